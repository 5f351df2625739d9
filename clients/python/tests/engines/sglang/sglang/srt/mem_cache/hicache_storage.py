"""Stand-in of sglang.srt.mem_cache.hicache_storage: what a storage backend is built from
(HiCacheStorageConfig), what rides along with a call (HiCacheStorageExtraInfo) and the base
class every backend subclasses (HiCacheStorage), with the documented signatures and
defaults. The hybrid-pool (v2) calls are left out: fluxkv's backend does not implement them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional

import torch

# The most pages the controller hands one storage call.
STORAGE_BATCH_SIZE = 128


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    # The JSON of --hicache-storage-backend-extra-config.
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    """A key-value store of KV pages: the generic calls move flat page tensors, the v1 calls
    move pages between the store and the host pool registered with register_mem_pool_host."""

    def register_mem_pool_host(self, mem_pool_host) -> None:
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Load each page into the host pool at its slots; one bool per key. Raises when not
        implemented: the controller indexes the result."""
        raise NotImplementedError()

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor, extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        """Store each page of the host pool at its slots; one bool per key."""
        raise NotImplementedError()

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        """The value of key, or None when it is not stored."""

    @abstractmethod
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None) -> List[torch.Tensor | None] | int:
        """A value or None per key."""

    @abstractmethod
    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> bool:
        """Store value under key; whether it worked."""

    @abstractmethod
    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None) -> bool:
        """Store every value; whether all of them worked."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether key is stored."""

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading keys are stored."""
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None
