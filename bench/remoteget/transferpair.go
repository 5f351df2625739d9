package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/shm"
)

// The data plane alone, between two processes: what a remote get costs without the
// owners' and the master's work around it. A child (-transfer-pair-serve) serves one
// memfd segment holding the value over daemon/transfer (authenticated with a fresh
// secret); this process pulls it, conc goroutines sharing one transfer.Client, each
// into its own memfd segment: the bytes take the path a remote get's take (segment →
// socket → segment, each end in its own process), fenced as a get's pull is.
//
// -child-pair runs the TCP pair's server in a child process too (-tcp-pair
// -child-pair), the like-for-like limit of this mode.

const (
	transferPairNode = "remoteget-source"
	transferPairGen  = 1
	transferPairID   = 1
)

// pairChild starts a copy of this program with args, hands it secret on stdin and
// reads the address it prints on its first stdout line. stop kills and reaps it.
func pairChild(secret []byte, args ...string) (addr string, stop func(), err error) {
	child := exec.Command(os.Args[0], args...)
	child.Stderr = os.Stderr
	in, err := child.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	out, err := child.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := child.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		child.Process.Kill()
		child.Wait()
	}
	in.Write(secret)
	in.Close()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("pair child: no address: %w", err)
	}
	return strings.TrimSpace(line), stop, nil
}

// pageRound rounds n up to a multiple of the page size (a segment's size must be).
func pageRound(n int) int64 {
	p := os.Getpagesize()
	return int64((n + p - 1) / p * p)
}

// runTransferPair pulls the child's segment over the data plane.
func runTransferPair(c config) (result, error) {
	secret := make([]byte, 32)
	rand.Read(secret)
	sec, err := auth.NewSecrets(secret)
	if err != nil {
		return result{}, err
	}
	addr, stop, err := pairChild(secret, "-transfer-pair-serve", "-size", fmt.Sprint(c.size))
	if err != nil {
		return result{}, err
	}
	defer stop()
	want := make([]byte, c.size)
	fillValue("transfer-pair", want)
	dsts := make([][]byte, c.conc)
	for g := range dsts {
		seg, err := shm.CreateSegment(fmt.Sprintf("remoteget-dst-%d", g), pageRound(c.size), shm.SegmentOptions{})
		if err != nil {
			return result{}, err
		}
		defer seg.Close()
		dsts[g] = seg.Bytes()[:c.size]
	}
	cl := transfer.NewClient(transfer.ClientOptions{Secrets: sec, MaxIdlePerPeer: max(4, c.conc), MaxPullsPerPeer: c.conc})
	defer cl.Close()
	f := transfer.Fence{SourceNode: transferPairNode, SourceGeneration: transferPairGen, TransferID: transferPairID}
	var wrong atomic.Int64
	pull := func(g, i int) (time.Duration, error) {
		t0 := time.Now()
		err := cl.Pull(context.Background(), addr, f, 0, dsts[g])
		d := time.Since(t0)
		if err == nil && i == 0 && !bytes.Equal(dsts[g], want) {
			wrong.Add(1)
		}
		return d, err
	}
	lat, seconds, errs, firstErr := loop(c, pull)
	r := summarize("transfer-pair", c, lat, seconds)
	r.Errors, r.Wrong = errs, int(wrong.Load())
	if firstErr != nil {
		r.FirstErr = firstErr.Error()
	}
	return r, nil
}

// pairSource serves one segment for the fence runTransferPair pulls with.
type pairSource struct{ seg []byte }

func (s pairSource) Open(f transfer.Fence, off, n int64) ([]byte, func(), error) {
	if f.SourceNode != transferPairNode || f.SourceGeneration != transferPairGen || f.TransferID != transferPairID {
		return nil, nil, fmt.Errorf("%w: not the pair's fence", transfer.ErrFenced)
	}
	if off < 0 || n <= 0 || off > int64(len(s.seg))-n {
		return nil, nil, fmt.Errorf("%w: range [%d,+%d) outside the %d-byte segment", transfer.ErrFenced, off, n, len(s.seg))
	}
	return s.seg[off : off+n], func() {}, nil
}

// serveTransferPair is the source process of -transfer-pair: the secret on stdin, the
// data plane's address on stdout, then it serves until killed.
func serveTransferPair(size int) {
	secret, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("transfer pair: secret: %v", err)
	}
	sec, err := auth.NewSecrets(secret)
	if err != nil {
		fail("transfer pair: %v", err)
	}
	seg, err := shm.CreateSegment("remoteget-src", pageRound(size), shm.SegmentOptions{})
	if err != nil {
		fail("transfer pair: %v", err)
	}
	fillValue("transfer-pair", seg.Bytes()[:size])
	srv, err := transfer.Listen("127.0.0.1:0", pairSource{seg.Bytes()[:size]}, transfer.ServerOptions{Secrets: sec})
	if err != nil {
		fail("transfer pair: %v", err)
	}
	fmt.Println(srv.Addr().String())
	select {}
}

// serveTCPPairChild is the sender of -tcp-pair -child-pair: it answers each request
// with that many bytes of the value, one goroutine per connection.
func serveTCPPairChild(size, reqLen int) {
	io.ReadAll(os.Stdin)
	src := make([]byte, size)
	fillValue("tcp-pair", src)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail("tcp pair: %v", err)
	}
	fmt.Println(ln.Addr().String())
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go serveTCPPairConn(conn, src, reqLen)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "remoteget: "+format+"\n", args...)
	os.Exit(1)
}
