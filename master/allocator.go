package master

import (
	"fmt"
	"math/bits"
)

// AllocGranule is the unit of every segment range: a range starts on and spans a
// multiple of it, so every replica can be read or written with O_DIRECT.
const AllocGranule = 512

// Range is a span of an owner's segment, in bytes.
type Range struct{ Offset, Size int64 }

// End is the first byte after the range.
func (r Range) End() int64 { return r.Offset + r.Size }

// Size classes, TLSF style: a first level per power of two and slCount linear
// subclasses inside it, so a class spans at most 1/32 of its sizes. Sizes below
// slCount granules get one exact class each (first level 0).
const (
	slBits  = 5
	slCount = 1 << slBits
	flCount = 64
)

// freeRange is one maximal free range, in granules. It sits in three indexes at once:
// the list of all free ranges in offset order (prev, next), the list of its size class
// (cprev, cnext) and a B+ tree keyed by end that finds the free range after any offset
// in O(log n) with few cache misses. Keying by end means that the common changes, Alloc
// taking the start of a range and Free merging into the range after it, never touch
// the tree.
type freeRange struct {
	start, size  int64
	prev, next   *freeRange
	cprev, cnext *freeRange
	fl, sl       uint8
}

func (f *freeRange) end() int64 { return f.start + f.size }

// Allocator decides the offsets of one owner's segment: a two-level segregated-fit
// (TLSF) index of the free ranges for a good fit in O(1), plus an offset index for
// coalescing with both neighbours on Free in O(log n), and for Reserve. Its memory is
// proportional to the number of free ranges, not to the segment size; it keeps no
// record of allocated ranges, so the caller (Allocation's reference count) must free
// exactly the ranges it was given.
//
// Alloc takes the first range of the request's own size class when it fits, else the
// first range of the smallest non-empty larger class (both O(1)), else, when only
// ranges of the request's class are left that might fit, searches that class: Alloc
// fails only when no free range is large enough. It hands out the low end of the
// range it picks, so a fresh segment fills from offset 0 upwards.
//
// Not safe for concurrent use.
type Allocator struct {
	capacity int64 // granules
	free     int64 // granules
	nranges  int

	head     *freeRange // lowest free range
	tail     *freeRange // highest free range
	byEnd    btree
	flBitmap uint64
	slBitmap [flCount]uint32
	classes  [flCount][slCount]*freeRange

	spare  *freeRange // recycled nodes, linked by next
	nspare int
}

const maxSpare = 64

// NewAllocator returns an allocator for a segment of capacity bytes, rounded down to
// AllocGranule; the whole segment starts free.
func NewAllocator(capacity int64) *Allocator {
	a := &Allocator{}
	if capacity > 0 {
		a.capacity = capacity / AllocGranule
	}
	if a.capacity > 0 {
		a.insertRange(nil, 0, a.capacity)
		a.free = a.capacity
	}
	return a
}

// Capacity is the segment size in bytes (a multiple of AllocGranule).
func (a *Allocator) Capacity() int64 { return a.capacity * AllocGranule }

// Used is the number of allocated bytes.
func (a *Allocator) Used() int64 { return (a.capacity - a.free) * AllocGranule }

// FreeBytes is the number of free bytes, in any number of ranges.
func (a *Allocator) FreeBytes() int64 { return a.free * AllocGranule }

// FreeRanges is the number of maximal free ranges: 1 when nothing is allocated (0 for
// a zero-capacity segment or a full one).
func (a *Allocator) FreeRanges() int { return a.nranges }

// LargestFree is the size in bytes of the largest free range: the largest request
// Alloc can satisfy. It scans the highest non-empty size class only.
func (a *Allocator) LargestFree() int64 {
	if a.flBitmap == 0 {
		return 0
	}
	fl := 63 - bits.LeadingZeros64(a.flBitmap)
	sl := 31 - bits.LeadingZeros32(a.slBitmap[fl])
	var largest int64
	for f := a.classes[fl][sl]; f != nil; f = f.cnext {
		largest = max(largest, f.size)
	}
	return largest * AllocGranule
}

