package daemon

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/fluxkv/fluxkv/internal/scripttest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
)

// TestOwnerScripts replays the scenarios in testdata/*.txt against ownerState, one
// subtest per file: registration and re-registration, pins across a failover, the
// hot-set lease, invalidations racing gets, eviction notices, sessions ending with
// holders and in-flight puts, gets and PullPuts answered across a registration. Each
// command is one decision the owner makes between its master calls; its output ends
// with the effects it asked for (acks, hot-set hits, SSD entries to forget).
func TestOwnerScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			s := newOwnerScript()
			datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
				out, err := s.run(d)
				if err != nil {
					out += "error: " + err.Error() + "\n"
				}
				return out + s.effects()
			})
		})
	}
}

// ownerScript is one script's owner: its state, clock, and what the owner remembers
// between the two halves of a master call (the registration epoch a call was sent at,
// the hot set's invalidation sequence, the last heartbeat's ack).
type ownerScript struct {
	st      ownerState
	now     time.Time
	epochs  map[string]uint64 // by key: the registration epoch its call was sent at
	seqs    map[string]uint64 // by key: cachedGet's sequence for a get that missed
	targets map[string]*getTarget
	puts    map[int64]*pendingPut
	pulls   map[int64]*segmentWrite
	prev    int64     // the registration's prev epoch
	regSent time.Time // when Register was sent
	hbAck   evictAck  // the last heartbeat's ack
	hbSent  time.Time
	report  *replicaReport
	clients map[int64]*session // every session attached, ended ones included
}

func newOwnerScript() *ownerScript {
	return &ownerScript{
		st: newOwnerState(stateOptions{nodeID: "n1", generation: 7, segSize: 1 << 20,
			grace: 10 * time.Second, hotBudget: 64 << 10, putArea: 0, areaTotal: 0}),
		now:    time.Unix(1000, 0),
		epochs: map[string]uint64{}, seqs: map[string]uint64{}, targets: map[string]*getTarget{},
		puts: map[int64]*pendingPut{}, pulls: map[int64]*segmentWrite{}, clients: map[int64]*session{},
	}
}

// sArg and sInt read a command's arguments (scripttest).
var (
	sArg = scripttest.Arg
	sInt = scripttest.Int
)

// keyVersions parses "k1@5 k2@7".
func keyVersions(s string) []*common.KeyVersion {
	var out []*common.KeyVersion
	for _, f := range strings.Fields(strings.ReplaceAll(s, ",", " ")) {
		k, v, _ := strings.Cut(f, "@")
		n, _ := strconv.ParseInt(v, 10, 64)
		out = append(out, &common.KeyVersion{Key: k, PutId: n})
	}
	return out
}

func (s *ownerScript) client(d *datadriven.TestData) (*session, error) {
	c := s.clients[sInt(d, "client")]
	if c == nil {
		return nil, fmt.Errorf("no client %d", sInt(d, "client"))
	}
	return c, nil
}

func code(err error) string {
	if err == nil {
		return "ok"
	}
	return wire.CodeOf(err).String()
}

