"""SDMA builders and the SDMA side of the command-processor model: copies of odd sizes and alignments in both
directions, chunking at the engine's count limit, fences, traps, timestamps, polls (also across queues), and
faults for unmapped addresses, counts the engine cannot hold and waits nothing will satisfy."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad.drivers.amd import pm4, regs, sdma
from rawgrad.drivers.amd.mock.cp import CommandProcessor, GPUFault, GPUHang, SDMAQueue, SignalTimeout
from rawgrad.drivers.amd.mock.rdna3.interp import MemoryMap
from rawgrad.drivers.amd.regs import GFX11, GFX943, CompareFunc

RING, RING_BYTES = 0x1000_0000, 4096
PM4_RING = 0x1100_0000
HOST, DEV = 0x2000_0000, 0x3000_0000  # a host-visible staging buffer and a "VRAM" buffer
SIGNALS = 0x4000_0000
BIG = 5 << 20


class Rig:
    def __init__(self, arch: str = "gfx1100", size: int = 1 << 16) -> None:
        self.mem = MemoryMap()
        self.fam = regs.family(arch)
        self.cp = CommandProcessor(self.mem, arch)
        self.mem.map(RING, RING_BYTES)
        self.mem.map(RING + 2 * RING_BYTES, 8)
        self.q: SDMAQueue = self.cp.sdma_queue(RING, RING_BYTES, rptr_va=RING + 2 * RING_BYTES)
        rng = np.random.default_rng(1)
        self.host = self.mem.map(HOST, rng.integers(0, 256, size, dtype=np.uint8))
        self.dev = self.mem.map(DEV, size)
        self.signals = self.mem.map(SIGNALS, 4096)

    def submit(self, words: list[int], q: SDMAQueue | None = None) -> None:
        """Write `words` at the queue's write pointer (a byte offset, wrapping) and ring its doorbell."""
        q = q or self.q
        data = np.array(words, np.uint32).view(np.uint8)
        ring = self.mem.load(np.array([q.ring_va], np.uint64), q.ring_bytes)[0].copy()
        ring[(q.wptr + np.arange(data.size)) % q.ring_bytes] = data
        self.mem.store(np.array([q.ring_va], np.uint64), ring[None, :])
        q.doorbell(q.wptr + data.size)


# ------------------------------------------------------------------------------------------- builders
def test_packets_match_the_sdma_headers() -> None:
    assert sdma.copy_linear(GFX11, 0x1_0000_0002, 0x3_0000_0001, 5) == [1, 4, 0, 1, 3, 2, 1]
    assert sdma.fence(GFX11, 0x1000, 9) == [5 | 3 << 16, 0x1000, 0, 9]  # MTYPE uncached on SDMA 6
    assert sdma.fence(GFX943, 0x1000, 9) == [5, 0x1000, 0, 9]  # SDMA 4.x has no MTYPE field
    assert sdma.trap(77) == [6, 77]
    assert sdma.poll_regmem(0x1000, 3) == [8 | 5 << 28 | 1 << 31, 0x1000, 0, 3, 0xFFFFFFFF, 10 | 0xFFF << 16]
    assert sdma.timestamp(0x2000) == [13 | 2 << 8, 0x2000, 0]
    assert sdma.nop(3) == [2 << 16, 0, 0]
    assert len(sdma.pad_to([1, 2, 3])) == 8 and sdma.pad_to(list(range(8))) == list(range(8))


def test_copy_is_chunked_at_the_engine_limit() -> None:
    n = (4 << 20) + 3  # one byte past a 4 MiB SDMA 4.x packet, plus 2
    words = sdma.copy_linear(GFX943, 0x10, 0x1_0000_0000, n)
    assert len(words) == 2 * regs.SDMA_COPY_LINEAR_DWORDS
    assert (words[1], words[8]) == ((4 << 20) - 1, 2)
    assert (words[10], words[12]) == (4 << 20, 0x10 + (4 << 20))  # second chunk continues both addresses
    assert len(sdma.copy_linear(GFX11, 0, 0x1000, n)) == regs.SDMA_COPY_LINEAR_DWORDS  # 1 GiB on SDMA 6
    with pytest.raises(ValueError, match="0 bytes"):
        sdma.copy_linear(GFX11, 0, 0, 0)
    with pytest.raises(ValueError, match="aligned"):
        sdma.fence(GFX11, 0x1002, 1)
    with pytest.raises(ValueError, match="32 bits"):
        sdma.poll_regmem(0x1000, 1 << 32)


# ------------------------------------------------------------------------------------------- execution
@pytest.mark.parametrize("n, src_off, dst_off", [(1, 0, 0), (3, 1, 2), (5, 3, 7), (4097, 1, 0),
                                                 (65521, 7, 11)])
def test_odd_copies_both_ways(n: int, src_off: int, dst_off: int) -> None:
    rig = Rig()
    dev_before = rig.dev.copy()
    rig.submit(sdma.copy_linear(GFX11, DEV + dst_off, HOST + src_off, n) + sdma.fence(GFX11, SIGNALS, 1))
    assert rig.cp.wait_signal(SIGNALS, 1) == 1
    np.testing.assert_array_equal(rig.dev[dst_off:dst_off + n], rig.host[src_off:src_off + n])
    np.testing.assert_array_equal(rig.dev[:dst_off], dev_before[:dst_off])  # nothing outside the range
    np.testing.assert_array_equal(rig.dev[dst_off + n:], dev_before[dst_off + n:])
    rig.dev[dst_off:dst_off + n] ^= 0x5A  # the GPU changes it; copy back into a different host spot
    back = rig.mem.map(HOST + (1 << 24), n + 16)
    rig.submit(sdma.copy_linear(GFX11, HOST + (1 << 24) + 1, DEV + dst_off, n)
               + sdma.fence(GFX11, SIGNALS, 2))
    assert rig.cp.wait_signal(SIGNALS, 2) == 2
    np.testing.assert_array_equal(back[1:n + 1], rig.dev[dst_off:dst_off + n])
    assert back[0] == 0 and (back[n + 1:] == 0).all()
    assert rig.q.idle and int(rig.mem.read(RING + 2 * RING_BYTES, np.uint64, 1)[0]) == rig.q.wptr  # bytes


