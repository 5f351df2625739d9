package metrics

import "github.com/prometheus/client_golang/prometheus"

// ReplicaState is what the owner's replica index and hot set hold right now, read at
// each scrape.
type ReplicaState struct {
	HotSetHoldings int64 // idle holdings kept for gets without a master trip
	HotSetBytes    int64 // their bytes
	Records        int64 // memory replicas in the replica index
}

// Replicas registers the owner's replica-index and hot-set gauges, read from state at
// each scrape, and returns the counter of gets answered from the hot set (cached
// holdings: no master trip). One owner per registry: a second call returns the same
// counter and keeps the first state. Nil for a nil m.
func (m *Metrics) Replicas(state func() ReplicaState) prometheus.Counter {
	if m == nil {
		return nil
	}
	m.replicasOnce.Do(func() { m.cachedGets = m.registerReplicas(state) })
	return m.cachedGets
}

func (m *Metrics) registerReplicas(state func() ReplicaState) prometheus.Counter {
	gauge := func(name, help string, v func(ReplicaState) int64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(v(state())) })
	}
	hits := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fluxkv_cached_gets_total",
		Help: "Gets this owner answered from a cached holding (its hot set, or a holding another external holds): no master trip.",
	})
	m.reg.MustRegister(hits,
		gauge("fluxkv_hot_set_holdings", "Idle holdings this owner keeps in its hot set (each a master holder on a replica in its segment).",
			func(s ReplicaState) int64 { return s.HotSetHoldings }),
		gauge("fluxkv_hot_set_bytes", "Bytes of the idle holdings in this owner's hot set.",
			func(s ReplicaState) int64 { return s.HotSetBytes }),
		gauge("fluxkv_replica_index_records", "Memory replicas in this owner's replica index (reported to a restarted master).",
			func(s ReplicaState) int64 { return s.Records }),
	)
	return hits
}
