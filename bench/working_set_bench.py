#!/usr/bin/python3
"""Single-thread memory-hit gets over a working set that fits in DRAM: the per-get cost of a node.

Issue 16 item 2's method, measured every `make bench-python`: for each --sizes value one run
starts a fresh `fluxkv up` owner sized to hold the working set (--working-set keys, default
4,096), puts every key, checks each is a memory hit, then times one thread of get + release
(holder mode: the bytes are not copied) for --seconds per key distribution:

  zipf      key ranks drawn from Zipf(--zipf-theta, default 0.99), the pressure benchmark's generator
  uniform   key ranks drawn uniformly

and, for the --go-sizes values (default 4 KiB), the Go client's get + release over the same keys
(bench/remoteget, one goroutine, keys in turn). The first get of each key crosses to the master (a
local hit); later ones are answered from the owner's hot set (the released holding it keeps, up to
--hot-set of the pool, for --cache-grace) with no master trip: the steady state this measures.
Mooncake Store's in-process client would join here where installed; it is not installed on the
build machine, so it is left out (the issue's figures for it came from a machine that had it).

Beside them it measures the machine's floor for a one-thread holder get from each language: a
100-byte request and a 60-byte reply with another process over a Unix socket, nothing else
(python-floor: a forked child; go-floor: remoteget -unix-pair). A holder get moves no payload, so
no get loop can beat its floor; the goals are printed with the share of it they reach.

It prints gets/s, p50/p99 latency and payload GiB/s per size and distribution, and checks that
the owner's used bytes and holders are back to their baseline afterwards (exit status 1 if not).
Goals (issue 16): 4 KiB holder gets >= 15k/s from Python, >= 40k/s from Go; (issue 26 point 5)
the Python 4 KiB holder gets >= 0.55 of the Python floor (the echo). For that ratio each Python
get loop is cut into --slices windows (default 6) alternating with windows of the Python echo,
so both see the same load on a shared machine; the python-floor row is measured on its own.

Batch rows (issue 26 point 3; --batch-keys, default 64, 0 skips them): the median latency of
--batch-runs (default 31) calls each, single and batch calls interleaved, and their ratio:
  batch_exists(64 keys) vs exists(1 key)                   on a default owner (goal <= 3x)
  batch_exists(64 keys, prefix=True) vs exists(1 key)      (printed for reference)
  batch_get(64 x 4 KiB) vs get(1 key), holders released,   on an owner started with --hot-set off
                                                            (every get asks the master; goal <= 4x)

  make build
  /usr/bin/python3 bench/working_set_bench.py --sizes 4KiB,64KiB,1MiB --working-set 4096 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import python_get_bench as pgb  # noqa: E402  (puts clients/python on sys.path)
from pressure.workload import ZIPF_THETA, ZipfSequence  # noqa: E402
from remote_get_bench import run_go, value  # noqa: E402

import fluxkv  # noqa: E402

PREFIX = "ws/"
PY_GOAL_4K, GO_GOAL_4K = 15_000, 40_000
PY_GOAL_OF_FLOOR = 0.55  # issue 26 point 5: Python 4 KiB holder gets vs the Python echo
BATCH_EXISTS_GOAL, BATCH_GET_GOAL = 3.0, 4.0  # issue 26 point 3: batch of 64 vs one key


def node_usage(c) -> tuple[int, int]:
    st = c.stat()
    m = next(m for m in st["members"] if m["node_id"] == st["node_id"])
    return m["memory_segment"]["used_bytes"], m["holders"]


def sequence(dist: str, n: int, length: int, theta: float, seed: int) -> list[int]:
    if dist == "zipf":
        return ZipfSequence(n, seed, 0, theta).take(length)
    rng = random.Random(seed)
    return [rng.randrange(n) for _ in range(length)]


def run_size(size: int, args, rg: Path | None, tmp: Path, failures: list[str]) -> list[dict]:
    n = args.working_set
    node = tmp / f"node-{size}"
    node.mkdir()
    sock = str(node / "fluxkv.sock")
    dram = n * max(size, 4096) * 5 // 4 + (64 << 20)
    owner = pgb.Server("fluxkv", [args.fluxkv_bin, "up", "--dir", str(node), "--dram", str(dram)], tmp / f"fluxkv-{size}.log", sock)
    rows = []
    try:
        owner.wait_ready()
        c = fluxkv.connect(sock)
        try:
            verify = args.go and size in args.go_sizes  # the Go loop checks its first value: value.go's bytes
            common = value("ws", size)
            keys = [f"{PREFIX}{i}" for i in range(n)]
            t0 = time.monotonic()
            for k in keys:
                c.put(k, value(k, size) if verify else common)
            print(f"{pgb_size(size)}: {n} keys put in {time.monotonic() - t0:.1f} s", flush=True)
            for k in keys[:: max(1, n // 64)]:
                with c.get(k) as h:
                    if h.source != "memory":
                        failures.append(f"{k} ({size} B) is not a memory hit: the working set does not fit")
            base = node_usage(c)
            # One get of every key first: the steady state, where the owner's hot set holds
            # what fits in its budget (the first get of a key is a master trip).
            t0 = time.monotonic()
            for k in keys:
                c.get(k).release()
            print(f"{pgb_size(size)}: first gets of {n} keys in {time.monotonic() - t0:.2f} s", flush=True)

            def holder(i):
                c.get(keys[i]).release()

            echo = PythonEcho()
            try:
                for dist in args.dists:
                    seq = sequence(dist, n, 1 << 20, args.zipf_theta, args.seed)
                    r, e = interleaved_loops(holder, seq, echo, args.seconds, args.warmup, args.slices)
                    rows.append({"client": "python-holder", "dist": dist, "size": size, "working_set": n, **r,
                                 "echo_per_s": e["gets_per_s"], "echo_p50_us": e["p50_us"]})
                    print(f"  python {dist:7s} {r['gets_per_s']:9.0f} gets/s  p50 {r['p50_us']:6.1f} us"
                          f"  (Python echo in the same windows: {e['gets_per_s']:.0f}/s, p50 {e['p50_us']:.1f} us: "
                          f"{r['gets_per_s'] / e['gets_per_s']:.2f}x)", flush=True)
            finally:
                echo.close()
            if verify:
                r = run_go(rg, ["-socket", sock, "-prefix", PREFIX, "-keys", str(n), "-verify-every", "0"], size, 1,
                           types.SimpleNamespace(duration=args.seconds, warmup=args.warmup))
                if r.get("errors") or r.get("wrong"):
                    failures.append(f"go ({size} B): {r.get('errors')} errors, {r.get('wrong')} wrong values: {r.get('first_error', '')}")
                rows.append({"client": "go-holder", "dist": "in-turn", "size": size, "working_set": n, "gets": r["ops"],
                             "seconds": r["seconds"], "gets_per_s": r["ops"] / r["seconds"], "p50_us": r["p50_us"], "p99_us": r["p99_us"]})
                print(f"  go     in-turn {rows[-1]['gets_per_s']:9.0f} gets/s  p50 {r['p50_us']:6.1f} us", flush=True)
            deadline = time.monotonic() + 10
            while node_usage(c) != base and time.monotonic() < deadline:
                time.sleep(0.05)
            if node_usage(c) != base:
                failures.append(f"{size} B: used bytes and holders {node_usage(c)} not back to {base}")
        finally:
            c.close()
    finally:
        owner.stop()
    return rows


def _median_us(fn, runs: int) -> float:
    lat = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn()
        lat.append(time.perf_counter_ns() - t0)
    return statistics.median(lat) / 1e3


def _interleaved(single, batch, runs: int) -> tuple[float, float]:
    """Median latency (us) of ``runs`` calls of each, alternating single and batch calls
    (after a few of each as warmup) so drift on a shared machine hits both alike."""
    for _ in range(5):
        single()
        batch()
    s_lat, b_lat = [], []
    perf = time.perf_counter_ns
    for _ in range(runs):
        t0 = perf()
        single()
        t1 = perf()
        batch()
        t2 = perf()
        s_lat.append(t1 - t0)
        b_lat.append(t2 - t1)
    return statistics.median(s_lat) / 1e3, statistics.median(b_lat) / 1e3


def batch_rows(args, tmp: Path, failures: list[str]) -> list[dict]:
    """Issue 26 point 3: one call of --batch-keys keys against one call of one key."""
    n, size, runs = args.batch_keys, 4096, args.batch_runs
    keys = [f"bt/{i}" for i in range(n)]
    common = value("bt", size)
    rows = []
    for hot_set in ("default", "off"):
        node = tmp / f"node-batch-{hot_set}"
        node.mkdir()
        sock = str(node / "fluxkv.sock")
        cmd = [args.fluxkv_bin, "up", "--dir", str(node), "--dram", str(n * size * 4 + (64 << 20))]
        if hot_set == "off":
            cmd += ["--hot-set", "off"]
        owner = pgb.Server("fluxkv", cmd, tmp / f"fluxkv-batch-{hot_set}.log", sock)
        try:
            owner.wait_ready()
            with fluxkv.connect(sock) as c:
                c.batch_put([(k, common) for k in keys])
                for k in keys:
                    c.get(k).release()
                if hot_set == "default":
                    if c.batch_exists(keys) != [True] * n:
                        failures.append(f"batch_exists of {n} keys just put: not all present")
                    one, many = _interleaved(lambda: c.exists(keys[0]), lambda: c.batch_exists(keys), runs)
                    rows.append({"what": f"batch_exists({n}) vs exists(1)", "single_us": one, "batch_us": many,
                                 "goal": BATCH_EXISTS_GOAL})
                    if c.batch_exists(keys, prefix=True) != n:
                        failures.append(f"batch_exists(prefix=True) of {n} keys just put: count is not {n}")
                    one, many = _interleaved(lambda: c.exists(keys[0]), lambda: c.batch_exists(keys, prefix=True), runs)
                    rows.append({"what": f"batch_exists({n}, prefix) vs exists(1)", "single_us": one, "batch_us": many,
                                 "goal": None})
                else:
                    def get_one():
                        c.get(keys[0]).release()

                    def get_many():
                        for h in c.batch_get(keys):
                            h.release()

                    one, many = _interleaved(get_one, get_many, runs)
                    rows.append({"what": f"batch_get({n} x 4 KiB) vs get(1), hot set off", "single_us": one,
                                 "batch_us": many, "goal": BATCH_GET_GOAL})
        finally:
            owner.stop()
    return rows


class PythonEcho:
    """The floor of a Python holder get on this machine: a 100-byte request and a 60-byte reply
    between this process and a forked child over a Unix socket, nothing else."""

    def __init__(self):
        import socket

        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:  # the answering child
            a.close()
            try:
                while True:
                    got = 0
                    while got < 100:
                        chunk = b.recv(100 - got)
                        if not chunk:
                            os._exit(0)
                        got += len(chunk)
                    b.sendall(b"r" * 60)
            finally:
                os._exit(0)
        b.close()
        self.sock, self.pid = a, pid
        self.req = b"q" * 100

    def trip(self, _=None) -> None:
        a = self.sock
        a.sendall(self.req)
        got = 0
        while got < 60:
            got += len(a.recv(60 - got))

    def close(self) -> None:
        self.sock.close()
        os.waitpid(self.pid, 0)


def python_unix_pair(seconds: float, warmup: float) -> dict:
    echo = PythonEcho()
    try:
        return pgb.timed_loop(echo.trip, list(range(1024)), seconds, warmup)
    finally:
        echo.close()


def interleaved_loops(fn, keys: list, echo: PythonEcho, seconds: float, warmup: float, slices: int) -> tuple[dict, dict]:
    """fn(key) over keys in turn and the Python echo, each for ``seconds`` in all, in
    ``slices`` alternating windows: on a shared machine both see the same load, so their
    ratio is the client's share of the floor rather than of whatever ran meanwhile."""
    perf = time.perf_counter_ns
    end = time.monotonic() + warmup
    i, nkeys = 0, len(keys)
    while time.monotonic() < end:
        fn(keys[i % nkeys])
        echo.trip()
        i += 1
    lats: tuple[list[int], list[int]] = ([], [])
    spent = [0, 0]
    window = int(seconds * 1e9 / slices)
    for _ in range(slices):
        for which, f in ((0, fn), (1, echo.trip)):
            append = lats[which].append
            t_start = now = perf()
            t_end = t_start + window
            while now < t_end:
                t0 = now
                f(keys[i % nkeys])
                now = perf()
                append(now - t0)
                i += 1
            spent[which] += now - t_start
    return pgb.latency_summary(lats[0], spent[0]), pgb.latency_summary(lats[1], spent[1])


