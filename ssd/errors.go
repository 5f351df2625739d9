package ssd

import "errors"

// The sentinels callers branch on; every other error is wrapped with context and
// may wrap an OS error (errors.Is(err, unix.ENOSPC) works).
var (
	// ErrNotFound: no readable entry for this key and put id (never stored, evicted,
	// overtaken, removed, still writing, or another version).
	ErrNotFound = errors.New("ssd: entry not found")
	// ErrClosed: the storage (or engine) is closed or closing.
	ErrClosed = errors.New("ssd: closed")
	// ErrTooLarge: the aligned value is larger than any shard file.
	ErrTooLarge = errors.New("ssd: value larger than a shard")
	// ErrStale: a persist lost to a newer put id of the same key (or a persist of the
	// same one still writing), or the key was removed while its bytes were being written.
	ErrStale = errors.New("ssd: put id superseded")
	// ErrMoved: a staged load lost its record to a rewrite of the same version (the
	// master's refresh) while it waited for a buffer, and the ring's tail then passed
	// the record it had begun: the version is still stored (at the rewrite), so load it
	// again. Not a failed read: the replica stays.
	ErrMoved = errors.New("ssd: record moved by a rewrite of its version")
	// ErrBusy: ring space stayed held by writing or pinned entries for BusyWait.
	ErrBusy = errors.New("ssd: ring space busy")
	// ErrCorrupt: a load read other bytes than the record stored (checksum, key, put
	// id, length or format mismatch); the entry was dropped. Handle it like any
	// failed SSD read: the replica is gone.
	ErrCorrupt = errors.New("ssd: corrupt record")
	// ErrLimit: a large_limit_size entry its path cannot hold (more than the free
	// space, or than the file system's largest file). A setting to refuse at start,
	// not an IO failure: the error names the path, the limit and what fits.
	ErrLimit = errors.New("ssd: large_limit_size does not fit")
)

// limitError is an error that is also ErrLimit (errors.Is), keeping its own text and
// the OS error it wraps.
type limitError struct{ err error }

func (e limitError) Error() string        { return e.err.Error() }
func (e limitError) Unwrap() error        { return e.err }
func (e limitError) Is(target error) bool { return target == ErrLimit }
