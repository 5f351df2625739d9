package master

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/fluxkv/fluxkv/internal/scripttest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestScenarios replays the master protocol scripts in testdata/ (put, overwrite,
// delete, eviction, holders, late SSD commits, tombs, TTL expiry) against State.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		st := NewState(Options{IDBase: 100, NodeTTL: 5 * time.Second, InflightTTL: 60 * time.Second})
		now := time.Unix(1000, 0)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := runCmd(st, &now, d)
			// The scripts model every invalidation as delivered and confirmed at once.
			clear(st.syncPending)
			// The namespace index never drifts from the routes, whatever a command did.
			if _, drift := dumpNamespaces(st); drift != nil {
				t.Fatalf("%s: after %q: %v", d.Pos, d.Cmd, drift)
			}
			// Nor do the pool's page ghost from the live pages of the nodes sharing it,
			// the nodes' duplicate counts and borrowed keys from their replicas.
			for _, drift := range []error{ghostDrift(st), dupDrift(st), borrowedDrift(st)} {
				if drift != nil {
					t.Fatalf("%s: after %q: %v", d.Pos, d.Cmd, drift)
				}
			}
			// Nor any of the State's structural invariants (state_random_test.go).
			if err := checkStateInvariants(st); err != nil {
				t.Fatalf("%s: after %q: %v\n%s", d.Pos, d.Cmd, err, dumpState(st))
			}
			if err != nil {
				return "error: " + err.Error() + "\n"
			}
			return out
		})
	})
}

// ghostDrift reports a pool ghost whose count of live pages is not the nodes' pages, or
// that holds more than its bound.
func ghostDrift(st *State) error {
	live := 0
	for _, n := range st.nodes {
		live += n.policy.pages.Len()
	}
	if g := st.ghosts; g.live != live || g.Len() > g.bound() {
		return fmt.Errorf("page ghost counts %d live pages (the nodes hold %d) and remembers %d (bound %d)", g.live, live, g.Len(), g.bound())
	}
	return nil
}

// dupDrift reports a node whose duplicate count is not its memory replicas whose key
// has a memory replica on another live node.
func dupDrift(st *State) error {
	want := map[*node]int{}
	for key, r := range st.routes {
		for n, rep := range r.replicas {
			if rep.memory != nil && !n.tombed && st.duplicateLocked(key, n) {
				want[n]++
			}
		}
	}
	for _, n := range st.nodes {
		if n.dups != want[n] {
			return fmt.Errorf("node %s counts %d duplicates, holds %d", n.id, n.dups, want[n])
		}
	}
	return nil
}

// ssdDrift reports a node whose count of SSD replicas (Members) is not the routes'.
func ssdDrift(st *State) error {
	want := map[*node]int64{}
	for _, r := range st.routes {
		for n, rep := range r.replicas {
			if rep.ssd {
				want[n]++
			}
		}
	}
	for _, n := range st.nodes {
		if n.ssdReplicas != want[n] {
			return fmt.Errorf("node %s counts %d SSD replicas, holds %d", n.id, n.ssdReplicas, want[n])
		}
	}
	return nil
}

// valuesDrift reports counts of values and duplicate bytes (MemoryValues) that are not
// the routes'.
func valuesDrift(st *State) error {
	var values, dupBytes int64
	for key, r := range st.routes {
		copies := 0
		var size int64
		for m, rep := range r.replicas {
			if m.tombed || rep.memory == nil {
				continue
			}
			if copies++; copies == 1 {
				size = rep.memory.Size()
			} else {
				if rep.memory.Size() != size {
					return fmt.Errorf("copies of %s of %d and %d bytes", key, size, rep.memory.Size())
				}
				dupBytes += size
			}
		}
		if copies > 0 {
			values++
		}
	}
	if v, d := st.MemoryValues(); v != values || d != dupBytes {
		return fmt.Errorf("counted %d values and %d duplicate bytes, the routes hold %d and %d", v, d, values, dupBytes)
	}
	return nil
}

// holdsDrift reports a node whose count of allocations only holders keep, or whose
// index of held allocations by offset, is not its holders'.
func holdsDrift(st *State) error {
	for _, n := range st.nodes {
		holds := map[*Allocation]int{}
		for _, a := range n.holders {
			holds[a]++
		}
		sole := 0
		for a, c := range holds {
			if a.holds != c {
				return fmt.Errorf("node %s: allocation at %d counts %d holds, %d holders name it", n.id, a.r.Offset, a.holds, c)
			}
			if n.heldAt[a.r.Offset] != a {
				return fmt.Errorf("node %s: held allocation at %d not indexed", n.id, a.r.Offset)
			}
			if a.refs == 1 {
				sole++
			}
		}
		if len(n.heldAt) != len(holds) || n.soleHeld != sole {
			return fmt.Errorf("node %s: %d indexed and %d sole holdings counted, holders keep %d and %d", n.id, len(n.heldAt), n.soleHeld, len(holds), sole)
		}
	}
	return nil
}

