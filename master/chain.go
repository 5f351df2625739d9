package master

import (
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// KV chains: a put may name its parent, the page before it in a prefix chain. The
// route keeps it; each node's eviction order (evictOrder, pagePolicy) keeps a page while
// its parent is cached. A page whose parent has no route is an orphan, the first victim;
// it is adopted again when the parent is put (a batch publishes its pages in any order).

// validateParent checks a put's parent key (nil: a plain key, "": a first page).
func validateParent(key string, parent *string) error {
	if parent == nil || *parent == "" {
		return nil
	}
	if err := wire.ValidateKey(*parent); err != nil {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "parent: %v", err)
	}
	if *parent == key {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "a key cannot be its own parent")
	}
	return nil
}

// enterPolicyLocked adds n's memory replica of key (route r, size bytes) to n's
// eviction order: a page of its chain, or a plain key.
func (s *State) enterPolicyLocked(key string, r *route, n *node, size int64) {
	if !r.page {
		n.policy.Insert(key, size)
		return
	}
	n.policy.InsertPage(key, size, r.parent, r.parent != "" && s.routes[r.parent] == nil)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// linkChainLocked records a new route: under its parent, and as the parent of its
// routed children, which are adopted where they were orphans.
func (s *State) linkChainLocked(key string, r *route) {
	s.addChildLocked(r.parent, key)
	s.eachChildReplicaLocked(key, func(child string, n *node) { n.policy.Adopt(child) })
}

// becomePageLocked makes r, key's route with no memory replica in any eviction order,
// a KV page under parent.
func (s *State) becomePageLocked(key string, r *route, parent string) {
	r.page, r.parent = true, parent
	s.addChildLocked(parent, key)
}

// addChildLocked records key under parent ("": a chain's first page, under none).
func (s *State) addChildLocked(parent, key string) {
	if parent != "" {
		c := s.children[parent]
		c.add(key)
		s.children[parent] = c
	}
}

// unlinkChainLocked forgets a removed route under its parent and orphans its children.
func (s *State) unlinkChainLocked(key string, r *route) {
	if c, ok := s.children[r.parent]; r.parent != "" && ok {
		if c.remove(key) {
			delete(s.children, r.parent)
		} else {
			s.children[r.parent] = c
		}
	}
	s.eachChildReplicaLocked(key, func(child string, n *node) { n.policy.Orphan(child) })
}

// eachChildReplicaLocked calls f for every memory replica of key's routed children.
func (s *State) eachChildReplicaLocked(key string, f func(child string, n *node)) {
	c := s.children[key]
	if c.one != "" {
		s.eachReplicaLocked(c.one, f)
	}
	for child := range c.more {
		s.eachReplicaLocked(child, f)
	}
}

// eachReplicaLocked calls f for every memory replica of key (none without a route).
func (s *State) eachReplicaLocked(key string, f func(key string, n *node)) {
	r := s.routes[key]
	if r == nil {
		return
	}
	for n, rep := range r.replicas {
		if rep.memory != nil {
			f(key, n)
		}
	}
}

// childKeys is the set of routed keys put under one parent. A prompt's pages form a
// chain, so most parents have one child: it is kept inline, and a map only from the
// second on (a map per parent was a tenth of the bytes a stored page allocated here).
type childKeys struct {
	one  string              // a member, or "" (keys are never empty)
	more map[string]struct{} // the other members
}

func (c *childKeys) add(k string) {
	if c.one == k {
		return
	}
	if _, ok := c.more[k]; ok {
		return
	}
	if c.one == "" {
		c.one = k
		return
	}
	if c.more == nil {
		c.more = make(map[string]struct{}, 1)
	}
	c.more[k] = struct{}{}
}

// remove drops k and reports whether the set is now empty.
func (c *childKeys) remove(k string) bool {
	if c.one == k {
		c.one = ""
	} else {
		delete(c.more, k)
	}
	return c.one == "" && len(c.more) == 0
}

// refreshChainLocked: a page is being put under parent, so parent's prefix was just
// used; its memory replicas and the pages above them move on in their nodes' order
// before the put's allocation evicts anything (pagePolicy.refresh).
func (s *State) refreshChainLocked(parent string) {
	r := s.routes[parent]
	if parent == "" || r == nil {
		return
	}
	for n, rep := range r.replicas {
		if rep.memory != nil && !n.tombed {
			n.policy.RefreshChain(parent)
		}
	}
}
