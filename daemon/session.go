package daemon

import (
	"cmp"
	"hash/maphash"
	"net"
	"slices"
	"time"

	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
)

// putEndMemory is how many ended puts a session remembers, so that a PutEnd repeated
// after a lost reply answers the first outcome (the wire contract's retry rule).
const putEndMemory = wire.PutEndMemory

// session is one attached external: its holders and in-flight puts. It lives as long
// as the attach connection.
type session struct {
	id    int64
	token int64
	name  string
	cred  shm.Cred
	conn  *net.UnixConn // the attach connection: closing it ends the session

	// Part of ownerState (under Owner.mu).
	holders map[int64]*holding // external holder id → shared holding
	puts    map[int64]*pendingPut
	pins    map[string]*pin // prefix-lookup pins by key (pins.go)
	pinned  int64           // the bytes of its pins (ownerState.addPinned)
	ended   endedPuts
	closed  bool
	// area is the session's put area under client isolation (nil without): the client
	// writes values there, the owner copies them into the segment. Closed by endSession
	// once copying is 0.
	area    *shm.Segment
	copying int // copies from area in progress (PutWrite, PutEnd)
}

func newSession(id, token int64, name string, cred shm.Cred, conn *net.UnixConn, area *shm.Segment) *session {
	return &session{id: id, token: token, name: name, cred: cred, conn: conn, area: area,
		holders: make(map[int64]*holding), puts: make(map[int64]*pendingPut)}
}

// pendingPut is a put between PutStart and the end of its PutEnd or PutAbort.
type pendingPut struct {
	key    string
	putID  int64
	offset int64
	len    int64
	parent *string // a KV page's parent (PutStartItem.parent); nil for a plain key
	// write is its entry in segmentWrites while the session has it; once pinned (the
	// owner registered with a new master during the put) the new master keeps the range
	// as a pin (id = putID) that must be acked, and the put cannot complete.
	write    *segmentWrite
	pinAcked bool // its pin was acked (ownerState.ackPin)
	// local: the master placed the put on this owner (offset is its replica's range).
	local bool
	// ending is closed when the PutEnd in progress finished (nil: none started); a
	// repeated PutEnd meanwhile waits for it and answers its outcome.
	ending  chan struct{}
	outcome error
	// copyBy: no copy into its range starts after it (Options.PutCopyDeadline after
	// its PutStart was sent): the master may have expired the put and freed the range.
	copyBy time.Time
	// gone: the master that answered its PutStart expired it by then (its in-flight
	// TTL after the call was sent); a put still pending goes (sweepDeadPuts).
	gone time.Time
	// copying counts PutWrite copies into the put's range in progress: its range is
	// not given back (abort, session end) nor published before they finish.
	copying int
	// expired: a PutWrite copy stopped at copyBy, its value part-copied; the PutEnd
	// that waited for it answers UNAVAILABLE instead of publishing.
	expired bool
	// written: the value ranges its PutWrites copied (a repeat copies nothing again).
	written valueRanges
}

// endedPuts remembers the outcome of a session's last putEndMemory ended puts (at
// least two full batches: a lost BatchPutEnd reply is answered again for every item of
// its wave, with room for the session's other calls meanwhile), in a ring of compact
// entries that grows as the session ends puts; a lookup, only for a repeated PutEnd or
// PutWrite, scans it newest first.
type endedPuts struct {
	ring []endedPut
	next int // the oldest entry once the ring is full
}

type endedPut struct {
	putID   int64
	key     uint64 // the key's hash (endedSeed)
	outcome error
}

// endedSeed hashes the keys of ended puts.
var endedSeed = maphash.MakeSeed()

func (e *endedPuts) add(putID int64, key string, outcome error) {
	p := endedPut{putID: putID, key: maphash.String(endedSeed, key), outcome: outcome}
	if len(e.ring) < putEndMemory {
		e.ring = append(e.ring, p)
		return
	}
	e.ring[e.next] = p
	e.next = (e.next + 1) % len(e.ring)
}

func (e *endedPuts) lookup(putID int64, key string) (outcome error, ok bool) {
	h := maphash.String(endedSeed, key)
	for i := range e.ring {
		p := &e.ring[(e.next-1-i+2*len(e.ring))%len(e.ring)]
		if p.putID == putID && p.key == h {
			return p.outcome, true
		}
	}
	return nil, false
}

