package master

import "fmt"

// Policy orders the memory replicas of one node for eviction, weighted by the bytes
// they hold: a weighted S3-FIFO. New keys enter a small FIFO (about 10% of the total
// weight); keys hit while there move to the main FIFO when they reach its tail, the
// others are evicted and remembered in a ghost FIFO of keys only. A key found in the
// ghost when it is inserted again goes straight to main. Main is a FIFO with
// reinsertion: a tail key that was hit goes back to the head with its frequency
// decremented (frequencies are capped at 3). A one-shot scan therefore passes through
// small without disturbing main, where the hot keys live.
//
// Every insert is admitted (a put is readable right after it returns), and the most
// recently inserted key is chosen as a victim only when it is the last key left.
// Each operation is O(1) amortized. Create one with NewPolicy; not safe for concurrent
// use.
type Policy[K comparable] struct {
	entries map[K]*policyEntry[K] // live keys and ghosts
	small   policyQueue[K]
	main    policyQueue[K]
	ghost   policyQueue[K] // weights are zero here
	newest  *policyEntry[K]
	// victimWeight is the weight of the last victim (a small victim's goes to zero in
	// the ghost): VictimWhere restores it.
	victimWeight int64
	// now is the clock evictOrder stamps inserts and hits with (it orders these keys
	// against a node's KV pages); it plays no part in the order within the policy.
	now int64
	// drawing: a VictimWhere has keys out that it may put back; the ghost is trimmed
	// once they are back (the live count is short by them meanwhile).
	drawing bool
}

const (
	maxFreq = 3
	// smallPercent is the small FIFO's share of the total weight.
	smallPercent = 10
	// minGhost is the fewest ghost keys kept however few keys are live.
	minGhost = 16
)

type queueID uint8

const (
	inSmall queueID = iota
	inMain
	inGhost
)

type policyEntry[K comparable] struct {
	key    K
	weight int64
	freq   uint8
	queue  queueID
	stamp  int64 // the clock at the last insert or hit

	prev, next *policyEntry[K]
}

// policyQueue is an intrusive FIFO: new entries at the head, the oldest at the tail.
// Its root is a sentinel: root.next is the head, root.prev the tail.
type policyQueue[K comparable] struct {
	root   policyEntry[K]
	n      int
	weight int64
}

func (q *policyQueue[K]) tail() *policyEntry[K] {
	if q.n == 0 {
		return nil
	}
	return q.root.prev
}

func (q *policyQueue[K]) pushHead(e *policyEntry[K], id queueID) {
	q.init()
	q.insertAfter(&q.root, e, id)
}

func (q *policyQueue[K]) pushTail(e *policyEntry[K], id queueID) {
	q.init()
	q.insertAfter(q.root.prev, e, id)
}

// init links the empty ring of a zero queue.
func (q *policyQueue[K]) init() {
	if q.root.next == nil {
		q.root.next, q.root.prev = &q.root, &q.root
	}
}

// insertAfter links e into queue id right after at (the root: at the head).
func (q *policyQueue[K]) insertAfter(at, e *policyEntry[K], id queueID) {
	e.queue = id
	e.prev, e.next = at, at.next
	at.next.prev = e
	at.next = e
	q.n++
	q.weight += e.weight
}

func (q *policyQueue[K]) remove(e *policyEntry[K]) {
	e.prev.next = e.next
	e.next.prev = e.prev
	e.prev, e.next = nil, nil
	q.n--
	q.weight -= e.weight
}

// NewPolicy returns an empty policy.
func NewPolicy[K comparable]() *Policy[K] {
	return &Policy[K]{entries: make(map[K]*policyEntry[K])}
}

// Len is the number of live keys.
func (p *Policy[K]) Len() int { return p.small.n + p.main.n }

// Weight is the total weight of live keys.
func (p *Policy[K]) Weight() int64 { return p.small.weight + p.main.weight }

