package daemon

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
)

// rwOwner is one owner of a read-your-writes stress test and its clients.
type rwOwner struct {
	id      string
	clients []*fluxkv.Client
}

// rwSetup is a stress test's length and seed (RW_STRESS_SECONDS, default 3; RW_STRESS_SEED,
// default the clock) and 3 owners of one master (RW_STRESS_LOCAL: local placement) with
// 3 clients each.
func rwSetup(t *testing.T) (time.Duration, uint64, []rwOwner) {
	dur := 3 * time.Second
	if s := os.Getenv("RW_STRESS_SECONDS"); s != "" {
		n, _ := strconv.Atoi(s)
		dur = time.Duration(n) * time.Second
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RW_STRESS_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d", seed)
	mo := master.Options{InsecureCluster: true}
	if os.Getenv("RW_STRESS_LOCAL") != "" {
		mo.Placement = master.PlacementLocal
	}
	n := startNode(t, 64<<20, nil, mo)
	owners := []rwOwner{{id: "n1", clients: []*fluxkv.Client{n.c}}}
	for _, id := range []string{"n2", "n3"} {
		_, c := n.addOwner(t, id, 64<<20, nil, func(o *Options) { o.LandingReserve = 4 << 20 })
		owners = append(owners, rwOwner{id: id, clients: []*fluxkv.Client{c}})
	}
	for i := range owners {
		sock := owners[i].clients[0].Options().Socket
		for j := range 2 {
			c2, err := fluxkv.Connect(fluxkv.Options{Socket: sock, Name: fmt.Sprintf("%s-%s-%d", t.Name(), owners[i].id, j)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c2.Close() })
			owners[i].clients = append(owners[i].clients, c2)
		}
	}
	return dur, seed, owners
}

// rwFailures stops a stress test's workers at the first failure and keeps the first 20.
type rwFailures struct {
	stop atomic.Bool
	mu   sync.Mutex
	list []string
}

// fail records a failure and stops the workers.
func (f *rwFailures) fail(format string, args ...any) {
	f.mu.Lock()
	if len(f.list) < 20 {
		f.list = append(f.list, fmt.Sprintf(format, args...))
	}
	f.mu.Unlock()
	f.stop.Store(true)
}

// rwWait lets the workers of wg run for dur (or until one sets stop), then stops them and
// waits for them.
func rwWait(dur time.Duration, stop *atomic.Bool, wg *sync.WaitGroup) {
	deadline := time.After(dur)
	for !stop.Load() {
		select {
		case <-deadline:
			stop.Store(true)
		case <-time.After(50 * time.Millisecond):
		}
	}
	wg.Wait()
}

// rwReleaseSome releases one of held, a time in three.
func rwReleaseSome(rng *rand.Rand, held []*fluxkv.MemHolder) []*fluxkv.MemHolder {
	if len(held) > 0 && rng.IntN(3) == 0 {
		j := rng.IntN(len(held))
		held[j].Release()
		held = append(held[:j], held[j+1:]...)
	}
	return held
}

// rwKey is one key's history: writes are serialized per key (one writer), numbered
// from 1; write 0 is the initial absent state.
type rwKey struct {
	name     string
	started  atomic.Int64 // highest write index begun
	returned atomic.Int64 // highest write index returned
	mu       sync.Mutex
	del      map[int64]bool // write index -> it was a delete
}

func (k *rwKey) isDel(v int64) bool {
	if v == 0 {
		return true
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.del[v]
}

// anyIn reports whether some write in [lo, hi] has del == wantDel.
func (k *rwKey) anyIn(lo, hi int64, wantDel bool) bool {
	for v := lo; v <= hi; v++ {
		if k.isDel(v) == wantDel {
			return true
		}
	}
	return false
}

func rwValue(key int, ver int64, n int) []byte {
	b := make([]byte, n)
	binary.LittleEndian.PutUint64(b, uint64(ver))
	binary.LittleEndian.PutUint64(b[8:], uint64(key))
	x := uint32(ver*2654435761) ^ uint32(key*40503)
	for i := 16; i < n; i++ {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// rwDecode returns the write index in b after checking its bytes.
func rwDecode(key int, b []byte) (int64, error) {
	if len(b) < 16 {
		return 0, fmt.Errorf("%d bytes: too short", len(b))
	}
	ver := int64(binary.LittleEndian.Uint64(b))
	if k := int(binary.LittleEndian.Uint64(b[8:])); k != key {
		return 0, fmt.Errorf("bytes of key %d, not %d", k, key)
	}
	want := rwValue(key, ver, len(b))
	for i := range b {
		if b[i] != want[i] {
			return 0, fmt.Errorf("WRONG BYTES at %d (version %d, %d bytes)", i, ver, len(b))
		}
	}
	return ver, nil
}

// TestReadYourWritesRandom: several owners, writers (one per key, rotating over
// owners) putting and deleting, readers getting, batch getting, checking existence and
// running pinned prefix lookups through every owner. Every answer is checked against
// the last write of the key that returned before the read began: never an older
// version, never a stale miss or a stale exists.
func TestReadYourWritesRandom(t *testing.T) {
	t.Parallel()
	dur, seed, owners := rwSetup(t)

	const nkeys = 6
	keys := make([]*rwKey, nkeys)
	names := make([]string, nkeys)
	for i := range keys {
		names[i] = fmt.Sprintf("rw-%d", i)
		keys[i] = &rwKey{name: names[i], del: map[int64]bool{}}
	}

	var fails rwFailures
	stop, fail := &fails.stop, fails.fail
	var stats struct{ puts, dels, gets, misses, exists, prefix, batch atomic.Int64 }

	// checkGot checks a value (ver, ok) or a miss (!ok) of key ki against [lo, hi].
	checkGot := func(what string, ki int, lo, hi int64, b []byte, ok bool) {
		k := keys[ki]
		if !ok {
			stats.misses.Add(1)
			if !k.anyIn(lo, hi, true) {
				fail("%s %s: a miss, but write %d (a put) had returned before it began and no delete began before it ended (last begun %d)", what, k.name, lo, hi)
			}
			return
		}
		ver, err := rwDecode(ki, b)
		if err != nil {
			fail("%s %s: %v", what, k.name, err)
			return
		}
		switch {
		case ver < lo:
			fail("%s %s: STALE: read write %d, but write %d (del %v) had returned before the read began", what, k.name, ver, lo, k.isDel(lo))
		case ver > hi:
			fail("%s %s: read write %d, not begun by the read's end (%d)", what, k.name, ver, hi)
		case k.isDel(ver):
			fail("%s %s: read write %d, a delete", what, k.name, ver)
		}
	}

	var wg sync.WaitGroup
	// Writers: one per key.
	for ki := range keys {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(ki)))
			k := keys[ki]
			for v := int64(1); !stop.Load(); v++ {
				oc := owners[rng.IntN(len(owners))]
				c := oc.clients[rng.IntN(len(oc.clients))]
				del := rng.IntN(5) == 0
				k.mu.Lock()
				k.del[v] = del
				k.mu.Unlock()
				k.started.Store(v)
				var err error
				if del {
					_, err = c.Delete(k.name)
					stats.dels.Add(1)
				} else {
					size := 1024 + rng.IntN(48<<10)
					err = c.Put(k.name, rwValue(ki, v, size))
					stats.puts.Add(1)
				}
				if err != nil {
					fail("write %d of %s (del %v) through %s: %v", v, k.name, del, oc.id, err)
					return
				}
				k.returned.Store(v)
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
			}
		})
	}
	// Readers: per owner per client.
	for oi, oc := range owners {
		for ci, c := range oc.clients {
			prefixClient := ci == 2
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seed, uint64(100+oi*10+ci)))
				var held []*fluxkv.MemHolder
				defer func() {
					for _, h := range held {
						h.Release()
					}
				}()
				for !stop.Load() {
					op := rng.IntN(10)
					switch {
					case prefixClient && op < 5:
						// A pinned prefix lookup over a random order of keys; found
						// keys must be present. (No gets on this session: a pinned
						// page is served to its own session as the lookup found it.)
						perm := rng.Perm(nkeys)[:1+rng.IntN(nkeys)]
						ks := make([]string, len(perm))
						los := make([]int64, len(perm))
						for j, ki := range perm {
							ks[j] = names[ki]
							los[j] = keys[ki].returned.Load()
						}
						found, err := c.BatchExistsPrefix(ks, time.Duration(rng.IntN(2))*50*time.Millisecond)
						if err != nil {
							fail("prefix through %s: %v", oc.id, err)
							return
						}
						stats.prefix.Add(1)
						for j := 0; j < found; j++ {
							k := keys[perm[j]]
							if hi := k.started.Load(); !k.anyIn(los[j], hi, false) {
								fail("prefix through %s: counted %s present, but delete %d had returned before the lookup began (last begun %d)", oc.id, k.name, los[j], hi)
							}
						}
					case prefixClient || op < 3:
						ki := rng.IntN(nkeys)
						k := keys[ki]
						lo := k.returned.Load()
						ok, err := c.Exists(k.name)
						if err != nil {
							fail("exists through %s: %v", oc.id, err)
							return
						}
						hi := k.started.Load()
						stats.exists.Add(1)
						if !k.anyIn(lo, hi, !ok) {
							fail("exists %s through %s: %v, but write %d (del %v) had returned before it began (last begun %d)", k.name, oc.id, ok, lo, k.isDel(lo), hi)
						}
					case op < 5:
						perm := rng.Perm(nkeys)[:1+rng.IntN(3)]
						ks := make([]string, len(perm))
						los := make([]int64, len(perm))
						for j, ki := range perm {
							ks[j] = names[ki]
							los[j] = keys[ki].returned.Load()
						}
						hs, errs, err := c.BatchGet(ks)
						if err != nil {
							fail("batch get through %s: %v", oc.id, err)
							return
						}
						stats.batch.Add(1)
						for j, ki := range perm {
							hi := keys[ki].started.Load()
							switch {
							case errs[j] == nil && hs[j] != nil:
								checkGot("batch get through "+oc.id, ki, los[j], hi, hs[j].Bytes(), true)
								hs[j].Release()
							case errors.Is(errs[j], fluxkv.ErrKeyNotFound) || (errs[j] == nil && hs[j] == nil):
								checkGot("batch get through "+oc.id, ki, los[j], hi, nil, false)
							default:
								fail("batch get %s through %s: %v", ks[j], oc.id, errs[j])
							}
						}
					default:
						ki := rng.IntN(nkeys)
						k := keys[ki]
						lo := k.returned.Load()
						h, err := c.Get(k.name)
						hi := k.started.Load()
						stats.gets.Add(1)
						switch {
						case err == nil:
							checkGot("get through "+oc.id, ki, lo, hi, h.Bytes(), true)
							if rng.IntN(4) == 0 && len(held) < 4 {
								held = append(held, h) // keep a holder a while
							} else {
								h.Release()
							}
						case errors.Is(err, fluxkv.ErrKeyNotFound):
							checkGot("get through "+oc.id, ki, lo, hi, nil, false)
						default:
							fail("get %s through %s: %v", k.name, oc.id, err)
							return
						}
					}
					held = rwReleaseSome(rng, held)
				}
			})
		}
	}
	rwWait(dur, stop, &wg)
	t.Logf("puts %d deletes %d gets %d (misses %d) batch gets %d exists %d prefix lookups %d",
		stats.puts.Load(), stats.dels.Load(), stats.gets.Load(), stats.misses.Load(), stats.batch.Load(), stats.exists.Load(), stats.prefix.Load())
	for _, f := range fails.list {
		t.Error(f)
	}
}

