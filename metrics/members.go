package metrics

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// membership holds the gauges of cluster membership, read at scrape time and
// registered on the first Set call: a process shows the master's gauge only when it
// runs a master, the owner's only when it runs an owner.
type membership struct {
	membersOnce, registeredOnce sync.Once
	members, registered         funcGauge
}

var (
	membersDesc = prometheus.NewDesc("fluxkv_master_members",
		"Owners registered with this master and heard from within the node TTL; 0 on an HA master that does not lead.", nil, nil)
	registeredDesc = prometheus.NewDesc("fluxkv_owner_registered",
		"1 while this owner is registered with a master that answered its registration or a heartbeat within its lease (two heartbeat intervals less a margin), else 0.", nil, nil)
)

// SetMembersFunc installs the function that counts the master's live members, read at
// each scrape for fluxkv_master_members; it must not block. A nil f removes the gauge.
func (m *Metrics) SetMembersFunc(f func() int) {
	if m == nil {
		return
	}
	ms := &m.membership
	ms.membersOnce.Do(func() {
		ms.members.desc = membersDesc
		m.reg.MustRegister(&ms.members)
	})
	if f == nil {
		ms.members.set(nil)
		return
	}
	ms.members.set(func() float64 { return float64(f()) })
}

// SetRegisteredFunc installs the function that says whether the owner is registered
// with a master now, read at each scrape for fluxkv_owner_registered; it must not
// block. A nil f removes the gauge.
func (m *Metrics) SetRegisteredFunc(f func() bool) {
	if m == nil {
		return
	}
	ms := &m.membership
	ms.registeredOnce.Do(func() {
		ms.registered.desc = registeredDesc
		m.reg.MustRegister(&ms.registered)
	})
	if f == nil {
		ms.registered.set(nil)
		return
	}
	ms.registered.set(func() float64 {
		if f() {
			return 1
		}
		return 0
	})
}

// funcGauge is a gauge whose value a function gives at scrape time; without a function
// it emits nothing.
type funcGauge struct {
	desc *prometheus.Desc
	fn   atomic.Pointer[func() float64]
}

func (g *funcGauge) set(f func() float64) {
	if f == nil {
		g.fn.Store(nil)
		return
	}
	g.fn.Store(&f)
}

func (g *funcGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *funcGauge) Collect(ch chan<- prometheus.Metric) {
	if f := g.fn.Load(); f != nil {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, (*f)())
	}
}
