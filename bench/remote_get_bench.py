#!/usr/bin/python3
"""Remote gets (owner to owner over the data plane) from Go and Python, beside a plain TCP pair.

Issue 13 item 7. One run starts a master (--no-promotion) and two owners on loopback, A and B
(B with --cache-grace off), both authenticated with a fresh cluster secret; puts --keys values of
each --sizes size through A; then, for each size and each concurrency in --conc, measures:

  tcp-pair-child  the limit: a plain Go TCP sender/receiver pair over loopback moving the same
             bytes, the sender a child process as A is another process (bench/remoteget -tcp-pair
             -child-pair: an 8-byte request, that many bytes back into a reused buffer; one
             connection per goroutine)
  tcp-pair   the same pair in one process, for reference only: on a few cores a connection's two
             goroutines often share a core, whose cache holds the bytes between the two kernel
             copies (at c2 on a 2-core VM about twice what two processes move)
  go         get + release through B from Go (bench/remoteget, goroutines sharing one client)
  python     get + release through B from Python (the fluxkv package; threads sharing one client,
             or with --py-workers procs one process per worker, each with its own client)

Every get through B is of a value whose replica is on A: with promotion off and B's cache off,
each one is a pull over the data plane into B's segment (h.remote; counted, and a get that was not
remote is reported). A Python holder is a zero-copy view, so the payload is not copied into Python
objects; latency is get() + release(). Every --verify-every-th get of each worker (and its first)
is compared byte for byte, outside its timed latency (in the window's time): a wrong value is not
counted as a hit and makes the exit status 1. Values are a pure function of key and length
(splitmix64 keyed by the key's FNV-1a; bench/remoteget/value.go is the same).

It prints a table: GiB/s of hit payload, p50/p99 latency, and the ratio to the two-process TCP pair
at the same size and concurrency (issue goal: >= 0.7x at 16 MiB). Every daemon is stopped at the end, also on
Ctrl-C, SIGTERM or an error (and dies with the harness: parent-death signal).

  make build
  /usr/bin/python3 bench/remote_get_bench.py                      # 1 MiB and 16 MiB, c1 and c2, 5 s
  /usr/bin/python3 bench/remote_get_bench.py --sizes 1MiB,4MiB,16MiB --conc 1,2,4,8 --keys 16 \\
      --duration 20 --dram 2GiB --json out/remote_get.jsonl   # a bigger machine
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))
sys.path.insert(0, str(REPO / "bench"))

import fluxkv  # noqa: E402
from pressure.procs import Group, progress, run_group, cluster_auth, free_port, install_signal_handlers, unix_socket_ready, wait_for  # noqa: E402
from pressure.sizes import format_size, parse_size  # noqa: E402

MiB = 1 << 20



# -- values: the same function as bench/remoteget/value.go -----------------------------------------

_M64 = (1 << 64) - 1


def _fnv1a(key: str) -> int:
    h = 14695981039346656037
    for b in key.encode():
        h = ((h ^ b) * 1099511628211) & _M64
    return h


def value(key: str, n: int) -> bytes:
    import numpy as np

    z = np.arange(1, (n + 7) // 8 + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(_fnv1a(key))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z.astype("<u8").tobytes()[:n]


def key_prefix(size: int) -> str:
    return f"rg/{size}/"


def keys_of(size: int, n: int) -> list[str]:
    return [f"{key_prefix(size)}{i}" for i in range(n)]


# -- the Python client loop ----------------------------------------------------------------------


def py_gets(socket: str, size: int, nkeys: int, threads: int, duration: float, warmup: float, verify_every: int,
            part: int = 0, parts: int = 1) -> dict:
    """``threads`` threads sharing one client loop get + release over the keys of ``size``: a
    warmup, then a window of ``duration`` s. Returns counts and the window's latencies (ns).
    With ``parts`` > 1 this is process ``part`` of that many, and takes its share of the keys."""
    keys = keys_of(size, nkeys)
    want = [value(k, size) for k in keys]
    state = {"measuring": False, "stop": False}
    lats: list[list[int]] = [[] for _ in range(threads)]
    counts = {"total": 0, "remote": 0, "verified": 0, "wrong": 0, "errors": 0}
    first_error: list[str] = []
    lock = threading.Lock()
    perf = time.perf_counter_ns
    client = fluxkv.connect(socket)

    def worker(g: int) -> None:
        mine = lats[g]
        total = remote = verified = wrong = errors = 0
        i = 0
        # Each worker has its own keys: two concurrent gets of one key would share the first
        # one's holding on the owner (a local hit, not a pull).
        ks = list(range(part * threads + g, nkeys, threads * parts))
        while not state["stop"]:
            k = ks[i % len(ks)]
            inside = state["measuring"]
            t0 = perf()
            try:
                h = client.get(keys[k])
            except fluxkv.Error as e:  # counted, never a hit
                errors += 1
                if not first_error:
                    first_error.append(repr(e))
                if errors > 100:
                    break
                i += 1
                continue
            d = perf() - t0
            total += 1
            remote += h.remote
            if i == 0 or (verify_every > 0 and i % verify_every == 0):
                verified += 1
                if h.bytes() != want[k]:
                    wrong += 1
                    if not first_error:
                        first_error.append(f"WRONG BYTES: get {keys[k]} ({len(h)} B) is not the value put")
            t1 = perf()
            h.release()
            d += perf() - t1
            if inside and state["measuring"]:
                mine.append(d)
            i += 1
        with lock:
            for name, v in (("total", total), ("remote", remote), ("verified", verified), ("wrong", wrong), ("errors", errors)):
                counts[name] += v

    ts = [threading.Thread(target=worker, args=(g,), daemon=True) for g in range(threads)]
    try:
        for t in ts:
            t.start()
        time.sleep(warmup)
        t_start = time.monotonic()
        state["measuring"] = True
        time.sleep(duration)
        state["measuring"] = False
        seconds = time.monotonic() - t_start
    finally:
        state["stop"] = True
        for t in ts:
            t.join()
        client.close()
    lat = sorted(x for lst in lats for x in lst)
    return {**counts, "seconds": seconds, "lat_ns": lat, "first_error": first_error[0] if first_error else ""}


def summarize(mode: str, size: int, conc: int, r: dict) -> dict:
    lat = r.pop("lat_ns")
    ops = len(lat)
    out = {"mode": mode, "size": size, "conc": conc, "ops": ops, **r}
    out["gib_per_s"] = ops * size / r["seconds"] / (1 << 30)
    out["p50_us"] = lat[ops // 2] / 1e3 if ops else 0.0
    out["p99_us"] = lat[min(ops - 1, ops * 99 // 100)] / 1e3 if ops else 0.0
    return out


def py_worker_main(argv: list[str]) -> int:
    """``--py-worker JSON``: one Python worker process (``--py-workers procs``); prints its result."""
    a = json.loads(argv[0])
    r = py_gets(a["socket"], a["size"], a["keys"], 1, a["duration"], a["warmup"], a["verify_every"], a["part"], a["parts"])
    print(json.dumps(r))
    return 0


# -- the harness ---------------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--py-worker":
        return py_worker_main(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--fluxkv-bin", default=str(REPO / "bin" / "fluxkv"), help="fluxkv binary (default bin/fluxkv: `make build`)")
    ap.add_argument("--go", default="go", help="go tool that builds bench/remoteget")
    ap.add_argument("--sizes", default="1MiB,16MiB", help="comma-separated value sizes (e.g. 1MiB,1MiB-128,16MiB)")
    ap.add_argument("--conc", default="1,2", help="comma-separated concurrencies (goroutines / threads / processes)")
    ap.add_argument("--keys", type=int, default=None, help="values of each size (default: max(4, largest --conc)); each worker rotates over its own share, so at least the largest --conc")
    ap.add_argument("--duration", type=float, default=5.0, help="measured window per case, seconds")
    ap.add_argument("--warmup", type=float, default=1.0, help="warmup per case, seconds")
    ap.add_argument("--dram", type=parse_size, default=None,
                    help="each owner's DRAM (default: room for every value on A with 25%% slack plus the targets of the largest concurrency)")
    ap.add_argument("--clients", default="go,python", help="which clients to measure: go, python")
    ap.add_argument("--py-workers", choices=("threads", "procs"), default="threads",
                    help="Python concurrency: threads sharing one client (the GIL is released while a get waits on its socket), or one process per worker")
    ap.add_argument("--verify-every", type=int, default=16, help="compare every Nth get of each worker (and its first) byte for byte")
    ap.add_argument("--work-dir", default=None, help="where the temp dir (sockets, logs) goes (default: the system temp dir)")
    ap.add_argument("--json", default=None, help="append one JSON line per measured case to this file")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    concs = [int(c) for c in args.conc.split(",") if c.strip()]
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    if not sizes or not concs or min(concs) < 1 or set(clients) - {"go", "python"}:
        ap.error("need sizes, concurrencies >= 1 and clients among go,python")
    args.keys = args.keys or max(4, max(concs))
    if args.keys < max(concs):
        ap.error("--keys must be at least the largest --conc (each worker gets its own keys)")
    if not os.access(args.fluxkv_bin, os.X_OK):
        ap.error(f"{args.fluxkv_bin} is not executable: run `make build` or pass --fluxkv-bin")
    dram = args.dram or max(64 * MiB, (args.keys * sum(sizes) * 5 // 4 + max(concs) * max(sizes) + MiB - 1) // MiB * MiB)

    install_signal_handlers()
    rows: list[dict] = []
    failures: list[str] = []
    def measure(g: Group) -> None:
        tmp = g.mkdtemp(args.work_dir, "fkv-remote-get-")
        rg = tmp / "remoteget"
        progress(f"building bench/remoteget -> {rg}")
        subprocess.run([args.go, "build", "-o", str(rg), "./bench/remoteget"], cwd=REPO, check=True)

        secret, mkey, mpub = cluster_auth(args.fluxkv_bin, tmp)
        maddr = f"127.0.0.1:{free_port()}"
        progress(f"starting master {maddr} (--no-promotion) and owners A, B ({format_size(dram)} DRAM each; B --cache-grace off)")
        common = ["--log-format", "text", "--log-level", "warn"]
        master = g.start("master", [args.fluxkv_bin, *common, "master", "--listen", maddr, "--no-promotion",
                                    "--cluster-secret-file", secret, "--master-key-file", mkey], tmp / "master.log")
        owners = {}
        for name, extra in (("a", []), ("b", ["--cache-grace", "off"])):
            d = tmp / name
            d.mkdir()
            owners[name] = g.start(name, [args.fluxkv_bin, *common, "owner", "--dir", d, "--dram", str(dram), "--master", maddr,
                                          "--node-id", name, "--cluster-secret-file", secret, "--master-pubkey-file", mpub, *extra],
                                         tmp / f"{name}.log")
        for name, p in owners.items():
            wait_for(lambda: unix_socket_ready(str(tmp / name / "fluxkv.sock")), 60, f"owner {name}'s socket", p)
        sock_a, sock_b = str(tmp / "a" / "fluxkv.sock"), str(tmp / "b" / "fluxkv.sock")
        wait_for(master.alive, 1, "master alive", master)

        with fluxkv.connect(sock_a) as ca, fluxkv.connect(sock_b) as cb:
            for size in sizes:
                progress(f"putting {args.keys} x {format_size(size)} through A")
                for k in keys_of(size, args.keys):
                    ca.put(k, value(k, size))
                k = keys_of(size, 1)[0]
                with cb.get(k) as h:  # a first remote get, checked whole
                    if not h.remote or h.bytes() != value(k, size):
                        raise RuntimeError(f"get {k} through B: remote={h.remote}, byte-exact={h.bytes() == value(k, size)}")

        for size in sizes:
            for conc in concs:
                label = f"{format_size(size)} c{conc}"
                progress(f"{label}: tcp-pair (two processes, then one)")
                rows.append(run_go(rg, ["-tcp-pair", "-child-pair"], size, conc, args))
                rows.append(run_go(rg, ["-tcp-pair"], size, conc, args))
                if "go" in clients:
                    progress(f"{label}: go (goroutines)")
                    rows.append(run_go(rg, ["-socket", sock_b, "-prefix", key_prefix(size), "-keys", str(args.keys),
                                            "-verify-every", str(args.verify_every)], size, conc, args))
                if "python" in clients:
                    progress(f"{label}: python ({args.py_workers})")
                    rows.append(run_python(sock_b, size, conc, args, g, tmp))
                for r in rows[-(2 + len(clients)):]:
                    progress(f"{label}: {r['mode']:<14} {r['gib_per_s']:6.2f} GiB/s  p50 {r['p50_us'] / 1e3:7.2f} ms  p99 {r['p99_us'] / 1e3:7.2f} ms")

        for r in rows:
            if r.get("wrong"):
                failures.append(f"{r['mode']} {format_size(r['size'])} c{r['conc']}: {r['wrong']} gets with WRONG BYTES ({r.get('first_error')})")
            if r.get("errors"):
                failures.append(f"{r['mode']} {format_size(r['size'])} c{r['conc']}: {r['errors']} errors ({r.get('first_error')})")
            # A get may find the holding of the same key that a release still queued in
            # the client keeps held (B's hot set answers it without a pull): a few such
            # gets are reported, more than 1% fail the run (they would flatter the figure).
            local = r.get("total", 0) - r.get("remote", 0)
            if not r["mode"].startswith("tcp-pair") and local:
                msg = f"{r['mode']} {format_size(r['size'])} c{r['conc']}: {local} of {r['total']} gets were not remote"
                if local > r.get("total", 0) // 100:
                    failures.append(msg)
                else:
                    progress(msg + " (a held holding reused; under 1%)")
        with fluxkv.connect(sock_b) as cb:  # B holds nothing once every holder is released
            cb.flush()
            st = cb.stat()
            me = next(m for m in st["members"] if m["node_id"] == "b")
            if me["memory_segment"]["used_bytes"] or me["holders"]:
                failures.append(f"B not back to empty: used={me['memory_segment']['used_bytes']} holders={me['holders']}")

    if not run_group(measure, failures, "daemons"):
        print_table(rows, args)
        return 130

    print_table(rows, args)
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps({**r, "duration": args.duration, "keys": args.keys, "dram": dram, "py_workers": args.py_workers}) + "\n")
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


def run_go(rg: Path, extra: list[str], size: int, conc: int, args) -> dict:
    cmd = [str(rg), *extra, "-size", str(size), "-conc", str(conc), "-duration", f"{args.duration}s", "-warmup", f"{args.warmup}s"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + args.warmup + 120)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
    r = json.loads(lines[-1])
    r.setdefault("first_error", "")
    if p.returncode and not r.get("wrong"):
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
    return r


def run_python(sock: str, size: int, conc: int, args, g: Group, tmp: Path) -> dict:
    if args.py_workers == "threads":
        r = py_gets(sock, size, args.keys, conc, args.duration, args.warmup, args.verify_every)
        return summarize("python", size, conc, r)
    spec = {"socket": sock, "size": size, "keys": args.keys, "duration": args.duration, "warmup": args.warmup,
            "verify_every": args.verify_every, "parts": conc}
    outs = [tmp / f"py-{size}-{conc}-{i}.json" for i in range(conc)]
    files = [open(o, "wb") for o in outs]
    try:
        procs = [g.start(f"py-worker-{i}", [sys.executable, __file__, "--py-worker", json.dumps({**spec, "part": i})], tmp / f"py-{i}.log",
                         stdout=files[i], own_session=False) for i in range(conc)]
        for p in procs:
            p.p.wait(timeout=args.duration + args.warmup + 120)
    finally:
        for f in files:
            f.close()
    merged = {"total": 0, "remote": 0, "verified": 0, "wrong": 0, "errors": 0, "seconds": 0.0, "lat_ns": [], "first_error": ""}
    for p, o in zip(procs, outs):
        if p.p.returncode:
            raise RuntimeError(f"python worker exited {p.p.returncode}: {p.log_tail()}")
        r = json.loads(o.read_text())
        for n in ("total", "remote", "verified", "wrong", "errors"):
            merged[n] += r[n]
        merged["seconds"] = max(merged["seconds"], r["seconds"])
        merged["lat_ns"] += r["lat_ns"]
        merged["first_error"] = merged["first_error"] or r["first_error"]
    merged["lat_ns"].sort()
    return summarize("python-procs", size, conc, merged)


def print_table(rows: list[dict], args) -> None:
    if not rows:
        return
    tcp = {(r["size"], r["conc"]): r["gib_per_s"] for r in rows if r["mode"] == "tcp-pair-child"}
    print()
    print(f"remote gets through owner B of values on owner A (loopback; {args.duration:g} s windows, {args.keys} keys per size)")
    print(f"{'size':>10} {'c':>3} {'client':<14} {'GiB/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'x tcp':>6} {'ops':>7} {'remote':>7} {'verified':>8}")
    for r in rows:
        base = tcp.get((r["size"], r["conc"]))
        ratio = f"{r['gib_per_s'] / base:6.2f}" if base else "     -"
        pair = r["mode"].startswith("tcp-pair")
        remote = "" if pair else f"{r['remote']}/{r['total']}"
        verified = "" if pair else str(r["verified"])
        print(f"{format_size(r['size']):>10} {r['conc']:>3} {r['mode']:<14} {r['gib_per_s']:7.2f} {r['p50_us'] / 1e3:8.2f} {r['p99_us'] / 1e3:8.2f} {ratio} {r['ops']:>7} {remote:>7} {verified:>8}")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
