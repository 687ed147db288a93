"""ABI tables, ioctl numbers, descriptor builders and the VA allocator (pure, no device)."""

from __future__ import annotations

import pytest

from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv import pushbuf as pb


def test_ioctl_numbers_match_worked_examples() -> None:
    a = abi.NVABI("580")
    # NV-FACTS 1.2 worked ioctl numbers (580 layouts)
    assert a.rm_request(abi.NV_ESC_RM_ALLOC, "NVOS21_PARAMETERS") == 0xC020462B
    assert a.rm_request(abi.NV_ESC_RM_ALLOC, "NVOS64_PARAMETERS") == 0xC030462B
    assert a.rm_request(abi.NV_ESC_RM_CONTROL, "NVOS54_PARAMETERS") == 0xC020462A
    assert a.rm_request(abi.NV_ESC_RM_FREE, "NVOS00_PARAMETERS") == 0xC0104629
    assert a.rm_request(abi.NV_ESC_RM_MAP_MEMORY, "nv_ioctl_nvos33_parameters_with_fd") == 0xC038464E
    assert a.rm_request(abi.NV_ESC_RM_UNMAP_MEMORY, "NVOS34_PARAMETERS") == 0xC020464F
    assert a.rm_request(abi.NV_ESC_RM_ALLOC_MEMORY, "nv_ioctl_nvos02_parameters_with_fd") == 0xC0384627
    assert a.rm_request(abi.NV_ESC_REGISTER_FD, "nv_ioctl_register_fd_t") == 0xC00446C9
    assert a.rm_request(abi.NV_ESC_CHECK_VERSION_STR, "nv_ioctl_rm_api_version_t") == 0xC04846D2
    assert abi.iowr(abi.NV_IOCTL_MAGIC, abi.NV_ESC_CARD_INFO, 64 * 72) == 0xD20046C8
    req = 0xC020462B
    assert abi.ioc_nr(req) == abi.NV_ESC_RM_ALLOC and abi.ioc_size(req) == 32


def test_layout_table_checked_and_unknown_branch_rejected() -> None:
    a = abi.NVABI("580")
    assert a.sizeof("NV_CHANNEL_ALLOC_PARAMS") == 368
    assert a.sizeof("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS") == 9264
    assert abi.driver_branch("580.159.04") == "580"
    with pytest.raises(abi.UnsupportedDriverError, match="branch 575"):
        abi.driver_branch("575.64.05")
    with pytest.raises(abi.UnsupportedDriverError):
        abi.NVABI("610")


def test_status_names() -> None:
    assert abi.status_name(0x3A) == "NV_ERR_INVALID_PARAM_STRUCT"
    assert abi.status_name(0x16) == "NV_ERR_ILLEGAL_ACTION"
    assert abi.status_name(0x68) == "NV_ERR_UVM_ADDRESS_IN_USE"
    assert abi.status_name(0x10006) == "NV_WARN_NOTHING_TO_DO"
    assert abi.status_name(0x12345) == "NV_STATUS_0x12345"


def test_method_headers_match_known_encodings() -> None:
    hopper = pb.HOST_CLASSES[abi.HOPPER_CHANNEL_GPFIFO_A]
    # NV-FACTS 4.4: SET_OBJECT subch 1; SEM 5 dwords; CE OFFSET_IN_UPPER x4; CE LAUNCH_DMA
    assert pb.set_object(pb.PushBuffer(), 1, abi.HOPPER_COMPUTE_A).words == [0x20012000, abi.HOPPER_COMPUTE_A]
    rel = pb.sem_release(pb.PushBuffer(), hopper, 0x1234_5670, 0x1234_5678_9ABC)
    assert rel.words == [0x20050017, 0x12345670, 0x0, 0x56789ABC, 0x1234, 0x03100001]
    acq = pb.sem_acquire(pb.PushBuffer(), hopper, 0x1000, 5)
    assert acq.words[-1] == 0x01000003
    copy = pb.ce_copy(pb.PushBuffer(), pb.COPY_CLASSES[abi.HOPPER_DMA_COPY_A], 0x2000, 0x1000, 100)
    assert copy.words == [0x20048100, 0, 0x1000, 0, 0x2000, 0x20018106, 100, 0x200180C0, 0x182]
    sem = pb.ce_sem_release(pb.PushBuffer(), pb.COPY_CLASSES[abi.AMPERE_DMA_COPY_B], 0x3000, 7)
    assert sem.words == [0x20048090, 0, 0x3000, 7, 0, 0x200180C0, 0x8000014]
    assert pb.PushBuffer().immd(0, pb.NVC56F_WFI, 1).words == [0x8001001E]


def test_builders_reject_out_of_range_fields() -> None:
    ampere = pb.HOST_CLASSES[abi.AMPERE_CHANNEL_GPFIFO_A]
    with pytest.raises(ValueError, match="SEM_ADDR_HI"):
        pb.sem_release(pb.PushBuffer(), ampere, 1 << 41, 1)  # C56F has an 8-bit SEM_ADDR_HI
    with pytest.raises(ValueError, match="16-byte aligned"):
        pb.sem_release(pb.PushBuffer(), ampere, 0x1008, 1)
    with pytest.raises(ValueError, match="below 2\\^40"):
        pb.GPEntry(1 << 40, 4).encode()
    with pytest.raises(ValueError, match="no 64-bit"):
        pb.ce_sem_release(pb.PushBuffer(), pb.COPY_CLASSES[abi.AMPERE_DMA_COPY_A], 0x1000, 1)


def test_gp_entry_fields() -> None:
    e = pb.GPEntry(0x12_3456_7890, 6).encode()
    assert pb.GP_ENTRY_GET.get(e) << 2 | pb.GP_ENTRY_GET_HI.get(e) << 32 == 0x12_3456_7890
    assert pb.GP_ENTRY_LENGTH.get(e) == 6 and pb.GP_ENTRY_LEVEL.get(e) == 0 and pb.GP_ENTRY_SYNC.get(e) == 0
    assert e == (0x12_3456_7890 | 6 << 42)  # NV-FACTS 4.3 summary formula


def test_libc_os_implements_the_seam() -> None:
    from rawgrad.drivers.osapi import PROT_READ, PROT_WRITE, LibcOS, OSInterface

    os_ = LibcOS()
    assert isinstance(os_, OSInterface)
    addr = os_.mmap(0, 4096, PROT_READ | PROT_WRITE, 0x22, -1, 0)  # MAP_PRIVATE | MAP_ANONYMOUS
    # the publish sequence on ordinary memory: ring of 4 entries at +0, put word at +64, doorbell at +68
    os_.gpfifo_publisher(addr, 4, addr + 64, addr + 68, 0xDEADBEEF)(1, 5)
    assert os_.mmio_read32(addr + 68) == 0xDEADBEEF and os_.mmio_read32(addr + 64) == 2
    assert os_.mmio_read32(addr + 8) == 5
    os_.munmap(addr, 4096)
    with pytest.raises(OSError, match="open\\(/nonexistent/x\\) failed: ENOENT"):
        os_.open("/nonexistent/x", 0)