// Insert adds k with the given weight; it is always admitted. A key remembered in the
// ghost goes straight to main. Inserting a live key again updates its weight and counts
// as an access.
func (p *Policy[K]) Insert(k K, weight int64) {
	if weight < 0 {
		panic(fmt.Sprintf("BUG: policy insert of %v with negative weight %d", k, weight))
	}
	e := p.entries[k]
	switch {
	case e == nil:
		e = &policyEntry[K]{key: k, weight: weight}
		p.entries[k] = e
		p.small.pushHead(e, inSmall)
	case e.queue == inGhost:
		p.ghost.remove(e)
		e.weight, e.freq = weight, 0
		p.main.pushHead(e, inMain)
	default:
		q := p.queue(e)
		q.weight += weight - e.weight
		e.weight = weight
		e.freq = min(e.freq+1, maxFreq)
	}
	e.stamp = p.now
	p.newest = e
}

// Touch records a hit on k; unknown keys and ghosts are ignored.
func (p *Policy[K]) Touch(k K) {
	if e := p.entries[k]; e != nil && e.queue != inGhost {
		e.freq = min(e.freq+1, maxFreq)
		e.stamp = p.now
	}
}

// has reports whether k is live.
func (p *Policy[K]) has(k K) bool {
	e := p.entries[k]
	return e != nil && e.queue != inGhost
}

// nextStamp is the stamp of the key Victim would examine first (the tail of the queue
// it evicts from); ok is false when no key is live.
func (p *Policy[K]) nextStamp() (int64, bool) {
	switch {
	case p.Len() == 0:
		return 0, false
	case p.small.n > 0 && (p.main.n == 0 || p.small.weight*100 > p.Weight()*smallPercent):
		return p.small.tail().stamp, true
	default:
		return p.main.tail().stamp, true
	}
}

// Remove forgets a live key (deleted or overwritten) without reporting it as a victim.
// It reports whether k was live; a key only in the ghost stays there.
func (p *Policy[K]) Remove(k K) bool {
	e := p.entries[k]
	if e == nil || e.queue == inGhost {
		return false
	}
	p.queue(e).remove(e)
	delete(p.entries, k)
	if p.newest == e {
		p.newest = nil
	}
	p.trimGhost()
	return true
}

// Evict evicts the live key k out of turn, as if Victim had drawn it: a key in small is
// remembered in the ghost, one in main is forgotten. It reports whether k was live.
func (p *Policy[K]) Evict(k K) bool {
	e := p.entries[k]
	if e == nil || e.queue == inGhost {
		return false
	}
	from := e.queue
	p.queue(e).remove(e)
	p.evicted(e)
	if from == inSmall {
		e.weight, e.freq = 0, 0
		p.ghost.pushHead(e, inGhost)
	} else {
		delete(p.entries, k)
	}
	p.trimGhost()
	return true
}

// Victim chooses the next key to evict, removes it and returns it; false when no key
// is live. Small is evicted from while it holds more than 10% of the weight (or main
// is empty), main otherwise.
func (p *Policy[K]) Victim() (K, bool) {
	if e, _ := p.victim(); e != nil {
		return e.key, true
	}
	var zero K
	return zero, false
}

// victim is Victim; it also says which queue the victim left.
func (p *Policy[K]) victim() (*policyEntry[K], queueID) {
	for p.Len() > 0 {
		var e *policyEntry[K]
		var ok bool
		from := inSmall
		if p.small.n > 0 && (p.main.n == 0 || p.small.weight*100 > p.Weight()*smallPercent) {
			if e, ok = p.stepSmall(); !ok {
				from = inMain
				e, ok = p.stepMain()
			}
		} else {
			from = inMain
			if e, ok = p.stepMain(); !ok {
				from = inSmall
				e, ok = p.stepSmall()
			}
		}
		if !ok {
			panic("BUG: policy found no victim among live keys")
		}
		if e != nil {
			return e, from
		}
	}
	return nil, 0
}

