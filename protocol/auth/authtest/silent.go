package authtest

import (
	"net"
	"sync"
	"testing"
)

// Silent makes ln a server that hangs: it accepts every connection and never reads or
// answers (a peer that is up but stuck). ln and the connections it took are closed when
// the test ends.
func Silent(t testing.TB, ln net.Listener) {
	t.Helper()
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
}
