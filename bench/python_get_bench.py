#!/usr/bin/python3
"""1 MiB memory-hit gets from Python: fluxkv (holder and bytes modes) vs memcached and Redis.

One run starts every server itself on Unix sockets under a temporary directory, loads the
same keys into each, then runs a single-threaded get loop per backend for --seconds:

  fluxkv-holder  get() + release()               (the native, zero-copy reference)
  fluxkv-bytes   get() + bytes() + release()     (payload materialised as Python bytes)
  memcached      pymemcache get()  (Debian memcached, -s socket)
  redis          redis-py get()    (Debian redis-server, --unixsocket)

It prints gets/s, p50/p99 latency and payload GiB/s per backend and the ratios against
memcached (goals: holder >= 10x, bytes >= 3x). It also checks that fluxkv's used bytes and
holders are back to their baseline after the loops, and that an overwrite made by another
process is visible to the next get. Exit status: 0 when those checks pass (and, with
--require-goals, the goals are met), 1 otherwise.

  /usr/bin/python3 bench/python_get_bench.py --fluxkv-bin bin/fluxkv --seconds 5 --keys 16 --size 1MiB
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

import fluxkv  # noqa: E402

MiB = 1 << 20


def parse_size(s: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?|B)?\s*", s, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r}")
    n, unit = float(m.group(1)), (m.group(2) or "B").upper()
    mult = {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit[0]]
    return int(n * mult)


class Server:
    def __init__(self, name: str, args: list[str], log: Path, ready_path: str):
        self.name = name
        self.args = args
        self.log_path = log
        self.ready_path = ready_path
        self.log = open(log, "wb")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.p.returncode}: {self.log_path.read_text(errors='replace')[-2000:]}")
            if os.path.exists(self.ready_path):
                return
            time.sleep(0.02)
        raise RuntimeError(f"{self.name}: {self.ready_path} did not appear within {timeout} s")

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                print(f"warning: {self.name} ignored SIGTERM for 15 s; killing it", file=sys.stderr)
                self.p.kill()
                self.p.wait()
        self.log.close()
        return self.p.returncode


def timed_loop(fn, keys: list, seconds: float, warmup: float) -> dict:
    """Call fn(key) round-robin over keys: warmup, then a fixed window. Latency per call."""
    perf = time.perf_counter_ns
    end = time.monotonic() + warmup
    i = 0
    while time.monotonic() < end:
        fn(keys[i % len(keys)])
        i += 1
    lat: list[int] = []
    append = lat.append
    nkeys = len(keys)
    t_start = perf()
    t_end = t_start + int(seconds * 1e9)
    i = 0
    now = t_start
    while now < t_end:
        t0 = now
        fn(keys[i % nkeys])
        now = perf()
        append(now - t0)
        i += 1
    return latency_summary(lat, now - t_start)


def latency_summary(lat: list[int], elapsed_ns: int) -> dict:
    """Rate and latency figures of calls whose latencies (ns) are lat, over elapsed_ns."""
    lat.sort()
    elapsed = elapsed_ns / 1e9
    return {
        "gets": len(lat),
        "seconds": elapsed,
        "gets_per_s": len(lat) / elapsed,
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e3,
        "mean_us": statistics.fmean(lat) / 1e3,
    }


_OVERWRITER = r"""
import sys
import fluxkv
with fluxkv.connect(sys.argv[1]) as c:
    c.put(sys.argv[2], bytes.fromhex(sys.argv[3]) * (int(sys.argv[4]) // 4))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"), help="fluxkv binary (built with go build when missing)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured window per backend")
    ap.add_argument("--warmup", type=float, default=0.5, help="warmup per backend")
    ap.add_argument("--keys", type=int, default=16, help="distinct keys, all memory hits")
    ap.add_argument("--size", type=parse_size, default=MiB, help="value size (default 1MiB)")
    ap.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    ap.add_argument("--require-goals", action="store_true", help="exit 1 when a goal ratio is missed")
    args = ap.parse_args()
    if args.size % 4:
        ap.error("--size must be a multiple of 4")

    tmp = Path(tempfile.mkdtemp(prefix="fkv-bench-", dir="/tmp"))
    servers: list[Server] = []
    failures: list[str] = []
    results: dict[str, dict] = {}
    try:
        binary = args.fluxkv_bin
        if not os.access(binary, os.X_OK):
            binary = str(tmp / "fluxkv")
            print(f"building {binary} (go build ./cmd/fluxkv)", flush=True)
            subprocess.run(["go", "build", "-o", binary, "./cmd/fluxkv"], cwd=REPO, check=True)
        data_bytes = args.keys * args.size
        dram_mib = max(64, (4 * data_bytes) // MiB + 16)
        node = tmp / "node"
        node.mkdir()
        fsock = str(node / "fluxkv.sock")
        msock = str(tmp / "memcached.sock")
        rsock = str(tmp / "redis.sock")
        servers.append(Server("fluxkv", [binary, "up", "--dir", str(node), "--dram", f"{dram_mib}MiB"], tmp / "fluxkv.log", fsock))
        servers.append(
            Server(
                "memcached",
                ["memcached", "-s", msock, "-a", "0700", "-m", str(dram_mib), "-I", f"{max(2, 2 * args.size // MiB)}m", "-u", "root"],
                tmp / "memcached.log",
                msock,
            )
        )
        servers.append(
            Server(
                "redis",
                ["redis-server", "--port", "0", "--unixsocket", rsock, "--unixsocketperm", "700", "--save", "",
                 "--appendonly", "no", "--maxmemory", f"{dram_mib}mb", "--dir", str(tmp)],
                tmp / "redis.log",
                rsock,
            )
        )
        for s in servers:
            s.wait_ready()

        import numpy as np
        import redis
        from pymemcache.client.base import Client as MemcacheClient

        keys = [f"bench/{i}" for i in range(args.keys)]
        values = {k: np.random.default_rng(i).integers(0, 256, args.size, dtype=np.uint8).tobytes() for i, k in enumerate(keys)}

        # -- fluxkv --------------------------------------------------------------------------------
        c = fluxkv.connect(fsock)
        for k in keys:
            c.put(k, values[k])
        st = c.stat()
        base_used = next(m for m in st["members"] if m["node_id"] == st["node_id"])["memory_segment"]["used_bytes"]
        base_holders = st["client_holders"]
        for k in keys:  # every key is a memory hit, byte exact
            with c.get(k) as h:
                if h.source != "memory" or h.bytes() != values[k]:
                    failures.append(f"fluxkv: {k} is not a byte-exact memory hit")

        def fk_holder(k):
            c.get(k).release()

        def fk_bytes(k):
            with c.get(k) as h:
                return h.bytes()

        results["fluxkv-holder"] = timed_loop(fk_holder, keys, args.seconds, args.warmup)
        results["fluxkv-bytes"] = timed_loop(fk_bytes, keys, args.seconds, args.warmup)
        st = c.stat()
        used = next(m for m in st["members"] if m["node_id"] == st["node_id"])["memory_segment"]["used_bytes"]
        if used != base_used or st["client_holders"] != base_holders:
            failures.append(
                f"fluxkv: after the loops used={used} holders={st['client_holders']}, baseline used={base_used} holders={base_holders}"
            )
        if c.release_errors:
            failures.append(f"fluxkv: {c.release_errors} release acks refused")
        # an overwrite by another process is visible to the very next get
        k0 = keys[0]
        held = c.get(k0)  # a live holder of the old version must not hide the new one
        r = subprocess.run(
            [sys.executable, "-c", _OVERWRITER, fsock, k0, "f1a2b3c4", str(args.size)],
            env={**os.environ, "PYTHONPATH": str(REPO / "clients" / "python")},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode != 0:
            failures.append(f"overwrite process failed: {r.stderr.strip()[-500:]}")
        else:
            with c.get(k0) as h:
                if h.bytes() != bytes.fromhex("f1a2b3c4") * (args.size // 4):
                    failures.append("fluxkv: the overwrite made by another process is not visible to the next get")
            if held.bytes() != values[k0]:
                failures.append("fluxkv: a holder of the old version changed under the overwrite")
        held.release()
        c.close()

        # -- memcached -------------------------------------------------------------------------------
        mc = MemcacheClient(msock, default_noreply=False)
        for k in keys:
            if not mc.set(k, values[k]):
                failures.append(f"memcached: set {k} failed")
        for k in keys:
            if mc.get(k) != values[k]:
                failures.append(f"memcached: {k} is not a byte-exact hit")
        results["memcached"] = timed_loop(mc.get, keys, args.seconds, args.warmup)
        mc.close()

        # -- redis -----------------------------------------------------------------------------------
        rc = redis.Redis(unix_socket_path=rsock)
        for k in keys:
            rc.set(k, values[k])
        for k in keys:
            if rc.get(k) != values[k]:
                failures.append(f"redis: {k} is not a byte-exact hit")
        results["redis"] = timed_loop(rc.get, keys, args.seconds, args.warmup)
        rc.close()
    finally:
        for s in reversed(servers):
            rc_ = s.stop()
            if s.name == "fluxkv" and rc_ != 0:
                failures.append(f"fluxkv did not stop cleanly on SIGTERM (status {rc_})")
        shutil.rmtree(tmp, ignore_errors=True)

    base = results["memcached"]["gets_per_s"]
    print(f"\n1 value of {args.size} bytes x {args.keys} keys, {args.seconds:g} s per backend, single thread, Unix sockets")
    print(f"{'backend':<15}{'gets/s':>10}{'p50 us':>10}{'p99 us':>10}{'GiB/s':>9}{'vs memcached':>14}")
    for name, r in results.items():
        gib = r["gets_per_s"] * args.size / (1 << 30)
        r["gib_per_s"] = gib
        r["vs_memcached"] = r["gets_per_s"] / base
        print(f"{name:<15}{r['gets_per_s']:>10.0f}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}{gib:>9.2f}{r['vs_memcached']:>13.2f}x")
    goals = {"fluxkv-holder": 10.0, "fluxkv-bytes": 3.0}
    missed = []
    for name, want in goals.items():
        got = results[name]["vs_memcached"]
        ok = got >= want
        print(f"goal {name} >= {want:g}x memcached: {got:.2f}x {'met' if ok else 'MISSED'}")
        if not ok:
            missed.append(name)
    for f in failures:
        print("CHECK FAILED:", f)
    if not failures:
        print("checks: byte-exact hits, used bytes and holders back to baseline, cross-process overwrite visible: ok")
    if args.json:
        print(json.dumps({"size": args.size, "keys": args.keys, "seconds": args.seconds, "results": results,
                          "failures": failures, "goals_missed": missed}))
    return 1 if failures or (args.require_goals and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
