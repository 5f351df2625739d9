"""The coordinator: for each case, start the backend's servers and the benchmark processes,
bootstrap, run warmup + window on a shared clock, sample SSD counters at the window's edges,
collect, attribute sources, write one summary line; stop everything whatever happens."""

from __future__ import annotations

import datetime
import json
import os
import platform
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import backends
from .backends.base import PAGE_CACHED_FLASH, CaseSpec
from .matrix import Case
from .procs import Group, Interrupted, fs_type
from .sizes import format_size
from .stats import Tally, attribute_counter, attribute_per_get, gib_s
from .workload import key_count, pause_after_put_s

BENCH_DIR = Path(__file__).resolve().parents[1]
clock = time.monotonic

# Fields every summary line has (None where a case did not run).
SCHEMA = (
    "backend", "variant", "ssd", "mode", "on_miss", "order", "payload_bytes", "procs", "threads", "concurrency",
    "status", "complete", "reason",
    "hits", "misses", "errors", "hit_rate", "memory_hits", "ssd_hits", "unknown_hits", "source_method",
    "hit_gib_s", "memory_gib_s", "ssd_gib_s", "ops_per_s", "p50_us", "p95_us", "p99_us",
    "keys", "dataset_bytes", "dram_bytes", "ssd_bytes", "warmup_s", "window_s", "zipf_theta", "seed",
    "bootstrap", "read_through", "cuda", "server", "client", "notes", "started_at",
)


class Context:
    """What the cases of one run share: options, the cuda probe and baselines, the output file."""

    def __init__(self, opts):
        self.opts = opts
        self._cuda: dict | None = None
        self._baselines: dict[int, dict] = {}

    def worker_env(self, extra_paths=()) -> dict:
        env = dict(os.environ)
        paths = [str(BENCH_DIR)] + [str(p) for p in self.opts.pythonpath] + [str(p) for p in extra_paths]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _py(self, args: list[str], timeout: float) -> dict:
        out = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout, env=self.worker_env())
        try:
            return json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"available": False, "reason": f"{' '.join(args)} failed: {out.stderr.strip()[-500:]}"}

    def cuda(self) -> dict:
        if self._cuda is None:
            self._cuda = self._py(["pressure.cuda", "probe"], 60)
            if self._cuda.get("available"):
                print(f"cuda: {self._cuda.get('device_name') or 'device 0'} via {self._cuda.get('library')}", file=sys.stderr)
            else:
                print(f"cuda mode: SKIPPED on this machine: {self._cuda.get('reason')}", file=sys.stderr)
        return self._cuda

    def cuda_baseline(self, payload: int) -> dict:
        if payload not in self._baselines:
            self._baselines[payload] = self._py(["pressure.cuda", "baseline", "--bytes", str(payload), "--seconds", "1"], 120)
        return self._baselines[payload]


# -- talking to worker processes -------------------------------------------------------------------


class Worker:
    def __init__(self, group: Group, ctx: Context, index: int, extra_paths):
        self.index = index
        self.proc = group.start(
            f"worker-{index}",
            [sys.executable, "-m", "pressure.worker"],
            None,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=ctx.worker_env(extra_paths),
        )

    def send(self, obj: dict) -> None:
        self.proc.p.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.p.stdin.flush()

    def recv(self, timeout: float, expect: str) -> dict:
        out = self.proc.p.stdout
        r, _, _ = select.select([out], [], [], max(0.0, timeout))
        if not r:
            raise RuntimeError(f"worker {self.index}: no {expect!r} within {timeout:.0f} s")
        line = out.readline()
        if not line:
            raise RuntimeError(f"worker {self.index} exited (status {self.proc.p.wait()}) before {expect!r}; its stderr is above")
        msg = json.loads(line)
        if msg.get("event") == "failed":
            raise RuntimeError(f"worker {self.index}: {msg.get('error')}\n{msg.get('trace', '')}")
        if msg.get("event") != expect:
            raise RuntimeError(f"worker {self.index}: got {msg.get('event')!r}, want {expect!r}")
        return msg


