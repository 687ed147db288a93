"""Apple Metal through cffi and the Objective-C runtime (issue #20): no PyObjC, no Swift helper.

Importing this package registers the "METAL" kind. The factory opens Metal.framework through the bridge
(objc.py) on an arm64 Mac, or the mock runtime with its host-run GPU when METAL_MOCK=1 asks explicitly
(never as a fallback); auto-detection reports METAL only on macOS. The device module loads on first use.
See docs/metal.md for what the Linux mock proves and what only a Mac can.
"""
from __future__ import annotations

import platform

from rawgrad import config
from rawgrad.hcq.device import Device, DeviceUnavailable, HCQDevice

# Below NV (10) and AMD (5), above the CPU (0): a Mac's GPU is its default device.
METAL_PRIORITY = 3


def mock_requested() -> bool:
    """METAL_MOCK=1: the Metal device runs on the mock Objective-C runtime and host-run GPU."""
    return config.getenv_int("METAL_MOCK") != 0


def missing_driver() -> str | None:
    """Why Metal cannot open here before trying, or None."""
    if mock_requested():
        return None
    if platform.system() != "Darwin":
        return f"Metal needs macOS; this is {platform.system()}"
    if platform.machine() != "arm64":
        return f"Metal on {platform.machine()} Macs is out of scope (rawgrad supports Apple silicon)"
    return None


def _open(name: str) -> HCQDevice:
    why = missing_driver()
    if why is not None:
        raise DeviceUnavailable(name, why,
                                hint="DEV=CPU runs on the CPU; METAL_MOCK=1 runs the mock Apple GPU")
    from rawgrad.drivers.metal.device import open_device
    return open_device(name, mock=mock_requested())


def _probe() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


Device.register("METAL", _open, probe=_probe, priority=METAL_PRIORITY)
