"""One process of a replay (started with multiprocessing's spawn): it opens its own client of
the backend, waits for the start, serves its share of the requests as an engine would (look
the prefix up, load the pages found into its preallocated buffers, store the rest) and sends
back one row per request. :class:`Sync` keeps the processes in arrival order."""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass

from .clients import BytePages, FluxkvPages, MooncakePages
from .pages import Pages

__all__ = ["Buffers", "Plan", "Sync", "main", "prepare"]


@dataclass
class Plan:
    """What one process needs (pickled to it)."""

    index: int
    backend: str  # a pressure backend name: fluxkv, redis, memcached, mooncake
    endpoint: dict  # the backend Server's endpoint
    spec: dict  # pressure CaseSpec fields
    requests: list  # (trace index, ms since the first request, block ids), in arrival order
    block_bytes: int
    buffer_pages: int  # page buffers of this process: loads and stores go in chunks of this many
    verify_every: int  # check every n-th page loaded byte for byte
    pin_ms: int
    speed: float  # > 0: a request starts no earlier than its timestamp / speed; 0: at once
    window: int  # > 0: request i starts once every request before i - window + 1 has finished
    namespace: str
    byte_access: str = "per-key"  # Redis, memcached: "per-key" or "batch" (tracebench.clients.BytePages)


class Sync:
    """Shared by the processes of one replay: which requests have finished (and the lowest
    unfinished one, the watermark), hits and blocks so far (progress lines), and the start signal."""

    def __init__(self, ctx, n_requests: int):
        self.cond = ctx.Condition()
        self.done = ctx.RawArray("B", n_requests)
        self.watermark = ctx.RawValue("q", 0)
        self.finished_count = ctx.RawValue("q", 0)
        self.hits = ctx.RawValue("q", 0)
        self.blocks = ctx.RawValue("q", 0)
        self.go = ctx.Event()
        self.start_at = ctx.RawValue("d", 0.0)  # time.monotonic() of the start (system-wide clock)

    def wait_turn(self, i: int, window: int) -> None:
        if window <= 0:
            return
        need = i - window + 1
        with self.cond:
            self.cond.wait_for(lambda: self.watermark.value >= need)

    def finished(self, i: int, hits: int, blocks: int) -> None:
        with self.cond:
            self.done[i] = 1
            self.finished_count.value += 1
            self.hits.value += hits
            self.blocks.value += blocks
            w = self.watermark.value
            while w < len(self.done) and self.done[w]:
                w += 1
            if w != self.watermark.value:
                self.watermark.value = w
                self.cond.notify_all()


def open_pages(plan: Plan):
    """(page client, the backend's WorkerSide, its ThreadClient or None) for this process."""
    from pressure.backends import load as load_backend
    from pressure.backends.base import CaseSpec

    mod = load_backend(plan.backend)
    ws = mod.WorkerSide(plan.endpoint, CaseSpec(**plan.spec), plan.index)
    if plan.backend == "fluxkv":
        return FluxkvPages(ws.client, plan.namespace, plan.pin_ms), ws, None
    if plan.backend == "mooncake":
        retries = int(plan.endpoint.get("put_retries", 8))
        return MooncakePages(ws.store, plan.namespace, plan.block_bytes, bool(plan.spec.get("ssd")), retries), ws, None
    tc = ws.thread_client(0)
    return BytePages(tc, plan.namespace, plan.block_bytes, batch=plan.byte_access == "batch"), ws, tc


@dataclass
class Buffers:
    """A process's page buffers. Loads go into ``load``, whose id words are poisoned before
    each load (a page reported found but not copied fails the check); stores come from
    ``store``, which hold the bytes common to every page, each stamped with its block's id
    words."""

    pages: Pages
    load: list
    store: list


def prepare(plan: Plan, pc) -> Buffers:
    """The process's page buffers, written (their memory really there) and registered with a
    client that loads into and stores from registered memory (Mooncake), once the client's
    own set-up is done (fluxkv's mapping of the segment ahead). A process prepares
    them before it says it is ready: at real block sizes they are gigabytes, and their first
    touch inside the timed window would be the replay's own work in every backend's figures."""
    pages = Pages(plan.block_bytes)
    b = Buffers(pages, pages.buffers(plan.buffer_pages), pages.store_buffers(plan.buffer_pages))
    if hasattr(pc, "register"):
        pc.register(b.load + b.store)
    if hasattr(pc, "settle"):
        pc.settle()
    return b


