"""fluxkv as an LMCache remote storage plugin (and so as vLLM's KV cache through LMCache).

LMCache configuration::

    remote_storage_plugins: ["fluxkv"]
    extra_config:
      remote_storage_plugin.fluxkv.module_path: fluxkv.integrations.lmcache
      remote_storage_plugin.fluxkv.class_name: FluxKVConnectorAdapter
      remote_storage_plugin.fluxkv.url: fluxkv:///run/fluxkv/fluxkv.sock
      remote_storage_plugin.fluxkv.timeout_s: 5     # optional

``timeout_s`` (optional) is how long one owner call may take, in seconds (PageStore's
``timeout``; PageStore's default when unset). A named instance ``fluxkv.<instance>`` reads
``remote_storage_plugin.fluxkv.<instance>.*``; the legacy ``remote_url`` form reads
``remote_storage_plugin.fluxkv.timeout_s``.

The interface met here (LMCache's v1 storage backend, 0.4/0.5 series: ``CacheEngineKey``
without ``fmt``, ``RemoteConnector.__init__(config, metadata)``, ``ConnectorContext.plugin_name``):

- Plugin loading (``lmcache.v1.storage_backend.connector.ConnectorManager``): for each name in
  ``remote_storage_plugins`` LMCache imports ``extra_config["remote_storage_plugin.<name>.module_path"]``,
  takes ``.class_name`` from it and, if it subclasses ``ConnectorAdapter``, instantiates it with
  no arguments. Each plugin gets its own ``RemoteBackend`` whose connector is created from the
  virtual URL ``plugin://<name>``: the first adapter whose ``can_parse(url)`` is true builds it
  with ``create_connector(context)``, ``context`` carrying ``url``, ``loop``,
  ``local_cpu_backend``, ``config``, ``metadata`` and ``plugin_name``. A name is ``<type>`` or
  ``<type>.<instance>``; the plugin's own settings are ``remote_storage_plugin.<name>.*`` keys.
  The deprecated ``remote_url: fluxkv:///...`` reaches the same adapter with the real URL.
  LMCache wraps the connector (``InstrumentedRemoteConnector``), which drops the caller's
  reference to a MemoryObj after ``put`` / ``batched_put``: a connector does not.
- ``RemoteConnector`` (``...connector.base_connector``): abstract async ``exists(key)``,
  ``exists_sync(key)`` (called off the event loop), async ``get(key) -> MemoryObj | None``,
  async ``put(key, memory_obj)``, async ``list() -> list[str]``, async ``close()``; optional,
  each behind a ``support_*()`` switch: async ``batched_get(keys) -> list[MemoryObj | None]``,
  async ``batched_put(keys, memory_objs)``, ``batched_contains(keys) -> int`` (leading keys
  present; older releases also passed ``stop_after_first_not_exits``), async
  ``batched_async_contains(lookup_id, keys, pin=False) -> int``, async
  ``batched_get_non_blocking(lookup_id, keys) -> list[MemoryObj]`` (the leading objects found;
  the rest must be released), async ``ping() -> int``; and ``remove_sync(key) -> bool``. The
  base's ``__init__`` sets ``meta_fmt``: ``KV_MLA_FMT`` for MLA models, else ``KV_2LTD``.
- ``CacheEngineKey`` (``lmcache.utils``): ``model_name``, ``world_size``, ``worker_id``,
  ``chunk_hash`` (int), ``dtype`` (torch), ``tags`` (from ``lmcache.tag.*`` request configs);
  ``to_string()`` is ``model@world_size@worker_id@<hash hex>@<dtype>[@tag%value...]``.
  ``LayerCacheEngineKey`` adds ``layer_id``.
- ``MemoryObj`` (``lmcache.v1.memory_management``): ``tensor`` (the chunk, e.g. KV_2LTD
  ``[2, num_layers, num_tokens, hidden]``), ``get_shape()``, ``get_dtype()``,
  ``get_memory_format()``, ``byte_array``, ``ref_count_up/down()``. Upstream connectors store
  a ``RemoteMetadata`` (length, shape, dtype, format) in front of the bytes so that ``get`` can
  allocate before reading, with ``local_cpu_backend.allocate(shape, dtype, fmt)``, and answer
  None when it returns None (the last chunk of a prompt may hold fewer tokens).
- ``RemoteBackend`` runs the connector's coroutines on its own event loop and waits for each
  with a timeout, cancelling the coroutine when it passes.

Here a chunk is one :class:`fluxkv.kv.PageStore` page. The page header already records the
tensor's dtype and shape; the format (the connector's ``meta_fmt``, on every path) is part of
the namespace and the layout tag. A chunk handed to ``put`` in another format is not stored
(nothing would read it): it is counted (``wrong_format``) and logged. Keys:
``kv1/<model>/tp<worker_id>of<world_size>/pp0of1/<dtype>/<format>/lmcache/<chunk hash hex>``
(``.<layer>`` after the hash for a layer key, ``~<digest>`` for tagged keys). ``get`` reads a
zero-copy view of the page (so the shape is known before anything is allocated), allocates
from LMCache's local CPU backend and copies once. Every batched form is one batch call; a
prefix lookup is one call (``contains_prefix``, which pins what it found, when ``pin``).
A batched put's chunks go as one chain of pages, so eviction keeps a prompt's chunks from
the front (see ``FluxKVConnector._store_all``). PageStore calls block, so the async methods
run them on the connector's worker threads.
A thread cannot be stopped, so cancelling an async method (LMCache's timeout) leaves its
work running to the end: a cancelled load releases the MemoryObjs it allocated when it
finishes, and a store holds its own reference to each MemoryObj until it has copied it (the
caller may drop its reference as soon as the call is cancelled).

fluxkv down is never an error: the stores fail open, so a lookup finds nothing, a get
misses, a put stores nothing, and LMCache recomputes; failures are logged (at most every
10 s) and counted (:meth:`FluxKVConnector.stats`). A page of another layout in the
namespace (a configuration bug) is answered as a miss too, logged as an error and counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib.util
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Iterator, Optional
from urllib.parse import urlparse

from fluxkv import kv

if TYPE_CHECKING:
    import torch
    from lmcache.v1.storage_backend.connector import ConnectorContext

__all__ = ["FluxKVConnectorAdapter", "FluxKVConnector", "PLUGIN_TYPE", "socket_path_of"]

_log = logging.getLogger("fluxkv.integrations.lmcache")

PLUGIN_TYPE = "fluxkv"
SCHEME = "fluxkv://"
_PLUGIN_SCHEME = "plugin://"
# What the namespace's "extra" part says: these pages hold LMCache chunks.
_NAMESPACE_TAG = "lmcache"
# How often a repeating problem (a chunk of another format, a page of another layout) is logged.
_LOG_EVERY_S = 10.0
_COUNTERS = ("alloc_failures", "wrong_format", "layout_mismatches")

if importlib.util.find_spec("lmcache") is not None:
    from lmcache.v1.storage_backend.connector import ConnectorAdapter
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
else:  # LMCache is not installed: bases of the same shape, so this module still imports.

    class RemoteConnector:  # type: ignore[no-redef]
        """Stand-in for LMCache's RemoteConnector: a connector needs LMCache itself."""

        def __init__(self, config, metadata):
            raise RuntimeError("fluxkv.integrations.lmcache: LMCache is not installed (pip install lmcache)")

    class ConnectorAdapter:  # type: ignore[no-redef]
        """Stand-in for LMCache's ConnectorAdapter."""

        def __init__(self, schema: str = ""):
            self.schema = schema


