package ssd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"
)

// Storage is the owner's KV SSD cache (the seed's KvSsdStorage): de-duplicated
// device roots, each with shard files, a writer and a reader queue and an io engine;
// one ring per shard and an index key → latest entry. It is safe for concurrent use.
type Storage struct {
	opts    Options
	log     zerolog.Logger
	kind    string // engine kind in use
	devices []*device
	rr      atomic.Uint64 // round-robin device choice

	mu      sync.Mutex        // protects index, every shard's ring, entries' state, device.nextShard, spaceCh, closed
	index   map[string]*entry // key → its latest entry (writing or committed)
	spaceCh chan struct{}     // closed when a busy entry stops being busy; nil when nobody waits
	closed  bool

	closing chan struct{} // closed when Close begins
	ops     sync.WaitGroup

	bufBudget    *semaphore.Weighted // persistBufferBudget (persistbudget.go)
	budgetCtx    context.Context     // cancelled when Close begins
	budgetCancel context.CancelFunc

	evq       chan []Eviction // to the batcher, one allocation's together; full → dropped and counted
	evOut     chan []Eviction // batches for the owner
	evStop    chan struct{}
	evDone    chan struct{}
	evDropped atomic.Uint64
	records   int64 // records reserved (under mu): each one's entry.seq

	directReads, scratchReads atomic.Uint64 // chunks read each way (tests, stats)
	corruptReads              atomic.Uint64 // loads that failed verification (ErrCorrupt)
}

var uringFallbackLog sync.Once

// Open creates the cache roots and shard files (truncating what a previous run left:
// the SSD cache is runtime only) and starts one io engine per device.
func Open(opts Options) (_ *Storage, err error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	s := &Storage{
		opts:    opts,
		log:     opts.Logger.With().Str("component", "ssd").Logger(),
		index:   make(map[string]*entry),
		closing: make(chan struct{}),
		evq:     make(chan []Eviction, 32*opts.EvictionBatch),
		evOut:   make(chan []Eviction, 64),
		evStop:  make(chan struct{}),
		evDone:  make(chan struct{}),
	}
	s.bufBudget = newPersistBudget()
	s.budgetCtx, s.budgetCancel = context.WithCancel(context.Background())
	switch opts.Engine {
	case EnginePsync:
		s.kind = EnginePsync
	case EngineUring:
		if err := UringAvailable(); err != nil {
			return nil, fmt.Errorf("ssd: io_uring requested but unavailable: %w", err)
		}
		s.kind = EngineUring
	default:
		s.kind = EngineUring
		if err := UringAvailable(); err != nil {
			s.kind = EnginePsync
			uringFallbackLog.Do(func() {
				s.log.Warn().Err(err).Msg("ssd: io_uring unavailable, using the pread/pwrite engine")
			})
		}
	}
	defer func() {
		if err != nil {
			for _, d := range s.devices {
				d.close()
			}
		}
	}()
	seen := make(map[uint64]string)
	for i, p := range opts.Paths {
		root := cacheRoot(&opts, p)
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, fmt.Errorf("ssd: large_file_paths[%d] %s: create %s: %w", i, p, root, err)
		}
		dev, err := opts.devOf(root)
		if err != nil {
			return nil, fmt.Errorf("ssd: large_file_paths[%d] %s: %w", i, p, err)
		}
		if first, dup := seen[dev]; dup {
			s.log.Warn().Str("root", root).Str("kept", first).Int64("limit_ignored", opts.Limits[i]).
				Msg("ssd: root shares a device with an earlier root; skipped, its limit ignored (first wins: give one path per device)")
			continue
		}
		seen[dev] = root
		d, err := openDevice(&s.opts, len(s.devices), root, dev, opts.Limits[i], s.kind)
		if err != nil {
			return nil, fmt.Errorf("ssd: large_file_paths[%d] %s: %w", i, p, err)
		}
		s.devices = append(s.devices, d)
		s.log.Info().Str("root", root).Uint64("dev", dev).Int("shards", len(d.shards)).
			Int64("shard_bytes", d.shardSize).Str("engine", d.kind).Msg("ssd: device opened")
	}
	s.kind = s.devices[0].kind
	go s.batchEvictions()
	return s, nil
}

// Engine is the io engine kind in use (EngineUring or EnginePsync); a device whose
// io_uring setup failed under EngineAuto says so in Stats.
func (s *Storage) Engine() string { return s.kind }

// RecordSpan bounds the ring bytes of the record of a value of n bytes under key: its
// header, its value and the padding to the next block, on the device that pads most.
func (s *Storage) RecordSpan(key string, n int64) int64 {
	var most int64
	for _, d := range s.devices {
		most = max(most, d.span(headerSize(len(key))+AlignedLen(n)))
	}
	return most
}

// MaxValueBytes is the largest value the largest ring holds under any key (a record
// lives in one ring: its header, the longest key's, and the value, block-aligned).
func (s *Storage) MaxValueBytes() int64 {
	var most int64
	for _, d := range s.devices {
		most = max(most, alignDown(d.shardSize-headerSize(MaxRecordKey)))
	}
	return most
}

