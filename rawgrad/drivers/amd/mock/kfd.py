"""Mock amdkfd (``/dev/kfd``) plus an amdgpu render node and the KFD sysfs topology, behind the OS seam.

The AMD twin of the NV mock kernel driver: an :class:`~rawgrad.drivers.osapi.OSInterface` (and
``DoorbellOS``) that a driver under test receives instead of ``LibcOS``. What it emulates, with the checks
of the real kernel (``kfd_chardev.c``, ``kfd_events.c``; AMD-METAL-FACTS 1.2):

- the ioctl front end: dispatch on ``_IOC_NR`` only, copy ``_IOC_SIZE`` bytes in, zero-fill up to the
  kernel's own struct size, copy the same number of bytes back (also on failure);
- process state: ACQUIRE_VM binds a render-node fd, without it allocations fail with ENODEV and queue
  creation with ESRCH; allocations live at the caller's VA (CPU VA == GPU VA), backed by a memfd that both
  the render-node mmap and the mock GPU view share; USERPTR allocations are the caller's own pages;
- queues: CREATE_QUEUE records ring base/size, read/write pointer and EOP/CWSR addresses after checking
  they lie in GPU-mapped allocations, and hands out a doorbell in the process's 8 KiB doorbell slice;
- doorbells: ``doorbell_publisher`` stores the write pointer and the doorbell and then calls
  ``on_doorbell(queue, value)`` -- the hook where a command-processor model (``mock/cp.py``) runs the ring;
- events: the user event page (first CREATE_EVENT), signal slots, WAIT_EVENTS with timeout, signals from
  the host (``signal_event``, SET_EVENT) or from the GPU side (``interrupt(ctxid)`` after a mailbox write),
  and fault injection (``inject_memory_fault``, ``inject_hw_exception``) that wakes MEMORY / HW_EXCEPTION
  events with their payload.

Every rejected call raises the errno the real driver returns and appends a line saying why to ``log``.
``strict=True`` (the default) also rejects what the kernel would accept but rawgrad must never send (a
size that matches no header version, several memory types in one allocation, a compute queue without an
EOP buffer); each such line says "mock strictness". ``leaks()`` lists whatever is still alive.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from rawgrad.drivers import osapi
from rawgrad.drivers.amd import abi
from rawgrad.drivers.amd.topology import KFD_PATH, NODES_DIR, RENDER_NODE_PREFIX, TOPOLOGY_ROOT
from rawgrad.drivers.memfd import Memfd
from rawgrad.drivers.memfd import ffi as _ffi
from rawgrad.drivers.memfd import libc as _libc

ENOTSUPP = 524  # include/linux/errno.h ENOTSUPP (kernel-internal; CREATE_QUEUE answers a bad queue type)

_FD_BASE = 2000  # mock fds far from real ones (and from the NV mock's 1000s), so a mix-up fails loudly
DRM_FILE_PAGE_OFFSET_START = 0x100000 << 12  # drm_vma_manager.h: fake mmap offsets start at 4 GiB
GPUVM_LIMIT = 1 << 47  # the user GPUVM aperture ends below 2^47 on gfx9/gfx11 (kfd_flat_memory.c)
KFD_FIRST_NONSIGNAL_EVENT_ID = 0x80000000  # kfd_events.c: non-signal events are numbered from here
KFD_DEFAULT_VERSION = (1, 17)  # what current kernels report; GET_VERSION returns it
CREATE_QUEUE_V117 = (1, 17)  # from this version the kernel's CREATE_QUEUE struct is 96 bytes


@dataclass(frozen=True)
class KFDProfile:
    """What one mock GPU node exposes through KFD."""

    label: str
    gpu_id: int
    render_minor: int
    properties: tuple[tuple[str, int], ...]  # the node's `properties` file, in order
    vram_bytes: int
    large_bar: bool  # all VRAM CPU-visible (resizable BAR): PUBLIC VRAM allowed
    eop_buffer_size: int  # the EOP buffer size the kernel expects of a compute queue

    def properties_text(self) -> str:
        return "".join(f"{k} {v}\n" for k, v in self.properties)


def _props(**kw: int) -> tuple[tuple[str, int], ...]:
    return tuple(kw.items())


# Radeon RX 7900 XTX (Navi 31): the values a gfx1100 KFD node prints (48 WGP = 96 CU, wave32, 64 KiB LDS).
GFX1100 = KFDProfile(
    "gfx1100 (Radeon RX 7900 XTX, mock)", 0x1A2B, 128,
    _props(cpu_cores_count=0, simd_count=192, mem_banks_count=1, caches_count=206, io_links_count=1,
           p2p_links_count=0, cpu_core_id_base=0, simd_id_base=2147488032, max_waves_per_simd=16,
           lds_size_in_kb=64, gds_size_in_kb=0, num_gws=64, wave_front_size=32, array_count=12,
           simd_arrays_per_engine=2, cu_per_simd_array=8, simd_per_cu=2, max_slots_scratch_cu=32,
           gfx_target_version=110000, vendor_id=0x1002, device_id=0x744C, location_id=0x8600, domain=0,
           drm_render_minor=128, hive_id=0, num_sdma_engines=2, num_sdma_xgmi_engines=0,
           num_sdma_queues_per_engine=6, num_cp_queues=8, max_engine_clk_fcompute=2482,
           local_mem_size=0, fw_version=2140, capability=671588992, debug_prop=1495, sdma_fw_version=20,
           unique_id=11673270660693242239, num_xcc=1, max_engine_clk_ccompute=2400),
    24 << 30, True, 0x1000)

# MI300X in CPX mode: one XCC per KFD node (38 CU, wave64), the configuration PM4 queues serve
# (AMD-METAL-FACTS 1.3: multi-XCC nodes need AQL, which this mock does not emulate).
GFX942 = KFDProfile(
    "gfx942 (Instinct MI300X CPX partition, mock)", 0x3C4D, 129,
    _props(cpu_cores_count=0, simd_count=152, mem_banks_count=1, caches_count=80, io_links_count=1,
           p2p_links_count=0, cpu_core_id_base=0, simd_id_base=2147487744, max_waves_per_simd=8,
           lds_size_in_kb=64, gds_size_in_kb=0, num_gws=64, wave_front_size=64, array_count=4,
           simd_arrays_per_engine=1, cu_per_simd_array=10, simd_per_cu=4, max_slots_scratch_cu=32,
           gfx_target_version=90402, vendor_id=0x1002, device_id=0x74A1, location_id=0x7500, domain=0,
           drm_render_minor=129, hive_id=0, num_sdma_engines=2, num_sdma_xgmi_engines=14,
           num_sdma_queues_per_engine=8, num_cp_queues=24, max_engine_clk_fcompute=2100,
           local_mem_size=24 << 30, fw_version=192, capability=540676, debug_prop=32768, sdma_fw_version=25,
           unique_id=9895604649984, num_xcc=1, max_engine_clk_ccompute=2100),
    24 << 30, True, 0x1000)

_CPU_NODE_PROPERTIES = ("cpu_cores_count 16\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\n"
                        "io_links_count 1\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\n"
                        "drm_render_minor 0\n")


class MockUsageError(RuntimeError):
    """The driver used the mock in a way no real OS call would allow (or the mock cannot emulate)."""


class MockGPUFault(RuntimeError):
    """A GPU-side access (by a CP model) to a VA no allocation maps on the GPU."""

    def __init__(self, va: int, size: int, why: str):
        super().__init__(f"GPU access {va:#x}+{size:#x}: {why}")
        self.va = va


class _Fail(Exception):
    def __init__(self, err: int, msg: str):
        super().__init__(msg)
        self.errno, self.msg = err, msg


@dataclass
class MockBO:
    """One ALLOC_MEMORY_OF_GPU allocation."""

    handle: int
    va: int
    size: int
    flags: int
    kind: str  # "vram" | "gtt" | "userptr" | "doorbell"
    host_addr: int  # where its bytes are in this process (the memfd mapping, or the user's pages)
    memfd: Memfd | None
    mmap_offset: int
    mapped_gpus: set[int] = field(default_factory=set)

    def describe(self) -> str:
        return f"handle {self.handle:#x} {self.kind} va {self.va:#x}+{self.size:#x}"


@dataclass
class MockQueue:
    """A queue as CREATE_QUEUE recorded it; a CP model reads the ring through the mock's GPU view."""

    queue_id: int
    queue_type: int
    gpu_id: int
    ring_base: int
    ring_size: int  # bytes
    read_pointer: int  # GPU VA of the read-pointer word the CP updates
    write_pointer: int  # GPU VA of the write-pointer word the driver publishes
    eop_buffer: int
    eop_buffer_size: int
    ctx_save_restore: int
    ctx_save_restore_size: int
    ctl_stack_size: int
    priority: int
    percentage: int
    doorbell_offset: int  # as returned to the driver
    doorbell_byte_offset: int  # inside the doorbell slice
    uses: tuple[int, ...]  # handles of the allocations it points into
    doorbell_writes: int = 0
    last_doorbell: int | None = None

    @property
    def is_sdma(self) -> bool:
        return self.queue_type == abi.KFD_IOC_QUEUE_TYPE_SDMA


