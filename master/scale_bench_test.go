package master

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// The master's calls that hold its lock should not grow with the routes of other owners
// (a million routes is 64 GiB of 64 KiB pages). Compare each benchmark's ns/op across
// its sub-benchmarks' route counts: flat.
//
//	go test ./master/ -run '^$' -bench AmongRoutes -benchtime 200x
var routeCounts = []int{10_000, 100_000, 400_000}

// scaleState is a state with owner "big" holding routes keys of AllocGranule bytes
// (local placement) and put, a put through PutStart and PutDone.
func scaleState(b *testing.B, routes int) (st *State, now time.Time, put func(NodeRef, string)) {
	st = NewState(Options{IDBase: 1, NodeTTL: time.Hour, Placement: PlacementLocal})
	now = time.Unix(1, 0)
	big := NodeRef{ID: "big", Generation: 1}
	if err := st.Register(now, big, int64(routes+1)*AllocGranule, 0, 0, "d-big:1", "p-big:1", SSDInfo{}, nil); err != nil {
		b.Fatal(err)
	}
	put = func(ref NodeRef, key string) {
		p, err := st.PutStart(now, ref, key, AllocGranule, false, nil)
		if err == nil {
			_, err = st.PutDone(now, ref, key, p.PutID)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	for i := range routes {
		put(big, fmt.Sprintf("big/%d", i))
	}
	return st, now, put
}

// BenchmarkTombAmongRoutes: a re-registration of an owner holding 8 keys while owner
// "big" holds many: the tomb of the old incarnation walks its own keys.
func BenchmarkTombAmongRoutes(b *testing.B) {
	for _, routes := range routeCounts {
		b.Run(fmt.Sprintf("routes=%d", routes), func(b *testing.B) {
			st, now, put := scaleState(b, routes)
			small := NodeRef{ID: "small", Generation: 1}
			register := func() {
				if err := st.Register(now, small, 64*AllocGranule, 0, 0, "d-small:1", "p-small:1", SSDInfo{}, nil); err != nil {
					b.Fatal(err)
				}
			}
			register()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for k := range 8 {
					put(small, fmt.Sprintf("small/%d", k))
				}
				small.Generation++
				register()
			}
			b.StopTimer()
			if got := len(st.routes); got != routes {
				b.Fatalf("%d routes after the re-registrations, want %d", got, routes)
			}
		})
	}
}

// BenchmarkStatAmongRoutes: what a Stat (each owner's metrics scrape, each client
// stat) reads under the lock: the members and the pool's values.
func BenchmarkStatAmongRoutes(b *testing.B) {
	for _, routes := range routeCounts {
		b.Run(fmt.Sprintf("routes=%d", routes), func(b *testing.B) {
			st, _, _ := scaleState(b, routes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if len(st.Members()) != 1 {
					b.Fatal("members")
				}
				if v, _ := st.MemoryValues(); v != int64(routes) {
					b.Fatalf("%d values, want %d", v, routes)
				}
			}
		})
	}
}

// BenchmarkMixedPutAmongRoutes: puts of plain values of 1 to 16 granules into owner
// "big"'s full pool of about routes values of such sizes, as a cache of mixed values in
// steady state evicts: each put evicts until a free range holds it.
func BenchmarkMixedPutAmongRoutes(b *testing.B) {
	for _, routes := range routeCounts {
		b.Run(fmt.Sprintf("routes=%d", routes), func(b *testing.B) {
			st := NewState(Options{IDBase: 1, NodeTTL: time.Hour, Placement: PlacementLocal})
			now := time.Unix(1, 0)
			big := NodeRef{ID: "big", Generation: 1}
			if err := st.Register(now, big, int64(routes)*17/2*AllocGranule, 0, 0, "d-big:1", "p-big:1", SSDInfo{}, nil); err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			seq := 0
			put := func() {
				key := fmt.Sprintf("v/%d", seq)
				seq++
				p, err := st.PutStart(now, big, key, (1+rng.Int64N(16))*AllocGranule, false, nil)
				if err == nil {
					_, err = st.PutDone(now, big, key, p.PutID)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			for range 2 * routes {
				put()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				put()
			}
		})
	}
}

// BenchmarkTakeBack: one PutStart whose source takes back a transfer area the pool
// borrowed in full for values of 512 bytes (placed on another owner, which has room). The
// take-back ranks the borrowed replicas once: ns/op should double with the area, not
// grow four times (each victim a walk of every borrowed replica took 7 s at 4 MiB).
//
//	go test ./master/ -run '^$' -bench TakeBack -benchtime 5x
func BenchmarkTakeBack(b *testing.B) {
	for _, area := range []int64{1 << 20, 2 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("area=%dKiB", area>>10), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				now := time.Unix(1000, 0)
				st := NewState(Options{IDBase: 100, NodeTTL: time.Hour, HeartbeatInterval: time.Hour, Placement: PlacementPool})
				n, m := NodeRef{ID: "n", Generation: 1}, NodeRef{ID: "m", Generation: 1}
				if err := st.Register(now, n, 3*area, area, 0, "dn", "pn", SSDInfo{}, nil); err != nil {
					b.Fatal(err)
				}
				for i := range 3 * area / 512 {
					plan, err := st.PutStart(now, n, fmt.Sprintf("k%d", i), 512, false, nil)
					if err == nil {
						_, err = st.PutDone(now, n, fmt.Sprintf("k%d", i), plan.PutID)
					}
					if err != nil {
						b.Fatalf("put %d: %v", i, err)
					}
				}
				if err := st.Register(now, m, 64<<20, 0, 0, "dm", "pm", SSDInfo{}, nil); err != nil {
					b.Fatal(err)
				}
				lent := st.nodes["n"].lent
				b.StartTimer()
				if plan, err := st.PutStart(now, n, "big", area, false, nil); err != nil || plan.TargetNode != "m" {
					b.Fatalf("the put taking the area back: %+v, %v", plan, err)
				}
				if lent == 0 || st.nodes["n"].lent != 0 {
					b.Fatalf("%d replicas borrowed the area before, %d after: want all taken back", lent, st.nodes["n"].lent)
				}
			}
		})
	}
}
