package master

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkPagePolicy verifies a pagePolicy's structure: the heap holds every live page once
// at its index and in heap order, weights add up, the newest page is live, the ghost is
// bounded (and, when the policy has it to itself, holds no live page and counts its
// pages), every page ranks no later than its parent on this node (a lower priority,
// or the same and deeper) and caches that parent (up).
func checkPagePolicy(t testing.TB, p *pagePolicy, ownGhost bool) {
	t.Helper()
	if len(p.heap) != len(p.entries) {
		t.Fatalf("%d pages in the heap, %d in the map", len(p.heap), len(p.entries))
	}
	var w int64
	for i, e := range p.heap {
		if e.index != i || p.entries[e.key] != e {
			t.Fatalf("heap[%d] = %q (index %d) is not the map's entry", i, e.key, e.index)
		}
		if i > 0 && p.heap.Less(i, (i-1)/2) {
			t.Fatalf("heap[%d] = %q ranks before its heap parent", i, e.key)
		}
		w += e.weight
		if want := p.entries[e.parent]; e.hasParent && e.up != want || !e.hasParent && e.up != nil {
			t.Fatalf("page %q: cached parent %p, the live page of its parent key %q is %p", e.key, e.up, e.parent, want)
		}
		if _, ghost := p.ghosts.ghost[e.key]; ghost && ownGhost {
			t.Fatalf("live page %q is in the ghost", e.key)
		}
		if e.prio != max(e.base, e.passed) {
			t.Fatalf("page %q: priority %d, base %d, passed at %d", e.key, e.prio, e.base, e.passed)
		}
		if par := p.entries[e.parent]; e.hasParent && par != nil && !inCycle(p, e) && !ranksBefore(e, par) && e.prio != e.passed {
			t.Fatalf("page %q (priority %d, depth %d) ranks after its parent %q (priority %d, depth %d), not lifted by a pass",
				e.key, e.prio, e.depth, par.key, par.prio, par.depth)
		}
		if par := p.entries[e.parent]; e.hasParent && par != nil && !inCycle(p, e) && e.base > par.base {
			t.Fatalf("page %q: base %d above its parent %q's %d", e.key, e.base, par.key, par.base)
		}
	}
	if w != p.weight {
		t.Fatalf("pages weigh %d, counted %d", w, p.weight)
	}
	checkDirty(t, p)
	if p.newest != nil && p.entries[p.newest.key] != p.newest {
		t.Fatalf("newest page %q is not live", p.newest.key)
	}
	if g := p.ghosts; g.Len() > g.bound() || (ownGhost && g.live != p.Len()) {
		t.Fatalf("ghost holds %d pages for %d live (counted %d)", g.Len(), p.Len(), g.live)
	}
}

// checkDirty verifies the write-back's structures (pagedirty.go): the dirty heap holds
// live pages once each at their dindex and in heap order, no other page has a dindex,
// and ahead is the weight of the pages marked ahead.
func checkDirty(t testing.TB, p *pagePolicy) {
	t.Helper()
	for i, e := range p.dirty {
		if e.dindex != i || p.entries[e.key] != e {
			t.Fatalf("dirty[%d] = %q (dindex %d) is not the map's entry", i, e.key, e.dindex)
		}
		if i > 0 && p.dirty.Less(i, (i-1)/2) {
			t.Fatalf("dirty[%d] = %q ranks before its heap parent", i, e.key)
		}
	}
	dirty, ahead := 0, int64(0)
	for _, e := range p.entries {
		if e.dindex >= 0 {
			dirty++
		}
		if e.isAhead {
			ahead += e.weight
		}
	}
	if dirty != len(p.dirty) || ahead != p.ahead {
		t.Fatalf("%d pages with a dirty index, %d in the dirty heap; ahead pages weigh %d, counted %d", dirty, len(p.dirty), ahead, p.ahead)
	}
}

