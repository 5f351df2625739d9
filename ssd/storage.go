package ssd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
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

	evq       chan Eviction   // to the batcher; full → dropped and counted
	evOut     chan []Eviction // batches for the owner
	evStop    chan struct{}
	evDone    chan struct{}
	evDropped atomic.Uint64

	directReads, scratchReads atomic.Uint64 // chunks read each way (tests, stats)
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
		evq:     make(chan Eviction, 32*opts.EvictionBatch),
		evOut:   make(chan []Eviction, 64),
		evStop:  make(chan struct{}),
		evDone:  make(chan struct{}),
	}
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
	cacheDir := safeName(opts.Cluster) + "_cluster_kv_ssd_storage"
	for i, p := range opts.Paths {
		root := filepath.Join(p, cacheDir, safeName(opts.InstanceKey))
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, fmt.Errorf("ssd: large_file_paths[%d]: create %s: %w", i, root, err)
		}
		dev, err := opts.devOf(root)
		if err != nil {
			return nil, fmt.Errorf("ssd: large_file_paths[%d]: %w", i, err)
		}
		if first, dup := seen[dev]; dup {
			s.log.Info().Str("root", root).Str("kept", first).Msg("ssd: root shares a device with an earlier root; skipped (first wins)")
			continue
		}
		seen[dev] = root
		d, err := openDevice(&s.opts, len(s.devices), root, dev, opts.Limits[i], s.kind)
		if err != nil {
			return nil, fmt.Errorf("ssd: large_file_paths[%d]: %w", i, err)
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
// size bytes.
func (s *Storage) pickDevice(size int64) (*device, error) {
	n := uint64(len(s.devices))
	start := s.rr.Add(1) - 1
	for i := range n {
		if d := s.devices[(start+i)%n]; d.shardSize >= size {
			return d, nil
		}
	}
	return nil, ErrTooLarge
}

// CommitPin keeps a freshly persisted entry from being overwritten until the owner's
// SsdReplicaCommit to the master returned. Whoever receives it from Persist must call
// Release exactly once (more calls are no-ops); until then the ring cannot reuse
// the entry's range and writers on that shard may wait.
type CommitPin struct{ p *commitPin }

type commitPin struct {
	s        *Storage
	e        *entry
	released atomic.Bool
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
// zero-padded aligned buffer, reserves a contiguous range on one device (round
// robin; waiting up to BusyWait while the space is held by busy entries), writes
// it and commits the entry only if every aligned byte was written. The returned pin
// must be released once the commit to the master returned. Overwritten committed
// entries appear on Evictions. src is not retained.
//
// Errors: ErrStale if the key already has this or a newer put id (or lost it while
// writing), ErrTooLarge, ErrBusy, ErrClosed, or a wrapped IO error; on any error no
// entry for (key, putID) is readable.
func (s *Storage) Persist(key string, putID int64, src []byte) (CommitPin, error) {
	if key == "" || len(src) == 0 {
		return CommitPin{}, fmt.Errorf("ssd persist %q: empty key or value", key)
	}
	if !s.enter() {
		return CommitPin{}, ErrClosed
	}
	defer s.leave()
	length := int64(len(src))
	size := alignUp(length)
	d, err := s.pickDevice(size)
	if err != nil {
		return CommitPin{}, fmt.Errorf("ssd persist %q put %d: %d aligned bytes: %w", key, putID, size, err)
	}
	if err := s.checkNewer(key, putID); err != nil {
		return CommitPin{}, err
	}
	select { // the device's writer queue
	case d.writeSlots <- struct{}{}:
	case <-s.closing:
		return CommitPin{}, ErrClosed
	}
	defer func() { <-d.writeSlots }()

	buf := getBuf(int(size))
	defer putBuf(buf) // the write below completed (or never started) by then
	copy(buf, src)
	clear(buf[length:]) // padding is zero and stays in the owner

	e, err := s.reserve(d, key, putID, length, size)
	if err != nil {
		return CommitPin{}, err
	}
	werr := e.shard.write(buf, e.shard.fileOffset(e))

	s.mu.Lock()
	defer s.mu.Unlock()
	if werr != nil || e.removed {
		e.shard.ring.abort(e)
		if s.index[key] == e {
			delete(s.index, key)
		}
		s.signalLocked()
		if werr != nil {
			return CommitPin{}, fmt.Errorf("ssd persist %q put %d: %w", key, putID, werr)
		}
		return CommitPin{}, fmt.Errorf("ssd persist %q put %d: removed or superseded while writing: %w", key, putID, ErrStale)
	}
	e.shard.ring.commit(e)
	e.shard.ring.pinCommit(e)
	return CommitPin{&commitPin{s: s, e: e}}, nil
}

func (s *Storage) checkNewer(key string, putID int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkNewerLocked(key, putID)
}

func (s *Storage) checkNewerLocked(key string, putID int64) error {
	if old := s.index[key]; old != nil && old.putID >= putID {
		return fmt.Errorf("ssd persist %q put %d: put %d is already stored: %w", key, putID, old.putID, ErrStale)
	}
	return nil
}

// reserve allocates a Writing entry on one of d's shards, waiting while every shard
// is blocked by busy entries, and makes it the key's entry in the index.
func (s *Storage) reserve(d *device, key string, putID, length, size int64) (*entry, error) {
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
			return nil, err
		}
		e, evicted, err := s.allocLocked(d, key, putID, length, size)
		if err == nil {
			evs := s.evictedLocked(evicted) // may include the key's previous version
			if old := s.index[key]; old != nil {
				s.dropLocked(old)
			}
			s.index[key] = e
			s.mu.Unlock()
			s.report(evs)
			return e, nil
		}
		if !errors.Is(err, errBlocked) {
			s.mu.Unlock()
			return nil, fmt.Errorf("ssd persist %q put %d: %w", key, putID, err)
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
			return nil, fmt.Errorf("ssd persist %q put %d: no space on %s within %v: %w", key, putID, d.root, s.opts.BusyWait, ErrBusy)
		case <-s.closing:
			return nil, ErrClosed
		}
		s.mu.Lock()
	}
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

// dropLocked takes e out of the index: a committed entry dies at once (no eviction
// report later); a writing one is aborted when its write completes.
func (s *Storage) dropLocked(e *entry) {
	if s.index[e.key] == e {
		delete(s.index, e.key)
	}
	if e.state == stateWriting {
		e.removed = true
	} else {
		e.shard.ring.kill(e)
	}
}

// evictedLocked unindexes the committed entries a ring overwrote.
func (s *Storage) evictedLocked(evicted []*entry) []Eviction {
	if len(evicted) == 0 {
		return nil
	}
	evs := make([]Eviction, 0, len(evicted))
	for _, e := range evicted {
		if s.index[e.key] != e {
			panic(fmt.Sprintf("BUG: evicted committed entry %q put %d is not indexed", e.key, e.putID))
		}
		delete(s.index, e.key)
		evs = append(evs, Eviction{Key: e.key, PutID: e.putID})
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

// Remove drops the entry of (key, putID) from the index (delete or overwrite of the
// key); its range is reused when the tail reaches it and it is not reported as an
// eviction. It reports whether such an entry existed. A persist of that put id still
// writing fails with ErrStale.
func (s *Storage) Remove(key string, putID int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.index[key]
	if e == nil || e.putID != putID {
		return false
	}
	s.dropLocked(e)
	return true
}

// Contains reports whether (key, putID) is committed and readable right now.
func (s *Storage) Contains(key string, putID int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.index[key]
	return e != nil && e.putID == putID && e.state == stateCommitted && !e.shard.ring.overtaken(e)
}

// LoadInto reads the n-byte value of (key, putID) into dst[:n]. It reads directly
// into dst when dst's address is 512-aligned and cap(dst) >= AlignedLen(n) (the
// padding then lands in dst[n:AlignedLen(n)], beyond the value); otherwise through an
// aligned scratch buffer, copying only real bytes. ErrNotFound when no such entry is
// readable; n must equal the stored length.
func (s *Storage) LoadInto(key string, putID int64, dst []byte, n int64) error {
	return s.LoadChunks(key, putID, dst, n, nil)
}

// LoadChunks is LoadInto in ChunkSize pieces, at most ChunkInflight reads in flight;
// after each piece is in dst (and the entry was re-checked not overtaken) it calls
// fn(off, n) for dst[off:off+n], in order, from the calling goroutine. An error from
// fn stops the load and is returned. On any error, no IO into dst is in flight when
// LoadChunks returns. fn must not call Close.
func (s *Storage) LoadChunks(key string, putID int64, dst []byte, n int64, fn func(off, n int64) error) error {
	if n <= 0 || int64(len(dst)) < n {
		return fmt.Errorf("ssd load %q put %d: %d bytes into a %d-byte buffer", key, putID, n, len(dst))
	}
	if !s.enter() {
		return ErrClosed
	}
	defer s.leave()

	s.mu.Lock()
	e := s.index[key]
	if e == nil || e.putID != putID {
		s.mu.Unlock()
		return fmt.Errorf("ssd load %q put %d: %w", key, putID, ErrNotFound)
	}
	d := e.shard.dev
	s.mu.Unlock()
	select { // the device's reader queue
	case d.readSlots <- struct{}{}:
	case <-s.closing:
		return ErrClosed
	}
	defer func() { <-d.readSlots }()

	s.mu.Lock()
	if s.index[key] != e || !e.shard.ring.pinRead(e) {
		s.mu.Unlock()
		return fmt.Errorf("ssd load %q put %d: %w", key, putID, ErrNotFound)
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		e.shard.ring.unpinRead(e)
		s.signalLocked()
		s.mu.Unlock()
	}()
	if e.length != n {
		return fmt.Errorf("ssd load %q put %d: stored %d bytes, asked for %d", key, putID, e.length, n)
	}
	return s.readChunks(e, dst, n, fn)
}

type chunkRead struct {
	off, n  int64
	scratch []byte // nil for a direct read
	done    bool
}

func (s *Storage) readChunks(e *entry, dst []byte, n int64, fn func(off, n int64) error) error {
	sh := e.shard
	base := sh.fileOffset(e)
	size := s.opts.ChunkSize
	chunks := make([]chunkRead, (n+size-1)/size)
	done := make(chan *Request, s.opts.ChunkInflight)
	next, deliver, inflight := 0, 0, 0
	var firstErr error
	for {
		for firstErr == nil && next < len(chunks) && inflight < s.opts.ChunkInflight {
			c := &chunks[next]
			c.off = int64(next) * size
			c.n = min(size, n-c.off)
			ioLen := alignUp(c.n)
			var buf []byte
			if target := dst[c.off:]; isAligned(target) && int64(cap(target)) >= ioLen {
				buf = target[:ioLen:ioLen]
				s.directReads.Add(1)
			} else {
				c.scratch = getBuf(int(ioLen))
				buf = c.scratch
				s.scratchReads.Add(1)
			}
			req := &Request{Op: OpRead, File: sh.file, Buf: buf, Off: base + c.off, Done: done, tag: next}
			if err := sh.dev.engine.Submit(req); err != nil {
				firstErr = fmt.Errorf("ssd load %q put %d: %w", e.key, e.putID, err)
				break
			}
			next++
			inflight++
		}
		if inflight == 0 {
			break
		}
		req := <-done
		inflight--
		c := &chunks[req.tag.(int)]
		c.done = true
		if firstErr == nil {
			if req.Err != nil {
				firstErr = fmt.Errorf("ssd load %q put %d: read %s at %d: %w", e.key, e.putID, sh.file.Name(), req.Off, req.Err)
			} else if req.N != len(req.Buf) {
				firstErr = fmt.Errorf("ssd load %q put %d: read %s at %d: %d of %d bytes: %w",
					e.key, e.putID, sh.file.Name(), req.Off, req.N, len(req.Buf), io.ErrUnexpectedEOF)
			}
		}
		for firstErr == nil && deliver < next && chunks[deliver].done {
			firstErr = s.deliver(e, dst, &chunks[deliver], fn)
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
	return firstErr
}

// deliver publishes one completed chunk: re-check that the tail did not pass the
// entry while the IO ran, copy real bytes out of scratch, then hand it to fn.
func (s *Storage) deliver(e *entry, dst []byte, c *chunkRead, fn func(off, n int64) error) error {
	s.mu.Lock()
	overtaken := e.shard.ring.overtaken(e)
	if overtaken && s.index[e.key] == e {
		s.dropLocked(e)
	}
	s.mu.Unlock()
	if c.scratch != nil {
		if !overtaken {
			copy(dst[c.off:c.off+c.n], c.scratch[:c.n])
		}
		putBuf(c.scratch)
		c.scratch = nil
	}
	if overtaken {
		return fmt.Errorf("ssd load %q put %d: range overtaken during the read: %w", e.key, e.putID, ErrNotFound)
	}
	if fn != nil {
		if err := fn(c.off, c.n); err != nil {
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
}

// Stats is the storage's capacity and ring use (kv_ssd_capacity_bytes,
// kv_ssd_used_bytes). Used counts every byte between a ring's tail and head: live,
// removed-but-not-yet-overwritten and skipped bytes.
type Stats struct {
	Engine           string `json:"engine"`
	CapacityBytes    int64  `json:"capacity_bytes"`
	UsedBytes        int64  `json:"used_bytes"`
	Entries          int    `json:"entries"`
	DroppedEvictions uint64 `json:"dropped_evictions"`
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
		DirectReadChunks:  s.directReads.Load(),
		ScratchReadChunks: s.scratchReads.Load(),
	}
	for _, d := range s.devices {
		ds := DeviceStats{Root: d.root, Dev: d.dev, Engine: d.kind, Shards: len(d.shards), CapacityBytes: d.capacity()}
		for _, sh := range d.shards {
			ds.UsedBytes += sh.ring.used()
		}
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