// keysDrift reports a node whose set of keys (what a tomb walks) is not the keys of the
// routes with a replica on it.
func keysDrift(st *State) error {
	want := map[*node]int{}
	for key, r := range st.routes {
		for n := range r.replicas {
			if _, ok := n.keys[key]; !ok {
				return fmt.Errorf("node %s holds a replica of %s its keys lack", n.id, key)
			}
			want[n]++
		}
	}
	for _, n := range st.nodes {
		if len(n.keys) != want[n] {
			return fmt.Errorf("node %s has %d keys, holds replicas of %d", n.id, len(n.keys), want[n])
		}
	}
	return nil
}

// borrowedDrift reports a node whose set of borrowed keys is not its memory replicas
// in the transfer area.
func borrowedDrift(st *State) error {
	want := map[*node]int{}
	for key, r := range st.routes {
		for n, rep := range r.replicas {
			if rep.memory != nil && rep.memory.inArea() && !n.tombed {
				if !n.borrowed.has(key) {
					return fmt.Errorf("node %s: %s lies in the transfer area, not among its borrowed keys", n.id, key)
				}
				want[n]++
			}
		}
	}
	for _, n := range st.nodes {
		if n.borrowed.len() != want[n] {
			return fmt.Errorf("node %s lists %d borrowed keys, holds %d replicas in its transfer area", n.id, n.borrowed.len(), want[n])
		}
	}
	return nil
}

// arg and argInt read a command's arguments (scripttest).
var (
	arg    = scripttest.Arg
	argInt = scripttest.Int
)

func nref(st *State, d *datadriven.TestData) NodeRef {
	id := arg(d, "node")
	if g := argInt(d, "gen"); g != 0 {
		return NodeRef{ID: id, Generation: g}
	}
	if n := st.nodes[id]; n != nil {
		return NodeRef{ID: id, Generation: n.generation}
	}
	return NodeRef{ID: id, Generation: 1}
}

// scriptPutID is the id= of a put command, or without one the newest in-flight put of
// the key (scripts that leave ids out stay valid when earlier steps change).
func scriptPutID(st *State, d *datadriven.TestData) int64 {
	if arg(d, "id") != "" {
		return argInt(d, "id")
	}
	var id int64
	for i, p := range st.puts {
		if p.key == arg(d, "key") && i > id {
			id = i
		}
	}
	return id
}

// scriptGetID is scriptPutID for gets (of the key, by the node).
func scriptGetID(st *State, d *datadriven.TestData) int64 {
	if arg(d, "id") != "" {
		return argInt(d, "id")
	}
	var id int64
	for i, g := range st.gets {
		if g.key == arg(d, "key") && g.node.id == arg(d, "node") && i > id {
			id = i
		}
	}
	return id
}

// scriptTasks keeps the write-back tasks each script's write-backs printed, for task-done.
var scriptTasks = taskLog{tasks: make(map[*State][]*PersistTask)}

type taskLog struct {
	mu    sync.Mutex
	tasks map[*State][]*PersistTask
}

func (l *taskLog) add(st *State, t *PersistTask) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tasks[st] = append(l.tasks[st], t)
}

// find is the last task of put putID printed for st whose bytes come from node from.
func (l *taskLog) find(st *State, putID int64, from string) *PersistTask {
	l.mu.Lock()
	defer l.mu.Unlock()
	ts := l.tasks[st]
	for i := len(ts) - 1; i >= 0; i-- {
		if t := ts[i]; t.PutID == putID && (t.SourceNodeID == from || t.SourceNodeID == "" && t.NodeID == from) {
			return t
		}
	}
	return nil
}

// scriptLine runs one script command (as in testdata/*.txt, its input lines after it)
// on st and returns its output.
func scriptLine(t *testing.T, st *State, now *time.Time, line string, input ...string) string {
	t.Helper()
	cmd, args, err := datadriven.ParseLine(line)
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	out, err := runCmd(st, now, &datadriven.TestData{Cmd: cmd, CmdArgs: args, Input: strings.Join(input, "\n")})
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	return out
}

