package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// batchCallsLost is the owner's master client with every BatchExists and BatchDelete
// lost on the way (the master never sees them).
type batchCallsLost struct {
	masterservice.Client
	lost atomic.Int64
}

func (b *batchCallsLost) BatchExists(ctx context.Context, req *mp.BatchExistsRequest, opts ...callopt.Option) (*mp.BatchExistsResponse, error) {
	b.lost.Add(1)
	return nil, errors.New("injected: connection reset before the master read the request")
}

func (b *batchCallsLost) BatchDelete(ctx context.Context, req *mp.BatchDeleteRequest, opts ...callopt.Option) (*mp.BatchDeleteResponse, error) {
	b.lost.Add(1)
	return nil, errors.New("injected: connection reset before the master read the request")
}

// TestClientBatchPerKeyErrors: a batch whose keys the owner could not evaluate (its
// master call failed: UNAVAILABLE, retry) is an error of the Go client's BatchExists and
// BatchDelete, as it is of Exists and Delete, never "absent" or "not deleted" with no
// error: a BatchDelete that deleted nothing must not look like one that found nothing
// to delete, and the keys are still there.
func TestClientBatchPerKeyErrors(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	keys := []string{"pk/0", "pk/1"}
	for i, k := range keys {
		if err := n.c.Put(k, value(i, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	lost := &batchCallsLost{}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { lost.Client = c; return lost })
	if ex, err := n.c.BatchExists([]string{"absent/0", "absent/1"}); !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Errorf("BatchExists with its master call lost = %v, %v; want ErrUnavailable", ex, err)
	}
	if del, err := n.c.BatchDelete(keys); !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Errorf("BatchDelete with its master call lost = %v, %v; want ErrUnavailable", del, err)
	}
	if lost.lost.Load() == 0 {
		t.Fatal("no master call was lost: the test tested nothing")
	}
	n.wrapMaster(func(masterservice.Client) masterservice.Client { return lost.Client })
	for _, k := range keys {
		if ok, err := n.c.Exists(k); err != nil || !ok {
			t.Errorf("exists %s after the failed delete: %v, %v", k, ok, err)
		}
	}
	n.drain(t, keys)
}

