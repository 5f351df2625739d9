"""The page caches a replay worker talks to, one interface over two kinds of backend:

* :class:`FluxkvPages`: ``fluxkv.kv.PageStore`` on the process's fluxkv client, as an engine
  backend uses it: one ``contains_prefix`` call, ``get_pages_into`` the pages it found,
  ``put_pages`` the rest (with the chain's parent where this PageStore takes ``parent=``).
* :class:`MooncakePages`: Mooncake Store through its batch zero-copy calls, as an engine's
  Mooncake connector uses it: the process's page buffers registered once (``register_buffer``),
  ``batch_is_exist`` for the prefix lookup, ``batch_get_into`` the pages found, ``batch_put_from``
  the rest (a refusal for space retried, as the pressure adapter does for ``put``).
* :class:`BytePages`: a byte store (Redis, memcached) through the pressure harness's per-backend
  ``ThreadClient``. A byte store has no prefix lookup: the pages are got one by one, in order,
  until the first miss, and each hit is copied into the engine's buffer.

Hits by source: fluxkv's ``get_pages_into`` hides the holders it reads, so
:class:`FluxkvPages` taps its client's ``batch_get`` (the call the PageStore loads through),
notes each holder's ``source`` (memory / ssd) and ``remote`` before the PageStore copies from
it, and tallies those of the loaded prefix (a page found after a miss is no hit). The tally is
exact while the PageStore loads through ``batch_get``; a replay whose
tally does not add up to the pages loaded reports its sources unknown. Byte stores tell the
source per get where they know it (Redis: memory); otherwise (memcached with extstore,
Mooncake) hits are left unattributed here and the coordinator splits them by the server's SSD
read counter."""

from __future__ import annotations

import inspect
from collections import Counter

import numpy as np

__all__ = ["FluxkvPages", "MooncakePages", "BytePages"]


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

        self.client = client
        self.store = kv.PageStore(client, namespace, pin_ms=pin_ms, fail_open=True)
        self.chained = "parent" in inspect.signature(kv.PageStore.put_pages).parameters
        self.tally: Counter = Counter()
        self._places: dict = {}  # key -> place of the holder batch_get returned, for load's prefix
        inner = client.batch_get

        def batch_get(keys, **kw):
            holders = inner(keys, **kw)
            for k, h in zip(keys, holders):
                if h is not None:
                    self._places[k] = _source_key(h.source, getattr(h, "remote", None))
            return holders

        client.batch_get = batch_get  # an instance attribute: this process's client only

    def settle(self) -> None:
        """Wait for the client's background mapping of the segment (its populate thread) to
        end: set up, not the replay's work (it ran into the timed window, charged to the
        clients' CPU; a review)."""
        seg = getattr(getattr(self.client, "_s", None), "segment", None)
        t = getattr(seg, "populating", None)
        if t is not None:
            t.join(120)

    def lookup(self, ids) -> int:
        return self.store.contains_prefix(ids)

    def load(self, ids, bufs) -> int:
        """Load the pages of ``ids`` into ``bufs``; how many leading ones were found."""
        self._places.clear()
        found = self.store.get_pages_into(ids, bufs)
        n = 0
        while n < len(found) and found[n]:
            n += 1
        # Only the loaded prefix counts: a page found after a miss (the page before it was
        # evicted since the lookup) is a hit of no request.
        for h in ids[:n]:
            self.tally[self._places.get(self.store.key(h), "unknown")] += 1
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


