"""The rows of summary.jsonl (one per backend x capacity x SSD x owners, the simulations
included) and the printed table.

Every row has ``backend`` (fluxkv, mooncake, redis, memcached, sim-lru, sim-s3fifo,
sim-belady, ideal), ``capacity_fraction`` (of the trace's distinct blocks), ``capacity_blocks``,
``owners`` and ``ssd`` (None for a simulation: no server), ``hit_rate`` (block accesses
served from cache, prefix semantics), ``token_hit_rate`` (the same weighted by tokens: 512 a
block, a request's last block what is left of its input_length) and ``status`` (ok, failed,
unavailable). A replay row adds lookup+load latency p50/p99 per request, GiB/s moved, hits by
source and what the backend held at the end."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pressure.stats import PLACES, Attribution, attribute_counter, attribute_dram_only, split_by_place

from .backends import Running
from .replay import ReplayResult
from .sim import POLICIES, SimResult
from .trace import Trace

__all__ = ["sim_row", "replay_row", "unavailable_row", "failed_row", "write_jsonl", "table"]

GiB = 1 << 30


def _base(backend: str, trace: Trace, capacity_blocks: int, owners, ssd, **extra) -> dict:
    return {
        "backend": backend,
        "capacity_fraction": capacity_blocks / trace.distinct,
        "capacity_blocks": capacity_blocks,
        "owners": owners,
        "ssd": ssd,
        "requests": len(trace.requests),
        "blocks": trace.accesses,
        "distinct_blocks": trace.distinct,
        **extra,
    }


def token_hits(trace: Trace, hits: list) -> int:
    return sum(r.prefix_tokens(h) for r, h in zip(trace.requests, hits))


def sim_row(s: SimResult, trace: Trace, capacity_blocks: int, context: dict) -> dict:
    return {
        **_base(s.policy, trace, capacity_blocks, None, None, **context),
        "hits": s.hits,
        "hit_rate": s.hit_rate,
        "token_hit_rate": s.token_hit_rate,
        "sim_seconds": round(s.seconds, 3),
        "status": "ok",
    }


def unavailable_row(run: Running, trace: Trace, capacity_blocks: int, reason: str, context: dict) -> dict:
    t = run.target
    return {**_base(t.backend, trace, capacity_blocks, t.owners, t.ssd, **context), **run.describe(),
            "hit_rate": None, "token_hit_rate": None, "status": "unavailable", "reason": reason}


def failed_row(run: Running, trace: Trace, capacity_blocks: int, reason: str, context: dict) -> dict:
    return {**unavailable_row(run, trace, capacity_blocks, reason, context), "status": "failed"}


def percentile_ms(values: list, p: float) -> float | None:
    """Nearest-rank percentile, in ms, of seconds."""
    if not values:
        return None
    s = sorted(values)
    return 1000.0 * s[max(0, math.ceil(p / 100.0 * len(s)) - 1)]


def sources(run: Running, res: ReplayResult, counter_samples: list, batch: bool = False) -> dict:
    """Hits by place (memory/SSD x local/remote) and how they were attributed; ``batch``: a
    byte store's loads were multi-gets (--byte-access batch)."""
    hits = res.loaded
    by = dict(res.sources)
    if run.target.backend == "fluxkv":
        split = split_by_place(hits, by)
        return {"hits_by_source": split.counts, "sources_method": split.method, "sources_complete": split.complete,
                **({"sources_note": split.note} if split.note else {})}
    remote = run.target.backend == "mooncake"  # dedicated owner: every hit crosses to the resident store
    where = "remote" if remote else "local"
    counts = {p: 0 for p in PLACES}
    for k, v in by.items():
        if k in PLACES:
            counts[f"{k.split('_')[0]}_{where}"] += v
    loose = by.get("unattributed", 0) + by.get("unknown", 0)
    # Mooncake SSD on: MooncakePages read the counter around each batch_get_into call.
    method, complete, note = ("counter-per-batch" if remote and run.target.ssd else "per-get"), True, ""
    if loose and remote and run.target.ssd:
        # MooncakePages attributed each load itself; what is left are the pages of loads that read
        # from flash, which Mooncake's per-RPC counter cannot split: no guessing.
        a = Attribution(0, 0, loose, False, "counter",
                        f"{loose} hits came in batch_get_into calls that read from flash; Mooncake's offload counter "
                        "counts RPCs (one per call and storage endpoint), not pages")
        counts = {p: None for p in PLACES}
        method, complete, note = a.method, a.complete, a.note
    elif loose and run.target.ssd and batch:
        # A multi-get also reads the pages after a request's first miss in its call, and the
        # server's flash-read counter counts those too (a review): no split.
        counts = {p: None for p in PLACES}
        method, complete = "counter", False
        note = (f"{loose} hits came in multi-gets, which also read pages past a request's first miss; the server's "
                "flash-read counter counts those too")
    elif loose:
        a = attribute_counter(loose, counter_samples) if run.target.ssd else attribute_dram_only(loose)
        counts[f"memory_{where}"] += a.memory
        counts[f"ssd_{where}"] += a.ssd
        method, complete, note = a.method, a.complete, a.note
        if not a.complete:
            counts = {p: None for p in PLACES}
    out = {"hits_by_source": counts, "sources_method": method, "sources_complete": complete}
    if note:
        out["sources_note"] = note
    return out


