"""`python -m rawgrad doctor`: which device paths work on this machine, and why the others do not.

Every check is independent: each runs inside its own guard, so one failure (an errno, an NV status, a
missing tool) becomes one finding and never hides the checks after it. The report is data first
(:class:`DoctorReport`, typed findings with a status and a one-line explanation) and text second
(:func:`render`).

Checks, in order: platform and the CPU path (a tiny kernel compiled and run through ``Tensor``); the
NVIDIA device nodes; ``/proc/driver/nvidia/version`` (version, open vs proprietary module); the driver
version through ``NV_ESC_CHECK_VERSION_STR`` and whether rawgrad has a struct-layout table for its branch;
sandbox hints (gVisor, Firecracker / VMs, containers, kernel log access); a full NV bring-up through
:class:`~rawgrad.drivers.nv.device.NVDevice` (GPU name, SM version, chosen classes), closed right after;
the kernel assembler NV needs (ptxas / nvJitLink); the verdict per path; and the ioctl / RM class /
control surface rawgrad speaks, derived from ``abi.py``'s tables and marked with what the bring-up issued.

``NV_MOCK=1`` runs the NV checks over the mock kernel driver (:class:`~rawgrad.drivers.nv.mock.MockNV`)
and says so at the top of the report.

The AMD section (KFD): ``/dev/kfd`` present and openable (permissions: the render group), GET_VERSION against
the oldest KFD rawgrad speaks, the GPU nodes of the sysfs topology and whether rawgrad has a target for each
gfx, the render node, then a full :class:`~rawgrad.drivers.amd.device.AMDDevice` bring-up closed right
after. ``AMD_MOCK=1`` runs it over the mock KFD and command processor (a kernel then runs on the RDNA3
interpreter). **AMD is verified on a mock only: no real AMD GPU has run rawgrad**, and the report says so.

The Metal section: why Metal cannot open here (not macOS, an Intel Mac), else the bring-up checklist of
``rawgrad.drivers.metal.smoke`` (open, shared buffers, the shared-event timeline, one MSL kernel eagerly and
as an indirect-command-buffer replay, timestamps). ``METAL_MOCK=1`` runs it over the fake Objective-C
runtime whose GPU builds the MSL with the host C++ compiler. **Metal is verified on that Linux mock only: no
Mac has run rawgrad**, and the report says so.
"""

from __future__ import annotations

import argparse
import enum
import errno as _errno
import glob
import os
import platform
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rawgrad import config
from rawgrad.drivers.nv import abi
from rawgrad.drivers.osapi import O_CLOEXEC, O_RDWR, LibcOS, OSInterface

# ------------------------------------------------------------------------------------------------ constants
CTL_PATH = "/dev/nvidiactl"  # NV-FACTS 1.1
UVM_PATH = "/dev/nvidia-uvm"  # NV-FACTS 1.1
GPU_NODE_PREFIX = "/dev/nvidia"  # /dev/nvidia<minor>
NV_MAX_DEVICES = 32  # kernel-open/common/inc/nv.h NV_MAX_DEVICES: GPU minors are 0..31
PROC_VERSION_PATH = "/proc/driver/nvidia/version"
# how the open module's /proc version line names itself (NV-FACTS 9.3)
OPEN_MODULE_MARKER = "Open Kernel Module"

# gVisor reports a fixed, made-up kernel identity (its syscall table's uname) and logs this at boot.
GVISOR_RELEASES = ("4.4.0",)
GVISOR_UNAME_VERSION = "#1 SMP Sun Jan 10 15:06:54 PST 2016"
GVISOR_LOG_MARKER = "Starting gVisor"
# Firecracker boots its guests with virtio-mmio devices named on the kernel command line.
FIRECRACKER_CMDLINE_MARKERS = ("firecracker", "virtio_mmio.device=")
CONTAINER_FILES = {"/.dockerenv": "Docker", "/run/.containerenv": "Podman"}
CONTAINER_CGROUP_MARKERS = {"docker": "Docker", "kubepods": "Kubernetes", "containerd": "containerd",
                            "lxc": "LXC", "libpod": "Podman"}

# klogctl(2) actions (linux/syslog.h SYSLOG_ACTION_*): what dmesg uses to read the kernel ring buffer.
SYSLOG_ACTION_READ_ALL = 3
SYSLOG_ACTION_SIZE_BUFFER = 10
XID_LINE_CHARS = 160  # how much of the last Xid line the report quotes

PERMISSION_ERRNOS = (_errno.EACCES, _errno.EPERM)
# ioctl errnos a sandbox gives for a call it does not forward (gVisor nvproxy rejects unknown ioctls).
REJECTED_IOCTL_ERRNOS = (_errno.EINVAL, _errno.ENOTTY, _errno.ENOSYS, _errno.EOPNOTSUPP)

# NV2080_CTRL_GR_INFO_INDEX_SM_VERSION values (NV-FACTS 2.2 step 31) -> family and chip.
ARCH_NAMES = {0x800: "Ampere (GA100)", 0x806: "Ampere (GA10x)", 0x809: "Ada (AD10x)", 0x900: "Hopper (GH100)"}
HOPPER_CLASS_PREFIX = "HOPPER_"  # abi.CLASS_NAMES spells every Hopper class this way

ASSEMBLER_HINT = ("NV kernels need ptxas: pip install 'rawgrad[nv]' (NVIDIA's nvidia-cuda-nvcc wheel), "
                  "or put CUDA's bin on PATH / set CUDA_HOME")

CPU_PROBE_INPUT = [1, 2, 3]
CPU_PROBE_ADD = 1

MOCK_PROFILE_NAMES = ("h100", "ampere")  # NV_MOCK_PROFILE values (config.NV_MOCK_PROFILE)


