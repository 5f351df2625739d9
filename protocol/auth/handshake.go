package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"time"
)

// The handshake, version 2. All messages have fixed sizes; the server speaks first.
//
//	server hello  (45 bytes): magic "FXKA" | version 2 | purpose (8 bytes, zero-padded) | server nonce (32)
//	client answer (70 bytes): magic "FXKA" | version 2 | role (1) | client nonce (32) | client MAC (32)
//	              (134 bytes for role 1, a master: then | master signature (64))
//	server verdict (33 bytes): code (1) | server MAC (32; zeros unless the code is verdictOK)
//
//	client MAC = HMAC-SHA256(secret, "fluxkv-auth v2 client\x00" | purpose | role | server nonce | client nonce)
//	server MAC = HMAC-SHA256(secret, "fluxkv-auth v2 server\x00" | purpose | role | server nonce | client nonce)
//	master signature = Ed25519(master key, "fluxkv-auth v2 master\x00" | purpose | len (2, big endian) |
//	                   server identity | server nonce | client nonce)
//
// The client signs with its first secret; the server accepts any of its own and
// answers with the one that matched, so each side proves it holds a shared secret.
// Role 0 is a member; role 1 claims a master (role.go): a server with a MasterCheck
// verifies the signature against its accepted master public keys and its own identity
// (an owner's node id, which the master names, so the proof cannot be relayed to
// another owner) and refuses the handshake when it does not verify; a server without
// one records a member. The server closes the connection after a refusal.
const (
	magic        = "FXKA"
	version      = 2
	nonceLen     = 32
	macLen       = sha256.Size
	purposeLen   = 8
	headerLen    = len(magic) + 1
	helloLen     = headerLen + purposeLen + nonceLen
	answerLen    = headerLen + 1 + nonceLen + macLen
	sigLen       = 64 // ed25519.SignatureSize
	verdictLen   = 1 + macLen
	clientLabel  = "fluxkv-auth v2 client\x00"
	serverLabel  = "fluxkv-auth v2 server\x00"
	defaultLimit = 5 * time.Second
)

// Purposes bind a handshake to one cluster surface.
const (
	PurposeMaster = "master" // MasterService (owner → master)
	PurposePeer   = "peer"   // PeerService (master → owner, owner ↔ owner)
	PurposeData   = "data"   // the owner-to-owner data plane
)

// Verdict codes the server sends.
const (
	verdictOK          byte = 0
	verdictWrongSecret byte = 1 // the client's MAC matched none of the server's secrets
	verdictVersion     byte = 2 // the client speaks another handshake version
	verdictNotAuth     byte = 3 // the client did not start a handshake (an unauthenticated client)
	verdictRole        byte = 4 // the client's master proof did not verify (or it sent an unknown role)
)

// ErrAuthFailed is wrapped by every handshake failure either side reports.
var ErrAuthFailed = errors.New("cluster authentication failed")

// checkPurpose panics on a purpose that does not fit the wire: purposes are constants.
func checkPurpose(purpose string) {
	if purpose == "" || len(purpose) > purposeLen {
		panic(fmt.Sprintf("BUG: auth purpose %q must be 1..%d bytes", purpose, purposeLen))
	}
}

func purposeField(purpose string) []byte {
	var p [purposeLen]byte
	copy(p[:], purpose)
	return p[:]
}

func mac(key []byte, label string, purpose []byte, role Role, serverNonce, clientNonce []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	h.Write(purpose)
	h.Write([]byte{byte(role)})
	h.Write(serverNonce)
	h.Write(clientNonce)
	return h.Sum(nil)
}

// serverHandshake is serverRoleHandshake for a server that checks no master claims.
func serverHandshake(rw io.ReadWriter, s *Secrets, purpose string) error {
	_, err := serverRoleHandshake(rw, s, purpose, "", nil)
	return err
}

