package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/shm"
)

// pinState is an owner state with a 1000-byte pin budget and sessions 1 and 2.
func pinState() (*ownerState, *session, *session) {
	st := newOwnerState(stateOptions{nodeID: "n", generation: 1, segSize: 1 << 20, grace: time.Minute, hotBudget: 1000, pinBudget: 1000})
	a := newSession(1, 1, "a", shm.Cred{}, nil, nil)
	b := newSession(2, 2, "b", shm.Cred{}, nil, nil)
	st.sessions[1], st.sessions[2] = a, b
	return &st, a, b
}

// pinPage gives c a holder of key@putID (len bytes; the hot set's holding of that
// version, made if new) and pins it for 5 s; false (the holder released) if refused.
func pinPage(st *ownerState, c *session, key string, putID, length int64, now time.Time) bool {
	h := st.hot.lookup(key)
	if h == nil || h.putID != putID {
		h, _ = st.hot.install(&holding{key: key, putID: putID, len: length, masterID: putID*1000 + length, replica: true}, st.hot.invalSeq())
	}
	id := st.newHolder(c, h)
	if st.pinHolder(c, key, &external.GetResponse{HolderId: id, PutId: putID, Len: length}, now.Add(5*time.Second), now) {
		return true
	}
	st.release(c, id, now)
	return false
}

// TestPinReplacedByAnotherVersion: a session alone whose pin of a key is replaced by a
// pin of the key's next version frees the old one's room first: it neither fails for
// want of room the old pin held nor locks itself out of the budget past half.
func TestPinReplacedByAnotherVersion(t *testing.T) {
	st, a, _ := pinState()
	now := time.Now()
	if !pinPage(st, a, "z", 1, 300, now) || !pinPage(st, a, "x", 1, 600, now) {
		t.Fatal("pins within the budget refused")
	}
	if !pinPage(st, a, "x", 2, 200, now) {
		t.Fatalf("the pin of x's next version (200 bytes, 300 + 600 pinned of 1000) was refused")
	}
	if !pinPage(st, a, "y", 1, 400, now) { // 900 of 1000, past half, nobody else pins
		t.Fatalf("a session alone was held to half of the budget (pinned %d)", st.hot.pinned)
	}
	if st.hot.pinned != 900 || a.pinned != 900 {
		t.Fatalf("pinned %d, the session's %d, want 900", st.hot.pinned, a.pinned)
	}
}

// TestPinContention: when a session within its half finds no room, the sessions past
// their half shrink to it at once and pin no more past it for a while; pages both pin
// count once.
func TestPinContention(t *testing.T) {
	st, a, b := pinState()
	now := time.Now()
	for i, k := range []string{"p0", "p1", "p2", "p3", "p4"} {
		if !pinPage(st, a, k, 1, 200, now) {
			t.Fatalf("a, alone, could not pin %s (%d of 1000 pinned)", k, i*200)
		}
	}
	if !pinPage(st, b, "p0", 1, 200, now) || st.hot.pinned != 1000 {
		t.Fatalf("b's pin of a page a pins: pinned %d, want it charged once (1000)", st.hot.pinned)
	}
	// b finds the budget full within its half: a's pins past half end at once, and b's
	// pin goes in.
	if !pinPage(st, b, "q", 1, 100, now) {
		t.Fatal("b, within its half, found no room although a held the budget past its half")
	}
	if a.pinned > 500 || st.hot.pinned > 1000 {
		t.Fatalf("a keeps %d pinned bytes (past half of 1000), the budget %d", a.pinned, st.hot.pinned)
	}
	if pinPage(st, a, "p9", 1, 200, now) && a.pinned > 500 { // past half again, within the contention
		t.Fatal("a pinned past half right after b found no room")
	}
	later := now.Add(pinContention + time.Millisecond)
	st.expirePins(now.Add(6 * time.Second))
	if !pinPage(st, a, "p4", 1, 200, later) || !pinPage(st, a, "p3", 1, 200, later) || !pinPage(st, a, "p2", 1, 200, later) {
		t.Fatal("a held to half after the contention passed")
	}
}

// TestPinShareOfThree: two sessions holding half of the pin budget each leave a third
// that finds no room within its share: they shrink to a third each, and it pins, also
// a page larger than a third.
func TestPinShareOfThree(t *testing.T) {
	for _, first := range []int64{100, 340} {
		t.Run(fmt.Sprint(first), func(t *testing.T) { pinShareOfThree(t, first) })
	}
}

