package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

func frameOf(msg []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(msg))), msg...)
}

// bomb is a Release call whose holder-id list announces 2^31-1 ids in a few bytes.
func bomb() []byte {
	return append(thrift.Binary.AppendMessageBegin(nil, "Release", thrift.CALL, 1),
		byte(thrift.STRUCT), 0, 1, byte(thrift.LIST), 0, 2, byte(thrift.I64), 0x7f, 0xff, 0xff, 0xff, 0, 0)
}

func getCall(key string) []byte {
	b, _ := thrift.MarshalFastMsg("Get", thrift.CALL, 1, &external.ExternalServiceGetArgs{Req: &external.GetRequest{Key: key}})
	return b
}

// guardPair returns the server side of a connection through a GuardListener, and the
// client side.
func guardPair(t *testing.T, opts GuardOptions) (net.Conn, net.Conn) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := GuardListener(raw, opts)
	t.Cleanup(func() { ln.Close() })
	client, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	server.SetDeadline(time.Now().Add(time.Minute))
	client.SetDeadline(time.Now().Add(time.Minute))
	return server, client
}

// TestGuardPasses: checked frames reach the server byte for byte, one after the
// other, through reads of any size; a large frame's budget is held until the server
// reads past it and given back at Close.
func TestGuardPasses(t *testing.T) {
	budget := NewFrameBudget(0)
	server, client := guardPair(t, GuardOptions{Budget: budget})
	big := getCall(string(bytes.Repeat([]byte("k"), 100<<10)))
	want := append(append(frameOf(getCall("a")), frameOf(big)...), frameOf(getCall("b"))...)
	go client.Write(want)
	got := make([]byte, len(want))
	for off := 0; off < len(got); {
		n, err := server.Read(got[off:min(off+7, len(got))])
		if err != nil {
			t.Fatalf("after %d bytes: %v", off, err)
		}
		off += n
		if off == 4+len(getCall("a"))+4+len(big) && budget.InUse() != int64(len(big)) {
			t.Fatalf("in use %d while the large frame is being read, want %d", budget.InUse(), len(big))
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ")
	}
	if budget.InUse() != 0 {
		t.Fatalf("in use %d once the server read past the large frame", budget.InUse())
	}
	// A large frame not read to its end gives its budget back at Close.
	go client.Write(frameOf(big))
	if _, err := server.Read(make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	server.Close()
	if budget.InUse() != 0 {
		t.Fatalf("in use %d after Close", budget.InUse())
	}
}

// TestGuardRefuses: a length bomb, an oversized or empty frame, unframed thrift, a
// frame that stalls and one that finds no frame memory are never passed on: the read
// fails with ErrGuardRefused (or a timeout) and the connection is closed.
func TestGuardRefuses(t *testing.T) {
	full := NewFrameBudget(0)
	if _, err := full.Reserve(int(full.Limit()), time.Time{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		opts   GuardOptions
		send   []byte
		reason error
	}{
		{"length bomb", GuardOptions{}, frameOf(bomb()), ErrGuardRefused},
		{"frame over MaxFrame", GuardOptions{MaxFrame: 1 << 20}, binary.BigEndian.AppendUint32(nil, 1<<20+1), ErrGuardRefused},
		{"empty frame", GuardOptions{}, []byte{0, 0, 0, 0}, ErrGuardRefused},
		{"unframed binary thrift", GuardOptions{}, getCall("a"), ErrGuardRefused},
		{"garbage message", GuardOptions{}, frameOf([]byte("hello world")), ErrGuardRefused},
		{"no frame memory", GuardOptions{Budget: full, FrameTimeout: 50 * time.Millisecond}, frameOf(getCall(string(bytes.Repeat([]byte("k"), 100<<10)))), ErrFrameBudget},
		{"stalled frame", GuardOptions{FrameTimeout: 50 * time.Millisecond}, frameOf(getCall("a"))[:10], ErrGuardRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			server, client := guardPair(t, tc.opts)
			go client.Write(tc.send)
			n, err := server.Read(make([]byte, 64<<10))
			if n != 0 || !errors.Is(err, tc.reason) {
				t.Fatalf("read %d bytes, %v; want %v", n, err, tc.reason)
			}
			if _, err := io.ReadAll(client); err != nil && !errors.Is(err, net.ErrClosed) && !bytes.Contains([]byte(err.Error()), []byte("reset")) {
				t.Fatalf("client: %v, want the connection closed", err)
			}
		})
	}
	if full.InUse() != full.Limit() {
		t.Fatalf("refused frames changed the budget: %d", full.InUse())
	}
}

// TestGuardReader: replies pass byte for byte; a length bomb ends the stream.
func TestGuardReader(t *testing.T) {
	want := append(frameOf(getCall("a")), frameOf(getCall("b"))...)
	got, err := io.ReadAll(GuardReader(bytes.NewReader(want), 0))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%v, %d of %d bytes", err, len(got), len(want))
	}
	_, err = io.ReadAll(GuardReader(bytes.NewReader(append(frameOf(getCall("a")), frameOf(bomb())...)), 0))
	if !errors.Is(err, ErrGuardRefused) {
		t.Fatalf("bomb reply: %v", err)
	}
}

// TestGuardPassesLargeClusterLists: cluster lists are not batches: a Register after a
// master restart pins every holder and write in flight, here 20,000 of them (over the
// RPC socket's 16,384 elements), and passes; 2^20+1 empty structs do not.
func TestGuardPassesLargeClusterLists(t *testing.T) {
	pins := make([]*mp.PinnedRange, 20000)
	for i := range pins {
		pins[i] = &mp.PinnedRange{PinId: int64(i + 1), Offset: int64(i) << 12, Len: 4096}
	}
	msg, err := thrift.MarshalFastMsg("Register", thrift.CALL, 1, &mp.MasterServiceRegisterArgs{Req: &mp.RegisterRequest{
		Node: &mp.NodeRef{NodeId: "n1", Generation: 1}, Pinned: pins}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(GuardReader(bytes.NewReader(frameOf(msg)), 0))
	if err != nil || !bytes.Equal(got, frameOf(msg)) {
		t.Fatalf("Register with %d pins: %v", len(pins), err)
	}
	many := append(thrift.Binary.AppendMessageBegin(nil, "Register", thrift.CALL, 1),
		byte(thrift.STRUCT), 0, 1, byte(thrift.LIST), 0, 9, byte(thrift.STRUCT))
	many = binary.BigEndian.AppendUint32(many, ClusterMaxElems+1)
	many = append(many, make([]byte, ClusterMaxElems+3)...) // the empty structs' STOPs, then two more
	if _, err := io.ReadAll(GuardReader(bytes.NewReader(frameOf(many)), 0)); !errors.Is(err, ErrGuardRefused) {
		t.Fatalf("%d empty structs: %v", ClusterMaxElems+1, err)
	}
}
