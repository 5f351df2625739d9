// Package daemon is the fluxkv owner: the per-node sidecar that holds the bytes. It
// creates the memfd segment, hands it to local externals over the attach socket
// (SCM_RIGHTS, SO_PEERCRED), serves the external API on a second Unix socket as framed
// binary thrift, keeps per-client holder and in-flight put records, keeps a hot set of
// holders so repeated gets of a key need no master round trip, batches holder acks,
// and registers and heartbeats with the master over TCP (Kitex).
//
// The attach connection is the client's session: when it closes (the process exited
// or died) every holder and in-flight put of that client is released.
//
// The owner's bookkeeping — sessions, pending puts, holders, the hot set, the replica
// index, the ranges of the segment being written or held, the registration and its
// lease — is one plain type, ownerState (ownerstate.go), that takes time as an
// argument and returns effects instead of making calls. Owner wraps it once behind
// Owner.mu and makes every network call outside that lock; scripts in testdata/ drive
// ownerState directly (TestOwnerScripts), process tests drive the whole owner.
package daemon
