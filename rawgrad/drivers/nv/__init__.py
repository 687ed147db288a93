"""The NVIDIA driver: kernel-driver ioctls (no libcuda), HCQ queues, QMD launches, and a mock GPU for tests.

Importing this package registers the "NV" kind. The factory opens the real driver (`/dev/nvidiactl`) unless
NV_MOCK=1 asks for the mock kernel driver + mock GPU explicitly; auto-detection (`Device.DEFAULT`) reports NV
only when `/dev/nvidiactl` exists, so the mock is never picked silently. The heavy modules load on first use.
"""
from __future__ import annotations

import os

from rawgrad import config
from rawgrad.hcq.device import Device, DeviceUnavailable, HCQDevice

CTL_PATH = "/dev/nvidiactl"  # the RM control node (NV-FACTS 1.1)
# Above the CPU (0): a machine with an NVIDIA GPU defaults to it.
NV_PRIORITY = 10


def missing_driver() -> str | None:
    """Why NV cannot open here before trying (no driver node and no NV_MOCK=1), or None."""
    if config.NV_MOCK() or os.path.exists(CTL_PATH):
        return None
    return (f"{CTL_PATH} is missing: no NVIDIA kernel driver on this machine (no GPU, or its device nodes "
            f"are not passed into this container)")


def _open(name: str) -> HCQDevice:
    why = missing_driver()
    if why is not None:
        raise DeviceUnavailable(name, why, hint="DEV=CPU runs on the CPU; NV_MOCK=1 runs the mock GPU")
    from rawgrad.drivers.nv.hcq import open_device
    return open_device(name)


def _probe() -> bool:
    return os.path.exists(CTL_PATH)


Device.register("NV", _open, probe=_probe, priority=NV_PRIORITY)