// Fits reports whether Alloc(n) would succeed: O(1) when a larger size class has a
// range, else a search of n's own class up to the first range that fits (LargestFree
// scans the whole largest class).
func (a *Allocator) Fits(n int64) bool {
	if n <= 0 || n > a.capacity*AllocGranule {
		return false
	}
	g := (n + AllocGranule - 1) / AllocGranule
	if g > a.free {
		return false
	}
	fl, sl := classOf(g)
	if _, _, ok := a.findClass(fl, sl+1); ok {
		return true
	}
	for f := a.classes[fl][sl]; f != nil; f = f.cnext {
		if f.size >= g {
			return true
		}
	}
	return false
}

// FreeAround is the size in bytes of the free range that holds segment offset off (0
// when off is allocated or outside the segment): O(log ranges).
func (a *Allocator) FreeAround(off int64) int64 {
	if off < 0 || off >= a.capacity*AllocGranule {
		return 0
	}
	g := off / AllocGranule
	if f := a.byEnd.ceil(g + 1); f != nil && f.start <= g {
		return f.size * AllocGranule
	}
	return 0
}

// Alloc reserves n bytes rounded up to AllocGranule. It reports false when n <= 0 or
// no free range is large enough.
func (a *Allocator) Alloc(n int64) (Range, bool) {
	if n <= 0 || n > a.capacity*AllocGranule {
		return Range{}, false
	}
	g := (n + AllocGranule - 1) / AllocGranule
	if g > a.free {
		return Range{}, false
	}
	fl, sl := classOf(g)
	f := a.classes[fl][sl]
	if f == nil || f.size < g {
		if gfl, gsl, ok := a.findClass(fl, sl+1); ok {
			f = a.classes[gfl][gsl]
		} else {
			// Only ranges of the request's own class are left that might fit (the
			// segment is nearly full or fragmented): search that list.
			for f != nil && f.size < g {
				f = f.cnext
			}
			if f == nil {
				return Range{}, false
			}
		}
	}
	// Take the start of f: the rest keeps its end, its key in the offset index.
	start := f.start
	if f.size == g {
		a.removeRange(f)
	} else {
		a.resize(f, f.start+g, f.size-g)
	}
	a.free -= g
	return Range{Offset: start * AllocGranule, Size: g * AllocGranule}, true
}

// Free returns a range that Alloc or Reserve handed out and coalesces it with its free
// neighbours. It panics on a range that is malformed, outside the segment or overlaps
// free space (a double free); freeing a different part of allocated space than was
// handed out cannot be detected.
func (a *Allocator) Free(r Range) {
	start, g, ok := a.granules(r)
	if !ok {
		panic(fmt.Sprintf("BUG: free of invalid range %+v (capacity %d)", r, a.Capacity()))
	}
	// s is the first free range ending after start: it must begin at or after r's end.
	// The free range before it ends at or before start.
	s := a.byEnd.ceil(start + 1)
	p := a.tail
	if s != nil {
		if s.start < start+g {
			panic(fmt.Sprintf("BUG: free of range %+v overlapping free range %+v (double free)", r, a.rangeOf(s)))
		}
		p = s.prev
	}
	left := p != nil && p.end() == start
	right := s != nil && s.start == start+g
	switch {
	case left && right:
		merged, from := p.size+g+s.size, p.start
		a.removeRange(p)
		a.resize(s, from, merged)
	case left:
		// p grows up to r's end: still before s, so its place in the order holds.
		a.byEnd.rekey(p.end(), start+g)
		a.resize(p, p.start, p.size+g)
	case right:
		a.resize(s, start, s.size+g)
	default:
		a.insertRange(p, start, g)
	}
	a.free += g
}

