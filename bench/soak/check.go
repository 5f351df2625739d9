package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ownerState is what the end checks look at, from the outside only: `fluxkv status
// --json`, the owner's /metrics and /proc/PID/fd.
type ownerState struct {
	Keys       int64 // routes the master knows
	Used       int64 // segment used bytes
	SSDUsed    int64 // SSD used bytes
	Holders    int64 // holders on this owner
	Goroutines int   // the owner's go_goroutines
	FDs        int   // the owner's open fds
	TCP        int   // of FDs, TCP connections and listeners
}

func (s ownerState) String() string {
	return fmt.Sprintf("keys=%d used=%d ssd_used=%d holders=%d goroutines=%d fds=%d (tcp %d)",
		s.Keys, s.Used, s.SSDUsed, s.Holders, s.Goroutines, s.FDs, s.TCP)
}

// kitexPooledConns bounds the TCP connections that Kitex's default long-connection pools
// may keep idle for a minute after the load stops: 10 per address, in each direction
// between an owner and the master (the owner's master client, the master's peer client).
const kitexPooledConns = 2 * 10

// peerPooledConns bounds the pooled TCP connections an owner may keep with each other
// owner: data-plane pulls (4 idle per peer, daemon/transfer, both directions) and
// PeerService clients for remote SSD staging (Kitex, 10 per address, both directions).
const peerPooledConns = 2*4 + 2*10

// statusJSON is the part of `fluxkv status --json` the checks read.
type statusJSON struct {
	Members []struct {
		NodeID        string `json:"node_id"`
		MemorySegment struct {
			UsedBytes int64 `json:"used_bytes"`
		} `json:"memory_segment"`
		KvSsd struct {
			UsedBytes int64 `json:"used_bytes"`
		} `json:"kv_ssd"`
		Holders int64 `json:"holders"`
	} `json:"members"`
	Keys int64 `json:"keys"`
}

var metricsClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// observe reads the state of owner o.
func (c *cluster) observe(o *ownerProc) (ownerState, error) {
	var s ownerState
	out, err := exec.Command(c.cfg.Bin, "status", "--socket", o.socket(), "--json").Output()
	if err != nil {
		return s, fmt.Errorf("fluxkv status: %w", err)
	}
	var st statusJSON
	if err := json.Unmarshal(out, &st); err != nil {
		return s, fmt.Errorf("fluxkv status --json: %w: %s", err, out)
	}
	found := false
	for _, m := range st.Members {
		if m.NodeID == o.nodeID {
			s.Used, s.SSDUsed, s.Holders, found = m.MemorySegment.UsedBytes, m.KvSsd.UsedBytes, m.Holders, true
		}
	}
	if !found {
		return s, fmt.Errorf("fluxkv status: no member %s in %s", o.nodeID, out)
	}
	s.Keys = st.Keys
	if s.Goroutines, err = goroutines(o.metricsAddr); err != nil {
		return s, err
	}
	if s.FDs, s.TCP, err = countFDs(o.p.cmd.Process.Pid); err != nil {
		return s, err
	}
	return s, nil
}

// countFDs counts a process's open fds and, of them, TCP sockets (by inode, from
// /proc/net/tcp and tcp6).
func countFDs(pid int) (all, tcp int, err error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("owner fds: %w", err)
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if fields := strings.Fields(line); len(fields) > 9 {
				inodes[fields[9]] = true
			}
		}
	}
	for _, f := range fds {
		target, err := os.Readlink(filepath.Join(dir, f.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		all++
		if ino, ok := strings.CutPrefix(target, "socket:["); ok && inodes[strings.TrimSuffix(ino, "]")] {
			tcp++
		}
	}
	return all, tcp, nil
}

// goroutines reads go_goroutines from a /metrics endpoint.
func goroutines(addr string) (int, error) {
	resp, err := metricsClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("metrics: go_goroutines %q: %w", v, err)
			}
			return int(f), nil
		}
	}
	return 0, fmt.Errorf("metrics at %s: no go_goroutines", addr)
}

