"""Stand-in of what sglang.srt.managers.cache_controller.HiCacheController does with a storage
backend, in miniature and single-threaded: attach it (the factory, then
register_mem_pool_host), pick the page I/O path (the zero-copy v1 calls for a ``dynamic``
backend whose extra_config sets ``interface_v1``, else the generic flat-page calls), count the
hit prefix batch by batch, load pages into the host pool and back them up."""

from __future__ import annotations

from typing import List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE, HiCacheStorageConfig, HiCacheStorageExtraInfo
from sglang.srt.mem_cache.storage import StorageBackendFactory


class StorageController:
    def __init__(self, storage_backend: str, storage_config: HiCacheStorageConfig, host_pool):
        self.backend = StorageBackendFactory.create_backend(storage_backend, storage_config, host_pool)
        self.backend.register_mem_pool_host(host_pool)
        self.host_pool = host_pool
        self.page_size = host_pool.page_size
        self.zero_copy = storage_backend == "dynamic" and bool(storage_config.extra_config.get("interface_v1", 0))

    def hit_pages(self, hashes: List[str]) -> int:
        """How many leading pages storage holds (as the prefetch thread's hit query)."""
        hits = 0
        for lo in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[lo : lo + STORAGE_BATCH_SIZE]
            n = self.backend.batch_exists(batch, HiCacheStorageExtraInfo())
            hits += n
            if n < len(batch):
                break
        return hits

    def load(self, hashes: List[str], host_indices: torch.Tensor) -> int:
        """Load pages into the host pool at host_indices; the leading pages loaded."""
        done = 0
        for lo in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[lo : lo + STORAGE_BATCH_SIZE]
            slots = host_indices[lo * self.page_size : (lo + len(batch)) * self.page_size]
            n = self._load_zero_copy(batch, slots) if self.zero_copy else self._load_generic(batch, slots)
            done += n
            if n < len(batch):
                break
        return done

    def _load_zero_copy(self, batch: List[str], slots: torch.Tensor) -> int:
        results = self.backend.batch_get_v1(batch, slots, HiCacheStorageExtraInfo())
        return next((i for i, ok in enumerate(results) if not ok), len(batch))

    def _load_generic(self, batch: List[str], slots: torch.Tensor) -> int:
        targets = [self.host_pool.get_dummy_flat_data_page() for _ in batch]
        pages = self.backend.batch_get(batch, targets)
        if pages is None:
            return 0
        for i, page in enumerate(pages):
            if page is None:
                return i
            self.host_pool.set_from_flat_data_page(slots[i * self.page_size], page)
        return len(batch)

    def backup(self, hashes: List[str], host_indices: torch.Tensor, prefix_keys: Optional[List[str]] = None) -> int:
        """Back up pages of the host pool at host_indices; the leading pages backed up.
        ``prefix_keys``: the hashes of the radix node's ancestors' pages (None under the
        root), handed to every batch's zero-copy call and, when there are any, extended by
        each batch backed up, as upstream's ``_page_backup`` does (the same list, mutated
        after the call)."""
        done = 0
        for lo in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[lo : lo + STORAGE_BATCH_SIZE]
            slots = host_indices[lo * self.page_size : (lo + len(batch)) * self.page_size]
            if self.zero_copy:
                ok = all(self.backend.batch_set_v1(batch, slots, HiCacheStorageExtraInfo(prefix_keys=prefix_keys)))
            else:
                ok = self.backend.batch_set(batch, [self.host_pool.get_data_page(slots[i * self.page_size]) for i in range(len(batch))])
            if not ok:
                break
            if prefix_keys and len(prefix_keys) > 0:
                prefix_keys += batch
            done += len(batch)
        return done
