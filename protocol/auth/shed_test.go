package auth

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/metrics"
)

var (
	srcA = netip.MustParseAddr("192.0.2.1")
	srcB = netip.MustParseAddr("192.0.2.2")
	srcC = netip.MustParseAddr("192.0.2.3")
)

// queueScript adds entries to q and records what each addition shed.
type queueScript struct {
	t       *testing.T
	q       *shedQueue
	entries []*pendingEntry
	shed    map[*pendingEntry]string
	lazy    bool // check the invariants only when asked (long scripts)
}

func newQueueScript(t *testing.T, max, perSource int) *queueScript {
	return &queueScript{t: t, q: newShedQueue(max, perSource), shed: map[*pendingEntry]string{}}
}

// add queues one entry from src and returns it with the index and reason of what it shed
// (-1, "" for nothing).
func (s *queueScript) add(src sourceKey) (e *pendingEntry, victim int, reason string) {
	e = &pendingEntry{src: src}
	v, r := s.q.add(e)
	s.entries = append(s.entries, e)
	victim = -1
	if v != nil {
		if v == e {
			s.t.Fatal("the arriving entry was shed")
		}
		if _, again := s.shed[v]; again {
			s.t.Fatal("an entry was shed twice")
		}
		s.shed[v] = r
		for i := len(s.entries) - 1; i >= 0; i-- {
			if s.entries[i] == v {
				victim = i
				break
			}
		}
	}
	if !s.lazy {
		s.check()
	}
	return e, victim, r
}

// check verifies the queue's invariants: bounds, counts and both lists in order.
func (s *queueScript) check() {
	t, q := s.t, s.q
	t.Helper()
	if q.len() > q.max {
		t.Fatalf("%d queued, max %d", q.len(), q.max)
	}
	n, last := 0, uint64(0)
	bySrc := map[sourceKey]int{}
	for e := q.all.head; e != nil; e = e.next {
		if e.seq <= last || !e.queued {
			t.Fatal("list of all entries out of order")
		}
		last = e.seq
		n++
		bySrc[e.src]++
	}
	if n != q.len() {
		t.Fatalf("%d linked, %d counted", n, q.len())
	}
	if len(bySrc) != len(q.sources) {
		t.Fatalf("%d sources linked, %d indexed (an empty one left behind?)", len(bySrc), len(q.sources))
	}
	for src, l := range q.sources {
		m, last := 0, uint64(0)
		for e := l.head; e != nil; e = e.snext {
			if e.seq <= last || e.src != src {
				t.Fatal("a source list out of order or mixed")
			}
			last = e.seq
			m++
		}
		if m != l.n || m != bySrc[src] || m > q.perSource {
			t.Fatalf("source %v: %d linked, %d counted, %d in all, cap %d", src, m, l.n, bySrc[src], q.perSource)
		}
	}
}

// The total full, one source: each arrival sheds the oldest, in admission order.
func TestShedOldestFirst(t *testing.T) {
	s := newQueueScript(t, 4, 4)
	for i := range 4 {
		if _, v, _ := s.add(srcA); v != -1 {
			t.Fatalf("entry %d shed %d below the bound", i, v)
		}
	}
	for i := 4; i < 10; i++ {
		_, v, r := s.add(srcA)
		if v != i-4 || r != metrics.RefuseSourceCap {
			t.Fatalf("arrival %d shed %d (%s), want %d (source_cap)", i, v, r, i-4)
		}
	}
	// A finished handshake leaves a free slot: the next arrival sheds nothing.
	s.q.remove(s.entries[7])
	s.q.remove(s.entries[7]) // twice: no effect
	s.check()
	if _, v, _ := s.add(srcA); v != -1 {
		t.Fatalf("shed %d with a free slot", v)
	}
	if _, v, _ := s.add(srcA); v != 6 {
		t.Fatalf("shed %d, want 6 (7 finished)", v)
	}
}

// A source at its cap sheds its own oldest; other sources keep theirs.
func TestShedSourceCap(t *testing.T) {
	s := newQueueScript(t, 10, 3)
	b, _, _ := s.add(srcB)
	for range 3 {
		s.add(srcA)
	}
	for i := range 20 {
		_, v, r := s.add(srcA)
		if r != metrics.RefuseSourceCap || s.entries[v].src != srcA {
			t.Fatalf("arrival %d shed %d from %v (%s), want A's oldest for source_cap", i, v, s.entries[v].src, r)
		}
	}
	if !b.queued || s.q.sources[srcA].n != 3 || s.q.len() != 4 {
		t.Fatalf("B queued %v, A holds %d, %d in all", b.queued, s.q.sources[srcA].n, s.q.len())
	}
}

