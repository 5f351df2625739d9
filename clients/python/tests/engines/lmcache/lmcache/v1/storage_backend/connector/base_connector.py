"""Stand-in of ``lmcache.v1.storage_backend.connector.base_connector``: the interface of a
remote connector.

Required: async ``exists``, ``exists_sync``, async ``get`` (a MemoryObj allocated from the
local CPU backend, or None), async ``put`` (the caller releases its reference afterwards),
async ``list``, async ``close``. Optional, each behind a ``support_*`` switch: ``ping``,
``batched_get``, ``batched_put``, ``batched_contains`` (the number of leading keys present),
``batched_async_contains(lookup_id, keys, pin)`` and ``batched_get_non_blocking(lookup_id,
keys)`` (the leading objects found); plus ``remove_sync``.

Two interfaces, by ``lmcache.RELEASE`` (see the package's docstring): the 0.4 series has
``__init__(config, metadata)`` and ``batched_contains(keys) -> int``; the releases before it
have no ``__init__`` (``meta_fmt`` is a class attribute, set by ``init_chunk_meta`` only
without saved chunk metadata, after the connector is built) and
``batched_contains(keys, stop_after_first_not_exits=True) -> List[bool]``.
"""

from __future__ import annotations

import abc
from typing import List, Optional

from lmcache import RELEASE
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.metadata import LMCacheMetadata


def _meta_fmt(metadata: LMCacheMetadata) -> MemoryFormat:
    return MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD


class _Connector(metaclass=abc.ABCMeta):
    """What both interfaces share."""

    @abc.abstractmethod
    async def exists(self, key: CacheEngineKey) -> bool: ...

    @abc.abstractmethod
    def exists_sync(self, key: CacheEngineKey) -> bool: ...

    @abc.abstractmethod
    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]: ...

    @abc.abstractmethod
    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj) -> None: ...

    @abc.abstractmethod
    async def list(self) -> List[str]: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    def support_ping(self) -> bool:
        return False

    async def ping(self) -> int:
        raise NotImplementedError

    def support_batched_get(self) -> bool:
        return False

    async def batched_get(self, keys: List[CacheEngineKey]) -> List[Optional[MemoryObj]]:
        raise NotImplementedError

    def support_batched_put(self) -> bool:
        return False

    async def batched_put(self, keys: List[CacheEngineKey], memory_objs: List[MemoryObj]) -> None:
        raise NotImplementedError

    def support_batched_contains(self) -> bool:
        return False

    def support_batched_async_contains(self) -> bool:
        return False

    async def batched_async_contains(self, lookup_id: str, keys: List[CacheEngineKey], pin: bool = False) -> int:
        raise NotImplementedError

    def support_batched_get_non_blocking(self) -> bool:
        return False

    async def batched_get_non_blocking(self, lookup_id: str, keys: List[CacheEngineKey]) -> List[MemoryObj]:
        raise NotImplementedError

    def remove_sync(self, key: CacheEngineKey) -> bool:
        raise NotImplementedError



class _RemoteConnector04(_Connector):
    def __init__(self, config: LMCacheEngineConfig, metadata: Optional[LMCacheMetadata]):
        if metadata is None:
            raise ValueError("a remote connector needs the engine metadata")
        self.save_chunk_meta = config.get_extra_config_value("save_chunk_meta", True) or config.use_layerwise
        self.meta_fmt = _meta_fmt(metadata)
        self.meta_shapes, self.meta_dtypes = metadata.get_shapes(), metadata.get_dtypes()

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        """How many leading keys are stored."""
        raise NotImplementedError


class _RemoteConnector03(_Connector):
    """The older interface: no constructor of its own (object's), chunk metadata set after
    the connector is built."""

    save_chunk_meta: bool = True
    meta_fmt: Optional[MemoryFormat] = None

    def init_chunk_meta(self, config: Optional[LMCacheEngineConfig], metadata: Optional[LMCacheMetadata]) -> None:
        """What the connector manager calls once the connector is built: without saved chunk
        metadata, the format every chunk has."""
        if config is None or metadata is None or config.get_extra_config_value("save_chunk_meta", True):
            return
        self.save_chunk_meta = False
        self.meta_fmt = _meta_fmt(metadata)

    def post_init(self) -> None:
        pass

    def batched_contains(self, keys: List[CacheEngineKey], stop_after_first_not_exits: bool = True) -> List[bool]:
        """Whether each key is stored (after the first miss, with stop_after_first_not_exits,
        the rest need not be looked up)."""
        raise NotImplementedError


RemoteConnector = _RemoteConnector04 if RELEASE == "0.4" else _RemoteConnector03