class MooncakePages:
    """Pages of one prefix in Mooncake Store, through ``store`` (the process's
    ``MooncakeDistributedStore``) and its batch zero-copy calls on registered buffers. With SSD
    off every hit is a memory hit. With SSD on, the client's ``get_offload_rpc_read_count()`` is
    read around each ``batch_get_into``: it counts offload RPCs, one per call and storage endpoint
    holding some of the keys on flash, not pages (mooncake-store/src/real_client.cpp,
    ``batch_get_into_internal`` groups the LOCAL_DISK keys by endpoint and
    ``batch_get_into_offload_object_internal`` adds 1 per group). So the pages of a call that did
    not move it are memory hits, and those of a call that did are ``unknown`` (how many came from
    flash it cannot say): such a row's sources are incomplete (report.sources), never a count of
    calls passed off as one of pages. A lookup or load error (a negative code other
    than OBJECT_NOT_FOUND or REPLICA_IS_NOT_READY, another process's put still in flight, which
    upstream's client also takes for a miss) ends the prefix there, as a miss would, and is counted."""

    def __init__(self, store, prefix: str, block_bytes: int, ssd: bool, put_retries: int, sleep=None):
        import time

        from pressure.backends import mooncake as mc

        self.mc = mc
        self.store = store
        self.prefix = prefix
        self.block_bytes = block_bytes
        self.ssd = ssd
        self.source = "memory"  # SSD on: only for the pages of a load the offload counter did not see
        self.put_retries = put_retries
        self.sleep = sleep or time.sleep
        self.tally: Counter = Counter()
        self.errors: Counter = Counter()  # lookup / load / put errors by Mooncake's name
        self.wrong_bytes = 0  # of loads that returned another length: every byte counts wrong
        self.existed = 0
        self.registered: dict = {}  # buffer address -> size

    def key(self, block: int) -> str:
        return f"{self.prefix}/{block}"

    def register(self, bufs) -> None:
        """Register the page buffers with the store (what zero-copy loads and stores need)."""
        for b in bufs:
            ptr, size = int(b.ctypes.data), int(b.nbytes)
            rc = self.store.register_buffer(ptr, size)
            if rc != 0:
                raise RuntimeError(f"mooncake register_buffer({size} bytes) returned {rc} ({self.mc.error_name(rc)})")
            self.registered[ptr] = size

    def _addrs(self, bufs) -> tuple[list, list]:
        ptrs = [int(b.ctypes.data) for b in bufs]
        missing = [p for p in ptrs if p not in self.registered]
        if missing:
            raise RuntimeError(f"{len(missing)} page buffers not registered with mooncake")
        return ptrs, [int(b.nbytes) for b in bufs]

    def _error(self, rc: int) -> None:
        self.errors[self.mc.error_name(rc)] += 1

    def lookup(self, ids) -> int:
        if not ids:
            return 0
        found = self.store.batch_is_exist([self.key(b) for b in ids])
        n = 0
        while n < len(found) and found[n] == 1:
            n += 1
        if n < len(found) and found[n] < 0 and found[n] not in self.mc.MISS_CODES:
            self._error(found[n])
        return n

    def load(self, ids, bufs) -> int:
        ptrs, sizes = self._addrs(bufs)
        c0 = self.mc.read_counter(self.store) if self.ssd else None
        got = self.store.batch_get_into([self.key(b) for b in ids], ptrs, sizes)
        place = _source_key(self.source, True)
        if self.ssd:
            c1 = self.mc.read_counter(self.store)
            if c0 is None or c1 is None or c1 != c0:
                place = "unknown"  # some of this call's pages came from flash: how many, the counter cannot say
        n = 0
        while n < len(got) and got[n] > 0:
            if got[n] != self.block_bytes:
                self.wrong_bytes += self.block_bytes
            self.tally[place] += 1
            n += 1
        if n < len(got) and got[n] not in self.mc.MISS_CODES:
            self._error(got[n])
        return n

    def store_pages(self, ids, bufs, parent) -> int:
        """Store the pages; how many could not be stored. Keys refused for space
        (NO_AVAILABLE_HANDLE) are tried again, alone, with the pressure adapter's backoff."""
        ptrs, sizes = self._addrs(bufs)
        todo = list(range(len(ids)))
        failed = 0
        for attempt in range(self.put_retries + 1):
            rcs = self.store.batch_put_from([self.key(ids[i]) for i in todo], [ptrs[i] for i in todo], [sizes[i] for i in todo])
            again = []
            for i, rc in zip(todo, rcs):
                if rc == 0:
                    continue
                if rc == self.mc.OBJECT_ALREADY_EXISTS:
                    self.existed += 1
                elif rc == self.mc.NO_AVAILABLE_HANDLE and attempt < self.put_retries:
                    again.append(i)
                else:
                    failed += 1
                    self._error(rc)
            if not again:
                break
            todo = again
            self.sleep(self.mc.backoff_s(attempt))
        return failed

    def counters(self) -> dict:
        return {"sources": dict(self.tally), "errors": sum(self.errors.values()), "mooncake_errors": dict(self.errors),
                "wrong_bytes_values": self.wrong_bytes, "skipped": self.existed}


