package transfer

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkPull measures pulls of 1 MiB and 16 MiB at concurrency 1 and 2 over
// loopback (authenticated, pooled), beside the limit: a plain Go TCP pair moving the
// same bytes request/response style over loopback in the same run ("tcp"). GiB/s
// comes from SetBytes; p50 and p99 of one pull are reported in µs. "sockbuf4m" is
// the data plane with SO_RCVBUF/SO_SNDBUF of 4 MiB instead of autotuning.
//
//	go test ./daemon/transfer/ -run '^$' -bench Pull -benchtime 2s
func BenchmarkPull(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20} {
		for _, conc := range []int{1, 2} {
			for _, kind := range []string{"tcp", "fluxkv", "sockbuf4m"} {
				b.Run(fmt.Sprintf("size=%dMiB/c=%d/%s", size>>20, conc, kind), func(b *testing.B) {
					benchPull(b, kind, size, conc)
				})
			}
		}
	}
}

func benchPull(b *testing.B, kind string, size, conc int) {
	seg := segment(b, size, true)
	dsts := make([][]byte, conc)
	for i := range dsts {
		dsts[i] = segment(b, size, false)
	}
	var pull func(g int) error
	switch kind {
	case "tcp":
		pull = plainTCPPair(b, seg, conc)
	default:
		sockBuf := 0
		if kind == "sockbuf4m" {
			sockBuf = 4 << 20
		}
		sec := secrets(b)
		src := newTestSource(seg)
		f := src.retain(1, 0, int64(size))
		srv := startServer(b, src, ServerOptions{Secrets: sec, sockBuf: sockBuf})
		cl := newClient(b, ClientOptions{Secrets: sec, MaxIdlePerPeer: conc, sockBuf: sockBuf})
		addr := srv.Addr().String()
		pull = func(g int) error { return cl.Pull(context.Background(), addr, f, 0, dsts[g]) }
		for g := range conc { // warm the pool
			if err := pull(g); err != nil {
				b.Fatal(err)
			}
		}
	}
	lat := make([][]time.Duration, conc)
	var next atomic.Int64
	b.SetBytes(int64(size))
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				start := time.Now()
				if err := pull(g); err != nil {
					b.Error(err)
					return
				}
				lat[g] = append(lat[g], time.Since(start))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(all[min(len(all)-1, len(all)*99/100)].Microseconds()), "p99-µs")
	}
}

// plainTCPPair is the limit: a Go TCP server that answers an 8-byte length with that
// many bytes of seg, one connection per puller, read with io.ReadFull.
func plainTCPPair(b *testing.B, seg []byte, conc int) func(g int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var served []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			served = append(served, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				var h [8]byte
				for {
					if _, err := io.ReadFull(c, h[:]); err != nil {
						return
					}
					if _, err := c.Write(seg[:binary.BigEndian.Uint64(h[:])]); err != nil {
						return
					}
				}
			}()
		}
	}()
	conns := make([]net.Conn, conc)
	dsts := make([][]byte, conc)
	for i := range conns {
		if conns[i], err = net.Dial("tcp", ln.Addr().String()); err != nil {
			b.Fatal(err)
		}
		dsts[i] = segment(b, len(seg), false)
	}
	b.Cleanup(func() {
		ln.Close()
		for _, c := range conns {
			c.Close()
		}
		mu.Lock()
		for _, c := range served {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return func(g int) error {
		var h [8]byte
		binary.BigEndian.PutUint64(h[:], uint64(len(seg)))
		if _, err := conns[g].Write(h[:]); err != nil {
			return err
		}
		_, err := io.ReadFull(conns[g], dsts[g])
		return err
	}
}

// BenchmarkPullMany measures one PullMany of 32 values of 64 KiB (a get batch's
// pages from one source) over loopback, beside the plain TCP pair moving the same
// bytes as 32 requests of 64 KiB one after the other ("tcp-each") and as one request
// of 2 MiB ("tcp-one").
//
//	go test ./daemon/transfer/ -run '^$' -bench PullMany -benchtime 2s
func BenchmarkPullMany(b *testing.B) {
	const n, size = 32, 64 << 10
	for _, kind := range []string{"tcp-each", "tcp-one", "fluxkv"} {
		b.Run(kind, func(b *testing.B) {
			seg := segment(b, n*size, true)
			dst := segment(b, n*size, false)
			var pull func() error
			switch kind {
			case "tcp-each", "tcp-one":
				one := plainTCPPair(b, seg[:size], 1)
				if kind == "tcp-one" {
					one = plainTCPPair(b, seg, 1)
				}
				pull = func() error {
					if kind == "tcp-one" {
						return one(0)
					}
					for range n {
						if err := one(0); err != nil {
							return err
						}
					}
					return nil
				}
			default:
				sec := secrets(b)
				src := newTestSource(seg)
				f := src.retain(1, 0, int64(n*size))
				srv := startServer(b, src, ServerOptions{Secrets: sec})
				cl := newClient(b, ClientOptions{Secrets: sec})
				addr := srv.Addr().String()
				items := make([]PullItem, n)
				for i := range items {
					items[i] = PullItem{Fence: f, Offset: int64(i * size), Dst: dst[i*size : (i+1)*size]}
				}
				pull = func() error {
					for _, err := range cl.PullMany(context.Background(), addr, items) {
						if err != nil {
							return err
						}
					}
					return nil
				}
			}
			if err := pull(); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(n * size)
			b.ResetTimer()
			for b.Loop() {
				if err := pull(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