// ranksBefore reports whether page a is drawn before page b (a < b in the heap order,
// the sequence tie-break left out: equal priority and depth is neither way).
func ranksBefore(a, b *pageEntry) bool {
	return a.prio < b.prio || (a.prio == b.prio && a.depth > b.depth)
}

// inCycle reports whether e's chain of live parent pages leads back to e (puts may name
// each other as parents: such pages have no order to keep).
func inCycle(p *pagePolicy, e *pageEntry) bool {
	c := e
	for range len(p.entries) {
		if c = p.entries[c.parent]; c == nil || !c.hasParent {
			return false
		}
		if c == e {
			return true
		}
	}
	return true
}

// orderModel is what State tells a node's evictOrder, replayed on one node: routed keys
// (a route may outlive the memory replica, as with an SSD copy), the live keys with
// their weights and parents, and the newest key.
type orderModel struct {
	t        *testing.T
	o        *evictOrder
	routed   map[string]bool
	live     map[string]modelKey
	weight   int64
	newest   string
	hasNew   bool
	victims  int
	orphansA int // victims drawn while an orphan was a candidate
}

type modelKey struct {
	weight    int64
	page      bool
	parent    string
	hasParent bool
	passed    bool // a page eviction passed over held (Pass): it outranks its cap
}

func newOrderModel(t *testing.T) *orderModel {
	return &orderModel{t: t, o: newEvictOrder(nil, nil), routed: map[string]bool{}, live: map[string]modelKey{}}
}

// route and unroute mirror setRouteLocked / unsetRouteLocked: a route adopts or
// orphans the live pages whose parent is the key.
func (m *orderModel) route(k string) {
	m.routed[k] = true
	for c, v := range m.live {
		if v.page && v.hasParent && v.parent == k {
			m.o.Adopt(c)
		}
	}
}

func (m *orderModel) unroute(k string) {
	delete(m.routed, k)
	for c, v := range m.live {
		if v.page && v.hasParent && v.parent == k {
			m.o.Orphan(c)
		}
	}
}

// put publishes k (a page when page, with parent unless it is ""), as publishLocked
// does: the old route goes, the new one is set, then the replica enters the order.
func (m *orderModel) put(k string, w int64, page bool, parent string) {
	if _, ok := m.live[k]; ok {
		m.forget(k)
	}
	if m.routed[k] {
		m.unroute(k)
	}
	m.route(k)
	if page {
		m.o.InsertPage(k, w, parent, parent != "" && !m.routed[parent])
	} else {
		m.o.Insert(k, w)
	}
	m.live[k] = modelKey{weight: w, page: page, parent: parent, hasParent: page && parent != ""}
	m.weight += w
	m.newest, m.hasNew = k, true
}

// forget drops k's replica from the order and the model (its route is left alone).
func (m *orderModel) forget(k string) {
	v, ok := m.live[k]
	if got := m.o.Remove(k); got != ok {
		m.t.Fatalf("Remove(%q) = %v, model %v", k, got, ok)
	}
	m.drop(k, v)
}

func (m *orderModel) drop(k string, v modelKey) {
	m.weight -= v.weight
	delete(m.live, k)
	if k == m.newest {
		m.hasNew = false
	}
}

// stranded reports whether live page k is an orphan or lies under one on this node: its
// chain of live pages reaches a page whose parent has no route.
func (m *orderModel) stranded(k string) bool {
	for range len(m.live) + 1 {
		v := m.live[k]
		if !v.hasParent {
			return false
		}
		if !m.routed[v.parent] {
			return true
		}
		pv, ok := m.live[v.parent]
		if !ok || !pv.page {
			return false
		}
		k = v.parent
	}
	return false // a cycle of parents: no page of it is an orphan
}

