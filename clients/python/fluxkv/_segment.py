"""The client's two mappings of the owner's memfd segment (docs/architecture.md §3).

``ro`` is mapped PROT_READ|MAP_SHARED: every holder view handed to users (memoryview,
numpy, DLPack) points into it, so a stray write faults in the offending process instead of
corrupting a replica other processes read. ``rw`` is mapped PROT_READ|PROT_WRITE and is
touched only by the put path, which copies a value into it exactly once. Under client
isolation (docs/architecture.md §11) the owner write-seals the segment: it is mapped read-only only
(``rw`` is None) and the put path writes into the session's :class:`PutArea` instead.

Views are exported through small ctypes arrays laid over the read-only mapping
(:meth:`Segment.export`). Python's buffer protocol keeps such an array alive for as long
as any memoryview, numpy array or DLPack consumer derived from it exists, and the array
carries a *pin* whose finalizer tells the holder when its last view is gone; that is how a
holder knows when its bytes may be handed back to the owner. The arrays also keep the
Segment (and so the mapping) alive: no view ever outlives its mapping.
"""

from __future__ import annotations

import ctypes
import mmap
import os

from fluxkv._gather import Gather

__all__ = ["Segment", "PutArea", "buffer_address"]


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer, used only to read the address behind a read-only buffer.
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_GetBuffer.restype = ctypes.c_int
_ReleaseBuffer = ctypes.pythonapi.PyBuffer_Release
_ReleaseBuffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_ReleaseBuffer.restype = None


_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 1


def buffer_address(obj) -> int:
    """The address of the first byte of a (possibly read-only) buffer object."""
    view = _PyBuffer()
    _GetBuffer(obj, ctypes.byref(view), _PyBUF_SIMPLE)  # raises the buffer's own error
    try:
        return int(view.buf or 0)
    finally:
        _ReleaseBuffer(ctypes.byref(view))


# _SMALL_COPY: the largest copy Segment.write makes under the GIL.
_SMALL_COPY = 16 << 10


class Segment:
    """Both mappings of one memfd segment. The file descriptor is not kept: the mappings
    stay valid after it is closed. Never unmapped explicitly; the mappings go when the last
    Segment reference (a client session, a holder or an exported view) goes."""

    __slots__ = ("size", "ro", "rw", "ro_base", "rw_base", "__weakref__")

    def __init__(self, fd: int, size: int, writable: bool = True):
        _check_fd_size(fd, size, "segment")
        self.size = size
        self.ro = mmap.mmap(fd, size, access=mmap.ACCESS_READ)  # MAP_SHARED, PROT_READ
        self.ro_base = buffer_address(self.ro)
        self.rw = self.rw_base = None
        if writable:
            self.rw = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)  # MAP_SHARED, PROT_READ|PROT_WRITE
            self.rw_base = buffer_address(self.rw)

    def contains(self, offset: int, length: int) -> bool:
        return 0 <= offset and 0 < length and offset + length <= self.size

    def export(self, offset: int, length: int, pin) -> ctypes.Array:
        """A ctypes byte array over ro[offset:offset+length] that owns ``pin`` and keeps this
        segment mapped. memoryview(result) is the zero-copy view; the pin is finalized
        when the array and every view derived from it are gone."""
        arr = (ctypes.c_ubyte * length).from_address(self.ro_base + offset)
        arr._fluxkv_segment = self
        arr._fluxkv_pin = pin
        return arr

    def write(self, offset: int, src, length: int) -> None:
        """The put path's one copy: the C-contiguous buffer ``src`` (``length`` bytes) into
        rw at offset. A copy of more than _SMALL_COPY bytes runs without the GIL; a smaller
        one is a slice assignment (cheaper than the foreign call around it). ``src`` may be a
        :class:`~fluxkv._gather.Gather`."""
        if length <= _SMALL_COPY and not isinstance(src, Gather):
            with memoryview(src) as mv:
                self.rw[offset : offset + length] = mv.cast("B")
            return
        _copy_in(self.rw_base, offset, src, length)

    def read_bytes(self, offset: int, length: int) -> bytes:
        return self.ro[offset : offset + length]

    def read_into(self, offset: int, length: int, dest) -> None:
        """Copy ro[offset:offset+length] into the writable buffer ``dest`` (at least
        ``length`` bytes, C-contiguous), without the GIL."""
        view = _PyBuffer()
        _GetBuffer(dest, ctypes.byref(view), _PyBUF_WRITABLE)
        try:
            if view.len < length:
                raise ValueError(f"buffer holds {view.len} bytes, the value {length}")
            ctypes.memmove(view.buf, self.ro_base + offset, length)
        finally:
            _ReleaseBuffer(ctypes.byref(view))


class PutArea:
    """The session's put area under client isolation: a memfd the owner created for this
    session, mapped read-write. Values are written here and the owner copies them into the
    write-sealed segment (AreaCopy ranges of PutWrite / PutEnd)."""

    __slots__ = ("size", "rw", "rw_base", "__weakref__")

    def __init__(self, fd: int, size: int):
        _check_fd_size(fd, size, "put area")
        self.size = size
        self.rw = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        self.rw_base = buffer_address(self.rw)

    def write(self, offset: int, src, length: int) -> None:
        """Copy the C-contiguous buffer ``src`` (``length`` bytes) in at offset, without the GIL."""
        _copy_in(self.rw_base, offset, src, length)


def _check_fd_size(fd: int, size: int, what: str) -> None:
    if size <= 0:
        raise ValueError(f"{what} size {size} must be positive")
    st = os.fstat(fd)
    if st.st_size < size:
        raise ValueError(f"memfd holds {st.st_size} bytes, less than the announced {what} size {size}")


def _copy_in(base: int, offset: int, src, length: int) -> None:
    if isinstance(src, Gather):
        if src.nbytes != length:
            raise ValueError(f"value holds {src.nbytes} bytes, expected {length}")
        src.copy_to(base + offset)
        return
    view = _PyBuffer()
    _GetBuffer(src, ctypes.byref(view), _PyBUF_SIMPLE)
    try:
        if view.len != length:
            raise ValueError(f"buffer holds {view.len} bytes, expected {length}")
        ctypes.memmove(base + offset, view.buf, length)
    finally:
        _ReleaseBuffer(ctypes.byref(view))