func runCmd(st *State, now *time.Time, d *datadriven.TestData) (string, error) {
	key := arg(d, "key")
	switch d.Cmd {
	case "register":
		var pins []Pin
		for _, line := range strings.Fields(d.Input) {
			var p Pin
			if _, err := fmt.Sscanf(line, "%d:%d+%d", &p.PinID, &p.Offset, &p.Len); err != nil {
				return "", err
			}
			pins = append(pins, p)
		}
		ssd := SSDInfo{Enabled: arg(d, "ssd") != "", CapacityBytes: argInt(d, "ssd"), UsedBytes: argInt(d, "ssdused"),
			MaxValueBytes: argInt(d, "ssdmax")}
		peer := "peer-" + arg(d, "node")
		if a := arg(d, "addr"); a != "" {
			peer = a
		}
		ref := NodeRef{ID: arg(d, "node"), Generation: argInt(d, "gen")}
		if err := st.Register(*now, ref, argInt(d, "size"), argInt(d, "reserve"), argInt(d, "landing"), "", peer, ssd, pins); err != nil {
			return "", err
		}
		if arg(d, "reports") != "" { // registered from another master: it reports next
			st.ExpectReport(ref)
		}
		if arg(d, "legacy") != "" { // an owner of an earlier release (remote_refill_holders false)
			st.RefillHoldersAtDone(ref)
		}
		return "ok\n", nil
	case "heartbeat":
		// heartbeat node=N [ack=SEQ]: prints the unacked eviction notices it carries.
		// heartbeat node=N [ack=SEQ] [ssd=BYTES]: without ssd= the owner reports no SSD tier.
		var info SSDInfo
		if c := argInt(d, "ssd"); c > 0 {
			info = SSDInfo{Enabled: true, CapacityBytes: c}
		}
		ns, err := st.Heartbeat(*now, nref(st, d), info, argInt(d, "ack"))
		if err != nil || len(ns.Evicted)+len(ns.SSDDropped) == 0 {
			return "ok\n", err
		}
		list := func(kvs []*common.KeyVersion, seqs []int64) string {
			var out []string
			for i, e := range kvs {
				s := fmt.Sprintf("%s@%d", e.Key, e.PutId)
				if seqs != nil {
					s += fmt.Sprintf("#%d", seqs[i])
				}
				out = append(out, s)
			}
			return strings.Join(out, ",")
		}
		out := "ok"
		if len(ns.Evicted) > 0 {
			out += " evicted=" + list(ns.Evicted, ns.EvictedSeqs)
		}
		if len(ns.SSDDropped) > 0 {
			out += " ssd_dropped=" + list(ns.SSDDropped, nil)
		}
		return fmt.Sprintf("%s seq=%d more=%v\n", out, ns.Seq, ns.More), nil
	case "rebuild":
		// rebuild window=DUR: open the rebuild window now (a master's start).
		w, err := time.ParseDuration(arg(d, "window"))
		st.opts.RebuildWindow = w
		st.OpenRebuild(*now)
		return "ok\n", err
	case "report":
		// report node=N [last=1], one record a line: KEY PUT_ID LEN mem@OFFSET|ssd
		// [parent=P] (a KV page; parent=- for a chain's first page)
		var recs []ReplicaRecord
		for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
			if line == "" {
				continue // an empty batch
			}
			var r ReplicaRecord
			var where string
			if _, err := fmt.Sscanf(line, "%s %d %d %s", &r.Key, &r.PutID, &r.Len, &where); err != nil {
				return "", fmt.Errorf("record %q: %w", line, err)
			}
			if f := strings.Fields(line); len(f) > 4 {
				p, _ := strings.CutPrefix(f[4], "parent=")
				if p == "-" {
					p = ""
				}
				r.Parent = &p
			}
			if off, ok := strings.CutPrefix(where, "mem@"); ok {
				r.Memory = true
				r.Offset, _ = strconv.ParseInt(off, 10, 64)
			} else {
				r.SSD = where == "ssd"
			}
			recs = append(recs, r)
		}
		rejected, invs, err := st.ReportReplicas(*now, nref(st, d), recs, arg(d, "last") != "")
		return fmt.Sprintf("rejected=%v%s\n", rejected, fmtInv(invs)), err
	case "put", "put-start":
		p, err := st.PutStart(*now, nref(st, d), key, argInt(d, "len"), arg(d, "nx") != "", scriptParent(d))
		if err != nil {
			return "", err
		}
		where := ""
		if p.TargetNode != arg(d, "node") {
			where = fmt.Sprintf(" target=%s source=%d", p.TargetNode, p.SourceOffset)
		}
		if d.Cmd == "put-start" {
			return fmt.Sprintf("put_id=%d offset=%d%s ssd=%v\n", p.PutID, p.TargetOffset, where, p.PersistToSSD), nil
		}
		res, err := st.PutDone(*now, nref(st, d), key, p.PutID)
		for err == nil && res.Pull != nil { // plain puts in scripts are pulled at once
			res, err = st.PullDone(*now, p.PutID, nil, true)
		}
		if err != nil {
			return "", err
		}
		if res.Persist != nil {
			st.PersistDone(res.Persist.PutID, true) // plain puts in scripts persist at once
		}
		return fmt.Sprintf("put_id=%d offset=%d%s%s\n", p.PutID, p.TargetOffset, where, fmtInv(res.Invalidations)), nil
	case "put-done":
		res, err := st.PutDone(*now, nref(st, d), key, scriptPutID(st, d))
		return fmtPutResult(res), err
	case "pull-done":
		// pull-done id=N [err=TEXT] [unanswered]
		var pullErr error
		if e := arg(d, "err"); e != "" {
			pullErr = errors.New(e)
		}
		res, err := st.PullDone(*now, scriptPutID(st, d), pullErr, arg(d, "unanswered") == "")
		return fmtPutResult(res), err
	case "spare-held":
		// spare-held set=true|false: the server's first allocation attempt.
		st.spareHeld = arg(d, "set") == "true"
		return "ok\n", nil
	case "placement":
		st.opts.Placement = arg(d, "set")
		return "ok\n", nil
	case "releases":
		// releases: the hot-set release calls due (Server.withState makes them).
		st.releasesDue = false
		var b strings.Builder
		calls := st.takeReleasesLocked()
		slices.SortFunc(calls, func(a, b releaseCall) int { return strings.Compare(a.id, b.id) })
		for _, c := range calls {
			fmt.Fprintf(&b, "release node=%s keys=%s\n", c.id, strings.Join(c.keys, ","))
		}
		if len(calls) == 0 {
			b.WriteString("none\n")
		}
		return b.String(), nil
	case "release-answered":
		// release-answered node=N keys=K,...: the owner answered the call naming keys.
		n := st.nodes[arg(d, "node")]
		n.release.answered(strings.Split(key+arg(d, "keys"), ","), func(k string) bool { return st.heldLocked(k, n) })
		return fmt.Sprintf("asked=%d\n", len(n.release.asked)), nil
	case "write-backs":
		// write-backs: the write-back persists started since the last (Server.withState
		// submits them); task-done ends one of them.
		var b strings.Builder
		for _, t := range st.takeWriteBacksLocked() {
			scriptTasks.add(st, t)
			from := ""
			if t.SourceNodeID != "" {
				from = " from=" + t.SourceNodeID
			}
			fmt.Fprintf(&b, "persist key=%s put=%d %s:%d+%d%s\n", t.Key, t.PutID, t.NodeID, t.Offset, t.Len, from)
		}
		if b.Len() == 0 {
			b.WriteString("none\n")
		}
		return b.String(), nil
	case "order":
		// order node=N: N's KV pages in the order evictions draw them, then those out of
		// it while their write-back runs (stepAway), and its duplicates and the evictions
		// before its next search for one (node.dups, dupQuiet).
		n := st.nodes[arg(d, "node")]
		p := n.policy.pages
		order := slices.Clone(p.heap)
		slices.SortFunc(order, func(a, b *pageEntry) int {
			if evictedBefore(a, b) {
				return -1
			}
			return 1
		})
		var keys, away []string
		for _, e := range order {
			keys = append(keys, e.key)
		}
		for k, e := range p.entries {
			if e.away {
				away = append(away, k)
			}
		}
		slices.Sort(away)
		return fmt.Sprintf("order=%s away=%s dups=%d quiet=%d\n", strings.Join(keys, ","), strings.Join(away, ","), n.dups, n.dupQuiet), nil
	case "write-ahead":
		// write-ahead node=N: the write-back's top-up of node N (after each publish and eviction).
		st.writeAheadLocked(st.nodes[arg(d, "node")])
		return "ok\n", nil
	case "ssd-admit":
		// ssd-admit set=evict|put [ahead=F] [queue=N]: Options.SSDAdmit, WriteBackAhead
		// and PersistQueue.
		st.opts.SSDAdmit = arg(d, "set")
		if q := argInt(d, "queue"); q > 0 {
			st.opts.PersistQueue = int(q)
		}
		if a := arg(d, "ahead"); a != "" {
			f, err := strconv.ParseFloat(a, 64)
			st.opts.WriteBackAhead = f
			return "ok\n", err
		}
		return "ok\n", nil
	case "persist-done":
		// persist-done put=N [failed]
		st.PersistDone(argInt(d, "put"), arg(d, "failed") == "")
		return "ok\n", nil
	case "task-done":
		// task-done put=N from=NODE [failed]: the persister ends the write-back task of put N
		// reading from NODE that write-backs printed (PersistTaskDone), as it ends every
		// task, also one whose write-back was passed to another copy since.
		t := scriptTasks.find(st, argInt(d, "put"), arg(d, "from"))
		if t == nil {
			return "", fmt.Errorf("no write-back task of put %d from %s was printed", argInt(d, "put"), arg(d, "from"))
		}
		st.PersistTaskDone(t, arg(d, "failed") == "")
		return "ok\n", nil
	case "put-revoke":
		return "ok\n", st.PutRevoke(nref(st, d), key, scriptPutID(st, d))
	case "get":
		var exclude []string
		if e := arg(d, "exclude"); e != "" {
			exclude = strings.Split(e, ",")
		}
		// holder=ID: the requester's choice of a local hit's holder id.
		p, err := st.GetStartAs(*now, nref(st, d), key, exclude, argInt(d, "holder"))
		if err != nil {
			return "", err
		}
		if p.Done {
			out := fmt.Sprintf("holder=%d offset=%d len=%d put_id=%d source=%s", p.HolderID, p.TargetOffset, p.Len, p.PutID, p.Source)
			if p.NoticesSeq > 0 {
				out += fmt.Sprintf(" notices=%d", p.NoticesSeq)
			}
			return out + "\n", nil
		}
		out := fmt.Sprintf("get_id=%d source=%s from=%s target=%d len=%d", p.GetID, p.Source, p.SourceNode, p.TargetOffset, p.Len)
		if p.HolderID != 0 {
			out += fmt.Sprintf(" holder=%d", p.HolderID)
		}
		return out + "\n", nil
	case "get-done":
		res, err := st.GetDone(nref(st, d), key, scriptGetID(st, d))
		if err != nil {
			return "", err
		}
		if res.Promoted && res.NoticesSeq > 0 {
			return fmt.Sprintf("holder=%d promoted=true notices=%d\n", res.HolderID, res.NoticesSeq), nil
		}
		return fmt.Sprintf("holder=%d promoted=%v\n", res.HolderID, res.Promoted), nil
	case "get-revoke":
		return "ok\n", st.GetRevoke(*now, nref(st, d), key, argInt(d, "id"), arg(d, "drop-ssd") != "", arg(d, "source-failed") != "")
	case "ack":
		var ids []int64
		for _, f := range strings.Split(arg(d, "ids"), ",") {
			if f != "" {
				n, _ := strconv.ParseInt(f, 10, 64)
				ids = append(ids, n)
			}
		}
		var touched []string
		if t := arg(d, "touched"); t != "" {
			touched = strings.Split(t, ",")
		}
		u, err := st.BatchDeleteAck(nref(st, d), ids, touched)
		return fmt.Sprintf("unknown=%d\n", u), err
	case "delete":
		ok, _, invs, err := st.Delete(nref(st, d), key)
		return fmt.Sprintf("deleted=%v%s\n", ok, fmtInv(invs)), err
	case "exists":
		ok, err := st.Exists(nref(st, d), key)
		return fmt.Sprintf("%v\n", ok), err
	case "ns-delete":
		// ns-delete node=N ns=NAME [limit=K]: one NamespaceDelete call (BATCH keys unless limit).
		limit := int(mp.BATCH)
		if arg(d, "limit") != "" {
			limit = int(argInt(d, "limit"))
		}
		n, left, invs, err := st.NamespaceDelete(nref(st, d), arg(d, "ns"), limit)
		return fmt.Sprintf("deleted=%d left=%d%s\n", n, left, fmtInv(invs)), err
	case "ns-stat":
		keys, bytes, err := st.NamespaceStat(nref(st, d), arg(d, "ns"))
		return fmt.Sprintf("keys=%d bytes=%d\n", keys, bytes), err
	case "namespaces":
		return dumpNamespaces(st)
	case "ssd-commit":
		ok, err := st.SsdReplicaCommit(nref(st, d), key, argInt(d, "put"), argInt(d, "len"), argInt(d, "rec"), argInt(d, "persist"))
		return fmt.Sprintf("published=%v\n", ok), err
	case "ssd-evict":
		return "ok\n", st.BatchSsdReplicaEvict(nref(st, d), []*common.KeyVersion{{Key: key, PutId: argInt(d, "put")}}, []int64{argInt(d, "rec")})
	case "tick":
		dur, err := time.ParseDuration(arg(d, "advance"))
		if err != nil {
			return "", err
		}
		*now = now.Add(dur)
		tombed := st.Maintain(*now)
		return fmt.Sprintf("tombed=%v\n", tombed), nil
	case "clock":
		// advance=N: N inserts or hits elsewhere in the pool age every key by N ticks.
		st.clock += argInt(d, "advance")
		return fmt.Sprintf("clock=%d\n", st.clock), nil
	case "values":
		v, dup := st.MemoryValues()
		return fmt.Sprintf("values=%d duplicate_bytes=%d\n", v, dup), nil
	case "state":
		return dumpState(st), nil
	case "inflight-ttl":
		d, err := time.ParseDuration(arg(d, "set"))
		st.opts.InflightTTL = d
		return "ok\n", err
	}
	return "", fmt.Errorf("unknown command %q", d.Cmd)
}