# -- one case --------------------------------------------------------------------------------------


def run_keeping_partial(run, out_dir) -> tuple[list[dict], bool]:
    """Runs run() for its records. On Ctrl-C (or SIGTERM) the servers are already stopped:
    the records written so far are read back from out_dir/summary.jsonl. Returns the records
    and whether the run was interrupted."""
    from .chart import load
    from .procs import Interrupted

    try:
        return run(), False
    except (KeyboardInterrupt, Interrupted):
        print("\ninterrupted: servers stopped, temp dirs removed; partial summary kept", file=sys.stderr)
        summary = Path(out_dir) / "summary.jsonl"
        return (load(summary) if summary.exists() else []), True


def check_window_and_workdir(a):
    """The checks every run command shares: a positive window, a warmup >= 0, an existing
    --work-dir. Returns a."""
    if a.window <= 0 or a.warmup < 0:
        raise SystemExit("--window must be > 0 and --warmup >= 0")
    if not os.path.isdir(a.work_dir):
        raise SystemExit(f"--work-dir {a.work_dir}: not a directory")
    return a


def case_record(schema, case, opts, keys: int, **extra) -> dict:
    """A fresh summary row of schema for case: its identity, the dataset and timing, extra."""
    rec = {k: None for k in schema}
    rec.update(case.to_json())
    rec.update(
        concurrency=case.concurrency,
        keys=keys,
        dataset_bytes=keys * case.payload_bytes,
        warmup_s=opts.warmup,
        window_s=opts.window,
        zipf_theta=opts.zipf_theta,
        seed=opts.seed,
        complete=False,
        notes=[],
        started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    )
    return rec


def base_record(case: Case, opts, keys: int) -> dict:
    return case_record(SCHEMA, case, opts, keys, dram_bytes=opts.dram, ssd_bytes=opts.ssd_size if case.ssd else 0)


def _pct(h, p):
    v = h.percentile(p)
    return None if v is None else round(v, 1)


def prepare(case: Case, ctx: Context, srv, spec: CaseSpec, rec: dict) -> bool:
    """Fill ``rec`` with why the case cannot run here (False), or its pre-run notes (True)."""
    opts = ctx.opts
    reason = srv.unavailable(spec)
    if reason is None and case.mode == "cuda":
        info = ctx.cuda()
        if not info.get("available"):
            reason = f"cuda mode: {info.get('reason')}"
    if reason:
        rec.update(status="unavailable", reason=reason)
        return False
    if case.ssd and fs_type(opts.work_dir) in ("tmpfs", "ramfs"):
        rec["notes"].append(f"work dir {opts.work_dir} is on {fs_type(opts.work_dir)}: the 'SSD' tier is RAM here")
    if case.ssd and case.backend in PAGE_CACHED_FLASH:
        rec["notes"].append(PAGE_CACHED_FLASH[case.backend] + " through the page cache (fluxkv reads its own with O_DIRECT): "
                            "its SSD hits are memory the machine had spare, not its flash, and its GiB/s and latencies with them")
    if case.mode == "cuda":
        rec["cuda"] = {"baseline": ctx.cuda_baseline(case.payload_bytes), "device": ctx.cuda().get("device_name")}
    return True


def worker_config(case: Case, spec: CaseSpec, ctx: Context, srv, endpoint: dict, label: str) -> dict:
    opts = ctx.opts
    return {
        "case": {**spec.__dict__},
        "endpoint": endpoint,
        "order": case.order,
        "on_miss": case.on_miss,
        "seed": opts.seed,
        "theta": opts.zipf_theta,
        "pace_scale": opts.pace_scale,
        "label": label,
        "pythonpath": [str(p) for p in opts.pythonpath] + list(srv.pythonpath),
    }


