package daemon

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
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
	c, id := startSessionPut(t, n, "late", size)
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

// TestValueRanges: each value range is copied once per put: a repeat is errRepeat, a
// range that overlaps a copied one in part (or a call mixing copied and new ranges) is
// refused, as is a call that would leave more than maxValueRanges pieces.
func TestValueRanges(t *testing.T) {
	cp := func(ranges ...int64) []*external.AreaCopy {
		var out []*external.AreaCopy
		for i := 0; i < len(ranges); i += 2 {
			out = append(out, &external.AreaCopy{ValueOffset: ranges[i], Len: ranges[i+1]})
		}
		return out
	}
	add := func(r valueRanges, c []*external.AreaCopy) valueRanges {
		t.Helper()
		out, err := r.with(c)
		if err != nil {
			t.Fatalf("with %v: %v", c[0], err)
		}
		return out
	}
	var r valueRanges
	r = add(r, cp(0, 10))
	r = add(r, cp(20, 10))
	for _, c := range [][]*external.AreaCopy{cp(0, 10), cp(22, 3), cp(0, 5, 20, 10)} {
		if _, err := r.with(c); !errors.Is(err, errRepeat) {
			t.Errorf("copied ranges %v named again: %v, want a repeat", c[0], err)
		}
	}
	for _, c := range [][]*external.AreaCopy{cp(5, 10), cp(25, 10), cp(0, 40), cp(0, 10, 40, 5)} {
		if _, err := r.with(c); wire.CodeOf(err) != common.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("a copied range named in part %v: %v, want INVALID_ARGUMENT", c[0], err)
		}
	}
	r = add(r, cp(10, 10)) // joins both
	if len(r) != 1 || r[0] != (valueRange{0, 30}) {
		t.Fatalf("merged: %v", r)
	}
	for i := range int64(maxValueRanges - 1) {
		r = add(r, cp(1000+10*i, 5))
	}
	if _, err := r.with(cp(5000, 1)); wire.CodeOf(err) != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("a piece past %d: %v, want INVALID_ARGUMENT", maxValueRanges, err)
	}
	if r = add(r, cp(30, 970)); len(r) != maxValueRanges-1 { // joins [0, 30) and [1000, 1005)
		t.Fatalf("a range that merges pieces: %d pieces", len(r))
	}
}

// FuzzValueRanges: against a byte map of what was copied, a range all copied is a
// repeat, one partly copied is refused, and a new one is recorded (unless it would make
// too many pieces); the record stays sorted, disjoint and merged.
func FuzzValueRanges(f *testing.F) {
	f.Add([]byte{0, 10, 20, 10, 10, 10})
	f.Add([]byte{5, 1, 3, 1, 4, 2, 0, 255})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var r valueRanges
		var copied [320]bool
		for i := 0; i+1 < len(ops); i += 2 {
			off, n := int64(ops[i]), int64(ops[i+1])%64+1
			some, all := false, true
			for j := off; j < off+n; j++ {
				some, all = some || copied[j], all && copied[j]
			}
			out, err := r.with([]*external.AreaCopy{{ValueOffset: off, Len: n}})
			switch {
			case all:
				if !errors.Is(err, errRepeat) {
					t.Fatalf("[%d, %d) all copied: %v, want a repeat (%v)", off, off+n, err, r)
				}
			case some:
				if wire.CodeOf(err) != common.ErrorCode_INVALID_ARGUMENT {
					t.Fatalf("[%d, %d) partly copied: %v, want INVALID_ARGUMENT (%v)", off, off+n, err, r)
				}
			case err != nil:
				if wire.CodeOf(err) != common.ErrorCode_INVALID_ARGUMENT || len(r) < maxValueRanges {
					t.Fatalf("[%d, %d) new: %v (%d pieces)", off, off+n, err, len(r))
				}
			default:
				r = out
				for j := off; j < off+n; j++ {
					copied[j] = true
				}
			}
			for k, v := range r {
				if v.start >= v.end || (k > 0 && r[k-1].end >= v.start) {
					t.Fatalf("not sorted, disjoint and merged: %v", r)
				}
				for j := v.start; j < v.end; j++ {
					if !copied[j] {
						t.Fatalf("byte %d recorded, never copied: %v", j, r)
					}
				}
			}
		}
	})
}

// startSessionPut starts a put of key (size bytes) for n's client on the owner directly,
// and returns the client's session and the put's id.
func startSessionPut(t *testing.T, n *node, key string, size int64) (*session, int64) {
	t.Helper()
	st := n.o.lock()
	c := st.sessions[n.c.ClientID()]
	n.o.unlock()
	id, _, err := n.o.putStart(c, key, size, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, id
}
