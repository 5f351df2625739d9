package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

// fakeSource is a data server that would serve 0xEE bytes for any pull, counting them.
type fakeSource struct{ opens atomic.Int64 }

func (f *fakeSource) Open(_ transfer.Fence, _, length int64) ([]byte, func(), error) {
	f.opens.Add(1)
	return bytes.Repeat([]byte{0xEE}, int(length)), func() {}, nil
}

// pooledPair starts a master and two owners where puts through n0 (a small pool) are
// placed on n1 and pulled there (PullPut from the master): 512 KiB values fit n0's
// 1 MiB transfer area. The extra flags go to both owners.
func pooledPair(t *testing.T, ownerExtra ...string) *cluster {
	t.Helper()
	cl := &cluster{master: startMaster(t, "")}
	for i, dram := range []string{"8MiB", "32MiB"} {
		o := startOwnerWith(t, filepath.Join(t.TempDir(), fmt.Sprintf("o%d", i)), cl.master.addr, dram, fmt.Sprintf("n%d", i), ownerExtra...)
		cl.owners = append(cl.owners, o)
		cl.clients = append(cl.clients, connect(t, o.socket))
	}
	return cl
}

// putPooled puts n values through n0 until some are on n1 and returns their keys and
// values by key.
func putPooled(t *testing.T, cl *cluster, prefix string, n int) map[string][]byte {
	t.Helper()
	had := member(t, cl.clients[0], "n1").MemoryReplicas
	vals := make(map[string][]byte)
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		vals[k] = clusterValue(i+len(prefix), 512<<10)
		if err := cl.clients[0].Put(k, vals[k]); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	if m := member(t, cl.clients[0], "n1"); m.MemoryReplicas <= had {
		t.Fatalf("no put was placed on n1 (PullPut): %d replicas before, %+v", had, m)
	}
	return vals
}

// checkValues reads every value through every owner: none may differ from what was
// put. A miss is a cache's right (under load the master may evict to place a put when
// n1 looked silent), but most values must be there.
func checkValues(t *testing.T, cl *cluster, vals map[string][]byte) {
	t.Helper()
	hits := 0
	for k, v := range vals {
		for i, c := range cl.clients {
			got, _, err := getBytes(c, k)
			if errors.Is(err, fluxkv.ErrKeyNotFound) {
				continue
			}
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get %s through n%d: err %v, equal %v", k, i, err, err == nil && bytes.Equal(got, v))
			}
			hits++
		}
	}
	if hits < len(vals) {
		t.Fatalf("%d of %d gets hit", hits, 2*len(vals))
	}
}

