"""PROFILE=1: device timestamps around every kernel, exported as a Chrome trace (and a PNG timeline).

Times come from the device, never from the host: each profiled kernel is bracketed in its own queue by two
`timestamp` commands, each writing the device clock (ticks: ns on the CPU and NV, 10 ns on AMD, seconds on
Metal; converted with the device's `DeviceClock.ticks_to_ns`) into the timestamp slot of a Signal. The host
reads those slots only once the device's timeline has passed the work, so profiling never makes an eager
launch synchronous.

- Eager launches (`launch`) take a start/end signal pair from a small per-device pool; a pair goes back to
  the pool once read, so launches still in flight never share a pair.
- Graph replays (hcq/graph.py) own one pair per kernel, encoded into the bound queue when the graph is
  built with PROFILE=1; a replay's pairs are read before the next replay of that graph overwrites them.
  A device whose clock says `kernel_timestamps_in_replay=False` (Metal: an indirect command buffer cannot
  timestamp each kernel) writes only the replay's first and last timestamps (its command buffer's start and
  end), and each replay is reported as one row naming its kernels.

Pending work is read lazily: on later profiled launches (without waiting), and at `events()` / export
(waiting). With PROFILE=1 the trace is written at exit to PROFILE_OUT (default ./rawgrad_profile.json).
"""
from __future__ import annotations

import atexit
import itertools
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rawgrad import config
from rawgrad.hcq.allocator import HCQBuffer
from rawgrad.hcq.program import NS_PER_S
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, Signal, device_clock

if TYPE_CHECKING:
    from rawgrad.hcq.device import HCQDevice
    from rawgrad.hcq.program import Program
    from rawgrad.hcq.queue import KernelArg

__all__ = ["EAGER", "PROFILER", "REPLAY", "ProfileEvent", "Profiler", "export_chrome_trace", "export_png",
           "launch"]

EAGER = "eager"
REPLAY = "replay"
# Signal pairs per device for eager launches: enough that a normal stream of async launches never waits
# for a free pair (the pool refills as the device retires work), small enough to cost nothing.
POOL_PAIRS = 64
# The trace's clock is nanoseconds; Chrome trace events count microseconds.
NS_PER_US = 1000.0

# (HCQDevice.new_signal and the queue vocabulary are typed with the memory Signal; an object-signal device's
# pairs are its ObjectSignals, read only through `timestamp`.)
Pair = tuple[Signal, Signal]


@dataclass(frozen=True)
class ProfileEvent:
    """One kernel as the device ran it; `batch` numbers the launch or replay it belongs to. On a device
    without per-kernel timestamps in a replay, one event covers a whole replay and `kernels` names what
    ran in it (empty for a single kernel's event)."""

    device: str
    name: str
    start_ns: int
    end_ns: int
    kind: str  # EAGER or REPLAY
    queue: str
    batch: int
    kernels: tuple[str, ...] = ()

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class _Pending:
    """Submitted work whose timestamps can be read once the timeline reaches `value`."""

    device: HCQDevice
    value: int
    names: Sequence[str]
    pairs: Sequence[Pair]
    kind: str
    queue: str
    batch: int
    owner: object | None  # the graph owning the pairs; None: pool pairs, returned once read


