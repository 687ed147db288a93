"""The ring helper (hcq/ring.py) on its own, and ring behaviour every device kind in conftest.KINDS must
show: multi-command queues wrapping a small ring under backpressure, and a full ring that times out and
then recovers with nothing lost or overwritten."""
from __future__ import annotations

import random
import threading
from collections.abc import Callable

import cffi
import pytest

from rawgrad.hcq import DeviceTimeout, HCQDevice, HWQueue
from rawgrad.hcq.ring import BYTES, DWORDS, CounterRetire, FenceRetire, Ring, RingUnit, WrappedIndexRetire

from .conftest import SMALL_RING_SLOTS, TIMEOUT_S

_ffi = cffi.FFI()
SHORT_S = 0.1  # a wait that is meant to time out
RECORDS = RingUnit("record", 64)


def _word(bits: int = 64) -> tuple[object, Callable[[int], None]]:
    """A device progress word in host memory and a setter (what the device would write)."""
    ptr = _ffi.new(f"uint{bits}_t[1]")

    def set_to(v: int) -> None:
        ptr[0] = v
    return ptr, set_to


# ------------------------------------------------------------------------------ Ring on its own
def test_reserve_commit_and_wrap_with_padding() -> None:
    word, retire_to = _word()
    pads: list[tuple[int, int]] = []
    ring = Ring("r", 8, RECORDS, CounterRetire(word, "read index"), pad=lambda s, n: pads.append((s, n)))
    assert ring.reserve(3) == 0 and ring.commit(3) == 3
    assert ring.reserve(3) == 3 and ring.commit(3) == 6
    retire_to(6)  # the device consumed everything
    # 3 more do not fit before the end (slot 6 of 8): pad 2, start the next lap at slot 0
    assert ring.reserve(3) == 0 and pads == [(6, 2)] and ring.write == 8
    assert ring.commit(3) == 11 and ring.free() == 8 - (11 - 6)


def test_alignment_pads_to_the_aligned_slot() -> None:
    word, _ = _word()
    pads: list[tuple[int, int]] = []
    ring = Ring("pb", 64, BYTES, CounterRetire(word, "rptr"), pad=lambda s, n: pads.append((s, n)))
    ring.reserve(5)
    ring.commit(5)
    assert ring.reserve(8, align=16) == 16 and pads == [(5, 11)]
    with pytest.raises(ValueError, match="alignment 24 does not divide"):
        ring.reserve(1, align=24)


def test_reserve_waits_for_retirement_and_flushes_first() -> None:
    word, retire_to = _word()
    flushed = threading.Event()
    ring = Ring("r", 4, DWORDS, CounterRetire(word, "CP read pointer"), flush=flushed.set,
                timeout_s=TIMEOUT_S)
    ring.reserve(4)
    ring.commit(4)
    retiring = threading.Event()

    def retire_later() -> None:
        retiring.set()  # set before the retire, so a reserve that returns has seen it happen
        retire_to(2)

    timer = threading.Timer(0.05, retire_later)
    timer.start()
    assert ring.reserve(2) == 0
    assert retiring.is_set(), "reserve returned before the device retired the dwords it reuses"
    timer.join()
    assert flushed.is_set()


def test_full_ring_times_out_naming_ring_queue_and_room_then_recovers() -> None:
    word, retire_to = _word()
    pads: list[tuple[int, int]] = []
    ring = Ring("SDMA ring", 16, BYTES, CounterRetire(word, "SDMA rptr"), device="AMD", timeout_s=SHORT_S,
                detail=lambda: "engine busy", pad=lambda s, n: pads.append((s, n)))
    ring.reserve(12)
    ring.commit(12)
    with pytest.raises(DeviceTimeout) as info:
        ring.reserve(8, queue="copy queue 2")
    e = info.value
    # 8 bytes do not fit after slot 12 of 16: the 4 to the end were free and are NOPs now; the 8 at slot 0
    # wait for the device to pass them
    assert (e.device, e.queue, e.expected, e.current, e.timeout_s) == ("AMD", "copy queue 2", 8, 0, SHORT_S)
    assert "free byte count in the SDMA ring" in e.signal and "SDMA rptr" in e.signal
    assert "engine busy" in str(e) and pads == [(12, 4)] and ring.write == 16
    retire_to(16)  # the device ran everything, padding included
    assert ring.reserve(8) == 0 and ring.commit(8) == 24 and pads == [(12, 4)]
    unpadded = Ring("no pad", 16, BYTES, CounterRetire(word, "SDMA rptr"), write=19)
    with pytest.raises(ValueError, match="SDMA rptr counts every unit the device reads"):
        unpadded.reserve(16)  # from slot 3 the span must start over at 0: that needs NOPs the device reads


