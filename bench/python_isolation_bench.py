#!/usr/bin/python3
"""Python put and get throughput with client isolation on and off, in one run.

Starts two single-node caches (`fluxkv up`), one with --client-isolation and one without,
and runs, --reps times alternating off/on, a put loop (put of --size bytes over --keys keys,
overwriting) and a get loop (get() + release(), the zero-copy memory hit) of --ops
operations each. Per mode it prints the mean ops/s of each loop, the run-to-run spread
(sample standard deviation / mean, and (max - min) / mean) and the ratio on/off. Issue 12's
rule: isolation becomes the default only if puts lose <= 15% and gets stay within the
run-to-run spread (<= 3%).

  /usr/bin/python3 bench/python_isolation_bench.py --fluxkv-bin bin/fluxkv --size 1MiB --ops 2000 --reps 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "bench"))

import fluxkv  # noqa: E402
from python_get_bench import parse_size  # noqa: E402


def start(binary: str, root: Path, name: str, dram: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    d = root / name
    d.mkdir()
    sock = str(d / "fluxkv.sock")
    log = open(root / f"{name}.log", "wb")
    p = subprocess.Popen([binary, "up", "--dir", str(d), "--dram", dram, *extra], stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        if p.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name}: fluxkv up did not start: {(root / f'{name}.log').read_text(errors='replace')[-2000:]}")
        time.sleep(0.02)
    return p, sock


def put_loop(c: fluxkv.Client, value: bytes, keys: list[str], ops: int) -> float:
    t0 = time.perf_counter()
    for i in range(ops):
        c.put(keys[i % len(keys)], value)
    return ops / (time.perf_counter() - t0)


def get_loop(c: fluxkv.Client, keys: list[str], ops: int) -> float:
    t0 = time.perf_counter()
    for i in range(ops):
        c.get(keys[i % len(keys)]).release()
    return ops / (time.perf_counter() - t0)


def summary(xs: list[float]) -> tuple[float, float, float]:
    m = statistics.fmean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return m, sd / m, (max(xs) - min(xs)) / m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"))
    ap.add_argument("--size", type=parse_size, default=1 << 20, help="value size (default 1MiB)")
    ap.add_argument("--ops", type=int, default=2000, help="operations per loop (default 2000)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions, each off then on (default 5)")
    ap.add_argument("--keys", type=int, default=16, help="keys the loops cycle over (default 16)")
    ap.add_argument("--dram", default="512MiB")
    ap.add_argument("--put-area", default="32MiB", help="--put-area of the isolated node (default 32MiB)")
    a = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="fkv-iso-bench-", dir="/tmp"))
    procs = []
    try:
        modes = {}
        for name, extra in (("off", []), ("on", ["--client-isolation", "--put-area", a.put_area])):
            p, sock = start(a.fluxkv_bin, root, name, a.dram, extra)
            procs.append(p)
            modes[name] = fluxkv.connect(sock, name=f"isolation-bench-{name}")
            assert modes[name]._current().area is not None if name == "on" else modes[name]._current().area is None
        value = os.urandom(a.size)
        keys = [f"bench-{i}" for i in range(a.keys)]
        for c in modes.values():  # warm up: every key exists, pages are touched
            put_loop(c, value, keys, 2 * len(keys))
            get_loop(c, keys, 2 * len(keys))
        res = {(m, op): [] for m in modes for op in ("put", "get")}
        for rep in range(a.reps):
            for m, c in modes.items():
                res[(m, "put")].append(put_loop(c, value, keys, a.ops))
                res[(m, "get")].append(get_loop(c, keys, a.ops))
                with c.get(keys[0]) as h:
                    if h.bytes() != value:
                        raise RuntimeError(f"{m}: value differs after the put loop")
            print(f"rep {rep + 1}/{a.reps}: " + "  ".join(f"{m} {op} {res[(m, op)][-1]:8.0f}/s" for m, op in res), flush=True)
        print(f"\nPython {a.size} B put / get, {a.reps} reps x {a.ops} ops each, alternating off/on")
        print(f"{'op':4} {'mode':4} {'mean ops/s':>11} {'GiB/s':>7} {'stdev':>7} {'range':>7} {'on/off':>7}")
        for op in ("put", "get"):
            base = summary(res[("off", op)])[0]
            for m in ("off", "on"):
                mean, sd, rng = summary(res[(m, op)])
                print(f"{op:4} {m:4} {mean:11.0f} {mean * a.size / (1 << 30):7.2f} {sd:7.1%} {rng:7.1%} {mean / base:7.3f}")
        for c in modes.values():
            c.close()
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(20)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