class Status(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Finding:
    """One check's result: the section it belongs to, what was checked, status, one-line explanation."""

    section: str
    check: str
    status: Status
    message: str


@dataclass(frozen=True)
class GPUInfo:
    name: str | None
    pci_device_id: int
    minor: int
    uuid: str
    sm_version: int
    arch: str  # "sm_90"
    family: str  # "Hopper (GH100)"
    gr_info: dict[str, int]
    classes: frozenset[int]
    compute_class: int
    copy_class: int
    gpfifo_class: int
    usermode_class: int

    @property
    def chosen_classes(self) -> dict[str, int]:
        return {"compute": self.compute_class, "copy": self.copy_class, "GPFIFO": self.gpfifo_class,
                "usermode": self.usermode_class}

    @property
    def hopper(self) -> bool:
        """Every chosen engine class is a Hopper class (GH100 exposes no other compute/copy class)."""
        return all(abi.CLASS_NAMES.get(c, "").startswith(HOPPER_CLASS_PREFIX)
                   for c in self.chosen_classes.values())


@dataclass(frozen=True)
class PathVerdict:
    device: str  # "CPU" | "NV" | "AMD"
    works: bool
    reason: str


@dataclass(frozen=True)
class AbiEntry:
    """One item of the driver surface rawgrad speaks, from the tables in ``drivers/nv/abi.py``."""

    kind: str  # "escape" | "uvm" | "class" | "control"
    name: str
    number: int  # escape nr, UVM command, class id or control command
    request: int | None  # the full ioctl request number of an escape, else None
    issued: int  # how often this run's bring-up issued it


@dataclass
class SandboxInfo:
    gvisor: list[str] = field(default_factory=list)  # the markers that point to gVisor
    vm: str | None = None
    firecracker: bool = False
    nomodule: bool = False
    container: str | None = None
    kernel_log: str | None = None  # text of the kernel ring buffer, None when unreadable
    kernel_log_errno: int | None = None


@dataclass
class DoctorReport:
    findings: list[Finding] = field(default_factory=list)
    mock: bool = False
    amd_mock: bool = False  # the AMD checks ran over the mock KFD (AMD_MOCK=1)
    metal_mock: bool = False  # the Metal checks ran over the fake Objective-C runtime (METAL_MOCK=1)
    mock_profile: str | None = None
    driver_version: str | None = None  # from NV_ESC_CHECK_VERSION_STR
    module_version: str | None = None  # from /proc/driver/nvidia/version
    module_flavour: str | None = None  # "open" | "proprietary"
    supported_branches: tuple[str, ...] = ()
    gpu: GPUInfo | None = None
    paths: list[PathVerdict] = field(default_factory=list)
    issued: list[str] = field(default_factory=list)  # every open / ioctl of the bring-up, in order
    abi_branch: str = ""  # the layout table the ioctl numbers of abi_surface come from
    abi_surface: list[AbiEntry] = field(default_factory=list)
    sandbox: SandboxInfo = field(default_factory=SandboxInfo)

    def add(self, section: str, check: str, status: Status, message: str) -> Finding:
        f = Finding(section, check, status, message)
        self.findings.append(f)
        return f

    def find(self, check: str) -> Finding:
        for f in self.findings:
            if f.check == check:
                return f
        raise KeyError(check)

    def path(self, device: str) -> PathVerdict:
        return next(p for p in self.paths if p.device == device)

    @property
    def exit_code(self) -> int:
        """0 unless a check failed; a machine without an NVIDIA driver is not a failure (skip / warn)."""
        return 1 if any(f.status is Status.FAIL for f in self.findings) else 0


# ------------------------------------------------------------------------------------------------ helpers
def errno_name(err: int | None) -> str:
    return _errno.errorcode.get(err, str(err)) if err is not None else "?"


def explain(exc: BaseException, sandbox: SandboxInfo | None = None) -> str:
    """One line that names the exception, its errno / NV status, and what it usually means."""
    if isinstance(exc, abi.UnsupportedDriverError):
        return str(exc)
    err = getattr(exc, "errno", None)
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(err, int) and errno_name(err) not in text:
        text += f" ({errno_name(err)})"
    status = getattr(exc, "status", None)  # NVError: the NV_STATUS RM answered
    if err in PERMISSION_ERRNOS or status == abi.NV_STATUS["NV_ERR_INSUFFICIENT_PERMISSIONS"]:
        groups = ",".join(str(g) for g in os.getgroups())
        return (f"permission problem: {text}; uid {os.getuid()} (groups {groups}) may not use the NVIDIA "
                f"device nodes: check `ls -l /dev/nvidia*` (owner group, often 'video') and add this user "
                f"to it, or pass the devices into the container (--gpus / --device)")
    if err == _errno.ENOENT:
        return f"{text}; the device node does not exist (driver not loaded, or not passed into this sandbox)"
    if sandbox is not None and sandbox.gvisor and err in REJECTED_IOCTL_ERRNOS:
        return (f"{text}; gVisor rejects ioctls its nvproxy does not know: run runsc with --nvproxy and a "
                f"driver version it supports")
    return text


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def parse_proc_version(text: str) -> tuple[str | None, str]:
    """(driver version, "open" | "proprietary") from the text of /proc/driver/nvidia/version.

    Its first line reads e.g. "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release
    Build ..." (open) or "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug ..."."""
    first = text.splitlines()[0] if text else ""
    version = next((tok for tok in first.split()
                    if "." in tok and all(part.isdigit() for part in tok.split("."))), None)
    return version, "open" if OPEN_MODULE_MARKER in first else "proprietary"


def read_kernel_log() -> tuple[str | None, int | None]:
    """The kernel ring buffer through klogctl(2) (what dmesg reads): (text, None) or (None, errno)."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef("int klogctl(int type, char *bufp, int len);")
    try:
        lib: Any = ffi.dlopen(None)
        size = lib.klogctl(SYSLOG_ACTION_SIZE_BUFFER, ffi.NULL, 0)
        if size < 0:
            return None, ffi.errno
        buf = ffi.new("char[]", max(size, 1))
        got = lib.klogctl(SYSLOG_ACTION_READ_ALL, buf, size)
        if got < 0:
            return None, ffi.errno
        return bytes(ffi.buffer(buf, got)).decode(errors="replace"), None
    except (OSError, AttributeError):  # no libc symbol: not Linux / glibc
        return None, _errno.ENOSYS


def detect_sandbox(read_text: Callable[[str], str | None] = _read_text,
                   uname: os.uname_result | None = None,
                   kernel_log: Callable[[], tuple[str | None, int | None]] = read_kernel_log,
                   exists: Callable[[str], bool] = os.path.exists) -> SandboxInfo:
    """Markers of gVisor, Firecracker / other VMs and containers (each source injectable for tests)."""
    u = uname or os.uname()
    info = SandboxInfo()
    if u.release in GVISOR_RELEASES or "gvisor" in u.release.lower():
        info.gvisor.append(f"kernel release {u.release!r}")
    if u.version == GVISOR_UNAME_VERSION:
        info.gvisor.append(f"uname version {u.version!r}")
    info.kernel_log, info.kernel_log_errno = kernel_log()
    if info.kernel_log and GVISOR_LOG_MARKER in info.kernel_log:
        info.gvisor.append(f"kernel log says {GVISOR_LOG_MARKER!r}")
    cmdline = (read_text("/proc/cmdline") or "").lower()
    info.firecracker = any(m in cmdline for m in FIRECRACKER_CMDLINE_MARKERS)
    info.nomodule = "nomodule" in cmdline.split()
    cpuinfo = read_text("/proc/cpuinfo") or ""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])
    vendor = (read_text("/sys/class/dmi/id/sys_vendor") or "").strip()
    product = (read_text("/sys/class/dmi/id/product_name") or "").strip()
    if info.firecracker:
        info.vm = "Firecracker microVM"
    elif "hypervisor" in flags:
        info.vm = " ".join(x for x in (vendor, product) if x) or "virtual machine (hypervisor CPU flag)"
    for path, what in CONTAINER_FILES.items():
        if exists(path):
            info.container = f"{what} ({path})"
            break
    else:
        cgroup = read_text("/proc/1/cgroup") or ""
        hit = next((what for marker, what in CONTAINER_CGROUP_MARKERS.items() if marker in cgroup), None)
        if hit is None and os.environ.get("container"):
            hit = f"container={os.environ['container']}"
        info.container = hit
    return info


class TracingOS:
    """OSInterface wrapper that records every open and ioctl (decoded to escape + class / control names),
    so the report can say at which step a bring-up failed and list what it really issued."""

    def __init__(self, inner: OSInterface) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.failed: set[int] = set()  # indices into calls: an errno, or an NV status other than NV_OK
        self.cleanup_at: int | None = None  # len(calls) when the device's close() began
        self._paths: dict[int, str] = {}
        # NVOS21 / NVOS02 / NVOS54 never drifted between branches (abi.py's common cdef): any table
        # decodes them, also when the driver's own branch is unknown.
        self._abi = abi.abi_for_branch(sorted(abi.LAYOUTS)[0])

    def open(self, path: str, flags: int) -> int:
        self.calls.append(f"open {path}")
        try:
            fd = self.inner.open(path, flags)
        except OSError:
            self.failed.add(len(self.calls) - 1)
            raise
        self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        self.inner.close(fd)

    def ioctl(self, fd: int, request: int, buf: Any) -> int:
        self.calls.append(self.describe(fd, request, buf))
        try:
            ret = self.inner.ioctl(fd, request, buf)
        except OSError:
            self.failed.add(len(self.calls) - 1)
            raise
        if self.status(fd, request, buf) not in (None, abi.NV_OK):
            self.failed.add(len(self.calls) - 1)
        return ret

    def status(self, fd: int, request: int, buf: Any) -> int | None:
        """The NV_STATUS the driver wrote into the parameter block (None when there is none to read)."""
        field_path: tuple[str, ...]
        if self._paths.get(fd) == UVM_PATH:
            ctype = abi.UVM_PARAM_TYPES.get(request)
            field_path = ("rmStatus",)
        else:
            nr = abi.ioc_nr(request)
            ctype = abi.ESCAPE_PARAM_TYPES.get(nr)
            if nr == abi.NV_ESC_RM_ALLOC and abi.ioc_size(request) == self._abi.sizeof("NVOS64_PARAMETERS"):
                ctype = "NVOS64_PARAMETERS"
            field_path = ("params", "status") if ctype and ctype.endswith("_with_fd") else ("status",)
        if ctype is None:
            return None
        try:
            obj = self._abi.at(ctype, self._abi.addr(buf))
            for name in field_path:
                obj = getattr(obj, name)
            return int(obj)
        except (AttributeError, TypeError, ValueError):  # a struct without status (REGISTER_FD, CARD_INFO)
            return None

    def describe(self, fd: int, request: int, buf: Any) -> str:
        if self._paths.get(fd) == UVM_PATH:  # UVM commands are raw numbers, not _IOC-encoded
            return abi.UVM_NAMES.get(request, f"UVM {request:#x}")
        nr = abi.ioc_nr(request)
        name = abi.ESCAPE_NAMES.get(nr, f"escape {nr:#x}")
        try:
            if nr == abi.NV_ESC_RM_ALLOC:
                cls = int(self._abi.at("NVOS21_PARAMETERS", self._abi.addr(buf)).hClass)
                return f"{name} {abi.CLASS_NAMES.get(cls, hex(cls))}"
            if nr == abi.NV_ESC_RM_ALLOC_MEMORY:
                w = self._abi.at("nv_ioctl_nvos02_parameters_with_fd", self._abi.addr(buf))
                cls = int(w.params.hClass)
                return f"{name} {abi.CLASS_NAMES.get(cls, hex(cls))}"
            if nr == abi.NV_ESC_RM_CONTROL:
                cmd = int(self._abi.at("NVOS54_PARAMETERS", self._abi.addr(buf)).cmd)
                return f"{name} {abi.CONTROL_NAMES.get(cmd, hex(cmd))}"
        except (TypeError, ValueError):  # a buffer that is not a cffi pointer: name the escape only
            pass
        return name

    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
        return self.inner.mmap(addr, length, prot, flags, fd, offset)

    def munmap(self, addr: int, length: int) -> None:
        self.inner.munmap(addr, length)

    def read(self, fd: int, n: int) -> bytes:
        return self.inner.read(fd, n)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def mmio_read32(self, addr: int) -> int:
        return self.inner.mmio_read32(addr)

    def gpfifo_publisher(self, ring: int, entries: int, put_word: int, doorbell: int,
                         token: int) -> Callable[[int, int], None]:
        return self.inner.gpfifo_publisher(ring, entries, put_word, doorbell, token)


def abi_surface(issued: Sequence[str], branch: str) -> list[AbiEntry]:
    """Every escape, UVM ioctl, RM class and control in abi.py's tables, with how often ``issued`` has it
    (``issued`` as recorded by :class:`TracingOS`); escape request numbers use ``branch``'s layouts."""
    nvabi = abi.abi_for_branch(branch)
    ioctls = [c for c in issued if not c.startswith("open ")]
    whole = Counter(ioctls)
    heads = Counter(c.split(" ", 1)[0] for c in ioctls)  # the escape of "NV_ESC_RM_ALLOC HOPPER_COMPUTE_A"
    tails = Counter(c.split(" ", 1)[1] for c in ioctls if " " in c)  # its class / control
    out: list[AbiEntry] = []
    for nr, name in sorted(abi.ESCAPE_NAMES.items()):
        ctype = abi.ESCAPE_PARAM_TYPES.get(nr)
        request = None
        if ctype is not None:  # CARD_INFO's size is its whole entry array
            count = abi.CARD_INFO_MAX_ENTRIES if nr == abi.NV_ESC_CARD_INFO else 1
            request = abi.iowr(abi.NV_IOCTL_MAGIC, nr, count * nvabi.sizeof(ctype))
        out.append(AbiEntry("escape", name, nr, request, heads[name]))
    out += [AbiEntry("uvm", name, cmd, None, whole[name]) for cmd, name in sorted(abi.UVM_NAMES.items())]
    out += [AbiEntry("class", name, cls, None, tails[name]) for cls, name in sorted(abi.CLASS_NAMES.items())]
    out += [AbiEntry("control", name, cmd, None, tails[name])
            for cmd, name in sorted(abi.CONTROL_NAMES.items())]
    return out


def sm_arch(sm_version: int) -> str:
    """GR SM_VERSION (0x900) -> "sm_90": major in bits 11:8, minor in bits 3:0 (NV-FACTS 2.2 step 31)."""
    return f"sm_{(sm_version >> 8) & 0xF}{sm_version & 0xF}"


def format_uuid(raw: bytes) -> str:
    """The 16-byte binary GID as nvidia-smi prints it: GPU- and 8-4-4-4-12 hex digits."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _class_label(cls: int) -> str:
    return f"{abi.CLASS_NAMES.get(cls, 'class')} ({cls:#06x})"


def read_gpu_name(dev: Any) -> str:
    """NV2080_CTRL_CMD_GPU_GET_NAME_STRING (ASCII) on an NVDevice's subdevice."""
    params = dev.abi.new("NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS",
                         gpuNameStringFlags=abi.NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_ASCII)
    p = dev.rm.control(dev.subdevice, abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING, params)
    return bytes(p.gpuNameString.ascii).split(b"\0", 1)[0].decode("ascii", errors="replace")


# ------------------------------------------------------------------------------------------------ checks
class _Diagnosis:
    """State one run of the checks shares (what later checks and the verdicts need to know)."""

    def __init__(self, report: DoctorReport, os_iface: OSInterface, real: bool) -> None:
        self.report, self.os, self.real = report, os_iface, real
        self.nv_blocker: str | None = None  # the first reason the NV path cannot work
        self.driver_present = False
        self.branch: str | None = None  # the driver's layout branch, once known to be supported
        self.branch_unsupported = False
        self.bringup_ok = False

    def block(self, reason: str) -> None:
        if self.nv_blocker is None:
            self.nv_blocker = reason

    @contextmanager
    def guard(self, section: str, check: str, block_nv: bool = False) -> Iterator[None]:
        """Run one check; any exception becomes a FAIL finding (and optionally blocks the NV path)."""
        try:
            yield
        except Exception as e:
            msg = explain(e, self.report.sandbox)
            self.report.add(section, check, Status.FAIL, msg)
            if block_nv:
                self.block(f"{check}: {msg}")


def _check_platform(d: _Diagnosis) -> None:
    r, sec = d.report, "Platform"
    with d.guard(sec, "os"):
        u = platform.uname()
        libc = " ".join(platform.libc_ver()).strip()
        r.add(sec, "os", Status.OK, f"{u.system} {u.release} {u.machine}" + (f", {libc}" if libc else ""))
    with d.guard(sec, "python"):
        r.add(sec, "python", Status.OK,
              f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})")
    with d.guard(sec, "cpu"):
        cpuinfo = _read_text("/proc/cpuinfo") or ""
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                      if line.startswith("model name")), platform.processor() or "unknown CPU")
        r.add(sec, "cpu", Status.OK, f"{model}, {os.cpu_count()} logical cores")
    cpu_ok = False
    with d.guard(sec, "CPU path"):
        import llvmlite
        import numpy as np

        from rawgrad import Tensor

        got = (Tensor(CPU_PROBE_INPUT, device="CPU") + CPU_PROBE_ADD).numpy()
        want = np.array(CPU_PROBE_INPUT) + CPU_PROBE_ADD
        if not np.array_equal(got, want):
            raise AssertionError(f"{CPU_PROBE_INPUT} + {CPU_PROBE_ADD} gave {got.tolist()}, "
                                 f"want {want.tolist()}")
        r.add(sec, "CPU path", Status.OK, f"compiled (llvmlite {llvmlite.__version__}) and ran a kernel on "
                                          f"CPU: {CPU_PROBE_INPUT} + {CPU_PROBE_ADD} = {got.tolist()}")
        cpu_ok = True
    reason = "a kernel compiled and ran" if cpu_ok else r.find("CPU path").message
    r.paths.append(PathVerdict("CPU", cpu_ok, reason))