def start_workers(group: Group, ctx: Context, srv, cfg: dict, procs: int, workers: list) -> list[dict]:
    """Start ``procs`` benchmark processes (appended to ``workers`` as they start, so that the
    caller stops them whatever happens) and wait for their ``ready``."""
    first = len(workers)
    for i in range(procs):
        workers.append(Worker(group, ctx, i, srv.pythonpath))
    mine = workers[first:]
    for i, w in enumerate(mine):
        w.send({"config": {**cfg, "proc_index": i}})
    return [w.recv(120, "ready") for w in mine]


def bootstrap(worker: Worker, case: Case, keys: int, opts, rec: dict) -> None:
    """The dataset's serial puts through ``worker`` (rec["bootstrap"])."""
    pause = pause_after_put_s(case.payload_bytes, opts.pace_scale)
    worker.send({"cmd": "bootstrap"})
    boot = worker.recv(keys * (pause + 10.0) + 120, "bootstrapped")
    boot.pop("event", None)
    rec["bootstrap"] = boot
    if boot["failed"]:
        rec["notes"].append(f"{boot['failed']} of {keys} bootstrap puts failed")


def describe_server(srv, rec: dict) -> None:
    try:
        rec["server"] = srv.describe()
        rec["notes"] += srv.notes(rec["server"])
        if srv.cmdline:
            rec["server"]["cmd"] = " ".join(shlex.quote(str(a)) for a in srv.cmdline)
    except Exception as e:  # the server's own view is informative, not part of the measurement
        rec["server"] = {"error": f"{type(e).__name__}: {e}"[:500]}


def measure(workers: list[Worker], srv, case: Case, opts) -> tuple[list[dict], list, float]:
    """One warmup + window on a shared clock; server-side SSD counters sampled at its edges.
    Returns the workers' results, the counter samples and the sampling skew."""
    t_start = clock() + 0.25
    ws = t_start + opts.warmup
    we = ws + opts.window
    for w in workers:
        w.send({"cmd": "go", "t_start": t_start, "window_start": ws, "window_end": we})
    samples = []
    skew = 0.0
    if case.ssd and srv.source_method == "counter":
        _sleep_until(ws)
        a, ta = srv.ssd_counter(), clock()
        if a is not None:  # a server-side counter (memcached); workers may add their own
            _sleep_until(we)
            b, tb = srv.ssd_counter(), clock()
            samples.append([a, b])
            skew = max(ta - ws, tb - we)
    results = [w.recv(we - clock() + 120, "result") for w in workers]
    return results, samples, skew


def stop_workers(workers: list[Worker], finished: bool) -> None:
    """Ask every worker to exit; idle workers close their clients and exit by themselves (when
    ``finished``), else the group's SIGTERM stops them at once."""
    for w in workers:
        try:
            w.send({"cmd": "exit"})
        except OSError:
            pass
    if finished:
        for w in workers:
            try:
                w.proc.p.wait(5)
            except subprocess.TimeoutExpired:
                pass


def died_early(group: Group) -> dict[str, str]:
    """Servers of ``group`` that already exited with a failure status, before the harness stopped
    them: name → status and log tail (read now: ``close`` removes the logs)."""
    out = {}
    for p in group.procs:
        code = p.p.poll()
        if code not in (None, 0) and not p.name.startswith("worker"):
            out[p.name] = f"exit status {code}: {p.log_tail(1500)}"
    return out


def stop_servers(srv, group: Group, rec: dict) -> None:
    early = died_early(group)
    if early:
        rec["notes"].append("servers died during the case: " + " | ".join(f"{k}: {v}" for k, v in early.items()))
        rec["servers_died"] = sorted(early)
    try:
        srv.stop()
    finally:
        codes = group.close()
    # A server that dies of the SIGTERM that stops it (no handler, e.g. mooncake_master) stopped as asked.
    bad = {k: v for k, v in codes.items() if v not in (0, None, -signal.SIGTERM) and not k.startswith("worker")}
    if bad:
        rec["notes"].append(f"servers exited with {bad}")