// cyclic reports whether live page k's chain of live parent pages leads back to it.
func (m *orderModel) cyclic(k string) bool {
	c := k
	for range len(m.live) {
		v, ok := m.live[c]
		if !ok || !v.page || !v.hasParent {
			return false
		}
		if c = v.parent; c == k {
			return true
		}
	}
	return true
}

// victim draws a victim through VictimWhere (refusing the keys refuse names) and checks
// it: live, accepted, the newest only when no other key is a candidate, no live page whose
// parent it is left behind (but the newest), an orphan (or under one) whenever a
// candidate is, and a page before every plain key while an orphan is a candidate.
func (m *orderModel) victim(refuse func(string) bool) bool {
	k, ok := m.o.VictimWhere(func(k string) bool { return !refuse(k) }, len(m.live)+1)
	candidates, stranded := 0, 0
	for c, v := range m.live {
		if refuse(c) || (m.hasNew && c == m.newest && len(m.live) > 1) {
			continue
		}
		candidates++
		if v.page && m.stranded(c) && !v.passed {
			stranded++
		}
	}
	// With every other key refused, the S3-FIFO may hand out its newest key.
	if (candidates > 0 && !ok) || (candidates == 0 && ok && k != m.newest) {
		m.t.Fatalf("VictimWhere() = %q, %v with %d candidates", k, ok, candidates)
	}
	if !ok {
		return false
	}
	v, live := m.live[k]
	switch {
	case !live:
		m.t.Fatalf("victim %q is not live", k)
	case refuse(k):
		m.t.Fatalf("victim %q was refused", k)
	case candidates > 0 && m.hasNew && k == m.newest && len(m.live) > 1:
		m.t.Fatalf("victim %q is the newest key, with %d others live", k, len(m.live)-1)
	case stranded > 0 && !(v.page && m.stranded(k)):
		m.t.Fatalf("victim %q is not an orphan, while %d orphans are candidates", k, stranded)
	}
	if v.page && !m.cyclic(k) {
		for c, cv := range m.live {
			if cv.page && cv.hasParent && cv.parent == k && c != k && !refuse(c) && !(m.hasNew && c == m.newest) && !cv.passed {
				m.t.Fatalf("victim %q leaves its child page %q behind", k, c)
			}
		}
	}
	m.victims++
	if stranded > 0 {
		m.orphansA++
	}
	m.drop(k, v)
	m.unroute(k) // a sole memory replica: its route goes with it
	return true
}

func (m *orderModel) check(what string) {
	m.t.Helper()
	checkPagePolicy(m.t, m.o.pages, true)
	checkPolicy(m.t, m.o.plain)
	if m.o.Len() != len(m.live) || m.o.Weight() != m.weight {
		m.t.Fatalf("after %s: len %d weight %d, model %d and %d", what, m.o.Len(), m.o.Weight(), len(m.live), m.weight)
	}
	for k, v := range m.live {
		if v.page != m.o.pages.has(k) || !v.page != m.o.plain.has(k) {
			m.t.Fatalf("after %s: %q (page %v) is in the wrong class", what, k, v.page)
		}
		if e := m.o.pages.entries[k]; e != nil && (e.base == 0) != m.stranded(k) {
			m.t.Fatalf("after %s: page %q has base priority %d, stranded %v", what, k, e.base, m.stranded(k))
		}
	}
}

