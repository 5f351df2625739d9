"""Counting: latency histograms that merge across threads and processes, hit attribution by
source (memory / SSD) with its completeness rule, and the per-thread tallies of a window."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Log-bucketed latency histogram: bucket i holds latencies in [G**i, G**(i+1)) µs, 1 % wide, so a
# percentile is exact to 1 % whatever the thread count; counts are plain ints and merge by sum.
_G = 1.01
_LOG_G = math.log(_G)


class Histogram:
    __slots__ = ("counts", "n")

    def __init__(self):
        self.counts: dict[int, int] = {}
        self.n = 0

    def add_us(self, us: float) -> None:
        i = int(math.log(us) / _LOG_G) if us > 1.0 else 0
        c = self.counts
        c[i] = c.get(i, 0) + 1
        self.n += 1

    def merge(self, other: "Histogram") -> None:
        for i, k in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + k
        self.n += other.n

    def percentile(self, p: float) -> float | None:
        """The p-th percentile (0-100) in µs: the geometric middle of the bucket holding it."""
        if self.n == 0:
            return None
        rank = max(1, math.ceil(p / 100.0 * self.n))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                return 1.0 if i == 0 else _G ** (i + 0.5)
        raise AssertionError("BUG: histogram counts do not add up")

    def to_json(self) -> dict:
        return {str(i): k for i, k in self.counts.items()}

    @classmethod
    def from_json(cls, d: dict) -> "Histogram":
        h = cls()
        for i, k in d.items():
            h.counts[int(i)] = h.counts.get(int(i), 0) + int(k)
            h.n += int(k)
        return h


# -- source attribution ----------------------------------------------------------------------------

SOURCES = ("memory", "ssd")


@dataclass
class Attribution:
    memory: int
    ssd: int
    unknown: int
    complete: bool
    method: str  # "per-get" | "counter" | "dram-only"
    note: str = ""


def attribute_per_get(hits: int, by_source: dict[str, int]) -> Attribution:
    """Each hit carried its own source (fluxkv's ``MemHolder.source``). Complete when every hit
    has exactly one known source: memory + ssd == hits and nothing else."""
    memory = int(by_source.get("memory", 0))
    ssd = int(by_source.get("ssd", 0))
    other = sum(int(v) for k, v in by_source.items() if k not in SOURCES)
    if memory + ssd == hits and other == 0:
        return Attribution(memory, ssd, 0, True, "per-get")
    # As the seed: counts that do not add up put every hit under unknown instead of guessing.
    note = f"per-get sources memory={memory} ssd={ssd} other={other} do not add up to hits={hits}"
    return Attribution(0, 0, hits, False, "per-get", note)


def attribute_dram_only(hits: int) -> Attribution:
    """A backend with no flash tier in this case: every hit came from memory."""
    return Attribution(hits, 0, 0, True, "dram-only")


def attribute_counter(hits: int, samples: list[tuple[float, float]]) -> Attribution:
    """SSD hits read off a monotonic server counter sampled at the window's start and end, one
    (start, end) pair per storage process (memcached's extstore reads; Mooncake's offload reads).
    The increase counts SSD hits, the rest of the hits are memory hits. If any counter went
    backwards, is missing, or the increase exceeds the hits, every hit is unknown: no guessing."""
    if not samples:
        return Attribution(0, 0, hits, False, "counter", "no counter samples")
    delta = 0
    for start, end in samples:
        if start is None or end is None:
            return Attribution(0, 0, hits, False, "counter", "a counter sample is missing")
        if end < start:
            return Attribution(0, 0, hits, False, "counter", f"counter went backwards ({start} -> {end})")
        delta += end - start
    delta = int(delta)
    if delta > hits:
        return Attribution(0, 0, hits, False, "counter", f"counter increase {delta} exceeds hits {hits}")
    return Attribution(hits - delta, delta, 0, True, "counter")


# Where a cluster hit came from: tier × (this owner | another owner), per response.
PLACES = ("memory_local", "memory_remote", "ssd_local", "ssd_remote")


def place_key(source, remote: bool) -> str:
    return f"{source or 'none'}_{'remote' if remote else 'local'}"


@dataclass
class PlaceSplit:
    """``hits`` split by place (``PLACES``, as ``<place>_hits`` fields). Complete when the four add
    up to the hits with nothing else; otherwise every count is None and ``note`` says why."""

    counts: dict
    complete: bool
    method: str  # "per-get" (each response's source and remote flag) | "topology" | "none"
    note: str = ""

    def fields(self) -> dict:
        return {f"{p}_hits": self.counts.get(p) for p in PLACES}


def split_by_place(hits: int, by_place: dict) -> PlaceSplit:
    """Per-response attribution (fluxkv: ``MemHolder.source`` and ``.remote``)."""
    counts = {p: int(by_place.get(p, 0)) for p in PLACES}
    other = {k: v for k, v in by_place.items() if k not in PLACES and v}
    if sum(counts.values()) == hits and not other:
        return PlaceSplit(counts, True, "per-get")
    note = f"per-get places {counts} (other {other}) do not add up to hits={hits}"
    return PlaceSplit({p: None for p in PLACES}, False, "per-get", note)


def split_all_remote(hits: int, memory: int | None, ssd: int | None, unknown: int | None) -> PlaceSplit:
    """A topology where no benchmark process stores anything (Mooncake's dedicated owner): every
    hit crossed the network; the tier split is the backend's own (counter) attribution."""
    if unknown or memory is None or ssd is None or memory + ssd != hits:
        return PlaceSplit({p: None for p in PLACES}, False, "topology", "tier sources incomplete: places unknown")
    return PlaceSplit({"memory_local": 0, "memory_remote": memory, "ssd_local": 0, "ssd_remote": ssd}, True, "topology")


def split_unplaced(why: str) -> PlaceSplit:
    """A topology whose hits may be local or remote, and a backend that does not say which."""
    return PlaceSplit({p: None for p in PLACES}, False, "none", why)


# -- per-thread tallies ----------------------------------------------------------------------------


@dataclass
class Tally:
    """What one worker thread counted inside the window (ops completed in [window start, end))."""

    hits: int = 0
    misses: int = 0
    errors: int = 0
    by_source: dict = field(default_factory=dict)  # "memory" / "ssd" / "none" → hits
    by_place: dict = field(default_factory=dict)  # "memory_local" / "memory_remote" / "ssd_local" / "ssd_remote" → hits (clusters)
    ops_total: int = 0  # every op issued, warmup and late ones included
    put_ok: int = 0  # read-through puts made in the window
    put_failed: int = 0
    hist: Histogram = field(default_factory=Histogram)
    error_samples: list = field(default_factory=list)
    stages: dict = field(default_factory=dict)  # cuda: stage name → Histogram

    def hit(self, source, latency_s: float, remote: bool | None = None) -> None:
        """One hit from ``source``; ``remote`` (None: the backend does not tell) says whether its
        bytes were pulled from another owner, counted in ``by_place``."""
        self.hits += 1
        k = source or "none"
        self.by_source[k] = self.by_source.get(k, 0) + 1
        if remote is not None:
            p = place_key(source, remote)
            self.by_place[p] = self.by_place.get(p, 0) + 1
        self.hist.add_us(latency_s * 1e6)

    def error(self, msg: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(msg[:300])

    def stage(self, name: str, seconds: float) -> None:
        h = self.stages.get(name)
        if h is None:
            h = self.stages[name] = Histogram()
        h.add_us(seconds * 1e6)

    def merge(self, o: "Tally") -> None:
        self.hits += o.hits
        self.misses += o.misses
        self.errors += o.errors
        for k, v in o.by_source.items():
            self.by_source[k] = self.by_source.get(k, 0) + v
        for k, v in o.by_place.items():
            self.by_place[k] = self.by_place.get(k, 0) + v
        self.ops_total += o.ops_total
        self.put_ok += o.put_ok
        self.put_failed += o.put_failed
        self.hist.merge(o.hist)
        for m in o.error_samples:
            if len(self.error_samples) < 5:
                self.error_samples.append(m)
        for name, h in o.stages.items():
            mine = self.stages.get(name)
            if mine is None:
                mine = self.stages[name] = Histogram()
            mine.merge(h)

    def to_json(self) -> dict:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "by_source": dict(self.by_source),
            "by_place": dict(self.by_place),
            "ops_total": self.ops_total,
            "put_ok": self.put_ok,
            "put_failed": self.put_failed,
            "hist": self.hist.to_json(),
            "error_samples": list(self.error_samples),
            "stages": {k: h.to_json() for k, h in self.stages.items()},
        }

    @classmethod
    def from_json(cls, d: dict) -> "Tally":
        t = cls(
            hits=d["hits"],
            misses=d["misses"],
            errors=d["errors"],
            by_source=dict(d["by_source"]),
            by_place=dict(d.get("by_place") or {}),
            ops_total=d["ops_total"],
            put_ok=d["put_ok"],
            put_failed=d["put_failed"],
            hist=Histogram.from_json(d["hist"]),
            error_samples=list(d["error_samples"]),
        )
        t.stages = {k: Histogram.from_json(v) for k, v in d.get("stages", {}).items()}
        return t


def gib_s(ops: int, payload_bytes: int, seconds: float) -> float:
    """Logical payload GiB/s: ops × payload ÷ window ÷ 2^30 (the seed's formula)."""
    return ops * payload_bytes / seconds / (1 << 30) if seconds > 0 else 0.0
