package daemon_test

import (
	"fmt"
	"sort"
	"testing"
	"time"
)

// BenchmarkGetMemoryHit measures memory-hit gets of 1 MiB values through the socket
// from the Go client (get + release, the release riding on the next call): over a
// working set of 64 keys and on one hot key (both served from the owner's cached
// holdings: a released key stays cached for the 20 ms grace), and over 64 keys with
// the grace off (every get crosses to the master). It reports ops/s and p50/p99.
//
//	go test ./daemon -run '^$' -bench GetMemoryHit -benchtime 3s
func BenchmarkGetMemoryHit(b *testing.B) {
	for _, tc := range []struct {
		name  string
		keys  int
		extra []string
	}{{"keys=64", 64, nil}, {"hot-key", 1, nil}, {"keys=64,grace=off", 64, []string{"--cache-grace", "0"}}} {
		b.Run(tc.name, func(b *testing.B) {
			p := startUp(b, "256MiB", tc.extra...)
			c := connect(b, p.socket)
			v := payload(1, 1<<20)
			for i := 0; i < tc.keys; i++ {
				if err := c.Put(fmt.Sprintf("k%d", i), v); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			b.SetBytes(1 << 20)
			b.ResetTimer()
			t0 := time.Now()
			for i := 0; i < b.N; i++ {
				s := time.Now()
				h, err := c.Get(fmt.Sprintf("k%d", i%tc.keys))
				if err != nil {
					b.Fatal(err)
				}
				_ = h.Bytes()[0]
				h.Release()
				lat = append(lat, time.Since(s))
			}
			el := time.Since(t0)
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(b.N)/el.Seconds(), "ops/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkFillShareAtFirstEviction fills a node with 1 MiB − 128 B values and reports
// the share of the segment in use when the first eviction happens (goal ≥ 95%).
func BenchmarkFillShareAtFirstEviction(b *testing.B) {
	for i := 0; i < b.N; i++ {
		p := startUp(b, "128MiB")
		c := connect(b, p.socket)
		v := payload(2, 1<<20-128)
		prevReplicas, prevUsed := int64(0), int64(0)
		share := -1.0
		for k := 0; share < 0 && k < 1000; k++ {
			if err := c.Put(fmt.Sprintf("f%d", k), v); err != nil {
				b.Fatal(err)
			}
			st, err := c.Stat()
			if err != nil {
				b.Fatal(err)
			}
			m := st.Members[0]
			if m.MemoryReplicas <= prevReplicas {
				share = float64(prevUsed) / float64(m.MemorySegment.CapacityBytes)
			}
			prevReplicas, prevUsed = m.MemoryReplicas, m.MemorySegment.UsedBytes
		}
		b.ReportMetric(share*100, "%used-at-first-eviction")
		p.stop()
	}
}
