"""Stand-in of ``lmcache.utils``: the cache engine keys.

A key names one chunk of KV for one worker: its string form is
``model@world_size@worker_id@<chunk hash hex>@<dtype>[@tag%value...]`` (a layer key adds
``@layer_id`` after the dtype). Tags come from request configs named ``lmcache.tag.<tag>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

DTYPE_NAMES = {
    torch.float16: "half",
    torch.bfloat16: "bfloat16",
    torch.float32: "float",
    torch.float64: "double",
    torch.uint8: "fp8",
}
_TAG = "lmcache.tag."


@dataclass
class CacheEngineKey:
    model_name: str
    world_size: int
    worker_id: int
    chunk_hash: int
    dtype: torch.dtype
    request_configs: Optional[dict] = None
    tags: Optional[tuple] = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"unsupported dtype in CacheEngineKey: {self.dtype}")
        tags = [(k[len(_TAG):], v) for k, v in (self.request_configs or {}).items() if k.startswith(_TAG)]
        self.tags = tuple(tags) if tags else None

    def _ident(self) -> tuple:
        return (self.model_name, self.world_size, self.worker_id, self.chunk_hash, self.dtype, self.tags)

    def __hash__(self) -> int:
        return hash(self._ident())

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self._ident() == other._ident()

    @property
    def chunk_hash_hex(self) -> str:
        return f"{self.chunk_hash:x}"

    def _head(self) -> str:
        return f"{self.model_name}@{self.world_size}@{self.worker_id}@{self.chunk_hash_hex}@{DTYPE_NAMES[self.dtype]}"

    def _tail(self) -> str:
        return "".join(f"@{k}%{v}" for k, v in self.tags or ())

    def to_string(self) -> str:
        return self._head() + self._tail()


@dataclass(eq=False)
class LayerCacheEngineKey(CacheEngineKey):
    """The key of one layer of a chunk (layer-wise transfers)."""

    layer_id: int = 0

    def _ident(self) -> tuple:
        return (*super()._ident(), self.layer_id)

    __hash__ = CacheEngineKey.__hash__

    def to_string(self) -> str:
        return f"{self._head()}@{self.layer_id}{self._tail()}"

