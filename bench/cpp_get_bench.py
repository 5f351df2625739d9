#!/usr/bin/python3
"""1 MiB memory-hit gets from C++ (holder and copy), beside the Go client and Python, in one run.

Issue 15 item 5. One run starts a `fluxkv up` owner on a Unix socket under a temporary directory,
puts --keys values of --size bytes (a pure function of the key: bench/remoteget/value.go), then
runs single-threaded get loops against the same owner, --rounds times in turn (the order rotates,
so no backend always runs first on a busy machine):

  cpp-holder     get() + release (the holder's destructor)           clients/cpp fluxkv_get_bench
  cpp-copy       get() + copy into a reused buffer + release         clients/cpp fluxkv_get_bench
  go-holder      Get() + Release()                                   bench/remoteget (Go client)
  python-holder  get() + release()                                   bench/python_get_bench.py's loop
  python-bytes   get() + bytes() + release()                         bench/python_get_bench.py's loop

Each loop is the method of bench/python_get_bench.py: a warmup, then a fixed window of calls
round-robin over the keys, each call timed. The table shows, per backend, the median over the
rounds of gets/s (and its p50/p99), payload GiB/s, and the ratio to go-holder; the goal is
cpp-holder >= 0.95x go-holder. It also checks that the owner's used bytes and holders are back
to their baseline afterwards. Exit status: 0 when the checks pass (and, with --require-goals,
the goal is met), 1 otherwise.

  make cpp build
  /usr/bin/python3 bench/cpp_get_bench.py --cpp-bench clients/cpp/build/fluxkv_get_bench --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import python_get_bench as pgb  # noqa: E402  (puts clients/python on sys.path)
from remote_get_bench import run_go, value  # noqa: E402

import fluxkv  # noqa: E402

GOAL = 0.95  # cpp-holder gets/s over go-holder's
PREFIX = "bench/"


def run_cpp(binary: str, sock: str, mode: str, args) -> dict:
    cmd = [binary, "--socket", sock, "--prefix", PREFIX, "--keys", str(args.keys), "--size", str(args.size),
           "--mode", mode, "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + args.warmup + 120)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(lines[-1])


def run_go_holder(rg: Path, sock: str, args) -> dict:
    # remoteget's get mode through a local owner: every get is a memory hit of this node.
    r = run_go(rg, ["-socket", sock, "-prefix", PREFIX, "-keys", str(args.keys), "-verify-every", "0"], args.size, 1,
               types.SimpleNamespace(duration=args.seconds, warmup=args.warmup))
    if r.get("errors") or r.get("wrong") or r.get("remote"):
        raise RuntimeError(f"go: {r.get('errors')} errors, {r.get('wrong')} wrong values, {r.get('remote')} remote gets: "
                           f"{r.get('first_error', '')}")
    return {"gets": r["ops"], "seconds": r["seconds"], "gets_per_s": r["ops"] / r["seconds"], "p50_us": r["p50_us"],
            "p99_us": r["p99_us"]}


def node_usage(c) -> tuple[int, int]:
    """(used memory bytes, holders) of the owner's node, after the client's queued releases."""
    st = c.stat()
    m = next(m for m in st["members"] if m["node_id"] == st["node_id"])
    return m["memory_segment"]["used_bytes"], m["holders"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"), help="fluxkv binary (make build)")
    ap.add_argument("--cpp-bench", default=str(REPO / "clients" / "cpp" / "build" / "fluxkv_get_bench"),
                    help="the C++ loop (make cpp builds it)")
    ap.add_argument("--go", default="go", help="go tool that builds bench/remoteget")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured window per backend and round")
    ap.add_argument("--warmup", type=float, default=0.5, help="warmup per backend and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over all backends; the table shows medians")
    ap.add_argument("--keys", type=int, default=16, help="distinct keys, all memory hits")
    ap.add_argument("--size", type=pgb.parse_size, default=pgb.MiB, help="value size (default 1MiB)")
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    ap.add_argument("--require-goals", action="store_true", help="exit 1 when the goal ratio is missed")
    args = ap.parse_args()
    for path, what in ((args.fluxkv_bin, "--fluxkv-bin"), (args.cpp_bench, "--cpp-bench")):
        if not os.access(path, os.X_OK):
            ap.error(f"{what} {path} is not an executable (make build cpp)")

    tmp = Path(tempfile.mkdtemp(prefix="fkv-cppbench-", dir="/tmp"))
    owner = None
    failures: list[str] = []
    runs: dict[str, list[dict]] = {}
    try:
        rg = tmp / "remoteget"
        print(f"building bench/remoteget -> {rg}", flush=True)
        subprocess.run([args.go, "build", "-o", str(rg), "./bench/remoteget"], cwd=REPO, check=True)
        node = tmp / "node"
        node.mkdir()
        sock = str(node / "fluxkv.sock")
        dram_mib = max(64, (4 * args.keys * args.size) // pgb.MiB + 16)
        owner = pgb.Server("fluxkv", [args.fluxkv_bin, "up", "--dir", str(node), "--dram", f"{dram_mib}MiB"],
                           tmp / "fluxkv.log", sock)
        owner.wait_ready()

        keys = [f"{PREFIX}{i}" for i in range(args.keys)]
        c = fluxkv.connect(sock)
        for k in keys:
            c.put(k, value(k, args.size))
        for k in keys:  # every key is a byte-exact memory hit
            with c.get(k) as h:
                if h.source != "memory" or h.bytes() != value(k, args.size):
                    failures.append(f"{k} is not a byte-exact memory hit")
        base = node_usage(c)

        def py_holder(k):
            c.get(k).release()

        def py_bytes(k):
            with c.get(k) as h:
                return h.bytes()

        backends = {
            "cpp-holder": lambda: run_cpp(args.cpp_bench, sock, "holder", args),
            "go-holder": lambda: run_go_holder(rg, sock, args),
            "cpp-copy": lambda: run_cpp(args.cpp_bench, sock, "copy", args),
            "python-holder": lambda: pgb.timed_loop(py_holder, keys, args.seconds, args.warmup),
            "python-bytes": lambda: pgb.timed_loop(py_bytes, keys, args.seconds, args.warmup),
        }
        names = list(backends)
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                r = backends[name]()
                runs.setdefault(name, []).append(r)
                print(f"round {rnd + 1}/{args.rounds} {name:<14} {r['gets_per_s']:>9.0f} gets/s", flush=True)

        after = node_usage(c)
        if after != base:
            failures.append(f"after the loops used={after[0]} holders={after[1]}, baseline used={base[0]} holders={base[1]}")
        if c.release_errors:
            failures.append(f"python: {c.release_errors} release acks refused")
        c.close()
    finally:
        if owner is not None:
            rc = owner.stop()
            if rc != 0:
                failures.append(f"fluxkv did not stop cleanly on SIGTERM (status {rc})")
        shutil.rmtree(tmp, ignore_errors=True)

    results = {}
    for name, rs in runs.items():
        med = sorted(rs, key=lambda r: r["gets_per_s"])[(len(rs) - 1) // 2]  # the median run, whole
        results[name] = {**med, "rounds_gets_per_s": [round(r["gets_per_s"], 1) for r in rs]}
    base_go = results["go-holder"]["gets_per_s"]
    print(f"\n1 value of {args.size} bytes x {args.keys} keys, {args.seconds:g} s per backend x {args.rounds} rounds "
          f"(median), single thread, one local owner")
    print(f"{'backend':<15}{'gets/s':>10}{'p50 us':>10}{'p99 us':>10}{'GiB/s':>9}{'vs go-holder':>14}")
    for name, r in results.items():
        r["gib_per_s"] = r["gets_per_s"] * args.size / (1 << 30)
        r["vs_go_holder"] = r["gets_per_s"] / base_go
        print(f"{name:<15}{r['gets_per_s']:>10.0f}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}{r['gib_per_s']:>9.2f}"
              f"{r['vs_go_holder']:>13.2f}x")
    got = results["cpp-holder"]["vs_go_holder"]
    met = got >= GOAL
    print(f"goal cpp-holder >= {GOAL:g}x go-holder: {got:.2f}x {'met' if met else 'MISSED'}")
    for f in failures:
        print("CHECK FAILED:", f)
    if not failures:
        print("checks: byte-exact memory hits, used bytes and holders back to baseline: ok")
    if args.json:
        print(json.dumps({"size": args.size, "keys": args.keys, "seconds": args.seconds, "rounds": args.rounds,
                          "results": results, "failures": failures, "goal_met": met}))
    return 1 if failures or (args.require_goals and not met) else 0


if __name__ == "__main__":
    sys.exit(main())
