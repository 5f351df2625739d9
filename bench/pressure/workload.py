"""The workload every backend sees, bit for bit: key names, values, the bootstrap order and pacing,
and the per-thread Zipf key sequences of the window.

Everything here is a pure function of (seed, key count, thread index, payload size), built on
``random.Random`` (Mersenne Twister, whose ``random()`` stream Python keeps stable across versions)
so a GPU box on another Python and no numpy draws the same keys as this one.
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import itertools
import random
import struct

import numpy as np

from .sizes import MiB

ZIPF_THETA = 0.99
ORDERS = ("random", "hot-first", "cold-first")

# The seed's bootstrap pacing (§8.3): pause after each put of a 1/4/8/16 MiB payload, capping the
# put rate at ~160 MiB/s. Other sizes interpolate linearly in MiB (0 MiB → 0 ms) and extrapolate
# past 16 MiB at the 16 MiB rate.
SEED_PACING_MS = ((1, 6.0), (4, 25.0), (8, 50.0), (16, 100.0))
_PACE_SNAP = 4096  # a payload within 4 KiB of a seed size (e.g. 1 MiB - 128 B) gets its pause


def derive_seed(seed: int, *parts) -> int:
    """A 64-bit seed for one purpose ("zipf", thread 3), independent of the others."""
    h = hashlib.sha256(repr((int(seed),) + tuple(parts)).encode()).digest()
    return int.from_bytes(h[:8], "little")


def key_name(index: int) -> str:
    """Key of dataset item ``index`` (= its Zipf rank: index 0 is the hottest)."""
    return f"pressure-{index:07d}"


def filler_key_name(index: int) -> str:
    """Key of filler value ``index``: never a dataset key, never read in a window."""
    return f"filler-{index:07d}"


def key_count(dataset_bytes: int, payload_bytes: int) -> int:
    """Keys in a dataset of about ``dataset_bytes`` (2.5 GiB / (1 MiB - 128 B) → 2560, the seed's)."""
    return max(1, round(dataset_bytes / payload_bytes))


# -- Zipf ------------------------------------------------------------------------------------------


def zipf_cdf(n: int, theta: float = ZIPF_THETA) -> list[float]:
    """Cumulative weights of ranks 0..n-1, weight(rank) = 1 / (rank + 1) ** theta, last = 1.0."""
    if n < 1:
        raise ValueError("zipf over an empty key space")
    cum = list(itertools.accumulate(1.0 / (k + 1) ** theta for k in range(n)))
    total = cum[-1]
    cdf = [c / total for c in cum]
    cdf[-1] = 1.0
    return cdf


def zipf_pmf(n: int, theta: float = ZIPF_THETA) -> list[float]:
    w = [1.0 / (k + 1) ** theta for k in range(n)]
    t = sum(w)
    return [x / t for x in w]


class ZipfSequence:
    """The key ranks one worker thread asks for, in order. Thread ``t`` (global index over all
    processes) of every backend draws the same sequence for the same seed and key count."""

    __slots__ = ("_cdf", "_rng", "_n")

    def __init__(self, n: int, seed: int, thread_index: int, theta: float = ZIPF_THETA, cdf: list[float] | None = None):
        self._cdf = cdf if cdf is not None else zipf_cdf(n, theta)
        if len(self._cdf) != n:
            raise ValueError("cdf length does not match the key count")
        self._n = n
        self._rng = random.Random(derive_seed(seed, "zipf", theta, n, thread_index))

    def next(self) -> int:
        i = bisect.bisect_left(self._cdf, self._rng.random())
        return i if i < self._n else self._n - 1

    def take(self, k: int) -> list[int]:
        return [self.next() for _ in range(k)]


# -- bootstrap -------------------------------------------------------------------------------------


def bootstrap_order(n: int, order: str, seed: int) -> list[int]:
    """Key indices in the order the bootstrap puts them. ``random`` is a seeded shuffle that does
    not depend on Zipf rank (nor on the backend); ``hot-first`` puts rank 0 first, ``cold-first``
    puts it last."""
    if order == "random":
        idx = list(range(n))
        random.Random(derive_seed(seed, "bootstrap", n)).shuffle(idx)
        return idx
    if order == "hot-first":
        return list(range(n))
    if order == "cold-first":
        return list(range(n - 1, -1, -1))
    raise ValueError(f"bootstrap order {order!r}: want one of {', '.join(ORDERS)}")


def pause_after_put_s(payload_bytes: int, scale: float = 1.0) -> float:
    """Seconds to sleep after each bootstrap put of this size (seed: 6/25/50/100 ms for
    1/4/8/16 MiB), times ``scale`` (0 turns pacing off)."""
    if scale <= 0:
        return 0.0
    for mib, ms in SEED_PACING_MS:
        if abs(payload_bytes - mib * MiB) <= _PACE_SNAP:
            return ms * scale / 1000.0
    x = payload_bytes / MiB
    pts = ((0, 0.0),) + SEED_PACING_MS
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            ms = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
            return ms * scale / 1000.0
    last_mib, last_ms = SEED_PACING_MS[-1]
    return x * (last_ms / last_mib) * scale / 1000.0


# -- values ----------------------------------------------------------------------------------------

_STAMP = struct.Struct("<QQ")
_MAGIC = 0x666C75786B762121  # "fluxkv!!"
STAMP_BYTES = _STAMP.size
# Between the end stamps, the 8-byte word at every 4 KiB names the key too: values share one
# body, so a value only stamped at its ends passed the check with any middle (zeros, another
# key's bytes, a transfer that skipped its middle).
_STRIDE_WORDS = 4096 // 8
_SALT = 0x9E3779B97F4A7C15


def _key_word(index: int) -> int:
    return (index ^ _SALT) & 0xFFFFFFFFFFFFFFFF


def _inner_words(words: np.ndarray) -> np.ndarray:
    """The words at every 4 KiB of a value's words, its stamps left out."""
    return words[_STRIDE_WORDS : len(words) - (STAMP_BYTES + 7) // 8 : _STRIDE_WORDS]


def stamp(index: int) -> bytes:
    """16 bytes naming key ``index``; written at both ends of its value."""
    return _STAMP.pack(_MAGIC, index)


def value_body(payload_bytes: int, seed: int) -> bytes:
    """The payload every value shares apart from its stamps (incompressible, deterministic)."""
    if payload_bytes < 2 * STAMP_BYTES:
        raise ValueError(f"payload {payload_bytes} B is below the {2 * STAMP_BYTES} B of stamps")
    return random.Random(derive_seed(seed, "body", payload_bytes)).randbytes(payload_bytes)


class ValueMaker:
    """Builds the value of key ``index`` in one reusable buffer (one per thread)."""

    def __init__(self, body: bytes):
        self.buf = bytearray(body)
        self.view = memoryview(self.buf)
        self.words = _inner_words(np.frombuffer(self.buf, dtype=np.uint64, count=len(self.buf) // 8))

    def value(self, index: int) -> memoryview:
        s = stamp(index)
        self.buf[:STAMP_BYTES] = s
        self.buf[-STAMP_BYTES:] = s
        self.words[:] = _key_word(index)
        return self.view


def check_value(data, index: int, payload_bytes: int) -> bool:
    """A full value read back: right length, both stamps and the word at every 4 KiB name
    ``index``."""
    if len(data) != payload_bytes:
        return False
    s = stamp(index)
    if data[:STAMP_BYTES] != s or data[-STAMP_BYTES:] != s:
        return False
    return bool((_inner_words(np.frombuffer(data, dtype=np.uint64, count=payload_bytes // 8)) == _key_word(index)).all())


def check_at(address: int, index: int, payload_bytes: int) -> bool:
    """check_value of the payload_bytes at ``address`` (a holder's bytes, read in place)."""
    s = stamp(index)
    if ctypes.string_at(address, STAMP_BYTES) != s or ctypes.string_at(address + payload_bytes - STAMP_BYTES, STAMP_BYTES) != s:
        return False
    words = np.ctypeslib.as_array((ctypes.c_uint64 * (payload_bytes // 8)).from_address(address))
    return bool((_inner_words(words) == _key_word(index)).all())


def expected_hit_rate(n: int, resident: set[int] | list[int], theta: float = ZIPF_THETA) -> float:
    """Hit rate of a get-only Zipf window over ``n`` keys when exactly ``resident`` stay cached."""
    pmf = zipf_pmf(n, theta)
    return sum(pmf[i] for i in set(resident))
