package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Changes of a master's leadership (the change label of
// fluxkv_master_leadership_changes_total).
const (
	LeadershipWon  = "won"  // this master became the leader (a new epoch)
	LeadershipLost = "lost" // its lease ended or it stopped: the term is over
)

// leadership holds the master-HA instruments, registered on first use so a process
// that never campaigns or follows a leader shows none of them.
type leadership struct {
	once     sync.Once
	leader   prometheus.Gauge
	epoch    prometheus.Gauge
	changes  *prometheus.CounterVec
	reregs   prometheus.Counter
	regsOnce sync.Once
}

func (m *Metrics) leaderInstruments() *leadership {
	l := &m.leadership
	l.once.Do(func() {
		l.leader = prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fluxkv_master_leader",
			Help: "1 while this master holds the leadership (a term; it answers only inside its lease), else 0.",
		})
		l.epoch = prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fluxkv_master_epoch",
			Help: "The epoch of this master's current (or last) leadership; 0 before its first.",
		})
		l.changes = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fluxkv_master_leadership_changes_total",
			Help: "Leaderships this master won and lost (change: won, lost).",
		}, []string{"change"})
		l.changes.WithLabelValues(LeadershipWon)
		l.changes.WithLabelValues(LeadershipLost)
		m.reg.MustRegister(l.leader, l.epoch, l.changes)
	})
	return l
}

// Leading sets whether this master serves as the leader now.
func (m *Metrics) Leading(on bool) {
	if m == nil {
		return
	}
	v := 0.0
	if on {
		v = 1
	}
	m.leaderInstruments().leader.Set(v)
}

// LeadershipChange counts a won or lost leadership; epoch is the term's.
func (m *Metrics) LeadershipChange(change string, epoch int64) {
	if m == nil {
		return
	}
	l := m.leaderInstruments()
	l.changes.WithLabelValues(change).Inc()
	l.epoch.Set(float64(epoch))
}

// Reregistered counts an owner's registration after its first: with a new leader or
// a restarted master, or again with the same master after that master tombed it.
func (m *Metrics) Reregistered() {
	if m == nil {
		return
	}
	l := &m.leadership
	l.regsOnce.Do(func() {
		l.reregs = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fluxkv_master_reregistrations_total",
			Help: "Registrations of this owner after its first: with a new master leader or a restarted master, or again with the same master after it tombed this owner.",
		})
		m.reg.MustRegister(l.reregs)
	})
	l.reregs.Inc()
}
