package transfer

import (
	"bytes"
	"strings"
	"testing"
	"unsafe"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range []request{
		{op: opPull, fence: Fence{SourceNode: "a", SourceGeneration: 1, TransferID: 2}, offset: 0, length: 1},
		{op: opPullStaged, fence: Fence{SourceNode: "s", SourceGeneration: 3, TransferID: 9, Staged: true}, offset: 4 << 20, length: 4 << 20},
		{op: opPull, fence: Fence{SourceNode: strings.Repeat("n", wire.MaxNodeIDBytes), SourceGeneration: -5, TransferID: 1 << 62}, offset: 1 << 40, length: 16<<20 + 1},
	} {
		b := appendRequest(nil, r)
		if len(b) > maxRequestLen {
			t.Fatalf("request of %d bytes exceeds %d", len(b), maxRequestLen)
		}
		got, err := parseRequest(b)
		if err != nil || got != r {
			t.Fatalf("round trip of %+v: %+v, %v", r, got, err)
		}
	}
	b := appendResponse(nil, statusFenced, 0, strings.Repeat("m", 1000))
	status, n, m, err := parseResponseFixed(b)
	if err != nil || status != statusFenced || n != 0 || m != maxMessageBytes || len(b) != responseFixedLen+m {
		t.Fatalf("response: %d %d %d %v", status, n, m, err)
	}
}

// FuzzParseRequest: the server's request parser never panics, accepts only what
// encodes back to the same bytes, and never asks for more than maxRequestLen.
func FuzzParseRequest(f *testing.F) {
	f.Add(appendRequest(nil, request{op: opPull, fence: Fence{SourceNode: "node-a", SourceGeneration: 7, TransferID: 3}, offset: 4096, length: 1 << 20}))
	f.Add(appendRequest(nil, request{op: opPull, fence: Fence{SourceNode: "x"}, offset: 0, length: 1}))
	f.Add(appendRequest(nil, request{op: opPullStaged, fence: Fence{SourceNode: "x", Staged: true}, offset: 0, length: 1}))
	f.Add([]byte("FXKD\x01\x01\xff\xff"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, err := parseRequestFixed(b); err == nil {
			if n < 1 || requestFixedLen+n > maxRequestLen {
				t.Fatalf("node id length %d accepted", n)
			}
		}
		r, err := parseRequest(b)
		if err != nil {
			return
		}
		if r.offset < 0 || r.length < 1 || r.offset+r.length < r.offset {
			t.Fatalf("bad range accepted: %+v", r)
		}
		if !bytes.Equal(appendRequest(nil, r), b) {
			t.Fatalf("%+v does not encode back to %x", r, b)
		}
	})
}

// TestOKPadding: the data of an OK response starts where neither kernel copy has its
// destination 1 to 31 bytes past its source modulo 4096 (okHeaderLen): the send's
// from any source offset, the read's into any destination on a 512-byte granule.
func TestOKPadding(t *testing.T) {
	buf := make([]byte, 3*4096)
	base := int(uintptr(unsafe.Pointer(&buf[0])) & 4095)
	slow := func(dst, src int) bool { d := (dst - src) & 4095; return d >= 1 && d < 32 }
	for s := range 4096 {
		data := buf[(4096-base+s)%4096:][:100]
		h := responseFixedLen + okPad(data)
		if h != okHeaderLen && h != okHeaderLenAlt {
			t.Fatalf("source at page offset %d: header of %d bytes", s, h)
		}
		if slow(h, s) {
			t.Errorf("source at page offset %d: header of %d bytes puts the send's copy on the slow path", s, h)
		}
		if s%512 != 0 {
			continue
		}
		for d := 0; d < 4096; d += 512 {
			if slow(d, h) {
				t.Errorf("source at %d, destination at %d: header of %d bytes puts the read's copy on the slow path", s, d, h)
			}
		}
	}
	if len(okPadding) < okHeaderLenAlt-responseFixedLen || okHeaderLenAlt-responseFixedLen > maxMessageBytes {
		t.Fatalf("padding of %d bytes, message limit %d", len(okPadding), maxMessageBytes)
	}
}
