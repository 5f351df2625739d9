// Package fluxkv is the Go client for externals: it attaches to the local owner's
// socket, maps the shared segment (read-only for holders, read-write only inside the
// put path) and speaks the external API as framed binary thrift. A Get returns a
// MemHolder whose Bytes view the shared mapping without copying; Release it when done.
//
// Calls: Put, PutWith, PutWithID and BatchPut store values; Get and BatchGet return
// holders; Exists, BatchExists, Delete, BatchDelete and Stat; DeleteNamespace and
// NamespaceStat act on every key of a namespace. BatchExistsPrefix is the
// prefix lookup of an inference engine: given the pages of one prompt in order, it
// returns how many leading pages the cache holds, one call per wire.MaxBatch keys,
// stopping at the first absent page, and with a pin (at most MaxPin) it also keeps the
// pages it found in the owner's memory for the loads that follow.
//
// Cost of a call: each RPC connection is a blocking Unix socket driven by plain system
// calls outside Go's network poller, so a call is one sendmsg and usually one read (the
// poller would add a failed read, an epoll_wait and two goroutine switches per reply);
// a call in flight holds an OS thread, as any blocking system call does. A Get reuses
// its request and reply structs and the connection's buffers: it allocates its
// MemHolder only. BenchmarkHotGet4KiB compares a hot-set get with a plain Unix-socket
// echo of the same sizes in the same run.
//
// The CLI, the integration tests and the Go benchmarks use this package.
package fluxkv
