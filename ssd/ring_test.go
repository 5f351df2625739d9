package ssd

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func mustAlloc(t *testing.T, r *ring, key string, size int64) (*entry, []*entry) {
	t.Helper()
	e, ev, err := r.alloc(key, 1, size, size)
	if err != nil {
		t.Fatalf("alloc %s (%d): %v", key, size, err)
	}
	checkRing(t, r)
	return e, ev
}

func keys(es []*entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.key)
	}
	return out
}

func TestRingAllocWrapEvict(t *testing.T) {
	r := newRing(4096)
	a, ev := mustAlloc(t, r, "a", 2048)
	if r.offset(a) != 0 || len(ev) != 0 {
		t.Fatalf("a at %d evicted %v", r.offset(a), keys(ev))
	}
	r.commit(a)
	b, _ := mustAlloc(t, r, "b", 1536)
	r.commit(b)
	if r.offset(b) != 2048 || r.used() != 3584 {
		t.Fatalf("b at %d used %d", r.offset(b), r.used())
	}
	// 1024 does not fit in the last 512 bytes: skip them, wrap to 0, evict a.
	c, ev := mustAlloc(t, r, "c", 1024)
	if r.offset(c) != 0 || fmt.Sprint(keys(ev)) != "[a]" {
		t.Fatalf("c at %d evicted %v", r.offset(c), keys(ev))
	}
	if !a.evicted || !r.overtaken(a) || r.overtaken(b) {
		t.Fatalf("a evicted %v overtaken %v, b overtaken %v", a.evicted, r.overtaken(a), r.overtaken(b))
	}
	if r.used() != 1536+512+1024 { // b, the skipped 512 bytes, c
		t.Fatalf("used %d", r.used())
	}
	// c is still Writing, but only b is in the way of the next allocations.
	d, ev := mustAlloc(t, r, "d", 512)
	if r.offset(d) != 1024 || len(ev) != 0 {
		t.Fatalf("d at %d evicted %v", r.offset(d), keys(ev))
	}
	e, ev := mustAlloc(t, r, "e", 1024)
	if r.offset(e) != 1536 || fmt.Sprint(keys(ev)) != "[b]" {
		t.Fatalf("e at %d evicted %v", r.offset(e), keys(ev))
	}
	if r.tail != c.begin || r.used() != 2560 {
		t.Fatalf("tail %d (c at %d) used %d", r.tail, c.begin, r.used())
	}
	// Now c (writing) is the oldest: a big allocation must wait for it.
	if _, _, err := r.alloc("f", 1, 4096, 4096); !errors.Is(err, errBlocked) {
		t.Fatalf("alloc over writing c: %v", err)
	}
}

func TestRingNeverOverwritesBusy(t *testing.T) {
	for _, tc := range []struct {
		name string
		busy func(r *ring, e *entry)
		free func(r *ring, e *entry)
	}{
		{"writing", func(r *ring, e *entry) {}, func(r *ring, e *entry) { r.commit(e) }},
		{"read-pinned", func(r *ring, e *entry) { r.commit(e); r.pinRead(e) }, func(r *ring, e *entry) { r.unpinRead(e) }},
		{"commit-pinned", func(r *ring, e *entry) { r.commit(e); r.pinCommit(e) }, func(r *ring, e *entry) { r.unpinCommit(e) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRing(2048)
			a, _ := mustAlloc(t, r, "a", 1024)
			tc.busy(r, a)
			b, _ := mustAlloc(t, r, "b", 1024)
			r.commit(b)
			before := r.used()
			if _, _, err := r.alloc("c", 1, 512, 512); !errors.Is(err, errBlocked) {
				t.Fatalf("alloc over busy a: %v", err)
			}
			if r.used() != before || a.evicted || len(r.live()) != 2 {
				t.Fatal("a blocked alloc changed the ring")
			}
			tc.free(r, a)
			_, ev, err := r.alloc("c", 1, 512, 512)
			if err != nil || fmt.Sprint(keys(ev)) != "[a]" {
				t.Fatalf("alloc after release: %v evicted %v", err, keys(ev))
			}
			checkRing(t, r)
		})
	}
}

