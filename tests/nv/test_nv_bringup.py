"""Bring-up RM/UVM call sequence on both mock GPUs, ABI error paths, and leak-free teardown."""

from __future__ import annotations

import errno

import cffi
import numpy as np
import pytest

from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.mock import AMPERE, H100, GPUProfile, MockNV
from rawgrad.drivers.nv.rm import UVM, NVError, RMClient

from .conftest import make_device

_ffi = cffi.FFI()


def _clean(m: MockNV) -> None:
    assert all(not v for v in m.leaks().values()), m.leaks()


def expected_sequence(p: GPUProfile) -> list[str]:
    um, gp = abi.CLASS_NAMES[p.usermode_classes[0]], abi.CLASS_NAMES[p.gpfifo_classes[0]]
    seq = [
        "NV_ESC_CHECK_VERSION_STR",
        "NV_ESC_RM_ALLOC NV01_ROOT_CLIENT",
        "UVM_INITIALIZE",
        "UVM_MM_INITIALIZE",
        "NV_ESC_CARD_INFO",
        "NV_ESC_REGISTER_FD",
        "NV_ESC_RM_CONTROL NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2",
        "NV_ESC_RM_ALLOC NV01_DEVICE_0",
        "NV_ESC_RM_ALLOC NV20_SUBDEVICE_0",
        "NV_ESC_RM_CONTROL NV0080_CTRL_CMD_GPU_GET_CLASSLIST",
        "NV_ESC_RM_CONTROL NV0080_CTRL_CMD_GPU_GET_CLASSLIST",
        f"NV_ESC_RM_ALLOC {um}",
        "NV_ESC_REGISTER_FD",
        "NV_ESC_RM_MAP_MEMORY",
        "NV_ESC_RM_ALLOC FERMI_VASPACE_A",
        "NV_ESC_RM_CONTROL NV2080_CTRL_CMD_GPU_GET_GID_INFO",
        "UVM_REGISTER_GPU",
        "UVM_REGISTER_GPU_VASPACE",
        "NV_ESC_RM_CONTROL NV2080_CTRL_CMD_GR_GET_INFO",
        "NV_ESC_RM_ALLOC_MEMORY NV01_MEMORY_SYSTEM_OS_DESCRIPTOR",
        "UVM_CREATE_EXTERNAL_RANGE",
        "UVM_MAP_EXTERNAL_ALLOCATION",
        "NV_ESC_RM_ALLOC KEPLER_CHANNEL_GROUP_A",
        "NV_ESC_RM_ALLOC FERMI_CONTEXT_SHARE_A",
        "NV_ESC_RM_ALLOC NV01_MEMORY_LOCAL_USER",
        "NV_ESC_REGISTER_FD",
        "NV_ESC_RM_MAP_MEMORY",
        "UVM_CREATE_EXTERNAL_RANGE",
        "UVM_MAP_EXTERNAL_ALLOCATION",
    ]
    for engine in (p.compute_classes[0], p.copy_classes[0]):
        seq += [
            "NV_ESC_RM_ALLOC NV01_MEMORY_SYSTEM",
            "NV_ESC_RM_MAP_MEMORY",
            f"NV_ESC_RM_ALLOC {gp}",
            f"NV_ESC_RM_ALLOC {abi.CLASS_NAMES[engine]}",
            "NV_ESC_RM_CONTROL NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN",
            "UVM_REGISTER_CHANNEL",
            "NV_ESC_RM_ALLOC NV01_MEMORY_LOCAL_USER",
            "NV_ESC_REGISTER_FD",
            "NV_ESC_RM_MAP_MEMORY",
            "UVM_CREATE_EXTERNAL_RANGE",
            "UVM_MAP_EXTERNAL_ALLOCATION",
        ]
    return seq + ["NV_ESC_RM_CONTROL NVA06C_CTRL_CMD_GPFIFO_SCHEDULE"]


def test_bringup_sequence_and_classes(mock: MockNV, profile: GPUProfile) -> None:
    d = make_device(mock)
    try:
        assert mock.calls == expected_sequence(profile)
        assert d.driver_version == "580.159.04" and d.abi.branch == "580"
        assert d.compute_class == profile.compute_classes[0] and d.copy_class == profile.copy_classes[0]
        assert d.gpfifo_class == profile.gpfifo_classes[0] and d.usermode_class == profile.usermode_classes[0]
        assert d.gr_info["sm_version"] == profile.sm_version and d.uuid == profile.uuid
        assert d.compute.token != d.copy.token
        assert d.timeline_value == 2 and d.compute.submissions == 1 and d.copy.submissions == 1
        t0 = d.read_timer_ns()
        assert 0 < t0 <= d.read_timer_ns()
        n = len(mock.calls)
    finally:
        d.close()
    frees = mock.calls[n:]
    assert frees[-1] == "NV_ESC_RM_FREE NV01_ROOT_CLIENT"
    assert frees.count("UVM_UNREGISTER_CHANNEL") == 2 and "UVM_UNREGISTER_GPU" in frees
    assert sum(c.startswith("NV_ESC_RM_FREE") for c in frees) == sum(
        c.startswith(("NV_ESC_RM_ALLOC ", "NV_ESC_RM_ALLOC_MEMORY")) for c in mock.calls[:n]
    )
    _clean(mock)


