package master

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// allocShadow is the obvious model of a segment: one flag per granule.
type allocShadow []bool // true: allocated

func (s allocShadow) mark(t *testing.T, r Range, used bool) {
	t.Helper()
	for i := r.Offset / AllocGranule; i < r.End()/AllocGranule; i++ {
		if s[i] == used {
			t.Fatalf("range %+v: granule %d already in that state (used=%v): overlap", r, i, used)
		}
		s[i] = used
	}
}

// free reports whether every granule of r is inside the segment and free.
func (s allocShadow) free(r Range) bool {
	if r.Offset < 0 || r.Size <= 0 || r.End() > int64(len(s))*AllocGranule {
		return false
	}
	for i := r.Offset / AllocGranule; i < r.End()/AllocGranule; i++ {
		if s[i] {
			return false
		}
	}
	return true
}

// runAt is the length in granules of the free run holding byte offset off (0: used or
// outside).
func (s allocShadow) runAt(off int64) int64 {
	g := off / AllocGranule
	if off < 0 || g >= int64(len(s)) || s[g] {
		return 0
	}
	lo, hi := g, g
	for lo > 0 && !s[lo-1] {
		lo--
	}
	for hi+1 < int64(len(s)) && !s[hi+1] {
		hi++
	}
	return hi - lo + 1
}

// runs is the number of maximal free runs, the largest in granules, and the used total.
func (s allocShadow) runs() (n int, largest, used int64) {
	var cur int64
	for _, u := range s {
		if u {
			used++
			cur = 0
			continue
		}
		if cur == 0 {
			n++
		}
		cur++
		largest = max(largest, cur)
	}
	return n, largest, used
}

// FuzzAllocator runs random Alloc, Free, Reserve and invalid Free sequences against a
// granule-by-granule model: ranges never overlap, Alloc fails only when no free run is
// large enough, every counter matches, and freeing everything leaves one free range
// of full capacity.
func FuzzAllocator(f *testing.F) {
	f.Add(uint16(100), []byte{0, 0, 10, 1, 0, 0, 20, 2, 2, 0, 0, 0, 3, 0, 3, 2, 4, 0, 1, 0})
	f.Add(uint16(4000), []byte{0, 1, 0, 5, 0, 0, 9, 0, 1, 3, 0, 1, 2, 0, 1, 0, 3, 0, 0, 7, 4, 0, 2, 3})
	f.Add(uint16(65535), []byte{1, 255, 255, 5, 1, 0, 1, 0, 2, 0, 0, 0, 1, 0, 1, 0})
	f.Fuzz(fuzzAllocator)
}

// TestAllocatorRandomOps runs the fuzz body over long random sequences of mostly small
// requests, which fragment the segment into thousands of free ranges.
func TestAllocatorRandomOps(t *testing.T) {
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 42))
		ops := make([]byte, 4*20000)
		for i := range ops {
			ops[i] = byte(rng.Uint32())
			if i%4 == 1 && rng.IntN(4) != 0 {
				ops[i] = 0 // small sizes and offsets
			}
		}
		fuzzAllocator(t, 65535, ops)
	}
}

func fuzzAllocator(t *testing.T, capSeed uint16, ops []byte) {
	a := NewAllocator(int64(capSeed) * 37) // rarely a multiple of the granule
	if a.Capacity() != int64(capSeed)*37/AllocGranule*AllocGranule {
		t.Fatalf("capacity %d from %d bytes", a.Capacity(), int64(capSeed)*37)
	}
	granules := a.Capacity() / AllocGranule
	shadow := make(allocShadow, granules)
	var live []Range
	check := func(what string) {
		t.Helper()
		if err := a.CheckInvariants(); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
		n, largest, used := shadow.runs()
		if a.Used() != used*AllocGranule || a.FreeBytes() != (granules-used)*AllocGranule ||
			a.FreeRanges() != n || a.LargestFree() != largest*AllocGranule {
			t.Fatalf("after %s: used %d free %d ranges %d largest %d; model used %d ranges %d largest %d",
				what, a.Used(), a.FreeBytes(), a.FreeRanges(), a.LargestFree(),
				used*AllocGranule, n, largest*AllocGranule)
		}
	}
	check("NewAllocator")
	for len(ops) >= 4 {
		op, x, y := ops[0]%5, int64(ops[1])<<8|int64(ops[2]), int64(ops[3])
		ops = ops[4:]
		switch op {
		case 0, 1:
			n := x<<(y%6) - 8 // includes ≤ 0 and sizes past the capacity
			_, largest, _ := shadow.runs()
			want := n > 0 && (n+AllocGranule-1)/AllocGranule <= largest
			if a.Fits(n) != want {
				t.Fatalf("Fits(%d) = %v; largest free run %d granules", n, !want, largest)
			}
			r, ok := a.Alloc(n)
			if ok != want {
				t.Fatalf("Alloc(%d) = %+v %v; largest free run %d granules", n, r, ok, largest)
			}
			if ok {
				if r.Offset%AllocGranule != 0 || r.Size != (n+AllocGranule-1)/AllocGranule*AllocGranule {
					t.Fatalf("Alloc(%d) = %+v: misaligned or wrong size", n, r)
				}
				if !shadow.free(r) {
					t.Fatalf("Alloc(%d) = %+v overlaps used space or leaves the segment", n, r)
				}
				shadow.mark(t, r, true)
				live = append(live, r)
			}
			check("Alloc")
		case 2:
			if len(live) == 0 {
				continue
			}
			i := int(x) % len(live)
			a.Free(live[i])
			shadow.mark(t, live[i], false)
			for _, off := range []int64{live[i].Offset, live[i].Offset - AllocGranule, live[i].End()} {
				if got, want := a.FreeAround(off), shadow.runAt(off)*AllocGranule; got != want {
					t.Fatalf("FreeAround(%d) = %d after a free of %+v; model %d", off, got, live[i], want)
				}
			}
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			check("Free")
		case 3:
			r := Range{Offset: (x % (granules + 2)) * AllocGranule, Size: (y%32 + 1) * AllocGranule}
			if y&0x80 != 0 {
				r.Size -= 100 // misaligned: refused
			}
			if y&0x40 != 0 && y&0x80 == 0 {
				r.Size *= 16
			}
			want := r.Size%AllocGranule == 0 && shadow.free(r)
			if ok := a.Reserve(r); ok != want {
				t.Fatalf("Reserve(%+v) = %v, model says %v", r, ok, want)
			}
			if want {
				shadow.mark(t, r, true)
				live = append(live, r)
			}
			check("Reserve")
		case 4:
			// A free touching free space is a double free: it must panic and change nothing.
			r := Range{Offset: (x % (granules + 1)) * AllocGranule, Size: (y%16 + 1) * AllocGranule}
			touchesFree := false
			for i := r.Offset / AllocGranule; i < min(r.End()/AllocGranule, granules); i++ {
				touchesFree = touchesFree || !shadow[i]
			}
			if r.End() <= a.Capacity() && !touchesFree {
				continue // all allocated: possibly a legal free, not what this op tests
			}
			func() {
				defer func() {
					msg, _ := recover().(string)
					if !strings.HasPrefix(msg, "BUG: ") {
						t.Fatalf("Free(%+v) over free space or outside the segment did not panic with BUG: %q", r, msg)
					}
				}()
				a.Free(r)
			}()
			check("refused Free")
		}
	}
	for len(live) > 0 {
		a.Free(live[len(live)-1])
		shadow.mark(t, live[len(live)-1], false)
		live = live[:len(live)-1]
		check("final Free")
	}
	if granules > 0 {
		checkEmpty(t, a)
	}
}
