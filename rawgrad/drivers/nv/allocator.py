"""`NVAllocator`: the NV device's buffers, in VRAM that the CPU does not map. Data moves through the
device's pinned staging buffer on the copy engine (`NVHCQDevice.copy_in` / `copy_out`), and a freed buffer
is released only once the timeline has passed the work queued before the free.

The device is `hcq.NVHCQDevice` (named here for types only: hcq.py imports this module).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from rawgrad.hcq.allocator import Allocator, HCQBuffer

if TYPE_CHECKING:
    from rawgrad.drivers.nv.hcq import NVHCQDevice

__all__ = ["NVAllocator"]


class NVAllocator(Allocator):
    """VRAM buffers (not CPU-mapped; the copy engine moves data through a pinned host staging buffer)."""

    def __init__(self, device: NVHCQDevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, nbytes: int) -> HCQBuffer:
        dev = self.device
        dev.reap()
        try:
            with dev.submit_lock:  # the driver's memory bookkeeping is not thread-safe: one caller at a time
                buf = dev.nv.alloc_vram(nbytes, cpu_map=False)
        except Exception as e:
            if "NO_MEMORY" not in str(e) and not isinstance(e, MemoryError):
                raise
            dev.synchronize()  # memory waiting for the GPU to finish with it may be enough
            if not dev.reap():
                raise MemoryError(str(e)) from e
            with dev.submit_lock:
                buf = dev.nv.alloc_vram(nbytes, cpu_map=False)
        return HCQBuffer(buf.va, nbytes, buf)

    def _free(self, buf: HCQBuffer) -> None:
        # Queued kernels may still use the memory: release it once the timeline has passed them.
        self.device.defer_free_after_timeline(buf.meta)

    def _copyin(self, buf: HCQBuffer, src: memoryview) -> None:
        self.device.copy_in(buf.va_addr, src)

    def _copyout(self, dst: memoryview, buf: HCQBuffer) -> None:
        self.device.copy_out(dst, buf.va_addr)