// RingBytes is the size of the smallest ring (shard file): entries pinned for their
// commit (CommitPin) beyond it would block the persists that must overwrite them.
func (s *Storage) RingBytes() int64 {
	var least int64
	for _, d := range s.devices {
		if least == 0 || d.shardSize < least {
			least = d.shardSize
		}
	}
	return least
}

// enter registers an operation; it reports false once Close began.
func (s *Storage) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.ops.Add(1)
	return true
}

func (s *Storage) leave() { s.ops.Done() }

// pickDevice chooses the next device round-robin among those whose shards can hold
// a record of rec bytes (header and padded value) with its pad to a block.
func (s *Storage) pickDevice(rec int64) (*device, error) {
	n := uint64(len(s.devices))
	start := s.rr.Add(1) - 1
	for i := range n {
		d := s.devices[(start+i)%n]
		if d.span(rec) <= d.shardSize {
			return d, nil
		}
	}
	return nil, ErrTooLarge
}

// CommitPin keeps a freshly persisted entry from being overwritten until the owner's
// BatchSsdReplicaCommit to the master returned. Whoever receives it from Persist must call
// Release exactly once (more calls are no-ops); until then the ring cannot reuse
// the entry's range and writers on that shard may wait.
type CommitPin struct{ p *commitPin }

type commitPin struct {
	s        *Storage
	e        *entry
	released atomic.Bool
}

// Seq is the number of the record this pin was taken on (Entry.Seq); 0 for none.
func (c CommitPin) Seq() int64 {
	if c.p == nil {
		return 0
	}
	return c.p.e.seq // set when the record was reserved, before the pin existed
}

// Forget drops the entry this pin was taken on, and only it: a rewrite of the same key and
// put id since (a newer record, committed apart) stays. The owner calls it when the entry's
// commit failed or went to a master it no longer follows. The pin must still be released.
func (c CommitPin) Forget() {
	if c.p == nil {
		return
	}
	s := c.p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(c.p.e)
}

// Alive reports whether the entry this pin was taken on is still indexed: not forgotten
// (Forget, Storage.Forget of its version) nor replaced by a rewrite.
func (c CommitPin) Alive() bool {
	if c.p == nil {
		return false
	}
	s := c.p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.index[c.p.e.key] == c.p.e
}

// Release lets the ring reuse the entry's range again.
func (c CommitPin) Release() {
	if c.p == nil || !c.p.released.CompareAndSwap(false, true) {
		return
	}
	s := c.p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c.p.e.shard.ring.unpinCommit(c.p.e)
	s.signalLocked()
}

// Persist writes src as the SSD replica of (key, putID): it copies src into a
// zero-padded aligned buffer behind a checksummed record header (record.go; keys of
// at most MaxRecordKey bytes), reserves a contiguous range of whole file system
// blocks on one device (round robin; waiting up to BusyWait while the space is held
// by busy entries), writes it and commits the entry only if every aligned byte was
// written. The returned pin must be released once the commit to the master
// returned. Overwritten committed entries appear on Evictions. src is not retained.
//
// A committed entry of the same (key, putID) is rewritten (checkNewerLocked): it stays
// readable until the new entry is reserved, and is dead from then on.
//
// Errors: ErrStale if the key already has a newer put id, or this one being written (or
// lost it while writing), ErrTooLarge, ErrBusy, ErrClosed, or a wrapped IO error; on
// an error after the reservation no entry for (key, putID) is readable (before it, a
// rewritten entry still is).
func (s *Storage) Persist(key string, putID int64, src []byte) (CommitPin, error) {
	return s.PersistFrom(key, putID, int64(len(src)), copyFrom(src))
}

// PersistFrom is Persist of a length-byte value that fill writes into the record's
// buffer (all of dst, len(dst) == length): a value pulled from another owner lands
// there without an intermediate copy. An error from fill aborts the persist before
// anything is reserved on the ring.
func (s *Storage) PersistFrom(key string, putID, length int64, fill func(dst []byte) error) (CommitPin, error) {
	r := &record{key: key, putID: putID, length: length, fill: fill}
	s.persistRecords([]*record{r})
	return r.pin, r.err
}

func (s *Storage) checkNewer(key string, putID int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkNewerLocked(key, putID)
}

// checkNewerLocked refuses a persist of (key, putID) when the key has a newer put id, or
// this one still being written. A committed entry of the same put id is rewritten: the
// master's refresh of a value read back from SSD (its record moves to the ring's head,
// so that the ring keeps what is read, not only what was written last); the old record
// dies once the new one is reserved, unreported.
func (s *Storage) checkNewerLocked(key string, putID int64) error {
	if old := s.index[key]; old != nil && (old.putID > putID || (old.putID == putID && old.state != stateCommitted)) {
		return fmt.Errorf("ssd persist %q put %d: put %d is already stored: %w", key, putID, old.putID, ErrStale)
	}
	return nil
}