// Reserve marks exactly r as allocated if all of it is free, as when a restarted master
// restores the ranges owners still use. It reports false, changing nothing, when r is
// malformed, outside the segment or not entirely free.
func (a *Allocator) Reserve(r Range) bool {
	start, g, ok := a.granules(r)
	if !ok {
		return false
	}
	// Only the first free range ending at or after r's end can hold r.
	f := a.byEnd.ceil(start + g)
	if f == nil || f.start > start {
		return false
	}
	before, after := start-f.start, f.end()-(start+g)
	switch {
	case before == 0 && after == 0:
		a.removeRange(f)
	case after == 0:
		a.byEnd.rekey(f.end(), start)
		a.resize(f, f.start, before)
	default:
		from := f.start
		a.resize(f, start+g, after)
		if before > 0 {
			a.insertRange(f.prev, from, before)
		}
	}
	a.free -= g
	return true
}

// CheckInvariants verifies every index against the others: free ranges sorted,
// disjoint, coalesced and inside the segment; the B+ tree and the size classes holding
// exactly those ranges; the counters matching. For tests.
func (a *Allocator) CheckInvariants() error {
	var sum int64
	n := 0
	var prev *freeRange
	for f := a.head; f != nil; f = f.next {
		switch {
		case f.size <= 0 || f.start < 0 || f.end() > a.capacity:
			return fmt.Errorf("free range %+v is empty or outside capacity %d", a.rangeOf(f), a.Capacity())
		case f.prev != prev:
			return fmt.Errorf("free range %+v: broken back link", a.rangeOf(f))
		case prev != nil && prev.end() > f.start:
			return fmt.Errorf("free ranges %+v and %+v are unsorted or overlap", a.rangeOf(prev), a.rangeOf(f))
		case prev != nil && prev.end() == f.start:
			return fmt.Errorf("free ranges %+v and %+v are not coalesced", a.rangeOf(prev), a.rangeOf(f))
		}
		if fl, sl := classOf(f.size); int(f.fl) != fl || int(f.sl) != sl {
			return fmt.Errorf("free range %+v filed in class (%d,%d), belongs in (%d,%d)", a.rangeOf(f), f.fl, f.sl, fl, sl)
		}
		sum += f.size
		n++
		prev = f
	}
	if n != a.nranges {
		return fmt.Errorf("%d free ranges listed, %d counted", n, a.nranges)
	}
	if sum != a.free {
		return fmt.Errorf("free ranges sum to %d bytes, %d counted", sum*AllocGranule, a.FreeBytes())
	}
	if a.free < 0 || a.free > a.capacity {
		return fmt.Errorf("free bytes %d outside capacity %d", a.FreeBytes(), a.Capacity())
	}
	// The B+ tree, in order, must be the offset list.
	if prev != a.tail {
		return fmt.Errorf("free list tail is wrong")
	}
	next := a.head
	if err := a.byEnd.check(func(key int64, f *freeRange) error {
		if f != next || key != f.end() {
			return fmt.Errorf("offset index out of step with the free list at end %d", key*AllocGranule)
		}
		next = next.next
		return nil
	}); err != nil {
		return err
	}
	if next != nil {
		return fmt.Errorf("free range %+v missing from the offset index", a.rangeOf(next))
	}
	// Every free range sits in exactly its class list; the bitmaps mark the non-empty ones.
	inClasses := 0
	for fl := range flCount {
		for sl := range slCount {
			var cprev *freeRange
			for f := a.classes[fl][sl]; f != nil; f = f.cnext {
				if f.cprev != cprev || int(f.fl) != fl || int(f.sl) != sl {
					return fmt.Errorf("size class (%d,%d) list broken at %+v", fl, sl, a.rangeOf(f))
				}
				cprev = f
				inClasses++
			}
			nonEmpty := a.classes[fl][sl] != nil
			if nonEmpty != (a.slBitmap[fl]&(1<<sl) != 0) {
				return fmt.Errorf("size class (%d,%d) bitmap is wrong", fl, sl)
			}
		}
		if (a.slBitmap[fl] != 0) != (a.flBitmap&(1<<fl) != 0) {
			return fmt.Errorf("first-level bitmap is wrong at %d", fl)
		}
	}
	if inClasses != n {
		return fmt.Errorf("%d ranges in size classes, %d free ranges", inClasses, n)
	}
	return nil
}