func fmtPutResult(res PutResult) string {
	switch {
	case res.Pull != nil:
		t := res.Pull
		return fmt.Sprintf("pull target=%s:%d+%d gen=%d from=%s:%d\n", t.TargetNode, t.TargetOffset, t.Len, t.TargetGeneration, t.SourceNode, t.SourceOffset)
	case res.Persist != nil:
		from := ""
		if res.Persist.SourceNodeID != "" {
			from = " from=" + res.Persist.SourceNodeID
		}
		return fmt.Sprintf("ok persist=%s:%d+%d%s%s\n", res.Persist.NodeID, res.Persist.Offset, res.Persist.Len, from, fmtInv(res.Invalidations))
	}
	return "ok" + fmtInv(res.Invalidations) + "\n"
}

func fmtInv(invs []Invalidation) string {
	if len(invs) == 0 {
		return ""
	}
	var ns, sync []string
	for _, iv := range invs {
		ns = append(ns, iv.NodeID)
		if iv.Sync {
			sync = append(sync, iv.NodeID)
		}
	}
	sort.Strings(ns)
	sort.Strings(sync)
	if len(sync) > 0 {
		return " invalidate=" + strings.Join(ns, ",") + " sync=" + strings.Join(sync, ",")
	}
	return " invalidate=" + strings.Join(ns, ",")
}