def account(rec: dict, case: Case, srv, results: list[dict], samples: list, skew: float, window: float) -> Tally | None:
    """Turn the workers' results into the record's counts, rates and latencies; returns the
    merged tally (None when a worker thread crashed: the case failed). A server that died
    during the case fails it (fail_if_servers_died)."""
    try:
        return _account(rec, case, srv, results, samples, skew, window)
    finally:
        fail_if_servers_died(rec, rec)


def _account(rec: dict, case: Case, srv, results: list[dict], samples: list, skew: float, window: float) -> Tally | None:
    tally = Tally()
    crashes = []
    samples = list(samples)
    for r in results:
        tally.merge(Tally.from_json(r["tally"]))
        samples += r.get("counter_samples") or []
        crashes += r.get("crashes") or []
    if crashes:
        rec.update(status="failed", reason="a worker thread crashed: " + crashes[0])
        return None

    hits, misses = tally.hits, tally.misses
    if case.ssd and srv.source_method == "counter":
        att = attribute_counter(hits, samples)
        if skew:
            rec["notes"].append(f"SSD hits from server counters sampled {skew * 1e3:.1f} ms after the window edges at most")
    else:
        att = attribute_per_get(hits, tally.by_source)
    if att.note:
        rec["notes"].append(att.note)
    rec.update(
        status="ok" if att.complete else "incomplete",
        complete=att.complete,
        hits=hits,
        misses=misses,
        errors=tally.errors,
        # (an error is no hit: a backend whose gets fail does not keep its rate)
        hit_rate=(hits / (hits + misses + tally.errors)) if hits + misses + tally.errors else None,
        memory_hits=att.memory,
        ssd_hits=att.ssd,
        unknown_hits=att.unknown,
        source_method=att.method,
        hit_gib_s=gib_s(hits, case.payload_bytes, window),
        memory_gib_s=gib_s(att.memory, case.payload_bytes, window),
        ssd_gib_s=gib_s(att.ssd, case.payload_bytes, window),
        ops_per_s=(hits + misses + tally.errors) / window,
        p50_us=_pct(tally.hist, 50),
        p95_us=_pct(tally.hist, 95),
        p99_us=_pct(tally.hist, 99),
    )
    if tally.errors:
        rec["notes"].append("errors: " + " | ".join(tally.error_samples))
    if case.on_miss == "put":
        rec["read_through"] = {"puts": tally.put_ok, "failed": tally.put_failed}
        if tally.put_failed:
            rec["notes"].append("read-through put failures: " + " | ".join(tally.error_samples))
    if case.mode == "cuda":
        c = rec["cuda"]
        for name, h in tally.stages.items():
            c[f"{name}_p50_us"] = _pct(h, 50)
            c[f"{name}_p99_us"] = _pct(h, 99)
        base = (c.get("baseline") or {}).get("gib_s")
        c["fraction_of_plain_h2d"] = (rec["hit_gib_s"] / base) if base else None
    return tally


def case_label(case: Case) -> str:
    return f"{case.backend}{'/' + case.variant if case.variant else ''} ssd={'on' if case.ssd else 'off'}"


def run_case(case: Case, ctx: Context) -> dict:
    opts = ctx.opts
    keys = key_count(opts.dataset, case.payload_bytes)
    rec = base_record(case, opts, keys)
    spec = CaseSpec(case.backend, case.variant, case.ssd, case.mode, case.payload_bytes, keys, opts.dram, opts.ssd_size, case.procs, case.threads)
    try:
        mod = backends.load(case.backend)
        srv = mod.Server(opts)
    except ImportError as e:
        rec.update(status="unavailable", reason=f"backend module: {e}")
        return rec
    if not prepare(case, ctx, srv, spec, rec):
        return rec

    group = Group()
    workers: list[Worker] = []
    finished = False
    try:
        workdir = group.mkdtemp(opts.work_dir, "fkp-")
        endpoint = srv.start(spec, workdir, group)
        cfg = worker_config(case, spec, ctx, srv, endpoint, case_label(case))
        ready = start_workers(group, ctx, srv, cfg, case.procs, workers)
        rec["client"] = {"native_type": ready[0].get("native_type"), **(ready[0].get("describe") or {})}
        bootstrap(workers[0], case, keys, opts, rec)
        srv.settle(opts.settle_timeout)
        describe_server(srv, rec)
        results, samples, skew = measure(workers, srv, case, opts)
        finished = True
    except (KeyboardInterrupt, Interrupted):
        raise
    except Exception as e:
        rec.update(status="failed", reason=f"{type(e).__name__}: {e}"[:3000])
        return rec
    finally:
        stop_workers(workers, finished)
        stop_servers(srv, group, rec)

    account(rec, case, srv, results, samples, skew, opts.window)
    return rec


