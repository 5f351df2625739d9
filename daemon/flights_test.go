package daemon

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"
)

// TestFlightChains drives the flights of a few keys through random joins, sends and
// landings (as getMany, lead and land do them) and checks after every step: a get
// follows only a flight whose call was not sent, a flight queues only behind a sent one,
// a key has at most one flight that gets may still join (unsent), the head of a key's
// flights is the oldest that has not landed, and nothing is left once every flight
// landed.
func TestFlightChains(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { flightChains(t, seed) })
	}
}

func flightChains(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	st := newOwnerState(stateOptions{nodeID: "n1", generation: 1, segSize: 1 << 20, grace: time.Second, hotBudget: 1 << 20})
	keys := []string{"a", "b", "c"}
	type led struct {
		key string
		f   *flight
	}
	var waiting, out []led // flights led and not sent yet, flights sent and not landed
	landed := map[*flight]bool{}
	step := func(op string) {
		t.Helper()
		for _, k := range keys {
			unsent := 0
			for f := st.flights[k]; f != nil; f = f.next {
				if landed[f] {
					t.Fatalf("%s: key %s: a landed flight is still in its chain", op, k)
				}
				if !f.sent {
					unsent++
				}
				if f.next != nil && !f.sent {
					t.Fatalf("%s: key %s: a flight is queued behind one not sent", op, k)
				}
			}
			if unsent > 1 {
				t.Fatalf("%s: key %s: %d flights gets may join", op, k, unsent)
			}
		}
	}
	for i := 0; i < 400 || len(waiting)+len(out) > 0; i++ {
		switch r := rng.Intn(3); {
		case r == 0 && i < 400:
			k := keys[rng.Intn(len(keys))]
			f, lead := st.joinFlight(k, st.hot.invalSeq())
			switch {
			case !lead && f.sent:
				t.Fatalf("join %s: followed a flight whose call was sent", k)
			case lead && f.after != nil && !f.after.sent:
				t.Fatalf("join %s: queued behind a flight not sent", k)
			case lead:
				waiting = append(waiting, led{k, f})
			}
			step("join " + k)
		case r == 1 && len(waiting) > 0:
			// lead: a queued flight starts only once the one it waits for landed.
			j := rng.Intn(len(waiting))
			w := waiting[j]
			if w.f.after != nil && !landed[w.f.after] {
				continue
			}
			if st.flights[w.key] != w.f {
				t.Fatalf("send %s: the flight starting is not its key's oldest", w.key)
			}
			w.f.after = nil
			w.f.sent = true
			waiting = slices.Delete(waiting, j, j+1)
			out = append(out, w)
			step("send " + w.key)
		case r == 2 && len(out) > 0:
			j := rng.Intn(len(out))
			w := out[j]
			out = slices.Delete(out, j, j+1)
			st.endFlight(w.key, w.f, nil)
			landed[w.f] = true
			step("land " + w.key)
		}
	}
	if len(st.flights) != 0 {
		t.Fatalf("%d keys still have flights after every flight landed", len(st.flights))
	}
}