def _gpu_nodes(d: _Diagnosis) -> list[str]:
    if d.real:
        found = [p for p in glob.glob(GPU_NODE_PREFIX + "[0-9]*") if p[len(GPU_NODE_PREFIX):].isdigit()]
        return sorted(found, key=lambda p: int(p[len(GPU_NODE_PREFIX):]))
    return [f"{GPU_NODE_PREFIX}{i}" for i in range(NV_MAX_DEVICES) if d.os.exists(f"{GPU_NODE_PREFIX}{i}")]


def _check_nodes(d: _Diagnosis) -> None:
    r, sec = d.report, "NVIDIA driver"
    missing: list[str] = []
    with d.guard(sec, "device nodes", block_nv=True):
        gpus = _gpu_nodes(d)
        nodes = ((f"{GPU_NODE_PREFIX}0", [CTL_PATH], CTL_PATH, "the RM control node"),
                 (f"{GPU_NODE_PREFIX}0", gpus, f"{GPU_NODE_PREFIX}N", "one per GPU"),
                 (UVM_PATH, [UVM_PATH], UVM_PATH, "the nvidia-uvm module: GPU virtual memory"))
        for first, paths, label, role in nodes:
            if not paths or not d.os.exists(paths[0]):
                shown = paths[0] if paths else first
                missing.append(shown)
                r.add(sec, label, Status.SKIP, f"{shown} missing ({role})")
            elif not d.real:
                r.add(sec, label, Status.OK, f"{', '.join(paths)} present (mock driver: no file permissions)")
            elif denied := [p for p in paths if not os.access(p, os.R_OK | os.W_OK)]:
                r.add(sec, label, Status.FAIL,
                      f"{', '.join(denied)} exists but is not readable+writable by uid {os.getuid()}: a "
                      f"permission problem (check `ls -l {denied[0]}` and add this user to its group)")
                d.block(f"permission denied on {', '.join(denied)}")
            else:
                r.add(sec, label, Status.OK, f"{', '.join(paths)} present, readable and writable")
    d.driver_present = CTL_PATH not in missing
    if not d.driver_present:
        sb, hint = r.sandbox, ""
        if sb.vm:
            hint = f"; this is a {sb.vm}: a GPU appears only when the host passes one through (PCI/VFIO)"
        elif sb.gvisor:
            hint = "; under gVisor the nodes appear only with runsc --nvproxy and NVIDIA_VISIBLE_DEVICES"
        elif sb.container:
            hint = f"; inside a container ({sb.container}) the nodes must be passed in (--gpus / --device)"
        r.add(sec, "driver", Status.SKIP,
              f"no NVIDIA kernel driver on this machine (missing: {', '.join(missing)}){hint}")
        d.block("no NVIDIA kernel driver on this machine" + hint)
    elif missing:
        r.add(sec, "driver", Status.FAIL, f"driver loaded but {', '.join(missing)} missing: load nvidia-uvm "
                                          f"(`nvidia-modprobe -u -c=0` or `modprobe nvidia-uvm`)")
        d.block(f"missing {', '.join(missing)}")


