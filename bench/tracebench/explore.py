"""How much of a trace's reuse an online policy can serve: the offline experiment behind
docs/eviction.md ("Why the SSD-off goals ... are not met"). It replays a trace with the prefix
semantics of :mod:`tracebench.sim` through

* ``lru`` (the yardstick),
* ``page-order``: the master's KV page order run offline (master/pagepolicy.go: priority = the
  access clock at the last use plus ``bonus`` per doubling of the hits, capped by the parent's;
  a chain goes from its deep end; a put under a parent moves the chain above on to now; evicted
  pages keep their hits in a ghost four times the live pages),
* ``oracle-lhd``: a hit-density ranking (LHD, Beckmann et al., NSDI '18) whose table is computed
  from the whole trace's future: for each hit count so far (1 to 5+) and idle age, the hits
  still to come per block-tick of room, so no recency/frequency policy can rank better than it
  knows how,
* ``belady`` (the offline optimum of :class:`tracebench.sim.Belady`),

and splits each one's hits by how often the block was used before (1: a block's first reuse,
on the conversation trace the first follow-up of a conversation). ``--owners 3`` runs each
policy split over 3 owners as well (:class:`Split`: a third of the capacity each, requests
routed as the replay's ``--route`` does, a block stored by the owner that missed it, the page
order's clock and ghost shared as the master's pool shares them): what partitioning alone
costs, beside the replay's 3-owner rows. Run from the repository root::

    PYTHONPATH=bench python3 -m tracebench.explore [--trace FILE] [--requests N] [--capacities 18279,4000] [--owners 1,3]

The whole conversation trace takes about a minute per policy and capacity."""

from __future__ import annotations

import argparse
import collections
import heapq
import math
import random
import sys
import time

from . import route, sim
from .trace import DEFAULT_TRACE, Trace, load

__all__ = ["PageOrder", "OracleLHD", "Split", "lhd_table", "replay", "Result", "POLICIES", "main"]

BONUS = 1 << 14  # master/pagepolicy.go pageFreqBonus
GHOST_FACTOR = 4  # master/pagepolicy.go pageGhostFactor
REFRESH_DEPTH = 256  # master/pagepolicy.go refreshDepth
USE_CLASSES = 4  # hits are split by prior uses 1, 2, 3 and 4+


class _Chains:
    """The cached blocks' chains: each block's parent (the id before it in its request), its
    depth below the first cached block of its chain, and the cached blocks under each."""

    def __init__(self):
        self.parent: dict = {}
        self.depth: dict = {}
        self.kids: dict = collections.defaultdict(set)

    def add(self, block, parent) -> None:
        self.parent[block] = parent
        self.depth[block] = self.depth.get(parent, -1) + 1 if parent is not None else 0
        if parent is not None:
            self.kids[parent].add(block)

    def deep_end(self, block):
        """The deepest cached block under ``block`` (itself when none): a chain goes from there."""
        while self.kids.get(block):
            block = max(self.kids[block], key=self.depth.__getitem__)
        return block

    def remove(self, block) -> None:
        p = self.parent.pop(block)
        if p is not None and p in self.kids:
            self.kids[p].discard(block)
        del self.depth[block]
        self.kids.pop(block, None)


class Pool:
    """What the owners of one pool share in the master: the access clock and the ghost of
    evicted pages (master/pageghost.go), ``ghost_factor`` times the pool's ``capacity``."""

    def __init__(self, capacity: int, ghost_factor: int = GHOST_FACTOR):
        self.clock = 0
        self.ghost: collections.OrderedDict = collections.OrderedDict()
        self.ghost_len = ghost_factor * capacity

    def tick(self) -> int:
        self.clock += 1
        return self.clock


