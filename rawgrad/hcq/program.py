"""Programs: a compiled kernel on a device, launchable as `wait -> exec -> signal` on the timeline.

A program may carry its launch contract (`launch`, a `compiler.target.LaunchSpec`: 3-D global and local
sizes, shared memory, registers, argument layout); a launch that names no local size runs in the contract's
blocks, and one that names no global size covers the contract's global size for the scalars it passes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rawgrad.compiler.target import LaunchSpec
from rawgrad.hcq.allocator import HCQBuffer
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, device_clock

if TYPE_CHECKING:
    from rawgrad.hcq.device import HCQDevice
    from rawgrad.hcq.queue import KernelArg, Value

__all__ = ["KernelLaunch", "Program"]

# Device timestamps are in nanoseconds.
NS_PER_S = 1e9
# A launch with neither sizes given nor a contract: one thread.
ONE = (1, 1, 1)


class Program:
    """A kernel `name` from the compiled binary `lib`, loaded on `device` by the driver subclass."""

    def __init__(self, device: HCQDevice, name: str, lib: bytes, launch: LaunchSpec | None = None) -> None:
        self.device, self.name, self.lib = device, name, lib
        self.launch = launch

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r} on {self.device.name})"

    def global_size_for(self, vals: Sequence[int]) -> tuple[int, int, int]:
        """The contract's global size for these scalar arguments ((1, 1, 1) for a program without one)."""
        return self.launch.global_for_scalars(vals) if self.launch is not None else ONE

    def __call__(self, *bufs: HCQBuffer, global_size: tuple[int, int, int] | None = None,
                 local_size: tuple[int, int, int] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> float | None:
        """Launch once on the device timeline (sizes default to the launch contract's); with `wait`, block
        and return the kernel's seconds."""
        dev = self.device
        args: tuple[KernelArg, ...] = (*bufs, *vals)
        gsize = self.global_size_for(vals) if global_size is None else global_size
        if not wait:
            dev.timeline_submit(lambda q: q.exec(self, args, gsize, local_size))
            return None
        # A timed launch keeps the (re-entrant) lock until it has read the device's one pair of timing
        # signals, so another thread's timed launch cannot overwrite them first (a debugging path: it waits).
        with dev.submit_lock:
            start, end = dev.timing_signals()
            value, q = dev.timeline_submit(
                lambda q: q.timestamp(start).exec(self, args, gsize, local_size).timestamp(end))
            dev.timeline_signal.wait(value, timeout_s, queue=q.name, check=dev.check_fault)
            return device_clock(dev).ticks_to_ns(end.timestamp - start.timestamp) / NS_PER_S


@dataclass(frozen=True)
class KernelLaunch:
    """One launch as a device asks a graph to encode it (`HCQDevice.graph_copy`): the program, its argument
    words (buffer addresses, then scalars; ints or symbolic), and its 3-D sizes."""

    program: Program
    args: tuple[Value, ...]
    global_size: tuple[Value, Value, Value]
    local_size: tuple[int, int, int]
