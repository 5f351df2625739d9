package transfer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// TestPullStress: concurrent PullMany and Pull with random cancellations and fenced
// items; a successful item holds its bytes, and nothing writes a destination after its
// call returned; gates drain.
func TestPullStress(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 8*mib, true))
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	cl := newClient(t, ClientOptions{Secrets: sec, MaxPullsPerPeer: 3})
	addr := srv.Addr().String()
	for id := int64(1); id <= 64; id++ {
		src.retain(id, (id-1)*100_000, 100_000)
	}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 30 {
				n := 1 + r.IntN(40)
				items := make([]PullItem, n)
				for i := range items {
					id := int64(1 + r.IntN(64))
					f := Fence{SourceNode: src.node, SourceGeneration: src.gen, TransferID: id}
					if r.IntN(10) == 0 {
						f.TransferID = 999
					}
					sz := 1 + r.IntN(100_000)
					items[i] = PullItem{Fence: f, Offset: (id - 1) * 100_000, Dst: make([]byte, sz)}
				}
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(3) == 0 {
					d := time.Duration(r.IntN(2000)) * time.Microsecond
					time.AfterFunc(d, cancel)
				}
				var errs []error
				if r.IntN(4) == 0 {
					errs = []error{cl.Pull(ctx, addr, items[0].Fence, items[0].Offset, items[0].Dst)}
					items = items[:1]
				} else {
					errs = cl.PullMany(ctx, addr, items)
				}
				cancel()
				for i, err := range errs {
					it := items[i]
					if err == nil && !bytes.Equal(it.Dst, src.seg[it.Offset:it.Offset+int64(len(it.Dst))]) {
						t.Errorf("item %d: wrong bytes", i)
					}
					for k := range it.Dst {
						it.Dst[k] = 0xAB
					}
				}
				time.Sleep(2 * time.Millisecond)
				for i, it := range items {
					for k, b := range it.Dst {
						if b != 0xAB {
							t.Errorf("item %d byte %d written after the call returned", i, k)
							break
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if users, held := cl.gateState(addr); users != 0 || held != 0 {
		t.Fatalf("gate: %d users, %d held", users, held)
	}
}

// TestRefusalAnnouncingBytes: a FENCED reply that announces bytes (length != 0) is a
// protocol error that closes the connection: taken as a refusal with the connection
// kept in step, the bytes it announced were read as the next pipelined item's reply
// (item 1 "succeeded" with bytes the source never served for it).
func TestRefusalAnnouncingBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const n = 100
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Read the two requests.
		var h [2 * (requestFixedLen + 6)]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		// Item 0: FENCED announcing an OK header and n bytes; they follow.
		tail := appendResponse(nil, statusOK, n, "")
		tail = append(tail, bytes.Repeat([]byte{0xEE}, n)...)
		reply := appendResponse(nil, statusFenced, int64(len(tail)), "no")
		c.Write(append(reply, tail...))
		time.Sleep(500 * time.Millisecond) // item 1's real answer never comes
	}()
	cl := newClient(t, ClientOptions{})
	f := Fence{SourceNode: "node-a", SourceGeneration: 1, TransferID: 1}
	items := []PullItem{{Fence: f, Dst: make([]byte, n)}, {Fence: f, Offset: 4096, Dst: make([]byte, n)}}
	errs := cl.PullMany(context.Background(), ln.Addr().String(), items)
	if errs[0] == nil {
		t.Fatalf("item 0 succeeded")
	}
	if errs[1] == nil {
		t.Fatalf("item 1 accepted the bytes a refusal announced as its data: %x...", items[1].Dst[:8])
	}
}

// orderedStaged models the stager: it reads staged items from disk in list order, one
// every d from the start, and a staged pull waits at most wait for its chunk (the
// stager's stageChunkWait), then is refused.
type orderedStaged struct {
	*testSource
	start time.Time
	d     time.Duration
	wait  time.Duration
}

func (s orderedStaged) Open(f Fence, off, n int64) ([]byte, func(), error) {
	if f.Staged {
		ready := s.start.Add(time.Duration(f.TransferID) * s.d) // item i has id i+1
		if w := time.Until(ready); w > s.wait {
			time.Sleep(s.wait)
			return nil, nil, fmt.Errorf("%w: chunk of %d not read within %v", ErrFenced, f.TransferID, s.wait)
		} else if w > 0 {
			time.Sleep(w)
		}
		f.Staged = false
	}
	return s.testSource.Open(f, off, n)
}

// TestStagedItemsOneRun: a PullMany of staged items (refillGroup's even or odd items)
// stays one in-order pipeline, which waits for one chunk at a time. Split into runs of
// 8 MiB on several connections like a memory batch, the later runs' first pulls waited
// at the source from the start for chunks it reads only after every item before them,
// and were refused below a read rate of (bytes ahead)/wait.
func TestStagedItemsOneRun(t *testing.T) {
	src := newTestSource(segment(t, 20*mib, true))
	const items, size = 8, 2 * mib // 16 MiB: two runs of four
	os := orderedStaged{testSource: src, d: 60 * time.Millisecond, wait: 200 * time.Millisecond}
	var list []PullItem
	for i := range items {
		f := src.retain(int64(i+1), int64(i)*size, size)
		f.Staged = true
		list = append(list, PullItem{Fence: f, Offset: int64(i) * size, Dst: make([]byte, size)})
	}
	os.start = time.Now()
	srv := startServer(t, os, ServerOptions{})
	cl := newClient(t, ClientOptions{ProgressTimeout: time.Second})
	for i, err := range cl.PullMany(context.Background(), srv.Addr().String(), list) {
		if err != nil {
			t.Errorf("item %d: %v", i, err)
		}
	}
}