// rwWrite is one write of a key in a history: its index (in the value), whether it
// deletes, and when it began and returned on the logical clock.
type rwWrite struct {
	del        bool
	start, end int64
	putID      int64
	via        string
}

// rwHist is one key's writes, by index (0: the initial absent state).
type rwHist struct {
	mu     sync.Mutex
	writes map[int64]*rwWrite
	next   int64
}

func (h *rwHist) begin(del bool, now int64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	h.writes[h.next] = &rwWrite{del: del, start: now, end: math.MaxInt64}
	return h.next
}

func (h *rwHist) done(v, now int64) {
	h.mu.Lock()
	h.writes[v].end = now
	h.mu.Unlock()
}

// staleValue reports a write w that returned before the read began (start) and began
// after write v returned: v was dead when the read began.
func (h *rwHist) staleValue(v, start int64) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	wv := h.writes[v]
	for i, w := range h.writes {
		if w.end < start && wv.end < w.start {
			return i, true
		}
	}
	return 0, false
}

// staleState reports, for a read (start, end) that saw the key absent (present false)
// or present, a write of the other kind that returned before the read began and that
// no write of the seen kind can follow (none began before the read ended and returned
// after it began).
func (h *rwHist) staleState(present bool, start, end int64) (int64, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, w := range h.writes {
		if w.del == !present || w.end >= start {
			continue
		}
		// w (a put if the read saw absent, a delete if it saw present) returned first.
		ok := false
		for _, x := range h.writes {
			if x.del == !present && x.start < end && x.end > w.start {
				ok = true
				break
			}
		}
		if !ok {
			return i, true
		}
	}
	return 0, false
}

