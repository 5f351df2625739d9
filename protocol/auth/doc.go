// Package auth authenticates fluxkv's cluster TCP connections (master, peer service,
// and the owner-to-owner data plane) with a shared secret, before any byte of an RPC
// is read (docs/architecture.md §11).
//
// Each connection opens with a mutual challenge-response handshake (handshake.go):
// the server sends a random nonce, the client answers with its own nonce and an
// HMAC-SHA256 over both under the secret, and the server proves it holds the secret
// too. A purpose ("master", "peer", "data") binds a handshake to one surface. After
// that the connection is plain: a call costs nothing extra, and no replay cache is
// needed because every handshake signs fresh nonces from both sides.
//
// Listener wraps a server's net.Listener (Kitex's gonet transport reads through the
// connections it returns; netpoll would take the raw fd and bypass it), and Dialer is
// the client side as a Kitex remote.Dialer. Secrets come from files (secrets.go): the
// first signs, any is accepted, so a secret is rotated by running with two files.
//
// The secret makes a process a member; a master also proves it holds a master key
// (Ed25519, masterkey.go) in the handshake of each connection it opens to an owner,
// signing both nonces and the owner's node id (role.go). Handlers read the proved
// role with ConnRole; owners answer master-only calls only from RoleMaster.
//
// Anyone who reaches a port can open connections that never authenticate, so Listener
// bounds those in their handshake per source address and in total, and sheds the
// oldest for a new one rather than refusing it (shed.go): a member's dial, which
// answers within a round trip, completes while a flood of silent connections runs.
//
// Traffic is authenticated, not encrypted.
package auth
