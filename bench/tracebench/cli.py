"""``python3 -m tracebench``: replay a trace through fluxkv.kv and peer caches, beside offline
simulations on the same requests; writes OUT/summary.jsonl and OUT/trace.png and prints a table.

    PYTHONPATH=bench python3 -m tracebench --preset quick --out out/bench-trace
    PYTHONPATH=bench python3 -m tracebench --trace my.jsonl --capacity 0.05,0.1,8000b --backends fluxkv --ssd off
    PYTHONPATH=bench python3 -m tracebench --backends none --requests 0        # the simulations alone
    PYTHONPATH=bench python3 -m tracebench chart OUT/summary.jsonl -o OUT/trace.png

Capacities (``--capacity``, comma-separated): a fraction of the trace's distinct blocks (0.10),
a block count (4000b) or a size (2GiB: that many bytes of blocks). Every backend gets the
cache memory of that many blocks (see tracebench/backends.py for how sizes are given and read
back). Exit status: 0 when every case that ran was correct, 1 when one failed (wrong bytes,
a server that stopped), 130 when interrupted. Failed puts and calls that answered errors (fluxkv
and Mooncake answer them as misses) do not fail a case: the table and the goal lines name them
next to the row's figures.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pressure.procs import Interrupted, install_signal_handlers, progress, run_group
from pressure.sizes import approx_size, parse_size

from . import backends as tb
from . import chart, cpu, goals, hosts, report, route, sim
from .presets import MODELS, PRESETS, describe_block
from .replay import ReplayConfig, replay
from .trace import DEFAULT_TRACE, load

__all__ = ["main", "parse_capacity", "targets"]

_BLOCKS = re.compile(r"^\s*(\d+)\s*(b|blocks?)\s*$", re.I)


def parse_capacity(item: str, distinct: int, block_bytes: int) -> int:
    """Blocks for one ``--capacity`` item: a fraction of ``distinct`` (0.1), blocks (4000b) or a size (2GiB)."""
    m = _BLOCKS.match(item)
    if m:
        n = int(m.group(1))
    else:
        try:
            frac = float(item)
        except ValueError:
            frac = None
        if frac is not None:
            if not 0 < frac <= 10:
                raise ValueError(f"capacity {item!r}: a fraction of the distinct blocks is in (0, 10]; blocks are written 4000b")
            n = int(frac * distinct)
        else:
            try:
                n = parse_size(item) // block_bytes
            except ValueError:
                raise ValueError(f"capacity {item!r}: want a fraction of the distinct blocks (0.1), blocks (4000b) or a size (2GiB)") from None
    if n < 2:
        raise ValueError(f"capacity {item!r} is {n} blocks: at least 2 are needed")
    return n


def _list(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip() and x.strip() != "none"]


def targets(backends: list, owners: list, ssd: list) -> list:
    """Every (backend, owners, SSD) to replay: owners apply to fluxkv, the others run one server."""
    out = []
    for b in backends:
        if b not in tb.NAMES:
            raise ValueError(f"unknown backend {b!r}: want {', '.join(tb.NAMES)}")
        for n in (owners if b == "fluxkv" else [1]):
            for s in ssd:
                out.append(tb.Target(b, n, s))
    return out


def _ssd_states(text: str) -> list:
    states = {"off": False, "on": True}
    bad = [x for x in _list(text) if x not in states]
    if bad:
        raise ValueError(f"--ssd takes off and/or on, not {bad}")
    return [states[x] for x in _list(text)]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tracebench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="quick", help="sizes and cases (default quick); flags override")
    ap.add_argument("--trace", default=str(DEFAULT_TRACE), help="a trace file of the Mooncake format (default: the conversation trace)")
    ap.add_argument("--requests", type=int, help="replay the first N requests (0: all; quick 3000, full all)")
    ap.add_argument("--block-bytes", type=parse_size, help="bytes of one 512-token block (quick 64KiB, full 28MiB)")
    ap.add_argument("--model", choices=sorted(MODELS), help="block bytes of this model (unless --block-bytes is given)")
    ap.add_argument("--capacity", help="comma-separated capacities: 0.10 (of distinct blocks), 4000b, 2GiB (default 0.10,4000b)")
    ap.add_argument("--backends", help=f"comma-separated, of {','.join(tb.NAMES)}; none: simulations only")
    ap.add_argument("--owners", help="fluxkv owners per case, comma-separated (1: fluxkv up; N: a master and N owners)")
    ap.add_argument("--ssd", help="off,on: SSD states to run (a backend without flash reports SSD on unavailable)")
    ap.add_argument("--ssd-ratio", type=float, default=5.0, help="flash = this x the DRAM of the capacity (default 5)")
    ap.add_argument("--procs", type=int, help="client processes (quick 2, full 8)")
    ap.add_argument("--window", type=int, help="requests in flight, in arrival order (default --procs; 1: one after another; 0: unordered)")
    ap.add_argument("--route", choices=route.ROUTES, default="rr",
                    help="which process serves a request: rr (request i by process i mod --procs) or prefix (the process "
                         "that served the longest prefix of its blocks, as a cache-aware router; default rr)")
    ap.add_argument("--speed", type=float, default=0.0, help="honour timestamps at this speed factor (2 = twice as fast); 0: as fast as possible")
    ap.add_argument("--verify-every", type=int, default=8, help="check every n-th page loaded byte for byte (default 8)")
    ap.add_argument("--byte-access", choices=("per-key", "batch"), default="per-key",
                    help="Redis and memcached: one get per page until the first miss and one put per page (default), "
                         "or one multi-get and one pipelined multi-put per chunk of a request's pages")
    ap.add_argument("--pin-ms", type=int, default=1000, help="fluxkv: how long contains_prefix pins what it found (PageStore pin_ms)")
    ap.add_argument("--buffer-bytes", type=parse_size, default=1 << 30, help="page buffers per process (loads and stores go in chunks that fit)")
    ap.add_argument("--sims", default=",".join(sim.POLICIES), help=f"simulations to run beside (default {','.join(sim.POLICIES)})")
    ap.add_argument("--host-cpus", type=float, default=0.0,
                    help="emulate hosts: each fluxkv owner with its client processes, the master, and a one-server backend "
                         "with its clients get a cgroup of this many CPUs (tracebench/hosts.py; root); 0: share the machine")
    ap.add_argument("--out", help="write summary.jsonl and trace.png here")
    ap.add_argument("--request-hits", action="store_true",
                    help="keep each request's hits in its row (request_hits, in trace order), the simulations' too: "
                         "which requests two rows differ on")
    ap.add_argument("--work-dir", help="where each case's temp dir goes (sockets, logs, SSD files); default: the system temp dir")
    tb.add_arguments(ap)
    return ap


def resolve(a: argparse.Namespace) -> argparse.Namespace:
    p = PRESETS[a.preset]
    a.requests = p["requests"] if a.requests is None else a.requests
    if a.block_bytes is None:
        a.block_bytes = MODELS[a.model].block_bytes if a.model else p["block_bytes"]
    a.capacity = a.capacity or p["capacity"]
    a.backends = _list(a.backends if a.backends is not None else p["backends"])
    a.owners = [int(x) for x in _list(a.owners or p["owners"])]
    a.ssd = _ssd_states(a.ssd or p["ssd"])
    a.procs = a.procs or p["procs"]
    a.sims = _list(a.sims)
    for s in a.sims:
        if s not in sim.POLICIES:
            raise ValueError(f"unknown simulation {s!r}: want {', '.join(sim.POLICIES)}")
    return a


def run_case(run: tb.Running, trace, cap: int, a, cfg: ReplayConfig, context: dict, rows: list) -> bool:
    """Start the backend, replay, read back what it holds; one row either way. False if interrupted."""
    failures: list = []
    label = f"{run.target.label} @ {cap:,} blocks"

    def body(g) -> None:
        wd = g.mkdtemp(a.work_dir, "tracebench-")
        progress(f"{label}: starting ({approx_size(run.dram_bytes)} DRAM" + (f", {approx_size(run.ssd_bytes)} SSD)" if run.ssd_bytes else ")"))
        hs = hosts.Hosts(a.host_cpus) if a.host_cpus else None
        if hs and (warn := hosts.oversubscribed(run.target.owners or 1, a.host_cpus)):
            progress(f"{label}: warning: {warn}")
        try:
            run.start(wd, g)
            if warmed := run.warm(a.block_bytes):
                progress(f"{label}: its memory touched ({warmed:,} values written and deleted)")
            place = mark = None
            if hs:
                hs.place_servers(g.procs, run.target.owners)
                place, mark = hs.placer(run.endpoint), hs.mark
            c0 = run.ssd_counter()
            res = replay(trace, run.target.backend, run.endpoint, run.spec, a.block_bytes, cfg, label=label,
                         server_cpu=lambda: cpu.tree_cpu_s([p.pid for p in g.procs]), place=place, mark=mark)
            c1 = run.ssd_counter()
            run.settle()
            samples = [(c0, c1)] if c0 is not None else []  # the server's SSD-read counter (memcached, a Mooncake owner)
            if res.ssd_counter_delta is not None:  # the replay processes' own (Mooncake clients)
                samples.append((0, res.ssd_counter_delta))
            row = report.replay_row(run, trace, cap, res, a.block_bytes, run.held(), samples, context)
            row.update(hs.layout() if hs else {"cpus_per_host": None})
            if a.request_hits:
                row["request_hits"] = list(res.hits)
        finally:
            run.stop()
            if hs:
                hs.close()
        rows.append(row)
        progress(f"{label}: hit {100 * row['hit_rate']:.1f} % of blocks in {res.wall_s:.1f} s ({row['status']})")

    n = len(rows)
    ok = run_group(body, failures, f"{run.target.label} servers")
    if failures:
        if len(rows) > n:
            rows[-1].update(status="failed", reason="; ".join(failures))
        else:
            rows.append(report.failed_row(run, trace, cap, "; ".join(failures), context))
    return ok


def inputs(a: argparse.Namespace) -> tuple:
    """(trace, capacities in blocks, targets); ValueError for a bad file or flag."""
    trace = load(a.trace, a.requests or None)
    caps = [parse_capacity(x, trace.distinct, a.block_bytes) for x in _list(a.capacity)]
    return trace, caps, targets(a.backends, a.owners, a.ssd)


def run(a: argparse.Namespace, trace, caps: list, tgs: list) -> int:
    install_signal_handlers()
    context = {"preset": a.preset, "trace_file": a.trace, "block_bytes": a.block_bytes, "procs": a.procs,
               "window": a.procs if a.window is None else a.window, "speed": a.speed,
               "route": a.route, "byte_access": a.byte_access}
    print(f"tracebench: preset {a.preset}; {describe_block(a.block_bytes)}", file=sys.stderr)
    print(f"trace {a.trace}: {len(trace.requests):,} requests over {trace.duration_s:,.0f} s, {trace.accesses:,} block accesses, "
          f"{trace.distinct:,} distinct blocks; capacities {', '.join(f'{c:,}' for c in caps)} blocks; "
          f"{a.procs} processes routed {a.route}, {'as fast as possible' if a.speed <= 0 else f'timestamps at {a.speed:g}x'}"
          + (f"; hosts emulated with {a.host_cpus:g} CPUs each" if a.host_cpus else ""), file=sys.stderr)
    rows: list = []
    progress(f"simulations: {', '.join(a.sims) or 'none'}")
    for s in sim.run_sims(trace, caps, a.sims):
        rows.append(report.sim_row(s, trace, s.capacity_blocks, context))
        if a.request_hits:
            rows[-1]["request_hits"] = list(s.per_request)
    cfg = ReplayConfig(procs=a.procs, window=a.window, speed=a.speed, verify_every=a.verify_every, pin_ms=a.pin_ms,
                       buffer_bytes=a.buffer_bytes, route=a.route, byte_access=a.byte_access)
    interrupted = False
    longest = max((len(r.hash_ids) for r in trace.requests), default=1)
    call_bytes = min(a.buffer_bytes, longest * a.block_bytes)
    try:
        for cap in caps:
            for t in tgs:
                r = tb.prepare(t, a, cap, a.block_bytes, a.ssd_ratio, a.procs, trace.distinct, call_bytes)
                why = r.unavailable()
                if why:
                    rows.append(report.unavailable_row(r, trace, cap, why, context))
                    continue
                if not run_case(r, trace, cap, a, cfg, context, rows):
                    raise Interrupted("stopped")
    except (KeyboardInterrupt, Interrupted):
        interrupted = True
        progress("interrupted: writing what ran")
    print(report.table(rows))
    for line in goals.lines(rows):
        print(line)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        report.write_jsonl(rows, out / "summary.jsonl")
        print(f"wrote {out / 'summary.jsonl'}", file=sys.stderr)
        if any(r["status"] != "unavailable" for r in rows):
            chart.render(rows, out / "trace.png")
            print(f"wrote {out / 'trace.png'}", file=sys.stderr)
    if interrupted:
        return 130
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def chart_main(argv: list) -> int:
    ap = argparse.ArgumentParser(prog="tracebench chart", description="trace.png from a summary.jsonl")
    ap.add_argument("summary")
    ap.add_argument("-o", "--output", help="PNG path (default: trace.png beside the summary)")
    a = ap.parse_args(argv)
    out = a.output or str(Path(a.summary).with_name("trace.png"))
    chart.render(chart.load(a.summary), out)
    print(out)
    return 0


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["chart"]:
        return chart_main(argv[1:])
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        a = resolve(a)
        if a.window is not None and a.window < 0 or a.verify_every < 1 or a.procs < 1:
            raise ValueError("--window must be >= 0, --verify-every and --procs >= 1")
        if a.host_cpus < 0:
            raise ValueError("--host-cpus must be >= 0")
        if a.host_cpus and (why := hosts.unavailable()):
            raise ValueError(f"--host-cpus: {why}")
        trace, caps, tgs = inputs(a)
    except (ValueError, OSError) as e:
        ap.error(str(e))
    return run(a, trace, caps, tgs)
