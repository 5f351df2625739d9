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
import fcntl
import mmap
import os
import threading
import weakref

from fluxkv._gather import Gather

__all__ = ["Segment", "PutArea", "buffer_address", "in_read_only_mapping", "POPULATE_AUTO_MAX"]

# The segments of this process still mapped (weakly: a mapping goes with its Segment), for
# in_read_only_mapping.
_MAPPED: "weakref.WeakSet[Segment]" = weakref.WeakSet()


def in_read_only_mapping(address: int, nbytes: int) -> bool:
    """Whether [address, address + nbytes) overlaps the read-only mapping of a segment this
    process maps: memory a copy into faults (SIGSEGV) instead of failing, as a holder's view
    handed back as a load target would."""
    return any(address < s.ro_base + s.size and s.ro_base < address + nbytes for s in list(_MAPPED))

# POPULATE_AUTO_MAX: the largest segment a client maps ahead by default (Segment's
# populate=None): its page tables then take at most 64 MiB of this process (8 bytes per
# 4 KiB page, two mappings).
POPULATE_AUTO_MAX = 16 << 30
_POPULATE_CHUNK = 64 << 20
_MADV_POPULATE_READ, _MADV_POPULATE_WRITE = 22, 23  # Linux 5.14
_libc = ctypes.CDLL(None, use_errno=True)
_madvise = _libc.madvise
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_madvise.restype = ctypes.c_int


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
    Segment reference (a client session, a holder or an exported view) goes.

    ``populate`` maps every page of both mappings ahead, on a background thread
    (``populating``), so that no put or get of this process takes a page fault on its first
    touch of a page (on a VM such faults cost a first put of a 64 KiB page about as much
    as its copy): True, False, or None for segments up to POPULATE_AUTO_MAX. Only a segment
    the owner has allocated whole (its --prefault, the default) is mapped ahead: mapping
    the holes of one that is not would allocate them, charged to this process."""

    __slots__ = ("size", "ro", "rw", "ro_base", "rw_base", "populating", "__weakref__")

    def __init__(self, fd: int, size: int, writable: bool = True, populate: bool | None = None):
        st = _check_fd_size(fd, size, "segment")
        self.size = size
        self.ro = mmap.mmap(fd, size, access=mmap.ACCESS_READ)  # MAP_SHARED, PROT_READ
        self.ro_base = buffer_address(self.ro)
        _MAPPED.add(self)
        self.rw = self.rw_base = None
        if writable:
            self.rw = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)  # MAP_SHARED, PROT_READ|PROT_WRITE
            self.rw_base = buffer_address(self.rw)
        self.populating = None
        if populate is None:
            populate = size <= POPULATE_AUTO_MAX
        if populate and st.st_blocks * 512 >= size:
            self.populating = threading.Thread(target=_populate, args=(weakref.ref(self), size), name="fluxkv-populate", daemon=True)
            self.populating.start()

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
                if mv.nbytes != length:  # (mmap's own error would be an IndexError)
                    raise ValueError(f"the value is {mv.nbytes} bytes now, {length} when the put began")
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


_SEALED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def _check_fd_size(fd: int, size: int, what: str) -> os.stat_result:
    """The memfd must be sealed against shrinking and growing (the owner's are: one truncated
    under the mapping would kill a read of it with SIGBUS) and hold exactly size bytes."""
    if size <= 0:
        raise ValueError(f"{what} size {size} must be positive")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as e:
        raise ValueError(f"the {what} is not a sealable memfd (F_GET_SEALS: {e.strerror})") from None
    if seals & _SEALED != _SEALED:
        raise ValueError(f"the {what} memfd is not sealed against shrinking and growing")
    st = os.fstat(fd)
    if st.st_size != size:
        raise ValueError(f"memfd holds {st.st_size} bytes, not the announced {what} size {size}")
    return st


def _populate(ref, size: int) -> None:
    """Map the pages of segment ``ref()`` in, the writable mapping first (puts write it),
    _POPULATE_CHUNK bytes per madvise (which runs without the GIL). It stops when the segment
    is gone (it holds it only for one call) or when madvise fails (EINVAL before Linux 5.14):
    pages not mapped yet then fault in on first use, as they would without it."""
    for base_of, advice in ((lambda s: s.rw_base, _MADV_POPULATE_WRITE), (lambda s: s.ro_base, _MADV_POPULATE_READ)):
        off = 0
        while off < size:
            seg = ref()
            if seg is None:
                return
            base = base_of(seg)
            if base is None:
                break
            n = min(_POPULATE_CHUNK, size - off)
            failed = _madvise(base + off, n, advice) != 0
            del seg
            if failed:
                return
            off += n


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
