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
	if r.parent != "" {
		c := s.children[r.parent]
		if c == nil {
			c = make(map[string]struct{})
			s.children[r.parent] = c
		}
		c[key] = struct{}{}
	}
	s.eachChildReplicaLocked(key, func(child string, n *node) { n.policy.Adopt(child) })
}

// unlinkChainLocked forgets a removed route under its parent and orphans its children.
func (s *State) unlinkChainLocked(key string, r *route) {
	if c := s.children[r.parent]; r.parent != "" && c != nil {
		delete(c, key)
		if len(c) == 0 {
			delete(s.children, r.parent)
		}
	}
	s.eachChildReplicaLocked(key, func(child string, n *node) { n.policy.Orphan(child) })
}

// eachChildReplicaLocked calls f for every memory replica of key's routed children.
func (s *State) eachChildReplicaLocked(key string, f func(child string, n *node)) {
	for child := range s.children[key] {
		cr := s.routes[child]
		if cr == nil {
			continue
		}
		for n, rep := range cr.replicas {
			if rep.memory != nil {
				f(child, n)
			}
		}
	}
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
