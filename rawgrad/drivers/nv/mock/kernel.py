"""Mock NVIDIA kernel driver implementing the OS seam.

Emulates ``/dev/nvidiactl``, ``/dev/nvidiaN`` and ``/dev/nvidia-uvm`` with the parameter-size checks
and status codes of the 580 driver (NV-FACTS 1.2-1.6), an RM object tree, UVM VA spaces, and memory
backed by real host pages (memfd for VRAM/sysmem, the caller's pages for OS descriptors), so the
driver's CPU mappings and the mock GPU (``gpu.py``) see the same bytes.
"""

from __future__ import annotations

import bisect
import errno
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rawgrad.drivers import osapi
from rawgrad.drivers.memfd import Memfd
from rawgrad.drivers.memfd import ffi as _ffi
from rawgrad.drivers.memfd import libc as _libc
from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv.mock.gpu import ChannelState, GPUMapping, MockGPU

CTL_PATH = "/dev/nvidiactl"
UVM_PATH = "/dev/nvidia-uvm"
GPU_PATH_PREFIX = "/dev/nvidia"
_FD_BASE = 1000  # mock fds live far from real ones so a mix-up fails loudly
_CLIENT_HANDLE_BASE = 0xC1D00000  # mock choice: RM-picked client handles
_OBJECT_HANDLE_BASE = 0xCAF00000  # mock choice: RM-picked object handles
_MAP_COOKIE_BASE = 0x7E0000000000  # mock choice: NVOS33 pLinearAddress cookies
_FAKE_PHYS_BASE = 0x200000000  # mock choice: "physical" addresses reported for VRAM


@dataclass(frozen=True)
class GPUProfile:
    """What a mock GPU exposes."""

    name: str
    pci_device_id: int
    sm_version: int
    usermode_classes: tuple[int, ...]
    gpfifo_classes: tuple[int, ...]
    compute_classes: tuple[int, ...]
    copy_classes: tuple[int, ...]
    litter_gpcs: int
    tpc_per_gpc: int
    sm_per_tpc: int
    max_warps_per_sm: int
    vram_bytes: int
    uuid: bytes

    @property
    def classes(self) -> tuple[int, ...]:
        base = (
            abi.NV01_DEVICE_0,
            abi.NV20_SUBDEVICE_0,
            abi.NV01_MEMORY_SYSTEM,
            abi.NV01_MEMORY_LOCAL_USER,
            abi.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
            abi.FERMI_VASPACE_A,
            abi.FERMI_CONTEXT_SHARE_A,
            abi.KEPLER_CHANNEL_GROUP_A,
        )
        return base + self.usermode_classes + self.gpfifo_classes + self.compute_classes + self.copy_classes


# GH100 exposes only the Hopper compute/copy classes (g_gpu_class_list.c; NV-FACTS 2.1).
H100 = GPUProfile(
    "NVIDIA H100 (mock)",
    0x2330,
    0x900,
    (abi.HOPPER_USERMODE_A, abi.AMPERE_USERMODE_A, abi.TURING_USERMODE_A),
    (abi.HOPPER_CHANNEL_GPFIFO_A, abi.AMPERE_CHANNEL_GPFIFO_A),
    (abi.HOPPER_COMPUTE_A,),
    (abi.HOPPER_DMA_COPY_A,),
    8,
    9,
    2,
    64,
    80 << 30,
    bytes(range(0x10, 0x20)),
)
# GA10x: AMPERE_COMPUTE_B + AMPERE_DMA_COPY_B, Ampere host/usermode classes.
AMPERE = GPUProfile(
    "NVIDIA GA102 (mock)",
    0x2204,
    0x806,
    (abi.AMPERE_USERMODE_A, abi.TURING_USERMODE_A),
    (abi.AMPERE_CHANNEL_GPFIFO_A,),
    (abi.AMPERE_COMPUTE_B,),
    (abi.AMPERE_DMA_COPY_B,),
    7,
    6,
    2,
    48,
    24 << 30,
    bytes(range(0x30, 0x40)),
)


class MemObject:
    """Payload of an RM memory (or usermode MMIO) object."""

    def __init__(self, kind: str, size: int, host_addr: int, backing: Memfd | None):
        self.kind, self.size, self.host_addr, self.backing = kind, size, host_addr, backing
        self.refs = 1  # the RM object itself; UVM and CPU mappings add more

    def unref(self) -> None:
        self.refs -= 1
        if self.refs == 0 and self.backing is not None:
            self.backing.release()
            self.backing = None


@dataclass
class RmObject:
    handle: int
    cls: int
    parent: RmObject | None
    client: Client
    children: list[RmObject] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    mem: MemObject | None = None


@dataclass
class Client:
    handle: int
    fd: int
    objects: dict[int, RmObject] = field(default_factory=dict)
    next_handle: int = _OBJECT_HANDLE_BASE


@dataclass
class UvmRange:
    base: int
    length: int
    kind: str  # "external" | "channel"
    mappings: list[GPUMapping] = field(default_factory=list)


