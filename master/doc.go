// Package master is the fluxkv control plane: it owns the route table (key → version →
// per-node replicas), every memory Allocation in every owner's segment, the eviction
// policy of memory replicas, in-flight puts and gets, holder records and membership.
// It never touches payload bytes.
//
// The core (State) is a plain deterministic type that is not safe for concurrent use;
// Server wraps it once with a mutex and serves the MasterService Kitex API over TCP.
// Keeping the core single-threaded makes every protocol scenario scriptable in tests
// (testdata/*.txt) without timing games.
package master