// FuzzPagePolicy replays random State-like sequences on one node's evictOrder: puts of
// pages (a parent chosen among the keys, or a chain's first page) and of plain keys,
// hits, passes of held pages, deletes, replicas dropped while their route lives on (an
// SSD copy), route losses, and victims with some keys refused. After every step the structure and the
// model agree (no key lost or duplicated, weights add up, each page ranks no later
// than its parent on the node, the write-back's dirty heap and ahead weight are
// consistent: the high nibble of a step's weight byte marks, takes, cleans or unaheads
// dirty pages); every victim is live and accepted, never the newest while another key
// is a candidate, leaves no child page behind (unless puts made their parents a cycle,
// or a pass lifted the child), and is an orphan (or under one) whenever one not lifted
// by a pass is a candidate. A final drain returns every live key once.
func FuzzPagePolicy(f *testing.F) {
	// A chain a-b-c, a plain key, hits, then victims; a child put before its parent.
	f.Add([]byte{0, 0, 8, 99, 0, 1, 8, 0, 0, 2, 8, 1, 1, 9, 8, 0, 2, 2, 0, 0, 6, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0})
	f.Add([]byte{0, 5, 8, 4, 0, 4, 8, 3, 0, 3, 8, 99, 2, 5, 0, 0, 3, 3, 0, 0, 4, 0, 0, 0, 0, 3, 8, 99, 4, 0, 0, 0})
	f.Add([]byte{0, 1, 8, 0, 0, 0, 8, 1, 5, 0, 0, 0, 7, 1, 0, 0, 0, 2, 8, 1, 4, 0, 0, 0, 4, 0, 0, 0})
	// Plain keys only, the newest accepted and the rest refused; then a page candidate too.
	f.Add([]byte("2A002000%000"))
	f.Add([]byte("210002002000%0010"))
	f.Fuzz(runPageOps)
}

// runPageOps is FuzzPagePolicy's body: ops is read four bytes a step (op, key, weight, arg).
func runPageOps(t *testing.T, ops []byte) {
	m := newOrderModel(t)
	const keys = 24
	name := func(b byte) string { return fmt.Sprintf("k%d", b%keys) }
	for len(ops) >= 4 {
		op, k, w, arg, dirty := ops[0]%8, name(ops[1]), int64(ops[2]%16)+1, ops[3], ops[2]>>4
		ops = ops[4:]
		switch op {
		case 0, 1: // put a page: arg names its parent, or (>= keys) a chain's first page
			parent := ""
			if arg < keys*8 && name(arg) != k {
				parent = name(arg)
			}
			m.put(k, w, true, parent)
		case 2:
			m.put(k, w, false, "")
		case 3: // arg odd: eviction passed over k held
			if arg%2 == 0 {
				m.o.Touch(k)
				break
			}
			m.o.Pass(k)
			if v, ok := m.live[k]; ok && v.page {
				v.passed = true
				m.live[k] = v
			}
		case 4:
			m.victim(func(string) bool { return false })
		case 5: // refuse the keys whose number shares a bit with arg (held replicas)
			m.victim(func(c string) bool {
				var n byte
				fmt.Sscanf(c, "k%d", &n)
				return n&arg != 0
			})
		case 6: // delete: the replica and the route go
			m.forget(k)
			if m.routed[k] {
				m.unroute(k)
			}
		case 7: // the replica goes, the route stays (an SSD copy); arg odd: then the route goes too
			m.forget(k)
			if arg%2 == 1 && m.routed[k] {
				m.unroute(k)
			}
		}
		switch pages := m.o.pages; dirty { // the write-back's moves (writeback.go)
		case 1:
			pages.markDirty(k)
		case 2:
			pages.takeDirty()
		case 3:
			pages.takeDirtyKey(k)
		case 4:
			pages.cleanDirty(k)
		case 5:
			pages.unahead(k)
		}
		m.check(fmt.Sprintf("op %d on %s (dirty move %d)", op, k, dirty))
	}
	for m.o.Len() > 0 {
		if !m.victim(func(string) bool { return false }) {
			t.Fatalf("no victim with %d keys live", m.o.Len())
		}
		m.check("drain")
	}
	if len(m.live) != 0 || m.weight != 0 {
		t.Fatalf("drain left %d keys of weight %d in the model", len(m.live), m.weight)
	}
}

