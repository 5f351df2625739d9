"""One replay: a trace's requests served by ``procs`` client processes (spawned; each with its
own client of the backend), in arrival order; request i by process i mod procs, or with
``route="prefix"`` by the process that served the longest prefix of its blocks (:mod:`.route`). With
``window`` W > 0, request i starts only once every request before i - W + 1 has finished, so
the requests in flight are always the next W in arrival order (W = procs by default; W = 1
replays strictly one request after another, the order the simulations assume). With
``speed`` > 0 a request also waits for its timestamp / speed; 0 ignores timestamps.

Each process sends back one row per request (trace index, prefix hits, lookup+load seconds,
store seconds) and its counters; :func:`replay` merges them into a :class:`ReplayResult`."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from pressure.procs import progress

from . import route, worker
from .trace import Trace

__all__ = ["ReplayConfig", "ReplayResult", "replay", "ReplayFailed"]

_START_MARGIN_S = 0.05
_PROGRESS_S = 10.0
_READY_TIMEOUT_S = 120.0


class ReplayFailed(RuntimeError):
    """A replay process failed or died; the message holds its traceback or exit status."""


@dataclass(frozen=True)
class ReplayConfig:
    procs: int = 2
    window: int | None = None  # None: procs
    speed: float = 0.0
    verify_every: int = 8
    pin_ms: int = 1000
    buffer_bytes: int = 1 << 30  # page buffers per process
    namespace: str = "kv1/tracebench"
    route: str = "rr"  # route.ROUTES: which process serves each request
    byte_access: str = "per-key"  # Redis, memcached: per-key gets and puts, or batched ones

    def effective_window(self) -> int:
        return self.procs if self.window is None else self.window


@dataclass
class ReplayResult:
    hits: list  # prefix hits of each request, by trace index
    lookup_load_s: list  # by trace index
    store_s: list
    wall_s: float
    loaded: int = 0
    store_attempts: int = 0
    put_failed: int = 0
    skipped: int = 0  # pages offered that were already cached (not rewritten)
    verified: int = 0
    wrong_bytes: int = 0
    errors: int = 0  # calls that failed (fluxkv: answered as misses, failing open)
    sources: Counter = field(default_factory=Counter)
    ssd_counter_delta: float | None = None  # summed over processes that have a counter
    chained: bool | None = None  # fluxkv: put_pages was given the chain's parent
    buffer_pages: int = 0
    client_cpu_s: float = 0.0  # the replay processes' CPU while serving, summed
    server_cpu_s: float | None = None  # the servers' CPU from the start to the last process's end


def plans(trace: Trace, backend: str, endpoint: dict, spec, block_bytes: int, cfg: ReplayConfig) -> list:
    t_first = trace.requests[0].timestamp_ms
    longest = max(len(r.hash_ids) for r in trace.requests)
    buffer_pages = max(1, min(longest, cfg.buffer_bytes // block_bytes))
    who = route.assign([r.hash_ids for r in trace.requests], cfg.procs, cfg.route)
    out = []
    for k in range(cfg.procs):
        reqs = [(i, r.timestamp_ms - t_first, r.hash_ids) for i, r in enumerate(trace.requests) if who[i] == k]
        out.append(worker.Plan(k, backend, endpoint, asdict(spec), reqs, block_bytes, buffer_pages, cfg.verify_every, cfg.pin_ms,
                               cfg.speed, cfg.effective_window(), cfg.namespace, cfg.byte_access))
    return out


def _receive(out, procs: list, timeout: float):
    """The next message, or None after ``timeout``; ReplayFailed if a process died silently."""
    try:
        return out.get(timeout=timeout)
    except queue.Empty:
        for p in procs:
            if p.exitcode not in (None, 0):
                raise ReplayFailed(f"replay process {p.name} exited with status {p.exitcode}") from None
        return None


def replay(trace: Trace, backend: str, endpoint: dict, spec, block_bytes: int, cfg: ReplayConfig, label: str = "",
           server_cpu=None, place=None, mark=None) -> ReplayResult:
    """Replay ``trace`` against a started backend (``endpoint`` and pressure ``spec``).
    ``server_cpu``, when given, returns the servers' CPU seconds so far (or None): read at the
    start and once every process is done, its difference is the result's ``server_cpu_s``.
    ``place``, when given, is called with each process's index and pid once it started, before
    it is ready (tracebench.hosts: its emulated host). ``mark``, when given, is called with
    "start" as the processes are released and "end" once every one is done."""
    if cfg.procs < 1 or cfg.verify_every < 1:
        raise ValueError("procs and verify_every must be at least 1")
    ctx = mp.get_context("spawn")
    n = len(trace.requests)
    sync = worker.Sync(ctx, n)
    out = ctx.Queue()
    ps = plans(trace, backend, endpoint, spec, block_bytes, cfg)
    procs = [ctx.Process(target=worker.main, args=(p, sync, out), name=f"replay-{p.index}", daemon=True) for p in ps]
    res = ReplayResult([0] * n, [0.0] * n, [0.0] * n, 0.0, buffer_pages=ps[0].buffer_pages)
    try:
        for i, p in enumerate(procs):
            p.start()
            if place:
                place(i, p.pid)
        ready, deadline = 0, time.monotonic() + _READY_TIMEOUT_S
        while ready < len(procs):
            msg = _receive(out, procs, 1.0)
            if msg is None:
                if time.monotonic() > deadline:
                    raise ReplayFailed(f"replay processes not ready within {_READY_TIMEOUT_S:g} s")
                continue
            kind, i, body = msg
            if kind == "error":
                raise ReplayFailed(f"replay process {i}: {body}")
            ready += 1
        cpu0 = server_cpu() if server_cpu else None
        if mark:
            mark("start")
        sync.start_at.value = time.monotonic() + _START_MARGIN_S
        sync.go.set()
        t0 = time.perf_counter()
        done = 0
        while done < len(procs):
            msg = _receive(out, procs, _PROGRESS_S)
            if msg is None:
                f, h, blocks = sync.finished_count.value, sync.hits.value, sync.blocks.value
                rate = f" (blocks hit so far {100.0 * h / blocks:.1f} %)" if blocks else ""
                progress(f"  {label}: {f:,}/{n:,} requests{rate}")
                continue
            kind, i, body = msg
            if kind == "error":
                raise ReplayFailed(f"replay process {i}: {body}")
            _merge(res, body)
            done += 1
        res.wall_s = time.perf_counter() - t0
        if mark:
            mark("end")
        cpu1 = server_cpu() if cpu0 is not None else None
        if cpu1 is not None:
            res.server_cpu_s = cpu1 - cpu0
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
    return res


def _merge(res: ReplayResult, body: dict) -> None:
    for i, h, ll, st in body["rows"]:
        res.hits[i], res.lookup_load_s[i], res.store_s[i] = h, ll, st
    for k in ("loaded", "store_attempts", "put_failed", "verified", "wrong_bytes", "errors"):
        setattr(res, k, getattr(res, k) + body.get(k, 0))
    res.skipped += body.get("skipped", 0)
    res.client_cpu_s += body.get("cpu_s", 0.0)
    res.sources.update(body.get("sources", {}))
    if body.get("ssd_counter_delta") is not None:
        res.ssd_counter_delta = (res.ssd_counter_delta or 0) + body["ssd_counter_delta"]
    if "chained" in body:
        res.chained = body["chained"]
