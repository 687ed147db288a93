"""Command rings: the one reserve/commit/retire mechanism every driver's submission ring uses.

A ring is `capacity` units of memory that the host fills and a device consumes in order. The host tracks
a monotonic write position (units ever written, padding included); the device's progress is a monotonic
retired position read through a pluggable `RetireSource`. Space is free when it is behind the retired
position, so the ring never overwrites work the device has not consumed (`limit` is the capacity, or one
less for a ring whose read index wraps):

    free = limit - (write - retired)

`Ring.reserve(n)` returns the slot where `n` contiguous units may be written, waiting (through the one
host wait loop, `hcq.signal.wait_until`) until the device has retired enough; a span that would straddle
the end is preceded by padding to the end (the driver's `pad`, e.g. NOP records or packets, or nothing
when the device never reads the skipped bytes). `commit(n)` publishes the written units. Waiting past the
ring's timeout raises `DeviceTimeout` naming the ring, the queue and how much room was free.

Units differ per ring (CPU records, NV GPFIFO entries and pushbuffer bytes, AMD PM4 dwords and SDMA
bytes), and so does where the device reports progress:

- `CounterRetire`: a monotonic counter in ring units (the CPU processor's read index; AMD's 64-bit CP and
  SDMA read pointers).
- `WrappedIndexRetire`: an index modulo the ring size that the device advances (NV's GPGet in USERD); one
  slot stays empty so a full ring is told from an empty one.
- `FenceRetire`: a counter the device writes after each submission (NV's per-channel retirement release);
  the ring records where each fence value ends and retires up to the newest fence reached.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rawgrad.hcq.errors import DeviceTimeout
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, wait_until

__all__ = ["BYTES", "DWORDS", "QWORDS", "CounterRetire", "FenceRetire", "RetireSource", "Ring", "RingUnit",
           "WrappedIndexRetire"]


@dataclass(frozen=True)
class RingUnit:
    """What a ring position counts: its name (for messages) and its size in bytes (for addresses)."""

    name: str
    nbytes: int


# Units shared by several rings (a driver defines its own for records of another size).
BYTES = RingUnit("byte", 1)  # NV pushbuffer, AMD SDMA ring pointers
DWORDS = RingUnit("dword", 4)  # AMD PM4 ring pointers count dwords
QWORDS = RingUnit("qword", 8)


class RetireSource(Protocol):
    """Where a ring learns how far the device has consumed it."""

    name: str

    def position(self, write: int) -> int:
        """The monotonic ring position up to which the device is done, given the host's write position."""
        ...

    def skip(self, start: int, end: int) -> None:
        """Positions [start, end) were skipped without padding: count them done with what precedes them."""
        ...


# Every source reads a word the device writes in host-visible memory: `word[index]` on a typed pointer
# (a cffi `volatile uint32_t *` / `uint64_t *`), read directly because a replay checks it on every submit.
Word = Any


class CounterRetire:
    """A monotonic count of retired units the device maintains at `word[index]`."""

    __slots__ = ("index", "name", "word")

    def __init__(self, word: Word, name: str, index: int = 0) -> None:
        self.word, self.index, self.name = word, index, name

    def read(self) -> int:
        return int(self.word[self.index])

    def position(self, write: int) -> int:
        return int(self.word[self.index])

    def skip(self, start: int, end: int) -> None:
        raise ValueError(f"{self.name} counts every unit the device reads: skipped units need padding")


class WrappedIndexRetire:
    """A read index modulo `modulus` (a power of two) that the device advances at `word[index]`; the ring's
    write position tells which lap it is on: units in flight are `(write - read) mod modulus`. The ring must
    be at most `modulus - 1` units deep, or a full ring would read as an empty one."""

    __slots__ = ("_mask", "index", "modulus", "name", "word")

    def __init__(self, word: Word, modulus: int, name: str, index: int = 0) -> None:
        if modulus < 2 or modulus & (modulus - 1):
            raise ValueError(f"{name}: modulus {modulus} must be a power of two >= 2")
        self.word, self.index, self.modulus, self.name, self._mask = word, index, modulus, name, modulus - 1

    def read(self) -> int:
        return int(self.word[self.index])

    def position(self, write: int) -> int:
        return write - ((write - self.word[self.index]) & self._mask)

    def skip(self, start: int, end: int) -> None:
        raise ValueError(f"{self.name} counts every unit the device reads: skipped units need padding")