// insertRandomChains puts pages k0..k(n-1) into p, each under a random earlier page
// two times in three, used at random times; with vary, of weights 1 to 4 and one in
// ten an orphan, else of weight 1.
func insertRandomChains(p *pagePolicy, rng *rand.Rand, n int, vary bool) {
	for i := range n {
		parent, hasParent := "", false
		if i > 0 && rng.IntN(3) > 0 {
			parent, hasParent = fmt.Sprintf("k%d", rng.IntN(i)), true
		}
		weight, orphan := int64(1), false
		if vary {
			weight, orphan = int64(1+rng.IntN(4)), rng.IntN(10) == 0
		}
		p.insert(fmt.Sprintf("k%d", i), weight, parent, hasParent, orphan, int64(rng.IntN(1000)))
	}
}

// TestPageVictimWhereOrder: victimWhere draws pages exactly in the eviction order: the
// victim is the first accepted page within limit, the newest passed over when
// protected, accept asked of the pages before it in order, and every other page stays
// (the heap intact). victimWhereStill, which walks the heap without drawing, does the
// same on the same policies.
func TestPageVictimWhereOrder(t *testing.T) {
	for _, still := range []bool{false, true} {
		t.Run(fmt.Sprintf("still=%v", still), func(t *testing.T) { testPageVictimWhereOrder(t, still) })
	}
}

func testPageVictimWhereOrder(t *testing.T, still bool) {
	victimWhere := func(p *pagePolicy, accept func(string) bool, limit int, protect bool) (string, bool) {
		if still {
			return p.victimWhereStill(accept, limit, protect)
		}
		return p.victimWhere(accept, limit, protect)
	}
	rng := rand.New(rand.NewPCG(41, 1))
	for round := range 200 {
		p := newPagePolicy(nil)
		n := 1 + rng.IntN(300)
		insertRandomChains(p, rng, n, true)
		for range rng.IntN(n) {
			p.touch(fmt.Sprintf("k%d", rng.IntN(n)), int64(1000+rng.IntN(1000)))
		}
		// The order popping gives, on a copy of the heap.
		order := make([]*pageEntry, len(p.heap))
		copy(order, p.heap)
		slices.SortFunc(order, func(a, b *pageEntry) int {
			if evictedBefore(a, b) {
				return -1
			}
			return 1
		})
		refused := make(map[string]bool)
		for _, e := range order {
			refused[e.key] = rng.IntN(4) > 0
		}
		limit, protect := 1+rng.IntN(n+2), rng.IntN(2) == 0
		want, drawn := "", 0
		var wantAsked []string
		for _, e := range order {
			if drawn == limit {
				break
			}
			drawn++
			if protect && e == p.newest {
				continue
			}
			wantAsked = append(wantAsked, e.key)
			if !refused[e.key] {
				want = e.key
				break
			}
		}
		var asked []string
		got, ok := victimWhere(p, func(k string) bool { asked = append(asked, k); return !refused[k] }, limit, protect)
		if got != want || ok != (want != "") {
			t.Fatalf("round %d: victimWhere = %q, %v; want %q", round, got, ok, want)
		}
		if !slices.Equal(asked, wantAsked) {
			t.Fatalf("round %d: asked %v, want %v (the heap's order)", round, asked, wantAsked)
		}
		if ok && (p.has(got) || len(p.heap) != n-1) || !ok && len(p.heap) != n {
			t.Fatalf("round %d: %d pages left of %d after victim %q", round, len(p.heap), n, got)
		}
		for i, e := range p.heap {
			if e.index != i || (i > 0 && evictedBefore(e, p.heap[(i-1)/2])) {
				t.Fatalf("round %d: heap broken at %d", round, i)
			}
		}
	}
}