def _check_proc_version(d: _Diagnosis) -> None:
    r, sec = d.report, "NVIDIA driver"
    with d.guard(sec, "module"):
        if not d.real:
            r.add(sec, "module", Status.SKIP, f"mock driver: no {PROC_VERSION_PATH}")
            return
        text = _read_text(PROC_VERSION_PATH)
        if text is None:
            r.add(sec, "module", Status.SKIP, f"{PROC_VERSION_PATH} absent (no NVIDIA kernel module loaded)")
            return
        version, flavour = parse_proc_version(text)
        r.module_version, r.module_flavour = version, flavour
        if flavour == "open":
            r.add(sec, "module", Status.OK, f"{version}, open kernel module ({OPEN_MODULE_MARKER!r})")
        else:
            r.add(sec, "module", Status.WARN, f"{version}, proprietary kernel module: rawgrad's path is "
                                              f"written for the open modules ('-open' packages)")


def _check_driver_version(d: _Diagnosis) -> None:
    r, sec = d.report, "NVIDIA driver"
    r.supported_branches = tuple(sorted(abi.LAYOUTS))
    supported = ", ".join(r.supported_branches)
    if not d.driver_present:
        r.add(sec, "driver version", Status.SKIP, f"no {CTL_PATH} to ask (rawgrad knows branch {supported})")
        return
    with d.guard(sec, "driver version", block_nv=True):
        fd = d.os.open(CTL_PATH, O_RDWR | O_CLOEXEC)
        try:
            version = abi.query_driver_version(d.os, fd)
        finally:
            d.os.close(fd)
        r.driver_version = version
        r.add(sec, "driver version", Status.OK, f"{version} (NV_ESC_CHECK_VERSION_STR query)")
        if r.module_version and r.module_version != version:
            r.add(sec, "version match", Status.WARN, f"/proc says {r.module_version} but RM answers "
                                                     f"{version}: reload the nvidia modules or reboot")
    if r.driver_version is None:
        return
    with d.guard(sec, "layout table", block_nv=True):
        try:
            branch = abi.driver_branch(r.driver_version)
        except abi.UnsupportedDriverError as e:
            d.branch_unsupported = True
            r.add(sec, "layout table", Status.FAIL, f"unknown driver branch: {e}")
            d.block(f"driver {r.driver_version} is an unknown branch (supported: {supported})")
            return
        nvabi = abi.abi_for_branch(branch)  # builds the cffi types and checks every size / offset
        d.branch = branch
        r.add(sec, "layout table", Status.OK, f"branch {branch} has a layout table ({len(nvabi.sizes)} "
                                              f"struct sizes checked); supported branches: {supported}")