// The total full: the source holding the most loses its oldest, the oldest of all among
// equals; a light source is not shed while another holds more.
func TestShedHeaviestSource(t *testing.T) {
	s := newQueueScript(t, 6, 4)
	for range 4 {
		s.add(srcA) // 0..3
	}
	s.add(srcB) // 4
	s.add(srcB) // 5
	if _, v, r := s.add(srcB); v != 0 || r != metrics.RefuseShed {
		t.Fatalf("shed %d (%s), want 0: A holds the most", v, r)
	} // A 3, B 3
	if _, v, _ := s.add(srcC); v != 1 {
		t.Fatalf("shed %d, want 1: A and B hold 3 each, A's oldest is older", v)
	} // A 2, B 3, C 1
	if _, v, _ := s.add(srcC); v != 4 {
		t.Fatalf("shed %d, want 4: B holds the most", v)
	}
}

// A flood from one source, however long, never sheds another source's connection and
// holds at most its share; a connection of the flooding source itself lives through
// exactly perSource-1 newer ones from it (the window an honest dial there has).
func TestShedFlood(t *testing.T) {
	const max, perSource = 256, 64
	s := newQueueScript(t, max, perSource)
	s.lazy = true
	defer s.check()
	honest, _, _ := s.add(srcB)
	for range 10 * max {
		s.add(srcA)
	}
	s.check()
	if !honest.queued || s.q.sources[srcA].n != perSource {
		t.Fatalf("other source's entry queued %v; flood holds %d", honest.queued, s.q.sources[srcA].n)
	}
	same, _, _ := s.add(srcA)
	for i := 1; same.queued; i++ {
		s.add(srcA)
		if !same.queued && i != perSource {
			t.Fatalf("an entry of the flooding source was shed after %d newer ones, want %d", i, perSource)
		}
	}
	// Many flooding sources fill the total: the light one still stays.
	for i := range 20 * max {
		s.add(netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 8)}))
	}
	if !honest.queued || s.q.len() != max {
		t.Fatalf("light source's entry queued %v with %d queued", honest.queued, s.q.len())
	}
}

// An entry whose client answered and waits for the server to read it is passed over;
// when every candidate did, the oldest goes.
func TestShedPassesOverAnswered(t *testing.T) {
	s := newQueueScript(t, 4, 4)
	waiting := map[*pendingEntry]bool{}
	s.q.answered = func(e *pendingEntry) bool { return waiting[e] }
	for range 4 {
		s.add(srcA) // 0..3
	}
	waiting[s.entries[0]], waiting[s.entries[1]] = true, true
	if _, v, _ := s.add(srcA); v != 2 {
		t.Fatalf("shed %d, want 2: 0 and 1 answered", v)
	}
	waiting[s.entries[3]], waiting[s.entries[4]] = true, true
	if _, v, _ := s.add(srcA); v != 0 {
		t.Fatalf("shed %d, want 0: all answered, the oldest goes", v)
	}
}

