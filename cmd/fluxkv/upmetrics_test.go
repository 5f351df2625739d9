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