func dumpState(st *State) string {
	var b strings.Builder
	ids := make([]string, 0, len(st.nodes))
	for id := range st.nodes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		n := st.nodes[id]
		fmt.Fprintf(&b, "node %s gen=%d used=%d/%d replicas=%d holders=%d", id, n.generation, n.alloc.Used(), n.alloc.Capacity(), n.policy.Len(), len(n.holders))
		if n.landing != nil {
			fmt.Fprintf(&b, " landing=%d/%d", n.landing.Used(), n.landing.Capacity())
		}
		if n.xfer != nil {
			fmt.Fprintf(&b, " xfer=%d/%d", n.xfer.Used(), n.xfer.Capacity())
		}
		if c := st.persistStats[id]; n.ssd.Enabled || c != nil {
			c := st.persistCount(id)
			fmt.Fprintf(&b, " ssd_pending=%d persists=%d dropped=%d", n.ssdPending, c.asked, c.dropped)
			if c.unwritten > 0 {
				fmt.Fprintf(&b, " unwritten=%d", c.unwritten)
			}
		}
		b.WriteString("\n")
	}
	keys := make([]string, 0, len(st.routes))
	for k := range st.routes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		r := st.routes[k]
		var reps []string
		for n, rep := range r.replicas {
			s := n.id + ":"
			if rep.memory != nil {
				s += fmt.Sprintf("mem@%d", rep.memory.Offset())
			}
			if rep.ssd {
				s += "+ssd"
			}
			if rep.dirty {
				s += "~dirty"
			}
			if rep.refresh {
				s += "~refresh"
			}
			reps = append(reps, s)
		}
		sort.Strings(reps)
		fmt.Fprintf(&b, "route %s put_id=%d len=%d [%s]\n", k, r.putID, r.len, strings.Join(reps, " "))
	}
	fmt.Fprintf(&b, "inflight puts=%d gets=%d persists=%d", len(st.puts), len(st.gets), len(st.persists))
	if pulling, q := st.Pulling(); pulling+q > 0 {
		fmt.Fprintf(&b, " pulling=%d quarantined=%d", pulling, q)
	}
	b.WriteString("\n")
	return b.String()
}

