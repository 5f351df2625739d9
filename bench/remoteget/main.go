// Command remoteget is the Go half of bench/remote_get_bench.py (issue 13 item 7): it
// measures gets of remote values through one owner from Go, and the limit beside them,
// a plain Go TCP sender/receiver pair over loopback moving the same sizes.
//
//	remoteget -socket B/fluxkv.sock -prefix rg/1048576/ -keys 8 -size 1048576 -conc 2 -duration 5s
//	remoteget -tcp-pair -size 16777216 -conc 2 -duration 5s
//	remoteget -unix-pair -duration 3s
//	remoteget -transfer-pair -size 1048576 -conc 1 -duration 5s
//	remoteget -tcp-pair -child-pair -size 1048576 -conc 1 -duration 5s
//
// Get mode: conc goroutines share one client and loop get + release over the keys
// PREFIX0 … PREFIX{keys-1}, each goroutine over its own share of them; every
// -verify-every-th get of each goroutine (and its first) is compared byte for byte with
// the value the harness put (value.go), outside the timed call. A wrong value is not a
// hit: it is counted, and the exit status is 1. TCP-pair mode: a server in this process
// answers each 8-byte request with that many bytes from one buffer; each of conc
// clients has its own connection and reads every answer into a reused buffer
// (-child-pair: the server is a child process). Transfer-pair mode (transferpair.go):
// the data plane alone, a child serving a memfd segment over daemon/transfer and this
// process pulling it into memfd segments. Unix-pair mode (unixpair.go): the floor of a
// holder get, a small request and reply between this process and a child over a Unix
// socket. Each prints one JSON line (result) on stdout: ops, bytes, seconds, GiB/s,
// p50/p99 in µs.
package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
)

// result is what one run prints, as one JSON line.
type result struct {
	Mode     string  `json:"mode"`
	Size     int     `json:"size"`
	Conc     int     `json:"conc"`
	Ops      int     `json:"ops"`
	Seconds  float64 `json:"seconds"`
	GiBps    float64 `json:"gib_per_s"`
	P50us    float64 `json:"p50_us"`
	P99us    float64 `json:"p99_us"`
	Total    int     `json:"total"`    // every successful get, warmup included
	Remote   int     `json:"remote"`   // of Total: gets whose bytes crossed the network
	Verified int     `json:"verified"` // gets compared byte for byte
	Wrong    int     `json:"wrong"`    // verified gets with wrong bytes (not counted as hits)
	Errors   int     `json:"errors"`
	FirstErr string  `json:"first_error,omitempty"`
}

type config struct {
	tcpPair      bool
	childPair    bool
	transferPair bool
	unixPair     bool
	socket       string
	prefix       string
	keys         int
	size         int
	conc         int
	duration     time.Duration
	warmup       time.Duration
	verifyEvery  int
	requestBytes int
}

func main() {
	var c config
	flag.BoolVar(&c.tcpPair, "tcp-pair", false, "measure the plain TCP sender/receiver pair over loopback instead of fluxkv gets")
	flag.BoolVar(&c.unixPair, "unix-pair", false, "measure a small request/reply round trip with a child process over a Unix socket (a holder get's floor) instead of fluxkv gets")
	flag.IntVar(&c.requestBytes, "request-bytes", 8, "with -tcp-pair: bytes of each request (the length in the first 8). On AMD EPYC an 8-byte request written by the thread that then writes the answer puts the answer's kernel copy on a slow rep movsb path (daemon/transfer/wire.go, okHeaderLen); 64 keeps it off")
	flag.BoolVar(&c.childPair, "child-pair", false, "with -tcp-pair: the sender is a child process (as a remote get's source is another owner)")
	flag.BoolVar(&c.transferPair, "transfer-pair", false, "measure the data plane alone (daemon/transfer between this process and a child, memfd segment to memfd segments) instead of fluxkv gets")
	serve := flag.Bool("unix-pair-serve", false, "internal: the answering process of -unix-pair")
	serveTransfer := flag.Bool("transfer-pair-serve", false, "internal: the source process of -transfer-pair")
	serveTCP := flag.Bool("tcp-pair-serve", false, "internal: the sender process of -tcp-pair -child-pair")
	flag.StringVar(&c.socket, "socket", "", "owner socket the gets go through (get mode)")
	flag.StringVar(&c.prefix, "prefix", "rg/", "key prefix: the keys are PREFIX0 … PREFIX{keys-1}")
	flag.IntVar(&c.keys, "keys", 8, "how many keys to rotate over")
	flag.IntVar(&c.size, "size", 1<<20, "value size in bytes (every key has this size)")
	flag.IntVar(&c.conc, "conc", 1, "goroutines (each with its own connection in TCP-pair mode)")
	flag.DurationVar(&c.duration, "duration", 5*time.Second, "measured window")
	flag.DurationVar(&c.warmup, "warmup", time.Second, "unmeasured warmup before the window")
	flag.IntVar(&c.verifyEvery, "verify-every", 16, "compare every Nth get of each goroutine byte for byte (and its first); 0 = only the first")
	flag.Parse()
	switch {
	case *serve:
		serveUnixPair()
		return
	case *serveTransfer:
		serveTransferPair(c.size)
		return
	case *serveTCP:
		serveTCPPairChild(c.size, c.requestBytes)
		return
	}
	if c.conc < 1 || c.size < 1 || c.keys < 1 || c.duration <= 0 || c.requestBytes < 8 {
		fmt.Fprintln(os.Stderr, "remoteget: -conc, -size, -keys and -duration must be positive, -request-bytes at least 8")
		os.Exit(2)
	}
	if !c.tcpPair && !c.unixPair && !c.transferPair && c.keys < c.conc {
		fmt.Fprintln(os.Stderr, "remoteget: -keys must be at least -conc (each goroutine gets its own keys)")
		os.Exit(2)
	}
	var r result
	var err error
	switch {
	case c.tcpPair:
		r, err = runTCPPair(c)
	case c.transferPair:
		r, err = runTransferPair(c)
	case c.unixPair:
		r, err = runUnixPair(c)
	default:
		if c.socket == "" {
			fmt.Fprintln(os.Stderr, "remoteget: -socket is required without -tcp-pair, -transfer-pair or -unix-pair")
			os.Exit(2)
		}
		r, err = runGets(c)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "remoteget:", err)
		os.Exit(1)
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	if r.Wrong > 0 {
		os.Exit(1)
	}
}

