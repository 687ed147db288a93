"""The device base and the process-wide device registry (`Device["CPU"]`, `Device.DEFAULT`)."""
from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rawgrad import config
from rawgrad.compiler.renderer import Renderer
from rawgrad.compiler.target import LaunchSpec, Target
from rawgrad.errors import ArgumentError
from rawgrad.hcq.allocator import Allocator
from rawgrad.hcq.errors import DeviceClosedError, DeviceUnavailable, HCQError
from rawgrad.hcq.program import KernelLaunch, Program
from rawgrad.hcq.queue import HWQueue, Value
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, NS_CLOCK, DeviceClock, Signal

__all__ = ["Device", "DeviceRegistry", "DeviceUnavailable", "HCQDevice"]

T = TypeVar("T")
A = TypeVar("A")

class HCQDevice:
    """One device: a timeline signal, an allocator, a compiler and queue/program factories.

`target` (compiler/target.py) describes its processor (the renderer's: what kernels for it may assume);
None for a device that cannot run kernels.

    `timeline_value` is the next value the timeline will be signalled with; every piece of work
    submitted on the timeline signals it, so `synchronize` waits for `timeline_value - 1`.

    Threads: reserving a timeline value and submitting the queue that signals it is one step under
    `submit_lock` (see `timeline_submit`). Each submission waits for the value before its own, so if two
    threads could interleave those steps, a queue waiting for a value that is only queued behind it would
    stall the device for good, and the timeline signal could be written out of order.
    """

    def __init__(self, name: str, allocator: Allocator, compiler: Any = None,
                 renderer: Renderer | None = None) -> None:
        self.name = name
        self.allocator = allocator
        self.compiler = compiler
        self.renderer = renderer
        self.target: Target | None = renderer.target if renderer is not None else None
        # Re-entrant: a driver's submit may run under a caller that already holds it (Program.__call__ ->
        # queue.submit), and a garbage-collector finalizer may run on a thread that holds it.
        self.submit_lock = threading.RLock()
        self.timeline_signal: Signal = self.new_signal(0, name=f"{name} timeline")
        self.timeline_value: int = 1
        self._timing: tuple[Signal, Signal] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    # True once close() ran: nothing of this instance may be touched any more (drivers set or override it)
    closed: bool = False
    # How its timestamps count time (hcq/signal.py DeviceClock): ns on the CPU and NV; AMD counts 10-ns ticks,
    # Metal has per-command-buffer seconds and no per-kernel timestamp inside a replay
    clock: DeviceClock = NS_CLOCK

    def check_open(self) -> None:
        """Raise DeviceClosedError if this instance was closed (before any access to its memory, which
        would be unmapped: reading it would crash the process, not raise)."""
        if self.closed:
            raise DeviceClosedError(self.name)

    def new_signal(self, value: int = 0, name: str | None = None) -> Signal:
        """A signal this device's queues can wait on and write (host memory by default)."""
        return Signal(value, owner=self.name, name=name)

    def timing_signals(self) -> tuple[Signal, Signal]:
        """A reusable pair of signals whose timestamp slots bracket a timed launch."""
        if self._timing is None:
            self._timing = (self.new_signal(name=f"{self.name} timing start"),
                            self.new_signal(name=f"{self.name} timing end"))
        return self._timing

    def next_timeline_value(self) -> int:
        """Reserve the next timeline value (the caller must signal it). With several threads, hold
        `submit_lock` from this call until the queue that signals the value is submitted."""
        with self.submit_lock:
            value = self.timeline_value
            self.timeline_value += 1
            return value

    def timeline_submit(self, work: Callable[[HWQueue], object] | None = None,
                        queue: HWQueue | None = None) -> tuple[int, HWQueue]:
        """Queue `wait(timeline, v - 1) -> work(q) -> signal(timeline, v)` on `queue` (default: a new compute
        queue) and submit it; returns (v, the queue). The one way work joins the timeline.

        All of it runs under `submit_lock`, and `v` is reserved only once the submit went through: a refused
        submit leaves no gap that a later `synchronize` would wait on forever."""
        with self.submit_lock:
            value = self.timeline_value
            q = (self.queue() if queue is None else queue).wait(self.timeline_signal, value - 1)
            if work is not None:
                work(q)
            q.signal(self.timeline_signal, value).submit(self)
            self.timeline_value = value + 1
        return value, q

    def timeline_replay(self, submit: Callable[[int, A], T], arg: A) -> T:
        """`timeline_submit` for a queue that encodes its own timeline wait and signal (a bound replay whose
        wait/signal values are patch points): `submit(v, arg)` must submit work that waits for `v - 1` and
        signals `v`; under `submit_lock`, `v` reserved once it returned. Returns what `submit` returned.
        (`arg` rather than a closure: this is TinyJit's replay path, where each call costs.)"""
        with self.submit_lock:
            value = self.timeline_value
            out = submit(value, arg)
            self.timeline_value = value + 1
        return out

    def queue(self) -> HWQueue:
        """A new, empty compute queue for this device."""
        raise NotImplementedError

    def program(self, name: str, lib: bytes, launch: LaunchSpec | None = None) -> Program:
        """Load kernel `name` from the compiled binary `lib`; `launch` is its launch contract (from the
        lowerer), which the driver may complete with what its compiler reported (registers)."""
        raise NotImplementedError

    def graph_copy(self, dst: Value, src: Value, nbytes: Value) -> KernelLaunch | None:
        """How a captured graph encodes a same-device copy on this device's compute queue: None (the
        default, the CPU's) to use the queue's own `copy` command, or a kernel launch for a device whose
        compute queue copies with a kernel (NV), so its entry point is relocated like any other program's
        and the graph can be saved."""
        return None

    def check_fault(self) -> None:
        """Raise DeviceFault if the device reported an error (called while waiting)."""

    def synchronize(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait until every piece of work submitted on the timeline has finished."""
        self.check_open()
        self.timeline_signal.wait(self.timeline_value - 1, timeout_s, queue="synchronize",
                                  check=self.check_fault)
        self.check_fault()

    def close(self) -> None:
        """Release the device's threads and memory; the device is unusable afterwards."""


Factory = Callable[[str], HCQDevice]
Probe = Callable[[], bool]


class DeviceRegistry:
    """Maps device names ("CPU", "NV:1") to lazily created, process-wide device instances."""

    def __init__(self) -> None:
        self._drivers: dict[str, tuple[Factory, Probe, int]] = {}
        self._instances: dict[str, HCQDevice] = {}
        self._canonical: dict[str, str] = {}  # names already checked (every buffer lookup canonicalizes)
        self._lock = threading.RLock()
        self._atexit_registered = False
        self.driver_errors: dict[str, BaseException] = {}

    def register(self, kind: str, factory: Factory, *, probe: Probe | None = None,
                 priority: int = 0) -> None:
        """Make `kind` available. `factory(full_name)` builds a device; `probe()` says whether this
        machine has one (for auto-detection, highest `priority` first)."""
        kind = kind.upper()
        if not kind.isalnum():
            raise ValueError(f"device kind must be alphanumeric, got {kind!r}")
        self._drivers[kind] = (factory, probe or (lambda: True), priority)

    def record_driver_error(self, kind: str, error: BaseException) -> None:
        """Remember why a driver could not load, to explain a later lookup of that kind."""
        self.driver_errors[kind.upper()] = error

    def _require_drivers(self) -> None:
        """Drivers register themselves when rawgrad.drivers is imported, and the package root
        (rawgrad/__init__.py) imports it, so every lookup finds them. hcq never imports a driver: the
        drivers import hcq, and a lower layer reaching up would make a cycle (tests/test_layering.py)."""
        if not self._drivers:
            raise RuntimeError("no device driver is registered: rawgrad.drivers was not imported (import "
                               "rawgrad, which imports it, before looking a device up)")

    @property
    def known(self) -> list[str]:
        """Registered device kinds."""
        self._require_drivers()
        return sorted(self._drivers)

    def canonicalize(self, name: str) -> str:
        """"cpu" -> "CPU", "nv:0" -> "NV", "nv:1" -> "NV:1"; ValueError for unknown kinds."""
        known = self._canonical.get(name) if isinstance(name, str) else None
        if known is not None:
            return known
        if not isinstance(name, str) or not name:
            raise ValueError(f"device name must be a non-empty string, got {name!r}")
        kind, _, index = name.strip().partition(":")
        kind = kind.upper()
        self._require_drivers()
        if kind not in self._drivers:
            why = self.driver_errors.get(kind)
            extra = f" (the {kind} driver failed to load: {why!r})" if why is not None else ""
            raise ArgumentError(f"unknown device {name!r}; known devices: {', '.join(self.known)}{extra}")
        if index and not index.isdigit():
            raise ValueError(f"device index in {name!r} must be a non-negative integer")
        full = kind if index in ("", "0") else f"{kind}:{int(index)}"
        self._canonical[name] = full
        return full

    def __getitem__(self, name: str) -> HCQDevice:
        full = self.canonicalize(name)
        dev = self._instances.get(full)
        if dev is None:
            with self._lock:
                dev = self._instances.get(full)
                if dev is None:
                    factory = self._drivers[full.partition(":")[0]][0]
                    try:
                        dev = self._instances[full] = factory(full)
                    except OSError as e:  # a driver node, a permission, an ioctl: say so and name the fix
                        if isinstance(e, HCQError):  # already says what happened (this class, a timeout)
                            raise
                        raise DeviceUnavailable(full, f"{type(e).__name__}: {e}") from e
                    if not self._atexit_registered:
                        # atexit runs last-registered first: this drains and stops every device before
                        # weakref finalizers unmap kernel code and buffers that queued work may still use
                        atexit.register(self.close_all)
                        self._atexit_registered = True
        return dev

    @property
    def DEFAULT(self) -> str:  # noqa: N802 - the public name the design uses
        """`DEV` from the environment, else the highest-priority kind whose probe succeeds."""
        env = config.DEV()
        if env:
            return self.canonicalize(env)
        self._require_drivers()
        for kind, (_, probe, _) in sorted(self._drivers.items(), key=lambda kv: -kv[1][2]):
            try:
                if probe():
                    return kind
            except Exception:  # a broken driver must not stop auto-detection of the others
                continue
        raise RuntimeError(f"no usable device found among {self.known}")

    def opened(self) -> list[str]:
        """Names of devices created so far."""
        return sorted(self._instances)

    def close(self, name: str) -> None:
        """Close one device instance and forget it (a later lookup creates a fresh one)."""
        dev = self._instances.pop(self.canonicalize(name), None)
        if dev is not None:
            dev.close()

    def close_all(self) -> None:
        for name in list(self._instances):
            self._instances.pop(name).close()


Device = DeviceRegistry()
