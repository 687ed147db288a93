"""Tensor-graph BUFFER nodes and the device memory behind them.

A BUFFER UOp's arg is (uid, size in elements); its dtype is the element type and its only source is the
DEVICE node. The memory lives in `_storage`, keyed weakly by the UOp, so it is released as soon as no
graph refers to the buffer any more.

TEMPORARY: storage is host numpy arrays until the HCQ allocator lands; the functions below are the
interface the Tensor layer and the realize loop use, and stay the same when the storage moves.
"""
from __future__ import annotations

import itertools
import weakref

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType

_uids = itertools.count()
_storage: weakref.WeakKeyDictionary[UOp, np.ndarray] = weakref.WeakKeyDictionary()


def new_buffer(device: str, size: int, dtype: DType) -> UOp:
    """A fresh, uninitialised buffer of `size` elements on `device`."""
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"buffer size must be a non-negative int, got {size!r}")
    return UOp(Ops.BUFFER, dtype, (UOp(Ops.DEVICE, arg=device),), (next(_uids), size))


def buffer_from_numpy(arr: np.ndarray, dtype: DType, device: str) -> UOp:
    """A buffer on `device` holding a copy of `arr` (already converted to dtype's host layout)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype != dtype.np:
        raise TypeError(f"host array of {flat.dtype} cannot back a {dtype} buffer")
    buf = new_buffer(device, flat.size, dtype)
    _storage[buf] = flat.copy()
    return buf


def buffer_numpy(buf: UOp) -> np.ndarray:
    """The buffer's contents as a flat host array in dtype's host layout (a copy)."""
    if buf.op is not Ops.BUFFER:
        raise TypeError(f"expected a BUFFER node, got {buf.op}")
    data = _storage.get(buf)
    if data is None:
        raise RuntimeError("buffer has no data yet (it was never realized)")
    return data.copy()


def buffer_write(buf: UOp, flat: np.ndarray) -> None:
    """Replace the buffer's contents with `flat` (host layout, `size` elements)."""
    assert buf.dtype is not None
    if flat.size != buf.arg[1] or flat.dtype != buf.dtype.np:
        raise ValueError(f"write of {flat.size} x {flat.dtype} into a buffer of {buf.arg[1]} x {buf.dtype}")
    _storage[buf] = np.ascontiguousarray(flat).reshape(-1).copy()


def is_allocated(buf: UOp) -> bool:
    return buf in _storage
