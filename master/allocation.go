package master

import "fmt"

// Allocation is a range of one owner incarnation's segment with an explicit reference
// count. Whoever stores an *Allocation (a route's memory replica, a holder record, an
// in-flight put or get) owns one reference and must Release it exactly once; the range
// returns to the node's allocator when the last reference goes. Allocations of a node
// that has been tombed release nothing: that incarnation's allocator is gone.
//
// Not safe for concurrent use; the State's lock protects it.
type Allocation struct {
	node *node
	r    Range
	len  int64 // real payload length (≤ r.Size)
	refs int
}

func newAllocation(n *node, r Range, length int64) *Allocation {
	n.allocs++
	return &Allocation{node: n, r: r, len: length, refs: 1}
}

// Offset is where the range starts in the owner's segment.
func (a *Allocation) Offset() int64 { return a.r.Offset }

// Len is the payload length stored in the range.
func (a *Allocation) Len() int64 { return a.len }

// Size is the number of segment bytes the range occupies.
func (a *Allocation) Size() int64 { return a.r.Size }

// Retain adds a reference.
func (a *Allocation) Retain() *Allocation {
	if a.refs <= 0 {
		panic(fmt.Sprintf("BUG: retain of released allocation %+v", a.r))
	}
	a.refs++
	return a
}

// Release drops a reference; the last one frees the range.
func (a *Allocation) Release() {
	if a.refs <= 0 {
		panic(fmt.Sprintf("BUG: double release of allocation %+v", a.r))
	}
	a.refs--
	if a.refs > 0 {
		return
	}
	a.node.allocs--
	if !a.node.tombed {
		a.node.alloc.Free(a.r)
	}
}
