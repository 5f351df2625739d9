package daemon

import (
	"sync"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// TestAbortedPutStaysRegisteredWhileItsCopyRuns: a put aborted (PutAbort, or its
// client's session ending) while a PutWrite still copies into its range keeps the range
// registered (segmentWrites) until the copy ends, so a registration meanwhile pins it:
// unregistered at once, a new master could hand the range to another value while the
// old copy still wrote it (a review).
func TestAbortedPutStaysRegisteredWhileItsCopyRuns(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"PutAbort", "session end"} {
		t.Run(end, func(t *testing.T) {
			const size = 2 << 20
			inChunk, release := make(chan struct{}), make(chan struct{})
			var once, rel sync.Once
			n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true}, func(o *Options) {
				o.ClientIsolation, o.PutArea = true, size
				o.testCopyChunk = func(key string, chunk int) {
					if key == "k" && chunk == 0 {
						once.Do(func() { close(inChunk) })
						<-release
					}
				}
			})
			unstall := func() { rel.Do(func() { close(release) }) }
			t.Cleanup(unstall)
			c, id := startSessionPut(t, n, "k", size)
			wrote := make(chan error, 1)
			go func() { wrote <- n.o.putWrite(c, "k", id, []*external.AreaCopy{{Len: size}}) }()
			<-inChunk
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				if end == "PutAbort" {
					n.o.putAbort(c, "k", id)
				} else {
					n.o.endSession(c, t.Name())
				}
			}()
			time.Sleep(100 * time.Millisecond) // the abort waits for the copy
			st := n.o.lock()
			registered := st.writes.lookup(writePut, id) != nil
			n.o.unlock()
			unstall()
			<-wrote
			<-ended
			if !registered {
				t.Errorf("a copy into put %d still ran after its %s, and its range was no longer registered", id, end)
			}
			st = n.o.lock()
			left := st.writes.lookup(writePut, id) != nil
			n.o.unlock()
			if left {
				t.Errorf("put %d's range still registered after its %s and its copy ended", id, end)
			}
		})
	}
}
