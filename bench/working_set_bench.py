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
Goals (issue 16): 4 KiB holder gets >= 15k/s from Python, >= 40k/s from Go.

  make build
  /usr/bin/python3 bench/working_set_bench.py --sizes 4KiB,64KiB,1MiB --working-set 4096 --seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
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

            for dist in args.dists:
                seq = sequence(dist, n, 1 << 20, args.zipf_theta, args.seed)
                r = pgb.timed_loop(holder, seq, args.seconds, args.warmup)
                rows.append({"client": "python-holder", "dist": dist, "size": size, "working_set": n, **r})
                print(f"  python {dist:7s} {r['gets_per_s']:9.0f} gets/s  p50 {r['p50_us']:6.1f} us", flush=True)
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


def python_unix_pair(seconds: float, warmup: float) -> dict:
    """The floor of a Python holder get on this machine: a 100-byte request and a 60-byte reply
    between this process and a forked child over a Unix socket, nothing else."""
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
    req = b"q" * 100

    def trip(_):
        a.sendall(req)
        got = 0
        while got < 60:
            got += len(a.recv(60 - got))

    try:
        return pgb.timed_loop(trip, list(range(1024)), seconds, warmup)
    finally:
        a.close()
        os.waitpid(pid, 0)


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
    ap.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    args = ap.parse_args()
    args.sizes = [pgb.parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.go_sizes = {pgb.parse_size(s) for s in args.go_sizes.split(",") if s.strip()}
    args.dists = [d.strip() for d in args.dists.split(",") if d.strip()]
    if any(d not in ("zipf", "uniform") for d in args.dists) or args.working_set < 1 or args.seconds <= 0:
        ap.error("--dists takes zipf and/or uniform; --working-set and --seconds must be positive")
    if not os.access(args.fluxkv_bin, os.X_OK):
        ap.error(f"--fluxkv-bin {args.fluxkv_bin} is not an executable (make build)")

    tmp = Path(tempfile.mkdtemp(prefix="fkv-wsbench-", dir="/tmp"))
    failures: list[str] = []
    rows: list[dict] = []
    try:
        rg = None
        if args.go:
            rg = tmp / "remoteget"
            subprocess.run([args.go, "build", "-o", str(rg), "./bench/remoteget"], cwd=REPO, check=True)
        for size in args.sizes:
            rows += run_size(size, args, rg, tmp, failures)
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
    if args.json:
        print(json.dumps({"rows": rows, "failures": failures}))
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
