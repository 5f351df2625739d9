package auth

import (
	"net"
	"testing"
	"time"
)

// IsActive must see a connection the server closed while it idled in the pool even
// when the read deadline of its last call (Kitex's RPC timeout, or a bound call's
// bound) has passed: the peek must not be refused by that stale deadline. And a
// connection of a dialer that was cut is not active.
func TestIsActiveAfterReadDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    *Dialer
	}{
		{"plain", NewDialer(nil, PurposePeer)},
		{"bound", NewDialer(nil, PurposePeer).BoundCalls(50 * time.Millisecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err == nil {
					accepted <- c
				}
			}()
			conn, err := tc.d.DialTimeout("tcp", ln.Addr().String(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			srv := <-accepted
			cc := conn.(*clientConn)
			// The last call's read deadline, now past.
			cc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			time.Sleep(150 * time.Millisecond)
			if !cc.IsActive() {
				t.Fatal("an idle connection the server keeps open is not active")
			}
			srv.Close()
			time.Sleep(100 * time.Millisecond)
			if cc.IsActive() {
				t.Fatal("a connection the server closed is active once its read deadline passed")
			}
		})
	}
	t.Run("cut", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err == nil {
				defer c.Close()
				time.Sleep(time.Second)
			}
		}()
		d := NewDialer(nil, PurposePeer).BoundCalls(time.Minute)
		conn, err := d.DialTimeout("tcp", ln.Addr().String(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		d.Cut()
		if conn.(*clientConn).IsActive() {
			t.Fatal("a connection of a cut dialer is active")
		}
	})
}
