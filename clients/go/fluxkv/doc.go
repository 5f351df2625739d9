// Package fluxkv is the Go client for externals: it attaches to the local owner's
// socket, maps the shared segment (read-only for holders, read-write only inside the
// put path) and speaks the external API as framed binary thrift. A Get returns a
// MemHolder whose Bytes view the shared mapping without copying; Release it when done.
//
// The CLI, the integration tests and the Go benchmarks use this package.
package fluxkv
