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
``remote_storage_plugin.fluxkv.<instance>.*``; the ``remote_url`` form reads
``remote_storage_plugin.fluxkv.timeout_s``.

LMCache releases before 0.4.4 build no backend per plugin: there the URL goes in
``remote_url: fluxkv:///run/fluxkv/fluxkv.sock``, with the plugin still listed in
``remote_storage_plugins`` (module_path and class_name, no url key): LMCache looks a
``remote_url`` up among its built-in adapters and those of the listed plugins only, so
``remote_url: fluxkv:///...`` alone fails with "No adapter found for URL". From 0.4.4 on, use
the plugin form above and no remote_url (both would make two remote backends).

Two interfaces are met, detected when this module is imported (:func:`lmcache_interface`
says which one the installed LMCache has): the 0.4/0.5 series below, and the older one of the
releases with plugin loading but before ``RemoteConnector`` had a constructor (LMCache PRs
#2225..#2314): there ``RemoteConnector`` has no ``__init__`` (this connector sets ``meta_fmt``
itself, as the base's ``init_chunk_meta`` would) and ``batched_contains(keys,
stop_after_first_not_exits=True)`` answers one bool per key (here the leading keys stored
True and the rest False, or each key's own answer when ``stop_after_first_not_exits`` is
False), not a count.

The 0.4/0.5 interface (LMCache's v1 storage backend: ``CacheEngineKey`` without ``fmt``,
``RemoteConnector.__init__(config, metadata)``, ``ConnectorContext.plugin_name``):

- Plugin loading (``lmcache.v1.storage_backend.connector.ConnectorManager``): for each name in
  ``remote_storage_plugins`` LMCache imports ``extra_config["remote_storage_plugin.<name>.module_path"]``,
  takes ``.class_name`` from it and, if it subclasses ``ConnectorAdapter``, instantiates it with
  no arguments. Each plugin gets its own ``RemoteBackend`` whose connector is created from the
  virtual URL ``plugin://<name>``: the first adapter whose ``can_parse(url)`` is true builds it
  with ``create_connector(context)``, ``context`` carrying ``url``, ``loop``,
  ``local_cpu_backend``, ``config``, ``metadata`` and ``plugin_name``. A name is ``<type>`` or
  ``<type>.<instance>``; the plugin's own settings are ``remote_storage_plugin.<name>.*`` keys.
  The deprecated ``remote_url: fluxkv:///...`` reaches the same adapter with the real URL
  when the plugin is listed (see above), never alone.
  LMCache wraps the connector (``InstrumentedRemoteConnector``), which drops the caller's
  reference to a MemoryObj after ``put`` / ``batched_put``: a connector does not.
