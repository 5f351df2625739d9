package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
	"github.com/fluxkv/fluxkv/ssd"
)

// limitNode is an in-process master + owner with the socket limits a test chose, the
// owner's metrics and its log.
type limitNode struct {
	o   *Owner
	m   *metrics.Metrics
	log *proctest.Buffer // safe for the owner's goroutines
}

func startLimitNode(t *testing.T, opts Options) *limitNode {
	t.Helper()
	nop := zerolog.Nop()
	secrets := authtest.Secrets(t)
	masterKey, masterKeys := authtest.MasterKeys(t)
	ms, err := master.NewServer(master.Options{Logger: &nop, Secrets: secrets, MasterKey: masterKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := ms.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	n := &limitNode{m: metrics.New(), log: &proctest.Buffer{}}
	log := zerolog.New(n.log)
	opts.Dir, opts.DRAM, opts.MasterAddr, opts.NodeID = t.TempDir(), 8<<20, ms.Addr().String(), "n1"
	opts.Logger, opts.Metrics, opts.Secrets, opts.MasterKeys = &log, n.m, secrets, masterKeys
	o, err := New(opts)
	if err != nil {
		ms.Stop()
		t.Fatal(err)
	}
	if err := o.Start(context.Background()); err != nil {
		ms.Stop()
		t.Fatal(err)
	}
	n.o = o
	t.Cleanup(func() {
		o.Stop()
		ms.Stop()
	})
	return n
}

func (n *limitNode) connect(t *testing.T, name string) *fluxkv.Client {
	t.Helper()
	c, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// counter reads one labelled counter of the owner's metrics.
func (n *limitNode) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := n.m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// waitClosed reads from conn until the server closes it (EOF or reset), failing after
// limit; it returns the bytes received.
func waitClosed(t *testing.T, conn net.Conn, limit time.Duration) []byte {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(limit))
	b, err := io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open after %v", limit)
	}
	return b
}

// dialRPC opens a raw connection to o's RPC socket, closed when the test ends.
func dialRPC(t *testing.T, o *Owner) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", wire.RPCSocketPath(o.SocketPath()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// frame encodes a thrift message as one RPC frame.
func frame(t *testing.T, method string, typ thrift.TMessageType, args thrift.FastCodec) []byte {
	t.Helper()
	b, err := thrift.MarshalFastMsg(method, typ, 1, args)
	if err != nil {
		t.Fatal(err)
	}
	return appendFrame(nil, b)
}

// readReply reads one reply frame and decodes its message header.
func readReply(t *testing.T, conn net.Conn) (typ thrift.TMessageType, body []byte) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		t.Fatalf("read reply: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(conn, b); err != nil {
		t.Fatalf("read reply: %v", err)
	}
	_, typ, _, off, err := thrift.Binary.ReadMessageBegin(b)
	if err != nil {
		t.Fatal(err)
	}
	return typ, b[off:]
}

func sessionOf(c *fluxkv.Client) *external.Session {
	return &external.Session{ClientId: c.ClientID(), SessionToken: c.SessionToken(), OwnerGeneration: c.Generation()}
}