// serverRoleHandshake runs the server side on rw (the caller sets deadlines). It
// returns nil only when the client proved it holds one of s's secrets for purpose, and
// RoleMaster only when it also proved a master to check for this connection, whose
// local address is local (nil check: a claim is read and the client is a member); on
// failure it has told the client why (when the client got
// that far) and the caller closes.
func serverRoleHandshake(rw io.ReadWriter, s *Secrets, purpose, local string, check *MasterCheck) (Role, error) {
	p := purposeField(purpose)
	hello := make([]byte, 0, helloLen)
	hello = append(hello, magic...)
	hello = append(hello, version)
	hello = append(hello, p...)
	serverNonce := make([]byte, nonceLen)
	if _, err := rand.Read(serverNonce); err != nil {
		return RoleMember, fmt.Errorf("auth nonce: %w", err)
	}
	hello = append(hello, serverNonce...)
	if _, err := rw.Write(hello); err != nil {
		return RoleMember, fmt.Errorf("send auth hello: %w", err)
	}
	var answer [answerLen]byte
	// The header first: a client that speaks something else is refused at once, not
	// after waiting for bytes it will never send.
	if _, err := io.ReadFull(rw, answer[:headerLen]); err != nil {
		return RoleMember, fmt.Errorf("read auth answer: %w", err)
	}
	if string(answer[:len(magic)]) != magic {
		refuse(rw, verdictNotAuth)
		return RoleMember, errors.New("the client did not authenticate (no handshake: an --insecure-cluster node, or not a fluxkv node)")
	}
	if answer[len(magic)] != version {
		refuse(rw, verdictVersion)
		return RoleMember, fmt.Errorf("the client speaks handshake version %d, this node %d", answer[len(magic)], version)
	}
	if _, err := io.ReadFull(rw, answer[headerLen:]); err != nil {
		return RoleMember, fmt.Errorf("read auth answer: %w", err)
	}
	role := Role(answer[headerLen])
	if role != RoleMember && role != RoleMaster {
		refuse(rw, verdictRole)
		return RoleMember, fmt.Errorf("the client claims an unknown role %d", role)
	}
	clientNonce, clientMAC := answer[headerLen+1:headerLen+1+nonceLen], answer[headerLen+1+nonceLen:]
	var sig [sigLen]byte
	if role == RoleMaster {
		if _, err := io.ReadFull(rw, sig[:]); err != nil {
			return RoleMember, fmt.Errorf("read auth answer: %w", err)
		}
	}
	var key []byte
	for _, k := range s.keys {
		if hmac.Equal(clientMAC, mac(k, clientLabel, p, role, serverNonce, clientNonce)) {
			key = k
			break
		}
	}
	if key == nil {
		refuse(rw, verdictWrongSecret)
		return RoleMember, errors.New("wrong secret: the client's proof matched none of this node's cluster secrets")
	}
	proved := RoleMember
	if role == RoleMaster && check != nil {
		// A master's signature is checked only once the client proved it is a member:
		// an outsider costs no signature check.
		if !check.verify(p, local, serverNonce, clientNonce, sig[:]) {
			refuse(rw, verdictRole)
			return RoleMember, fmt.Errorf("master proof refused: the signature matches none of this node's master public keys "+
				"(--master-pubkey-file) for node %q", check.identity)
		}
		proved = RoleMaster
	}
	verdict := append([]byte{verdictOK}, mac(key, serverLabel, p, role, serverNonce, clientNonce)...)
	if _, err := rw.Write(verdict); err != nil {
		return RoleMember, fmt.Errorf("send auth verdict: %w", err)
	}
	return proved, nil
}

// refuse sends a refusal verdict; the connection is closed after it anyway, so a
// failed write changes nothing.
func refuse(w io.Writer, code byte) {
	var v [verdictLen]byte
	v[0] = code
	w.Write(v[:])
}