func (s *ownerScript) run(d *datadriven.TestData) (string, error) {
	st := &s.st
	key := sArg(d, "key")
	switch d.Cmd {
	case "tick":
		dur, err := time.ParseDuration(sArg(d, "d"))
		if err != nil {
			return "", err
		}
		s.now = s.now.Add(dur)
		return "", nil

	case "attach":
		id, _, err := st.reserveSession(0)
		if err != nil {
			return "", err
		}
		st.sessions[id] = newSession(id, 1, "script", shm.Cred{}, nil, nil)
		s.clients[id] = st.sessions[id]
		return fmt.Sprintf("client=%d\n", id), nil

	case "session-end":
		c, err := s.client(d)
		if err != nil {
			return "", err
		}
		puts, holders, ok := st.endSession(c, s.now)
		st.unregisterPuts(puts) // (the owner does once no copy into them runs)
		var ids []string
		for _, p := range puts {
			ids = append(ids, strconv.FormatInt(p.putID, 10))
		}
		return fmt.Sprintf("ended=%v holders=%d abandon=[%s]\n", ok, holders, strings.Join(ids, " ")), nil

	case "session":
		_, err := st.session(&external.Session{ClientId: sInt(d, "client"), SessionToken: sInt(d, "token"), OwnerGeneration: sInt(d, "gen")})
		return code(err) + "\n", nil

	// --- registration
	case "register-begin":
		s.regSent = s.now
		pins, prev := st.beginRegister(s.now, defaultMasterTimes.inflightTTL*5/6)
		s.prev = prev
		var b strings.Builder
		fmt.Fprintf(&b, "prev=%d pins:", prev)
		for _, p := range pins {
			fmt.Fprintf(&b, " %d@%d+%d", p.PinId, p.Offset, p.Len)
		}
		return b.String() + "\n", nil

	case "register-end":
		var resp *mp.RegisterResponse
		if sArg(d, "lost") == "" {
			resp = &mp.RegisterResponse{Code: common.ErrorCode_OK, MasterEpoch: sInt(d, "epoch"), HeartbeatIntervalMs: sInt(d, "hb")}
			if c := sArg(d, "code"); c != "" {
				resp.Code, _ = common.ErrorCodeFromString(c)
			}
		}
		next, ok := st.endRegister(resp, s.regSent, s.prev)
		if !ok {
			return "not registered\n", nil
		}
		return []string{"first registration", "report the replica index", "forget every replica (tombed)"}[next] + "\n", nil

	case "heartbeat-sent":
		s.hbAck, s.hbSent = st.reg.acked, s.now
		return fmt.Sprintf("ack epoch=%d seq=%d\n", s.hbAck.epoch, s.hbAck.seq), nil

	case "heartbeat-answer":
		resp := &mp.HeartbeatResponse{Code: common.ErrorCode_OK, MasterEpoch: sInt(d, "epoch"), EvictionsSeq: sInt(d, "seq"),
			Evicted: keyVersions(sArg(d, "evicted")), SsdDropped: keyVersions(sArg(d, "ssd"))}
		// seqs=1,2: each evicted notice's number (none: an older master's reply).
		for _, f := range strings.Split(sArg(d, "seqs"), ",") {
			if f != "" {
				n, _ := strconv.ParseInt(f, 10, 64)
				resp.EvictedSeqs = append(resp.EvictedSeqs, n)
			}
		}
		rereg := st.heartbeatAnswered(s.hbAck, s.hbSent, resp)
		return fmt.Sprintf("reregister=%v acked=%d@%d\n", rereg, st.reg.acked.seq, st.reg.acked.epoch), nil

	case "admit":
		return code(st.admit(sInt(d, "epoch"))) + "\n", nil

	case "lease":
		return fmt.Sprintf("leased=%v\n", st.leased(s.now)), nil

	// --- gets
	case "get":
		c, err := s.client(d)
		if err != nil {
			return "", err
		}
		resp, seq, err := st.cachedGet(c, key, s.now, nil)
		if err != nil {
			return "", err
		}
		if resp != nil {
			return fmt.Sprintf("hit holder=%d put=%d\n", resp.HolderId, resp.PutId), nil
		}
		s.seqs[key], s.epochs[key] = seq, st.reg.epoch
		return "miss: GetStart\n", nil

	case "plan":
		plan := &mp.GetStartResponse{GetId: sInt(d, "get"), TargetOffset: sInt(d, "off"), Len: sInt(d, "len"),
			PutId: sInt(d, "put"), Done: sArg(d, "done") != "", HolderId: sInt(d, "holder")}
		t, err := st.acceptPlan(plan, s.epochs[key])
		if err != nil {
			return "", err
		}
		s.targets[key] = t
		return fmt.Sprintf("tracked=%v\n", t.write != nil), nil

	case "not-found":
		st.getNotFound(key)
		return "", nil

	case "finish-get":
		c, err := s.client(d)
		if err != nil {
			return "", err
		}
		t := s.targets[key]
		h := &holding{key: key, putID: sInt(d, "put"), offset: sInt(d, "off"), len: sInt(d, "len"),
			masterID: sInt(d, "holder"), replica: sArg(d, "replica") != ""}
		if t != nil {
			h.offset, h.len = t.offset, t.len
		}
		resp, err := st.finishGet(c, t, h, s.seqs[key], s.now)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("holder=%d put=%d\n", resp.HolderId, resp.PutId), nil

	case "refill-confirmed":
		// The GetDone answer of a refill finish-get handed out (a holder recorded at GetStart).
		t := s.targets[key]
		h := &holding{key: key, putID: sInt(d, "put"), offset: t.offset, len: t.len, masterID: sInt(d, "holder")}
		done := &mp.GetDoneResponse{Promoted: sArg(d, "promoted") != "", NoticesSeq: sInt(d, "notices")}
		return fmt.Sprintf("replica=%v\n", st.refillConfirmed(h, t, done, s.mark(d), 0)), nil

	case "end-get":
		return fmt.Sprintf("stale=%v\n", st.endGet(s.targets[key])), nil

	case "get-pinned":
		return fmt.Sprintf("pinned=%v\n", st.getPinned(sInt(d, "get"))), nil

	case "release":
		c, err := s.client(d)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("released=%v\n", st.release(c, sInt(d, "holder"), s.now)), nil

	case "invalidate":
		upTo := sInt(d, "upto")
		if sArg(d, "upto") == "any" {
			upTo = 1<<63 - 1
		}
		st.invalidate(key, upTo)
		return "", nil

	case "sweep":
		st.sweepIdle(s.now, sArg(d, "force") != "")
		return "", nil

	case "release-hotset":
		var keys []string
		if k := sArg(d, "keys"); k != "" {
			keys = strings.Split(k, ",")
		}
		n, b := st.releaseHotSet(keys, sInt(d, "bytes"))
		return fmt.Sprintf("released %d holdings, %d bytes\n", n, b), nil

	// --- puts
	case "put-start":
		s.epochs[key] = st.reg.epoch
		return "", nil

	case "put-accept":
		c, err := s.client(d)
		if err != nil {
			return "", err
		}
		p := &pendingPut{key: key, putID: sInt(d, "put"), offset: sInt(d, "off"), len: sInt(d, "len"), local: sArg(d, "local") != "",
			copyBy: s.now.Add(defaultMasterTimes.inflightTTL * 5 / 6), gone: s.now.Add(defaultMasterTimes.inflightTTL)}
		if par := sArg(d, "parent"); par != "" { // parent=- : a chain's first page
			par = strings.TrimPrefix(par, "-")
			p.parent = &par
		}
		if err := st.acceptPut(c, p, s.epochs[key]); err != nil {
			return "", err
		}
		s.puts[p.putID] = p
		return "", nil

	case "put-end":
		c, err := s.client(d)
		if err != nil {
			return "", err
		}
		p := s.puts[sInt(d, "put")]
		if p == nil {
			return "", fmt.Errorf("no put %d", sInt(d, "put"))
		}
		p.ending = make(chan struct{})
		var outcome error
		switch {
		case st.ackPin(p): // publish's first step
			outcome = errCode(common.ErrorCode_UNAVAILABLE, "the master restarted during this put")
		case sArg(d, "failed") != "":
			// PutDone went out and failed (a registration may have pinned the put meanwhile).
			outcome = errCode(common.ErrorCode_UNAVAILABLE, "PutDone failed")
		default:
			st.putsPublished([]*pendingPut{p}, s.mark(d))
		}
		st.endPut(c, p, outcome)
		return "outcome: " + code(outcome) + "\n", nil

	case "max-holders": // a session's holder cap (maxSessionHolders)
		st.maxHolders = int(sInt(d, "n"))
		return "", nil

	case "sweep-puts": // the idle loop's look for puts past their master's TTL
		st.sweepDeadPuts(s.now, defaultMasterTimes.inflightTTL*5/6)
		return "", nil

	case "put-source":
		if err := st.checkPutSource(sInt(d, "put"), sInt(d, "off"), sInt(d, "len")); err != nil {
			return "refused: " + err.Error() + "\n", nil
		}
		return "ok\n", nil

	// --- PullPut
	case "pull-begin":
		t, err := st.beginPull(&peer.PullPutRequest{Key: key, PutId: sInt(d, "put"), TargetOffset: sInt(d, "off"),
			Len: sInt(d, "len"), MasterEpoch: sInt(d, "epoch")})
		if err != nil {
			return "", err
		}
		s.pulls[t.id] = t
		return "", nil

	case "pull-end":
		t := s.pulls[sInt(d, "put")]
		if t == nil {
			return "", fmt.Errorf("no pull %d", sInt(d, "put"))
		}
		if err := st.endPull(t); err != nil {
			return "failed: " + err.Error() + "\n", nil
		}
		return "ok\n", nil

	// --- replica index
	case "mark":
		// The replica index's position now, for a later learn's mark= (a call starting now).
		return fmt.Sprintf("mark=%d\n", st.replicas.mark()), nil

	case "learn":
		h := &holding{key: key, putID: sInt(d, "put"), offset: sInt(d, "off"), len: sInt(d, "len"), replica: true,
			noticesSeq: sInt(d, "notices")}
		st.learnReplica(h, s.mark(d), 0)
		return "", nil

	// --- the replica report after a registration
	case "report":
		var onSSD []replicaRecord
		for i, e := range keyVersions(sArg(d, "ssd")) { // numbered in their order
			onSSD = append(onSSD, replicaRecord{key: e.Key, putID: e.PutId, len: 100, seq: int64(i + 1)})
		}
		s.report = newReplicaReport(st.replicas.records(), onSSD, int(sInt(d, "batch")))
		var b strings.Builder
		for _, bt := range s.report.batches() {
			fmt.Fprintf(&b, "batch [%d,%d) last=%v:", bt[0], bt[1], bt[1] == len(s.report.recs))
			for _, r := range s.report.recs[bt[0]:bt[1]] {
				medium := "ssd"
				if r.Memory {
					medium = fmt.Sprintf("mem@%d", r.Offset)
				}
				if r.Parent != nil {
					medium += fmt.Sprintf(",parent=%q", *r.Parent)
				}
				fmt.Fprintf(&b, " %s@%d(%s)", r.Key, r.PutId, medium)
			}
			b.WriteString("\n")
		}
		return b.String(), nil

	case "report-rejected":
		// rejected=i,j: records the master refused (indexes into the whole report);
		// from=i: the call carrying record i failed, nothing from it on was adopted.
		for _, f := range strings.Split(sArg(d, "rejected"), ",") {
			if f != "" {
				i, _ := strconv.Atoi(f)
				s.report.refuse(st, i)
			}
		}
		if sArg(d, "from") != "" {
			for i := int(sInt(d, "from")); i < len(s.report.recs); i++ {
				s.report.refuse(st, i)
			}
		}
		return "", nil

	case "state":
		return s.dump(), nil
	}
	return "", fmt.Errorf("unknown command %q", d.Cmd)
}

