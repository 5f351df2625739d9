package daemon_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/internal/testbytes"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// payload is the test value of seed: n bytes.
func payload(seed int64, n int) []byte { return testbytes.Value(int(seed), n) }

// TestRoundTripSizes: put/get/overwrite/exists/delete over the socket, byte-exact at
// sizes from 1 B to 16 MiB + 1, with the holder viewing the shared mapping.
func TestRoundTripSizes(t *testing.T) {
	t.Parallel()
	p := startUp(t, "64MiB")
	c := connect(t, p.socket)
	sizes := []int{1, 2, 511, 512, 513, 4095, 4096, 4097, 1<<20 - 128, 1 << 20, 4<<20 + 7, 16<<20 + 1}
	seg := c.Segment()
	base := uintptr(unsafe.Pointer(&seg[0]))
	for i, n := range sizes {
		key := fmt.Sprintf("size-%d", n)
		v := payload(int64(i), n)
		if err := c.Put(key, v); err != nil {
			t.Fatalf("put %d bytes: %v", n, err)
		}
		h, err := c.Get(key)
		if err != nil {
			t.Fatalf("get %d bytes: %v", n, err)
		}
		if !bytes.Equal(h.Bytes(), v) {
			t.Fatalf("%d bytes: value differs", n)
		}
		addr := uintptr(unsafe.Pointer(&h.Bytes()[0]))
		if addr < base || addr+uintptr(n) > base+uintptr(len(seg)) {
			t.Fatalf("%d bytes: holder does not view the shared mapping", n)
		}
		// A second get of the same key while the first holder lives views the same bytes.
		h2, err := c.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		if h2.Offset() != h.Offset() || h2.Source() != "memory" {
			t.Fatalf("second get: offset %d vs %d, source %s", h2.Offset(), h.Offset(), h2.Source())
		}
		h.Release()
		h2.Release()
		if err := h.Release(); err == nil {
			t.Fatal("double release must fail on the client")
		}
		if ok, err := c.Exists(key); err != nil || !ok {
			t.Fatalf("exists %s: %v %v", key, ok, err)
		}
		// Overwrite with a different value of another size.
		v2 := payload(int64(i)+100, n/2+1)
		if err := c.Put(key, v2); err != nil {
			t.Fatal(err)
		}
		h, err = c.Get(key)
		if err != nil || !bytes.Equal(h.Bytes(), v2) {
			t.Fatalf("overwrite of %s not visible: %v", key, err)
		}
		h.Release()
		if ok, err := c.Delete(key); err != nil || !ok {
			t.Fatalf("delete %s: %v %v", key, ok, err)
		}
		if _, err := c.Get(key); !errors.Is(err, fluxkv.ErrKeyNotFound) {
			t.Fatalf("get after delete: %v", err)
		}
		if ok, _ := c.Exists(key); ok {
			t.Fatal("exists after delete")
		}
	}
	leakCheck(t, c)
}