// TestBatchPutLongestKeysAndParents: a BatchPut of wire.MaxBatch pages, each with a key
// and a parent of the longest length (wire.MaxKeyBytes), is a valid batch: every item
// is stored and reads back, however many frames its requests take; nothing leaks.
func TestBatchPutLongestKeysAndParents(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	long := func(i int) string {
		s := fmt.Sprintf("long/%d/", i)
		return s + strings.Repeat("k", wire.MaxKeyBytes-len(s))
	}
	items := make([]fluxkv.PutItem, wire.MaxBatch)
	keys := make([]string, len(items))
	for i := range items {
		keys[i] = long(i)
		parent := long(i + len(items)) // never put: an orphan page, still a valid one
		items[i] = fluxkv.PutItem{Key: keys[i], Value: []byte{byte(i)}, Parent: &parent}
	}
	errs, err := n.c.BatchPut(items, fluxkv.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i, e := range errs {
		if e != nil {
			if failed++; failed <= 3 {
				t.Errorf("put item %d: %v", i, e)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d items failed", failed, len(items))
	}
	hs, gerrs, err := n.c.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if gerrs[i] != nil || h == nil || len(h.Bytes()) != 1 || h.Bytes()[0] != byte(i) {
			t.Fatalf("get item %d: %v", i, gerrs[i])
		}
		h.Release()
	}
	n.drain(t, keys)
}

// TestGetLargerThanRequesterPool: owners of different sizes. A value put through the
// large owner that is larger than the small owner's whole pool can never be brought into
// the small one: a get of it there fails at once, INVALID_ARGUMENT as the put of such a
// value there does, without evicting a thing of the small owner's pool (it evicted
// every sole copy trying, then answered NO_SPACE, a code that says retry).
func TestGetLargerThanRequesterPool(t *testing.T) {
	t.Parallel()
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Placement: master.PlacementLocal})
	_, c2 := n.addOwner(t, "n2", 8<<20, nil, func(o *Options) { o.LandingReserve = 2 << 20 })
	big := value(1, 12<<20) // larger than n2's segment, smaller than n1's pool
	if err := n.c.Put("big", big); err != nil {
		t.Fatal(err)
	}
	var small []string
	for i := range 8 {
		k := fmt.Sprintf("small/%d", i)
		if err := c2.Put(k, value(i, 256<<10)); err != nil {
			t.Fatal(err)
		}
		small = append(small, k)
	}
	h, err := c2.Get("big")
	if h != nil {
		h.Release()
	}
	if !errors.Is(err, fluxkv.ErrInvalidArgument) {
		t.Errorf("get of a value larger than the requester's pool: %v; want ErrInvalidArgument", err)
	}
	for i, k := range small {
		h, err := c2.Get(k)
		if err != nil {
			t.Errorf("get %s after the oversized get: %v", k, err)
			continue
		}
		if !bytes.Equal(h.Bytes(), value(i, 256<<10)) {
			t.Errorf("get %s: wrong bytes", k)
		}
		h.Release()
	}
	if hs, errs, err := c2.BatchGet([]string{small[0], "big"}); err != nil || errs[0] != nil || !errors.Is(errs[1], fluxkv.ErrInvalidArgument) {
		t.Errorf("batch get via n2: %v %v", errs, err)
	} else {
		hs[0].Release()
	}
	// A pinned prefix lookup through n2 cannot bring the page in for its pin: it ends the
	// count there with NO_SPACE, the code of a page that does not fit.
	sess := &external.Session{ClientId: c2.ClientID(), SessionToken: c2.SessionToken(), OwnerGeneration: c2.Generation()}
	res := &external.ExternalServiceBatchExistsResult{}
	req := &external.BatchExistsRequest{Session: sess, Keys: []string{"big"}, Prefix: true, PinMs: 1000}
	if err := c2.Call("BatchExists", &external.ExternalServiceBatchExistsArgs{Req: req}, res); err != nil ||
		res.Success.Found != 0 || len(res.Success.Results) != 1 || res.Success.Results[0].Code != common.ErrorCode_NO_SPACE {
		t.Errorf("pinned prefix lookup of the page via n2: %v %v", err, res.Success)
	}
	if hb, err := n.c.Get("big"); err != nil || !bytes.Equal(hb.Bytes(), big) {
		t.Errorf("get big through n1: %v", err)
	} else {
		hb.Release()
	}
	if _, err := c2.BatchDelete(small); err != nil {
		t.Fatal(err)
	}
	n.drain(t, []string{"big"})
}

// TestBatchGetSparesItsOwnReplicas: a batch get through an owner whose pool is full
// asks for a value of another owner (its target needs room: evictions) and for values
// whose only copies are replicas in that pool, put first (so first in the eviction
// order). The room for the remote value must not come from the batch's own local
// values: each is answered with its bytes, and the remote one is served too (other
// values make its room). It evicted the batch's own values, oldest first, and those
// items then answered KEY_NOT_FOUND.
func TestBatchGetSparesItsOwnReplicas(t *testing.T) {
	t.Parallel()
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Placement: master.PlacementLocal})
	// No transfer area (its idle room is lent to the pool) nor landing area: the remote
	// value's target is taken from the pool's 8 MiB.
	_, c2 := n.addOwner(t, "n2", 8<<20, nil, func(o *Options) { o.TransferReserve = -1; o.CacheGrace = -1 })
	remote := value(100, 3<<20)
	if err := n.c.Put("remote", remote); err != nil {
		t.Fatal(err)
	}
	put := func(prefix string, count int) []string {
		var keys []string
		for i := range count {
			k := fmt.Sprintf("%s/%d", prefix, i)
			if err := c2.Put(k, value(i, 1<<20)); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
		return keys
	}
	mine := put("mine", 4)    // the batch's local values: the oldest of n2's pool
	others := put("other", 3) // 7 of n2's 8 MiB taken
	keys := append([]string{"remote"}, mine...)
	hs, errs, err := c2.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		want := remote
		if i > 0 {
			want = value(i-1, 1<<20)
		}
		switch {
		case errs[i] != nil:
			t.Errorf("batch get %s: %v", k, errs[i])
		case hs[i] == nil:
			t.Errorf("batch get %s: not found (evicted for the room of another item of its batch)", k)
		case !bytes.Equal(hs[i].Bytes(), want):
			t.Errorf("batch get %s: wrong bytes", k)
		}
		if hs[i] != nil {
			hs[i].Release()
		}
	}
	if _, err := c2.BatchDelete(append(mine, others...)); err != nil {
		t.Fatal(err)
	}
	n.drain(t, []string{"remote"})
}

