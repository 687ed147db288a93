"""The virtual-address range allocator: first fit, alignment, coalescing, reuse, errors."""
import random

import pytest

from rawgrad.hcq import OutOfVirtualMemory, VARangeAllocator

BASE = 0x10000
SIZE = 0x10000


def test_first_fit_and_reuse():
    va = VARangeAllocator(BASE, SIZE)
    a, b, c = va.alloc(0x1000), va.alloc(0x2000), va.alloc(0x1000)
    assert (a, b, c) == (BASE, BASE + 0x1000, BASE + 0x3000)
    va.free(b)
    assert va.alloc(0x1000) == b  # the freed hole is reused, not bumped past
    assert va.alloc(0x1000) == b + 0x1000
    assert va.alloc(0x100) == BASE + 0x4000


def test_alignment_keeps_head_free():
    va = VARangeAllocator(BASE, SIZE)
    va.alloc(0x10)
    x = va.alloc(0x100, alignment=0x1000)
    assert x == BASE + 0x1000
    assert va.alloc(0x20) == BASE + 0x10  # the skipped head stays usable
    with pytest.raises(ValueError, match="power of two"):
        va.alloc(0x10, alignment=3)
    with pytest.raises(ValueError, match="power of two"):
        VARangeAllocator(BASE, SIZE, alignment=6)


def test_default_alignment():
    va = VARangeAllocator(BASE, SIZE, alignment=0x100)
    assert va.alloc(1) == BASE
    assert va.alloc(1) == BASE + 0x100


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (0, 2, 1), (1, 0, 2)])
def test_coalescing_in_any_order(order):
    va = VARangeAllocator(BASE, SIZE)
    addrs = [va.alloc(0x1000) for _ in range(3)]
    for i in order:
        va.free(addrs[i])
    assert va.free_ranges() == [(BASE, SIZE)]
    assert va.alloc(SIZE) == BASE  # the whole range is one hole again


def test_exhaustion_and_fragmentation_errors():
    va = VARangeAllocator(BASE, SIZE)
    blocks = [va.alloc(0x1000) for _ in range(16)]
    with pytest.raises(OutOfVirtualMemory, match="no free virtual range"):
        va.alloc(1)
    for b in blocks[::2]:
        va.free(b)
    assert va.free_bytes == 0x8000
    with pytest.raises(OutOfVirtualMemory, match="largest hole 0x1000"):
        va.alloc(0x2000)  # enough bytes in total, but no hole is big enough
    assert isinstance(OutOfVirtualMemory("x"), MemoryError)


def test_bad_free_is_a_clear_error():
    va = VARangeAllocator(BASE, SIZE)
    a = va.alloc(0x100)
    with pytest.raises(ValueError, match="not the start of a range"):
        va.free(a + 8)
    va.free(a)
    with pytest.raises(ValueError, match="already freed"):
        va.free(a)
    with pytest.raises(ValueError):
        va.alloc(0)
    with pytest.raises(ValueError):
        VARangeAllocator(BASE, 0)


def test_random_against_model():
    rng = random.Random(1234)
    va = VARangeAllocator(BASE, 1 << 20, alignment=16)
    live: dict[int, int] = {}
    for _ in range(3000):
        if live and rng.random() < 0.45:
            addr = rng.choice(list(live))
            va.free(addr)
            del live[addr]
        else:
            size = rng.choice([16, 48, 256, 4096, 1000, 65536])
            align = rng.choice([16, 64, 4096])
            try:
                addr = va.alloc(size, alignment=align)
            except OutOfVirtualMemory:
                continue
            assert addr % align == 0 and BASE <= addr and addr + size <= BASE + (1 << 20)
            live[addr] = size
        # invariants: live ranges disjoint; free list sorted, disjoint, never adjacent, disjoint from live
        spans = sorted([(a, a + s, "L") for a, s in live.items()] +
                       [(a, a + s, "F") for a, s in va.free_ranges()])
        for (_s0, e0, k0), (s1, _, k1) in zip(spans, spans[1:]):
            assert e0 <= s1, "overlap"
            assert not (k0 == k1 == "F" and e0 == s1), "free neighbours not merged"
        assert va.allocated_bytes == sum(live.values())
        assert va.allocated_bytes + va.free_bytes == 1 << 20
    for addr in list(live):
        va.free(addr)
    assert va.free_ranges() == [(BASE, 1 << 20)]


def test_nv_driver_window_uses_this_allocator():
    """The NV driver carves every buffer, signal page and UVM channel range out of its shared CPU/GPU
    window with this allocator (page-aligned by default, 2 MiB for huge pages), and frees go back to it."""
    from rawgrad.drivers.nv.device import SMALL_PAGE, NVDevice
    from rawgrad.drivers.nv.mock import H100, MockNV

    m = MockNV(H100)
    d = NVDevice(m, gpfifo_entries=8, window_size=1 << 30, timeout_s=5.0)  # type: ignore[arg-type]
    try:
        assert isinstance(d.va, VARangeAllocator) and d.va.alignment == SMALL_PAGE
        used = d.va.allocated_bytes
        buf = d.alloc_host(SMALL_PAGE + 1)  # rounded to pages
        assert buf.va % SMALL_PAGE == 0 and d.va.size_of(buf.va) == 2 * SMALL_PAGE
        d.free(buf)
        assert d.va.allocated_bytes == used
        again = d.alloc_host(2 * SMALL_PAGE)
        assert again.va == buf.va  # the freed range is reused first-fit, not bumped past
        d.free(again)
    finally:
        d.close()
        m.shutdown()


def test_page_and_huge_page_requests_like_the_nv_driver():
    va = VARangeAllocator(0x10000, 0x100000, alignment=0x1000)
    a, b, c = va.alloc(0x1000), va.alloc(0x3000), va.alloc(0x1000)
    assert (a, b, c) == (0x10000, 0x11000, 0x14000)
    va.free(b)
    assert va.alloc(0x2000) == 0x11000  # freed range reused first-fit
    va.free(0x11000)
    va.free(a)
    va.free(c)
    assert va.allocated_bytes == 0 and va.alloc(0x100000) == 0x10000  # fully coalesced again
    with pytest.raises(MemoryError):  # OutOfVirtualMemory is a MemoryError: the NV allocator's retry sees it
        va.alloc(0x1000)
    big = VARangeAllocator(0, 1 << 30)
    assert big.alloc(0x1000, 1 << 21) == 0 and big.alloc(0x1000, 1 << 21) == 1 << 21