// TestHolderSurvivesOverwriteAndDelete: a holder keeps its bytes while the key is
// overwritten and deleted; releasing it frees the range.
func TestHolderSurvivesOverwriteAndDelete(t *testing.T) {
	t.Parallel()
	p := startUp(t, "16MiB")
	c := connect(t, p.socket)
	v1 := payload(1, 100000)
	if err := c.Put("k", v1); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put("k", payload(2, 100000)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete("k"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ { // fill the segment around it
		c.Put(fmt.Sprintf("f%d", i), payload(int64(i), 150000))
	}
	if !bytes.Equal(h.Bytes(), v1) {
		t.Fatal("held bytes changed after overwrite/delete/pressure")
	}
	h.Release()
	keys := []string{}
	for i := 0; i < 100; i++ {
		keys = append(keys, fmt.Sprintf("f%d", i))
	}
	leakCheck(t, c, keys...)
}

// TestEvictionAt4xDRAM: writing 4× DRAM evicts older values; every put succeeds, the
// most recent ones hit, used bytes never exceed capacity.
func TestEvictionAt4xDRAM(t *testing.T) {
	t.Parallel()
	p := startUp(t, "64MiB")
	c := connect(t, p.socket)
	const n = 256 // 256 × 1 MiB = 4 × 64 MiB
	var keys []string
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("e%04d", i)
		keys = append(keys, k)
		if err := c.Put(k, payload(int64(i), 1<<20)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if i%32 == 0 {
			used, _, _ := usage(t, c)
			if used > 64<<20 {
				t.Fatalf("used %d exceeds capacity", used)
			}
		}
	}
	for i := n - 20; i < n; i++ {
		h, err := c.Get(keys[i])
		if err != nil {
			t.Fatalf("recent key %s: %v", keys[i], err)
		}
		if !bytes.Equal(h.Bytes(), payload(int64(i), 1<<20)) {
			t.Fatalf("recent key %s: wrong bytes", keys[i])
		}
		h.Release()
	}
	if _, err := c.Get(keys[0]); !errors.Is(err, fluxkv.ErrKeyNotFound) {
		t.Fatalf("oldest key should have been evicted: %v", err)
	}
	leakCheck(t, c, keys...)
}

// TestSeparateMasterAndOwner: master and owner as separate processes; a master restart
// makes the owner register again (and report its replicas), held ranges stay pinned,
// service resumes.
func TestSeparateMasterAndOwner(t *testing.T) {
	t.Parallel()
	m := startMaster(t, "")
	dir := t.TempDir()
	o := startOwner(t, dir, m.addr, "8MiB")
	c := connect(t, o.socket)
	v := payload(7, 1<<20)
	if err := c.Put("held", v); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("held")
	if err != nil {
		t.Fatal(err)
	}
	m.stop()
	m2 := startMaster(t, m.addr)
	_ = m2
	// The owner notices within a heartbeat or two and registers again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Put("after", payload(8, 1000))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("owner did not recover after the master restart: %v\n%s", err, o.stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	hv, err := c.Get("after")
	if err != nil || !bytes.Equal(hv.Bytes(), payload(8, 1000)) {
		t.Fatalf("get after restart: %v", err)
	}
	hv.Release()
	// Fill the segment: the new master must not hand out the held range.
	for i := 0; i < 16; i++ {
		if err := c.Put(fmt.Sprintf("fill%d", i), payload(int64(100+i), 1<<20)); err != nil {
			t.Fatalf("fill %d: %v", i, err)
		}
	}
	if !bytes.Equal(h.Bytes(), v) {
		t.Fatal("a range held across the master restart was overwritten")
	}
	h.Release()
	// "held" was reported by the owner and rebuilt: a master restart is not a flush.
	keys := []string{"held", "after"}
	for i := 0; i < 16; i++ {
		keys = append(keys, fmt.Sprintf("fill%d", i))
	}
	leakCheck(t, c, keys...)
}

// TestOwnerDeathTombs: an owner killed with SIGKILL is tombed by the master within the
// node TTL; a new owner incarnation starts empty and serves.
func TestOwnerDeathTombs(t *testing.T) {
	t.Parallel()
	m := startMaster(t, "")
	dir := t.TempDir()
	o := startOwner(t, dir, m.addr, "8MiB")
	c := connect(t, o.socket)
	if err := c.Put("k", payload(1, 5000)); err != nil {
		t.Fatal(err)
	}
	c.Close()
	o.kill()
	// The socket files of a crashed owner stay; a new owner removes the stale ones.
	o2 := startOwner(t, dir, m.addr, "8MiB")
	c2 := connect(t, o2.socket)
	if _, err := c2.Get("k"); !errors.Is(err, fluxkv.ErrKeyNotFound) {
		t.Fatalf("a restarted owner must not serve the old incarnation's replica: %v", err)
	}
	if c2.Generation() == 0 {
		t.Fatal("no generation")
	}
	st, err := c2.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 1 || st.Members[0].MemorySegment.UsedBytes != 0 || st.Keys != 0 {
		t.Fatalf("after owner restart: %+v keys=%d", st.Members, st.Keys)
	}
	leakCheck(t, c2)
}

// TestBadRequestsRaw sends malformed requests that bypass the client's own checks; each
// gets a clear code and the node keeps serving without leaking.
func TestBadRequestsRaw(t *testing.T) {
	t.Parallel()
	p := startUp(t, "8MiB")
	c := connect(t, p.socket)
	sess := func() *external.Session {
		return &external.Session{ClientId: c.ClientID(), SessionToken: sessionToken(c), OwnerGeneration: c.Generation()}
	}
	putStart := func(s *external.Session, key string, n int64) *external.PutStartResponse {
		res := &external.ExternalServicePutStartResult{}
		if err := c.Call("PutStart", &external.ExternalServicePutStartArgs{Req: &external.PutStartRequest{Session: s, Key: key, Len: n}}, res); err != nil {
			t.Fatal(err)
		}
		return res.Success
	}
	for _, tc := range []struct {
		name string
		key  string
		n    int64
		s    *external.Session
		want common.ErrorCode
	}{
		{"empty key", "", 10, sess(), common.ErrorCode_INVALID_ARGUMENT},
		{"5000-byte key", strings.Repeat("k", 5000), 10, sess(), common.ErrorCode_INVALID_ARGUMENT},
		{"len 0", "k", 0, sess(), common.ErrorCode_INVALID_ARGUMENT},
		{"negative len", "k", -1, sess(), common.ErrorCode_INVALID_ARGUMENT},
		{"len > segment", "k", 9 << 20, sess(), common.ErrorCode_INVALID_ARGUMENT},
		{"stale generation", "k", 10, &external.Session{ClientId: c.ClientID(), SessionToken: sessionToken(c), OwnerGeneration: c.Generation() + 1}, common.ErrorCode_STALE_GENERATION},
		{"wrong token", "k", 10, &external.Session{ClientId: c.ClientID(), SessionToken: 42, OwnerGeneration: c.Generation()}, common.ErrorCode_INVALID_ARGUMENT},
		{"no session", "k", 10, nil, common.ErrorCode_INVALID_ARGUMENT},
	} {
		r := putStart(tc.s, tc.key, tc.n)
		if r.Code != tc.want || r.Message == "" {
			t.Errorf("%s: got %v %q, want %v with a message", tc.name, r.Code, r.Message, tc.want)
		}
	}
	// Unknown holder and double release.
	if err := c.Put("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	h, _ := c.Get("k")
	rel := func(ids ...int64) *external.ReleaseResponse {
		res := &external.ExternalServiceReleaseResult{}
		if err := c.Call("Release", &external.ExternalServiceReleaseArgs{Req: &external.ReleaseRequest{Session: sess(), HolderIds: ids}}, res); err != nil {
			t.Fatal(err)
		}
		return res.Success
	}
	if r := rel(h.ID(), 987654321); r.Code != common.ErrorCode_INVALID_ARGUMENT || r.Results[0] != common.ErrorCode_OK || r.Results[1] != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("release with an unknown holder: %+v", r)
	}
	if r := rel(h.ID()); r.Code != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("double release: %+v", r)
	}
	// PutEnd of a put never started.
	res := &external.ExternalServicePutEndResult{}
	if err := c.Call("PutEnd", &external.ExternalServicePutEndArgs{Req: &external.PutEndRequest{Session: sess(), Key: "k", PutId: 5}}, res); err != nil || res.Success.Code != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("unknown put end: %v %+v", err, res.Success)
	}
	// An unknown method gets an application exception, and the connection stays usable.
	if err := c.Call("NoSuchMethod", &external.ExternalServiceStatArgs{Req: &external.StatRequest{Session: sess()}}, &external.ExternalServiceStatResult{}); err == nil || !strings.Contains(err.Error(), "unknown method") {
		t.Fatalf("unknown method: %v", err)
	}
	// Garbage on both sockets closes only those connections.
	for _, path := range []string{p.socket, p.socket + ".rpc"} {
		for _, junk := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), {0, 0, 0, 5, 1, 2, 3, 4, 5}, {0x7f, 0xff, 0xff, 0xff}, bytes.Repeat([]byte{0xAB}, 1000)} {
			conn, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			conn.Write(junk)
			conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 4096)
			for {
				if _, err := conn.Read(buf); err != nil {
					break // closed by the server (EOF) — what we want
				}
			}
			conn.Close()
		}
	}
	// A call of a method name as long as a frame holds: no reply, which would repeat the
	// name twice (four times the frame, held while the client does not read it).
	name := strings.Repeat("m", 1<<20)
	msg := binary.BigEndian.AppendUint32(nil, 0x80010001) // strict binary, CALL
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(name)))
	msg = append(binary.BigEndian.AppendUint32(append(msg, name...), 1), 0) // seq 1, empty struct
	conn, err := net.Dial("unix", p.socket+".rpc")
	if err != nil {
		t.Fatal(err)
	}
	conn.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(msg))), msg...))
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := io.Copy(io.Discard, conn); err != nil || got != 0 {
		t.Fatalf("a call of a %d-byte method name: %d bytes back (%v), want none and the connection closed", len(name), got, err)
	}
	conn.Close()
	// Still serving, and nothing leaked.
	if err := c.Put("after-garbage", []byte("ok")); err != nil {
		t.Fatalf("node stopped serving after bad requests: %v", err)
	}
	leakCheck(t, c, "k", "after-garbage")
}