func TestRingDeadEntriesAreNotReported(t *testing.T) {
	r := newRing(2048)
	a, _ := mustAlloc(t, r, "a", 1024)
	r.abort(a) // failed write
	b, _ := mustAlloc(t, r, "b", 1024)
	r.commit(b)
	r.kill(b) // removed
	_, ev := mustAlloc(t, r, "c", 2048)
	if len(ev) != 0 || !a.evicted || !b.evicted {
		t.Fatalf("evicted %v (a %v, b %v)", keys(ev), a.evicted, b.evicted)
	}
	if r.pinRead(b) {
		t.Fatal("pinned an evicted entry")
	}
}

func TestRingTooLarge(t *testing.T) {
	r := newRing(1024)
	if _, _, err := r.alloc("x", 1, 1025, 1536); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v", err)
	}
	mustAlloc(t, r, "whole", 1024)
}

// checkRing verifies the ring's invariants.
func checkRing(t testing.TB, r *ring) {
	t.Helper()
	if r.used() < 0 || r.used() > r.size {
		t.Fatalf("used %d outside [0, %d]", r.used(), r.size)
	}
	live := r.live()
	if len(live) > 0 && live[0].begin != r.tail {
		t.Fatalf("tail %d is not the oldest entry's begin %d", r.tail, live[0].begin)
	}
	prevEnd := r.tail
	var phys []([2]int64)
	var liveBytes int64
	for i, e := range live {
		if e.evicted {
			t.Fatalf("live entry %d (%s) is marked evicted", i, e.key)
		}
		if e.begin < prevEnd {
			t.Fatalf("entry %s begins at %d before the previous end %d", e.key, e.begin, prevEnd)
		}
		off := r.offset(e)
		if off%Align != 0 || e.size%Align != 0 || off+e.size > r.size {
			t.Fatalf("entry %s at %d size %d straddles or is unaligned (ring %d)", e.key, off, e.size, r.size)
		}
		phys = append(phys, [2]int64{off, off + e.size})
		liveBytes += e.size
		prevEnd = e.begin + e.size
	}
	if prevEnd != r.head && len(live) > 0 {
		t.Fatalf("newest entry ends at %d, head at %d", prevEnd, r.head)
	}
	if liveBytes > r.used() {
		t.Fatalf("live entries hold %d bytes, used is %d", liveBytes, r.used())
	}
	for i := range phys {
		for j := i + 1; j < len(phys); j++ {
			if phys[i][0] < phys[j][1] && phys[j][0] < phys[i][1] {
				t.Fatalf("live entries %s %v and %s %v overlap", live[i].key, phys[i], live[j].key, phys[j])
			}
		}
	}
}

// ringModel drives a ring with random operations and checks it after each one.
type ringModel struct {
	t      testing.TB
	r      *ring
	all    []*entry // every entry ever allocated, allocation order
	nextID int
}

