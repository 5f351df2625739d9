package fluxkv

import (
	"fmt"
	"sync"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Get returns a holder viewing key's value in the shared segment; ErrKeyNotFound on a miss.
func (c *Client) Get(key string) (*MemHolder, error) {
	if err := wire.ValidateKey(key); err != nil {
		return nil, err
	}
	g := getCalls.Get().(*getCall)
	g.req.Key = key
	r, a, err := invoke(c, call{method: "Get", retry: retryAlways, req: g}, &g.res)
	var h *MemHolder
	if err == nil {
		h, err = c.holder(a, r)
	}
	*g = getCall{} // keeps nothing of this call (key, session) while pooled
	getCalls.Put(g)
	return h, err
}

// getCall is one Get's request and reply, pooled: a get allocates only its holder (the
// generated Args, request, Result and response structs would be four allocations more).
type getCall struct {
	args external.ExternalServiceGetArgs
	req  external.GetRequest
	res  getResult
}

var getCalls = sync.Pool{New: func() any { return new(getCall) }}

func (g *getCall) withSession(s *external.Session) thrift.FastCodec {
	g.req.Session = s
	g.args.Req = &g.req
	return &g.args
}

// getResult is ExternalServiceGetResult decoding into a GetResponse it holds, where the
// generated struct allocates one per reply. Only FastRead is used (a reply is read, never
// written); the rest of thrift.FastCodec delegates to the generated struct.
type getResult struct {
	resp external.GetResponse
	set  bool
}

func (r *getResult) FastRead(buf []byte) (int, error) {
	r.resp, r.set = external.GetResponse{}, false
	off := 0
	for {
		typ, id, l, err := thrift.Binary.ReadFieldBegin(buf[off:])
		off += l
		if err != nil {
			return off, fmt.Errorf("Get result: %w", err)
		}
		if typ == thrift.STOP {
			return off, nil
		}
		if id == 0 && typ == thrift.STRUCT {
			l, err = r.resp.FastRead(buf[off:])
			r.set = true
		} else {
			l, err = thrift.Binary.Skip(buf[off:], typ)
		}
		off += l
		if err != nil {
			return off, fmt.Errorf("Get result field %d: %w", id, err)
		}
	}
}

func (r *getResult) generated() *external.ExternalServiceGetResult {
	if !r.set {
		return &external.ExternalServiceGetResult{}
	}
	return &external.ExternalServiceGetResult{Success: &r.resp}
}

func (r *getResult) BLength() int { return r.generated().BLength() }
func (r *getResult) FastWriteNocopy(buf []byte, w thrift.NocopyWriter) int {
	return r.generated().FastWriteNocopy(buf, w)
}
func (r *getResult) IsSetSuccess() bool { return r.set }
func (r *getResult) GetSuccess() *external.GetResponse {
	if !r.set {
		return nil
	}
	return &r.resp
}

func (c *Client) holder(a *attachment, r *external.GetResponse) (*MemHolder, error) {
	if !inSegment(r.Offset, r.Len, a.reply.SegmentSize) {
		c.queueRelease(a, r.HolderId)
		return nil, fmt.Errorf("%w: owner returned range [%d,+%d) outside the segment", ErrUnavailable, r.Offset, r.Len)
	}
	if !c.use(a) {
		c.queueRelease(a, r.HolderId)
		return nil, fmt.Errorf("%w: the session ended (the owner restarted, or the client closed) before the holder arrived", ErrUnavailable)
	}
	return &MemHolder{c: c, a: a, id: r.HolderId, off: r.Offset, n: r.Len, source: r.Source, remote: r.Remote, putID: r.PutId}, nil
}

// Delete removes key and reports whether it existed.
func (c *Client) Delete(key string) (bool, error) {
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	r, _, err := invoke(c, call{method: "Delete", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceDeleteArgs{Req: &external.DeleteRequest{Session: s, Key: key}}
	}}, &external.ExternalServiceDeleteResult{})
	if err != nil {
		return false, err
	}
	return r.Deleted, nil
}