// sessionToken reads the client's token through a Stat round trip's session: the
// client does not export it, so tests recover it from a request they build themselves.
func sessionToken(c *fluxkv.Client) int64 { return c.SessionToken() }

// TestExternalKilled: a client killed with SIGKILL while holding holders or mid-put has
// everything released within 2 s.
func TestExternalKilled(t *testing.T) {
	t.Parallel()
	p := startUp(t, "16MiB")
	c := connect(t, p.socket)
	var keys []string
	for i := 0; i < 5; i++ {
		k := fmt.Sprintf("h%d", i)
		keys = append(keys, k)
		if err := c.Put(k, payload(int64(i), 300000)); err != nil {
			t.Fatal(err)
		}
	}
	baseUsed, _, _ := usage(t, c)
	hold := startChild(t, p.socket, "hold", "FLUXKV_TEST_KEYS="+strings.Join(keys, ","))
	mid := startChild(t, p.socket, "midput")
	// The child's holders keep the bytes even after the keys are deleted.
	for _, k := range keys {
		c.Delete(k)
	}
	used, holders, _ := usage(t, c)
	if holders != 5 || used <= 1<<20 {
		t.Fatalf("with the children alive: used=%d holders=%d (base %d)", used, holders, baseUsed)
	}
	hold.Process.Kill()
	mid.Process.Kill()
	hold.Wait()
	mid.Wait()
	waitUsage(t, c, 0, 0, 2*time.Second)
}

