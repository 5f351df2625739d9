package ssd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// device is one de-duplicated cache root: its shard files, its writer and reader
// queues (slot semaphores bounding persists and loads in flight) and its io engine.
type device struct {
	id        int
	root      string
	dev       uint64
	shardSize int64
	// align is the unit writes are placed in (placementAlign): each write run starts
	// on it and a pad entry takes the run to the next one; the shard size is a
	// multiple of it.
	align  int64
	shards []*shard
	engine Engine
	kind   string // engine kind, kept after close

	writeSlots chan struct{}
	readSlots  chan struct{}
	nextShard  int   // round-robin start for allocations; guarded by Storage.mu
	used       int64 // on-disk bytes of committed, indexed entries; guarded by Storage.mu
}

// shardCount splits a device's limit into at most perDevice shards of at least
// minSize bytes (one shard if the limit is smaller).
func shardCount(limit int64, perDevice int, minSize int64) int {
	n := perDevice
	for n > 1 && limit/int64(n) < minSize {
		n--
	}
	return n
}

// maxPlacementAlign bounds the placement unit a file system's block size yields, so
// that one reporting a huge "block" (NFS reports its wsize, up to 1 MiB) does not pad
// every write run to it.
const maxPlacementAlign = 64 << 10

// placementAlign is the unit write runs start and end on on root's file
// system: its block size (statfs f_bsize, 4 KiB on ext4 and xfs), bounded to
// [Align, maxPlacementAlign] and rounded down to a power of two; Align when statfs
// fails.
//
// Why not Align (512), which O_DIRECT accepts: a direct write that does not start
// and end on a file system block is "unaligned" there, and the file system
// serializes it. ext4 (Linux 6.x) takes the inode lock exclusively for an unaligned
// write into unwritten blocks (fallocated, as every shard is until the ring's first
// lap over it), waits for every direct IO in flight on the file (inode_dio_wait),
// reads included, and completes the write synchronously; xfs does the same
// (xfs_file_dio_write_unaligned). Both let an unaligned pure overwrite of written
// blocks run concurrently, but the first lap over a fresh shard is all of a bench
// run and hours of a large ring. A record of a 1 MiB value is 1 MiB + 512 bytes (its
// header sector), so with 512-byte placement nearly every persist was unaligned and
// a shard file had one write in flight at a time: 0.18-0.30× of fio's write
// bandwidth on the development VM's ext4, where fio itself, writing 1 MiB + 512-byte
// blocks into a fresh file, fell to 0.41× of its 1 MiB figure.
func placementAlign(root string) int64 {
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return Align
	}
	return placementAlignOf(int64(fs.Bsize))
}

// placementAlignOf is placementAlign for a file system of bsize-byte blocks.
func placementAlignOf(bsize int64) int64 {
	a := int64(Align)
	for a < maxPlacementAlign && a*2 <= bsize {
		a *= 2
	}
	return a
}

// span is rec (a record's header and padded value) rounded up to the device's
// placement unit: what a lone record takes of the ring with its pad, and the bound
// RecordSpan and the shard fit use.
func (d *device) span(rec int64) int64 { return (rec + d.align - 1) &^ (d.align - 1) }

