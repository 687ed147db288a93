"""GPFIFO channel submission: pushbuffer ring, GP ring, USERD, doorbell, with backpressure and timeouts."""

from __future__ import annotations

from collections.abc import Callable

import cffi

from rawgrad.drivers.nv import pushbuf as pbuf
from rawgrad.drivers.osapi import OSInterface
from rawgrad.hcq.errors import DeviceTimeout
from rawgrad.hcq.ring import BYTES, FenceRetire, Ring, RingUnit, WrappedIndexRetire
from rawgrad.hcq.signal import wait_until

_ffi = cffi.FFI()

# NvNotification (the channel error notifier): info32 at +8, status (u16) at +14.
NOTIFIER_INFO32_OFFSET = 8
NOTIFIER_STATUS_OFFSET = 14
# A GPFIFO ring counts 8-byte entries (NV-FACTS 4.3: GP entry, two dwords).
GP_ENTRIES = RingUnit("GPFIFO entry", 8)


class NVChannelError(RuntimeError):
    """The channel's error notifier reports a fault (RC error): the GPU stopped executing it."""


def read_u32(addr: int) -> int:
    return int(_ffi.cast("volatile uint32_t *", addr)[0])


def read_u64(addr: int) -> int:
    return int(_ffi.cast("volatile uint64_t *", addr)[0])


def write_u64(addr: int, value: int) -> None:
    _ffi.cast("volatile uint64_t *", addr)[0] = value & ((1 << 64) - 1)


def write_bytes(addr: int, data: bytes) -> None:
    _ffi.memmove(_ffi.cast("void *", addr), data, len(data))


def _as_pb(words: list[int]) -> pbuf.PushBuffer:
    pb = pbuf.PushBuffer()
    pb.words.extend(words)
    return pb