// dumpNamespaces prints the namespace index (namespace.go), one namespace a line with
// its byte total and keys in order, after checking it against a recount of the routes:
// an index that drifted from them is an error.
func dumpNamespaces(st *State) (string, error) {
	type count struct {
		keys  []string
		bytes int64
	}
	want := map[string]*count{}
	for k, r := range st.routes {
		if name, ok := wire.KeyNamespace(k); ok {
			if want[name] == nil {
				want[name] = &count{}
			}
			want[name].keys = append(want[name].keys, k)
			want[name].bytes += r.len
		}
	}
	names := make([]string, 0, len(st.namespaces))
	for name := range st.namespaces {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		ns := st.namespaces[name]
		var keys []string
		ns.keys.Ascend(func(k string) bool { keys = append(keys, k); return true })
		w := want[name]
		if w == nil {
			return "", fmt.Errorf("namespace %q is indexed but has no routed key", name)
		}
		sort.Strings(w.keys)
		if fmt.Sprint(keys) != fmt.Sprint(w.keys) || ns.bytes != w.bytes {
			return "", fmt.Errorf("namespace %q: index %v %d bytes, routes %v %d bytes", name, keys, ns.bytes, w.keys, w.bytes)
		}
		delete(want, name)
		fmt.Fprintf(&b, "ns %s bytes=%d [%s]\n", name, ns.bytes, strings.Join(keys, " "))
	}
	for name := range want {
		return "", fmt.Errorf("namespace %q has routed keys but is not indexed", name)
	}
	if b.Len() == 0 {
		return "none\n", nil
	}
	return b.String(), nil
}

