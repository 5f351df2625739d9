package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Capacity is a node's memory segment and SSD cache size and use, in bytes.
type Capacity struct {
	SegmentCapacity, SegmentUsed int64
	SSDCapacity, SSDUsed         int64
	// SegmentUnknown leaves the segment gauges out: the figures are not known yet (an
	// owner before its master first answered about its pool).
	SegmentUnknown bool
}

const (
	// capacityMaxAge is how long a capacity reading is served before the function
	// is called again.
	capacityMaxAge = time.Second
	// capacityTimeout is how long a scrape waits for the capacity function.
	capacityTimeout = time.Second
)

var (
	segmentCapacityDesc = prometheus.NewDesc("kvcache_segment_capacity_bytes",
		"The memory pool in bytes: the memory (memfd) segment less its transfer and landing areas.", nil, nil)
	segmentUsedDesc = prometheus.NewDesc("kvcache_segment_used_bytes",
		"Bytes of the memory pool allocated to replicas, holders and in-flight work.", nil, nil)
	ssdCapacityDesc = prometheus.NewDesc("kv_ssd_capacity_bytes",
		"Ring space of the SSD cache in bytes (sum of large_limit_size over distinct devices; 0 when off).", nil, nil)
	ssdUsedDesc = prometheus.NewDesc("kv_ssd_used_bytes",
		"Bytes of the SSD cache rings holding values.", nil, nil)
)

// capacityCollector turns a capacity function into four gauges at scrape time,
// calling the function at most once per maxAge and waiting at most timeout for it.
type capacityCollector struct {
	maxAge, timeout time.Duration

	mu      sync.Mutex // protects the fields below
	fn      func() Capacity
	epoch   uint64 // bumped by set, so a late result of a replaced fn is dropped
	last    Capacity
	have    bool          // last holds a reading of the current fn
	at      time.Time     // when last was read
	pending chan struct{} // closed when the call in flight returns; nil when none
}

func newCapacityCollector(maxAge, timeout time.Duration) *capacityCollector {
	return &capacityCollector{maxAge: maxAge, timeout: timeout}
}

func (c *capacityCollector) set(fn func() Capacity) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fn = fn
	c.epoch++
	c.have = false
	c.pending = nil
}

// read returns the current capacity, calling the function when the last reading is
// older than maxAge; ok is false when there is no function or no reading yet.
func (c *capacityCollector) read() (v Capacity, ok bool) {
	c.mu.Lock()
	if c.fn == nil {
		c.mu.Unlock()
		return Capacity{}, false
	}
	if c.have && time.Since(c.at) < c.maxAge {
		v = c.last
		c.mu.Unlock()
		return v, true
	}
	if c.pending == nil {
		c.pending = make(chan struct{})
		go c.call(c.fn, c.epoch, c.pending)
	}
	pending := c.pending
	c.mu.Unlock()

	t := time.NewTimer(c.timeout)
	select {
	case <-pending:
	case <-t.C:
	}
	t.Stop()

	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last, c.have
}

func (c *capacityCollector) call(fn func() Capacity, epoch uint64, done chan struct{}) {
	v := fn()
	c.mu.Lock()
	if c.epoch == epoch {
		c.last, c.have, c.at = v, true, time.Now()
		c.pending = nil
	}
	c.mu.Unlock()
	close(done)
}

func (c *capacityCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- segmentCapacityDesc
	ch <- segmentUsedDesc
	ch <- ssdCapacityDesc
	ch <- ssdUsedDesc
}

// Collect emits the four gauges (the segment's left out while unknown), or none before
// a capacity function returned once.

func (c *capacityCollector) Collect(ch chan<- prometheus.Metric) {
	v, ok := c.read()
	if !ok {
		return
	}
	if !v.SegmentUnknown {
		ch <- prometheus.MustNewConstMetric(segmentCapacityDesc, prometheus.GaugeValue, float64(v.SegmentCapacity))
		ch <- prometheus.MustNewConstMetric(segmentUsedDesc, prometheus.GaugeValue, float64(v.SegmentUsed))
	}
	ch <- prometheus.MustNewConstMetric(ssdCapacityDesc, prometheus.GaugeValue, float64(v.SSDCapacity))
	ch <- prometheus.MustNewConstMetric(ssdUsedDesc, prometheus.GaugeValue, float64(v.SSDUsed))
}