// A page stepped away (its write-back runs) is never drawn, keeps being ranked (hits,
// its parent's changes) without re-entering the heap, counts as live, can be removed,
// and is drawn at its rank again once back; stepped away from an accept of
// victimWhere, the page just drawn stays out.
func TestPageStepAway(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 1))
	for round := range 200 {
		p := newPagePolicy(nil)
		n := 2 + rng.IntN(100)
		insertRandomChains(p, rng, n, false)
		away := map[string]bool{}
		for range 3 * n {
			k := fmt.Sprintf("k%d", rng.IntN(n))
			switch op := rng.IntN(6); {
			case op == 0:
				p.stepAway(k)
				if p.has(k) {
					away[k] = true
				}
			case op == 1:
				p.stepBack(k)
				delete(away, k)
			case op == 2:
				p.touch(k, int64(1000+rng.IntN(1000)))
			case op == 3:
				p.remove(k)
				delete(away, k)
			case op == 4:
				// An accept that steps the drawn page away and refuses it (a dirty page
				// whose write-back starts out of turn), or takes it.
				took := rng.IntN(2) == 0
				got, ok := p.victimWhere(func(c string) bool {
					if away[c] {
						t.Fatalf("round %d: drew %q, stepped away", round, c)
					}
					if !took {
						p.stepAway(c)
						away[c] = true
					}
					return took
				}, 1, false)
				if ok {
					delete(away, got)
				}
			default:
				p.insert(k, 1, "", false, false, int64(2000+rng.IntN(1000)))
			}
		}
		if p.Len() != len(p.entries) || len(p.heap)+len(away) != len(p.entries) {
			t.Fatalf("round %d: %d live, %d in the heap, %d away", round, p.Len(), len(p.heap), len(away))
		}
		for i, e := range p.heap {
			if e.away || e.index != i || (i > 0 && evictedBefore(e, p.heap[(i-1)/2])) {
				t.Fatalf("round %d: heap broken at %d (away %v)", round, i, e.away)
			}
		}
		for k := range away {
			e := p.entries[k]
			if e == nil || !e.away || e.index != -1 {
				t.Fatalf("round %d: %q stepped away: entry %+v", round, k, e)
			}
			// (A parent's raise is not carried down: a page may rank below its rank.)
			if prio, _, depth := p.rank(e); e.prio > prio || e.depth != depth {
				t.Fatalf("round %d: %q stepped away ranks %d at depth %d, want at most %d at %d", round, k, e.prio, e.depth, prio, depth)
			}
			p.stepBack(k)
		}
		// All back: the draws give the whole order.
		for range len(p.entries) {
			if _, ok := p.victimWhere(func(string) bool { return true }, 1, false); !ok {
				t.Fatalf("round %d: a live page not drawn", round)
			}
		}
		if len(p.entries) != 0 || len(p.heap) != 0 {
			t.Fatalf("round %d: %d pages left", round, len(p.entries))
		}
	}
}

// A page stepped away is ranked as ever: its hits raise it, its parent's loss moves it
// up the chain, and it is drawn at that rank once back.
func TestPageStepAwayRanked(t *testing.T) {
	p := newPagePolicy(nil)
	p.insert("a", 1, "", false, false, 10)
	p.insert("b", 1, "a", true, false, 20)
	p.insert("c", 1, "", false, false, 30)
	p.stepAway("b")
	check := func(what string, prio int64, depth int32) {
		t.Helper()
		e := p.entries["b"]
		if e.prio != prio || e.depth != depth {
			t.Fatalf("%s: b ranks %d at depth %d, want %d at %d", what, e.prio, e.depth, prio, depth)
		}
	}
	a := p.entries["a"].prio
	check("stepped away", a, 1) // capped by its parent
	p.touch("b", 40)
	check("touched", a, 1) // still capped
	p.remove("a")
	own := p.entries["b"].own
	if own <= 30 {
		t.Fatalf("b's own priority %d: the hit at 40 not counted", own)
	}
	check("its parent gone", own, 0)
	p.stepBack("b")
	for _, want := range []string{"c", "b"} {
		if got, ok := p.victimWhere(func(string) bool { return true }, 1, false); !ok || got != want {
			t.Fatalf("drew %q, want %q", got, want)
		}
	}
}
