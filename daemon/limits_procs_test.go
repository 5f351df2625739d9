package daemon_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// noRaceBin is the plain fluxkv binary for limit tests (FLUXKV_BIN_NORACE), else the
// one the other process tests use.
func noRaceBin() string {
	if p := os.Getenv("FLUXKV_BIN_NORACE"); p != "" {
		return p
	}
	return bin
}

// TestOpenFileLimit: `fluxkv up` under `prlimit --nofile=256` with 400 idle connections,
// half to each socket (attached clients, and RPC connections that named a live
// session, so no deadline closes them): attaches beyond what the node can hold get a
// clear refusal instead of a hang, the node keeps serving the connections it holds,
// and once they close, attach + put + get work again.
//
// Not parallel: 400 connections' fds in this process.
func TestOpenFileLimit(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("prlimit not installed")
	}
	dir := t.TempDir()
	p := &proc{t: t, stderr: &proctest.Buffer{}, done: make(chan error, 1), socket: filepath.Join(dir, "fluxkv.sock")}
	p.cmd = exec.Command("prlimit", "--nofile=256:256", noRaceBin(), "--log-level", "info", "up", "--dir", dir, "--dram", "16MiB")
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(p.stop)
	p.waitSocket()

	first := connect(t, p.socket)
	if err := first.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	// 200 attaches: those over the cap are refused with a clear error, quickly.
	var clients []*fluxkv.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	refused := 0
	for i := 0; i < 200; i++ {
		c, err := fluxkv.Connect(fluxkv.Options{Socket: p.socket, Name: fmt.Sprintf("idle-%d", i), Timeout: 20 * time.Second})
		if err != nil {
			if !strings.Contains(err.Error(), "connection cap") && !strings.Contains(err.Error(), "out of file descriptors") {
				t.Fatalf("attach %d: %v (want a clear refusal)", i, err)
			}
			refused++
			continue
		}
		clients = append(clients, c)
	}
	// 200 RPC connections, each naming a live session once.
	var rpcs []net.Conn
	defer func() {
		for _, c := range rpcs {
			c.Close()
		}
	}()
	s := &external.Session{ClientId: first.ClientID(), SessionToken: first.SessionToken(), OwnerGeneration: first.Generation()}
	call, _ := thrift.MarshalFastMsg("Exists", thrift.CALL, 1, &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: s, Key: "k"}})
	req := append(binary.BigEndian.AppendUint32(nil, uint32(len(call))), call...)
	closedRPC := 0
	for i := 0; i < 200; i++ {
		c, err := net.Dial("unix", wire.RPCSocketPath(p.socket))
		if err != nil {
			t.Fatalf("rpc dial %d: %v", i, err)
		}
		rpcs = append(rpcs, c)
		c.Write(req)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		var hdr [4]byte
		if _, err := c.Read(hdr[:]); err != nil {
			if os.IsTimeout(err) {
				t.Fatalf("rpc connection %d hangs", i)
			}
			closedRPC++ // refused: closed without a reply
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
	t.Logf("attached %d, refused %d; rpc refused %d; owner fds %d of 256", len(clients), refused, closedRPC, len(fds))
	if refused == 0 || closedRPC == 0 {
		t.Fatalf("no refusal under a 256-fd limit: attach refused %d, rpc refused %d", refused, closedRPC)
	}
	// One more attach: a clear refusal, not a hang.
	if _, err := fluxkv.Connect(fluxkv.Options{Socket: p.socket, Name: "one-more", Timeout: 20 * time.Second}); err == nil ||
		!(strings.Contains(err.Error(), "connection cap") || strings.Contains(err.Error(), "out of file descriptors")) {
		t.Fatalf("attach at the limit: %v", err)
	}
	// The node keeps serving the clients it holds.
	h, err := first.Get("k")
	if err != nil || string(h.Bytes()) != "value" {
		t.Fatalf("get during the flood: %v", err)
	}
	h.Release()
	for _, c := range clients {
		c.Close()
	}
	clients = nil
	for _, c := range rpcs {
		c.Close()
	}
	rpcs = nil
	// Everything closed: attach + put + get work again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := fluxkv.Connect(fluxkv.Options{Socket: p.socket, Name: "after", Timeout: 20 * time.Second})
		if err == nil {
			defer c.Close()
			if err := c.Put("after", []byte("again")); err != nil {
				t.Fatal(err)
			}
			h, err := c.Get("after")
			if err != nil || string(h.Bytes()) != "again" {
				t.Fatalf("get after the flood: %v", err)
			}
			h.Release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no attach after the flood: %v\n%s", err, tail(p.stderr.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.checkAlive()
	if n := strings.Count(p.stderr.String(), "connection refused"); n > 20 {
		t.Fatalf("%d refusal log lines: not rate-limited", n)
	}
}
