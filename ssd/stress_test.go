package ssd

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func stressValue(key string, putID int64, maxN int64) []byte {
	h := uint64(putID)*0x9e3779b97f4a7c15 ^ uint64(len(key))*1315423911
	for i := 0; i < len(key); i++ {
		h = h*31 + uint64(key[i])
	}
	n := int64(h%uint64(maxN)) + 1
	return pattern(fmt.Sprintf("%s/%d", key, putID), n)
}

// TestStressPackedRuns: concurrent PersistMany, Persist, Forget and loads on small
// rings of packed runs (block sizes 512, 4096, 8192, both engines): every load that
// succeeds returns exactly the bytes put, none is ever corrupt, and at rest nothing is
// pinned or mid-write, no indexed entry was overtaken, used bytes are the index's, and
// every indexed entry reads back exactly.
func TestStressPackedRuns(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		for _, align := range []int64{512, 4096, 8192} {
			t.Run(fmt.Sprint("align", align), func(t *testing.T) {
				stress(t, kind, align)
			})
		}
	})
}

func stress(t *testing.T, kind string, align int64) { stressWith(t, kind, align, nil, nil) }

// stressWith runs 3 writers (300 calls each of 1 to 8 items, as PersistMany or
// Persist, their commit pins released up to 300 µs later), 3 readers of each key's
// latest committed version (aligned and unaligned buffers) and a forgetter on a ring
// of 3 small shards; open, when set, opens the shard files; quiesce, when set, runs
// once they stopped, before the checks at rest.

func stressWith(t *testing.T, kind string, align int64, open func(path string, flag int, perm os.FileMode) (File, error), quiesce func()) {
	s := openTest(t, kind, 192<<10, func(o *Options) {
		o.OpenFile = open
		o.ShardsPerDevice = 3
		o.minShardSize = 32 << 10
		o.blockAlign = align
		o.BusyWait = 200 * time.Millisecond // calls blocked by each other's pins fail (ErrBusy) rather than wait long
		o.EvictionDelay = time.Millisecond
		o.ChunkSize = 4096
		o.ChunkInflight = 3
	})
	go func() {
		for range s.Evictions() {
		}
	}()
	const nkeys = 24
	const maxN = 9000
	var putSeq atomic.Int64
	var mu sync.Mutex
	latest := map[string]int64{}
	var wg, releases sync.WaitGroup
	stop := make(chan struct{})
	var corrupt, wrong atomic.Int64
	for g := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := 0; i < 300; i++ {
				k := 1 + rng.IntN(8)
				items := make([]PersistItem, k)
				for j := range items {
					key := fmt.Sprintf("k%02d", rng.IntN(nkeys))
					p := putSeq.Add(1)
					items[j] = PersistItem{Key: key, PutID: p, Src: stressValue(key, p, maxN)}
				}
				var pins []CommitPin
				var errs []error
				if k == 1 && rng.IntN(2) == 0 {
					pin, err := s.Persist(items[0].Key, items[0].PutID, items[0].Src)
					pins, errs = []CommitPin{pin}, []error{err}
				} else {
					pins, errs = s.PersistMany(items)
				}
				for j, err := range errs {
					if err == nil {
						mu.Lock()
						if latest[items[j].Key] < items[j].PutID {
							latest[items[j].Key] = items[j].PutID
						}
						mu.Unlock()
					}
				}
				hold := time.Duration(rng.IntN(300)) * time.Microsecond
				releases.Go(func() {
					time.Sleep(hold)
					for _, p := range pins {
						p.Release()
					}
				})
			}
		})
	}
	var readers sync.WaitGroup
	for g := range 3 {
		readers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 99))
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("k%02d", rng.IntN(nkeys))
				mu.Lock()
				p := latest[key]
				mu.Unlock()
				if p == 0 {
					continue
				}
				want := stressValue(key, p, maxN)
				var buf []byte
				if rng.IntN(2) == 0 {
					buf = AllocAligned(int64(len(want)))
				} else {
					buf = make([]byte, len(want)+1)[1:]
				}
				err := s.LoadInto(key, p, buf, int64(len(want)))
				switch {
				case err == nil:
					if !bytes.Equal(buf[:len(want)], want) {
						wrong.Add(1)
						t.Errorf("%s put %d: wrong bytes", key, p)
					}
				case errors.Is(err, ErrCorrupt):
					corrupt.Add(1)
					t.Errorf("%s put %d: %v", key, p, err)
				}
			}
		})
	}
	readers.Go(func() {
		rng := rand.New(rand.NewPCG(5, 5))
		for {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Sprintf("k%02d", rng.IntN(nkeys))
			if rng.IntN(50) == 0 {
				s.Forget(key, 0)
			}
			time.Sleep(50 * time.Microsecond)
		}
	})
	wg.Wait()
	close(stop)
	readers.Wait()
	if quiesce != nil {
		quiesce()
	}
	releases.Wait()
	// Accounting: used equals the committed indexed entries' sizes; every
	// committed indexed entry is readable and right.
	s.mu.Lock()
	var used int64
	var want []Entry
	for k, e := range s.index {
		if e.state == stateCommitted {
			used += e.size
			want = append(want, Entry{k, e.putID, e.length, e.seq})
		} else {
			t.Errorf("%s: index holds a %s entry at rest", k, e.state)
		}
		if e.shard.ring.overtaken(e) {
			t.Errorf("%s: indexed entry overtaken", k)
		}
	}
	var devUsed int64
	for _, d := range s.devices {
		devUsed += d.used
		for _, sh := range d.shards {
			for _, e := range sh.ring.live() {
				if e.readPins != 0 || e.commitPins != 0 {
					t.Errorf("entry %q put %d: pins %d/%d left", e.key, e.putID, e.readPins, e.commitPins)
				}
			}
		}
	}
	s.mu.Unlock()
	if used != devUsed {
		t.Errorf("used %d, index sums %d", devUsed, used)
	}
	for _, e := range want {
		v := stressValue(e.Key, e.PutID, maxN)
		if int64(len(v)) != e.Length {
			t.Errorf("%s put %d: length %d want %d", e.Key, e.PutID, e.Length, len(v))
			continue
		}
		got := AllocAligned(e.Length)
		if err := s.LoadInto(e.Key, e.PutID, got, e.Length); err != nil || !bytes.Equal(got, v) {
			t.Errorf("%s put %d at rest: %v", e.Key, e.PutID, err)
		}
	}
	t.Logf("%d entries at rest, %d corrupt, %d wrong", len(want), corrupt.Load(), wrong.Load())
}

// TestStressFaults is TestStressPackedRuns with write and read failures and short IOs
// injected now and then: a failed or short write never leaves a readable entry with
// other bytes, a failed read is never taken for corruption, and nothing stays busy.
func TestStressFaults(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		for _, align := range []int64{512, 4096} {
			t.Run(fmt.Sprint("align", align), func(t *testing.T) {
				var f Faults
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					rng := rand.New(rand.NewPCG(3, 3))
					for {
						select {
						case <-stop:
							return
						case <-time.After(time.Duration(rng.IntN(3000)) * time.Microsecond):
						}
						switch rng.IntN(4) {
						case 0:
							f.Fail(OpWrite, errors.New("EIO"), 1)
						case 1:
							f.Short(OpWrite, 1)
						case 2:
							f.Short(OpRead, 1)
						case 3:
							f.Fail(OpRead, errors.New("EIO"), 1)
						}
					}
				}()
				stressWith(t, kind, align, f.OpenFile, func() {
					close(stop)
					<-done
					f.Clear()
				})
			})
		}
	})
}
