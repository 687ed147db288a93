"""GPU virtual-address range allocation and buffer records."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


class VARangeAllocator:
    """First-fit range allocator over [base, base+size) with coalescing frees (freed ranges are reused)."""

    def __init__(self, base: int, size: int):
        if size <= 0:
            raise ValueError(f"VA window size {size:#x} must be positive")
        self.base, self.size = base, size
        self._free_starts: list[int] = [base]  # sorted starts of free extents
        self._free_len: dict[int, int] = {base: size}
        self._used: dict[int, int] = {}

    def alloc(self, size: int, align: int = 0x1000) -> int:
        """Lowest address of a free, ``align``-aligned range of ``size`` bytes."""
        if size <= 0 or align <= 0 or align & (align - 1):
            raise ValueError(f"bad VA request size={size:#x} align={align:#x}")
        for start in self._free_starts:
            length = self._free_len[start]
            va = round_up(start, align)
            if va + size <= start + length:
                self._take(start, length, va, size)
                return va
        raise MemoryError(
            f"GPU VA window {self.base:#x}+{self.size:#x} has no free {size:#x}-byte range "
            f"aligned to {align:#x} ({len(self._used)} ranges in use)"
        )

    def _take(self, start: int, length: int, va: int, size: int) -> None:
        i = bisect.bisect_left(self._free_starts, start)
        del self._free_starts[i]
        del self._free_len[start]
        if va > start:
            self._insert_free(start, va - start)
        end, free_end = va + size, start + length
        if free_end > end:
            self._insert_free(end, free_end - end)
        self._used[va] = size

    def _insert_free(self, start: int, length: int) -> None:
        bisect.insort(self._free_starts, start)
        self._free_len[start] = length

    def free(self, va: int) -> None:
        """Return the range that starts at ``va``; neighbours merge."""
        size = self._used.pop(va, None)
        if size is None:
            raise ValueError(f"VA {va:#x} is not the start of an allocated range")
        i = bisect.bisect_left(self._free_starts, va)
        start, length = va, size
        if i < len(self._free_starts) and self._free_starts[i] == va + size:  # merge right
            nxt = self._free_starts.pop(i)
            length += self._free_len.pop(nxt)
        if i > 0:  # merge left
            prev = self._free_starts[i - 1]
            if prev + self._free_len[prev] == va:
                self._free_starts.pop(i - 1)
                start, length = prev, self._free_len.pop(prev) + length
        self._insert_free(start, length)

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    @property
    def live_ranges(self) -> dict[int, int]:
        return dict(self._used)


class MemoryKind:
    VRAM = "vram"  # NV01_MEMORY_LOCAL_USER
    SYSMEM = "sysmem"  # NV01_MEMORY_SYSTEM (RM-allocated host memory)
    HOST = "host"  # NV01_MEMORY_SYSTEM_OS_DESCRIPTOR (our own anonymous pages)


@dataclass
class NVBuffer:
    """A device allocation: RM handle, GPU VA (== CPU VA when CPU-mapped), size."""

    kind: str
    handle: int
    va: int
    size: int
    cpu_mapped: bool
    uvm_mapped: bool = False
    map_cookie: int | None = None
    meta: dict = field(default_factory=dict)

    @property
    def cpu_addr(self) -> int:
        if not self.cpu_mapped:
            raise ValueError(f"{self.kind} buffer at {self.va:#x} has no CPU mapping")
        return self.va
