package ssd

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// Config is the owner's YAML view of the SSD cache, with the seed's fluxonkv_spec
// meaning:
//
//	large_file_paths: [/data/fluxkv0, /data/fluxkv1]
//	large_limit_size: ["4GB", 17179869184]
//
// large_limit_size absent or null turns the SSD cache off. When present it must have
// one entry per path: an integer number of bytes or a size string (see ParseSize;
// KB/MB/GB are binary), fractional bytes truncated, each at least 512.
type Config struct {
	LargeFilePaths []string `yaml:"large_file_paths" json:"large_file_paths"`
	LargeLimitSize []any    `yaml:"large_limit_size" json:"large_limit_size"`
}

// Enabled reports whether the config asks for an SSD cache (large_limit_size is set).
func (c Config) Enabled() bool { return c.LargeLimitSize != nil }

// Limits parses large_limit_size and checks it against large_file_paths. It returns
// nil, nil when the SSD cache is off.
func (c Config) Limits() ([]int64, error) {
	if !c.Enabled() {
		return nil, nil
	}
	if len(c.LargeLimitSize) != len(c.LargeFilePaths) {
		return nil, fmt.Errorf("large_limit_size has %d entries but large_file_paths has %d: they must have the same length (one limit per path)",
			len(c.LargeLimitSize), len(c.LargeFilePaths))
	}
	if len(c.LargeFilePaths) == 0 {
		return nil, errors.New("large_limit_size is set but large_file_paths is empty: name at least one path, or drop large_limit_size to turn the SSD cache off")
	}
	for i, p := range c.LargeFilePaths {
		if p == "" {
			return nil, fmt.Errorf("large_file_paths[%d]: empty path", i)
		}
	}
	return ParseLimits(c.LargeLimitSize)
}

// Validate reports a config that cannot work; a disabled config is valid.
func (c Config) Validate() error {
	_, err := c.Limits()
	return err
}

// Options turns an enabled config into storage options for one owner; the caller may
// adjust the remaining fields (engine, depth, logger) before Open.
func (c Config) Options(cluster, instanceKey string) (Options, error) {
	limits, err := c.Limits()
	if err != nil {
		return Options{}, err
	}
	if limits == nil {
		return Options{}, errors.New("ssd config: large_limit_size is not set, the SSD cache is off")
	}
	return Options{
		Cluster:     cluster,
		InstanceKey: instanceKey,
		Paths:       append([]string(nil), c.LargeFilePaths...),
		Limits:      limits,
	}, nil
}

// ParseLimits parses large_limit_size as decoded from YAML or JSON: every element an
// integer of any Go integer type, a float (fraction truncated), a json.Number or a
// size string. Each limit must be at least 512 bytes,
// the O_DIRECT alignment. Errors name the index: "large_limit_size[1]: ...".
func ParseLimits(vals []any) ([]int64, error) {
	out := make([]int64, len(vals))
	for i, v := range vals {
		n, err := limitValue(v)
		if err != nil {
			return nil, fmt.Errorf("large_limit_size[%d]: %w", i, err)
		}
		if n < Align {
			return nil, fmt.Errorf("large_limit_size[%d]: %d bytes is below the minimum of %d bytes (the O_DIRECT alignment)", i, n, Align)
		}
		out[i] = n
	}
	return out, nil
}

func limitValue(v any) (int64, error) {
	switch x := v.(type) {
	case nil:
		return 0, errors.New("null entry: want bytes or a size string such as \"4GB\"")
	case int:
		return int64(x), nil
	case int8:
		return int64(x), nil
	case int16:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case int64:
		return x, nil
	case uint:
		return uintValue(uint64(x))
	case uint8:
		return int64(x), nil
	case uint16:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case uint64:
		return uintValue(x)
	case float32:
		return floatValue(float64(x))
	case float64:
		return floatValue(x)
	case json.Number:
		return ParseSize(string(x))
	case string:
		return ParseSize(x)
	default:
		return 0, fmt.Errorf("%v (%T): want bytes or a size string such as \"4GB\"", v, v)
	}
}

