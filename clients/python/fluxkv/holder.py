"""MemHolder: a zero-copy, read-only view of one value in the owner's segment.

A holder pins ``len`` bytes at ``offset`` of the segment until it is released: the owner
keeps them (docs/architecture.md §4, holder lifecycle) and the client's read-only mapping shows them.
Every way of looking at the bytes (``memoryview()``, ``numpy()``, ``__dlpack__``) is a
view of that mapping, never a copy, except ``bytes()``.

Lifetime rules:

* ``release()`` (or leaving a ``with`` block, or garbage collection) ends the holder: from
  then on every accessor raises :class:`fluxkv.Error`. The release ack is queued and sent
  to the owner piggybacked on the client's next call (or by its flush timer).
* Views exported before the release stay valid and keep their bytes: the ack is delayed
  until the last exported view (memoryview, numpy array, DLPack tensor) is gone. Each
  export carries a *pin*; the ack goes out when the holder is released and has no pins.
* A holder belongs to one attach session. After the owner restarted (new generation), the
  client closed, or in a forked child, its accessors raise; its views stay mapped (memory
  safe) but their bytes are no longer guaranteed.
"""

from __future__ import annotations

import ctypes
import itertools

from fluxkv import _dlpack
from fluxkv.errors import Error, InvalidArgument

__all__ = ["MemHolder"]

_SOURCES = {1: "memory", 2: "ssd"}
_tokens = itertools.count(1)  # next() is atomic under the GIL


def next_pin_token() -> int:
    """A token for the session's pins, distinct from every holder's."""
    return next(_tokens)


class _Pin:
    """Owned by one exported view's backing array; its finalization unpins the holder."""

    __slots__ = ("holder", "token")

    def __init__(self, holder: "MemHolder", token: int):
        self.holder = holder
        self.token = token

    def __del__(self):
        h = self.holder
        if h is not None:
            self.holder = None
            h._unpin(self.token, from_gc=True)