// TestRPCDeadlines: a partial frame is closed by FrameTimeout, a connection that never
// named a session by IdleTimeout; a connection of a live session idles through several
// IdleTimeouts, and is closed within one once its session ended.
//
// Not parallel: the test's own calls must beat 300 ms deadlines.
func TestRPCDeadlines(t *testing.T) {
	const timeout = 300 * time.Millisecond
	n := startLimitNode(t, Options{FrameTimeout: timeout, IdleTimeout: timeout})
	// A partial frame: half a header, and a header with part of its body.
	for _, partial := range [][]byte{{0, 0}, {0, 0, 1, 0, 0x80, 1}} {
		conn := dialRPC(t, n.o)
		conn.Write(partial)
		waitClosed(t, conn, 30*time.Second)
	}
	if got := n.counter(t, "fluxkv_conn_timeouts_total", "socket", "rpc", "kind", "frame"); got != 2 {
		t.Fatalf("frame timeouts: %v, want 2", got)
	}
	// Silent from the start.
	idle := dialRPC(t, n.o)
	waitClosed(t, idle, 30*time.Second)
	// A call with a session that does not exist does not make a connection live.
	c := n.connect(t, "live")
	bogus := dialRPC(t, n.o)
	bogus.Write(frame(t, "Stat", thrift.CALL, &external.ExternalServiceStatArgs{Req: &external.StatRequest{Session: &external.Session{ClientId: 999, OwnerGeneration: n.o.Generation()}}}))
	readReply(t, bogus)
	waitClosed(t, bogus, 30*time.Second)
	if got := n.counter(t, "fluxkv_conn_timeouts_total", "socket", "rpc", "kind", "idle"); got < 2 {
		t.Fatalf("idle timeouts: %v, want >= 2", got)
	}
	// A live session's connection stays through 4 idle periods.
	live := dialRPC(t, n.o)
	exists := func() {
		t.Helper()
		live.Write(frame(t, "Exists", thrift.CALL, &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: sessionOf(c), Key: "k"}}))
		if typ, body := readReply(t, live); typ != thrift.REPLY {
			t.Fatalf("exists: message type %d: %q", typ, body)
		}
	}
	exists()
	time.Sleep(4 * timeout)
	exists()
	// Its session ends: the connection is closed by the idle deadline.
	c.Close()
	waitClosed(t, live, 30*time.Second)
	if strings.Contains(n.log.String(), `"level":"error"`) {
		t.Fatalf("errors logged:\n%s", n.log)
	}
}

