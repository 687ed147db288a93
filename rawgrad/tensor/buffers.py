"""Tensor-graph BUFFER nodes and the device memory behind them.

A BUFFER UOp's arg is (uid, size in elements); its dtype is the element type and its only source is the
DEVICE node. Device memory is allocated on first use and kept on the node itself (its `_cached` slot, under
MEMORY_KEY: a BUFFER node is unique by its uid), so it goes back to the device allocator as soon as no graph
refers to the buffer any more.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType
from rawgrad.hcq.device import Device, HCQDevice

_uids = itertools.count()


class DeviceMemory:
    """One allocation on one device, returned to the allocator when collected."""

    __slots__ = ("device", "hcq_buffer", "nbytes", "__weakref__")

    def __init__(self, device: HCQDevice, nbytes: int):
        self.device = device
        self.nbytes = nbytes
        # zero-byte buffers get no memory: nothing may read or write them
        self.hcq_buffer: Any = device.allocator.alloc(nbytes) if nbytes > 0 else None

    def __del__(self) -> None:
        # __del__, not weakref.finalize: every replay makes fresh output buffers, and registering a
        # finalizer cost more than the rest of the allocation (~1.4 us of ~2 us)
        if self.hcq_buffer is not None:
            self.device.allocator.free(self.hcq_buffer)

    @property
    def address(self) -> int:
        return 0 if self.hcq_buffer is None else self.hcq_buffer.va_addr


MEMORY_KEY = "device_memory"


def new_buffer(device: str, size: int, dtype: DType) -> UOp:
    """A fresh buffer node of `size` elements on `device` (memory is allocated when first needed)."""
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"buffer size must be a non-negative int, got {size!r}")
    return UOp(Ops.BUFFER, dtype, (_device_node(Device.canonicalize(device)),), (next(_uids), size))


def allocated_buffer(device: HCQDevice, node: UOp, size: int, dtype: DType, nbytes: int) -> UOp:
    """`new_buffer` with its memory allocated, for a caller that made the DEVICE node and checked the size
    once (TinyJit's fresh output buffers on every replay: no canonicalizing, no lookups)."""
    buf = UOp(Ops.BUFFER, dtype, (node,), (next(_uids), size))
    buf._cached[MEMORY_KEY] = DeviceMemory(device, nbytes)
    return buf


def device_node(name: str) -> UOp:
    """The DEVICE node for a device name (canonicalized)."""
    return _device_node(Device.canonicalize(name))


@functools.cache
def _device_node(name: str) -> UOp:
    return UOp(Ops.DEVICE, arg=name)


def device_memory(buf: UOp) -> DeviceMemory:
    """The memory behind a BUFFER node, allocating it on first use."""
    if buf.op is not Ops.BUFFER:
        raise TypeError(f"expected a BUFFER node, got {buf.op}")
    mem: DeviceMemory | None = buf._cached.get(MEMORY_KEY)
    if mem is None:
        assert buf.dtype is not None
        fresh = DeviceMemory(Device[buf.device], buf.arg[1] * buf.dtype.itemsize)
        # setdefault (one atomic dict operation): two threads allocating for the same buffer both get the
        # first one's memory; the other allocation is freed when `fresh` goes out of scope
        mem = buf._cached.setdefault(MEMORY_KEY, fresh)
    mem.device.check_open()  # a buffer of a closed device instance: its memory is unmapped
    return mem


def buffer_from_numpy(arr: np.ndarray, dtype: DType, device: str) -> UOp:
    """A buffer on `device` holding a copy of `arr` (already in dtype's host layout)."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype != dtype.np:
        raise TypeError(f"host array of {flat.dtype} cannot back a {dtype} buffer")
    buf = new_buffer(device, flat.size, dtype)
    buffer_write(buf, flat)
    return buf


def buffer_numpy(buf: UOp) -> np.ndarray:
    """The buffer's contents as a flat host array in dtype's host layout (waits for pending work)."""
    assert buf.dtype is not None
    out = np.empty(buf.arg[1], dtype=buf.dtype.np)
    mem = device_memory(buf)  # a never-written buffer (Tensor.empty) reads as whatever it holds
    if mem.hcq_buffer is not None:
        mem.device.synchronize()
        mem.device.allocator.copyout(memoryview(out).cast("B"), mem.hcq_buffer)  # type: ignore[arg-type]
    return out


def buffer_write(buf: UOp, flat: np.ndarray) -> None:
    """Replace the buffer's contents with `flat` (host layout, `size` elements)."""
    assert buf.dtype is not None
    if flat.size != buf.arg[1] or flat.dtype != buf.dtype.np:
        raise ValueError(f"write of {flat.size} x {flat.dtype} into a buffer of {buf.arg[1]} x {buf.dtype}")
    mem = device_memory(buf)
    if mem.hcq_buffer is not None:
        # kernels still queued may read this memory: let them finish before the host overwrites it
        mem.device.synchronize()
        mem.device.allocator.copyin(mem.hcq_buffer, memoryview(np.ascontiguousarray(flat)).cast("B"))  # type: ignore[arg-type]


def is_allocated(buf: UOp) -> bool:
    return MEMORY_KEY in buf._cached


# movement ops an assign can write through: each maps a view element to exactly one buffer element and
# covers no padding (PAD would store out of bounds, EXPAND would store one element from many lanes)
WRITABLE_VIEW_OPS = (Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP)


def writable_view(u: UOp) -> tuple[UOp, tuple[UOp, ...]] | None:
    """(BUFFER, movement ops from the buffer up to `u`) when `u` is a chain of WRITABLE_VIEW_OPS over a
    BUFFER (the buffer itself gives an empty chain); else None."""
    chain: list[UOp] = []
    while u.op in WRITABLE_VIEW_OPS:
        chain.append(u)
        u = u.src[0]
    if u.op is not Ops.BUFFER:
        return None
    return u, tuple(reversed(chain))
