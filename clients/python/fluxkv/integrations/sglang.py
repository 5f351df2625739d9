"""SGLang HiCache storage backend on fluxkv: ``FluxkvHiCacheStorage``.

Load it with ``--hicache-storage-backend dynamic --hicache-storage-backend-extra-config
'{"backend_name": "fluxkv", "module_path": "fluxkv.integrations.sglang", "class_name":
"FluxkvHiCacheStorage", "socket": "/run/fluxkv/fluxkv.sock", "interface_v1": 1}'``.
Optional keys: ``pin_ms``, ``checksum`` (see :class:`FluxkvHiCacheStorage`) and
``timeout_s``: how long one owner call may take, in seconds (PageStore's ``timeout``;
PageStore's default when unset).

What SGLang expects, as read from sgl-project/sglang main at commit 001067ff
(``mem_cache/hicache_storage.py``, ``mem_cache/storage/backend_factory.py``,
``managers/cache_controller.py``, ``mem_cache/pool_host/{mha,mla}.py`` -- the host pools were
``mem_cache/memory_pool_host.py`` before that package existed):

- Loading. For backend ``dynamic`` the factory reads ``backend_name``, ``module_path`` and
  ``class_name`` from ``HiCacheStorageConfig.extra_config`` (the command line's JSON), imports
  the module, refuses a class that does not subclass ``HiCacheStorage`` and builds
  ``cls(storage_config, kwargs)`` (kwargs: a dict, empty today). The cache controller then
  calls ``register_mem_pool_host(host_pool)`` before any I/O. The config carries tp/pp/
  attn-cp ranks and sizes, ``is_mla_model`` (every rank holds the same pages), whether the
  host pool is ``page_first``, ``model_name`` and ``enable_storage_metrics``.
- Which calls. A dynamic backend gets the zero-copy calls only when ``extra_config`` sets
  ``interface_v1`` (truthy): ``batch_get_v1(keys, host_indices, extra_info) -> list[bool]`` and
  ``batch_set_v1(...) -> list[bool]``, one key per page, ``host_indices`` the page's token
  slots (``len(keys) * page_size`` of them, a page starting at ``host_indices[i * page_size]``).
  Otherwise the controller's generic path: ``batch_get(keys, [host_pool.
  get_dummy_flat_data_page() per key])`` returning a tensor or None per key, which it copies
  in with ``set_from_flat_data_page``, and ``batch_set(keys, [host_pool.get_data_page(i)])
  -> bool``. Either way ``batch_exists(keys, extra_info) -> int`` (leading pages present)
  sizes a prefetch, in batches of 128, reduced with MIN across ranks; a load counts the
  leading True results, a backup needs all of them. For MLA only TP rank 0 backs up.
- Order. A backup hands ``batch_set_v1`` (and the generic ``batch_set``) the pages of one
  radix-tree node in prompt order, at most 128 a call. ``extra_info`` is a
  ``HiCacheStorageExtraInfo`` whose ``prefix_keys`` lists the hashes of the pages before
  the batch, when the controller knows them: for a node under the root it stays empty for
  every batch of the node (it is extended only once non-empty), and some releases default
  it to ``(None,)``. The generic calls get no ``extra_info``.
- Failure. These calls run on the controller's prefetch and backup threads, which nothing
  restarts: a None result or an escaping exception ends L3 for the life of the process. So
  every outcome of fluxkv (down, out of space, a page of another layout) is answered as a miss
  or False; only misuse (no host pool, host_indices of the wrong length) raises. A page of
  another layout in a load is a miss with the pages after it (``_page_get_zero_copy`` counts
  the leading True results only); the pages before it load.
- Host pools (``mem_cache/pool_host/{mha,mla,mha_mxfp8}.py`` at 0047d999, 01c0ede3,
  02d20b8b; ``--hicache-mem-layout`` picks the layout). ``MHATokenToKVPoolHost.kv_buffer`` is
  (2, layers, tokens, heads, head_dim) for ``layer_first``, (2, tokens, layers, heads,
  head_dim) for ``page_first``, (2, pages, layers, page_size, heads, head_dim) for
  ``page_first_direct`` and (2, pages, heads, page_size, layers, head_dim) for ``page_head``
  (``k_buffer``/``v_buffer`` are its halves). Models with ``head_dim != v_head_dim`` get an
  ``AsymmetricMHATokenToKVPoolHost`` (page_first and page_first_direct only): K and V are
  two allocations and ``kv_buffer`` is the tuple (K, V); its flat-page methods raise
  NotImplementedError, so only the v1 calls move its pages (as Mooncake's backend does).
  ``MLATokenToKVPoolHost.kv_buffer`` is (layers, tokens, 1, kv_cache_dim), (tokens, layers,
  1, kv_cache_dim) or (pages, layers, page_size, 1, kv_cache_dim) (no page_head; Ascend's
  ``page_first_kv_split`` is not supported here). ``get_page_buffer_meta(indices)`` lists a
  page's memory ranges: K and V (MHA) or one range (MLA) per page, except one per layer for
  layer_first; a flat data page is K's page then V's, each in the layout's order. The MXFP8
  pool (``MHATokenToKVPoolMXFP8Host``: fp8 KV, scales in ``k_scale_host``/``v_scale_host``)
  and the FP4 and INT8 pools raise NotImplementedError from ``get_page_buffer_meta`` and
  the flat-page methods: this backend refuses them when it is attached, with a ValueError
  naming the pool, rather than store KV bytes without their scales.
- Peers. Mooncake's backend stores an MHA page as keys ``<key>_<rank>_k`` and ``_v`` (MLA:
  one ``_k`` key, no rank), skips keys already present on set, and refuses layer_first MHA on
  the v1 path. The file backend suffixes keys with the model name and, except for MLA, the TP
  rank and size (then PP, then attention-CP when used).
- ``get_stats()``: with ``--enable-metrics`` (``enable_storage_metrics`` in the config) the
  radix cache passes its result, at every event check, to ``StorageMetricsCollector.
  log_storage_metrics``, which ignores None and otherwise requires a ``StorageMetrics`` and
  observes its ``prefetch_pgs``, ``backup_pgs``, ``prefetch_bandwidth`` and
  ``backup_bandwidth`` lists (samples since the last call). It runs on the scheduler thread,
  so it must not wait on the network: the namespace's size (a call to the master) is
  refreshed on a background thread and get_stats() reports the last answer.
- Not used here: the v2 calls of hybrid models (their extra host pools, Mamba, SWA, DSA
  indexers, come through ``register_mem_host_pool_v2``, refused here) and split heads
  (``tp_lcm_size``, refused at construction).

What this backend does: one :class:`fluxkv.kv.PageStore` (``fail_open=True``) in the
namespace ``kv.namespace(model, tp, pp, dtype, layout)`` (the host pool's dtype must be one
of ``kv.DTYPES``: refused at registration otherwise; the namespace names the KV cache's
dtype, the device pool's, since an fp8 cache of either format is held in uint8), then the
page's shape (``16x3x2x8``; K's and V's ``+``-joined where they differ: one model's host
pools can hold pages of other shapes, e.g. with MTP draft layers) -- ``tp*`` for MLA,
``cp<r>of<n>`` appended under attention context parallelism -- with a page's K and V under
``<hash>.k``/``<hash>.v`` (MLA: ``<hash>``), each stored in the host pool's own page order.
Both call paths read and write the same pages. A store's pages go as one chain
(``PageStore.put_pages`` with ``chain``): K before V, each page after the one before it, so
eviction keeps a prompt's pages from the front (see :meth:`FluxkvHiCacheStorage._save`). v1
calls move pages between fluxkv and the host pool's buffers at ``host_indices``: pages of
page_first, page_first_direct and page_head (and both buffers of an asymmetric pool) are
contiguous, copied straight in and out of shared memory; layer_first pages are strided, so a
store gathers each page once before its copy into shared memory and a load copies from a
zero-copy view. The layout is part of the namespace and of every page's header tag
(``page_direct`` stands for page_first_direct: the tag holds 20 bytes), so pools of two
layouts never read each other's pages. A pool without flat data pages is refused at
registration unless ``interface_v1`` is set (the generic calls could not move its pages).
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import torch

import fluxkv
from fluxkv import kv

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
except ImportError:  # SGLang is not installed: the same name, for imports and tests

    class HiCacheStorage(ABC):  # type: ignore[no-redef]
        """Local stand-in of ``sglang.srt.mem_cache.hicache_storage.HiCacheStorage``."""

        def register_mem_pool_host(self, mem_pool_host) -> None:
            self.mem_pool_host = mem_pool_host

        @abstractmethod
        def get(self, key, target_location=None, target_sizes=None): ...

        @abstractmethod
        def batch_get(self, keys, target_locations=None, target_sizes=None): ...

        @abstractmethod
        def set(self, key, value=None, target_location=None, target_sizes=None) -> bool: ...

        @abstractmethod
        def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool: ...

        @abstractmethod
        def exists(self, key) -> bool: ...


__all__ = ["FluxkvHiCacheStorage", "HiCacheStorage"]

_log = logging.getLogger("fluxkv.integrations.sglang")

# How often get_stats() has the namespace's pages and bytes asked of the master (on a
# background thread): SGLang calls it at every scheduler event check.
NAMESPACE_STATS_INTERVAL_S = 5.0
# How often a page of another layout is logged (it repeats on every prefetch until fixed).
_MISMATCH_LOG_EVERY_S = 10.0
_SAMPLES = ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth")
# Where SGLang defines StorageMetrics, newest first.
_STORAGE_METRICS_MODULES = ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector")


# Host pool layouts: where a component buffer keeps a page. "slots": page_size token slots
# along the token axis (a page of layer_first is strided, of page_first contiguous);
# "page": one index of the leading page axis (contiguous).
_LAYOUTS = {
    "layer_first": ("slots", 1),
    "page_first": ("slots", 0),
    "page_first_direct": ("page", 0),
    "page_head": ("page", 0),
}
# Layouts an MLA pool has (upstream has no page_head for MLA).
_MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
# The layout part of the pages' tag and namespace: the header's tag holds 20 bytes, and
# "mha-page_first_direct" is 21.
_LAYOUT_TAGS = {"page_first_direct": "page_direct"}


class _HostPages:
    """Where a host pool keeps each page: its components (MHA: K and V, MLA: one) as views of
    the pool's buffers, and the flat form of a page the generic calls use (each component's
    page in the pool's own order, K's then V's).

    The component buffers: MHA ``kv_buffer`` is (2, ...), K and V its halves, except in an
    asymmetric pool (``head_dim != v_head_dim``), whose ``kv_buffer`` is the tuple (K, V) of
    two allocations; MLA ``kv_buffer`` is the one component. Per layout a component is
    (layers, tokens, heads, dim) layer_first, (tokens, layers, heads, dim) page_first,
    (pages, layers, page_size, heads, dim) page_first_direct and (pages, heads, page_size,
    layers, dim) page_head (MLA: heads is 1)."""

    def __init__(self, pool, mla: bool):
        self.kind = type(pool).__name__
        layouts = _MLA_LAYOUTS if mla else tuple(_LAYOUTS)
        if pool.layout not in layouts:
            raise ValueError(f"host pool layout {pool.layout!r}: fluxkv's SGLang backend supports {', '.join(layouts)} for {'MLA' if mla else 'MHA'} pools")
        self._refuse_scaled(pool)
        self.buffers, self.suffixes = self._components(pool.kv_buffer, mla)
        dtypes = {b.dtype for b in self.buffers}
        if len(dtypes) != 1:
            raise ValueError(f"{self.kind}: K and V of different dtypes ({', '.join(map(str, dtypes))})")
        self.dtype = self.buffers[0].dtype
        dtype = str(self.dtype).removeprefix("torch.")
        if dtype not in kv.DTYPES:
            raise ValueError(f"host pool dtype {dtype}: fluxkv pages hold {', '.join(kv.DTYPES)}")
        self.kv_dtype = self._kv_dtype(pool, dtype)
        self.layout = pool.layout
        self.tag = _LAYOUT_TAGS.get(pool.layout, pool.layout)
        self.page_size = int(pool.page_size)
        self._where, self._axis = _LAYOUTS[pool.layout]
        want_dim = 4 if self._where == "slots" else 5
        for b in self.buffers:
            if b.dim() != want_dim:
                what = "an MLA host pool's kv_buffer" if mla else "an MHA host pool's K and V"
                raise ValueError(f"{what} ({self.kind}, {pool.layout}): {tuple(b.shape)}, expected {want_dim}-D")
        first = self.buffers[0]
        self.tokens = first.shape[self._axis] * (self.page_size if self._where == "page" else 1)
        views = self.views(0)
        self.page_shapes = [tuple(v.shape) for v in views]
        self.page_numels = [v.numel() for v in views]
        self.page_bytes = sum(v.numel() * v.element_size() for v in views)
        # The page's shape (each component's, where K's and V's differ), part of the namespace:
        # one model's pools can hold pages of other shapes (SGLang's MTP draft layers).
        self.geometry = "+".join(dict.fromkeys("x".join(map(str, shape)) for shape in self.page_shapes))
        self._check_meta(pool, views)

    @staticmethod
    def _kv_dtype(pool, store_dtype: str) -> str:
        """The KV cache's dtype, for the namespace: SGLang keeps an fp8 KV cache (float8_e4m3fn
        or float8_e5m2) in uint8 buffers (the device pool's ``store_dtype``, which the host pool
        takes as its ``dtype``), so the host pool alone does not tell the two formats apart;
        the device pool's ``dtype`` does. The pages themselves stay of the host pool's dtype."""
        logical = getattr(getattr(pool, "device_pool", None), "dtype", None)
        return store_dtype if logical is None else str(logical).removeprefix("torch.")

    def _refuse_scaled(self, pool) -> None:
        """Refuse a quantized pool whose scales live beside kv_buffer (MXFP8, FP4): storing its
        KV bytes alone would load pages whose scales are wrong."""
        scales = sorted(name for name, value in vars(pool).items() if "scale" in name and isinstance(value, torch.Tensor))
        if scales:
            raise ValueError(
                f"host pool {self.kind}: fluxkv's SGLang backend cannot store its pages: their scales live outside "
                f"kv_buffer ({', '.join(scales)}) and SGLang describes no page buffers for them; use a bf16/fp16/fp8 KV cache without block scales"
            )

    def _components(self, buf, mla: bool) -> tuple:
        if isinstance(buf, (tuple, list)):  # an asymmetric MHA pool: K and V allocated apart
            if mla or len(buf) != 2 or not all(isinstance(b, torch.Tensor) for b in buf):
                raise ValueError(f"{self.kind}: kv_buffer is a {type(buf).__name__} of {len(buf)}; fluxkv reads (K, V) of an MHA pool")
            self._cpu(buf)
            return tuple(buf), (".k", ".v")
        if not isinstance(buf, torch.Tensor):
            raise ValueError(f"{self.kind}: kv_buffer is {type(buf).__name__}, not a tensor (K and V) or a (K, V) pair")
        self._cpu((buf,))
        if mla:
            return (buf,), ("",)
        if buf.shape[0] != 2:
            raise ValueError(f"an MHA host pool's kv_buffer is (2, ...), this one is {tuple(buf.shape)}")
        return (buf[0], buf[1]), (".k", ".v")

    def _cpu(self, bufs) -> None:
        for b in bufs:
            if b.device.type != "cpu":
                raise ValueError(f"{self.kind}: the host pool's buffers must be in CPU memory, one is on {b.device}")

    def _check_meta(self, pool, first: list) -> None:
        """Refuse a pool whose own page description (``get_page_buffer_meta``, where it has
        one) disagrees with these views: the first range and the page's bytes must match.
        A pool that cannot describe its pages (NotImplementedError) is refused by name."""
        meta = getattr(pool, "get_page_buffer_meta", None)
        if meta is None:
            return
        try:
            ptrs, sizes = meta(torch.arange(self.page_size, dtype=torch.int64))
        except NotImplementedError as e:
            raise ValueError(f"host pool {self.kind}: fluxkv's SGLang backend cannot store its pages: SGLang describes no page buffers for it ({e})") from None
        if list(ptrs)[:1] != [first[0].data_ptr()] or sum(sizes) != self.page_bytes:
            raise ValueError(f"the host pool's page buffers ({len(ptrs)} ranges, {sum(sizes)} bytes) are not the {self.layout} pages fluxkv expects")

    def names(self, keys: Sequence[str]) -> list:
        """The page hash of every component of every page, in order."""
        return [f"{k}{s}" for k in keys for s in self.suffixes]

    def per_page(self, results: Sequence[bool]) -> list:
        """Per-component results folded into one per page: all of its components."""
        n = len(self.suffixes)
        return [all(results[i : i + n]) for i in range(0, len(results), n)]

    def views(self, start: int) -> list:
        """The page of token slots start..start+page_size, one tensor per component."""
        if start < 0 or start % self.page_size or start + self.page_size > self.tokens:
            raise ValueError(f"host index {start} does not start a page of {self.page_size} slots in a pool of {self.tokens}")
        if self._where == "page":
            return [b[start // self.page_size] for b in self.buffers]
        return [b.narrow(self._axis, start, self.page_size) for b in self.buffers]

    def at(self, n_keys: int, host_indices: torch.Tensor) -> list:
        """The components of each page named by host_indices (page_size slots per key)."""
        idx = torch.as_tensor(host_indices).reshape(-1)
        if idx.numel() != n_keys * self.page_size:
            raise ValueError(f"{n_keys} keys need {n_keys * self.page_size} host indices, got {idx.numel()}")
        return [self.views(int(s)) for s in idx[:: self.page_size].tolist()]

    def new_flat(self) -> torch.Tensor:
        return torch.empty(sum(self.page_numels), dtype=self.dtype)

    def split_flat(self, flat, what: str) -> list:
        """A flat data page's components, as views of its memory."""
        want = sum(self.page_numels)
        if not isinstance(flat, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor (one flat host page), not {type(flat).__name__}")
        if flat.dtype != self.dtype or flat.numel() != want or not flat.is_contiguous() or flat.device.type != "cpu":
            raise ValueError(f"{what} is {flat.dtype} x {flat.numel()} ({flat.device}); a flat page is a contiguous CPU {self.dtype} x {want}")
        flat, parts, offset = flat.view(-1), [], 0
        for shape, n in zip(self.page_shapes, self.page_numels):
            parts.append(flat[offset : offset + n].view(shape))
            offset += n
        return parts


class _Meter:
    """What get_stats() reports between its calls: page counters and, with storage metrics on,
    SGLang's per-call samples. The prefetch and backup threads and the scheduler share it."""

    def __init__(self, samples: bool):
        self._samples_on = samples
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "stored": 0}
        self._samples: dict = {name: [] for name in _SAMPLES}

    def loaded(self, asked: int, hits: int, page_bytes: int, seconds: float) -> None:
        with self._lock:
            self._counts["hits"] += hits
            self._counts["misses"] += asked - hits
            if self._samples_on and asked:
                self._samples["prefetch_pgs"].append(asked)
                self._samples["prefetch_bandwidth"].append(_gbps(hits * page_bytes, seconds))

    def wrote(self, stored: int, page_bytes: int, seconds: float) -> None:
        with self._lock:
            self._counts["stored"] += stored
            if self._samples_on and stored:
                self._samples["backup_pgs"].append(stored)
                self._samples["backup_bandwidth"].append(_gbps(stored * page_bytes, seconds))

    def drain(self) -> tuple:
        """(the samples since the last drain, the counters since the start)."""
        with self._lock:
            samples, self._samples = self._samples, {name: [] for name in _SAMPLES}
            return samples, dict(self._counts)


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / max(seconds, 1e-9) / 1e9


