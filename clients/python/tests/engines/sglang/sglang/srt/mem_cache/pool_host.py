"""Stand-in of sglang.srt.mem_cache.pool_host: the host (CPU) KV pools HiCache stages pages
in, with what storage backends use of them -- ``kv_buffer`` in the documented shapes,
``layout``, ``page_size``, ``size``, ``dtype``, flat data pages for the generic calls and
``get_page_buffer_meta`` for the zero-copy ones. Built from sizes, not from a device pool.

``kv_buffer`` shapes (tokens = ``size`` token slots)::

    MHA layer_first  (2, layer_num, tokens, head_num, head_dim)    K = [0], V = [1]
    MHA page_first   (2, tokens, layer_num, head_num, head_dim)
    MLA layer_first  (layer_num, tokens, 1, kv_cache_dim)
    MLA page_first   (tokens, layer_num, 1, kv_cache_dim)

A page is the ``page_size`` slots from a multiple of ``page_size``; its flat form is K's
slots then V's, each in the pool's own order.
"""

from __future__ import annotations

import torch

LAYOUTS = ("layer_first", "page_first")


class HostKVCache:
    """What the MHA and MLA pools share; a subclass gives the shape of kv_buffer and its
    components (K and V, or one)."""

    _KV_AXES = 0  # axes of kv_buffer in front of a component's

    def __init__(self, size: int, page_size: int, layer_num: int, dtype: torch.dtype, layout: str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout {layout!r}: the stand-in has {LAYOUTS}")
        if size % page_size:
            raise ValueError(f"size {size} is not a whole number of pages of {page_size}")
        self.size, self.page_size, self.layer_num = size, page_size, layer_num
        self.page_num = size // page_size
        self.dtype, self.layout, self.device = dtype, layout, "cpu"
        self.kv_buffer = torch.zeros(self._dims(), dtype=dtype)

    def _dims(self) -> tuple:
        raise NotImplementedError

    def _components(self) -> list:
        """K and V (MHA) or the one buffer (MLA), each with its token axis at _token_axis."""
        raise NotImplementedError

    @property
    def _token_axis(self) -> int:
        return 1 if self.layout == "layer_first" else 0

    @property
    def _kv_token_axis(self) -> int:
        """The token axis of kv_buffer itself: MHA's has the K/V axis in front."""
        return self._token_axis + self._KV_AXES

    def _page(self, index) -> torch.Tensor:
        return self.kv_buffer.narrow(self._kv_token_axis, int(index), self.page_size)

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        """The page at slot index, as a view of kv_buffer or flat (K's slots, then V's)."""
        page = self._page(index)
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self._page(0).numel(), dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page: torch.Tensor) -> None:
        page = self._page(index)
        page.copy_(data_page.reshape(page.shape))

    def get_page_buffer_meta(self, indices: torch.Tensor) -> tuple:
        """(pointers, byte sizes) of every page's memory ranges, pages in order: per page the
        components (page_first), or per layer the components (layer_first)."""
        assert len(indices) % self.page_size == 0
        ptrs, sizes = [], []
        for start in indices.tolist()[:: self.page_size]:
            views = [c.narrow(self._token_axis, start, self.page_size) for c in self._components()]
            parts = views if self.layout == "page_first" else [v[layer] for layer in range(self.layer_num) for v in views]
            for part in parts:
                assert part.is_contiguous()
                ptrs.append(part.data_ptr())
                sizes.append(part.numel() * part.element_size())
        return ptrs, sizes


class MHATokenToKVPoolHost(HostKVCache):
    _KV_AXES = 1
    def __init__(self, size: int, page_size: int, layer_num: int, head_num: int, head_dim: int, dtype: torch.dtype, layout: str):
        self.head_num, self.head_dim = head_num, head_dim
        super().__init__(size, page_size, layer_num, dtype, layout)

    def _dims(self) -> tuple:
        if self.layout == "layer_first":
            return (2, self.layer_num, self.size, self.head_num, self.head_dim)
        return (2, self.size, self.layer_num, self.head_num, self.head_dim)

    @property
    def k_buffer(self) -> torch.Tensor:
        return self.kv_buffer[0]

    @property
    def v_buffer(self) -> torch.Tensor:
        return self.kv_buffer[1]

    def _components(self) -> list:
        return [self.k_buffer, self.v_buffer]


class MLATokenToKVPoolHost(HostKVCache):
    def __init__(self, size: int, page_size: int, layer_num: int, kv_cache_dim: int, dtype: torch.dtype, layout: str):
        self.kv_cache_dim = kv_cache_dim
        super().__init__(size, page_size, layer_num, dtype, layout)

    def _dims(self) -> tuple:
        if self.layout == "layer_first":
            return (self.layer_num, self.size, 1, self.kv_cache_dim)
        return (self.size, self.layer_num, 1, self.kv_cache_dim)

    def _components(self) -> list:
        return [self.kv_buffer]
