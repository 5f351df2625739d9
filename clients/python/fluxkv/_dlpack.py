"""DLPack export of read-only memory, built with ctypes.

numpy 1.24 (Debian bookworm) refuses to export read-only arrays through its own
``__dlpack__``, so the client builds the ``DLManagedTensor`` capsule itself. The capsule
describes a 1-D uint8 CPU tensor over memory the caller keeps alive through ``keepalive``
(for holders: the ctypes array over the read-only mapping, which carries the holder's pin).
The keepalive object is held in a module table until the consumer calls the tensor's
``deleter`` (numpy and torch do so when the imported array is freed) or, if the capsule is
never consumed, until the capsule itself is destroyed.

A tensor may outlive this module: one kept by a module imported before fluxkv is freed at
interpreter exit after this module's dict was cleared. The table and the two C callbacks are
therefore never freed (one extra reference each), the callbacks reach the table through
their own default arguments, not the module's globals, and a deleter called while the
interpreter finalizes frees nothing (it crashed the process at exit: the struct it read the
deleter from, and the deleter's code, were gone).

DLPack (v0.x ABI) has no read-only flag: consumers see a writable tensor. The memory behind
it is mapped PROT_READ, so a write through it faults in the writing process; nothing else is
corrupted.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["KDL_CPU", "make_capsule", "live_exports"]

KDL_CPU = 1
_KDL_UINT = 1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
    ]


# address of a DLManagedTensor -> (the struct, its shape array, the caller's keepalive)
_LIVE: dict[int, tuple] = {}

_NAME = b"dltensor"  # must outlive every capsule: PyCapsule keeps the pointer

_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor]
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def _free(addr: int, _live=_LIVE, _finalizing=sys.is_finalizing) -> None:
    # Dropping the entry drops the struct, the shape array and the keepalive object. While
    # the interpreter finalizes nothing is dropped: the keepalive's release would run
    # client code whose modules may be cleared already (the process is exiting).
    if not _finalizing():
        _live.pop(addr, None)


@_Deleter
def _deleter(addr, _free=_free):
    # Called by the consumer (numpy, torch) when it is done with the tensor; ctypes takes
    # the GIL for us, whichever thread calls.
    if addr:
        _free(addr)


@_CapsuleDestructor
def _capsule_destructor(
    capsule, _free=_free, _valid=_PyCapsule_IsValid, _pointer=_PyCapsule_GetPointer, _name=_NAME
):
    # A consumer renames the capsule to "used_dltensor" and owns the deleter call from then
    # on; a capsule still named "dltensor" was never consumed, so free it here.
    if capsule and _valid(capsule, _name):
        addr = _pointer(capsule, _name)
        if addr:
            _free(addr)


# Never freed: a tensor's deleter may be called after this module's dict was cleared.
for _immortal in (_LIVE, _deleter, _capsule_destructor, _PyCapsule_IsValid, _PyCapsule_GetPointer):
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_immortal))
del _immortal


def make_capsule(data_address: int, nbytes: int, keepalive) -> object:
    """A "dltensor" capsule for a 1-D uint8 CPU tensor of nbytes at data_address.
    ``keepalive`` is referenced until the consumer's deleter call (or the unconsumed
    capsule's destruction)."""
    if nbytes < 0:
        raise ValueError("negative tensor size")
    shape = (ctypes.c_int64 * 1)(nbytes)
    managed = _DLManagedTensor()
    t = managed.dl_tensor
    t.data = data_address
    t.device = _DLDevice(KDL_CPU, 0)
    t.ndim = 1
    t.dtype = _DLDataType(_KDL_UINT, 8, 1)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = None  # compact row-major
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _deleter
    addr = ctypes.addressof(managed)
    _LIVE[addr] = (managed, shape, keepalive)
    try:
        return _PyCapsule_New(addr, _NAME, _capsule_destructor)
    except BaseException:
        _free(addr)
        raise


def live_exports() -> int:
    """How many DLPack tensors are still exported (not yet deleted): for tests."""
    return len(_LIVE)
