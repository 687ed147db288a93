"""Signals: a 64-bit value and a 64-bit timestamp in memory that both the host and a device can write."""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from rawgrad.hcq.errors import DeviceTimeout
from rawgrad.hcq.memory import WORD_BYTES, ffi, u64_pointer

__all__ = ["SIGNAL_BYTES", "Signal", "wait_until"]

# Layout of a signal in memory: word 0 the value, word 1 the timestamp (device clock, nanoseconds).
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

_names = itertools.count()


class Signal:
    """A 64-bit value plus a 64-bit timestamp at `address` (16 bytes, 8-byte aligned).

    With no address the signal owns host memory of its own; a device that needs signals in memory it
    can reach (a GPU) passes an address inside such memory and keeps that memory alive (`keepalive`).
    `value=None` leaves the memory as it is (a view of a word some device already maintains).
    """

    def __init__(self, value: int | None = 0, *, address: int | None = None, owner: str = "host",
                 name: str | None = None, keepalive: object = None) -> None:
        if address is None:
            # Owned storage; malloc alignment (16 bytes on our targets) exceeds the 8 the words need.
            self._storage: object = ffi.new("uint64_t[2]")
            address = int(ffi.cast("uintptr_t", self._storage))
        else:
            self._storage = keepalive
        self.address: int = address
        self.owner = owner
        self.name = name if name is not None else f"signal{next(_names)}"
        self._words = u64_pointer(address)
        if value is not None:
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
        """The device clock (ns) written by the last `timestamp` command on this signal."""
        return int(self._words[TIMESTAMP_WORD])

    @property
    def timestamp_address(self) -> int:
        return self.address + TIMESTAMP_WORD * WORD_BYTES

    def wait(self, value: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, queue: str = "host",
             check: Callable[[], None] | None = None) -> None:
        """Block until `self.value >= value` (through `wait_until`: spin briefly, then sleep with backoff).

        `check` is called while sleeping (a device uses it to raise DeviceFault instead of waiting out
        the timeout when it has died). Raises DeviceTimeout after `timeout_s`, naming the owner, `queue`,
        this signal and the values. (A driver that can sleep on a device event calls `wait_until` with it.)
        """
        words = self._words
        if words[VALUE_WORD] >= value:  # the common case pays for no closure
            return
        wait_until(lambda: words[VALUE_WORD] >= value, timeout_s,
                   lambda: DeviceTimeout(self.owner, queue, self.name, value, int(words[VALUE_WORD]),
                                         timeout_s), check)


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