// TestAttachHelloDeadline: an attach connection that never says hello is closed by
// HelloTimeout and counted; the node keeps attaching others.
//
// Not parallel: the last client's hello must beat a 200 ms deadline.
func TestAttachHelloDeadline(t *testing.T) {
	n := startLimitNode(t, Options{HelloTimeout: 200 * time.Millisecond})
	silent, err := net.Dial("unix", n.o.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	half, err := net.Dial("unix", n.o.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	half.Write([]byte{0, 0, 0, 40, 1, 2}) // a hello that never completes
	waitClosed(t, silent, 30*time.Second)
	waitClosed(t, half, 30*time.Second)
	if got := n.counter(t, "fluxkv_conn_timeouts_total", "socket", "attach", "kind", "hello"); got != 2 {
		t.Fatalf("hello timeouts: %v, want 2", got)
	}
	c := n.connect(t, "after")
	if err := c.Put("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// TestConnectionCap: over the cap, attaches are refused with the cap message and RPC
// connections closed at once, while an existing client keeps working; once the flood
// is gone, new clients attach again.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	const max = 6
	n := startLimitNode(t, Options{MaxConnections: max})
	c := n.connect(t, "existing")
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	// Fill both sockets: the existing client holds one attach connection and at least
	// one RPC connection.
	var flood []net.Conn
	defer func() {
		for _, f := range flood {
			f.Close()
		}
	}()
	for _, path := range []string{n.o.SocketPath(), wire.RPCSocketPath(n.o.SocketPath())} {
		for i := 0; i < 2*max; i++ {
			f, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			flood = append(flood, f)
		}
	}
	// Attaches over the cap get a clear refusal.
	for i := 0; i < 3; i++ {
		_, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: "over"})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("connection cap %d reached", max)) {
			t.Fatalf("attach over the cap: %v", err)
		}
	}
	// A raw RPC connection over the cap is closed without a reply.
	over := dialRPC(t, n.o)
	over.Write(frame(t, "Stat", thrift.CALL, &external.ExternalServiceStatArgs{Req: &external.StatRequest{Session: sessionOf(c)}}))
	if b := waitClosed(t, over, 30*time.Second); len(b) != 0 {
		t.Fatalf("refused RPC connection got %d bytes", len(b))
	}
	// The existing client uses its pooled connection(s).
	for i := 0; i < 20; i++ {
		h, err := c.Get("k")
		if err != nil {
			t.Fatalf("existing client during the flood: %v", err)
		}
		if string(h.Bytes()) != "value" {
			t.Fatal("wrong bytes")
		}
		h.Release()
	}
	if got := n.counter(t, "fluxkv_conn_refused_total", "socket", "attach", "reason", "cap"); got < 3 {
		t.Fatalf("attach cap refusals: %v", got)
	}
	if got := n.counter(t, "fluxkv_conn_refused_total", "socket", "rpc", "reason", "cap"); got < 1 {
		t.Fatalf("rpc cap refusals: %v", got)
	}
	for _, f := range flood {
		f.Close()
	}
	flood = nil
	// The flood's connections end (idle/hello deadlines or EOF): new clients attach.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c2, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: "after"})
		if err == nil {
			if _, err := c2.Exists("k"); err != nil {
				t.Fatal(err)
			}
			c2.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no attach after the flood: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAnnouncedFrameNotAllocated: connections announcing 32 MiB frames and sending
// nothing more cost the owner little memory (before: the announced length each).
//
// Not parallel: it measures the process's allocations (runtime.MemStats).
func TestAnnouncedFrameNotAllocated(t *testing.T) {
	const conns = 20
	n := startLimitNode(t, Options{FrameTimeout: 500 * time.Millisecond})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var cs []net.Conn
	for i := 0; i < conns; i++ {
		conn := dialRPC(t, n.o)
		conn.Write(binary.BigEndian.AppendUint32(nil, uint32(wire.MaxFrameBytes-4)))
		conn.Write(make([]byte, 1000))
		cs = append(cs, conn)
	}
	// Each is closed by the frame deadline: by then its header was read and the body
	// waited for, or (past the two frames the 64 MiB frame budget holds) the frame's
	// memory was waited for and refused.
	for _, conn := range cs {
		waitClosed(t, conn, 30*time.Second)
	}
	runtime.ReadMemStats(&after)
	timeouts := n.counter(t, "fluxkv_conn_timeouts_total", "socket", "rpc", "kind", "frame")
	refused := n.counter(t, "fluxkv_conn_refused_total", "socket", "rpc", "reason", "frame_memory")
	if timeouts+refused != conns || timeouts < 2 {
		t.Fatalf("frame timeouts %v and frame-memory refusals %v, want %d in all, at least 2 timeouts", timeouts, refused, conns)
	}
	// Announced: 20 × 32 MiB = 640 MiB. Allowed: everything else the process did
	// meanwhile, generously.
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<20 {
		t.Fatalf("allocated %d MiB while %d connections announced 32 MiB frames", got>>20, conns)
	}
	// Over the limit: closed at once, counted as a refused frame.
	big := dialRPC(t, n.o)
	big.Write(binary.BigEndian.AppendUint32(nil, uint32(wire.MaxFrameBytes-3)))
	waitClosed(t, big, 30*time.Second)
	if got := n.counter(t, "fluxkv_conn_refused_total", "socket", "rpc", "reason", "frame"); got != 1 {
		t.Fatalf("refused frames %v, want 1", got)
	}
}

// TestHostileCalls: ONEWAY and REPLY-typed messages get a TApplicationException and
// the connection closes; 5000 piggybacked releases fail the call with INVALID_ARGUMENT
// and release nothing; a hostile list size is refused without allocating it.
//
// Not parallel: it measures the process's allocations (runtime.MemStats).
func TestHostileCalls(t *testing.T) {
	n := startLimitNode(t, Options{})
	c := n.connect(t, "hostile")
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []thrift.TMessageType{thrift.ONEWAY, thrift.REPLY} {
		conn := dialRPC(t, n.o)
		conn.Write(frame(t, "Exists", typ, &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: sessionOf(c), Key: "k"}}))
		got, body := readReply(t, conn)
		if got != thrift.EXCEPTION {
			t.Fatalf("message type %d answered with type %d", typ, got)
		}
		ex := thrift.NewApplicationException(0, "")
		if _, err := ex.FastRead(body); err != nil || ex.TypeID() != thrift.INVALID_MESSAGE_TYPE_EXCEPTION {
			t.Fatalf("exception %v %v", ex, err)
		}
		waitClosed(t, conn, 30*time.Second)
	}
	if got := n.counter(t, "fluxkv_conn_refused_total", "socket", "rpc", "reason", "frame"); got != 2 {
		t.Fatalf("refused frames %v, want 2", got)
	}

	// 5000 releases, one of them a real holder: INVALID_ARGUMENT, and the holder lives.
	h, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	s := sessionOf(c)
	s.Releases = append(s.Releases, h.ID())
	for i := 1; len(s.Releases) < 5000; i++ {
		s.Releases = append(s.Releases, int64(1_000_000+i))
	}
	res := &external.ExternalServiceExistsResult{}
	if err := c.Call("Exists", &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: s, Key: "k"}}, res); err != nil {
		t.Fatal(err)
	}
	if res.Success.Code != common.ErrorCode_INVALID_ARGUMENT || !strings.Contains(res.Success.Message, "4096") {
		t.Fatalf("5000 releases: %v %q", res.Success.Code, res.Success.Message)
	}
	st := &external.ExternalServiceStatResult{}
	if err := c.Call("Stat", &external.ExternalServiceStatArgs{Req: &external.StatRequest{Session: sessionOf(c)}}, st); err != nil {
		t.Fatal(err)
	}
	if st.Success.ClientHolders != 1 {
		t.Fatalf("holders after the refused releases: %d, want 1", st.Success.ClientHolders)
	}
	// Exactly the limit is fine (the bogus ids are ignored, the holder released).
	s.Releases = s.Releases[:wire.MaxReleasesPerCall]
	if err := c.Call("Exists", &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: s, Key: "k"}}, res); err != nil || res.Success.Code != common.ErrorCode_OK {
		t.Fatalf("4096 releases: %v %+v", err, res.Success)
	}
	if err := c.Call("Stat", &external.ExternalServiceStatArgs{Req: &external.StatRequest{Session: sessionOf(c)}}, st); err != nil || st.Success.ClientHolders != 0 {
		t.Fatalf("holders after 4096 releases: %v %d", err, st.Success.ClientHolders)
	}

	// A list announcing 2^31-1 ids in a 60-byte frame: a protocol error, nothing
	// allocated for it (the old decoder made a 16 GiB slice).
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	msg := thrift.Binary.AppendMessageBegin(nil, "Release", thrift.CALL, 1)
	msg = append(msg, byte(thrift.STRUCT), 0, 1, byte(thrift.LIST), 0, 2, byte(thrift.I64), 0x7f, 0xff, 0xff, 0xff, 0, 0)
	conn := dialRPC(t, n.o)
	conn.Write(appendFrame(nil, msg))
	if typ, _ := readReply(t, conn); typ != thrift.EXCEPTION {
		t.Fatalf("hostile list size answered with %d", typ)
	}
	waitClosed(t, conn, 30*time.Second)
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<20 {
		t.Fatalf("allocated %d MiB for a hostile list size", got>>20)
	}
	if _, err := c.Exists("k"); err != nil {
		t.Fatalf("node after hostile calls: %v", err)
	}
}

