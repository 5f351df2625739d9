package master

import (
	"container/list"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// checkPolicy verifies the queues against the map: every entry in exactly the queue
// it names, counts and weights summed, frequencies capped, the ghost bounded.
func checkPolicy[K comparable](t testing.TB, p *Policy[K]) {
	t.Helper()
	seen := 0
	for _, q := range []struct {
		id queueID
		q  *policyQueue[K]
	}{{inSmall, &p.small}, {inMain, &p.main}, {inGhost, &p.ghost}} {
		n := 0
		var w int64
		if q.q.n > 0 || q.q.root.next != nil {
			prev := &q.q.root
			for e := q.q.root.next; e != &q.q.root; e = e.next {
				if e.prev != prev || e.queue != q.id || p.entries[e.key] != e || e.freq > maxFreq {
					t.Fatalf("queue %d: entry %v malformed", q.id, e.key)
				}
				if q.id == inGhost && (e.weight != 0 || e.freq != 0) {
					t.Fatalf("ghost %v keeps weight %d freq %d", e.key, e.weight, e.freq)
				}
				prev = e
				n++
				w += e.weight
			}
		}
		if n != q.q.n || w != q.q.weight {
			t.Fatalf("queue %d: %d entries of weight %d, counted %d of %d", q.id, n, w, q.q.n, q.q.weight)
		}
		seen += n
	}
	if seen != len(p.entries) {
		t.Fatalf("%d entries in queues, %d in the map", seen, len(p.entries))
	}
	if p.ghost.n > max(p.Len(), minGhost) {
		t.Fatalf("ghost holds %d keys for %d live", p.ghost.n, p.Len())
	}
	if p.newest != nil && (p.entries[p.newest.key] != p.newest || p.newest.queue == inGhost) {
		t.Fatalf("newest %v is not live", p.newest.key)
	}
}

func drain[K comparable](t testing.TB, p *Policy[K]) []K {
	t.Helper()
	var out []K
	for {
		k, ok := p.Victim()
		if !ok {
			break
		}
		out = append(out, k)
		checkPolicy(t, p)
	}
	if p.Len() != 0 || p.Weight() != 0 {
		t.Fatalf("drained policy: len %d weight %d", p.Len(), p.Weight())
	}
	return out
}

func TestPolicyBasics(t *testing.T) {
	p := NewPolicy[string]()
	if _, ok := p.Victim(); ok || p.Len() != 0 || p.Weight() != 0 {
		t.Fatal("empty policy is not empty")
	}
	p.Insert("a", 10)
	p.Insert("b", 20)
	p.Insert("c", 30)
	checkPolicy(t, p)
	if p.Len() != 3 || p.Weight() != 60 {
		t.Fatalf("len %d weight %d", p.Len(), p.Weight())
	}
	p.Insert("b", 25) // re-insert: new weight, counts as an access
	if p.Len() != 3 || p.Weight() != 65 || p.entries["b"].freq != 1 {
		t.Fatalf("after re-insert: len %d weight %d freq %d", p.Len(), p.Weight(), p.entries["b"].freq)
	}
	p.Insert("c", 30) // c is the newest again
	// Untouched keys leave oldest first; b was accessed and outlives a; c is newest.
	if got, want := drain(t, p), []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("victims %v, want %v", got, want)
	}
	p.Touch("nothing") // unknown keys are ignored
	if p.Remove("nothing") {
		t.Fatal("Remove of an unknown key reported true")
	}
}

func TestPolicyFrequencyPromotion(t *testing.T) {
	p := NewPolicy[int]()
	for k := range 10 {
		p.Insert(k, 1)
	}
	p.Touch(0)
	p.Touch(3)
	p.Touch(3)
	got := drain(t, p)
	// The untouched keys go first, oldest first; the touched ones went to main.
	want := []int{1, 2, 4, 5, 6, 7, 8}
	if !slices.Equal(got[:len(want)], want) {
		t.Fatalf("victims %v, want the untouched keys %v first", got, want)
	}
	if got[len(got)-1] != 9 {
		t.Fatalf("victims %v: the newest key 9 must go last", got)
	}
}

