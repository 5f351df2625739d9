// Package authtest checks that a Kitex service behind protocol/auth runs no handler
// for an unauthenticated caller, whatever the method: it walks the service's
// generated method table, so a method added later is checked too.
package authtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/serviceinfo"
	"github.com/cloudwego/kitex/transport"

	"github.com/fluxkv/fluxkv/protocol/auth"
)

// Secrets returns fresh random secrets (one key) for in-process tests.
func Secrets(t testing.TB) *auth.Secrets {
	t.Helper()
	k := make([]byte, 32)
	rand.Read(k)
	s, err := auth.NewSecrets(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// MasterKeys returns a fresh master key and the public keys that accept it, for
// in-process masters (master.Options.MasterKey) and owners (daemon.Options.MasterKeys).
func MasterKeys(t testing.TB) (*auth.MasterKey, *auth.MasterPubKeys) {
	t.Helper()
	k, err := auth.GenerateMasterKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := auth.NewMasterPubKeys(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	return k, pub
}

// Methods are the names in svc's method table, sorted.
func Methods(svc *serviceinfo.ServiceInfo) []string {
	var names []string
	for name := range svc.Methods {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// CheckRefused sends every method of svc to addr (a server behind auth.Listener with
// purpose) without authenticating, three ways: a Kitex client on netpoll (as any Kitex
// user would write it), a Kitex client on gonet with an insecure auth.Dialer, and a raw
// connection speaking framed binary thrift. Each call must fail, the raw connection
// must be closed after the server's refusal, and calls() (the server's count of calls
// that reached its middleware) must not move.
func CheckRefused(t *testing.T, svc *serviceinfo.ServiceInfo, addr, purpose string, calls func() int64) {
	t.Helper()
	before := calls()
	names := Methods(svc)
	if len(names) == 0 {
		t.Fatalf("%s: empty method table", svc.ServiceName)
	}
	plain, err := client.NewClient(svc, client.WithDestService(svc.ServiceName), client.WithHostPorts(addr), client.WithRPCTimeout(3*time.Second),
		client.WithTransportProtocol(transport.Framed))
	if err != nil {
		t.Fatal(err)
	}
	insecure, err := client.NewClient(svc, append(auth.ClientOptions(nil, purpose),
		client.WithDestService(svc.ServiceName), client.WithHostPorts(addr), client.WithRPCTimeout(3*time.Second),
		client.WithTransportProtocol(transport.Framed))...)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		mi := svc.Methods[name]
		if err := plain.Call(context.Background(), name, wellFormedArgs(mi.NewArgs()), mi.NewResult()); err == nil {
			t.Errorf("%s.%s from a plain Kitex client: succeeded without authentication", svc.ServiceName, name)
		}
		err := insecure.Call(context.Background(), name, wellFormedArgs(mi.NewArgs()), mi.NewResult())
		if !errors.Is(err, auth.ErrAuthFailed) || !strings.Contains(err.Error(), "requires cluster authentication") {
			t.Errorf("%s.%s from an insecure fluxkv client: got %v, want a clear %q error", svc.ServiceName, name, err, auth.ErrAuthFailed)
		}
		rawCall(t, addr, name)
	}
	if n := calls() - before; n != 0 {
		t.Fatalf("%s: %d unauthenticated calls reached the server's handlers", svc.ServiceName, n)
	}
}

// wellFormedArgs fills every nil struct pointer of a generated args struct (its
// request) with an empty request, so the call is one a real client could send.
func wellFormedArgs(args any) any {
	v := reflect.ValueOf(args).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if f.Kind() == reflect.Pointer && f.IsNil() && f.Type().Elem().Kind() == reflect.Struct && f.CanSet() {
			f.Set(reflect.New(f.Type().Elem()))
		}
	}
	return args
}

// rawCall writes a framed binary thrift CALL of method (args: field 1, an empty
// struct) on a fresh connection and expects the server to refuse it: its hello, a
// refusal verdict, then the connection closed.
func rawCall(t *testing.T, addr, method string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	var body bytes.Buffer
	binary.Write(&body, binary.BigEndian, uint32(0x80010001)) // strict binary, CALL
	binary.Write(&body, binary.BigEndian, uint32(len(method)))
	body.WriteString(method)
	binary.Write(&body, binary.BigEndian, int32(1)) // seqid
	body.Write([]byte{12, 0, 1, 0, 0})              // field 1: struct {}; STOP
	frame := binary.BigEndian.AppendUint32(nil, uint32(body.Len()))
	if _, err := conn.Write(append(frame, body.Bytes()...)); err != nil {
		return // already refused and closed: fine
	}
	got, err := io.ReadAll(conn)
	if err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Errorf("raw %s: reading the reply: %v (want the connection closed)", method, err)
	}
	if !bytes.HasPrefix(got, []byte("FXKA")) {
		t.Errorf("raw %s: got %q, want the server's auth hello and a refusal", method, got)
	}
	if bytes.Contains(got, []byte(method)) {
		t.Errorf("raw %s: the server replied to the call: %q", method, got)
	}
}

func isReset(err error) bool {
	return strings.Contains(err.Error(), "connection reset")
}