class UvmSpace:
    """UVM state of one initialized ``/dev/nvidia-uvm`` fd (its VA space)."""

    def __init__(self) -> None:
        self.ranges: dict[int, UvmRange] = {}
        self._starts: list[int] = []
        self._maps: list[GPUMapping] = []
        self._map_starts: list[int] = []
        self.gpu_registered = False
        self.vaspace: RmObject | None = None
        self.channels: dict[tuple[int, int], UvmRange] = {}

    def overlaps(self, base: int, length: int) -> bool:
        return any(r.base < base + length and base < r.base + r.length for r in self.ranges.values())

    def add_range(self, r: UvmRange) -> None:
        self.ranges[r.base] = r
        bisect.insort(self._starts, r.base)

    def range_containing(self, base: int, length: int) -> UvmRange | None:
        i = bisect.bisect_right(self._starts, base) - 1
        if i < 0:
            return None
        r = self.ranges[self._starts[i]]
        return r if base + length <= r.base + r.length else None

    def remove_range(self, r: UvmRange) -> None:
        for m in r.mappings:
            self._unmap(m)
        del self.ranges[r.base]
        self._starts.remove(r.base)

    def add_mapping(self, r: UvmRange, m: GPUMapping) -> None:
        r.mappings.append(m)
        i = bisect.bisect_left(self._map_starts, m.va)
        self._map_starts.insert(i, m.va)
        self._maps.insert(i, m)
        m.mem.refs += 1

    def _unmap(self, m: GPUMapping) -> None:
        i = self._maps.index(m)
        del self._maps[i], self._map_starts[i]
        m.mem.unref()

    def lookup(self, va: int) -> GPUMapping | None:
        i = bisect.bisect_right(self._map_starts, va) - 1
        if i >= 0 and va < self._maps[i].va + self._maps[i].length:
            return self._maps[i]
        return None


@dataclass
class FdState:
    fd: int
    kind: str  # "ctl" | "gpu" | "uvm"
    path: str
    minor: int = -1
    ctl_fd: int | None = None  # a gpu fd's registered control fd
    pending_map: dict[str, Any] | None = None
    uvm: UvmSpace | None = None
    uvm_mm: bool = False


@dataclass
class CpuMapping:
    addr: int
    length: int
    obj: RmObject
    cookie: int


class MockUsageError(RuntimeError):
    """The driver used the mock in a way the real OS would not allow (e.g. MMIO on plain memory)."""


class _RmFail(Exception):
    def __init__(self, status: str):
        self.status = abi.NV_STATUS[status]