// Exists reports whether key has a value.
func (c *Client) Exists(key string) (bool, error) {
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	r, _, err := invoke(c, call{method: "Exists", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: s, Key: key}}
	}}, &external.ExternalServiceExistsResult{})
	if err != nil {
		return false, err
	}
	return r.Exists, nil
}

// chunks calls f on consecutive slices of at most wire.MaxBatch keys, with the index of
// each slice's first key, stopping at the first error.
func chunks(keys []string, f func(base int, part []string) error) error {
	for base := 0; base < len(keys); base += wire.MaxBatch {
		if err := f(base, keys[base:min(base+wire.MaxBatch, len(keys))]); err != nil {
			return err
		}
	}
	return nil
}

// BatchGet gets many keys, wire.MaxBatch per round trip; a miss is a nil holder with a
// nil error. On a call error the holders obtained so far are released. (Gets need no
// waves: a get holds no space that only a later item of the same batch could free.)
func (c *Client) BatchGet(keys []string) ([]*MemHolder, []error, error) {
	hs := make([]*MemHolder, len(keys))
	errs := make([]error, len(keys))
	err := chunks(keys, func(base int, part []string) error {
		r, a, err := invoke(c, call{method: "BatchGet", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
			return &external.ExternalServiceBatchGetArgs{Req: &external.BatchKeysRequest{Session: s, Keys: part}}
		}}, &external.ExternalServiceBatchGetResult{})
		if err != nil {
			return err
		}
		if len(r.Results) != len(part) {
			// A malformed answer: a missing result is no miss. The holders it grants go back.
			for _, g := range r.Results {
				if g != nil && g.Code == common.ErrorCode_OK {
					c.queueRelease(a, g.HolderId)
				}
			}
			return fmt.Errorf("%w: the owner answered %d results for %d keys", ErrUnavailable, len(r.Results), len(part))
		}
		for i, g := range r.Results {
			if g == nil {
				errs[base+i] = fmt.Errorf("%w: the owner answered no result for %q", ErrUnavailable, part[i])
				continue
			}
			if g.Code == common.ErrorCode_KEY_NOT_FOUND {
				continue
			}
			if errs[base+i] = wire.FromResponse(g.Code, g.Message); errs[base+i] == nil {
				hs[base+i], errs[base+i] = c.holder(a, g)
			}
		}
		return nil
	})
	if err != nil {
		for _, h := range hs {
			if h != nil {
				h.Release()
			}
		}
		return nil, nil, err
	}
	return hs, errs, nil
}

