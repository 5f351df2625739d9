"""Command line of the pressure benchmark.

    python3 -m pressure run --out DIR [--preset quick|full] [sizes, matrix and tool flags]
    python3 -m pressure chart DIR/summary.jsonl [-o DIR/pressure.png]
    python3 -m pressure cluster --out DIR [--preset quick|full] [flags]   # the cluster benchmark (cluster.py)
    python3 -m pressure chart-cluster DIR/summary.jsonl [-o DIR/cluster.png]
    python3 -m pressure vendor-thrift DIR       # copy the pure-Python thrift runtime, for --pythonpath DIR

(run from the repository root with ``PYTHONPATH=bench``; ``make bench`` / ``make bench-quick`` do.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from . import backends
from .matrix import MODES, ON_MISS, SEED_PAYLOADS, WORKERS, cross, parse_workers, quick
from .sizes import format_size, parse_size
from .workload import ORDERS, ZIPF_THETA


# Preset defaults; any flag given on the command line wins.
PRESETS = {
    # The seed's experiment: 2 GiB DRAM, ≈ 2.5 GiB dataset, 16 GiB SSD, 5 s warmup + 30 s window.
    "full": dict(dram="2GiB", ssd_size=None, dataset_ratio=1.25, payloads=",".join(SEED_PAYLOADS), workers="c2,c4,c8,c16",
                 modes="holder,bytes,cuda", on_miss="none", ssd="off,on", warmup=5.0, window=30.0),
    # Under 3 minutes on 2 cores: same ratios, 1/8 of the sizes, one payload, c2, short window.
    "quick": dict(dram="256MiB", ssd_size=None, dataset_ratio=1.25, payloads="1MiB-128", workers="c2",
                  modes="bytes", on_miss="none", ssd="off,on", warmup=2.0, window=6.0),
}
SSD_PER_DRAM = 8  # the seed's 16 GiB SSD for 2 GiB DRAM


def csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def onoff(s: str) -> list[bool]:
    out = []
    for x in csv(s):
        if x.lower() in ("on", "true", "1", "yes"):
            out.append(True)
        elif x.lower() in ("off", "false", "0", "no"):
            out.append(False)
        else:
            raise SystemExit(f"--ssd: {x!r} is neither on nor off")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m pressure", description="fluxkv pressure benchmark against memcached, Redis and Mooncake Store where installed (docs/architecture.md §8)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run a matrix of cases, write summary.jsonl and pressure.png")
    r.add_argument("--out", required=True, help="output directory (summary.jsonl, pressure.png)")
    r.add_argument("--preset", choices=sorted(PRESETS), default="full", help="default sizes and matrix: full (the seed's) or quick")
    g = r.add_argument_group("sizes (every backend gets the same)")
    g.add_argument("--dram", help="DRAM per backend (fluxkv --dram, memcached -m, redis maxmemory); full: 2GiB, quick: 256MiB")
    g.add_argument("--ssd-size", help=f"flash per backend when SSD is on (fluxkv SSD limit, memcached extstore size); default {SSD_PER_DRAM} x DRAM")
    g.add_argument("--dataset", help="dataset size (keys = dataset / payload); default --dataset-ratio x DRAM")
    g.add_argument("--dataset-ratio", type=float, help="dataset / DRAM when --dataset is not given (default 1.25)")
    m = r.add_argument_group("matrix")
    m.add_argument("--backends", default=",".join(backends.NAMES), help=f"comma list of {', '.join(backends.NAMES)}")
    m.add_argument("--ssd", help="SSD states: off,on")
    m.add_argument("--payloads", help="payload sizes, e.g. 1MiB-128,4MiB-128 (seed: 1/4/8/16 MiB - 128 B)")
    m.add_argument("--workers", help=f"layouts: {', '.join(f'{k}={p}x{t}' for k, (p, t) in WORKERS.items())} or PROCSxTHREADS")
    m.add_argument("--modes", help=f"output modes: {', '.join(MODES)} (full preset only; quick has its own list)")
    m.add_argument("--on-miss", help="window kinds: none (get-only, the seed's) and/or put (read-through)")
    m.add_argument("--bootstrap-order", default="random", help=f"comma list of {', '.join(ORDERS)} (default random)")
    add_workload_arguments(r.add_argument_group("timing and workload"), "full: 5, quick: 2", "full: 30, quick: 6")
    for name in backends.names():  # each backend's own flags (binaries, client paths)
        add_backend_arguments(r, name)
    add_tool_arguments(r.add_argument_group("tools"))

    from . import cluster

    cluster.add_arguments(sub.add_parser("cluster", help="the cluster benchmark: master + owners, remote memory and SSD paths, tcp-raw limit, cluster.png"))

    for name, png in (("chart", "pressure.png"), ("chart-cluster", "cluster.png")):
        c = sub.add_parser(name, help=f"draw {png} from a summary.jsonl")
        c.add_argument("summary")
        c.add_argument("-o", "--output")
        c.add_argument("--title")

    v = sub.add_parser("vendor-thrift", help="copy the pure-Python thrift runtime into DIR/thrift (for machines without python3-thrift)")
    v.add_argument("dir")
    return ap


def add_workload_arguments(t, warmup_default: str, window_default: str) -> None:
    t.add_argument("--warmup", type=float, help=f"seconds before the window ({warmup_default})")
    t.add_argument("--window", type=float, help=f"seconds counted ({window_default})")
    t.add_argument("--seed", type=int, default=1, help="seed of the bootstrap order, Zipf sequences and values")
    t.add_argument("--zipf-theta", type=float, default=ZIPF_THETA)
    t.add_argument("--pace-scale", type=float, default=1.0, help="scale of the seed's bootstrap pauses (0: no pause)")
    t.add_argument("--settle-timeout", type=float, default=30.0, help="max seconds to wait for background SSD writes after the bootstrap")


def add_backend_arguments(r, name: str) -> None:
    try:
        mod = backends.load(name)
    except ImportError:
        return
    if hasattr(mod, "add_arguments"):
        mod.add_arguments(r.add_argument_group(f"backend {name}"))


def add_tool_arguments(o) -> None:
    o.add_argument("--pythonpath", action="append", default=[], help="extra sys.path entry for every process (e.g. a vendored thrift)")
    o.add_argument("--work-dir", default=os.environ.get("FLUXKV_BENCH_WORKDIR") or "/var/tmp",
                   help="where temp dirs, sockets and the SSD files go (a disk, not tmpfs; default /var/tmp)")
    o.add_argument("--no-chart", action="store_true")


def resolve(a) -> argparse.Namespace:
    """Fill preset defaults, parse sizes, validate; returns the options the harness uses."""
    p = PRESETS[a.preset]

    def pick(name):
        v = getattr(a, name)
        return p[name] if v is None else v

    a.dram = parse_size(pick("dram"))
    a.ssd_size = parse_size(a.ssd_size) if a.ssd_size else SSD_PER_DRAM * a.dram
    ratio = a.dataset_ratio if a.dataset_ratio is not None else p["dataset_ratio"]
    a.dataset = parse_size(a.dataset) if a.dataset else int(ratio * a.dram)
    a.payload_list = [parse_size(x) for x in csv(pick("payloads"))]
    a.worker_list = [parse_workers(x) for x in csv(pick("workers"))]
    a.mode_list = csv(pick("modes"))
    a.on_miss_list = csv(pick("on_miss"))
    a.ssd_list = onoff(pick("ssd"))
    a.order_list = csv(a.bootstrap_order)
    a.backend_list = csv(a.backends)
    a.warmup = float(pick("warmup"))
    a.window = float(pick("window"))
    a.pythonpath = [Path(x).resolve() for x in a.pythonpath]
    for x in a.mode_list:
        if x not in MODES:
            raise SystemExit(f"--modes: {x!r} not in {MODES}")
    for x in a.on_miss_list:
        if x not in ON_MISS:
            raise SystemExit(f"--on-miss: {x!r} not in {ON_MISS}")
    for x in a.order_list:
        if x not in ORDERS:
            raise SystemExit(f"--bootstrap-order: {x!r} not in {ORDERS}")
    for x in a.backend_list:
        if x not in backends.names():
            raise SystemExit(f"--backends: {x!r} not in {backends.names()}")
    from .harness import check_window_and_workdir

    return check_window_and_workdir(a)


def cases_for(a) -> list:
    if a.preset == "quick":
        out = []
        for payload in a.payload_list:
            for w in a.worker_list:
                for order in a.order_list:
                    out += quick(a.backend_list, payload, w, order)
        return out
    return cross(a.backend_list, a.ssd_list, a.mode_list, a.on_miss_list, a.order_list, a.payload_list, a.worker_list)


def vendor_thrift(dest: str) -> int:
    """Copy the ``thrift`` package's Python files (no compiled extension: it falls back to pure
    Python) to DEST/thrift, for a machine whose Python has no thrift (e.g. a GPU box on 3.12)."""
    import thrift

    src = Path(thrift.__file__).resolve().parent
    dst = Path(dest) / "thrift"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.pyc"))
    print(f"copied {src} -> {dst}; pass --pythonpath {Path(dest).resolve()}")
    return 0


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd in ("chart", "chart-cluster"):
        from .chart import load, render, render_cluster

        cluster_chart = a.cmd == "chart-cluster"
        out = a.output or str(Path(a.summary).with_name("cluster.png" if cluster_chart else "pressure.png"))
        (render_cluster if cluster_chart else render)(load(a.summary), out, a.title)
        print(out)
        return 0
    if a.cmd == "cluster":
        from . import cluster

        return cluster.main(a)
    if a.cmd == "vendor-thrift":
        return vendor_thrift(a.dir)

    from . import harness
    from .procs import install_signal_handlers

    opts = resolve(a)
    cases = cases_for(opts)
    install_signal_handlers()
    records, interrupted = harness.run_keeping_partial(lambda: harness.run(cases, opts), opts.out)
    if records:
        print()
        harness.print_table(records)
        if not opts.no_chart:
            try:
                from .chart import render

                png = render(records, Path(opts.out) / "pressure.png",
                             f"fluxkv pressure benchmark ({opts.preset}{', interrupted' if interrupted else ''})")
                print(f"\nwrote {Path(opts.out) / 'summary.jsonl'} and {png}")
            except ImportError as e:
                print(f"chart skipped: {e} (apt-get install python3-matplotlib)", file=sys.stderr)
    print(f"sizes: DRAM {format_size(opts.dram)}, SSD {format_size(opts.ssd_size)}, dataset {format_size(opts.dataset)}", file=sys.stderr)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
