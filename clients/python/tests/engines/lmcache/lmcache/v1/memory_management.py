"""Stand-in of ``lmcache.v1.memory_management``: memory formats and memory objects.

A memory object is one chunk's KV in host memory: a tensor plus its metadata (logical shape,
dtype, format) and a reference count; the allocator takes the memory back when the count
drops to zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Callable, Optional

import torch


class MemoryFormat(Enum):
    UNDEFINED = 0
    KV_2LTD = auto()  # [2, num_layers, num_tokens, hidden_dim]
    KV_T2D = auto()  # [num_tokens, 2, hidden_dim]
    KV_2TD = auto()  # [2, num_tokens, hidden_dim]
    BINARY = auto()
    BINARY_BUFFER = auto()
    KV_MLA_FMT = auto()  # [1, num_layers, num_tokens, latent_dim]


@dataclass
class MemoryObjMetadata:
    shape: torch.Size
    dtype: Optional[torch.dtype]
    address: int
    phy_size: int
    ref_count: int
    fmt: MemoryFormat = MemoryFormat.UNDEFINED


class MemoryObj:
    """One chunk's tensor and metadata; ``free`` is called when the last reference goes."""

    def __init__(self, meta: MemoryObjMetadata, tensor: torch.Tensor, free: Callable[["MemoryObj"], None]):
        self.meta = meta
        self._tensor = tensor
        self._free = free

    @property
    def tensor(self) -> Optional[torch.Tensor]:
        return self._tensor if self.is_valid() else None

    def get_shape(self) -> torch.Size:
        return self.meta.shape

    def get_dtype(self) -> Optional[torch.dtype]:
        return self.meta.dtype

    def get_memory_format(self) -> MemoryFormat:
        return self.meta.fmt

    def is_valid(self) -> bool:
        return self.meta.ref_count > 0

    def get_ref_count(self) -> int:
        return self.meta.ref_count

    def ref_count_up(self) -> None:
        if self.meta.ref_count <= 0:
            raise RuntimeError("ref_count_up of a freed MemoryObj")
        self.meta.ref_count += 1

    def ref_count_down(self) -> None:
        if self.meta.ref_count <= 0:
            raise RuntimeError("ref_count_down of a freed MemoryObj")
        self.meta.ref_count -= 1
        if self.meta.ref_count == 0:
            self._free(self)
