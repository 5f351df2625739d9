package main

import (
	"bytes"
	"encoding/hex"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestValueMatchesPython: worker.py derives the same bytes from (key, put_id, len) as
// value.go, so a Go worker verifies what a Python worker wrote and the other way round.
func TestValueMatchesPython(t *testing.T) {
	py, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("no /usr/bin/python3")
	}
	if exec.Command(py, "-c", "import numpy").Run() != nil {
		t.Skip("python3-numpy is not installed")
	}
	cases := []struct {
		key   string
		putID int64
		n     int
	}{{"soak/000001", 1, 1}, {"soak/000001", 2, 1}, {"k", 7, 7}, {"k", 7, 8}, {"k", 7, 9}, {"é/ü", 1 << 40, 1000}, {"soak/000042", 123456789, 65537}}
	var script strings.Builder
	script.WriteString("import sys; sys.path.insert(0, '.'); import worker\n")
	for _, c := range cases {
		script.WriteString("print(worker.value_bytes(" + pyStr(c.key) + ", " + itoa(c.putID) + ", " + itoa(int64(c.n)) + ").tobytes().hex())\n")
	}
	cmd := exec.Command(py, "-c", script.String())
	cmd.Env = append(cmd.Environ(), "PYTHONPATH=../../clients/python")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(cases) {
		t.Fatalf("python printed %d lines for %d cases:\n%s", len(lines), len(cases), out)
	}
	for i, c := range cases {
		want := make([]byte, c.n)
		fillValue(c.key, c.putID, want)
		got, err := hex.DecodeString(lines[i])
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%q put_id=%d len=%d: Python and Go differ (first bytes py %x go %x)", c.key, c.putID, c.n, got[:min(8, len(got))], want[:min(8, len(want))])
		}
	}
}

// TestWrongBytesCounts: verification finds every changed byte, and a value read with
// another put_id or length is wrong almost everywhere.
func TestWrongBytesCounts(t *testing.T) {
	v := make([]byte, 1<<20+3)
	fillValue("k", 5, v)
	if n := wrongBytes("k", 5, v); n != 0 {
		t.Fatalf("an intact value has %d wrong bytes", n)
	}
	v[0] ^= 1
	v[4096] ^= 0x80
	v[len(v)-1]++
	if n := wrongBytes("k", 5, v); n != 3 {
		t.Fatalf("3 changed bytes counted as %d", n)
	}
	fillValue("k", 5, v)
	if n := wrongBytes("k", 6, v); n < int64(len(v))*9/10 {
		t.Fatalf("a value checked against another put_id has only %d of %d wrong bytes", n, len(v))
	}
	if n := wrongBytes("k", 5, v[:len(v)-1]); n < int64(len(v))*9/10 {
		t.Fatalf("a value of another length has only %d of %d wrong bytes", n, len(v))
	}
	zeros := make([]byte, 4096)
	if n := wrongBytes("k", 5, zeros); n < 4000 {
		t.Fatalf("zeros pass verification: %d wrong bytes of 4096", n)
	}
}

func pyStr(s string) string { return "'" + strings.ReplaceAll(s, "'", "\\'") + "'" }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
