package master

import (
	"fmt"
	"testing"
	"time"
)

// What a re-registration costs the master (its lock held) when the owner that comes
// back holds a few keys and another owner holds many: the tomb of the old incarnation
// walks its own keys, not every route. Reported per re-registration; compare the
// sub-benchmarks' ns/op (flat across the route counts).
//
//	go test ./master/ -run '^$' -bench TombAmongRoutes -benchtime 200x
func BenchmarkTombAmongRoutes(b *testing.B) {
	for _, routes := range []int{10_000, 100_000, 400_000} {
		b.Run(fmt.Sprintf("routes=%d", routes), func(b *testing.B) {
			st := NewState(Options{IDBase: 1, NodeTTL: time.Hour, Placement: PlacementLocal})
			now := time.Unix(1, 0)
			big := NodeRef{ID: "big", Generation: 1}
			if err := st.Register(now, big, int64(routes+1)*AllocGranule, 0, 0, "d-big:1", "p-big:1", SSDInfo{}, nil); err != nil {
				b.Fatal(err)
			}
			put := func(ref NodeRef, key string) {
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
