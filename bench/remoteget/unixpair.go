package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// The Unix-socket floor of a holder get: one small request and one small reply
// between two processes over a Unix socket, nothing else. A holder get moves no payload
// (the bytes stay in shared memory), so this round trip is the most a one-thread get
// loop can do on the machine; a get's figure divided by it is the share the owner's and
// client's own work leaves.
const (
	pairRequest = 100 // about a GetRequest frame
	pairReply   = 60  // about a GetResponse frame
)

// runUnixPair starts a copy of this program as the answering process (-unix-pair-serve)
// and measures conc connections' request/reply round trips against it.
func runUnixPair(c config) (result, error) {
	dir, err := os.MkdirTemp("", "remoteget-pair-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "pair.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		return result{}, err
	}
	defer ln.Close()
	f, err := ln.(*net.UnixListener).File()
	if err != nil {
		return result{}, err
	}
	child := exec.Command(os.Args[0], "-unix-pair-serve")
	child.ExtraFiles = []*os.File{f} // fd 3 in the child
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		f.Close()
		return result{}, err
	}
	f.Close()
	defer func() {
		child.Process.Kill()
		child.Wait()
	}()
	conns := make([]net.Conn, c.conc)
	for g := range conns {
		if conns[g], err = net.Dial("unix", path); err != nil {
			return result{}, err
		}
		defer conns[g].Close()
	}
	bufs := make([][]byte, c.conc)
	for g := range bufs {
		bufs[g] = make([]byte, pairRequest)
	}
	trip := func(g, i int) (time.Duration, error) {
		t0 := time.Now()
		if _, err := conns[g].Write(bufs[g][:pairRequest]); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(conns[g], bufs[g][:pairReply]); err != nil {
			return 0, err
		}
		return time.Since(t0), nil
	}
	lat, seconds, errs, firstErr := loop(c, trip)
	c.size = pairRequest
	r := summarize("go-unix-pair", c, lat, seconds)
	r.GiBps = 0 // no payload moves
	r.Errors = errs
	if firstErr != nil {
		r.FirstErr = firstErr.Error()
	}
	return r, nil
}

// serveUnixPair is the answering process: it accepts on fd 3 and answers every
// pairRequest bytes with pairReply bytes, one goroutine per connection, until killed.
func serveUnixPair() {
	ln, err := net.FileListener(os.NewFile(3, "pair-listener"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "remoteget: pair listener:", err)
		os.Exit(1)
	}
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer conn.Close()
			b := make([]byte, pairRequest)
			for {
				if _, err := io.ReadFull(conn, b); err != nil {
					return
				}
				if _, err := conn.Write(b[:pairReply]); err != nil {
					return
				}
			}
		}()
	}
}