def _check_sandbox(d: _Diagnosis) -> None:
    r, sec = d.report, "Sandbox"
    sb = r.sandbox
    with d.guard(sec, "gVisor"):
        if sb.gvisor:
            r.add(sec, "gVisor", Status.WARN, f"gVisor sandbox ({'; '.join(sb.gvisor)}): NVIDIA ioctls pass "
                                              f"only through runsc --nvproxy, which forwards a fixed list")
        else:
            r.add(sec, "gVisor", Status.OK, "no gVisor markers (kernel release, uname version, kernel log)")
    with d.guard(sec, "virtualization"):
        if sb.vm:
            r.add(sec, "virtualization", Status.OK, f"{sb.vm}: a GPU is visible only with PCI passthrough")
        else:
            r.add(sec, "virtualization", Status.OK, "no hypervisor CPU flag (bare metal)")
        if sb.nomodule:
            r.add(sec, "modules", Status.WARN, "kernel booted with `nomodule`: no kernel module (nvidia.ko "
                                               "included) can be loaded here")
    with d.guard(sec, "container"):
        if sb.container:
            r.add(sec, "container", Status.OK, f"{sb.container}: GPU device nodes must be passed in")
        else:
            r.add(sec, "container", Status.OK, "no container markers")
    with d.guard(sec, "kernel log"):
        if sb.kernel_log is None:
            err = sb.kernel_log_errno
            why = "kernel.dmesg_restrict or no CAP_SYSLOG" if err in PERMISSION_ERRNOS else "no klogctl"
            r.add(sec, "kernel log", Status.WARN, f"unreadable ({errno_name(err)}: {why}): GPU faults (NVRM "
                                                  f"Xid lines) will not be visible from here")
        else:
            nvrm = [line for line in sb.kernel_log.splitlines() if "NVRM" in line]
            xids = [line.strip() for line in nvrm if "Xid" in line]
            msg = f"readable ({len(sb.kernel_log)} bytes), {len(nvrm)} NVRM lines"
            if xids:
                r.add(sec, "kernel log", Status.WARN, f"{msg}, {len(xids)} Xid; last: "
                                                      f"{xids[-1][:XID_LINE_CHARS]}")
            else:
                r.add(sec, "kernel log", Status.OK, msg + ", no Xid errors")


def _check_bringup(d: _Diagnosis, base_os: OSInterface) -> None:
    r, sec = d.report, "NV bring-up"
    if not d.driver_present:
        r.add(sec, "bring-up", Status.SKIP, f"skipped: no {CTL_PATH}")
        return
    if d.branch_unsupported:
        r.add(sec, "bring-up", Status.SKIP, f"skipped: driver {r.driver_version} has no layout table, and "
                                            f"NVDevice stops at the same point")
        return
    from rawgrad.drivers.nv.device import NVDevice

    tracer = TracingOS(d.os)

    class TracedNVDevice(NVDevice):
        """NVDevice that notes where its close() begins: a failed bring-up closes itself before raising,
        and the step that failed is the last driver call before that cleanup."""

        def close(self) -> None:
            if tracer.cleanup_at is None:
                tracer.cleanup_at = len(tracer.calls)
            super().close()

    dev: Any = None
    try:
        dev = TracedNVDevice(tracer)  # type: ignore[arg-type]
    except Exception as e:
        n = tracer.cleanup_at if tracer.cleanup_at is not None else len(tracer.calls)
        step = tracer.calls[n - 1] if n else "start"
        where = "at" if n - 1 in tracer.failed else "after"  # a driver call failed, or Python after it
        r.add(sec, "bring-up", Status.FAIL, f"failed {where} step '{step}' (driver call {n}): "
                                            f"{explain(e, r.sandbox)}")
        d.block(f"bring-up failed {where} '{step}': {type(e).__name__}: {e}")
    if dev is not None:
        try:
            _describe_gpu(d, dev, tracer)
        finally:
            with d.guard(sec, "close", block_nv=True):
                before = len(tracer.calls)
                dev.close()
                r.add(sec, "close", Status.OK,
                      f"device closed again ({len(tracer.calls) - before} driver calls)")
    r.issued = list(tracer.calls)
    leaks = getattr(base_os, "leaks", None)  # MockNV: everything still alive in the mock driver
    if callable(leaks):
        with d.guard(sec, "mock leaks"):
            left = {k: v for k, v in leaks().items() if v}
            if left:
                r.add(sec, "mock leaks", Status.FAIL, f"left after close: {left}")
            else:
                r.add(sec, "mock leaks", Status.OK,
                      "no RM objects, mappings, UVM ranges or fds left after close")


