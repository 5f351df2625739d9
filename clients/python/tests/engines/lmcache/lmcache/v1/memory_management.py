"""Stand-in of ``lmcache.v1.memory_management``: memory formats and memory objects.

A memory object is one chunk's KV in host memory: bytes plus their metadata (logical shape,
dtype, format) and a reference count; the allocator takes the memory back when the count
drops to zero. As upstream (0.4 series):

- ``MemoryObj`` (upstream's TensorMemoryObj) holds its KV groups back to back in one byte
  buffer: ``get_shapes()``/``get_dtypes()`` list them (one entry for one group),
  ``get_tensor(i)`` is group i, ``tensor`` is group 0 (``shape``/``dtype`` describe group 0),
  ``byte_array`` every byte.
- ``BytesBufferMemoryObj`` holds serialized bytes (what a serde such as cachegen makes):
  format BINARY_BUFFER, shape ``[n, 0, 0, 0]``, dtype None, ``tensor`` None, ``byte_array``
  a bytearray; its reference count does nothing.
- ``LayerPageMemoryObj`` (seen in a fork's memory_management, not upstream's) keeps a chunk
  as one page per layer: ``tensor`` raises, ``layer_tensor(i)`` is layer i's
  (2, tokens, hidden) page, ``get_shapes()`` lists those pages' shapes (as the fork's, which
  keeps them in the metadata's shapes), ``byte_array`` every byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Callable, List, Optional

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
    # Every KV group's shape and dtype (shape and dtype above are group 0's).
    shapes: Optional[List[torch.Size]] = None
    dtypes: Optional[List[torch.dtype]] = None


def nbytes_of(shape, dtype) -> int:
    return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()


class MemoryObj:
    """One chunk's groups in ``raw`` (uint8); ``free`` is called when the last reference goes."""

    def __init__(self, meta: MemoryObjMetadata, raw: torch.Tensor, free: Callable[["MemoryObj"], None]):
        self.meta = meta
        self._raw = raw
        self._free = free

    def get_shapes(self) -> List[torch.Size]:
        return list(self.meta.shapes or [self.meta.shape])

    def get_dtypes(self) -> List[torch.dtype]:
        return list(self.meta.dtypes or [self.meta.dtype])

    @property
    def group_prefix_sum(self) -> List[int]:
        """The byte offset of each group, and the end."""
        out = [0]
        for shape, dtype in zip(self.get_shapes(), self.get_dtypes()):
            out.append(out[-1] + nbytes_of(shape, dtype))
        return out

    def get_tensor(self, group: int) -> Optional[torch.Tensor]:
        if not self.is_valid():
            return None
        lo, hi = self.group_prefix_sum[group : group + 2]
        return self._raw[lo:hi].view(self.get_dtypes()[group]).view(self.get_shapes()[group])

    @property
    def tensor(self) -> Optional[torch.Tensor]:
        return self.get_tensor(0)

    @property
    def byte_array(self) -> memoryview:
        return memoryview(self._raw.numpy())

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


class LayerPageMemoryObj(MemoryObj):
    """A KV_2LTD chunk [2, layers, tokens, hidden] kept as one (2, tokens, hidden) page per layer."""

    @property
    def tensor(self) -> Optional[torch.Tensor]:
        raise RuntimeError("Layer page requires layer_tensor(layer_id)")

    @property
    def num_layers(self) -> int:
        return self.meta.shape[1]

    def get_shapes(self) -> List[torch.Size]:
        two, layers, tokens, hidden = self.meta.shape
        return [torch.Size([two, tokens, hidden])] * layers

    def layer_tensor(self, layer: int) -> torch.Tensor:
        two, layers, tokens, hidden = self.meta.shape
        per = nbytes_of((two, tokens, hidden), self.meta.dtype)
        return self._raw[layer * per : (layer + 1) * per].view(self.meta.dtype).view(two, tokens, hidden)


class BytesBufferMemoryObj:
    """Serialized bytes of a chunk; reference counting is a no-op, as upstream."""

    def __init__(self, raw: bytearray):
        self.raw_data = raw
        self.meta = MemoryObjMetadata(torch.Size([len(raw), 0, 0, 0]), None, 0, len(raw), 1, MemoryFormat.BINARY_BUFFER)

    tensor = None

    @property
    def byte_array(self) -> bytearray:
        return self.raw_data

    def get_shape(self) -> torch.Size:
        return self.meta.shape

    def get_dtype(self) -> None:
        return None

    def get_memory_format(self) -> MemoryFormat:
        return MemoryFormat.BINARY_BUFFER

    def is_valid(self) -> bool:
        return True

    def ref_count_up(self) -> None:
        pass

    def ref_count_down(self) -> None:
        pass
