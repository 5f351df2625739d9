"""Offline cache simulations of a trace with prefix semantics, the yardstick beside every
replay: a request looks its block ids up in order, is served the leading ones that are
cached and stops at its first miss; then every id from that miss on is inserted (one that is
still cached is offered again: most policies ignore it, Belady moves its next use on).

A *policy* is any object with two methods (so a new eviction idea can be tried here before it
is written into the master)::

    hit(block, now) -> bool    # is block cached? if so it is used (a hit) at access index now
    insert(block, now) -> None  # the request missed at or before block and stores it

``now`` is the index of this access in the trace's flattened id sequence (request after
request, each request's ids in order). Policies here: :class:`LRU`, :class:`S3FIFO` (10 %
small queue, ghost queue), :class:`Belady` (evicts the block used furthest in the future,
never stores one that is not used again) and :class:`Infinite` (the ideal)."""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

from .trace import Trace

__all__ = ["Policy", "LRU", "S3FIFO", "Belady", "Infinite", "SimResult", "simulate", "next_uses", "make", "POLICIES", "run_sims"]

NEVER = 1 << 62  # the next use of a block that is not used again


class Policy(Protocol):
    def hit(self, block: int, now: int) -> bool:
        ...

    def insert(self, block: int, now: int) -> None:
        ...


class Infinite:
    """Every block ever inserted stays: the most any cache can serve (the ideal)."""

    def __init__(self):
        self.blocks: set = set()

    def hit(self, block: int, now: int) -> bool:
        return block in self.blocks

    def insert(self, block: int, now: int) -> None:
        self.blocks.add(block)