// TestReadYourWritesConcurrentWriters is TestReadYourWritesRandom with two writers per
// key (their puts and deletes overlap): every read is checked against the real-time
// order of the writes, on a logical clock.
func TestReadYourWritesConcurrentWriters(t *testing.T) {
	t.Parallel()
	dur, seed, owners := rwSetup(t)
	const nkeys = 4
	names := make([]string, nkeys)
	hists := make([]*rwHist, nkeys)
	for i := range names {
		names[i] = fmt.Sprintf("cw-%d", i)
		hists[i] = &rwHist{writes: map[int64]*rwWrite{0: {del: true, start: -2, end: -1}}}
	}
	var clock atomic.Int64
	var fails rwFailures
	stop, fail := &fails.stop, fails.fail
	type obs struct {
		what       string
		key        int
		start, end int64
		kind       int // 0 value, 1 absent (miss / exists false), 2 present (exists true)
		ver        int64
		putID      int64
		src        string
	}
	var obsMu sync.Mutex
	var all []obs
	record := func(o obs) {
		obsMu.Lock()
		all = append(all, o)
		obsMu.Unlock()
	}
	var wg sync.WaitGroup
	for ki := range nkeys {
		for w := range 2 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seed, uint64(ki*2+w)))
				for !stop.Load() {
					oc := owners[rng.IntN(len(owners))]
					c := oc.clients[rng.IntN(len(oc.clients))]
					del := rng.IntN(4) == 0
					v := hists[ki].begin(del, clock.Add(1))
					var err error
					if del {
						_, err = c.Delete(names[ki])
					} else {
						val := rwValue(ki, v, 1024+rng.IntN(32<<10))
						var pid int64
						pid, err = c.PutWithID(names[ki], int64(len(val)), fluxkv.PutOptions{}, func(_ int64, dst []byte) error { copy(dst, val); return nil })
						hists[ki].mu.Lock()
						hists[ki].writes[v].putID = pid
						hists[ki].mu.Unlock()
					}
					hists[ki].mu.Lock()
					hists[ki].writes[v].via = oc.id
					hists[ki].mu.Unlock()
					if err != nil {
						fail("write %d of %s through %s: %v", v, names[ki], oc.id, err)
						return
					}
					hists[ki].done(v, clock.Add(1))
					time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
				}
			})
		}
	}
	for oi, oc := range owners {
		for ci, c := range oc.clients {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seed, uint64(100+oi*10+ci)))
				var held []*fluxkv.MemHolder
				defer func() {
					for _, h := range held {
						h.Release()
					}
				}()
				for !stop.Load() {
					op := rng.IntN(10)
					what := fmt.Sprintf("op %d through %s/%d", op, oc.id, ci)
					switch {
					case op < 2:
						ki := rng.IntN(nkeys)
						start := clock.Add(1)
						ok, err := c.Exists(names[ki])
						end := clock.Add(1)
						if err != nil {
							fail("%s: %v", what, err)
							return
						}
						record(obs{what: "exists " + what, key: ki, start: start, end: end, kind: map[bool]int{false: 1, true: 2}[ok]})
					case op < 3:
						perm := rng.Perm(nkeys)[:1+rng.IntN(nkeys)]
						ks := make([]string, len(perm))
						for j, ki := range perm {
							ks[j] = names[ki]
						}
						start := clock.Add(1)
						found, err := c.BatchExistsPrefix(ks, 0)
						end := clock.Add(1)
						if err != nil {
							fail("%s: %v", what, err)
							return
						}
						for j := 0; j < found; j++ {
							record(obs{what: "prefix " + what, key: perm[j], start: start, end: end, kind: 2})
						}
					case op < 5:
						perm := rng.Perm(nkeys)[:1+rng.IntN(3)]
						ks := make([]string, len(perm))
						for j, ki := range perm {
							ks[j] = names[ki]
						}
						start := clock.Add(1)
						hs, errs, err := c.BatchGet(ks)
						end := clock.Add(1)
						if err != nil {
							fail("%s: %v", what, err)
							return
						}
						for j, ki := range perm {
							switch {
							case errs[j] == nil && hs[j] != nil:
								ver, err := rwDecode(ki, hs[j].Bytes())
								if err != nil {
									fail("%s %s: %v", what, ks[j], err)
								}
								record(obs{what: "batch get " + what, key: ki, start: start, end: end, ver: ver, putID: hs[j].PutID(), src: fmt.Sprintf("%s remote %v", hs[j].Source(), hs[j].Remote())})
								hs[j].Release()
							case errs[j] == nil || errors.Is(errs[j], fluxkv.ErrKeyNotFound):
								record(obs{what: "batch get " + what, key: ki, start: start, end: end, kind: 1})
							default:
								fail("%s %s: %v", what, ks[j], errs[j])
							}
						}
					default:
						ki := rng.IntN(nkeys)
						start := clock.Add(1)
						h, err := c.Get(names[ki])
						end := clock.Add(1)
						switch {
						case err == nil:
							ver, derr := rwDecode(ki, h.Bytes())
							if derr != nil {
								fail("%s %s: %v", what, names[ki], derr)
							}
							record(obs{what: "get " + what, key: ki, start: start, end: end, ver: ver, putID: h.PutID(), src: fmt.Sprintf("%s remote %v", h.Source(), h.Remote())})
							if rng.IntN(4) == 0 && len(held) < 4 {
								held = append(held, h)
							} else {
								h.Release()
							}
						case errors.Is(err, fluxkv.ErrKeyNotFound):
							record(obs{what: "get " + what, key: ki, start: start, end: end, kind: 1})
						default:
							fail("%s: %v", what, err)
							return
						}
					}
					held = rwReleaseSome(rng, held)
				}
			})
		}
	}
	rwWait(dur, stop, &wg)
	bad := 0
	for _, o := range all {
		h := hists[o.key]
		switch o.kind {
		case 0:
			h.mu.Lock()
			wv := h.writes[o.ver]
			h.mu.Unlock()
			switch {
			case wv == nil || wv.del:
				fail("%s %s: read write %d, no put", o.what, names[o.key], o.ver)
			case wv.start > o.end:
				fail("%s %s: read write %d, begun after the read", o.what, names[o.key], o.ver)
			default:
				if w, stale := h.staleValue(o.ver, o.start); stale {
					fail("%s %s: STALE: read write %d %+v (put id %d, %s) in [%d,%d], but write %d %+v began after it returned and returned before the read",
						o.what, names[o.key], o.ver, *wv, o.putID, o.src, o.start, o.end, w, *h.writes[w])
					for i := int64(1); i < h.next && i < o.ver+6; i++ {
						if i > o.ver-4 {
							t.Logf("  %s write %d: %+v", names[o.key], i, *h.writes[i])
						}
					}
				}
			}
		default:
			if w, stale := h.staleState(o.kind == 2, o.start, o.end); stale {
				fail("%s %s: STALE: saw present=%v in [%d,%d], but write %d %+v returned before and nothing after it could undo it",
					o.what, names[o.key], o.kind == 2, o.start, o.end, w, *h.writes[w])
			}
		}
		bad++
	}
	t.Logf("%d observations", len(all))
	for _, f := range fails.list {
		t.Error(f)
	}
}
