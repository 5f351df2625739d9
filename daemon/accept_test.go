package daemon

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/shm"
)

// acceptChildEnv makes the test binary run acceptChild (a process of its own, so that
// its RLIMIT_NOFILE can be tiny without starving the test).
const acceptChildEnv = "FLUXKV_ACCEPT_CHILD"

// TestAcceptorFDExhaustion runs an acceptor in a child process whose open-file limit
// leaves room for 16 connections and no cap of its own: a burst of 60 connections gets
// 16 served and the rest a clear refusal (the spare fd at work), none hangs; once they
// close, new connections are served again.
//
// Not parallel: a child process at its RLIMIT_NOFILE.
func TestAcceptorFDExhaustion(t *testing.T) {
	if path := os.Getenv(acceptChildEnv); path != "" {
		acceptChild(t, path)
		return
	}
	socket := filepath.Join(t.TempDir(), "a.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestAcceptorFDExhaustion$", "-test.count=1")
	// FLUXKV_BIN set: the package's TestMain skips building the fluxkv binary the child
	// does not use.
	cmd.Env = append(os.Environ(), acceptChildEnv+"="+socket, "FLUXKV_BIN=/nonexistent")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	defer func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	lines := bufio.NewReader(out)
	if l, err := lines.ReadString('\n'); err != nil || l != "ready\n" {
		t.Fatalf("child: %q %v\n%s", l, err, stderr.String())
	}
	// Connect all before reading any answer, so they queue in the backlog together.
	var conns []net.Conn
	for i := 0; i < 60; i++ {
		c, err := net.Dial("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	served, refused := 0, 0
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		l, err := bufio.NewReader(c).ReadString('\n')
		switch {
		case l == "OK\n":
			served++
		case strings.HasPrefix(l, "REFUSED owner out of file descriptors (RLIMIT_NOFILE "):
			refused++
		default:
			t.Fatalf("connection %d: %q %v (a hang or an unclear refusal)\n%s", i, l, err, stderr.String())
		}
	}
	t.Logf("served %d, refused %d", served, refused)
	if served == 0 || refused == 0 || served > 20 {
		t.Fatalf("served %d refused %d: want some of each, at most the free fds served", served, refused)
	}
	for _, c := range conns {
		c.Close()
	}
	// Served again once the burst is gone (the child notices each close).
	deadline := time.Now().Add(30 * time.Second)
	for ok := 0; ok < 5; {
		c, err := net.Dial("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		l, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if l == "OK\n" {
			ok++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("not served again after the burst: %q", l)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stdin.Close()
	exited = true
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), `"suppressed"`) {
		t.Fatalf("no refusal logged:\n%s", stderr.String())
	}
	if n := strings.Count(stderr.String(), "connection refused"); n > 5 {
		t.Fatalf("%d refusal lines: not rate-limited", n)
	}
}

// acceptChild serves the socket with an uncapped acceptor under a limit of 16 free fds,
// until stdin closes.
func acceptChild(t *testing.T, path string) {
	ln, err := shm.ListenUnix(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(os.Stderr)
	a := newAcceptor(ln, socketAttach, 1<<20, 1, log, nil,
		func(conn *net.UnixConn, _ uint32) {
			conn.Write([]byte("OK\n"))
			io.Copy(io.Discard, conn)
		},
		func(conn *net.UnixConn, msg string) { conn.Write([]byte("REFUSED " + msg + "\n")) })
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	lim := uint64(len(fds) + 16)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: lim, Max: lim}); err != nil {
		t.Fatal(err)
	}
	a.nofile = lim
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.run()
	}()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	ln.Close()
	a.closeConns()
	<-done
}
