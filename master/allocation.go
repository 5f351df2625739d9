package master

import "fmt"

// Allocation is a range of one owner incarnation's segment with an explicit reference
// count. Whoever stores an *Allocation (a route's memory replica, a holder record, an
// in-flight put or get) owns one reference and must Release it exactly once; the range
// returns to the node's allocator when the last reference goes. Allocations of a node
// that has been tombed release nothing: that incarnation's allocator is gone.
//
// An Allocation comes from the node's memory pool, from its transfer area (the source
// range of a put placed on another owner, or a replica the pool borrowed the area's
// idle room for) or from its landing area (a get's range); Release returns it to the
// allocator it came from.
//
// Not safe for concurrent use; the State's lock protects it.
type Allocation struct {
	node *node
	area *Allocator // the allocator r came from: node.alloc, node.xfer or node.landing
	base int64      // the segment offset of area's offset 0
	r    Range      // in segment offsets
	len  int64      // real payload length (≤ r.Size)
	refs int
	// holds counts the holder records (node.holders) naming it: node.hold, node.unhold.
	holds int
	// lent: a range of the transfer area taken for the pool (xferarea.go), counted in
	// node.lent until it is freed.
	lent bool
}

// newAllocation wraps a range of n's memory pool.
func newAllocation(n *node, r Range, length int64) *Allocation {
	n.allocs++
	n.opened.add(r)
	return &Allocation{node: n, area: n.alloc, r: r, len: length, refs: 1}
}

// newXferAllocation wraps a range r of n's transfer area (in area offsets).
func newXferAllocation(n *node, r Range, length int64) *Allocation {
	return newAreaAllocation(n, n.xfer, n.xferBase, r, length)
}

// newAreaAllocation wraps a range r (in the area's offsets) of n's allocator area,
// whose offset 0 is segment offset base: the pool (base 0), the transfer area or the
// landing area.
func newAreaAllocation(n *node, area *Allocator, base int64, r Range, length int64) *Allocation {
	n.allocs++
	r.Offset += base
	n.opened.add(r)
	return &Allocation{node: n, area: area, base: base, r: r, len: length, refs: 1}
}

// Offset is where the range starts in the owner's segment.
func (a *Allocation) Offset() int64 { return a.r.Offset }

// Len is the payload length stored in the range.
func (a *Allocation) Len() int64 { return a.len }

// inArea reports whether the range lies in its node's transfer area.
func (a *Allocation) inArea() bool { return a.node.xfer != nil && a.area == a.node.xfer }

// Size is the number of segment bytes the range occupies.
func (a *Allocation) Size() int64 { return a.r.Size }

// Retain adds a reference.
func (a *Allocation) Retain() *Allocation {
	if a.refs <= 0 {
		panic(fmt.Sprintf("BUG: retain of released allocation %+v", a.r))
	}
	was := a.soleHeld()
	a.refs++
	a.node.soleChanged(was, a)
	return a
}

// soleHeld reports whether a holder record alone keeps a (a get's range that was not
// promoted, a replica's range after its eviction): what a get's first attempt spares.
func (a *Allocation) soleHeld() bool { return a.refs == 1 && a.holds > 0 }

// Release drops a reference; the last one frees the range.
func (a *Allocation) Release() {
	if a.refs <= 0 {
		panic(fmt.Sprintf("BUG: double release of allocation %+v", a.r))
	}
	was := a.soleHeld()
	a.refs--
	a.node.soleChanged(was, a)
	if a.refs > 0 {
		return
	}
	a.node.allocs--
	if a.lent {
		a.node.lent--
	}
	if !a.node.tombed {
		a.area.Free(Range{Offset: a.r.Offset - a.base, Size: a.r.Size})
	}
}
