"""Stand-in of ``lmcache.v1.storage_backend.connector.base_connector``: the interface of a
remote connector.

Required: async ``exists``, ``exists_sync``, async ``get`` (a MemoryObj allocated from the
local CPU backend, or None), async ``put`` (the caller releases its reference afterwards),
async ``list``, async ``close``. Optional, each behind a ``support_*`` switch: ``ping``,
``batched_get``, ``batched_put``, ``batched_contains`` (the number of leading keys present),
``batched_async_contains(lookup_id, keys, pin)`` and ``batched_get_non_blocking(lookup_id,
keys)`` (the leading objects found); plus ``remove_sync``.
"""

from __future__ import annotations

import abc
from typing import List, Optional

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat, MemoryObj
from lmcache.v1.metadata import LMCacheMetadata


class RemoteConnector(metaclass=abc.ABCMeta):
    def __init__(self, config: LMCacheEngineConfig, metadata: Optional[LMCacheMetadata]):
        if metadata is None:
            raise ValueError("a remote connector needs the engine metadata")
        self.save_chunk_meta = config.get_extra_config_value("save_chunk_meta", True) or config.use_layerwise
        self.meta_fmt = MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD

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

    def batched_contains(self, keys: List[CacheEngineKey]) -> int:
        raise NotImplementedError

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