func uintValue(x uint64) (int64, error) {
	if x > math.MaxInt64 {
		return 0, fmt.Errorf("%d bytes is too large", x)
	}
	return int64(x), nil
}

func floatValue(f float64) (int64, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f >= math.MaxInt64 {
		return 0, fmt.Errorf("%v is not a valid number of bytes", f)
	}
	return int64(f), nil // fractional bytes are truncated
}

// Engine names accepted by Options.Engine.
const (
	EngineAuto  = "auto"  // io_uring when the kernel allows it, else psync (logged once)
	EngineUring = "uring" // io_uring or fail
	EnginePsync = "psync" // pread/pwrite from a pool of goroutines
)

// Options configures a Storage. Zero fields take the defaults listed beside them.
type Options struct {
	// Cluster and InstanceKey name the cache root under every path:
	// <path>/<Cluster>_cluster_kv_ssd_storage/<safe InstanceKey>/. Both required.
	Cluster     string
	InstanceKey string
	// Paths and Limits are large_file_paths and the parsed large_limit_size: one limit
	// (bytes of ring space, at least 512) per path. Paths on a device already used
	// by an earlier path are skipped, their limits ignored.
	Paths  []string
	Limits []int64

	// ShardsPerDevice is the number of shard files (each its own ring) a device's
	// limit is split into. Shards are never smaller than 256 MiB unless the limit
	// itself is, so small limits get fewer shards. Default 4.
	ShardsPerDevice int
	// Engine is EngineAuto (default), EngineUring or EnginePsync.
	Engine string
	// IODepth caps the IOs one device's engine keeps in flight. Default 32.
	IODepth int
	// WriteInflight and ReadInflight bound the persists and loads one device serves
	// at once (the device's writer and reader queues); the rest wait their turn.
	// Defaults 8 and 16.
	WriteInflight int
	ReadInflight  int
	// ChunkSize and ChunkInflight shape loads: a value is read in ChunkSize pieces
	// (a multiple of 512), at most ChunkInflight in flight. Defaults 4 MiB and 4.
	ChunkSize     int64
	ChunkInflight int
	// BusyWait bounds how long a persist waits for ring space held by writing or
	// pinned entries before it fails with ErrBusy. Default 30s.
	BusyWait time.Duration
	// EvictionBatch and EvictionDelay shape the Evictions channel: a batch is sent
	// when it holds EvictionBatch entries or its first entry is EvictionDelay old.
	// Defaults 256 and 10ms.
	EvictionBatch int
	EvictionDelay time.Duration
	// SkipVerify turns off the checks of every load (record header and value
	// CRC32C; the header is not even read). It exists to measure what verification
	// costs (`fluxkv bench ssd`); the owner never sets it.
	SkipVerify bool
	// BufferedIO opens shard files without O_DIRECT. Only for development on file
	// systems without O_DIRECT (tmpfs); never in production.
	BufferedIO bool
	// OpenFile opens a shard file; tests pass Faults.OpenFile to inject IO errors.
	// Default OpenOSFile.
	OpenFile func(path string, flag int, perm os.FileMode) (File, error)
	// Logger receives structured logs. Default: disabled.
	Logger *zerolog.Logger

	// devOf maps a root to its device id; tests fake several devices on one disk.
	devOf func(root string) (uint64, error)
	// separateHeaderRead reads a record's header with an IO of its own, submitted
	// together with the value's first chunk, instead of both in one vectored read
	// (the default; see record.go). Kept to measure the alternative (RunBench,
	// BenchmarkLoad) and to test both.
	separateHeaderRead bool
	// fallocate reserves a shard file's blocks; tests fake EOPNOTSUPP. Default
	// unix.Fallocate with mode 0.
	fallocate func(fd int, size int64) error
	// blockAlign, when not 0, replaces the file system's block size as the unit
	// write runs start and end on (placementAlign; a power of two, at least
	// Align). Tests and BenchmarkPersist set Align to measure 512-byte placement.
	blockAlign int64
	// minShardSize is the smallest shard a limit is split into (default 256 MiB);
	// tests lower it to get several small shards.
	minShardSize int64
}

