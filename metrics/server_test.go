package metrics

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// get fetches path from srv and returns the status and the body.
func get(t *testing.T, srv *Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + srv.Addr() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// /healthz answers ok whatever the readiness; /readyz follows Options.Ready, with its
// reason on one line while not ready.
func TestHealthAndReadiness(t *testing.T) {
	checkGoroutines(t)
	var notReady atomic.Pointer[error]
	err := errors.New("owner: not registered\nwith a master")
	notReady.Store(&err)
	srv, err2 := Serve("127.0.0.1:0", New(), Options{Ready: func() error {
		if e := notReady.Load(); e != nil {
			return *e
		}
		return nil
	}})
	if err2 != nil {
		t.Fatal(err2)
	}
	t.Cleanup(func() { srv.Close() })

	if code, body := get(t, srv, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q, want 200 \"ok\\n\"", code, body)
	}
	code, body := get(t, srv, "/readyz")
	if code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while not ready = %d, want 503", code)
	}
	if want := "not ready: owner: not registered with a master\n"; body != want {
		t.Errorf("/readyz body %q, want %q (one line)", body, want)
	}
	notReady.Store(nil)
	if code, body := get(t, srv, "/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz when ready = %d %q, want 200 \"ok\\n\"", code, body)
	}
	if code, _ := get(t, srv, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
}

// Without a Ready function the server is ready as soon as it serves.
func TestReadyWithoutCheck(t *testing.T) {
	srv := serve(t, New())
	if code, body := get(t, srv, "/readyz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz = %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, srv, "/"); code != http.StatusOK || !strings.Contains(body, "/readyz") {
		t.Errorf("/ = %d %q, want the index naming the endpoints", code, body)
	}
}

// A client that declares a request body and never sends it loses its connection after
// ReadTimeout, as one that stops in its headers does after theirs: it holds no
// connection and goroutine of the server for good.
func TestStalledRequestClosed(t *testing.T) {
	checkGoroutines(t)
	srv, err := Serve("127.0.0.1:0", New(), Options{ReadTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	// The answer may come (the handler does not read the body); then the server, which
	// must read the body before the next request, closes the connection at ReadTimeout.
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the stalled connection was not closed by the server: %v", err)
	}
}