class _NamespaceUsage:
    """The pages and bytes of a store's namespace, asked of the master on a daemon thread (a
    call that can take as long as the master's timeout while the master is unreachable).
    :meth:`latest` never waits for it: it answers the last result and, when that is older
    than NAMESPACE_STATS_INTERVAL_S and no refresh is in flight, asks for the next one."""

    def __init__(self, store: kv.PageStore, components: int):
        self._store, self._components = store, components
        self._cond = threading.Condition()
        self._usage: tuple = (None, None)  # guarded by _cond, as are the three below
        self._asked_at = -float("inf")
        self._wanted = self._busy = self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"fluxkv-stats {store.namespace}", daemon=True)
        self._thread.start()

    def latest(self) -> tuple:
        """(pages, bytes) as of the last refresh; None each while there has been none, or
        while fluxkv is unreachable."""
        with self._cond:
            stale = time.monotonic() - self._asked_at >= NAMESPACE_STATS_INTERVAL_S
            if stale and not (self._wanted or self._busy or self._stopped):
                self._wanted = True
                self._cond.notify()
            return self._usage

    def stop(self) -> None:
        """End the thread (after a refresh in flight, whose answer is dropped)."""
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted or self._stopped)
                if self._stopped:
                    return
                self._wanted, self._busy, self._asked_at = False, True, time.monotonic()
            usage = None
            try:
                st = self._store.stats()
                pages = None if st["pages"] is None else st["pages"] // self._components
                usage = (pages, st["bytes"])
            except Exception:  # not an outage (the store fails open): keep the last answer
                _log.exception("fluxkv HiCache storage: the stats of %s failed", self._store.namespace)
            with self._cond:
                self._busy = False
                if usage is not None and not self._stopped:
                    self._usage = usage