// BatchExists checks many keys, wire.MaxBatch per round trip. A key the owner could not
// evaluate (an invalid key, a failed master call) fails the call, as Exists fails.
func (c *Client) BatchExists(keys []string) ([]bool, error) {
	out := make([]bool, len(keys))
	err := chunks(keys, func(base int, part []string) error {
		r, _, err := invoke(c, call{method: "BatchExists", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
			return &external.ExternalServiceBatchExistsArgs{Req: &external.BatchExistsRequest{Session: s, Keys: part}}
		}}, &external.ExternalServiceBatchExistsResult{})
		if err != nil {
			return err
		}
		return batchFlags(part, len(r.Results), func(i int) (bool, common.ErrorCode, string) {
			e := r.Results[i]
			return e.Exists, e.Code, e.Message
		}, out[base:])
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// batchFlags fills out[i] for each key of part from a batch answer of n results (get
// answers result i): a key the owner could not evaluate (its code neither OK nor
// KEY_NOT_FOUND: say UNAVAILABLE, its master call failed) fails the call, as it fails
// the per-key call; it is never a plain false.
func batchFlags(part []string, n int, get func(i int) (bool, common.ErrorCode, string), out []bool) error {
	if n != len(part) {
		return fmt.Errorf("%w: %d results for %d keys", ErrUnavailable, n, len(part))
	}
	for i := range part {
		flag, code, msg := get(i)
		switch code {
		case common.ErrorCode_OK:
			out[i] = flag
		case common.ErrorCode_KEY_NOT_FOUND:
		default:
			return fmt.Errorf("key %q: %w", part[i], wire.FromResponse(code, msg))
		}
	}
	return nil
}

// MaxPin is the longest pin of a prefix lookup (BatchExistsPrefix; the protocol's
// MAX_PIN_MS).
const MaxPin = time.Duration(external.MAX_PIN_MS) * time.Millisecond

// BatchExistsPrefix is a prefix lookup: keys are the pages of one prompt in order, and it
// returns how many leading keys are present. The owner evaluates each chunk of
// wire.MaxBatch keys in one call and stops at the first absent key; a later chunk is
// sent only when the whole previous one was present. A key the owner could not
// evaluate (a per-key error) ends the count like an absent one.
//
// pin > 0 (at most MaxPin; rounded up to whole milliseconds) also pins the pages found
// for that long: each becomes a holding of this client's session in the owner's memory,
// so the load that follows finds it and eviction spares it (a page on another owner or
// on SSD is brought in only as far as half the owner's landing area takes; the rest are
// counted unpinned and the load brings them in). A pin needs no release: it ends when its time is up, when the
// session ends, or when this client gets the same key (the get's holder takes over).
// Pins count against the owner's hot-set budget; a page that cannot be pinned ends the
// count like an absent one.
//
// An owner that predates prefix lookups answers every key (and pins nothing): the count
// is then that of the leading keys present, the same answer. On an error the count is
// that of the chunks answered before it.
func (c *Client) BatchExistsPrefix(keys []string, pin time.Duration) (int, error) {
	if pin < 0 || pin > MaxPin {
		return 0, wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "pin %v: must be 0 to %v (MAX_PIN_MS)", pin, MaxPin)
	}
	pinMS := int64((pin + time.Millisecond - 1) / time.Millisecond)
	for i, k := range keys {
		if err := wire.ValidateKey(k); err != nil {
			return 0, fmt.Errorf("key %d: %w", i, err)
		}
	}
	total := 0
	for base := 0; base < len(keys); base += wire.MaxBatch {
		part := keys[base:min(base+wire.MaxBatch, len(keys))]
		r, _, err := invoke(c, call{method: "BatchExists", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
			return &external.ExternalServiceBatchExistsArgs{Req: &external.BatchExistsRequest{Session: s, Keys: part, Prefix: true, PinMs: pinMS}}
		}}, &external.ExternalServiceBatchExistsResult{})
		if err != nil {
			return total, err
		}
		n := prefixCount(r.Results, r.Found, len(part))
		total += n
		if n < len(part) {
			break
		}
	}
	return total, nil
}

// prefixCount is the count of leading keys present that a prefix answer for n keys
// gives. A prefix-aware owner stops its results after the first absent key and counts
// in found; one that predates prefix lookups ignores the flag and answers every key
// with found = 0. So: found when the results are fewer than the keys or found > 0, else
// the number of leading results present.
func prefixCount(results []*external.ExistsResponse, found int32, n int) int {
	if len(results) < n || found > 0 {
		return min(max(int(found), 0), n)
	}
	k := 0
	for k < n && results[k] != nil && results[k].Code == common.ErrorCode_OK && results[k].Exists {
		k++
	}
	return k
}