def socket_path_of(url: str) -> str:
    """The owner socket of ``fluxkv:///path/to/fluxkv.sock``; ValueError for another URL."""
    u = urlparse(url)
    if u.scheme != PLUGIN_TYPE or u.netloc or not u.path.startswith("/") or u.query or u.fragment:
        raise ValueError(f"fluxkv URL {url!r}: expected fluxkv:///path/to/fluxkv.sock (an absolute socket path)")
    return u.path


def _plugin_type(plugin_name: str) -> str:
    return plugin_name.split(".", 1)[0]


class FluxKVConnectorAdapter(ConnectorAdapter):
    """The adapter LMCache's config names: it takes ``fluxkv://`` URLs and the virtual
    ``plugin://fluxkv[.<instance>]`` URL of a plugin backend (whose socket URL is
    ``extra_config["remote_storage_plugin.<name>.url"]``)."""

    def __init__(self) -> None:
        super().__init__(SCHEME)

    def can_parse(self, url: str) -> bool:
        if url.startswith(SCHEME):
            return True
        return url.startswith(_PLUGIN_SCHEME) and _plugin_type(url[len(_PLUGIN_SCHEME) :]) == PLUGIN_TYPE

    def create_connector(self, context: ConnectorContext) -> "FluxKVConnector":
        url = context.url if context.url.startswith(SCHEME) else _plugin_url(context)
        timeout = _plugin_setting(context, "timeout_s")
        return FluxKVConnector(
            socket_path_of(url),
            context.local_cpu_backend,
            context.config,
            context.metadata,
            timeout_s=None if timeout is None else float(timeout),
        )