// TestReportLongestKeysAndParents: an owner whose replica index holds REPORT_BATCH
// pages with the longest key and parent (wire.MaxKeyBytes each) reports them all to a
// restarted master, which routes every one of them; a master restart is no cache flush
// for them.
func TestReportLongestKeysAndParents(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	long := func(i int) string {
		s := fmt.Sprintf("long/%d/", i)
		return s + strings.Repeat("k", wire.MaxKeyBytes-len(s))
	}
	const pages = int(mp.REPORT_BATCH)
	items := make([]fluxkv.PutItem, pages)
	keys := make([]string, pages)
	for i := range items {
		keys[i] = long(i)
		parent := long(i + pages)
		items[i] = fluxkv.PutItem{Key: keys[i], Value: []byte{byte(i)}, Parent: &parent}
	}
	if errs, err := n.c.BatchPut(items, fluxkv.PutOptions{}); err != nil || errors.Join(errs...) != nil {
		t.Fatalf("batch put: %v %v", err, errors.Join(errs...))
	}
	m2 := restartMaster(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	routes := 0
	m2.Inspect(func(st *master.State) { routes = st.Keys() })
	if routes != pages {
		t.Fatalf("the restarted master routes %d of the %d pages the owner reported", routes, pages)
	}
	hs, errs, err := n.c.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if errs[i] != nil || h == nil || h.Bytes()[0] != byte(i) {
			t.Fatalf("get page %d after the restart: %v", i, errs[i])
		}
		h.Release()
	}
}

// TestOwnerForwardsFullFrameBatchPutStart: a BatchPutStart that fills a client frame with
// items of the longest key and parent (wire.MaxKeyBytes each), sent while the owner holds
// wire.MaxBatch queued holder acks, starts every item: the owner's calls to the master,
// which add its node and those acks, each fit a frame.
func TestOwnerForwardsFullFrameBatchPutStart(t *testing.T) {
	t.Parallel()
	// No hot set: every release is a holder ack; AckDelay keeps the acks queued.
	n := startNode(t, 64<<20, nil, master.Options{InsecureCluster: true}, func(o *Options) { o.CacheGrace, o.AckDelay = -1, time.Hour })
	short := make([]fluxkv.PutItem, wire.MaxBatch)
	shortKeys := make([]string, len(short))
	for i := range short {
		shortKeys[i] = fmt.Sprintf("short/%d", i)
		short[i] = fluxkv.PutItem{Key: shortKeys[i], Value: []byte{1}}
	}
	if errs, err := n.c.BatchPut(short, fluxkv.PutOptions{}); err != nil || errors.Join(errs...) != nil {
		t.Fatalf("batch put: %v %v", err, errors.Join(errs...))
	}
	// Each round of gets queues an ack per key; a flush of the acker may send some on a
	// busy machine (its timer runs from the first hit it reports), so rounds go on until
	// enough are queued.
	var hs []*fluxkv.MemHolder
	var errs []error
	var err error
	queued := 0
	for round := 0; round < 4 && queued < wire.MaxBatch; round++ {
		hs, errs, err = n.c.BatchGet(shortKeys)
		if err != nil || errors.Join(errs...) != nil {
			t.Fatalf("batch get: %v %v", err, errors.Join(errs...))
		}
		for _, h := range hs {
			h.Release()
		}
		if err := n.c.Flush(); err != nil {
			t.Fatal(err)
		}
		n.o.acks.mu.Lock()
		queued = len(n.o.acks.pending)
		n.o.acks.mu.Unlock()
	}
	if queued < wire.MaxBatch {
		t.Fatalf("%d holder acks queued, want %d", queued, wire.MaxBatch)
	}

	long := func(i int) string {
		s := fmt.Sprintf("long/%d/", i)
		return s + strings.Repeat("k", wire.MaxKeyBytes-len(s))
	}
	req := &external.BatchPutStartRequest{Session: sessionOf(n.c)}
	args := &external.ExternalServiceBatchPutStartArgs{Req: req}
	for {
		parent := long(wire.MaxBatch + len(req.Items))
		req.Items = append(req.Items, &external.PutStartItem{Key: long(len(req.Items)), Len: 1, Opts: &external.PutOptions{}, Parent: &parent})
		if 4+thrift.Binary.MessageBeginLength("BatchPutStart")+args.BLength() > wire.MaxFrameBytes {
			req.Items = req.Items[:len(req.Items)-1]
			break
		}
	}
	start := &external.ExternalServiceBatchPutStartResult{}
	if err := n.c.Call("BatchPutStart", args, start); err != nil || start.Success.Code != common.ErrorCode_OK {
		t.Fatalf("batch put start of %d items: %v %v", len(req.Items), err, start.Success)
	}
	ends := make([]*external.PutEndItem, len(req.Items))
	keys := make([]string, len(req.Items))
	for i, r := range start.Success.Results {
		if r.Code != common.ErrorCode_OK {
			t.Fatalf("item %d of %d: %v %s", i, len(req.Items), r.Code, r.Message)
		}
		n.o.seg.Bytes()[r.Offset] = byte(i)
		keys[i] = req.Items[i].Key
		ends[i] = &external.PutEndItem{Key: keys[i], PutId: r.PutId}
	}
	end := &external.ExternalServiceBatchPutEndResult{}
	if err := n.c.Call("BatchPutEnd", &external.ExternalServiceBatchPutEndArgs{Req: &external.BatchPutEndRequest{Session: sessionOf(n.c), Items: ends}}, end); err != nil ||
		end.Success.Code != common.ErrorCode_OK {
		t.Fatalf("batch put end: %v %v", err, end.Success)
	}
	for i, r := range end.Success.Results {
		if r.Code != common.ErrorCode_OK {
			t.Fatalf("put end of item %d: %v %s", i, r.Code, r.Message)
		}
	}
	hs, errs, err = n.c.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if errs[i] != nil || h == nil || len(h.Bytes()) != 1 || h.Bytes()[0] != byte(i) {
			t.Fatalf("get item %d: %v", i, errs[i])
		}
		h.Release()
	}
	n.drain(t, append(keys, shortKeys...))
}

