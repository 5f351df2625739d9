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

// The handshake, version 1. All messages have fixed sizes; the server speaks first.
//
//	server hello  (45 bytes): magic "FXKA" | version 1 | purpose (8 bytes, zero-padded) | server nonce (32)
//	client answer (69 bytes): magic "FXKA" | version 1 | client nonce (32) | client MAC (32)
//	server verdict (33 bytes): code (1) | server MAC (32; zeros unless the code is verdictOK)
//
//	client MAC = HMAC-SHA256(secret, "fluxkv-auth v1 client\x00" | purpose | server nonce | client nonce)
//	server MAC = HMAC-SHA256(secret, "fluxkv-auth v1 server\x00" | purpose | server nonce | client nonce)
//
// The client signs with its first secret; the server accepts any of its own and
// answers with the one that matched, so each side proves it holds a shared secret.
// The server closes the connection after a refusal.
const (
	magic        = "FXKA"
	version      = 1
	nonceLen     = 32
	macLen       = sha256.Size
	purposeLen   = 8
	headerLen    = len(magic) + 1
	helloLen     = headerLen + purposeLen + nonceLen
	answerLen    = headerLen + nonceLen + macLen
	verdictLen   = 1 + macLen
	clientLabel  = "fluxkv-auth v1 client\x00"
	serverLabel  = "fluxkv-auth v1 server\x00"
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

func mac(key []byte, label string, purpose, serverNonce, clientNonce []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	h.Write(purpose)
	h.Write(serverNonce)
	h.Write(clientNonce)
	return h.Sum(nil)
}

// serverHandshake runs the server side on rw (the caller sets deadlines). It returns
// nil only when the client proved it holds one of s's secrets for purpose; on failure
// it has told the client why (when the client got that far) and the caller closes.
func serverHandshake(rw io.ReadWriter, s *Secrets, purpose string) error {
	p := purposeField(purpose)
	hello := make([]byte, 0, helloLen)
	hello = append(hello, magic...)
	hello = append(hello, version)
	hello = append(hello, p...)
	serverNonce := make([]byte, nonceLen)
	if _, err := rand.Read(serverNonce); err != nil {
		return fmt.Errorf("auth nonce: %w", err)
	}
	hello = append(hello, serverNonce...)
	if _, err := rw.Write(hello); err != nil {
		return fmt.Errorf("send auth hello: %w", err)
	}
	var answer [answerLen]byte
	// The header first: a client that speaks something else is refused at once, not
	// after waiting for bytes it will never send.
	if _, err := io.ReadFull(rw, answer[:headerLen]); err != nil {
		return fmt.Errorf("read auth answer: %w", err)
	}
	if string(answer[:len(magic)]) != magic {
		refuse(rw, verdictNotAuth)
		return errors.New("the client did not authenticate (no handshake: an --insecure-cluster node, or not a fluxkv node)")
	}
	if answer[len(magic)] != version {
		refuse(rw, verdictVersion)
		return fmt.Errorf("the client speaks handshake version %d, this node %d", answer[len(magic)], version)
	}
	if _, err := io.ReadFull(rw, answer[headerLen:]); err != nil {
		return fmt.Errorf("read auth answer: %w", err)
	}
	clientNonce, clientMAC := answer[headerLen:headerLen+nonceLen], answer[headerLen+nonceLen:]
	for _, k := range s.keys {
		if hmac.Equal(clientMAC, mac(k, clientLabel, p, serverNonce, clientNonce)) {
			verdict := append([]byte{verdictOK}, mac(k, serverLabel, p, serverNonce, clientNonce)...)
			if _, err := rw.Write(verdict); err != nil {
				return fmt.Errorf("send auth verdict: %w", err)
			}
			return nil
		}
	}
	refuse(rw, verdictWrongSecret)
	return errors.New("wrong secret: the client's proof matched none of this node's cluster secrets")
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
	return answerHello(rw, s, purpose, addr, serverNonce)
}

// readHello reads and checks the server's hello and returns its nonce.
func readHello(r io.Reader, purpose, addr string) ([]byte, error) {
	p := purposeField(purpose)
	var hello [helloLen]byte
	if _, err := io.ReadFull(r, hello[:]); err != nil {
		return nil, fmt.Errorf("%w: no authentication hello from %s (%v): it runs with --insecure-cluster, or is not a fluxkv %s port",
			ErrAuthFailed, addr, err, purpose)
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

// answerHello proves this side holds the first of s and checks the server's proof.
func answerHello(rw io.ReadWriter, s *Secrets, purpose, addr string, serverNonce []byte) error {
	p := purposeField(purpose)
	answer := make([]byte, 0, answerLen)
	answer = append(answer, magic...)
	answer = append(answer, version)
	clientNonce := make([]byte, nonceLen)
	if _, err := rand.Read(clientNonce); err != nil {
		return fmt.Errorf("auth nonce: %w", err)
	}
	answer = append(answer, clientNonce...)
	answer = append(answer, mac(s.keys[0], clientLabel, p, serverNonce, clientNonce)...)
	if _, err := rw.Write(answer); err != nil {
		return fmt.Errorf("%w: send answer to %s: %v", ErrAuthFailed, addr, err)
	}
	var verdict [verdictLen]byte
	if _, err := io.ReadFull(rw, verdict[:]); err != nil {
		return fmt.Errorf("%w: no verdict from %s: %v", ErrAuthFailed, addr, err)
	}
	switch verdict[0] {
	case verdictOK:
	case verdictWrongSecret:
		return fmt.Errorf("%w: wrong secret: %s does not accept this node's cluster secret (compare --cluster-secret-file on both nodes)", ErrAuthFailed, addr)
	case verdictVersion:
		return fmt.Errorf("%w: %s does not speak handshake version %d: run the same fluxkv release on both", ErrAuthFailed, addr, version)
	default:
		return fmt.Errorf("%w: %s refused the handshake (code %d)", ErrAuthFailed, addr, verdict[0])
	}
	if !hmac.Equal(verdict[1:], mac(s.keys[0], serverLabel, p, serverNonce, clientNonce)) {
		return fmt.Errorf("%w: %s did not prove it holds this node's cluster secret: it is not a fluxkv %s node of this cluster", ErrAuthFailed, addr, purpose)
	}
	return nil
}
