package master

import "fmt"

// chainDrift checks every node's page entries against the routes: parent and hasParent
// as the route's, orphan exactly when the parent key has no route, the cached parent the
// live entry of the parent key, the kid lists exactly the live pages of each parent key
// (linked both ways), and base and depth what rank gives outside cycles (a base may be
// lower: a parent's raise is not carried down), the priority the later of the base and
// the last pass.
func chainDrift(st *State) error {
	for _, n := range st.nodes {
		p := n.policy.pages
		for k, e := range p.entries {
			r := st.routes[k]
			if r == nil {
				return fmt.Errorf("node %s: page %q without a route", n.id, k)
			}
			if e.parent != r.parent || e.hasParent != (r.parent != "") {
				return fmt.Errorf("node %s: page %q parent %q/%v, route's %q", n.id, k, e.parent, e.hasParent, r.parent)
			}
			if want := e.hasParent && st.routes[e.parent] == nil; e.orphan != want {
				return fmt.Errorf("node %s: page %q orphan=%v, parent %q routed=%v", n.id, k, e.orphan, e.parent, st.routes[e.parent] != nil)
			}
			if want := p.entries[e.parent]; e.hasParent && e.up != want {
				return fmt.Errorf("node %s: page %q's cached parent is not the live page of %q", n.id, k, e.parent)
			}
			if e.hasParent && !kidOf(p, e) {
				return fmt.Errorf("node %s: page %q missing from the kids of %q", n.id, k, e.parent)
			}
			if e.prio != max(e.base, e.passed) {
				return fmt.Errorf("node %s: page %q priority %d, base %d, passed at %d", n.id, k, e.prio, e.base, e.passed)
			}
			if !underCycle(p, e) {
				_, base, depth := p.rank(e)
				if e.base > base || depth != e.depth || (e.base != 0 && base == 0) {
					return fmt.Errorf("node %s: page %q base/depth %d/%d, rank says %d/%d", n.id, k, e.base, e.depth, base, depth)
				}
			}
		}
		for par, c := range p.kids {
			var prev *pageEntry
			for ; c != nil; c = c.nextKid {
				if p.entries[c.key] != c || c.parent != par || c.prevKid != prev {
					return fmt.Errorf("node %s: the kids of %q hold a stale or mislinked entry %q", n.id, par, c.key)
				}
				prev = c
			}
		}
	}
	return nil
}

// kidOf reports whether e is in its parent key's kid list.
func kidOf(p *pagePolicy, e *pageEntry) bool {
	for c := p.kids[e.parent]; c != nil; c = c.nextKid {
		if c == e {
			return true
		}
	}
	return false
}

// underCycle reports whether e's chain of live parent pages reaches a cycle.
func underCycle(p *pagePolicy, e *pageEntry) bool {
	seen := map[*pageEntry]bool{}
	for c := e; c != nil && c.hasParent; c = p.entries[c.parent] {
		if seen[c] {
			return true
		}
		seen[c] = true
	}
	return false
}
