"""Buffer records of the NV driver (its address ranges come from rawgrad.hcq.va.VARangeAllocator)."""

from __future__ import annotations

from dataclasses import dataclass, field


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


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