// TestExternalKilledMidBatchIsolated: under client isolation, a client killed with
// SIGKILL in the middle of a BatchPut (two values copied from its put area into their
// targets, the third being written) leaves nothing: no value published, no byte or
// holder of the segment held, and its put area back in --put-area-total for the next
// session.
func TestExternalKilledMidBatchIsolated(t *testing.T) {
	t.Parallel()
	p := startUp(t, "16MiB", "--client-isolation", "--put-area", "1MiB", "--put-area-total", "2MiB")
	c := connect(t, p.socket)
	mid := startChild(t, p.socket, "midbatch")
	if used, _, _ := usage(t, c); used < 3*300000 {
		t.Fatalf("the child's batch holds %d bytes of the segment, want its three started values", used)
	}
	if _, err := fluxkv.Connect(fluxkv.Options{Socket: p.socket, Name: t.Name()}); !errors.Is(err, fluxkv.ErrNoSpace) {
		t.Fatalf("a third session while the child holds its put area: %v, want ErrNoSpace", err)
	}
	mid.Process.Kill()
	mid.Wait()
	waitUsage(t, c, 0, 0, 2*time.Second)
	for i := range 4 {
		k := fmt.Sprintf("midbatch-%d", i)
		if h, err := c.Get(k); !errors.Is(err, fluxkv.ErrKeyNotFound) {
			if err == nil {
				h.Release()
			}
			t.Fatalf("%s after the child was killed mid-batch: %v, want not found", k, err)
		}
	}
	var c2 *fluxkv.Client
	proctest.WaitUntil(t, func() bool {
		var err error
		c2, err = fluxkv.Connect(fluxkv.Options{Socket: p.socket, Name: t.Name()})
		return err == nil
	})
	defer c2.Close()
	if c2.PutAreaSize() != 1<<20 {
		t.Fatalf("the next session's put area: %d, want the killed child's 1 MiB", c2.PutAreaSize())
	}
	v := payload(2, 300000)
	if err := c2.Put("midbatch-2", v); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("midbatch-2")
	if err != nil || !bytes.Equal(h.Bytes(), v) {
		t.Fatalf("midbatch-2 put again: %v", err)
	}
	h.Release()
	leakCheck(t, c, "midbatch-2")
}