@dataclass
class _LocalStorageMetrics:
    """The shape of SGLang's StorageMetrics, where SGLang is not installed."""

    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


def _storage_metrics_base() -> type:
    for name in _STORAGE_METRICS_MODULES:
        try:
            return importlib.import_module(name).StorageMetrics
        except (ImportError, AttributeError):
            continue
    return _LocalStorageMetrics


@functools.lru_cache(maxsize=1)
def stats_type() -> type:
    """The type get_stats() returns: built on SGLang's StorageMetrics (its collector accepts
    nothing else), imported on first use because SGLang's metrics module is heavy."""
    base = _storage_metrics_base()

    class FluxkvStorageStats(base):
        """SGLang's storage samples since the last get_stats(), plus fluxkv's view: ``pages``
        and ``bytes`` the namespace holds cluster-wide (None while fluxkv is unreachable) and
        (as of the last refresh: at most NAMESPACE_STATS_INTERVAL_S old when fluxkv answers);
        fluxkv calls that failed (``errors``); engine pages loaded (``hits``) and not
        (``misses``) and backed up (``stored``: in fluxkv after the backup, written now or
        found cached)."""

        def __init__(self, samples: dict, *, pages, nbytes, hits: int, misses: int, stored: int, errors: int):
            base.__init__(self)
            for name, values in samples.items():
                getattr(self, name).extend(values)
            self.pages, self.bytes = pages, nbytes
            self.hits, self.misses, self.stored, self.errors = hits, misses, stored, errors

        def __repr__(self) -> str:
            return (
                f"FluxkvStorageStats(pages={self.pages}, bytes={self.bytes}, hits={self.hits}, misses={self.misses}, "
                f"stored={self.stored}, errors={self.errors}, prefetch_pgs={self.prefetch_pgs}, backup_pgs={self.backup_pgs})"
            )

    return FluxkvStorageStats