def test_a_blocking_wait_hook_replaces_the_spin_and_naps() -> None:
    word, retire_to = _word()
    asked: list[tuple[int, str, float]] = []

    def block(position: int, queue: str, timeout_s: float) -> None:
        asked.append((position, queue, timeout_s))
        retire_to(position)  # what the device would do while the host sleeps

    flushed = threading.Event()
    ring = Ring("r", 8, RECORDS, CounterRetire(word, "read index"), flush=flushed.set, block=block,
                timeout_s=TIMEOUT_S)
    ring.reserve(8)
    ring.commit(8)
    assert ring.reserve(3, queue="q1") == 0  # 3 free <=> read index >= 8 - 8 + 3
    assert asked == [(3, "q1", TIMEOUT_S)] and flushed.is_set()
    ring.commit(3)
    ring.wait_retired(11, queue="q2", timeout_s=SHORT_S)
    assert asked[-1] == (11, "q2", SHORT_S)
    ring.wait_retired(5)  # already retired: no wait at all
    assert len(asked) == 2


def test_a_blocking_wait_hook_needs_a_counter() -> None:
    word, _ = _word()
    with pytest.raises(ValueError, match="CounterRetire"):
        Ring("gp", 8, RECORDS, WrappedIndexRetire(word, 8, "GPGet"), limit=7, block=lambda p, q, t: None)


def test_try_take_never_waits_pads_or_changes_anything_when_it_cannot() -> None:
    word, retire_to = _word()
    pads: list[tuple[int, int]] = []
    ring = Ring("cmd", 8, RECORDS, CounterRetire(word, "read index"), pad=lambda s, n: pads.append((s, n)),
                timeout_s=TIMEOUT_S)
    assert ring.try_take(5) == 0 and ring.write == 5
    assert ring.try_take(4) == -1 and ring.write == 5  # 3 free: no
    retire_to(5)
    assert ring.try_take(4) == -1 and ring.write == 5 and pads == []  # free, but it would straddle the end
    assert ring.try_take(3) == 5 and ring.write == 8 and ring.try_take(0) == -1


def test_bad_spans_are_named_errors() -> None:
    word, _ = _word()
    ring = Ring("cmd", 8, RECORDS, CounterRetire(word, "read index"))
    with pytest.raises(ValueError, match="q1 on the cmd: a span of 9 records does not fit a ring of 8"):
        ring.reserve(9, queue="q1")
    with pytest.raises(ValueError, match="span of 0"):
        ring.reserve(0)
    ring.reserve(2)
    with pytest.raises(ValueError, match="commit of 3 records exceeds the 2 reserved"):
        ring.commit(3)
    with pytest.raises(ValueError, match="capacity"):
        Ring("empty", 0, BYTES, CounterRetire(word, "x"))


def test_wrapped_index_keeps_one_slot_empty() -> None:
    word, fetch_to = _word(32)
    with pytest.raises(ValueError, match="at most 7"):
        Ring("gp", 8, RingUnit("entry", 8), WrappedIndexRetire(word, 8, "GPGet"))
    ring = Ring("gp", 8, RingUnit("entry", 8), WrappedIndexRetire(word, 8, "GPGet"), limit=7,
                timeout_s=SHORT_S)
    assert [ring.take(1) for _ in range(7)] == [0, 1, 2, 3, 4, 5, 6]
    with pytest.raises(DeviceTimeout):
        ring.take(1)  # 7 in flight: GPGet == GPPut would read as empty, so the 8th waits
    fetch_to(5)  # the front end fetched 5 (GPGet moves modulo 8)
    assert [ring.take(1) for _ in range(5)] == [7, 0, 1, 2, 3]  # slots follow GPPut modulo the 8 entries
    assert ring.write == 12 and ring.retired() == 5 and ring.slot() == 4
    ring.untake(1)  # the last entry never reached the device (its publish failed)
    assert ring.write == 11 and ring.slot() == 3


def test_fence_retire_frees_space_per_submission() -> None:
    word, counter_to = _word()
    fences = FenceRetire(word, "retirement counter")
    ring = Ring("pb", 100, BYTES, fences, timeout_s=SHORT_S)
    for value in (1, 2, 3):
        ring.reserve(30)
        fences.record(value, ring.commit(30))
    assert ring.free() == 10
    counter_to(2)  # two submissions ran: their 60 bytes are free, the third's are not
    assert ring.free() == 70 and fences.pending == 1
    with pytest.raises(ValueError, match="fence 2 after fence 3"):
        fences.record(2, 95)


