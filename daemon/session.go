package daemon

import (
	"net"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/shm"
)

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
	closed  bool
}

// pendingPut is a put between PutStart and PutEnd/PutAbort.
type pendingPut struct {
	key    string
	putID  int64
	offset int64
	len    int64
	// pinned: the master restarted during the put; the new master keeps the range as a
	// pin (id = putID) that must be acked, and the put cannot complete.
	pinned bool
}

// holding is one master holder, shared by every external holder of the same key
// version on this owner (the owner's "cached info").
type holding struct {
	key      string
	putID    int64
	offset   int64
	len      int64
	source   common.Source
	masterID int64
	refs     int       // external holders referring to it
	idle     time.Time // when refs dropped to 0 while cached (zero: in use)
	// replica: the holding views the key's memory replica itself (local reuse or a
	// promoted refill), so keeping it cached after release costs no extra memory. A
	// temporary refill target is released at once instead: its space serves the next
	// refill rather than pushing a replica out.
	replica bool
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

// newHolderLocked gives the session a new external holder on h (reviving it if it was
// idle in the cache).
func (o *Owner) newHolderLocked(c *session, h *holding) int64 {
	o.nextID++
	if h.refs == 0 {
		delete(o.idle, h)
		h.idle = time.Time{}
	}
	h.refs++
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
	o.unrefLocked(h)
	return true
}

func (o *Owner) unrefLocked(h *holding) {
	h.refs--
	if h.refs > 0 {
		return
	}
	if o.cache[h.key] == h && o.opts.CacheGrace > 0 && h.replica {
		h.idle = time.Now()
		o.idle[h] = struct{}{}
		return
	}
	o.forgetLocked(h)
}

// forgetLocked drops an unreferenced holding from the cache and acks it to the master.
func (o *Owner) forgetLocked(h *holding) {
	if o.cache[h.key] == h {
		delete(o.cache, h.key)
	}
	delete(o.idle, h)
	o.acks.add(h.masterID)
}

// sweepIdle acks idle cached holdings whose grace ran out (all of them with force).
func (o *Owner) sweepIdle(force bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	cutoff := time.Now().Add(-o.opts.CacheGrace)
	for h := range o.idle {
		if force || h.idle.Before(cutoff) {
			o.forgetLocked(h)
		}
	}
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

// dropCachedLocked forgets the cached info of key (any version ≤ putID; 0 = any) so
// the next get asks the master. Live holders keep their bytes.
func (o *Owner) dropCachedLocked(key string, putID int64) {
	o.invalSeq++
	if h := o.cache[key]; h != nil && (putID == 0 || h.putID <= putID) {
		delete(o.cache, key)
		if h.refs == 0 {
			o.forgetLocked(h)
		}
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
	puts := c.puts
	c.puts = nil
	o.mu.Unlock()
	c.conn.Close() // wakes serveAttach when the owner ends the session (shutdown)
	for _, p := range puts {
		o.abandonPut(p)
	}
	o.log.Info().Int64("client", c.id).Str("name", c.name).Int32("pid", c.cred.Pid).
		Int("holders", nh).Int("puts", len(puts)).Str("why", why).Msg("session ended")
}