// VictimWhere is Victim restricted to the keys accept takes: it draws victims in the
// order Victim would and evicts the first one accepted; the refused ones go back where
// they were (the tail of their queue, in their order, as if never drawn; the steps
// that moved other keys on the way, a hit key's promotion or lap, stand, as they
// would for Victim). At most limit keys are drawn: false when none of them was
// accepted (or no key is live), and then nothing was evicted.
func (p *Policy[K]) VictimWhere(accept func(K) bool, limit int) (K, bool) {
	type drawn struct {
		e      *policyEntry[K]
		from   queueID
		weight int64
	}
	var refused []drawn
	newest := p.newest
	var victim *policyEntry[K]
	p.drawing = true
	defer func() {
		p.drawing = false
		p.trimGhost()
	}()
	for range limit {
		e, from := p.victim()
		if e == nil {
			break
		}
		if accept(e.key) {
			victim = e
			break
		}
		refused = append(refused, drawn{e, from, p.victimWeight})
	}
	for i := len(refused) - 1; i >= 0; i-- {
		d := refused[i]
		if d.e.queue == inGhost && d.e.prev != nil {
			p.ghost.remove(d.e) // still remembered as a ghost
		}
		d.e.weight = d.weight
		p.entries[d.e.key] = d.e
		if d.from == inSmall {
			p.small.pushTail(d.e, inSmall)
		} else {
			p.main.pushTail(d.e, inMain)
		}
	}
	if newest != nil && newest != victim {
		p.newest = newest
	}
	if victim == nil {
		var zero K
		return zero, false
	}
	return victim.key, true
}

// stepSmall handles small's oldest key: a key hit since it was inserted moves to main,
// any other is evicted (victim set) and remembered in the ghost. ok is false when that
// key is the newest and others are left: it stays, and main must evict instead.
func (p *Policy[K]) stepSmall() (victim *policyEntry[K], ok bool) {
	e := p.small.tail()
	if e.freq > 0 {
		p.small.remove(e)
		e.freq = 0
		p.main.pushHead(e, inMain)
		return nil, true
	}
	if e == p.newest && p.Len() > 1 {
		return nil, false // small holds only the newest key (a re-inserted one has freq > 0)
	}
	p.small.remove(e)
	p.evicted(e)
	p.victimWeight = e.weight
	e.weight = 0
	p.ghost.pushHead(e, inGhost)
	p.trimGhost()
	return e, true
}

// stepMain handles main's oldest key: a key hit since its last lap goes back to the
// head with one hit less, any other is evicted (victim set). The newest key goes back
// to the head untouched while main holds others; ok is false when main holds only it.
func (p *Policy[K]) stepMain() (victim *policyEntry[K], ok bool) {
	e := p.main.tail()
	switch {
	case e.freq > 0:
		e.freq--
	case e == p.newest && p.Len() > 1:
		if p.main.n == 1 {
			return nil, false
		}
	default:
		p.main.remove(e)
		p.evicted(e)
		p.victimWeight = e.weight
		delete(p.entries, e.key)
		p.trimGhost()
		return e, true
	}
	p.main.remove(e)
	p.main.pushHead(e, inMain)
	return nil, true
}

// trimGhost forgets the oldest ghosts beyond as many as there are live keys (not while
// a VictimWhere has refused keys out: they are live again once it put them back).
func (p *Policy[K]) trimGhost() {
	for !p.drawing && p.ghost.n > max(p.Len(), minGhost) {
		g := p.ghost.tail()
		p.ghost.remove(g)
		delete(p.entries, g.key)
	}
}

func (p *Policy[K]) evicted(e *policyEntry[K]) {
	if p.newest == e {
		p.newest = nil
	}
}

func (p *Policy[K]) queue(e *policyEntry[K]) *policyQueue[K] {
	switch e.queue {
	case inSmall:
		return &p.small
	case inMain:
		return &p.main
	default:
		return &p.ghost
	}
}