// TestConcurrentClients: many goroutines on one client and several clients, under load.
func TestConcurrentClients(t *testing.T) {
	t.Parallel()
	p := startUp(t, "64MiB")
	c1 := connect(t, p.socket)
	c2 := connect(t, p.socket)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 8; g++ {
		c := c1
		if g%2 == 1 {
			c = c2
		}
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				k := fmt.Sprintf("g%d-%d", g, i%10)
				v := payload(int64(g*1000+i), 20000+i)
				if err := c.Put(k, v); err != nil {
					errs <- err
					return
				}
				h, err := c.Get(k)
				if err != nil {
					errs <- fmt.Errorf("get %s: %w", k, err)
					return
				}
				// Only this goroutine writes k, so the bytes must be exactly v.
				if !bytes.Equal(h.Bytes(), v) {
					errs <- fmt.Errorf("%s: wrong bytes", k)
				}
				h.Release()
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var keys []string
	for g := 0; g < 8; g++ {
		for i := 0; i < 10; i++ {
			keys = append(keys, fmt.Sprintf("g%d-%d", g, i))
		}
	}
	leakCheck(t, c1, keys...)
}

// TestCLI: the operator commands as a user runs them.
func TestCLI(t *testing.T) {
	t.Parallel()
	p := startUp(t, "256MiB")
	dir := t.TempDir()
	file := filepath.Join(dir, "v5")
	v := payload(5, 5<<20)
	if err := os.WriteFile(file, v, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), raceEnv)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), raceReport) || code == raceExitCode {
			t.Fatalf("the race detector reported a race in fluxkv %s (exit %d):\n%s", strings.Join(args, " "), code, tailN(string(out), 16000))
		}
		return string(out), code
	}
	if out, code := run("put", "--socket", p.socket, "five", file); code != 0 {
		t.Fatalf("put: %d %s", code, out)
	}
	outFile := filepath.Join(dir, "out")
	if out, code := run("get", "--socket", p.socket, "-o", outFile, "five"); code != 0 {
		t.Fatalf("get: %d %s", code, out)
	}
	if got, _ := os.ReadFile(outFile); !bytes.Equal(got, v) {
		t.Fatal("5 MiB file did not round-trip byte-exact")
	}
	if out, code := run("get", "--socket", p.socket, "missing"); code != 1 || !strings.Contains(out, "not found") {
		t.Fatalf("miss: code %d output %q", code, out)
	}
	if _, code := run("exists", "--socket", p.socket, "five"); code != 0 {
		t.Fatal("exists of a present key must exit 0")
	}
	if _, code := run("exists", "--socket", p.socket, "missing"); code != 1 {
		t.Fatal("exists of a missing key must exit 1")
	}
	out, code := run("status", "--json", "--socket", p.socket)
	if code != 0 || !strings.Contains(out, `"memory_segment":{"capacity_bytes":268435456`) || !strings.Contains(out, `"keys":1`) {
		t.Fatalf("status --json: %d %s", code, out)
	}
	if out, code := run("status", "--socket", p.socket); code != 0 || !strings.Contains(out, "MEMORY USED") {
		t.Fatalf("status: %d %s", code, out)
	}
	if out, code := run("del", "--socket", p.socket, "five"); code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("del: %d %s", code, out)
	}
	out, _ = run("status", "--json", "--socket", p.socket)
	if !strings.Contains(out, `"used_bytes":0`) {
		t.Fatalf("used bytes not back to 0 after delete: %s", out)
	}
	if out, code := run("put", "--socket", p.socket, "", file); code == 0 {
		t.Fatalf("empty key accepted: %s", out)
	}
}

// TestThousandPuts: 1,000 puts of 1 MiB into a 256 MiB node all succeed and the 20
// most recent keys still hit.
func TestThousandPuts(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: skips the 1 GiB write")
	}
	p := startUp(t, "256MiB")
	c := connect(t, p.socket)
	v := payload(3, 1<<20)
	var keys []string
	for i := 0; i < 1000; i++ {
		k := fmt.Sprintf("t%04d", i)
		keys = append(keys, k)
		v[0], v[1] = byte(i), byte(i>>8)
		if err := c.Put(k, v); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	for i := 980; i < 1000; i++ {
		h, err := c.Get(keys[i])
		if err != nil {
			t.Fatalf("recent key %d: %v", i, err)
		}
		if b := h.Bytes(); b[0] != byte(i) || b[1] != byte(i>>8) {
			t.Fatalf("key %d: wrong bytes", i)
		}
		h.Release()
	}
	used, _, _ := usage(t, c)
	if used > 256<<20 {
		t.Fatalf("used %d exceeds capacity", used)
	}
	leakCheck(t, c, keys...)
}