class Channel:
    """One GPFIFO channel as the CPU sees it (rings are CPU-mapped at their GPU VA)."""

    def __init__(
        self,
        *,
        name: str,
        device_name: str,
        os_iface: OSInterface,
        host: pbuf.HostClass,
        token: int,
        gpfifo_addr: int,
        entries: int,
        userd_addr: int,
        pb_addr: int,
        pb_bytes: int,
        doorbell_addr: int,
        retire_addr: int,
        notifier_addr: int | None,
        timeout_s: float = 10.0,
    ):
        if entries < 2 or entries & (entries - 1):
            raise ValueError(f"GPFIFO entries {entries} must be a power of two >= 2")
        self.name, self.device_name, self.os, self.host, self.token = name, device_name, os_iface, host, token
        self.gpfifo_addr, self.entries, self.userd_addr = gpfifo_addr, entries, userd_addr
        self._entry_mask = entries - 1  # GPGet/GPPut wrap with a mask (entries is a power of two)
        self.pb_addr, self.pb_bytes, self.doorbell_addr = pb_addr, pb_bytes, doorbell_addr
        self.retire_addr, self.notifier_addr = retire_addr, notifier_addr
        # Typed pointers made once: the replay path reads these words on every submit.
        self._gp_get = _ffi.cast("volatile uint32_t *", userd_addr + pbuf.USERD_GP_GET)
        self._retired = _ffi.cast("volatile uint64_t *", retire_addr)
        self._notifier_status = None if notifier_addr is None else _ffi.cast(
            "volatile uint16_t *", notifier_addr + NOTIFIER_STATUS_OFFSET)
        self.put = read_u32(userd_addr + pbuf.USERD_GP_PUT)
        self._publish_entry = os_iface.gpfifo_publisher(gpfifo_addr, entries, userd_addr + pbuf.USERD_GP_PUT,
                                                        doorbell_addr, token)
        # GPGet is the front end's index modulo `entries`: one entry stays empty (full != empty)
        self.gp_ring = Ring(f"{name} GPFIFO ring", entries, GP_ENTRIES, limit=entries - 1,
                            retire=WrappedIndexRetire(self._gp_get, entries, "GPGet"), device=device_name,
                            write=self.put, check=self.check_error, detail=self._progress,
                            timeout_s=timeout_s)
        self.retire_value = read_u64(retire_addr)
        # pushbuffer bytes are free once the retirement release that follows them has landed; the GPU
        # never reads bytes skipped at the end (a GP entry names where its commands start), so no padding
        self._pb_fences = FenceRetire(self._retired, f"{name} retirement counter")
        self.pb_ring = Ring(f"{name} pushbuffer space", pb_bytes, BYTES, self._pb_fences, device=device_name,
                            check=self.check_error, detail=self._progress, timeout_s=timeout_s)
        self.pb_head = 0  # ring offset just past the last commit
        self._label = self._who(None)  # the bound replay's name for itself in a timeout
        self.submissions = 0

    # -- progress --------------------------------------------------------------------------------
    def gp_get(self) -> int:
        return int(self._gp_get[0])

    def retired(self) -> int:
        return int(self._retired[0])

    def check_error(self) -> None:
        """Raise NVChannelError if RM wrote this channel's error notifier (NvNotification.status != 0)."""
        if self._notifier_status is None:
            return
        status = int(self._notifier_status[0])
        if status:
            info32 = read_u32(self.notifier_addr + NOTIFIER_INFO32_OFFSET)  # type: ignore[operator]
            raise NVChannelError(
                f"{self.device_name} {self.name} channel error: notifier status {status:#x}, "
                f"info32 (Xid-style code) {info32}"
            )

    def _timed_out(self, queue: str | None, what: str, expected: int, current: Callable[[], int],
                   timeout_s: float) -> Callable[[], DeviceTimeout]:
        """The DeviceTimeout of a wait on this channel for ``what`` >= ``expected``, naming the queue."""
        return lambda: DeviceTimeout(self.device_name, self._who(queue), what, expected, current(), timeout_s,
                                     self._progress())

    def _progress(self) -> str:
        return (f"GPGet={self.gp_get()} GPPut={self.put} retired={self.retired()} "
                f"(last submitted {self.retire_value})")

    @property
    def timeout_s(self) -> float:
        """How long a submit waits for ring space and `wait_retired` for the counter."""
        return self.pb_ring.timeout_s

    @timeout_s.setter
    def timeout_s(self, seconds: float) -> None:
        self.gp_ring.timeout_s = self.pb_ring.timeout_s = seconds

    def wait_retired(self, value: int, timeout_s: float | None = None, queue: str | None = None) -> None:
        """Wait until the channel's retirement counter reaches ``value`` (DeviceTimeout naming ``queue``
        after the timeout; NVChannelError as soon as the channel reports a fault)."""
        if self.retired() >= value:
            return
        timeout = self.timeout_s if timeout_s is None else timeout_s
        wait_until(lambda: self.retired() >= value, timeout,
                   self._timed_out(queue, f"{self.name} retirement counter", value, self.retired, timeout),
                   self.check_error)

    # -- submission ------------------------------------------------------------------------------
    def _who(self, queue: str | None) -> str:
        return f"{queue} on the {self.name} channel" if queue else f"{self.name} channel"

    def _retire_words(self, value: int, wfi: bool) -> list[int]:
        return pbuf.sem_release(pbuf.PushBuffer(), self.host, self.retire_addr, value, timestamp=False,
                                wfi=wfi).words

    def submit(self, pb: pbuf.PushBuffer, *, retire_wfi: bool = False) -> int:
        """Copy ``pb`` and a retirement release after it into the pushbuffer ring, ring the doorbell.

        Returns the retirement value; the pushbuffer space is reused only after the GPU reaches it.
        ``retire_wfi``: the retirement waits for the engine to go idle first.
        """
        words = list(pb.words) + self._retire_words(self.retire_value + 1, retire_wfi)
        start = self.reserve(4 * len(words))
        return self.commit(start, _as_pb(words).to_bytes(), len(words))

    def reserve(self, nbytes: int, align: int = 4, queue: str | None = None) -> int:
        """Reserve ``nbytes`` of ring space at an ``align``-aligned offset (for the queue named ``queue``,
        which a DeviceTimeout names).

        The caller must ``commit`` it before any other submission on this channel. Both waits happen before
        any state changes, so a timeout leaves the channel consistent.
        """
        self.check_error()
        who = self._who(queue)
        if nbytes > self.pb_bytes:
            raise ValueError(f"{who}: submission of {nbytes} bytes exceeds the {self.pb_bytes}-byte "
                             f"pushbuffer")
        self.gp_ring.reserve(1, queue=who)
        return self.pb_ring.reserve(nbytes, align, who)

    def commit(self, start: int, blob: bytes, fetch_dwords: int) -> int:
        """Write ``blob`` at ring offset ``start`` (from ``reserve``) and run its first ``fetch_dwords``
        words; returns the retirement value, the channel's next one.

        Those commands must end with a release of the retirement counter to that value: the ring space
        (all of ``blob``: data after the commands too) is reused only once the GPU has written it.
        """
        if not 0 < 4 * fetch_dwords <= len(blob):
            raise ValueError(f"{self.name}: fetch {fetch_dwords} dwords of a {len(blob)}-byte submission")
        if start != self.pb_ring.slot():
            raise ValueError(f"{self.name}: commit at {start:#x}, but the pushbuffer reservation is at "
                             f"{self.pb_ring.slot():#x}")
        value = self.retire_value + 1
        write_bytes(self.pb_addr + start, blob)
        self._pb_fences.record(value, self.pb_ring.commit(len(blob)))
        self.pb_head = start + len(blob)
        self.retire_value = value
        self._publish(pbuf.GPEntry(self.pb_addr + start, fetch_dwords).encode())
        return value

    def submit_bound(self, entry: int, value: int) -> int:
        """Run a bound block (its GP entry `entry`, from GPEntry(va, ndwords).encode()) that ends with its
        own release of the retirement counter to ``value``, the next retirement value: no ring space.
        The caller has checked the device for channel errors (its replay path does, once for all)."""
        if value != self.retire_value + 1:
            raise ValueError(f"{self.name}: a bound block must retire with {self.retire_value + 1}, "
                             f"not {value}")
        self._publish(entry)  # waits for a free GP entry before anything changes
        self.retire_value = value
        return value

    def _publish(self, entry: int) -> None:
        # ring entry (and the pushbuffer it points at) visible before GPPut, GPPut before the doorbell
        # (NV-FACTS 4.5): one call through the OS seam, native code in production. The GP slot was
        # taken from the ring first, so the entry overwrites one the front end has fetched.
        ring = self.gp_ring
        slot = ring.take(1, self._label)
        try:
            self._publish_entry(slot, entry)
        except BaseException:
            ring.untake(1)
            raise
        self.put = ring.write & self._entry_mask
        self.submissions += 1

    def wait_idle(self, timeout_s: float | None = None) -> None:
        """Wait until everything submitted so far has retired."""
        self.wait_retired(self.retire_value, timeout_s)
