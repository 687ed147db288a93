"""Programs: a compiled kernel on a device, launchable as `wait -> exec -> signal` on the timeline."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rawgrad.hcq.allocator import HCQBuffer
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    from rawgrad.hcq.device import HCQDevice

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
        with dev.submit_lock:  # reserve the value and queue the work that signals it as one step
            value = dev.timeline_value
            q = dev.queue().wait(dev.timeline_signal, value - 1)
            if not wait:
                q.exec(self, (*bufs, *vals), global_size, local_size)
                q.signal(dev.timeline_signal, value).submit(dev)
                dev.timeline_value = value + 1
                return None
            # A timed launch keeps the lock until it has read the device's one pair of timing signals, so
            # another thread's timed launch cannot overwrite them first (a debugging path: it waits anyway).
            start, end = dev.timing_signals()
            q.timestamp(start).exec(self, (*bufs, *vals), global_size, local_size).timestamp(end)
            q.signal(dev.timeline_signal, value).submit(dev)
            dev.timeline_value = value + 1
            dev.timeline_signal.wait(value, timeout_s, queue=q.name, check=dev.check_fault)
            return (end.timestamp - start.timestamp) / NS_PER_S
