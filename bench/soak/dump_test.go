package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// parkForDump is the goroutine a child parks 3 times for TestDumpGoroutines; it says
// when it runs (a goroutine not yet scheduled shows its go statement's wrapper instead).
func parkForDump(ch chan struct{}, running *sync.WaitGroup) {
	running.Done()
	<-ch
}

// TestDumpGoroutines stops a real Go process with SIGQUIT and reads its goroutines from
// the dump in its log, as the end check does with an owner.
func TestDumpGoroutines(t *testing.T) {
	if os.Getenv("SOAK_DUMP_CHILD") == "1" {
		ch := make(chan struct{})
		var running sync.WaitGroup
		for i := 0; i < 3; i++ {
			running.Add(1)
			go parkForDump(ch, &running)
		}
		running.Wait()
		os.Stdout.WriteString("ready\n")
		<-ch
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ready := make(chan struct{}, 1)
	log := filepath.Join(t.TempDir(), "child.log")
	p, err := startProc(&wg, "child", []string{os.Args[0], "-test.run=^TestDumpGoroutines$"}, []string{"SOAK_DUMP_CHILD=1"}, log,
		func(line []byte) {
			if strings.TrimSpace(string(line)) == "ready" {
				ready <- struct{}{}
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		p.kill()
		t.Fatalf("the child never got ready: %s", p.describe())
	}
	cl := &cluster{}
	d, err := cl.dumpGoroutines(&ownerProc{p: p})
	if err != nil {
		t.Fatal(err)
	}
	if d.Pooled != 0 {
		t.Errorf("%d Kitex pool goroutines in a process without Kitex", d.Pooled)
	}
	if n := d.Groups["github.com/fluxkv/fluxkv/bench/soak.parkForDump"]; n != 3 {
		t.Errorf("parkForDump: %d goroutines, want 3; groups: %s", n, d.summary(10))
	}
	if d.Total < 4 {
		t.Errorf("%d goroutines in the dump", d.Total)
	}
}

// TestCountFDs: the fd count of this process follows a file and a TCP listener it opens.
func TestCountFDs(t *testing.T) {
	all0, tcp0, err := countFDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	all1, tcp1, err := countFDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if all1 < all0+2 || tcp1 != tcp0+1 {
		t.Fatalf("after opening a file and a TCP listener: fds %d→%d, tcp %d→%d", all0, all1, tcp0, tcp1)
	}
}

// TestWorkerLines: the pool keeps the last counter line of every incarnation and sums
// them, so a killed incarnation's work still counts.
func TestWorkerLines(t *testing.T) {
	var wg sync.WaitGroup
	defer wg.Wait()
	dir := t.TempDir()
	script := filepath.Join(dir, "w.sh")
	body := "#!/bin/sh\necho '{\"worker\":\"x\",\"puts\":1,\"errors\":{\"NO_SPACE\":1}}'\necho 'not json'\n" +
		"echo '{\"worker\":\"x\",\"puts\":5,\"bytes_verified\":7,\"errors\":{\"NO_SPACE\":2}}'\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	pool := &workerPool{wg: &wg, logDir: dir, goArgv: []string{script}, last: map[string]*Counters{}}
	s := &workerSlot{lang: "go", cfg: workerConfig{Name: "w", Seed: 1}}
	for i := 0; i < 2; i++ {
		if err := pool.start(s); err != nil {
			t.Fatal(err)
		}
		<-s.p.done
	}
	tot := pool.totals()
	if tot.Puts != 10 || tot.BytesVerified != 14 || tot.Errors["NO_SPACE"] != 4 {
		t.Fatalf("totals of two incarnations: puts=%d bytes_verified=%d errors=%v", tot.Puts, tot.BytesVerified, tot.Errors)
	}
	if !s.p.unexpected() {
		t.Fatal("an exit the driver did not cause is not unexpected")
	}
}