// TestValidation covers bad requests at the master: every one is an error code, never a panic.
func TestValidation(t *testing.T) {
	st := NewState(Options{IDBase: 1})
	now := time.Unix(1, 0)
	ref := NodeRef{ID: "n1", Generation: 7}
	if err := st.Register(now, ref, 1<<20, 0, 0, "", "", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		err  error
		code common.ErrorCode
	}{
		{"empty key", second(st.PutStart(now, ref, "", 10, false, nil)), common.ErrorCode_INVALID_ARGUMENT},
		{"long key", second(st.PutStart(now, ref, strings.Repeat("k", 5000), 10, false, nil)), common.ErrorCode_INVALID_ARGUMENT},
		{"zero len", second(st.PutStart(now, ref, "k", 0, false, nil)), common.ErrorCode_INVALID_ARGUMENT},
		{"negative len", second(st.PutStart(now, ref, "k", -5, false, nil)), common.ErrorCode_INVALID_ARGUMENT},
		{"len > segment", second(st.PutStart(now, ref, "k", 2<<20, false, nil)), common.ErrorCode_INVALID_ARGUMENT},
		{"stale generation", second(st.PutStart(now, NodeRef{ID: "n1", Generation: 8}, "k", 1, false, nil)), common.ErrorCode_STALE_GENERATION},
		{"unknown node", second(st.GetStart(now, NodeRef{ID: "zz", Generation: 1}, "k", nil)), common.ErrorCode_STALE_GENERATION},
		{"unknown put", second(st.PutDone(now, ref, "k", 12345)), common.ErrorCode_INVALID_ARGUMENT},
		{"negative transfer reserve", st.Register(now, NodeRef{ID: "n3", Generation: 1}, 1<<20, -1, 0, "", "", SSDInfo{}, nil), common.ErrorCode_INVALID_ARGUMENT},
		{"transfer reserve = segment", st.Register(now, NodeRef{ID: "n3", Generation: 1}, 1<<20, 1<<20, 0, "", "", SSDInfo{}, nil), common.ErrorCode_INVALID_ARGUMENT},
		// Reserves whose sum wraps int64 (a pool past the segment's end; a review).
		{"reserves past int64", st.Register(now, NodeRef{ID: "n3", Generation: 1}, 1<<20, math.MaxInt64-511, math.MaxInt64-511, "", "", SSDInfo{}, nil), common.ErrorCode_INVALID_ARGUMENT},
		{"landing reserve past int64", st.Register(now, NodeRef{ID: "n3", Generation: 1}, 1<<20, 0, math.MaxInt64, "", "", SSDInfo{}, nil), common.ErrorCode_INVALID_ARGUMENT},
		{"unknown get", st.GetRevoke(now, ref, "k", 12345, false, false), common.ErrorCode_INVALID_ARGUMENT},
		{"miss", second(st.GetStart(now, ref, "k", nil)), common.ErrorCode_KEY_NOT_FOUND},
		{"zero generation", st.Register(now, NodeRef{ID: "n2"}, 1<<20, 0, 0, "", "", SSDInfo{}, nil), common.ErrorCode_INVALID_ARGUMENT},
		{"tiny segment", st.Register(now, NodeRef{ID: "n2", Generation: 1}, 10, 0, 0, "", "", SSDInfo{}, nil), common.ErrorCode_INVALID_ARGUMENT},
	}
	for _, c := range cases {
		if got := wire.CodeOf(c.err); got != c.code {
			t.Errorf("%s: got %v (%v), want %v", c.name, got, c.err, c.code)
		}
	}
	if used := st.nodes["n1"].alloc.Used(); used != 0 {
		t.Fatalf("bad requests leaked %d bytes", used)
	}
}

