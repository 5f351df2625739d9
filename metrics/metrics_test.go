package metrics

import (
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape serves m on 127.0.0.1:0, fetches /metrics once over HTTP and parses it.
func scrape(t *testing.T, srv *Server) map[string]*familyView {
	t.Helper()
	resp, err := http.Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape: %s: %s", resp.Status, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	out := map[string]*familyView{}
	for name, f := range fams {
		v := &familyView{samples: map[string]float64{}}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := strings.Join(labels, ",")
			switch {
			case m.Counter != nil:
				v.samples[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				v.samples[key] = m.Gauge.GetValue()
			case m.Histogram != nil:
				v.samples[key] = float64(m.Histogram.GetSampleCount())
				for _, b := range m.Histogram.GetBucket() {
					v.cumulative = append(v.cumulative, b.GetCumulativeCount())
				}
			case m.Untyped != nil:
				v.samples[key] = m.Untyped.GetValue()
			}
		}
		out[name] = v
	}
	return out
}

type familyView struct {
	samples    map[string]float64 // label string ("op=get,result=miss") → value (histograms: count)
	cumulative []uint64
}

// checkGoroutines fails t unless, after every later cleanup ran, the goroutine count
// is back to what it is now (servers must not outlive Close).
func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<16)
				t.Errorf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func serve(t *testing.T, m *Metrics) *Server {
	t.Helper()
	srv, err := Serve("127.0.0.1:0", m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return srv
}

func TestScrapeOpsAndInflight(t *testing.T) {
	checkGoroutines(t)
	m := New()
	srv := serve(t, m)

	m.Observe("get", ResultHitMemory, 40*time.Microsecond)
	m.Observe("get", ResultHitMemory, 3*time.Millisecond)
	m.Observe("get", ResultHitSSD, 2*time.Millisecond)
	m.Observe("get", ResultMiss, 20*time.Microsecond)
	m.Observe("put", ResultOK, 200*time.Microsecond)
	m.Observe("put", ResultError, time.Minute) // above the last bucket: only +Inf
	doneGet := m.Inflight("get")
	donePut1 := m.Inflight("put")
	donePut2 := m.Inflight("put")
	donePut2()
	donePut2() // a second call must not lower the gauge again

	got := scrape(t, srv)
	wantOps := map[string]float64{
		"op=get,result=hit_memory": 2,
		"op=get,result=hit_ssd":    1,
		"op=get,result=miss":       1,
		"op=put,result=ok":         1,
		"op=put,result=error":      1,
	}
	for k, want := range wantOps {
		if g := got["fluxkv_ops_total"].samples[k]; g != want {
			t.Errorf("fluxkv_ops_total{%s} = %v, want %v", k, g, want)
		}
		if g := got["fluxkv_op_duration_seconds"].samples[k]; g != want {
			t.Errorf("fluxkv_op_duration_seconds{%s} count = %v, want %v", k, g, want)
		}
	}
	if g := got["fluxkv_inflight"].samples["op=get"]; g != 1 {
		t.Errorf("fluxkv_inflight{get} = %v, want 1", g)
	}
	if g := got["fluxkv_inflight"].samples["op=put"]; g != 1 {
		t.Errorf("fluxkv_inflight{put} = %v, want 1", g)
	}
	for _, name := range []string{"go_goroutines", "process_open_fds"} {
		if got[name] == nil {
			t.Errorf("%s missing: the Go and process collectors must be registered", name)
		}
	}
	// No capacity function yet: no capacity gauges rather than made-up zeros.
	if got["kvcache_segment_capacity_bytes"] != nil {
		t.Errorf("capacity gauges present before SetCapacityFunc")
	}

	doneGet()
	donePut1()
	got = scrape(t, srv)
	for _, op := range []string{"get", "put"} {
		if g := got["fluxkv_inflight"].samples["op="+op]; g != 0 {
			t.Errorf("fluxkv_inflight{%s} = %v after done, want 0", op, g)
		}
	}
}

func TestBuckets(t *testing.T) {
	if DurationBuckets[0] != 10e-6 || DurationBuckets[len(DurationBuckets)-1] != 10 {
		t.Fatalf("buckets span %v..%v, want 10µs..10s", DurationBuckets[0], DurationBuckets[len(DurationBuckets)-1])
	}
	for i := 1; i < len(DurationBuckets); i++ {
		if DurationBuckets[i] <= DurationBuckets[i-1] {
			t.Fatalf("buckets not increasing at %d: %v", i, DurationBuckets)
		}
	}
	m := New()
	srv := serve(t, m)
	m.Observe("get", ResultHitMemory, 15*time.Microsecond) // falls in the 25µs bucket
	h := scrape(t, srv)["fluxkv_op_duration_seconds"]
	if len(h.cumulative) != len(DurationBuckets)+1 { // + the +Inf bucket
		t.Fatalf("%d buckets scraped, want %d", len(h.cumulative), len(DurationBuckets)+1)
	}
	if h.cumulative[0] != 0 || h.cumulative[1] != 1 {
		t.Errorf("cumulative counts %v: want 0 at ≤10µs and 1 from ≤25µs", h.cumulative)
	}
}

func TestScrapeCapacity(t *testing.T) {
	checkGoroutines(t)
	m := New()
	srv := serve(t, m)
	var calls atomic.Int64
	m.SetCapacityFunc(func() Capacity {
		calls.Add(1)
		return Capacity{SegmentCapacity: 1 << 30, SegmentUsed: 4096, SSDCapacity: 4 << 30, SSDUsed: 512}
	})
	t0 := time.Now()
	got := scrape(t, srv)
	want := map[string]float64{
		"kvcache_segment_capacity_bytes": 1 << 30,
		"kvcache_segment_used_bytes":     4096,
		"kv_ssd_capacity_bytes":          4 << 30,
		"kv_ssd_used_bytes":              512,
	}
	for name, w := range want {
		f := got[name]
		if f == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if g := f.samples[""]; g != w {
			t.Errorf("%s = %v, want %v", name, g, w)
		}
	}
	// A second scrape within a second reuses the reading. A machine too busy to scrape
	// twice within the second proves nothing either way: say so rather than fail.
	scrape(t, srv)
	if d := time.Since(t0); d >= capacityMaxAge {
		t.Logf("two scrapes took %v (≥ %v): reuse of the reading not checked", d, capacityMaxAge)
	} else if n := calls.Load(); n != 1 {
		t.Errorf("capacity func called %d times for two scrapes within %v, want 1", n, d)
	}
}

// A slow capacity function is cut off: scrapes return after the timeout, serve the
// last reading, and only one call is in flight at a time. The timeout is generous so
// that the first, quick call completes within it however busy the machine.
func TestCapacitySlowFunc(t *testing.T) {
	const timeout = 500 * time.Millisecond
	c := newCapacityCollector(0, timeout)
	release := make(chan struct{})
	var calls, running, maxRunning atomic.Int64
	var slow atomic.Bool
	c.set(func() Capacity {
		calls.Add(1)
		r := running.Add(1)
		if r > maxRunning.Load() {
			maxRunning.Store(r)
		}
		defer running.Add(-1)
		if slow.Load() {
			<-release
		}
		return Capacity{SegmentCapacity: calls.Load()}
	})
	v, ok := c.read()
	if !ok || v.SegmentCapacity != 1 {
		t.Fatalf("first read = %+v, %v; want capacity 1", v, ok)
	}
	slow.Store(true)
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		v, ok = c.read()
		if d := time.Since(t0); d > 20*timeout {
			t.Fatalf("read took %v with a stuck capacity func (timeout %v)", d, timeout)
		}
		if !ok || v.SegmentCapacity != 1 {
			t.Fatalf("read during a stuck call = %+v, %v; want the last reading", v, ok)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls, want 2 (one stuck call shared by the later reads)", n)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		// The stuck call's result (2), or a later call's once reads start new ones:
		// anything but the stale first reading.
		v, _ = c.read()
		if v.SegmentCapacity >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no fresh result served after the stuck call returned: %+v", v)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if maxRunning.Load() != 1 {
		t.Errorf("%d capacity calls ran at once, want 1", maxRunning.Load())
	}
}

func TestCapacityBeforeFirstReading(t *testing.T) {
	c := newCapacityCollector(time.Second, 10*time.Millisecond)
	if _, ok := c.read(); ok {
		t.Fatal("reading without a function")
	}
	release := make(chan struct{})
	defer close(release)
	c.set(func() Capacity { <-release; return Capacity{} })
	if _, ok := c.read(); ok {
		t.Fatal("reading reported before the first call returned")
	}
}

func TestNilMetrics(t *testing.T) {
	var m *Metrics
	m.Observe("get", ResultMiss, time.Millisecond)
	m.Inflight("get")()
	m.SetCapacityFunc(func() Capacity { return Capacity{} })
	if m.Registry() != nil {
		t.Error("nil Metrics has a registry")
	}
	if _, err := Serve("127.0.0.1:0", nil, Options{}); err == nil {
		t.Error("Serve accepted a nil Metrics")
	}
}

func TestServeListensBeforeReturn(t *testing.T) {
	checkGoroutines(t)
	m := New()
	srv, err := Serve("127.0.0.1:0", m, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(srv.Addr(), ":0") {
		t.Fatalf("Addr %q lacks the real port", srv.Addr())
	}
	// The port is taken: a second server on it fails at once.
	if s2, err := Serve(srv.Addr(), m, Options{}); err == nil {
		s2.Close()
		t.Fatal("second Serve on a taken port succeeded")
	}
	resp, err := http.Get("http://" + srv.Addr() + "/nope")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nope: %s, want 404", resp.Status)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get("http://" + srv.Addr() + "/metrics"); err == nil {
		t.Error("scrape after Close succeeded")
	}
	http.DefaultClient.CloseIdleConnections()
}

// BenchmarkObserve is the cost a request pays for its counter and histogram.
func BenchmarkObserve(b *testing.B) {
	m := New()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Observe("get", ResultHitMemory, 30*time.Microsecond)
		}
	})
}

// BenchmarkObserveLabels is the same through the vectors' label lookup, the
// baseline the cached children are measured against.
func BenchmarkObserveLabels(b *testing.B) {
	m := New()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.ops.WithLabelValues("get", ResultHitMemory).Inc()
			m.duration.WithLabelValues("get", ResultHitMemory).Observe(30e-6)
		}
	})
}

func BenchmarkInflight(b *testing.B) {
	m := New()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		m.Inflight("get")()
	}
}