// baseline is an idle owner's goroutines and fds, taken after start-up (and after one
// status call, so lazily started parts are counted): the minimum of a few samples.
func (c *cluster) baseline(o *ownerProc) (ownerState, error) {
	var best ownerState
	for i := 0; i < 4; i++ {
		time.Sleep(250 * time.Millisecond)
		s, err := c.observe(o)
		if err != nil {
			return s, err
		}
		if i == 0 || s.Goroutines < best.Goroutines {
			best.Goroutines = s.Goroutines
		}
		if i == 0 || s.FDs < best.FDs {
			best.FDs, best.TCP = s.FDs, s.TCP
		}
	}
	return best, nil
}

// endCheck is the verdict on one owner after the key space was deleted.
type endCheck struct {
	base, last     ownerState
	problems       []string // anything but the goroutine count
	goroutinesOver bool     // go_goroutines above baseline + slack (see goroutineDump)
	dump           *goroutineDump
}

// settle polls owner o until it is back to baseline (no keys, nothing used, no
// holders, goroutines and fds within slack) or the deadline passes.
func (c *cluster) settle(o *ownerProc, base ownerState, slackG, slackFD int, checkSSD bool, deadline time.Time) endCheck {
	r := endCheck{base: base}
	var cleanSince time.Time // when every check but the goroutine count first held
	for {
		s, err := c.observe(o)
		r.last = s
		r.problems = r.problems[:0]
		r.goroutinesOver = false
		if err != nil {
			r.problems = append(r.problems, err.Error())
		} else {
			if s.Keys != 0 {
				r.problems = append(r.problems, fmt.Sprintf("%d keys left", s.Keys))
			}
			if s.Used != 0 {
				r.problems = append(r.problems, fmt.Sprintf("segment used %d bytes", s.Used))
			}
			if s.Holders != 0 {
				r.problems = append(r.problems, fmt.Sprintf("%d holders left", s.Holders))
			}
			if checkSSD && s.SSDUsed != 0 {
				r.problems = append(r.problems, fmt.Sprintf("SSD used %d bytes", s.SSDUsed))
			}
			r.goroutinesOver = s.Goroutines > base.Goroutines+slackG
			// TCP connections may stay pooled by Kitex for a minute (bounded); every other
			// fd (client sessions on the Unix sockets, files, pipes) must come back.
			if other, baseOther := s.FDs-s.TCP, base.FDs-base.TCP; other > baseOther+slackFD {
				r.problems = append(r.problems, fmt.Sprintf("non-TCP fds %d→%d", baseOther, other))
			}
			if s.TCP > base.TCP+kitexPooledConns+(c.cfg.Owners-1)*peerPooledConns+slackFD {
				r.problems = append(r.problems, fmt.Sprintf("TCP fds %d→%d (beyond Kitex's pools)", base.TCP, s.TCP))
			}
		}
		// Kitex's worker pool does not drain while heartbeats run: once everything else is
		// back, a few seconds tell a slow wind-down from a lasting excess (dumpGoroutines).
		if len(r.problems) > 0 {
			cleanSince = time.Time{}
		} else if cleanSince.IsZero() {
			cleanSince = time.Now()
		}
		if (len(r.problems) == 0 && (!r.goroutinesOver || time.Since(cleanSince) > 5*time.Second)) || time.Now().After(deadline) {
			return r
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// parseSize reads 64MiB, 1.5GiB, 4GB (binary units) or plain bytes.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if v, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = v, u.m
			break
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("size %q: want e.g. 64MiB or bytes", s)
	}
	return int64(f * float64(mult)), nil
}

// humanBytes prints bytes with a binary unit.
func humanBytes(n int64) string {
	var b bytes.Buffer
	switch {
	case n >= 1<<30:
		fmt.Fprintf(&b, "%.2fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		fmt.Fprintf(&b, "%.1fMiB", float64(n)/(1<<20))
	default:
		fmt.Fprintf(&b, "%dB", n)
	}
	return b.String()
}