// TestBatchGetOutgrowingItsPoolFailsAtOnce: a batch get whose values each fit the
// requester's pool but not together (three 3 MiB values of another owner through an
// owner of 8 MiB) is served as far as they fit; the item that can fit only once the
// batch's own earlier items are released fails NO_SPACE at once instead of waiting the
// master's whole AllocWait for room only its own batch holds.
func TestBatchGetOutgrowingItsPoolFailsAtOnce(t *testing.T) {
	t.Parallel()
	const allocWait = 20 * time.Second
	n, c2 := batchPair(t, 32<<20, allocWait, 8<<20, noCacheGrace)
	keys := []string{"big/0", "big/1", "big/2"}
	var want [][]byte
	for i, k := range keys {
		want = append(want, value(i, 3<<20))
		if err := n.c.Put(k, want[i]); err != nil {
			t.Fatal(err)
		}
	}
	checkBatchServesTwo(t, c2, keys, want, allocWait)
}

// TestBatchGetOutgrowingAcrossMasterCalls: a batch of long keys goes to the master in
// two BatchGetStart calls (their keys pass masterCallBytes); the second call counts
// the targets the first planned, so its last key, which fits the pool alone but not
// beside the batch's other targets, fails NO_SPACE at once instead of waiting the
// master's AllocWait for room only its own batch holds (the owner's call timed out
// first: UNAVAILABLE after 15 s).
//
// Not parallel: the batch's pipelined pull of MaxBatch values from n1 has one deadline
// (5 s and its bytes); beside three other tests on two cores under -race it ran out.
func TestBatchGetOutgrowingAcrossMasterCalls(t *testing.T) {
	const allocWait = 60 * time.Second
	n, c2 := batchPair(t, 64<<20, allocWait, 20<<20, noCacheGrace)
	keys := make([]string, wire.MaxBatch)
	want := make([][]byte, len(keys))
	items := make([]fluxkv.PutItem, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("%04d/%s", i, strings.Repeat("k", wire.MaxKeyBytes-5))
		want[i] = value(i, 4<<10)
		if i == len(keys)-1 {
			want[i] = value(i, 6<<20) // fits the 20 MiB pool alone, not beside 16 MiB of targets
		}
		items[i] = fluxkv.PutItem{Key: keys[i], Value: want[i]}
	}
	if errs, err := n.c.BatchPut(items, fluxkv.PutOptions{}); err != nil || errors.Join(errs...) != nil {
		t.Fatalf("batch put: %v %v", err, errors.Join(errs...))
	}
	start := time.Now()
	hs, errs, err := c2.BatchGet(keys)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	last := len(keys) - 1
	for i, h := range hs {
		if h != nil {
			if !bytes.Equal(h.Bytes(), want[i]) {
				t.Errorf("batch get %d: wrong bytes", i)
			}
			h.Release()
		} else if i < last {
			t.Errorf("batch get %d: %v", i, errs[i])
		}
	}
	if !errors.Is(errs[last], fluxkv.ErrNoSpace) {
		t.Errorf("the last key: %v, want NO_SPACE", errs[last])
	}
	// A key that waits for room only its own batch holds fails UNAVAILABLE at the owner's
	// 15 s call timeout (the check above), or NO_SPACE after the AllocWait (60 s, here).
	// The batch itself takes 2.8 s with -race alone (MaxBatch long keys) and took 16 s
	// on two cores shared with three other tests: the bound is three quarters of the
	// AllocWait, not of the call timeout.
	if took >= allocWait*3/4 {
		t.Errorf("the batch took %v: its last key waited for room only its own batch held (AllocWait %v)", took, allocWait)
	}
}

