package main

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestUpCountsMasterRefusals: `fluxkv up`'s embedded master records no per-call metrics
// (the owner's are the node's), but its listener's refusals are counted like any
// master's: a connection to its TCP address that fails cluster authentication shows in
// fluxkv_conn_refused_total{socket="master",reason="auth"} (docs/authentication.md).
func TestUpCountsMasterRefusals(t *testing.T) {
	dir := t.TempDir()
	s := startService(t, "up", "--dir", dir, "--dram", "32MiB", "--metrics-addr", "127.0.0.1:0", "--listen", "127.0.0.1:0")
	waitSocket(t, s, filepath.Join(dir, "fluxkv.sock"))
	maddr := s.metricsAddr()
	l, _ := s.waitLog("master started")
	addr, _ := l["addr"].(string)
	if addr == "" {
		t.Fatalf("master started without addr: %v", l)
	}
	const sample = "fluxkv_conn_refused_total{reason=auth,socket=master}"
	before, ok := scrapeMetrics(t, maddr)[sample]
	if !ok {
		t.Fatalf("%s not served", sample)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(bytes.Repeat([]byte("not a fluxkv handshake "), 40))
	io.Copy(io.Discard, c) // until the master closes it
	c.Close()
	s.waitLog("cluster authentication failed; connection closed")
	if got := scrapeMetrics(t, maddr)[sample]; got != before+1 {
		t.Errorf("%s = %v after one refused handshake, want %v", sample, got, before+1)
	}
}

// TestUpWriteQuietOnAFixedPort: `fluxkv up` keeps the master's write quiet period when it
// listens on a fixed port, where owners of other hosts reach it again after a restart,
// with hot sets of the incarnation before; on an ephemeral port (the default) only its
// own owner, restarted with it, reaches it, and writes answer at once. The quiet period
// was off either way (a review).
func TestUpWriteQuietOnAFixedPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fixed := l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		listen string
		quiet  bool
	}{{"127.0.0.1:0", false}, {fixed, true}} {
		dir := t.TempDir()
		s := startService(t, "up", "--dir", dir, "--dram", "32MiB", "--listen", tc.listen)
		m, _ := s.waitLog("master started")
		if q, _ := m["write_quiet"].(bool); q != tc.quiet {
			t.Errorf("up --listen %s: write_quiet %v, want %v", tc.listen, m["write_quiet"], tc.quiet)
		}
		sock := filepath.Join(dir, "fluxkv.sock")
		waitSocket(t, s, sock)
		s.stop(sock)
	}
}
