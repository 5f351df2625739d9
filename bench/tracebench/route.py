"""Which client process serves each request of a replay.

``rr`` (the default) gives request i to process i mod procs: a follow-up of a conversation lands
on any process, as behind a round-robin load balancer. ``prefix`` routes as a cache-aware router
does (SGLang's router, Mooncake's Conductor): a request goes to the process that last served the
longest prefix of its blocks, so a multi-owner cache finds the pages on the owner that process is
attached to; a request whose prefix nobody served, or whose process is overloaded, goes to the
process given the fewest blocks so far. Overloaded: given more than ``balance_abs`` blocks beyond
the least-loaded process *and* more than ``balance_rel`` times its blocks (the shape of SGLang's
router's balance test, both an absolute and a relative excess, counted here in blocks given so far
rather than requests in flight: a routing decided ahead has no queues to look at). The routing is
computed before the replay from the trace alone, so every backend gets the same assignment."""

from __future__ import annotations

ROUTES = ("rr", "prefix")

__all__ = ["ROUTES", "assign"]


def assign(block_ids: list, procs: int, route: str = "rr", balance_abs: int = 256, balance_rel: float = 1.1) -> list:
    """The process index of each request, given each request's block ids in arrival order."""
    if procs < 1:
        raise ValueError("procs must be at least 1")
    if route == "rr":
        return [i % procs for i in range(len(block_ids))]
    if route != "prefix":
        raise ValueError(f"unknown route {route!r}: want {', '.join(ROUTES)}")
    last: dict = {}  # block id -> the process that last served a request holding it
    load = [0] * procs  # blocks given to each process so far
    out = []
    for ids in block_ids:
        matched = 0
        while matched < len(ids) and ids[matched] in last:
            matched += 1
        least = min(range(procs), key=lambda p: (load[p], p))
        p = last[ids[matched - 1]] if matched else least
        if load[p] - load[least] > balance_abs and load[p] > balance_rel * load[least]:
            p = least
        out.append(p)
        load[p] += len(ids)
        for b in ids:
            last[b] = p
    return out