// reserve allocates a Writing entry on one of d's shards, waiting while every shard
// is blocked by busy entries, and makes it the key's entry in the index. It returns
// with s.mu held, so that the caller allocates what follows the entry before another
// writer can (reserveRun), and the evictions to report once it released it; on an
// error, without the lock.
func (s *Storage) reserve(d *device, call *persistCall, key string, putID, length, size int64) (*entry, []Eviction, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	s.mu.Lock()
	for {
		if err := s.checkNewerLocked(key, putID); err != nil {
			s.mu.Unlock()
			return nil, nil, err
		}
		e, evicted, err := s.allocLocked(d, key, putID, length, size)
		if errors.Is(err, errBlocked) && call != nil && blockedByCall(d, call) {
			s.mu.Unlock()
			return nil, nil, fmt.Errorf("ssd persist %q put %d: no space on %s: the room is held by the commit pins of this call's own records: %w", key, putID, d.root, ErrBusy)
		}
		if err == nil {
			e.call = call
			evs := s.evictedLocked(evicted, key, putID) // may include the key's previous version
			s.replaceLocked(key, putID, e)
			return e, evs, nil
		}
		if !errors.Is(err, errBlocked) {
			s.mu.Unlock()
			return nil, nil, fmt.Errorf("ssd persist %q put %d: %w", key, putID, err)
		}
		if s.spaceCh == nil {
			s.spaceCh = make(chan struct{})
		}
		wait := s.spaceCh
		s.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(s.opts.BusyWait)
		}
		select {
		case <-wait:
		case <-timer.C:
			return nil, nil, fmt.Errorf("ssd persist %q put %d: no space on %s within %v: %w", key, putID, d.root, s.opts.BusyWait, ErrBusy)
		case <-s.closing:
			return nil, nil, ErrClosed
		}
		s.mu.Lock()
	}
}

// blockedByCall reports whether every shard of d is blocked by an entry that call
// wrote and still holds commit-pinned (right after allocLocked failed with errBlocked):
// no room can come back before the call returns.
func blockedByCall(d *device, call *persistCall) bool {
	for _, sh := range d.shards {
		if b := sh.ring.blocker; b == nil || b.call != call || b.commitPins == 0 {
			return false
		}
	}
	return true
}

// allocLocked tries d's shards round-robin; errBlocked if every shard is blocked.
func (s *Storage) allocLocked(d *device, key string, putID, length, size int64) (*entry, []*entry, error) {
	n := len(d.shards)
	for i := range n {
		sh := d.shards[(d.nextShard+i)%n]
		e, evicted, err := sh.ring.alloc(key, putID, length, size)
		if err == nil {
			e.shard = sh
			d.nextShard = (d.nextShard + i + 1) % n
			return e, evicted, nil
		}
		if !errors.Is(err, errBlocked) {
			return nil, nil, err
		}
	}
	return nil, nil, errBlocked
}

// replaceLocked makes e, a new record of key's version putID, the key's entry in place
// of the one indexed (a rewrite of the same version marks that one superseded).
func (s *Storage) replaceLocked(key string, putID int64, e *entry) {
	s.records++
	e.seq = s.records
	if old := s.index[key]; old != nil {
		old.superseded = old.putID == putID && old.state == stateCommitted
		if old.superseded {
			e.supersedes = old
		}
		s.dropLocked(old)
	}
	s.index[key] = e
}

// dropLocked takes e (the key's indexed entry) out of the index: a committed entry
// dies at once (no eviction report later, its bytes no longer count as used); a
// writing one is aborted when its write completes.
func (s *Storage) dropLocked(e *entry) {
	if s.index[e.key] != e {
		return
	}
	delete(s.index, e.key)
	switch e.state {
	case stateWriting:
		e.removed = true
	case stateCommitted:
		e.shard.dev.used -= e.size
		e.shard.ring.kill(e)
	}
}

// evictedLocked unindexes the committed entries a ring overwrote, reserving room for
// (key, putID): the key's entry of that put id, overwritten by its own rewrite
// (checkNewerLocked), is not reported, since the rewrite replaces it.
func (s *Storage) evictedLocked(evicted []*entry, key string, putID int64) []Eviction {
	if len(evicted) == 0 {
		return nil
	}
	evs := make([]Eviction, 0, len(evicted))
	for _, e := range evicted {
		if s.index[e.key] != e {
			panic(fmt.Sprintf("BUG: evicted committed entry %q put %d is not indexed", e.key, e.putID))
		}
		delete(s.index, e.key)
		e.shard.dev.used -= e.size
		if e.key != key || e.putID != putID {
			evs = append(evs, Eviction{Key: e.key, PutID: e.putID, Seq: e.seq})
		}
	}
	return evs
}

// signalLocked wakes persists waiting for ring space.
func (s *Storage) signalLocked() {
	if s.spaceCh != nil {
		close(s.spaceCh)
		s.spaceCh = nil
	}
}

