"""Signals and device time: what a queue waits on and signals, and how device timestamps become ns.

Two kinds of signal behind one interface (`BaseSignal`: `value`, `timestamp`, `wait`):
- `Signal`: a 64-bit value and a 64-bit timestamp in memory that both the host and a device can write
  (CPU, NV, AMD). `compare_bits` says how many low bits of the value the device compares (64 on CPU/NV;
  AMD's command processor compares 32, so its driver keeps the values it waits for below 2**32).
- `ObjectSignal`: a value the host reads and writes through an API, with no memory word (Metal's
  MTLSharedEvent); a driver subclass implements `_read` and `_write`, and may implement `_event_wait`.

Every host wait goes through `wait_until`: spin briefly, then sleep with backoff. A signal's driver-event
hook (`event_wait` for a memory signal, `_event_wait` for an object signal) replaces the sleep: KFD's
WAIT_EVENTS or MTLSharedEvent's wait returns as soon as the device signals instead of at the next nap.

Timestamps are device ticks; `DeviceClock.ticks_to_ns` converts them (ns on CPU and NV, 10-ns ticks on AMD,
seconds per command buffer on Metal). A device declares its clock as `clock` (`device_clock` reads it;
devices without one count ns).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rawgrad.hcq.errors import DeviceTimeout
from rawgrad.hcq.memory import WORD_BYTES, ffi, u64_pointer

__all__ = ["NS_CLOCK", "SIGNAL_BYTES", "BaseSignal", "BlockingWait", "DeviceClock", "EventWait",
           "ObjectSignal", "Signal", "device_clock", "wait_until"]

# Layout of a memory signal: word 0 the value, word 1 the timestamp (device ticks).
VALUE_WORD = 0
TIMESTAMP_WORD = 1
SIGNAL_BYTES = 2 * WORD_BYTES
# Host waits first spin this long: a short kernel finishes within it and a sleep would only add latency.
SPIN_S = 50e-6
# Then they sleep, starting here and doubling up to the cap: the cap bounds both the wake-up latency of
# a long wait and the CPU an idle waiter costs (one wake-up per cap).
SLEEP_START_S = 20e-6
SLEEP_CAP_S = 1e-3
# Default timeout of a host wait; generous because a real workload can legitimately run for seconds.
DEFAULT_TIMEOUT_S = 30.0
# Bits of a signal value every device compares today (CPU, NV); AMD's CP compares 32 (AMD-METAL-FACTS §4).
FULL_COMPARE_BITS = 64

_names = itertools.count()

# A driver's event wait: `wait(value, seconds)` returns once the signal may have reached `value` or after
# `seconds` (it may return early; the loop checks the value again and sleeps on).
EventWait = Callable[[int, float], None]
# A driver's whole wait for a memory signal: `wait(address, value, seconds)` spins and blocks as the driver
# sees fit (the CPU device: a native spin, then a futex its SIGNAL record wakes) and returns True once the
# value at `address` is >= `value`, False after `seconds`. No Python spin or nap runs around it.
BlockingWait = Callable[[int, int, float], bool]
# A blocking wait is called in slices growing from the first to the cap, so `check()` (a driver's fault
# check) still runs now and then, and a value written by a party that does not wake the waiter (the host
# itself, another device) is seen within a slice.
BLOCKING_SLICE_START_S = 100e-6
BLOCKING_SLICE_CAP_S = 1e-3


@dataclass(frozen=True)
class DeviceClock:
    """How a device's timestamps count time, and what the profiler can ask of them.

    `ns_per_tick`: 1 for a ns counter (CPU CLOCK_MONOTONIC, NV globaltimer), 10 for AMD's 100 MHz counter,
    1e9 for Metal's seconds (doubles). `kernel_timestamps_in_replay`: whether a bound queue can timestamp
    each kernel; False (Metal: an indirect command buffer has no timestamp command, only its command
    buffer's start and end times) means only a bound queue's first and last timestamp commands are written,
    with the start and end of the whole replay, and the profiler reports a replay as one row.
    """

    unit: str
    ns_per_tick: int | float
    kernel_timestamps_in_replay: bool = True

    def ticks_to_ns(self, ticks: int | float) -> int:
        if isinstance(ticks, int) and isinstance(self.ns_per_tick, int):
            return ticks * self.ns_per_tick  # exact for integer counters
        return round(ticks * self.ns_per_tick)


NS_CLOCK = DeviceClock("ns", 1)


def device_clock(device: Any) -> DeviceClock:
    """The clock `device` declares (its `clock` attribute); a device without one counts ns."""
    clock = getattr(device, "clock", None)
    return clock if isinstance(clock, DeviceClock) else NS_CLOCK


class BaseSignal:
    """What queues and the host need of a signal: a value to wait on (`>=`) and set, and the device
    ticks of the last `timestamp` command on it. Subclasses say where the value lives."""

    owner: str
    name: str
    compare_bits: int = FULL_COMPARE_BITS

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r} of {self.owner}, value={self.value})"

    @property
    def value(self) -> int:
        raise NotImplementedError

    @value.setter
    def value(self, new: int) -> None:
        raise NotImplementedError

    @property
    def timestamp(self) -> int | float:
        """Device ticks written by the last `timestamp` command on this signal (see `DeviceClock`)."""
        raise NotImplementedError

    def _sleeper(self, value: int) -> Callable[[float], None]:
        """What the wait loop sleeps with while waiting for `value` (the driver's event wait, if any)."""
        return time.sleep

    def check_value(self, value: int) -> None:
        """Raise ValueError if the device could not compare `value` (it has more than `compare_bits`)."""
        if not 0 <= value < 1 << self.compare_bits:
            raise ValueError(f"signal {self.name!r} of {self.owner}: value {value} does not fit the "
                             f"{self.compare_bits} bits its device compares")

    def wait(self, value: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, queue: str = "host",
             check: Callable[[], None] | None = None) -> None:
        """Block until `self.value >= value` (through `wait_until`: spin briefly, then sleep or wait for the
        driver's event). `check` is called while sleeping (a device uses it to raise DeviceFault instead of
        waiting out the timeout when it has died). Raises DeviceTimeout after `timeout_s`, naming the
        owner, `queue`, this signal and the values."""
        if self.value >= value:
            return
        self.check_value(value)
        wait_until(lambda: self.value >= value, timeout_s,
                   lambda: DeviceTimeout(self.owner, queue, self.name, value, self.value, timeout_s), check,
                   self._sleeper(value))


class Signal(BaseSignal):
    """A 64-bit value plus a 64-bit timestamp at `address` (16 bytes, 8-byte aligned).

    With no address the signal owns host memory of its own; a device that needs signals in memory it
    can reach (a GPU) passes an address inside such memory and keeps that memory alive (`keepalive`).
    `value=None` leaves the memory as it is (a view of a word some device already maintains).
    `compare_bits`: the low bits of the value the device compares (32 on AMD). `event_wait`: the driver's
    event wait for this signal (see `EventWait`), used instead of sleeping. `blocking_wait`: the driver's
    whole wait (see `BlockingWait`), used instead of the spin-then-sleep loop.
    """

    def __init__(self, value: int | None = 0, *, address: int | None = None, owner: str = "host",
                 name: str | None = None, keepalive: object = None, compare_bits: int = FULL_COMPARE_BITS,
                 event_wait: EventWait | None = None, blocking_wait: BlockingWait | None = None) -> None:
        if not 0 < compare_bits <= FULL_COMPARE_BITS:
            raise ValueError(f"compare_bits must be in [1, {FULL_COMPARE_BITS}], got {compare_bits}")
        if address is None:
            # Owned storage; malloc alignment (16 bytes on our targets) exceeds the 8 the words need.
            self._storage: object = ffi.new("uint64_t[2]")
            address = int(ffi.cast("uintptr_t", self._storage))
        else:
            self._storage = keepalive
        self.address: int = address
        self.owner = owner
        self.name = name if name is not None else f"signal{next(_names)}"
        self.compare_bits = compare_bits
        self.event_wait = event_wait
        self.blocking_wait = blocking_wait
        self._words = u64_pointer(address)
        if value is not None:
            self.check_value(value)
            self._words[VALUE_WORD] = value
            self._words[TIMESTAMP_WORD] = 0

    def __repr__(self) -> str:
        return f"Signal({self.name!r} of {self.owner}, value={self.value}, address={self.address:#x})"

    @property
    def value(self) -> int:
        return int(self._words[VALUE_WORD])

    @value.setter
    def value(self, new: int) -> None:
        self._words[VALUE_WORD] = new

    @property
    def timestamp(self) -> int:
        """Device ticks written by the last `timestamp` command on this signal."""
        return int(self._words[TIMESTAMP_WORD])

    @property
    def timestamp_address(self) -> int:
        return self.address + TIMESTAMP_WORD * WORD_BYTES

    def _sleeper(self, value: int) -> Callable[[float], None]:
        event_wait = self.event_wait
        if event_wait is None:
            return time.sleep
        return lambda seconds: event_wait(value, seconds)

    def wait(self, value: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, queue: str = "host",
             check: Callable[[], None] | None = None) -> None:
        words = self._words
        if words[VALUE_WORD] >= value:  # the common case pays for no closure
            return
        self.check_value(value)
        if self.blocking_wait is not None:
            self._blocking(value, timeout_s, queue, check)
            return
        wait_until(lambda: words[VALUE_WORD] >= value, timeout_s,
                   lambda: DeviceTimeout(self.owner, queue, self.name, value, int(words[VALUE_WORD]),
                                         timeout_s), check, self._sleeper(value))


    def _blocking(self, value: int, timeout_s: float, queue: str, check: Callable[[], None] | None) -> None:
        wait = self.blocking_wait
        assert wait is not None
        deadline = time.perf_counter() + timeout_s
        piece = BLOCKING_SLICE_START_S
        while True:
            left = deadline - time.perf_counter()
            if wait(self.address, value, max(0.0, min(piece, left))):
                return
            if check is not None:
                check()
            if left <= piece:
                if self._words[VALUE_WORD] >= value:
                    return
                raise DeviceTimeout(self.owner, queue, self.name, value, int(self._words[VALUE_WORD]),
                                    timeout_s)
            piece = min(piece * 2, BLOCKING_SLICE_CAP_S)


class ObjectSignal(BaseSignal):
    """A signal whose value lives in a driver object reached through an API (Metal's MTLSharedEvent), not in
    memory a queue could write: a driver subclass implements `_read` and `_write`, and `_event_wait` when
    the API can block until a value (the default sleeps). Timestamps are whatever the driver records with
    `record_timestamp` (Metal: a command buffer's start or end time, in seconds).

    It has no `address`: a queue that encodes signals as memory words cannot use it (TypeError naming it).
    """

    def __init__(self, *, owner: str = "host", name: str | None = None, compare_bits: int = FULL_COMPARE_BITS
                 ) -> None:
        self.owner = owner
        self.name = name if name is not None else f"signal{next(_names)}"
        self.compare_bits = compare_bits
        self._timestamp: int | float = 0

    @property
    def address(self) -> int:
        raise TypeError(f"signal {self.name!r} of {self.owner} is an object signal: it has no memory word "
                        f"for a queue to wait on or write")

    @property
    def timestamp_address(self) -> int:
        return self.address

    @property
    def value(self) -> int:
        return self._read()

    @value.setter
    def value(self, new: int) -> None:
        self.check_value(new)
        self._write(new)

    @property
    def timestamp(self) -> int | float:
        return self._timestamp

    def record_timestamp(self, ticks: int | float) -> None:
        """Called by the driver when the device reports the time of a `timestamp` command on this signal."""
        self._timestamp = ticks

    def _sleeper(self, value: int) -> Callable[[float], None]:
        return lambda seconds: self._event_wait(value, seconds)

    # ------------------------------------------------------------------ driver hooks
    def _read(self) -> int:
        raise NotImplementedError

    def _write(self, value: int) -> None:
        raise NotImplementedError

    def _event_wait(self, value: int, seconds: float) -> None:
        """Block until the value may have reached `value`, at most `seconds` (default: sleep)."""
        time.sleep(seconds)


def wait_until(ready: Callable[[], bool], timeout_s: float, timed_out: Callable[[], DeviceTimeout],
               check: Callable[[], None] | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
    """The one host wait loop of the HCQ core and every driver: until `ready()`, spin for SPIN_S, then sleep
    from SLEEP_START_S doubling up to SLEEP_CAP_S, so an idle waiter does not burn a core.

    Hooks: `check()` runs before every sleep and may raise (a driver's fault check: DeviceFault instead of
    waiting out the timeout on a dead device); `sleep(seconds)` may be a driver's event wait (eventfd, futex,
    a driver notification) that returns early when the device signals. After `timeout_s` the loop raises
    `timed_out()`, a DeviceTimeout naming device, queue, what was waited for and how far it got.
    """
    if ready():
        return
    start = time.perf_counter()
    spin_end = start + SPIN_S
    while time.perf_counter() < spin_end:
        if ready():
            return
    deadline = start + timeout_s
    nap = SLEEP_START_S
    while not ready():
        if check is not None:
            check()
        now = time.perf_counter()
        if now >= deadline:
            raise timed_out()
        sleep(min(nap, deadline - now))
        nap = min(nap * 2, SLEEP_CAP_S)
