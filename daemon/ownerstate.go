package daemon

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/ssd"
)

// ownerState is the owner's bookkeeping in one place: the attached sessions (their
// holders and in-flight puts), the hot set, the replica index, the registry of ranges
// being written or held in the segment (segmentWrites: what a new master is told of as
// pins), and the registration with the master (its epochs and the hot-set lease).
//
// It is a plain deterministic type, not safe for concurrent use: Owner wraps it once
// (Owner.mu), and every Owner method that runs with that lock held is named ...Locked.
// Time is an argument. It makes no master call and touches neither the network nor
// the disk: what must be sent or done once the lock is released — holder acks, hot-set
// hits to report, SSD entries to forget — collects in fx, which Owner.unlock hands on;
// what decides a master call (the pins of a Register, the puts to revoke, whether to
// report the replica index) is returned to the caller. Scripts in
// testdata/*.txt drive it (TestOwnerScripts).
type ownerState struct {
	nodeID     string
	generation int64
	segSize    int64
	isolation  bool // client isolation: sessions get put areas

	sessions map[int64]*session
	// maxHolders bounds one session's holders (maxSessionHolders): a client that never
	// releases what it gets is refused new ones instead of growing the owner's memory.
	maxHolders int
	nextID     int64 // client ids and external holder ids
	stopping   bool  // Stop began: no new sessions
	areas      putAreaBudget
	// segUsers counts peer calls using the segment (Owner.useSegment); once segClosed
	// none start, and Stop unmaps the segment when the count is 0.
	segUsers  int
	segClosed bool

	hot      *hotSet
	replicas *replicaIndex
	writes   segmentWrites
	reg      registration
	flights  map[string]*flight // gets in progress, one per key (flights.go)
	pins     pinQueue           // prefix-lookup pins by deadline (pins.go)
	pinKeys  map[string][]*pin  // the same pins by key, every session's
	// pinSessions counts the sessions with pins; pinContended is when a session within
	// its share of the pin budget last found no room (pins.go).
	pinSessions  int
	pinContended time.Time
	// writing counts, per key, this owner's puts and deletes out at the master (PutDone,
	// Delete: beginWrite .. endWrite). The master does not invalidate a write's requester
	// (it drops its own records once answered), so from the master's publish or delete to
	// that answer the hot set and replica index may hold a version the master declared
	// dead, while a concurrent write of the key through another owner, ordered after this
	// one, returns (a delete finding no route, a put found already overwritten). Such a
	// key is answered by the master, not from them (cachedGet, knows).
	writing map[string]int

	fx effects
}

// effects is what an ownerState change asks of the world once Owner.mu is released.
type effects struct {
	acks    []int64  // master holder ids to ack (BatchDeleteAck)
	touched []string // keys of gets served from the hot set, for the master's eviction order
	// ssdForget: SSD entries of dead versions (every version of Key up to PutId);
	// ssdForgetRecords: SSD records by number (ssd.Storage.ForgetRecord), not a
	// rewrite of their version since.
	ssdForget        []*common.KeyVersion
	ssdForgetRecords []ssd.Eviction
}

// stateOptions are the settings ownerState needs.
type stateOptions struct {
	nodeID     string
	generation int64
	segSize    int64
	isolation  bool
	grace      time.Duration // hot-set grace period
	hotBudget  int64         // hot-set bytes
	pinBudget  int64         // prefix-lookup pin bytes (0: hotBudget)
	putArea    int64         // per-session put area
	areaTotal  int64         // all put areas
	uidShare   float64       // Options.UIDShare
	maxHolders int           // one session's holders (0: maxSessionHolders)
}

// maxSessionHolders is how many holders one session may keep at once, what a get past it
// answers NO_SPACE for: far more than an engine holds (its pages being loaded), far
// fewer than would exhaust the owner's memory (a holder costs about a hundred bytes).
const maxSessionHolders = 1 << 20

