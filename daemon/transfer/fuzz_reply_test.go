package transfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// replyOnce serves one connection: it reads one request for node "node-a", writes
// replies and closes the connection (a truncated stream ends in EOF, not a wait).
func replyOnce(t *testing.T, replies []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, requestFixedLen+len("node-a"))); err != nil {
			return
		}
		c.Write(replies)
	}()
	return ln.Addr().String()
}

// okValue is what a well-formed stream of replies to one pull of n bytes delivers (for
// a staged pull, after WAIT headers), and whether it does.
func okValue(b []byte, n int, staged bool) ([]byte, bool) {
	for len(b) >= responseFixedLen {
		status, length, msgLen, err := parseResponseFixed(b[:responseFixedLen])
		switch {
		case err != nil:
			return nil, false
		case status == statusWait && staged && length == 0 && msgLen == 0:
			b = b[responseFixedLen:]
			continue
		case status != statusOK || length != int64(n) || len(b) < responseFixedLen+msgLen+n:
			return nil, false
		}
		return b[responseFixedLen+msgLen : responseFixedLen+msgLen+n], true
	}
	return nil, false
}

// FuzzReplyStream: whatever a data-plane peer answers a pull with, the puller never
// panics, returns, and succeeds only on a well-formed OK of exactly the bytes asked
// for, which it delivers (the request parser has FuzzParseRequest).
func FuzzReplyStream(f *testing.F) {
	ok := appendResponse(nil, statusOK, 5, okPadding[:okHeaderLen-responseFixedLen])
	f.Add(append(ok, "hello"...), uint8(5), false)
	f.Add(append(appendResponse(nil, statusWait, 0, ""), append(ok, "hello"...)...), uint8(5), true)
	f.Add(appendResponse(nil, statusFenced, 0, "gone"), uint8(5), false)
	f.Add(appendResponse(nil, statusOK, 1<<40, ""), uint8(1), false)
	f.Add([]byte("FXKA\x01"), uint8(1), false)
	bad := appendResponse(nil, statusOK, 5, "")
	binary.BigEndian.PutUint16(bad[len(frameMagic)+2:], 0xffff)
	f.Add(bad, uint8(5), false)
	cl := NewClient(ClientOptions{ProgressTimeout: 2 * time.Second})
	defer cl.Close()
	f.Fuzz(func(t *testing.T, replies []byte, n uint8, staged bool) {
		size := int(n%64) + 1
		dst := make([]byte, size)
		addr := replyOnce(t, replies)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := cl.Pull(ctx, addr, Fence{SourceNode: "node-a", SourceGeneration: 1, TransferID: 1, Staged: staged}, 0, dst)
		want, wellFormed := okValue(replies, size, staged)
		switch {
		case err == nil && !wellFormed:
			t.Fatalf("a pull of %d bytes succeeded on %x", size, replies)
		case err == nil && !bytes.Equal(dst, want):
			t.Fatalf("a pull of %d bytes delivered %x, the reply carried %x", size, dst, want)
		}
	})
}
