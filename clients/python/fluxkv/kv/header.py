"""The page header: 64 bytes in front of every page's payload that say what the payload is.

Layout (little-endian)::

    0   4  magic  b"FKVP"
    4   1  format version (1)
    5   1  dtype code (DTYPES)
    6   1  ndim (0..MAX_DIMS)
    7   1  flags (bit 0: crc32 holds the payload's CRC-32)
    8   8  payload bytes
    16  4  crc32 of the payload (0 without the flag)
    20  24 shape: MAX_DIMS u32, unused ones 0
    44  20 layout tag: ASCII, NUL-padded

A reader checks all of it against what it expects before it trusts a byte of payload: a
page of another dtype, shape or layout is :class:`PageLayoutMismatch`, a page whose bytes
do not match their CRC :class:`PageCorrupt`.
"""

from __future__ import annotations

import ctypes
import math
import struct
import zlib
from dataclasses import dataclass

from fluxkv.errors import Error
from fluxkv._gen.common.ttypes import ErrorCode

__all__ = [
    "PAGE_HEADER_BYTES",
    "FORMAT_VERSION",
    "MAX_DIMS",
    "MAX_LAYOUT_BYTES",
    "DTYPES",
    "PageHeader",
    "PageLayoutMismatch",
    "PageCorrupt",
    "check_layout_tag",
]

PAGE_HEADER_BYTES = 64
FORMAT_VERSION = 1
MAX_DIMS = 6
MAX_LAYOUT_BYTES = 20
_MAGIC = b"FKVP"
_FLAG_CRC = 1
_FMT = struct.Struct(f"<4sBBBBQI{MAX_DIMS}I{MAX_LAYOUT_BYTES}s")
assert _FMT.size == PAGE_HEADER_BYTES

# dtype name -> code. Names are torch's (without "torch."), which numpy shares where it has
# the type; codes are the on-page format and never change meaning. ITEMSIZE: bytes per element.
DTYPES = {
    "float32": 1,
    "float16": 2,
    "bfloat16": 3,
    "float64": 4,
    "int8": 5,
    "uint8": 6,
    "int16": 7,
    "int32": 8,
    "int64": 9,
    "bool": 10,
    "float8_e4m3fn": 11,
    "float8_e5m2": 12,
}
_NAMES = {code: name for name, code in DTYPES.items()}
ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
assert ITEMSIZE.keys() == DTYPES.keys()


class PageLayoutMismatch(Error, ValueError):
    """A page is not what the reader expects: another dtype, shape or layout tag, another
    format version, or not a fluxkv page at all. Nothing was copied. ``index``: raised by a
    :class:`~fluxkv.kv.PageStore` load, the position of that page among the call's hashes
    (the first page that did not match; the pages before it can be loaded on their own),
    else None."""

    index = None

    def __init__(self, message: str):
        super().__init__(message, ErrorCode.INVALID_ARGUMENT)


class PageCorrupt(Error):
    """A page's payload does not match the CRC-32 its header carries."""

    def __init__(self, message: str):
        super().__init__(message, ErrorCode.INTERNAL)


def check_layout_tag(layout: str) -> bytes:
    """The layout tag as stored; raises ValueError for a tag the header cannot carry."""
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, not {type(layout).__name__}")
    raw = layout.encode("ascii", errors="strict") if layout.isascii() else None
    if raw is None or len(raw) > MAX_LAYOUT_BYTES or "\x00" in layout:
        raise ValueError(f"layout tag {layout!r} must be ASCII without NUL, at most {MAX_LAYOUT_BYTES} bytes")
    return raw


@dataclass(frozen=True)
class PageHeader:
    """What a page's payload is."""

    dtype: str
    shape: tuple
    layout: str
    nbytes: int
    crc32: int | None = None  # None: not recorded

    def pack(self) -> bytes:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} has no page format code (known: {', '.join(DTYPES)})")
        if len(self.shape) > MAX_DIMS:
            raise ValueError(f"a page has at most {MAX_DIMS} dimensions, not {len(self.shape)}")
        if any(d < 0 or d >= 1 << 32 for d in self.shape):
            raise ValueError(f"page shape {self.shape} has a dimension outside 0..2^32-1")
        dims = list(self.shape) + [0] * (MAX_DIMS - len(self.shape))
        flags = _FLAG_CRC if self.crc32 is not None else 0
        return _FMT.pack(
            _MAGIC,
            FORMAT_VERSION,
            DTYPES[self.dtype],
            len(self.shape),
            flags,
            self.nbytes,
            self.crc32 or 0,
            *dims,
            check_layout_tag(self.layout),
        )

    @classmethod
    def unpack(cls, raw: bytes, key: str = "") -> "PageHeader":
        """Parse a header; PageLayoutMismatch for anything that is not a page of this format."""
        where = f"page {key!r}" if key else "page"
        if len(raw) < PAGE_HEADER_BYTES:
            raise PageLayoutMismatch(f"{where}: {len(raw)} bytes is too short for a page header")
        magic, version, code, ndim, flags, nbytes, crc, *rest = _FMT.unpack_from(raw)
        dims, tag = rest[:MAX_DIMS], rest[MAX_DIMS]
        if magic != _MAGIC:
            raise PageLayoutMismatch(f"{where}: not a fluxkv page (no page header)")
        if version != FORMAT_VERSION:
            raise PageLayoutMismatch(f"{where}: page format version {version}, this reader knows {FORMAT_VERSION}")
        if code not in _NAMES or ndim > MAX_DIMS:
            raise PageLayoutMismatch(f"{where}: unknown dtype code {code} or {ndim} dimensions")
        shape = tuple(dims[:ndim])
        if nbytes != math.prod(shape) * ITEMSIZE[_NAMES[code]]:
            # never trusted: a reader sizes its copy and its view by dtype x shape
            raise PageLayoutMismatch(f"{where}: {nbytes} payload bytes for {_NAMES[code]} x {shape}: a malformed header")
        return cls(
            dtype=_NAMES[code],
            shape=shape,
            layout=tag.rstrip(b"\x00").decode("ascii", errors="replace"),
            nbytes=nbytes,
            crc32=crc if flags & _FLAG_CRC else None,
        )

    def expect(self, *, key: str, dtype: str | None, shape: tuple | None, layout: str, value_len: int) -> None:
        """Raise PageLayoutMismatch unless this page is ``dtype`` x ``shape`` (None: any) in
        ``layout`` and the stored value holds exactly the header and its payload."""
        problems = []
        if self.layout != layout:
            problems.append(f"layout {self.layout!r}, expected {layout!r}")
        if dtype is not None and self.dtype != dtype:
            problems.append(f"dtype {self.dtype}, expected {dtype}")
        if shape is not None and tuple(self.shape) != tuple(shape):
            problems.append(f"shape {tuple(self.shape)}, expected {tuple(shape)}")
        if PAGE_HEADER_BYTES + self.nbytes != value_len or self.nbytes != math.prod(self.shape) * ITEMSIZE[self.dtype]:
            problems.append(f"{self.nbytes} payload bytes in a {value_len}-byte value")
        if problems:
            raise PageLayoutMismatch(f"page {key!r}: " + "; ".join(problems))


def crc32_of(address: int, nbytes: int) -> int:
    """CRC-32 of raw memory (zlib's polynomial), without a copy."""
    view = (ctypes.c_ubyte * nbytes).from_address(address)
    return zlib.crc32(memoryview(view)) & 0xFFFFFFFF
