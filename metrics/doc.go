// Package metrics is fluxkv's Prometheus instrumentation: per-operation counters,
// latency histograms and in-flight gauges, the memory and SSD capacity gauges the
// operator dashboards read (docs/architecture.md §7), hits by source and client bytes, membership
// and leadership, and the small HTTP server that exposes them on /metrics beside the
// /healthz and /readyz probes (Readiness says when a process's components are ready).
// docs/monitoring.md lists every metric; deploy/ holds the dashboard and alert rules
// built on them, and deploy/metrics_test.go checks they name only metrics served here.
//
// A *Metrics owns its own registry (with the Go and process collectors), so several
// nodes in one test process never collide. Every method is safe on a nil *Metrics
// and does nothing there: components take an optional *Metrics and call it
// unconditionally.
//
// Labelled counters are created with every label value at 0, so increase() sees the
// first event (the per-operation series, labelled by RPC method, are the exception).
//
// Capacities are pulled, not pushed: SetCapacityFunc installs a function that the
// registry calls at scrape time (at most once a second; a slow call is cut off after
// a second and the last value is served).
package metrics