class FluxkvHiCacheStorage(HiCacheStorage):
    """SGLang's HiCache L3 tier on fluxkv (see the module docstring).

    ``extra_config`` keys read here: ``socket`` (the owner's socket; default
    :func:`fluxkv.default_socket`), ``pin_ms`` (how long a prefix lookup pins what it found
    for the load that follows), ``checksum`` (CRC-32 every page) and ``timeout_s`` (seconds
    one owner call may take; PageStore's default when unset). Nothing opens until
    ``register_mem_pool_host``, which the controller calls first: the namespace needs the
    pool's dtype and layout. The generic calls take flat page tensors, as the controller's
    generic path and SGLang's file backend use them (``target_sizes`` is not read); the
    pointer form of Mooncake's backend (addresses and sizes) is refused with TypeError."""

    def __init__(self, storage_config, kwargs: Optional[dict] = None):
        extra = dict(storage_config.extra_config or {})
        if not storage_config.model_name:
            raise ValueError("fluxkv's SGLang backend needs the model name (it names the pages' namespace)")
        if getattr(storage_config, "should_split_heads", False):
            raise ValueError("fluxkv's SGLang backend does not split heads across TP sizes (tp_lcm_size)")
        self.storage_config = storage_config
        self.socket = extra.get("socket") or fluxkv.default_socket()
        self._store_options: dict = {"checksum": bool(extra.get("checksum", False))}
        if extra.get("pin_ms") is not None:
            self._store_options["pin_ms"] = int(extra["pin_ms"])
        if extra.get("timeout_s") is not None:
            self._store_options["timeout"] = float(extra["timeout_s"])
        self._mla = bool(storage_config.is_mla_model)
        # Whether SGLang calls the zero-copy v1 methods (its controller's rule for a
        # dynamic backend) or the generic ones, which need the pool's flat data pages.
        self._v1 = bool(extra.get("interface_v1", 0))
        self._meter = _Meter(samples=bool(storage_config.enable_storage_metrics))
        self._pages: Optional[_HostPages] = None
        self._store: Optional[kv.PageStore] = None
        self._usage: Optional[_NamespaceUsage] = None
        self._mismatch_logged_at = -_MISMATCH_LOG_EVERY_S

    # -- set-up ------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Keep the host pool and open the page store of its namespace."""
        pages = _HostPages(mem_pool_host, self._mla)
        cfg = self.storage_config
        if bool(cfg.is_page_first_layout) != (pages.layout == "page_first"):
            raise ValueError(f"storage config says page_first={cfg.is_page_first_layout}, the host pool is {pages.layout}")
        if not self._v1:
            self._check_flat_pages(mem_pool_host)
        tag = f"{'mla' if self._mla else 'mha'}-{pages.tag}"
        cp_size = int(getattr(cfg, "attn_cp_size", 1) or 1)
        ns = kv.namespace(
            cfg.model_name,
            tp_rank=None if self._mla else cfg.tp_rank,
            tp_size=cfg.tp_size,
            pp_rank=cfg.pp_rank,
            pp_size=cfg.pp_size,
            dtype=pages.kv_dtype,
            layout=tag,
            extra=pages.geometry + (f"/cp{cfg.attn_cp_rank}of{cp_size}" if cp_size > 1 else ""),
        )
        store = kv.PageStore(self.socket, ns, layout=tag, fail_open=True, **self._store_options)
        self.close()  # what an earlier registration opened
        super().register_mem_pool_host(mem_pool_host)
        self._pages, self._store = pages, store
        self._usage = _NamespaceUsage(store, len(pages.suffixes))
        _log.info("fluxkv HiCache storage: namespace %s at %s, %d bytes per page", ns, self.socket, pages.page_bytes)

    @staticmethod
    def _check_flat_pages(pool) -> None:
        """The generic calls move flat data pages the controller gets from the pool; a pool
        that has none (an asymmetric K/V pool) would fail on the first prefetch, so it is
        refused here, with what to set instead."""
        try:
            pool.get_dummy_flat_data_page()
        except NotImplementedError as e:
            raise ValueError(
                f"host pool {type(pool).__name__} has no flat data pages ({e}): SGLang's generic storage calls cannot move "
                'its pages; set "interface_v1": 1 in --hicache-storage-backend-extra-config for the zero-copy calls'
            ) from None

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        """Hybrid models' extra host pools (Mamba, SWA, indexers) are refused here, when the
        backend is attached, rather than by the v2 calls on SGLang's prefetch thread."""
        if str(host_pool_name) != "kv":
            raise ValueError(f"fluxkv's SGLang backend stores KV pages only, not the {host_pool_name!r} pool of a hybrid model")

    @property
    def namespace(self) -> str:
        return self._ready()[1].namespace

    def _ready(self) -> tuple:
        if self._store is None:
            raise RuntimeError("fluxkv's SGLang backend is used before register_mem_pool_host()")
        return self._pages, self._store

    # -- zero-copy calls -----------------------------------------------------------------------

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info: Any = None) -> List[bool]:
        """Load each page into the host pool at its slots; True where it was loaded."""
        pages, _ = self._ready()
        return self._load(keys, pages.at(len(keys), host_indices))

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info: Any = None) -> List[bool]:
        """Store each page of the host pool at its slots; True where fluxkv holds it now."""
        pages, _ = self._ready()
        return self._save(keys, pages.at(len(keys), host_indices), _page_before(extra_info))

    # -- generic (flat page) calls -----------------------------------------------------------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Optional[torch.Tensor]:
        """The page as a flat tensor (``target_location``, filled, or a new one), or None."""
        return self.batch_get([key], None if target_location is None else [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Optional[torch.Tensor]]:
        pages, _ = self._ready()
        targets = list(target_locations) if target_locations is not None else [pages.new_flat() for _ in keys]
        if len(targets) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(targets)} target locations")
        found = self._load(keys, [pages.split_flat(t, f"target location {i}") for i, t in enumerate(targets)])
        return [t if hit else None for t, hit in zip(targets, found)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        """Store one flat page (``value``, as ``host_pool.get_data_page`` gives it)."""
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        """Store flat pages; True when fluxkv holds every one of them."""
        pages, _ = self._ready()
        if values is None:
            raise ValueError("fluxkv's SGLang backend stores the given values (flat host pages); target_locations are not read")
        values = list(values)
        if len(values) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(values)} values")
        return all(self._save(keys, [pages.split_flat(v, f"value {i}") for i, v in enumerate(values)]))

    def exists(self, key: str) -> bool:
        pages, store = self._ready()
        return all(store.contains(pages.names([key])))

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many leading pages fluxkv holds whole (one call; it pins them for pin_ms)."""
        pages, store = self._ready()
        return store.contains_prefix(pages.names(keys)) // len(pages.suffixes)

    # -- upkeep --------------------------------------------------------------------------------

    def clear(self) -> None:
        """Delete every page of this backend's namespace, cluster-wide (for MLA: every TP
        rank's, since they share them)."""
        _, store = self._ready()
        _log.info("fluxkv HiCache storage: cleared %d values of %s", store.delete_namespace(), store.namespace)

    def get_stats(self):
        """A StorageMetrics (see :func:`stats_type`) for SGLang's metrics collector. Never
        waits on fluxkv (it runs on the scheduler thread)."""
        samples, counts = self._meter.drain()
        store, usage = self._store, self._usage
        pages, nbytes = usage.latest() if usage is not None else (None, None)
        errors = store.counters()["errors"] if store is not None else 0
        return stats_type()(samples, pages=pages, nbytes=nbytes, errors=errors, **counts)

    def close(self) -> None:
        """Stop the stats thread and close the page store (the controller calls this when it
        detaches the backend)."""
        if self._usage is not None:
            self._usage.stop()
        if self._store is not None:
            self._store.close()

    # -- moving pages --------------------------------------------------------------------------

    def _load(self, keys: Sequence[str], targets: list) -> list:
        """Copy each page's components into its tensors; per page, whether all were found.

        A page of another layout is a miss, and so is every page after it (SGLang uses the
        leading pages found): the pages before it are loaded again without it."""
        pages, store = self._ready()
        started = time.perf_counter()
        names = pages.names(keys)
        flat = [t for page in targets for t in page]
        n, got = len(names), None
        while got is None:
            try:
                got = _load_components(store, names[:n], flat[:n])
            except kv.PageLayoutMismatch as e:
                self._mismatch(e)
                bad = e.index if e.index is not None and e.index < n else 0
                n = bad - bad % len(pages.suffixes)  # the whole pages before it
                if n == 0:
                    got = []
        found = pages.per_page(got + [False] * (len(names) - len(got)))
        # Counted: the leading pages found, those SGLang uses (found ones after a miss are not).
        used = next((i for i, f in enumerate(found) if not f), len(found))
        self._meter.loaded(len(keys), used, pages.page_bytes, time.perf_counter() - started)
        return found

    def _save(self, keys: Sequence[str], sources: list, before: Optional[str] = None) -> list:
        """Store each page's components; per page, whether fluxkv holds all of them now.

        The keys are consecutive pages of one prompt (SGLang backs up a radix node's pages
        in order), so they are put as one chain, whose first page follows the page
        ``before`` (its SGLang key), or starts at the root when that is unknown. An MHA
        page is two keys, K and V: the chain runs K, V, next K, ..., the order in which
        :meth:`batch_exists` looks them up, so V's parent is its K and K's parent is the
        previous page's V; a lookup stops at the first component missing, and that is
        where the cached part of the chain ends. Without prefix_keys the batch is taken to
        start at the root: right for the first batch of a node under the root; for its later
        batches, and for a generic call, the true predecessor is unknown, and the page then
        ranks by its own use instead of under its parent (never as an orphan)."""
        pages, store = self._ready()
        started = time.perf_counter()
        names = pages.names(keys)
        parent = pages.names([before])[-1] if before else None
        flat = [t if t.is_contiguous() else t.contiguous() for page in sources for t in page]
        held = pages.per_page(store.put_pages(names, flat, parent=parent))
        self._meter.wrote(sum(held), pages.page_bytes, time.perf_counter() - started)
        return held

    def _mismatch(self, e: Exception) -> None:
        now = time.monotonic()
        if now - self._mismatch_logged_at >= _MISMATCH_LOG_EVERY_S:
            self._mismatch_logged_at = now
            _log.error("fluxkv HiCache storage: a page of another layout in %s, answered as a miss: %s", self.namespace, e)


