package fluxkv

import (
	"fmt"
	"github.com/cloudwego/gopkg/protocol/thrift"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Get returns a holder viewing key's value in the shared segment; ErrKeyNotFound on a miss.
func (c *Client) Get(key string) (*MemHolder, error) {
	if err := wire.ValidateKey(key); err != nil {
		return nil, err
	}
	r, a, err := invoke(c, call{method: "Get", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
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
		for i, g := range r.Results {
			if i >= len(part) {
				break
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

// BatchExists checks many keys, wire.MaxBatch per round trip.
func (c *Client) BatchExists(keys []string) ([]bool, error) {
	out := make([]bool, len(keys))
	err := chunks(keys, func(base int, part []string) error {
		r, _, err := invoke(c, call{method: "BatchExists", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
			return &external.ExternalServiceBatchExistsArgs{Req: &external.BatchKeysRequest{Session: s, Keys: part}}
		}}, &external.ExternalServiceBatchExistsResult{})
		if err != nil {
			return err
		}
		for i, e := range r.Results {
			if i < len(part) {
				out[base+i] = e.Exists
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// BatchDelete deletes many keys, wire.MaxBatch per round trip. A retried call (after a
// lost reply) may report deleted=false for a key it deleted.
func (c *Client) BatchDelete(keys []string) ([]bool, error) {
	out := make([]bool, len(keys))
	err := chunks(keys, func(base int, part []string) error {
		r, _, err := invoke(c, call{method: "BatchDelete", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
			return &external.ExternalServiceBatchDeleteArgs{Req: &external.BatchKeysRequest{Session: s, Keys: part}}
		}}, &external.ExternalServiceBatchDeleteResult{})
		if err != nil {
			return err
		}
		for i, e := range r.Results {
			if i < len(part) {
				out[base+i] = e.Deleted
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Stat returns the cluster's members and key count as the owner sees them, after
// applying this client's pending releases, and the masters (Masters: each one's
// address, whether it is the leader and the epoch of its leadership, as the leader
// reports them; with masters on etcd, every campaigning master).
func (c *Client) Stat() (*external.StatResponse, error) {
	r, _, err := invoke(c, call{method: "Stat", retry: retryAlways, args: func(s *external.Session) thrift.FastCodec {
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

// Flush sends queued releases now (they ride on the session of empty Releases).
func (c *Client) Flush() error {
	// Each call carries at most wire.MaxReleasesPerCall ids: loop until the queue is
	// empty, stopping at the first failure (the ids stay queued for a later call).
	for {
		c.mu.Lock()
		pending := len(c.releases) > 0 && !c.closed
		c.mu.Unlock()
		if !pending {
			return nil
		}
		_, _, err := invoke(c, call{method: "Release", retry: retryNever, args: func(s *external.Session) thrift.FastCodec {
			return &external.ExternalServiceReleaseArgs{Req: &external.ReleaseRequest{Session: s}}
		}}, &external.ExternalServiceReleaseResult{})
		if err != nil {
			return err
		}
	}
}