func newOwnerState(o stateOptions) ownerState {
	return ownerState{
		nodeID: o.nodeID, generation: o.generation, segSize: o.segSize, isolation: o.isolation,
		sessions: make(map[int64]*session), maxHolders: cmp.Or(o.maxHolders, maxSessionHolders),
		areas:    newPutAreaBudget(o.putArea, o.areaTotal, o.uidShare),
		hot:      newHotSet(o.grace, o.hotBudget, o.pinBudget),
		replicas: newReplicaIndex(),
		reg:      registration{period: time.Second},
	}
}

// takeEffects returns and clears the effects collected so far.
func (st *ownerState) takeEffects() effects {
	fx := st.fx
	st.fx = effects{}
	return fx
}

// ack queues master holder ids to ack (0 = nothing).
func (st *ownerState) ack(ids ...int64) {
	for _, id := range ids {
		if id != 0 {
			st.fx.acks = append(st.fx.acks, id)
		}
	}
}

// session checks a request's session: known client, matching token, current generation.
func (st *ownerState) session(s *external.Session) (*session, error) {
	if s == nil || (s.ClientId == 0 && s.OwnerGeneration == 0) {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "missing session: attach first")
	}
	if s.OwnerGeneration != st.generation {
		return nil, errCode(common.ErrorCode_STALE_GENERATION, "owner generation %d is not %d: the owner restarted, attach again", s.OwnerGeneration, st.generation)
	}
	c := st.sessions[s.ClientId]
	if c == nil || c.token != s.SessionToken || c.closed {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown client %d or wrong session token: attach first", s.ClientId)
	}
	return c, nil
}

// live reports whether client id names an attached session.
func (st *ownerState) live(id int64) bool {
	c := st.sessions[id]
	return c != nil && !c.closed
}

// reserveSession takes the next client id and, under client isolation, the size of
// its put area (0 without) for a client of uid; a refusal is UNAVAILABLE (stopping) or
// NO_SPACE.
func (st *ownerState) reserveSession(uid uint32) (id, areaSize int64, err error) {
	if st.stopping {
		return 0, 0, errCode(common.ErrorCode_UNAVAILABLE, "owner shutting down")
	}
	st.nextID++
	if st.isolation {
		if areaSize, err = st.areas.reserve(uid); err != nil {
			return 0, 0, err
		}
	}
	return st.nextID, areaSize, nil
}

// newHolder gives session c a new external holder on h (reviving h if it was idle in
// the hot set).
func (st *ownerState) newHolder(c *session, h *holding) int64 {
	st.nextID++
	st.refHolding(h)
	c.holders[st.nextID] = h
	return st.nextID
}

// refHolding takes a reference to h: its range is read from (segmentWrites: a
// registration pins it) until the last reference goes (unrefHolding).
func (st *ownerState) refHolding(h *holding) {
	if h.refs == 0 {
		h.write = st.writes.add(writeHolder, h.masterID, h.offset, h.len)
	}
	st.hot.ref(h)
}

// unrefHolding drops a reference to h at now: the last one leaves a hot-set holding
// idle there for the grace period; any other is acked to the master.
func (st *ownerState) unrefHolding(h *holding, now time.Time) {
	acks := st.hot.unref(h, now)
	if h.refs == 0 {
		st.writes.remove(h.write)
		h.write = nil
	}
	st.ack(acks...)
}

// release drops one external holder of c at now. The last reference to a hot-set
// holding leaves it idle there for the grace period (a get meanwhile revives it
// without a master trip); any other is acked to the master at once.
func (st *ownerState) release(c *session, id int64, now time.Time) bool {
	h := c.holders[id]
	if h == nil {
		return false
	}
	delete(c.holders, id)
	st.unrefHolding(h, now)
	return true
}