func TestPolicyMainReinsertion(t *testing.T) {
	p := NewPolicy[int]()
	for k := range 10 {
		p.Insert(k, 1)
	}
	p.Insert(100, 1)
	for range 10 { // 0..9 leave small unhit, into the ghost
		p.Victim()
	}
	for k := range 10 { // back from the ghost: main holds 0..9, 0 oldest
		p.Insert(k, 1)
	}
	p.Remove(100)
	if p.main.n != 10 || p.small.n != 0 {
		t.Fatalf("small %d, main %d keys", p.small.n, p.main.n)
	}
	for range 4 {
		p.Touch(0) // capped at 3
	}
	p.Touch(1)
	// FIFO with reinsertion: unhit keys leave in order; 1 after one more lap, 0 after
	// three; 9, the newest, last.
	if got, want := drain(t, p), []int{2, 3, 4, 5, 6, 7, 8, 1, 0, 9}; !slices.Equal(got, want) {
		t.Fatalf("victims %v, want %v", got, want)
	}
}

func TestPolicyNewestIsLast(t *testing.T) {
	p := NewPolicy[string]()
	for i := range 5 {
		p.Insert(fmt.Sprint("old", i), 1)
	}
	// A put far heavier than everything else: small is over its share, but the new
	// key must stay readable while anything older is left.
	p.Insert("big", 1000)
	got := drain(t, p)
	if got[len(got)-1] != "big" {
		t.Fatalf("victims %v: the newest key was evicted before older ones", got)
	}
	// The same when the newest goes to main from the ghost and main holds only it.
	p.Insert("a", 1)
	p.Insert("b", 1)
	if k, _ := p.Victim(); k != "a" {
		t.Fatalf("victim %q, want a", k)
	}
	p.Insert("a", 1) // from the ghost into main
	if p.entries["a"].queue != inMain {
		t.Fatal("a ghost key was not re-admitted into main")
	}
	for i := range 20 {
		p.Insert(fmt.Sprint("s", i), 1)
		p.Touch(fmt.Sprint("s", i))
	}
	p.Insert("a", 5) // newest again, in main
	got = drain(t, p)
	if got[len(got)-1] != "a" {
		t.Fatalf("victims %v: the newest key was evicted before older ones", got)
	}
}

func TestPolicyRemove(t *testing.T) {
	p := NewPolicy[int]()
	for k := range 20 {
		p.Insert(k, int64(k))
	}
	p.Touch(0)
	for range 5 {
		p.Victim() // 0 goes to main, 1..5 to the ghost
	}
	checkPolicy(t, p)
	if p.entries[0].queue != inMain || p.entries[1].queue != inGhost {
		t.Fatal("unexpected queue layout")
	}
	for _, k := range []int{0, 10, 19} { // in main, in small, the newest
		w := p.Weight()
		if !p.Remove(k) {
			t.Fatalf("Remove(%d) = false", k)
		}
		if p.Weight() != w-int64(k) {
			t.Fatalf("Remove(%d): weight %d, want %d", k, p.Weight(), w-int64(k))
		}
		checkPolicy(t, p)
	}
	if p.Remove(0) || p.Remove(1) || p.Remove(99) {
		t.Fatal("Remove of a removed, ghost or unknown key reported true")
	}
	if p.Len() != 12 {
		t.Fatalf("len %d, want 12", p.Len())
	}
	for _, k := range drain(t, p) {
		if k == 0 || k == 10 || k == 19 || (k >= 1 && k <= 5) {
			t.Fatalf("victim %d was removed or evicted before", k)
		}
	}
}

func TestPolicyGhostReadmission(t *testing.T) {
	p := NewPolicy[int]()
	for k := range 100 {
		p.Insert(k, 1)
	}
	for range 10 {
		p.Victim() // 0..9 leave small unhit: they go to the ghost
	}
	for k := range 10 {
		if e := p.entries[k]; e == nil || e.queue != inGhost {
			t.Fatalf("evicted key %d is not in the ghost", k)
		}
	}
	p.Insert(3, 7) // seen again soon after eviction: straight into main
	if e := p.entries[3]; e.queue != inMain || e.weight != 7 || p.Weight() != 97 {
		t.Fatalf("re-admitted key: queue %d weight %d, total %d", e.queue, e.weight, p.Weight())
	}
	p.Touch(4) // touching a ghost does nothing
	if p.entries[4].queue != inGhost || p.Len() != 91 {
		t.Fatal("Touch of a ghost changed it")
	}
	// A scan of new keys churns small and leaves the re-admitted key in main alone.
	for k := 1000; k < 1200; k++ {
		p.Insert(k, 1)
		for p.Weight() > 97 {
			if v, _ := p.Victim(); v == 3 {
				t.Fatal("re-admitted key evicted by a scan")
			}
		}
	}
	checkPolicy(t, p)
	// The ghost stays bounded by the live keys.
	if len(p.entries) > p.Len()+max(p.Len(), minGhost) {
		t.Fatalf("%d keys remembered for %d live", len(p.entries), p.Len())
	}
}