def _describe_gpu(d: _Diagnosis, dev: Any, tracer: TracingOS) -> None:
    r, sec = d.report, "NV bring-up"
    r.add(sec, "bring-up", Status.OK,
          f"NVDevice up in {len(tracer.calls)} driver calls (client, UVM, device, classes, VA space, TSG, "
          f"compute + copy channels); both channels ran their bootstrap push (timeline {dev.timeline_value})")
    d.bringup_ok = True
    name: str | None = None
    with d.guard(sec, "gpu name"):
        name = read_gpu_name(dev)
        r.add(sec, "gpu name", Status.OK, f"{name} (PCI device {dev.pci_device_id:#06x}, "
                                          f"{GPU_NODE_PREFIX}{dev.minor})")
    with d.guard(sec, "arch"):
        sm = int(dev.gr_info["sm_version"])
        info = GPUInfo(
            name=name, pci_device_id=dev.pci_device_id, minor=dev.minor, uuid=format_uuid(dev.uuid),
            sm_version=sm, arch=sm_arch(sm), family=ARCH_NAMES.get(sm, f"unknown SM version {sm:#x}"),
            gr_info=dict(dev.gr_info), classes=frozenset(dev.classes), compute_class=dev.compute_class,
            copy_class=dev.copy_class, gpfifo_class=dev.gpfifo_class, usermode_class=dev.usermode_class)
        r.gpu = info
        g = info.gr_info
        sms = g["gpcs"] * g["tpc_per_gpc"] * g["sm_per_tpc"]
        r.add(sec, "arch", Status.OK if sm in ARCH_NAMES else Status.WARN,
              f"{info.arch}, {info.family}; up to {sms} SMs ({g['gpcs']} GPCs x {g['tpc_per_gpc']} TPCs x "
              f"{g['sm_per_tpc']}, chip maximum), {g['max_warps_per_sm']} warps/SM; {info.uuid}")
        chosen = ", ".join(f"{k} {_class_label(v)}" for k, v in info.chosen_classes.items())
        r.add(sec, "classes", Status.OK, f"{chosen}; Hopper classes: {'yes' if info.hopper else 'no'} "
                                         f"({len(info.classes)} classes exposed)")


def _check_assembler(d: _Diagnosis) -> None:
    r, sec = d.report, "NV kernels"
    # a missing assembler stops a real GPU; the mock interprets the PTX itself; without a driver it is moot
    severity = Status.FAIL if d.real and d.driver_present else Status.WARN
    with d.guard(sec, "assembler"):
        from rawgrad.drivers.nv import cubin

        # find_ptxas / ptxas_version are newer than find_nvjitlink: an older cubin.py simply has no ptxas
        find_ptxas = getattr(cubin, "find_ptxas", None)
        ptxas = find_ptxas() if callable(find_ptxas) else None
        jitlink = cubin.find_nvjitlink()
        found: list[str] = []
        if ptxas:
            ptxas_version = getattr(cubin, "ptxas_version", None)
            try:
                release = ptxas_version(ptxas)[0] if callable(ptxas_version) else None
            except Exception as e:  # found but does not run: say so, nvJitLink may still serve
                r.add(sec, "ptxas", severity, f"{ptxas} does not run: {explain(e)}")
            else:
                found.append(f"ptxas {ptxas}" + (f" (CUDA {release[0]}.{release[1]})" if release else ""))
                gpu = r.gpu
                # the oldest CUDA release whose ptxas knows this SM, keyed by the number in "sm_90"
                need = getattr(cubin, "MIN_PTXAS_RELEASE", {}).get(int(gpu.arch[3:])) if gpu else None
                if gpu is not None and release and need and release < need:
                    r.add(sec, "ptxas", severity, f"{ptxas} is CUDA {release[0]}.{release[1]}; {gpu.arch} "
                                                  f"needs {need[0]}.{need[1]} or newer")
                    found.pop()
        if jitlink is not None:
            found.append(f"nvJitLink {getattr(jitlink, 'path', jitlink)}")
        if found:
            r.add(sec, "assembler", Status.OK, "PTX -> cubin through " + " and ".join(found))
            return
        if not d.real:
            r.add(sec, "assembler", Status.WARN, f"none found; the mock runs the PTX itself, a real GPU "
                                                 f"cannot. {ASSEMBLER_HINT}")
        elif d.driver_present:
            r.add(sec, "assembler", Status.FAIL, ASSEMBLER_HINT)
            d.block("no usable ptxas / nvJitLink to build kernels")
        else:
            r.add(sec, "assembler", Status.WARN, f"none found (only matters with a GPU). {ASSEMBLER_HINT}")


def _mock_os(profile: str) -> Any:
    from rawgrad.drivers.nv.mock import AMPERE, H100, MockNV

    if profile not in MOCK_PROFILE_NAMES:
        raise ValueError(f"NV_MOCK_PROFILE={profile!r}; expected one of {', '.join(MOCK_PROFILE_NAMES)}")
    return MockNV(H100 if profile == "h100" else AMPERE)


def diagnose(os_iface: OSInterface | None = None, *, mock: bool | None = None,
             sandbox: SandboxInfo | None = None, amd_os: Any = None,
             amd_mock: bool | None = None) -> DoctorReport:
    """Run every check and return the report.

    ``os_iface``: the OS seam the NV checks use; by default the real libc one, or (NV_MOCK=1, or
    ``mock=True``) a fresh :class:`MockNV` for ``NV_MOCK_PROFILE`` that is shut down again here. A given
    ``os_iface`` counts as the mock when it is a MockNV, unless ``mock`` says otherwise (e.g. a wrapper
    around one). ``sandbox``: precomputed sandbox markers (default: :func:`detect_sandbox`). ``amd_os``: the
    OS seam of the AMD checks (default: libc, or with AMD_MOCK=1 / ``amd_mock=True`` a fresh mock AMD GPU);
    a given ``amd_os`` is a mock unless ``amd_mock=False``."""
    if os_iface is None:
        use_mock = config.NV_MOCK() if mock is None else mock
    else:
        use_mock = type(os_iface).__name__ == "MockNV" if mock is None else mock
    report = DoctorReport(mock=use_mock)
    owned: Any = None
    try:
        report.sandbox = sandbox if sandbox is not None else detect_sandbox()
        if os_iface is not None:
            base: OSInterface = os_iface
        elif use_mock:
            report.mock_profile = config.NV_MOCK_PROFILE()
            owned = base = _mock_os(report.mock_profile)
        else:
            base = LibcOS()
        d = _Diagnosis(report, base, real=not use_mock)
        _check_platform(d)
        _check_nodes(d)
        _check_proc_version(d)
        _check_driver_version(d)
        _check_sandbox(d)
        _check_bringup(d, base)
        _check_assembler(d)
        _check_amd(report, amd_os, amd_mock)
        _check_metal(report)
        nv_ok = d.bringup_ok and d.nv_blocker is None
        if nv_ok and use_mock:
            why = "mock driver: bring-up OK; kernels would run in the mock's PTX interpreter"
        elif nv_ok:
            why = f"{report.gpu.name if report.gpu else 'GPU'} brought up and closed again cleanly"
        else:
            why = d.nv_blocker or "bring-up did not complete"
        report.paths.insert(1, PathVerdict("NV", nv_ok, why))
        report.abi_branch = d.branch or sorted(abi.LAYOUTS)[0]
        report.abi_surface = abi_surface(report.issued, report.abi_branch)
    except Exception as e:  # an error outside every check's guard: still return what was found
        report.add("doctor", "internal", Status.FAIL, explain(e))
    finally:
        if owned is not None:
            owned.shutdown()
    return report


