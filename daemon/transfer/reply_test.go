package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// scriptedReplies is a data-plane server without authentication that answers every
// connection's first n requests with the bytes of replies, written in pieces of at
// most piece bytes (0: at once) a little apart, so that the puller's reads end at
// every place of the stream: inside a header, its padding, the data, and the next
// reply's header. It returns the address and the count of connections accepted.
func scriptedReplies(t *testing.T, n int, replies []byte, piece int) (string, func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			go func() {
				defer c.Close()
				req := make([]byte, n*(requestFixedLen+len("node-a")))
				if _, err := io.ReadFull(c, req); err != nil {
					return
				}
				for rest := replies; len(rest) > 0; {
					k := len(rest)
					if piece > 0 {
						k = min(piece, k)
						time.Sleep(50 * time.Microsecond)
					}
					if _, err := c.Write(rest[:k]); err != nil {
						return
					}
					rest = rest[k:]
				}
				io.Copy(io.Discard, c) // until the client closes or the test ends
			}()
		}
	}()
	return ln.Addr().String(), func() int { return len(accepted) }
}

// TestReplyReadAhead: the puller reads an OK reply's padding and data together with
// whatever of the next reply's fixed header came with them. Whatever the pieces the
// replies arrive in (a header split anywhere, the next one read in part or whole with
// the data before it), every pull of a PullMany gets its own outcome and bytes: OK
// with either padding, a refusal with its message, an OK after a refusal.
func TestReplyReadAhead(t *testing.T) {
	sizes := []int{100, 3, 5000, 1, 777}
	var replies []byte
	want := make([][]byte, len(sizes))
	for i, n := range sizes {
		if i == 2 {
			replies = appendResponse(replies, statusFenced, 0, "gone")
			continue
		}
		want[i] = bytes.Repeat([]byte{byte(i + 1)}, n)
		pad := okHeaderLen - responseFixedLen
		if i%2 == 1 {
			pad = okHeaderLenAlt - responseFixedLen
		}
		replies = appendResponse(replies, statusOK, int64(n), okPadding[:pad])
		replies = append(replies, want[i]...)
	}
	for _, piece := range []int{0, 1, 5, 16, 21, 64} {
		t.Run(fmt.Sprintf("piece=%d", piece), func(t *testing.T) {
			t.Parallel()
			addr, _ := scriptedReplies(t, len(sizes), replies, piece)
			cl := newClient(t, ClientOptions{ProgressTimeout: 10 * time.Second})
			items := make([]PullItem, len(sizes))
			for i, n := range sizes {
				items[i] = PullItem{Fence: Fence{SourceNode: "node-a", SourceGeneration: 1, TransferID: int64(i + 1)}, Dst: make([]byte, n)}
			}
			errs := cl.PullMany(context.Background(), addr, items)
			for i, err := range errs {
				switch {
				case i == 2:
					if !errors.Is(err, ErrFenced) || !bytes.Contains([]byte(err.Error()), []byte("gone")) {
						t.Errorf("item 2: %v, want the refusal with its message", err)
					}
				case err != nil:
					t.Errorf("item %d: %v", i, err)
				case !bytes.Equal(items[i].Dst, want[i]):
					t.Errorf("item %d: wrong bytes", i)
				}
			}
		})
	}
}

// TestReplyUnaskedBytes: bytes that follow the last reply of a PullMany came unasked
// (read ahead with its data or not): the connection is out of step and is not used
// again; the next batch dials a fresh one and gets its bytes.
func TestReplyUnaskedBytes(t *testing.T) {
	want := bytes.Repeat([]byte{0xAB}, 200)
	replies := appendResponse(nil, statusOK, int64(len(want)), okPadding[:okHeaderLen-responseFixedLen])
	replies = append(replies, want...)
	script := append(replies, appendResponse(nil, statusOK, 0, "")...) // a stray reply after the one asked for
	f := Fence{SourceNode: "node-a", SourceGeneration: 1, TransferID: 1}
	for _, tc := range []struct {
		name string
		pull func(cl *Client, addr string, dst []byte) error
	}{
		{"PullMany", func(cl *Client, addr string, dst []byte) error {
			return cl.PullMany(context.Background(), addr, []PullItem{{Fence: f, Dst: dst}})[0]
		}},
		{"Pull", func(cl *Client, addr string, dst []byte) error { return cl.Pull(context.Background(), addr, f, 0, dst) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, accepted := scriptedReplies(t, 1, script, 0)
			cl := newClient(t, ClientOptions{})
			for round := range 2 {
				dst := make([]byte, len(want))
				if err := tc.pull(cl, addr, dst); err != nil || !bytes.Equal(dst, want) {
					t.Fatalf("round %d: %v (bytes equal: %v)", round, err, bytes.Equal(dst, want))
				}
			}
			if d, a := cl.dials.Load(), accepted(); d != 2 || a != 2 {
				t.Errorf("%d dials, %d connections accepted; want 2: a connection with unasked bytes must not carry another pull", d, a)
			}
		})
	}
}

// TestReplyDeadlineKeptAfterCancel: once a pull's context ended, moving the read
// deadline for the next header puts the forced past deadline back (the cancellation
// may land between the two), so a reader of a silent source fails at once instead of
// after the progress timeout.
func TestReplyDeadlineKeptAfterCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			io.Copy(io.Discard, c) // silent until the client closes
			c.Close()
		}
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cl := newClient(t, ClientOptions{ProgressTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rr, err := cl.newReplyReader(ctx, conn.(*net.TCPConn))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan pullResult, 1)
	go func() { done <- rr.read(pullRef{addr: ln.Addr().String(), n: 1}, make([]byte, 1)) }()
	select {
	case res := <-done:
		if res.err == nil {
			t.Fatal("a read after the pull's context ended succeeded")
		}
	case <-time.After(20 * time.Second):
		conn.Close()
		<-done
		t.Fatal("a read after the pull's context ended waited for the progress timeout")
	}
}