func (m *ringModel) step(op, arg byte) {
	r := m.r
	pick := func() *entry {
		live := r.live()
		if len(live) == 0 {
			return nil
		}
		return live[int(arg)%len(live)]
	}
	switch op % 8 {
	case 0, 1: // allocate
		size := int64(arg%16+1) * Align
		length := size - int64(arg%7)
		before := append([]*entry(nil), r.live()...)
		states := make([]entryState, len(before))
		for i, b := range before {
			states[i] = b.state
		}
		usedBefore := r.used()
		e, ev, err := r.alloc(fmt.Sprint(m.nextID), int64(m.nextID), length, size)
		switch {
		case errors.Is(err, ErrTooLarge):
			if size <= r.size {
				m.t.Fatalf("too large: %d in %d", size, r.size)
			}
			return
		case errors.Is(err, errBlocked):
			if r.used() != usedBefore || len(r.live()) != len(before) {
				m.t.Fatal("blocked alloc changed the ring")
			}
			// Blocked must mean an oldest entry that had to go is busy.
			busy := false
			for _, b := range before {
				if b.busy() {
					busy = true
					break
				}
			}
			if !busy {
				m.t.Fatal("blocked without a busy entry")
			}
			return
		case err != nil:
			m.t.Fatal(err)
		}
		m.nextID++
		m.all = append(m.all, e)
		// Evictions are exactly an oldest prefix of the live entries, none busy, and
		// the committed ones are reported in order.
		gone := len(before) - (len(r.live()) - 1)
		var want []*entry
		for _, b := range before[:gone] {
			if !b.evicted {
				m.t.Fatalf("entry %s left the ring without being marked evicted", b.key)
			}
			if b.readPins > 0 || b.commitPins > 0 {
				m.t.Fatalf("evicted pinned entry %s", b.key)
			}
		}
		for i := range before[:gone] {
			if states[i] == stateWriting {
				m.t.Fatalf("evicted writing entry %s", before[i].key)
			}
		}
		for _, b := range before[gone:] {
			if b.evicted {
				m.t.Fatalf("entry %s marked evicted but still live", b.key)
			}
		}
		for i, b := range before[:gone] {
			if states[i] == stateCommitted {
				want = append(want, b)
			}
		}
		if fmt.Sprint(keys(ev)) != fmt.Sprint(keys(want)) {
			m.t.Fatalf("reported %v, want %v", keys(ev), keys(want))
		}
	case 2: // commit or abort a writing entry
		for _, e := range r.live() {
			if e.state == stateWriting {
				if arg%5 == 0 {
					r.abort(e)
				} else {
					r.commit(e)
				}
				break
			}
		}
	case 3: // read pin
		if e := pick(); e != nil {
			ok := r.pinRead(e)
			if ok != (e.state == stateCommitted) {
				m.t.Fatalf("pinRead(%s %s) = %v", e.key, e.state, ok)
			}
		}
	case 4: // read unpin
		if e := pick(); e != nil && e.readPins > 0 {
			r.unpinRead(e)
		}
	case 5: // commit pin / unpin
		if e := pick(); e != nil {
			if e.commitPins > 0 {
				r.unpinCommit(e)
			} else if e.state == stateCommitted {
				r.pinCommit(e)
			}
		}
	case 6: // kill (remove / supersede)
		if e := pick(); e != nil && arg%3 == 0 {
			r.kill(e)
		}
	case 7: // release everything: lets the sequence make progress
		for _, e := range r.live() {
			for e.readPins > 0 {
				r.unpinRead(e)
			}
			for e.commitPins > 0 {
				r.unpinCommit(e)
			}
		}
	}
	checkRing(m.t, r)
	// No evicted entry may be busy, and the writing ones are all live.
	for _, e := range m.all {
		if e.evicted && (e.readPins > 0 || e.commitPins > 0) {
			m.t.Fatalf("evicted entry %s is pinned", e.key)
		}
	}
}

func TestRingRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		m := &ringModel{t: t, r: newRing(int64(rng.IntN(64)+1) * Align)}
		for range 2000 {
			m.step(byte(rng.UintN(256)), byte(rng.UintN(256)))
		}
	}
}

func FuzzRing(f *testing.F) {
	f.Add(uint8(8), []byte{0, 1, 2, 0, 3, 0, 7, 2, 1, 9, 4, 1, 5, 2, 6, 3, 0, 200})
	f.Add(uint8(1), []byte{0, 0, 0, 0, 2, 2, 0, 0})
	f.Add(uint8(32), []byte{1, 15, 1, 15, 2, 1, 3, 0, 1, 15, 1, 15, 7, 0, 1, 15})
	f.Fuzz(func(t *testing.T, sectors uint8, ops []byte) {
		m := &ringModel{t: t, r: newRing(int64(sectors%64+1) * Align)}
		for i := 0; i+1 < len(ops); i += 2 {
			m.step(ops[i], ops[i+1])
		}
	})
}