# The most value bytes one multi-get asks for (BytePages with batch): Redis counts a reply
# waiting in its output buffer against maxmemory and evicts cached keys for it (two readers
# of 1,024-key MGETs over 64 KiB values took 1,267 of 3,261 keys out of a full 256 MiB
# server, single GETs 3; a review), which memcached and the other backends' receive
# buffers do not.
BATCH_REPLY_BYTES = 4 << 20


class BytePages:
    """Pages as plain values of a byte store, under ``prefix/<id>``: one copying get per page
    until the first miss and one put per page, or with ``batch`` multi-gets of at most
    BATCH_REPLY_BYTES of pages until the first miss (the pages after it in its call come too,
    and are dropped) and one pipelined multi-put (memcached ``get k1 k2 ...`` and
    ``set_many``, Redis ``MGET`` and ``MSET``)."""

    def __init__(self, thread_client, prefix: str, block_bytes: int, batch: bool = False):
        self.c = thread_client
        self.prefix = prefix
        self.block_bytes = block_bytes
        self.batch = batch
        self.batch_keys = max(1, BATCH_REPLY_BYTES // max(1, block_bytes))
        self.tally: Counter = Counter()
        self.wrong_bytes = 0  # of hits whose value was not block_bytes long: every byte counts wrong
        self.put_errors: Counter = Counter()

    def key(self, block: int) -> str:
        return f"{self.prefix}/{block}"

    def lookup(self, ids) -> int:
        return len(ids)  # no prefix lookup: load() finds the first miss

    def load(self, ids, bufs) -> int:
        keys = [self.key(b) for b in ids]
        if not self.batch:
            for n, (k, buf) in enumerate(zip(keys, bufs)):
                got = self.c.get(k)
                if got is None:
                    return n
                try:
                    self._take(got, buf)
                finally:
                    got.release()
            return len(ids)
        for lo in range(0, len(keys), self.batch_keys):
            gots = self.c.get_many(keys[lo : lo + self.batch_keys])
            try:
                for j, got in enumerate(gots):
                    if got is None:
                        return lo + j
                    self._take(got, bufs[lo + j])
            finally:
                for got in gots:
                    if got is not None:
                        got.release()
        return len(ids)

    def _take(self, got, buf) -> None:
        """Copy a hit into buf (a value of another length counts every byte wrong)."""
        data = got.materialize()
        self.tally[_source_key(got.source, getattr(got, "remote", None))] += 1
        if len(data) == self.block_bytes:
            np.copyto(buf, np.frombuffer(data, dtype=np.uint8))
        else:
            self.wrong_bytes += self.block_bytes

    def store_pages(self, ids, bufs, parent) -> int:
        if self.batch:
            try:
                refused = self.c.put_many([(self.key(b), memoryview(buf)) for b, buf in zip(ids, bufs)])
            except Exception as e:  # noqa: BLE001 - a refused call is a miss of each page, as an engine would take it
                self.put_errors[type(e).__name__] += len(ids)
                return len(ids)
            if refused:
                self.put_errors["refused"] += len(refused)
            return len(refused)
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
