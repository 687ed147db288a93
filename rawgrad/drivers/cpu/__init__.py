"""The CPU driver: the host CPU as an HCQ device, driven by a native command processor.

Importing this package registers the "CPU" kind in the device registry (`Device["CPU"]`). The processor
(processor.py) is LLVM IR compiled once per process; worker threads run it and split each launch.

The device module (and with it the host compiler, the ELF loader and cffi) is imported when a CPU device is
first made or one of its classes is first named, not when rawgrad is imported (issue 21: `import rawgrad`
opens and probes nothing, and pays only for what it uses).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rawgrad.drivers.cpu.records import RECORD_BYTES, RECORD_WORDS, Op
from rawgrad.hcq.device import Device

if TYPE_CHECKING:
    from rawgrad.drivers.cpu.device import CPUAllocator, CPUDevice, CPUProgram, CPUQueue
    from rawgrad.hcq.device import HCQDevice

__all__ = ["CPUAllocator", "CPUDevice", "CPUProgram", "CPUQueue", "Op", "RECORD_BYTES", "RECORD_WORDS"]

# Lowest priority: the CPU is the fallback when no accelerator is found.
CPU_PRIORITY = 0
# The names this package re-exports from its device module, imported on first use (PEP 562).
_DEVICE_NAMES = ("CPUAllocator", "CPUDevice", "CPUProgram", "CPUQueue")


def __getattr__(name: str) -> Any:
    if name in _DEVICE_NAMES:
        from rawgrad.drivers.cpu import device
        return getattr(device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make_device(name: str) -> HCQDevice:
    from rawgrad.drivers.cpu.device import CPUDevice
    return CPUDevice(name)


Device.register("CPU", _make_device, priority=CPU_PRIORITY)
