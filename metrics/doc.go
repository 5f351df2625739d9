// Package metrics is fluxkv's Prometheus instrumentation: per-operation counters,
// latency histograms and in-flight gauges, the memory and SSD capacity gauges the
// operator dashboards read (DESIGN.md §7), and the small HTTP server that exposes
// them on /metrics.
//
// A *Metrics owns its own registry (with the Go and process collectors), so several
// nodes in one test process never collide. Every method is safe on a nil *Metrics
// and does nothing there: components take an optional *Metrics and call it
// unconditionally.
//
// Capacities are pulled, not pushed: SetCapacityFunc installs a function that the
// registry calls at scrape time (at most once a second; a slow call is cut off after
// a second and the last value is served).
package metrics