// TestOwnerDiesTombedWithinTTL: the master tombs an owner that stopped heartbeating
// within the node TTL (2s in these tests); its replicas vanish from routes.
func TestOwnerDiesTombedWithinTTL(t *testing.T) {
	t.Parallel()
	m := startMaster(t, "")
	a := startOwner(t, t.TempDir(), m.addr, "8MiB", "owner-a")
	b := startOwner(t, t.TempDir(), m.addr, "8MiB", "owner-b")
	ca := connect(t, a.socket)
	cb := connect(t, b.socket)
	if err := ca.Put("on-a", payload(1, 1000)); err != nil {
		t.Fatal(err)
	}
	ca.Close()
	a.kill()
	t0 := time.Now()
	for {
		st, err := cb.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Members) == 1 && st.Keys == 0 {
			t.Logf("owner tombed and its replica gone %v after the kill", time.Since(t0).Round(100*time.Millisecond))
			break
		}
		if time.Since(t0) > 8*time.Second { // TTL 2s + heartbeat + scheduling slack on a loaded CI box
			t.Fatalf("owner not tombed within the TTL: %d members, %d keys", len(st.Members), st.Keys)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := cb.Get("on-a"); !errors.Is(err, fluxkv.ErrKeyNotFound) {
		t.Fatalf("a dead owner's replica must miss: %v", err)
	}
	leakCheck(t, cb)
}

// TestMemoryPressureBoundedWait: when every byte is held, a put waits (bounded) and
// then fails with NO_SPACE naming total and free capacity; it never waits forever.
func TestMemoryPressureBoundedWait(t *testing.T) {
	t.Parallel()
	p := startUp(t, "4MiB")
	c := connect(t, p.socket)
	var hs []*fluxkv.MemHolder
	var keys []string
	for i := 0; i < 4; i++ {
		k := fmt.Sprintf("p%d", i)
		keys = append(keys, k)
		if err := c.Put(k, payload(int64(i), 1<<20)); err != nil {
			t.Fatal(err)
		}
		h, err := c.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
	t0 := time.Now()
	err := c.Put("one-more", payload(9, 1<<20))
	waited := time.Since(t0)
	if !errors.Is(err, fluxkv.ErrNoSpace) || !strings.Contains(err.Error(), "total") || !strings.Contains(err.Error(), "free") {
		t.Fatalf("want NO_SPACE with total/free, got %v", err)
	}
	if waited < 4*time.Second || waited > 15*time.Second {
		t.Fatalf("bounded wait took %v, want about 5s", waited)
	}
	// Releasing the holders frees the space (their replicas were evicted meanwhile).
	for _, h := range hs {
		h.Release()
	}
	if err := c.Put("one-more", payload(9, 1<<20)); err != nil {
		t.Fatalf("put after release: %v", err)
	}
	leakCheck(t, c, append(keys, "one-more")...)
}

// TestGoClientReattach: the Go client survives an owner restart: it attaches to the
// new incarnation by itself and retries; a holder of the old one keeps its bytes
// (its mapping stays until Close) and releasing it is harmless.
func TestGoClientReattach(t *testing.T) {
	t.Parallel()
	m := startMaster(t, "")
	dir := t.TempDir()
	o := startOwner(t, dir, m.addr, "8MiB")
	c := connect(t, o.socket)
	v := payload(4, 100000)
	if err := c.Put("before", v); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("before")
	if err != nil {
		t.Fatal(err)
	}
	gen := c.Generation()
	o.kill()
	o2 := startOwner(t, dir, m.addr, "8MiB")
	_ = o2
	if err := c.Put("after", payload(5, 1000)); err != nil {
		t.Fatalf("put after the owner restart: %v", err)
	}
	if c.Generation() == gen {
		t.Fatal("client did not attach to the new incarnation")
	}
	if _, err := c.Get("before"); !errors.Is(err, fluxkv.ErrKeyNotFound) {
		t.Fatalf("the old incarnation's value must be gone: %v", err)
	}
	if !bytes.Equal(h.Bytes(), v) {
		t.Fatal("a holder of the old incarnation lost its bytes")
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	leakCheck(t, c, "after")
}
