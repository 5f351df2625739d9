// Package auth authenticates fluxkv's cluster TCP connections (master, peer service,
// and the owner-to-owner data plane) with a shared secret, before any byte of an RPC
// is read (DESIGN §11).
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
// Traffic is authenticated, not encrypted.
package auth