class MemHolder:
    """A held value: ``len(h)`` bytes, viewed zero-copy through the read-only mapping."""

    __slots__ = (
        "_session",
        "_holder_id",
        "_offset",
        "_len",
        "_source",
        "_remote",
        "_put_id",
        "_key",
        "_pins",
        "_released",
        "_ack",
        "__weakref__",
    )

    def __init__(
        self, session, key: str, holder_id: int, offset: int, length: int, source: int, put_id: int, remote: bool = False
    ):
        self._session = session
        self._key = key
        self._holder_id = holder_id
        self._offset = offset
        self._len = length
        self._source = source
        self._remote = bool(remote)
        self._put_id = put_id
        self._pins: set[int] = set()
        self._released = False
        self._ack = [True]  # popped exactly once, by whoever queues the release ack

    # -- metadata (always readable: it touches no shared memory) --------------------------

    def __len__(self) -> int:
        return self._len

    @property
    def key(self) -> str:
        return self._key

    @property
    def source(self) -> str:
        """``"memory"`` or ``"ssd"``: where the owner found the bytes (a get after a pinned
        prefix lookup: where the lookup found them, and so does ``remote``)."""
        return _SOURCES.get(self._source, "unknown")

    @property
    def remote(self) -> bool:
        """True when the bytes crossed the network: the owner pulled them from another
        owner's replica (``source`` says which tier they came from there)."""
        return self._remote

    @property
    def put_id(self) -> int:
        """The version of the key this holder shows."""
        return self._put_id

    @property
    def holder_id(self) -> int:
        return self._holder_id

    @property
    def offset(self) -> int:
        """Offset of the bytes in the owner's segment."""
        return self._offset

    @property
    def address(self) -> int:
        """Address of the first byte in this process (inside the read-only mapping)."""
        return self._session.segment.ro_base + self._offset

    @property
    def released(self) -> bool:
        return self._released

    @property
    def exports(self) -> int:
        """How many exported views (memoryview, numpy, DLPack) are still alive."""
        return len(self._pins)

    def __repr__(self) -> str:
        state = "released" if self._released else f"{self.source}, exports={len(self._pins)}"
        return f"<fluxkv.MemHolder key={self._key!r} len={self._len} {state}>"

    # -- data access ------------------------------------------------------------------------

    def memoryview(self) -> memoryview:
        """A read-only, zero-copy memoryview (format ``B``) of the value."""
        return memoryview(self._export()).cast("B").toreadonly()

    def bytes(self) -> bytes:
        """A copy of the value as ``bytes``."""
        token = self._pin()
        try:
            return self._session.segment.read_bytes(self._offset, self._len)
        finally:
            self._unpin(token)

    def copy_into(self, buffer) -> int:
        """Copy the value into a writable buffer (at least ``len(self)`` bytes); returns the length."""
        size = writable_nbytes(buffer)
        if size < self._len:
            raise InvalidArgument(f"buffer of {size} bytes is smaller than the value ({self._len} bytes)")
        token = self._pin()
        try:
            self._session.segment.read_into(self._offset, self._len, buffer)
        finally:
            self._unpin(token)
        return self._len

    def read(self, start: int, length: int) -> bytes:
        """A copy of ``length`` bytes of the value from ``start``."""
        self._check_range(start, length)
        token = self._pin()
        try:
            return self._session.segment.read_bytes(self._offset + start, length)
        finally:
            self._unpin(token)

    def copy_range_to(self, address: int, start: int, length: int) -> None:
        """Copy ``length`` bytes of the value from ``start`` to the raw ``address`` (writable
        memory of at least ``length`` bytes the caller owns, e.g. a tensor's data_ptr()),
        without the GIL."""
        self._check_range(start, length)
        token = self._pin()
        try:
            ctypes.memmove(address, self._session.segment.ro_base + self._offset + start, length)
        finally:
            self._unpin(token)

    def _check_range(self, start: int, length: int) -> None:
        if start < 0 or length < 0 or start + length > self._len:
            raise InvalidArgument(f"range [{start}, {start + length}) outside the {self._len}-byte value")

    def numpy(self, dtype=None, shape=None):
        """A read-only numpy array over the value (zero copy). ``dtype`` defaults to uint8;
        ``shape`` reshapes (the byte length must match)."""
        import numpy as np

        arr = np.frombuffer(self.memoryview(), dtype=np.uint8 if dtype is None else dtype)
        if shape is not None:
            arr = arr.reshape(shape)
        return arr

    def __dlpack__(self, stream=None, *, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule: a 1-D uint8 CPU tensor over the read-only mapping (zero copy),
        or over a private writable copy when ``copy=True``."""
        if stream is not None and stream != -1:
            raise BufferError("fluxkv holders are CPU memory: stream must be None")
        if dl_device is not None and tuple(dl_device) != (_dlpack.KDL_CPU, 0):
            raise BufferError(f"fluxkv holders live on the CPU, not on device {tuple(dl_device)}")
        if copy:
            data = (ctypes.c_ubyte * self._len).from_buffer_copy(self.bytes())
            return _dlpack.make_capsule(ctypes.addressof(data), self._len, data)
        arr = self._export()
        return _dlpack.make_capsule(ctypes.addressof(arr), self._len, arr)

    def __dlpack_device__(self):
        return (_dlpack.KDL_CPU, 0)

    # -- release ------------------------------------------------------------------------------

    def release(self) -> None:
        """End the holder. Idempotent. The owner gets the ack once the last exported view is gone."""
        if self._released:
            return
        self._released = True
        self._maybe_ack(from_gc=False)

    def __enter__(self) -> "MemHolder":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self):
        # Runs only once no view pins the holder (each pin references it).
        if not self._released:
            self._released = True
            self._maybe_ack(from_gc=True)

    # -- internals ------------------------------------------------------------------------------

    def _export(self):
        token = self._pin()
        try:
            return self._session.segment.export(self._offset, self._len, _Pin(self, token))
        except BaseException:
            self._unpin(token)
            raise

    def _pin(self) -> int:
        # Pin first, then check: a concurrent release() either sees the pin (and leaves the
        # ack to the last unpin) or has already set _released, which we see here.
        token = next(_tokens)
        self._pins.add(token)
        self._session.pins.add(token)
        if self._released:
            self._unpin(token)
            raise Error(f"holder of {self._key!r} was released")
        reason = self._session.unusable_reason()
        if reason is not None:
            self._unpin(token)
            raise Error(f"holder of {self._key!r} is no longer valid: {reason}")
        return token

    def _unpin(self, token: int, from_gc: bool = False) -> None:
        self._pins.discard(token)
        self._session.unpin(token)
        if self._released:
            self._maybe_ack(from_gc)

    def _maybe_ack(self, from_gc: bool) -> None:
        if self._pins:
            return
        try:
            self._ack.pop()
        except IndexError:
            return  # already queued
        self._session.queue_release(self._holder_id, wake=not from_gc)


def writable_nbytes(buffer) -> int:
    """The size of a writable, C-contiguous buffer; raises for anything else."""
    try:
        mv = memoryview(buffer)
    except TypeError:
        raise TypeError(f"a writable buffer is required, not {type(buffer).__name__}") from None
    with mv:
        if mv.readonly:
            raise TypeError("the buffer is read-only")
        if not mv.c_contiguous:
            raise InvalidArgument("the buffer must be C-contiguous")
        return mv.nbytes
