package wire

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// TestCheckStruct: real requests of every shape pass (batches over the limit too: the
// handler answers them with INVALID_ARGUMENT); announced sizes beyond the bytes
// present, huge counts of variable-size elements, unknown types and deep nesting fail.
func TestCheckStruct(t *testing.T) {
	keys := func(n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = fmt.Sprintf("key-%d", i)
		}
		return ks
	}
	s := &external.Session{ClientId: 1, SessionToken: 2, OwnerGeneration: 3, Releases: make([]int64, 100000)}
	items := make([]*external.PutStartItem, MaxBatch+1)
	for i := range items {
		items[i] = &external.PutStartItem{Key: "k", Len: 10, Opts: &external.PutOptions{}}
	}
	// A batch of puts ended with the most copies a call carries, one per item, and all in one item.
	copies := func(items, each int) []*external.PutEndItem {
		out := make([]*external.PutEndItem, items)
		for i := range out {
			out[i] = &external.PutEndItem{Key: "k", PutId: int64(i)}
			for range each {
				out[i].Copies = append(out[i].Copies, &external.AreaCopy{})
			}
		}
		return out
	}
	for _, args := range []thrift.FastCodec{
		&external.ExternalServiceBatchPutEndArgs{Req: &external.BatchPutEndRequest{Session: s, Items: copies(MaxBatch, 1)}},
		&external.ExternalServiceBatchPutEndArgs{Req: &external.BatchPutEndRequest{Session: s, Items: append(copies(1, MaxBatch), copies(MaxBatch-1, 0)...)}},
		&external.ExternalServiceGetArgs{Req: &external.GetRequest{Session: s, Key: "k"}},
		&external.ExternalServiceBatchGetArgs{Req: &external.BatchKeysRequest{Session: s, Keys: keys(MaxBatch + 1)}},
		&external.ExternalServiceReleaseArgs{Req: &external.ReleaseRequest{Session: s, HolderIds: make([]int64, 5000)}},
		&external.ExternalServiceBatchPutStartArgs{Req: &external.BatchPutStartRequest{Session: s, Items: items}},
		&external.ExternalServiceStatArgs{Req: &external.StatRequest{}},
		&external.ExternalServiceStatArgs{},
	} {
		if err := CheckStruct(thrift.FastMarshal(args)); err != nil {
			t.Errorf("%T: %v", args, err)
		}
	}
	field := func(t thrift.TType, id int16) []byte { return []byte{byte(t), byte(id >> 8), byte(id)} }
	list := func(et thrift.TType, n uint32) []byte {
		return []byte{byte(et), byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	}
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	stops := func(n int) []byte { return []byte(strings.Repeat("\x00", n)) }
	deep := []byte{}
	for i := 0; i < 20; i++ {
		deep = append(deep, field(thrift.STRUCT, 1)...)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"2^31-1 ids in a few bytes", cat(field(thrift.LIST, 1), list(thrift.I64, 1<<31-1), stops(16), stops(1))},
		{"negative list size", cat(field(thrift.LIST, 1), list(thrift.I64, 1<<31), stops(1))},
		{"20000 empty structs", cat(field(thrift.LIST, 1), list(thrift.STRUCT, 20000), stops(20000), stops(1))},
		{"string longer than the frame", cat(field(thrift.STRING, 1), []byte{0, 0, 1, 0}, []byte("abc"), stops(1))},
		{"negative string length", cat(field(thrift.STRING, 1), []byte{0xff, 0xff, 0xff, 0xff}, stops(1))},
		{"map of 2^30 pairs", cat(field(thrift.MAP, 1), []byte{byte(thrift.STRING), byte(thrift.I32), 0x40, 0, 0, 0}, stops(1))},
		{"unknown type", cat(field(thrift.TType(-51), 1), stops(8))},
		{"deep nesting", cat(deep, stops(21))},
		{"no STOP", field(thrift.I32, 1)},
		{"empty", nil},
		// Each list under the bound, all of them far over it: it decoded 1-byte elements
		// into 32-byte structs (2,000 such items of 16,000 made 1 GiB of a 31 MiB frame).
		{"3 items of 8000 copies each", thrift.FastMarshal(&external.ExternalServiceBatchPutEndArgs{Req: &external.BatchPutEndRequest{Session: s, Items: copies(3, 8000)}})},
	} {
		if err := CheckStruct(tc.b); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

// FuzzCheckMessage: the check never panics, agrees with LengthOffsets, and a message
// it passes decodes (as any request of ours) within memory proportional to its size.
func FuzzCheckMessage(f *testing.F) {
	s := &external.Session{ClientId: 1, Releases: []int64{1, 2}}
	for _, args := range []thrift.FastCodec{
		&external.ExternalServiceBatchGetArgs{Req: &external.BatchKeysRequest{Session: s, Keys: []string{"a", "b"}}},
		&external.ExternalServiceReleaseArgs{Req: &external.ReleaseRequest{Session: s, HolderIds: []int64{1}}},
	} {
		b, _ := thrift.MarshalFastMsg("M", thrift.CALL, 1, args)
		f.Add(b)
	}
	f.Add(append(thrift.Binary.AppendMessageBegin(nil, "Release", thrift.CALL, 1),
		byte(thrift.STRUCT), 0, 1, byte(thrift.LIST), 0, 2, byte(thrift.I64), 0x7f, 0xff, 0xff, 0xff, 0, 0))
	f.Fuzz(func(t *testing.T, msg []byte) {
		err := CheckMessage(msg, maxVarElems)
		if err != nil {
			return
		}
		_, _, _, off, _ := thrift.Binary.ReadMessageBegin(msg)
		if _, err := LengthOffsets(msg[off:]); err != nil {
			t.Fatalf("CheckMessage passed what LengthOffsets refuses: %v", err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, args := range []thrift.FastCodec{&external.ExternalServiceBatchGetArgs{}, &external.ExternalServiceReleaseArgs{},
			&external.ExternalServiceBatchPutStartArgs{}} {
			func() {
				defer func() { recover() }() // the skipper may panic on garbage; the servers recover it
				args.FastRead(msg[off:])
			}()
		}
		runtime.ReadMemStats(&after)
		if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(1<<20+1024*len(msg)); got > limit {
			t.Fatalf("a %d-byte message that passed decoded into %d bytes", len(msg), got)
		}
	})
}
