package daemon

import (
	"bytes"
	"net"
	"testing"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// TestLostReplyTakesBackGrants: a client whose call timed out closes its connection
// and never learns the holder (or put) the reply handed it. The owner takes it back at
// once instead of holding it until the session ends: when the client closed the
// connection with the reply unread (a Get, a BatchGet, a PutStart, a BatchPutStart), and when it closed
// the connection before the reply was written (a Get whose SSD refill was slow). A
// reply the client read keeps its holder after the connection closes.
func TestLostReplyTakesBackGrants(t *testing.T) {
	t.Parallel()
	om := metrics.New()
	n := startNode(t, 4<<20, ssdOptions(t, 16<<20),
		master.Options{InsecureCluster: true, WriteQuiet: -1},
		func(o *Options) { o.TransferReserve = -1; o.CacheGrace = -1; o.Metrics = om })
	const size = 1 << 20
	want := value(1, size)
	if err := n.c.Put("k", want); err != nil {
		t.Fatal(err)
	}
	n.waitPersisted(t)
	sess := rawSession(n.c)
	grants := func() (holders, puts int) {
		st := n.o.lock()
		defer n.o.unlock()
		c := st.sessions[sess.ClientId]
		return len(c.holders), len(c.puts)
	}
	lost := func() float64 { return counter(t, om, "fluxkv_lost_replies_total", nil) }
	rpcConns := func() int { return n.o.rpc.acc.open() }
	base := rpcConns()
	dial := func() net.Conn { return dialRPC(t, n.o) }
	// closeUnread waits until the reply of the call sent on c is in c's receive queue
	// and the owner waits for c's next request, then closes c without reading.
	closeUnread := func(c net.Conn) {
		t.Helper()
		raw, err := c.(*net.UnixConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		waitUntil(t, func() bool {
			queued := 0
			raw.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
			return queued > 0
		})
		c.Close()
	}
	getFrame := frame(t, "Get", thrift.CALL, &external.ExternalServiceGetArgs{Req: &external.GetRequest{Session: sess, Key: "k"}})

	// The reply of a slow get written after the client closed: k's memory replica goes
	// for the others' room (k stays on SSD), the get refills it, and the refill waits
	// (hook) until the client has closed the connection.
	for _, key := range []string{"o1", "o2", "o3", "o4"} {
		if err := n.c.Put(key, value(2, size)); err != nil {
			t.Fatal(err)
		}
	}
	n.c.Flush()
	refilling := make(chan struct{}, 1)
	closed := make(chan struct{})
	n.o.mu.Lock()
	n.o.mu.afterWrite = func(int64) { refilling <- struct{}{}; <-closed }
	n.o.mu.Unlock()
	c := dial()
	c.Write(getFrame)
	<-refilling
	c.Close()
	close(closed)
	waitUntil(t, func() bool { return lost() == 1 })
	if h, _ := grants(); h != 0 {
		t.Fatalf("after a reply written to a closed connection the session holds %d holders, want 0", h)
	}
	n.o.mu.Lock()
	n.o.mu.afterWrite = nil
	n.o.mu.Unlock()

	// A reply read keeps its holder: the client knows it and releases it itself.
	c = dial()
	c.Write(getFrame)
	readReply(t, c)
	c.Close()
	waitUntil(t, func() bool { return rpcConns() == base })
	if h, _ := grants(); h != 1 || lost() != 1 {
		t.Fatalf("a read reply, its connection closed: the session holds %d holders (want 1), %v replies lost (want 1)", h, lost())
	}

	// loseReply sends request f on a new connection and closes it with the reply unread,
	// the owner's lostCount-th lost reply; it returns what the session holds then.
	loseReply := func(f []byte, lostCount float64) (holders, puts int) {
		t.Helper()
		c := dial()
		c.Write(f)
		closeUnread(c)
		waitUntil(t, func() bool { return lost() == lostCount })
		return grants()
	}

	// A reply left unread: the holder it named goes.
	if h, _ := loseReply(getFrame, 2); h != 1 {
		t.Fatalf("after an unread Get reply the session holds %d holders, want 1", h)
	}
	// BatchGet: every holder of the reply.
	if h, _ := loseReply(frame(t, "BatchGet", thrift.CALL, &external.ExternalServiceBatchGetArgs{
		Req: &external.BatchKeysRequest{Session: sess, Keys: []string{"k", "absent", "o4"}}}), 3); h != 1 {
		t.Fatalf("after an unread BatchGet reply the session holds %d holders, want 1", h)
	}
	// PutStart: the put it started is aborted (its range freed at the master).
	if _, p := loseReply(frame(t, "PutStart", thrift.CALL, &external.ExternalServicePutStartArgs{
		Req: &external.PutStartRequest{Session: sess, Key: "p", Len: size}}), 4); p != 0 {
		t.Fatalf("after an unread PutStart reply the session has %d puts pending, want 0", p)
	}
	// BatchPutStart: every put it started.
	if _, p := loseReply(frame(t, "BatchPutStart", thrift.CALL, &external.ExternalServiceBatchPutStartArgs{
		Req: &external.BatchPutStartRequest{Session: sess, Items: []*external.PutStartItem{{Key: "bp1", Len: 4096}, {Key: "bp2", Len: 4096}}}}), 5); p != 0 {
		t.Fatalf("after an unread BatchPutStart reply the session has %d puts pending, want 0", p)
	}
	waitUntil(t, func() bool {
		puts := -1
		n.m.Inspect(func(st *master.State) { puts = st.PutsInFlight() })
		return puts == 0
	})

	// The holder kept all along is the read reply's, and k's bytes are intact.
	h, err := n.c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if !bytes.Equal(h.Bytes(), want) {
		t.Fatal("get k: wrong bytes")
	}
}