class PageOrder:
    """The master's page order over ``capacity`` blocks of one node (module docstring). Every
    insert or hit ticks the clock of ``pool`` (its own when none is given: one node), as the
    pool's access clock does."""

    def __init__(self, capacity: int, bonus: int = BONUS, ghost_factor: int = GHOST_FACTOR, pool: Pool | None = None):
        self.capacity, self.bonus = capacity, bonus
        self.pool = pool or Pool(capacity, ghost_factor)
        self.freq: dict = {}
        self.last: dict = {}
        self.chains = _Chains()
        self.heap: list = []  # (own priority, -depth, block); stale entries are skipped

    def __contains__(self, block) -> bool:
        return block in self.freq

    def _own(self, b) -> float:
        return self.last[b] + self.bonus * math.log2(self.freq[b])

    def _push(self, b) -> None:
        heapq.heappush(self.heap, (self._own(b), -self.chains.depth[b], b))

    def hit(self, block, parent, now) -> bool:
        if block not in self.freq:
            return False
        self.freq[block] += 1
        self.last[block] = self.pool.tick()
        self._push(block)
        return True

    def insert(self, block, parent, now) -> None:
        now = self.pool.tick()
        if block in self.freq:  # offered again after a miss before it: a use
            self.freq[block] += 1
            self.last[block] = now
            self._push(block)
            return
        self.freq[block] = self.pool.ghost.pop(block, 0) + 1
        self.last[block] = now
        self.chains.add(block, parent)
        up, n = parent, 0
        while up is not None and up in self.freq and n < REFRESH_DEPTH:  # the refresh
            self.last[up] = now
            self._push(up)
            up, n = self.chains.parent.get(up), n + 1
        self._push(block)
        while len(self.freq) > self.capacity:
            self._evict()

    def _evict(self) -> None:
        while True:
            own, d, b = heapq.heappop(self.heap)
            if b in self.freq and own == self._own(b):
                break
        v = self.chains.deep_end(b)  # the page of lowest own priority caps the pages under it
        if v != b:
            heapq.heappush(self.heap, (own, d, b))
        self.chains.remove(v)
        ghost = self.pool.ghost
        ghost[v] = self.freq[v]
        while len(ghost) > self.pool.ghost_len:
            ghost.popitem(last=False)
        del self.freq[v], self.last[v]


