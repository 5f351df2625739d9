#!/usr/bin/python3
"""Latency of memory-hit and SSD-hit gets from Python (holder mode: get + release).

Starts `fluxkv up` with an SSD tier and promotion off, writes a dataset of 4x DRAM so the
first half lives only on SSD, then times single-threaded gets of keys known to be in
memory and of keys known to be on SSD only, and prints p50/p95/p99 per source.

    /usr/bin/python3 bench/python_tier_latency.py --fluxkv-bin bin/fluxkv --dir /var/tmp
"""
import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "clients" / "python"))

import fluxkv  # noqa: E402

MiB = 1 << 20


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"))
    ap.add_argument("--dir", default=None, help="directory for the SSD ring (must support O_DIRECT)")
    ap.add_argument("--dram-mib", type=int, default=64)
    ap.add_argument("--size", type=int, default=MiB, help="value bytes")
    ap.add_argument("--gets", type=int, default=2000, help="gets per source")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as ssd_dir, tempfile.TemporaryDirectory() as sock_dir:
        proc = subprocess.Popen(
            [args.fluxkv_bin, "--log-level", "warn", "up", "--dir", sock_dir, "--dram", f"{args.dram_mib}MiB",
             "--ssd-path", ssd_dir, "--ssd-limit", f"{8 * args.dram_mib}MiB", "--no-promotion"])
        try:
            sock = os.path.join(sock_dir, "fluxkv.sock")
            deadline = time.time() + 30
            while not os.path.exists(sock):
                if time.time() > deadline or proc.poll() is not None:
                    sys.exit("fluxkv did not start")
                time.sleep(0.05)
            with fluxkv.connect(sock) as c:
                n = 4 * args.dram_mib * MiB // args.size
                value = os.urandom(args.size)
                for i in range(n):
                    c.put(f"k{i}", value)
                    print(f"\rbootstrap {i + 1}/{n}", end="", file=sys.stderr)
                print(file=sys.stderr)
                time.sleep(1.0)  # let the last persists finish
                rng = random.Random(1)
                lat = {"memory": [], "ssd": []}
                hot = range(n - args.dram_mib * MiB // args.size // 2, n)  # last puts: in memory
                cold = range(0, n // 2)                                      # first puts: SSD only
                for src, keys in (("memory", hot), ("ssd", cold)):
                    for _ in range(args.gets):
                        k = f"k{rng.choice(keys)}"
                        t0 = time.perf_counter()
                        with c.get(k) as h:
                            got = h.source
                        lat[got].append((time.perf_counter() - t0) * 1e6)
                print(f"{args.size} B values, {args.dram_mib} MiB DRAM, dataset {n * args.size >> 20} MiB, promotion off")
                print(f"{'source':8} {'gets':>6} {'p50 us':>9} {'p95 us':>9} {'p99 us':>9}")
                for src, xs in lat.items():
                    if xs:
                        print(f"{src:8} {len(xs):6d} {pct(xs, 50):9.1f} {pct(xs, 95):9.1f} {pct(xs, 99):9.1f}")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