// loop runs conc workers calling op(g, i) (i counts that worker's calls) through a
// warmup and then a window; it keeps the latency op reports for each call that starts
// and ends inside the window.
func loop(c config, op func(g, i int) (time.Duration, error)) (lat []time.Duration, seconds float64, errs int, firstErr error) {
	var measuring atomic.Bool
	var stop atomic.Bool
	lats := make([][]time.Duration, c.conc)
	var mu sync.Mutex // protects errs, firstErr
	var wg sync.WaitGroup
	for g := range c.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				in := measuring.Load()
				d, err := op(g, i)
				if err != nil {
					mu.Lock()
					errs++
					if firstErr == nil {
						firstErr = err
					}
					tooMany := errs > 100
					mu.Unlock()
					if tooMany {
						return
					}
					continue
				}
				if in && measuring.Load() {
					lats[g] = append(lats[g], d)
				}
			}
		}()
	}
	time.Sleep(c.warmup)
	start := time.Now()
	measuring.Store(true)
	time.Sleep(c.duration)
	measuring.Store(false)
	seconds = time.Since(start).Seconds()
	stop.Store(true)
	wg.Wait()
	lat = slices.Concat(lats...)
	slices.Sort(lat)
	return lat, seconds, errs, firstErr
}

func summarize(mode string, c config, lat []time.Duration, seconds float64) result {
	r := result{Mode: mode, Size: c.size, Conc: c.conc, Ops: len(lat), Seconds: seconds}
	r.GiBps = float64(len(lat)) * float64(c.size) / seconds / (1 << 30)
	if len(lat) > 0 {
		r.P50us = float64(lat[len(lat)/2].Nanoseconds()) / 1e3
		r.P99us = float64(lat[min(len(lat)-1, len(lat)*99/100)].Nanoseconds()) / 1e3
	}
	return r
}

