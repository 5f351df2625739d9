package daemon

import (
	"math"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// TestBoundsInsideMasterTimes: whatever the master's times and the owner's options,
// the bounds in force end every write of a get's target, copy into a put's range,
// read of a persist's source and pull of a pooled put before the master frees the
// range; under the master's defaults they are the options' defaults. A remote SSD
// refill's deadline stays inside the TTL for any value length the master accepts.
func TestBoundsInsideMasterTimes(t *testing.T) {
	var defaults Options
	defaults.setDefaults()
	if b := defaults.boundsFor(defaultMasterTimes); *b != (bounds{putCopy: defaults.PutCopyDeadline, persistRead: defaults.PersistReadWindow,
		planAge: planMaxAge, transfer: defaults.TransferTimeout, stageMax: stageMaxDeadline, pullPut: defaults.TransferTimeout,
		reack: defaultMasterTimes.inflightTTL}) {
		t.Errorf("under the master's defaults: %+v, want the options' defaults", *b)
	}
	long := defaults
	long.PutCopyDeadline, long.PersistReadWindow, long.TransferTimeout = time.Hour, time.Hour, time.Hour
	for _, o := range []Options{defaults, long} {
		for _, ttl := range []time.Duration{time.Second, 6 * time.Second, time.Minute, 10 * time.Minute} {
			for _, timeout := range []time.Duration{300 * time.Millisecond, 5 * time.Second, 30 * time.Second, 5 * time.Minute} {
				m := masterTimes{inflightTTL: ttl, persistTimeout: timeout, pullTimeout: timeout}
				b := o.boundsFor(m)
				// The second ack of a failed planning call's holder ids comes once the master
				// dropped whatever that call left in flight.
				if b.putCopy >= ttl || b.planAge+b.transfer >= ttl || b.persistRead >= timeout || b.pullPut >= timeout || b.reack < ttl {
					t.Errorf("options %v/%v/%v, master %+v: bounds %+v end past the master's", o.PutCopyDeadline, o.PersistReadWindow, o.TransferTimeout, m, *b)
				}
				for _, n := range []int64{1 << 20, 1 << 30, 8 << 30, 9 << 30, 1 << 40} {
					if d := b.stageDeadline(n); b.planAge+d >= ttl {
						t.Errorf("master %+v: a remote SSD refill of %d bytes may write its target %v after its plan", m, n, b.planAge+d)
					}
				}
			}
		}
	}
	if m := masterTimesOf(&mp.RegisterResponse{}); m != defaultMasterTimes {
		t.Errorf("an older master's answer: %+v, want the defaults", m)
	}
}

// TestOwnerAdoptsMasterTimes: a real master with shorter times than its defaults
// sends them at registration, and the owner's bounds follow.
func TestOwnerAdoptsMasterTimes(t *testing.T) {
	n := startNode(t, 8<<20, nil, master.Options{InflightTTL: 6 * time.Second, PersistTimeout: 3 * time.Second, PullTimeout: 7 * time.Second})
	b := n.o.bounds()
	want := bounds{putCopy: 5 * time.Second, persistRead: 2 * time.Second, planAge: time.Second,
		transfer: 3 * time.Second, stageMax: 4500 * time.Millisecond, pullPut: 6 * time.Second, reack: 6 * time.Second}
	if *b != want {
		t.Errorf("bounds in force %+v, want %+v", *b, want)
	}
}

// TestDeadlinesOfHugeValues: a refill's and a pull's deadline grow with the value up to
// their bound, also past 9.2 GB, where n bytes in nanoseconds overflowed int64 (a value
// of 9 GiB got a negative deadline: every remote get of it failed at once).
func TestDeadlinesOfHugeValues(t *testing.T) {
	var o Options
	o.setDefaults()
	o.TransferTimeout = time.Hour // (the pull's bound, under the master's TTL/2, is 30 s)
	b := o.boundsFor(defaultMasterTimes)
	for _, n := range []int64{1, 64 << 10, 1 << 30, 8 << 30, 9 << 30, 16 << 30, 1 << 40, math.MaxInt64} {
		for _, d := range []struct {
			name     string
			got, max time.Duration
		}{{"refill", b.stageDeadline(n), b.stageMax}, {"pull", b.pullDeadline(n), b.transfer}} {
			want := d.max
			if secs := stageBase.Seconds() + float64(n)/stageRate; secs < d.max.Seconds() {
				want = time.Duration(secs * float64(time.Second))
			}
			if diff := d.got - want; diff < -time.Millisecond || diff > time.Millisecond {
				t.Errorf("%s deadline of %d bytes: %v, want %v", d.name, n, d.got, want)
			}
		}
	}
}
