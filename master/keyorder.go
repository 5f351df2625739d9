package master

import "container/list"

// keyOrder is a set of keys kept in the order they came in: insert and remove in
// O(1), walked from the oldest. The zero value is an empty set.
//
// Not safe for concurrent use; the State's lock protects it.
type keyOrder struct {
	at map[string]*list.Element
	l  list.List
}

// push adds k at the back (the newest); a key already in the set is left in place.
func (o *keyOrder) push(k string) {
	if o.at == nil {
		o.at = make(map[string]*list.Element)
	}
	if _, ok := o.at[k]; !ok {
		o.at[k] = o.l.PushBack(k)
	}
}

// remove takes k out of the set, if it is there.
func (o *keyOrder) remove(k string) {
	if e, ok := o.at[k]; ok {
		o.l.Remove(e)
		delete(o.at, k)
	}
}

// has reports whether k is in the set.
func (o *keyOrder) has(k string) bool {
	_, ok := o.at[k]
	return ok
}

// len is the number of keys in the set.
func (o *keyOrder) len() int { return len(o.at) }

// each calls f on the keys from the oldest until it returns false. f must not change
// the set.
func (o *keyOrder) each(f func(k string) bool) {
	for e := o.l.Front(); e != nil; e = e.Next() {
		if !f(e.Value.(string)) {
			return
		}
	}
}