// TestRegisterAddrTaken: a registration naming another live owner's peer or data
// address is refused (its master calls and proofs would go to the wrong node); once that
// owner is silent past two heartbeat intervals the address may be taken.
func TestRegisterAddrTaken(t *testing.T) {
	st := NewState(Options{IDBase: 1})
	now := time.Unix(1, 0)
	if err := st.Register(now, NodeRef{ID: "n1", Generation: 1}, 1<<20, 0, 0, "d1:2", "p1:1", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	for _, addrs := range [][2]string{{"d2:2", "p1:1"}, {"d1:2", "p2:1"}} {
		err := st.Register(now, NodeRef{ID: "n2", Generation: 1}, 1<<20, 0, 0, addrs[0], addrs[1], SSDInfo{}, nil)
		if wire.CodeOf(err) != common.ErrorCode_ALREADY_EXISTS || !strings.Contains(err.Error(), `live owner "n1"`) {
			t.Fatalf("data %s peer %s: %v", addrs[0], addrs[1], err)
		}
	}
	if err := st.Register(now, NodeRef{ID: "n1", Generation: 2}, 1<<20, 0, 0, "d1:2", "p1:1", SSDInfo{}, nil); err != nil {
		t.Fatalf("the same owner again: %v", err)
	}
	later := now.Add(3 * time.Second) // default heartbeat 1s
	if err := st.Register(later, NodeRef{ID: "n2", Generation: 1}, 1<<20, 0, 0, "d1:2", "p1:1", SSDInfo{}, nil); err != nil {
		t.Fatalf("after n1 went silent: %v", err)
	}
}

// TestCallsNeedTheRegistrationToken: a call naming an owner's id and generation (both
// public: Stat, fences) with another token than its Register's is refused as a stale
// generation and changes nothing; a review acked a live owner's holders from a process
// holding only the cluster secret, and the range a client held was handed to another
// value.
func TestCallsNeedTheRegistrationToken(t *testing.T) {
	st := NewState(Options{IDBase: 1})
	now := time.Unix(1, 0)
	ref := NodeRef{ID: "n1", Generation: 1, Token: 0x5ec2e7}
	if err := st.Register(now, ref, 64<<20, 0, 0, "", "", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	p, err := st.PutStart(now, ref, "k", 1<<20, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutDone(now, ref, "k", p.PutID); err != nil {
		t.Fatal(err)
	}
	g, err := st.GetStart(now, ref, "k", nil)
	if err != nil || !g.Done {
		t.Fatalf("get: %+v %v", g, err)
	}
	n := st.nodes["n1"]
	for _, token := range []int64{0, ref.Token + 1} {
		forged := NodeRef{ID: ref.ID, Generation: ref.Generation, Token: token}
		if _, err := st.BatchDeleteAck(forged, []int64{g.HolderID}, nil); wire.CodeOf(err) != common.ErrorCode_STALE_GENERATION {
			t.Fatalf("ack with token %d: %v, want STALE_GENERATION", token, err)
		}
		if _, err := st.PutStart(now, forged, "other", 1<<20, false, nil); wire.CodeOf(err) != common.ErrorCode_STALE_GENERATION {
			t.Fatalf("put with token %d: %v, want STALE_GENERATION", token, err)
		}
	}
	if len(n.holders) != 1 {
		t.Fatalf("%d holders after the forged acks, want the get's 1", len(n.holders))
	}
	if unknown, err := st.BatchDeleteAck(ref, []int64{g.HolderID}, nil); err != nil || unknown != 0 || len(n.holders) != 0 {
		t.Fatalf("the owner's own ack: unknown %d, %v, %d holders left", unknown, err, len(n.holders))
	}
	// An owner of an earlier release sends no token: its calls go on its generation.
	old := NodeRef{ID: "n2", Generation: 1}
	if err := st.Register(now, old, 64<<20, 0, 0, "", "", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutStart(now, old, "k2", 1<<20, false, nil); err != nil {
		t.Fatalf("a tokenless owner's put: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }

// TestFillBeforeEviction: with 1 MiB − 128 B values the segment is fully used before
// the first eviction, and every put is admitted and readable right after it returns.
func TestFillBeforeEviction(t *testing.T) {
	st := NewState(Options{IDBase: 1})
	now := time.Unix(1, 0)
	ref := NodeRef{ID: "n1", Generation: 1}
	const seg = 64 << 20
	if err := st.Register(now, ref, seg, 0, 0, "", "", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	n := st.nodes["n1"]
	firstEvictionUsed := int64(-1)
	for i := 0; i < 256; i++ {
		before := n.alloc.Used()
		replicas := n.policy.Len()
		key := fmt.Sprintf("k%03d", i)
		p, err := st.PutStart(now, ref, key, 1<<20-128, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.PutDone(now, ref, key, p.PutID); err != nil {
			t.Fatal(err)
		}
		if firstEvictionUsed < 0 && n.policy.Len() <= replicas {
			firstEvictionUsed = before
		}
		g, err := st.GetStart(now, ref, key, nil)
		if err != nil || !g.Done {
			t.Fatalf("put %s not readable right after it returned: %v", key, err)
		}
		if _, err := st.BatchDeleteAck(ref, []int64{g.HolderID}, nil); err != nil {
			t.Fatal(err)
		}
		if n.alloc.Used() > seg {
			t.Fatalf("used %d exceeds capacity", n.alloc.Used())
		}
	}
	share := float64(firstEvictionUsed) / seg
	t.Logf("segment share in use at the first eviction: %.2f%%", share*100)
	if share < 0.95 {
		t.Fatalf("first eviction at %.1f%% of the segment, want ≥ 95%%", share*100)
	}
	for k, r := range st.routes {
		st.dropRouteLocked(k, r)
	}
	if n.alloc.Used() != 0 || n.allocs != 0 {
		t.Fatalf("leak: used=%d allocations=%d", n.alloc.Used(), n.allocs)
	}
}

// scriptParent is a put's parent= argument: unset for a plain key, "-" for a chain's
// first page, else the parent key.
func scriptParent(d *datadriven.TestData) *string {
	if !d.HasArg("parent") {
		return nil
	}
	p := arg(d, "parent")
	if p == "-" {
		p = ""
	}
	return &p
}

// TestNewRingLevelStartSaturates: a ring registered level with rings far ahead starts at a
// share of persists that fits int64, level with them (their whole laps are taken off). 40,000 laps of 64 GiB rings (2.5 PiB written) and a
// 256 TiB newcomer wrapped its bytes to MinInt64: -32,768 laps, and every persist of every
// owner went to it for the rest of the master's life (a review).
func TestNewRingLevelStartSaturates(t *testing.T) {
	st := NewState(Options{IDBase: 1})
	now := time.Unix(1, 0)
	if err := st.Register(now, NodeRef{ID: "a", Generation: 1}, 64<<20, 0, 0, "", "", SSDInfo{Enabled: true, CapacityBytes: 64 << 30}, nil); err != nil {
		t.Fatal(err)
	}
	st.nodes["a"].ssdAssigned = 40000 * (64 << 30)
	if err := st.Register(now, NodeRef{ID: "b", Generation: 1}, 64<<20, 0, 0, "", "", SSDInfo{Enabled: true, CapacityBytes: 256 << 40}, nil); err != nil {
		t.Fatal(err)
	}
	a, b := st.nodes["a"], st.nodes["b"]
	if b.ssdAssigned < 0 || math.Abs(ringLaps(a)-ringLaps(b)) > 1e-9 {
		t.Errorf("the new ring starts at %d bytes assigned, %g laps, level with a ring of %g laps", b.ssdAssigned, ringLaps(b), ringLaps(a))
	}
	// Level: a's persists stay on a's own ring (a start far behind drew them all to b).
	if got := st.persistNodeLocked(a, 64<<10); got != a {
		t.Errorf("a's persist goes to %s", got.id)
	}
}
