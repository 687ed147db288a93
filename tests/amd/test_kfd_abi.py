"""The KFD ABI (rawgrad/drivers/amd/abi.py): request numbers, struct layouts and flag values against
../shared/AMD-METAL-FACTS.md section 1.2 (numbers the facts computed with gcc from kfd_ioctl.h 1.11 and 1.17),
against the system's own kfd_ioctl.h when gcc and the header are here, and the builders' argument checks."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from rawgrad.drivers import osapi
from rawgrad.drivers.amd import abi

# AMD-METAL-FACTS 1.2, table "ioctl | request | nr | size"
FACTS_REQUESTS = {
    "GET_VERSION": 0x80084B01,
    "CREATE_QUEUE": 0xC0584B02,
    "DESTROY_QUEUE": 0xC0084B03,
    "GET_CLOCK_COUNTERS": 0xC0284B05,
    "CREATE_EVENT": 0xC0204B08,
    "WAIT_EVENTS": 0xC0184B0C,
    "ACQUIRE_VM": 0x40084B15,
    "ALLOC_MEMORY_OF_GPU": 0xC0284B16,
    "FREE_MEMORY_OF_GPU": 0x40084B17,
    "MAP_MEMORY_TO_GPU": 0xC0184B18,
    "UNMAP_MEMORY_FROM_GPU": 0xC0184B19,
    "RUNTIME_ENABLE": 0xC0104B25,
}


def test_request_numbers_match_the_facts_table() -> None:
    by_name = {i.name: i for i in abi.IOCTLS.values()}
    for name, want in FACTS_REQUESTS.items():
        assert by_name[name].request == want, f"{name}: {by_name[name].request:#x} != {want:#x}"
        assert abi.ioc_nr(want) == by_name[name].nr and abi.ioc_size(want) == by_name[name].size
    # the 1.17 CREATE_QUEUE (96 bytes) encodes to the facts' second number
    assert (
        abi.ioc(
            abi.IOC_READ | abi.IOC_WRITE,
            abi.AMDKFD_IOCTL_BASE,
            0x02,
            abi.sizeof("kfd_ioctl_create_queue_args_v117"),
        )
        == 0xC0604B02
    )


def test_struct_layouts_match_the_facts() -> None:
    ffi = abi.ffi
    off = lambda s, f: ffi.offsetof(f"struct {s}", f)
    cq = "kfd_ioctl_create_queue_args"
    assert ffi.sizeof(f"struct {cq}") == 88
    assert [
        off(cq, f)
        for f in (
            "ring_base_address",
            "write_pointer_address",
            "read_pointer_address",
            "doorbell_offset",
            "ring_size",
            "gpu_id",
            "queue_type",
            "queue_percentage",
            "queue_priority",
            "queue_id",
            "eop_buffer_address",
            "eop_buffer_size",
            "ctx_save_restore_address",
            "ctx_save_restore_size",
            "ctl_stack_size",
        )
    ] == [0, 8, 16, 24, 32, 36, 40, 44, 48, 52, 56, 64, 72, 80, 84]
    assert off("kfd_ioctl_create_queue_args_v117", "sdma_engine_id") == 88
    al = "kfd_ioctl_alloc_memory_of_gpu_args"
    assert [off(al, f) for f in ("va_addr", "size", "handle", "mmap_offset", "gpu_id", "flags")] == [
        0,
        8,
        16,
        24,
        32,
        36,
    ]
    mp = "kfd_ioctl_map_memory_to_gpu_args"
    assert [off(mp, f) for f in ("handle", "device_ids_array_ptr", "n_devices", "n_success")] == [
        0,
        8,
        16,
        20,
    ]
    ev = "kfd_ioctl_create_event_args"
    assert [
        off(ev, f)
        for f in (
            "event_page_offset",
            "event_trigger_data",
            "event_type",
            "auto_reset",
            "node_id",
            "event_id",
            "event_slot_index",
        )
    ] == [0, 8, 12, 16, 20, 24, 28]
    we = "kfd_ioctl_wait_events_args"
    assert [off(we, f) for f in ("events_ptr", "num_events", "wait_for_all", "timeout", "wait_result")] == [
        0,
        8,
        12,
        16,
        20,
    ]
    assert ffi.sizeof("struct kfd_event_data") == 48 and off("kfd_event_data", "event_id") == 40


def test_flag_and_type_values_match_the_facts() -> None:
    assert (
        abi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_GTT,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_MMIO_REMAP,
    ) == (1, 2, 4, 8, 0x10)
    assert (
        abi.KFD_IOC_ALLOC_MEM_FLAGS_AQL_QUEUE_MEM,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_COHERENT,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_NO_SUBSTITUTE,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE,
        abi.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE,
    ) == (0x8000000, 0x2000000, 0x4000000, 0x10000000, 0x20000000, 0x40000000, 0x80000000)
    assert (
        abi.KFD_IOC_QUEUE_TYPE_COMPUTE,
        abi.KFD_IOC_QUEUE_TYPE_SDMA,
        abi.KFD_IOC_QUEUE_TYPE_COMPUTE_AQL,
    ) == (0, 1, 2)
    assert (abi.KFD_IOC_EVENT_SIGNAL, abi.KFD_IOC_EVENT_HW_EXCEPTION, abi.KFD_IOC_EVENT_MEMORY) == (0, 3, 8)
    assert abi.EVENT_PAGE_BYTES == 0x8000 and abi.DOORBELL_PROCESS_SLICE == 0x2000


_HEADER = Path("/usr/include/linux/kfd_ioctl.h")


@pytest.mark.skipif(not (_HEADER.exists() and shutil.which("gcc")), reason="needs gcc and linux/kfd_ioctl.h")
def test_against_the_system_kfd_ioctl_h(tmp_path: Path) -> None:
    """Every request number and struct size we encode equals what gcc computes from the installed header."""
    (tmp_path / "drm").mkdir()
    (tmp_path / "drm" / "drm.h").write_text("#include <linux/types.h>\n")  # the header needs only __u32/__u64
    lines = [
        f'printf("{i.name} %lu %lu\\n", (unsigned long)AMDKFD_IOC_{i.name}, '
        f"(unsigned long)sizeof(struct {i.ctype}));"
        for i in abi.IOCTLS.values()
        if i.min_version <= (1, 11)
    ]
    src = tmp_path / "k.c"
    src.write_text(
        "#include <stdio.h>\n#include <linux/kfd_ioctl.h>\nint main(void){" + "".join(lines) + "}\n"
    )
    exe = tmp_path / "k"
    subprocess.run(["gcc", "-Ulinux", f"-I{tmp_path}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    got = {n: (int(r), int(s)) for n, r, s in (line.split() for line in out if line)}
    by_name = {i.name: i for i in abi.IOCTLS.values()}
    assert len(got) == 14
    for name, (request, size) in got.items():
        assert (by_name[name].request, by_name[name].size) == (request, size), name


def test_ioc_encoding_round_trips_and_bounds() -> None:
    r = abi.ioc(abi.IOC_READ | abi.IOC_WRITE, ord("K"), 0x16, 40)
    assert (abi.ioc_dir(r), abi.ioc_type(r), abi.ioc_nr(r), abi.ioc_size(r)) == (3, ord("K"), 0x16, 40)
    with pytest.raises(ValueError, match="14-bit size"):
        abi.ioc(abi.IOC_READ, ord("K"), 1, 1 << 14)


def test_handles_and_mmap_offsets() -> None:
    assert abi.make_handle(0x1A2B, 7) == 0x1A2B00000007 and abi.handle_gpu_id(0x1A2B00000007) == 0x1A2B
    off = abi.KFD_MMAP_TYPE_DOORBELL | abi.kfd_mmap_gpu_id(0x1A2B) | 0x18
    assert abi.mmap_offset_gpu_id(off) == 0x1A2B
    q = abi.QueueInfo(3, off)
    assert q.doorbell_byte_offset == 0x18 and q.doorbell_mmap_offset == off - 0x18
    assert abi.kfd_mmap_gpu_id(0x12345) == abi.kfd_mmap_gpu_id(0x2345)  # 16-bit field, as the kernel masks


def test_alloc_builder_rejects_bad_arguments() -> None:
    gtt, vram = abi.KFD_IOC_ALLOC_MEM_FLAGS_GTT, abi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM
    call = abi.alloc_memory(0x1A2B, 0x10000, 0x2000, gtt | abi.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)
    assert call.request == FACTS_REQUESTS["ALLOC_MEMORY_OF_GPU"]
    assert (call.args.va_addr, call.args.size, call.args.gpu_id) == (0x10000, 0x2000, 0x1A2B)
    with pytest.raises(ValueError, match="exactly one memory type"):
        abi.alloc_memory(0x1A2B, 0x10000, 0x1000, gtt | vram)
    with pytest.raises(ValueError, match="exactly one memory type"):
        abi.alloc_memory(0x1A2B, 0x10000, 0x1000, abi.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE)
    with pytest.raises(ValueError, match="multiple of the page size"):
        abi.alloc_memory(0x1A2B, 0x10000, 0x1001, gtt)
    with pytest.raises(ValueError, match="not page aligned"):
        abi.alloc_memory(0x1A2B, 0x10010, 0x1000, gtt)
    with pytest.raises(ValueError, match="doorbell slice"):
        abi.alloc_memory(0x1A2B, 0x10000, 0x1000, abi.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL)
    with pytest.raises(ValueError, match="USERPTR needs"):
        abi.alloc_memory(0x1A2B, 0x10000, 0x1000, abi.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR)
    with pytest.raises(ValueError, match="only meaningful with the USERPTR"):
        abi.alloc_memory(0x1A2B, 0x10000, 0x1000, gtt, userptr=0x20000)
    with pytest.raises(ValueError, match="unknown bits"):
        abi.alloc_memory(0x1A2B, 0x10000, 0x1000, gtt | 0x100)
    with pytest.raises(ValueError, match="not a KFD gpu_id"):
        abi.alloc_memory(0, 0x10000, 0x1000, gtt)


def test_queue_builder_rejects_bad_arguments() -> None:
    ok = dict(
        ring_base=0x100000,
        ring_size=0x10000,
        read_pointer=0x200000,
        write_pointer=0x200008,
        eop_buffer=0x300000,
        eop_buffer_size=0x1000,
    )
    call = abi.create_queue(0x1A2B, abi.KFD_IOC_QUEUE_TYPE_COMPUTE, **ok)
    assert (call.args.ring_size, call.args.queue_priority, call.args.queue_percentage) == (0x10000, 7, 100)
    with pytest.raises(ValueError, match="power of two"):
        abi.create_queue(0x1A2B, abi.KFD_IOC_QUEUE_TYPE_COMPUTE, **{**ok, "ring_size": 0x3000})
    with pytest.raises(ValueError, match="EOP buffer"):
        abi.create_queue(0x1A2B, abi.KFD_IOC_QUEUE_TYPE_COMPUTE, **{**ok, "eop_buffer": 0})
    with pytest.raises(ValueError, match="no EOP buffer"):
        abi.create_queue(0x1A2B, abi.KFD_IOC_QUEUE_TYPE_SDMA, **ok)
    with pytest.raises(ValueError, match="priority=16"):
        abi.create_queue(0x1A2B, abi.KFD_IOC_QUEUE_TYPE_COMPUTE, **ok, priority=16)
    with pytest.raises(ValueError, match="queue_type=7"):
        abi.create_queue(0x1A2B, 7, **ok)
    with pytest.raises(ValueError, match="go together"):
        abi.create_queue(0x1A2B, abi.KFD_IOC_QUEUE_TYPE_COMPUTE, **ok, ctx_save_restore=0x400000)


def test_event_and_map_builders() -> None:
    with pytest.raises(ValueError, match="gpu_id list is empty"):
        abi.map_memory(0x1A2B00000000, [])
    m = abi.map_memory(0x1A2B00000000, [0x1A2B])
    ids = abi.ffi.cast("uint32_t *", int(m.args.device_ids_array_ptr))
    assert (m.args.n_devices, ids[0]) == (1, 0x1A2B)  # the id array is kept alive by the call
    with pytest.raises(ValueError, match="event_type=42"):
        abi.create_event(42)
    with pytest.raises(ValueError, match="at least one event"):
        abi.wait_events([], 10)
    w = abi.wait_events([5, 0x80000001], 250, wait_for_all=True)
    data = w.keep[0]
    assert (w.args.num_events, w.args.timeout, w.args.wait_for_all, data[1].event_id) == (
        2,
        250,
        1,
        0x80000001,
    )
    # a memory event's payload decodes into a MemoryFault naming the VA and the cause
    d = data[1].memory_exception_data
    d.va, d.gpu_id, d.failure.ReadOnly = 0x7F0000001000, 0x1A2B, 1
    res = abi.decode_wait(w, memory_event_ids=[0x80000001])
    assert res.faults == (abi.MemoryFault(0x7F0000001000, 0x1A2B, False, True, False, False, 0),)
    assert "0x7f0000001000" in str(res.faults[0]) and "read-only" in str(res.faults[0])


def test_libc_seam_takes_offsets_with_bit_63_set() -> None:
    """KFD doorbell offsets have bits 63:62 set; LibcOS must pass them on (as the same 64 bits), not raise."""
    os_ = osapi.LibcOS()
    off = abi.KFD_MMAP_TYPE_DOORBELL  # anonymous maps ignore the offset, so this only exercises the call
    addr = os_.mmap(
        0, 4096, osapi.PROT_READ | osapi.PROT_WRITE, osapi.MAP_PRIVATE | osapi.MAP_ANONYMOUS, -1, off
    )
    os_.munmap(addr, 4096)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 publisher only")
def test_libc_doorbell_publisher_stores_write_pointer_and_doorbell() -> None:
    os_ = osapi.LibcOS()
    assert isinstance(os_, osapi.DoorbellOS)
    words = abi.ffi.new("uint64_t[2]")
    base = int(abi.ffi.cast("uintptr_t", words))
    os_.doorbell_publisher(base, base + 8)(0x1234_5678_9ABC)
    assert (words[0], words[1]) == (0x1234_5678_9ABC, 0x1234_5678_9ABC)