def fail_if_servers_died(r: dict, rec: dict) -> None:
    """Fail record r (rec or one of its windows) when a server of rec's case died during it:
    its counts stay, but they are not the backend's (a dead owner's failed gets would read as
    a low hit rate; a review: such a case was reported ok)."""
    if not rec.get("servers_died"):
        return
    r.update(status="failed", complete=False, reason=f"{', '.join(rec['servers_died'])} died during the case (notes: its log tail)")
    if r is not rec:
        r["notes"] += [n for n in rec["notes"] if n.startswith("servers died")]


def _sleep_until(t: float) -> None:
    while True:
        d = t - clock()
        if d <= 0:
            return
        time.sleep(min(d, 0.05))


# -- a run -----------------------------------------------------------------------------------------


def fmt_row(r: dict) -> str:
    b = r["backend"] + (f"/{r['variant']}" if r.get("variant") else "")
    head = f"{b:<10} {'on' if r['ssd'] else 'off':<3} {r['mode']:<6} {'get-only' if r['on_miss'] == 'none' else 'read-thr':<8} {format_size(r['payload_bytes']):<10} {r['concurrency']:<4}"
    if r["status"] in ("unavailable", "failed"):
        return f"{head} {r['status'].upper()}: {r['reason']}"
    hr = r["hit_rate"]
    hr_s = "   -  " if hr is None else f"{hr * 100:5.1f}%"
    p = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    return (
        f"{head} {r['hits']:>7} {r['misses']:>6} {r['errors']:>4} {hr_s} {r['memory_hits']:>7} {r['ssd_hits']:>6} "
        f"{r['hit_gib_s']:7.3f} {p(r['p50_us']):>7} {p(r['p95_us']):>7} {p(r['p99_us']):>7} {'yes' if r['complete'] else 'NO'}"
    )


TABLE_HEAD = (
    f"{'backend':<10} {'ssd':<3} {'mode':<6} {'window':<8} {'payload':<10} {'cN':<4} {'hits':>7} {'misses':>6} {'err':>4} {'hit%':>6} "
    f"{'mem':>7} {'ssd':>6} {'GiB/s':>7} {'p50us':>7} {'p95us':>7} {'p99us':>7} complete"
)


def run(cases: list[Case], opts) -> list[dict]:
    out_dir = Path(opts.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.jsonl"
    ctx = Context(opts)
    for p in opts.pythonpath:
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    records: list[dict] = []
    print(
        f"pressure: {len(cases)} cases; DRAM {format_size(opts.dram)}, SSD {format_size(opts.ssd_size)}, dataset ≈ {format_size(opts.dataset)}, "
        f"warmup {opts.warmup:g} s, window {opts.window:g} s, work dir {opts.work_dir} ({fs_type(opts.work_dir)}); "
        f"host {platform.node()} with {os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    with open(summary, "w") as f:
        for i, case in enumerate(cases, 1):
            print(f"[{i}/{len(cases)}] {case.label()}", file=sys.stderr, flush=True)
            t0 = clock()
            rec = run_case(case, ctx)
            rec["case_seconds"] = round(clock() - t0, 1)
            records.append(rec)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            print("    " + fmt_row(rec), file=sys.stderr, flush=True)
    return records


def print_table(records: list[dict], stream=sys.stdout) -> None:
    print(TABLE_HEAD, file=stream)
    for r in records:
        print(fmt_row(r), file=stream)
