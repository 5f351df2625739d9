package daemon

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/fluxkv/fluxkv/internal/scripttest"
)

// TestHotSetScript replays testdata/hotset/hotset.txt against hotSet: cache
// hits, installs racing invalidations (the invalidation sequence), grace periods,
// re-registration. Holdings are named by their master holder id.
func TestHotSetScript(t *testing.T) {
	c := newHotSet(20*time.Millisecond, 1<<30, 0)
	now := time.Unix(1000, 0)
	byID := make(map[int64]*holding)
	datadriven.RunTest(t, "testdata/hotset/hotset.txt", func(t *testing.T, d *datadriven.TestData) string {
		argStr := func(k string) string { return scripttest.Arg(d, k) }
		argInt := func(k string) int64 { return scripttest.Int(d, k) }
		switch d.Cmd {
		case "get": // a get that finds cached info takes an external holder on it
			h := c.lookup(argStr("key"))
			if h == nil {
				return fmt.Sprintf("miss seq=%d\n", c.invalSeq())
			}
			c.ref(h)
			return fmt.Sprintf("hit holding=%d put=%d refs=%d\n", h.masterID, h.putID, h.refs)
		case "plan": // a get's master trip returned holding `holder`; seq is what the get read before it
			h := &holding{key: argStr("key"), putID: argInt("put"), masterID: argInt("holder"), replica: argStr("replica") == "true", len: argInt("len")}
			seq := c.invalSeq()
			if argStr("seq") != "" {
				seq = uint64(argInt("seq"))
			}
			byID[h.masterID] = h
			use, acks := c.install(h, seq)
			c.ref(use)
			return fmt.Sprintf("use=%d acks=%v\n", use.masterID, acks)
		case "release":
			h := byID[argInt("holding")]
			if acks := c.unref(h, now); len(acks) > 0 {
				return fmt.Sprintf("ack=%s\n", strings.Trim(fmt.Sprint(acks), "[]"))
			}
			if h.refs > 0 {
				return fmt.Sprintf("refs=%d\n", h.refs)
			}
			return "idle\n"
		case "invalidate":
			upTo := int64(math.MaxInt64)
			if argStr("upto") != "" {
				upTo = argInt("upto")
			}
			return fmt.Sprintf("ack=%d\n", c.invalidate(argStr("key"), upTo))
		case "tick":
			dur, err := time.ParseDuration(argStr("d"))
			if err != nil {
				t.Fatal(err)
			}
			now = now.Add(dur)
			return "ok\n"
		case "sweep":
			return fmt.Sprintf("acks=%v\n", c.sweep(now, argStr("force") == "true"))
		case "budget": // budget set=BYTES
			c.budget = argInt("set")
			return "ok\n"
		case "release-hot": // the master's ReleaseHotSet
			acks, n := c.release(argInt("bytes"))
			return fmt.Sprintf("acks=%v released=%d\n", acks, n)
		case "release-keys": // the master's ReleaseHotSet naming keys its eviction order reached
			acks, n := c.releaseKeys(strings.Split(argStr("keys"), ","))
			return fmt.Sprintf("acks=%v released=%d\n", acks, n)
		case "reset":
			c.reset()
			return "ok\n"
		case "pin": // pin bytes=N: a prefix lookup pins N bytes
			acks, ok := c.reservePin(argInt("bytes"))
			return fmt.Sprintf("ok=%v acks=%v pinned=%d\n", ok, acks, c.pinned)
		case "unpin":
			c.unpin(argInt("bytes"))
			return fmt.Sprintf("pinned=%d\n", c.pinned)
		case "state":
			var b strings.Builder
			keys := make([]string, 0, c.len())
			for k := range c.byKey {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				h := c.byKey[k]
				idle := ""
				if !h.idle.IsZero() {
					idle = fmt.Sprintf(" idle_since=%v", h.idle.Sub(time.Unix(1000, 0)))
				}
				fmt.Fprintf(&b, "%s: holding=%d put=%d refs=%d%s\n", k, h.masterID, h.putID, h.refs, idle)
			}
			fmt.Fprintf(&b, "idle=%d seq=%d\n", c.idleLen(), c.invalSeq())
			return b.String()
		}
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
		return ""
	})
}

func TestHotSetUnrefUnderflowPanics(t *testing.T) {
	c := newHotSet(time.Second, 1<<30, 0)
	defer func() {
		if recover() == nil {
			t.Fatal("releasing an unheld holding did not panic")
		}
	}()
	c.unref(&holding{key: "k"}, time.Now())
}
