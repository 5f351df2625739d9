package authtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"runtime"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/cloudwego/kitex/pkg/serviceinfo"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// fillDepth bounds how deep Requests fills nested requests (our IDL nests four deep).
const fillDepth = 8

// Requests returns one CALL message (binary thrift, unframed) for every method of svc,
// in Methods order: its arguments with every struct, list, map and string filled, each
// list and map with one element, so every length the request can carry is present.
func Requests(svc *serviceinfo.ServiceInfo) [][]byte {
	var msgs [][]byte
	for _, name := range Methods(svc) {
		args := svc.Methods[name].NewArgs()
		fill(reflect.ValueOf(args).Elem(), fillDepth)
		b, err := thrift.MarshalFastMsg(name, thrift.CALL, 1, args.(thrift.FastCodec))
		if err != nil {
			panic(fmt.Sprintf("BUG: marshal %s: %v", name, err))
		}
		msgs = append(msgs, b)
	}
	return msgs
}

// Bombs returns, for every message of Requests, one copy per length it carries (a
// string length or a container count) announcing 2^31-1 in place of it: the frame of
// a few dozen bytes that would make a decoder that trusts it allocate gigabytes.
func Bombs(svc *serviceinfo.ServiceInfo) [][]byte {
	var bombs [][]byte
	for _, msg := range Requests(svc) {
		_, _, _, off, err := thrift.Binary.ReadMessageBegin(msg)
		if err != nil {
			panic(fmt.Sprintf("BUG: %v", err))
		}
		offs, err := wire.LengthOffsets(msg[off:])
		if err != nil {
			panic(fmt.Sprintf("BUG: a request of ours fails the check: %v", err))
		}
		for _, o := range offs {
			b := append([]byte(nil), msg...)
			binary.BigEndian.PutUint32(b[off+o:], 1<<31-1)
			bombs = append(bombs, b)
		}
	}
	return bombs
}

// fill sets every settable field of v: pointers to new values, slices and maps to one
// element, strings to "k", numbers to 1, booleans to true.
func fill(v reflect.Value, depth int) {
	if depth == 0 {
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		fill(v.Elem(), depth-1)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if f := v.Field(i); f.CanSet() {
				fill(f, depth)
			}
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth-1)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMapWithSize(v.Type(), 1)
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k, depth-1)
		fill(e, depth-1)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("k")
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		v.SetInt(1)
	case reflect.Uint8:
		v.SetUint(1)
	case reflect.Float64:
		v.SetFloat(1)
	case reflect.Bool:
		v.SetBool(true)
	}
}

// SendFrame dials addr, authenticates for purpose with s (nil: none), writes msg as one
// frame, and waits up to timeout for the server to answer a frame or close. It reports
// whether a reply frame came; a refused frame closes the connection (no error).
func SendFrame(addr string, s *auth.Secrets, purpose string, msg []byte, timeout time.Duration) (bool, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if err := auth.ClientHandshake(conn, s, purpose, addr, timeout); err != nil {
		return false, err
	}
	conn.SetDeadline(time.Now().Add(timeout))
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(msg)), uint32(len(msg)))
	if _, err := conn.Write(append(frame, msg...)); err != nil {
		return false, nil // refused and closed while writing
	}
	var hdr [4]byte
	switch _, err := io.ReadFull(conn, hdr[:]); {
	case err == nil:
		return true, nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), isReset(err):
		return false, nil
	default:
		return false, fmt.Errorf("no answer and not closed: %w", err)
	}
}

// maxFrameAlloc bounds what the fuzzing process allocates while a server handles one
// frame and answers the liveness call after it (runtime.MemStats.TotalAlloc before and
// after): a decoder that trusted an announced length would allocate gigabytes (or die
// of it). It counts the frame's allocations, freed or not, and none of what the tests
// before it left on the heap: the process may have run other tests' servers first.
const maxFrameAlloc = 1 << 30

// FuzzFrames runs f against a real server of svc at addr (behind auth.Listener with
// purpose and s): its seeds are every method's filled request (Requests) and every one
// of those with one length announcing 2^31-1 (Bombs). Each input is sent as one
// authenticated frame (SendFrame); after it alive (a real call) must succeed, and the
// process must have allocated under 1 GiB for the two (maxFrameAlloc).
func FuzzFrames(f *testing.F, svc *serviceinfo.ServiceInfo, addr string, s *auth.Secrets, purpose string, alive func() error) {
	for _, m := range Requests(svc) {
		f.Add(m)
	}
	for _, b := range Bombs(svc) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		before := totalAlloc()
		if _, err := SendFrame(addr, s, purpose, msg, 10*time.Second); err != nil {
			t.Fatalf("frame of %d bytes: %v", len(msg), err)
		}
		if err := alive(); err != nil {
			t.Fatalf("%s stopped answering after a frame of %d bytes: %v", svc.ServiceName, len(msg), err)
		}
		if n := totalAlloc() - before; n > maxFrameAlloc {
			t.Fatalf("%d bytes allocated for a frame of %d bytes", n, len(msg))
		}
	})
}

// totalAlloc is the bytes the process has allocated on the heap since it started.
func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}