# ---------------------------------------------------------------------------------------------- Metal
METAL_SECTION = "Apple GPU (Metal)"
METAL_VERIFIED = ("Metal support is verified on a Linux mock only (rawgrad's fake Objective-C runtime; the "
                  "MSL built and run by the host C++ compiler): no Mac has run rawgrad yet "
                  "(`python -m rawgrad metal-smoke` is the checklist for the first one)")


def _check_metal(report: DoctorReport) -> None:
    """The Metal section (see the module docstring); adds the METAL path verdict. Never raises."""
    from rawgrad.drivers import metal

    sec = METAL_SECTION
    report.metal_mock = metal.mock_requested()
    report.add(sec, "verified", Status.WARN, METAL_VERIFIED)
    why = metal.missing_driver()
    if why is not None:
        report.add(sec, "platform", Status.SKIP, f"{why} (METAL_MOCK=1 runs the mock Apple GPU)")
        report.paths.append(PathVerdict("METAL", False, why))
        return
    lines: list[str] = []
    dev: Any = None
    try:
        from rawgrad.drivers.metal.device import MetalDevice, open_mock
        from rawgrad.drivers.metal.smoke import run_steps
        dev = open_mock("METAL:doctor") if report.metal_mock else MetalDevice("METAL:doctor")
        ok = run_steps(dev, lines.append)
    except Exception as e:  # opening failed, or a step raised outside its own guard
        lines.append(f"FAIL open: {explain(e)}")
        ok = False
    finally:
        if dev is not None:
            try:
                dev.close()
            except Exception as e:  # a close that fails is a finding too, never a crash
                lines.append(f"FAIL close: {explain(e)}")
                ok = False
    for line in lines:
        status, _, rest = line.partition(" ")
        check, _, detail = rest.strip().partition(": ")
        report.add(sec, check, Status.OK if status == "ok" else Status.FAIL, detail)
    failed = next((ln for ln in lines if ln.startswith("FAIL")), None)
    if ok and failed is None:
        reason = ("mock runtime: every smoke step passed, the kernels ran as host-built MSL (not a Mac)"
                  if report.metal_mock else "every smoke step passed and the device closed cleanly")
        report.paths.append(PathVerdict("METAL", True, reason))
    else:
        report.paths.append(PathVerdict("METAL", False, failed or "the smoke steps did not complete"))


# ------------------------------------------------------------------------------------------------ AMD
AMD_SECTION = "AMD GPU (KFD)"
AMD_VERIFIED = ("AMD support is verified on a mock KFD + command processor only: no real AMD GPU has run "
                "rawgrad yet (`python -m rawgrad amd-smoke` is the bring-up checklist for the first one)")
AMD_PERMISSION_HINT = ("add your user to the 'render' group (and 'video' on older distributions), or run the "
                       "container with --device=/dev/kfd --device=/dev/dri")


def _check_amd(report: DoctorReport, amd_os: Any, amd_mock: bool | None) -> None:
    """The AMD section (see the module docstring); adds the AMD path verdict. Never raises."""
    sec = AMD_SECTION
    use_mock = (amd_os is not None or config.getenv_int("AMD_MOCK") != 0) if amd_mock is None else amd_mock
    report.amd_mock = use_mock
    report.add(sec, "verified", Status.WARN, AMD_VERIFIED)
    owned: Any = None
    blocker: str | None = None
    try:
        if amd_os is None and use_mock:
            from rawgrad.drivers.amd.device import MockAMD
            owned = MockAMD()
            amd_os = owned.kfd
        elif amd_os is None:
            amd_os = LibcOS()
        blocker = _amd_checks(report, amd_os, owned)
    except Exception as e:  # outside the checks' own handling: one finding, never a crash
        blocker = explain(e)
        report.add(sec, "internal", Status.FAIL, blocker)
    finally:
        if owned is not None:
            owned.shutdown()
    works = blocker is None
    if works:
        reason = ("mock KFD: bring-up OK and a kernel ran on the RDNA3 interpreter (not hardware)" if use_mock
                  else "brought up and closed again cleanly (unverified on real AMD hardware before this)")
    else:
        reason = blocker or "bring-up did not complete"
    report.paths.append(PathVerdict("AMD", works, reason))


