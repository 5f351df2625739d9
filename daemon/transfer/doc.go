// Package transfer is the owner-to-owner data plane (docs/architecture.md §3, §10): it moves a
// value's bytes from one owner's segment into another's over TCP.
//
// Pull only. Every byte in a segment is written by the process that owns it, so a
// transfer is always a pull by the owner of the destination range: the puller
// (Client, a Puller) reads from the socket straight into its own mapping, and the
// source (Server, over a Source) only reads its mapping and writes it to the socket.
// Only the puller has to know whether its destination range is still open, so a late,
// duplicated or stray transfer can never land in a range that was freed and reused.
// A pull names a fence, the source incarnation (node id and generation) and the
// transfer id the source range is retained for; the Source refuses a pull whose fence
// or range it does not hold (ErrFenced).
//
// Wire, version 1. A connection opens with protocol/auth's handshake for purpose
// "data" (the versioned hello carrying the cluster authentication); then the client
// sends requests and the server answers them in order, one at a time, and the
// connection is pooled per peer address for the next pull. Pull sends one request and
// reads its answer; PullMany (a get batch's values from one owner) keeps up to 32
// requests ahead, so the source streams one value after another without a round trip
// between them. At most ClientOptions.MaxPullsPerPeer pulls or PullMany runs (default
// 4; staged pulls aside) are in flight to one peer; more wait.
// Integers are big-endian:
//
//	request  (40 + n bytes): magic "FXKD" | version 1 | op (1 = PULL, 2 = PULL_STAGED) | node id length n (2; 1..256)
//	                         | transfer id (8) | source generation (8) | offset (8) | length (8) | node id (n)
//	response (16 + m bytes): magic "FXKD" | version 1 | status (1) | message length m (2; ≤ 256)
//	                         | length (8) | message (m)
//	                         then, for status OK, exactly length bytes: the source range.
//
// The message of an OK response is padding the puller skips: the server pads the
// header to 64 bytes (128 for some source offsets), which keeps the kernel's copies of
// the data off a slow path of the CPU (wire.go, okHeaderLen).
//
// Status: 0 OK; 1 FENCED (the fence or range is not what the source retains; the
// connection stays usable); 2 BAD_REQUEST (malformed: the server closes the
// connection); 3 UNAVAILABLE (the source cannot serve now); 4 WAIT (length 0, no
// message; only for PULL_STAGED: the chunk is still being read from SSD, sent every
// 250 ms, the final status follows), so a puller tells a slow disk from a dead source
// within its progress deadline. A WaitingSource (the owner's) waits for the chunk on
// the serving goroutine and has the WAITs sent from there; another Source is waited for
// on a goroutine of its own. The server allocates
// nothing from a length field: a request header is at most 296 bytes, and the bytes a
// pull sends are the slice the Source returned, written from there (no intermediate
// buffer): an OK header and the first MiB of its data in one writev on the TCP
// connection, so the puller finds the data behind the header instead of parking
// between them.
//
// The puller (reply.go) reads an OK response's padding and data with one readv, into
// whose last vector goes whatever of the next response's fixed header (16 bytes, never
// more) arrived behind them: a PullMany whose source streams ahead costs one read per
// value instead of three. Bytes read ahead once every request was answered came
// unasked: that connection is not pooled.
//
// Deadlines. The puller fails a pull when no byte arrives for ProgressTimeout (a wait
// for a reply's header gets all of it; data streaming in, between 3/4 and all of it,
// so that not every read moves the deadline), sets TCP_USER_TIMEOUT on each
// connection, and closes the connection when its context ends; a connection that failed mid-pull is never pooled again. Errors wrap ErrFenced
// (re-plan) or ErrUnreachable (revoke, and re-plan without that node).
//
// RDMA. Puller is the whole contract the owner uses: an RDMA transport implements
// Pull(ctx, addr, fence, offset, dst) with a one-sided read into the registered
// destination mapping, the fence checked by the source when it grants the remote key.
package transfer