// TestBatchGetLandingTargetsDoNotOutgrowPool: a batch's targets in the requester's
// landing area (outside its pool) take none of the pool's room, so a later key of the
// batch whose target would fit the pool does not fail NO_SPACE at once while the pool is
// held by the client's other handles for a moment; it waits for that room as a per-key
// get would.
func TestBatchGetLandingTargetsDoNotOutgrowPool(t *testing.T) {
	t.Parallel()
	n, c2 := batchPair(t, 32<<20, 20*time.Second, 8<<20, noCacheGrace, func(o *Options) { o.LandingReserve = 6 << 20 })
	// n2's pool: 6 of its 8 MiB held by the client's handles of its own values.
	var held []*fluxkv.MemHolder
	for i := range 2 {
		k := fmt.Sprintf("mine/%d", i)
		if err := c2.Put(k, value(50+i, 3<<20)); err != nil {
			t.Fatal(err)
		}
		h, err := c2.Get(k)
		if err != nil || h == nil {
			t.Fatalf("get %s: %v", k, err)
		}
		held = append(held, h)
	}
	keys := []string{"r/0", "r/1", "r/2"}
	for i, k := range keys {
		if err := n.c.Put(k, value(i, 3<<20)); err != nil {
			t.Fatal(err)
		}
	}
	go func() {
		time.Sleep(500 * time.Millisecond)
		for _, h := range held {
			h.Release()
		}
	}()
	// r/0 and r/1 land in the 6 MiB landing area; r/2 needs 3 MiB of the pool, free
	// once the handles are released.
	checkBatchServesAll(t, c2, keys, [][]byte{value(0, 3<<20), value(1, 3<<20), value(2, 3<<20)},
		"its batch's landing targets were counted against the pool")
}