func TestPolicyWeights(t *testing.T) {
	p := NewPolicy[string]()
	// Main holds nine keys of weight 100 (re-admitted from the ghost).
	for i := range 9 {
		p.Insert(fmt.Sprint("hot", i), 100)
	}
	p.Insert("tmp", 0)
	for range 9 {
		p.Victim()
	}
	for i := range 9 {
		p.Insert(fmt.Sprint("hot", i), 100)
	}
	p.Remove("tmp")
	if p.main.n != 9 || p.Weight() != 900 {
		t.Fatalf("main %d keys, weight %d", p.main.n, p.Weight())
	}
	p.Insert("cold0", 100)
	p.Insert("cold1", 5)
	p.Insert("new", 1)
	if p.Len() != 12 || p.Weight() != 1006 {
		t.Fatalf("len %d weight %d", p.Len(), p.Weight())
	}
	// Small holds 106 of 1006: over 10%, so small evicts first.
	if k, _ := p.Victim(); k != "cold0" {
		t.Fatalf("victim %q, want cold0", k)
	}
	// Small holds 2 of 11 keys but 6 of 906 bytes: under its share by weight, so main
	// evicts next.
	if k, _ := p.Victim(); k != "hot0" {
		t.Fatalf("victim %q, want hot0", k)
	}
	// Re-inserting cold1 heavier is an access and a new weight: small is over its
	// share, cold1 was hit, so it moves to main, and main evicts.
	p.Insert("cold1", 500)
	if p.Weight() != 1301 {
		t.Fatalf("weight %d after re-weighting, want 1301", p.Weight())
	}
	if k, _ := p.Victim(); k != "hot1" || p.entries["cold1"].queue != inMain || p.Weight() != 1201 {
		t.Fatalf("victim %q, cold1 in queue %d, weight %d", k, p.entries["cold1"].queue, p.Weight())
	}
	checkPolicy(t, p)
}

// cacheSim is a cache of unit-weight keys: access reports a hit, and on a miss inserts
// the key and evicts down to the capacity.
type cacheSim interface {
	access(k int) bool
}

type s3Sim struct {
	p    *Policy[int]
	live []bool
	cap  int64
}

func (s *s3Sim) access(k int) bool {
	if s.live[k] {
		s.p.Touch(k)
		return true
	}
	s.p.Insert(k, 1)
	s.live[k] = true
	for s.p.Weight() > s.cap {
		v, _ := s.p.Victim()
		s.live[v] = false
	}
	return false
}

type lruSim struct {
	l   *list.List
	m   map[int]*list.Element
	cap int
}

func (s *lruSim) access(k int) bool {
	if e := s.m[k]; e != nil {
		s.l.MoveToFront(e)
		return true
	}
	s.m[k] = s.l.PushFront(k)
	if s.l.Len() > s.cap {
		delete(s.m, s.l.Remove(s.l.Back()).(int))
	}
	return false
}

type fifoSim struct {
	q    []int
	live []bool
	cap  int
}

func (s *fifoSim) access(k int) bool {
	if s.live[k] {
		return true
	}
	s.q = append(s.q, k)
	s.live[k] = true
	if len(s.q) > s.cap {
		s.live[s.q[0]] = false
		s.q = s.q[1:]
	}
	return false
}

func newSims(keys, capacity int) (s3, lru, fifo cacheSim) {
	return &s3Sim{p: NewPolicy[int](), live: make([]bool, keys), cap: int64(capacity)},
		&lruSim{l: list.New(), m: make(map[int]*list.Element), cap: capacity},
		&fifoSim{live: make([]bool, keys), cap: capacity}
}

// zipf draws ranks 0..n-1 with P(k) ∝ 1/(k+1)^s (math/rand's Zipf needs s > 1).
type zipf struct {
	cdf []float64
	rng *rand.Rand
}

func newZipf(rng *rand.Rand, s float64, n int) *zipf {
	z := &zipf{cdf: make([]float64, n), rng: rng}
	var sum float64
	for k := range n {
		sum += 1 / math.Pow(float64(k+1), s)
		z.cdf[k] = sum
	}
	for k := range z.cdf {
		z.cdf[k] /= sum
	}
	return z
}

func (z *zipf) next() int {
	return min(sort.SearchFloat64s(z.cdf, z.rng.Float64()), len(z.cdf)-1)
}