class Profiler:
    """The process-wide record of profiled kernels (`PROFILER`)."""

    def __init__(self) -> None:
        # Re-entrant: `pair` collects, and `flush` is called from `events` and `reset`.
        self._lock = threading.RLock()
        self._batches = itertools.count()
        self._events: list[ProfileEvent] = []
        self._pending: list[_Pending] = []
        self._free: dict[HCQDevice, list[Pair]] = {}
        self._allocated: dict[HCQDevice, int] = {}
        self._exit_hook = False

    def reset(self) -> None:
        """Forget every event and pool. Work still in flight is waited for first: its queues write into
        signals this profiler owns."""
        with self._lock:
            self.flush()
            self._events, self._pending, self._free, self._allocated = [], [], {}, {}

    # ------------------------------------------------------------------ recording
    def pair(self, device: HCQDevice) -> Pair:
        """A start/end signal pair no queued work of `device` still writes."""
        with self._lock:
            free = self._free.setdefault(device, [])
            if not free:
                self.collect()
            if not free and self._allocated.get(device, 0) < POOL_PAIRS:
                return self._new_pair(device)
            while not free:
                # Pool exhausted: the oldest launch holding a pair retires first, so wait for that one.
                oldest = next((p for p in self._pending if p.device is device and p.owner is None), None)
                if oldest is None:  # pairs went with records dropped by `flush`: replace them
                    return self._new_pair(device)
                self._wait(oldest)
                self.collect()
            return free.pop()

    def _new_pair(self, device: HCQDevice) -> Pair:
        n = self._allocated[device] = self._allocated.get(device, 0) + 1
        return (device.new_signal(name=f"{device.name} profile start {n}"),
                device.new_signal(name=f"{device.name} profile end {n}"))

    def give_back(self, device: HCQDevice, pair: Pair) -> None:
        """Return an unused pair (its launch failed before anything was queued)."""
        with self._lock:
            self._free.setdefault(device, []).append(pair)

    def add(self, device: HCQDevice, value: int, names: Sequence[str], pairs: Sequence[Pair], kind: str,
            queue: str, owner: object | None = None) -> None:
        """Record submitted work: kernel `names[i]` is bracketed by `pairs[i]`, all done at timeline
        `value`."""
        with self._lock:
            self._pending.append(_Pending(device, value, list(names), list(pairs), kind, queue,
                                          next(self._batches), owner))
            if not self._exit_hook:
                # Registered after the device registry's close_all (a device exists by now), so at exit
                # atexit runs this first, while the devices can still finish their work.
                atexit.register(_export_at_exit)
                self._exit_hook = True

    def settle(self, owner: object) -> None:
        """Wait for and read the work recorded with `owner` (a graph about to overwrite its pairs)."""
        with self._lock:
            mine = [p for p in self._pending if p.owner is owner]
            for p in mine:
                self._wait(p)
            if mine:
                self.collect()

    # ------------------------------------------------------------------ reading
    def collect(self) -> None:
        """Read every pending batch the device has finished; never waits."""
        with self._lock:
            keep: list[_Pending] = []
            for p in self._pending:
                if getattr(p.device, "closed", False):
                    continue  # its work was drained or abandoned at close; nothing reliable to read
                if p.device.timeline_signal.value < p.value:
                    keep.append(p)
                    continue
                self._events.extend(_events_of(p))
                if p.owner is None:
                    self._free.setdefault(p.device, []).extend(p.pairs)
            self._pending = keep

    def flush(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Wait for all recorded work, then read it."""
        with self._lock:
            for p in list(self._pending):
                try:
                    self._wait(p, timeout_s)
                except Exception:
                    # A device that died or hung: drop its records rather than fail the export.
                    self._pending.remove(p)
            self.collect()

    def events(self) -> list[ProfileEvent]:
        """Every profiled kernel so far (waits for work in flight), in start order per batch."""
        with self._lock:
            self.flush()
            return list(self._events)

    @staticmethod
    def _wait(p: _Pending, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        p.device.timeline_signal.wait(p.value, timeout_s, queue="profile", check=p.device.check_fault)

    # ------------------------------------------------------------------ export
    def chrome_trace(self) -> dict[str, Any]:
        """The events as a Chrome trace-event object (loads in Perfetto and chrome://tracing)."""
        events = sorted(self.events(), key=lambda e: (e.start_ns, e.batch))
        origin = min((e.start_ns for e in events), default=0)
        pids: dict[str, int] = {}
        tids: dict[tuple[str, str, str], int] = {}
        trace: list[dict[str, Any]] = []
        for e in events:
            pid = pids.setdefault(e.device, len(pids) + 1)
            tid = tids.setdefault((e.device, e.kind, e.queue), len(tids) + 1)
            trace.append({"name": e.name, "cat": e.kind, "ph": "X", "pid": pid, "tid": tid,
                          "ts": (e.start_ns - origin) / NS_PER_US, "dur": e.duration_ns / NS_PER_US,
                          "args": {"kernel": e.name, "kind": e.kind, "queue": e.queue, "batch": e.batch,
                                   "start_ns": e.start_ns, "end_ns": e.end_ns,
                                   **({"kernels": list(e.kernels)} if e.kernels else {})}})
        # Metadata rows name the tracks: one process per device, one thread per queue (eager or a graph).
        for dev, pid in pids.items():
            trace.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": dev}})
        for (dev, kind, queue), tid in tids.items():
            label = kind if kind == EAGER else f"{kind} {queue}"
            trace.append({"name": "thread_name", "ph": "M", "pid": pids[dev], "tid": tid,
                          "args": {"name": label}})
        # Each device has its own clock: one origin shifts them all, so compare times within a device.
        return {"traceEvents": trace, "displayTimeUnit": "ns",
                "otherData": {"source": "rawgrad PROFILE=1", "origin_ns": origin,
                              "clock": "device timestamps converted to ns (CLOCK_MONOTONIC on CPU)"}}

    def export_chrome_trace(self, path: str) -> str:
        """Write the Chrome trace JSON to `path`; returns the path."""
        trace = self.chrome_trace()
        with open(path, "w") as f:
            json.dump(trace, f, indent=1)
        return path

    def export_png(self, path: str) -> str:
        """Draw the events as a timeline (one row per device queue) into `path`; needs matplotlib."""
        try:
            import matplotlib
            matplotlib.use("Agg")  # no display needed: this only writes a file
            import matplotlib.pyplot as plt
        except ImportError as err:
            raise ImportError("export_png needs matplotlib (pip install matplotlib); the Chrome trace "
                              "(export_chrome_trace) needs nothing extra") from err
        events = self.events()
        origin = min((e.start_ns for e in events), default=0)
        rows: dict[tuple[str, str, str], int] = {}
        for e in sorted(events, key=lambda e: (e.device, e.kind, e.queue)):
            rows.setdefault((e.device, e.kind, e.queue), len(rows))
        colors: dict[str, Any] = {}
        cmap = plt.get_cmap("tab20")
        fig, ax = plt.subplots(figsize=(12, 1.5 + 0.6 * max(len(rows), 1)))
        for e in events:
            color = colors.setdefault(e.name, cmap(len(colors) % 20))
            ax.broken_barh([((e.start_ns - origin) / 1e6, max(e.duration_ns, 1) / 1e6)],
                           (rows[(e.device, e.kind, e.queue)] - 0.4, 0.8), facecolors=color)
        ax.set_yticks(range(len(rows)), [f"{d} {k}" if k == EAGER else f"{d} {k} {q}" for d, k, q in rows])
        ax.set_xlabel("ms (device clock)")
        ax.set_title(f"rawgrad profile: {len(events)} kernels")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path


PROFILER = Profiler()


def export_chrome_trace(path: str) -> str:
    """Write the process-wide profile as Chrome trace-event JSON."""
    return PROFILER.export_chrome_trace(path)


def export_png(path: str) -> str:
    """Draw the process-wide profile as a PNG timeline (ImportError without matplotlib)."""
    return PROFILER.export_png(path)


def launch(program: Program, bufs: Sequence[HCQBuffer], global_size: tuple[int, int, int],
           local_size: tuple[int, int, int] = (1, 1, 1), vals: tuple[int, ...] = (), wait: bool = False,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> float | None:
    """`Program.__call__` with the exec bracketed by timestamps into a pooled pair, recorded as an eager
    event; with `wait`, block and return the kernel's seconds (as Program does)."""
    dev = program.device
    PROFILER.collect()  # cheap, and keeps the pending list short during long eager runs
    start, end = PROFILER.pair(dev)  # the pair is this launch's alone until the profiler reads it
    try:
        # Reserving the value and queueing the work that signals it are one step (timeline_submit). The
        # profiler's calls stay outside the device's lock: under its own lock it waits for device work and
        # allocates signals, so it must never be taken while a device's lock is held.
        args: tuple[KernelArg, ...] = (*bufs, *vals)
        value, q = dev.timeline_submit(
            lambda q: q.timestamp(start).exec(program, args, global_size, local_size).timestamp(end))
    except BaseException:
        PROFILER.give_back(dev, (start, end))
        raise
    PROFILER.add(dev, value, [program.name], [(start, end)], EAGER, EAGER)
    if not wait:
        return None
    dev.timeline_signal.wait(value, timeout_s, queue=q.name, check=dev.check_fault)
    # The pair stays this launch's until the profiler reads it, so its slots still hold these times.
    clock = device_clock(dev)
    return (clock.ticks_to_ns(end.timestamp) - clock.ticks_to_ns(start.timestamp)) / NS_PER_S


def _events_of(p: _Pending) -> list[ProfileEvent]:
    """The events of finished work `p`, its device's ticks converted to ns: one per kernel, or one for the
    whole replay when the device cannot timestamp kernels inside one (its first start and last end stamps
    are the replay's)."""
    clock = device_clock(p.device)
    ns = clock.ticks_to_ns
    dev = p.device.name
    if p.kind == REPLAY and not clock.kernel_timestamps_in_replay and p.pairs:
        return [ProfileEvent(dev, f"replay of {len(p.names)} kernels", ns(p.pairs[0][0].timestamp),
                             ns(p.pairs[-1][1].timestamp), p.kind, p.queue, p.batch, tuple(p.names))]
    return [ProfileEvent(dev, name, ns(start.timestamp), ns(end.timestamp), p.kind, p.queue, p.batch)
            for name, (start, end) in zip(p.names, p.pairs, strict=True)]


def _export_at_exit() -> None:
    if not config.PROFILE():
        return
    with PROFILER._lock:
        if not PROFILER._pending and not PROFILER._events:
            return
    path = PROFILER.export_chrome_trace(config.PROFILE_OUT())
    print(f"rawgrad: profile written to {os.path.abspath(path)} (open in https://ui.perfetto.dev)")
    try:
        png = PROFILER.export_png(os.path.splitext(path)[0] + ".png")
    except ImportError:
        return
    print(f"rawgrad: profile timeline drawn to {os.path.abspath(png)}")