// granules converts a range to granules, checking that it is non-empty, aligned and
// inside the segment.
func (a *Allocator) granules(r Range) (start, size int64, ok bool) {
	if r.Size <= 0 || r.Offset < 0 || r.Offset%AllocGranule != 0 || r.Size%AllocGranule != 0 {
		return 0, 0, false
	}
	start, size = r.Offset/AllocGranule, r.Size/AllocGranule
	return start, size, size <= a.capacity-start
}

func (a *Allocator) rangeOf(f *freeRange) Range {
	return Range{Offset: f.start * AllocGranule, Size: f.size * AllocGranule}
}

// classOf maps a size in granules to its size class.
func classOf(g int64) (fl, sl int) {
	if g < slCount {
		return 0, int(g)
	}
	shift := bits.Len64(uint64(g)) - 1 - slBits
	return shift + 1, int(g>>shift) - slCount
}

// findClass finds the first non-empty size class at or above (fl, sl); sl may be
// slCount, meaning the next first level.
func (a *Allocator) findClass(fl, sl int) (int, int, bool) {
	if m := a.slBitmap[fl] & (^uint32(0) << sl); m != 0 {
		return fl, bits.TrailingZeros32(m), true
	}
	m := a.flBitmap & (^uint64(0) << (fl + 1))
	if m == 0 {
		return 0, 0, false
	}
	fl = bits.TrailingZeros64(m)
	return fl, bits.TrailingZeros32(a.slBitmap[fl]), true
}

func (a *Allocator) linkClass(f *freeRange) {
	fl, sl := classOf(f.size)
	f.fl, f.sl = uint8(fl), uint8(sl)
	h := a.classes[fl][sl]
	f.cprev, f.cnext = nil, h
	if h != nil {
		h.cprev = f
	}
	a.classes[fl][sl] = f
	a.slBitmap[fl] |= 1 << sl
	a.flBitmap |= 1 << fl
}

func (a *Allocator) unlinkClass(f *freeRange) {
	fl, sl := f.fl, f.sl
	if f.cprev != nil {
		f.cprev.cnext = f.cnext
	} else {
		a.classes[fl][sl] = f.cnext
	}
	if f.cnext != nil {
		f.cnext.cprev = f.cprev
	}
	f.cprev, f.cnext = nil, nil
	if a.classes[fl][sl] == nil {
		a.slBitmap[fl] &^= 1 << sl
		if a.slBitmap[fl] == 0 {
			a.flBitmap &^= 1 << fl
		}
	}
}

// resize changes a free range in place; the new start must keep its offset order.
func (a *Allocator) resize(f *freeRange, start, size int64) {
	a.unlinkClass(f)
	f.start, f.size = start, size
	a.linkClass(f)
}

// insertRange adds a free range right after prev in offset order (first if prev is nil).
func (a *Allocator) insertRange(prev *freeRange, start, size int64) {
	f := a.spare
	if f != nil {
		a.spare = f.next
		a.nspare--
		*f = freeRange{}
	} else {
		f = new(freeRange)
	}
	f.start, f.size = start, size
	f.prev = prev
	if prev != nil {
		f.next = prev.next
		prev.next = f
	} else {
		f.next = a.head
		a.head = f
	}
	if f.next != nil {
		f.next.prev = f
	} else {
		a.tail = f
	}
	a.byEnd.insert(f.end(), f)
	a.linkClass(f)
	a.nranges++
}

// removeRange drops a free range from every index.
func (a *Allocator) removeRange(f *freeRange) {
	a.unlinkClass(f)
	a.byEnd.delete(f.end())
	if f.prev != nil {
		f.prev.next = f.next
	} else {
		a.head = f.next
	}
	if f.next != nil {
		f.next.prev = f.prev
	} else {
		a.tail = f.prev
	}
	a.nranges--
	if a.nspare < maxSpare {
		*f = freeRange{next: a.spare}
		a.spare = f
		a.nspare++
	}
}