def test_mock_implements_the_seam() -> None:
    """The mock behind the OSInterface seam does what the real calls do, checked by effect (a Protocol
    isinstance check only compares method names)."""
    from rawgrad.drivers import osapi

    m = MockNV(H100)
    try:
        assert isinstance(m, osapi.OSInterface)
        assert m.exists("/dev/nvidiactl") and m.exists("/dev/nvidia-uvm") and not m.exists("/dev/nvidia7")
        with pytest.raises(OSError, match="open\\(/dev/nvidia7\\).*ENOENT"):
            m.open("/dev/nvidia7", 0)
        fd = m.open("/dev/nvidiactl", 0)
        with pytest.raises(OSError, match="EINVAL"):
            m.read(fd, 4)
        m.close(fd)
        with pytest.raises(OSError, match=f"close\\({fd}\\).*EBADF"):
            m.close(fd)
        with make_device(m) as d:
            # the publish sequence: ring entry, fence, GP_PUT = slot + 1, fence, token to the doorbell
            ring = m.mmap(0, 4096, osapi.PROT_READ | osapi.PROT_WRITE, 0x22, -1, 0)  # private anonymous
            fences, unknown = m.fence_count, list(m.gpu.unknown_doorbells)
            m.gpfifo_publisher(ring, 4, ring + 64, d.doorbell_addr, 0xBAD)(3, 0x1234_5678_9ABC)
            words = np.frombuffer(_ffi.buffer(_ffi.cast("char *", ring), 72), np.uint32)
            assert int(words[6]) | int(words[7]) << 32 == 0x1234_5678_9ABC  # ring[3]
            assert words[16] == 0  # GP_PUT wrapped: (3 + 1) % 4
            assert m.fence_count == fences + 2
            assert m.gpu.unknown_doorbells == [*unknown, 0xBAD]  # the doorbell reached the GPU, token intact
            m.munmap(ring, 4096)
            t0 = d.read_timer_ns()  # usermode MMIO reads: the GPU timer, advancing
            assert 0 < t0 <= d.read_timer_ns()
        _clean(m)
    finally:
        m.shutdown()


def test_hopper_picks_only_hopper_engines() -> None:
    m = MockNV(H100)
    try:
        with make_device(m) as d:
            assert (d.compute_class, d.copy_class, d.gpfifo_class) == (0xCBC0, 0xC8B5, 0xC86F)
            assert d.usermode_class == 0xC661
        _clean(m)
    finally:
        m.shutdown()


def test_missing_engine_class_fails_cleanly() -> None:
    no_copy = GPUProfile(**{**AMPERE.__dict__, "copy_classes": ()})
    m = MockNV(no_copy)
    with pytest.raises(NVError, match="class selection \\(copy\\)"):
        make_device(m)
    _clean(m)  # everything created before the failure was freed again
    m.shutdown()


def test_unknown_driver_branch_is_rejected() -> None:
    m = MockNV(H100, version="575.64.05")
    with pytest.raises(abi.UnsupportedDriverError, match="575"):
        make_device(m)
    _clean(m)


def test_va_window_collision_moves_to_next_base(mock: MockNV) -> None:
    a = make_device(mock)
    m2 = MockNV(mock.profile)
    try:
        b = make_device(m2)  # same preferred base, already reserved by `a` in this process
        assert b.window_base != a.window_base
        b.close()
    finally:
        a.close()
        m2.shutdown()
    _clean(mock)
    _clean(m2)


# --- the mock enforces the real driver's checks ------------------------------------------------
@pytest.fixture
def rm(mock: MockNV):  # type: ignore[no-untyped-def]
    fd = mock.open("/dev/nvidiactl", 0)
    client = RMClient(mock, fd, abi.abi_for_branch("580"))
    yield client
    client.free(client.root)
    mock.close(fd)
    _clean(mock)


def test_wrong_ioctl_size_is_einval(mock: MockNV, rm: RMClient) -> None:
    p = rm.abi.new("NVOS21_PARAMETERS", hRoot=rm.root, hObjectParent=rm.root, hClass=abi.NV01_DEVICE_0)
    bad = abi.iowr(abi.NV_IOCTL_MAGIC, abi.NV_ESC_RM_ALLOC, 40)  # neither NVOS21 (32) nor NVOS64 (48)
    with pytest.raises(OSError) as e:
        mock.ioctl(rm.ctl_fd, bad, p)
    assert e.value.errno == errno.EINVAL and "NV_ESC_RM_ALLOC" in str(e.value)