// clientHandshake runs the client side on rw (the caller sets deadlines); addr names
// the server in errors. Every error wraps ErrAuthFailed and says what to check.
func clientHandshake(rw io.ReadWriter, s *Secrets, purpose, addr string) error {
	serverNonce, err := readHello(rw, purpose, addr)
	if err != nil {
		return err
	}
	return answerHello(rw, s, purpose, addr, serverNonce, nil)
}

// readHello reads and checks the server's hello and returns its nonce.
func readHello(r io.Reader, purpose, addr string) ([]byte, error) {
	p := purposeField(purpose)
	var hello [helloLen]byte
	if _, err := io.ReadFull(r, hello[:]); err != nil {
		return nil, helloError(addr, purpose, err) // shed.go: says what most likely happened
	}
	if string(hello[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: %s did not send a fluxkv authentication hello: it is not a fluxkv %s port", ErrAuthFailed, addr, purpose)
	}
	if hello[len(magic)] != version {
		return nil, fmt.Errorf("%w: %s speaks handshake version %d, this node %d: run the same fluxkv release on both", ErrAuthFailed, addr, hello[len(magic)], version)
	}
	if got := hello[headerLen : headerLen+purposeLen]; !bytes.Equal(got, p) {
		return nil, fmt.Errorf("%w: %s is a fluxkv %q port, not %q: check the address", ErrAuthFailed, addr, string(bytes.TrimRight(got, "\x00")), purpose)
	}
	return hello[headerLen+purposeLen:], nil
}

// answerHello proves this side holds the first of s, and with master set that it is a
// master, and checks the server's proof.
func answerHello(rw io.ReadWriter, s *Secrets, purpose, addr string, serverNonce []byte, master *masterProof) error {
	p := purposeField(purpose)
	role := RoleMember
	if master != nil {
		role = RoleMaster
	}
	answer := make([]byte, 0, answerLen+sigLen)
	answer = append(answer, magic...)
	answer = append(answer, version, byte(role))
	clientNonce := make([]byte, nonceLen)
	if _, err := rand.Read(clientNonce); err != nil {
		return fmt.Errorf("auth nonce: %w", err)
	}
	answer = append(answer, clientNonce...)
	answer = append(answer, mac(s.keys[0], clientLabel, p, role, serverNonce, clientNonce)...)
	var identity string
	if master != nil {
		var sig []byte
		sig, identity = master.sign(p, addr, serverNonce, clientNonce)
		answer = append(answer, sig...)
	}
	if _, err := rw.Write(answer); err != nil {
		return verdictError(addr, "send answer to", err)
	}
	var verdict [verdictLen]byte
	if _, err := io.ReadFull(rw, verdict[:]); err != nil {
		return verdictError(addr, "read verdict from", err)
	}
	switch verdict[0] {
	case verdictOK:
	case verdictWrongSecret:
		return fmt.Errorf("%w: wrong secret: %s does not accept this node's cluster secret (compare --cluster-secret-file on both nodes)", ErrAuthFailed, addr)
	case verdictVersion:
		return fmt.Errorf("%w: %s does not speak handshake version %d: run the same fluxkv release on both", ErrAuthFailed, addr, version)
	case verdictRole:
		return fmt.Errorf("%w: %s refused this master's proof: it is not node %q, or does not accept this master's key "+
			"(give it this master's public key with --master-pubkey-file)", ErrAuthFailed, addr, identity)
	case verdictBusy:
		return busyError(addr)
	default:
		return fmt.Errorf("%w: %s refused the handshake (code %d)", ErrAuthFailed, addr, verdict[0])
	}
	if !hmac.Equal(verdict[1:], mac(s.keys[0], serverLabel, p, role, serverNonce, clientNonce)) {
		return fmt.Errorf("%w: %s did not prove it holds this node's cluster secret: it is not a fluxkv %s node of this cluster", ErrAuthFailed, addr, purpose)
	}
	return nil
}
