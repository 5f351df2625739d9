package daemon_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

// shareHelper is the other uid's side of TestUIDShare (FLUXKV_TEST_ISO=share): it
// attaches up to FLUXKV_TEST_LEN times and opens as many RPC connections, printing one
// line for each ("attach N: ok" or the refusal, "rpc N: ok" when a call is answered,
// "rpc N: closed" when the owner closed it unanswered), then "ready", and holds every
// connection until its stdin closes.
func shareHelper() int {
	socket := os.Getenv("FLUXKV_TEST_SOCKET")
	n, _ := strconv.Atoi(os.Getenv("FLUXKV_TEST_LEN"))
	var held []io.Closer
	for i := 1; i <= n; i++ {
		conn, _, _, err := rawAttach(socket)
		if err != nil {
			fmt.Printf("attach %d: %v\n", i, err)
			continue
		}
		held = append(held, conn)
		fmt.Printf("attach %d: ok\n", i)
	}
	for i := 1; i <= n; i++ {
		conn, answered, err := unknownCall(wire.RPCSocketPath(socket))
		switch {
		case err != nil:
			fmt.Printf("rpc %d: %v\n", i, err)
		case answered:
			held = append(held, conn)
			fmt.Printf("rpc %d: ok\n", i)
		default:
			fmt.Printf("rpc %d: closed\n", i)
		}
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range held {
		c.Close()
	}
	return 0
}

// unknownCall connects to the RPC socket and calls a method the owner does not have:
// an admitted connection is answered (a TApplicationException) and stays open; one
// over a cap is closed unanswered.
func unknownCall(path string) (net.Conn, bool, error) {
	conn, err := net.DialTimeout("unix", path, 10*time.Second)
	if err != nil {
		return nil, false, err
	}
	const method = "NoSuchMethod"
	msg := binary.BigEndian.AppendUint32(nil, 0x80010001) // strict binary, CALL
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(method)))
	msg = append(msg, method...)
	msg = binary.BigEndian.AppendUint32(msg, 1) // seq
	msg = append(msg, 0)                        // empty args: field stop
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(msg)))
	if _, err := conn.Write(append(frame, msg...)); err != nil {
		conn.Close()
		return nil, false, nil // closed before the write: refused
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		conn.Close()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return nil, false, nil
		}
		return nil, false, err
	}
	if _, err := io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint32(hdr[:]))); err != nil {
		conn.Close()
		return nil, false, err
	}
	conn.SetReadDeadline(time.Time{})
	return conn, true, nil
}

// shareClient runs shareHelper as uid 65534 (in the socket's group) and returns its
// lines up to "ready"; the helper holds its connections until the test ends.
func shareClient(t *testing.T, exe, socket string, n int) []string {
	t.Helper()
	cmd := otherUIDCmd(t, exe, socket, "share", "FLUXKV_TEST_LEN="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	var lines []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if sc.Text() == "ready" {
			return lines
		}
		lines = append(lines, sc.Text())
	}
	t.Fatalf("helper as uid 65534 ended before it was ready: %v\n%s", sc.Err(), strings.Join(lines, "\n"))
	return nil
}

// TestUIDShare: the clients of a uid other than the owner's and root take at most
// --uid-share (here 0.5) of each socket's connection cap and of --put-area-total, and while
// that uid holds its share, root's clients still attach up to the socket's cap.
func TestUIDShare(t *testing.T) {
	t.Parallel()
	exe := otherUIDExe(t)

	t.Run("connections", func(t *testing.T) {
		p := startUp(t, "16MiB", "--max-connections", "8", "--uid-share", "0.5")
		reachable(t, p.socket)
		lines := shareClient(t, exe, p.socket, 6)
		t.Logf("uid 65534:\n%s", strings.Join(lines, "\n"))
		want := []string{"attach 1: ok", "attach 2: ok", "attach 3: ok", "attach 4: ok",
			"attach 5: attach reply UNAVAILABLE (uid 65534 holds 4 connections, its share of this socket's cap 8 (--uid-share 0.5))",
			"rpc 1: ok", "rpc 2: ok", "rpc 3: ok", "rpc 4: ok", "rpc 5: closed", "rpc 6: closed"}
		for _, w := range want {
			if !containsLine(lines, w) {
				t.Errorf("uid 65534 lacks %q", w)
			}
		}
		// Root is not bounded: the socket's other four slots are its (one attach
		// connection each), and the cap still ends them.
		for i := 1; i <= 5; i++ {
			conn, _, _, err := rawAttach(p.socket)
			if i <= 4 {
				if err != nil {
					t.Fatalf("root's attach %d: %v", i, err)
				}
				t.Cleanup(func() { conn.Close() })
				continue
			}
			if err == nil || !strings.Contains(err.Error(), "connection cap 8 reached") {
				conn.Close()
				t.Fatalf("root's attach %d past the cap: %v, want the cap's refusal", i, err)
			}
		}
	})

	t.Run("put areas", func(t *testing.T) {
		p := startUp(t, "16MiB", "--client-isolation", "--put-area", "1MiB", "--put-area-total", "4MiB", "--uid-share", "0.5")
		reachable(t, p.socket)
		lines := shareClient(t, exe, p.socket, 3)
		t.Logf("uid 65534:\n%s", strings.Join(lines, "\n"))
		for _, w := range []string{"attach 1: ok", "attach 2: ok",
			"attach 3: attach reply NO_SPACE (the put areas of uid 65534's sessions use 2097152 of the 2097152 bytes its share allows"} {
			if !containsLine(lines, w) {
				t.Errorf("uid 65534 lacks %q", w)
			}
		}
		// The other half of the total is left for root's sessions.
		for i := 1; i <= 3; i++ {
			conn, _, _, err := rawAttach(p.socket)
			if i <= 2 {
				if err != nil {
					t.Fatalf("root's attach %d: %v", i, err)
				}
				t.Cleanup(func() { conn.Close() })
				continue
			}
			if err == nil || !strings.Contains(err.Error(), "--put-area-total allows") {
				conn.Close()
				t.Fatalf("root's attach %d past the total: %v, want the total's refusal", i, err)
			}
		}
	})
}

// containsLine reports a line that starts with prefix.
func containsLine(lines []string, prefix string) bool {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}
