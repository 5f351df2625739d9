"""Page contents that are a function of the block id, so every load can be checked byte for
byte: one random page (fixed seed) with the block's id written into its first 8 bytes of every
4 KiB. A page of another block, a torn page or a flipped byte all differ from what is expected."""

from __future__ import annotations

import numpy as np

__all__ = ["Pages", "STRIDE"]

STRIDE = 4096  # bytes between the copies of the id in a page
_CHECK_WORDS = 1 << 15  # words compared at once by wrong_bytes (256 KiB of each page)
_SALT = 0x9E3779B97F4A7C15  # ids 0 and 1 do not leave the words they replace near zero
_POISON = _SALT ^ 0xFFFFFFFFFFFFFFFF  # the id words of block 2**64 - 1: of no block of a trace


class Pages:
    """Pages of ``block_bytes`` (a multiple of 8) as uint8 numpy arrays."""

    def __init__(self, block_bytes: int, seed: int = 28):
        if block_bytes < 8 or block_bytes % 8:
            raise ValueError(f"block bytes {block_bytes} must be a positive multiple of 8")
        self.block_bytes = block_bytes
        self.base = np.random.default_rng(seed).integers(0, 256, block_bytes, dtype=np.uint8)
        self._scratch = self.base.copy()  # the common bytes: stamp makes it any block's page
        self._equal = np.empty(min(_CHECK_WORDS, block_bytes // 8), dtype=bool)

    def buffers(self, n: int) -> list:
        """``n`` page buffers, each written (its memory really there before the replay times
        anything: ``np.zeros`` alone maps it on first touch)."""
        out = []
        for _ in range(n):
            b = np.empty(self.block_bytes, dtype=np.uint8)
            b.fill(0)
            out.append(b)
        return out

    def store_buffers(self, n: int) -> list:
        """``n`` page buffers holding the common bytes of every page: :meth:`stamp` makes one
        a block's page by writing only its id words, 1/512 of the bytes that :meth:`fill`
        writes (the replay's own work stays out of the caches' figures as far as it can)."""
        out = self.buffers(n)
        for b in out:
            np.copyto(b, self.base)
        return out

    def fill(self, buf: np.ndarray, block: int) -> None:
        """Write block ``block``'s page into ``buf``."""
        np.copyto(buf, self.base)
        self.stamp(buf, block)

    def stamp(self, buf: np.ndarray, block: int) -> None:
        """Make ``buf``, which holds the common bytes (:meth:`store_buffers`), block ``block``'s
        page: its id words alone differ between pages."""
        buf.view(np.uint64)[:: STRIDE // 8] = (block ^ _SALT) & 0xFFFFFFFFFFFFFFFF

    def poison(self, buf: np.ndarray) -> None:
        """Overwrite ``buf``'s id words with a value no block's page has, so a load that
        reports a page found but leaves its buffer as it was fails the byte check."""
        buf.view(np.uint64)[:: STRIDE // 8] = _POISON

    def wrong_bytes(self, buf: np.ndarray, block: int) -> int:
        """How many bytes of ``buf`` differ from block ``block``'s page. Every byte is
        compared, a word at a time in runs of _CHECK_WORDS (no page-sized temporary: at
        28 MiB pages a check cost 3.6 times the page's copy, inside the timed window of
        every backend, and most for the one with the most hits); the bytes are counted only
        when some differ."""
        if buf.shape != self.base.shape:
            return self.block_bytes
        self.stamp(self._scratch, block)
        got, want, eq = buf.view(np.uint64), self._scratch.view(np.uint64), self._equal
        for lo in range(0, len(want), len(eq)):
            n = min(len(eq), len(want) - lo)
            np.equal(got[lo : lo + n], want[lo : lo + n], out=eq[:n])
            if not eq[:n].all():
                return int(np.count_nonzero(buf != self._scratch))
        return 0
