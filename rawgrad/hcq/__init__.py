"""The HCQ core: the hardware-queue vocabulary every device driver implements."""
from rawgrad.hcq.allocator import Allocator, HCQBuffer
from rawgrad.hcq.device import Device, DeviceRegistry, HCQDevice
from rawgrad.hcq.errors import DeviceClosedError, DeviceFault, DeviceTimeout, HCQError, OutOfVirtualMemory
from rawgrad.hcq.program import Program
from rawgrad.hcq.queue import HWQueue, PatchPoint, sym_eval
from rawgrad.hcq.signal import Signal
from rawgrad.hcq.va import VARangeAllocator

__all__ = ["Allocator", "Device", "DeviceClosedError", "DeviceFault", "DeviceRegistry", "DeviceTimeout",
           "HCQBuffer", "HCQDevice", "HCQError", "HWQueue", "OutOfVirtualMemory", "PatchPoint", "Program",
           "Signal", "VARangeAllocator", "sym_eval"]
