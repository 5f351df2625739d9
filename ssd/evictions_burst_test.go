package ssd

import (
	"fmt"
	"testing"
	"time"
)

// TestLargePersistReportsEveryEviction: one persist that overwrites more records than
// the eviction queue holds entries (a 24 MiB value over ~24,000 records of 1 KiB, written
// in runs) reports every one of them while the consumer keeps up: an allocation's reports
// take one place in the queue (a review: 16,001 were dropped, the master kept routing
// to the gone records and, with --ssd-admit evict, took their memory copies for clean).
func TestLargePersistReportsEveryEviction(t *testing.T) {
	checkLeaks(t)
	s := openTest(t, EngineAuto, 32<<20, nil)
	const small = 30000
	items := make([]PersistItem, 0, 256)
	for i := 0; i < small; i += len(items) {
		items = items[:0]
		for j := i; j < min(i+256, small); j++ {
			items = append(items, PersistItem{Key: fmt.Sprint("s", j), PutID: 1, Src: []byte{byte(j)}})
		}
		pins, errs := s.PersistMany(items)
		for k, err := range errs {
			if err != nil {
				t.Fatalf("persist %s: %v", items[k].Key, err)
			}
			pins[k].Release()
		}
	}
	before := s.Stats().DroppedEvictions
	done := make(chan error, 1)
	go func() {
		pin, err := s.Persist("big", 1, pattern("big", 24<<20))
		if err == nil {
			pin.Release()
		}
		done <- err
	}()
	n := 0
	for idle := time.After(5 * time.Second); ; {
		select {
		case b := <-s.Evictions():
			n += len(b)
			idle = time.After(time.Second)
			continue
		case <-idle:
		}
		break
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := s.Stats().DroppedEvictions - before; d != 0 {
		t.Fatalf("%d eviction reports dropped (%d delivered) while the consumer kept up", d, n)
	}
	if n < 20000 {
		t.Fatalf("%d evictions delivered for a 24 MiB value over %d records of a 32 MiB ring", n, small)
	}
}
