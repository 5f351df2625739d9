package metrics

import "github.com/prometheus/client_golang/prometheus"

// Where a get's value came from (the source and locality labels of
// fluxkv_get_hits_total).
const (
	SourceMemory   = "memory" // a memory replica
	SourceSSD      = "ssd"    // an SSD replica (refilled into memory for the get)
	LocalityLocal  = "local"  // the replica was on this owner: no byte crossed the network
	LocalityRemote = "remote" // pulled from another owner's replica over the data plane
)

// Directions of the clients' value bytes (the dir label of fluxkv_client_bytes_total).
const (
	ClientIn  = "in"  // value bytes of the puts clients completed (PutEnd answered OK)
	ClientOut = "out" // value bytes of the holders gets handed to clients
)

// traffic counts what clients get and put, one key at a time (a batch call counts each
// of its keys): hits by source and locality, misses, and value bytes in and out.
type traffic struct {
	hits   *prometheus.CounterVec
	misses prometheus.Counter
	bytes  *prometheus.CounterVec

	// The children, resolved once: hit[ssd][remote].
	hit     [2][2]prometheus.Counter
	in, out prometheus.Counter
}

func newTraffic() *traffic {
	t := &traffic{
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fluxkv_get_hits_total",
			Help: "Keys gets found and handed to a client, by source (memory, ssd: the tier the value came from) and locality (local: on this owner, remote: pulled from another owner). Each key of a batch get counts.",
		}, []string{"source", "locality"}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fluxkv_get_misses_total",
			Help: "Keys gets did not find (KEY_NOT_FOUND). Each key of a batch get counts.",
		}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fluxkv_client_bytes_total",
			Help: "Value bytes between this owner and its clients, by direction (in: puts completed, out: gets answered).",
		}, []string{"dir"}),
	}
	for i, src := range []string{SourceMemory, SourceSSD} {
		for j, loc := range []string{LocalityLocal, LocalityRemote} {
			t.hit[i][j] = t.hits.WithLabelValues(src, loc)
		}
	}
	t.in, t.out = t.bytes.WithLabelValues(ClientIn), t.bytes.WithLabelValues(ClientOut)
	return t
}

func (t *traffic) collectors() []prometheus.Collector {
	return []prometheus.Collector{t.hits, t.misses, t.bytes}
}

// GetHit counts one key a get handed to a client: from an SSD replica or a memory one,
// pulled from another owner (remote) or not, n value bytes.
func (m *Metrics) GetHit(ssd, remote bool, n int64) {
	if m == nil {
		return
	}
	m.traffic.hit[b2i(ssd)][b2i(remote)].Inc()
	if n > 0 {
		m.traffic.out.Add(float64(n))
	}
}

// GetMiss counts one key a get did not find.
func (m *Metrics) GetMiss() {
	if m == nil {
		return
	}
	m.traffic.misses.Inc()
}

// PutBytes counts n value bytes of completed puts.
func (m *Metrics) PutBytes(n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.traffic.in.Add(float64(n))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