// invalidate declares every version of key up to upTo dead on this owner
// (math.MaxInt64: any version): it leaves the hot set (live holders keep their
// bytes), the replica index, and the SSD ring.
func (st *ownerState) invalidate(key string, upTo int64) {
	st.ack(st.hot.invalidate(key, upTo))
	st.unpinDead(key, upTo)
	st.replicas.drop(key, upTo)
	if upTo > 0 {
		st.fx.ssdForget = append(st.fx.ssdForget, &common.KeyVersion{Key: key, PutId: upTo})
	}
}

// beginWrite marks key as written through this owner until endWrite (writing).
func (st *ownerState) beginWrite(key string) {
	if st.writing == nil {
		st.writing = make(map[string]int)
	}
	st.writing[key]++
}

// endWrite ends a beginWrite of key, once the master answered and this owner dropped
// what the write declared dead.
func (st *ownerState) endWrite(key string) {
	if st.writing[key] <= 1 {
		delete(st.writing, key)
		return
	}
	st.writing[key]--
}

// sweepIdle acks idle hot-set holdings whose grace ran out by now (all with force).
func (st *ownerState) sweepIdle(now time.Time, force bool) {
	st.expirePins(now)
	st.ack(st.hot.sweep(now, force)...)
}

// releaseHotSet lets go of idle hot-set holdings (ReleaseHotSet: the master needs the
// space): with keys, those of keys only; without, least recently released first until at
// least bytes are released (bytes ≤ 0: all of them). It returns how many and their bytes.
func (st *ownerState) releaseHotSet(keys []string, bytes int64) (n int, released int64) {
	var acks []int64
	if len(keys) > 0 {
		acks, released = st.hot.releaseKeys(keys)
	} else {
		acks, released = st.hot.release(bytes)
	}
	st.ack(acks...)
	return len(acks), released
}

// unregisterPuts takes the ranges of puts out of segmentWrites: a registration from
// then on does not report them as pins.
func (st *ownerState) unregisterPuts(puts []*pendingPut) {
	for _, p := range puts {
		st.writes.remove(p.write)
	}
}

// endSession closes c: its holders are released and its puts leave it. It returns
// the puts to abandon (a PutEnd in progress finishes or revokes by itself), whose
// ranges the caller unregisters (unregisterPuts) once no copy into them runs, and the
// number of holders it had; ok is false when c was already closed.
func (st *ownerState) endSession(c *session, now time.Time) (abandon []*pendingPut, holders int, ok bool) {
	if c.closed {
		return nil, 0, false
	}
	c.closed = true
	delete(st.sessions, c.id)
	st.dropPins(c)
	holders = len(c.holders)
	ids := make([]int64, 0, len(c.holders))
	for id := range c.holders {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		st.release(c, id, now)
	}
	for _, p := range sortedPuts(c.puts) {
		if p.ending == nil {
			abandon = append(abandon, p)
		}
		// An ending put's PutEnd still copies into or publishes its range: its entry
		// stays (a registration meanwhile reports the range as a pin) until endPut.
	}
	c.puts = nil
	return abandon, holders, true
}