// BatchDelete deletes many keys, wire.MaxBatch per round trip. A retried call (after a
// lost reply) may report deleted=false for a key it deleted. A key the owner could not
// delete (an invalid key, a failed master call) fails the call, as Delete fails: the
// keys of its chunk may or may not be deleted.
func (c *Client) BatchDelete(keys []string) ([]bool, error) {
	out := make([]bool, len(keys))
	err := chunks(keys, func(base int, part []string) error {
		r, _, err := invoke(c, call{method: "BatchDelete", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
			return &external.ExternalServiceBatchDeleteArgs{Req: &external.BatchKeysRequest{Session: s, Keys: part}}
		}}, &external.ExternalServiceBatchDeleteResult{})
		if err != nil {
			return err
		}
		return batchFlags(part, len(r.Results), func(i int) (bool, common.ErrorCode, string) {
			e := r.Results[i]
			return e.Deleted, e.Code, e.Message
		}, out[base:])
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteNamespace deletes every key of namespace ns cluster-wide (a key's namespace is
// the text before its last '/': see wire.KeyNamespace) and returns how many existed.
// Holders of those keys keep their bytes. It costs one master call per 4,096 keys of
// the namespace, whatever the size of the cache. A retried call (after a lost reply)
// may count fewer keys.
func (c *Client) DeleteNamespace(ns string) (int64, error) {
	if err := wire.ValidateNamespace(ns); err != nil {
		return 0, err
	}
	r, _, err := invoke(c, call{method: "DeleteNamespace", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceDeleteNamespaceArgs{Req: &external.NamespaceRequest{Session: s, Name: ns}}
	}}, &external.ExternalServiceDeleteNamespaceResult{})
	if err != nil {
		return 0, err
	}
	return r.Deleted, nil
}

// NamespaceStat returns the number of keys of namespace ns and the bytes of their
// values (each key's current version once, however many replicas it has).
func (c *Client) NamespaceStat(ns string) (keys, bytes int64, err error) {
	if err := wire.ValidateNamespace(ns); err != nil {
		return 0, 0, err
	}
	r, _, err := invoke(c, call{method: "NamespaceStat", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceNamespaceStatArgs{Req: &external.NamespaceRequest{Session: s, Name: ns}}
	}}, &external.ExternalServiceNamespaceStatResult{})
	if err != nil {
		return 0, 0, err
	}
	return r.Keys, r.Bytes, nil
}

// Stat returns the cluster's members and key count as the owner sees them, after
// applying this client's pending releases, and the masters (Masters: each one's
// address, whether it is the leader and the epoch of its leadership, as the leader
// reports them; with masters on etcd, every campaigning master). The owner lets its
// hot set's idle holdings go first, so holder counts are exact; see StatWith.
func (c *Client) Stat() (*external.StatResponse, error) { return c.StatWith(StatOptions{}) }

// StatOptions tunes StatWith.
type StatOptions struct {
	// KeepHotSet leaves the owner's hot set as it is (its holder figures then count the
	// idle holdings it caches): for status polls, which would otherwise send the owner's
	// next gets of every cached key to the master.
	KeepHotSet bool
}

// StatWith is Stat with options.
func (c *Client) StatWith(opts StatOptions) (*external.StatResponse, error) {
	r, _, err := invoke(c, call{method: "Stat", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceStatArgs{Req: &external.StatRequest{Session: s, KeepHotSet: opts.KeepHotSet}}
	}}, &external.ExternalServiceStatResult{})
	return r, err
}

// queueRelease schedules a holder release: it rides on the next call, or goes on its
// own after ReleaseDelay. Holders of a previous owner incarnation need no release.
func (c *Client) queueRelease(a *attachment, id int64) {
	c.mu.Lock()
	if a != c.cur || c.closed {
		c.mu.Unlock()
		return
	}
	c.releases = append(c.releases, id)
	c.armReleaseLocked(c.opts.ReleaseDelay)
	c.mu.Unlock()
}

// armReleaseLocked arms the release timer to fire after d, unless it is armed already,
// nothing is queued or the client is closed.
func (c *Client) armReleaseLocked(d time.Duration) {
	if c.timerSet || c.closed || len(c.releases) == 0 {
		return
	}
	c.timerSet = true
	if c.relTimer == nil {
		c.relTimer = time.AfterFunc(d, c.releaseDue)
	} else {
		c.relTimer.Reset(d)
	}
}

