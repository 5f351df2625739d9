"""A small decoder-only transformer whose KV cache is a list of pages, for tests and benchmarks
of fluxkv.kv on real tensors (issue 27).

It is what an inference engine does with a prompt, in miniature: grouped-query attention
with rotary positions (RoPE), RMSNorm and a SwiGLU MLP, in float32 or bfloat16, with the KV
cache held page-wise (``page_tokens`` tokens per page, every layer's K and V of a page in one
tensor of ``page_shape``). ``prefill`` takes the KV pages of the prompt's leading pages (from a
cache, or from an earlier prefill) and computes only the rest, concatenating the cached K and
V with the new ones under a causal mask; ``generate`` decodes greedily from there. Weights are
drawn from ``seed`` (no external weights); the bfloat16 model has the float32 model's weights
rounded, so both answer to the same seed. ``chain_hashes`` names pages as engines do: a hash
chained over every token before.

Written for torch 1.13 (no ``scaled_dot_product_attention``); everything runs on the CPU.
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import numpy as np
import torch

PAGE_TOKENS = 16


def chain_hashes(tokens: torch.Tensor, page_tokens: int = PAGE_TOKENS) -> list[str]:
    """The hash of every full page of ``tokens``, in order: hex sha256 over the previous page's
    hash (its 32 bytes; nothing for the first page) and the page's token ids as int64
    little-endian. A trailing partial page has no hash."""
    ids = np.ascontiguousarray(torch.as_tensor(tokens).reshape(-1).numpy(), dtype="<i8")
    out: list[str] = []
    prev = b""
    for p in range(len(ids) // page_tokens):
        prev = hashlib.sha256(prev + ids[p * page_tokens : (p + 1) * page_tokens].tobytes()).digest()
        out.append(prev.hex())
    return out


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm computed in float32, returned in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


class _Layer:
    """One transformer block's weights (each [in, out], applied as x @ w)."""

    def __init__(self, g: torch.Generator, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int, d_ff: int, dtype: torch.dtype):
        def w(n_in: int, n_out: int) -> torch.Tensor:
            return (torch.randn(n_in, n_out, generator=g) / math.sqrt(n_in)).to(dtype)

        def norm() -> torch.Tensor:
            return (1.0 + 0.1 * torch.randn(d_model, generator=g)).to(dtype)

        self.attn_norm = norm()
        self.wq = w(d_model, n_heads * head_dim)
        self.wk = w(d_model, n_kv_heads * head_dim)
        self.wv = w(d_model, n_kv_heads * head_dim)
        self.wo = w(n_heads * head_dim, d_model)
        self.mlp_norm = norm()
        self.w_gate = w(d_model, d_ff)
        self.w_up = w(d_model, d_ff)
        self.w_down = w(d_ff, d_model)