class FenceRetire:
    """A counter the device writes at `word[index]` with each submission's fence value once it has run it;
    `record(value, end)` after each commit says the ring is consumed up to `end` once the counter reaches
    `value`. Fence values must increase in commit order (the device retires submissions in order)."""

    __slots__ = ("_done", "_fences", "index", "name", "word")

    def __init__(self, word: Word, name: str, index: int = 0, start: int = 0) -> None:
        self.word, self.index, self.name = word, index, name
        self._fences: deque[tuple[int, int]] = deque()
        self._done = start  # ring position the newest reached fence ends at

    def read(self) -> int:
        return int(self.word[self.index])

    def record(self, value: int, end: int) -> None:
        if self._fences and value <= self._fences[-1][0]:
            raise ValueError(f"{self.name}: fence {value} after fence {self._fences[-1][0]}")
        self._fences.append((value, end))

    def skip(self, start: int, end: int) -> None:
        # free once the newest fence is reached (at once if every fence is): nothing reads them
        if self._fences:
            value, last_end = self._fences[-1]
            self._fences[-1] = (value, max(last_end, end))
        elif self._done == start:
            self._done = end

    def position(self, write: int) -> int:
        fences = self._fences
        if fences:
            counter = self.word[self.index]
            while fences and fences[0][0] <= counter:
                self._done = fences.popleft()[1]
        return self._done

    @property
    def pending(self) -> int:
        """Fences recorded that the device has not reached (as of the last `position`)."""
        return len(self._fences)


