"""The HCQ core: the hardware-queue vocabulary every device driver implements."""
from rawgrad.hcq.allocator import Allocator, HCQBuffer
from rawgrad.hcq.device import Device, DeviceRegistry, HCQDevice
from rawgrad.hcq.errors import DeviceClosedError, DeviceFault, DeviceTimeout, HCQError, OutOfVirtualMemory
from rawgrad.hcq.program import Program
from rawgrad.hcq.queue import HWQueue, PatchPoint, sym_eval
from rawgrad.hcq.ring import Ring
from rawgrad.hcq.signal import NS_CLOCK, BaseSignal, DeviceClock, ObjectSignal, Signal
from rawgrad.hcq.va import VARangeAllocator

__all__ = ["NS_CLOCK", "Allocator", "BaseSignal", "Device", "DeviceClock", "DeviceClosedError", "DeviceFault",
           "DeviceRegistry", "DeviceTimeout", "HCQBuffer", "HCQDevice", "HCQError", "HWQueue", "ObjectSignal",
           "OutOfVirtualMemory", "PatchPoint", "Program", "Ring", "Signal", "VARangeAllocator", "sym_eval"]
