"""Raw host-memory access shared by the core: read and write 64-bit words at absolute addresses.

Signals, command rings and bound command blocks are plain memory that native code (the CPU command
processor, later a GPU through a host-visible mapping) reads and writes concurrently, so the core
touches them only through these helpers: each access is one aligned 64-bit load or store, which is
single-copy atomic on every 64-bit target we run on.
"""
from __future__ import annotations

import cffi
import numpy as np

__all__ = ["ffi", "u64_array", "u64_pointer"]

# One FFI object without a cdef: only casts and buffers are needed here (no C functions).
ffi = cffi.FFI()

# Bytes per machine word used for signals, records and patch points.
WORD_BYTES = 8


def u64_pointer(addr: int) -> cffi.FFI.CData:
    """A `volatile uint64_t *` at `addr`; index it for single 64-bit loads/stores."""
    if addr % WORD_BYTES:
        raise ValueError(f"address {addr:#x} is not {WORD_BYTES}-byte aligned")
    return ffi.cast("volatile uint64_t *", addr)


def u64_array(addr: int, count: int) -> np.ndarray:
    """A numpy uint64 view (no copy) of `count` words at `addr`, for bulk record writes."""
    if addr % WORD_BYTES:
        raise ValueError(f"address {addr:#x} is not {WORD_BYTES}-byte aligned")
    return np.frombuffer(ffi.buffer(ffi.cast("char *", addr), count * WORD_BYTES), dtype=np.uint64)
