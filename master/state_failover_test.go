package master

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

// TestStateFailoverRandom is TestStateRandom's walk with master failovers: at a
// failover a new State (a new term) starts with its rebuild window open, every owner
// registers with it with the pins an owner reports (its holders, the targets and
// sources of in-flight puts, the targets of in-flight gets, quarantined pull targets)
// and reports its replica index (memory replicas with their ranges and parents, SSD
// entries) in batches, interleaved with the random operations of the other owners.
// checkStateInvariants after every step, plus the rebuild checks (rebuildInvariants).
// (The walk and its checks: state_random_test.go.)

// failoverReport is one owner's report in progress to the new master.
type failoverReport struct {
	id    string
	gen   int64
	recs  []ReplicaRecord
	next  int
	batch int
}

// ownerView is what owner id would report to a new master: its replica records and
// its pins, taken from the old master's state (an owner's index that is exact).
func ownerView(st *State, n *node) (recs []ReplicaRecord, pins []Pin) {
	var mem, ssd []ReplicaRecord
	for k, r := range st.routes {
		rep := r.replicas[n]
		if rep == nil {
			continue
		}
		if rep.memory != nil {
			rec := ReplicaRecord{Key: k, PutID: r.putID, Len: rep.memory.Len(), Memory: true, Offset: rep.memory.Offset()}
			if r.page {
				p := r.parent
				rec.Parent = &p
			}
			mem = append(mem, rec)
		}
		if rep.ssd {
			ssd = append(ssd, ReplicaRecord{Key: k, PutID: r.putID, Len: r.len, SSD: true})
		}
	}
	sort.Slice(mem, func(i, j int) bool { return mem[i].Offset < mem[j].Offset })
	sort.Slice(ssd, func(i, j int) bool { return ssd[i].Key < ssd[j].Key })
	recs = append(mem, ssd...)

	// One pin per range still in use (an owner's holding is shared by its holders).
	byAlloc := map[*Allocation]int64{}
	addPin := func(a *Allocation, id int64) {
		if a == nil || a.node != n {
			return
		}
		if cur, ok := byAlloc[a]; !ok || id < cur {
			byAlloc[a] = id
		}
	}
	for id, a := range n.holders {
		addPin(a, id)
	}
	for id, p := range st.puts {
		addPin(p.target, id)
		addPin(p.source, id)
	}
	for id, g := range st.gets {
		addPin(g.target, id)
	}
	for i, q := range st.quarantine {
		addPin(q.alloc, 1<<50+int64(i))
	}
	for a, id := range byAlloc {
		pins = append(pins, Pin{PinID: id, Offset: a.Offset(), Len: a.Len()})
	}
	sort.Slice(pins, func(i, j int) bool { return pins[i].PinID < pins[j].PinID })
	return recs, pins
}

func (d *randomDriver) failover(rng *rand.Rand) []*failoverReport {
	old := d.st
	opts := old.opts
	opts.IDBase = old.nextID + 1<<30
	opts.RebuildWindow = 30 * time.Second
	st := NewState(opts)
	st.OpenRebuild(d.now)
	var reports []*failoverReport
	order := rng.Perm(len(d.nodes))
	for _, i := range order {
		rn := d.nodes[i]
		n := old.nodes[rn.id]
		var recs []ReplicaRecord
		var pins []Pin
		if n != nil {
			recs, pins = ownerView(old, n)
		}
		if !rn.ssd.Enabled { // its SSD went away (a heartbeat's figure): no entries to report
			kept := recs[:0]
			for _, r := range recs {
				if !r.SSD {
					kept = append(kept, r)
				}
			}
			recs = kept
		}
		ref := NodeRef{ID: rn.id, Generation: rn.gen}
		if err := st.Register(d.now, ref, 12*1024, 2048, 1024, "data-"+rn.id, "peer-"+rn.id, rn.ssd, pins); err != nil {
			d.t.Fatalf("register: %v", err)
		}
		st.ExpectReport(ref)
		d.holders[rn.id] = nil
		for _, p := range pins {
			d.holders[rn.id] = append(d.holders[rn.id], p.PinID)
		}
		reports = append(reports, &failoverReport{id: rn.id, gen: rn.gen, recs: recs, batch: 1 + rng.IntN(4)})
		d.logf("failover: %s registers pins=%v reports %v", rn.id, pins, recs)
	}
	d.st = st
	d.puts, d.pulls, d.gets, d.tasks = nil, nil, nil, nil
	return reports
}

// sendReport sends the next batch of one pending report; it reports whether that
// report is done.
func (d *randomDriver) sendReport(r *failoverReport) bool {
	rn := d.nodes[0]
	for _, x := range d.nodes {
		if x.id == r.id {
			rn = x
		}
	}
	if rn.gen != r.gen {
		return true // the owner restarted: its report is gone
	}
	end := min(r.next+r.batch, len(r.recs))
	last := end == len(r.recs)
	rej, invs, err := d.st.ReportReplicas(d.now, NodeRef{ID: r.id, Generation: r.gen}, r.recs[r.next:end], last)
	d.logf("report %s %v last=%v -> rejected=%v invs=%d %v", r.id, r.recs[r.next:end], last, rej, len(invs), err)
	r.next = end
	return last || err != nil
}