// TestPolicyScanResistance: a hot set hit often, then a one-shot scan ten times the
// cache size. S3-FIFO keeps the hot set; LRU loses it.
func TestPolicyScanResistance(t *testing.T) {
	const keys, capacity, hot = 20000, 1000, 600
	s3, lru, _ := newSims(keys, capacity)
	for range 5 {
		for k := range hot {
			s3.access(k)
			lru.access(k)
		}
	}
	for k := hot; k < hot+10*capacity; k++ {
		s3.access(k)
		lru.access(k)
	}
	kept := func(c cacheSim) (n int) {
		for k := range hot {
			if c.access(k) {
				n++
			}
		}
		return n
	}
	s3Kept, lruKept := kept(s3), kept(lru)
	t.Logf("hot keys surviving a scan of %d: S3-FIFO %d/%d, LRU %d/%d", 10*capacity, s3Kept, hot, lruKept, hot)
	if s3Kept < hot*95/100 {
		t.Fatalf("the scan flushed the hot set: %d of %d left", s3Kept, hot)
	}
	checkPolicy(t, s3.(*s3Sim).p)
}

// TestPolicyZipfHitRate compares hit rates on Zipf(0.99) keys of equal weight with a
// cache of 50–80% of the key space.
func TestPolicyZipfHitRate(t *testing.T) {
	keys, requests := 10000, 300000
	if testing.Short() {
		keys, requests = 2000, 60000
	}
	for _, share := range []float64{0.5, 0.65, 0.8} {
		capacity := int(share * float64(keys))
		s3, lru, fifo := newSims(keys, capacity)
		var hits [3]int
		z := newZipf(rand.New(rand.NewPCG(11, uint64(capacity))), 0.99, keys)
		warm := requests / 5
		for i := range requests {
			k := z.next()
			for j, c := range []cacheSim{s3, lru, fifo} {
				if c.access(k) && i >= warm {
					hits[j]++
				}
			}
		}
		rate := func(j int) float64 { return 100 * float64(hits[j]) / float64(requests-warm) }
		t.Logf("cache %2.0f%% of %d keys: hit rate S3-FIFO %.2f%%, LRU %.2f%%, FIFO %.2f%%",
			100*share, keys, rate(0), rate(1), rate(2))
		if rate(0) < rate(1)-1 || rate(0) < rate(2)-1 {
			t.Fatalf("S3-FIFO hit rate %.2f%% more than a point below LRU %.2f%% or FIFO %.2f%%", rate(0), rate(1), rate(2))
		}
		checkPolicy(t, s3.(*s3Sim).p)
	}
}

// BenchmarkPolicy measures one cache access (Touch on a hit; Insert and Victim on a
// miss) with Zipf(0.99) keys and a cache of half the key space.
func BenchmarkPolicy(b *testing.B) {
	const keys = 1 << 20
	z := newZipf(rand.New(rand.NewPCG(1, 1)), 0.99, keys)
	trace := make([]int, 1<<20)
	for i := range trace {
		trace[i] = z.next()
	}
	s := &s3Sim{p: NewPolicy[int](), live: make([]bool, keys), cap: keys / 2}
	for _, k := range trace {
		s.access(k)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		s.access(trace[i&(len(trace)-1)])
	}
}

// FuzzPolicy runs random Insert, Touch, Remove and Victim sequences against a map of
// live keys: Len and Weight always match, every victim is live, the newest key is a
// victim only when it is the last, and draining returns every remaining key once.
func FuzzPolicy(f *testing.F) {
	f.Add([]byte{0, 1, 5, 0, 2, 6, 1, 1, 0, 3, 0, 0, 2, 2, 0, 0, 3, 0, 0, 0})
	f.Add([]byte{0, 1, 1, 0, 1, 1, 3, 0, 0, 0, 1, 9, 1, 1, 0, 3, 0, 0, 2, 1, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		p := NewPolicy[uint8]()
		live := make(map[uint8]int64)
		var weight int64
		newest, hasNewest := uint8(0), false
		check := func(what string) {
			t.Helper()
			checkPolicy(t, p)
			if p.Len() != len(live) || p.Weight() != weight {
				t.Fatalf("after %s: len %d weight %d, model %d and %d", what, p.Len(), p.Weight(), len(live), weight)
			}
		}
		for len(ops) >= 3 {
			op, k, w := ops[0]%4, ops[1]%48, int64(ops[2])
			ops = ops[3:]
			switch op {
			case 0:
				p.Insert(k, w)
				weight += w - live[k]
				live[k] = w
				newest, hasNewest = k, true
				check("Insert")
			case 1:
				p.Touch(k)
				check("Touch")
			case 2:
				_, want := live[k]
				if got := p.Remove(k); got != want {
					t.Fatalf("Remove(%d) = %v, model %v", k, got, want)
				}
				weight -= live[k]
				delete(live, k)
				if k == newest {
					hasNewest = false
				}
				check("Remove")
			case 3:
				v, ok := p.Victim()
				if ok != (len(live) > 0) {
					t.Fatalf("Victim() = %v with %d live keys", ok, len(live))
				}
				if !ok {
					continue
				}
				if _, isLive := live[v]; !isLive {
					t.Fatalf("Victim() = %d, not live", v)
				}
				if hasNewest && v == newest && len(live) > 1 {
					t.Fatalf("Victim() = %d, the newest key, with %d others live", v, len(live)-1)
				}
				if v == newest {
					hasNewest = false
				}
				weight -= live[v]
				delete(live, v)
				check("Victim")
			}
		}
		for _, v := range drain(t, p) {
			if _, isLive := live[v]; !isLive {
				t.Fatalf("drain returned %d twice or never inserted", v)
			}
			delete(live, v)
		}
		if len(live) != 0 {
			t.Fatalf("drain missed %d live keys", len(live))
		}
	})
}

