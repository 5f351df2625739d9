"""Stand-in of ``lmcache.v1.metadata``: what the engine tells LMCache about the model and
this worker, with its KV groups (0.4 series: a model may keep several groups of KV, each of
its own shape and dtype, in one chunk)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch


@dataclass
class LMCacheMetadata:
    model_name: str
    world_size: int
    worker_id: int
    kv_dtype: torch.dtype
    # (num_layers, 2, chunk_size, num_kv_heads, head_size), as LMCache records it
    kv_shape: tuple
    use_mla: bool = False
    chunk_size: int = 256
    # Each KV group's full-chunk shape and dtype, where the model has several.
    group_shapes: Optional[List[torch.Size]] = None
    group_dtypes: Optional[List[torch.dtype]] = None

    def get_num_groups(self) -> int:
        return len(self.group_shapes) if self.group_shapes else 1

    def get_shapes(self) -> List[torch.Size]:
        if self.group_shapes:
            return list(self.group_shapes)
        layers, two, tokens, heads, head_size = self.kv_shape
        return [torch.Size([two, layers, tokens, heads * head_size])]

    def get_dtypes(self) -> List[torch.dtype]:
        return list(self.group_dtypes) if self.group_dtypes else [self.kv_dtype]