class LRU:
    """Least recently used, ``capacity`` blocks."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity {capacity} must be at least one block")
        self.capacity = capacity
        self.order: OrderedDict = OrderedDict()

    def __contains__(self, block: int) -> bool:
        return block in self.order

    def hit(self, block: int, now: int) -> bool:
        if block in self.order:
            self.order.move_to_end(block)
            return True
        return False

    def insert(self, block: int, now: int) -> None:
        if block in self.order:
            return
        self.order[block] = None
        if len(self.order) > self.capacity:
            self.order.popitem(last=False)


class S3FIFO:
    """S3-FIFO (Yang et al., SOSP '23) over ``capacity`` blocks: a small FIFO of a tenth of
    them where new blocks start, a main FIFO for the rest, and a ghost FIFO of up to
    ``capacity`` ids recently dropped from the small one. A hit raises a block's count (at most
    3). The small queue's oldest block moves to main if it was hit there (count reset), else it
    is dropped into the ghost; a block inserted while in the ghost goes straight to main. Main's
    oldest block is put back with its count less one while the count is above zero, else
    evicted."""

    MAX_FREQ = 3

    def __init__(self, capacity: int, small_fraction: float = 0.1):
        if capacity < 2:
            raise ValueError(f"capacity {capacity} must be at least two blocks (a small and a main queue)")
        self.capacity = capacity
        self.small_cap = max(1, int(capacity * small_fraction))
        self.main_cap = capacity - self.small_cap
        self.small: deque = deque()
        self.main: deque = deque()
        self.freq: dict = {}
        self.ghost: OrderedDict = OrderedDict()

    def hit(self, block: int, now: int) -> bool:
        f = self.freq.get(block)
        if f is None:
            return False
        if f < self.MAX_FREQ:
            self.freq[block] = f + 1
        return True

    def insert(self, block: int, now: int) -> None:
        if block in self.freq:
            return
        while len(self.small) + len(self.main) >= self.capacity:
            if len(self.small) >= self.small_cap:
                self._evict_small()
            else:
                self._evict_main()
        if block in self.ghost:
            del self.ghost[block]
            self.main.append(block)
        else:
            self.small.append(block)
        self.freq[block] = 0

    def _evict_small(self) -> None:
        b = self.small.popleft()
        if self.freq[b] > 0:
            self.freq[b] = 0
            self.main.append(b)
            if len(self.main) > self.main_cap:
                self._evict_main()
            return
        del self.freq[b]
        self.ghost[b] = None
        if len(self.ghost) > self.capacity:
            self.ghost.popitem(last=False)

    def _evict_main(self) -> None:
        while True:
            b = self.main.popleft()
            f = self.freq[b]
            if f == 0:
                del self.freq[b]
                return
            self.freq[b] = f - 1
            self.main.append(b)


def next_uses(trace: Trace) -> list:
    """For each access of the flattened id sequence, the index of the next access of the
    same block (NEVER if there is none)."""
    flat = [b for r in trace.requests for b in r.hash_ids]
    out = [NEVER] * len(flat)
    seen: dict = {}
    for i in range(len(flat) - 1, -1, -1):
        b = flat[i]
        out[i] = seen.get(b, NEVER)
        seen[b] = i
    return out


class Belady:
    """The offline optimum over ``capacity`` blocks (Belady's MIN with bypass): when room is
    needed, the cached block whose next use is furthest away goes; a block that is never used
    again, or whose next use is further away than every cached block's, is not stored.
    ``next_use``: :func:`next_uses` of the trace being simulated. A max-heap of (next use,
    block) with stale entries skipped keeps each step O(log n)."""

    def __init__(self, capacity: int, next_use: list):
        if capacity < 1:
            raise ValueError(f"capacity {capacity} must be at least one block")
        self.capacity = capacity
        self.next_use = next_use
        self.cached: dict = {}  # block -> its next use
        self.heap: list = []  # (-next use, block); an entry is live while cached[block] == next use

    def _set(self, block: int, n: int) -> None:
        self.cached[block] = n
        heapq.heappush(self.heap, (-n, block))

    def hit(self, block: int, now: int) -> bool:
        if block not in self.cached:
            return False
        self._set(block, self.next_use[now])
        return True

    def insert(self, block: int, now: int) -> None:
        n = self.next_use[now]
        if block in self.cached:
            self._set(block, n)
            return
        if n == NEVER:
            return
        if len(self.cached) >= self.capacity:
            while True:  # drop stale heap entries down to the furthest live one
                neg, b = self.heap[0]
                if self.cached.get(b) == -neg:
                    break
                heapq.heappop(self.heap)
            if -neg <= n:
                return  # the new block would be the furthest: bypass it
            heapq.heappop(self.heap)
            del self.cached[b]
        self._set(block, n)


@dataclass
class SimResult:
    """What one simulation served."""

    policy: str
    capacity_blocks: int | None  # None: unbounded
    blocks: int = 0  # block accesses
    hits: int = 0  # block accesses served from cache (prefix)
    tokens: int = 0
    token_hits: int = 0
    seconds: float = 0.0
    per_request: list = field(default_factory=list)  # prefix hits of each request

    @property
    def hit_rate(self) -> float:
        return self.hits / self.blocks if self.blocks else 0.0

    @property
    def token_hit_rate(self) -> float:
        return self.token_hits / self.tokens if self.tokens else 0.0


def simulate(trace: Trace, policy: Policy, name: str = "custom", capacity_blocks: int | None = None) -> SimResult:
    """Run ``policy`` over ``trace`` with prefix semantics (module docstring)."""
    res = SimResult(name, capacity_blocks)
    t0 = time.perf_counter()
    now = 0
    hit, insert = policy.hit, policy.insert
    for r in trace.requests:
        ids = r.hash_ids
        n = len(ids)
        h = 0
        while h < n and hit(ids[h], now + h):
            h += 1
        for j in range(h, n):
            insert(ids[j], now + j)
        now += n
        res.per_request.append(h)
        res.blocks += n
        res.hits += h
        res.tokens += r.prefix_tokens(n)
        res.token_hits += r.prefix_tokens(h)
    res.seconds = time.perf_counter() - t0
    return res


# name in summary.jsonl -> constructor(capacity in blocks, next uses of the trace)
POLICIES = {
    "sim-lru": lambda cap, nu: LRU(cap),
    "sim-s3fifo": lambda cap, nu: S3FIFO(cap),
    "sim-belady": lambda cap, nu: Belady(cap, nu),
    "ideal": lambda cap, nu: Infinite(),
}


def make(name: str, capacity: int, next_use: list) -> Policy:
    """The policy called ``name`` (a key of :data:`POLICIES`) at ``capacity`` blocks."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: want one of {', '.join(POLICIES)}")
    return POLICIES[name](capacity, next_use)


def run_sims(trace: Trace, capacities: list, names=tuple(POLICIES)) -> list:
    """Every policy of ``names`` at every capacity (blocks); the ideal once (it has no size),
    its result repeated per capacity so each capacity's rows are complete."""
    nu = next_uses(trace) if "sim-belady" in names else []
    out = []
    ideal = simulate(trace, Infinite(), "ideal") if "ideal" in names else None
    for cap in capacities:
        for name in names:
            if name == "ideal":
                out.append(SimResult(**{**ideal.__dict__, "capacity_blocks": cap}))
            else:
                out.append(simulate(trace, make(name, cap, nu), name, cap))
    return out
