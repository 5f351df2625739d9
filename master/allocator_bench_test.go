package master

import (
	"math/rand/v2"
	"testing"
)

// fragmented is a large segment in the state the offset index is for: 64 GiB filled
// with values of log-uniform sizes from 4 KiB to 512 KiB (multiples of 4 KiB), then a
// random fifth of them freed, which leaves about 100k free ranges, many more than fit
// in the CPU caches with their index.
func fragmented(b *testing.B, rng *rand.Rand) (*Allocator, []Range) {
	b.Helper()
	const capacity = 64 * gib
	a := NewAllocator(capacity)
	var live []Range
	for {
		r, ok := a.Alloc(fragmentedSize(rng))
		if !ok {
			break
		}
		live = append(live, r)
	}
	rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	n := len(live) / 5
	for _, r := range live[:n] {
		a.Free(r)
	}
	return a, live[n:]
}

func fragmentedSize(rng *rand.Rand) int64 {
	return logUniform(rng, 4*kib, 512*kib) / (4 * kib) * (4 * kib)
}

// BenchmarkAllocatorFragmented measures the offset index's work on a fragmented 64 GiB
// segment with about 100k free ranges:
//
//   - free-alloc: Free a random live value (coalescing with whichever neighbours are
//     free) and Alloc a new one of a random size; the steady state of an owner's cache.
//   - free-reserve: Free a random live value and Reserve it again, so the state stays
//     exactly the same: each op is one Free and one Reserve at a random offset, both
//     searching the index and most of them changing it.
//   - restore: Reserve every live value of the fragmented segment, in random order,
//     into an empty one, as a restarted master does; reported per Reserve.
func BenchmarkAllocatorFragmented(b *testing.B) {
	b.Run("free-alloc", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 2))
		a, live := fragmented(b, rng)
		sizes := make([]int64, 1<<16)
		for i := range sizes {
			sizes[i] = fragmentedSize(rng)
		}
		victims := make([]int, 1<<16)
		for i := range victims {
			victims[i] = rng.IntN(len(live))
		}
		for i := 0; b.Loop(); i++ {
			j := victims[i&(len(victims)-1)] % len(live)
			a.Free(live[j])
			n := sizes[i&(len(sizes)-1)]
			r, ok := a.Alloc(n)
			for !ok { // rare: make room
				live[j] = live[len(live)-1]
				live = live[:len(live)-1]
				j = len(live) - 1
				a.Free(live[j])
				r, ok = a.Alloc(n)
			}
			live[j] = r
		}
		b.StopTimer()
		b.ReportMetric(float64(a.FreeRanges()), "free-ranges")
		if err := a.CheckInvariants(); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("free-reserve", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(3, 4))
		a, live := fragmented(b, rng)
		victims := make([]int32, 1<<20)
		for i := range victims {
			victims[i] = int32(rng.IntN(len(live)))
		}
		for i := 0; b.Loop(); i++ {
			r := live[victims[i&(len(victims)-1)]]
			a.Free(r)
			if !a.Reserve(r) {
				b.Fatalf("Reserve(%+v) of what was just freed failed", r)
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(a.FreeRanges()), "free-ranges")
		if err := a.CheckInvariants(); err != nil {
			b.Fatal(err)
		}
	})
	b.Run("restore", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(5, 6))
		src, live := fragmented(b, rng)
		rng.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
		var a *Allocator
		for b.Loop() {
			a = NewAllocator(src.Capacity())
			for _, r := range live {
				if !a.Reserve(r) {
					b.Fatalf("Reserve(%+v) failed", r)
				}
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(live)), "ns/reserve")
		b.ReportMetric(float64(a.FreeRanges()), "free-ranges")
		if err := a.CheckInvariants(); err != nil {
			b.Fatal(err)
		}
	})
}