func TestSourceOf(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, tc := range []struct {
		a, b net.Addr
		same bool
	}{
		{tcp("10.0.0.1:1"), tcp("10.0.0.1:2"), true},
		{tcp("10.0.0.1:1"), tcp("10.0.0.2:1"), false},
		{tcp("10.0.0.1:1"), tcp("[::ffff:10.0.0.1]:2"), true},
		{tcp("[2001:db8:1:2::1]:1"), tcp("[2001:db8:1:2:ffff::9]:1"), true}, // one /64
		{tcp("[2001:db8:1:2::1]:1"), tcp("[2001:db8:1:3::1]:1"), false},
		{&net.UnixAddr{Name: "a"}, &net.UnixAddr{Name: "b"}, true},
	} {
		if got := sourceOf(tc.a) == sourceOf(tc.b); got != tc.same {
			t.Errorf("%v and %v: same source %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

// A listener whose pending bound is full sheds its oldest connection for a new one; a
// shed client past the hello reads a busy verdict and says so. No timing: each step
// waits for the one before it.
func TestListenerShedsOldest(t *testing.T) {
	s := testSecrets(t, "k")
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	const max = 3
	ln := Listener(raw, s, PurposePeer, ListenerOptions{MaxPending: max, MaxPendingPerSource: max, Metrics: m, Timeout: time.Minute})
	defer ln.Close()
	// A server that authenticates each connection and then closes it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				Handshake(c)
			}()
		}
	}()
	addr := raw.Addr().String()
	dialHello := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(time.Minute))
		if _, err := readHello(c, PurposePeer, addr); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var silent []net.Conn
	for range max {
		silent = append(silent, dialHello()) // each admitted, in this order
	}
	waitHellos(t, ln, max)
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	for i := range 2 {
		// A new dial authenticates, and the oldest silent connection was shed for it,
		// after a busy verdict: its client reads it and says so.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := ClientHandshake(c, s, PurposePeer, addr, time.Minute); err != nil {
			t.Fatalf("dial %d with the bound full: %v", i, err)
		}
		c.Close()
		err = answerHello(silent[i], s, PurposePeer, addr, make([]byte, nonceLen), nil)
		if !errors.Is(err, ErrHandshakeIncomplete) || !errors.Is(err, ErrAuthFailed) || !strings.Contains(err.Error(), "busy") {
			t.Fatalf("shed connection %d: %v, want a busy verdict", i, err)
		}
		if _, err := silent[i].Read(make([]byte, 1)); err == nil {
			t.Fatalf("shed connection %d still open", i)
		}
		silent = append(silent, dialHello()) // the bound full again
		waitHellos(t, ln, max)
	}
	if got := refused(t, m, PurposePeer, metrics.RefuseShed); got != 0 {
		t.Errorf("shed %v for the total, want 0: one source", got)
	}
	if got := refused(t, m, PurposePeer, metrics.RefuseSourceCap); got != 2 {
		t.Errorf("shed %v for the source cap, want 2", got)
	}
	if got := refused(t, m, PurposePeer, metrics.RefuseAuth); got != 0 {
		t.Errorf("%v counted as failed authentication, want 0 (shed ones are counted once)", got)
	}
	ln.Close()
	<-done
}

// What a client says when the server closes before its hello or its verdict.
func TestClientErrorsSayWhatHappened(t *testing.T) {
	s := testSecrets(t, "k")
	for _, tc := range []struct {
		name   string
		server func(c net.Conn)
		want   string
	}{
		{"closed before the hello", func(c net.Conn) {}, "closed the connection before its authentication hello"},
		{"closed before the verdict", func(c net.Conn) {
			var b [helloLen]byte
			copy(b[:], magic)
			b[len(magic)] = version
			copy(b[headerLen:], purposeField(PurposeData))
			c.Write(b[:])
			io.ReadFull(c, make([]byte, answerLen))
		}, "closed the connection before its verdict"},
		{"no hello", func(c net.Conn) { c.Read(make([]byte, 1)) }, "overloaded with connections in their handshake, runs with --insecure-cluster, or is not a fluxkv data port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			go func() {
				tc.server(a)
				a.Close()
			}()
			defer b.Close()
			b.SetDeadline(time.Now().Add(time.Second))
			if tc.name == "no hello" {
				b.SetDeadline(time.Now().Add(20 * time.Millisecond))
			}
			err := clientHandshake(b, s, PurposeData, "srv")
			if !errors.Is(err, ErrAuthFailed) || !errors.Is(err, ErrHandshakeIncomplete) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// waitHellos waits until n connections are pending with their hello recorded as sent
// (the client can read it a moment before the server records it): only then is the busy
// verdict of a shed one certain.
func waitHellos(t *testing.T, ln net.Listener, n int) {
	t.Helper()
	l := ln.(*listener)
	deadline := time.Now().Add(time.Minute)
	for {
		l.mu.Lock()
		got := 0
		for e := l.pending.all.head; e != nil; e = e.next {
			if e.c.phase == phaseHello {
				got++
			}
		}
		l.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			for e := l.pending.all.head; e != nil; e = e.next {
				t.Logf("entry %d phase %d shed %q", e.seq, e.c.phase, e.c.shed)
			}
			t.Logf("queued %d", l.pending.len())
			l.mu.Unlock()
			t.Fatalf("%d connections pending past their hello, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// refused is fluxkv_conn_refused_total{socket, reason} in m.
func refused(t *testing.T, m *metrics.Metrics, socket, reason string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "fluxkv_conn_refused_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range mt.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["socket"] == socket && labels["reason"] == reason {
				return mt.GetCounter().GetValue()
			}
		}
	}
	return 0
}
