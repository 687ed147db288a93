"""Errors raised by the HCQ core and its drivers."""
from __future__ import annotations

__all__ = ["DeviceClosedError", "DeviceFault", "DeviceTimeout", "DeviceUnavailable", "HCQError",
           "OutOfVirtualMemory"]


class HCQError(Exception):
    """Base class of every error the HCQ layer raises on its own behalf."""


class DeviceTimeout(HCQError, TimeoutError):
    """A wait ran past its timeout; the message names who waited on what, and how far it got."""

    def __init__(self, device: str, queue: str, signal: str, expected: int, current: int,
                 timeout_s: float, detail: str = "") -> None:
        msg = (f"{device}: {queue} timed out after {timeout_s:g} s waiting for {signal} >= {expected} "
               f"(current value {current})")
        super().__init__(msg + (f"; {detail}" if detail else ""))
        self.device, self.queue, self.signal = device, queue, signal
        self.expected, self.current, self.timeout_s = expected, current, timeout_s


class DeviceFault(HCQError):
    """The device reported an error while running commands (bad record, bad launch, ...)."""


class DeviceClosedError(DeviceFault):
    """Memory or work of a device instance that was closed (`Device.close(name)`): its mappings are gone,
    so the data of tensors made on it before the close cannot be read or used."""

    def __init__(self, device: str) -> None:
        super().__init__(f"{device} was closed (Device.close({device!r})); tensors made on it before the "
                         f"close no longer have their data: make them again (a new {device} opens on next "
                         f"use)")
        self.device = device


DOCTOR_HINT = "`python -m rawgrad doctor` shows which devices work here and why the others do not"


class DeviceUnavailable(HCQError, OSError):
    """A device could not be opened on this machine (no driver node, no permission, a failed bring-up).
    One line: what is missing, what to do instead, and the doctor command."""

    def __init__(self, device: str, why: str, hint: str = "") -> None:
        tail = f"; {hint}" if hint else ""
        super().__init__(f"cannot open device {device}: {why}{tail}; {DOCTOR_HINT}")
        self.device, self.why = device, why


class OutOfVirtualMemory(HCQError, MemoryError):
    """A virtual-address range allocator has no free range that fits the request."""