class MockNV:
    """OSInterface that emulates the NVIDIA kernel driver for one mock GPU."""

    def __init__(
        self,
        profile: GPUProfile = H100,
        *,
        version: str = "580.159.04",
        minor: int = 0,
        execute_kernels: bool = False,
        strict_uvm_mm: bool = False,
    ):
        self.profile, self.version, self.minor = profile, version, minor
        self.abi = abi.abi_for_branch("580")  # the mock *is* a 580 driver, whatever version string it reports
        self.lock = threading.RLock()
        self.gpu = MockGPU(self.lock, execute_kernels=execute_kernels, sm_version=profile.sm_version,
                           max_warps_per_sm=profile.max_warps_per_sm, sm_per_tpc=profile.sm_per_tpc)
        self.real = osapi.LibcOS()
        self.fds: dict[int, FdState] = {}
        self._next_fd = _FD_BASE
        self.clients: dict[int, Client] = {}
        self._next_client = _CLIENT_HANDLE_BASE
        self.rm_maps: dict[int, CpuMapping | dict[str, Any]] = {}
        self.cpu_maps: dict[int, CpuMapping] = {}
        self._next_cookie = _MAP_COOKIE_BASE
        self._next_phys = _FAKE_PHYS_BASE
        self.vram_used = 0
        self.calls: list[str] = []  # every RM/UVM call made, in order ("ALLOC HOPPER_COMPUTE_A", ...)
        self.auto_freed: list[str] = []  # objects the mock had to free on fd close (driver leaks)
        self.fence_count = 0
        self.uvm_gpu_uuid = profile.uuid
        self.strict_uvm_mm = strict_uvm_mm

    # ==========================================================================================
    # OSInterface
    def open(self, path: str, flags: int) -> int:
        with self.lock:
            if path == CTL_PATH:
                st = FdState(0, "ctl", path)
            elif path == UVM_PATH:
                st = FdState(0, "uvm", path)
            elif path == f"{GPU_PATH_PREFIX}{self.minor}":
                st = FdState(0, "gpu", path, minor=self.minor)
            else:
                raise osapi.os_error(f"open({path})", errno.ENOENT)
            st.fd = self._next_fd
            self._next_fd += 1
            self.fds[st.fd] = st
            return st.fd

    def close(self, fd: int) -> None:
        with self.lock:
            st = self.fds.pop(fd, None)
            if st is None:
                raise osapi.os_error(f"close({fd})", errno.EBADF)
            if st.kind == "ctl":
                for c in [c for c in self.clients.values() if c.fd == fd]:
                    self.auto_freed.extend(self._describe(o) for o in c.objects.values())
                    self._free_client(c)
            if st.kind == "uvm" and st.uvm is not None:
                for r in list(st.uvm.ranges.values()):
                    self.auto_freed.append(f"UVM range {r.base:#x}+{r.length:#x} ({r.kind})")
                    st.uvm.remove_range(r)
                if st.uvm.vaspace is not None:
                    st.uvm.vaspace.data.pop("uvm", None)

    def exists(self, path: str) -> bool:
        return path in (CTL_PATH, UVM_PATH, f"{GPU_PATH_PREFIX}{self.minor}")

    def read(self, fd: int, n: int) -> bytes:
        raise osapi.os_error(f"read({fd})", errno.EINVAL)

    def store_fence(self) -> None:
        self.fence_count += 1

    def gpfifo_publisher(self, ring: int, entries: int, put_word: int, doorbell: int,
                         token: int) -> Callable[[int, int], None]:
        """The publish sequence in Python: fences are counted and the doorbell goes to the mock GPU."""
        ring_p = _ffi.cast("volatile uint64_t *", ring)
        put_p = _ffi.cast("volatile uint32_t *", put_word)

        def publish(slot: int, entry: int) -> None:
            ring_p[slot] = entry
            self.store_fence()
            put_p[0] = (slot + 1) % entries
            self.store_fence()
            self.mmio_write32(doorbell, token)
        return publish

    def mmio_write32(self, addr: int, value: int) -> None:
        with self.lock:
            m, off = self._mmio(addr)
            if off == 0x90:  # NVC361_NOTIFY_CHANNEL_PENDING: the doorbell
                self.gpu.kick(value)
            else:
                raise MockUsageError(f"write to usermode MMIO offset {off:#x} is not emulated")

    def mmio_read32(self, addr: int) -> int:
        with self.lock:
            _, off = self._mmio(addr)
            t = self.gpu.now_ns()
            if off == 0x80:  # NVC361_TIME_0: bits 31:5 valid
                return t & 0xFFFFFFE0
            if off == 0x84:  # NVC361_TIME_1: bits 28:0
                return (t >> 32) & 0x1FFFFFFF
            raise MockUsageError(f"read of usermode MMIO offset {off:#x} is not emulated")

    def _mmio(self, addr: int) -> tuple[CpuMapping, int]:
        for m in self.cpu_maps.values():
            if m.addr <= addr < m.addr + m.length and m.obj.cls in self.profile.usermode_classes:
                return m, addr - m.addr
        raise MockUsageError(f"MMIO access at {addr:#x} is not inside a mapped usermode region")

    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
        with self.lock:
            if fd == -1:
                if flags & osapi.MAP_FIXED:  # replacing pages drops any device mapping there
                    self._forget_cpu_maps(addr, length)
                return self.real.mmap(addr, length, prot, flags, fd, offset)
            st = self.fds.get(fd)
            if st is None:
                raise osapi.os_error("mmap", errno.EBADF)
            ctx = st.pending_map
            if ctx is None:
                raise osapi.os_error("mmap (no prior NV_ESC_RM_MAP_MEMORY on this fd)", errno.EINVAL)
            if offset != 0:
                raise osapi.os_error("mmap (file offset must be 0)", errno.EINVAL)
            if st.kind == "gpu" and length != ctx["length"]:
                raise osapi.os_error(f"mmap length {length:#x} != mapped {ctx['length']:#x}", errno.ENXIO)
            obj: RmObject = ctx["obj"]
            mem = obj.mem
            assert mem is not None and mem.backing is not None
            if flags & osapi.MAP_FIXED:
                self._forget_cpu_maps(addr, length)
            ptr = _libc.mmap(
                _ffi.cast("void *", addr),
                length,
                prot,
                (flags & ~osapi.MAP_PRIVATE) | osapi.MAP_SHARED,
                mem.backing.fd,
                ctx["offset"],
            )
            res = int(_ffi.cast("uintptr_t", ptr))
            if res == osapi.MAP_FAILED:
                raise osapi.os_error("mmap(device memory)", _ffi.errno)
            st.pending_map = None
            cm = CpuMapping(res, length, obj, ctx["cookie"])
            self.cpu_maps[res] = cm
            self.rm_maps[ctx["cookie"]] = cm
            mem.refs += 1
            return res

    def _forget_cpu_maps(self, addr: int, length: int) -> None:
        for a, m in list(self.cpu_maps.items()):
            if m.addr < addr + length and addr < m.addr + m.length:
                if not (addr <= m.addr and m.addr + m.length <= addr + length):
                    raise MockUsageError(f"partial unmap of device mapping {m.addr:#x}+{m.length:#x}")
                del self.cpu_maps[a]
                assert m.obj.mem is not None
                m.obj.mem.unref()

    def munmap(self, addr: int, length: int) -> None:
        with self.lock:
            self._forget_cpu_maps(addr, length)
            self.real.munmap(addr, length)

    def ioctl(self, fd: int, request: int, buf: Any) -> int:
        with self.lock:
            st = self.fds.get(fd)
            if st is None:
                raise osapi.os_error("ioctl", errno.EBADF)
            addr = int(_ffi.cast("uintptr_t", buf))
            if st.kind == "uvm":
                return self._uvm_ioctl(st, request, addr)
            return self._nv_ioctl(st, request, addr)

    # ==========================================================================================
    # Leak tracking / introspection
    def leaks(self) -> dict[str, list[str]]:
        """Everything still alive; all lists empty after a clean driver close()."""
        with self.lock:
            out: dict[str, list[str]] = {
                "objects": [self._describe(o) for c in self.clients.values() for o in c.objects.values()],
                "rm_mappings": [f"cookie {k:#x}" for k in self.rm_maps],
                "cpu_mappings": [
                    f"{m.addr:#x}+{m.length:#x} of {self._describe(m.obj)}" for m in self.cpu_maps.values()
                ],
                "uvm_ranges": [
                    f"{r.base:#x}+{r.length:#x} ({r.kind})"
                    for st in self.fds.values()
                    if st.uvm
                    for r in st.uvm.ranges.values()
                ],
                "fds": [f"{st.fd} {st.path}" for st in self.fds.values()],
                "auto_freed": list(self.auto_freed),
            }
            return out

    def shutdown(self) -> None:
        """Stop the GPU thread (tests call this in teardown)."""
        self.gpu.shutdown()

    def _describe(self, o: RmObject) -> str:
        return f"{abi.CLASS_NAMES.get(o.cls, hex(o.cls))} {o.handle:#x}"

    def find_objects(self, cls: int) -> list[RmObject]:
        return [o for c in self.clients.values() for o in c.objects.values() if o.cls == cls]

    # ==========================================================================================
    # /dev/nvidiactl and /dev/nvidiaN
    def _nv_ioctl(self, st: FdState, request: int, addr: int) -> int:
        nr, size = abi.ioc_nr(request), abi.ioc_size(request)
        if abi.ioc_type(request) != abi.NV_IOCTL_MAGIC or size > abi.NV_ABSOLUTE_MAX_IOCTL_SIZE:
            raise osapi.os_error("ioctl", errno.EINVAL, f"bad NV ioctl {request:#x}")
        name = abi.ESCAPE_NAMES.get(nr, f"escape {nr:#x}")
        self.calls.append(name)
        if nr == abi.NV_ESC_CARD_INFO:
            return self._card_info(st, addr, size)
        if nr == abi.NV_ESC_CHECK_VERSION_STR:
            return self._check_version(st, addr, size)
        if nr == abi.NV_ESC_REGISTER_FD:
            return self._register_fd(st, addr, size)
        table = {
            abi.NV_ESC_RM_ALLOC: ("NVOS21_PARAMETERS", self._rm_alloc),
            abi.NV_ESC_RM_FREE: ("NVOS00_PARAMETERS", self._rm_free),
            abi.NV_ESC_RM_CONTROL: ("NVOS54_PARAMETERS", self._rm_control),
            abi.NV_ESC_RM_MAP_MEMORY: ("nv_ioctl_nvos33_parameters_with_fd", self._rm_map),
            abi.NV_ESC_RM_UNMAP_MEMORY: ("NVOS34_PARAMETERS", self._rm_unmap),
            abi.NV_ESC_RM_ALLOC_MEMORY: ("nv_ioctl_nvos02_parameters_with_fd", self._rm_alloc_memory),
        }
        if nr not in table:
            raise osapi.os_error(name, errno.EINVAL, "escape not emulated")
        ctype, handler = table[nr]
        # escape.c: the wrapper size must match exactly (NVOS64 is the only alternative for RM_ALLOC)
        if size != self.abi.sizeof(ctype):
            if nr == abi.NV_ESC_RM_ALLOC and size == self.abi.sizeof("NVOS64_PARAMETERS"):
                ctype = "NVOS64_PARAMETERS"
            else:
                raise osapi.os_error(name, errno.EINVAL, f"size {size} != sizeof({ctype})")
        ctl_only = nr != abi.NV_ESC_RM_ALLOC_MEMORY
        if (st.kind == "ctl") != ctl_only:
            raise osapi.os_error(name, errno.EINVAL, "escape issued on the wrong device node")
        p = self.abi.at(ctype, addr)
        p_status = p.params if ctype.endswith("_with_fd") else p
        try:
            handler(st, p)
            p_status.status = abi.NV_OK
        except _RmFail as e:
            p_status.status = e.status
        return 0

    def _card_info(self, st: FdState, addr: int, size: int) -> int:
        entry = self.abi.sizeof("nv_ioctl_card_info_t")
        if st.kind != "ctl" or size == 0 or size % entry:
            raise osapi.os_error("NV_ESC_CARD_INFO", errno.EINVAL)
        cards = self.abi.ffi.cast("nv_ioctl_card_info_t *", addr)
        _ffi.memmove(_ffi.cast("void *", addr), b"\0" * size, size)
        c = cards[0]
        c.valid, c.gpu_id, c.minor_number = 1, 0x100, self.minor
        c.pci_info.vendor_id, c.pci_info.device_id, c.pci_info.bus = 0x10DE, self.profile.pci_device_id, 1
        return 0

    def _check_version(self, st: FdState, addr: int, size: int) -> int:
        if st.kind != "ctl" or size != self.abi.sizeof("nv_ioctl_rm_api_version_t"):
            raise osapi.os_error("NV_ESC_CHECK_VERSION_STR", errno.EINVAL)
        p = self.abi.at("nv_ioctl_rm_api_version_t", addr)
        mine = self.version.encode()
        if p.cmd == abi.NV_RM_API_VERSION_CMD_QUERY:
            p.versionString = mine
            p.reply = abi.NV_RM_API_VERSION_REPLY_RECOGNIZED
            return 0
        theirs = self.abi.ffi.string(p.versionString)
        ok = (
            theirs == mine
            if p.cmd == abi.NV_RM_API_VERSION_CMD_STRICT
            else theirs.split(b".")[0] == mine.split(b".")[0]
        )
        p.reply = abi.NV_RM_API_VERSION_REPLY_RECOGNIZED
        if not ok:
            p.versionString = mine
            raise osapi.os_error("NV_ESC_CHECK_VERSION_STR", errno.EINVAL, "version mismatch")
        return 0

    def _register_fd(self, st: FdState, addr: int, size: int) -> int:
        if size != self.abi.sizeof("nv_ioctl_register_fd_t"):
            raise osapi.os_error("NV_ESC_REGISTER_FD", errno.EINVAL)
        ctl = self.abi.at("nv_ioctl_register_fd_t", addr).ctl_fd
        target = self.fds.get(ctl)
        if st.kind != "gpu" or st.ctl_fd is not None or target is None or target.kind != "ctl":
            raise osapi.os_error("NV_ESC_REGISTER_FD", errno.EINVAL)
        st.ctl_fd = ctl
        return 0

    # -- RM object tree --------------------------------------------------------------------------
    def _client(self, st: FdState, handle: int) -> Client:
        c = self.clients.get(handle)
        if c is None or c.fd != st.fd:
            raise _RmFail("NV_ERR_INVALID_CLIENT")
        return c

    def _obj(self, c: Client, handle: int, status: str = "NV_ERR_INVALID_OBJECT_HANDLE") -> RmObject:
        o = c.objects.get(handle)
        if o is None:
            raise _RmFail(status)
        return o

    def _params(self, cls: int, ptr: int, required: bool) -> Any:
        ctype = abi.ALLOC_PARAM_TYPES.get(cls)
        if ctype is None:
            return None
        if ptr == 0:
            if required:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            return None
        # RM copies sizeof(class params) from the user pointer, ignoring paramsSize (NV-FACTS 1.5)
        return self.abi.at(ctype, ptr)

    _PARENTS = {
        abi.NV01_DEVICE_0: "client",
        abi.NV20_SUBDEVICE_0: (abi.NV01_DEVICE_0,),
        abi.NV01_MEMORY_SYSTEM: (abi.NV01_DEVICE_0,),
        abi.NV01_MEMORY_LOCAL_USER: (abi.NV01_DEVICE_0,),
        abi.FERMI_VASPACE_A: (abi.NV01_DEVICE_0,),
        abi.KEPLER_CHANNEL_GROUP_A: (abi.NV01_DEVICE_0,),
        abi.FERMI_CONTEXT_SHARE_A: (abi.KEPLER_CHANNEL_GROUP_A,),
    }

    def _rm_alloc(self, st: FdState, p: Any) -> None:
        cls = p.hClass
        self.calls[-1] += f" {abi.CLASS_NAMES.get(cls, hex(cls))}"
        if cls == abi.NV01_ROOT_CLIENT:
            h = p.hObjectNew or self._next_client
            if h in self.clients:
                raise _RmFail("NV_ERR_INSERT_DUPLICATE_NAME")
            self._next_client = max(self._next_client, h) + 1
            c = Client(h, st.fd)
            c.objects[h] = RmObject(h, cls, None, c)
            self.clients[h] = c
            p.hObjectNew = h
            return
        if cls not in self.profile.classes:
            raise _RmFail("NV_ERR_INVALID_CLASS")
        c = self._client(st, p.hRoot)
        parent = self._obj(c, p.hObjectParent, "NV_ERR_INVALID_OBJECT_PARENT")
        allowed = self._PARENTS.get(cls)
        if allowed == "client":
            ok = parent.cls == abi.NV01_ROOT_CLIENT
        elif allowed is not None:
            ok = parent.cls in allowed
        elif cls in self.profile.usermode_classes:
            ok = parent.cls == abi.NV20_SUBDEVICE_0
        elif cls in self.profile.gpfifo_classes:
            ok = parent.cls == abi.KEPLER_CHANNEL_GROUP_A
        else:  # engine objects live on a channel
            ok = parent.cls in self.profile.gpfifo_classes
        if not ok:
            raise _RmFail("NV_ERR_INVALID_OBJECT_PARENT")
        if p.hObjectNew and p.hObjectNew in c.objects:
            raise _RmFail("NV_ERR_INSERT_DUPLICATE_NAME")
        obj = RmObject(p.hObjectNew or self._new_handle(c), cls, parent, c)
        self._construct(obj, p.pAllocParms)
        c.objects[obj.handle] = obj
        parent.children.append(obj)
        p.hObjectNew = obj.handle

    def _new_handle(self, c: Client) -> int:
        while c.next_handle in c.objects:
            c.next_handle += 1
        c.next_handle += 1
        return c.next_handle - 1

    def _construct(self, obj: RmObject, pptr: int) -> None:
        cls, prof = obj.cls, self.profile
        if cls == abi.NV01_DEVICE_0:
            prm = self._params(cls, pptr, True)
            if prm.deviceId != 0:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            if any(o.cls == cls for o in obj.client.objects.values()):
                raise _RmFail("NV_ERR_STATE_IN_USE")
        elif cls == abi.NV20_SUBDEVICE_0:
            prm = self._params(cls, pptr, True)
            if prm.subDeviceId != 0:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
        elif cls in (abi.NV01_MEMORY_LOCAL_USER, abi.NV01_MEMORY_SYSTEM):
            prm = self._params(cls, pptr, True)
            size = (prm.size + 0xFFF) & ~0xFFF
            if size == 0:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            if cls == abi.NV01_MEMORY_LOCAL_USER:
                if self.vram_used + size > prof.vram_bytes:
                    raise _RmFail("NV_ERR_NO_MEMORY")
                self.vram_used += size
            kind = "vram" if cls == abi.NV01_MEMORY_LOCAL_USER else "sysmem"
            b = Memfd(size, f"mock-nv-{kind}")
            obj.mem = MemObject(kind, size, b.addr, b)
            prm.address, prm.limit = self._next_phys, size - 1
            self._next_phys += size
        elif cls in prof.usermode_classes:
            b = Memfd(0x10000, "mock-nv-usermode")
            obj.mem = MemObject("usermode", 0x10000, b.addr, b)
        elif cls == abi.FERMI_VASPACE_A:
            prm = self._params(cls, pptr, True)
            obj.data.update(flags=prm.flags, vaBase=prm.vaBase, vaSize=prm.vaSize)
        elif cls == abi.KEPLER_CHANNEL_GROUP_A:
            prm = self._params(cls, pptr, True)
            if prm.engineType != abi.NV2080_ENGINE_TYPE_GRAPHICS:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            obj.data.update(scheduled=False, channels=[])
        elif cls == abi.FERMI_CONTEXT_SHARE_A:
            prm = self._params(cls, pptr, True)
            va = obj.client.objects.get(prm.hVASpace)
            if va is None or va.cls != abi.FERMI_VASPACE_A:
                raise _RmFail("NV_ERR_INVALID_OBJECT_HANDLE")
            obj.data["vaspace"] = va
            prm.subctxId = sum(1 for o in obj.parent.children if o.cls == cls) if obj.parent else 0
        elif cls in prof.gpfifo_classes:
            self._construct_channel(obj, self._params(cls, pptr, True))
        elif cls in prof.compute_classes or cls in prof.copy_classes:
            ch: ChannelState = obj.parent.data["state"]  # type: ignore[union-attr]
            if cls in ch.engines:
                raise _RmFail("NV_ERR_INVALID_STATE")
            ch.engines.add(cls)
        elif cls == abi.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
            raise _RmFail("NV_ERR_INVALID_CLASS")  # only through NV_ESC_RM_ALLOC_MEMORY

    def _construct_channel(self, obj: RmObject, prm: Any) -> None:
        c, tsg = obj.client, obj.parent
        assert tsg is not None
        err = c.objects.get(prm.hObjectError)
        if err is None or err.mem is None or err.mem.kind not in ("sysmem", "vram"):
            raise _RmFail("NV_ERR_INVALID_OBJECT_HANDLE")
        n = prm.gpFifoEntries
        if n < 2 or n & (n - 1):
            raise _RmFail("NV_ERR_INVALID_ARGUMENT")
        if prm.gpFifoOffset % 8:
            raise _RmFail("NV_ERR_INVALID_ADDRESS")
        userd = c.objects.get(prm.hUserdMemory[0])
        if userd is None or userd.mem is None:
            raise _RmFail("NV_ERR_INVALID_OBJECT_HANDLE")
        uoff = prm.userdOffset[0]
        if uoff % 512 or uoff + 512 > userd.mem.size:
            raise _RmFail("NV_ERR_INVALID_OFFSET")
        share = c.objects.get(prm.hContextShare)
        if share is None or share.cls != abi.FERMI_CONTEXT_SHARE_A or share.parent is not tsg:
            raise _RmFail("NV_ERR_INVALID_OBJECT_HANDLE")
        state = ChannelState(
            obj.handle,
            obj.cls,
            prm.gpFifoOffset,
            n,
            userd.mem.host_addr + uoff,
            err.mem.host_addr,
            tsg,
            share.data["vaspace"],
        )
        obj.data.update(state=state, userd=userd, error=err)
        for o in (userd, err):
            assert o.mem is not None
            o.mem.refs += 1
        tsg.data["channels"].append(obj)
        self.gpu.channels[obj.handle] = state

    def _rm_free(self, st: FdState, p: Any) -> None:
        c = self._client(st, p.hRoot)
        o = self._obj(c, p.hObjectOld)
        self.calls[-1] += f" {abi.CLASS_NAMES.get(o.cls, hex(o.cls))}"
        if o.cls == abi.NV01_ROOT_CLIENT:
            self._free_client(c)
        else:
            self._free_obj(o)

    def _free_client(self, c: Client) -> None:
        root = c.objects[c.handle]
        for child in list(root.children):
            self._free_obj(child)
        del self.clients[c.handle]
        c.objects.clear()

    def _free_obj(self, o: RmObject) -> None:
        for child in list(o.children):
            self._free_obj(child)
        if o.parent is not None:
            o.parent.children.remove(o)
        del o.client.objects[o.handle]
        st = o.data.get("state")
        if st is not None:
            self.gpu.channels.pop(o.handle, None)
            if o.parent is not None:
                o.parent.data["channels"].remove(o)
            for key in ("userd", "error"):
                o.data[key].mem.unref()
        if o.parent is not None and o.parent.data.get("state") is not None:
            o.parent.data["state"].engines.discard(o.cls)
        if o.mem is not None:
            for k, m in list(self.rm_maps.items()):
                if isinstance(m, dict) and m["obj"] is o:
                    del self.rm_maps[k]
                elif isinstance(m, CpuMapping) and m.obj is o:
                    del self.rm_maps[k]
            if o.mem.kind == "vram":
                self.vram_used -= o.mem.size
            o.mem.unref()

    # -- controls --------------------------------------------------------------------------------
    def _rm_control(self, st: FdState, p: Any) -> None:
        cmd = p.cmd
        self.calls[-1] += f" {abi.CONTROL_NAMES.get(cmd, hex(cmd))}"
        c = self._client(st, p.hClient)
        o = self._obj(c, p.hObject)
        ctype = abi.CONTROL_PARAM_TYPES.get(cmd)
        if ctype is None:
            raise _RmFail("NV_ERR_NOT_SUPPORTED")
        iface = cmd >> 16
        owner = {
            0x0000: (abi.NV01_ROOT_CLIENT,),
            0x0080: (abi.NV01_DEVICE_0,),
            0x2080: (abi.NV20_SUBDEVICE_0,),
            0xA06C: (abi.KEPLER_CHANNEL_GROUP_A,),
            0xC36F: self.profile.gpfifo_classes,
        }[iface]
        if o.cls not in owner:
            raise _RmFail("NV_ERR_NOT_SUPPORTED")
        if p.paramsSize != self.abi.sizeof(ctype):  # rmControl: declared size must match exactly
            raise _RmFail("NV_ERR_INVALID_PARAM_STRUCT")
        if p.params == 0:
            raise _RmFail("NV_ERR_INVALID_ARGUMENT")
        prm = self.abi.at(ctype, p.params)
        prof = self.profile
        if cmd == abi.NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2:
            if prm.gpuId != 0x100:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            prm.deviceInstance, prm.subDeviceInstance = 0, 0
        elif cmd == abi.NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2:
            prm.driverVersionBuffer = self.version.encode()
        elif cmd == abi.NV0080_CTRL_CMD_GPU_GET_CLASSLIST:
            classes = prof.classes
            if prm.numClasses == 0 and prm.classList == 0:
                prm.numClasses = len(classes)
            elif prm.numClasses < len(classes) or prm.classList == 0:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            else:
                arr = _ffi.cast("uint32_t *", prm.classList)
                for i, k in enumerate(classes):
                    arr[i] = k
                prm.numClasses = len(classes)
        elif cmd == abi.NV2080_CTRL_CMD_GPU_GET_GID_INFO:
            if prm.flags & 3 != abi.NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY:
                raise _RmFail("NV_ERR_NOT_SUPPORTED")
            prm.length = 16
            for i, b in enumerate(prof.uuid):
                prm.data[i] = b
        elif cmd == abi.NV2080_CTRL_CMD_GPU_GET_NAME_STRING:
            # NUL-terminated within NV2080_GPU_MAX_NAME_STRING_LENGTH entries, ASCII or UTF-16 units
            name = prof.name[: abi.NV2080_GPU_MAX_NAME_STRING_LENGTH - 1]
            if prm.gpuNameStringFlags == abi.NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_ASCII:
                prm.gpuNameString.ascii = name.encode("ascii", errors="replace") + b"\0"
            elif prm.gpuNameStringFlags == abi.NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_UNICODE:
                prm.gpuNameString.unicode = [ord(ch) for ch in name] + [0]
            else:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
        elif cmd == abi.NV2080_CTRL_CMD_GR_GET_INFO:
            values = {
                abi.NV2080_CTRL_GR_INFO_INDEX_SM_VERSION: prof.sm_version,
                abi.NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS: prof.litter_gpcs,
                abi.NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC: prof.tpc_per_gpc,
                abi.NV2080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC: prof.sm_per_tpc,
                abi.NV2080_CTRL_GR_INFO_INDEX_MAX_WARPS_PER_SM: prof.max_warps_per_sm,
            }
            lst = self.abi.ffi.cast("NV2080_CTRL_GR_INFO *", prm.grInfoList)
            for i in range(prm.grInfoListSize):
                if lst[i].index not in values:
                    raise _RmFail("NV_ERR_INVALID_ARGUMENT")
                lst[i].data = values[lst[i].index]
        elif cmd == abi.NVA06C_CTRL_CMD_GPFIFO_SCHEDULE:
            if not o.data["channels"]:
                raise _RmFail("NV_ERR_INVALID_STATE")
            o.data["scheduled"] = bool(prm.bEnable)
            self.gpu.cv.notify_all()
        elif cmd == abi.NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN:
            state: ChannelState = o.data["state"]
            if state.token is None:
                state.token = len([s for s in self.gpu.channels.values() if s.token is not None]) + 1
                while any(s.token == state.token for s in self.gpu.channels.values() if s is not state):
                    state.token += 1
            prm.workSubmitToken = state.token
        # PERF_BOOST, FB_FLUSH_GPU_CACHE, GET_BUILD_VERSION: accepted, nothing observable in the mock

    # -- mappings and OS-descriptor memory -------------------------------------------------------
    def _rm_map(self, st: FdState, w: Any) -> None:
        p = w.params
        c = self._client(st, p.hClient)
        dev = self._obj(c, p.hDevice)
        if dev.cls not in (abi.NV01_DEVICE_0, abi.NV20_SUBDEVICE_0):
            raise _RmFail("NV_ERR_INVALID_OBJECT_HANDLE")
        o = self._obj(c, p.hMemory)
        if o.mem is None or o.mem.backing is None:
            raise _RmFail("NV_ERR_INVALID_OBJECT_HANDLE" if o.mem is None else "NV_ERR_INVALID_ARGUMENT")
        if p.length == 0 or p.offset + p.length > o.mem.size or p.offset % 0x1000:
            raise _RmFail("NV_ERR_INVALID_LIMIT")
        target = self.fds.get(w.fd)
        want = "ctl" if o.mem.kind == "sysmem" else "gpu"  # NV-FACTS 3.4: which node maps which memory
        if target is None or target.kind != want or (want == "gpu" and target.ctl_fd is None):
            raise _RmFail("NV_ERR_INVALID_ARGUMENT")
        if target.pending_map is not None:
            raise _RmFail("NV_ERR_INVALID_STATE")
        cookie = self._next_cookie
        self._next_cookie += 0x100000
        ctx = {"obj": o, "offset": p.offset, "length": p.length, "cookie": cookie}
        target.pending_map = ctx
        self.rm_maps[cookie] = ctx
        p.pLinearAddress = cookie

    def _rm_unmap(self, st: FdState, p: Any) -> None:
        c = self._client(st, p.hClient)
        o = self._obj(c, p.hMemory)
        m = self.rm_maps.get(p.pLinearAddress)
        obj = m["obj"] if isinstance(m, dict) else (m.obj if m is not None else None)
        if obj is not o:
            raise _RmFail("NV_ERR_INVALID_ARGUMENT")
        del self.rm_maps[p.pLinearAddress]

    def _rm_alloc_memory(self, st: FdState, w: Any) -> None:
        p = w.params
        self.calls[-1] += f" {abi.CLASS_NAMES.get(p.hClass, hex(p.hClass))}"
        if st.ctl_fd is None:
            raise _RmFail("NV_ERR_INVALID_STATE")
        if p.hClass != abi.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
            raise _RmFail("NV_ERR_INVALID_CLASS")
        c = self.clients.get(p.hRoot)
        if c is None or c.fd != st.ctl_fd:
            raise _RmFail("NV_ERR_INVALID_CLIENT")
        parent = self._obj(c, p.hObjectParent, "NV_ERR_INVALID_OBJECT_PARENT")
        if parent.cls != abi.NV01_DEVICE_0:
            raise _RmFail("NV_ERR_INVALID_OBJECT_PARENT")
        if p.hObjectNew == 0:
            raise _RmFail("NV_ERR_INVALID_OBJECT_NEW")
        if p.hObjectNew in c.objects:
            raise _RmFail("NV_ERR_INSERT_DUPLICATE_NAME")
        flags = p.flags
        location, mapping, coherency = (flags >> 8) & 0xF, (flags >> 30) & 3, (flags >> 12) & 0xF
        if location != 0 or mapping != 1 or coherency not in (0, 1, 5):  # NV-FACTS 3.3 checks
            raise _RmFail("NV_ERR_INVALID_FLAGS")
        if p.pMemory % 0x1000 or (p.limit + 1) % 0x1000:
            raise _RmFail("NV_ERR_INVALID_ADDRESS")
        obj = RmObject(p.hObjectNew, p.hClass, parent, c)
        obj.mem = MemObject("host", p.limit + 1, p.pMemory, None)
        c.objects[obj.handle] = obj
        parent.children.append(obj)

    # ==========================================================================================
    # /dev/nvidia-uvm
    def _uvm_ioctl(self, st: FdState, cmd: int, addr: int) -> int:
        ctype = abi.UVM_PARAM_TYPES.get(cmd)
        if ctype is None:
            raise osapi.os_error("ioctl(nvidia-uvm)", errno.EINVAL, f"unknown UVM command {cmd:#x}")
        name = abi.UVM_NAMES[cmd]
        self.calls.append(name)
        p = self.abi.at(ctype, addr)
        try:
            if cmd == abi.UVM_INITIALIZE:
                if st.uvm_mm:
                    raise _RmFail("NV_ERR_INVALID_STATE")
                st.uvm = st.uvm or UvmSpace()
            elif cmd == abi.UVM_MM_INITIALIZE:
                primary = self.fds.get(p.uvmFd)
                if st.uvm is not None or primary is None or primary.uvm is None:
                    raise _RmFail("NV_ERR_INVALID_ARGUMENT")
                st.uvm_mm = True
            elif st.uvm is None:
                raise _RmFail("NV_ERR_ILLEGAL_ACTION")  # uvm_api.h: ioctls before UVM_INITIALIZE
            else:
                self._uvm_call(st, st.uvm, cmd, p)
            p.rmStatus = abi.NV_OK
        except _RmFail as e:
            p.rmStatus = e.status
        return 0

    def _uvm_client_obj(self, fd: int, client: int, handle: int) -> RmObject:
        ctl = self.fds.get(fd)
        c = self.clients.get(client)
        if ctl is None or ctl.kind != "ctl" or c is None or c.fd != fd:
            raise _RmFail("NV_ERR_INVALID_ARGUMENT")
        o = c.objects.get(handle)
        if o is None:
            raise _RmFail("NV_ERR_OBJECT_NOT_FOUND")
        return o

    def _uuid_ok(self, u: Any) -> None:
        if bytes(u.uuid) != self.profile.uuid:
            raise _RmFail("NV_ERR_GPU_UUID_NOT_FOUND")

    def _uvm_call(self, st: FdState, space: UvmSpace, cmd: int, p: Any) -> None:
        if cmd == abi.UVM_REGISTER_GPU:
            self._uuid_ok(p.gpu_uuid)
            if space.gpu_registered:
                raise _RmFail("NV_ERR_IN_USE")
            space.gpu_registered = True
        elif cmd == abi.UVM_UNREGISTER_GPU:
            self._uuid_ok(p.gpu_uuid)
            if not space.gpu_registered or space.vaspace is not None:
                raise _RmFail("NV_ERR_INVALID_DEVICE")
            space.gpu_registered = False
        elif cmd == abi.UVM_REGISTER_GPU_VASPACE:
            self._uuid_ok(p.gpuUuid)
            if not space.gpu_registered:
                raise _RmFail("NV_ERR_INVALID_DEVICE")
            o = self._uvm_client_obj(p.rmCtrlFd, p.hClient, p.hVaSpace)
            if (
                o.cls != abi.FERMI_VASPACE_A
                or not o.data["flags"] & abi.NV_VASPACE_ALLOCATION_FLAGS_IS_EXTERNALLY_OWNED
            ):
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            if space.vaspace is not None:
                raise _RmFail("NV_ERR_IN_USE")
            space.vaspace = o
            o.data["uvm"] = space
        elif cmd == abi.UVM_UNREGISTER_GPU_VASPACE:
            self._uuid_ok(p.gpuUuid)
            if space.vaspace is None:
                raise _RmFail("NV_ERR_INVALID_DEVICE")
            space.vaspace.data.pop("uvm", None)
            space.vaspace = None
        elif cmd == abi.UVM_CREATE_EXTERNAL_RANGE:
            self._check_range(space, p.base, p.length)
            space.add_range(UvmRange(p.base, p.length, "external"))
        elif cmd == abi.UVM_MAP_EXTERNAL_ALLOCATION:
            if not 1 <= p.gpuAttributesCount <= abi.UVM_MAX_GPUS:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            self._uuid_ok(p.perGpuAttributes[0].gpuUuid)
            if space.vaspace is None:
                raise _RmFail("NV_ERR_INVALID_DEVICE")
            r = space.range_containing(p.base, p.length)
            if r is None or r.kind != "external" or p.length == 0 or (p.base | p.length) % 0x1000:
                raise _RmFail("NV_ERR_INVALID_ADDRESS")
            if any(m.va < p.base + p.length and p.base < m.va + m.length for m in r.mappings):
                raise _RmFail("NV_ERR_UVM_ADDRESS_IN_USE")
            o = self._uvm_client_obj(p.rmCtrlFd, p.hClient, p.hMemory)
            if o.mem is None or o.mem.kind == "usermode" or p.offset + p.length > o.mem.size:
                raise _RmFail("NV_ERR_INVALID_ARGUMENT")
            space.add_mapping(r, GPUMapping(p.base, p.length, o.mem, p.offset))
        elif cmd == abi.UVM_FREE:
            r = space.ranges.get(p.base)
            if r is None or r.kind != "external":
                raise _RmFail("NV_ERR_INVALID_ADDRESS")
            space.remove_range(r)
        elif cmd == abi.UVM_REGISTER_CHANNEL:
            self._uuid_ok(p.gpuUuid)
            o = self._uvm_client_obj(p.rmCtrlFd, p.hClient, p.hChannel)
            if o.cls not in self.profile.gpfifo_classes:
                raise _RmFail("NV_ERR_INVALID_CHANNEL")
            if (p.hClient, p.hChannel) in space.channels:
                raise _RmFail("NV_ERR_IN_USE")
            self._check_range(space, p.base, p.length)
            r = UvmRange(p.base, p.length, "channel")
            space.add_range(r)
            space.channels[(p.hClient, p.hChannel)] = r
        elif cmd == abi.UVM_UNREGISTER_CHANNEL:
            self._uuid_ok(p.gpuUuid)
            r = space.channels.pop((p.hClient, p.hChannel), None)
            if r is None:
                raise _RmFail("NV_ERR_INVALID_CHANNEL")
            space.remove_range(r)
        else:
            raise _RmFail("NV_ERR_NOT_SUPPORTED")

    @staticmethod
    def _check_range(space: UvmSpace, base: int, length: int) -> None:
        if length == 0 or (base | length) % 0x1000:
            raise _RmFail("NV_ERR_INVALID_ADDRESS")
        if space.overlaps(base, length):
            raise _RmFail("NV_ERR_UVM_ADDRESS_IN_USE")
