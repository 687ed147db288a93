"""One process-wide switch: keep every native mapping once a native thread had to be abandoned.

A CPU worker thread stuck inside a kernel that does not return (or one that outlives its wait's timeout
at exit) keeps executing the kernel's image and reading and writing buffers. Unmapping any of them under
it crashes the whole process (SIGSEGV at exit). So when `CPUDevice.close` abandons a worker, it pins all
mappings: from then on the ELF loader and the CPU host-memory layer leave memory mapped instead of
unmapping it (a leak, reported once, for the rest of a process that is usually exiting anyway).
"""

from __future__ import annotations

import threading
import warnings

_pinned = threading.Event()


def pin_all(reason: str) -> None:
    if not _pinned.is_set():
        _pinned.set()
        warnings.warn(f"{reason}; from now on no kernel image or buffer is unmapped (memory is leaked so "
                      f"the abandoned thread cannot crash the process)", RuntimeWarning, stacklevel=3)


def pinned() -> bool:
    return _pinned.is_set()