// mark is the replica index mark= of a command, or without one the index's mark now
// (the master call whose answer the command applies was sent just before it).
func (s *ownerScript) mark(d *datadriven.TestData) uint64 {
	if sArg(d, "mark") != "" {
		return uint64(sInt(d, "mark"))
	}
	return s.st.replicas.mark()
}

// effects prints and clears what the last command asked of the world.
func (s *ownerScript) effects() string {
	fx := s.st.takeEffects()
	var b strings.Builder
	if len(fx.acks) > 0 {
		fmt.Fprintf(&b, "> ack %v\n", fx.acks)
	}
	if len(fx.touched) > 0 {
		fmt.Fprintf(&b, "> touched %v\n", fx.touched)
	}
	for _, e := range fx.ssdForget {
		fmt.Fprintf(&b, "> ssd forget %s up to %d\n", e.Key, e.PutId)
	}
	for _, e := range fx.ssdForgetRecords {
		fmt.Fprintf(&b, "> ssd forget %s@%d record %d\n", e.Key, e.PutID, e.Seq)
	}
	return b.String()
}

func (s *ownerScript) dump() string {
	st := &s.st
	var b strings.Builder
	fmt.Fprintf(&b, "registration: epoch=%d master=%d registering=%v leased=%v\n",
		st.reg.epoch, st.reg.masterEpoch, st.reg.registering, st.leased(s.now))
	for _, id := range slices.Sorted(maps.Keys(st.sessions)) {
		c := st.sessions[id]
		var hs, ps []string
		for _, hid := range slices.Sorted(maps.Keys(c.holders)) {
			h := c.holders[hid]
			hs = append(hs, fmt.Sprintf("%d:%s@%d", hid, h.key, h.putID))
		}
		for _, p := range sortedPuts(c.puts) {
			ps = append(ps, fmt.Sprintf("%s@%d", p.key, p.putID))
		}
		fmt.Fprintf(&b, "client %d: holders [%s] puts [%s]\n", id, strings.Join(hs, " "), strings.Join(ps, " "))
	}
	for _, k := range slices.Sorted(maps.Keys(st.hot.byKey)) {
		h := st.hot.byKey[k]
		fmt.Fprintf(&b, "hot %s@%d holder=%d refs=%d idle=%v\n", k, h.putID, h.masterID, h.refs, h.elem != nil)
	}
	for _, w := range st.writes.entries() {
		fmt.Fprintf(&b, "write %s %d [%d+%d) pinned=%v\n", w.kind, w.id, w.offset, w.len, w.pinned)
	}
	for _, r := range st.replicas.records() {
		fmt.Fprintf(&b, "replica %s@%d [%d+%d)", r.key, r.putID, r.offset, r.len)
		if r.page {
			fmt.Fprintf(&b, " parent=%q", r.parent)
		}
		if r.notices.seq > 0 {
			fmt.Fprintf(&b, " notices<=%d@%d", r.notices.seq, r.notices.reg)
		}
		b.WriteString("\n")
	}
	return b.String()
}