// releaseRetryDelayLocked is how long queued releases whose call failed wait before the
// timer sends them again.
func (c *Client) releaseRetryDelayLocked() time.Duration {
	return max(c.opts.ReleaseDelay, c.relBackoff)
}

// releaseDue is the release timer's function: it sends what no call carried meanwhile.
// A failed send leaves the ids queued and re-arms the timer, backing off up to a second.
func (c *Client) releaseDue() {
	c.mu.Lock()
	c.timerSet = false
	c.mu.Unlock()
	err := c.Flush()
	c.mu.Lock()
	if err != nil {
		c.relBackoff = min(max(2*c.relBackoff, c.opts.ReleaseDelay, 10*time.Millisecond), time.Second)
	} else {
		c.relBackoff = 0
	}
	c.armReleaseLocked(c.releaseRetryDelayLocked())
	c.mu.Unlock()
}

// Flush sends queued releases now (they ride on the session of empty Releases), then
// waits for the calls of other goroutines in flight that carry releases, the release
// timer's included (a call that follows Flush finds the owner has them: Stat counts the
// holders released, a put finds the room they freed; one of those calls that fails gives
// its releases back, and Flush sends them). It fails when a call carrying releases failed
// again in its second round: they stay queued for a later call.
func (c *Client) Flush() error {
	if c.hooks.flushing != nil {
		c.hooks.flushing()
	}
	// Twice at most: a call waited for that fails gives its ids back to the queue (or to
	// its own retry, which takes them again), and the second round sends them or waits for
	// that retry (more rounds would chase the releases of a steady load).
	for round := 0; ; round++ {
		// Each call carries at most wire.MaxReleasesPerCall ids: loop until the queue is
		// empty, stopping at the first failure (the ids stay queued for a later call).
		for {
			c.mu.Lock()
			pending := len(c.releases) > 0 && !c.closed
			c.mu.Unlock()
			if !pending {
				break
			}
			c.releaseFlight(+1)
			_, _, err := invoke(c, call{method: releaseMethod, retry: retryNever, args: func(s *external.Session) thrift.FastCodec {
				return &external.ExternalServiceReleaseArgs{Req: &external.ReleaseRequest{Session: s}}
			}}, &external.ExternalServiceReleaseResult{})
			c.releaseFlight(-1)
			if err != nil {
				return err
			}
		}
		// The queue is empty, but a call that took the last ids (another goroutine's, or
		// the release timer's Flush) may still be on its way: wait for those in flight now
		// (each bounded by the call timeout; calls begun later are not waited for).
		c.mu.Lock()
		carrying := make([]chan struct{}, 0, len(c.carrying))
		for ch := range c.carrying {
			carrying = append(carrying, ch)
		}
		requeues := c.requeues
		c.mu.Unlock()
		if len(carrying) == 0 {
			return nil
		}
		for _, ch := range carrying {
			<-ch
		}
		c.mu.Lock()
		failed := c.requeues != requeues && !c.closed
		queued := len(c.releases) > 0 && !c.closed
		c.mu.Unlock()
		switch {
		case failed && round == 1:
			return fmt.Errorf("%w: a call carrying releases failed twice; they stay queued for a later call", ErrUnavailable)
		case !failed && (!queued || round == 1):
			return nil // (round 1: what is queued now came after Flush began)
		}
	}
}

// releaseMethod is Flush's call: the others wait for it (afterReleases).
const releaseMethod = "Release"

// releaseFlight counts a Flush call in (+1) or out (-1).
func (c *Client) releaseFlight(delta int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.relFlights == 0 {
		c.relIdle = make(chan struct{})
	}
	c.relFlights += delta
	if c.relFlights == 0 {
		close(c.relIdle)
		c.relIdle = nil
	}
}

// afterReleases waits until no Flush call is in flight (each is bounded by the call
// timeout), so the releases it carries reach the owner before the caller's call.
func (c *Client) afterReleases() {
	c.mu.Lock()
	idle := c.relIdle
	c.mu.Unlock()
	if idle != nil {
		<-idle
	}
}
