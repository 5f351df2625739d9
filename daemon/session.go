package daemon

import (
	"net"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
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

	// Protected by Owner.mu.
	holders map[int64]*holding // external holder id → shared holding
	puts    map[int64]*pendingPut
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
	// pinned: the master restarted during the put; the new master keeps the range as a
	// pin (id = putID) that must be acked, and the put cannot complete.
	pinned bool
	// local: the master placed the put on this owner (offset is its replica's range).
	local bool
	// ending is closed when the PutEnd in progress finished (nil: none started); a
	// repeated PutEnd meanwhile waits for it and answers its outcome.
	ending  chan struct{}
	outcome error
	// copying counts PutWrite copies into the put's range in progress: its range is
	// not given back (abort, session end) nor published before they finish.
	copying int
}

// endedPuts remembers the outcome of a session's last putEndMemory ended puts.
type endedPuts struct {
	order []int64 // oldest first
	byID  map[int64]endedPut
}

type endedPut struct {
	key     string
	outcome error
}

func (e *endedPuts) add(putID int64, key string, outcome error) {
	if e.byID == nil {
		e.byID = make(map[int64]endedPut, putEndMemory)
	}
	if len(e.order) == putEndMemory {
		delete(e.byID, e.order[0])
		e.order = e.order[1:]
	}
	e.order = append(e.order, putID)
	e.byID[putID] = endedPut{key: key, outcome: outcome}
}

func (e *endedPuts) lookup(putID int64, key string) (outcome error, ok bool) {
	p, ok := e.byID[putID]
	if !ok || p.key != key {
		return nil, false
	}
	return p.outcome, true
}

// sessionLocked checks a request's session: known client, matching token, current
// generation.
func (o *Owner) sessionLocked(s *external.Session) (*session, error) {
	if s == nil || (s.ClientId == 0 && s.OwnerGeneration == 0) {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "missing session: attach first")
	}
	if s.OwnerGeneration != o.generation {
		return nil, errCode(common.ErrorCode_STALE_GENERATION, "owner generation %d is not %d: the owner restarted, attach again", s.OwnerGeneration, o.generation)
	}
	c := o.sessions[s.ClientId]
	if c == nil || c.token != s.SessionToken || c.closed {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown client %d or wrong session token: attach first", s.ClientId)
	}
	return c, nil
}

// sessionLive reports whether client id names an attached session (the RPC server
// closes idle connections of dead sessions).
func (o *Owner) sessionLive(id int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := o.sessions[id]
	return c != nil && !c.closed
}

// newHolderLocked gives the session a new external holder on h (reviving it if it was
// idle in the cache).
func (o *Owner) newHolderLocked(c *session, h *holding) int64 {
	o.nextID++
	o.cache.ref(h)
	c.holders[o.nextID] = h
	return o.nextID
}

// releaseLocked drops one external holder. The last reference to a cached holding
// leaves it idle in the cache for CacheGrace (a get meanwhile revives it without a
// master trip); an uncached one is acked to the master at once.
func (o *Owner) releaseLocked(c *session, id int64) bool {
	h := c.holders[id]
	if h == nil {
		return false
	}
	delete(c.holders, id)
	o.ackLocked(o.cache.unref(h, time.Now())...)
	return true
}

// ackLocked queues master holder ids for BatchDeleteAck (0 = nothing).
func (o *Owner) ackLocked(ids ...int64) {
	for _, id := range ids {
		if id != 0 {
			o.acks.add(id)
		}
	}
}

// sweepIdle acks idle cached holdings whose grace ran out (all of them with force).
func (o *Owner) sweepIdle(force bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ackLocked(o.cache.sweep(time.Now(), force)...)
}

// idleLoop ends cache grace periods.
func (o *Owner) idleLoop(stop <-chan struct{}) {
	defer o.wg.Done()
	t := time.NewTicker(max(o.opts.CacheGrace/2, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-stop:
			o.sweepIdle(true)
			return
		case <-t.C:
			o.sweepIdle(false)
		}
	}
}

// invalidateLocked declares every version of key up to upTo dead on this owner
// (math.MaxInt64: any version): its cached info is dropped (live holders keep their
// bytes) and so are its SSD entries.
func (o *Owner) invalidateLocked(key string, upTo int64) {
	o.ackLocked(o.cache.invalidate(key, upTo))
	o.replicas.drop(key, upTo)
	if o.store != nil && upTo > 0 {
		o.store.Forget(key, upTo)
	}
}

// endSession releases everything a client held: revokes its in-flight puts and drops
// its holders. Called when the attach connection closes and at shutdown.
func (o *Owner) endSession(c *session, why string) {
	o.mu.Lock()
	if c.closed {
		o.mu.Unlock()
		return
	}
	c.closed = true
	delete(o.sessions, c.id)
	nh := len(c.holders)
	for id := range c.holders {
		o.releaseLocked(c, id)
	}
	var puts []*pendingPut
	for _, p := range c.puts {
		if p.ending == nil { // a PutEnd in progress finishes (or revokes) by itself
			puts = append(puts, p)
		}
	}
	c.puts = nil
	for c.copying > 0 { // copies into its puts' ranges, from its area
		o.copied.Wait()
	}
	o.mu.Unlock()
	c.conn.Close() // wakes serveAttach when the owner ends the session (shutdown)
	for _, p := range puts {
		o.abandonPut(p)
	}
	o.closePutArea(c)
	o.log.Info().Int64("client", c.id).Str("name", c.name).Int32("pid", c.cred.Pid).
		Int("holders", nh).Int("puts", len(puts)).Str("why", why).Msg("session ended")
}