def test_chunked_copy_runs_on_the_sdma4_model() -> None:
    rig = Rig("gfx942", size=BIG)
    n = (4 << 20) + 3
    rig.submit(sdma.copy_linear(GFX943, DEV + 1, HOST, n) + sdma.fence(GFX943, SIGNALS, 1))
    assert rig.cp.wait_signal(SIGNALS, 1) == 1
    np.testing.assert_array_equal(rig.dev[1:n + 1], rig.host[:n])
    assert rig.cp.queues[0].packets == 3


def test_count_wider_than_the_engine_is_a_fault() -> None:
    rig = Rig("gfx942", size=BIG)
    with pytest.raises(GPUFault) as e:
        rig.submit(sdma.copy_linear(GFX11, DEV, HOST, BIG))  # an SDMA 6 packet sent to SDMA 4.4
    assert e.value.field == "SDMA COPY_LINEAR.COUNT" and "sdma queue 0 ring byte 0" in str(e.value)
    assert (rig.dev == 0).all()


def test_fence_trap_and_timestamp() -> None:
    rig = Rig()
    rig.submit(sdma.timestamp(SIGNALS + 8) + sdma.copy_linear(GFX11, DEV, HOST, 1000)
               + sdma.timestamp(SIGNALS + 24) + sdma.fence(GFX11, SIGNALS + 16, 7) + sdma.trap(99))
    assert rig.cp.wait_signal(SIGNALS + 16, 7) == 7
    t0, t1 = rig.signals[8:16].view(np.uint64)[0], rig.signals[24:32].view(np.uint64)[0]
    assert t1 > t0 > 0
    assert rig.cp.interrupts == [(rig.q.name, 99)]


def test_poll_blocks_and_crosses_queues() -> None:
    """SDMA waits for a PM4 signal and PM4 waits for the SDMA fence: one run resolves both."""
    rig = Rig()
    rig.mem.map(PM4_RING, RING_BYTES)
    pq = rig.cp.pm4_queue(PM4_RING, RING_BYTES)
    rig.submit(sdma.poll_regmem(SIGNALS, 1) + sdma.copy_linear(GFX11, DEV, HOST, 333)
               + sdma.fence(GFX11, SIGNALS + 16, 1))
    assert rig.q.blocked is not None and "POLL_REGMEM on memory 0x40000000" in rig.q.blocked
    assert (rig.dev == 0).all()
    with pytest.raises(GPUHang, match="POLL_REGMEM"):
        rig.cp.drain()
    words = pm4.signal(GFX11, SIGNALS, 1) + pm4.wait_reg_mem(SIGNALS + 16, 1)
    words += pm4.signal(GFX11, SIGNALS + 32, 5)
    mem = rig.mem.load(np.array([PM4_RING], np.uint64), RING_BYTES)[0].copy()
    mem[:4 * len(words)] = np.array(words, np.uint32).view(np.uint8)
    rig.mem.store(np.array([PM4_RING], np.uint64), mem[None, :])
    pq.doorbell(len(words))
    assert rig.cp.wait_signal(SIGNALS + 32, 5) == 5
    np.testing.assert_array_equal(rig.dev[:333], rig.host[:333])
    rig.cp.drain()  # everything idle now
    assert all(q.idle for q in rig.cp.queues)


def test_poll_compare_functions() -> None:
    rig = Rig()
    rig.signals.view(np.uint32)[0] = 10
    rig.submit(sdma.poll_regmem(SIGNALS, 10, CompareFunc.EQ) + sdma.poll_regmem(SIGNALS, 11, CompareFunc.LT)
               + sdma.poll_regmem(SIGNALS, 0x8, CompareFunc.EQ, mask=0x8)
               + sdma.fence(GFX11, SIGNALS + 16, 1))
    assert rig.cp.wait_signal(SIGNALS + 16, 1) == 1
    rig.submit(sdma.poll_regmem(SIGNALS, 10, CompareFunc.GT) + sdma.fence(GFX11, SIGNALS + 16, 2))
    assert rig.q.blocked is not None and "> 10 is false" in rig.q.blocked


def test_unmapped_copy_and_missing_fence_are_reported() -> None:
    rig = Rig()
    with pytest.raises(GPUFault) as e:
        rig.submit(sdma.copy_linear(GFX11, DEV, 0x7000_0000, 64))
    assert e.value.field == "SDMA COPY_LINEAR source" and e.value.va == 0x7000_0000
    assert "not mapped" in str(e.value)
    rig = Rig()
    with pytest.raises(GPUFault, match="SDMA COPY_LINEAR destination"):
        rig.submit(sdma.copy_linear(GFX11, DEV + (1 << 16) - 10, HOST, 64))  # runs off the buffer's end
    rig = Rig()
    rig.submit(sdma.copy_linear(GFX11, DEV, HOST, 64))
    with pytest.raises(SignalTimeout, match="no RELEASE_MEM or FENCE has written it"):
        rig.cp.wait_signal(SIGNALS, 1)


def test_doorbell_misuse_is_reported() -> None:
    rig = Rig()
    with pytest.raises(GPUFault, match="more than the ring holds"):
        rig.q.doorbell(RING_BYTES + 4)
    rig = Rig()
    with pytest.raises(GPUFault, match="dword boundary"):
        rig.q.doorbell(6)
