"""Values made of several memory ranges: a put that writes a header and a payload that live
in different objects straight into shared memory, back to back, with no joined copy.

A :class:`Gather` lists ``(address, nbytes)`` ranges and keeps the objects that own them
alive for as long as it lives. :meth:`Gather.copy_to` copies any byte range of the joined
value to an address; the put path calls it where it would copy a plain buffer (the segment,
or the put area under client isolation, part by part for a value larger than the area).
"""

from __future__ import annotations

import ctypes

__all__ = ["Gather"]


class Gather:
    """A put value made of ``ranges`` (``(address, nbytes)`` pairs, in order). ``keep`` holds
    the objects that own the memory (tensors, arrays, bytes): they must not be resized or
    freed while the Gather is in use, and the Gather keeps a reference to them."""

    __slots__ = ("ranges", "nbytes", "_keep")

    def __init__(self, ranges, keep=()):
        rs = []
        total = 0
        for addr, n in ranges:
            addr, n = int(addr), int(n)
            if n < 0 or (n and not addr):
                raise ValueError(f"bad range ({addr:#x}, {n})")
            if n:
                rs.append((addr, n))
                total += n
        self.ranges = tuple(rs)
        self.nbytes = total
        self._keep = tuple(keep)

    def copy_to(self, dest: int, start: int = 0, length: int | None = None) -> None:
        """Copy bytes [start, start+length) of the joined value to address ``dest`` (without
        the GIL: ctypes.memmove is a foreign call)."""
        end = self.nbytes if length is None else start + length
        if start < 0 or end > self.nbytes or start > end:
            raise ValueError(f"range [{start}, {end}) outside a {self.nbytes}-byte value")
        at = 0  # offset of the current range in the joined value
        for addr, n in self.ranges:
            if at >= end:
                break
            lo, hi = max(start, at), min(end, at + n)
            if lo < hi:
                ctypes.memmove(dest + (lo - start), addr + (lo - at), hi - lo)
            at += n
