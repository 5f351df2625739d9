"""Stand-in of ``lmcache.v1.storage_backend.local_cpu_backend``: the host-memory allocator
remote connectors allocate their results from. It counts what is allocated so tests can
check that a connector hands back every object it does not return, and overwrites what it
frees, as reuse would, so that reading a chunk without holding a reference shows."""

from __future__ import annotations

import threading
from typing import Optional, Union

import torch

from lmcache.v1.memory_management import MemoryFormat, MemoryObj, MemoryObjMetadata


# What freed memory holds: tests see a chunk read after its last reference went.
FREED_BYTE = 0xA5


class LocalCPUBackend:
    """Allocates up to ``capacity_bytes`` of tensors; ``allocate`` answers None beyond."""

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self.used_bytes = 0
        self.live = 0  # objects allocated and not yet freed
        self.failed = 0  # allocations answered None

    def allocate(
        self,
        shapes: Union[torch.Size, list],
        dtypes: Union[torch.dtype, list],
        fmt: Optional[MemoryFormat] = None,
        eviction: bool = True,
        busy_loop: bool = True,
    ) -> Optional[MemoryObj]:
        shape, dtype = _one(shapes), _one(dtypes)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        with self._lock:
            if self.used_bytes + nbytes > self.capacity_bytes:
                self.failed += 1
                return None
            self.used_bytes += nbytes
            self.live += 1
        tensor = torch.empty(shape, dtype=dtype)
        meta = MemoryObjMetadata(torch.Size(shape), dtype, tensor.data_ptr(), nbytes, 1, fmt or MemoryFormat.KV_2LTD)
        return MemoryObj(meta, tensor, self._free)

    def _free(self, obj: MemoryObj) -> None:
        # Freed memory is handed out again: whoever still reads it (without a reference of
        # its own) sees other bytes, here a fill pattern.
        obj._tensor.view(torch.uint8).fill_(FREED_BYTE)
        with self._lock:
            self.used_bytes -= obj.meta.phy_size
            self.live -= 1


def _one(x):
    """A single shape or dtype; LMCache also takes one-element lists (one KV group)."""
    if isinstance(x, list):
        if len(x) != 1:
            raise ValueError(f"this stand-in allocates one KV group, not {len(x)}")
        return x[0]
    return x
