"""fluxkv.kv: KV-cache pages on torch tensors and numpy arrays, for inference engines.

    import fluxkv
    from fluxkv import kv

    store = kv.PageStore(fluxkv.connect(), kv.namespace("my-model", tp_rank=0, tp_size=2, dtype="bfloat16"))
    n = store.contains_prefix(page_hashes)              # leading pages cached (one call, pinned briefly)
    found = store.get_pages_into(page_hashes[:n], host_buffers[:n])
    store.put_pages(page_hashes[n:], new_pages)        # already cached pages are not rewritten

A page is a tensor (any shape, dtype from :data:`DTYPES`) stored under
``<namespace>/<page hash>`` behind a 64-byte header recording its format version, dtype,
shape, layout tag and optionally a CRC-32, so a read into the wrong layout raises
:class:`PageLayoutMismatch` instead of returning garbage. The engine backends
(``fluxkv.integrations.sglang``, ``fluxkv.integrations.lmcache``) are thin layers over
:class:`PageStore`. See clients/python/README.md.
"""

from fluxkv.kv.header import DTYPES, PAGE_HEADER_BYTES, PageCorrupt, PageHeader, PageLayoutMismatch
from fluxkv.kv.namespace import hash_text, namespace
from fluxkv.kv.store import PageStore

__all__ = [
    "PageStore",
    "namespace",
    "hash_text",
    "PageHeader",
    "PageLayoutMismatch",
    "PageCorrupt",
    "PAGE_HEADER_BYTES",
    "DTYPES",
]