// Forget drops the key's entry from the index if its put id is at most upTo (upTo
// <= 0: whatever its put id). The owner calls it when the key is deleted or
// overwritten, by itself or (through the master's invalidation) by another owner, so
// a dead value is never read again. The range is reused when the tail reaches it, is
// not reported as an eviction and stops counting as used at once. A persist of that
// entry still writing fails with ErrStale. It reports whether an entry was dropped.
func (s *Storage) Forget(key string, upTo int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.index[key]
	if e == nil || (upTo > 0 && e.putID > upTo) {
		return false
	}
	s.dropLocked(e)
	return true
}

// ForgetRecord drops key's entry if it is the record numbered seq (Entry.Seq), and
// nothing else: a rewrite of the version since, another record, stays.
func (s *Storage) ForgetRecord(key string, seq int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.index[key]
	if e == nil || e.seq != seq {
		return false
	}
	s.dropLocked(e)
	return true
}

// Entry names one value the ring holds.
type Entry struct {
	Key    string
	PutID  int64
	Length int64
	// Seq numbers the record: a rewrite of the same key and put id is another record,
	// with a higher number (Eviction.Seq, CommitPin.Seq).
	Seq int64
}

// Committed lists the entries that are committed and readable right now, in no
// particular order.
func (s *Storage) Committed() []Entry { return s.committed(true) }

// Settled is Committed less the entries whose CommitPin is still held: those the owner
// reports to a restarted master. A pinned entry's commit to the master is still out,
// and its outcome decides whether the owner keeps it (it forgets one whose commit
// failed, or went to a master it is no longer registered with).
func (s *Storage) Settled() []Entry { return s.committed(false) }

func (s *Storage) committed(pinned bool) []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Entry, 0, len(s.index))
	for k, e := range s.index {
		if e.state == stateCommitted && (pinned || e.commitPins == 0) && !e.shard.ring.overtaken(e) {
			out = append(out, Entry{Key: k, PutID: e.putID, Length: e.length, Seq: e.seq})
		}
	}
	return out
}

// Contains reports whether (key, putID) is committed and readable right now.
func (s *Storage) Contains(key string, putID int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.index[key]
	return e != nil && e.putID == putID && e.state == stateCommitted && !e.shard.ring.overtaken(e)
}

// LoadInto reads the n-byte value of (key, putID) into dst[:n] and verifies it (see
// LoadChunks). It reads directly into dst when dst's address is 512-aligned and
// cap(dst) >= AlignedLen(n) (the padding then lands in dst[n:AlignedLen(n)], beyond
// the value; the record header is read into a buffer of its own, never into dst);
// otherwise through an aligned scratch buffer, copying only real bytes. ErrNotFound
// when no such entry is readable, ErrCorrupt when the bytes read are not the record
// stored; n must equal the stored length. On any error dst[:n] holds unspecified
// bytes.
func (s *Storage) LoadInto(key string, putID int64, dst []byte, n int64) error {
	return s.LoadChunks(key, putID, dst, n, nil)
}

// LoadChunks is LoadInto in ChunkSize pieces, at most ChunkInflight reads in flight;
// after each piece is in dst (and the entry was re-checked not overtaken) it calls
// fn(off, n) for dst[off:off+n], in order, from the calling goroutine. An error from
// fn stops the load and is returned. On any error, no IO into dst is in flight when
// LoadChunks returns. fn must not call Close.
//
// Verification: the record header is read together with the first chunk (one READV)
// and checked before the first call of fn (metadata checksum, magic and format version, key, put
// id, length, ring position); the CRC32C of the value is computed over the pieces as
// they are handed to fn and compared after the last one. The bytes handed to fn are
// therefore provisional until LoadChunks returns nil: the caller must not publish
// them (to a holder, a client, the master) before. A mismatch returns an error
// wrapping ErrCorrupt, drops the entry from the index (it is never read again) and
// counts in Stats.CorruptReads. Short reads and IO errors are plain errors and leave
// the entry indexed. Options.SkipVerify turns all of this off.
func (s *Storage) LoadChunks(key string, putID int64, dst []byte, n int64, fn func(off, n int64) error) error {
	if n <= 0 || int64(len(dst)) < n {
		return fmt.Errorf("ssd load %q put %d: %d bytes into a %d-byte buffer", key, putID, n, len(dst))
	}
	into := chunkDest{
		// dst[off:] keeps dst's capacity: the chunk is read straight into it when aligned.
		take: func(_ int, off, _ int64) []byte { return dst[off:] },
	}
	if fn != nil {
		into.deliver = func(_ int, off, n int64, _ []byte) error { return fn(off, n) }
	}
	return s.load(context.Background(), key, putID, n, into)
}