func runGets(c config) (result, error) {
	cl, err := fluxkv.Connect(fluxkv.Options{Socket: c.socket, Name: "remoteget", MaxIdleConns: max(16, 2*c.conc)})
	if err != nil {
		return result{}, err
	}
	defer cl.Close()
	keys := make([]string, c.keys)
	want := make([][]byte, c.keys)
	for i := range keys {
		keys[i] = c.prefix + strconv.Itoa(i)
		want[i] = make([]byte, c.size)
		fillValue(keys[i], want[i])
	}
	// Each goroutine has its own keys (g, g+conc, …): two concurrent gets of one key would
	// share the first one's holding on the owner, a local hit instead of a pull.
	mine := make([][]int, c.conc)
	for k := range c.keys {
		mine[k%c.conc] = append(mine[k%c.conc], k)
	}
	var total, remote, verified, wrong atomic.Int64
	var wrongMsg atomic.Value
	// Timed: the get and its release; a sampled verification is not part of the latency
	// (it does take the worker's time inside the window).
	get := func(g, i int) (time.Duration, error) {
		k := mine[g][i%len(mine[g])]
		t0 := time.Now()
		h, err := cl.Get(keys[k])
		d := time.Since(t0)
		if err != nil {
			return d, err
		}
		total.Add(1)
		if h.Remote() {
			remote.Add(1)
		}
		if i == 0 || (c.verifyEvery > 0 && i%c.verifyEvery == 0) {
			verified.Add(1)
			if !bytes.Equal(h.Bytes(), want[k]) {
				wrong.Add(1)
				wrongMsg.CompareAndSwap(nil, fmt.Sprintf("get %s: %d bytes, not the value put", keys[k], h.Len()))
			}
		}
		t1 := time.Now()
		err = h.Release()
		return d + time.Since(t1), err
	}
	lat, seconds, errs, firstErr := loop(c, get)
	cl.Flush()
	r := summarize("go", c, lat, seconds)
	r.Total, r.Remote, r.Verified, r.Wrong, r.Errors = int(total.Load()), int(remote.Load()), int(verified.Load()), int(wrong.Load()), errs
	if firstErr != nil {
		r.FirstErr = firstErr.Error()
	}
	if m, ok := wrongMsg.Load().(string); ok {
		fmt.Fprintln(os.Stderr, "remoteget: WRONG BYTES:", m)
	}
	return r, nil
}

// runTCPPair is the limit: the same sizes over a plain loopback TCP connection per
// goroutine, request/response (an 8-byte length, then that many bytes).
func runTCPPair(c config) (result, error) {
	src := make([]byte, c.size)
	fillValue("tcp-pair", src)
	if c.childPair {
		addr, stop, err := pairChild(nil, "-tcp-pair-serve", "-size", strconv.Itoa(c.size), "-request-bytes", strconv.Itoa(c.requestBytes))
		if err != nil {
			return result{}, err
		}
		defer stop()
		return tcpPairClients(c, addr, src, "tcp-pair-child")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	var srvWG sync.WaitGroup
	var mu sync.Mutex // protects served
	var served []net.Conn
	srvWG.Add(1)
	go func() {
		defer srvWG.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			served = append(served, conn)
			mu.Unlock()
			srvWG.Add(1)
			go func() {
				defer srvWG.Done()
				serveTCPPairConn(conn, src, c.requestBytes)
			}()
		}
	}()
	defer func() {
		ln.Close()
		mu.Lock()
		for _, conn := range served {
			conn.Close()
		}
		mu.Unlock()
		srvWG.Wait()
	}()
	return tcpPairClients(c, ln.Addr().String(), src, "tcp-pair")
}

// serveTCPPairConn answers each request of reqLen bytes on conn (a length, then
// padding) with that many bytes of src.
func serveTCPPairConn(conn net.Conn, src []byte, reqLen int) {
	defer conn.Close()
	h := make([]byte, reqLen)
	for {
		if _, err := io.ReadFull(conn, h); err != nil {
			return
		}
		if _, err := conn.Write(src[:binary.BigEndian.Uint64(h)]); err != nil {
			return
		}
	}
}

// tcpPairClients measures conc connections to the pair's sender at addr, each reading
// every answer into its own reused buffer; the first answer is compared with src.
func tcpPairClients(c config, addr string, src []byte, mode string) (result, error) {
	conns := make([]net.Conn, c.conc)
	bufs := make([][]byte, c.conc)
	reqs := make([][]byte, c.conc)
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close()
			}
		}
	}()
	for g := range conns {
		var err error
		if conns[g], err = net.Dial("tcp", addr); err != nil {
			return result{}, err
		}
		bufs[g] = make([]byte, c.size)
		reqs[g] = make([]byte, c.requestBytes)
	}
	var wrong atomic.Int64
	pull := func(g, i int) (time.Duration, error) {
		t0 := time.Now()
		h := reqs[g]
		binary.BigEndian.PutUint64(h, uint64(c.size))
		if _, err := conns[g].Write(h); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(conns[g], bufs[g]); err != nil {
			return 0, err
		}
		d := time.Since(t0)
		if i == 0 && !bytes.Equal(bufs[g], src) {
			wrong.Add(1)
		}
		return d, nil
	}
	lat, seconds, errs, firstErr := loop(c, pull)
	r := summarize(mode, c, lat, seconds)
	r.Errors, r.Wrong = errs, int(wrong.Load())
	if firstErr != nil {
		if errors.Is(firstErr, io.EOF) {
			firstErr = fmt.Errorf("tcp pair: %w", firstErr)
		}
		r.FirstErr = firstErr.Error()
	}
	return r, nil
}
