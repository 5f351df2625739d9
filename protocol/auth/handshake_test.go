package auth

import (
	"bytes"
	"crypto/rand"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

func testSecrets(t testing.TB, keys ...string) *Secrets {
	t.Helper()
	var bs [][]byte
	for _, k := range keys {
		bs = append(bs, []byte(strings.Repeat(k, MinSecretLen/len(k)+1)))
	}
	s, err := NewSecrets(bs...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// handshake runs both sides over a pipe and returns their errors.
func handshake(t *testing.T, server, client *Secrets, serverPurpose, clientPurpose string) (serr, cerr error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	deadline := time.Now().Add(5 * time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	done := make(chan error, 1)
	go func() {
		err := serverHandshake(a, server, serverPurpose)
		a.Close() // as the listener does after a refusal
		done <- err
	}()
	cerr = clientHandshake(b, client, clientPurpose, "test-server")
	b.Close()
	return <-done, cerr
}

func TestHandshake(t *testing.T) {
	old, other := testSecrets(t, "old"), testSecrets(t, "other")
	both := testSecrets(t, "new", "old")
	for _, tc := range []struct {
		name            string
		server, client  *Secrets
		sPurpose, cPurp string
		wantClient      string // "" = success
	}{
		{"same secret", old, old, PurposeMaster, PurposeMaster, ""},
		{"rotation: server new+old, client old", both, old, PurposePeer, PurposePeer, ""},
		{"rotation: server new+old, client new+old", both, both, PurposePeer, PurposePeer, ""},
		{"unrelated secret", both, other, PurposeMaster, PurposeMaster, "wrong secret"},
		{"client signs with new, server only old", old, both, PurposeMaster, PurposeMaster, "wrong secret"},
		{"purpose mismatch", old, old, PurposePeer, PurposeMaster, `is a fluxkv "peer" port, not "master"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serr, cerr := handshake(t, tc.server, tc.client, tc.sPurpose, tc.cPurp)
			if tc.wantClient == "" {
				if serr != nil || cerr != nil {
					t.Fatalf("server %v, client %v", serr, cerr)
				}
				return
			}
			if !errors.Is(cerr, ErrAuthFailed) || !strings.Contains(cerr.Error(), tc.wantClient) {
				t.Fatalf("client error %v, want %q", cerr, tc.wantClient)
			}
			if serr == nil {
				t.Fatal("server accepted")
			}
		})
	}
}

// A server that does not hold the secret cannot pass: the client checks its proof.
func TestHandshakeFakeServer(t *testing.T) {
	s := testSecrets(t, "real")
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		hello := append([]byte(magic), version)
		hello = append(hello, purposeField(PurposeMaster)...)
		hello = append(hello, make([]byte, nonceLen)...)
		a.Write(hello)
		var answer [answerLen]byte
		a.Read(answer[:])
		a.Write(make([]byte, verdictLen)) // "OK" with a made-up proof
	}()
	err := clientHandshake(b, s, PurposeMaster, "fake")
	if !errors.Is(err, ErrAuthFailed) || !strings.Contains(err.Error(), "did not prove") {
		t.Fatalf("got %v", err)
	}
}

// A client that speaks thrift instead of the handshake is refused at once with a code
// the insecure dialer never needs, and nothing it sent is answered.
func TestHandshakeNotAuthenticating(t *testing.T) {
	s := testSecrets(t, "k")
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() { done <- serverHandshake(a, s, PurposeMaster) }()
	var hello [helloLen]byte
	if _, err := b.Read(hello[:]); err != nil {
		t.Fatal(err)
	}
	b.Write([]byte{0, 0, 0, 40, 0x80}) // the start of a framed thrift call
	var v [verdictLen]byte
	if _, err := b.Read(v[:]); err != nil || v[0] != verdictNotAuth {
		t.Fatalf("verdict %v, %v", v[0], err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "did not authenticate") {
		t.Fatalf("server: %v", err)
	}
}

func TestHandshakeReplayFails(t *testing.T) {
	s := testSecrets(t, "k")
	// Record one good client answer, then replay it to a new server nonce.
	a, b := net.Pipe()
	var recorded []byte
	go func(a net.Conn) {
		serverHandshake(a, s, PurposeMaster)
		a.Close()
	}(a)
	rec := &recorder{Conn: b}
	if err := clientHandshake(rec, s, PurposeMaster, "x"); err != nil {
		t.Fatal(err)
	}
	recorded = rec.written.Bytes()
	b.Close()

	a, b = net.Pipe()
	done := make(chan error, 1)
	go func() { done <- serverHandshake(a, s, PurposeMaster); a.Close() }()
	var hello [helloLen]byte
	b.Read(hello[:])
	b.Write(recorded)
	var v [verdictLen]byte
	b.Read(v[:])
	if v[0] != verdictWrongSecret || <-done == nil {
		t.Fatalf("replayed answer accepted (verdict %d)", v[0])
	}
}

type recorder struct {
	net.Conn
	written bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.written.Write(b)
	return r.Conn.Write(b)
}

// FuzzServerHandshake feeds arbitrary client bytes to the server side, one that checks
// master claims: it must never panic and never accept (the server's nonce is fresh,
// so no input can hold its proof, a member's or a master's).
func FuzzServerHandshake(f *testing.F) {
	s, _ := NewSecrets(bytes.Repeat([]byte("k"), MinSecretLen))
	mk, _ := GenerateMasterKey()
	pubs, _ := NewMasterPubKeys(mk.Public())
	check := NewMasterCheck(pubs, "n1")
	f.Add([]byte{})
	f.Add(append([]byte("FXKA\x02\x01"), make([]byte, nonceLen+macLen+sigLen)...))
	f.Add(append([]byte("FXKA\x02\x00"), make([]byte, nonceLen+macLen)...))
	f.Add(append([]byte("FXKA\x02\x07"), make([]byte, nonceLen+macLen)...))
	f.Add([]byte("FXKA"))
	f.Add(append([]byte("FXKA\x01"), make([]byte, nonceLen+macLen)...))
	f.Add(append([]byte("FXKA\x02"), make([]byte, nonceLen+macLen)...))
	f.Add([]byte{0, 0, 0, 20, 0x80, 1, 0, 1})
	junk := make([]byte, 200)
	rand.Read(junk)
	f.Add(junk)
	f.Fuzz(func(t *testing.T, in []byte) {
		rw := &fakeConn{in: bytes.NewReader(in)}
		if _, err := serverRoleHandshake(rw, s, PurposePeer, "", check); err == nil {
			t.Fatalf("accepted %x", in)
		}
		if rw.out.Len() != helloLen && rw.out.Len() != helloLen+verdictLen {
			t.Fatalf("wrote %d bytes", rw.out.Len())
		}
	})
}

type fakeConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *fakeConn) Read(b []byte) (int, error)  { return c.in.Read(b) }
func (c *fakeConn) Write(b []byte) (int, error) { return c.out.Write(b) }
