"""Stand-in of ``lmcache.v1.metadata``: what the engine tells LMCache about the model and
this worker."""

from __future__ import annotations

from dataclasses import dataclass

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