// VictimWhere evicts the first accepted key in Victim's order and puts the refused
// ones back where they were: the order of the rest is Victim's order without it.
func TestPolicyVictimWhere(t *testing.T) {
	build := func() *Policy[int] {
		p := NewPolicy[int]()
		for k := 1; k <= 40; k++ {
			p.Insert(k, int64(1+k%3))
			if k%5 == 0 {
				p.Touch(k)
			}
		}
		return p
	}
	drain := func(p *Policy[int]) []int {
		var out []int
		for {
			k, ok := p.Victim()
			if !ok {
				return out
			}
			out = append(out, k)
		}
	}
	want := drain(build())
	p := build()
	isMult7 := func(k int) bool { return k%7 == 0 }
	k, ok := p.VictimWhere(isMult7, 256)
	first := -1
	for _, w := range want {
		if isMult7(w) {
			first = w
			break
		}
	}
	if !ok || k != first {
		t.Fatalf("VictimWhere = %d, %v; want %d (the first multiple of 7 in %v)", k, ok, first, want)
	}
	rest := drain(p)
	wantRest := slices.DeleteFunc(slices.Clone(want), func(x int) bool { return x == first })
	if !slices.Equal(rest, wantRest) {
		t.Fatalf("after VictimWhere the order is\n %v\nwant\n %v", rest, wantRest)
	}
	// Nothing accepted within the limit: nothing evicted. (Drawing every key advances
	// the clock over all of them, hit keys losing their hits as Victim would, so the
	// order afterwards is not the untouched one.)
	p = build()
	if k, ok := p.VictimWhere(func(int) bool { return false }, 256); ok {
		t.Fatalf("VictimWhere accepted %d", k)
	}
	if p.Len() != 40 || p.Weight() != build().Weight() {
		t.Fatalf("Len %d weight %d after a refused scan, want 40 and %d", p.Len(), p.Weight(), build().Weight())
	}
	got := drain(p)
	slices.Sort(got)
	if len(got) != 40 || got[0] != 1 || got[39] != 40 {
		t.Fatalf("after a refused scan the keys are %v", got)
	}
	// The limit bounds the scan.
	p = build()
	if _, ok := p.VictimWhere(func(k int) bool { return k == want[len(want)-1] }, 5); ok {
		t.Fatal("VictimWhere looked past its limit")
	}
}

// TestPolicyRefusedDrawKeepsTheGhost: a VictimWhere that accepts none of the keys it
// drew (a search for a duplicate, or for a key no holder keeps) leaves the ghost as it
// was. While it draws, the refused keys are out of the live count: trimming the ghost
// to that count forgot real ghosts for good.
func TestPolicyRefusedDrawKeepsTheGhost(t *testing.T) {
	p := NewPolicy[int]()
	for k := range 600 {
		p.Insert(k, 1)
	}
	for range 250 {
		p.Victim()
	}
	ghosts := p.ghost.n
	if ghosts < 200 {
		t.Fatalf("%d ghosts after 250 evictions", ghosts)
	}
	if _, ok := p.VictimWhere(func(int) bool { return false }, 256); ok {
		t.Fatal("a key was accepted")
	}
	if p.ghost.n != ghosts || p.Len() != 350 {
		t.Fatalf("after a refused draw: %d ghosts (were %d), %d live keys (were 350)", p.ghost.n, ghosts, p.Len())
	}
	checkPolicy(t, p)
}