// TestBatchGetOwnReplicasCountAgainstPool: the requester's memory replicas a batch
// reuses are held by the batch from its first phase on, in the pool: a later key whose
// target fits beside the batch's targets but not beside those replicas too needs room
// only its own batch holds, and fails NO_SPACE at once instead of waiting the master's
// AllocWait (past the owner's call timeout the whole batch failed UNAVAILABLE).
func TestBatchGetOwnReplicasCountAgainstPool(t *testing.T) {
	t.Parallel()
	const allocWait = 20 * time.Second
	n, c2 := batchPair(t, 32<<20, allocWait, 8<<20, noCacheGrace)
	mine := value(100, 3<<20)
	if err := c2.Put("mine", mine); err != nil { // n2's memory replica, reused by the batch
		t.Fatal(err)
	}
	keys := []string{"mine", "big/0", "big/1"}
	want := [][]byte{mine, value(0, 3<<20), value(1, 3<<20)}
	for i, k := range keys[1:] {
		if err := n.c.Put(k, want[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	checkBatchServesTwo(t, c2, keys, want, allocWait)
}

// TestBatchGetLostReplyLeaksNoReusedHolder: a BatchGetStart whose reply the owner never
// reads (its call timed out while another key waited for space) leaves no holder at the
// master: the holder it recorded for a reused local replica has no id the owner could
// release, and kept the replica's range (and the value) held until the owner left.
func TestBatchGetLostReplyLeaksNoReusedHolder(t *testing.T) {
	t.Parallel()
	const allocWait = 5 * time.Second
	n, c2 := batchPair(t, 32<<20, allocWait, 8<<20, noCacheGrace, func(o *Options) { o.MasterTimeout = 3 * time.Second })
	for _, k := range []string{"mine", "other"} {
		if err := c2.Put(k, value(7, 3<<20)); err != nil {
			t.Fatal(err)
		}
	}
	other, err := c2.Get("other") // held: the batch's remote key finds no room
	if err != nil || other == nil {
		t.Fatalf("get other: %v", err)
	}
	if err := n.c.Put("big", value(8, 3<<20)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	hs, errs, err := c2.BatchGet([]string{"mine", "big"})
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if h != nil {
			h.Release()
		}
		t.Logf("item %d: %v", i, errs[i])
	}
	other.Release()
	time.Sleep(time.Until(start.Add(allocWait + time.Second))) // the master's call ended
	holders := func() int64 { return memberHolders(t, n.m, "n2") }
	deadline := time.Now().Add(5 * time.Second)
	for h := holders(); h != 0; h = holders() {
		if time.Now().After(deadline) {
			t.Fatalf("the master keeps %d holder(s) of n2, whose client holds none (a lost BatchGetStart reply's reused replica)", h)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBatchGetLandingValueWaitsForLanding: a value larger than the requester's pool but
// within its landing area (where such a get always lands) needs room another get
// holds for a moment, not its batch: it waits for it as its per-key get would, instead
// of failing NO_SPACE at once as if it could never fit.
func TestBatchGetLandingValueWaitsForLanding(t *testing.T) {
	t.Parallel()
	n, c2 := batchPair(t, 32<<20, 10*time.Second, 8<<20, noCacheGrace, func(o *Options) { o.LandingReserve = 10 << 20 })
	for i, k := range []string{"other", "big"} {
		if err := n.c.Put(k, value(i, 9<<20)); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.c.Put("small", value(2, 1<<20)); err != nil {
		t.Fatal(err)
	}
	held, err := c2.Get("other") // lands in n2's landing area, held for a moment
	if err != nil || held == nil {
		t.Fatalf("get other: %v", err)
	}
	go func() {
		time.Sleep(500 * time.Millisecond)
		held.Release()
	}()
	keys := []string{"big", "small"}
	checkBatchServesAll(t, c2, keys, [][]byte{value(1, 9<<20), value(2, 1<<20)}, "a per-key get waits for the landing area")
}

// TestBatchGetHotSetHitsCountAgainstPool: a key of the batch that the owner's hot set
// answers (no master trip) is held by the batch's client in the pool as much as a
// replica the master reuses: a later key whose target fits beside the batch's targets
// but not beside that holding too needs room only its own batch holds, and fails
// NO_SPACE at once instead of waiting the master's AllocWait (past the owner's call
// timeout the batch's other keys all failed UNAVAILABLE).
func TestBatchGetHotSetHitsCountAgainstPool(t *testing.T) {
	t.Parallel()
	const allocWait = 20 * time.Second
	n, c2 := batchPair(t, 32<<20, allocWait, 8<<20)
	mine := value(100, 3<<20)
	if err := c2.Put("mine", mine); err != nil {
		t.Fatal(err)
	}
	h, err := c2.Get("mine") // its released holding stays in n2's hot set
	if err != nil || h == nil {
		t.Fatalf("get mine: %v", err)
	}
	h.Release()
	keys := []string{"mine", "big/0", "big/1"}
	want := [][]byte{mine, value(0, 3<<20), value(1, 3<<20)}
	for i, k := range keys[1:] {
		if err := n.c.Put(k, want[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	checkBatchServesTwo(t, c2, keys, want, allocWait)
}

// checkBatchServesTwo runs c.BatchGet(keys) of three values of which two fit the
// requester's 8 MiB pool together: those two are served with the bytes want names, the
// third fails NO_SPACE, and the batch ends well within allocWait (no key waited for
// room only its own batch held).
// batchPair starts node n1 of n1Dram (its master places every put on its requester and
// waits allocWait for space) and owner n2 of n2Dram without a transfer area, the
// requester of the batch tests; tweaks adjust n2's options further.
func batchPair(t *testing.T, n1Dram int64, allocWait time.Duration, n2Dram int64, tweaks ...func(*Options)) (*node, *fluxkv.Client) {
	t.Helper()
	n := startNode(t, n1Dram, nil, master.Options{InsecureCluster: true, Placement: master.PlacementLocal, AllocWait: allocWait})
	_, c2 := n.addOwner(t, "n2", n2Dram, nil, append([]func(*Options){func(o *Options) { o.TransferReserve = -1 }}, tweaks...)...)
	return n, c2
}

// noCacheGrace turns an owner's cache grace off (batchPair).
func noCacheGrace(o *Options) { o.CacheGrace = -1 }

func checkBatchServesTwo(t *testing.T, c *fluxkv.Client, keys []string, want [][]byte, allocWait time.Duration) {
	t.Helper()
	start := time.Now()
	hs, errs, err := c.BatchGet(keys)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	served := 0
	for i, k := range keys {
		switch {
		case errs[i] == nil && hs[i] != nil:
			if !bytes.Equal(hs[i].Bytes(), want[i]) {
				t.Errorf("batch get %s: wrong bytes", k)
			}
			hs[i].Release()
			served++
		case errs[i] != nil && !errors.Is(errs[i], fluxkv.ErrNoSpace):
			t.Errorf("batch get %s: %v, want NO_SPACE", k, errs[i])
		case errs[i] == nil:
			t.Errorf("batch get %s: not found", k)
		}
	}
	if served != 2 {
		t.Errorf("%d of 3 items served, want 2 (two fit the 8 MiB pool)", served)
	}
	if took >= allocWait/2 {
		t.Errorf("the batch took %v: a key waited for room only its own batch held (AllocWait %v)", took, allocWait)
	}
}

// checkBatchServesAll runs c.BatchGet(keys): every key is served with the bytes want
// names; why says what an error would mean.
func checkBatchServesAll(t *testing.T, c *fluxkv.Client, keys []string, want [][]byte, why string) {
	t.Helper()
	hs, errs, err := c.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		switch {
		case errs[i] != nil:
			t.Errorf("batch get %s: %v (%s)", k, errs[i], why)
		case hs[i] == nil:
			t.Errorf("batch get %s: not found", k)
		case !bytes.Equal(hs[i].Bytes(), want[i]):
			t.Errorf("batch get %s: wrong bytes", k)
		}
		if hs[i] != nil {
			hs[i].Release()
		}
	}
}

// TestBatchGetRepeatedHotSetHitCountsOnce: a key named twice in a batch that the hot set
// answers holds one range of the pool, not two: a later key that fits beside it waits
// for room the client's other handle frees a moment later, as a per-key get would,
// instead of failing NO_SPACE at once (the hit was counted once per name in held_bytes).
func TestBatchGetRepeatedHotSetHitCountsOnce(t *testing.T) {
	t.Parallel()
	n, c2 := batchPair(t, 32<<20, 20*time.Second, 8<<20)
	mine := value(100, 3<<20)
	if err := c2.Put("mine", mine); err != nil {
		t.Fatal(err)
	}
	h, err := c2.Get("mine") // its released holding stays in n2's hot set
	if err != nil || h == nil {
		t.Fatalf("get mine: %v", err)
	}
	h.Release()
	if err := c2.Put("other", value(101, 3<<20)); err != nil {
		t.Fatal(err)
	}
	other, err := c2.Get("other") // held by the client for a moment
	if err != nil || other == nil {
		t.Fatalf("get other: %v", err)
	}
	if err := n.c.Put("big", value(0, 3<<20)); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(500 * time.Millisecond)
		other.Release()
	}()
	// mine (3 MiB, once) + big (3 MiB) fit the 8 MiB pool; big waits for other's room.
	checkBatchServesAll(t, c2, []string{"mine", "mine", "big"}, [][]byte{mine, mine, value(0, 3<<20)},
		"a repeated hot-set hit was counted twice against the pool")
}