def test_skipped_tail_of_a_fence_ring_is_free_with_the_work_before_it() -> None:
    """NV's pushbuffer: a span that does not fit before the end starts over at 0 and the GPU never reads the
    skipped tail, so it is free as soon as the submissions before it retired; a span longer than the
    current slot must not wait for the tail itself to retire (it never would)."""
    word, counter_to = _word()
    fences = FenceRetire(word, "compute retirement counter")
    ring = Ring("pushbuffer space", 100, BYTES, fences, timeout_s=SHORT_S)
    ring.reserve(10)
    fences.record(1, ring.commit(10))
    counter_to(1)
    assert ring.reserve(95) == 0 and ring.write == 100  # the 90 skipped were free with fence 1
    fences.record(2, ring.commit(95))
    assert ring.reserve(5) == 95
    fences.record(3, ring.commit(5))
    with pytest.raises(DeviceTimeout):
        ring.reserve(50)  # fences 2 and 3 pending: slots 0..95 and 95..100 are in use
    counter_to(2)
    assert ring.free() == 95 and ring.reserve(50) == 0  # fence 2 freed 0..95; the tail waits for fence 3
    fences.record(4, ring.commit(50))
    with pytest.raises(DeviceTimeout):
        ring.reserve(60)  # 60 more do not fit at slot 50: skipping 50 is fine, but 0..50 is fence 4's
    counter_to(4)
    assert ring.reserve(60) == 0


def test_random_use_never_overwrites_unretired_units() -> None:
    """A model device consumes the ring part of the way at random times, and all of it when the ring
    flushes before a wait; every span handed out is aligned, inside the ring, and lies over units the
    device has consumed."""
    rng = random.Random(7)
    word, retire_to = _word()
    cap = 37
    consumed = [0]
    last_write: dict[int, int] = {}  # ring slot -> the position of the unit last written or padded there

    def consume(upto: int) -> None:
        consumed[0] = upto
        retire_to(upto)

    def pad(slot: int, n: int) -> None:
        assert slot + n == cap  # padding only ever runs to the ring's end
        for k in range(n):
            assert last_write.get(slot + k, -1) < consumed[0]
            last_write[slot + k] = ring.write + k

    ring = Ring("model", cap, BYTES, CounterRetire(word, "rptr"), pad=pad, timeout_s=TIMEOUT_S,
                flush=lambda: consume(ring.write))
    waits = 0
    for _ in range(3000):
        if rng.random() < 0.3:
            consume(rng.randint(consumed[0], ring.write))
        n, align = rng.randint(1, cap), rng.choice([1, 1, 1, 37])
        before = consumed[0]
        slot = ring.reserve(n, align)
        waits += consumed[0] != before
        assert slot % align == 0 and slot + n <= cap and slot == ring.write % cap
        for k in range(n):
            assert last_write.get(slot + k, -1) < consumed[0]
            last_write[slot + k] = ring.write + k
        ring.commit(n)
    assert waits > 100  # the ring was full often: the test exercised backpressure, not just free space


# ------------------------------------------------------------------------------ every device kind
def test_queues_of_many_sizes_wrap_a_small_ring_in_order(fresh: Callable[..., HCQDevice]) -> None:
    """Queues of 1 to 6 commands (on the CPU: 1 to 6 records, so a command often lands at the ring's end and
    is padded past it) submitted behind a stalled device: each waits for room, none overwrites queued work,
    and they run in submission order."""
    dev = fresh(ring_slots=SMALL_RING_SLOTS)
    gate, seq, log = dev.new_signal(0, name="gate"), dev.new_signal(0, name="sequence"), dev.new_signal(0)
    dev.timeline_submit(lambda q: q.wait(gate, 1))
    timer = threading.Timer(0.1, lambda: setattr(gate, "value", 1))
    timer.start()
    count = 6 * SMALL_RING_SLOTS
    rng = random.Random(3)
    try:
        for i in range(1, count + 1):
            extra = rng.randint(0, 4)

            def work(q: HWQueue, i: int = i, extra: int = extra) -> None:
                q.wait(seq, i - 1)
                for _ in range(extra):
                    q.signal(log, i)  # filler commands that make the queue longer
                q.signal(seq, i)
            dev.timeline_submit(work)
    finally:
        timer.cancel()
    dev.synchronize(TIMEOUT_S)
    assert seq.value == count and dev.timeline_signal.value == dev.timeline_value - 1


def test_a_full_ring_times_out_then_the_device_recovers(fresh: Callable[..., HCQDevice]) -> None:
    dev = fresh(ring_slots=SMALL_RING_SLOTS, timeout_s=SHORT_S)
    gate, done = dev.new_signal(0, name="gate"), dev.new_signal(0, name="done")
    dev.timeline_submit(lambda q: q.wait(gate, 1))
    accepted = 0
    with pytest.raises(DeviceTimeout) as info:
        for i in range(1, 4 * SMALL_RING_SLOTS):
            dev.timeline_submit(lambda q, i=i: q.signal(done, i))
            accepted = i
    assert info.value.device == dev.name and accepted >= 1
    assert done.value == 0  # nothing ran past the stalled wait, nothing was overwritten
    gate.value = 1  # the stalled wait retires and the ring drains
    dev.synchronize(TIMEOUT_S)
    assert done.value == accepted  # every accepted queue ran, in order
    dev.timeline_submit(lambda q: q.signal(done, 1000))
    dev.synchronize(TIMEOUT_S)
    assert done.value == 1000 and dev.timeline_signal.value == dev.timeline_value - 1
