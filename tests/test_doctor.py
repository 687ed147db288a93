"""`python -m rawgrad doctor`: what it reports on a machine without a GPU, over the mock driver, for an
unknown driver branch, for a permission error, and in a gVisor sandbox."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from typing import Any

import pytest

from rawgrad.cli import doctor
from rawgrad.cli.doctor import Status, diagnose, render
from rawgrad.cli.main import main as cli_main
from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.mock import AMPERE, H100, GPUProfile, MockNV
from rawgrad.drivers.nv.rm import NVError

HAS_NVIDIA_DRIVER = os.path.exists("/dev/nvidiactl")


def _assert_no_leaks(m: MockNV) -> None:
    assert all(not v for v in m.leaks().values()), m.leaks()


@pytest.fixture
def h100() -> Iterator[MockNV]:
    m = MockNV(H100)
    yield m
    m.shutdown()


@pytest.mark.skipif(HAS_NVIDIA_DRIVER, reason="this machine has an NVIDIA driver")
def test_machine_without_gpu_reports_missing_nodes_and_exits_0(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NV_MOCK", raising=False)
    assert cli_main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "*** MOCK" not in out  # no mock banner (NV or AMD)
    for node in ("/dev/nvidiactl missing", "/dev/nvidia0 missing", "/dev/nvidia-uvm missing"):
        assert node in out
    assert "no NVIDIA kernel driver on this machine" in out
    assert "[ok  ] CPU path" in out and "[1, 2, 3] + 1 = [2, 3, 4]" in out
    assert "exit status 0" in out and "--verbose lists them" in out

    report = diagnose()
    assert not report.mock and report.exit_code == 0
    assert report.path("CPU").works
    nv = report.path("NV")
    assert not nv.works and nv.reason.startswith("no NVIDIA kernel driver on this machine")
    assert report.find("/dev/nvidiactl").status is Status.SKIP
    assert report.find("driver version").status is Status.SKIP
    assert report.find("bring-up").status is Status.SKIP
    assert report.driver_version is None and report.gpu is None and report.issued == []
    assert report.find("assembler").status in (Status.OK, Status.WARN)  # never FAIL without a driver
    assert not any(f.status is Status.FAIL for f in report.findings)


@pytest.mark.parametrize("profile", [H100, AMPERE], ids=["h100", "ampere"])
def test_mock_bringup_reports_gpu_and_leaves_nothing_behind(profile: GPUProfile) -> None:
    m = MockNV(profile)
    try:
        report = diagnose(m)
        _assert_no_leaks(m)
    finally:
        m.shutdown()
    assert report.mock and report.exit_code == 0, render(report)
    assert report.driver_version == "580.159.04"
    assert report.find("layout table").status is Status.OK
    gpu = report.gpu
    assert gpu is not None and gpu.name == profile.name
    assert gpu.sm_version == profile.sm_version and gpu.pci_device_id == profile.pci_device_id
    assert gpu.compute_class == profile.compute_classes[0] and gpu.copy_class == profile.copy_classes[0]
    assert gpu.uuid == "GPU-" + "-".join(profile.uuid.hex()[a:b] for a, b in
                                         ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))
    if profile is H100:
        assert gpu.arch == "sm_90" and gpu.family.startswith("Hopper") and gpu.hopper
        assert gpu.chosen_classes == {
            "compute": abi.HOPPER_COMPUTE_A, "copy": abi.HOPPER_DMA_COPY_A,
            "GPFIFO": abi.HOPPER_CHANNEL_GPFIFO_A, "usermode": abi.HOPPER_USERMODE_A}
        assert "HOPPER_COMPUTE_A (0xcbc0)" in report.find("classes").message
        assert "Hopper classes: yes" in report.find("classes").message
    else:
        assert gpu.arch == "sm_86" and not gpu.hopper
        assert "Hopper classes: no" in report.find("classes").message
    assert report.find("mock leaks").status is Status.OK
    assert report.path("NV").works and report.path("CPU").works
    # the trace names escapes with their class / control, in the order the driver saw them
    assert report.issued[:2] == ["open /dev/nvidiactl", "NV_ESC_CHECK_VERSION_STR"]
    assert "NV_ESC_RM_CONTROL NV2080_CTRL_CMD_GPU_GET_NAME_STRING" in report.issued
    assert "NV_ESC_RM_ALLOC_MEMORY NV01_MEMORY_SYSTEM_OS_DESCRIPTOR" in report.issued
    surface = {(e.kind, e.name): e for e in report.abi_surface}
    assert surface[("escape", "NV_ESC_CHECK_VERSION_STR")].request == 0xC04846D2  # NV-FACTS 1.2
    assert surface[("escape", "NV_ESC_RM_ALLOC")].request == 0xC020462B
    assert surface[("escape", "NV_ESC_CARD_INFO")].request == 0xD20046C8
    assert surface[("class", abi.CLASS_NAMES[profile.compute_classes[0]])].issued == 1
    assert surface[("control", "NV0080_CTRL_CMD_GPU_GET_CLASSLIST")].issued == 2  # count, then list
    assert surface[("control", "NV2080_CTRL_CMD_PERF_BOOST")].issued == 0
    assert surface[("uvm", "UVM_INITIALIZE")].issued == 1
    # every table entry of abi.py appears once, none invented
    assert len(report.abi_surface) == (len(abi.ESCAPE_NAMES) + len(abi.UVM_NAMES) + len(abi.CLASS_NAMES)
                                       + len(abi.CONTROL_NAMES))


def test_nv_mock_cli_says_it_is_the_mock_and_lists_the_surface(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NV_MOCK", "1")
    monkeypatch.setenv("NV_MOCK_PROFILE", "h100")
    assert cli_main(["doctor", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert out.index("*** MOCK DRIVER (NV_MOCK=1, profile h100)") < out.index("Platform")
    assert "NVIDIA H100 (mock)" in out and "sm_90, Hopper (GH100)" in out
    assert "NV    yes  mock driver" in out and "580.159.04" in out
    lines = out.splitlines()
    alloc = next(line for line in lines if line.strip().startswith("NV_ESC_RM_ALLOC "))
    assert "nr 0x2b" in alloc and "ioctl 0xc020462b" in alloc and "issued x" in alloc
    name_ctl = next(line for line in lines if line.strip().startswith("NV2080_CTRL_CMD_GPU_GET_NAME_STRING"))
    assert "0x20800110" in name_ctl and name_ctl.rstrip().endswith("issued x1")
    boost = next(line for line in lines if line.strip().startswith("NV2080_CTRL_CMD_PERF_BOOST"))
    assert "issued" not in boost  # declared in abi.py, not part of bring-up
    assert any(line.strip().startswith("HOPPER_COMPUTE_A") and "0x0000cbc0" in line for line in lines)


def test_unknown_driver_branch_is_explained_with_the_supported_ones() -> None:
    m = MockNV(H100, version="575.64.05")
    try:
        report = diagnose(m)
        _assert_no_leaks(m)
    finally:
        m.shutdown()
    assert report.driver_version == "575.64.05"
    table = report.find("layout table")
    assert table.status is Status.FAIL
    assert table.message.startswith("unknown driver branch")
    assert "branch 575" in table.message and "known branches: ['580']" in table.message
    assert report.supported_branches == ("580",)
    bringup = report.find("bring-up")
    assert bringup.status is Status.SKIP and "575.64.05 has no layout table" in bringup.message
    nv = report.path("NV")
    assert not nv.works and "unknown branch" in nv.reason and "supported: 580" in nv.reason
    assert report.path("CPU").works and report.exit_code == 1


class DeniedOS:
    """The mock driver behind device nodes this user may not open (EACCES on every /dev/nvidia* open)."""

    def __init__(self, inner: MockNV) -> None:
        self.inner = inner

    def open(self, path: str, flags: int) -> int:
        if path.startswith("/dev/nvidia"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return self.inner.open(path, flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_permission_error_on_open_is_explained_as_permissions(h100: MockNV) -> None:
    report = diagnose(DeniedOS(h100), mock=True)  # type: ignore[arg-type]
    _assert_no_leaks(h100)
    version = report.find("driver version")
    assert version.status is Status.FAIL
    assert version.message.startswith("permission problem") and "EACCES" in version.message
    assert "/dev/nvidiactl" in version.message and "ls -l /dev/nvidia*" in version.message
    bringup = report.find("bring-up")
    assert bringup.status is Status.FAIL
    assert "failed at step 'open /dev/nvidiactl'" in bringup.message
    assert "permission problem" in bringup.message
    nv = report.path("NV")
    assert not nv.works and "permission problem" in nv.reason
    assert report.gpu is None and report.exit_code == 1
    assert report.find("/dev/nvidiactl").status is Status.OK  # the node exists; opening it is what fails


def test_rm_status_in_a_failed_bringup_names_the_step() -> None:
    m = MockNV(H100)

    class NoTSG:  # RM refuses the channel group: the report names the call and the NV status
        def __getattr__(self, name: str) -> Any:
            return getattr(m, name)

        def ioctl(self, fd: int, request: int, buf: Any) -> int:
            if abi.ioc_nr(request) == abi.NV_ESC_RM_ALLOC:
                p = m.abi.at("NVOS21_PARAMETERS", m.abi.addr(buf))
                if p.hClass == abi.KEPLER_CHANNEL_GROUP_A:
                    p.status = abi.NV_STATUS["NV_ERR_INSUFFICIENT_RESOURCES"]
                    return 0
            return m.ioctl(fd, request, buf)

    try:
        report = diagnose(NoTSG(), mock=True)  # type: ignore[arg-type]
        _assert_no_leaks(m)
    finally:
        m.shutdown()
    bringup = report.find("bring-up")
    assert bringup.status is Status.FAIL
    assert "failed at step 'NV_ESC_RM_ALLOC KEPLER_CHANNEL_GROUP_A'" in bringup.message
    assert "NV_ERR_INSUFFICIENT_RESOURCES" in bringup.message
    assert report.find("driver version").status is Status.OK  # the checks before still ran
    assert report.find("assembler").status in (Status.OK, Status.WARN)  # and the ones after
    assert not report.path("NV").works


def test_mock_answers_gpu_name_string_size_checked(h100: MockNV) -> None:
    dev = NVDevice(h100, gpfifo_entries=64, window_size=1 << 30)  # type: ignore[arg-type]
    try:
        assert doctor.read_gpu_name(dev) == H100.name
        p = dev.rm.control(dev.subdevice, abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING,
                           dev.abi.new("NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS",
                                       gpuNameStringFlags=abi.NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_UNICODE))
        units = list(p.gpuNameString.unicode)
        assert "".join(map(chr, units[: units.index(0)])) == H100.name
        with pytest.raises(NVError, match="NV2080_CTRL_CMD_GPU_GET_NAME_STRING.*NV_ERR_INVALID_PARAM_STRUCT"):
            dev.rm.control(dev.subdevice, abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING,
                           dev.abi.new("NV2080_CTRL_PERF_BOOST_PARAMS"))  # 8 bytes, not 132
        with pytest.raises(NVError, match="NV_ERR_NOT_SUPPORTED"):  # a device, not a subdevice, control
            dev.rm.control(dev.device, abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING,
                           dev.abi.new("NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS"))
    finally:
        dev.close()
    _assert_no_leaks(h100)
    assert abi.NVABI("580").sizeof("NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS") == 132


def test_gvisor_markers_and_their_explanations() -> None:
    uname = os.uname_result(("Linux", "runsc", "4.4.0", doctor.GVISOR_UNAME_VERSION, "x86_64"))
    files = {"/proc/cmdline": "console=ttyS0", "/proc/cpuinfo": "flags\t\t: fpu sse2\n"}
    sb = doctor.detect_sandbox(read_text=files.get, uname=uname,
                               kernel_log=lambda: ("[    0.000000] Starting gVisor...\n", None),
                               exists=lambda p: False)
    assert len(sb.gvisor) == 3 and not sb.firecracker and sb.vm is None and sb.container is None
    rejected = OSError(errno.EINVAL, "ioctl(fd=3, request=0xc020462a) failed: EINVAL")
    assert "nvproxy" in doctor.explain(rejected, sb)
    assert "nvproxy" not in doctor.explain(rejected, doctor.SandboxInfo())
    fc = doctor.detect_sandbox(read_text={"/proc/cmdline": "nomodule -- --firecracker-init",
                                          "/proc/cpuinfo": "flags : fpu hypervisor"}.get,
                               uname=os.uname_result(("Linux", "vm", "6.1.0", "#1", "x86_64")),
                               kernel_log=lambda: (None, errno.EPERM), exists=lambda p: p == "/.dockerenv")
    assert fc.firecracker and fc.nomodule and fc.vm == "Firecracker microVM" and not fc.gvisor
    assert fc.container == "Docker (/.dockerenv)" and fc.kernel_log_errno == errno.EPERM


@pytest.mark.skipif(HAS_NVIDIA_DRIVER, reason="this machine has an NVIDIA driver")
def test_sandbox_hint_reaches_the_missing_driver_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NV_MOCK", raising=False)
    sb = doctor.SandboxInfo(gvisor=["kernel release '4.4.0'"], kernel_log=None, kernel_log_errno=errno.EPERM)
    report = diagnose(sandbox=sb)
    assert report.find("gVisor").status is Status.WARN and "runsc --nvproxy" in report.find("gVisor").message
    assert "runsc --nvproxy" in report.path("NV").reason
    log = report.find("kernel log")
    assert log.status is Status.WARN and "EPERM" in log.message and "dmesg_restrict" in log.message
    assert report.exit_code == 0


def test_proc_version_flavour() -> None:
    open_line = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
                 "(dvs-builder@U22-I3-AM02-24-3)  Wed Jul 30 00:00:00 UTC 2026\nGCC version:  gcc 12\n")
    assert doctor.parse_proc_version(open_line) == ("580.159.04", "open")
    prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    assert doctor.parse_proc_version(prop) == ("535.104.05", "proprietary")


# -- AMD (KFD): the section explains each way the AMD path fails here, and says AMD is verified on a mock only
def _amd_findings(report: doctor.DoctorReport) -> dict[str, doctor.Finding]:
    return {f.check: f for f in report.findings if f.section == doctor.AMD_SECTION}


class _AMDWrapper:
    """The mock KFD with one thing changed: `/dev/kfd` missing, or its open refused."""

    def __init__(self, kfd: Any, *, missing: bool = False, deny: bool = False) -> None:
        self.kfd, self.missing, self.deny = kfd, missing, deny

    def exists(self, path: str) -> bool:
        from rawgrad.drivers.amd.topology import KFD_PATH
        return False if self.missing and path == KFD_PATH else bool(self.kfd.exists(path))

    def open(self, path: str, flags: int) -> int:
        from rawgrad.drivers.amd.topology import KFD_PATH
        if self.deny and path == KFD_PATH:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return int(self.kfd.open(path, flags))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kfd, name)


def test_amd_without_dev_kfd_is_a_skip_and_the_path_says_why() -> None:
    from rawgrad.drivers.amd.mock.kfd import MockKFD
    report = diagnose(amd_os=_AMDWrapper(MockKFD(), missing=True), amd_mock=False)
    got = _amd_findings(report)
    assert got["/dev/kfd"].status is Status.SKIP and "no amdgpu kernel driver" in got["/dev/kfd"].message
    assert not report.path("AMD").works and "/dev/kfd is missing" in report.path("AMD").reason
    assert got["verified"].status is Status.WARN and "no real AMD GPU has run" in got["verified"].message
    assert "no real AMD GPU has run" in render(report) and "MOCK AMD GPU" not in render(report)


def test_amd_permission_denied_names_the_render_group() -> None:
    from rawgrad.drivers.amd.mock.kfd import MockKFD
    report = diagnose(amd_os=_AMDWrapper(MockKFD(), deny=True), amd_mock=False)
    f = _amd_findings(report)["/dev/kfd"]
    assert f.status is Status.FAIL and "EACCES" in f.message and "'render' group" in f.message
    assert not report.path("AMD").works and report.exit_code == 1


def test_amd_kfd_too_old_is_a_failure_naming_both_versions() -> None:
    from rawgrad.drivers.amd.mock.kfd import MockKFD
    report = diagnose(amd_os=MockKFD(version=(1, 9)), amd_mock=False)
    f = _amd_findings(report)["KFD version"]
    assert f.status is Status.FAIL and "KFD 1.9 is too old" in f.message and "1.11" in f.message
    assert "GPU node 1" not in _amd_findings(report)  # nothing after the version check ran


def test_amd_unsupported_gfx_from_the_topology() -> None:
    import dataclasses

    from rawgrad.drivers.amd.mock.kfd import GFX1100, MockKFD
    props = tuple((k, 100300 if k == "gfx_target_version" else v) for k, v in GFX1100.properties)  # gfx1030
    navi21 = dataclasses.replace(GFX1100, label="gfx1030 (RX 6900 XT, mock)", properties=props)
    report = diagnose(amd_os=MockKFD(navi21), amd_mock=False)
    got = _amd_findings(report)
    node = got["GPU node 1"]
    assert node.status is Status.WARN and "gfx1030" in node.message
    assert "unsupported gfx target" in node.message
    assert got["supported GPU"].status is Status.FAIL and "found gfx1030" in got["supported GPU"].message
    assert "gfx1100, gfx942" in report.path("AMD").reason


def test_amd_mock_brings_up_runs_a_kernel_and_says_it_is_the_mock(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMD_MOCK", "1")
    assert cli_main(["doctor"]) in (0, 1)  # the NV section's verdict depends on this machine
    out = capsys.readouterr().out
    assert "MOCK AMD GPU (AMD_MOCK=1)" in out and "no real AMD GPU has run rawgrad" in out
    assert "KFD version      1.17" in out and "gfx1100, 96 CUs, wave32" in out
    assert "the copy kernel ran on the RDNA3 interpreter" in out
    assert "AMD   yes  mock KFD: bring-up OK and a kernel ran on the RDNA3 interpreter (not hardware)" in out


def test_metal_off_a_mac_is_a_skip_and_says_it_is_verified_on_a_mock_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("METAL_MOCK", raising=False)
    report = diagnose(mock=True)
    got = {f.check: f for f in report.findings if f.section == "Apple GPU (Metal)"}
    assert got["verified"].status is Status.WARN and "no Mac has run rawgrad" in got["verified"].message
    assert got["platform"].status is Status.SKIP and "Metal needs macOS" in got["platform"].message
    assert not report.path("METAL").works and "macOS" in report.path("METAL").reason
    assert "MOCK METAL" not in render(report)


def test_metal_mock_runs_the_smoke_steps_and_says_it_is_the_mock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METAL_MOCK", "1")
    report = diagnose(mock=True)
    got = {f.check.split(" (")[0]: f for f in report.findings if f.section == "Apple GPU (Metal)"}
    for step in ("buffers", "timeline", "eager kernel", "ICB replay", "timestamps"):
        assert got[step].status is Status.OK, (step, got.get(step))
    assert report.path("METAL").works and "not a Mac" in report.path("METAL").reason
    text = render(report)
    assert "MOCK METAL (METAL_MOCK=1)" in text and "no Mac has run rawgrad" in text
