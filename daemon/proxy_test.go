package daemon_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tcpProxy forwards connections from its listener to target; bytes from the target
// back to the dialer can be throttled (rate bytes/s; 0 = as fast as they come), so a
// transfer through it takes long enough to kill a process in the middle of it, and
// frozen (nothing moves either way: a network partition, the peer alive behind it). It
// is a fault injector: real owners on both sides, only the pace changed.
type tcpProxy struct {
	ln     net.Listener
	target string
	rate   atomic.Int64
	chunk  atomic.Int64 // the most bytes a throttled read takes (0: 64 KiB): small ones trickle
	frozen atomic.Bool

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(t testing.TB, listen, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *tcpProxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !add {
		delete(p.conns, c)
		return true
	}
	if p.conns == nil {
		return false // closed
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			down.Close()
			continue
		}
		if !p.track(down, true) || !p.track(up, true) {
			down.Close()
			up.Close()
			return
		}
		p.wg.Add(2)
		go p.pipe(down, up, false)
		go p.pipe(up, down, true)
	}
}

// pipe copies src to dst until either side fails, then closes both.
func (p *tcpProxy) pipe(src, dst net.Conn, throttled bool) {
	defer p.wg.Done()
	defer func() {
		src.Close()
		dst.Close()
		p.track(src, false)
		p.track(dst, false)
	}()
	buf := make([]byte, 64<<10)
	for {
		p.waitThawed()
		b := buf
		if c := p.chunk.Load(); throttled && c > 0 && c < int64(len(buf)) {
			b = buf[:c]
		}
		n, err := src.Read(b)
		p.waitThawed()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if r := p.rate.Load(); throttled && r > 0 {
				time.Sleep(time.Duration(n) * time.Second / time.Duration(r))
			}
		}
		if err != nil { // EOF included: the other direction ends with the close
			return
		}
	}
}

func (p *tcpProxy) waitThawed() {
	for p.frozen.Load() {
		time.Sleep(5 * time.Millisecond)
	}
}

func (p *tcpProxy) close() {
	p.frozen.Store(false)
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
