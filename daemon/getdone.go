package daemon

import (
	"slices"
	"sync"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// GetDones in one call. A get that brought a value into a target (a pull, a refill)
// ends with GetDone; the gets of one batch finish at nearly the same time. At most one
// GetDone call of this owner is out at a time: the caller that finds none out sends the
// queue (its own GetDone and the ones that arrived meanwhile) in one BatchGetDone per
// mp.BATCH (GetDone for a single one) until its own is answered, and hands what is still
// queued to a goroutine of its own; the others wait for their answer. Without
// concurrency each GetDone is sent at once, as before.

// getDoneQueue is the owner's pending GetDones.
type getDoneQueue struct {
	mu      sync.Mutex
	queue   []*getDoneCall
	sending bool
}

// getDoneCall is one queued GetDone and, once done is closed, its answer (err: the
// transport's or the call's, per masterLink.check).
type getDoneCall struct {
	key   string
	getID int64
	resp  *mp.GetDoneResponse
	err   error
	done  chan struct{}
}

// getDone completes the get getID of key at the master.
func (o *Owner) getDone(key string, getID int64) (*mp.GetDoneResponse, error) {
	c := o.getDoneMany([]string{key}, []int64{getID})[0]
	return c.resp, c.err
}

// getDoneMany completes the gets ids (of keys) at the master: queued together, they go
// in one BatchGetDone per mp.BATCH (behind any call already out). It returns the
// answered calls, in order.
func (o *Owner) getDoneMany(keys []string, ids []int64) []*getDoneCall {
	q := &o.getDones
	calls := make([]*getDoneCall, len(keys))
	for i, k := range keys {
		calls[i] = &getDoneCall{key: k, getID: ids[i], done: make(chan struct{})}
	}
	q.mu.Lock()
	q.queue = append(q.queue, calls...)
	lead := !q.sending
	q.sending = true
	q.mu.Unlock()
	if lead {
		o.sendQueued(calls[len(calls)-1].done) // the queue is sent in order: the last is answered last
	}
	for _, c := range calls {
		<-c.done
	}
	return calls
}

// sendQueued sends the queued GetDones; with own set it returns once own is closed
// (answered), handing anything still queued to a new goroutine (joined by Owner.wg).
func (o *Owner) sendQueued(own chan struct{}) {
	q := &o.getDones
	q.mu.Lock()
	for len(q.queue) > 0 {
		if own != nil && isClosed(own) {
			o.wg.Add(1)
			go func() {
				defer o.wg.Done()
				o.sendQueued(nil)
			}()
			q.mu.Unlock()
			return
		}
		n := min(len(q.queue), int(mp.BATCH))
		calls := slices.Clone(q.queue[:n])
		q.queue = slices.Delete(q.queue, 0, n)
		q.mu.Unlock()
		o.sendGetDones(calls)
		q.mu.Lock()
	}
	q.sending = false
	q.mu.Unlock()
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// sendGetDones makes one GetDone or BatchGetDone call for calls and answers each.
func (o *Owner) sendGetDones(calls []*getDoneCall) {
	ctx, cancel := o.master.ctx()
	defer cancel()
	defer func() {
		for _, c := range calls {
			close(c.done)
		}
	}()
	if len(calls) == 1 {
		c := calls[0]
		resp, err := o.master.cl().GetDone(ctx, &mp.GetDoneRequest{Node: o.master.ref(), Key: c.key, GetId: c.getID})
		c.resp, c.err = resp, o.master.check(respCode(resp, err))
		return
	}
	items := make([]*mp.GetDoneItem, len(calls))
	for i, c := range calls {
		items[i] = &mp.GetDoneItem{Key: c.key, GetId: c.getID}
	}
	resp, err := o.master.cl().BatchGetDone(ctx, &mp.BatchGetDoneRequest{Node: o.master.ref(), Items: items})
	err = o.master.check(respCode(resp, err))
	if err == nil && (len(resp.Results) != len(calls) || slices.Contains(resp.Results, nil)) {
		err = errCode(common.ErrorCode_INTERNAL, "the master answered %d of %d gets of a BatchGetDone", len(resp.Results), len(calls))
	}
	for i, c := range calls {
		if c.err = err; err == nil {
			c.resp, c.err = resp.Results[i], o.master.check(resp.Results[i].Code, resp.Results[i].Message, nil)
		}
	}
}