func pinShareOfThree(t *testing.T, first int64) {
	st, a, b := pinState()
	c := newSession(3, 3, "c", shm.Cred{}, nil, nil)
	st.sessions[3] = c
	now := time.Now()
	for i := range 5 {
		if !pinPage(st, a, fmt.Sprintf("a%d", i), 1, 100, now) || !pinPage(st, b, fmt.Sprintf("b%d", i), 1, 100, now) {
			t.Fatalf("a and b could not pin half each (%d of 1000 pinned)", st.hot.pinned)
		}
	}
	if !pinPage(st, c, "c0", 1, first, now) {
		t.Fatalf("c found no room for %d bytes within its share: a %d, b %d of 1000 pinned", first, a.pinned, b.pinned)
	}
	if first > 333 {
		return
	}
	if a.pinned > 333 || b.pinned > 333 {
		t.Fatalf("a keeps %d, b %d pinned bytes, past a third of 1000", a.pinned, b.pinned)
	}
	if pinPage(st, a, "a9", 1, 100, now) && a.pinned > 333 {
		t.Fatal("a pinned past its share right after c found no room")
	}
	for i := 1; i < 3; i++ {
		if !pinPage(st, c, fmt.Sprintf("c%d", i), 1, 100, now) {
			t.Fatalf("c refused within its share (%d pinned, budget %d of 1000)", c.pinned, st.hot.pinned)
		}
	}
}

// TestNoShedForAPageThatCannotFit: a newcomer's first page, within its share however
// large, makes the others shed only when that makes room for it: a 700-byte page under a
// 1000-byte budget that a session holds 900 of would still not fit once that session
// shrank to its share (500), so nobody sheds and nobody is held to a share (a review:
// the others lost their pins, and were refused past their share, for nothing).
func TestNoShedForAPageThatCannotFit(t *testing.T) {
	st, a, b := pinState()
	now := time.Now()
	for i := range 9 {
		if !pinPage(st, a, fmt.Sprintf("a%d", i), 1, 100, now) {
			t.Fatal("a alone could not pin")
		}
	}
	if pinPage(st, b, "big", 1, 700, now) {
		t.Fatalf("b pinned 700 bytes with %d of 1000 pinned", st.hot.pinned)
	}
	if a.pinned != 900 {
		t.Fatalf("a was shed to %d bytes for a page that could not fit anyway", a.pinned)
	}
	if !pinPage(st, a, "a9", 1, 100, now) {
		t.Fatal("a was held to its share though b pinned nothing")
	}
	// A page that fits once a sheds: a shrinks to its share, b pins.
	if !pinPage(st, b, "small", 1, 400, now) || a.pinned > 500 {
		t.Fatalf("b's 400-byte page: b %d, a %d pinned of 1000", b.pinned, a.pinned)
	}
}

// TestDiedSince: a kill noted after a reset still tells the version died.
func TestDiedSince(t *testing.T) {
	c := newHotSet(time.Minute, 1000, 0)
	seq := c.invalSeq()
	c.reset()
	c.invalidate("k", 5)
	if dead, known := c.diedSince("k", 5, seq); !dead || !known {
		t.Errorf("reset then kill: dead %v known %v, want dead", dead, known)
	}
	if dead, known := c.diedSince("other", 1, seq); dead || known {
		t.Errorf("reset, no kill of the key: dead %v known %v, want unknown", dead, known)
	}
	seq = c.invalSeq()
	c.invalidate("k", 3)
	if dead, known := c.diedSince("k", 5, seq); dead || !known {
		t.Errorf("a kill of older versions: dead %v known %v, want alive, known", dead, known)
	}
}

// TestEndedPutsRing: a session remembers the outcome of its last putEndMemory ended puts,
// the newest answer of a put id winning, and forgets the oldest past that.
func TestEndedPutsRing(t *testing.T) {
	var e endedPuts
	const last = int64(putEndMemory + 10)
	for i := int64(1); i <= last; i++ {
		e.add(i, "k", nil)
	}
	if _, ok := e.lookup(10, "k"); ok {
		t.Error("put 10 of the ring's first lap still remembered")
	}
	if _, ok := e.lookup(11, "k"); !ok {
		t.Error("put 11, the oldest of the last putEndMemory, forgotten")
	}
	if _, ok := e.lookup(last, "other"); ok {
		t.Error("a put id answered for another key")
	}
	e.add(last, "k", errPutExpired(&pendingPut{key: "k"}, time.Second))
	if out, ok := e.lookup(last, "k"); !ok || out == nil {
		t.Errorf("the newest outcome of a put id: %v, %v", out, ok)
	}
	if len(e.ring) != putEndMemory {
		t.Errorf("ring of %d entries, want %d", len(e.ring), putEndMemory)
	}
}
