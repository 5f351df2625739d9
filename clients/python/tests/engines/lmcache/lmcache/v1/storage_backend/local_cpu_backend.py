"""Stand-in of ``lmcache.v1.storage_backend.local_cpu_backend``: the host-memory allocator
remote connectors allocate their results from. It counts what is allocated so tests can
check that a connector hands back every object it does not return, and overwrites what it
frees, as reuse would, so that reading a chunk without holding a reference shows.

``allocate`` takes one shape and dtype, or lists of them (one per KV group: the groups lie
back to back in one object); format BINARY_BUFFER gives a BytesBufferMemoryObj of
``shape[0]`` bytes (not counted: upstream's buffer allocator does not track them). With
``layer_pages`` KV chunks come as LayerPageMemoryObj (a fork's allocator)."""

from __future__ import annotations

import threading
from typing import Optional, Union

import torch

from lmcache.v1.memory_management import (
    BytesBufferMemoryObj,
    LayerPageMemoryObj,
    MemoryFormat,
    MemoryObj,
    MemoryObjMetadata,
    nbytes_of,
)


# What freed memory holds: tests see a chunk read after its last reference went.
FREED_BYTE = 0xA5


class LocalCPUBackend:
    """Allocates up to ``capacity_bytes`` of chunks; ``allocate`` answers None beyond."""

    def __init__(self, capacity_bytes: int, *, layer_pages: bool = False):
        self.capacity_bytes = capacity_bytes
        self.layer_pages = layer_pages
        self._lock = threading.Lock()
        self.used_bytes = 0
        self.live = 0  # objects allocated and not yet freed
        self.failed = 0  # allocations answered None

    def allocate(
        self,
        shapes: Union[torch.Size, list],
        dtypes: Union[torch.dtype, list, None],
        fmt: Optional[MemoryFormat] = None,
        eviction: bool = True,
        busy_loop: bool = True,
    ):
        if fmt == MemoryFormat.BINARY_BUFFER:
            return BytesBufferMemoryObj(bytearray(int(torch.Size(_first(shapes))[0])))
        shapes = [torch.Size(s) for s in shapes] if isinstance(shapes, list) else [torch.Size(shapes)]
        dtypes = list(dtypes) if isinstance(dtypes, list) else [dtypes] * len(shapes)
        if len(shapes) != len(dtypes):
            raise ValueError(f"{len(shapes)} shapes but {len(dtypes)} dtypes")
        if self.layer_pages and len(shapes) > 1:
            raise ValueError("layer pages hold one KV group")
        nbytes = sum(nbytes_of(s, d) for s, d in zip(shapes, dtypes))
        with self._lock:
            if self.used_bytes + nbytes > self.capacity_bytes:
                self.failed += 1
                return None
            self.used_bytes += nbytes
            self.live += 1
        raw = torch.empty(nbytes, dtype=torch.uint8)
        groups = len(shapes) > 1
        meta = MemoryObjMetadata(shapes[0], dtypes[0], raw.data_ptr(), nbytes, 1, fmt or MemoryFormat.KV_2LTD,
                                 shapes if groups else None, dtypes if groups else None)
        return (LayerPageMemoryObj if self.layer_pages else MemoryObj)(meta, raw, self._free)

    def _free(self, obj: MemoryObj) -> None:
        # Freed memory is handed out again: whoever still reads it (without a reference of
        # its own) sees other bytes, here a fill pattern.
        obj._raw.fill_(FREED_BYTE)
        with self._lock:
            self.used_bytes -= obj.meta.phy_size
            self.live -= 1


def _first(x):
    return x[0] if isinstance(x, list) else x
