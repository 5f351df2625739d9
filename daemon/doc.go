// Package daemon is the fluxkv owner: the per-node sidecar that holds the bytes. It
// creates the memfd segment, hands it to local externals over the attach socket
// (SCM_RIGHTS, SO_PEERCRED), serves the external API on a second Unix socket as framed
// binary thrift, keeps per-client holder and in-flight put records, caches hot
// holders so repeated gets of a key need no master round trip, batches holder acks,
// and registers and heartbeats with the master over TCP (Kitex).
//
// The attach connection is the client's session: when it closes (the process exited
// or died) every holder and in-flight put of that client is released.
package daemon
