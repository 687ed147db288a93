"""Programs: a compiled kernel on a device, launchable as `wait -> exec -> signal` on the timeline."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rawgrad.hcq.allocator import HCQBuffer
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from rawgrad.hcq.device import HCQDevice
    from rawgrad.hcq.queue import KernelArg

__all__ = ["Program"]

# Device timestamps are in nanoseconds.
NS_PER_S = 1e9


class Program:
    """A kernel `name` from the compiled binary `lib`, loaded on `device` by the driver subclass."""

    def __init__(self, device: HCQDevice, name: str, lib: bytes) -> None:
        self.device, self.name, self.lib = device, name, lib

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r} on {self.device.name})"

    def __call__(self, *bufs: HCQBuffer, global_size: tuple[int, int, int] = (1, 1, 1),
                 local_size: tuple[int, int, int] = (1, 1, 1), vals: tuple[int, ...] = (),
                 wait: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> float | None:
        """Launch once on the device timeline; with `wait`, block and return the kernel's seconds."""
        dev = self.device
        args: tuple[KernelArg, ...] = (*bufs, *vals)
        if not wait:
            dev.timeline_submit(lambda q: q.exec(self, args, global_size, local_size))
            return None
        # A timed launch keeps the (re-entrant) lock until it has read the device's one pair of timing
        # signals, so another thread's timed launch cannot overwrite them first (a debugging path: it waits).
        with dev.submit_lock:
            start, end = dev.timing_signals()
            value, q = dev.timeline_submit(
                lambda q: q.timestamp(start).exec(self, args, global_size, local_size).timestamp(end))
            dev.timeline_signal.wait(value, timeout_s, queue=q.name, check=dev.check_fault)
            return (end.timestamp - start.timestamp) / NS_PER_S