// cachedGet answers a get of key from the hot set at now, under the lease: an owner
// cut off from the master may hold a version another owner's delete has since killed.
// Only a holding of the key's replica here answers (the master invalidates a replica's
// owner before an overwrite or delete elsewhere returns), or the holding c's own
// prefix lookup pinned for it: any other (a pull or refill the master did not promote)
// is invalidated only in the background, so a get after an overwrite returned could
// read the old version from it. None answers while a write of key through this owner
// is out at the master (writing). share, when set, is a holding the get may take even
// so (its flight's leader's, answered by a master call sent after the get began:
// flights.go) while it is the hot set's. A miss (nil resp) returns the invalidation
// sequence to install the master's answer with.
func (st *ownerState) cachedGet(c *session, key string, now time.Time, share *holding) (resp *external.GetResponse, seq uint64, err error) {
	if c.closed { // the session ended while this call waited: nobody would release a holder
		return nil, 0, errSessionClosed()
	}
	if err := st.holderRoom(c); err != nil {
		return nil, 0, err
	}
	if h := st.hot.lookup(key); h != nil && (h.replica || h == share || c.pinsHolding(key, h)) && st.writing[key] == 0 && st.leased(now) {
		id := st.newHolder(c, h)
		if h.replica {
			st.fx.touched = append(st.fx.touched, key)
		}
		// This get moved nothing: the bytes are already here, in memory (the session's
		// pin of the key may have brought them in for it: then it reports what the
		// pin's get did). A get that waited for its flight's leader (share) reports
		// the leader's source: its bytes were not in memory when it began (an SSD
		// refill it waited for is its SSD hit).
		resp = holderResponse(id, h)
		if h != share {
			resp.Source = common.Source_MEMORY
		}
		resp.Remote = false
		st.takeOverPin(c, key, h, resp, true, now)
		return resp, 0, nil
	}
	return nil, st.hot.invalSeq(), nil
}

// getNotFound: the master has no version of key. A get planned before this miss must
// not install one afterwards (its install sees the sequence moved).
func (st *ownerState) getNotFound(key string) {
	st.ack(st.hot.invalidate(key, math.MaxInt64))
}

// finishGet hands the holding h of a planned get (target t) to session c: the target
// leaves segmentWrites and becomes the session's holder, which register pins like any
// other. A plan of an earlier registration never reaches the client. seq is what
// cachedGet returned.
func (st *ownerState) finishGet(c *session, t *getTarget, h *holding, seq uint64, now time.Time) (*external.GetResponse, error) {
	if st.endGet(t) {
		st.ack(h.masterID)
		return nil, errGetMasterChanged()
	}
	if c.closed {
		st.ack(h.masterID)
		return nil, errSessionClosed()
	}
	if err := st.holderRoom(c); err != nil { // the keys of a batch, or of calls at once, passed cachedGet together
		st.ack(h.masterID)
		return nil, err
	}
	h, acks := st.hot.install(h, seq)
	st.ack(acks...)
	id := st.newHolder(c, h)
	resp := holderResponse(id, h)
	st.takeOverPin(c, h.key, h, resp, resp.Source == common.Source_MEMORY && !resp.Remote, now)
	return resp, nil
}

// learnReplica records h in the replica index when it views the key's memory replica
// in this segment (a local hit, or a promoted target); mark and own as for
// replicaIndex.learn.
func (st *ownerState) learnReplica(h *holding, mark, own uint64) {
	if h.replica {
		// Numbered as the heartbeats' notices are applied: by the registration whose
		// master numbers them (a registration whose answer was lost moved reg.epoch only).
		st.replicas.learn(replicaRecord{key: h.key, putID: h.putID, offset: h.offset, len: h.len,
			notices: noticeBound{reg: st.reg.acked.reg, seq: h.noticesSeq}}, mark, own)
	}
}

func errSessionClosed() error { return errCode(common.ErrorCode_UNAVAILABLE, "session closed") }

// holderRoom refuses a new holder of session c past maxHolders (NO_SPACE).
func (st *ownerState) holderRoom(c *session) error {
	if len(c.holders) < st.maxHolders {
		return nil
	}
	return holderCapError{errCode(common.ErrorCode_NO_SPACE,
		"this session keeps %d holders, the most one session may: release some before getting more", len(c.holders))}
}

// holderCapError is a session's NO_SPACE at its holder cap: its own state, never the
// answer of a flight to the other sessions' gets that follow it (endFlight).
type holderCapError struct{ err error }

func (e holderCapError) Error() string { return e.err.Error() }
func (e holderCapError) Unwrap() error { return e.err }

func holderResponse(id int64, h *holding) *external.GetResponse {
	return &external.GetResponse{HolderId: id, Offset: h.offset, Len: h.len, Source: h.source, PutId: h.putID, Remote: h.remote}
}