// pinned reports whether a registration reported p's range as a pin.
func (p *pendingPut) pinned() bool { return p.write != nil && p.write.pinned }

// sortedPuts returns a session's puts in put id order.
func sortedPuts(m map[int64]*pendingPut) []*pendingPut {
	out := make([]*pendingPut, 0, len(m))
	for _, p := range m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *pendingPut) int { return cmp.Compare(a.putID, b.putID) })
	return out
}

// sessionLive reports whether client id names an attached session (the RPC server
// closes idle connections of dead sessions).
func (o *Owner) sessionLive(id int64) bool {
	st := o.lock()
	defer o.unlock()
	return st.live(id)
}

// sweepIdle acks idle hot-set holdings whose grace ran out (all of them with force).
func (o *Owner) sweepIdle(force bool) {
	st := o.lock()
	defer o.unlock()
	st.sweepIdle(time.Now(), force)
}

// pinTick bounds how late a prefix-lookup pin ends after its time is up.
const pinTick = 50 * time.Millisecond

// idleTick is how often idleLoop sweeps: half the cache grace, between 1 ms and pinTick
// (a grace off, negative, sweeps at pinTick: pins alone need no finer tick).
func idleTick(grace time.Duration) time.Duration {
	if grace <= 0 {
		return pinTick
	}
	return min(max(grace/2, time.Millisecond), pinTick)
}

// deadPutSweep is how often idleLoop looks for puts past their master's TTL.
const deadPutSweep = time.Second

// idleLoop ends hot-set grace periods and prefix-lookup pins, and drops the puts that
// outlived their master's TTL.
func (o *Owner) idleLoop(stop <-chan struct{}) {
	defer o.wg.Done()
	t := time.NewTicker(idleTick(o.opts.CacheGrace))
	defer t.Stop()
	swept := time.Now()
	for {
		select {
		case <-stop:
			o.sweepIdle(true)
			return
		case now := <-t.C:
			o.sweepIdle(false)
			if now.Sub(swept) >= deadPutSweep {
				swept = now
				st := o.lock()
				st.sweepDeadPuts(now, o.bounds().putCopy)
				o.unlock()
			}
		}
	}
}

// sweepDeadPuts takes out of their sessions the puts whose master expired them by now
// (pendingPut.gone) and that no copy or PutEnd is working on: a client that started a
// put and never ended it. Its range may hold another key since: a registration must
// not report it as a pin (a new master would keep the range from the pool, or refuse
// the replica living there), and the session must not keep it forever. A later PutEnd
// answers UNAVAILABLE; a pin a registration made of it is acked. putCopy names the copy
// deadline in that answer.
func (st *ownerState) sweepDeadPuts(now time.Time, putCopy time.Duration) {
	for _, c := range st.sessions {
		for id, p := range c.puts {
			if p.ending != nil || p.copying > 0 || !now.After(p.gone) {
				continue
			}
			delete(c.puts, id)
			st.writes.remove(p.write)
			c.ended.add(p.putID, p.key, errPutExpired(p, putCopy))
			st.ackPin(p)
		}
	}
}

// endSession releases everything a client held: revokes its in-flight puts and drops
// its holders. Called when the attach connection closes and at shutdown.
func (o *Owner) endSession(c *session, why string) {
	st := o.lock()
	puts, nh, ok := st.endSession(c, time.Now())
	if !ok {
		o.unlock()
		return
	}
	for c.copying > 0 { // copies into its puts' ranges, from its area
		o.copied.Wait()
	}
	// Registered until no copy runs: a registration meanwhile pins their ranges, else a
	// new master could hand one to another value while a copy still wrote it.
	st.unregisterPuts(puts)
	o.unlock()
	c.conn.Close() // wakes serveAttach when the owner ends the session (shutdown)
	o.abandonPuts(puts)
	o.closePutArea(c)
	o.log.Info().Int64("client", c.id).Str("name", c.name).Int32("pid", c.cred.Pid).
		Int("holders", nh).Int("puts", len(puts)).Str("why", why).Msg("session ended")
}
