"""The CPU driver: the host CPU as an HCQ device, driven by a native command processor.

Importing this package registers the "CPU" kind in the device registry (`Device["CPU"]`). The processor
(processor.py) is LLVM IR compiled once per process; worker threads run it and split each launch.
"""
from rawgrad.drivers.cpu.device import CPUAllocator, CPUDevice, CPUProgram, CPUQueue
from rawgrad.drivers.cpu.records import RECORD_BYTES, RECORD_WORDS, Op
from rawgrad.hcq.device import Device

__all__ = ["CPUAllocator", "CPUDevice", "CPUProgram", "CPUQueue", "Op", "RECORD_BYTES", "RECORD_WORDS"]

# Lowest priority: the CPU is the fallback when no accelerator is found.
CPU_PRIORITY = 0

Device.register("CPU", CPUDevice, priority=CPU_PRIORITY)
