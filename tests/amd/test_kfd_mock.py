"""The mock KFD (rawgrad/drivers/amd/mock/kfd.py) driven through the OS seam with the ABI builders: the
bring-up sequence of AMD-METAL-FACTS 1.2 end to end (and nothing left behind), the errno the real amdkfd
returns for each kind of bad argument, events and waits, doorbells, fault injection."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from rawgrad.drivers import osapi
from rawgrad.drivers.amd import abi, topology
from rawgrad.drivers.amd.mock.kfd import (
    GFX942,
    GFX1100,
    Memfd,
    MockBO,
    MockGPUFault,
    MockKFD,
    MockQueue,
    MockUsageError,
)

GTT_RING = (
    abi.KFD_IOC_ALLOC_MEM_FLAGS_GTT
    | abi.KFD_IOC_ALLOC_MEM_FLAGS_COHERENT
    | abi.KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED
    | abi.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
    | abi.KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE
    | abi.KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE
)
VRAM = (
    abi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM
    | abi.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
    | abi.KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE
    | abi.KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE
)
RESERVE = osapi.MAP_PRIVATE | osapi.MAP_ANONYMOUS | osapi.MAP_NORESERVE
RW = osapi.PROT_READ | osapi.PROT_WRITE


@dataclass
class Buf:
    va: int
    size: int
    handle: int
    cpu: bool


@dataclass
class Session:
    """A minimal driver: what device.py will do, written against the seam and the ABI builders only."""

    os: MockKFD
    node: topology.AMDNode
    kfd_fd: int
    drm_fd: int
    bufs: list[Buf] = field(default_factory=list)

    def run(self, call: abi.KFDCall) -> abi.KFDCall:
        self.os.ioctl(self.kfd_fd, call.request, call.args)
        return call

    def alloc(self, size: int, flags: int, *, cpu: bool = True, mapped: bool = True) -> Buf:
        va = self.os.mmap(0, size, osapi.PROT_NONE, RESERVE, -1, 0)  # reserve the VA (CPU VA == GPU VA)
        a = abi.decode_alloc(self.run(abi.alloc_memory(self.node.gpu_id, va, size, flags)))
        if cpu:
            fd = self.kfd_fd if flags & abi.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL else self.drm_fd
            assert self.os.mmap(va, size, RW, osapi.MAP_SHARED | osapi.MAP_FIXED, fd, a.mmap_offset) == va
        if mapped:
            assert abi.decode_mapped(self.run(abi.map_memory(a.handle, [self.node.gpu_id]))) == 1
        b = Buf(va, size, a.handle, cpu)
        self.bufs.append(b)
        return b

    def free(self, b: Buf, *, mapped: bool = True) -> None:
        if mapped:
            self.run(abi.unmap_memory(b.handle, [self.node.gpu_id]))
        self.run(abi.free_memory(b.handle))
        self.os.munmap(b.va, b.size)
        self.bufs.remove(b)


def open_session(kfd: MockKFD) -> Session:
    (node,) = topology.discover(kfd)
    kfd_fd = kfd.open(topology.KFD_PATH, osapi.O_RDWR | osapi.O_CLOEXEC)
    drm_fd = kfd.open(node.render_node, osapi.O_RDWR | osapi.O_CLOEXEC)
    s = Session(kfd, node, kfd_fd, drm_fd)
    assert abi.decode_version(s.run(abi.get_version())) == (1, 17)
    s.run(abi.acquire_vm(drm_fd, node.gpu_id))
    s.run(abi.runtime_enable())
    return s


@pytest.fixture
def kfd() -> Iterator[MockKFD]:
    m = MockKFD()
    yield m
    for fd in list(m.fds):  # a failing test must not leak memfds into the next
        m.close(fd)


def expect_errno(err: int, fn, *args, why: str = "") -> str:
    with pytest.raises(OSError) as ei:
        fn(*args)
    assert ei.value.errno == err, f"{ei.value} (wanted {errno.errorcode[err]})"
    assert why in str(ei.value), f"{why!r} not in {ei.value}"
    return str(ei.value)


def make_queues(s: Session) -> tuple[Buf, Buf, Buf, abi.QueueInfo, abi.QueueInfo]:
    ring = s.alloc(0x10000, GTT_RING)
    ptrs = s.alloc(0x1000, GTT_RING)  # rptr/wptr words: compute at +0/+8, SDMA at +0x80/+0x88
    eop = s.alloc(0x1000, VRAM, cpu=False)
    sdma_ring = s.alloc(0x4000, GTT_RING)
    cq = abi.decode_create_queue(
        s.run(
            abi.create_queue(
                s.node.gpu_id,
                abi.KFD_IOC_QUEUE_TYPE_COMPUTE,
                ring_base=ring.va,
                ring_size=ring.size,
                read_pointer=ptrs.va,
                write_pointer=ptrs.va + 8,
                eop_buffer=eop.va,
                eop_buffer_size=eop.size,
            )
        )
    )
    sq = abi.decode_create_queue(
        s.run(
            abi.create_queue(
                s.node.gpu_id,
                abi.KFD_IOC_QUEUE_TYPE_SDMA,
                ring_base=sdma_ring.va,
                ring_size=sdma_ring.size,
                read_pointer=ptrs.va + 0x80,
                write_pointer=ptrs.va + 0x88,
            )
        )
    )
    return ring, ptrs, eop, cq, sq


def test_bringup_sequence_runs_and_leaves_nothing_behind(kfd: MockKFD) -> None:
    memfds_before = Memfd.live
    s = open_session(kfd)
    assert kfd.runtime_enabled and kfd.vm_fd == s.drm_fd
    expect_errno(errno.EBUSY, s.run, abi.runtime_enable(), why="already enabled")
    data = s.alloc(0x4000, VRAM | abi.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC)  # CPU-visible VRAM (large BAR)
    ring, ptrs, eop, cq, sq = make_queues(s)
    doorbell_bo = s.alloc(abi.DOORBELL_PROCESS_SLICE, abi.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL)
    event_page = s.alloc(abi.EVENT_PAGE_BYTES, GTT_RING)
    sig = abi.decode_event(
        s.run(abi.create_event(abi.KFD_IOC_EVENT_SIGNAL, event_page_handle=event_page.handle))
    )
    mem_ev = abi.decode_event(s.run(abi.create_event(abi.KFD_IOC_EVENT_MEMORY, auto_reset=False)))
    hw_ev = abi.decode_event(s.run(abi.create_event(abi.KFD_IOC_EVENT_HW_EXCEPTION, auto_reset=False)))
    assert (sig.event_id, sig.slot_index, sig.trigger_data) == (0, 0, 0)
    assert mem_ev.event_id >= 0x80000000 and hw_ev.event_id == mem_ev.event_id + 1

    # queues: KFD recorded what we passed; the doorbells are distinct 8-byte words of the process slice
    q = kfd.queues[cq.queue_id]
    assert (q.ring_base, q.ring_size, q.read_pointer, q.write_pointer, q.eop_buffer) == (
        ring.va,
        ring.size,
        ptrs.va,
        ptrs.va + 8,
        eop.va,
    )
    assert kfd.queues[sq.queue_id].is_sdma and cq.doorbell_byte_offset != sq.doorbell_byte_offset
    assert (
        cq.doorbell_mmap_offset
        == sq.doorbell_mmap_offset
        == abi.KFD_MMAP_TYPE_DOORBELL | abi.kfd_mmap_gpu_id(s.node.gpu_id)
    )
    bells = kfd.mmap(0, abi.DOORBELL_PROCESS_SLICE, RW, osapi.MAP_SHARED, s.kfd_fd, cq.doorbell_mmap_offset)

    # the CPU mapping and the GPU view are the same bytes
    abi.ffi.cast("uint32_t *", data.va)[3] = 0xDEADBEEF
    assert kfd.gpu_read(data.va + 12, 4) == (0xDEADBEEF).to_bytes(4, "little")

    # a doorbell published through the seam reaches the CP hook, the write pointer word first
    rung: list[tuple[int, int, int]] = []

    def cp(queue: MockQueue, value: int) -> None:
        rung.append((queue.queue_id, value, int.from_bytes(kfd.gpu_read(queue.write_pointer, 8), "little")))

    kfd.on_doorbell = cp
    kfd.doorbell_publisher(ptrs.va + 8, bells + cq.doorbell_byte_offset)(16)
    kfd.doorbell_publisher(ptrs.va + 0x88, bells + sq.doorbell_byte_offset)(0x40)
    assert rung == [(cq.queue_id, 16, 16), (sq.queue_id, 0x40, 0x40)]
    assert kfd.unpublished_doorbells() == []

    # events: nothing signaled -> timeout; mailbox + interrupt -> complete, auto-reset re-arms the mailbox
    ev_page = abi.ffi.cast("uint64_t *", event_page.va)
    assert ev_page[sig.slot_index] == abi.UNSIGNALED_EVENT_SLOT
    t0 = time.monotonic()
    assert abi.decode_wait(s.run(abi.wait_events([sig.event_id], 20))).timed_out
    assert time.monotonic() - t0 >= 0.015
    ev_page[sig.slot_index] = sig.trigger_data
    kfd.interrupt(sig.trigger_data)
    assert abi.decode_wait(s.run(abi.wait_events([sig.event_id, mem_ev.event_id], 1000))).completed
    assert ev_page[sig.slot_index] == abi.UNSIGNALED_EVENT_SLOT
    assert abi.decode_wait(s.run(abi.wait_events([sig.event_id], 0))).timed_out

    # teardown in reverse order
    for e in (sig, mem_ev, hw_ev):
        s.run(abi.destroy_event(e.event_id))
    for qi in (cq, sq):
        s.run(abi.destroy_queue(qi.queue_id))
    kfd.munmap(bells, abi.DOORBELL_PROCESS_SLICE)
    for b in list(s.bufs):
        if b is not event_page:  # the event page lives as long as the KFD process
            s.free(b)
    expect_errno(errno.EPERM, s.run, abi.free_memory(event_page.handle), why="event page")
    s.run(abi.unmap_memory(event_page.handle, [s.node.gpu_id]))
    kfd.munmap(event_page.va, event_page.size)
    kfd.close(s.drm_fd)
    kfd.close(s.kfd_fd)
    assert kfd.auto_freed == []  # the event page is freed by the process teardown, by design
    leaks = kfd.leaks()
    assert all(v == [] for v in leaks.values()), leaks
    assert Memfd.live == memfds_before
    assert doorbell_bo not in s.bufs and kfd.calls[:5] == [
        "GET_VERSION",
        "ACQUIRE_VM",
        "RUNTIME_ENABLE",
        "RUNTIME_ENABLE",  # the refused second one
        "ALLOC_MEMORY_OF_GPU",
    ]


def test_closing_kfd_with_live_objects_reports_them(kfd: MockKFD) -> None:
    memfds_before = Memfd.live
    s = open_session(kfd)
    make_queues(s)
    kfd.close(s.drm_fd)
    kfd.close(s.kfd_fd)
    assert sum(x.startswith("queue") for x in kfd.auto_freed) == 2
    assert sum("(GPU-mapped)" in x for x in kfd.auto_freed) == 4
    assert kfd.leaks()["queues"] == [] and kfd.leaks()["allocations"] == []
    assert len(kfd.leaks()["cpu_mappings"]) == 3  # the driver never unmapped its CPU views
    for b in s.bufs:
        kfd.munmap(b.va, b.size)
    assert Memfd.live == memfds_before


def test_order_errors(kfd: MockKFD) -> None:
    (node,) = topology.discover(kfd)
    kfd_fd = kfd.open(topology.KFD_PATH, osapi.O_RDWR)
    drm_fd = kfd.open(node.render_node, osapi.O_RDWR)
    s = Session(kfd, node, kfd_fd, drm_fd)
    gtt = abi.alloc_memory(node.gpu_id, 0x10000000, 0x1000, GTT_RING)
    expect_errno(errno.ENODEV, s.run, gtt, why="call ACQUIRE_VM")
    q = abi.create_queue(
        node.gpu_id,
        abi.KFD_IOC_QUEUE_TYPE_SDMA,
        ring_base=0x1000000,
        ring_size=0x1000,
        read_pointer=0x2000000,
        write_pointer=0x2000008,
    )
    expect_errno(errno.ESRCH, s.run, q, why="no VM")
    expect_errno(errno.EINVAL, s.run, abi.acquire_vm(kfd_fd, node.gpu_id), why="not the GPU's render node")
    expect_errno(errno.EINVAL, s.run, abi.acquire_vm(drm_fd, 0x9999), why="gpu_id 0x9999")
    s.run(abi.acquire_vm(drm_fd, node.gpu_id))
    s.run(abi.acquire_vm(drm_fd, node.gpu_id))  # again with the same file: fine
    other = kfd.open(node.render_node, osapi.O_RDWR)
    expect_errno(errno.EBUSY, s.run, abi.acquire_vm(other, node.gpu_id), why="already acquired")
    expect_errno(errno.ENOTTY, kfd.ioctl, drm_fd, abi.GET_VERSION.request, abi.get_version().args)
    expect_errno(errno.EBADF, kfd.ioctl, 12345, abi.GET_VERSION.request, abi.get_version().args)


def test_memory_errors(kfd: MockKFD) -> None:
    s = open_session(kfd)
    gid = s.node.gpu_id
    c = abi.alloc_memory(gid, 0x10000000, 0x1000, GTT_RING)
    c.args.size = 0
    expect_errno(errno.EINVAL, s.run, c, why="size 0")
    mmio = abi.alloc_memory(gid, 0x10000000, 0x1000, abi.KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP)
    expect_errno(errno.EINVAL, s.run, mmio, why="MMIO_REMAP")
    c = abi.alloc_memory(gid, 0x10000000, abi.DOORBELL_PROCESS_SLICE, abi.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL)
    c.args.size = 0x1000
    expect_errno(errno.EINVAL, s.run, c, why="process doorbell slice")
    c = abi.alloc_memory(gid, 0x10000000, 0x1000, GTT_RING)
    c.args.flags |= abi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM
    expect_errno(errno.EINVAL, s.run, c, why="several memory types (mock strictness")
    c = abi.alloc_memory(gid, 0x10000000, 0x1000, GTT_RING)
    c.args.flags |= 0x100
    expect_errno(errno.EINVAL, s.run, c, why="0x100 carry bits kfd_ioctl.h does not")
    c = abi.alloc_memory(gid, 0x10000000, 0x1000, GTT_RING)
    c.args.va_addr += 0x10
    expect_errno(errno.EINVAL, s.run, c, why="not page aligned")
    expect_errno(errno.EINVAL, s.run, abi.free_memory(abi.make_handle(gid, 999)), why="not a live allocation")
    expect_errno(errno.EINVAL, s.run, abi.free_memory(abi.make_handle(0x7777, 0)), why="names gpu_id 0x7777")
    # MAP of an unknown handle is ENOMEM in amdkfd (kfd_process_device_translate_handle failing)
    expect_errno(errno.ENOMEM, s.run, abi.map_memory(abi.make_handle(gid, 999), [gid]), why="not a live")
    b = s.alloc(0x2000, GTT_RING)
    m = abi.map_memory(b.handle, [gid])
    m.args.n_devices = 0
    expect_errno(errno.EINVAL, s.run, m, why="n_devices is 0")
    expect_errno(errno.EINVAL, s.run, abi.map_memory(b.handle, [0x4242]), why="gpu_id 0x4242")
    expect_errno(errno.EBUSY, s.run, abi.free_memory(b.handle), why="still mapped")
    # a second allocation over the same VA cannot be mapped
    clash = abi.decode_alloc(s.run(abi.alloc_memory(gid, b.va, 0x1000, GTT_RING)))
    expect_errno(errno.EINVAL, s.run, abi.map_memory(clash.handle, [gid]), why="overlaps mapped")
    s.run(abi.free_memory(clash.handle))
    # CPU mappings: unknown offset, non-PUBLIC VRAM, private mapping, wrong render fd, doorbell length
    expect_errno(
        errno.EINVAL, kfd.mmap, 0, 0x1000, RW, osapi.MAP_SHARED, s.drm_fd, 0x12345000, why="no allocation"
    )
    hidden = s.alloc(0x1000, VRAM, cpu=False)
    hidden_off = kfd.bos[hidden.handle].mmap_offset
    expect_errno(errno.EPERM, kfd.mmap, 0, 0x1000, RW, osapi.MAP_SHARED, s.drm_fd, hidden_off, why="PUBLIC")
    gtt_off = kfd.bos[b.handle].mmap_offset
    expect_errno(
        errno.EINVAL, kfd.mmap, 0, 0x1000, RW, osapi.MAP_PRIVATE, s.drm_fd, gtt_off, why="MAP_SHARED"
    )
    other = kfd.open(s.node.render_node, osapi.O_RDWR)
    expect_errno(errno.EACCES, kfd.mmap, 0, 0x1000, RW, osapi.MAP_SHARED, other, gtt_off, why="ACQUIRE_VM")
    bell_off = abi.KFD_MMAP_TYPE_DOORBELL | abi.kfd_mmap_gpu_id(gid)
    expect_errno(errno.EINVAL, kfd.mmap, 0, 0x1000, RW, osapi.MAP_SHARED, s.kfd_fd, bell_off, why="slice")
    expect_errno(
        errno.EINVAL,
        kfd.mmap,
        0,
        abi.DOORBELL_PROCESS_SLICE,
        RW,
        osapi.MAP_SHARED,
        s.kfd_fd,
        abi.KFD_MMAP_TYPE_DOORBELL | abi.kfd_mmap_gpu_id(0x55),
        why="names gpu_id 0x55",
    )
    assert "EPERM" in "\n".join(kfd.log) and kfd.log[-1].startswith("mmap(/dev/kfd): EINVAL")


def test_small_bar_refuses_public_vram() -> None:
    kfd = MockKFD(replace(GFX1100, large_bar=False))
    s = open_session(kfd)
    expect_errno(
        errno.EINVAL,
        s.run,
        abi.alloc_memory(s.node.gpu_id, 0x10000000, 0x1000, VRAM | abi.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC),
        why="large BAR",
    )
    kfd.close(s.kfd_fd)


def test_vram_is_finite() -> None:
    kfd = MockKFD(replace(GFX1100, vram_bytes=0x10000))
    s = open_session(kfd)
    s.alloc(0x8000, VRAM, cpu=False)
    expect_errno(
        errno.ENOMEM, s.run, abi.alloc_memory(s.node.gpu_id, 0x20000000, 0x10000, VRAM), why="VRAM exhausted"
    )
    kfd.close(s.kfd_fd)


def _queue_call(s: Session, ring: Buf, ptrs: Buf, eop: Buf, **over: int) -> abi.KFDCall:
    c = abi.create_queue(
        s.node.gpu_id,
        abi.KFD_IOC_QUEUE_TYPE_COMPUTE,
        ring_base=ring.va,
        ring_size=ring.size,
        read_pointer=ptrs.va,
        write_pointer=ptrs.va + 8,
        eop_buffer=eop.va,
        eop_buffer_size=eop.size,
    )
    for k, v in over.items():
        setattr(c.args, k, v)
    return c


def test_queue_errors(kfd: MockKFD) -> None:
    s = open_session(kfd)
    ring, ptrs, eop = s.alloc(0x10000, GTT_RING), s.alloc(0x1000, GTT_RING), s.alloc(0x1000, VRAM, cpu=False)
    cases = [
        (dict(ring_size=0x3000), errno.EINVAL, "not a power of two"),
        (dict(queue_priority=16), errno.EINVAL, "queue_priority 16"),
        (dict(queue_percentage=101), errno.EINVAL, "queue_percentage 101"),
        (dict(queue_type=9), 524, "not a KFD queue type"),  # ENOTSUPP, as set_queue_properties_from_user
        (dict(queue_type=abi.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL), errno.EINVAL, "not emulated"),
        (dict(gpu_id=0x4242), errno.EINVAL, "gpu_id 0x4242"),
        (dict(ring_base_address=0x7000_0000_0000), errno.EINVAL, "ring 0x700000000000"),
        (dict(ring_size=0x20000), errno.EINVAL, "not inside one GPU-mapped allocation"),
        # an address no allocation holds (one just past `ptrs` may be the next allocation: VAs come from mmap)
        (dict(write_pointer_address=0x6000_0000_0000), errno.EINVAL, "write pointer"),
        (dict(eop_buffer_address=0), errno.EINVAL, "without an EOP buffer"),
        (dict(eop_buffer_size=0x800), errno.EINVAL, "eop_buffer_size 0x800"),
        (
            dict(ctx_save_restore_address=ring.va, ctx_save_restore_size=0x1000, ctl_stack_size=0x2000),
            errno.EINVAL,
            "ctl_stack_size",
        ),
    ]
    for over, err, why in cases:
        expect_errno(err, s.run, _queue_call(s, ring, ptrs, eop, **over), why=why)
    assert kfd.queues == {}
    # a ring below the minimum is clamped, and the clamped size is copied back (args are in/out)
    small = s.alloc(0x1000, GTT_RING)
    c = s.run(_queue_call(s, small, ptrs, eop, ring_size=256))
    assert c.args.ring_size == abi.KFD_MIN_QUEUE_RING_SIZE and kfd.queues[c.args.queue_id].ring_size == 1024
    # buffers a live queue uses cannot be unmapped; a queue that is gone cannot be destroyed
    expect_errno(errno.EBUSY, s.run, abi.unmap_memory(small.handle, [s.node.gpu_id]), why="backs queue 0")
    s.run(abi.destroy_queue(c.args.queue_id))
    expect_errno(errno.EINVAL, s.run, abi.destroy_queue(c.args.queue_id), why="not a live queue")
    s.run(abi.unmap_memory(small.handle, [s.node.gpu_id]))
    expect_errno(errno.EINVAL, s.run, abi.unmap_memory(small.handle, [s.node.gpu_id]), why="not mapped")


def test_event_errors(kfd: MockKFD) -> None:
    s = open_session(kfd)
    expect_errno(errno.EINVAL, s.run, abi.create_event(abi.KFD_IOC_EVENT_SIGNAL), why="before the event page")
    vram_page = s.alloc(abi.EVENT_PAGE_BYTES, VRAM, cpu=False)
    expect_errno(
        errno.EINVAL,
        s.run,
        abi.create_event(abi.KFD_IOC_EVENT_SIGNAL, event_page_handle=vram_page.handle),
        why="must be GTT",
    )
    small = s.alloc(0x1000, GTT_RING)
    expect_errno(
        errno.EINVAL,
        s.run,
        abi.create_event(abi.KFD_IOC_EVENT_SIGNAL, event_page_handle=small.handle),
        why="0x8000 needed",
    )
    page = s.alloc(abi.EVENT_PAGE_BYTES, GTT_RING)
    s.run(abi.create_event(abi.KFD_IOC_EVENT_SIGNAL, event_page_handle=page.handle))
    expect_errno(
        errno.EINVAL,
        s.run,
        abi.create_event(abi.KFD_IOC_EVENT_SIGNAL, event_page_handle=page.handle),
        why="already set",
    )
    expect_errno(errno.EINVAL, s.run, abi.wait_events([77], 0), why="event_id 0x4d")
    expect_errno(errno.EINVAL, s.run, abi.destroy_event(77), why="not a live event")
    mem = abi.decode_event(s.run(abi.create_event(abi.KFD_IOC_EVENT_MEMORY)))
    expect_errno(errno.EINVAL, s.run, abi.set_event(mem.event_id), why="not a signal event")


def test_ioctl_front_end_sizes_and_versions() -> None:
    kfd = MockKFD()
    s = open_session(kfd)
    args = abi.get_version().args
    bad = abi.ioc(abi.IOC_READ, abi.AMDKFD_IOCTL_BASE, 0x01, 4)
    msg = expect_errno(errno.EINVAL, kfd.ioctl, s.kfd_fd, bad, args, why="mock strictness")
    assert "matches no kfd_ioctl.h version" in msg and kfd.log[-1].startswith("GET_VERSION: EINVAL")
    expect_errno(
        errno.EINVAL,
        kfd.ioctl,
        s.kfd_fd,
        abi.ioc(3, abi.AMDKFD_IOCTL_BASE, 0x30, 8),
        args,
        why="outside KFD 1.17's ioctl table",
    )
    expect_errno(
        errno.EINVAL,
        kfd.ioctl,
        s.kfd_fd,
        abi.ioc(3, abi.AMDKFD_IOCTL_BASE, 0x1A, 16),
        args,
        why="does not emulate",
    )
    kfd.close(s.kfd_fd)

    # without strictness the kernel's own rule shows: a short struct is zero-filled, so a CREATE_QUEUE cut
    # before gpu_id fails on gpu_id 0 -- and the 1.11 kernel has no RUNTIME_ENABLE at all
    lax = MockKFD(version=(1, 11), strict=False)
    (node,) = topology.discover(lax)
    fd = lax.open(topology.KFD_PATH, osapi.O_RDWR)
    drm = lax.open(node.render_node, osapi.O_RDWR)
    lax.ioctl(fd, abi.ACQUIRE_VM.request, abi.acquire_vm(drm, node.gpu_id).args)
    expect_errno(
        errno.EINVAL,
        lax.ioctl,
        fd,
        abi.RUNTIME_ENABLE.request,
        abi.runtime_enable().args,
        why="outside KFD 1.11's ioctl table",
    )
    q = abi.create_queue(
        node.gpu_id,
        abi.KFD_IOC_QUEUE_TYPE_SDMA,
        ring_base=0x1000000,
        ring_size=0x1000,
        read_pointer=0x2000000,
        write_pointer=0x2000008,
    )
    short = abi.ioc(abi.IOC_READ | abi.IOC_WRITE, abi.AMDKFD_IOCTL_BASE, 0x02, 36)
    expect_errno(errno.EINVAL, lax.ioctl, fd, short, q.args, why="gpu_id 0x0 is not a GPU")
    assert q.args.gpu_id == node.gpu_id  # bytes past the caller's size are never written back
    lax.close(fd)


def test_create_queue_88_and_96_byte_forms_on_a_117_kernel(kfd: MockKFD) -> None:
    s = open_session(kfd)
    ring, ptrs = s.alloc(0x4000, GTT_RING), s.alloc(0x1000, GTT_RING)
    base = dict(ring_base=ring.va, ring_size=ring.size, read_pointer=ptrs.va, write_pointer=ptrs.va + 8)
    c88 = s.run(abi.create_queue(s.node.gpu_id, abi.KFD_IOC_QUEUE_TYPE_SDMA, **base))
    v117 = abi.ffi.new("struct kfd_ioctl_create_queue_args_v117 *")
    other = abi.create_queue(
        s.node.gpu_id,
        abi.KFD_IOC_QUEUE_TYPE_SDMA,
        **{**base, "read_pointer": ptrs.va + 64, "write_pointer": ptrs.va + 72},
    )
    abi.ffi.memmove(v117, other.args, 88)
    v117.sdma_engine_id, v117.pad = 0, 0xAAAA
    req96 = abi.ioc(abi.IOC_READ | abi.IOC_WRITE, abi.AMDKFD_IOCTL_BASE, 0x02, 96)
    kfd.ioctl(s.kfd_fd, req96, v117)
    assert c88.args.queue_id != v117.base.queue_id and len(kfd.queues) == 2


def test_wait_forever_is_woken_by_another_thread(kfd: MockKFD) -> None:
    s = open_session(kfd)
    page = s.alloc(abi.EVENT_PAGE_BYTES, GTT_RING)
    ev = abi.decode_event(s.run(abi.create_event(abi.KFD_IOC_EVENT_SIGNAL, event_page_handle=page.handle)))
    t = threading.Timer(0.05, kfd.signal_event, (ev.event_id,))
    t.start()
    w = s.run(abi.wait_events([ev.event_id], abi.KFD_EVENT_TIMEOUT_INFINITE))
    t.join()
    assert abi.decode_wait(w).completed
    s.run(abi.set_event(ev.event_id))  # SET_EVENT from the host signals too
    assert abi.decode_wait(s.run(abi.wait_events([ev.event_id], 0))).completed


def test_interrupt_needs_both_mailbox_and_interrupt(kfd: MockKFD) -> None:
    """A signal packet that forgets the interrupt, or the mailbox write, never wakes the waiter."""
    s = open_session(kfd)
    page = s.alloc(abi.EVENT_PAGE_BYTES, GTT_RING)
    ev = abi.decode_event(s.run(abi.create_event(abi.KFD_IOC_EVENT_SIGNAL, event_page_handle=page.handle)))
    kfd.interrupt(ev.trigger_data)  # interrupt, mailbox untouched
    assert abi.decode_wait(s.run(abi.wait_events([ev.event_id], 0))).timed_out
    abi.ffi.cast("uint64_t *", page.va)[ev.slot_index] = ev.trigger_data  # mailbox, no interrupt
    assert abi.decode_wait(s.run(abi.wait_events([ev.event_id], 5))).timed_out
    kfd.interrupt(0xFFFF)  # an interrupt whose ctxid names no event: KFD scans every mailbox
    assert abi.decode_wait(s.run(abi.wait_events([ev.event_id], 0))).completed


def test_injected_faults_reach_memory_and_hw_events(kfd: MockKFD) -> None:
    s = open_session(kfd)
    mem = abi.decode_event(s.run(abi.create_event(abi.KFD_IOC_EVENT_MEMORY, auto_reset=False)))
    hw = abi.decode_event(s.run(abi.create_event(abi.KFD_IOC_EVENT_HW_EXCEPTION, auto_reset=False)))
    assert abi.decode_wait(s.run(abi.wait_events([mem.event_id, hw.event_id], 0))).timed_out
    kfd.inject_memory_fault(0x7FFF_0000_1000, write=True, not_present=False)
    res = abi.decode_wait(s.run(abi.wait_events([mem.event_id], 100)), memory_event_ids=[mem.event_id])
    assert res.completed and len(res.faults) == 1
    f = res.faults[0]
    assert (f.va, f.gpu_id, f.read_only, f.not_present) == (0x7FFF_0000_1000, s.node.gpu_id, True, False)
    assert kfd.faults == [f]
    kfd.inject_hw_exception(memory_lost=True)
    w = s.run(abi.wait_events([hw.event_id], 100))
    d = w.keep[0][0].hw_exception_data
    assert abi.decode_wait(w).completed and (d.reset_cause, d.memory_lost, d.gpu_id) == (
        abi.KFD_HW_EXCEPTION_GPU_HANG,
        1,
        s.node.gpu_id,
    )


def test_doorbell_misuse_is_caught(kfd: MockKFD) -> None:
    s = open_session(kfd)
    _, ptrs, _, cq, _ = make_queues(s)
    bells = kfd.mmap(0, abi.DOORBELL_PROCESS_SLICE, RW, osapi.MAP_SHARED, s.kfd_fd, cq.doorbell_mmap_offset)
    with pytest.raises(MockUsageError, match="its write pointer is"):
        kfd.doorbell_publisher(ptrs.va + 0x100, bells + cq.doorbell_byte_offset)
    with pytest.raises(MockUsageError, match="not inside a mapped doorbell slice"):
        kfd.doorbell_publisher(ptrs.va + 8, ptrs.va)
    with pytest.raises(MockUsageError, match="belongs to no live queue"):
        kfd.doorbell_publisher(ptrs.va + 8, bells + 0x1F8)
    publish = kfd.doorbell_publisher(ptrs.va + 8, bells + cq.doorbell_byte_offset)
    abi.ffi.cast("uint64_t *", bells + cq.doorbell_byte_offset)[0] = 4  # a store that bypassed the seam
    assert kfd.unpublished_doorbells() == [cq.queue_id]
    publish(8)
    assert kfd.unpublished_doorbells() == [] and kfd.queues[cq.queue_id].doorbell_writes == 1
    s.run(abi.destroy_queue(cq.queue_id))
    with pytest.raises(MockUsageError, match="destroyed queue"):
        publish(12)
    kfd.munmap(bells, abi.DOORBELL_PROCESS_SLICE)


def test_gpu_view_userptr_and_faults(kfd: MockKFD) -> None:
    s = open_session(kfd)
    host = kfd.mmap(0, 0x2000, RW, osapi.MAP_PRIVATE | osapi.MAP_ANONYMOUS, -1, 0)
    va = kfd.mmap(0, 0x2000, osapi.PROT_NONE, RESERVE, -1, 0)
    a = abi.decode_alloc(
        s.run(abi.alloc_memory(s.node.gpu_id, va, 0x2000, abi.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR, userptr=host))
    )
    assert a.mmap_offset == host
    with pytest.raises(MockGPUFault, match="not inside one GPU-mapped allocation"):
        kfd.gpu_read(va, 4)  # allocated but not yet mapped on the GPU
    s.run(abi.map_memory(a.handle, [s.node.gpu_id]))
    kfd.gpu_write(va + 0x1000, b"\x01\x02\x03\x04")  # the GPU writes through its VA into the user's pages
    assert bytes(abi.ffi.buffer(abi.ffi.cast("char *", host + 0x1000), 4)) == b"\x01\x02\x03\x04"
    with pytest.raises(MockGPUFault, match="0x"):
        kfd.translate(va + 0x1FFC, 8)  # runs past the allocation
    s.run(abi.unmap_memory(a.handle, [s.node.gpu_id]))
    s.run(abi.free_memory(a.handle))
    kfd.munmap(host, 0x2000)
    kfd.munmap(va, 0x2000)


def test_gfx942_profile_brings_up() -> None:
    m = MockKFD(GFX942)
    s = open_session(m)
    assert s.node.target == "gfx942" and s.node.wave_size == 64
    _, _, _, cq, sq = make_queues(s)
    assert cq.queue_id != sq.queue_id
    m.close(s.drm_fd)
    m.close(s.kfd_fd)
    assert len(m.auto_freed) == 6  # two queues and four mapped buffers, freed with the process
    for b in s.bufs:
        m.munmap(b.va, b.size)
    assert m.leaks()["cpu_mappings"] == []


def test_sysfs_is_read_only_and_unknown_paths_do_not_exist(kfd: MockKFD) -> None:
    expect_errno(errno.EACCES, kfd.open, f"{topology.NODES_DIR}/1/properties", osapi.O_RDWR, why="read-only")
    expect_errno(errno.ENOENT, kfd.open, "/dev/dri/renderD200", osapi.O_RDWR)
    assert kfd.exists(topology.NODES_DIR) and kfd.exists(f"{topology.NODES_DIR}/1")
    assert not kfd.exists(f"{topology.NODES_DIR}/2")


def test_hooks_mirror_queues_and_gpu_mappings_for_a_cp_model(kfd: MockKFD) -> None:
    """A CP model keeps its address space and queue list in step through on_gpu_map / on_queue, and can
    share the allocations' bytes without copying (host_buffer)."""
    mapped: dict[int, object] = {}
    queues: list[tuple[int, bool]] = []

    def on_gpu_map(bo: MockBO, on: bool) -> None:
        if on:
            mapped[bo.va] = kfd.host_buffer(bo.va, bo.size)
        else:
            del mapped[bo.va]

    kfd.on_gpu_map = on_gpu_map
    kfd.on_queue = lambda q, on: queues.append((q.queue_id, on))
    s = open_session(kfd)
    ring, ptrs, eop, cq, sq = make_queues(s)
    assert set(mapped) == {b.va for b in s.bufs} == {bo.va for bo in kfd.gpu_mappings()}
    assert queues == [(cq.queue_id, True), (sq.queue_id, True)]
    view = np.frombuffer(mapped[ring.va], np.uint32)
    abi.ffi.cast("uint32_t *", ring.va)[5] = 0xC0DE  # the driver writes a packet word through its CPU map
    assert view[5] == 0xC0DE  # the CP model sees it in place
    view[6] = 0xBEEF  # and the CP's writes (a read pointer, a signal) reach the driver
    assert abi.ffi.cast("uint32_t *", ring.va)[6] == 0xBEEF
    s.run(abi.destroy_queue(sq.queue_id))
    kfd.close(s.drm_fd)
    kfd.close(s.kfd_fd)  # teardown reports the rest through the hooks too
    assert queues[-2:] == [(sq.queue_id, False), (cq.queue_id, False)] and mapped == {}
    for b in s.bufs:
        kfd.munmap(b.va, b.size)


