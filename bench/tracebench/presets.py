"""Presets, and what a block's bytes mean: the KV cache of 512 tokens of a real model.

bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element (an MLA model
caches one latent per layer instead of K and V per head). ``quick`` scales the block down so
a replay of several backends fits a small machine (and says from which model); ``full`` uses
Qwen2.5-7B's block and the whole trace, which needs a machine with the DRAM for it (10 % of
the conversation trace's distinct blocks is about 500 GiB at 28 MiB a block)."""

from __future__ import annotations

from dataclasses import dataclass

from pressure.sizes import approx_size

from .trace import BLOCK_TOKENS

__all__ = ["Model", "MODELS", "PRESETS", "describe_block"]


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    kv_heads: int  # 0 for MLA: one latent of head_dim per layer
    head_dim: int
    elem_bytes: int = 2

    @property
    def token_bytes(self) -> int:
        if self.kv_heads == 0:
            return self.layers * self.head_dim * self.elem_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * self.elem_bytes

    @property
    def block_bytes(self) -> int:
        return BLOCK_TOKENS * self.token_bytes

    def describe(self) -> str:
        shape = f"{self.layers} layers, one {self.head_dim}-wide latent" if self.kv_heads == 0 else \
            f"{self.layers} layers x {self.kv_heads} KV heads x dim {self.head_dim}"
        return f"{self.name} ({shape}, {8 * self.elem_bytes}-bit)"


MODELS = {m.name: m for m in (
    Model("Qwen2.5-7B", 28, 4, 128),
    Model("Llama-3-8B", 32, 8, 128),
    Model("DeepSeek-V3", 61, 0, 576),
)}
REFERENCE_MODEL = "Qwen2.5-7B"

PRESETS = {
    # First 3,000 requests (16 minutes of the conversation trace): 8 replays in about 3 minutes
    # on 2 cores. --requests 0 replays the whole trace (the README's figures) at the same sizes.
    "quick": dict(block_bytes=64 << 10, requests=3000, capacity="0.10,4000b", backends="fluxkv,redis,memcached,mooncake",
                  owners="1", ssd="off,on", procs=2),
    "full": dict(block_bytes=MODELS[REFERENCE_MODEL].block_bytes, requests=0, capacity="0.10,4000b",
                 backends="fluxkv,redis,memcached,mooncake", owners="1,3", ssd="off,on", procs=8),
}


def describe_block(block_bytes: int) -> str:
    """Which model's 512-token block ``block_bytes`` is, or from which it is scaled down."""
    for m in MODELS.values():
        if m.block_bytes == block_bytes:
            return f"{approx_size(block_bytes)} per block: one {BLOCK_TOKENS}-token block of {m.describe()}"
    ref = MODELS[REFERENCE_MODEL]
    return (f"{approx_size(block_bytes)} per block: scaled down {ref.block_bytes / block_bytes:.0f}x from "
            f"{ref.describe()}, {approx_size(ref.block_bytes)} per {BLOCK_TOKENS}-token block")