// rebuildInvariants: an owner still reporting has nothing of its pool handed out since
// it registered (only pins and adopted records), and no key is routed at a version
// below its tombstone.
func rebuildInvariants(st *State) error {
	for k, r := range st.routes {
		if st.tombstones != nil {
			if tomb, ok := st.tombstones[k]; ok && r.putID <= tomb && tomb != 1<<63-1 {
				return fmt.Errorf("route %s@%d at or below its tombstone %d", k, r.putID, tomb)
			}
		}
	}
	return nil
}

func runFailoverRandom(t *testing.T, seed uint64, steps int, admit, placement string) {
	d := newRandomDriver(t, admit, placement)
	rng := rand.New(rand.NewPCG(seed, seed*13+5))
	var reports []*failoverReport
	var pins map[string]map[int64]bool
	for i := 0; i < steps; i++ {
		func() {
			defer func() {
				if r := recover(); r != nil {
					dumpLog(t, d)
					t.Fatalf("seed %d step %d: panic: %v", seed, i, r)
				}
			}()
			switch {
			case len(reports) == 0 && rng.IntN(200) == 0:
				before := routeSummary(d.st)
				reports = d.failover(rng)
				pins = map[string]map[int64]bool{}
				for id, hs := range d.holders {
					pins[id] = map[int64]bool{}
					for _, h := range hs {
						pins[id][h] = true
					}
				}
				if rng.IntN(2) == 0 {
					// Every report at once, interleaved: the routes come back exactly.
					for len(reports) > 0 {
						j := rng.IntN(len(reports))
						if d.sendReport(reports[j]) {
							reports = append(reports[:j], reports[j+1:]...)
						}
					}
					if after := routeSummary(d.st); after != before {
						dumpLog(t, d)
						t.Fatalf("seed %d step %d: routes after the rebuild differ:\nbefore:\n%s\nafter:\n%s", seed, i, before, after)
					}
				}
			case len(reports) > 0 && rng.IntN(3) == 0:
				j := rng.IntN(len(reports))
				if d.sendReport(reports[j]) {
					reports = append(reports[:j], reports[j+1:]...)
				}
			default:
				d.step(byte(rng.UintN(256)), rng.Uint64())
			}
		}()
		err := checkStateInvariants(d.st)
		if err == nil {
			err = rebuildInvariants(d.st)
		}
		if err == nil {
			err = pinsKept(d, pins)
		}
		if err != nil {
			dumpLog(t, d)
			t.Fatalf("seed %d step %d: %v\n%s", seed, i, err, dumpState(d.st))
		}
	}
}

func TestStateFailoverRandom(t *testing.T) {
	for _, tc := range []struct {
		name             string
		admit, placement string
	}{
		{"pool-evict", SSDAdmitEvict, PlacementPool},
		{"local-evict", SSDAdmitEvict, PlacementLocal},
		{"pool-put", SSDAdmitPut, PlacementPool},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			seeds := uint64(20)
			if raceEnabled || testing.Short() {
				seeds = 3
			}
			for seed := uint64(1); seed <= seeds; seed++ {
				runFailoverRandom(t, seed, 3000, tc.admit, tc.placement)
			}
		})
	}
}

// routeSummary prints every route: version, length, page, and per node memory offset and SSD.
func routeSummary(st *State) string {
	var lines []string
	for k, r := range st.routes {
		var reps []string
		for n, rep := range r.replicas {
			x := n.id + ":"
			if rep.memory == nil && !n.ssd.Enabled {
				continue
			}
			if rep.memory != nil {
				x += fmt.Sprintf("mem@%d", rep.memory.Offset())
			}
			if rep.ssd && n.ssd.Enabled {
				x += "+ssd"
			}
			reps = append(reps, x)
		}
		if len(reps) == 0 {
			continue
		}
		sort.Strings(reps)
		lines = append(lines, fmt.Sprintf("%s@%d len=%d %v", k, r.putID, r.len, reps))
	}
	sort.Strings(lines)
	out := ""
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}

// pinsKept: a pin registered at the failover stays a holder until the owner acks it
// (the driver's release op) or the owner restarts.
func pinsKept(d *randomDriver, pins map[string]map[int64]bool) error {
	for id, ps := range pins {
		n := d.st.nodes[id]
		if n == nil {
			continue
		}
		live := map[int64]bool{}
		for _, h := range d.holders[id] {
			live[h] = true
		}
		for p := range ps {
			if !live[p] {
				delete(ps, p) // acked, or the owner restarted
				continue
			}
			if n.holders[p] == nil {
				return fmt.Errorf("pin %d of %s was dropped before its ack", p, id)
			}
		}
	}
	return nil
}
