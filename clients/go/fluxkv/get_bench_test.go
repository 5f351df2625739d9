package fluxkv

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// echoServeEnv makes this test binary the answering process of the echo floor
// (TestMain): "REQ,REPLY" sizes, the listener on fd 3.
const echoServeEnv = "FLUXKV_TEST_ECHO_SERVE"

// BenchmarkHotGet4KiB measures a one-goroutine loop of Get + Release of 4 KiB values the
// owner's hot set answers (every key got once first), beside its floor in the same run:
// a plain Go request/reply with another process over a Unix socket, with the byte sizes
// of the get's own request and reply frames (issue 26 point 5: get ≥ 0.6 × echo). The two
// alternate in rounds of 256 calls, so that load on the machine weighs on both alike.
// It reports get_ns and echo_ns per call and get/echo, the ratio of their rates.
//
//	FLUXKV_BIN=$PWD/bin/fluxkv go test ./clients/go/fluxkv -run '^$' -bench HotGet4KiB -benchtime 20000x -count 3
func BenchmarkHotGet4KiB(b *testing.B) {
	const keys, size, round = 1024, 4096, 256
	n := startNode(b, "256MiB")
	c := n.connect(b)
	names := make([]string, keys)
	value := make([]byte, size)
	for i := range names {
		names[i] = fmt.Sprintf("hot/%d", i)
		pattern(names[i], 0, value)
		if err := c.Put(names[i], value); err != nil {
			b.Fatal(err)
		}
	}
	// Every key once (the hot set keeps its holding), and the frame sizes of a get.
	var reqBytes int
	c.hooks.onSend = func(method string, args thrift.FastCodec) {
		if method == "Get" {
			reqBytes = 4 + thrift.Binary.MessageBeginLength(method) + args.BLength()
		}
	}
	var sample *MemHolder
	for _, k := range names {
		h, err := c.Get(k)
		if err != nil {
			b.Fatal(err)
		}
		sample = h
		h.Release()
	}
	c.hooks.onSend = nil
	c.Flush()
	res := &external.ExternalServiceGetResult{Success: &external.GetResponse{HolderId: sample.id, Offset: sample.off,
		Len: sample.n, Source: sample.source, PutId: sample.putID, Remote: sample.remote}}
	replyBytes := 4 + thrift.Binary.MessageBeginLength("Get") + res.BLength()
	echo := startEcho(b, reqBytes, replyBytes)
	defer echo.Close()
	req, reply := make([]byte, reqBytes), make([]byte, replyBytes)

	calls := recordMethods(c)
	var getT, echoT, getCPU, echoCPU time.Duration
	var gets, echoes int
	k := 0
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; {
		m := min(round, b.N-done)
		c0 := cpuTime()
		t0 := time.Now()
		for range m {
			h, err := c.Get(names[k%keys])
			if err != nil {
				b.Fatal(err)
			}
			h.Release()
			k++
		}
		t1 := time.Now()
		c1 := cpuTime()
		for range m {
			if _, err := echo.Write(req); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(echo, reply); err != nil {
				b.Fatal(err)
			}
		}
		t2 := time.Now()
		c2 := cpuTime()
		getT += t1.Sub(t0)
		echoT += t2.Sub(t1)
		getCPU += c1 - c0
		echoCPU += c2 - c1
		gets += m
		echoes += m
		done += m
	}
	b.StopTimer()
	getNs := float64(getT.Nanoseconds()) / float64(gets)
	echoNs := float64(echoT.Nanoseconds()) / float64(echoes)
	b.ReportMetric(getNs, "get_ns")
	b.ReportMetric(echoNs, "echo_ns")
	b.ReportMetric(echoNs/getNs, "get/echo")
	// This process's CPU time (every thread, user + system) per call: the client's own
	// cost, which load on the machine does not inflate as it does the wall times.
	b.ReportMetric(float64(getCPU.Nanoseconds())/float64(gets), "get_cpu_ns")
	b.ReportMetric(float64(echoCPU.Nanoseconds())/float64(echoes), "echo_cpu_ns")
	// Releases sent on their own (not riding on a get), per get.
	b.ReportMetric(float64(calls.count("Release"))/float64(gets), "releases/get")
	b.ReportMetric(float64(reqBytes), "req_B")
	b.ReportMetric(float64(replyBytes), "reply_B")
}

// cpuTime is the CPU time this process used so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startEcho starts a copy of this test binary that answers every req bytes with reply
// bytes on a Unix socket, and returns a connection to it.
func startEcho(b *testing.B, req, reply int) net.Conn {
	path := filepath.Join(b.TempDir(), "echo.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.UnixListener).File()
	if err != nil {
		b.Fatal(err)
	}
	child := exec.Command(os.Args[0])
	child.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d", echoServeEnv, req, reply))
	child.ExtraFiles = []*os.File{f} // fd 3
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	b.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	conn, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	return conn
}

// serveEcho is the echo process: one connection, every req bytes answered with reply bytes.
func serveEcho(spec string) {
	var req, reply int
	if _, err := fmt.Sscanf(spec, "%d,%d", &req, &reply); err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(2)
	}
	ln, err := net.FileListener(os.NewFile(3, "echo-listener"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
	conn, err := ln.Accept()
	if err != nil {
		os.Exit(1)
	}
	in, out := make([]byte, req), make([]byte, reply)
	for {
		if _, err := io.ReadFull(conn, in); err != nil {
			os.Exit(0)
		}
		if _, err := conn.Write(out); err != nil {
			os.Exit(0)
		}
	}
}