// Slots lends a staged load (LoadStaged) the buffers its chunks are read into: a
// bounded set the caller recycles, so a value of any size is staged in a fixed amount
// of memory.
type Slots interface {
	// Take returns the buffer chunk i (n bytes) is read into, or nil when none is free
	// now. A buffer that is 512-aligned with capacity ≥ AlignedLen(n) is read into
	// directly; any other goes through a scratch buffer.
	Take(i int, n int64) []byte
	// Freed is signalled whenever a buffer may have been given back: a load waiting
	// for one tries Take again.
	Freed() <-chan struct{}
}

// LoadStaged is LoadChunks in chunkSize pieces (a multiple of Align) with at most
// inflight reads in flight (the caller's protocol fixes both, not Options) into buffers
// lent by slots instead of one contiguous destination: chunk i is read into
// slots.Take(i, n) (waiting on slots.Freed while none is free, so the caller bounds the
// rest), then fn(i, off, n, buf) hands it over, in order. The bytes are
// provisional until LoadStaged returns nil (the value's CRC is checked after the
// last chunk). ctx ends a load waiting for a buffer; no IO is in flight when it
// returns. A record the tail passed while the load waited for a buffer fails it:
// ErrMoved when the version was rewritten meanwhile (load it again), else ErrNotFound.
func (s *Storage) LoadStaged(ctx context.Context, key string, putID int64, n, chunkSize int64, inflight int, slots Slots,
	fn func(i int, off, n int64, buf []byte) error) error {
	if n <= 0 || chunkSize <= 0 || chunkSize%Align != 0 || chunkSize > maxIOSize || inflight <= 0 {
		return fmt.Errorf("ssd load %q put %d: %d bytes in chunks of %d, %d in flight", key, putID, n, chunkSize, inflight)
	}
	return s.load(ctx, key, putID, n, chunkDest{
		size:     chunkSize,
		inflight: inflight,
		take:     func(i int, _, n int64) []byte { return slots.Take(i, n) },
		freed:    slots.Freed(),
		deliver:  fn,
	})
}

// chunkDest is where a load puts its chunks: take returns chunk i's destination (nil:
// none free, wait on freed), deliver hands a completed chunk over (may be nil).
type chunkDest struct {
	size     int64 // chunk size; 0: Options.ChunkSize
	inflight int   // reads in flight at most; 0: Options.ChunkInflight
	take     func(i int, off, n int64) []byte
	freed    <-chan struct{}
	deliver  func(i int, off, n int64, buf []byte) error
}

// load finds the entry, takes a place in its device's reader queue and pins the
// entry's range against the ring's tail while the chunks are read.
func (s *Storage) load(ctx context.Context, key string, putID int64, n int64, into chunkDest) error {
	if !s.enter() {
		return ErrClosed
	}
	defer s.leave()

	s.mu.Lock()
	e := s.toReadLocked(key, putID)
	if e == nil {
		s.mu.Unlock()
		return fmt.Errorf("ssd load %q put %d: %w", key, putID, ErrNotFound)
	}
	slot := &readerSlot{ch: e.shard.dev.readSlots}
	s.mu.Unlock()
	if err := slot.take(ctx, s.closing); err != nil { // the device's reader queue
		return fmt.Errorf("ssd load %q put %d: %w", key, putID, err)
	}
	defer slot.release()

	// While the load waited for the queue, a refresh may have rewritten the version
	// and the tail passed the record found above: read the rewrite (a few times at
	// most; the queue slot taken stays that of the first device).
	for tries := 0; !s.pinReading(key, e); tries++ {
		s.mu.Lock()
		next := s.toReadLocked(key, putID)
		s.mu.Unlock()
		switch {
		case next == nil || next == e:
			return fmt.Errorf("ssd load %q put %d: %w", key, putID, ErrNotFound)
		case tries == maxRepins:
			return fmt.Errorf("ssd load %q put %d: rewritten %d times while the load waited: %w", key, putID, tries+1, ErrMoved)
		}
		e = next
	}
	pinned := true
	defer func() {
		if pinned {
			s.unpinReading(e)
		}
	}()
	if e.length != n {
		return fmt.Errorf("ssd load %q put %d: stored %d bytes, asked for %d", key, putID, e.length, n)
	}
	return s.readChunks(ctx, e, n, into, &pinned, slot)
}

// readerSlot is a load's place in its device's reader queue (device.readSlots): taken
// to read, given back while the load waits for a buffer (so that a consumer slow to free
// one holds no other load of the device: a local refill queued behind staged loads
// waited for their staging slots, a review).
type readerSlot struct {
	ch   chan struct{}
	held bool
}

