package master

import "testing"

// FuzzRangeSet checks rangeSet against a bitmap: after any adds, overlaps answers as
// the bitmap does, and the ranges stay disjoint and merged.
func FuzzRangeSet(f *testing.F) {
	f.Add([]byte{0, 4, 1, 2, 10, 3, 3, 1, 1, 9})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const units = 64
		var bits [units]bool
		s := newRangeSet()
		for len(ops) >= 3 {
			add, off, size := ops[0]%2 == 0, int64(ops[1]%units), int64(ops[2]%8)+1
			ops = ops[3:]
			size = min(size, units-off)
			r := Range{Offset: off, Size: size}
			if add {
				s.add(r)
				for u := off; u < off+size; u++ {
					bits[u] = true
				}
				continue
			}
			want := false
			for u := off; u < off+size; u++ {
				want = want || bits[u]
			}
			if got := s.overlaps(r); got != want {
				t.Fatalf("overlaps(%+v) = %v, bitmap says %v", r, got, want)
			}
		}
		var prev *Range
		s.t.Ascend(func(m Range) bool {
			if prev != nil && prev.Offset+prev.Size >= m.Offset {
				t.Fatalf("ranges not merged: %+v then %+v", *prev, m)
			}
			prev = &m
			return true
		})
	})
}

func TestRangeSetNil(t *testing.T) {
	var s *rangeSet
	s.add(Range{Offset: 0, Size: 512})
	if s.overlaps(Range{Offset: 0, Size: 512}) {
		t.Fatal("the nil set holds a range")
	}
}