- ``RemoteConnector`` (``...connector.base_connector``): abstract async ``exists(key)``,
  ``exists_sync(key)`` (called off the event loop), async ``get(key) -> MemoryObj | None``,
  async ``put(key, memory_obj)``, async ``list() -> list[str]``, async ``close()``; optional,
  each behind a ``support_*()`` switch: async ``batched_get(keys) -> list[MemoryObj | None]``,
  async ``batched_put(keys, memory_objs)``, ``batched_contains(keys) -> int`` (leading keys
  present; the older interface's answers a list, see above), async
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
  ``get_memory_format()``, ``byte_array``, ``ref_count_up/down()``. A model with several KV
  groups (``metadata.get_num_groups()``; e.g. a uint8 rope part and a bf16 latent) keeps them
  back to back in one object: ``get_shapes()``, ``get_dtypes()``, ``get_tensor(i)``, and
  ``tensor`` is group 0 only. The metadata learns the groups (``register_kv_caches``) after
  the connectors are made: until then it says one group. A serde that encodes (``remote_serde: cachegen``) hands the
  connector ``BytesBufferMemoryObj`` chunks (BINARY_BUFFER, ``tensor`` None, the bytes in
  ``byte_array``, allocated back with shape ``[n, 0, 0, 0]``, dtype None); ``naive`` and
  ``kivi`` pass KV chunks through. Some allocators (a fork's ``LayerPageMemoryObj``) keep a
  chunk as per-layer pages whose ``tensor`` raises. Upstream connectors store
  a ``RemoteMetadata`` (length, shape, dtype, format) in front of the bytes so that ``get`` can
  allocate before reading, with ``local_cpu_backend.allocate(shape, dtype, fmt)``, and answer
  None when it returns None (the last chunk of a prompt may hold fewer tokens).
- ``RemoteBackend`` runs the connector's coroutines on its own event loop and waits for each
  with a timeout, cancelling the coroutine when it passes.

Here a chunk is one :class:`fluxkv.kv.PageStore` page: its tensor (of a chunk whose
``tensor`` raises, its ``byte_array`` viewed as its dtype and shape, when it is exactly that
many bytes), or, for a model of several KV groups, one page per group (``<hash>``,
``<hash>#1``, ...: a chunk is present only with all of them), or, with an encoding serde,
its bytes as one uint8 page. Those are loaded on the blocking path only (``batched_get``,
whose results LMCache deserializes): LMCache's RemoteBackend hands
``batched_get_non_blocking``'s results (async loading) to the engine as they are, so under
an encoding serde that path is not offered and finds nothing (``batched_async_contains``
answers 0, ``batched_get_non_blocking`` an empty list). The page header already records each page's dtype and shape;
the format (the engine's: ``meta_fmt``, KV_T2D or KV_2TD under ``use_layerwise``, or
BINARY_BUFFER under an encoding serde, on every path) is part of
the namespace and the layout tag. A chunk handed to ``put`` in another format is not stored
(nothing would read it): it is counted (``wrong_format``) and logged; so is one whose data
cannot be read (``unstorable``, logged as an error). Keys:
``kv1/<model>/tp<worker_id>of<world_size>/pp0of1/<dtype>/<format>/lmcache/<geometry>/<chunk hash hex>``,
(``.<layer>`` after the hash for a layer key, ``~<digest>`` for tagged keys), where
``<geometry>`` is the chunk shape of the engine metadata less its token count (``2x32x1024``
for ``[2, layers, tokens, hidden]``; several KV groups ``+``-joined): LMCache's key does not
tell it (worker 0 of 2 under tensor and under pipeline parallelism share keys), and a chunk
of another geometry would be taken for the engine's KV (LMCache checks no shape on its way
to the GPU). ``get`` reads a
zero-copy view of the page (so the shape is known before anything is allocated), allocates
from LMCache's local CPU backend and copies once. A load holds at most about 256 MiB of
pages in one owner call (by the chunk size the engine metadata gives, then by the chunks
it loaded), copied out before the next call: a load of a long prompt never holds all of
its pages in the owner's memory at once (pages refilled from SSD need room there). Every
other batched form is one batch call, as is a load of fewer bytes; a prefix lookup is one
call (``contains_prefix``, which pins what it found, when ``pin``).
A batched put's chunks go as one chain of pages, so eviction keeps a prompt's chunks from
the front (see ``FluxKVConnector._store_all``). PageStore calls block, so the async methods
run them on the connector's worker threads.
``close()`` does not wait for the workers (LMCache waits for it with no timeout): what they
still run or have queued ends as a miss on the closed stores, and opens none again.
A thread cannot be stopped, so cancelling an async method (LMCache's timeout) leaves its
work running to the end: a cancelled load releases the MemoryObjs it allocated when it
finishes, and a store holds its own reference to each MemoryObj until it has copied it (the
caller may drop its reference as soon as the call is cancelled).

fluxkv down is never an error: the stores fail open, so a lookup finds nothing, a get
misses, a put stores nothing, and LMCache recomputes; failures are logged (at most every
10 s) and counted (:meth:`FluxKVConnector.stats`). A page of another layout in the
namespace (a configuration bug) is answered as a miss too, logged as an error and counted;
in a batch, so are the chunks after it (LMCache uses the leading chunks found), while the
chunks before it load.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import threading
import time
import warnings
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, Optional
from urllib.parse import urlparse

import fluxkv
from fluxkv import kv

if TYPE_CHECKING:
    import torch
    from lmcache.v1.storage_backend.connector import ConnectorContext

__all__ = ["FluxKVConnectorAdapter", "FluxKVConnector", "PLUGIN_TYPE", "socket_path_of", "lmcache_interface"]

_log = logging.getLogger("fluxkv.integrations.lmcache")

PLUGIN_TYPE = "fluxkv"
SCHEME = "fluxkv://"
_PLUGIN_SCHEME = "plugin://"
# What the namespace's "extra" part says: these pages hold LMCache chunks.
_NAMESPACE_TAG = "lmcache"
# How often a repeating problem (a chunk of another format, a page of another layout) is logged.
_LOG_EVERY_S = 10.0
_COUNTERS = ("alloc_failures", "wrong_format", "layout_mismatches", "unstorable")
# The remote_serde values whose chunks reach the connector as they are (KV tensors); any
# other (cachegen) hands it serialized bytes, a BINARY_BUFFER object.
_KV_SERDES = (None, "naive", "kivi")
# The suffix of a KV group's page after the first (multi-group models: one page per group).
_GROUP_SEP = "#"
# About the most bytes of pages one owner call of a load holds (see FluxKVConnector._load).
_LOAD_BYTES = 256 << 20

if importlib.util.find_spec("lmcache") is not None:
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.storage_backend.connector import ConnectorAdapter
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
else:  # LMCache is not installed: bases of the same shape, so this module still imports.
    MemoryFormat = None

    class RemoteConnector:  # type: ignore[no-redef]
        """Stand-in for LMCache's RemoteConnector: a connector needs LMCache itself."""

        def __init__(self, config, metadata):
            raise RuntimeError("fluxkv.integrations.lmcache: LMCache is not installed (pip install lmcache)")

    class ConnectorAdapter:  # type: ignore[no-redef]
        """Stand-in for LMCache's ConnectorAdapter."""

        def __init__(self, schema: str = ""):
            self.schema = schema


def lmcache_interface() -> dict:
    """Which of LMCache's two remote-connector interfaces the installed LMCache has, as this
    module detected it when it was imported (``python3 -c "import fluxkv.integrations.lmcache
    as m; print(m.lmcache_interface())"``): ``remote_connector_init`` is whether
    ``RemoteConnector`` has an ``__init__(config, metadata)`` (0.4 series; older releases
    have none and this connector sets ``meta_fmt`` itself), ``batched_contains`` is what it
    answers: ``"count"`` (leading keys present) or ``"list"`` (one bool per key, the older
    ``batched_contains(keys, stop_after_first_not_exits=True)``)."""
    try:
        version = importlib.metadata.version("lmcache")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "lmcache": version,
        "remote_connector_init": _BASE_HAS_INIT,
        "batched_contains": "list" if _CONTAINS_LISTS else "count",
    }


def _base_has_init() -> bool:
    return MemoryFormat is None or RemoteConnector.__init__ is not object.__init__


def _contains_lists() -> bool:
    base = getattr(RemoteConnector, "batched_contains", None)
    return base is not None and "stop_after_first_not_exits" in inspect.signature(base).parameters


_BASE_HAS_INIT = _base_has_init()
_CONTAINS_LISTS = _contains_lists()


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
    uses one. Results of ``get`` are allocated from ``local_cpu_backend``.

    What a chunk is stored as, from the engine metadata and the config: a KV chunk of one
    group is one page (its tensor); a chunk of a model with several KV groups
    (``metadata.get_num_groups()``) is one page per group, ``<hash>``, ``<hash>#1``, ...,
    each of its group's dtype and shape; with a ``remote_serde`` that serializes (cachegen)
    a chunk is its bytes (a BINARY_BUFFER object) as one uint8 page. The metadata is read
    at each call (:meth:`_layout`), not once: LMCache builds a model's KV groups after it
    made the connectors."""

    def __init__(self, socket_path: str, local_cpu_backend, config, metadata, *, timeout_s: Optional[float] = None):
        if metadata is None and MemoryFormat is not None:
            raise ValueError("fluxkv's LMCache connector needs the engine metadata (LMCache passes it from 0.3.4 on)")
        if _BASE_HAS_INIT:
            super().__init__(config, metadata)
        else:  # releases whose RemoteConnector has no __init__: the format it would set
            self.meta_fmt = MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD
        serde = getattr(config, "remote_serde", None) if config is not None else None
        self._serialized = serde not in _KV_SERDES
        # The format of the chunks this connector stores and loads: the engine's.
        self._fmt = MemoryFormat.BINARY_BUFFER if self._serialized else _engine_fmt(config, self.meta_fmt)
        self._metadata = metadata
        self._layout_memo: Optional[tuple] = None  # (the metadata's shapes, dtypes and groups, their _Layout)
        self._layout()  # metadata that cannot be read fails here, not at the first call
        self.socket_path = socket_path
        self.local_cpu_backend = local_cpu_backend
        self._store_options = {} if timeout_s is None else {"timeout": timeout_s}
        self._workers = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="fluxkv-lmcache")
        self._lock = threading.Lock()
        self._stores: dict[str, kv.PageStore] = {}  # by namespace; guarded by _lock
        self._closed = False  # guarded by _lock
        self._counts = dict.fromkeys(_COUNTERS, 0)  # guarded by _lock
        self._log_format = _Throttled(logging.WARNING)
        self._log_mismatch = _Throttled(logging.ERROR)
        self._log_unstorable = _Throttled(logging.ERROR)

    def __repr__(self) -> str:
        return f"<FluxKVConnector {self.socket_path}>"

    def _layout(self) -> "_Layout":
        """What a chunk is stored as by the engine metadata now. Each call that stores, loads
        or looks up takes it once: LMCache builds a model's KV groups (``register_kv_caches``)
        after it made the connectors (upstream's base reads the shapes lazily for that), and
        read at construction they were the single legacy group's, so only group 0 of every
        chunk was stored (a review). Computed again only when the metadata changes."""
        md = self._metadata
        memo_key = tuple(_call(md, name) for name in ("get_shapes", "get_dtypes", "get_num_groups"))
        memo = self._layout_memo
        if memo is None or memo[0] != memo_key:
            groups = 1 if self._serialized or memo_key[2] is None else int(memo_key[2])
            if groups < 1:
                raise ValueError(f"fluxkv's LMCache connector: the engine metadata says {groups} KV groups")
            memo = (memo_key, _Layout(groups, _geometry(md), _chunk_bytes(md)))
            self._layout_memo = memo
        return memo[1]

    # -- keys ------------------------------------------------------------------------------

    def _store(self, key, lay: "_Layout") -> kv.PageStore:
        fmt = self._fmt.name
        ns = kv.namespace(
            key.model_name,
            tp_rank=key.worker_id,
            tp_size=key.world_size,
            dtype=str(key.dtype).removeprefix("torch."),
            layout=fmt,
            extra=f"{_NAMESPACE_TAG}/{lay.geometry}",
        )
        with self._lock:
            store = self._stores.get(ns)
            if store is None:
                store = kv.PageStore(self.socket_path, ns, layout=fmt, fail_open=True, **self._store_options)
                if self._closed:  # work that outlived close(): a closed store, every call a miss
                    store.close()
                else:
                    self._stores[ns] = store
            return store

    def _pages_of(self, key, lay: "_Layout") -> list:
        """The page hashes of one chunk: one per KV group."""
        page = _page_hash(key)
        return [page] + [f"{page}{_GROUP_SEP}{g}" for g in range(1, lay.groups)]

    def _runs(self, keys: list, lay: "_Layout") -> Iterator[tuple[kv.PageStore, int, list]]:
        """(store, index of the first key, page hashes) for each run of consecutive keys that
        share a store: one run, so one batch call, unless keys of several namespaces mix.
        The hashes are the pages of every key of the run, a key's groups together."""
        run_store, start, hashes = None, 0, []
        for i, key in enumerate(keys):
            store = self._store(key, lay)
            if store is not run_store and hashes:
                yield run_store, start, hashes
                start, hashes = i, []
            run_store = store
            hashes.extend(self._pages_of(key, lay))
        if hashes:
            yield run_store, start, hashes

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    # -- worker threads --------------------------------------------------------------------

    async def _off_loop(self, fn: Callable, *args, abandoned: Optional[Callable] = None):
        """fn(*args) on a worker thread. Cancelling the await does not stop the worker: its
        work runs to the end, and then ``abandoned`` gets its result (to release it)."""
        return await _wait(self._submit(fn, *args), abandoned)

    def _submit(self, fn: Callable, *args) -> concurrent.futures.Future:
        """The worker threads' future of fn(*args). After close() they take no more work: fn
        runs here, where on the closed stores it ends as a miss at once (it raised
        RuntimeError, "cannot schedule new futures after shutdown"; a review)."""
        try:
            return self._workers.submit(fn, *args)
        except RuntimeError:
            with self._lock:
                closed = self._closed
            if not closed:
                raise
        f: concurrent.futures.Future = concurrent.futures.Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:
            f.set_exception(e)
        return f

    # -- lookups ---------------------------------------------------------------------------

    def exists_sync(self, key) -> bool:
        return self._prefix([key], pin=False) == 1

    async def exists(self, key) -> bool:
        return await self._off_loop(self.exists_sync, key)

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys: list, stop_after_first_not_exits: bool = True):
        """Which keys are stored, in one call per namespace, in the form the installed LMCache
        expects (:func:`lmcache_interface`): the number of leading keys stored (0.4 series),
        or one bool per key (older releases): the leading keys stored True and the rest
        False, or, with ``stop_after_first_not_exits=False``, each key's own answer."""
        keys = list(keys)
        if not _CONTAINS_LISTS:
            return self._prefix(keys, pin=False)
        if stop_after_first_not_exits:
            n = self._prefix(keys, pin=False)
            return [True] * n + [False] * (len(keys) - n)
        found: list = []
        lay = self._layout()
        for store, _, hashes in self._runs(keys, lay):
            found.extend(_per_chunk(store.contains(hashes), lay.groups))
        return found

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list, pin: bool = False) -> int:
        """How many leading keys are stored (one call); ``pin`` keeps those in the owner's
        memory for the load that follows. 0 under an encoding serde: the load that follows is
        :meth:`batched_get_non_blocking`, which has nothing to give then."""
        if self._serialized:
            return 0
        return await self._off_loop(self._prefix, list(keys), pin)

    def _prefix(self, keys: list, pin: bool) -> int:
        n = 0
        lay = self._layout()
        for store, _, hashes in self._runs(keys, lay):
            found = store.contains_prefix(hashes, pin=pin)
            n += found // lay.groups
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
        """Not under an encoding serde: LMCache's RemoteBackend hands what this path loads to
        the engine without deserializing it (it does so only on the blocking path)."""
        return not self._serialized

    async def batched_get_non_blocking(self, lookup_id: str, keys: list) -> list:
        """The MemoryObjs of the leading keys found; what was loaded after a miss is released.
        Nothing under an encoding serde (see :meth:`support_batched_get_non_blocking`): its
        chunks would reach the engine as serialized bytes."""
        if self._serialized:
            return []
        objs = await self.batched_get(keys)
        n = _leading([o is not None for o in objs])
        for o in objs[n:]:
            if o is not None:
                o.ref_count_down()
        return objs[:n]

    def _load(self, keys: list) -> list:
        """The chunks of the keys, loaded a group at a time: each owner call holds at most
        about _LOAD_BYTES of pages (as many chunks as fit, by the size of a full chunk the
        engine metadata gives, then by the largest chunk loaded so far; one at first when
        the metadata does not say), copied out before the next call, so a load of more than
        the owner's memory (its pages refilled from SSD) never needs all of it at once."""
        out: list = [None] * len(keys)
        lay = self._layout()
        g = lay.groups
        first = max(1, _LOAD_BYTES // lay.chunk_bytes) if lay.chunk_bytes else 1
        try:
            for store, start, hashes in self._runs(keys, lay):
                n, at, per_call = len(hashes) // g, 0, first
                cut = False
                while at < n:
                    take = min(per_call, n - at)
                    views, whole = self._views(store, hashes[at * g : (at + take) * g], g)
                    chunks = [views[i : i + g] for i in range(0, len(views), g)]
                    views.clear()
                    largest = max(sum(_nbytes(v) for v in c) for c in chunks)
                    out[start + at : start + at + take] = self._copy_all(chunks, lay)
                    chunks.clear()
                    if not whole:  # a page of another layout: the chunks after it miss,
                        cut = True  # those of the later runs (other namespaces) too
                        break
                    at += take
                    per_call = max(1, _LOAD_BYTES // largest) if largest else per_call
                if cut:
                    break
        except BaseException:
            _release(out)
            raise
        return out

    def _views(self, store: kv.PageStore, hashes: list, groups: int) -> tuple:
        """(the pages' views, None for a miss; False when a page of another layout cut them
        short). Such a page is a miss, and so is every chunk from its own on (LMCache uses
        the leading chunks found): the chunks before it are loaded again without it."""
        n = len(hashes)
        while n:
            try:
                return store.get_pages(hashes[:n]) + [None] * (len(hashes) - n), n == len(hashes)
            except kv.PageLayoutMismatch as e:
                self._count("layout_mismatches")
                self._log_mismatch("fluxkv: a page of another layout in %s, answered as a miss: %s", store.namespace, e)
                bad = e.index if e.index is not None and e.index < n else 0
                n = bad - bad % groups  # the whole chunks before it
        return [None] * len(hashes), False

    def _copy_all(self, chunks: list, lay: "_Layout") -> list:
        """Copies of the chunks, each from the views of its pages (they, and so the pages, go
        when this returns); None for a chunk with a page missing."""
        out: list = []
        try:
            for views in chunks:
                out.append(None if any(v is None for v in views) else self._copy_out(views, lay))
        except BaseException:
            _release(out)
            raise
        return out

    def _copy_out(self, views: list, lay: "_Layout"):
        if self._serialized:  # the serialized bytes: LMCache's byte buffer objects
            (view,) = views
            obj = self.local_cpu_backend.allocate(_size((view.numel(), 0, 0, 0)), None, self._fmt)
        elif lay.groups == 1:
            (view,) = views
            obj = self.local_cpu_backend.allocate(view.shape, view.dtype, self._fmt)
        else:
            obj = self.local_cpu_backend.allocate([v.shape for v in views], [v.dtype for v in views], self._fmt)
        if obj is None:
            self._count("alloc_failures")
            _log.warning("fluxkv: LMCache's local CPU backend has no room for a %s chunk; answered as a miss",
                         " + ".join(f"{v.dtype} {tuple(v.shape)}" for v in views))
            return None
        try:
            for target, view in zip(self._targets(obj, lay, check_groups=False), views):
                target.copy_(view)
        except BaseException:
            obj.ref_count_down()
            raise
        return obj

    # -- what a chunk's pages are ------------------------------------------------------------

    def _targets(self, obj, lay: "_Layout", check_groups: bool = True) -> list:
        """The tensors of a chunk, one per page: its serialized bytes (uint8), each KV group's
        tensor, or the one tensor. Of a chunk whose ``tensor`` is not to be had (a layer-page
        object: its KV is in per-layer pages), the bytes of the object viewed as its dtype and
        shape, when they are exactly that much; ValueError otherwise. ``check_groups`` (a chunk
        to store; a load's object is allocated by this layout): ValueError for a chunk of
        another number of KV groups than the layout's, which would be stored short. Not for a
        layer-page object: its get_shapes() lists its layers' pages, not KV groups."""
        if self._serialized:
            return [_bytes_of(obj)]
        if check_groups and not hasattr(obj, "layer_tensor"):
            shapes = obj.get_shapes() if hasattr(obj, "get_shapes") else [obj.get_shape()]
            if len(shapes) != lay.groups:  # stored as one group, the others would be dropped unseen
                raise ValueError(f"a chunk of {len(shapes)} KV groups where the engine metadata says {lay.groups}")
        if lay.groups > 1:
            return [obj.get_tensor(g) for g in range(lay.groups)]
        try:
            t = obj.tensor
        except Exception:  # e.g. LayerPageMemoryObj: "Layer page requires layer_tensor(layer_id)"
            t = None
        if t is not None:
            return [t]
        dtype, shape = obj.get_dtype(), _size(obj.get_shape())
        raw = _bytes_of(obj)
        if dtype is None or raw.numel() != shape.numel() * _itemsize(dtype):
            raise ValueError(f"a {type(obj).__name__} whose tensor is not available and whose {raw.numel()} bytes are not a {dtype} {tuple(shape)}")
        return [raw.view(dtype).view(shape)]

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
            work = self._submit(self._store_all, keys, objs)
        except BaseException:
            _release(objs)
            raise
        await _wait(work)

    def _store_all(self, keys: list, objs: list) -> None:
        """(on a worker) Store the chunks in this connector's format, then drop batched_put's
        references.

        LMCache stores a request's new chunks with one batched_put, in token order, so a
        run of chunk keys is put as one chain (each chunk's parent is the chunk before it,
        a chunk's KV groups one after another), and eviction keeps a prompt's chunks from
        the front. What comes before the first chunk is not known (the chunks LMCache found
        cached are left out of the call), so it starts a chain of its own. No chain where
        the order is not certain: layer keys (each is one layer of a chunk: whether lookups
        walk them by chunk or by layer is not known here), and a batch with a chunk left out
        (not storable: the next chunk's parent would never be stored)."""
        try:
            lay = self._layout()
            tensors = {i: t for i, t in ((i, self._storable(o, lay)) for i, o in enumerate(objs)) if t is not None}
            kept = sorted(tensors)
            chain = len(kept) == len(objs) and all(getattr(k, "layer_id", None) is None for k in keys)
            for store, start, hashes in self._runs([keys[i] for i in kept], lay):
                n = len(hashes) // lay.groups
                pages = [t for i in kept[start : start + n] for t in tensors[i]]
                store.put_pages(hashes, pages, chain=chain)
        finally:
            _release(objs)

    def _storable(self, obj, lay: "_Layout") -> Optional[list]:
        """The chunk's page tensors, or None (counted and logged) where it cannot be stored:
        a chunk of another format than this connector's, or one whose data is not to be had."""
        fmt = obj.get_memory_format()
        if fmt != self._fmt:
            self._count("wrong_format")
            self._log_format("fluxkv: a %s chunk where this connector stores %s: not stored", fmt.name, self._fmt.name)
            return None
        try:
            pages = [t if t.is_contiguous() else t.contiguous() for t in self._targets(obj, lay)]
            for t in pages:  # a dtype without page format, an empty chunk: this chunk alone is left out
                kv.tensors.describe(t, writable=False, what="the chunk's tensor")
            return pages
        except (ValueError, TypeError, RuntimeError, AttributeError, fluxkv.Error) as e:
            self._count("unstorable")
            self._log_unstorable("fluxkv: a chunk (%s) this connector cannot read, not stored: %s", type(obj).__name__, e)
            return None

    def remove_sync(self, key) -> bool:
        lay = self._layout()
        return all(self._store(key, lay).delete_pages(self._pages_of(key, lay)))

    # -- the rest --------------------------------------------------------------------------

    async def list(self) -> list:
        """Not available: fluxkv has no key listing (no scan call); LMCache does not list."""
        raise NotImplementedError("fluxkv cannot list keys; use PageStore.stats() for a namespace's pages and bytes")

    async def close(self) -> None:
        """Close the stores, on a thread of their own: LMCache's RemoteBackend.close waits for
        this with no timeout, so it does not queue behind the worker threads' calls. Work
        still running or queued (puts LMCache did not wait for, cancelled calls) ends as a
        miss, and opens no store again."""
        with self._lock:
            self._closed = True
            stores, self._stores = list(self._stores.values()), {}
        self._workers.shutdown(wait=False)
        if stores:
            await asyncio.to_thread(lambda: [store.close() for store in stores])

    def stats(self) -> dict:
        """Counters summed over this connector's namespaces (see PageStore.stats: ``hits``,
        ``misses``, ``stored``, ``skipped``, ``errors``; pages, so a chunk of several KV
        groups counts one per group) and this connector's own: ``alloc_failures`` (loads
        answered as misses because LMCache's local CPU backend had no room), ``wrong_format``
        (chunks not stored: not in this connector's format), ``unstorable`` (chunks not
        stored: their data could not be read) and ``layout_mismatches`` (pages of another
        layout met by loads, each answered as a miss with the chunks after it)."""
        with self._lock:
            stores, own = list(self._stores.values()), dict(self._counts)
        total = dict.fromkeys(("hits", "misses", "stored", "skipped", "errors"), 0)
        for store in stores:
            st = store.counters()
            for k in total:
                total[k] += st[k]
        return {**total, **own}


def _engine_fmt(config, meta_fmt):
    """The format LMCache's engine keeps KV chunks in (``LMCacheEngine.__init__``): with
    ``use_layerwise`` a non-MLA model's chunks are per-layer KV_T2D objects (KV_2TD with
    ``enable_blending``), whatever ``meta_fmt`` says; otherwise ``meta_fmt``."""
    if config is None or not getattr(config, "use_layerwise", False) or meta_fmt == MemoryFormat.KV_MLA_FMT:
        return meta_fmt
    return MemoryFormat.KV_2TD if getattr(config, "enable_blending", False) else MemoryFormat.KV_T2D


def _size(dims):
    import torch

    return torch.Size(dims)


class _Layout(NamedTuple):
    """What a chunk is stored as (FluxKVConnector._layout): its pages (one per KV group), the
    namespace's geometry part and a full chunk's bytes (None: the metadata does not say)."""

    groups: int
    geometry: str
    chunk_bytes: Optional[int]


def _call(obj, name: str):
    """obj.name() as a tuple where it is a sequence, None where obj has no such method."""
    fn = getattr(obj, name, None)
    if fn is None:
        return None
    v = fn()
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _geometry(metadata) -> str:
    """The chunk shape the engine metadata gives, less the token count (a prompt's last
    chunk may be short): ``2x32x1024`` for KV_2LTD ``[2, layers, tokens, hidden]``, each KV
    group's ``+``-joined. LMCache's key does not tell it: e.g. worker 0 of 2 under tensor
    parallelism (all layers, half the heads) and under pipeline parallelism (half the
    layers, all heads) share keys. From ``get_shapes()``, else from ``kv_shape`` (``(layers,
    2, chunk_size, heads, head_size)``, releases without it)."""
    get_shapes = getattr(metadata, "get_shapes", None)
    if get_shapes is not None:
        shapes = [tuple(s) for s in get_shapes()]
    else:
        layers, kv, _, heads, head_size = metadata.kv_shape
        shapes = [(kv, layers, 0, heads * head_size)]
    return "+".join("x".join(str(int(d)) for i, d in enumerate(s) if i != 2) for s in shapes)


def _chunk_bytes(metadata) -> Optional[int]:
    """The bytes of a full chunk by the engine metadata (``get_shapes()``, ``get_dtypes()``:
    every KV group), or None where it does not say."""
    try:
        shapes, dtypes = metadata.get_shapes(), metadata.get_dtypes()
        total = sum(_size(s).numel() * _itemsize(d) for s, d in zip(shapes, dtypes))
    except Exception:  # older metadata without them, or not what they should be
        return None
    return total if total > 0 else None


def _nbytes(view) -> int:
    return 0 if view is None else view.numel() * view.element_size()


def _itemsize(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


def _bytes_of(obj):
    """The bytes of a MemoryObj (``byte_array``) as a uint8 tensor sharing its memory. A
    read-only buffer (a chunk being stored) is only read: torch's warning about it is not
    for this use."""
    import torch

    raw = obj.byte_array
    if memoryview(raw).nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(raw, dtype=torch.uint8)


def _per_chunk(found: list, groups: int) -> list:
    """Per-page answers folded into one per chunk: all of its groups."""
    return [all(found[i : i + groups]) for i in range(0, len(found), groups)]


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
    ``~<digest of the tags>`` for a tagged one (tags are free text; a page hash holds no '/').
    The digest is of the tags' JSON, so no two tag sets LMCache tells apart share one: a
    joined text (``k%v`` joined by ``@``) made ``(("user", "a@b%c"),)`` and ``(("user",
    "a"), ("b", "c"))`` one page, and a tenant's tags could load another's KV."""
    text = kv.hash_text(key.chunk_hash)
    layer = getattr(key, "layer_id", None)
    if layer is not None:
        text += f".{layer}"
    if key.tags:
        tags = json.dumps([[str(k), str(v)] for k, v in key.tags], separators=(",", ":"))
        text += "~" + hashlib.sha256(tags.encode()).hexdigest()[:16]
    return text


def _leading(found: list) -> int:
    return next((i for i, f in enumerate(found) if not f), len(found))