// take waits for a place in the queue: an error when ctx ends (its cause) or the
// storage closes (ErrClosed).
func (r *readerSlot) take(ctx context.Context, closing <-chan struct{}) error {
	select {
	case r.ch <- struct{}{}:
		r.held = true
		return nil
	case <-closing:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *readerSlot) release() {
	if r.held {
		<-r.ch
		r.held = false
	}
}

// maxRepins is how many rewrites of its version a load follows before it gives up
// (ErrMoved): each one means the ring's tail passed a record while the load waited.
const maxRepins = 3

// toReadLocked is the entry a load of key's putID reads (nil: none): the indexed one,
// or the record a refresh writing the version again replaces while the tail has not
// passed it.
func (s *Storage) toReadLocked(key string, putID int64) *entry {
	e := s.index[key]
	if e == nil || e.putID != putID {
		return nil
	}
	if old := e.supersedes; old != nil && !old.shard.ring.overtaken(old) {
		return old
	}
	return e
}

// lostPin is why a load could not pin e again: ErrMoved when key's entry is now a
// rewrite of e's version (the refresh; the tail passed e), else ErrNotFound (deleted,
// forgotten, overwritten by another version, or evicted).
func (s *Storage) lostPin(e *entry) error {
	s.mu.Lock()
	cur := s.index[e.key]
	s.mu.Unlock()
	if cur != nil && cur != e && cur.putID == e.putID {
		return ErrMoved
	}
	return ErrNotFound
}

// pinReading read-pins e, still key's entry, committed and not overtaken; false if not.
// An entry superseded by a rewrite of its version (a refresh while the load waited for
// a buffer) is pinned too while that rewrite is the key's entry and the tail has not
// passed it: its bytes are the version's (a delete, a forget or a newer version fails
// the load).
func (s *Storage) pinReading(key string, e *entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.index[key]
	if cur == e {
		return e.shard.ring.pinRead(e)
	}
	if !e.superseded || cur == nil || cur.putID != e.putID || e.shard.ring.overtaken(e) {
		return false
	}
	e.readPins++ // a dead entry: its pin holds the tail as a live one's does (busy)
	return true
}

// unpinReading ends a read pin of e (a writer waiting for its range may go on).
func (s *Storage) unpinReading(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e.shard.ring.unpinRead(e)
	s.signalLocked()
}

type chunkRead struct {
	off, n  int64
	dst     []byte // the chunk's n-byte destination
	scratch []byte // nil for a direct read
	done    bool
}

// headerTag marks the header read among a load's requests (chunks are tagged by index).
const headerTag = -1

// readChunks runs one load: the value's chunks, the first one read together with the
// record header (unless SkipVerify) in one vectored IO, delivered in order once the
// header checked out.
func (s *Storage) readChunks(ctx context.Context, e *entry, n int64, into chunkDest, pinned *bool, slot *readerSlot) error {
	sh := e.shard
	start := sh.fileOffset(e)
	base := start + headerSize(len(e.key)) // the value's first byte
	size := cmp.Or(into.size, s.opts.ChunkSize)
	chunks := make([]chunkRead, (n+size-1)/size)
	maxInflight := cmp.Or(into.inflight, s.opts.ChunkInflight)
	done := make(chan *Request, maxInflight+1)
	verify := !s.opts.SkipVerify
	v := verifier{s: s, e: e, on: verify, checked: !verify}
	readv := verify && !s.opts.separateHeaderRead
	// inflight counts every IO of this load. Chunks submitted but not yet delivered
	// (in flight, or done and waiting for an earlier chunk or the header) are at most
	// ChunkInflight: that bounds the scratch memory too. The small header read of
	// separateHeaderRead does not take a chunk's turn.
	next, deliver, inflight := 0, 0, 0
	var firstErr error
	if verify {
		v.hbuf = getBuf(int(base - start))
	}
	if verify && !readv {
		req := &Request{Op: OpRead, File: sh.file, Buf: v.hbuf, Off: start, Done: done, tag: headerTag}
		if err := sh.dev.engine.Submit(req); err != nil {
			putBuf(v.hbuf)
			return fmt.Errorf("ssd load %q put %d: %w", e.key, e.putID, err)
		}
		inflight++
	}
	for {
		for firstErr == nil && next < len(chunks) && next-deliver < maxInflight {
			c := &chunks[next]
			c.off = int64(next) * size
			c.n = min(size, n-c.off)
			target := into.take(next, c.off, c.n)
			if target == nil {
				break // no buffer free: wait for one (or for a read to complete)
			}
			c.dst = target[:c.n]
			ioLen := alignUp(c.n)
			var buf []byte
			if isAligned(target) && int64(cap(target)) >= ioLen {
				buf = target[:ioLen:ioLen]
				s.directReads.Add(1)
			} else {
				c.scratch = getBuf(int(ioLen))
				buf = c.scratch
				s.scratchReads.Add(1)
			}
			req := &Request{Op: OpRead, File: sh.file, Buf: buf, Off: base + c.off, Done: done, tag: next}
			if readv && next == 0 {
				req.Head, req.Off = v.hbuf, start // the header and the first chunk in one IO
			}
			if err := sh.dev.engine.Submit(req); err != nil {
				firstErr = fmt.Errorf("ssd load %q put %d: %w", e.key, e.putID, err)
				if req.Head != nil {
					putBuf(v.hbuf)
				}
				break
			}
			next++
			inflight++
		}
		if inflight == 0 {
			if firstErr != nil || next == len(chunks) {
				break
			}
			// Nothing in flight and no buffer free: wait for one, without the read pin
			// (*pinned false meanwhile) or the reader slot: a consumer that pulls slowly, or
			// not at all, must not hold the ring's writers, which wait BusyWait for a
			// pinned entry and then fail, nor the device's other loads. Slot and pin are
			// taken again before the next read; an entry overwritten or dropped meanwhile
			// ends the load (what was delivered was read pinned).
			s.unpinReading(e)
			*pinned = false
			slot.release()
			select {
			case <-into.freed:
			case <-ctx.Done():
				firstErr = fmt.Errorf("ssd load %q put %d: waiting for a buffer: %w", e.key, e.putID, ctx.Err())
			case <-s.closing:
				firstErr = ErrClosed
			}
			if firstErr == nil {
				if err := slot.take(ctx, s.closing); err != nil {
					firstErr = fmt.Errorf("ssd load %q put %d: waiting for the device's reader queue: %w", e.key, e.putID, err)
				}
			}
			if firstErr == nil {
				if !s.pinReading(e.key, e) {
					// (The chunks delivered came from e: the load cannot go on in the
					// rewrite's record; its caller loads again.)
					firstErr = fmt.Errorf("ssd load %q put %d: overwritten while waiting for a buffer: %w", e.key, e.putID, s.lostPin(e))
				} else {
					*pinned = true
				}
			}
			continue
		}
		var req *Request
		select {
		case req = <-done:
		case <-into.freed:
			continue // a buffer came back: submit the next chunk while these run
		}
		inflight--
		var ioErr error
		if req.Err != nil {
			ioErr = fmt.Errorf("ssd load %q put %d: read %s at %d: %w", e.key, e.putID, sh.file.Name(), req.Off, req.Err)
		} else if req.N != len(req.Head)+len(req.Buf) {
			ioErr = fmt.Errorf("ssd load %q put %d: read %s at %d: %d of %d bytes: %w",
				e.key, e.putID, sh.file.Name(), req.Off, req.N, len(req.Head)+len(req.Buf), io.ErrUnexpectedEOF)
		}
		if req.tag.(int) == headerTag || req.Head != nil {
			if firstErr == nil {
				firstErr = ioErr
			}
			if firstErr == nil {
				firstErr = v.header()
			}
			putBuf(v.hbuf)
			v.hbuf = nil
		}
		if req.tag.(int) != headerTag {
			chunks[req.tag.(int)].done = true
			if firstErr == nil {
				firstErr = ioErr
			}
		}
		for firstErr == nil && v.checked && deliver < next && chunks[deliver].done {
			firstErr = s.deliver(e, deliver, &chunks[deliver], &v, into.deliver)
			deliver++
		}
	}
	// Every submitted IO completed; free the scratch of chunks never delivered.
	for i := range chunks[deliver:next] {
		if c := &chunks[deliver+i]; c.scratch != nil {
			putBuf(c.scratch)
			c.scratch = nil
		}
	}
	if firstErr == nil && verify {
		firstErr = v.value()
	}
	return firstErr
}

// verifier checks one load against the record on disk: the header when it arrives,
// the value's CRC32C as the chunks are delivered in order.
type verifier struct {
	s       *Storage
	e       *entry
	on      bool   // verification is on (not Options.SkipVerify)
	hbuf    []byte // the header read's buffer while it is in flight
	checked bool   // the header matched (or verification is off)
	want    uint32 // the header's value CRC
	crc     uint32 // CRC of the value bytes delivered so far
}

// header checks the record header in hbuf against the indexed entry.
func (v *verifier) header() error {
	e := v.e
	h, err := decodeHeader(v.hbuf)
	switch {
	case err != nil:
	case h.key != e.key:
		err = fmt.Errorf("record of key %.64q", h.key)
	case h.putID != e.putID:
		err = fmt.Errorf("record of put %d", h.putID)
	case h.length != e.length:
		err = fmt.Errorf("record of %d bytes, indexed %d", h.length, e.length)
	case h.pos != e.begin:
		err = fmt.Errorf("record written at ring position %d, indexed %d", h.pos, e.begin)
	}
	if err != nil {
		return v.s.corrupt(e, err)
	}
	v.checked, v.want = true, h.valueCRC
	return nil
}

// add folds delivered value bytes into the CRC.
func (v *verifier) add(b []byte) {
	if v.on {
		v.crc = crc32.Update(v.crc, castagnoli, b)
	}
}

// value compares the CRC of all delivered bytes with the header's.
func (v *verifier) value() error {
	if v.crc != v.want {
		return v.s.corrupt(v.e, fmt.Errorf("value CRC32C %08x, record says %08x", v.crc, v.want))
	}
	return nil
}

// corrupt handles a load whose bytes are not the record stored: the entry leaves the
// index for good and the failure is counted. A range the tail passed during the read
// (it holds other bytes now) is a plain ErrNotFound instead.
func (s *Storage) corrupt(e *entry, why error) error {
	s.mu.Lock()
	overtaken := e.shard.ring.overtaken(e)
	s.dropLocked(e)
	s.mu.Unlock()
	if overtaken {
		return fmt.Errorf("ssd load %q put %d: range overtaken during the read: %w", e.key, e.putID, ErrNotFound)
	}
	s.corruptReads.Add(1)
	s.log.Warn().Str("key", e.key).Int64("put_id", e.putID).Str("file", e.shard.file.Name()).
		Int64("offset", e.shard.fileOffset(e)).Err(why).Msg("ssd: corrupt record; entry dropped")
	return fmt.Errorf("ssd load %q put %d: %s at %d: %w: %w", e.key, e.putID, e.shard.file.Name(), e.shard.fileOffset(e), why, ErrCorrupt)
}

// deliver publishes one completed chunk: re-check that the tail did not pass the
// entry while the IO ran, copy real bytes out of scratch, fold them into the CRC,
// then hand them to fn.
func (s *Storage) deliver(e *entry, i int, c *chunkRead, v *verifier, fn func(i int, off, n int64, buf []byte) error) error {
	s.mu.Lock()
	overtaken := e.shard.ring.overtaken(e)
	if overtaken {
		s.dropLocked(e)
	}
	s.mu.Unlock()
	if c.scratch != nil {
		if !overtaken {
			copy(c.dst, c.scratch[:c.n])
		}
		putBuf(c.scratch)
		c.scratch = nil
	}
	if overtaken {
		return fmt.Errorf("ssd load %q put %d: range overtaken during the read: %w", e.key, e.putID, ErrNotFound)
	}
	v.add(c.dst)
	if fn != nil {
		if err := fn(i, c.off, c.n, c.dst); err != nil {
			return err
		}
	}
	return nil
}

// DeviceStats describes one de-duplicated device root.
type DeviceStats struct {
	Root          string `json:"root"`
	Dev           uint64 `json:"dev"`
	Engine        string `json:"engine"`
	Shards        int    `json:"shards"`
	CapacityBytes int64  `json:"capacity_bytes"`
	UsedBytes     int64  `json:"used_bytes"`
	// AlignBytes is the unit write runs start and end on there: the file system's
	// block size (see placementAlign).
	AlignBytes int64 `json:"align_bytes"`
}

// Stats is the storage's capacity and use (kv_ssd_capacity_bytes,
// kv_ssd_used_bytes). Used counts the on-disk bytes (header and padded value) of the
// committed entries in the index: not the ones being written, forgotten, superseded,
// overwritten or found corrupt, nor the pads behind write runs or the ring's skipped
// gaps.
type Stats struct {
	Engine        string `json:"engine"`
	CapacityBytes int64  `json:"capacity_bytes"`
	UsedBytes     int64  `json:"used_bytes"`
	Entries       int    `json:"entries"`
	// DroppedEvictions counts eviction reports dropped before the master took them
	// (the ring's queue, or the owner's, overflowed): each left a route to a gone record.
	DroppedEvictions uint64 `json:"dropped_evictions"`
	// CorruptReads counts loads that found other bytes than the record stored
	// (ErrCorrupt); each dropped its entry.
	CorruptReads uint64 `json:"corrupt_reads"`
	// DirectReadChunks and ScratchReadChunks count load chunks read straight into
	// the caller's memory and through a scratch buffer.
	DirectReadChunks  uint64        `json:"direct_read_chunks"`
	ScratchReadChunks uint64        `json:"scratch_read_chunks"`
	Devices           []DeviceStats `json:"devices"`
}

// Stats reports capacity and use per device and in total.
func (s *Storage) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Engine:            s.kind,
		Entries:           len(s.index),
		DroppedEvictions:  s.evDropped.Load(),
		CorruptReads:      s.corruptReads.Load(),
		DirectReadChunks:  s.directReads.Load(),
		ScratchReadChunks: s.scratchReads.Load(),
	}
	for _, d := range s.devices {
		ds := DeviceStats{Root: d.root, Dev: d.dev, Engine: d.kind, Shards: len(d.shards), CapacityBytes: d.capacity(), UsedBytes: d.used,
			AlignBytes: d.align}
		st.CapacityBytes += ds.CapacityBytes
		st.UsedBytes += ds.UsedBytes
		st.Devices = append(st.Devices, ds)
	}
	return st
}

// Close refuses new operations, waits for the running ones (waiting persists and
// loads give up with ErrClosed), stops the engines, closes the shard files (they
// stay on disk; the next Open truncates them) and closes Evictions after a last
// batch. Commit pins need not be released first. Calling it again is a no-op.
func (s *Storage) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.budgetCancel()
	s.mu.Unlock()
	s.ops.Wait()
	var errs []error
	for _, d := range s.devices {
		if err := d.close(); err != nil {
			errs = append(errs, err)
		}
	}
	close(s.evStop)
	<-s.evDone
	return errors.Join(errs...)
}