def replay_row(run: Running, trace: Trace, capacity_blocks: int, res: ReplayResult, block_bytes: int, held: dict,
               counter_samples: list, context: dict) -> dict:
    t = run.target
    hits = sum(res.hits)
    stored = res.store_attempts - res.put_failed - res.skipped
    loaded_bytes, stored_bytes = res.loaded * block_bytes, stored * block_bytes
    load_s, store_s = sum(res.lookup_load_s), sum(res.store_s)
    problems = []
    if res.wrong_bytes:
        problems.append(f"{res.wrong_bytes} wrong bytes in {res.verified} pages checked")
    row = {
        **_base(t.backend, trace, capacity_blocks, t.owners, t.ssd, **context),
        **run.describe(),
        "held_blocks": held.get("memory"),
        "held_ssd_blocks": held.get("ssd"),
        # fluxkv: fluxkv.kv's batch calls (one prefix lookup, batched loads into the engine's
        # buffers, batched stores); Mooncake: its batch zero-copy calls on registered buffers
        # (tracebench.clients.MooncakePages); Redis, memcached: one copying get per page until the
        # first miss, one put per page, or with --byte-access batch one multi-get and one
        # pipelined multi-put per chunk (tracebench.clients.BytePages).
        "access": "batch" if t.backend in ("fluxkv", "mooncake") else context.get("byte_access", "per-key"),
        "hits": hits,
        "hit_rate": hits / trace.accesses,
        "token_hit_rate": token_hits(trace, res.hits) / trace.tokens,
        "p50_ms": percentile_ms(res.lookup_load_s, 50),
        "p99_ms": percentile_ms(res.lookup_load_s, 99),
        "gib_per_s": (loaded_bytes + stored_bytes) / GiB / res.wall_s if res.wall_s else None,
        "load_gib_per_s": loaded_bytes / GiB / load_s if load_s else None,
        "store_gib_per_s": stored_bytes / GiB / store_s if store_s else None,
        "loaded_bytes": loaded_bytes,
        "stored_bytes": stored_bytes,
        **sources(run, res, counter_samples, context.get("byte_access") == "batch"),
        "store_attempts": res.store_attempts,
        "put_failed": res.put_failed,
        "already_cached_puts": res.skipped,
        "errors": res.errors,
        "verified_pages": res.verified,
        "wrong_bytes": res.wrong_bytes,
        "chained_puts": res.chained,
        "buffer_pages": res.buffer_pages,
        "wall_s": round(res.wall_s, 3),
        **cpu_fields(res, loaded_bytes + stored_bytes),
        "status": "failed" if problems else "ok",
    }
    if problems:
        row["reason"] = "; ".join(problems)
    return row


def cpu_fields(res, moved_bytes: int) -> dict:
    """The CPU the replay took: its client processes' and the servers' (None where not read),
    and both together per GiB moved (None without both or without bytes). On a machine whose
    cores the processes share, this is steadier than GiB/s, and where cores are plenty GiB/s
    follows its inverse."""
    out = {"client_cpu_s": round(res.client_cpu_s, 3), "server_cpu_s": None, "cpu_s_per_gib": None}
    if res.server_cpu_s is not None:
        out["server_cpu_s"] = round(res.server_cpu_s, 3)
        if moved_bytes:
            out["cpu_s_per_gib"] = (res.client_cpu_s + res.server_cpu_s) / (moved_bytes / GiB)
    return out


def write_jsonl(rows: list, path: Path) -> None:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:5.1f}"


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def trouble(r: dict) -> str:
    """What went wrong in a row that still counts ("" when nothing did): puts that failed and
    calls that raised or answered an error (fluxkv and Mooncake answer those as misses; a byte
    store's failed put is a page not stored). Such a row's hit rate and GiB/s are those of a
    cache that lost work, so the table and the goal lines say so next to its figures."""
    out = []
    if r.get("put_failed"):
        attempts = r.get("store_attempts")
        out.append(f"{r['put_failed']:,}" + (f" of {attempts:,}" if attempts else "") + " puts failed")
    if r.get("errors"):
        out.append(f"{r['errors']:,} errors")
    return ", ".join(out)


def _sources_text(r: dict) -> str:
    s = r.get("hits_by_source")
    if not s:
        text = ""
    elif not r.get("sources_complete"):
        text = "unknown"
    else:
        text = " ".join(f"{k.replace('memory', 'mem')}={v}" for k, v in s.items() if v)
    if t := trouble(r):
        text = f"{text} [{t}]" if text else f"[{t}]"
    return text


def _table_order(r: dict) -> tuple:
    sims = list(POLICIES)
    return (r["capacity_blocks"], r["owners"] is None, sims.index(r["backend"]) if r["backend"] in sims else 0,
            r["backend"], r["owners"] or 0, bool(r["ssd"]))


def table(rows: list) -> str:
    """The rows as a fixed-width table, capacities in order, simulations last in each."""
    head = f"{'backend':<12} {'own':>3} {'SSD':>3} {'capacity':>14} {'held':>7} {'hit %':>6} {'tok %':>6} {'p50 ms':>7} {'p99 ms':>7} {'GiB/s':>6}  sources / status"
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=_table_order):
        ssd = "" if r["ssd"] is None else ("on" if r["ssd"] else "off")
        cap = f"{r['capacity_blocks']:,} ({100 * r['capacity_fraction']:.1f}%)"
        tail = _sources_text(r) if r["status"] == "ok" else f"{r['status']}: {r.get('reason', '')}"
        lines.append(
            f"{r['backend']:<12} {'' if r['owners'] is None else r['owners']:>3} {ssd:>3} {cap:>14} {_num(r.get('held_blocks'), ','):>7} "
            f"{_pct(r['hit_rate']):>6} {_pct(r['token_hit_rate']):>6} {_num(r.get('p50_ms'), '.2f'):>7} {_num(r.get('p99_ms'), '.2f'):>7} "
            f"{_num(r.get('gib_per_s'), '.2f'):>6}  {tail}"
        )
    return "\n".join(lines)