// btree is a B+ tree from the end of each free range to the range: a search touches a
// few wide nodes instead of a long chain of pointers, which keeps Free fast when the
// free ranges of a large segment no longer fit in the CPU caches. Each inner key is the
// largest key below its child.
//
// It is not github.com/google/btree (BTreeG of {end, range} items): with that, at any
// degree from 16 to 64, BenchmarkAllocatorFragmented ran 33–42% slower per Free+Alloc
// or Free+Reserve and 51–52% slower restoring ranges. Its searches call the less func
// through a closure per comparison, a ceil costs an iteration, and it cannot rekey in
// place.
type btree struct {
	root   *bnode
	height int // levels below the root
}

const (
	bMax = 32       // a node splits when it reaches bMax entries
	bMin = bMax / 2 // a non-root node below bMin entries borrows or merges
)

type bnode struct {
	n    int
	leaf bool
	keys [bMax]int64
	kids [bMax]*bnode     // inner nodes
	vals [bMax]*freeRange // leaves
}

func (nd *bnode) maxKey() int64 { return nd.keys[nd.n-1] }

// search is the index of the first key ≥ x, or n.
func (nd *bnode) search(x int64) int {
	lo, hi := 0, nd.n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if nd.keys[m] < x {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// ceil is the free range with the smallest end ≥ x, or nil.
func (t *btree) ceil(x int64) *freeRange {
	nd := t.root
	if nd == nil {
		return nil
	}
	for h := t.height; ; h-- {
		i := nd.search(x)
		if i == nd.n {
			return nil
		}
		if h == 0 {
			return nd.vals[i]
		}
		nd = nd.kids[i]
	}
}

func (t *btree) insert(key int64, f *freeRange) {
	if t.root == nil {
		t.root = &bnode{leaf: true}
	}
	if sib := t.insertAt(t.root, t.height, key, f); sib != nil {
		old := t.root
		t.root = &bnode{n: 2}
		t.root.keys[0], t.root.kids[0] = old.maxKey(), old
		t.root.keys[1], t.root.kids[1] = sib.maxKey(), sib
		t.height++
	}
}

// insertAt inserts below nd, h levels above the leaves; it returns the new right
// sibling when nd split.
func (t *btree) insertAt(nd *bnode, h int, key int64, f *freeRange) *bnode {
	i := nd.search(key)
	if h == 0 {
		nd.insertAt(i, key, nil, f)
	} else {
		i = min(i, nd.n-1) // past every key: into the last child
		sib := t.insertAt(nd.kids[i], h-1, key, f)
		nd.keys[i] = nd.kids[i].maxKey()
		if sib != nil {
			nd.insertAt(i+1, sib.maxKey(), sib, nil)
		}
	}
	if nd.n < bMax {
		return nil
	}
	sib := &bnode{n: bMax - bMin, leaf: nd.leaf}
	copy(sib.keys[:], nd.keys[bMin:])
	if nd.leaf {
		copy(sib.vals[:], nd.vals[bMin:])
		clear(nd.vals[bMin:])
	} else {
		copy(sib.kids[:], nd.kids[bMin:])
		clear(nd.kids[bMin:])
	}
	nd.n = bMin
	return sib
}

func (t *btree) delete(key int64) {
	t.deleteAt(t.root, t.height, key)
	if t.height > 0 && t.root.n == 1 {
		t.root = t.root.kids[0]
		t.height--
	}
}

// deleteAt removes key below nd, h levels above the leaves, and mends a child left
// with fewer than bMin entries by borrowing from or merging with a sibling.
func (t *btree) deleteAt(nd *bnode, h int, key int64) {
	i := nd.search(key)
	if h == 0 {
		if i == nd.n || nd.keys[i] != key {
			panic(fmt.Sprintf("BUG: free range ending at granule %d missing from the offset index", key))
		}
		nd.removeAt(i)
		return
	}
	c := nd.kids[i]
	t.deleteAt(c, h-1, key)
	switch {
	case c.n >= bMin:
	case i > 0 && nd.kids[i-1].n > bMin: // borrow the left sibling's last entry
		l := nd.kids[i-1]
		c.insertAt(0, l.keys[l.n-1], l.kids[l.n-1], l.vals[l.n-1])
		l.removeAt(l.n - 1)
		nd.keys[i-1] = l.maxKey()
	case i > 0: // merge into the left sibling
		l := nd.kids[i-1]
		l.appendFrom(c)
		nd.removeAt(i)
		i--
		c = l
	case nd.kids[i+1].n > bMin: // borrow the right sibling's first entry
		r := nd.kids[i+1]
		c.insertAt(c.n, r.keys[0], r.kids[0], r.vals[0])
		r.removeAt(0)
	default: // merge the right sibling in
		c.appendFrom(nd.kids[i+1])
		nd.removeAt(i + 1)
	}
	nd.keys[i] = c.maxKey()
}

// insertAt puts an entry at i: kid in an inner node, f in a leaf.
func (nd *bnode) insertAt(i int, key int64, kid *bnode, f *freeRange) {
	copy(nd.keys[i+1:nd.n+1], nd.keys[i:nd.n])
	nd.keys[i] = key
	if nd.leaf {
		copy(nd.vals[i+1:nd.n+1], nd.vals[i:nd.n])
		nd.vals[i] = f
	} else {
		copy(nd.kids[i+1:nd.n+1], nd.kids[i:nd.n])
		nd.kids[i] = kid
	}
	nd.n++
}

func (nd *bnode) removeAt(i int) {
	copy(nd.keys[i:], nd.keys[i+1:nd.n])
	nd.n--
	if nd.leaf {
		copy(nd.vals[i:], nd.vals[i+1:nd.n+1])
		nd.vals[nd.n] = nil
	} else {
		copy(nd.kids[i:], nd.kids[i+1:nd.n+1])
		nd.kids[nd.n] = nil
	}
}

func (nd *bnode) appendFrom(o *bnode) {
	copy(nd.keys[nd.n:], o.keys[:o.n])
	if nd.leaf {
		copy(nd.vals[nd.n:], o.vals[:o.n])
	} else {
		copy(nd.kids[nd.n:], o.kids[:o.n])
	}
	nd.n += o.n
}

// rekey changes the key old to new, which must keep its place in the key order.
func (t *btree) rekey(old, new int64) {
	nd := t.root
	for h := t.height; ; h-- {
		i := nd.search(old)
		if i == nd.n || (h == 0 && nd.keys[i] != old) {
			panic(fmt.Sprintf("BUG: free range ending at granule %d missing from the offset index", old))
		}
		if nd.keys[i] == old {
			nd.keys[i] = new // the largest key below: its ancestors' keys change too
		}
		if h == 0 {
			return
		}
		nd = nd.kids[i]
	}
}

// check verifies the tree's shape and key order and calls visit on every entry in
// key order.
func (t *btree) check(visit func(key int64, f *freeRange) error) error {
	if t.root == nil {
		return nil
	}
	var walk func(nd *bnode, h int, after int64) error
	walk = func(nd *bnode, h int, after int64) error {
		if nd.leaf != (h == 0) || nd.n >= bMax || (nd != t.root && nd.n < bMin) || (h > 0 && nd == t.root && nd.n < 2) {
			return fmt.Errorf("offset index node with %d entries at height %d", nd.n, h)
		}
		for i := range nd.n {
			if nd.keys[i] <= after {
				return fmt.Errorf("offset index keys out of order at %d", nd.keys[i]*AllocGranule)
			}
			if h == 0 {
				if nd.kids[i] != nil || nd.vals[i] == nil {
					return fmt.Errorf("offset index leaf entry %d malformed", nd.keys[i]*AllocGranule)
				}
				if err := visit(nd.keys[i], nd.vals[i]); err != nil {
					return err
				}
			} else {
				c := nd.kids[i]
				if c == nil || nd.vals[i] != nil || c.n == 0 || c.maxKey() != nd.keys[i] {
					return fmt.Errorf("offset index inner entry %d malformed", nd.keys[i]*AllocGranule)
				}
				if err := walk(c, h-1, after); err != nil {
					return err
				}
			}
			after = nd.keys[i]
		}
		for i := nd.n; i < bMax; i++ {
			if nd.kids[i] != nil || nd.vals[i] != nil {
				return fmt.Errorf("offset index node keeps a stale pointer")
			}
		}
		return nil
	}
	return walk(t.root, t.height, -1<<63)
}