def lhd_table(trace: Trace, bucket: int = 64, buckets: int = 4096, classes: int = 5, horizon: int = 2000) -> list:
    """Hit density per (uses so far, idle age bucket) from the whole trace's future: the hits
    still to come for a block of that class at that age, over the block-ticks of room it holds
    until its next use, a block never used again holding room for ``horizon`` buckets."""
    hits = [[0.0] * buckets for _ in range(classes)]
    deaths = [0.0] * classes
    last: dict = {}
    uses: dict = {}
    t = 0
    for r in trace.requests:
        for b in r.hash_ids:
            t += 1
            if b in last:
                c = min(uses[b], classes) - 1
                hits[c][min((t - last[b]) // bucket, buckets - 1)] += 1
                uses[b] += 1
            else:
                uses[b] = 1
            last[b] = t
    for n in uses.values():
        deaths[min(n, classes) - 1] += 1
    table = []
    for c in range(classes):
        dens = [0.0] * buckets
        later = 0.0  # hits at ages >= a
        room = 0.0  # sum over those hits of (age - a + 1)
        for a in range(buckets - 1, -1, -1):
            later += hits[c][a]
            room += later
            dens[a] = later / (room + deaths[c] * max(horizon - a, 1)) if room or deaths[c] else 0.0
        table.append(dens)
    return table


class OracleLHD:
    """Evicts, of ``samples`` random cached blocks, the one of lowest hit density by
    :func:`lhd_table` (taking a chain from its deep end); one clock tick per insert or hit.
    It knows every block's whole past (uses and last use survive an eviction, as in a ghost
    of unbounded length) and, through the table, the statistics of the future."""

    def __init__(self, capacity: int, table: list, bucket: int = 64, samples: int = 32, seed: int = 1):
        self.capacity, self.table, self.bucket, self.samples = capacity, table, bucket, samples
        self.rand = random.Random(seed)
        self.clock = 0
        self.uses: dict = {}  # every block seen: uses so far
        self.last: dict = {}  # and the clock at its last use
        self.chains = _Chains()
        self.cached: list = []
        self.index: dict = {}  # cached block -> its place in cached

    def _density(self, b) -> float:
        dens = self.table[min(self.uses[b], len(self.table)) - 1]
        return dens[min((self.clock - self.last[b]) // self.bucket, len(dens) - 1)]

    def _use(self, block) -> None:
        self.clock += 1
        self.uses[block] = self.uses.get(block, 0) + 1
        self.last[block] = self.clock

    def __contains__(self, block) -> bool:
        return block in self.index

    def hit(self, block, parent, now) -> bool:
        if block not in self.index:
            return False
        self._use(block)
        return True

    def insert(self, block, parent, now) -> None:
        self._use(block)
        if block in self.index:
            return
        self.chains.add(block, parent)
        self.index[block] = len(self.cached)
        self.cached.append(block)
        while len(self.cached) > self.capacity:
            self._evict(block)

    def _evict(self, newest) -> None:
        best, low = None, None
        for _ in range(self.samples):
            c = self.cached[self.rand.randrange(len(self.cached))]
            if c != newest and (low is None or self._density(c) < low):
                best, low = c, self._density(c)
        v = self.chains.deep_end(best if best is not None else newest)
        self.chains.remove(v)
        i, tail = self.index.pop(v), self.cached.pop()
        if tail != v:
            self.cached[i], self.index[tail] = tail, i


class _Plain:
    """A :class:`tracebench.sim.Policy` (block, now) behind the (block, parent, now) calls."""

    def __init__(self, policy):
        self.policy = policy

    def __contains__(self, block) -> bool:
        return block in self.policy

    def hit(self, block, parent, now) -> bool:
        return self.policy.hit(block, now)

    def insert(self, block, parent, now) -> None:
        self.policy.insert(block, now)


class Split:
    """``owners`` instances of a policy, one per owner of a cluster, each over a share of the
    capacity: request i is served by owner ``route[i]``, which finds a block on whichever owner
    holds it (a hit counts there) and puts the blocks it missed in its own share, unless another
    owner holds one already (as a put's reject_if_exists). ``make(capacity)`` builds one
    owner's policy; each must answer ``block in policy``. One owner's policy sees the parents
    held elsewhere as absent, as the master's page order caps and refreshes only through pages
    on the same node (orphans, pages whose parent another owner evicted, are not modelled)."""

    def __init__(self, make, capacity: int, owners: int, route: list):
        if capacity < owners:
            raise ValueError(f"capacity {capacity} is below one block an owner ({owners} owners)")
        self.parts = [make(capacity // owners + (i < capacity % owners)) for i in range(owners)]
        self.route = route
        self.owner = 0
        self.where: dict = {}  # block -> the owner that last stored it (it may have evicted it since)

    def begin(self, request: int) -> None:
        self.owner = self.route[request]

    def _holder(self, block):
        p = self.where.get(block)
        if p is not None and block not in self.parts[p]:
            del self.where[block]
            return None
        return p

    def hit(self, block, parent, now) -> bool:
        p = self._holder(block)
        return p is not None and self.parts[p].hit(block, parent, now)

    def insert(self, block, parent, now) -> None:
        p = self._holder(block)
        if p is None:
            p = self.where[block] = self.owner
        self.parts[p].insert(block, parent, now)


class Result:
    """What one replay served: hits, and hits by the block's uses before (1 .. USE_CLASSES+)."""

    def __init__(self, policy: str, capacity: int):
        self.policy, self.capacity = policy, capacity
        self.accesses = 0
        self.hits = 0
        self.by_uses = [0] * USE_CLASSES
        self.seconds = 0.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0


def replay(trace: Trace, policy, name: str, capacity: int) -> Result:
    """Run ``policy`` (hit / insert with the block's parent, the id before it in the request)
    over ``trace`` with sim's prefix semantics."""
    res = Result(name, capacity)
    t0 = time.perf_counter()
    uses: collections.Counter = collections.Counter()
    now = 0
    begin = getattr(policy, "begin", None)
    for i, r in enumerate(trace.requests):
        if begin:
            begin(i)
        ids = r.hash_ids
        n, h = len(ids), 0
        while h < n and policy.hit(ids[h], ids[h - 1] if h else None, now + h):
            res.by_uses[min(uses[ids[h]], USE_CLASSES) - 1] += 1
            h += 1
        for j in range(h, n):
            policy.insert(ids[j], ids[j - 1] if j else None, now + j)
        for b in ids:
            uses[b] += 1
        now += n
        res.accesses += n
        res.hits += h
    res.seconds = time.perf_counter() - t0
    return res


# name -> constructor(capacity, trace, shared state): the policies main() runs, in order
POLICIES = {
    "lru": lambda cap, trace, memo: _Plain(sim.LRU(cap)),
    "page-order": lambda cap, trace, memo: PageOrder(cap, pool=memo.get("pool")),
    "oracle-lhd": lambda cap, trace, memo: OracleLHD(cap, memo.setdefault("lhd", lhd_table(trace))),
    "belady": lambda cap, trace, memo: _Plain(sim.Belady(cap, memo.setdefault("next", sim.next_uses(trace)))),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tracebench.explore", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE), help="trace file (Mooncake FAST'25 format; default: the shipped conversation trace)")
    ap.add_argument("--requests", type=int, default=0, help="replay the first N requests (default 0: all)")
    ap.add_argument("--capacities", default="0.1,4000", help="capacities in blocks, or fractions (< 1) of the distinct blocks (default 0.1,4000)")
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"of {', '.join(POLICIES)} (default: all)")
    ap.add_argument("--owners", default="1", help="comma-separated owner counts: each policy split over that many owners, "
                    "a share of the capacity each (Split; default 1)")
    ap.add_argument("--route", default="rr", choices=route.ROUTES, help="which owner serves each request when split (default rr)")
    a = ap.parse_args(argv)
    trace = load(a.trace)
    if a.requests:
        trace = Trace(trace.path, trace.requests[: a.requests])
    names = [p for p in a.policies.split(",") if p]
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        ap.error(f"unknown policies {', '.join(unknown)}: want {', '.join(POLICIES)}")
    owner_counts = [int(x) for x in a.owners.split(",") if x]
    if not owner_counts or min(owner_counts) < 1:
        ap.error(f"--owners {a.owners!r}: want counts of 1 or more")
    caps = []
    for c in a.capacities.split(","):
        v = float(c)
        caps.append(max(1, int(v * trace.distinct)) if v < 1 else int(v))
    print(f"{trace.path}: {len(trace.requests)} requests, {trace.accesses} block accesses, {trace.distinct} distinct blocks", flush=True)
    print(f"{'policy':<13} {'capacity':>9} {'hit %':>6} {'hits':>7} " + " ".join(f"{f'uses {i + 1}' + ('+' if i == USE_CLASSES - 1 else ''):>8}" for i in range(USE_CLASSES)) + "  seconds")
    memo: dict = {}
    for owners in owner_counts:
        routed = route.assign([r.hash_ids for r in trace.requests], owners, a.route)
        for cap in caps:
            for name in names:
                if owners == 1:
                    p, label = POLICIES[name](cap, trace, memo), name
                else:
                    shared = dict(memo, pool=Pool(cap))  # the owners share the pool's clock and ghost
                    p, label = Split(lambda c: POLICIES[name](c, trace, shared), cap, owners, routed), f"{name}/{owners}"
                r = replay(trace, p, label, cap)
                print(f"{label:<13} {cap:>9} {100 * r.hit_rate:>6.1f} {r.hits:>7} " + " ".join(f"{h:>8}" for h in r.by_uses) +
                      f"  {r.seconds:7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
