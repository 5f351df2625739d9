"""Torch tensors and numpy arrays as pages: where their bytes are, what dtype and shape they
have, and zero-copy read-only tensors over a holder's payload.

Neither torch nor numpy is imported here unless the caller passes one of its objects (or
asks for a tensor), so ``fluxkv.kv`` loads on a machine with only one of them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from fluxkv._segment import in_read_only_mapping
from fluxkv.errors import InvalidArgument

from fluxkv.kv.header import DTYPES, MAX_DIMS, PAGE_HEADER_BYTES

__all__ = ["Buffer", "describe", "tensor_view"]


@dataclass(frozen=True)
class Buffer:
    """A tensor's or array's memory: ``nbytes`` at ``address``, owned by ``obj``."""

    obj: object
    dtype: str
    shape: tuple
    address: int
    nbytes: int


def _is_torch(t) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(t, torch.Tensor)


def _is_numpy(t) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(t, np.ndarray)


# The page dtype name of each torch or numpy dtype seen (a dtype's own name costs a few
# microseconds to build, paid per page otherwise); a handful of entries.
_DTYPE_NAMES: dict = {}


def _dtype_name(dtype, torch: bool) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        if torch:
            name = str(dtype).removeprefix("torch.")
        else:  # a byte-swapped dtype has its native twin's name: no page format of its own
            name = dtype.name if dtype.isnative else f"{dtype.name} in non-native byte order"
        _DTYPE_NAMES[dtype] = name
    return name


def describe(t, *, writable: bool, what: str) -> Buffer:
    """The memory of a CPU, C-contiguous torch tensor or numpy array; InvalidArgument for
    anything else (``what`` names it in the message, a callable giving it: the message is
    only built for an error)."""
    if _is_numpy(t):
        flags = t.flags
        if not flags.c_contiguous:
            raise InvalidArgument(f"{_what(what)}: the array must be C-contiguous")
        if writable and not flags.writeable:
            raise InvalidArgument(f"{_what(what)}: the array is read-only")
        name = _dtype_name(t.dtype, torch=False)
        nbytes = t.nbytes
        address = t.ctypes.data
    elif _is_torch(t):
        if t.device.type != "cpu":
            raise InvalidArgument(f"{_what(what)}: a {t.device} tensor; pages move through host memory (use a CPU tensor)")
        if not t.is_contiguous():
            raise InvalidArgument(f"{_what(what)}: the tensor must be contiguous")
        name = _dtype_name(t.dtype, torch=True)
        nbytes = t.numel() * t.element_size()
        address = t.data_ptr()
    else:
        raise TypeError(f"{_what(what)}: a torch.Tensor or numpy.ndarray is required, not {type(t).__name__}")
    if name not in DTYPES:
        raise InvalidArgument(f"{_what(what)}: dtype {name} has no page format (known: {', '.join(DTYPES)})")
    if nbytes == 0:
        raise InvalidArgument(f"{_what(what)}: an empty tensor is not a page")
    if len(t.shape) > MAX_DIMS:
        # (the header's ValueError escaped fail_open: a 7-D chunk made LMCache's whole
        # batched_put raise; a review)
        raise InvalidArgument(f"{_what(what)}: a page has at most {MAX_DIMS} dimensions, not {len(t.shape)}")
    if writable and in_read_only_mapping(address, nbytes):
        # (torch has no read-only flag: a page of get_pages taken for a load target was
        # copied into, and the process died of SIGSEGV; a review.)
        raise InvalidArgument(f"{_what(what)}: a read-only view of cached bytes (a page of get_pages); load into writable memory")
    return Buffer(t, name, tuple(t.shape), address, nbytes)


def _what(what) -> str:
    return what() if callable(what) else what


def tensor_view(holder, dtype: str, shape: tuple, numpy: bool):
    """A zero-copy read-only tensor (or numpy array) of ``dtype`` x ``shape`` over a holder's
    payload; it keeps the holder's bytes for as long as it lives (then the holder is released).
    Writing into it faults: the bytes are mapped read-only."""
    if numpy:
        import numpy as np

        try:
            np_dtype = np.dtype(dtype)
        except TypeError:
            raise InvalidArgument(f"page {holder.key!r} is {dtype}, which numpy has no type for: read it as torch") from None
        return holder.numpy()[PAGE_HEADER_BYTES:].view(np_dtype).reshape(shape)
    import torch

    t_dtype = getattr(torch, dtype, None)
    if not isinstance(t_dtype, torch.dtype):
        raise InvalidArgument(f"page {holder.key!r} is {dtype}, which this torch has no type for")
    raw = torch.utils.dlpack.from_dlpack(holder)  # 1-D uint8 over the read-only mapping
    return raw[PAGE_HEADER_BYTES:].view(t_dtype).view(shape)
