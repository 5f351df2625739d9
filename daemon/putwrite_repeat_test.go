package daemon

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// TestRepeatedPutWriteCopiesOnce: a PutWrite sent again after its reply was lost waits
// for the first, still copying, and copies nothing itself; the first, arriving late
// once the client refilled the area with the next part, copies nothing either (it
// copied the area's next part into this part's range before, and the PutEnd published
// those wrong bytes).
func TestRepeatedPutWriteCopiesOnce(t *testing.T) {
	t.Parallel()
	const size = 2 << 20
	inChunk, release := make(chan struct{}), make(chan struct{})
	var copies atomic.Int32 // chunk 0 copies of "late"
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true}, func(o *Options) {
		o.ClientIsolation, o.PutArea = true, size
		o.testCopyChunk = func(key string, chunk int) {
			if key == "late" && chunk == 0 && copies.Add(1) == 1 {
				close(inChunk)
				<-release
			}
		}
	})
	var once sync.Once
	unstall := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unstall) // before the node stops (a failed check must not leave the copy stalled)
	st := n.o.lock()
	c := st.sessions[n.c.ClientID()]
	n.o.unlock()
	id, _, err := n.o.putStart(c, "late", size, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0xAB}, size)
	copy(c.area.Bytes(), want)
	part := []*external.AreaCopy{{Len: size}}
	first, again := make(chan error, 1), make(chan error, 1)
	go func() { first <- n.o.putWrite(c, "late", id, part) }()
	<-inChunk
	go func() { again <- n.o.putWrite(c, "late", id, part) }()
	select {
	case err := <-again:
		t.Fatalf("the repeated PutWrite answered (%v) while the first still copied", err)
	case <-time.After(100 * time.Millisecond):
	}
	unstall()
	if err := <-first; err != nil {
		t.Fatalf("first PutWrite: %v", err)
	}
	if err := <-again; err != nil {
		t.Fatalf("repeated PutWrite: %v", err)
	}
	// The client moved on: the area holds other bytes when the first arrives once more.
	copy(c.area.Bytes(), bytes.Repeat([]byte{0xCD}, size))
	if err := n.o.putWrite(c, "late", id, part); err != nil {
		t.Fatalf("late PutWrite: %v", err)
	}
	if got := copies.Load(); got != 1 {
		t.Errorf("the value's part was copied %d times, want once", got)
	}
	if err := n.o.putEnd(c, "late", id, nil); err != nil {
		t.Fatal(err)
	}
	h, err := n.c.Get("late")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if !bytes.Equal(h.Bytes(), want) {
		t.Errorf("the value holds bytes the area held after its part was copied (byte 0 %#x)", h.Bytes()[0])
	}
}

func TestValueRanges(t *testing.T) {
	cp := func(off, n int64) []*external.AreaCopy { return []*external.AreaCopy{{ValueOffset: off, Len: n}} }
	var r valueRanges
	if r.covers(cp(0, 1)) || r.covers(nil) {
		t.Fatal("an empty record covers nothing")
	}
	r.add(cp(0, 10))
	r.add(cp(20, 10))
	if !r.covers(cp(0, 10)) || !r.covers(cp(22, 3)) || r.covers(cp(5, 10)) || r.covers(cp(10, 10)) || r.covers(cp(25, 6)) {
		t.Fatalf("covers wrong for %v", r)
	}
	r.add(cp(10, 10)) // joins both
	if len(r) != 1 || r[0] != (valueRange{0, 30}) || !r.covers(cp(5, 20)) {
		t.Fatalf("merged: %v", r)
	}
	r.add(cp(40, 5))
	r.add(cp(35, 20)) // overlaps [40, 45) and extends it
	if len(r) != 2 || r[1] != (valueRange{35, 55}) {
		t.Fatalf("overlap merged: %v", r)
	}
	for i := range int64(2 * maxValueRanges) {
		r.add(cp(1000+10*i, 5))
	}
	if len(r) != maxValueRanges {
		t.Fatalf("%d ranges recorded, want at most %d", len(r), maxValueRanges)
	}
	r.add(cp(0, 2000)) // a range that merges others is still recorded
	if len(r) > maxValueRanges || !r.covers(cp(0, 2000)) {
		t.Fatalf("a merging range: %d ranges, covers %v", len(r), r.covers(cp(0, 2000)))
	}
}

// FuzzValueRanges: whatever ranges are added, the record stays sorted, disjoint and
// merged, within its bound, and never says a range was copied that was not (it may
// forget one past the bound: that one is copied again).
func FuzzValueRanges(f *testing.F) {
	f.Add([]byte{0, 10, 20, 10, 10, 10})
	f.Add([]byte{5, 1, 3, 1, 4, 2, 0, 255})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var r valueRanges
		var copied [512]bool
		for i := 0; i+1 < len(ops); i += 2 {
			off, n := int64(ops[i]), int64(ops[i+1])%64+1
			r.add([]*external.AreaCopy{{ValueOffset: off, Len: n}})
			for j := off; j < off+n; j++ {
				copied[j] = true
			}
			if len(r) > maxValueRanges {
				t.Fatalf("%d ranges", len(r))
			}
			for k, v := range r {
				if v.start >= v.end || (k > 0 && r[k-1].end >= v.start) {
					t.Fatalf("not sorted, disjoint and merged: %v", r)
				}
			}
			for q := 0; q+1 < len(ops); q += 2 {
				qo, qn := int64(ops[q]), int64(ops[q+1])%64+1
				if !r.covers([]*external.AreaCopy{{ValueOffset: qo, Len: qn}}) {
					continue
				}
				for j := qo; j < qo+qn; j++ {
					if !copied[j] {
						t.Fatalf("[%d, %d) covered, but byte %d was never copied: %v", qo, qo+qn, j, r)
					}
				}
			}
		}
	})
}
