#!/usr/bin/python3
"""Batches at the cost of one call: the batch calls an inference engine makes, from Python.

Issue 26 item 6. One run starts a master (--no-promotion, /metrics) and two owners on loopback:
A (--dram, SSD under --work-dir) and B (--cache-grace off, so every get of A's values through B is
a pull), and a third owner C alone with a master of its own, all authenticated with a fresh cluster
secret; then measures, each beside its baseline in the same run:

  exists      batch_exists of 64 keys vs of 1 key through B (keys held by A: a master trip),
              medians of --rounds calls each (goal: <= 3x)
  prefix      batch_exists(prefix=True) of 64 keys vs of 1 key (goal: <= 3x, as exists)
  remote-mem  batch_get of --pages x --page-size held by A, through B, vs the TCP pair moving
              the same bytes one page per round trip, its sender a child process as A
              is another process (bench/remoteget -tcp-pair -child-pair, one connection;
              goal: >= 0.7x); printed for reference: the same pair in one process (on a
              few cores its two goroutines share a core's cache: about twice as fast), and
              the two-process pair moving a whole batch's bytes per round trip (the batch
              get's one call: a stricter baseline than the goal's)
  remote-ssd  the same batch of pages that live only on A's SSD, through B (A stages each page
              in its memory, B pulls it) vs through A (a local refill) (goal: >= 0.7x), with the
              CPU each process spent per batch
With --alternate N each of the last two rows alternates its window and its baseline's N
times and is the median round's (a machine whose speed drifts between windows). With
--host-cpus C (root, a cgroup cpu controller) those two rows run on emulated hosts
(tracebench.hosts): the master, A and B are each a CPU cgroup of C CPUs, as three machines
would be; this client goes with the owner it calls (B, or A for the local refill), the TCP
pair's sender with A and its receiver with B. Without it every process shares this
machine's cores, and a remote row pays both owners' CPU out of the one budget.
  batch-put   batch_put of --put-keys values of 16 bytes in batches of 2,000 through one owner of
              its own standalone master (the issue's set-up; its figure before: 3,711 keys/s;
              goal: >= 10x)
  one-flight  64 threads get one cold key at once through an owner that does not hold it: the
              master's GetStart and BatchGetStart calls and the owner's pulls, counted from
              /metrics. Through owner D of master 2 (promotion on, as deployed; goal: 1 and 1),
              then through B (this bench's --no-promotion: printed for information, as a pull
              that is no replica answers only the gets that came while it was out: one_flight)

Every page is compared byte for byte once before the timed calls; in them, each page's length
and where it came from (memory or SSD, of A or of the owner called) are checked. Prints a table and, with --json, one JSON line per
row. Every daemon is stopped at the end, also on Ctrl-C or an error.

  make build
  /usr/bin/python3 bench/batch_bench.py
  /usr/bin/python3 bench/batch_bench.py --pages 256 --page-size 64KiB --put-keys 1000000 --dram 4GiB
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "bench"))

import fluxkv  # noqa: E402
from pressure.procs import Group, progress, run_group, cluster_auth, free_port, install_signal_handlers, unix_socket_ready, wait_for  # noqa: E402
from pressure.sizes import format_size, parse_size  # noqa: E402
from tracebench import hosts  # noqa: E402
from tracebench.cpu import tree_cpu_s, tree_pids  # noqa: E402

MiB = 1 << 20



def value(key: str, n: int) -> bytes:
    """A value that is a pure function of key and length."""
    seed = (key.encode() * (1 + 64 // max(1, len(key))))[:64]
    return (seed * (n // len(seed) + 1))[:n]


def one_flight(putter, sock: str, master_metrics: str, owner_metrics: str, errs: list) -> tuple[float, float]:
    """64 threads of a client of sock get one 1 MiB key putter put (held by another owner) at
    once: (the master's GetStart and BatchGetStart calls, the owner's pulls) it took, from
    /metrics. With promotion on, the first get's pull becomes the key's replica on that owner
    and every other get is answered from it (the gets that came while it was out queue for
    one flight behind it, which finds the replica). With promotion off the pull is no
    replica: only the gets that came before its plan was sent share it, the ones that came
    while it was out share one more, and each later one (Python's threads leave over
    milliseconds) pulls again."""
    key, vsize = "cold/1", 1 * MiB
    want = value(key, vsize)
    putter.put(key, want)
    plans0 = scrape(master_metrics, "fluxkv_ops_total", {"op": "GetStart"}) + scrape(master_metrics, "fluxkv_ops_total", {"op": "BatchGetStart"})
    pulled0 = scrape(owner_metrics, "fluxkv_transfer_bytes_total", {"dir": "pull"})
    # A client of its own whose pool keeps 64 connections, opened by a round of exists
    # calls first: the gets then leave at once instead of one connection (and one owner
    # accept) after another. Their bytes are checked once every get answered: 64 checks
    # of 1 MiB under the GIL would hold back the gets still to leave.
    with fluxkv.connect(sock, max_idle_connections=64) as cf:
        def together(call):
            barrier = threading.Barrier(64)

            def one():
                barrier.wait()
                try:
                    call()
                except Exception as e:  # noqa: BLE001
                    errs.append(repr(e))
            ts = [threading.Thread(target=one) for _ in range(64)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        together(lambda: time.sleep(0.05) or cf.batch_exists(["warm"]))
        held: list = []
        together(lambda: held.append(cf.get(key)))
        for h in held:
            if h.bytes() != want:
                errs.append("wrong bytes")
            h.release()
    plans = scrape(master_metrics, "fluxkv_ops_total", {"op": "GetStart"}) + scrape(master_metrics, "fluxkv_ops_total", {"op": "BatchGetStart"}) - plans0
    pulls = (scrape(owner_metrics, "fluxkv_transfer_bytes_total", {"dir": "pull"}) - pulled0) / vsize
    return plans, pulls


def scrape(addr: str, name: str, labels: dict[str, str]) -> float:
    """Sums the samples of metric name at addr whose labels include labels."""
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, v = line.rpartition(" ")
        if all(f'{k}="{val}"' in head for k, val in labels.items()):
            total += float(v)
    return total


def median_us(fn, rounds: int) -> float:
    fn()  # warm
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def timed_gib(fn, nbytes: int, seconds: float) -> float:
    """Repeats fn (moving nbytes each time) for seconds; GiB/s."""
    return timed_calls(fn, nbytes, seconds)[0]


def timed_calls(fn, nbytes: int, seconds: float, pids: dict[str, int] | None = None) -> tuple[float, dict[str, float]]:
    """Repeats fn (moving nbytes each time) for seconds: GiB/s, and the CPU milliseconds
    per call of each process of pids (name -> pid) and of this one ("client")."""
    fn()
    pids = pids or {}
    before = {name: tree_cpu_s([pid]) for name, pid in pids.items()}
    t = os.times()
    own = t.user + t.system
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    gib = n * nbytes / (time.perf_counter() - t0) / (1 << 30)
    t = os.times()
    cpu = {"client": (t.user + t.system - own) * 1e3 / n}
    for name, pid in pids.items():
        after = tree_cpu_s([pid])
        if after is not None and before[name] is not None:
            cpu[name] = (after - before[name]) * 1e3 / n
    return gib, cpu


def median_round(rounds: list[dict]) -> dict:
    """The round of median ratio, with every round's ratio (round_ratios)."""
    mid = sorted(rounds, key=lambda r: r["ratio"])[len(rounds) // 2]
    return {**mid, "round_ratios": [r["ratio"] for r in rounds]}


def batch_reader(c, keys: list[str], size: int, source: str, remote: bool):
    """A timed batch get of keys, each of size bytes, that each came from source ("memory",
    "ssd") of an owner other than c's (remote) or of c's own: a row whose pages moved (a
    refill that left them in memory, a get served without a pull) fails instead of timing
    another path. The bytes are checked once before the timed calls (verify)."""
    def read():
        hs = c.batch_get(keys)
        try:
            for k, h in zip(keys, hs):
                if h is None:
                    raise RuntimeError(f"batch get: {k} missing")
                if len(h) != size:
                    raise RuntimeError(f"batch get: {k} has {len(h)} bytes, want {size}")
                if h.source != source or h.remote != remote:
                    raise RuntimeError(f"batch get: {k} came from {'another owner' if h.remote else 'this owner'}'s {h.source}, "
                                       f"want {'another owner' if remote else 'this owner'}'s {source}")
        finally:
            for h in hs:
                if h is not None:
                    h.release()
    return read


def verify(c, keys: list[str], size: int) -> None:
    hs = c.batch_get(keys)
    try:
        for k, h in zip(keys, hs):
            if h is None or h.bytes() != value(k, size):
                raise RuntimeError(f"batch get of {k}: wrong bytes")
    finally:
        for h in hs:
            if h is not None:
                h.release()


def tcp_pair(rg: Path, size: int, seconds: float, child: bool = True, hs: hosts.Hosts | None = None) -> float:
    """The TCP pair's GiB/s; with hs (and child) its receiver runs on hostB and its sender,
    the child it starts, on hostA, placed within its 0.5 s warm-up."""
    p = subprocess.Popen([str(rg), "-tcp-pair", *(["-child-pair"] if child else []), "-size", str(size), "-conc", "1",
                          "-duration", f"{seconds}s", "-warmup", "0.5s"], stdout=subprocess.PIPE, text=True)
    if hs is not None and child:
        hs.place("hostB", "tcp-pair receiver", [p.pid])
        deadline = time.monotonic() + 0.4
        while not (kids := tree_pids([p.pid]) - {p.pid}) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.005)
        if not kids:
            p.kill()
            p.wait()
            raise RuntimeError("the TCP pair's sender did not start within its warm-up: cannot place it on host A")
        hs.place("hostA", "tcp-pair sender", kids)
    out, _ = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"remoteget exited {p.returncode}: {out[-400:]}")
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)["gib_per_s"]
    raise RuntimeError(f"remoteget printed no JSON: {out[-400:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"), help="fluxkv binary (default bin/fluxkv: `make build`)")
    ap.add_argument("--go", default="go", help="go tool that builds bench/remoteget")
    ap.add_argument("--dram", type=parse_size, default=64 * MiB, help="each owner's DRAM")
    ap.add_argument("--pages", type=int, default=32, help="pages per batch get")
    ap.add_argument("--page-size", type=parse_size, default=64 << 10, help="page size")
    ap.add_argument("--put-keys", type=int, default=100_000, help="16-byte values for the batch-put row (batches of 2,000)")
    ap.add_argument("--rounds", type=int, default=31, help="calls per exists median")
    ap.add_argument("--seconds", type=float, default=3.0, help="measured window per throughput row")
    ap.add_argument("--alternate", type=int, default=1, help="remote-mem and remote-ssd: alternate the window and its baseline's this many times (the median round)")
    ap.add_argument("--host-cpus", type=float, default=0.0,
                    help="remote-mem and remote-ssd on emulated hosts of this many CPUs each: master, A, B (root; 0: off)")
    ap.add_argument("--work-dir", default=None, help="where the temp dir (sockets, logs, A's SSD ring) goes")
    ap.add_argument("--json", default=None, help="append one JSON line per row to this file")
    args = ap.parse_args()
    if not os.access(args.fluxkv_bin, os.X_OK):
        ap.error(f"{args.fluxkv_bin} is not executable: run `make build` or pass --fluxkv-bin")
    if args.host_cpus < 0:
        ap.error("--host-cpus must be 0 (off) or more")
    if args.host_cpus and (why := hosts.unavailable()):
        ap.error(f"--host-cpus: cannot emulate hosts here: {why}")
    if args.host_cpus and (why := hosts.oversubscribed(2, args.host_cpus)):
        print(f"warning: {why}", file=sys.stderr)
    install_signal_handlers()
    rows: list[dict] = []
    failures: list[str] = []
    def measure(g: Group) -> None:
        hs = hosts.Hosts(args.host_cpus) if args.host_cpus else None
        try:
            measure_on(g, hs)
        finally:
            if hs is not None:
                hs.close()  # this process, too, goes back to the root group

    def measure_on(g: Group, hs: hosts.Hosts | None) -> None:
        def on(host: str) -> None:
            """With emulated hosts, this client runs on host from now on."""
            if hs is not None:
                hs.place(host, "client", [os.getpid()])

        tmp = g.mkdtemp(args.work_dir, "fkv-batch-")
        rg = tmp / "remoteget"
        progress(f"building bench/remoteget -> {rg}")
        subprocess.run([args.go, "build", "-o", str(rg), "./bench/remoteget"], cwd=REPO, check=True)
        secret, mkey, mpub = cluster_auth(args.fluxkv_bin, tmp)
        maddr, mmetrics, bmetrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        common = ["--log-format", "text", "--log-level", "warn"]
        progress(f"starting master {maddr} (--no-promotion) and owners A (SSD), B (--cache-grace off), {format_size(args.dram)} DRAM each")
        pm = g.start("master", [args.fluxkv_bin, *common, "master", "--listen", maddr, "--no-promotion", "--metrics-addr", mmetrics,
                           "--cluster-secret-file", secret, "--master-key-file", mkey], tmp / "master.log")
        m2addr, m2metrics, dmetrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        g.start("master2", [args.fluxkv_bin, *common, "master", "--listen", m2addr, "--metrics-addr", m2metrics,
                            "--cluster-secret-file", secret, "--master-key-file", mkey], tmp / "master2.log")
        ssd_dir = tmp / "a-ssd"
        ssd_dir.mkdir()
        socks, pids = {}, {"master": pm.p.pid}
        for name, extra in (("a", ["--ssd-path", str(ssd_dir), "--ssd-limit", format_size(4 * args.dram).replace(" ", "")]),
                            ("b", ["--cache-grace", "off", "--metrics-addr", bmetrics]), ("c", [])):
            d = tmp / name
            d.mkdir()
            p = g.start(name, [args.fluxkv_bin, *common, "owner", "--dir", d, "--dram", str(args.dram), "--master", m2addr if name == "c" else maddr, "--node-id", name,
                               "--cluster-secret-file", secret, "--master-pubkey-file", mpub, *extra], tmp / f"{name}.log")
            socks[name], pids[name] = str(d / "fluxkv.sock"), p.p.pid
            wait_for(lambda s=socks[name]: unix_socket_ready(s), 60, f"owner {name}'s socket", p)

        with fluxkv.connect(socks["a"]) as ca, fluxkv.connect(socks["b"]) as cb:
            size, n = args.page_size, args.pages
            # Pages that end up on A's SSD only: put first, then 2x DRAM of filler through A.
            ssd_keys = [f"ssd/{i}" for i in range(n)]
            ca.batch_put([(k, value(k, size)) for k in ssd_keys])
            progress(f"pushing {n} pages out of A's memory (2x DRAM of filler)")
            filler = 1 * MiB
            for i in range(2 * args.dram // filler):
                ca.put(f"filler/{i}", value(f"filler/{i}", filler))
            mem_keys = [f"mem/{i}" for i in range(n)]
            ca.batch_put([(k, value(k, size)) for k in mem_keys])
            verify(cb, mem_keys, size)
            verify(cb, ssd_keys, size)
            verify(ca, ssd_keys, size)

            progress("exists: 64 keys vs 1, plain and prefix")
            keys64 = [f"exists/{i}" for i in range(64)]
            ca.batch_put([(k, value(k, 4096)) for k in keys64])
            e1 = median_us(lambda: cb.batch_exists(keys64[:1]), args.rounds)
            e64 = median_us(lambda: cb.batch_exists(keys64), args.rounds)
            p1 = median_us(lambda: cb.batch_exists(keys64[:1], prefix=True), args.rounds)
            p64 = median_us(lambda: cb.batch_exists(keys64, prefix=True), args.rounds)
            if cb.batch_exists(keys64, prefix=True) != 64:
                failures.append("prefix lookup of 64 present keys did not count 64")
            rows.append({"row": "exists", "one_us": e1, "batch_us": e64, "ratio": e64 / e1, "goal": "<= 3x"})
            rows.append({"row": "prefix", "one_us": p1, "batch_us": p64, "ratio": p64 / p1, "goal": "<= 3x"})

            batch_bytes = n * size
            if hs is not None:
                progress(f"emulated hosts of {args.host_cpus:g} CPUs: master, A, B")
                for name, host in (("master", "master"), ("a", "hostA"), ("b", "hostB")):
                    hs.place(host, name, tree_pids([pids[name]]))
            progress(f"remote-mem: batch_get of {n} x {format_size(size)} through B vs the TCP pair")
            on("hostB")
            tcp1 = tcp_pair(rg, size, args.seconds, child=False)
            # The pair asks for one page per round trip (the baseline); one batch's
            # bytes per round trip, as the batch get moves them, is printed beside it.
            tcp_batch = tcp_pair(rg, batch_bytes, args.seconds, hs=hs)
            rounds = []
            for _ in range(args.alternate):
                tcp = tcp_pair(rg, size, args.seconds, hs=hs)
                rm = timed_gib(batch_reader(cb, mem_keys, size, "memory", True), batch_bytes, args.seconds)
                rounds.append({"gib_per_s": rm, "baseline_gib_per_s": tcp, "ratio": rm / tcp})
            rows.append({"row": "remote-mem", **median_round(rounds), "goal": ">= 0.7x", "baseline": "tcp-pair c1, 2 procs",
                         "one_process_gib_per_s": tcp1, "batch_pair_gib_per_s": tcp_batch, "host_cpus": args.host_cpus})
            progress(f"remote-ssd: the same from A's SSD, through B vs through A")
            ssd_pids = {k: pids[k] for k in ("master", "a", "b")}
            rounds = []
            for _ in range(args.alternate):
                on("hostB")
                rs, rcpu = timed_calls(batch_reader(cb, ssd_keys, size, "ssd", True), batch_bytes, args.seconds, ssd_pids)
                on("hostA")
                ls, lcpu = timed_calls(batch_reader(ca, ssd_keys, size, "ssd", False), batch_bytes, args.seconds, ssd_pids)
                rounds.append({"gib_per_s": rs, "baseline_gib_per_s": ls, "ratio": rs / ls, "cpu_ms_per_batch": rcpu, "baseline_cpu_ms_per_batch": lcpu})
            rows.append({"row": "remote-ssd", **median_round(rounds), "goal": ">= 0.7x", "baseline": "local SSD (A)", "host_cpus": args.host_cpus})
            if hs is not None:
                hs.close()  # the rows below share the machine's cores again
                hs = None

            progress(f"batch-put: {args.put_keys} x 16 B in batches of 2,000 through C, alone with master 2")
            with fluxkv.connect(socks["c"]) as cc:
                t0 = time.perf_counter()
                for base in range(0, args.put_keys, 2000):
                    cc.batch_put([(f"small/{i}", b"%016d" % i) for i in range(base, min(base + 2000, args.put_keys))])
                kps = args.put_keys / (time.perf_counter() - t0)
                for i in (0, args.put_keys - 1):
                    with cc.get(f"small/{i}") as h:
                        if h.bytes() != b"%016d" % i:
                            failures.append(f"batch-put: small/{i} wrong bytes")
            rows.append({"row": "batch-put", "keys_per_s": kps, "baseline_keys_per_s": 3711, "ratio": kps / 3711, "goal": ">= 10x",
                         "baseline": "issue 26's figure (other run)"})

            # Owner D, of master 2 (promotion on, as deployed): started now, so that C put alone.
            d = tmp / "d"
            d.mkdir()
            p = g.start("d", [args.fluxkv_bin, *common, "owner", "--dir", d, "--dram", str(args.dram), "--master", m2addr, "--node-id", "d",
                              "--metrics-addr", dmetrics, "--cluster-secret-file", secret, "--master-pubkey-file", mpub], tmp / "d.log")
            socks["d"] = str(d / "fluxkv.sock")
            wait_for(lambda: unix_socket_ready(socks["d"]), 60, "owner d's socket", p)
            progress("one-flight: 64 threads get one cold key of C through D (promotion on), then of A through B (off)")
            with fluxkv.connect(socks["c"]) as cc:
                plans, pulls = one_flight(cc, socks["d"], m2metrics, dmetrics, errs := [])
            rows.append({"row": "one-flight", "gets": 64, "master_plans": plans, "pulls": pulls, "goal": "1 and 1"})
            plans, pulls = one_flight(ca, socks["b"], mmetrics, bmetrics, errs)
            rows.append({"row": "one-flight", "gets": 64, "master_plans": plans, "pulls": pulls, "goal": "info", "promotion": False})
            if errs:
                failures.append(f"one-flight: {len(errs)} gets failed: {errs[0]}")

    if not run_group(measure, failures, "daemons"):
        return 130

    print(f"\nbatches (issue 26): {args.pages} x {format_size(args.page_size)} pages, {format_size(args.dram)} DRAM per owner"
          + (f"; remote-mem and remote-ssd on emulated hosts of {args.host_cpus:g} CPUs each (master, A, B)" if args.host_cpus else ""))
    for r in rows:
        if "one_us" in r:
            print(f"  {r['row']:<11} 64 keys {r['batch_us']:9.0f} us   1 key {r['one_us']:7.0f} us   ratio {r['ratio']:5.2f}x   goal {r['goal']}")
        elif "gib_per_s" in r:
            print(f"  {r['row']:<11} {r['gib_per_s']:6.3f} GiB/s   {r['baseline']}: {r['baseline_gib_per_s']:6.3f} GiB/s   ratio {r['ratio']:5.2f}x   goal {r['goal']}")
            if "one_process_gib_per_s" in r:
                print(f"  {'':<11} (the pair in one process: {r['one_process_gib_per_s']:6.3f} GiB/s, ratio {r['gib_per_s'] / r['one_process_gib_per_s']:5.2f}x)")
            if "batch_pair_gib_per_s" in r:
                print(f"  {'':<11} (the pair moving a batch's {format_size(args.pages * args.page_size)} per round trip: "
                      f"{r['batch_pair_gib_per_s']:6.3f} GiB/s, ratio {r['gib_per_s'] / r['batch_pair_gib_per_s']:5.2f}x)")
            if len(r.get("round_ratios", [])) > 1:
                print(f"  {'':<11} (median of {len(r['round_ratios'])} rounds: {' '.join(f'{x:.2f}' for x in sorted(r['round_ratios']))})")
            if "cpu_ms_per_batch" in r:
                cpu = ", ".join(f"{k} {r['cpu_ms_per_batch'][k]:.2f}/{r['baseline_cpu_ms_per_batch'][k]:.2f}"
                                for k in ("master", "a", "b", "client") if k in r["cpu_ms_per_batch"] and k in r["baseline_cpu_ms_per_batch"])
                print(f"  {'':<11} (CPU ms per batch, remote/local: {cpu})")
        elif "keys_per_s" in r:
            print(f"  {r['row']:<11} {r['keys_per_s']:9.0f} keys/s   {r['baseline']}: {r['baseline_keys_per_s']} keys/s   ratio {r['ratio']:5.1f}x   goal {r['goal']}")
        else:
            promo = "promotion off" if r.get("promotion") is False else "promotion on"
            print(f"  {r['row']:<11} {r['gets']} gets ({promo}): {r['master_plans']:.0f} master plans, {r['pulls']:.1f} pulls   goal {r['goal']}")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps({**r, "pages": args.pages, "page_size": args.page_size, "dram": args.dram}) + "\n")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
