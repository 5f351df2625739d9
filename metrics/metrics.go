package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Results an operation is labelled with (the result label of fluxkv_ops_total and
// fluxkv_op_duration_seconds).
const (
	ResultOK        = "ok"         // a put, delete or exists that succeeded
	ResultHitMemory = "hit_memory" // a get served from a memory replica
	ResultHitSSD    = "hit_ssd"    // a get served from an SSD replica
	ResultMiss      = "miss"       // a get (or exists) of an absent key
	ResultNotLeader = "not_leader" // a master call answered NOT_LEADER: an HA standby (or a lapsed leader) redirecting, by design
	ResultError     = "error"      // anything that failed
)

// DurationBuckets are the latency histogram's upper bounds in seconds: 1, 2.5 and 5
// per decade from 10µs to 10s. A memory-hit get on a Unix socket takes tens of
// microseconds; an SSD refill of a large value or a put waiting for space takes up
// to seconds.
var DurationBuckets = []float64{
	10e-6, 25e-6, 50e-6,
	100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3,
	10e-3, 25e-3, 50e-3,
	100e-3, 250e-3, 500e-3,
	1, 2.5, 5,
	10,
}

// Metrics holds one node's (or one process's) instruments and their registry.
// A nil *Metrics is valid and records nothing.
type Metrics struct {
	reg      *prometheus.Registry
	ops      *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inflight *prometheus.GaugeVec
	capacity *capacityCollector
	events   *events
	traffic  *traffic

	// byOp caches the counter and histogram child of each (op, result) so Observe
	// does one map lookup instead of two label hashes: opKey → *opInstruments.
	byOp sync.Map
	// inflightByOp caches the in-flight gauge child of each op: string → prometheus.Gauge.
	inflightByOp sync.Map

	stageOnce sync.Once
	stage     *Stage

	replicasOnce sync.Once
	cachedGets   prometheus.Counter

	leadership leadership
	membership membership
}

type opKey struct{ op, result string }

type opInstruments struct {
	count    prometheus.Counter
	duration prometheus.Observer
}

// New returns instruments registered in a fresh registry that also carries the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fluxkv_ops_total",
			Help: "Operations served, by operation and result (ok, hit_memory, hit_ssd, miss, not_leader, error).",
		}, []string{"op", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fluxkv_op_duration_seconds",
			Help:    "Operation latency in seconds, by operation and result.",
			Buckets: DurationBuckets,
		}, []string{"op", "result"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fluxkv_inflight",
			Help: "Operations in progress, by operation.",
		}, []string{"op"}),
		capacity: newCapacityCollector(capacityMaxAge, capacityTimeout),
		events:   newEvents(),
		traffic:  newTraffic(),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.ops, m.duration, m.inflight, m.capacity,
	)
	m.reg.MustRegister(m.events.collectors()...)
	m.reg.MustRegister(m.traffic.collectors()...)
	return m
}

// Registry is the registry every instrument lives in; callers may register their own
// collectors in it. Nil for a nil *Metrics.
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// SetCapacityFunc installs the function that reports segment and SSD capacity and
// use. It is called at scrape time, at most once per second (later scrapes within
// the second reuse its value); a call slower than a second is not waited for: the
// scrape serves the previous value (or no capacity gauges at all before the first
// call returned) and the next scrape picks up the late result. Only one call runs at
// a time. f may do an RPC. A nil f removes the capacity gauges.
func (m *Metrics) SetCapacityFunc(f func() Capacity) {
	if m == nil {
		return
	}
	m.capacity.set(f)
}

// Observe counts one finished operation and records its latency.
func (m *Metrics) Observe(op, result string, d time.Duration) {
	if m == nil {
		return
	}
	k := opKey{op, result}
	v, ok := m.byOp.Load(k)
	if !ok {
		v, _ = m.byOp.LoadOrStore(k, &opInstruments{
			count:    m.ops.WithLabelValues(op, result),
			duration: m.duration.WithLabelValues(op, result),
		})
	}
	in := v.(*opInstruments)
	in.count.Inc()
	in.duration.Observe(d.Seconds())
}

// Inflight raises the in-flight gauge of op; the returned func lowers it again and
// must be called once when the operation ends (later calls do nothing).
func (m *Metrics) Inflight(op string) (done func()) {
	if m == nil {
		return noop
	}
	v, ok := m.inflightByOp.Load(op)
	if !ok {
		v, _ = m.inflightByOp.LoadOrStore(op, m.inflight.WithLabelValues(op))
	}
	g := v.(prometheus.Gauge)
	g.Inc()
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			g.Dec()
		}
	}
}

func noop() {}