def serve(plan: Plan, sync: Sync, pc, buffers: Buffers) -> dict:
    pages, bufs, sbufs = buffers.pages, buffers.load, buffers.store
    nb = len(bufs)
    t0 = sync.start_at.value
    rows = []
    loaded = attempted = failed = verified = wrong = seen = 0
    for i, ts, ids in plan.requests:
        if plan.speed > 0:
            delay = t0 + ts / 1000.0 / plan.speed - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        sync.wait_turn(i, plan.window)
        start = time.perf_counter()
        verify_s = 0.0  # the harness's own work: poisoning buffers and checking bytes
        n = pc.lookup(ids)
        h = 0
        while h < n:
            k = min(nb, n - h)
            p0 = time.perf_counter()
            for b in bufs[:k]:
                pages.poison(b)
            verify_s += time.perf_counter() - p0
            got = pc.load(ids[h : h + k], bufs[:k])
            v0 = time.perf_counter()
            for j in range(got):
                seen += 1
                if seen % plan.verify_every == 0:
                    wrong += pages.wrong_bytes(bufs[j], ids[h + j])
                    verified += 1
            verify_s += time.perf_counter() - v0
            h += got
            if got < k:
                break
        lookup_load_s = time.perf_counter() - start - verify_s
        store_s = 0.0
        for lo in range(h, len(ids), nb):
            chunk = ids[lo : lo + nb]
            for j, b in enumerate(chunk):
                pages.stamp(sbufs[j], b)
            s0 = time.perf_counter()
            failed += pc.store_pages(chunk, sbufs[: len(chunk)], ids[lo - 1] if lo else None)
            store_s += time.perf_counter() - s0
        loaded += h
        attempted += len(ids) - h
        rows.append((i, h, lookup_load_s, store_s))
        sync.finished(i, h, len(ids))
    return {"rows": rows, "loaded": loaded, "store_attempts": attempted, "put_failed": failed, "verified": verified, "wrong_bytes": wrong}


def _profiled(plan: Plan, sync: Sync, pc, buffers: Buffers) -> dict:
    """serve, under cProfile when TRACEBENCH_PROFILE names a directory: each process writes
    its statistics there (``worker-I.prof``, for ``python3 -m pstats``)."""
    where = os.environ.get("TRACEBENCH_PROFILE")
    if not where:
        return serve(plan, sync, pc, buffers)
    import cProfile

    prof = cProfile.Profile()
    try:
        return prof.runcall(serve, plan, sync, pc, buffers)
    finally:
        prof.dump_stats(os.path.join(where, f"worker-{plan.index}.prof"))


def main(plan: Plan, sync: Sync, out) -> None:
    """The process's entry point: ("ready", i, None), then ("done", i, result) or ("error", i, text) on ``out``."""
    ws = tc = None
    try:
        pc, ws, tc = open_pages(plan)
        buffers = prepare(plan, pc)
        ssd0 = ws.ssd_counter()
        out.put(("ready", plan.index, None))
        sync.go.wait()
        cpu0 = time.process_time()
        res = _profiled(plan, sync, pc, buffers)
        res["cpu_s"] = time.process_time() - cpu0
        ssd1 = ws.ssd_counter()
        res.update(pc.counters())
        res["wrong_bytes"] += res.pop("wrong_bytes_values", 0)
        res["ssd_counter_delta"] = None if ssd0 is None or ssd1 is None else ssd1 - ssd0
        out.put(("done", plan.index, res))
    except BaseException:  # noqa: BLE001 - reported to the coordinator, which stops the replay
        out.put(("error", plan.index, traceback.format_exc()))
    finally:
        for x in (tc, ws):
            if x is not None:
                try:
                    x.close()
                except Exception:  # noqa: BLE001 - closing after an error
                    pass