func (o *Options) setDefaults() {
	if o.ShardsPerDevice == 0 {
		o.ShardsPerDevice = 4
	}
	if o.Engine == "" {
		o.Engine = EngineAuto
	}
	if o.IODepth == 0 {
		o.IODepth = 32
	}
	if o.WriteInflight == 0 {
		o.WriteInflight = 8
	}
	if o.ReadInflight == 0 {
		o.ReadInflight = 16
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = 4 << 20
	}
	if o.ChunkInflight == 0 {
		o.ChunkInflight = 4
	}
	if o.BusyWait == 0 {
		o.BusyWait = 30 * time.Second
	}
	if o.EvictionBatch == 0 {
		o.EvictionBatch = 256
	}
	if o.EvictionDelay == 0 {
		o.EvictionDelay = 10 * time.Millisecond
	}
	if o.OpenFile == nil {
		o.OpenFile = OpenOSFile
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
	if o.devOf == nil {
		o.devOf = deviceOf
	}
	if o.fallocate == nil {
		o.fallocate = func(fd int, size int64) error { return unix.Fallocate(fd, 0, 0, size) }
	}
	if o.minShardSize == 0 {
		o.minShardSize = 256 << 20
	}
}

// Validate reports options that cannot work. Zero fields are valid (they take
// defaults).
func (o *Options) Validate() error {
	if o.Cluster == "" {
		return errors.New("ssd options: cluster name is required (it names the cache root)")
	}
	if o.InstanceKey == "" {
		return errors.New("ssd options: instance key is required (it names the cache root)")
	}
	if len(o.Paths) == 0 {
		return errors.New("ssd options: no paths (large_file_paths)")
	}
	if len(o.Limits) != len(o.Paths) {
		return fmt.Errorf("ssd options: %d limits (large_limit_size) for %d paths (large_file_paths): they must have the same length", len(o.Limits), len(o.Paths))
	}
	for i, p := range o.Paths {
		if p == "" {
			return fmt.Errorf("ssd options: large_file_paths[%d]: empty path", i)
		}
	}
	for i, l := range o.Limits {
		if l < Align {
			return fmt.Errorf("ssd options: large_limit_size[%d]: %d bytes is below the minimum of %d bytes", i, l, Align)
		}
	}
	switch o.Engine {
	case "", EngineAuto, EngineUring, EnginePsync:
	default:
		return fmt.Errorf("ssd options: unknown engine %q (want %q, %q or %q)", o.Engine, EngineAuto, EngineUring, EnginePsync)
	}
	if o.ShardsPerDevice < 0 || o.IODepth < 0 || o.WriteInflight < 0 || o.ReadInflight < 0 || o.ChunkInflight < 0 || o.EvictionBatch < 0 {
		return errors.New("ssd options: counts must not be negative")
	}
	if o.IODepth > 4096 {
		return fmt.Errorf("ssd options: io depth %d is above 4096", o.IODepth)
	}
	if o.ChunkSize < 0 || o.ChunkSize%Align != 0 || o.ChunkSize > maxIOSize {
		return fmt.Errorf("ssd options: chunk size %d must be a positive multiple of %d, at most %d", o.ChunkSize, Align, maxIOSize)
	}
	if o.blockAlign != 0 && (o.blockAlign < Align || o.blockAlign&(o.blockAlign-1) != 0) {
		return fmt.Errorf("ssd options: block alignment %d is not a power of two of at least %d", o.blockAlign, Align)
	}
	if o.BusyWait < 0 || o.EvictionDelay < 0 {
		return errors.New("ssd options: durations must not be negative")
	}
	return nil
}