def pgb_size(n: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"), help="fluxkv binary (make build)")
    ap.add_argument("--go", default="go", help="go tool that builds bench/remoteget ('' skips the Go client)")
    ap.add_argument("--sizes", default="4KiB,64KiB,1MiB", help="value sizes, one owner each")
    ap.add_argument("--go-sizes", default="4KiB", help="sizes the Go client is measured at too")
    ap.add_argument("--working-set", type=int, default=4096, help="distinct keys, all held in DRAM")
    ap.add_argument("--dists", default="zipf,uniform", help="key distributions: zipf, uniform")
    ap.add_argument("--zipf-theta", type=float, default=ZIPF_THETA)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=3.0, help="measured window per case")
    ap.add_argument("--warmup", type=float, default=0.5, help="warmup per case")
    ap.add_argument("--slices", type=int, default=6,
                    help="windows each Python get loop is cut into, alternating with the Python echo")
    ap.add_argument("--batch-keys", type=int, default=64, help="keys of the batch rows (0 skips them)")
    ap.add_argument("--batch-runs", type=int, default=31, help="calls timed per batch row case (median)")
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    args = ap.parse_args()
    args.sizes = [pgb.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.go_sizes = {pgb.parse_size(s) for s in args.go_sizes.split(",") if s.strip()}
    args.dists = [d.strip() for d in args.dists.split(",") if d.strip()]
    if any(d not in ("zipf", "uniform") for d in args.dists) or args.working_set < 1 or args.seconds <= 0:
        ap.error("--dists takes zipf and/or uniform; --working-set and --seconds must be positive")
    if args.slices < 1:
        ap.error("--slices must be positive")
    if args.batch_keys < 0 or args.batch_runs < 15:
        ap.error("--batch-keys must be >= 0 and --batch-runs >= 15")
    if not os.access(args.fluxkv_bin, os.X_OK):
        ap.error(f"--fluxkv-bin {args.fluxkv_bin} is not an executable (make build)")

    tmp = Path(tempfile.mkdtemp(prefix="fkv-wsbench-", dir="/tmp"))
    failures: list[str] = []
    rows: list[dict] = []
    brows: list[dict] = []
    try:
        rg = None
        if args.go:
            rg = tmp / "remoteget"
            subprocess.run([args.go, "build", "-o", str(rg), "./bench/remoteget"], cwd=REPO, check=True)
        for size in args.sizes:
            rows += run_size(size, args, rg, tmp, failures)
        if args.batch_keys:
            brows = batch_rows(args, tmp, failures)
        # The machine's floor for a one-thread holder get, measured here, beside the gets.
        r = python_unix_pair(args.seconds, args.warmup)
        rows.append({"client": "python-floor", "dist": "-", "size": 0, "working_set": 0, **r})
        if rg is not None:
            r = run_go(rg, ["-unix-pair"], 100, 1, types.SimpleNamespace(duration=args.seconds, warmup=args.warmup))
            rows.append({"client": "go-floor", "dist": "-", "size": 0, "working_set": 0, "gets": r["ops"], "seconds": r["seconds"],
                         "gets_per_s": r["ops"] / r["seconds"], "p50_us": r["p50_us"], "p99_us": r["p99_us"]})
    finally:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)

    print(f"\none thread, holder gets (get + release), working set {args.working_set} keys in DRAM, one local owner")
    print(f"{'client':14s} {'dist':8s} {'size':>8s} {'gets/s':>9s} {'p50 us':>8s} {'p99 us':>8s} {'GiB/s':>7s}")
    floors = {r["client"].split("-")[0]: r["gets_per_s"] for r in rows if r["client"].endswith("-floor")}
    for r in rows:
        gib = r["gets_per_s"] * r["size"] / (1 << 30)
        size = pgb_size(r["size"]) if r["size"] else "-"
        print(f"{r['client']:14s} {r['dist']:8s} {size:>8s} {r['gets_per_s']:9.0f} {r['p50_us']:8.1f} {r['p99_us']:8.1f} {gib:7.2f}")
    print("(floor: a small request and reply with another process over a Unix socket, no fluxkv: a holder get's limit)")
    for r in rows:
        if r["size"] == 4096:
            goal = PY_GOAL_4K if r["client"] == "python-holder" else GO_GOAL_4K
            verdict = "met" if r["gets_per_s"] >= goal else "not met"
            floor = floors.get(r["client"].split("-")[0])
            of_floor = f", {r['gets_per_s'] / floor:.2f}x the {floor:.0f}/s floor" if floor else ""
            print(f"goal (issue 16) {r['client']} {r['dist']} 4 KiB >= {goal}/s: {r['gets_per_s']:.0f}/s {verdict}{of_floor}")
    for r in rows:
        if r["size"] == 4096 and r["client"] == "python-holder" and r.get("echo_per_s"):
            share = r["gets_per_s"] / r["echo_per_s"]
            verdict = "met" if share >= PY_GOAL_OF_FLOOR else "not met"
            print(f"goal (issue 26) python-holder {r['dist']} 4 KiB >= {PY_GOAL_OF_FLOOR}x the Python echo (interleaved "
                  f"windows): {r['gets_per_s']:.0f}/s of {r['echo_per_s']:.0f}/s = {share:.2f}x {verdict}")
    if brows:
        print(f"\nbatch calls vs one key (median of {args.batch_runs} calls each, interleaved)")
        for b in brows:
            ratio = b["batch_us"] / b["single_us"]
            goal = f"goal <= {b['goal']:.0f}x: {'met' if ratio <= b['goal'] else 'not met'}" if b["goal"] else "(reference)"
            print(f"  {b['what']:44s} {b['batch_us']:8.1f} us vs {b['single_us']:6.1f} us = {ratio:5.2f}x  {goal}")
    if args.json:
        print(json.dumps({"rows": rows, "batch_rows": brows, "failures": failures}))
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
