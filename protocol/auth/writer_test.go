package auth

import (
	"io"
	"net"
	"testing"
	"time"
)

// Writer hands a server the TCP connection under an authenticated one (so that
// net.Buffers writes a header and its data in one writev), and the guarded connection
// itself when the handshake failed: a refused peer still gets nothing.
func TestWriterAfterHandshake(t *testing.T) {
	s := testSecrets(t, "k")
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Listener(raw, s, PurposeData, ListenerOptions{Timeout: 5 * time.Second})
	defer ln.Close()
	type result struct {
		tcp      bool
		writeErr error
	}
	results := make(chan result, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				ok := Handshake(c) == nil
				w := Writer(c)
				_, isTCP := w.(*net.TCPConn)
				var werr error
				if ok {
					_, werr = (&net.Buffers{[]byte("head"), []byte("data")}).WriteTo(w)
				} else {
					_, werr = w.Write([]byte("data"))
				}
				results <- result{isTCP, werr}
			}()
		}
	}()

	// An authenticated client reads what the server wrote through Writer.
	c, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := ClientHandshake(c, s, PurposeData, raw.Addr().String(), 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "headdata" {
		t.Fatalf("read %q, %v; want headdata", got, err)
	}
	if r := <-results; !r.tcp || r.writeErr != nil {
		t.Fatalf("authenticated: Writer gave a TCP connection %v, write error %v", r.tcp, r.writeErr)
	}

	// A client with the wrong key is refused: Writer gives the guarded connection,
	// whose writes fail.
	bad, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	bad.SetDeadline(time.Now().Add(5 * time.Second))
	if ClientHandshake(bad, testSecrets(t, "other"), PurposeData, raw.Addr().String(), 0) == nil {
		t.Fatal("a client with the wrong key was accepted")
	}
	if r := <-results; r.tcp || r.writeErr == nil {
		t.Fatalf("refused: Writer gave a TCP connection %v, write error %v", r.tcp, r.writeErr)
	}
}
