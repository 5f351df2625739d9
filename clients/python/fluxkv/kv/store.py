"""PageStore: one namespace of KV pages on top of a fluxkv client's batch calls.

Every method is one batch call per ``batch`` pages (a prefix lookup: one call per MAX_BATCH),
so an engine's lookup over hundreds of pages costs one owner round trip and, behind it, one
master call. Stores write the page header and the tensor's bytes straight into shared
memory (a :class:`fluxkv.Gather`); loads copy from shared memory into the caller's tensors,
or hand out read-only tensors over it.

With ``fail_open=True`` (what engine backends use) the cache being unreachable is never an
error: a lookup finds nothing, a load misses, a store stores nothing, and the engine
recomputes. A page of the wrong layout is still an error then: that is a configuration bug,
not an outage.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import time
import weakref

import fluxkv
from fluxkv._gen.external.constants import MAX_PIN_MS
from fluxkv._segment import buffer_address
from fluxkv.errors import AlreadyExists, Error, InvalidArgument, Unavailable

from fluxkv.kv.header import PAGE_HEADER_BYTES, PageCorrupt, PageHeader, PageLayoutMismatch, check_layout_tag, crc32_of
from fluxkv.kv.namespace import check_namespace, hash_text
from fluxkv.kv.tensors import describe, tensor_view

__all__ = ["PageStore"]

_log = logging.getLogger("fluxkv.kv")
_LOG_EVERY_S = 10.0
_COUNTERS = ("hits", "misses", "stored", "skipped", "errors")
# The most header kinds (dtype, shape, size) a store keeps packed; a store sees a few.
_HEADER_KINDS = 64


# Every PageStore of this process, for the fork hook below.
_stores: "weakref.WeakSet[PageStore]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_stores):
        store._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class PageStore:
    """The pages of one ``namespace`` (see :func:`fluxkv.kv.namespace`).

    ``client_or_socket``: a :class:`fluxkv.Client` (the store borrows it), or the owner's
    socket path (the store connects on first use, reconnects after a failure at most every
    ``retry_s`` seconds, and closes the client in :meth:`close`). ``layout``: a tag (at most
    20 ASCII bytes) every page records and every read checks. ``checksum``: record a CRC-32
    of each payload and check it on load. ``pin_ms``: how long :meth:`contains_prefix` pins
    the pages it found (0..MAX_PIN_MS) so the load that follows finds them in memory.
    ``batch``: the most pages one batch call of a load brings in (``get_pages`` keeps every
    chunk's views, and so their holders, until it returns). ``timeout``: seconds one call may take
    on a client this store opens (an owner that hangs costs an engine that long, then a miss
    when failing open)."""

    def __init__(
        self,
        client_or_socket,
        namespace: str,
        *,
        layout: str = "",
        checksum: bool = False,
        pin_ms: int = 1000,
        fail_open: bool = False,
        retry_s: float = 5.0,
        batch: int = 256,
        timeout: float = 10.0,
    ):
        self.namespace = check_namespace(namespace)
        check_layout_tag(layout)
        self.layout = layout
        self.checksum = bool(checksum)
        self.pin_ms = operator.index(pin_ms)
        if not 0 <= self.pin_ms <= MAX_PIN_MS:
            # Checked here, not at the first lookup: failing open, every lookup would
            # answer 0 for the process's life.
            raise ValueError(f"pin_ms {pin_ms} is out of range: 0 to {MAX_PIN_MS}")
        self.fail_open = bool(fail_open)
        self.batch = operator.index(batch)
        if self.batch < 1:
            raise ValueError(f"batch {batch} must be at least 1")
        self._retry_s = float(retry_s)
        self._timeout = float(timeout)
        if isinstance(client_or_socket, fluxkv.Client):
            self._client, self._socket, self._owns = client_or_socket, None, False
        else:
            self._client, self._socket, self._owns = None, client_or_socket, True
        self._lock = threading.Lock()
        # Serializes attaching (which may take attach_timeout) without holding _lock, which
        # counters() and the call paths take and must never wait on the network for.
        self._connect_lock = threading.Lock()
        self._next_try = 0.0
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._logged_at = -_LOG_EVERY_S
        self._unlogged = 0
        self._closed = False
        self._headers: dict = {}  # (dtype, shape, nbytes) -> (packed header, its address)
        _stores.add(self)

    def _after_fork_in_child(self) -> None:
        """Fresh locks in a forked child: a lock another thread of the parent held at fork()
        (an attach in progress holds _connect_lock for up to attach_timeout) would be held
        for good there, and every call of the child would wait on it. The client itself
        attaches again on its own (fluxkv.Client's fork handling); a child of a store not
        attached yet tries at once."""
        self._lock = threading.Lock()
        self._connect_lock = threading.Lock()
        if self._client is None:
            # An attach in progress set the next try ahead before it connected: the
            # child, which never saw its outcome, would refuse to attach until then.
            self._next_try = 0.0

    # -- keys --------------------------------------------------------------------------------

    def key(self, h) -> str:
        """The fluxkv key of page hash ``h``."""
        return f"{self.namespace}/{hash_text(h)}"

    def keys(self, hashes) -> list:
        return [self.key(h) for h in hashes]

    # -- lookups -------------------------------------------------------------------------------

    def contains_prefix(self, hashes, *, pin: bool = True) -> int:
        """How many leading pages of ``hashes`` are cached (one call; with ``pin``, pins them
        for pin_ms so the load that follows finds them in memory)."""
        ks = self.keys(hashes)
        if not ks:
            return 0
        pin_ms = self.pin_ms if pin else 0
        return self._guard(0, lambda c: c.batch_exists(ks, prefix=True, pin_ms=pin_ms))

    def contains(self, hashes) -> list:
        """Whether each page is cached."""
        ks = self.keys(hashes)
        if not ks:
            return []
        return self._guard([False] * len(ks), lambda c: c.batch_exists(ks))

    # -- stores ----------------------------------------------------------------------------------

    def put_pages(self, hashes, tensors, *, parent=None, chain: bool = True) -> list:
        """Store each tensor as the page of its hash; True where the page is cached after the
        call: stored now, or already cached (then it is not rewritten: counted as ``skipped``);
        False only failing open, where it could not be stored.

        With ``chain`` (the default) the hashes are consecutive pages of one prompt, and each
        page is put with its parent, so that eviction keeps a prompt's pages while the pages
        before them are cached, evicts them from the deep end first, and evicts first those
        whose prefix is gone: page i's parent is page i-1, page 0's is the page of hash
        ``parent`` (the page before it, e.g. the last of those :meth:`contains_prefix`
        found), or the root of the chain when ``parent`` is None. ``chain=False`` puts
        plain keys (pages in no known order); ``parent`` must then be None. A page already
        cached keeps the parent it was put with."""
        ks = self.keys(hashes)
        ts = list(tensors)
        _same_length(ks, ts, "tensors")
        if chain:
            head = "" if parent is None else self.key(parent)
            parents: list | None = [head] + ks[:-1]
        elif parent is not None:
            raise ValueError("parent names the page before a chain: it needs chain=True")
        else:
            parents = None
        if not ks:
            return []
        items = [(k, self._page_value(k, t, i)) for i, (k, t) in enumerate(zip(ks, ts))]

        def put(c):
            """(cached after the call, stored now) per item."""
            try:
                c.batch_put(items, reject_if_exists=True, parents=parents)
                return [True] * len(items), [True] * len(items)
            except Error as e:
                errors = getattr(e, "errors", None)
                if errors is None:
                    raise
            failed = [err for err in errors if err is not None and not isinstance(err, AlreadyExists)]
            if failed:
                if not self.fail_open:
                    # The batch's first error carried every item's outcome; this one may
                    # not be it (an AlreadyExists came first): it carries them now.
                    failed[0].errors = errors
                    raise failed[0]
                self._failed(failed[0], "put_pages")
            return [err is None or isinstance(err, AlreadyExists) for err in errors], [err is None for err in errors]

        none = [False] * len(items)
        cached, stored = self._guard((none, none), put)
        n = sum(stored)
        self._count(stored=n, skipped=sum(cached) - n)
        return cached

    def _page_value(self, key: str, t, i: int) -> fluxkv.Gather:
        buf = describe(t, writable=False, what=lambda: f"page {i} ({key!r})")
        if self.checksum:
            header = PageHeader(buf.dtype, buf.shape, self.layout, buf.nbytes, crc32_of(buf.address, buf.nbytes)).pack()
            at = buffer_address(header)
        else:
            header, at = self._header(buf)
        return fluxkv.Gather([(at, PAGE_HEADER_BYTES), (buf.address, buf.nbytes)], keep=(header, t))

    def _header(self, buf) -> tuple:
        """(the packed header, its address) of a page without a CRC: the same bytes for every
        page of one dtype and shape, so packed once per kind (a store sees a few)."""
        kind = (buf.dtype, buf.shape, buf.nbytes)
        got = self._headers.get(kind)
        if got is None:
            header = PageHeader(buf.dtype, buf.shape, self.layout, buf.nbytes).pack()
            if len(self._headers) >= _HEADER_KINDS:
                self._headers.clear()
            got = self._headers[kind] = (header, buffer_address(header))
        return got

    # -- loads -------------------------------------------------------------------------------------

    def get_pages_into(self, hashes, tensors) -> list:
        """Copy each cached page into its tensor (same dtype, shape and layout as stored, else
        PageLayoutMismatch before anything of that batch is copied, its ``index`` the position
        of the first such page in ``hashes``); True where it was copied,
        False for a miss. A tensor of a miss is left as it was. A payload that does not match
        its CRC is deleted (the next put stores it again) and raises PageCorrupt after the
        batch; failing open, that page alone answers False and the others of its batch load
        (its tensor then holds bytes to ignore). With ``checksum`` a page that carries no CRC
        is a miss (see _unchecked)."""
        ks = self.keys(hashes)
        ts = list(tensors)
        _same_length(ks, ts, "tensors")
        bufs = [describe(t, writable=True, what=lambda i=i, k=k: f"buffer {i} ({k!r})") for i, (k, t) in enumerate(zip(ks, ts))]
        out: list = []
        tally = [0, 0]  # hits, misses: counted once the call returns (a caller that loads again after
        # a PageLayoutMismatch of a later batch counted the earlier batches twice; a review)
        for lo in range(0, len(ks), self.batch):
            chunk = ks[lo : lo + self.batch]
            out += _at(lo, lambda: self._guard([False] * len(chunk), lambda c: self._load_into(c, chunk, bufs[lo : lo + len(chunk)], tally)))
        self._count(hits=tally[0], misses=tally[1])
        return out

    def _unchecked(self, hdr) -> bool:
        """Whether this store must not load a page of header ``hdr``: with ``checksum`` every
        page loaded carries a CRC-32, and one put by a store without it (another deployment
        sharing the namespace, or this one before checksum was switched on) is a miss; the
        caller deletes it (_drop_unchecked), so the next put stores it again with a CRC.
        Without that, lookups kept counting the page cached and puts skipped it, and every
        load of it failed for as long as it stayed. A page that carries a CRC is checked
        either way."""
        return self.checksum and hdr.crc32 is None

    def _drop_unchecked(self, c, ks: list) -> None:
        """Delete the pages _unchecked refused, and those whose payload failed its CRC (best
        effort: a failed delete leaves them to the next load)."""
        if not ks:
            return
        try:
            c.batch_delete(ks)
        except (Error, OSError) as e:
            _log.debug("fluxkv page store %s: deleting %d pages without a CRC-32 failed: %s", self.namespace, len(ks), e)

    def _batch_get(self, c, ks: list) -> list:
        """c.batch_get(ks), keeping the pages served when some keys fail on their own (a
        target that did not fit the pool, a failed pull): failing open, those answer as
        misses (counted and logged as failures); else the first raises."""
        errors: list = []
        holders = c.batch_get(ks, errors=errors)
        if errors:
            if not self.fail_open:
                for h in holders:
                    if h is not None:
                        h.release()
                raise errors[0][1]
            self._failed(errors[0][1], f"getting {len(errors)} of {len(ks)} pages")
        return holders

    def _corrupt(self, ks: list) -> None:
        """Report pages whose payload did not match its CRC (deleted by the caller): raised
        unless failing open, where each is a miss and the rest of its batch loads (one
        corrupt page made its whole batch miss, and, never deleted, every later load of it
        too: lookups counted it and puts skipped it; a review)."""
        if not ks:
            return
        more = f" ({len(ks) - 1} more pages of this batch)" if len(ks) > 1 else ""
        e = PageCorrupt(f"page {ks[0]!r}: its payload does not match the CRC-32 in its header{more}; deleted")
        if not self.fail_open:
            raise e
        self._failed(e, "loading pages")

    def _load_into(self, c, ks: list, bufs: list, tally: list) -> list:
        holders = self._batch_get(c, ks)
        unchecked, corrupt = [], []
        try:
            headers = []
            for i, (k, h, b) in enumerate(zip(ks, holders, bufs)):
                if h is None:
                    headers.append(None)
                    continue
                with _page_at(i):
                    hdr = PageHeader.unpack(h.read(0, min(len(h), PAGE_HEADER_BYTES)), k)
                    hdr.expect(key=k, dtype=b.dtype, shape=b.shape, layout=self.layout, value_len=len(h))
                if self._unchecked(hdr):
                    unchecked.append(k)
                    hdr = None
                headers.append(hdr)
            found = []
            for k, h, b, hdr in zip(ks, holders, bufs, headers):
                if hdr is not None:
                    h.copy_range_to(b.address, PAGE_HEADER_BYTES, hdr.nbytes)
                    if hdr.crc32 is not None and crc32_of(b.address, hdr.nbytes) != hdr.crc32:
                        corrupt.append(k)
                        hdr = None
                found.append(hdr is not None)
        finally:
            for h in holders:
                if h is not None:
                    h.release()
        self._drop_unchecked(c, unchecked + corrupt)
        n = sum(found)
        tally[0] += n
        tally[1] += len(found) - n
        self._corrupt(corrupt)
        return found

    def get_pages(self, hashes, *, numpy: bool = False) -> list:
        """A zero-copy read-only tensor (a numpy array with ``numpy=True``) of each cached page,
        of its stored dtype and shape, or None for a miss. Each keeps its page's bytes in the
        owner's memory for as long as it lives; writing into one faults (the mapping is
        read-only). Layout: as :meth:`get_pages_into` (a PageLayoutMismatch leaves no view)."""
        ks = self.keys(hashes)
        out: list = []
        tally = [0, 0]  # hits, misses: counted once the call returns (as get_pages_into's)
        try:
            for lo in range(0, len(ks), self.batch):
                chunk = ks[lo : lo + self.batch]
                out += _at(lo, lambda: self._guard([None] * len(chunk), lambda c: self._views(c, chunk, numpy, tally)))
        except BaseException:
            out.clear()  # no view outlives the call in this frame (a traceback keeps it)
            raise
        self._count(hits=tally[0], misses=tally[1])
        return out

    def _views(self, c, ks: list, numpy: bool, tally: list) -> list:
        holders = self._batch_get(c, ks)
        views: list = []
        unchecked, corrupt, untyped = [], [], []
        v = None
        try:
            for i, (k, h) in enumerate(zip(ks, holders)):
                if h is None:
                    views.append(None)
                    continue
                with _page_at(i):
                    hdr = PageHeader.unpack(h.read(0, min(len(h), PAGE_HEADER_BYTES)), k)
                    hdr.expect(key=k, dtype=None, shape=None, layout=self.layout, value_len=len(h))
                if self._unchecked(hdr):
                    unchecked.append(k)
                    views.append(None)
                    continue
                if hdr.crc32 is not None and crc32_of(h.address + PAGE_HEADER_BYTES, hdr.nbytes) != hdr.crc32:
                    corrupt.append(k)
                    views.append(None)
                    continue
                try:
                    v = tensor_view(h, hdr.dtype, hdr.shape, numpy)
                except InvalidArgument as e:
                    if not self.fail_open:
                        raise
                    # A page numpy has no type for (bfloat16): a miss alone, the rest of
                    # its batch still viewed (it made the whole batch miss; a review).
                    untyped.append(e)
                    views.append(None)
                    continue
                views.append(v)
        except BaseException:
            views.clear()  # the views go first, so each holder's bytes are handed back below
            v = None
            raise
        finally:
            for h in holders:
                if h is not None:
                    h.release()  # acked once its view is gone
        v = None
        self._drop_unchecked(c, unchecked + corrupt)
        n = sum(v is not None for v in views)
        tally[0] += n
        tally[1] += len(views) - n
        if untyped:
            self._failed(untyped[0], "viewing pages")
        if corrupt:
            try:
                self._corrupt(corrupt)
            except BaseException:
                views.clear()  # no view outlives the raise
                raise
        return views

    # -- removal and status --------------------------------------------------------------------

    def delete_pages(self, hashes) -> list:
        """Remove pages; True where one existed. Views and holders of them keep their bytes."""
        ks = self.keys(hashes)
        if not ks:
            return []
        return self._guard([False] * len(ks), lambda c: c.batch_delete(ks))

    def delete_namespace(self) -> int:
        """Remove every page of this namespace, cluster-wide; the count removed. Costs the
        namespace's pages, not the whole cache (one master call per 4,096 pages): a namespace
        of millions of pages may outlast the call ``timeout``; the owner finishes the delete
        anyway, and a repeat counts what was left."""
        return self._guard(0, lambda c: c.delete_namespace(self.namespace))

    def stats(self) -> dict:
        """``pages`` and ``bytes`` of the namespace cluster-wide (None when failing open while
        the cache is unreachable), and this store's counters: ``hits``, ``misses``, ``stored``,
        ``skipped`` (already cached), ``errors`` (failures answered as misses)."""
        st = self._guard(None, lambda c: c.namespace_stat(self.namespace))
        return {"pages": st["keys"] if st else None, "bytes": st["bytes"] if st else None, **self.counters()}

    def counters(self) -> dict:
        """This store's counters (as :meth:`stats`), without asking the cluster."""
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        """Close the client if this store opened it. Idempotent."""
        with self._lock:
            self._closed = True
            c, self._client = self._client, (None if self._owns else self._client)
        if self._owns and c is not None:
            c.close()

    def __enter__(self) -> "PageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fluxkv.kv.PageStore {self.namespace!r} layout={self.layout!r}>"

    # -- internals -----------------------------------------------------------------------------

    def _connected(self) -> "fluxkv.Client":
        with self._lock:
            if self._closed:
                raise Error("the page store is closed")
            if self._client is not None:
                return self._client
        with self._connect_lock:
            with self._lock:
                if self._closed:
                    raise Error("the page store is closed")
                if self._client is not None:
                    return self._client
                now = time.monotonic()
                if now < self._next_try:
                    raise Unavailable(f"the owner at {self._socket!r} was unreachable; next try in {self._next_try - now:.1f} s")
                self._next_try = now + self._retry_s
            try:
                c = fluxkv.connect(self._socket, timeout=self._timeout, attach_timeout=min(self._timeout, 10.0))
            except (Error, OSError) as e:
                raise Unavailable(f"cannot attach to the owner at {self._socket!r}: {e}") from e
            with self._lock:
                closed = self._closed
                if not closed:
                    self._client = c
            if closed:
                c.close()
                raise Error("the page store is closed")
            return c

    def _guard(self, missing, op):
        """op(client); failing open, an outage answers ``missing`` instead of raising."""
        try:
            return op(self._connected())
        except PageLayoutMismatch:
            raise
        except (Error, OSError) as e:
            if not self.fail_open:
                raise
            self._failed(e, getattr(op, "__name__", "call"))
            return missing

    def _failed(self, e: BaseException, what: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._counts["errors"] += 1
            if now - self._logged_at < _LOG_EVERY_S:
                self._unlogged += 1
                return
            self._logged_at, quiet, self._unlogged = now, self._unlogged, 0
        _log.warning(
            "fluxkv page store %s: %s failed, answered as not cached (%s)%s",
            self.namespace,
            what,
            e,
            f"; {quiet} more failures not logged" if quiet else "",
        )

    def _count(self, **n) -> None:
        with self._lock:
            for k, v in n.items():
                self._counts[k] += v


class _page_at:
    """Gives a PageLayoutMismatch raised inside the block the page's ``index`` in its batch."""

    def __init__(self, i: int):
        self.i = i

    def __enter__(self) -> None:
        pass

    def __exit__(self, typ, e, tb) -> bool:
        if isinstance(e, PageLayoutMismatch):
            e.index = self.i
        return False


def _at(lo: int, load):
    """load() of the batch starting at ``lo``: a PageLayoutMismatch's index moves from the
    batch to the whole call."""
    try:
        return load()
    except PageLayoutMismatch as e:
        if e.index is not None:
            e.index += lo
        raise


def _same_length(keys: list, items: list, what: str) -> None:
    if len(keys) != len(items):
        raise ValueError(f"{len(keys)} hashes but {len(items)} {what}")
