"""AMD GPUs (gfx1100 / RDNA3 first): driver pieces; under mock/ the CI stand-ins that need no hardware.

Importing this package registers the "AMD" kind. The factory opens the real KFD (`/dev/kfd`) unless AMD_MOCK=1
asks for the mock KFD + command-processor model explicitly; auto-detection (`Device.DEFAULT`) reports AMD only
when `/dev/kfd` exists, so the mock is never picked silently. The device module loads on first use.
"""
from __future__ import annotations

import os

from rawgrad import config
from rawgrad.hcq.device import Device, DeviceUnavailable, HCQDevice

KFD_NODE = "/dev/kfd"  # the amdkfd character device (AMD-METAL-FACTS 1.2)
# Above the CPU (0), below NV (10): a machine with an AMD GPU defaults to it.
AMD_PRIORITY = 5


def mock_requested() -> bool:
    """AMD_MOCK=1: the AMD device runs on the mock KFD and command-processor model."""
    return config.getenv_int("AMD_MOCK") != 0


def missing_driver() -> str | None:
    """Why AMD cannot open here before trying (no /dev/kfd and no AMD_MOCK=1), or None."""
    if mock_requested() or os.path.exists(KFD_NODE):
        return None
    return (f"{KFD_NODE} is missing: no amdgpu kernel driver (KFD) on this machine (no AMD GPU, or its "
            f"device nodes are not passed into this container)")


def _open(name: str) -> HCQDevice:
    why = missing_driver()
    if why is not None:
        raise DeviceUnavailable(name, why, hint="DEV=CPU runs on the CPU; AMD_MOCK=1 runs the mock AMD GPU")
    from rawgrad.drivers.amd.device import open_device
    return open_device(name, mock=mock_requested())


def _probe() -> bool:
    return os.path.exists(KFD_NODE)


Device.register("AMD", _open, probe=_probe, priority=AMD_PRIORITY)