def test_control_with_wrong_params_size(mock: MockNV, rm: RMClient) -> None:
    small = rm.abi.ffi.new("uint8_t[28]")  # GET_ID_INFO_V2 params are 32 bytes
    p = rm.abi.new(
        "NVOS54_PARAMETERS",
        hClient=rm.root,
        hObject=rm.root,
        cmd=abi.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
        params=rm.abi.addr(small),
        paramsSize=28,
    )
    mock.ioctl(rm.ctl_fd, rm.abi.rm_request(abi.NV_ESC_RM_CONTROL, "NVOS54_PARAMETERS"), p)
    assert p.status == abi.NV_STATUS["NV_ERR_INVALID_PARAM_STRUCT"]


def test_rm_errors_name_call_and_status(rm: RMClient) -> None:
    with pytest.raises(NVError, match="NV01_DEVICE_0.*NV_ERR_INVALID_OBJECT_PARENT") as e:
        rm.alloc(0xDEAD, abi.NV01_DEVICE_0, rm.abi.new("NV0080_ALLOC_PARAMETERS"))
    assert e.value.status == 0x36
    with pytest.raises(NVError, match="NV_ERR_INVALID_CLASS"):
        rm.alloc(rm.root, 0xC0DE)
    with pytest.raises(NVError, match="GPU_GET_ID_INFO_V2.*on 0xbad.*NV_ERR_INVALID_OBJECT_HANDLE"):
        rm.control(
            0xBAD, abi.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, rm.abi.new("NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS")
        )
    dev = rm.alloc(rm.root, abi.NV01_DEVICE_0, rm.abi.new("NV0080_ALLOC_PARAMETERS"))
    with pytest.raises(NVError, match="NV_ERR_NOT_SUPPORTED"):  # a subdevice control sent to the device
        rm.control(dev, abi.NV2080_CTRL_CMD_GR_GET_INFO, rm.abi.new("NV2080_CTRL_GR_GET_INFO_PARAMS"))
    with pytest.raises(NVError, match="NV_ESC_RM_FREE.*NV_ERR_INVALID_OBJECT_HANDLE"):
        rm.free(0x1234)
    with pytest.raises(TypeError, match="NV0080_ALLOC_PARAMETERS"):
        rm.alloc(rm.root, abi.NV01_DEVICE_0, rm.abi.new("NV2080_ALLOC_PARAMETERS"))
    rm.free(dev)


def test_uvm_before_initialize_is_illegal(mock: MockNV) -> None:
    fd = mock.open("/dev/nvidia-uvm", 0)
    uvm = UVM(mock, fd, abi.abi_for_branch("580"))
    with pytest.raises(NVError, match="UVM_CREATE_EXTERNAL_RANGE failed: NV_ERR_ILLEGAL_ACTION"):
        uvm.create_external_range(0x100000, 0x1000)
    uvm.initialize()
    uvm.create_external_range(0x100000, 0x1000)
    with pytest.raises(NVError, match="NV_ERR_UVM_ADDRESS_IN_USE"):
        uvm.create_external_range(0x100000, 0x2000)
    uvm.free(0x100000, 0x1000)
    mock.close(fd)
    _clean(mock)


def test_fd_close_reports_what_the_driver_leaked(mock: MockNV) -> None:
    fd = mock.open("/dev/nvidiactl", 0)
    rm = RMClient(mock, fd, abi.abi_for_branch("580"))
    rm.alloc(rm.root, abi.NV01_DEVICE_0, rm.abi.new("NV0080_ALLOC_PARAMETERS"))
    mock.close(fd)  # RM frees the client on close, but the mock records it as a leak
    assert any("NV01_DEVICE_0" in s for s in mock.leaks()["auto_freed"])


def test_device_buffers_free_and_reuse_va(dev: NVDevice, mock: MockNV) -> None:
    a = dev.alloc_vram(0x3000)
    h = dev.alloc_host(0x2000)
    big = dev.alloc_vram(8 << 20, cpu_map=False)
    assert big.va % (2 << 20) == 0 and big.size == 8 << 20
    va_a = a.va
    dev.free(a)
    b = dev.alloc_vram(0x1000)
    assert b.va == va_a  # range allocator hands the freed range out again
    dev.free(b)
    dev.free(h)
    dev.free(big)
    with pytest.raises(ValueError, match="not live"):
        dev.free(big)
    assert mock.vram_used == dev.gpfifo_mem.size + 2 * (1 << 20)
