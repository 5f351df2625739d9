"""Stand-in of sglang.srt.mem_cache.pool_host: the host (CPU) KV pools HiCache stages pages
in, with what storage backends use of them -- ``kv_buffer`` in the documented shapes,
``layout``, ``page_size``, ``size``, ``dtype``, flat data pages for the generic calls and
``get_page_buffer_meta`` for the zero-copy ones. Built from sizes, not from a device pool.
Written from upstream's pool_host/{mha,mla,mha_mxfp8}.py (sgl-project/sglang main, 0047d999,
01c0ede3, 02d20b8b): the shapes, the order of the page ranges and which methods raise.

``kv_buffer`` shapes (tokens = ``size`` token slots, pages = ``size // page_size``)::

    MHA layer_first        (2, layer_num, tokens, head_num, head_dim)    K = [0], V = [1]
    MHA page_first         (2, tokens, layer_num, head_num, head_dim)
    MHA page_first_direct  (2, pages, layer_num, page_size, head_num, head_dim)
    MHA page_head          (2, pages, head_num, page_size, layer_num, head_dim)
    MLA layer_first        (layer_num, tokens, 1, kv_cache_dim)
    MLA page_first         (tokens, layer_num, 1, kv_cache_dim)
    MLA page_first_direct  (pages, layer_num, page_size, 1, kv_cache_dim)

A page is the ``page_size`` slots from a multiple of ``page_size``; its flat form is K's
slots then V's, each in the pool's own order. ``AsymmetricMHATokenToKVPoolHost`` (models
whose ``head_dim != v_head_dim``) allocates K and V apart: ``kv_buffer`` is the tuple
``(k_buffer, v_buffer)``, page_first or page_first_direct only, and it has no flat pages.
``MHATokenToKVPoolMXFP8Host`` keeps fp8 KV in ``kv_buffer`` (page_first) and its scales in
``k_scale_host``/``v_scale_host``; every storage method of it raises NotImplementedError.
"""

from __future__ import annotations

import torch

# Layouts whose page is one index of a page axis, not page_size slots of a token axis.
PAGE_AXIS_LAYOUTS = ("page_first_direct", "page_head")