def _plugin_name(context) -> str:
    """``fluxkv[.<instance>]``: the plugin's name, or ``fluxkv`` for the legacy remote_url."""
    if context.plugin_name:
        return context.plugin_name
    if context.url.startswith(_PLUGIN_SCHEME):
        return context.url[len(_PLUGIN_SCHEME) :]
    return PLUGIN_TYPE


def _plugin_setting(context, setting: str):
    extra = (context.config.extra_config if context.config else None) or {}
    return extra.get(f"remote_storage_plugin.{_plugin_name(context)}.{setting}")


def _plugin_url(context) -> str:
    url = _plugin_setting(context, "url")
    if not url:
        setting = f"remote_storage_plugin.{_plugin_name(context)}.url"
        raise ValueError(f"LMCache plugin {_plugin_name(context)!r}: set extra_config {setting}: fluxkv:///path/to/fluxkv.sock")
    return url


class _Throttled:
    """A log line of a problem that repeats: written at most every _LOG_EVERY_S seconds,
    with the number held back since."""

    def __init__(self, level: int):
        self._level = level
        self._lock = threading.Lock()
        self._at = -_LOG_EVERY_S
        self._held = 0

    def __call__(self, msg: str, *args) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._at < _LOG_EVERY_S:
                self._held += 1
                return
            self._at, held, self._held = now, self._held, 0
        _log.log(self._level, msg + ("; %d more not logged" if held else ""), *args, *((held,) if held else ()))