class TinyLM:
    """A seeded random transformer with a page-wise KV cache.

    ``page_shape`` is one page's KV of every layer: (n_layers, 2 [K, V], n_kv_heads,
    page_tokens, head_dim), in ``dtype``. K is stored after the rotary embedding, as engines
    store it. Sizes are constructor arguments: the defaults make a model that runs a few
    hundred tokens in milliseconds on one core; the benchmark builds a bigger one.
    ``attn_chunk`` bounds the queries attended at once (the score matrix's memory)."""

    def __init__(
        self,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        *,
        vocab: int = 512,
        d_model: int = 128,
        n_layers: int = 4,
        n_heads: int = 8,
        n_kv_heads: int = 2,
        d_ff: int | None = None,
        page_tokens: int = PAGE_TOKENS,
        rope_base: float = 10000.0,
        attn_chunk: int = 256,
    ):
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype {dtype}: TinyLM runs in torch.float32 or torch.bfloat16")
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"d_model {d_model}, n_heads {n_heads}, n_kv_heads {n_kv_heads}: need d_model % n_heads == 0 and n_heads % n_kv_heads == 0")
        head_dim = d_model // n_heads
        if head_dim % 2:
            raise ValueError(f"head_dim {head_dim} must be even for the rotary embedding")
        self.dtype = dtype
        self.vocab = vocab
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.page_tokens = page_tokens
        self.attn_chunk = attn_chunk
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(vocab, d_model, generator=g).to(dtype)
        self.layers = [_Layer(g, d_model, n_heads, n_kv_heads, head_dim, d_ff or 4 * d_model, dtype) for _ in range(n_layers)]
        self.final_norm = torch.ones(d_model, dtype=dtype)
        # Logits of a few units: greedy choices are far apart compared with rounding.
        self.lm_head = (4.0 * torch.randn(d_model, vocab, generator=g) / math.sqrt(d_model)).to(dtype)
        self.inv_freq = rope_base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)

    @property
    def page_shape(self) -> tuple[int, int, int, int, int]:
        return (self.n_layers, 2, self.n_kv_heads, self.page_tokens, self.head_dim)

    @property
    def page_bytes(self) -> int:
        return math.prod(self.page_shape) * torch.empty((), dtype=self.dtype).element_size()

    def prompt(self, n_tokens: int, seed: int) -> torch.Tensor:
        """A deterministic random prompt of n_tokens token ids (int64)."""
        return torch.randint(self.vocab, (n_tokens,), generator=torch.Generator().manual_seed(seed))

    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, prefix_pages: Sequence[torch.Tensor] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Run the prompt ``tokens`` (1-D int64) with the KV of its first len(prefix_pages)
        full pages given. Returns (logits of the positions computed, [T - page_tokens *
        len(prefix_pages), vocab], float32) and the KV pages of every full page of the
        prompt: the prefix pages themselves, then new C-contiguous tensors."""
        tokens, logits, kv = self._run_prompt(tokens, prefix_pages)
        n_prefix, n_full = len(prefix_pages), len(tokens) // self.page_tokens
        pt = self.page_tokens
        new = [kv[:, :, :, p * pt : (p + 1) * pt].contiguous() for p in range(n_prefix, n_full)]
        return logits, list(prefix_pages) + new

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, n: int = 64, prefix_pages: Sequence[torch.Tensor] = ()) -> list[int]:
        """Greedy decoding: the n token ids that follow the prompt, its first
        len(prefix_pages) pages' KV given."""
        _, logits, kv = self._run_prompt(tokens, prefix_pages)
        out: list[int] = []
        for i in range(n):
            nxt = int(torch.argmax(logits[-1]))
            out.append(nxt)
            if i + 1 < n:
                logits, kv = self._forward(torch.tensor([nxt]), kv)
        return out

    def _run_prompt(self, tokens: torch.Tensor, prefix_pages: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tokens checked, logits of the positions after the prefix pages, KV of every position)."""
        t = torch.as_tensor(tokens)
        if t.dim() != 1 or t.dtype != torch.int64 or len(t) == 0:
            raise ValueError(f"tokens must be a non-empty 1-D int64 tensor, not {t.dtype} of shape {tuple(t.shape)}")
        past = self._past(prefix_pages, len(t))
        logits, kv = self._forward(t[past.shape[3] :], past)
        return t, logits, kv

    def _past(self, prefix_pages: Sequence[torch.Tensor], n_tokens: int) -> torch.Tensor:
        """The prefix pages as one KV tensor [n_layers, 2, n_kv_heads, tokens, head_dim]."""
        for i, p in enumerate(prefix_pages):
            if tuple(p.shape) != self.page_shape or p.dtype != self.dtype:
                raise ValueError(f"prefix page {i} is {p.dtype} {tuple(p.shape)}, want {self.dtype} {self.page_shape}")
        if len(prefix_pages) * self.page_tokens >= n_tokens:
            raise ValueError(f"{len(prefix_pages)} prefix pages cover all {n_tokens} tokens: at least the last token must be computed")
        if not prefix_pages:
            return torch.empty(self.n_layers, 2, self.n_kv_heads, 0, self.head_dim, dtype=self.dtype)
        return torch.cat(list(prefix_pages), dim=3)

    def _rope(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rotary embedding of x [heads, tokens, head_dim] at positions start.. (float32 math)."""
        pos = torch.arange(start, start + x.shape[1], dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        xf = x.float()
        half = self.head_dim // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], -1)
        return (xf * cos + rotated * sin).to(x.dtype)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
        """Causal grouped-query attention of q [H, n, hd] (positions start..) over k, v
        [Hkv, start + n, hd]: each group of H // Hkv query heads shares one KV head. Queries go
        in chunks of attn_chunk, each over the keys up to its last position only."""
        n_kv, n, hd = k.shape[0], q.shape[1], self.head_dim
        group = q.shape[0] // n_kv
        qg = q.view(n_kv, group, n, hd)
        scale = 1.0 / math.sqrt(hd)
        outs = []
        for c in range(0, n, self.attn_chunk):
            qc = qg[:, :, c : c + self.attn_chunk]
            m, end = qc.shape[2], start + c + qc.shape[2]
            scores = torch.matmul(qc.reshape(n_kv, group * m, hd), k[:, :end].transpose(1, 2)).float() * scale
            scores = scores.view(n_kv, group, m, end)
            q_pos = torch.arange(start + c, end)
            scores.masked_fill_(torch.arange(end)[None, :] > q_pos[:, None], float("-inf"))
            probs = torch.softmax(scores, -1).to(v.dtype).view(n_kv, group * m, end)
            outs.append(torch.matmul(probs, v[:, :end]).view(n_kv, group, m, hd))
        return torch.cat(outs, 2).view(n_kv * group, n, hd)

    def _forward(self, new_tokens: torch.Tensor, past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (float32) of new_tokens following the KV ``past`` [L, 2, Hkv, S, hd], and the
        KV of every position [L, 2, Hkv, S + n, hd]."""
        start, n = past.shape[3], len(new_tokens)
        x = self.embed[new_tokens]
        kvs = []
        for li, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.attn_norm)
            q = (h @ layer.wq).view(n, self.n_heads, self.head_dim).transpose(0, 1)
            k = (h @ layer.wk).view(n, self.n_kv_heads, self.head_dim).transpose(0, 1)
            v = (h @ layer.wv).view(n, self.n_kv_heads, self.head_dim).transpose(0, 1)
            q, k = self._rope(q, start), self._rope(k, start)
            k_all = torch.cat([past[li, 0], k], 1)
            v_all = torch.cat([past[li, 1], v], 1)
            kvs.append(torch.stack([k_all, v_all]))
            a = self._attend(q, k_all, v_all, start)
            x = x + a.transpose(0, 1).reshape(n, self.n_heads * self.head_dim) @ layer.wo
            h = _rms_norm(x, layer.mlp_norm)
            x = x + (torch.nn.functional.silu(h @ layer.w_gate) * (h @ layer.w_up)) @ layer.w_down
        logits = (_rms_norm(x, self.final_norm) @ self.lm_head).float()
        return logits, torch.stack(kvs)