def _page_before(extra_info: Any) -> Optional[str]:
    """The SGLang key of the page before a batch: the last of ``extra_info.prefix_keys``;
    None when it names none (no extra_info, an empty list, or ``(None,)``)."""
    prefix = getattr(extra_info, "prefix_keys", None)
    last = prefix[-1] if prefix else None
    return last if isinstance(last, str) and last else None


def _load_components(store: kv.PageStore, names: list, targets: list) -> list:
    """Copy each component into its tensor (one batch call); PageLayoutMismatch (with the
    ``index`` of the component) for one of another layout."""
    if all(t.is_contiguous() for t in targets):
        return store.get_pages_into(names, targets)
    views = store.get_pages(names)
    try:
        return [_copy(i, t, view) for i, (t, view) in enumerate(zip(targets, views))]
    finally:
        views.clear()  # no view outlives the call in this frame (a traceback keeps it)


def _copy(i: int, target: torch.Tensor, page: Optional[torch.Tensor]) -> bool:
    """Copy a zero-copy page view into a (strided) host pool view; False for a miss."""
    if page is None:
        return False
    if page.dtype != target.dtype or page.shape != target.shape:
        raise _mismatch(i, f"a page of {page.dtype} {tuple(page.shape)} where {target.dtype} {tuple(target.shape)} belongs")
    target.copy_(page)
    return True


def _mismatch(i: int, message: str) -> kv.PageLayoutMismatch:
    """The PageLayoutMismatch of component ``i`` (made here: no frame of its traceback refers
    to it, so it and the views that frames hold go as soon as it is handled)."""
    e = kv.PageLayoutMismatch(message)
    e.index = i
    return e
