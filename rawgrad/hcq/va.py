"""A virtual-address range allocator: first fit over a sorted free list, with coalescing on free.

Drivers that manage their own GPU address space (NV through UVM) carve buffer addresses out of one big
reserved range with this; freed ranges go back to the free list and are reused, never only bumped.
"""
from __future__ import annotations

import bisect

from rawgrad.hcq.errors import OutOfVirtualMemory

__all__ = ["VARangeAllocator"]


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _align_up(x: int, alignment: int) -> int:
    return (x + alignment - 1) & ~(alignment - 1)


class VARangeAllocator:
    """Hands out aligned ranges of [base, base + size).

    The free list is kept sorted by start address with neighbours always merged, so a free range is
    never adjacent to another free range. `alloc` is first fit (lowest address that fits the size at
    the requested alignment); the unused head and tail of the chosen hole stay free.
    """

    def __init__(self, base: int, size: int, alignment: int = 1) -> None:
        if base < 0 or size <= 0:
            raise ValueError(f"VA range needs base >= 0 and size > 0, got base={base:#x} size={size:#x}")
        if not _is_pow2(alignment):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.base, self.size, self.alignment = base, size, alignment
        self._free_starts: list[int] = [base]
        self._free_sizes: list[int] = [size]
        self._allocated: dict[int, int] = {}

    @property
    def free_bytes(self) -> int:
        return sum(self._free_sizes)

    @property
    def allocated_bytes(self) -> int:
        return sum(self._allocated.values())

    def free_ranges(self) -> list[tuple[int, int]]:
        """The free list as (start, size) pairs, sorted by address."""
        return list(zip(self._free_starts, self._free_sizes))

    def alloc(self, size: int, alignment: int | None = None) -> int:
        """Reserve `size` bytes aligned to `alignment` (default: the allocator's); returns the start."""
        align = self.alignment if alignment is None else alignment
        if not _is_pow2(align):
            raise ValueError(f"alignment must be a power of two, got {align}")
        if size <= 0:
            raise ValueError(f"cannot allocate a range of {size} bytes")
        for i, (start, hole) in enumerate(zip(self._free_starts, self._free_sizes)):
            addr = _align_up(start, align)
            if addr + size > start + hole:
                continue
            head, tail = addr - start, start + hole - (addr + size)
            # Replace the hole by its unused head and tail (either may be empty).
            repl_starts = ([start] if head else []) + ([addr + size] if tail else [])
            repl_sizes = ([head] if head else []) + ([tail] if tail else [])
            self._free_starts[i:i + 1] = repl_starts
            self._free_sizes[i:i + 1] = repl_sizes
            self._allocated[addr] = size
            return addr
        largest = max(self._free_sizes, default=0)
        raise OutOfVirtualMemory(
            f"no free virtual range of {size:#x} bytes aligned to {align:#x} in "
            f"[{self.base:#x}, {self.base + self.size:#x}): {self.free_bytes:#x} bytes free, "
            f"largest hole {largest:#x}")

    def free(self, addr: int) -> None:
        """Return the range that `alloc` gave out at `addr`, merging it with free neighbours."""
        size = self._allocated.pop(addr, None)
        if size is None:
            raise ValueError(f"free of {addr:#x}: not the start of a range allocated here "
                             f"(never allocated, or already freed)")
        i = bisect.bisect_left(self._free_starts, addr)
        starts, sizes = self._free_starts, self._free_sizes
        merge_prev = i > 0 and starts[i - 1] + sizes[i - 1] == addr
        merge_next = i < len(starts) and addr + size == starts[i]
        if merge_prev and merge_next:
            sizes[i - 1] += size + sizes[i]
            del starts[i], sizes[i]
        elif merge_prev:
            sizes[i - 1] += size
        elif merge_next:
            starts[i] = addr
            sizes[i] += size
        else:
            starts.insert(i, addr)
            sizes.insert(i, size)

    def size_of(self, addr: int) -> int:
        """Size of the live range starting at `addr` (ValueError if there is none)."""
        try:
            return self._allocated[addr]
        except KeyError:
            raise ValueError(f"{addr:#x} is not the start of a live range") from None
