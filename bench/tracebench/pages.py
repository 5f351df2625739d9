"""Page contents that are a function of the block id, so every load can be checked byte for
byte: one random page (fixed seed) with the block's id written into its first 8 bytes of every
4 KiB. A page of another block, a torn page or a flipped byte all differ from what is expected."""

from __future__ import annotations

import numpy as np

__all__ = ["Pages", "STRIDE"]

STRIDE = 4096  # bytes between the copies of the id in a page
_SALT = 0x9E3779B97F4A7C15  # ids 0 and 1 do not leave the words they replace near zero


class Pages:
    """Pages of ``block_bytes`` (a multiple of 8) as uint8 numpy arrays."""

    def __init__(self, block_bytes: int, seed: int = 28):
        if block_bytes < 8 or block_bytes % 8:
            raise ValueError(f"block bytes {block_bytes} must be a positive multiple of 8")
        self.block_bytes = block_bytes
        self.base = np.random.default_rng(seed).integers(0, 256, block_bytes, dtype=np.uint8)
        self._scratch = np.empty(block_bytes, dtype=np.uint8)

    def buffers(self, n: int) -> list:
        """``n`` page buffers (written, so their memory is really there)."""
        return [np.zeros(self.block_bytes, dtype=np.uint8) for _ in range(n)]

    def fill(self, buf: np.ndarray, block: int) -> None:
        """Write block ``block``'s page into ``buf``."""
        np.copyto(buf, self.base)
        buf.view(np.uint64)[:: STRIDE // 8] = (block ^ _SALT) & 0xFFFFFFFFFFFFFFFF

    def wrong_bytes(self, buf: np.ndarray, block: int) -> int:
        """How many bytes of ``buf`` differ from block ``block``'s page."""
        self.fill(self._scratch, block)
        return int(np.count_nonzero(buf != self._scratch))