// openDevice creates (truncating) the shard files of one root and starts its engine.
func openDevice(o *Options, id int, root string, dev uint64, limit int64, engineKind string) (_ *device, err error) {
	n := shardCount(limit, o.ShardsPerDevice, o.minShardSize)
	align := o.blockAlign
	if align == 0 {
		align = placementAlign(root)
	}
	if limit/int64(n) < align {
		align = Align // a ring smaller than one block (tiny test caches): 512-byte placement
	}
	d := &device{
		id:         id,
		root:       root,
		dev:        dev,
		shardSize:  (limit / int64(n)) &^ (align - 1),
		align:      align,
		writeSlots: make(chan struct{}, o.WriteInflight),
		readSlots:  make(chan struct{}, o.ReadInflight),
	}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	flags := unix.O_RDWR | unix.O_CREAT | unix.O_TRUNC | unix.O_CLOEXEC
	if !o.BufferedIO {
		flags |= unix.O_DIRECT
	}
	for k := range n {
		path := filepath.Join(root, fmt.Sprintf("shard-%03d.dat", k))
		f, err := o.OpenFile(path, flags, 0o600)
		if err != nil {
			if !o.BufferedIO && errors.Is(err, unix.EINVAL) {
				return nil, fmt.Errorf("open shard %s: the file system does not support O_DIRECT (tmpfs?): %w", path, err)
			}
			return nil, fmt.Errorf("open shard %s: %w", path, err)
		}
		d.shards = append(d.shards, &shard{dev: d, file: f, ring: newRing(d.shardSize)})
		if k == 0 && !o.BufferedIO {
			if a := directIOAlign(path); a > Align {
				return nil, fmt.Errorf("ssd root %s: the device needs %d-byte aligned direct IO, fluxkv aligns to %d", root, a, Align)
			}
		}
		if err := f.Truncate(d.shardSize); err != nil {
			if errors.Is(err, unix.EFBIG) || errors.Is(err, unix.EINVAL) { // beyond the largest file
				return nil, limitError{fmt.Errorf("cannot reserve %s (large_limit_size / --ssd-limit): size shard to %s: %w: larger than the file system (or RLIMIT_FSIZE) allows: lower the limit",
					FormatSize(limit), FormatSize(d.shardSize), err)}
			}
			return nil, fmt.Errorf("size shard %s to %d bytes: %w", path, d.shardSize, err)
		}
	}
	// Shard files beyond n are left from a run with more shards: free their space
	// before reserving.
	if old, err := filepath.Glob(filepath.Join(root, "shard-*.dat")); err == nil {
		for _, p := range old {
			var k int
			if _, err := fmt.Sscanf(filepath.Base(p), "shard-%d.dat", &k); err == nil && k >= n {
				os.Remove(p)
			}
		}
	}
	if err := d.reserve(o, root); err != nil {
		return nil, err
	}
	d.engine, err = NewEngine(engineKind, o.IODepth)
	if err != nil && engineKind == EngineUring && o.Engine == EngineAuto {
		o.Logger.Warn().Err(err).Str("root", root).Msg("ssd: io_uring setup failed, using the pread/pwrite engine for this device")
		d.engine, err = NewEngine(EnginePsync, o.IODepth)
	}
	if err != nil {
		return nil, fmt.Errorf("ssd root %s: start %s engine: %w", root, engineKind, err)
	}
	d.kind = d.engine.Kind()
	return d, nil
}

func (d *device) capacity() int64 { return d.shardSize * int64(len(d.shards)) }

// reserve allocates every shard's blocks up front (fallocate), so that the ring's
// writes never allocate and cannot hit ENOSPC later: a limit the file system cannot
// hold is a start-up error that names the limit and the free space, never a cache
// that claims space it does not have. On a file system without fallocate
// (EOPNOTSUPP) the files stay sparse, and the free space must cover the limit.
// On failure the shard files are emptied again, so the error's free bytes are
// what the operator can really use.
func (d *device) reserve(o *Options, root string) error {
	want := d.capacity()
	for _, sh := range d.shards {
		err := o.fallocate(sh.file.Fd(), d.shardSize)
		if err == nil {
			continue
		}
		if errors.Is(err, unix.EOPNOTSUPP) {
			free, serr := freeBytes(root)
			if serr != nil || free >= want {
				o.Logger.Info().Err(err).Str("root", root).Msg("ssd: the file system cannot preallocate; shard files stay sparse")
				return nil // statfs failing as well: nothing more to check
			}
			return limitError{fmt.Errorf("cannot reserve %s (large_limit_size / --ssd-limit): the file system cannot preallocate (%v) and has %s free: lower the limit",
				FormatSize(want), err, FormatSize(free))}
		}
		for _, sh := range d.shards {
			_ = sh.file.Truncate(0) // give back what the earlier shards reserved
		}
		free, serr := freeBytes(root)
		freeText := "free space unknown (" + fmt.Sprint(serr) + ")"
		if serr == nil {
			freeText = FormatSize(free) + " free"
		}
		err = fmt.Errorf("cannot reserve %s (large_limit_size / --ssd-limit): fallocate %s: %w; %s: lower the limit",
			FormatSize(want), sh.file.Name(), err, freeText)
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.EFBIG) {
			return limitError{err}
		}
		return err
	}
	return nil
}

// freeBytes is the space an unprivileged writer can still use on path's file system.
func freeBytes(path string) (int64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return int64(fs.Bavail) * int64(fs.Bsize), nil
}

// close stops the engine (after its IOs finished) and closes the shard files.
func (d *device) close() error {
	var errs []error
	if d.engine != nil {
		errs = append(errs, d.engine.Close())
		d.engine = nil
	}
	for _, sh := range d.shards {
		if err := sh.file.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close shard %s: %w", sh.file.Name(), err))
		}
	}
	return errors.Join(errs...)
}