// A process that holds the cluster secret but not the master key calls every
// master-only PeerService method on the owners' peer ports, naming their real
// generation and master epoch (as `fluxkv status` shows them), with a PullPut over
// the whole of n1's pool (its live replicas) from a fake data server: each is refused
// PERMISSION_DENIED, the fake source is never asked, and every value reads back
// byte-exact through real gets. A master key the owners do not accept is refused in
// the handshake. SsdStageRead, which owners ask of each other, is not refused.
func TestMasterOnlyCallsRefused(t *testing.T) {
	t.Parallel()
	cl := pooledPair(t)
	vals := putPooled(t, cl, "victim", 24)

	secrets, err := auth.LoadSecrets([]string{clusterSecret})
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{}
	fake, err := transfer.Listen("127.0.0.1:0", src, transfer.ServerOptions{Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	st, err := cl.clients[0].Stat()
	if err != nil {
		t.Fatal(err)
	}
	var epoch int64
	for _, m := range st.Masters {
		if m.Leader || epoch == 0 {
			epoch = m.Epoch
		}
	}
	stranger, err := auth.GenerateMasterKey()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		member, err := peerservice.NewClient("fluxkv-owner", append(auth.ClientOptions(secrets, auth.PurposePeer),
			client.WithHostPorts(m.PeerAddr), client.WithRPCTimeout(10*time.Second), client.WithConnectTimeout(10*time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		pool := m.MemorySegment.CapacityBytes
		calls := map[string]func() (common.ErrorCode, string, error){
			"PullPut": func() (common.ErrorCode, string, error) {
				r, err := member.PullPut(ctx, &peer.PullPutRequest{Key: "victim-0", PutId: 1 << 62, Generation: m.Generation,
					TargetOffset: 0, Len: pool, SourceNodeId: "n0", SourceGeneration: 1, SourceDataAddr: fake.Addr().String(), MasterEpoch: epoch})
				if r == nil {
					return 0, "", err
				}
				return r.Code, r.Message, err
			},
			"BatchPullPut": func() (common.ErrorCode, string, error) {
				r, err := member.BatchPullPut(ctx, &peer.BatchPullPutRequest{Items: []*peer.PullPutRequest{{Key: "victim-0", PutId: 1 << 62,
					Generation: m.Generation, TargetOffset: 0, Len: pool, SourceNodeId: "n0", SourceGeneration: 1,
					SourceDataAddr: fake.Addr().String(), MasterEpoch: epoch}}})
				if r == nil {
					return 0, "", err
				}
				return r.Code, r.Message, err
			},
			"BatchSsdReplicaPersist": func() (common.ErrorCode, string, error) {
				r, err := member.BatchSsdReplicaPersist(ctx, &peer.BatchSsdReplicaPersistRequest{Items: []*peer.SsdReplicaPersistRequest{{
					Key: "victim-0", PutId: 1 << 62, Offset: 0, Len: 512 << 10, Generation: m.Generation, SourceNodeId: "fake",
					SourceGeneration: 1, SourceDataAddr: fake.Addr().String(), MasterEpoch: epoch}}})
				if r == nil {
					return 0, "", err
				}
				return r.Code, r.Message, err
			},
			"InvalidateCachedInfo": func() (common.ErrorCode, string, error) {
				r, err := member.InvalidateCachedInfo(ctx, &peer.InvalidateCachedInfoRequest{Generation: m.Generation, MasterEpoch: epoch,
					Entries: []*common.KeyVersion{{Key: "victim-0", PutId: 1 << 62}}})
				if r == nil {
					return 0, "", err
				}
				return r.Code, r.Message, err
			},
			"ReleaseHotSet": func() (common.ErrorCode, string, error) {
				r, err := member.ReleaseHotSet(ctx, &peer.ReleaseHotSetRequest{Generation: m.Generation, Bytes: pool, MasterEpoch: epoch})
				if r == nil {
					return 0, "", err
				}
				return r.Code, r.Message, err
			},
		}
		for name, call := range calls {
			code, msg, err := call()
			if err != nil || code != common.ErrorCode_PERMISSION_DENIED || !strings.Contains(msg, name+" is a master-only call") {
				t.Errorf("%s from a member to %s: code %v %q, err %v; want PERMISSION_DENIED", name, m.NodeId, code, msg, err)
			}
		}
		r, err := member.SsdStageRead(ctx, &peer.SsdStageReadRequest{Key: "victim-0", PutId: 1, GetId: 2, Len: 1, Generation: m.Generation,
			TargetNodeId: "x", DeadlineMs: 1000})
		if err != nil || r.Code == common.ErrorCode_PERMISSION_DENIED {
			t.Errorf("SsdStageRead from a member to %s: %v %v; want it served (owners ask it of each other)", m.NodeId, r, err)
		}

		// A master key the owners were not given does not pass the handshake.
		forger, err := peerservice.NewClient("fluxkv-owner", append(auth.ClientOptions(secrets, auth.PurposePeer),
			client.WithHostPorts(m.PeerAddr), client.WithRPCTimeout(10*time.Second), client.WithConnectTimeout(10*time.Second),
			client.WithDialer(auth.NewMasterDialer(secrets, auth.PurposePeer, stranger, func(string) string { return m.NodeId })))...)
		if err != nil {
			t.Fatal(err)
		}
		// Kitex dials with a 50 ms connect timeout unless told otherwise: on a loaded machine
		// the dial itself can time out, which proves nothing. With 10 s to connect, a
		// refusal is the owner's answer; a timeout is reported as what it is.
		_, err = forger.InvalidateCachedInfo(ctx, &peer.InvalidateCachedInfoRequest{MasterEpoch: epoch})
		var ne net.Error
		switch {
		case err == nil:
			t.Errorf("a stranger's master key to %s was accepted", m.NodeId)
		case strings.Contains(err.Error(), "refused this master's proof"):
		case errors.As(err, &ne) && ne.Timeout():
			t.Errorf("a stranger's master key to %s: no answer within 10 s (%v): neither a refusal nor an acceptance", m.NodeId, err)
		default:
			t.Errorf("a stranger's master key to %s: %v, want the proof refused", m.NodeId, err)
		}
	}
	if n := src.opens.Load(); n != 0 {
		t.Errorf("the fake data server was asked for %d pulls", n)
	}
	checkValues(t, cl, vals)
	// The master's own calls still work: more puts pulled to n1.
	checkValues(t, cl, putPooled(t, cl, "after", 8))
}

// Rotating the master key: owners accept the old and the new public key, the master
// restarts with the new key, and pooled puts (PullPut) work before and after.
func TestMasterKeyRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	newKey, newPub := filepath.Join(dir, "new.key"), filepath.Join(dir, "new.pub")
	if err := auth.GenerateMasterKeyFiles(newKey, newPub); err != nil {
		t.Fatal(err)
	}
	cl := pooledPair(t, "--master-pubkey-file", newPub) // besides ownerAuth's old one
	checkValues(t, cl, putPooled(t, cl, "old-key", 16))

	addr := cl.master.addr
	cl.master.stop()
	cl.master = start(t, "master", "--listen", addr, "--node-ttl", "2s", "--cluster-secret-file", clusterSecret, "--master-key-file", newKey)
	cl.master.addr = addr
	waitFor(t, 15*time.Second, "both owners registered with the master on the new key", func() bool {
		st, err := cl.clients[0].Stat()
		if err != nil || len(st.Members) != 2 {
			return false
		}
		return cl.clients[0].Put("probe", []byte("p")) == nil && cl.clients[1].Put("probe1", []byte("p")) == nil
	})
	if !strings.Contains(cl.master.stderr.String(), "new.key") {
		t.Fatalf("the master did not load the new key:\n%s", tail(cl.master.stderr.String()))
	}
	checkValues(t, cl, putPooled(t, cl, "new-key", 16))
}