def _amd_checks(report: DoctorReport, os_iface: Any, mock: Any) -> str | None:
    """Each step in order; the first that fails stops the rest (they depend on it). Returns the blocker."""
    from rawgrad.drivers.amd import abi as amd_abi
    from rawgrad.drivers.amd.device import MIN_KFD_VERSION, AMDDevice
    from rawgrad.drivers.amd.topology import KFD_PATH, SUPPORTED_TARGETS, TopologyError, gpu_nodes

    sec = AMD_SECTION
    if not os_iface.exists(KFD_PATH):
        msg = (f"{KFD_PATH} is missing: no amdgpu kernel driver (KFD) here, or its device nodes are not "
               f"passed into this container (AMD_MOCK=1 runs the mock AMD GPU)")
        report.add(sec, KFD_PATH, Status.SKIP, msg)
        return msg
    try:
        fd = os_iface.open(KFD_PATH, O_RDWR | O_CLOEXEC)
    except OSError as e:
        if e.errno in PERMISSION_ERRNOS:
            msg = f"open({KFD_PATH}): {errno_name(e.errno)}, permission denied: {AMD_PERMISSION_HINT}"
        else:
            msg = f"open({KFD_PATH}): {explain(e)}"
        report.add(sec, KFD_PATH, Status.FAIL, msg)
        return msg
    try:
        report.add(sec, KFD_PATH, Status.OK, "present and opened read-write")
        call = amd_abi.get_version()
        os_iface.ioctl(fd, call.request, call.args)
        version = amd_abi.decode_version(call)
    except OSError as e:
        msg = f"AMDKFD_IOC_GET_VERSION: {explain(e)}"
        report.add(sec, "KFD version", Status.FAIL, msg)
        return msg
    finally:
        os_iface.close(fd)
    shown = f"{version[0]}.{version[1]}"
    oldest = f"{MIN_KFD_VERSION[0]}.{MIN_KFD_VERSION[1]}"
    if version < MIN_KFD_VERSION:
        msg = (f"KFD {shown} is too old: rawgrad's CREATE_QUEUE needs KFD {oldest} or newer (Linux 5.x "
               f"kernels with a current amdgpu)")
        report.add(sec, "KFD version", Status.FAIL, msg)
        return msg
    report.add(sec, "KFD version", Status.OK, f"{shown} (rawgrad needs {oldest} or newer)")
    try:
        nodes = gpu_nodes(os_iface)
    except (OSError, TopologyError) as e:
        msg = f"topology: {explain(e)}"
        report.add(sec, "topology", Status.FAIL, msg)
        return msg
    if not nodes:
        msg = ("the KFD topology lists no GPU node (every node is CPU-only): no AMD GPU is visible to this "
               "process; " + AMD_PERMISSION_HINT)
        report.add(sec, "topology", Status.FAIL, msg)
        return msg
    supported = [n for n in nodes if n.target in SUPPORTED_TARGETS]
    for n in nodes:
        what = (f"node {n.node_id}: {n.target}, {n.cu_count} CUs, wave{n.wave_size}, device id "
                f"{n.device_id:#06x}, render node {n.render_node}")
        if n.target in SUPPORTED_TARGETS:
            report.add(sec, f"GPU node {n.node_id}", Status.OK, what)
        else:
            report.add(sec, f"GPU node {n.node_id}", Status.WARN,
                       f"{what}: unsupported gfx target (rawgrad has code generation for "
                       f"{', '.join(SUPPORTED_TARGETS)} only)")
    if not supported:
        msg = (f"no supported AMD GPU: found {', '.join(n.target for n in nodes)}; rawgrad drives "
               f"{', '.join(SUPPORTED_TARGETS)}")
        report.add(sec, "supported GPU", Status.FAIL, msg)
        return msg
    node = supported[0]
    try:
        rfd = os_iface.open(node.render_node, O_RDWR | O_CLOEXEC)
        os_iface.close(rfd)
    except OSError as e:
        hint = f": {AMD_PERMISSION_HINT}" if e.errno in PERMISSION_ERRNOS else ""
        msg = f"open({node.render_node}): {explain(e)}{hint}"
        report.add(sec, "render node", Status.FAIL, msg)
        return msg
    report.add(sec, "render node", Status.OK, f"{node.render_node} opened read-write")
    try:
        dev = AMDDevice("AMD", mock=mock) if mock is not None else AMDDevice("AMD", os_iface)
    except Exception as e:
        msg = f"bring-up: {explain(e)}"
        report.add(sec, "bring-up", Status.FAIL, msg)
        return msg
    try:
        what = (f"{dev.arch}: ACQUIRE_VM, memory, a PM4 and an SDMA queue, events "
                f"({'interrupt-driven waits' if dev.signal_event is not None else 'polled waits'})")
        if mock is not None:
            import numpy as np

            src, dst = dev.allocator.alloc(64), dev.allocator.alloc(64)
            dev.allocator.copyin(src, np.arange(16, dtype=np.int32).data)
            dev.timeline_submit(lambda q: q.copy(dst.va_addr, src.va_addr, 64))
            out = np.zeros(16, np.int32)
            dev.allocator.copyout(out.data, dst)
            if not np.array_equal(out, np.arange(16)):
                raise AssertionError(f"the copy kernel gave {out.tolist()}")
            what += "; the copy kernel ran on the RDNA3 interpreter"
        report.add(sec, "bring-up", Status.OK, what)
    except Exception as e:
        msg = f"bring-up: {explain(e)}"
        report.add(sec, "bring-up", Status.FAIL, msg)
        return msg
    finally:
        dev.close()
    return None


# ------------------------------------------------------------------------------------------------ render
_KIND_TITLES = {
    "escape": "NV escapes (ioctls on /dev/nvidiactl and /dev/nvidiaN)",
    "uvm": "UVM ioctls (/dev/nvidia-uvm)",
    "class": "RM classes (NV_ESC_RM_ALLOC / NV_ESC_RM_ALLOC_MEMORY)",
    "control": "RM controls (NV_ESC_RM_CONTROL)",
}


def render(report: DoctorReport, verbose: bool = False) -> str:
    """The report as text: a banner on the mock, findings by section, path verdicts, the driver surface."""
    lines = ["rawgrad doctor"]
    if report.mock:
        profile = f", profile {report.mock_profile}" if report.mock_profile else ""
        lines += ["", f"*** MOCK DRIVER (NV_MOCK=1{profile}): the NV checks ran against rawgrad's mock "
                      f"NVIDIA kernel driver, not a GPU. ***",
                  "*** Nothing under 'NVIDIA driver', 'NV bring-up' or the NV path describes a real GPU. ***"]
    if report.amd_mock:
        lines += ["", "*** MOCK AMD GPU (AMD_MOCK=1): the AMD checks ran against rawgrad's mock KFD and "
                      "command processor, not a GPU. ***"]
    if report.metal_mock:
        lines += ["", "*** MOCK METAL (METAL_MOCK=1): the Metal checks ran against rawgrad's fake "
                      "Objective-C runtime on this host, not a Mac. ***"]
    section = None
    width = max((len(f.check) for f in report.findings), default=10)
    for f in report.findings:
        if f.section != section:
            section = f.section
            lines += ["", section]
        lines.append(f"  [{f.status.value:4s}] {f.check:<{width}}  {f.message}")
    lines += ["", "Paths"]
    for p in report.paths:
        lines.append(f"  {p.device:5s} {'yes' if p.works else 'no '}  {p.reason}")
    by_kind: dict[str, list[AbiEntry]] = {}
    for e in report.abi_surface:
        by_kind.setdefault(e.kind, []).append(e)
    if by_kind:
        lines += ["", "Driver surface (from rawgrad/drivers/nv/abi.py)"]
        lines += _render_surface(report, by_kind, verbose)
    n = Counter(f.status for f in report.findings)
    lines += ["", f"{n[Status.OK]} ok, {n[Status.WARN]} warn, {n[Status.FAIL]} fail, {n[Status.SKIP]} skip; "
                  f"exit status {report.exit_code}"]
    return "\n".join(lines)


def _render_surface(report: DoctorReport, by_kind: dict[str, list[AbiEntry]], verbose: bool) -> list[str]:
    lines: list[str] = []
    counts = ", ".join(f"{len(v)} {_KIND_TITLES[k].split(' (')[0]}" for k, v in by_kind.items())
    ioctls = [c for c in report.issued if not c.startswith("open ")]
    issued = (f"this bring-up issued {len(ioctls)} ioctls of {len(set(ioctls))} kinds" if ioctls
              else "no bring-up ran here, so nothing was issued")
    lines.append(f"  rawgrad speaks {counts}; {issued}" + ("" if verbose else " (--verbose lists them)"))
    if verbose:
        lines.append(f"  (ioctl numbers for the {report.abi_branch} layouts; 'issued xN': sent N times by "
                     f"this bring-up; blank: not part of bring-up)")
        for kind, entries in by_kind.items():
            lines.append(f"  {_KIND_TITLES[kind]}:")
            for e in entries:
                if kind == "escape":
                    num = f"nr {e.number:#04x}  " + (f"ioctl {e.request:#010x}" if e.request is not None
                                                      else "ioctl n/a")
                else:
                    num = f"{e.number:#010x}"
                used = f"issued x{e.issued}" if e.issued else ""
                lines.append(f"    {e.name:<46s} {num:<28s} {used}".rstrip())
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rawgrad doctor",
                                     description="Which device paths work here, and why the others do not.")
    parser.add_argument("--verbose", action="store_true", help="list every ioctl, RM class and control")
    args = parser.parse_args(argv)
    report = diagnose()
    print(render(report, verbose=args.verbose))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
