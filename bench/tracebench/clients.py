"""The page caches a replay worker talks to, one interface over two kinds of backend:

* :class:`FluxkvPages`: ``fluxkv.kv.PageStore`` on the process's fluxkv client, as an engine
  backend uses it: one ``contains_prefix`` call, ``get_pages_into`` the pages it found,
  ``put_pages`` the rest (with the chain's parent where this PageStore takes ``parent=``).
* :class:`BytePages`: a byte store (Redis, memcached, Mooncake Store) through the pressure
  harness's per-backend ``ThreadClient``. A byte store has no prefix lookup: the pages are got
  one by one, in order, until the first miss, and each hit is copied into the engine's buffer.

Hits by source: fluxkv's ``get_pages_into`` hides the holders it reads, so
:class:`FluxkvPages` taps its client's ``batch_get`` (the call the PageStore loads through)
and tallies each holder's ``source`` (memory / ssd) and ``remote`` before the PageStore copies
from it. The tally is exact while the PageStore loads through ``batch_get``; a replay whose
tally does not add up to the pages loaded reports its sources unknown. Byte stores tell the
source per get where they know it (Redis: memory); otherwise (memcached with extstore,
Mooncake) hits are left unattributed here and the coordinator splits them by the server's SSD
read counter."""

from __future__ import annotations

import inspect
from collections import Counter

import numpy as np

__all__ = ["FluxkvPages", "BytePages"]


def _source_key(source: str | None, remote: bool | None) -> str:
    """A hit's place as pressure.stats.PLACES names it (memory_local ... ssd_remote);
    ``unattributed`` when the backend did not say, ``unknown`` when it said something else."""
    if source not in ("memory", "ssd"):
        return "unattributed" if source is None else "unknown"
    return f"{source}_{'remote' if remote else 'local'}"


class FluxkvPages:
    """Pages of one namespace in fluxkv, through ``client`` (a fluxkv.Client this object
    borrows and taps)."""

    def __init__(self, client, namespace: str, pin_ms: int):
        from fluxkv import kv

        self.store = kv.PageStore(client, namespace, pin_ms=pin_ms, fail_open=True)
        self.chained = "parent" in inspect.signature(kv.PageStore.put_pages).parameters
        self.tally: Counter = Counter()
        inner = client.batch_get

        def batch_get(keys):
            holders = inner(keys)
            for h in holders:
                if h is not None:
                    self.tally[_source_key(h.source, getattr(h, "remote", None))] += 1
            return holders

        client.batch_get = batch_get  # an instance attribute: this process's client only

    def lookup(self, ids) -> int:
        return self.store.contains_prefix(ids)

    def load(self, ids, bufs) -> int:
        """Load the pages of ``ids`` into ``bufs``; how many leading ones were found."""
        found = self.store.get_pages_into(ids, bufs)
        n = 0
        while n < len(found) and found[n]:
            n += 1
        return n

    def store_pages(self, ids, bufs, parent) -> int:
        """Store the pages; how many could not be stored."""
        if self.chained:
            ok = self.store.put_pages(ids, bufs, parent=parent)
        else:
            ok = self.store.put_pages(ids, bufs)
        return len(ok) - sum(ok)

    def counters(self) -> dict:
        c = self.store.counters()
        return {"sources": dict(self.tally), "errors": c["errors"], "skipped": c["skipped"], "chained": self.chained}


class BytePages:
    """Pages as plain values of a byte store, under ``prefix/<id>``."""

    def __init__(self, thread_client, prefix: str, block_bytes: int):
        self.c = thread_client
        self.prefix = prefix
        self.block_bytes = block_bytes
        self.tally: Counter = Counter()
        self.wrong_bytes = 0  # of hits whose value was not block_bytes long: every byte counts wrong
        self.put_errors: Counter = Counter()

    def key(self, block: int) -> str:
        return f"{self.prefix}/{block}"

    def lookup(self, ids) -> int:
        return len(ids)  # no prefix lookup: load() finds the first miss

    def load(self, ids, bufs) -> int:
        for n, (b, buf) in enumerate(zip(ids, bufs)):
            got = self.c.get(self.key(b))
            if got is None:
                return n
            try:
                data = got.materialize()
                self.tally[_source_key(got.source, getattr(got, "remote", None))] += 1
                if len(data) == self.block_bytes:
                    np.copyto(buf, np.frombuffer(data, dtype=np.uint8))
                else:
                    self.wrong_bytes += self.block_bytes
            finally:
                got.release()
        return len(ids)

    def store_pages(self, ids, bufs, parent) -> int:
        failed = 0
        for b, buf in zip(ids, bufs):
            try:
                self.c.put(self.key(b), memoryview(buf))
            except Exception as e:  # noqa: BLE001 - a refused put is a counted miss, as an engine would take it
                failed += 1
                self.put_errors[type(e).__name__] += 1
        return failed

    def counters(self) -> dict:
        return {"sources": dict(self.tally), "errors": sum(self.put_errors.values()), "put_errors": dict(self.put_errors),
                "wrong_bytes_values": self.wrong_bytes}
