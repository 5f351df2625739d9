package fluxkv

import (
	"fmt"
	"github.com/cloudwego/gopkg/protocol/thrift"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// PutOptions tune a put.
type PutOptions struct {
	// RejectIfExists fails the put with ErrAlreadyExists when the key has a value.
	RejectIfExists bool
}

// Put stores value under key: one copy, into the shared segment.
func (c *Client) Put(key string, value []byte) error {
	return c.PutWith(key, int64(len(value)), PutOptions{}, func(dst []byte) error { copy(dst, value); return nil })
}

// PutWith reserves n bytes for key, lets fill write them straight into the shared
// segment, then publishes the value. If fill fails the put is aborted.
func (c *Client) PutWith(key string, n int64, opts PutOptions, fill func(dst []byte) error) error {
	if err := wire.ValidateKey(key); err != nil {
		return err
	}
	if err := wire.ValidateLen(n, c.SegmentSize()); err != nil {
		return err
	}
	start, a, err := invoke(c, call{method: "PutStart", retry: true, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServicePutStartArgs{Req: &external.PutStartRequest{
			Session: s, Key: key, Len: n, Opts: &external.PutOptions{RejectIfExists: opts.RejectIfExists}}}
	}}, &external.ExternalServicePutStartResult{})
	if err != nil {
		return err
	}
	if start.Offset < 0 || start.Offset+n > a.reply.SegmentSize {
		c.abort(key, start.PutId)
		return fmt.Errorf("%w: owner returned offset %d outside the segment", ErrUnavailable, start.Offset)
	}
	if err := fill(a.rw.Bytes()[start.Offset : start.Offset+n : start.Offset+n]); err != nil {
		c.abort(key, start.PutId)
		return err
	}
	// PutEnd belongs to the incarnation that started the put: never retried elsewhere.
	_, _, err = invoke(c, call{method: "PutEnd", args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServicePutEndArgs{Req: &external.PutEndRequest{Session: s, Key: key, PutId: start.PutId}}
	}}, &external.ExternalServicePutEndResult{})
	return err
}

func (c *Client) abort(key string, putID int64) {
	invoke(c, call{method: "PutAbort", args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServicePutAbortArgs{Req: &external.PutAbortRequest{Session: s, Key: key, PutId: putID}}
	}}, &external.ExternalServicePutAbortResult{})
}

// Get returns a holder viewing key's value in the shared segment; ErrKeyNotFound on a miss.
func (c *Client) Get(key string) (*MemHolder, error) {
	if err := wire.ValidateKey(key); err != nil {
		return nil, err
	}
	r, a, err := invoke(c, call{method: "Get", retry: true, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceGetArgs{Req: &external.GetRequest{Session: s, Key: key}}
	}}, &external.ExternalServiceGetResult{})
	if err != nil {
		return nil, err
	}
	return c.holder(a, r)
}

func (c *Client) holder(a *attachment, r *external.GetResponse) (*MemHolder, error) {
	if r.Offset < 0 || r.Len < 0 || r.Offset+r.Len > a.reply.SegmentSize {
		c.queueRelease(a, r.HolderId)
		return nil, fmt.Errorf("%w: owner returned range [%d,+%d) outside the segment", ErrUnavailable, r.Offset, r.Len)
	}
	return &MemHolder{c: c, a: a, id: r.HolderId, off: r.Offset, n: r.Len, source: r.Source, putID: r.PutId}, nil
}

// Delete removes key and reports whether it existed.
func (c *Client) Delete(key string) (bool, error) {
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	r, _, err := invoke(c, call{method: "Delete", retry: true, args: func(s *external.Session) thrift.FastCodec {
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
	r, _, err := invoke(c, call{method: "Exists", retry: true, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceExistsArgs{Req: &external.ExistsRequest{Session: s, Key: key}}
	}}, &external.ExternalServiceExistsResult{})
	if err != nil {
		return false, err
	}
	return r.Exists, nil
}

// BatchGet gets many keys in one round trip; a miss is a nil holder with a nil error.
func (c *Client) BatchGet(keys []string) ([]*MemHolder, []error, error) {
	r, a, err := invoke(c, call{method: "BatchGet", retry: true, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceBatchGetArgs{Req: &external.BatchKeysRequest{Session: s, Keys: keys}}
	}}, &external.ExternalServiceBatchGetResult{})
	if err != nil {
		return nil, nil, err
	}
	hs := make([]*MemHolder, len(keys))
	errs := make([]error, len(keys))
	for i, g := range r.Results {
		if i >= len(keys) {
			break
		}
		if g.Code == common.ErrorCode_KEY_NOT_FOUND {
			continue
		}
		if errs[i] = wire.FromResponse(g.Code, g.Message); errs[i] == nil {
			hs[i], errs[i] = c.holder(a, g)
		}
	}
	return hs, errs, nil
}

// BatchExists checks many keys in one round trip.
func (c *Client) BatchExists(keys []string) ([]bool, error) {
	r, _, err := invoke(c, call{method: "BatchExists", retry: true, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceBatchExistsArgs{Req: &external.BatchKeysRequest{Session: s, Keys: keys}}
	}}, &external.ExternalServiceBatchExistsResult{})
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(keys))
	for i, e := range r.Results {
		if i < len(out) {
			out[i] = e.Exists
		}
	}
	return out, nil
}

// BatchDelete deletes many keys in one round trip.
func (c *Client) BatchDelete(keys []string) ([]bool, error) {
	r, _, err := invoke(c, call{method: "BatchDelete", retry: true, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceBatchDeleteArgs{Req: &external.BatchKeysRequest{Session: s, Keys: keys}}
	}}, &external.ExternalServiceBatchDeleteResult{})
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(keys))
	for i, e := range r.Results {
		if i < len(out) {
			out[i] = e.Deleted
		}
	}
	return out, nil
}

// Stat returns the cluster's members and key count as the owner sees them, after
// applying this client's pending releases.
func (c *Client) Stat() (*external.StatResponse, error) {
	r, _, err := invoke(c, call{method: "Stat", retry: true, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceStatArgs{Req: &external.StatRequest{Session: s}}
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
	arm := !c.timerSet
	c.timerSet = true
	c.mu.Unlock()
	if arm {
		time.AfterFunc(c.opts.ReleaseDelay, func() {
			c.mu.Lock()
			c.timerSet = false
			c.mu.Unlock()
			c.Flush()
		})
	}
}

// Flush sends queued releases now (they ride on the session of an empty Release).
func (c *Client) Flush() error {
	c.mu.Lock()
	pending := len(c.releases) > 0 && !c.closed
	c.mu.Unlock()
	if !pending {
		return nil
	}
	_, _, err := invoke(c, call{method: "Release", args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceReleaseArgs{Req: &external.ReleaseRequest{Session: s}}
	}}, &external.ExternalServiceReleaseResult{})
	return err
}