@dataclass
class MockEvent:
    event_id: int
    event_type: int
    auto_reset: bool
    node_id: int
    slot: int | None  # signal events: the mailbox index in the event page
    signaled: bool = False
    # va, not_present, read_only, no_execute, imprecise
    memory_fault: tuple[int, int, int, int, int] | None = None
    hw_exception: tuple[int, int, int] | None = None  # reset_type, reset_cause, memory_lost


@dataclass
class _Fd:
    fd: int
    kind: str  # "kfd" | "drm" | "file"
    path: str
    data: bytes = b""
    pos: int = 0


@dataclass
class CpuMap:
    addr: int
    length: int
    kind: str  # "bo" | "doorbell"
    bo: MockBO | None = None


class MockKFD:
    """OSInterface + DoorbellOS emulating amdkfd, one render node and the sysfs topology of one GPU."""

    def __init__(self, profile: KFDProfile = GFX1100, *, version: tuple[int, int] = KFD_DEFAULT_VERSION,
                 strict: bool = True, on_doorbell: Callable[[MockQueue, int], None] | None = None):
        self.profile, self.version, self.strict = profile, version, strict
        self.gpu_id = profile.gpu_id
        self.on_doorbell = on_doorbell  # CP-model hook: called after each published doorbell write
        # CP-model hooks to mirror KFD state: a queue created (True) / destroyed (False); an allocation mapped
        # on (True) / unmapped from (False) the GPU. Called with the mock's lock held, after the change.
        self.on_queue: Callable[[MockQueue, bool], None] | None = None
        self.on_gpu_map: Callable[[MockBO, bool], None] | None = None
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.real = osapi.LibcOS()
        self.log: list[str] = []  # one line per rejected call (and per notable acceptance), in order
        self.calls: list[str] = []  # ioctl names as dispatched
        self.files: dict[str, bytes] = self._sysfs()
        self.fds: dict[int, _Fd] = {}
        self._next_fd = _FD_BASE
        self.vm_fd: int | None = None  # the render-node fd ACQUIRE_VM bound
        self.runtime_enabled = False
        self.bos: dict[int, MockBO] = {}
        self._next_idr = 0
        self._next_drm_offset = DRM_FILE_PAGE_OFFSET_START
        self.vram_used = 0
        self.cpu_maps: dict[int, CpuMap] = {}
        self.queues: dict[int, MockQueue] = {}
        self.doorbells: Memfd | None = None  # the process's doorbell slice
        self.events: dict[int, MockEvent] = {}
        self.event_page: MockBO | None = None
        self._next_other_event = KFD_FIRST_NONSIGNAL_EVENT_ID
        self.memory_policy: tuple[int, int] | None = None
        self.faults: list[abi.MemoryFault] = []
        self.auto_freed: list[str] = []  # what closing /dev/kfd had to tear down (driver leaks)

    # ==========================================================================================
    # sysfs
    def _sysfs(self) -> dict[str, bytes]:
        p = self.profile
        gpu = f"{NODES_DIR}/1"
        props = p.properties_text()
        return {
            f"{TOPOLOGY_ROOT}/generation_id": b"1\n",
            f"{NODES_DIR}/0/gpu_id": b"0\n",
            f"{NODES_DIR}/0/name": b"\n",
            f"{NODES_DIR}/0/properties": _CPU_NODE_PROPERTIES.encode(),
            f"{gpu}/gpu_id": f"{p.gpu_id}\n".encode(),
            f"{gpu}/name": b"ip discovery\n",
            f"{gpu}/properties": props.encode(),
        }

    @property
    def render_path(self) -> str:
        return f"{RENDER_NODE_PREFIX}{self.profile.render_minor}"

    # ==========================================================================================
    # OSInterface: files
    def open(self, path: str, flags: int) -> int:
        with self.lock:
            if path == KFD_PATH:
                kind = "kfd"
            elif path == self.render_path:
                kind = "drm"
            elif path in self.files:
                if flags & 0x3 != osapi.O_RDONLY:
                    self._reject_os(f"open({path})", errno.EACCES, "sysfs topology files are read-only")
                kind = "file"
            else:
                self._reject_os(f"open({path})", errno.ENOENT, "no such file in the mock")
            st = _Fd(self._next_fd, kind, path, self.files.get(path, b""))
            self._next_fd += 1
            self.fds[st.fd] = st
            return st.fd

    def close(self, fd: int) -> None:
        with self.lock:
            st = self.fds.pop(fd, None)
            if st is None:
                self._reject_os(f"close({fd})", errno.EBADF, "not an open mock fd")
            if st.kind == "kfd" and not any(s.kind == "kfd" for s in self.fds.values()):
                self._teardown_process()
            if st.kind == "drm" and fd == self.vm_fd:
                # amdkfd keeps its own reference to the DRM file after ACQUIRE_VM: the VM lives on
                self.log.append(f"close(render fd {fd}): the acquired VM stays with the KFD process")

    def read(self, fd: int, n: int) -> bytes:
        with self.lock:
            st = self.fds.get(fd)
            if st is None:
                self._reject_os(f"read({fd})", errno.EBADF, "not an open mock fd")
            if st.kind != "file":
                self._reject_os(f"read({st.path})", errno.EINVAL, "device nodes are not read")
            chunk = st.data[st.pos:st.pos + n]
            st.pos += len(chunk)
            return chunk

    def exists(self, path: str) -> bool:
        with self.lock:
            if path in (KFD_PATH, self.render_path) or path in self.files:
                return True
            prefix = path.rstrip("/") + "/"
            return any(f.startswith(prefix) for f in self.files)

    def mmio_read32(self, addr: int) -> int:
        raise MockUsageError("the mock KFD has no MMIO registers")

    def gpfifo_publisher(self, ring: int, entries: int, put_word: int, doorbell: int,
                         token: int) -> Callable[[int, int], None]:
        raise MockUsageError("gpfifo_publisher is NVIDIA's publish sequence; AMD queues use "
                             "doorbell_publisher")

    # ==========================================================================================
    # OSInterface: mappings
    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
        with self.lock:
            offset &= (1 << 64) - 1  # LibcOS passes offsets with bit 63 set as negative longs
            if fd == -1:
                if flags & osapi.MAP_FIXED:
                    self._forget_cpu_maps(addr, length)
                return self.real.mmap(addr, length, prot, flags, fd, offset)
            st = self.fds.get(fd)
            if st is None:
                self._reject_os("mmap", errno.EBADF, f"fd {fd} is not open")
            if st.kind == "drm":
                return self._mmap_bo(st, addr, length, prot, flags, offset)
            if st.kind == "kfd":
                return self._mmap_kfd(addr, length, prot, flags, offset)
            self._reject_os("mmap", errno.ENODEV, f"{st.path} cannot be mapped")

    def _map_memfd(self, what: str, addr: int, length: int, prot: int, flags: int, m: Memfd) -> int:
        if flags & osapi.MAP_FIXED:
            self._forget_cpu_maps(addr, length)
        ptr = _libc.mmap(_ffi.cast("void *", addr), length, prot, flags, m.fd, 0)
        res = int(_ffi.cast("uintptr_t", ptr))
        if res == osapi.MAP_FAILED:
            raise osapi.os_error(f"mmap({what})", _ffi.errno)
        return res

    def _mmap_bo(self, st: _Fd, addr: int, length: int, prot: int, flags: int, offset: int) -> int:
        bo = next((b for b in self.bos.values() if b.kind in ("vram", "gtt") and b.mmap_offset == offset),
                  None)
        if bo is None:
            self._reject_os("mmap(render node)", errno.EINVAL, f"offset {offset:#x} is no allocation's "
                            "mmap_offset (drm_gem_mmap finds no object)")
        if st.fd != self.vm_fd:
            self._reject_os("mmap(render node)", errno.EACCES, f"fd {st.fd} is not the render fd passed to "
                            "ACQUIRE_VM (drm_vma_node_is_allowed)")
        if not flags & osapi.MAP_SHARED:
            self._reject_os("mmap(render node)", errno.EINVAL, "a private (copy-on-write) mapping of a GEM "
                            "object is refused by TTM; use MAP_SHARED")
        if length > bo.size:
            self._reject_os("mmap(render node)", errno.EINVAL, f"length {length:#x} exceeds {bo.describe()}")
        if bo.kind == "vram" and not bo.flags & abi.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC:
            self._reject_os("mmap(render node)", errno.EPERM, f"{bo.describe()} was allocated without PUBLIC "
                            "(amdgpu NO_CPU_ACCESS): the CPU cannot map it")
        assert bo.memfd is not None
        res = self._map_memfd("bo", addr, length, prot, flags, bo.memfd)
        self.cpu_maps[res] = CpuMap(res, length, "bo", bo)
        return res

    def _mmap_kfd(self, addr: int, length: int, prot: int, flags: int, offset: int) -> int:
        kind = offset & abi.KFD_MMAP_TYPE_MASK
        if kind != abi.KFD_MMAP_TYPE_DOORBELL:
            self._reject_os("mmap(/dev/kfd)", errno.EINVAL, f"offset {offset:#x}: only doorbell mappings are "
                            "emulated (events/MMIO are not)")
        if abi.mmap_offset_gpu_id(offset) != self.gpu_id:
            self._reject_os("mmap(/dev/kfd)", errno.EINVAL, f"offset {offset:#x} names gpu_id "
                            f"{abi.mmap_offset_gpu_id(offset):#x}, not {self.gpu_id:#x}")
        if offset & (abi.DOORBELL_PROCESS_SLICE - 1):
            self._reject_os("mmap(/dev/kfd)", errno.EINVAL, "a doorbell mapping starts at the slice "
                            "(doorbell_offset & ~0x1fff)")
        if length != abi.DOORBELL_PROCESS_SLICE:
            self._reject_os("mmap(/dev/kfd)", errno.EINVAL, f"doorbell length {length:#x} != the process "
                            f"slice {abi.DOORBELL_PROCESS_SLICE:#x} (kfd_doorbell_mmap)")
        res = self._map_memfd("doorbells", addr, length, prot, flags, self._doorbell_memfd())
        self.cpu_maps[res] = CpuMap(res, length, "doorbell")
        return res

    def _doorbell_memfd(self) -> Memfd:
        if self.doorbells is None:
            self.doorbells = Memfd(abi.DOORBELL_PROCESS_SLICE, "mock-kfd-doorbells")
        return self.doorbells

    def _forget_cpu_maps(self, addr: int, length: int) -> None:
        for a, m in list(self.cpu_maps.items()):
            if m.addr < addr + length and addr < m.addr + m.length:
                if not (addr <= m.addr and m.addr + m.length <= addr + length):
                    raise MockUsageError(f"partial unmap of a device mapping {m.addr:#x}+{m.length:#x} "
                                         "is not emulated")
                del self.cpu_maps[a]

    def munmap(self, addr: int, length: int) -> None:
        with self.lock:
            self._forget_cpu_maps(addr, length)
            self.real.munmap(addr, length)

    # ==========================================================================================
    # DoorbellOS
    def doorbell_publisher(self, write_pointer: int, doorbell: int) -> Callable[[int], None]:
        """`publish(value)`: the write-pointer word, then the doorbell, then ``on_doorbell(queue, value)``."""
        with self.lock:
            m = next((m for m in self.cpu_maps.values()
                      if m.kind == "doorbell" and m.addr <= doorbell < m.addr + m.length), None)
            if m is None:
                raise MockUsageError(f"doorbell {doorbell:#x} is not inside a mapped doorbell slice")
            off = doorbell - m.addr
            q = next((q for q in self.queues.values() if q.doorbell_byte_offset == off), None)
            if off % abi.DOORBELL_BYTES or q is None:
                raise MockUsageError(f"doorbell slice offset {off:#x} belongs to no live queue")
            if write_pointer != q.write_pointer:
                raise MockUsageError(f"queue {q.queue_id}: publishing to {write_pointer:#x}, but its write "
                                     f"pointer is {q.write_pointer:#x}")
        wp = _ffi.cast("volatile uint64_t *", write_pointer)
        db = _ffi.cast("volatile uint64_t *", doorbell)
        queue = q

        def publish(value: int) -> None:
            with self.lock:
                if self.queues.get(queue.queue_id) is not queue:
                    raise MockUsageError(f"doorbell of destroyed queue {queue.queue_id} rung")
                wp[0] = value
                db[0] = value
                queue.doorbell_writes += 1
                queue.last_doorbell = value
                hook = self.on_doorbell
            if hook is not None:
                hook(queue, value)
        return publish

    def unpublished_doorbells(self) -> list[int]:
        """Queues whose doorbell word differs from the last value published through the seam: something
        wrote the doorbell directly, so a CP model never heard of it."""
        with self.lock:
            if self.doorbells is None:
                return []
            slots = _ffi.cast("uint64_t *", self.doorbells.addr)
            return [q.queue_id for q in self.queues.values()
                    if int(slots[q.doorbell_byte_offset // abi.DOORBELL_BYTES]) != (q.last_doorbell or 0)]

    # ==========================================================================================
    # ioctl front end (kfd_chardev.c kfd_ioctl)
    def _command_end(self) -> int:
        return abi.COMMAND_END_1_14 if self.version >= (1, 14) else abi.COMMAND_END_1_11

    def _kernel_size(self, desc: abi.KFDIoctl) -> int:
        if desc is abi.CREATE_QUEUE and self.version >= CREATE_QUEUE_V117:
            return abi.sizeof("kfd_ioctl_create_queue_args_v117")
        return desc.size

    def ioctl(self, fd: int, request: int, buf: Any) -> int:
        with self.lock:
            st = self.fds.get(fd)
            if st is None:
                self._reject_os("ioctl", errno.EBADF, f"fd {fd} is not open")
            if st.kind != "kfd":
                self._reject_os("ioctl", errno.ENOTTY, f"{request:#x} on {st.path}: KFD ioctls go to "
                                f"{KFD_PATH}")
            nr, usize = abi.ioc_nr(request), abi.ioc_size(request)
            if not abi.AMDKFD_COMMAND_START <= nr < self._command_end():
                self._reject_os("ioctl", errno.EINVAL, f"nr {nr:#x} is outside KFD "
                                f"{self.version[0]}.{self.version[1]}'s ioctl table")
            desc = abi.IOCTLS.get(nr)
            if desc is None:
                self._reject_os("ioctl", errno.EINVAL, f"nr {nr:#x} is a real KFD ioctl the mock does not "
                                "emulate")
            ksize = self._kernel_size(desc)
            if self.strict:
                known = {desc.size, ksize}
                if abi.ioc_type(request) != abi.AMDKFD_IOCTL_BASE or abi.ioc_dir(request) != desc.direction:
                    self._reject_os(desc.name, errno.EINVAL, f"request {request:#x} != {desc.request:#x} in "
                                    "type or direction (mock strictness: amdkfd uses only _IOC_NR)")
                if usize not in known:
                    self._reject_os(desc.name, errno.EINVAL, f"argument size {usize} matches no kfd_ioctl.h "
                                    f"version of {desc.ctype} ({sorted(known)}) (mock strictness: amdkfd "
                                    "would zero-fill or truncate)")
            addr = int(_ffi.cast("uintptr_t", buf))
            if addr == 0:
                self._reject_os(desc.name, errno.EFAULT, "argument pointer is NULL")
            asize = max(usize, ksize)
            kdata = bytearray(asize)
            if desc.direction & abi.IOC_WRITE:
                _ffi.memmove(kdata, _ffi.cast("char *", addr), usize)
            args = abi.ffi.cast(f"struct {desc.ctype} *", abi.ffi.from_buffer(kdata))
            self.calls.append(desc.name)
            failure: _Fail | None = None
            try:
                getattr(self, f"_k_{desc.name.lower()}")(args)
            except _Fail as e:
                failure = e
            if desc.direction & abi.IOC_READ:
                _ffi.memmove(_ffi.cast("char *", addr), bytes(kdata[:usize]), usize)
            if failure is not None:
                self._reject_os(desc.name, failure.errno, failure.msg)
            return 0

    def _reject_os(self, call: str, err: int, why: str) -> NoReturn:
        name = errno.errorcode.get(err, str(err))
        self.log.append(f"{call}: {name}: {why}")
        raise osapi.os_error(call, err, why)

    # -- process / device -----------------------------------------------------------------------
    def _gpu(self, gpu_id: int, what: str) -> None:
        if gpu_id != self.gpu_id:
            raise _Fail(errno.EINVAL, f"{what}: gpu_id {gpu_id:#x} is not a GPU of this KFD "
                        f"(it has {self.gpu_id:#x})")

    def _bound(self, err: int, what: str) -> None:
        if self.vm_fd is None:
            raise _Fail(err, f"{what}: the process has no VM on gpu_id {self.gpu_id:#x} yet (call ACQUIRE_VM "
                        "with the render-node fd first)")

    def _k_get_version(self, a: Any) -> None:
        a.major_version, a.minor_version = self.version

    def _k_acquire_vm(self, a: Any) -> None:
        st = self.fds.get(a.drm_fd)
        if st is None:
            raise _Fail(errno.EINVAL, f"drm_fd {a.drm_fd} is not an open file")
        self._gpu(a.gpu_id, "ACQUIRE_VM")
        if st.kind != "drm":
            raise _Fail(errno.EINVAL, f"drm_fd {a.drm_fd} is {st.path}, not the GPU's render node "
                        f"{self.render_path}")
        if self.vm_fd is not None:
            if self.vm_fd != a.drm_fd:
                raise _Fail(errno.EBUSY, f"the VM was already acquired through render fd {self.vm_fd}")
            return
        self.vm_fd = a.drm_fd

    def _k_runtime_enable(self, a: Any) -> None:
        enable = bool(a.mode_mask & abi.KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK)
        if enable and self.runtime_enabled:
            raise _Fail(errno.EBUSY, "the runtime is already enabled (kfd_chardev.c runtime_enable)")
        self.runtime_enabled = enable
        a.capabilities_mask = 0

    def _k_set_memory_policy(self, a: Any) -> None:
        for name in ("default_policy", "alternate_policy"):
            if getattr(a, name) not in (abi.KFD_IOC_CACHE_POLICY_COHERENT,
                                        abi.KFD_IOC_CACHE_POLICY_NONCOHERENT):
                raise _Fail(errno.EINVAL, f"{name} {getattr(a, name)} is neither COHERENT nor NONCOHERENT")
        self._gpu(a.gpu_id, "SET_MEMORY_POLICY")
        self._bound(errno.ESRCH, "SET_MEMORY_POLICY")
        self.memory_policy = (int(a.default_policy), int(a.alternate_policy))

    def _k_get_clock_counters(self, a: Any) -> None:
        # GPU counter: 100 MHz (AMD-METAL-FACTS 1.4); 0 for a gpu_id the process does not have, as the kernel
        a.gpu_clock_counter = time.perf_counter_ns() // 10 if a.gpu_id == self.gpu_id else 0
        a.cpu_clock_counter = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)  # ktime_get_raw_ns
        a.system_clock_counter = time.clock_gettime_ns(time.CLOCK_BOOTTIME)  # ktime_get_boottime_ns
        a.system_clock_freq = 1_000_000_000  # both counters are nanoseconds

    # -- memory ---------------------------------------------------------------------------------
    def _k_alloc_memory_of_gpu(self, a: Any) -> None:
        flags, size, va = int(a.flags), int(a.size), int(a.va_addr)
        if size == 0:
            raise _Fail(errno.EINVAL, "size 0")
        self._gpu(a.gpu_id, "ALLOC_MEMORY_OF_GPU")
        if flags & abi.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC and flags & abi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM \
                and not self.profile.large_bar:
            raise _Fail(errno.EINVAL, "PUBLIC VRAM needs a large BAR, which this GPU lacks")
        self._bound(errno.ENODEV, "ALLOC_MEMORY_OF_GPU")
        kinds = flags & abi.MEM_TYPE_FLAGS
        if kinds == 0:
            raise _Fail(errno.EINVAL, f"flags {abi.describe_mem_flags(flags)} name no memory type")
        if kinds & (kinds - 1) and self.strict:
            raise _Fail(errno.EINVAL, f"flags {abi.describe_mem_flags(flags)} name several memory types "
                        "(mock strictness: amdgpu takes the first)")
        if self.strict and flags & ~(abi.MEM_TYPE_FLAGS | abi.MEM_ATTR_FLAGS):
            raise _Fail(errno.EINVAL, f"flags {abi.describe_mem_flags(flags)} carry bits kfd_ioctl.h does "
                        "not define (mock strictness: amdgpu ignores them)")
        if self.strict and (va % abi.PAGE_SIZE or size % abi.PAGE_SIZE):
            raise _Fail(errno.EINVAL, f"va {va:#x} / size {size:#x} not page aligned (mock strictness: the "
                        "map would fail)")
        memfd: Memfd | None = None
        host = 0
        offset = 0
        if kinds & abi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM:
            kind = "vram"
            if self.vram_used + size > self.profile.vram_bytes:
                raise _Fail(errno.ENOMEM, f"VRAM exhausted ({self.vram_used:#x} of "
                            f"{self.profile.vram_bytes:#x} used, {size:#x} asked)")
        elif kinds & abi.KFD_IOC_ALLOC_MEM_FLAGS_GTT:
            kind = "gtt"
        elif kinds & abi.KFD_IOC_ALLOC_MEM_FLAGS_USERPTR:
            kind, host = "userptr", int(a.mmap_offset)
            if host % abi.PAGE_SIZE or host == 0:
                raise _Fail(errno.EINVAL, f"userptr {host:#x} is not a page-aligned host address")
        elif kinds & abi.KFD_IOC_ALLOC_MEM_FLAGS_DOORBELL:
            kind = "doorbell"
            if size != abi.DOORBELL_PROCESS_SLICE:
                raise _Fail(errno.EINVAL, f"a DOORBELL allocation must be the process doorbell slice "
                            f"({abi.DOORBELL_PROCESS_SLICE:#x}), got {size:#x}")
            db = self._doorbell_memfd()
            host = db.addr
            offset = abi.KFD_MMAP_TYPE_DOORBELL | abi.kfd_mmap_gpu_id(self.gpu_id)
        else:
            raise _Fail(errno.EINVAL, "MMIO_REMAP allocations are not emulated by the mock")
        if kind in ("vram", "gtt"):
            memfd = Memfd(size, f"mock-kfd-{kind}")
            host = memfd.addr
            offset = self._next_drm_offset
            self._next_drm_offset += -(-size // abi.PAGE_SIZE) * abi.PAGE_SIZE
            if kind == "vram":
                self.vram_used += size
        handle = abi.make_handle(self.gpu_id, self._next_idr)
        self._next_idr += 1
        self.bos[handle] = MockBO(handle, va, size, flags, kind, host, memfd, offset)
        a.handle, a.mmap_offset = handle, (host if kind == "userptr" else offset)

    def _bo(self, handle: int, missing_err: int, what: str) -> MockBO:
        if abi.handle_gpu_id(handle) != self.gpu_id:
            raise _Fail(errno.EINVAL, f"{what}: handle {handle:#x} names gpu_id "
                        f"{abi.handle_gpu_id(handle):#x}, not a GPU of this process")
        bo = self.bos.get(handle)
        if bo is None:
            raise _Fail(missing_err, f"{what}: handle {handle:#x} is not a live allocation")
        return bo

    def _k_free_memory_of_gpu(self, a: Any) -> None:
        if self.event_page is not None and a.handle == self.event_page.handle:
            raise _Fail(errno.EPERM, "the event page cannot be freed while the process lives")
        bo = self._bo(int(a.handle), errno.EINVAL, "FREE_MEMORY_OF_GPU")
        if bo.mapped_gpus:
            raise _Fail(errno.EBUSY, f"{bo.describe()} is still mapped to the GPU (unmap first)")
        self._free_bo(bo)

    def _free_bo(self, bo: MockBO) -> None:
        del self.bos[bo.handle]
        if bo.kind == "vram":
            self.vram_used -= bo.size
        if bo.memfd is not None:  # CPU mappings of it keep their pages (the kernel holds them)
            bo.memfd.release()

    def _device_ids(self, a: Any, what: str) -> list[int]:
        if a.n_devices == 0:
            raise _Fail(errno.EINVAL, f"{what}: n_devices is 0")
        if a.n_success > a.n_devices:
            raise _Fail(errno.EINVAL, f"{what}: n_success {a.n_success} > n_devices {a.n_devices}")
        if a.device_ids_array_ptr == 0:
            raise _Fail(errno.EFAULT, f"{what}: device_ids_array_ptr is NULL")
        ids = _ffi.cast("uint32_t *", int(a.device_ids_array_ptr))
        return [int(ids[i]) for i in range(int(a.n_devices))]

    def _k_map_memory_to_gpu(self, a: Any) -> None:
        ids = self._device_ids(a, "MAP_MEMORY_TO_GPU")
        bo = self._bo(int(a.handle), errno.ENOMEM, "MAP_MEMORY_TO_GPU")
        self._bound(errno.ENODEV, "MAP_MEMORY_TO_GPU")
        if bo.va % abi.PAGE_SIZE or bo.size % abi.PAGE_SIZE or bo.va == 0 or bo.va + bo.size > GPUVM_LIMIT:
            raise _Fail(errno.EINVAL, f"{bo.describe()}: VA range not page aligned or outside the GPUVM "
                        f"aperture (1..{GPUVM_LIMIT:#x})")
        clash = next((o for o in self.bos.values() if o is not bo and o.mapped_gpus
                      and o.va < bo.va + bo.size and bo.va < o.va + o.size), None)
        if clash is not None:
            raise _Fail(errno.EINVAL, f"{bo.describe()} overlaps mapped {clash.describe()}")
        was_mapped = bool(bo.mapped_gpus)
        for i in range(int(a.n_success), len(ids)):
            self._gpu(ids[i], "MAP_MEMORY_TO_GPU")
            bo.mapped_gpus.add(ids[i])
            a.n_success = i + 1
        if not was_mapped and self.on_gpu_map is not None:
            self.on_gpu_map(bo, True)

    def _k_unmap_memory_from_gpu(self, a: Any) -> None:
        ids = self._device_ids(a, "UNMAP_MEMORY_FROM_GPU")
        bo = self._bo(int(a.handle), errno.ENOMEM, "UNMAP_MEMORY_FROM_GPU")
        user = next((q for q in self.queues.values() if bo.handle in q.uses), None)
        if user is not None:
            # kernels >= 6.12 pin queue buffers (kfd_queue.c); UNSURE whether older ones refuse
            raise _Fail(errno.EBUSY, f"{bo.describe()} backs queue {user.queue_id} (destroy it first)")
        for i in range(int(a.n_success), len(ids)):
            self._gpu(ids[i], "UNMAP_MEMORY_FROM_GPU")
            if ids[i] not in bo.mapped_gpus:
                raise _Fail(errno.EINVAL, f"{bo.describe()} is not mapped on gpu_id {ids[i]:#x}")
            bo.mapped_gpus.discard(ids[i])
            a.n_success = i + 1
            if not bo.mapped_gpus and self.on_gpu_map is not None:
                self.on_gpu_map(bo, False)

    def mapped_bo(self, va: int, size: int) -> MockBO | None:
        """The GPU-mapped allocation holding [va, va+size), if any."""
        for bo in self.bos.values():
            if bo.mapped_gpus and bo.va <= va and va + size <= bo.va + bo.size:
                return bo
        return None

    # -- queues ---------------------------------------------------------------------------------
    def _need_mapped(self, what: str, va: int, size: int) -> MockBO:
        bo = self.mapped_bo(va, size)
        if bo is None:
            raise _Fail(errno.EINVAL, f"CREATE_QUEUE: {what} {va:#x}+{size:#x} is not inside one GPU-mapped "
                        "allocation (kfd_queue_acquire_buffers)")
        return bo

    def _k_create_queue(self, a: Any) -> None:
        pct = int(a.queue_percentage) & 0xFF  # bits 15:8 select a PM4 target XCC on newer kernels
        if pct > abi.KFD_MAX_QUEUE_PERCENTAGE:
            raise _Fail(errno.EINVAL, f"queue_percentage {pct} > {abi.KFD_MAX_QUEUE_PERCENTAGE}")
        if a.queue_priority > abi.KFD_MAX_QUEUE_PRIORITY:
            raise _Fail(errno.EINVAL, f"queue_priority {a.queue_priority} > {abi.KFD_MAX_QUEUE_PRIORITY}")
        size = int(a.ring_size)
        if size and size & (size - 1):
            raise _Fail(errno.EINVAL, f"ring_size {size:#x} is not a power of two")
        if size < abi.KFD_MIN_QUEUE_RING_SIZE:
            self.log.append(f"CREATE_QUEUE: ring_size {size:#x} clamped to {abi.KFD_MIN_QUEUE_RING_SIZE:#x}")
            size = a.ring_size = abi.KFD_MIN_QUEUE_RING_SIZE
        qtype = int(a.queue_type)
        if qtype not in abi.QUEUE_TYPE_NAMES:
            raise _Fail(ENOTSUPP, f"queue_type {qtype} is not a KFD queue type")
        if qtype not in (abi.KFD_IOC_QUEUE_TYPE_COMPUTE, abi.KFD_IOC_QUEUE_TYPE_SDMA):
            raise _Fail(errno.EINVAL, f"{abi.QUEUE_TYPE_NAMES[qtype]} queues are not emulated (PM4 and SDMA "
                        "only)")
        self._gpu(a.gpu_id, "CREATE_QUEUE")
        self._bound(errno.ESRCH, "CREATE_QUEUE")
        uses = [self._need_mapped("ring", int(a.ring_base_address), size).handle,
                self._need_mapped("read pointer", int(a.read_pointer_address), 8).handle,
                self._need_mapped("write pointer", int(a.write_pointer_address), 8).handle]
        if qtype == abi.KFD_IOC_QUEUE_TYPE_COMPUTE:
            if a.eop_buffer_address == 0:
                if self.strict:
                    raise _Fail(errno.EINVAL, "a PM4 compute queue without an EOP buffer: RELEASE_MEM would "
                                "dereference NULL (mock strictness)")
            else:
                if a.eop_buffer_size != self.profile.eop_buffer_size:
                    raise _Fail(errno.EINVAL, f"eop_buffer_size {a.eop_buffer_size:#x} != the node's "
                                f"{self.profile.eop_buffer_size:#x}")
                eop = self._need_mapped("EOP buffer", int(a.eop_buffer_address), int(a.eop_buffer_size))
                uses.append(eop.handle)
            if a.ctx_save_restore_address:
                if not 0 < a.ctl_stack_size <= a.ctx_save_restore_size:
                    raise _Fail(errno.EINVAL, f"ctl_stack_size {a.ctl_stack_size:#x} must be in 1.."
                                f"ctx_save_restore_size {a.ctx_save_restore_size:#x}")
                uses.append(self._need_mapped("CWSR area", int(a.ctx_save_restore_address),
                                              int(a.ctx_save_restore_size)).handle)
            else:
                self.log.append("CREATE_QUEUE: no CWSR area (accepted; UNSURE whether a real KFD with CWSR "
                                "enabled accepts it)")
        qid = next(i for i in range(abi.KFD_MAX_NUM_OF_QUEUES_PER_PROCESS + 1) if i not in self.queues)
        if qid == abi.KFD_MAX_NUM_OF_QUEUES_PER_PROCESS:
            raise _Fail(errno.ENOMEM, "no free queue id")
        # one doorbell per queue, so a free slot exists whenever a queue id does
        used_slots = {q.doorbell_byte_offset for q in self.queues.values()}
        slot = next(s for s in range(0, abi.DOORBELL_PROCESS_SLICE, abi.DOORBELL_BYTES)
                    if s not in used_slots)
        self._doorbell_memfd()
        doorbell_offset = abi.KFD_MMAP_TYPE_DOORBELL | abi.kfd_mmap_gpu_id(self.gpu_id) | slot
        self.queues[qid] = MockQueue(
            qid, qtype, self.gpu_id, int(a.ring_base_address), size, int(a.read_pointer_address),
            int(a.write_pointer_address), int(a.eop_buffer_address), int(a.eop_buffer_size),
            int(a.ctx_save_restore_address), int(a.ctx_save_restore_size), int(a.ctl_stack_size),
            int(a.queue_priority), pct, doorbell_offset, slot, tuple(uses))
        a.queue_id, a.doorbell_offset = qid, doorbell_offset
        if self.on_queue is not None:
            self.on_queue(self.queues[qid], True)

    def _k_destroy_queue(self, a: Any) -> None:
        q = self.queues.pop(int(a.queue_id), None)
        if q is None:
            raise _Fail(errno.EINVAL, f"queue_id {a.queue_id} is not a live queue")
        if self.on_queue is not None:
            self.on_queue(q, False)

    # -- events ---------------------------------------------------------------------------------
    def _slots(self) -> Any:
        assert self.event_page is not None
        return _ffi.cast("volatile uint64_t *", self.event_page.host_addr)

    def _k_create_event(self, a: Any) -> None:
        if a.event_page_offset:
            if self.event_page is not None:
                raise _Fail(errno.EINVAL, "the event page is already set (pass it with the first event only)")
            bo = self._bo(int(a.event_page_offset), errno.EINVAL, "CREATE_EVENT event page")
            if bo.kind != "gtt":
                raise _Fail(errno.EINVAL, f"event page {bo.describe()} must be GTT (the kernel maps it)")
            if bo.size < abi.EVENT_PAGE_BYTES:
                raise _Fail(errno.EINVAL, f"event page {bo.size:#x} bytes < {abi.EVENT_PAGE_BYTES:#x} needed")
            self.event_page = bo
            _ffi.memmove(_ffi.cast("char *", bo.host_addr), b"\xff" * abi.EVENT_PAGE_BYTES,
                         abi.EVENT_PAGE_BYTES)
        etype = int(a.event_type)
        if etype not in abi.EVENT_TYPE_NAMES and self.strict:
            raise _Fail(errno.EINVAL, f"event_type {etype} is not a KFD_IOC_EVENT_* value (mock strictness)")
        if etype in (abi.KFD_IOC_EVENT_SIGNAL, abi.KFD_IOC_EVENT_DEBUG_EVENT):
            if self.event_page is None:
                raise _Fail(errno.EINVAL, "a signal event before the event page was passed (mock: rawgrad "
                            "always supplies a user event page; kernel-allocated pages are not emulated)")
            used = {e.slot for e in self.events.values() if e.slot is not None}
            limit = min(self.event_page.size // abi.EVENT_SLOT_BYTES, abi.KFD_SIGNAL_EVENT_LIMIT)
            slot = next((s for s in range(limit) if s not in used), None)
            if slot is None:
                raise _Fail(errno.ENOSPC, f"all {limit} signal event slots are in use")
            ev = MockEvent(slot, etype, bool(a.auto_reset), int(a.node_id), slot)
            self._slots()[slot] = abi.UNSIGNALED_EVENT_SLOT
            a.event_slot_index, a.event_trigger_data = slot, slot
            a.event_page_offset = abi.KFD_MMAP_TYPE_EVENTS
        else:
            ev = MockEvent(self._next_other_event, etype, bool(a.auto_reset), int(a.node_id), None)
            self._next_other_event += 1
        self.events[ev.event_id] = ev
        a.event_id = ev.event_id

    def _event(self, event_id: int, what: str) -> MockEvent:
        ev = self.events.get(event_id)
        if ev is None:
            raise _Fail(errno.EINVAL, f"{what}: event_id {event_id:#x} is not a live event")
        return ev

    def _k_destroy_event(self, a: Any) -> None:
        ev = self._event(int(a.event_id), "DESTROY_EVENT")
        del self.events[ev.event_id]
        if ev.slot is not None:
            self._slots()[ev.slot] = abi.UNSIGNALED_EVENT_SLOT

    def _k_set_event(self, a: Any) -> None:
        ev = self._event(int(a.event_id), "SET_EVENT")
        if ev.slot is None:
            raise _Fail(errno.EINVAL, f"SET_EVENT: event {ev.event_id:#x} is not a signal event")
        self._signal(ev)

    def _signal(self, ev: MockEvent) -> None:
        ev.signaled = True
        self.cond.notify_all()

    def _k_wait_events(self, a: Any) -> None:
        n = int(a.num_events)
        if n == 0 and self.strict:
            raise _Fail(errno.EINVAL, "WAIT_EVENTS on no events (mock strictness)")
        if a.events_ptr == 0:
            raise _Fail(errno.EFAULT, "events_ptr is NULL")
        data = abi.ffi.cast("struct kfd_event_data *", int(a.events_ptr))
        evs = [self._event(int(data[i].event_id), "WAIT_EVENTS") for i in range(n)]
        timeout = int(a.timeout)
        deadline = None if timeout == abi.KFD_EVENT_TIMEOUT_INFINITE else time.monotonic() + timeout / 1000
        while True:
            done = [e.signaled for e in evs]
            if (all(done) if a.wait_for_all else any(done)):
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                a.wait_result = abi.KFD_IOC_WAIT_RESULT_TIMEOUT
                return
            self.cond.wait(left)
        for i, ev in enumerate(evs):
            if not ev.signaled:
                continue
            d = data[i]
            if ev.memory_fault is not None:
                m = d.memory_exception_data
                m.va, m.gpu_id = ev.memory_fault[0], self.gpu_id
                f = m.failure
                f.NotPresent, f.ReadOnly, f.NoExecute, f.imprecise = ev.memory_fault[1:]
            if ev.hw_exception is not None:
                h = d.hw_exception_data
                h.reset_type, h.reset_cause, h.memory_lost = ev.hw_exception
                h.gpu_id = self.gpu_id
            if ev.auto_reset:
                ev.signaled = False
                if ev.slot is not None:
                    self._slots()[ev.slot] = abi.UNSIGNALED_EVENT_SLOT
        a.wait_result = abi.KFD_IOC_WAIT_RESULT_COMPLETE

    # ==========================================================================================
    # The GPU side: what a CP model (or a test) calls
    def translate(self, va: int, size: int) -> int:
        """Host address of GPU VA range [va, va+size); MockGPUFault if no GPU mapping holds it."""
        with self.lock:
            bo = self.mapped_bo(va, size)
            if bo is None:
                raise MockGPUFault(va, size, "not inside one GPU-mapped allocation")
            return bo.host_addr + (va - bo.va)

    def host_buffer(self, va: int, size: int) -> Any:
        """A writable buffer over the bytes behind GPU VA range [va, va+size) (no copy: ``np.frombuffer`` of
        it shares memory with the driver's CPU mapping). Valid while the allocation lives."""
        return _ffi.buffer(_ffi.cast("char *", self.translate(va, size)), size)

    def gpu_mappings(self) -> list[MockBO]:
        """Every allocation currently mapped on the GPU (what a GPU model's address space holds)."""
        with self.lock:
            return [bo for bo in self.bos.values() if bo.mapped_gpus]

    def gpu_read(self, va: int, size: int) -> bytes:
        return bytes(_ffi.buffer(_ffi.cast("char *", self.translate(va, size)), size))

    def gpu_write(self, va: int, data: bytes) -> None:
        _ffi.memmove(_ffi.cast("char *", self.translate(va, len(data))), data, len(data))

    def interrupt(self, ctxid: int) -> None:
        """An end-of-pipe interrupt (RELEASE_MEM with INT_SEL, SDMA TRAP) carrying ``ctxid``: like
        kfd_signal_event_interrupt, signal that event if its mailbox was written, else scan every mailbox."""
        with self.lock:
            if self.event_page is None:
                return
            slots = self._slots()
            ev = self.events.get(ctxid)
            if ev is not None and ev.slot is not None and int(slots[ev.slot]) != abi.UNSIGNALED_EVENT_SLOT:
                self._signal(ev)
                return
            for e in self.events.values():
                if e.slot is not None and int(slots[e.slot]) != abi.UNSIGNALED_EVENT_SLOT:
                    self._signal(e)

    def signal_event(self, event_id: int) -> None:
        """Signal an event from the host side (what SET_EVENT does)."""
        with self.lock:
            ev = self.events.get(event_id)
            if ev is None:
                raise MockUsageError(f"signal_event: no event {event_id:#x}")
            self._signal(ev)

    def inject_memory_fault(self, va: int, *, write: bool = False, execute: bool = False,
                            not_present: bool = True, imprecise: bool = False) -> abi.MemoryFault:
        """A GPU page fault at ``va``: recorded in ``faults`` and delivered to every MEMORY event."""
        with self.lock:
            fault = abi.MemoryFault(va, self.gpu_id, not_present, write and not not_present, execute,
                                    imprecise, abi.KFD_MEM_ERR_NO_RAS)
            self.faults.append(fault)
            for ev in self.events.values():
                if ev.event_type == abi.KFD_IOC_EVENT_MEMORY:
                    ev.memory_fault = (va, int(fault.not_present), int(fault.read_only), int(execute),
                                       int(imprecise))
                    self._signal(ev)
            return fault

    def inject_hw_exception(self, *, reset_cause: int = abi.KFD_HW_EXCEPTION_GPU_HANG,
                            reset_type: int = abi.KFD_HW_EXCEPTION_WHOLE_GPU_RESET,
                            memory_lost: bool = False) -> None:
        """A GPU hang/reset: every HW_EXCEPTION event is signaled with the payload."""
        with self.lock:
            for ev in self.events.values():
                if ev.event_type == abi.KFD_IOC_EVENT_HW_EXCEPTION:
                    ev.hw_exception = (reset_type, reset_cause, int(memory_lost))
                    self._signal(ev)

    # ==========================================================================================
    # Teardown / leak tracking
    def _teardown_process(self) -> None:
        """Closing the last /dev/kfd fd ends the KFD process: the kernel frees what is left (recorded)."""
        for q in list(self.queues.values()):
            self.auto_freed.append(f"queue {q.queue_id} ({abi.QUEUE_TYPE_NAMES[q.queue_type]})")
            del self.queues[q.queue_id]
            if self.on_queue is not None:
                self.on_queue(q, False)
        for e in list(self.events.values()):
            self.auto_freed.append(f"event {e.event_id:#x} ({abi.EVENT_TYPE_NAMES.get(e.event_type, '?')})")
        self.events.clear()
        for bo in list(self.bos.values()):
            if bo is not self.event_page:  # the event page is only ever freed here, by design
                self.auto_freed.append(bo.describe() + (" (GPU-mapped)" if bo.mapped_gpus else ""))
            if bo.mapped_gpus and self.on_gpu_map is not None:
                self.on_gpu_map(bo, False)
            bo.mapped_gpus.clear()
            self._free_bo(bo)
        self.event_page = None
        if self.doorbells is not None:
            self.doorbells.release()
            self.doorbells = None
        self.vm_fd = None
        self.runtime_enabled = False

    def leaks(self) -> dict[str, list[str]]:
        """Everything still alive; every list is empty after a clean driver close."""
        with self.lock:
            return {
                "fds": [f"{st.fd} {st.path}" for st in self.fds.values()],
                "allocations": [bo.describe() for bo in self.bos.values()],
                "gpu_mappings": [bo.describe() for bo in self.bos.values() if bo.mapped_gpus],
                "cpu_mappings": [f"{m.addr:#x}+{m.length:#x} {m.kind}" for m in self.cpu_maps.values()],
                "queues": [f"queue {q.queue_id}" for q in self.queues.values()],
                "events": [f"event {e.event_id:#x}" for e in self.events.values()],
                "memfds": [f"{bo.describe()}" for bo in self.bos.values() if bo.memfd is not None]
                + (["doorbell slice"] if self.doorbells is not None else []),
                "auto_freed": list(self.auto_freed),
            }
