"""Namespaces and page keys.

A page's key is ``<namespace>/<hash text>``. The master indexes keys by the text before
their last ``/`` (their namespace; the owner only forwards), which is what makes
:meth:`PageStore.delete_namespace` and per-namespace stats cost the namespace's pages
rather than the whole cache; so a namespace may contain ``/`` but a page hash's text may not.
"""

from __future__ import annotations

import re

from fluxkv._gen.external.constants import MAX_KEY_BYTES

__all__ = ["namespace", "hash_text", "check_namespace"]

# The most bytes a namespace may take: room is left for a 128-byte hash text (a hex SHA-256
# with a suffix, as SGLang's "<64 hex>.k" keys: 64 bytes of room made a namespace near
# the limit give keys the owner refuses, and nothing was cached; a review).
MAX_NAMESPACE_BYTES = MAX_KEY_BYTES - 129
_VERSION = "kv1"
# A tensor-parallel part of a namespace: a model name holding one could end where another
# model's namespace (with a longer extra) goes on.
_TP_PART = re.compile(r"tp(\d+of\d+|\*)")


def namespace(
    model: str,
    *,
    tp_rank: int | None = 0,
    tp_size: int | None = 1,
    pp_rank: int = 0,
    pp_size: int = 1,
    dtype: str = "",
    layout: str = "",
    extra: str = "",
) -> str:
    """The namespace of one model's pages as one rank holds them:
    ``kv1/<model>/tp<r>of<n>/pp<r>of<n>/<dtype>/<layout>[/<extra>]``. Pass ``tp_rank=None``
    for pages every tensor-parallel rank shares (MLA): the part reads ``tp*``. Two models,
    ranks, dtypes or layouts never share a namespace, so never a page."""
    if not model:
        raise ValueError("namespace: the model name is empty")
    # The parts between the model and the extra are one each: with a '/' in dtype or layout,
    # or a model name holding a part of its own, two configurations made one namespace
    # (dtype "a/b" and dtype "a" with layout "b/-"; a review).
    if any(_TP_PART.fullmatch(p) for p in model.split("/")):
        raise ValueError(f"namespace: model name {model!r} holds a part read as the tensor-parallel one")
    for what, v in (("dtype", dtype), ("layout", layout)):
        if "/" in v:
            raise ValueError(f"namespace: {what} {v!r} must hold no '/'")
    tp = "tp*" if tp_rank is None else f"tp{int(tp_rank)}of{int(tp_size or 1)}"
    parts = [_VERSION, model, tp, f"pp{int(pp_rank)}of{int(pp_size)}", dtype or "-", layout or "-"]
    if extra:
        parts.append(extra)
    return check_namespace("/".join(parts))


def check_namespace(ns: str) -> str:
    """``ns`` if it can prefix page keys; ValueError otherwise."""
    if not isinstance(ns, str):
        raise TypeError(f"a namespace is a str, not {type(ns).__name__}")
    raw = ns.encode("utf-8")
    if not raw or ns.endswith("/") or len(raw) > MAX_NAMESPACE_BYTES:
        raise ValueError(f"namespace {ns!r} must be 1..{MAX_NAMESPACE_BYTES} bytes and not end with '/'")
    return ns


def hash_text(h) -> str:
    """A page hash as key text: a str as it is, bytes as hex, an int as hex (``-`` for a
    negative one)."""
    if isinstance(h, str):
        if not h or "/" in h:
            raise ValueError(f"page hash {h!r} must be non-empty and hold no '/'")
        return h
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
        if not b:
            raise ValueError("page hash is empty bytes")
        return b.hex()
    if isinstance(h, int) and not isinstance(h, bool):
        return f"{h:x}" if h >= 0 else f"-{-h:x}"
    raise TypeError(f"a page hash is a str, bytes or int, not {type(h).__name__}")
