// Package shm is the owner's shared-memory and local-socket plumbing: memfd segments,
// sealing, mmap, fd passing over SCM_RIGHTS, peer credentials and daemon-grade Unix
// socket listening, plus the length-prefixed framing of the attach protocol.
//
// The owner keeps the real bytes of its node in one memfd (a Segment) and hands the fd
// to each local external over the attach socket (SendFrameWithFd). The external maps it
// (MapFd): read-only for every view it hands to users, so a stray write faults in the
// offending process instead of corrupting a replica others read, and read-write only in
// its put path. The segment is sealed against shrinking and growing before its fd ever
// leaves the owner, and MapFd refuses an fd without those seals: nobody can truncate the
// file under a live mapping and turn reads into SIGBUS. Under client isolation the
// owner also seals it with F_SEAL_FUTURE_WRITE once its own read-write mapping exists
// (SegmentOptions.SealWrites): clients then map it read-only only, and write their values
// into a per-session put area (CreatePutArea) the owner copies from.
// The segment is advised for transparent huge pages (SegmentOptions.HugePages) where the
// kernel gives them to shared memory (ShmemTHP), so every mapping of it needs a 512th of
// the page-table entries; HugeBytes says how much of it got them.
//
// ListenUnix behaves like a daemon people trust (tailscale's safesocket): it refuses to
// steal a socket another daemon is serving, removes only a stale socket, never removes
// a file that is not a socket, applies the requested permissions and removes the socket
// on Close. PeerCred identifies callers with SO_PEERCRED.
//
// Everything here is Linux-only (memfd_create, F_ADD_SEALS, SO_PEERCRED, MSG_CMSG_CLOEXEC).
// Functions return errors with context; nothing logs.
package shm
