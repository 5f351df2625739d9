package daemon

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// rawSession is the Session a raw call of client c names.
func rawSession(c *fluxkv.Client) *external.Session {
	return &external.Session{ClientId: c.ClientID(), SessionToken: c.SessionToken(), OwnerGeneration: c.Generation()}
}

func rawPutStart(t *testing.T, c *fluxkv.Client, key string, n int64) *external.PutStartResponse {
	t.Helper()
	res := &external.ExternalServicePutStartResult{}
	if err := c.Call("PutStart", &external.ExternalServicePutStartArgs{Req: &external.PutStartRequest{Session: rawSession(c), Key: key, Len: n}}, res); err != nil {
		t.Fatal(err)
	}
	if res.Success.Code != common.ErrorCode_OK {
		t.Fatalf("PutStart %s: %v %s", key, res.Success.Code, res.Success.Message)
	}
	return res.Success
}

func rawPutEnd(t *testing.T, c *fluxkv.Client, key string, putID int64) *external.PutEndResponse {
	t.Helper()
	res := &external.ExternalServicePutEndResult{}
	if err := c.Call("PutEnd", &external.ExternalServicePutEndArgs{Req: &external.PutEndRequest{Session: rawSession(c), Key: key, PutId: putID}}, res); err != nil {
		t.Fatal(err)
	}
	return res.Success
}

// TestPutEndRepeated: the wire contract lets a client repeat PutEnd on the same
// session after a lost reply; the owner answers the first outcome, also while the
// first is still running, and forgets puts older than its memory.
func TestPutEndRepeated(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{})
	c := n.c
	s := rawPutStart(t, c, "k", 1000)
	if r := rawPutEnd(t, c, "k", s.PutId); r.Code != common.ErrorCode_OK {
		t.Fatalf("first PutEnd: %v %s", r.Code, r.Message)
	}
	if r := rawPutEnd(t, c, "k", s.PutId); r.Code != common.ErrorCode_OK {
		t.Fatalf("repeated PutEnd: %v %s, want the first outcome (OK)", r.Code, r.Message)
	}
	if r := rawPutEnd(t, c, "other-key", s.PutId); r.Code != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("PutEnd naming another key: %v, want INVALID_ARGUMENT", r.Code)
	}
	h, err := c.Get("k")
	if err != nil || h.PutID() != s.PutId || h.Len() != 1000 {
		t.Fatalf("after repeated PutEnd: %v %+v", err, h)
	}
	h.Release()

	// Concurrent duplicates of one PutEnd: every one answers OK, the put is published once.
	s2 := rawPutStart(t, c, "k2", 5000)
	var wg sync.WaitGroup
	codes := make([]common.ErrorCode, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = rawPutEnd(t, c, "k2", s2.PutId).Code
		}()
	}
	wg.Wait()
	for i, code := range codes {
		if code != common.ErrorCode_OK {
			t.Fatalf("concurrent PutEnd %d: %v", i, code)
		}
	}

	// The memory is bounded: k's is forgotten at the putEndMemory-th put ended after it
	// (k2 was the first; the rest are puts of this session in batches).
	fillers := make([]fluxkv.PutItem, putEndMemory-1)
	keys := []string{"k", "k2"}
	for i := range fillers {
		fillers[i] = fluxkv.PutItem{Key: fmt.Sprintf("filler/%d", i), Value: []byte{byte(i)}}
		keys = append(keys, fillers[i].Key)
	}
	last := len(fillers) - 1
	if errs, err := c.BatchPut(fillers[:last], fluxkv.PutOptions{}); err != nil || errors.Join(errs...) != nil {
		t.Fatalf("filler puts: %v %v", err, errors.Join(errs...))
	}
	if r := rawPutEnd(t, c, "k", s.PutId); r.Code != common.ErrorCode_OK {
		t.Fatalf("PutEnd within the memory: %v %s, want the first outcome (OK)", r.Code, r.Message)
	}
	if err := c.Put(fillers[last].Key, fillers[last].Value); err != nil {
		t.Fatal(err)
	}
	if r := rawPutEnd(t, c, "k", s.PutId); r.Code != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("PutEnd older than the memory: %v, want INVALID_ARGUMENT", r.Code)
	}
	n.drain(t, keys)
}