// TestHelloBounds: a 300-byte name is refused with INVALID_ARGUMENT and not logged in
// full; a hello frame over MAX_ATTACH_FRAME_BYTES is refused too.
func TestHelloBounds(t *testing.T) {
	t.Parallel()
	n := startLimitNode(t, Options{})
	name := strings.Repeat("n", 299) + "Z"
	_, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: name})
	if err == nil || !strings.Contains(err.Error(), "300 bytes exceeds the limit of 256") {
		t.Fatalf("300-byte name: %v", err)
	}
	if code := wire.CodeOf(err); code != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("300-byte name: code %v", code)
	}
	// Raw: the reply itself.
	conn, err := net.Dial("unix", n.o.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	shm.WriteFrame(conn, thrift.FastMarshal(&external.AttachHello{ProtocolVersion: external.PROTOCOL_VERSION, Name: name}))
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	body, err := shm.ReadFrame(conn, 0)
	if err != nil {
		t.Fatal(err)
	}
	var reply external.AttachReply
	if _, err := reply.FastRead(body); err != nil {
		t.Fatal(err)
	}
	if reply.Code != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("reply code %v", reply.Code)
	}
	if strings.Contains(n.log.String(), name) || !strings.Contains(n.log.String(), `"name_bytes":300`) {
		t.Fatalf("the log shows the whole name or not its size:\n%s", n.log)
	}
	// A hello frame over the attach frame limit.
	big, err := net.Dial("unix", n.o.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	big.Write(binary.BigEndian.AppendUint32(nil, uint32(wire.MaxAttachFrameBytes)))
	big.SetReadDeadline(time.Now().Add(20 * time.Second))
	body, err = shm.ReadFrame(big, 0)
	if err != nil {
		t.Fatal(err)
	}
	reply = external.AttachReply{}
	if _, err := reply.FastRead(body); err != nil || reply.Code != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("oversized hello: %v %+v", err, reply)
	}
	if got := n.counter(t, "fluxkv_conn_refused_total", "socket", "attach", "reason", "hello"); got != 3 {
		t.Fatalf("refused hellos %v, want 3", got)
	}
	c := n.connect(t, strings.Repeat("x", wire.MaxHelloNameBytes))
	if err := c.Put("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// TestDefaultMaxConnections: the derived caps stay within their bounds, and all of
// them full at once (both sockets, the data plane's connections and handshakes, the peer
// service's handshakes, the owner's own pulls) fit the open-file limit with the base left
// over (a review: from nofile 8,192 they took all of it, below 4,096 more than all).
func TestDefaultMaxConnections(t *testing.T) {
	for _, tc := range []struct {
		nofile uint64
		so     *ssd.Options
		want   int
	}{
		{256, nil, 80},
		{1024, nil, 416},
		{20000, nil, 8718},
		{1 << 20, nil, maxDerivedConnections},
		{64, nil, minConnections},
		{256, &ssd.Options{Paths: []string{"a", "b"}}, 64},
		{256, &ssd.Options{Paths: []string{"a"}, ShardsPerDevice: 12}, 68},
	} {
		got := defaultMaxConnections(tc.nofile, tc.so)
		if got != tc.want {
			t.Errorf("nofile %d: cap %d, want %d", tc.nofile, got, tc.want)
		}
	}
	for _, nofile := range []uint64{256, 1024, 4096, 8192, 20000, 65536, 1 << 20} {
		for _, so := range []*ssd.Options{nil, {Paths: []string{"a", "b"}}} {
			base := fdReserve(nofile, so) - nofile/8
			used := 2*uint64(defaultMaxConnections(nofile, so)) + 2*uint64(dataPlaneConnections(nofile)) +
				uint64(peerPendingHandshakes(nofile)) + nofile/32 // the owner's own pulls
			if used+base > nofile {
				t.Errorf("nofile %d (SSD %v): the caps take %d fds and the base %d", nofile, so != nil, used, base)
			}
		}
	}
	// The data plane's cap: 4 connections for each of over 64 busy peers from nofile
	// 8,192, more with the open-file limit, never past the memory of 8,192 idle connections.
	for _, tc := range []struct {
		nofile uint64
		want   int
	}{{256, 8}, {1024, 32}, {8192, 256}, {65536, 2048}, {1 << 20, 8192}} {
		if got := dataPlaneConnections(tc.nofile); got != tc.want {
			t.Errorf("nofile %d: data plane cap %d, want %d", tc.nofile, got, tc.want)
		}
	}
	o := Options{MasterAddr: "x:1"}
	o.setDefaults()
	if o.MaxConnections != defaultMaxConnections(nofileLimit(), nil) || o.HelloTimeout != 5*time.Second ||
		o.FrameTimeout != 10*time.Second || o.IdleTimeout != 10*time.Second {
		t.Fatalf("defaults: %+v", o)
	}
	for _, bad := range []Options{{MasterAddr: "x:1", MaxConnections: -1}, {MasterAddr: "x:1", IdleTimeout: -time.Second}} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