def test_clock_counters_and_memory_policy(kfd: MockKFD) -> None:
    s = open_session(kfd)
    c1 = abi.decode_clock_counters(s.run(abi.get_clock_counters(s.node.gpu_id)))
    time.sleep(0.01)
    c2 = abi.decode_clock_counters(s.run(abi.get_clock_counters(s.node.gpu_id)))
    assert c1.system_freq == 1_000_000_000
    # 100 MHz GPU counter: 10 ms is about 1e6 ticks; the CPU counter is in ns
    assert 0.9e6 <= c2.gpu - c1.gpu <= 1e8 and 9e6 <= c2.cpu_ns - c1.cpu_ns <= 1e9
    other = abi.get_clock_counters(s.node.gpu_id)
    other.args.gpu_id = 0x4242
    assert s.run(other).args.gpu_clock_counter == 0  # a GPU this process lacks reads 0, as in amdkfd
    s.run(abi.set_memory_policy(s.node.gpu_id, abi.KFD_IOC_CACHE_POLICY_NONCOHERENT))
    assert kfd.memory_policy == (abi.KFD_IOC_CACHE_POLICY_NONCOHERENT, abi.KFD_IOC_CACHE_POLICY_COHERENT)
    bad = abi.set_memory_policy(s.node.gpu_id)
    bad.args.default_policy = 2
    expect_errno(errno.EINVAL, s.run, bad, why="neither COHERENT nor NONCOHERENT")
