package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Stage instruments remote SSD refills (docs/architecture.md §10 "SSD pool"): the SSD owner's
// staging slots and reads, the requester's pulls. The peaks are the most seen at once
// in one refill since the node started: they show the protocol's bounds hold (at most
// STAGE_READS_IN_FLIGHT reads, STAGE_PULLS_IN_FLIGHT pulls). A nil *Stage records
// nothing.
type Stage struct {
	slots     prometheus.Gauge
	readsPeak prometheus.Gauge
	pullsPeak prometheus.Gauge
	mu        sync.Mutex // orders the peak updates
	reads     int
	pulls     int
}

// Stage returns m's remote SSD refill instruments, registering them in m's registry on
// the first call. Nil for a nil m.
func (m *Metrics) Stage() *Stage {
	if m == nil {
		return nil
	}
	m.stageOnce.Do(func() {
		s := &Stage{
			slots: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "fluxkv_stage_slots_in_use",
				Help: "Staging slots (4 MiB each) this SSD owner holds for other owners' refills: a chunk being read or waiting to be pulled, or up to 16 small ones (256 KiB) or 4 of up to 1 MiB sharing a slot.",
			}),
			readsPeak: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "fluxkv_stage_reads_in_flight_peak",
				Help: "The most SSD chunk reads one remote refill had in flight at once on this owner, since it started.",
			}),
			pullsPeak: prometheus.NewGauge(prometheus.GaugeOpts{
				Name: "fluxkv_stage_pulls_in_flight_peak",
				Help: "The most staged chunk pulls one remote SSD refill of this owner had in flight at once, since it started.",
			}),
		}
		m.reg.MustRegister(s.slots, s.readsPeak, s.pullsPeak)
		m.stage = s
	})
	return m.stage
}

// Slots adds d (±) to the staging slots in use (a slot split into sub-slots counts once).
func (s *Stage) Slots(d int) {
	if s != nil {
		s.slots.Add(float64(d))
	}
}

// Reads records n reads in flight in one refill.
func (s *Stage) Reads(n int) {
	if s != nil {
		s.peak(&s.reads, s.readsPeak, n)
	}
}

// Pulls records n pulls in flight in one refill.
func (s *Stage) Pulls(n int) {
	if s != nil {
		s.peak(&s.pulls, s.pullsPeak, n)
	}
}

func (s *Stage) peak(max *int, g prometheus.Gauge, n int) {
	s.mu.Lock()
	if n > *max {
		*max = n
		g.Set(float64(n))
	}
	s.mu.Unlock()
}
