"""Mock NVIDIA kernel driver + GPU front end for tests (implements rawgrad.drivers.osapi.OSInterface)."""

from rawgrad.drivers.nv.mock.gpu import MockGPUFault, MockLaunch, MockUnsupported
from rawgrad.drivers.nv.mock.kernel import AMPERE, H100, GPUProfile, MockNV, MockUsageError

__all__ = [
    "AMPERE",
    "H100",
    "GPUProfile",
    "MockGPUFault",
    "MockLaunch",
    "MockNV",
    "MockUnsupported",
    "MockUsageError",
]