class FluxKVConnector(RemoteConnector):
    """LMCache chunks as fluxkv pages (see the module docstring for the key layout).

    One fail-open :class:`fluxkv.kv.PageStore` per namespace, opened on first use on the
    owner socket ``socket_path`` (with ``timeout=timeout_s`` when given); a worker normally
    uses one. Results of ``get`` are allocated from ``local_cpu_backend``."""

    def __init__(self, socket_path: str, local_cpu_backend, config, metadata, *, timeout_s: Optional[float] = None):
        super().__init__(config, metadata)
        self.socket_path = socket_path
        self.local_cpu_backend = local_cpu_backend
        self._store_options = {} if timeout_s is None else {"timeout": timeout_s}
        self._workers = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="fluxkv-lmcache")
        self._lock = threading.Lock()
        self._stores: dict[str, kv.PageStore] = {}  # by namespace; guarded by _lock
        self._counts = dict.fromkeys(_COUNTERS, 0)  # guarded by _lock
        self._log_format = _Throttled(logging.WARNING)
        self._log_mismatch = _Throttled(logging.ERROR)

    def __repr__(self) -> str:
        return f"<FluxKVConnector {self.socket_path}>"

    # -- keys ------------------------------------------------------------------------------

    def _store(self, key) -> kv.PageStore:
        fmt = self.meta_fmt.name
        ns = kv.namespace(
            key.model_name,
            tp_rank=key.worker_id,
            tp_size=key.world_size,
            dtype=str(key.dtype).removeprefix("torch."),
            layout=fmt,
            extra=_NAMESPACE_TAG,
        )
        with self._lock:
            store = self._stores.get(ns)
            if store is None:
                store = self._stores[ns] = kv.PageStore(
                    self.socket_path, ns, layout=fmt, fail_open=True, **self._store_options
                )
            return store

    def _runs(self, keys: list) -> Iterator[tuple[kv.PageStore, int, list]]:
        """(store, index of the first key, page hashes) for each run of consecutive keys that
        share a store: one run, so one batch call, unless keys of several namespaces mix."""
        run_store, start, hashes = None, 0, []
        for i, key in enumerate(keys):
            store = self._store(key)
            if store is not run_store and hashes:
                yield run_store, start, hashes
                start, hashes = i, []
            run_store = store
            hashes.append(_page_hash(key))
        if hashes:
            yield run_store, start, hashes

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    # -- worker threads --------------------------------------------------------------------

    async def _off_loop(self, fn: Callable, *args, abandoned: Optional[Callable] = None):
        """fn(*args) on a worker thread. Cancelling the await does not stop the worker: its
        work runs to the end, and then ``abandoned`` gets its result (to release it)."""
        return await _wait(self._workers.submit(fn, *args), abandoned)

    # -- lookups ---------------------------------------------------------------------------

    def exists_sync(self, key) -> bool:
        return self._prefix([key], pin=False) == 1

    async def exists(self, key) -> bool:
        return await self._off_loop(self.exists_sync, key)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list, stop_after_first_not_exits: bool = True) -> int:
        """How many leading keys are stored (one call). ``stop_after_first_not_exits``, which
        older LMCache releases pass, is accepted and ignored: the count always stops at the
        first key not stored."""
        return self._prefix(list(keys), pin=False)

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list, pin: bool = False) -> int:
        """How many leading keys are stored (one call); ``pin`` keeps those in the owner's
        memory for the load that follows."""
        return await self._off_loop(self._prefix, list(keys), pin)

    def _prefix(self, keys: list, pin: bool) -> int:
        n = 0
        for store, _, hashes in self._runs(keys):
            found = store.contains_prefix(hashes, pin=pin)
            n += found
            if found < len(hashes):
                break
        return n

    # -- loads -----------------------------------------------------------------------------

    async def get(self, key):
        return (await self.batched_get([key]))[0]

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys: list) -> list:
        """A MemoryObj for each stored key, None for a miss or where the local CPU backend had
        no room; one batch call."""
        return await self._off_loop(self._load, list(keys), abandoned=_release)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys: list) -> list:
        """The MemoryObjs of the leading keys found; what was loaded after a miss is released."""
        objs = await self.batched_get(keys)
        n = _leading([o is not None for o in objs])
        for o in objs[n:]:
            if o is not None:
                o.ref_count_down()
        return objs[:n]

    def _load(self, keys: list) -> list:
        out: list = [None] * len(keys)
        try:
            for store, start, hashes in self._runs(keys):
                try:
                    views = store.get_pages(hashes)
                except kv.PageLayoutMismatch as e:
                    self._count("layout_mismatches")
                    self._log_mismatch("fluxkv: a page of another layout in %s, answered as a miss: %s", store.namespace, e)
                    continue
                out[start : start + len(hashes)] = self._copy_all(views)
        except BaseException:
            _release(out)
            raise
        return out

    def _copy_all(self, views: list) -> list:
        """Copies of the pages (their views, and so the pages, go when this returns)."""
        out: list = []
        try:
            for view in views:
                out.append(None if view is None else self._copy_out(view))
        except BaseException:
            _release(out)
            raise
        return out

    def _copy_out(self, view: "torch.Tensor"):
        obj = self.local_cpu_backend.allocate(view.shape, view.dtype, self.meta_fmt)
        if obj is None:
            self._count("alloc_failures")
            _log.warning("fluxkv: LMCache's local CPU backend has no room for a %s %s chunk; answered as a miss",
                         view.dtype, tuple(view.shape))
            return None
        obj.tensor.copy_(view)
        return obj

    # -- stores ----------------------------------------------------------------------------

    async def put(self, key, memory_obj) -> None:
        await self.batched_put([key], [memory_obj])

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys: list, memory_objs: list) -> None:
        """Store each chunk (one batch call); chunks already stored are not rewritten. The
        caller keeps its references (LMCache's wrapper drops them afterwards); the worker
        holds one of its own on each chunk until it is done with it."""
        keys, objs = list(keys), list(memory_objs)
        if len(keys) != len(objs):
            raise ValueError(f"{len(keys)} keys but {len(objs)} memory objects")
        for o in objs:
            o.ref_count_up()
        try:
            work = self._workers.submit(self._store_all, keys, objs)
        except BaseException:
            _release(objs)
            raise
        await _wait(work)

    def _store_all(self, keys: list, objs: list) -> None:
        """(on a worker) Store the chunks in meta_fmt, then drop batched_put's references.

        LMCache stores a request's new chunks with one batched_put, in token order, so a
        run of chunk keys is put as one chain (each chunk's parent is the chunk before it),
        and eviction keeps a prompt's chunks from the front. What comes before the first
        chunk is not known (the chunks LMCache found cached are left out of the call), so
        it starts a chain of its own. No chain where the order is not certain: layer keys
        (each is one layer of a chunk: whether lookups walk them by chunk or by layer is
        not known here), and a batch with a chunk left out (not in meta_fmt: the next
        chunk's parent would never be stored)."""
        try:
            kept = [i for i, o in enumerate(objs) if self._storable(o)]
            chain = len(kept) == len(objs) and all(getattr(k, "layer_id", None) is None for k in keys)
            for store, start, hashes in self._runs([keys[i] for i in kept]):
                store.put_pages(hashes, [objs[i].tensor for i in kept[start : start + len(hashes)]], chain=chain)
        finally:
            _release(objs)

    def _storable(self, obj) -> bool:
        fmt = obj.get_memory_format()
        if fmt == self.meta_fmt:
            return True
        self._count("wrong_format")
        self._log_format("fluxkv: a %s chunk where this connector stores %s: not stored", fmt.name, self.meta_fmt.name)
        return False

    def remove_sync(self, key) -> bool:
        return self._store(key).delete_pages([_page_hash(key)])[0]

    # -- the rest --------------------------------------------------------------------------

    async def list(self) -> list:
        """Not available: fluxkv has no key listing (no scan call); LMCache does not list."""
        raise NotImplementedError("fluxkv cannot list keys; use PageStore.stats() for a namespace's pages and bytes")

    async def close(self) -> None:
        """Close the stores; work still running (of cancelled calls) ends as a miss."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            await self._off_loop(store.close)
        self._workers.shutdown(wait=False)

    def stats(self) -> dict:
        """Counters summed over this connector's namespaces (see PageStore.stats: ``hits``,
        ``misses``, ``stored``, ``skipped``, ``errors``) and this connector's own:
        ``alloc_failures`` (loads answered as misses because LMCache's local CPU backend had
        no room), ``wrong_format`` (chunks not stored: not in meta_fmt) and
        ``layout_mismatches`` (batch loads answered as misses: a page of another layout)."""
        with self._lock:
            stores, own = list(self._stores.values()), dict(self._counts)
        total = dict.fromkeys(("hits", "misses", "stored", "skipped", "errors"), 0)
        for store in stores:
            st = store.counters()
            for k in total:
                total[k] += st[k]
        return {**total, **own}


async def _wait(work: concurrent.futures.Future, abandoned: Optional[Callable] = None):
    """The result of a worker's ``work``. Cancelled, the work goes on (a thread cannot be
    stopped); ``abandoned`` then gets its result once it is done."""
    try:
        return await asyncio.shield(asyncio.wrap_future(work))
    except asyncio.CancelledError:
        if abandoned is not None:
            work.add_done_callback(lambda w: w.cancelled() or w.exception() is not None or abandoned(w.result()))
        raise


def _release(objs: list) -> None:
    """Drop one reference to each MemoryObj (None for none)."""
    for obj in objs:
        if obj is not None:
            obj.ref_count_down()


def _page_hash(key) -> str:
    """The page hash text of a key: its chunk hash, then ``.<layer>`` for a layer key and
    ``~<digest of the tags>`` for a tagged one (tags are free text; a page hash holds no '/')."""
    text = kv.hash_text(key.chunk_hash)
    layer = getattr(key, "layer_id", None)
    if layer is not None:
        text += f".{layer}"
    if key.tags:
        tags = "@".join(f"{k}%{v}" for k, v in key.tags)
        text += "~" + hashlib.sha256(tags.encode()).hexdigest()[:16]
    return text


def _leading(found: list) -> int:
    return next((i for i, f in enumerate(found) if not f), len(found))