class Ring:
    """`capacity` units consumed in order by a device (see the module docstring); at most `limit` of them
    in flight (default all; a ring tracked by a wrapped read index keeps one empty).

    `pad(slot, n)` fills `n` units from `slot` that the device will read past (NOP records or packets);
    None when the device never reads skipped units (NV's pushbuffer: each GP entry says where its commands
    start), and then the retire source counts them done with what precedes them (`skip`). `flush()` runs
    before any wait for space (a driver whose commits are not yet visible to the
    device rings its doorbell there, or the space would never free up); `check()` runs while waiting and
    may raise (a fault check); `detail()` adds the driver's view of its rings to a timeout's message. The
    caller serializes use (a device's submit lock). `block(position, queue, timeout_s)`, for a ring retired
    by a counter (CounterRetire), is the driver's blocking wait until that counter reaches `position` (the
    CPU device's spin-then-futex wait): waits for space and for retirement use it instead of the shared
    loop's spin and sleep naps; it raises DeviceTimeout (or DeviceFault) itself, after `timeout_s`.
    """

    __slots__ = ("_known", "_position", "_room", "block", "capacity", "check", "detail", "device", "flush",
                 "limit", "name", "pad", "retire", "timeout_s", "unit", "write")

    def __init__(self, name: str, capacity: int, unit: RingUnit, retire: RetireSource, *, device: str = "",
                 write: int = 0, limit: int | None = None, pad: Callable[[int, int], None] | None = None,
                 flush: Callable[[], None] | None = None, check: Callable[[], None] | None = None,
                 detail: Callable[[], str] | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 block: Callable[[int, str, float], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"{name}: ring capacity must be >= 1 {unit.name}, got {capacity}")
        limit = capacity if limit is None else limit
        if not 0 < limit <= capacity:
            raise ValueError(f"{name}: in-flight limit {limit} must be in [1, {capacity}]")
        if isinstance(retire, WrappedIndexRetire) and limit >= retire.modulus:
            raise ValueError(f"{name}: a wrapped read index modulo {retire.modulus} tracks at most "
                             f"{retire.modulus - 1} {unit.name}s in flight, not {limit} (pass limit=)")
        if block is not None and not isinstance(retire, CounterRetire):
            raise ValueError(f"{name}: a blocking wait needs a counter the device advances (CounterRetire), "
                             f"not {type(retire).__name__}")
        self.limit = limit
        self.block = block
        self.name, self.capacity, self.unit, self.retire, self.device = name, capacity, unit, retire, device
        self._position = retire.position  # bound once: a replay's reserve calls it on every submit
        self.write = write
        self.pad, self.flush, self.check, self.detail, self.timeout_s = pad, flush, check, detail, timeout_s
        self._room = 0  # contiguous units the last reserve made available at the write position
        # A lower bound of the free units (retirement only moves forward), so a reserve that fits in it
        # skips reading the device's progress word: a replay reads it once per many submits, not each time.
        self._known = 0

    def __repr__(self) -> str:
        return (f"Ring({self.name!r}: {self.capacity} {self.unit.name}s, write {self.write}, "
                f"retired {self.retired()})")

    # ------------------------------------------------------------------ state
    def retired(self) -> int:
        """Position up to which the device has consumed the ring."""
        return self.retire.position(self.write)

    def free(self) -> int:
        """Units the host may overwrite now (not necessarily contiguous)."""
        self._known = free = self.limit - (self.write - self._position(self.write))
        return free

    def slot(self) -> int:
        """Offset in units of the write position inside the ring."""
        return self.write % self.capacity

    def room(self) -> int:
        """Contiguous units writable at `slot()` now, without waiting."""
        slot = self.write % self.capacity
        self._room = room = min(self.capacity - slot, self.free())
        return room

    # ------------------------------------------------------------------ reserve / commit
    def reserve(self, n: int, align: int = 1, queue: str = "ring", timeout_s: float | None = None) -> int:
        """The slot (offset in units) where `n` contiguous units may now be written, `align`-aligned: pads
        to the alignment, or to the ring's end when the span would straddle it, and waits for the device
        to retire what is in the way. Nothing is published until `commit`."""
        w = self.write
        cap = self.capacity
        slot = w % cap
        if align == 1 and slot + n <= cap and 0 < n <= self._known:
            self._room = n  # the common case: fits here, known to be free without asking the device
            return slot
        if not 0 < n <= self.limit:
            raise ValueError(f"{queue} on the {self.name}: a span of {n} {self.unit.name}s does not fit a "
                             f"ring of {self.limit}")
        if align < 1 or cap % align:
            raise ValueError(f"{self.name}: alignment {align} does not divide the ring's {cap} "
                             f"{self.unit.name}s")
        gap = -slot % align
        if slot + gap + n > cap:
            gap = cap - slot  # to the end: a span never wraps
        if gap:
            if self.pad is None:
                self.retire.skip(w, w + gap)
            else:  # the padding is read by the device: it takes space like a command, written first
                if self.free() < gap:
                    self._wait_free(gap, queue, timeout_s)
                self.pad(slot, gap)
            self.write = w + gap
        if self.free() < n:
            self._wait_free(n, queue, timeout_s)
        self._room = n
        return self.write % cap

    def take(self, n: int = 1, queue: str = "ring") -> int:
        """`reserve(n)` and `commit(n)` in one call, returning the slot: for a writer whose units reach the
        device in one step that follows (NV's native GP-entry publish), which calls `untake(n)` if that
        step fails. The replay path's whole use of the GPFIFO ring."""
        w = self.write
        slot = w % self.capacity
        if slot + n <= self.capacity and 0 < n <= self._known:
            self._known -= n
            self.write = w + n
            return slot
        slot = self.reserve(n, 1, queue)
        self.commit(n)
        return slot

    def try_take(self, n: int) -> int:
        """`take(n)` if `n` contiguous units are free right now (reading the device's progress at most
        once), else -1 without waiting or changing anything: a writer's one-copy fast path."""
        w = self.write
        slot = w % self.capacity
        if slot + n <= self.capacity and 0 < n and (n <= self._known or n <= self.free()):
            self._known -= n
            self.write = w + n
            return slot
        return -1

    def untake(self, n: int) -> None:
        """Undo the last `take(n)` (its units never reached the device)."""
        self.write -= n
        self._known += n

    def commit(self, n: int) -> int:
        """Publish `n` units written at the reserved slot; returns the new write position."""
        room = self._room
        if n > room or n < 0:
            raise ValueError(f"{self.name}: commit of {n} {self.unit.name}s exceeds the {room} reserved")
        self._room = room - n
        self._known -= n
        self.write = w = self.write + n
        return w

    def span(self, sizes: list[int]) -> int:
        """Units that spans of `sizes` would take from the write position, in order, each contiguous (the
        padding before any that would straddle the end included); ValueError if one exceeds the ring."""
        cap = self.capacity
        slot = self.write % cap
        total = 0
        for n in sizes:
            if not 0 < n <= self.limit:
                raise ValueError(f"{self.name}: a span of {n} {self.unit.name}s does not fit a ring of "
                                 f"{self.limit}")
            if slot + n > cap:
                total += cap - slot
                slot = 0
            total += n
            slot += n
        return total

    def wait_free(self, n: int, queue: str = "ring", timeout_s: float | None = None) -> None:
        """Wait until `n` units are free (a writer that must place several spans all or nothing waits for
        their `span` first)."""
        if self.free() < n:
            self._wait_free(n, queue, timeout_s)

    def _wait_free(self, need: int, queue: str, timeout_s: float | None) -> None:
        if self.flush is not None:
            self.flush()  # what is already written must run, or the space never frees up
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if self.block is not None:
            # free() >= need  <=>  retired >= write - limit + need: the driver's blocking wait on that count
            self.block(self.write - self.limit + need, queue, timeout)
            self.free()
            return
        free = self.free
        wait_until(lambda: free() >= need, timeout,
                   lambda: DeviceTimeout(self.device, queue, self._what(), need, free(), timeout,
                                         self._detail()), self.check)

    def wait_retired(self, position: int, queue: str = "ring", timeout_s: float | None = None) -> None:
        """Wait until the device has consumed the ring up to `position`."""
        if self.retire.position(self.write) >= position:
            return
        if self.flush is not None:
            self.flush()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if self.block is not None:
            self.block(position, queue, timeout)
            return
        wait_until(lambda: self.retire.position(self.write) >= position, timeout,
                   lambda: DeviceTimeout(self.device, queue, self.retire.name, position,
                                         self.retire.position(self.write), timeout, self._detail()),
                   self.check)

    def _detail(self) -> str:
        return self.detail() if self.detail is not None else ""

    def _what(self) -> str:
        w = self.write
        return (f"free {self.unit.name} count in the {self.name} ({self.retire.name} at "
                f"{self.retire.position(w)}, write position {w}, {self.capacity} {self.unit.name}s)")
