package fluxkv

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// fakeOwner answers each framed request on one connection with an Exists reply whose
// message is msg bytes long, written by send (which may split it, stall or close).
func fakeOwner(t *testing.T, msg int, send func(c net.Conn, frame []byte)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rpc.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for {
			var hdr [4]byte
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(c, body); err != nil {
				return
			}
			name, _, seq, _, err := thrift.Binary.ReadMessageBegin(body)
			if err != nil {
				return
			}
			b, _ := thrift.MarshalFastMsg(name, thrift.REPLY, seq,
				&external.ExternalServiceExistsResult{Success: &external.ExistsResponse{Exists: true, Message: strings.Repeat("m", msg)}})
			send(c, append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...))
		}
	}()
	return path
}

func existsCall(rc *rpcConn, timeout time.Duration) (*external.ExternalServiceExistsResult, error) {
	args := &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: &external.Session{}, Key: "k"}}
	res := &external.ExternalServiceExistsResult{}
	return res, rc.call("Exists", args, res, timeout, nil)
}

// The blocking connection reads a reply that comes in pieces (larger than its buffer),
// gives up at the call's deadline, and reports a closed peer and bytes after a reply.
func TestRPCConnReplies(t *testing.T) {
	whole := func(c net.Conn, f []byte) { c.Write(f) }
	pieces := func(c net.Conn, f []byte) { // 3 bytes, then parts of 50 KiB, with pauses
		for k := 3; len(f) > 0; k = 50 << 10 {
			k = min(k, len(f))
			c.Write(f[:k])
			f = f[k:]
			time.Sleep(5 * time.Millisecond)
		}
	}
	const big = 200 << 10 // more than the connection's read buffer
	for _, tc := range []struct {
		name string
		msg  int
		send func(c net.Conn, f []byte)
	}{{"small, whole", 10, whole}, {"large, whole", big, whole}, {"small, in pieces", 10, pieces}, {"large, in pieces", big, pieces}} {
		rc, err := dialRPC(fakeOwner(t, tc.msg, tc.send), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			res, err := existsCall(rc, 5*time.Second)
			if err != nil || !res.Success.Exists || len(res.Success.Message) != tc.msg {
				t.Fatalf("%s, call %d: %v", tc.name, i, err)
			}
		}
		rc.close()
	}

	// A stalled owner: the call ends at its timeout, not later.
	stall := fakeOwner(t, 10, func(c net.Conn, f []byte) { c.Write(f[:6]); time.Sleep(3 * time.Second) })
	rc, err := dialRPC(stall, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = existsCall(rc, 300*time.Millisecond)
	if took := time.Since(start); !errors.Is(err, os.ErrDeadlineExceeded) || took > 1500*time.Millisecond {
		t.Fatalf("stalled reply: %v after %v; want a timeout after about 300ms", err, took)
	}
	rc.close()

	// The owner closes without an answer; answers with bytes beyond its reply.
	closing := fakeOwner(t, 10, func(c net.Conn, f []byte) { c.Close() })
	rc, err = dialRPC(closing, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := existsCall(rc, time.Second); !errors.Is(err, errEOF) {
		t.Fatalf("closed peer: %v", err)
	}
	rc.close()
	extra := fakeOwner(t, 10, func(c net.Conn, f []byte) { c.Write(append(append([]byte{}, f...), 0, 0, 0, 1, 7)) })
	rc, err = dialRPC(extra, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := existsCall(rc, time.Second); err == nil || !strings.Contains(err.Error(), "after the reply") {
		t.Fatalf("bytes after the reply: %v", err)
	}
	rc.close()
}

// A reply names the call it answers; an EXCEPTION is returned whatever it names (the
// owner names a frame it refused before decoding it "unknown", seq 0).
func TestDecodeReply(t *testing.T) {
	res := &external.ExternalServiceExistsResult{Success: &external.ExistsResponse{Exists: true}}
	ok, _ := thrift.MarshalFastMsg("Exists", thrift.REPLY, 7, res)
	got := &external.ExternalServiceExistsResult{}
	if err := decodeReply(ok, "Exists", 7, got); err != nil || !got.Success.Exists {
		t.Fatalf("reply: %v", err)
	}
	if err := decodeReply(ok, "Exists", 8, got); err == nil || !strings.Contains(err.Error(), "Exists#7") {
		t.Fatalf("wrong seq: %v", err)
	}
	if err := decodeReply(ok, "Get", 7, got); err == nil {
		t.Fatal("wrong method accepted")
	}
	ex, _ := thrift.MarshalFastMsg("unknown", thrift.EXCEPTION, 0, thrift.NewApplicationException(thrift.INTERNAL_ERROR, "no frame memory"))
	var ae *thrift.ApplicationException
	if err := decodeReply(ex, "Exists", 7, got); !errors.As(err, &ae) || !strings.Contains(err.Error(), "no frame memory") {
		t.Fatalf("exception: %v", err)
	}
	if err := decodeReply(ok[:5], "Exists", 7, got); err == nil {
		t.Fatal("a truncated reply decoded")
	}
}

// slowOwner reads requests at about 64 KiB per pause and never answers.
func slowOwner(t *testing.T, pause time.Duration) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rpc.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			select {
			case <-done:
				return
			case <-time.After(pause):
			}
		}
	}()
	return path
}

// A call's deadline bounds the send of a large request to an owner that reads it slowly
// (a blocking send got the whole socket timeout afresh for each buffer it waited for:
// seconds past a 300 ms deadline), and the wait for the reply after a slow send (it got
// the socket's whole timeout again).
func TestCallDeadlineBoundsASlowSend(t *testing.T) {
	bigCall := func(rc *rpcConn, size int, timeout time.Duration) error {
		args := &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: &external.Session{}, Key: strings.Repeat("k", size)}}
		return rc.call("Exists", args, &external.ExternalServiceExistsResult{}, timeout, nil)
	}
	rc, err := dialRPC(slowOwner(t, 50*time.Millisecond), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = bigCall(rc, 8<<20, 300*time.Millisecond) // ~6 s to drain
	if took := time.Since(start); !errors.Is(err, os.ErrDeadlineExceeded) || took > 3*time.Second {
		t.Fatalf("an 8 MiB request drained slowly: %v after %v; want a timeout at about 300ms", err, took)
	}
	rc.close()

	rc, err = dialRPC(slowOwner(t, 10*time.Millisecond), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	err = bigCall(rc, 2<<20, time.Second) // sent within ~0.3 s on an idle machine, never answered
	if took := time.Since(start); !errors.Is(err, os.ErrDeadlineExceeded) || took > 4*time.Second {
		t.Fatalf("a slow send then no reply: %v after %v; want a timeout at about 1s, not the socket's 10s", err, took)
	}
	rc.close()
}