class HostKVCache:
    """What the MHA and MLA pools share; a subclass gives the shape of its component buffers
    (K and V, or one) per layout."""

    LAYOUTS: tuple = ()

    def __init__(self, size: int, page_size: int, layer_num: int, dtype: torch.dtype, layout: str):
        if layout not in self.LAYOUTS:
            raise ValueError(f"layout {layout!r}: {type(self).__name__} has {self.LAYOUTS}")
        if size % page_size:
            raise ValueError(f"size {size} is not a whole number of pages of {page_size}")
        self.size, self.page_size, self.layer_num = size, page_size, layer_num
        self.page_num = size // page_size
        self.dtype, self.layout, self.device = dtype, layout, "cpu"
        self.kv_buffer = self.init_kv_buffer()

    def init_kv_buffer(self):
        raise NotImplementedError

    def _components(self) -> list:
        """K and V (MHA) or the one buffer (MLA)."""
        raise NotImplementedError

    def _component_page(self, component: torch.Tensor, start: int) -> torch.Tensor:
        """The page at slot start of one component, in the layout's own order."""
        if self.layout in PAGE_AXIS_LAYOUTS:
            return component[start // self.page_size]
        axis = 1 if self.layout == "layer_first" else 0
        return component.narrow(axis, start, self.page_size)

    def _page(self, index) -> list:
        return [self._component_page(c, int(index)) for c in self._components()]

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        """The page at slot index, flat (K's slots, then V's) or stacked."""
        parts = self._page(index)
        if flat:
            return torch.cat([p.flatten() for p in parts])
        return torch.stack(parts)

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(sum(p.numel() for p in self._page(0)), dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page: torch.Tensor) -> None:
        offset = 0
        for part in self._page(index):
            part.copy_(data_page[offset : offset + part.numel()].reshape(part.shape))
            offset += part.numel()

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple:
        """(pointers, byte sizes) of every page's memory ranges, pages in order: per page the
        components (page_first, page_first_direct, page_head), or per layer the components
        (layer_first)."""
        assert len(indices) % self.page_size == 0
        ptrs, sizes = [], []
        for start in indices.tolist()[:: self.page_size]:
            views = self._page(start)
            parts = [v[layer] for layer in range(self.layer_num) for v in views] if self.layout == "layer_first" else views
            for part in parts:
                assert part.is_contiguous()
                ptrs.append(part.data_ptr())
                sizes.append(part.numel() * part.element_size())
        return ptrs, sizes


class MHATokenToKVPoolHost(HostKVCache):
    LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")

    def __init__(self, size: int, page_size: int, layer_num: int, head_num: int, head_dim: int, dtype: torch.dtype, layout: str):
        self.head_num, self.head_dim = head_num, head_dim
        super().__init__(size, page_size, layer_num, dtype, layout)

    def _dims(self, head_dim: int) -> tuple:
        """One component's shape (K's with head_dim, V's with v_head_dim)."""
        if self.layout == "layer_first":
            return (self.layer_num, self.size, self.head_num, head_dim)
        if self.layout == "page_first":
            return (self.size, self.layer_num, self.head_num, head_dim)
        if self.layout == "page_first_direct":
            return (self.page_num, self.layer_num, self.page_size, self.head_num, head_dim)
        return (self.page_num, self.head_num, self.page_size, self.layer_num, head_dim)

    def init_kv_buffer(self):
        return torch.zeros((2, *self._dims(self.head_dim)), dtype=self.dtype)

    @property
    def k_buffer(self) -> torch.Tensor:
        return self.kv_buffer[0]

    @property
    def v_buffer(self) -> torch.Tensor:
        return self.kv_buffer[1]

    def _components(self) -> list:
        return [self.k_buffer, self.v_buffer]


class AsymmetricMHATokenToKVPoolHost(MHATokenToKVPoolHost):
    """K and V of different head dims, allocated apart: ``kv_buffer`` is ``(K, V)``."""

    LAYOUTS = ("page_first", "page_first_direct")

    def __init__(self, size: int, page_size: int, layer_num: int, head_num: int, head_dim: int, v_head_dim: int, dtype: torch.dtype, layout: str):
        self.v_head_dim = v_head_dim
        super().__init__(size, page_size, layer_num, head_num, head_dim, dtype, layout)

    def init_kv_buffer(self):
        return (torch.zeros(self._dims(self.head_dim), dtype=self.dtype), torch.zeros(self._dims(self.v_head_dim), dtype=self.dtype))

    def _no_flat_pages(self, *_args, **_kwargs):
        raise NotImplementedError("asymmetric K/V host pools have no flat data pages: use a zero-copy (v1) storage backend")

    get_data_page = get_dummy_flat_data_page = set_from_flat_data_page = _no_flat_pages


class MHATokenToKVPoolMXFP8Host(MHATokenToKVPoolHost):
    """fp8 KV (e4m3; uint8 where torch has no float8 dtype) in a page_first ``kv_buffer``,
    one scale row of ``sf_page_bytes`` per page and layer in ``k_scale_host``/``v_scale_host``."""

    LAYOUTS = ("page_first",)

    def __init__(self, size: int, page_size: int, layer_num: int, head_num: int, head_dim: int, sf_page_bytes: int, layout: str = "page_first"):
        dtype = getattr(torch, "float8_e4m3fn", torch.uint8)
        super().__init__(size, page_size, layer_num, head_num, head_dim, dtype, layout)
        self.k_scale_host = torch.zeros((self.page_num, layer_num, sf_page_bytes), dtype=torch.uint8)
        self.v_scale_host = torch.zeros((self.page_num, layer_num, sf_page_bytes), dtype=torch.uint8)

    def _scales_elsewhere(self, *_args, **_kwargs):
        raise NotImplementedError("MXFP8 host pool: scales live outside kv_buffer")

    get_data_page = get_dummy_flat_data_page = set_from_flat_data_page = get_page_buffer_meta = _scales_elsewhere


class MLATokenToKVPoolHost(HostKVCache):
    LAYOUTS = ("layer_first", "page_first", "page_first_direct")

    def __init__(self, size: int, page_size: int, layer_num: int, kv_cache_dim: int, dtype: torch.dtype, layout: str):
        self.kv_cache_dim = kv_cache_dim
        super().__init__(size, page_size, layer_num, dtype, layout)

    def init_kv_buffer(self):
        if self.layout == "layer_first":
            dims = (self.layer_num, self.size, 1, self.kv_cache_dim)
        elif self.layout == "page_first":
            dims = (self.size, self.layer_num, 1, self.kv_cache_dim)
        else:
            dims = (self.page_num, self.layer_num, self.page_size, 1, self.kv_cache_dim)
        return torch.zeros(dims, dtype=self.dtype)

    def _components(self) -> list:
        return [self.kv_buffer]
