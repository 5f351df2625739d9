package master

import (
	gbtree "github.com/google/btree"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Namespaces (protocol/external.thrift NAMESPACE_SEPARATOR): a key's namespace is the
// text before its last '/'. The master indexes the routed keys of every namespace, in
// key order, with the bytes of their current versions, so a namespace delete or stat
// costs O(keys of the namespace), not O(all keys). Every change of s.routes goes through
// setRouteLocked / unsetRouteLocked, which keep the index in step; a key in no namespace
// costs nothing more.

// namespace is one namespace's routed keys and the summed length of their versions.
type namespace struct {
	keys  *gbtree.BTreeG[string]
	bytes int64
}

// setRouteLocked makes r the route of key, which has none (a route being replaced is
// dropped first: dropRouteLocked).
func (s *State) setRouteLocked(key string, r *route) {
	if s.routes[key] != nil {
		panic("BUG: a route set over another one")
	}
	s.routes[key] = r
	s.linkChainLocked(key, r)
	name, ok := wire.KeyNamespace(key)
	if !ok {
		return
	}
	ns := s.namespaces[name]
	if ns == nil {
		ns = &namespace{keys: gbtree.NewG(32, func(a, b string) bool { return a < b })}
		s.namespaces[name] = ns
	}
	ns.keys.ReplaceOrInsert(key)
	ns.bytes += r.len
}

// unsetRouteLocked removes key's route, if any.
func (s *State) unsetRouteLocked(key string) {
	r := s.routes[key]
	if r == nil {
		return
	}
	delete(s.routes, key)
	s.routeDroppedLocked(key, r.putID)
	s.unlinkChainLocked(key, r)
	name, ok := wire.KeyNamespace(key)
	if !ok {
		return
	}
	ns := s.namespaces[name]
	if ns == nil {
		panic("BUG: a routed key's namespace is not indexed")
	}
	ns.keys.Delete(key)
	ns.bytes -= r.len
	if ns.keys.Len() == 0 {
		delete(s.namespaces, name)
	}
}

// NamespaceStat is the number of routed keys of namespace name and their versions' bytes.
func (s *State) NamespaceStat(ref NodeRef, name string) (keys, bytes int64, err error) {
	if _, err := s.nodeLocked(ref); err != nil {
		return 0, 0, err
	}
	if err := wire.ValidateNamespace(name); err != nil {
		return 0, 0, err
	}
	if ns := s.namespaces[name]; ns != nil {
		return int64(ns.keys.Len()), ns.bytes, nil
	}
	return 0, 0, nil
}

// NamespaceDelete deletes the first limit keys (in key order) of namespace name, each as
// Delete does, and reports how many existed and how many keys the namespace has left. The requester is
// among the owners invalidated synchronously: its records of the keys go before the
// answer, which it may lose (it knew none of the keys when it asked).
func (s *State) NamespaceDelete(ref NodeRef, name string, limit int) (deleted, left int, invs []Invalidation, err error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return 0, 0, nil, err
	}
	if err := wire.ValidateNamespace(name); err != nil {
		return 0, 0, nil, err
	}
	if s.tombstones != nil {
		// While the rebuild window is open, owners may still report keys of the namespace
		// that no route names yet: whatever they report is older than this delete.
		if s.nsTombstones == nil {
			s.nsTombstones = make(map[string]bool)
		}
		s.nsTombstones[name] = true
	}
	ns := s.namespaces[name]
	if ns == nil {
		return 0, 0, nil, nil
	}
	keys := make([]string, 0, min(limit, ns.keys.Len()))
	ns.keys.Ascend(func(k string) bool {
		keys = append(keys, k)
		return len(keys) < limit
	})
	for _, k := range keys {
		existed, putID, kinvs := s.deleteLocked(n, k)
		if existed {
			deleted++
		}
		invs = append(invs, kinvs...)
		if n.peerAddr != "" {
			iv := Invalidation{NodeID: n.id, PeerAddr: n.peerAddr, Generation: n.generation, Key: k, PutID: putID, Sync: true}
			s.pendSyncLocked(iv)
			invs = append(invs, iv)
		}
	}
	if ns := s.namespaces[name]; ns != nil {
		left = ns.keys.Len()
	}
	return deleted, left, invs, nil
}
