"""The AMD GPU as an HCQ device: `AMDDevice` brings a GPU up through KFD (`/dev/kfd` + the render node) behind
the OS seam, with no ROCm library (AMD-METAL-FACTS 1.2): GET_VERSION, ACQUIRE_VM, memory allocated at the
driver's own virtual addresses (KFD: CPU VA == GPU VA), one PM4 compute queue and one SDMA queue whose rings
are `hcq.Ring`s retired by the CP / SDMA read pointers, doorbells through the seam's publisher.

- Memory: one PROT_NONE reservation carved by `hcq.VARangeAllocator`; each allocation is mapped over its
  range (render-node mmap) and on the GPU. Buffers and code are CPU-visible VRAM (PUBLIC: a large BAR is
  assumed, as on the RX 7900 XTX); rings, signals and bound queues are GTT.
- Signals: 16-byte slots (u64 value, u64 timestamp) in GTT pages, `compare_bits=32` (the CP compares 32 bits).
  Host waits sleep in KFD's WAIT_EVENTS on the device's SIGNAL event (AMD-METAL-FACTS 1.3 step 5, 1.4): every
  signal write is followed by a write of the event's trigger data to its mailbox and an interrupt with the
  event id, which wakes the waiter at once. Without the event (KFD refused it, or `interrupts=False`) the
  waits poll.
- Host copies go through the CPU mapping after the timeline drained (simple and correct; not fast).
- `clock`: the GPU counter runs at 100 MHz (AMD-METAL-FACTS 1.4), one tick = 10 ns.

`MockAMD` (the CI stand-in, `AMD_MOCK=1`): the mock KFD (mock/kfd.py) with the command-processor model
(mock/cp.py) on its hooks: GPU mappings shared with the CP's memory map (no copy), queues mirrored, and a GPU
thread that runs the CP on each doorbell and, while a queue waits on memory, polls it. A CP fault halts that
queue and surfaces as `hcq.DeviceFault` from `check_fault`.
"""
from __future__ import annotations

import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgrad.compiler.amdgpu_code import AMDCodeObject, load_code_object
from rawgrad.compiler.ir import Variable
from rawgrad.compiler.renderer import renderer_for
from rawgrad.compiler.target import AMD_GFX942, AMD_GFX1100, LaunchSpec
from rawgrad.compiler.toolchain import amdgpu_compiler
from rawgrad.drivers import osapi
from rawgrad.drivers.amd import abi, pm4, regs, sdma
from rawgrad.drivers.amd.queues import GPU_VA_LIMIT, AMDComputeQueue, AMDCopyQueue
from rawgrad.drivers.amd.topology import KFD_PATH, AMDNode, discover
from rawgrad.hcq.allocator import Allocator, HCQBuffer
from rawgrad.hcq.device import HCQDevice
from rawgrad.hcq.errors import DeviceFault, DeviceTimeout
from rawgrad.hcq.memory import ffi
from rawgrad.hcq.program import KernelLaunch, Program
from rawgrad.hcq.queue import Value
from rawgrad.hcq.ring import BYTES, DWORDS, CounterRetire, Ring
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, SIGNAL_BYTES, DeviceClock, Signal

__all__ = ["AMD_CLOCK", "AMDAllocator", "AMDBuffer", "AMDDevice", "AMDProgram", "MockAMD", "open_device"]

# The GPU counter RELEASE_MEM / SDMA TIMESTAMP write: 100 MHz on gfx11 and gfx942 (AMD-METAL-FACTS 1.4).
AMD_CLOCK = DeviceClock("10-ns tick", regs.NS_PER_TICK)
PAGE = abi.PAGE_SIZE
# The oldest KFD whose CREATE_QUEUE takes the 88-byte 1.11 layout abi.py builds (kfd_ioctl.h history).
MIN_KFD_VERSION = (1, 11)
# RUNTIME_ENABLE exists from KFD 1.14 (kfd_ioctl.h); current ROCm runtimes call it before creating queues.
RUNTIME_ENABLE_VERSION = (1, 14)
# The GPU address space rawgrad carves its allocations from: one PROT_NONE reservation asked for at this hint,
# far below the mock CP's kernarg snapshot (0x7F00_0000_0000) and the 2**47 GPUVM limit.
VA_HINT = 0x1000_0000_0000
VA_BYTES = 64 << 30
# Ring sizes: power-of-two bytes (KFD CREATE_QUEUE). 64 KiB PM4 = 16384 dwords; the SDMA ring the same.
DEFAULT_RING_BYTES = 64 << 10
# The EOP buffer a PM4 compute queue needs (its node's eop size; 4 KiB on gfx11 / gfx942 per the mock
# profiles, which follow kfd_queue.c's checks).
EOP_BUFFER_BYTES = 0x1000
# How often check_fault asks KFD (WAIT_EVENTS, no wait) whether a memory-fault or HW-exception event fired.
FAULT_POLL_S = 0.001
# Event waits are in whole ms (WAIT_EVENTS takes ms). The wait loop's sleeps double from 20 us to a 1 ms cap
# (hcq/signal.py): the shorter ones stay plain sleeps, so a short wait (a kernel of a few hundred us, a graph
# replay whose signals do not interrupt) is seen as soon as before; from the first 1-ms sleep on, the wait
# sleeps in WAIT_EVENTS and returns at the interrupt. A missed interrupt costs at most that 1 ms.
MS_PER_S = 1000
EVENT_WAIT_MIN_S = 1e-3
# The queue-control page holds the PM4 and SDMA read/write pointers in its first 32 bytes; this spare word
# takes the mailbox writes of a graph that carries interrupt packets on a device without a SIGNAL event.
CTL_SPARE_OFFSET = 64
# Signal slots come in GTT pages of this many bytes.
SIGNAL_POOL_BYTES = 16 * PAGE
# Same-device copies on the compute queue: a kernel moving one byte per work-item, in blocks of this many
# (index and bound are 32-bit: a copy of 4 GiB or more is refused by `copy_kernel`; the RDNA3 interpreter's
# opcode table has no 64-bit multiply-add nor 64-bit v_cmpx).
COPY_KERNEL = "rawgrad_amd_copy"
COPY_BLOCK = 256
COPY_MAX_BYTES = (1 << 32) - 1
COPY_NBYTES = Variable("amd.copy_nbytes", 0, COPY_MAX_BYTES)
COPY_KERNEL_IR = f"""
define amdgpu_kernel void @{COPY_KERNEL}(ptr addrspace(1) %dst, ptr addrspace(1) %src, i64 %n) #0 {{
entry:
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %base = mul i32 %wg, {COPY_BLOCK}
  %i32 = add i32 %base, %tid
  %i = zext i32 %i32 to i64
  %n32 = trunc i64 %n to i32
  %ok = icmp ult i32 %i32, %n32
  br i1 %ok, label %copy, label %done
copy:
  %s = getelementptr i8, ptr addrspace(1) %src, i64 %i
  %v = load i8, ptr addrspace(1) %s, align 1
  %d = getelementptr i8, ptr addrspace(1) %dst, i64 %i
  store i8 %v, ptr addrspace(1) %d, align 1
  br label %done
done:
  ret void
}}
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.workitem.id.x()
attributes #0 = {{ nounwind "amdgpu-flat-work-group-size"="1,{COPY_BLOCK}" }}
"""
TARGETS = {"gfx1100": AMD_GFX1100, "gfx942": AMD_GFX942}
# The mock runs kernels on the RDNA3 interpreter, thousands of times slower than hardware: a wait for the
# default timeout (DEFAULT_TIMEOUT_S) lasts this many times longer there, as on the NV mock. A timeout given
# explicitly is kept as it is, and real hardware never scales.
MOCK_TIMEOUT_SCALE = 20.0


class _MockSignal(Signal):
    """A signal of the mock GPU: a wait for the library's default timeout lasts MOCK_TIMEOUT_SCALE longer."""

    def wait(self, value: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, queue: str = "host",
             check: Callable[[], None] | None = None) -> None:
        if timeout_s == DEFAULT_TIMEOUT_S:
            timeout_s *= MOCK_TIMEOUT_SCALE
        super().wait(value, timeout_s, queue=queue, check=check)


def _round_up(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclass
class AMDBuffer:
    """One KFD allocation: its VA (CPU == GPU), page-rounded size, handle and kind ("vram" / "gtt")."""

    va: int
    size: int
    handle: int
    kind: str


class AMDAllocator(Allocator):
    """CPU-visible VRAM buffers; a freed buffer is released once the timeline passed the work before it."""

    def __init__(self, device: AMDDevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, nbytes: int) -> HCQBuffer:
        dev = self.device
        dev.reap()
        with dev.submit_lock:
            buf = dev.alloc_memory(nbytes, "vram")
        return HCQBuffer(buf.va, nbytes, buf)

    def _free(self, buf: HCQBuffer) -> None:
        self.device.free_after_timeline(buf.meta)

    def _copyin(self, buf: HCQBuffer, src: memoryview) -> None:
        dev = self.device
        dev.synchronize()  # queued work may still read or write the buffer
        dev.check_open()
        ffi.memmove(ffi.cast("void *", buf.va_addr), src, src.nbytes)

    def _copyout(self, dst: memoryview, buf: HCQBuffer) -> None:
        dev = self.device
        dev.synchronize()
        dev.check_open()
        ffi.memmove(ffi.from_buffer(dst), ffi.cast("void *", buf.va_addr), dst.nbytes)


class AMDProgram(Program):
    """A kernel's code object, relocated and copied to executable VRAM; `image_va` is where it landed."""

    def __init__(self, device: AMDDevice, name: str, lib: bytes, launch: LaunchSpec | None = None) -> None:
        self.co: AMDCodeObject = load_code_object(bytes(lib), device.arch, kernel=name)
        if launch is not None:
            launch = launch.with_resources(
                shared_bytes=max(launch.shared_bytes, self.co.metadata.group_segment_fixed_size))
        super().__init__(device, name, lib, launch)
        with device.submit_lock:
            self.image = device.alloc_memory(len(self.co.image), "vram", executable=True)
        ffi.memmove(ffi.cast("void *", self.image.va), self.co.image, len(self.co.image))
        self.image_va = self.image.va
        self.fn_addr: int = self.image.va  # what a graph template relocates: the image base (code at +entry)
        device.program_loaded(self)
        weakref.finalize(self, _free_image, weakref.ref(device), self.image)


def _free_image(dev_ref: weakref.ref[AMDDevice], buf: AMDBuffer) -> None:
    dev = dev_ref()
    if dev is not None:
        dev.free_after_timeline(buf)


class AMDDevice(HCQDevice):
    """One AMD GPU through KFD (see the module docstring). `os_iface`: LibcOS, or a mock KFD; `mock`: the
    MockAMD behind it (its CP faults become DeviceFault, and close() shuts it down)."""

    clock = AMD_CLOCK

    def __init__(self, name: str = "AMD", os_iface: Any = None, *, mock: MockAMD | None = None,
                 index: int = 0, ring_bytes: int = DEFAULT_RING_BYTES,
                 timeout_s: float = DEFAULT_TIMEOUT_S, interrupts: bool = True) -> None:
        self.closed = False
        self.name = name
        self.mock = mock
        if os_iface is None:
            os_iface = mock.kfd if mock is not None else osapi.LibcOS()
        self.os: Any = os_iface
        self.timeout_s = timeout_s
        self._buffers: dict[int, AMDBuffer] = {}
        self._deferred: deque[tuple[Callable[[], bool], AMDBuffer]] = deque()
        self._signal_free: list[int] = []
        self._queue_ids: list[int] = []
        self._event_ids: list[int] = []  # the fault events check_fault polls
        self._signal_event_ids: list[int] = []  # the SIGNAL event host waits sleep on (not polled for faults)
        self._memory_event = 0
        self.interrupts = interrupts
        self.signal_event: abi.EventInfo | None = None  # the SIGNAL event host waits sleep on (None: poll)
        self.event_mailbox = 0  # its mailbox: event page + slot * 8
        self.event_waits = 0  # WAIT_EVENTS calls host waits made (how tests see the waits were event driven)
        self.pm4_submissions = 0  # doorbells rung on the PM4 queue (a bound replay is one: tests count them)
        self._last_fault_poll = 0.0
        self._kfd_fault: str | None = None
        self._fds: list[int] = []
        self._va_base = 0
        self._doorbells = 0
        self._copy_program: AMDProgram | None = None
        self._code_objects: dict[tuple[str, bytes], AMDCodeObject] = {}
        self.submit_lock = threading.RLock()  # (HCQDevice sets it too; the bring-up needs it first)
        try:
            nodes = discover(self.os)
            if index >= len(nodes):
                raise OSError(f"AMD:{index}: only {len(nodes)} supported AMD GPU(s) here")
            self.node: AMDNode = nodes[index]
            self.arch = self.node.target
            self.fam = regs.family(self.arch)
            self.gpu_id = self.node.gpu_id
            self._bring_up(ring_bytes)
            super().__init__(name, AMDAllocator(self), amdgpu_compiler(self.arch),
                             renderer_for(TARGETS[self.arch]))
        except BaseException:
            self._teardown()
            raise

    @property
    def is_mock(self) -> bool:
        """Whether this is the mock GPU (its numbers are not hardware numbers)."""
        return self.mock is not None

    def __repr__(self) -> str:
        mock = " (mock)" if self.mock is not None else ""
        return f"<AMDDevice {self.name} {getattr(self, 'arch', '?')}{mock}>"

    # -- bring-up -----------------------------------------------------------------------------------------
    def _ioctl(self, call: abi.KFDCall) -> abi.KFDCall:
        self.os.ioctl(self.kfd_fd, call.request, call.args)
        return call

    def _bring_up(self, ring_bytes: int) -> None:
        flags = osapi.O_RDWR | osapi.O_CLOEXEC
        self.kfd_fd = self.os.open(KFD_PATH, flags)
        self._fds.append(self.kfd_fd)
        self.version = abi.decode_version(self._ioctl(abi.get_version()))
        if self.version < MIN_KFD_VERSION:
            raise OSError(f"KFD {self.version[0]}.{self.version[1]} is older than {MIN_KFD_VERSION[0]}."
                          f"{MIN_KFD_VERSION[1]}, the oldest CREATE_QUEUE layout rawgrad sends")
        self.drm_fd = self.os.open(self.node.render_node, flags)
        self._fds.append(self.drm_fd)
        self._ioctl(abi.acquire_vm(self.drm_fd, self.gpu_id))
        if self.version >= RUNTIME_ENABLE_VERSION:
            self._ioctl(abi.runtime_enable(True))
        self._va_base = self.os.mmap(VA_HINT, VA_BYTES, osapi.PROT_NONE,
                                     osapi.MAP_PRIVATE | osapi.MAP_ANONYMOUS | osapi.MAP_NORESERVE, -1, 0)
        from rawgrad.hcq.va import VARangeAllocator
        if self._va_base + VA_BYTES > GPU_VA_LIMIT:
            raise OSError(f"the VA reservation at {self._va_base:#x} is beyond the GPUVM aperture")
        self.va = VARangeAllocator(self._va_base, VA_BYTES, PAGE)
        self._signal_pool()
        self._fault_events()
        # queue control words: PM4 rptr/wptr, SDMA rptr/wptr (64-bit each)
        self.ctl = self.alloc_memory(PAGE, "gtt")
        ctl_words = ffi.cast("volatile uint64_t *", self.ctl.va)
        self.pm4_ring_buf = self.alloc_memory(ring_bytes, "gtt")
        self.eop = self.alloc_memory(EOP_BUFFER_BYTES, "gtt")
        pm4_q = abi.decode_create_queue(self._ioctl(abi.create_queue(
            self.gpu_id, abi.KFD_IOC_QUEUE_TYPE_COMPUTE, ring_base=self.pm4_ring_buf.va, ring_size=ring_bytes,
            read_pointer=self.ctl.va, write_pointer=self.ctl.va + 8, eop_buffer=self.eop.va,
            eop_buffer_size=EOP_BUFFER_BYTES)))
        self._queue_ids.append(pm4_q.queue_id)
        self.sdma_ring_buf = self.alloc_memory(ring_bytes, "gtt")
        sdma_q = abi.decode_create_queue(self._ioctl(abi.create_queue(
            self.gpu_id, abi.KFD_IOC_QUEUE_TYPE_SDMA, ring_base=self.sdma_ring_buf.va, ring_size=ring_bytes,
            read_pointer=self.ctl.va + 16, write_pointer=self.ctl.va + 24)))
        self._queue_ids.append(sdma_q.queue_id)
        self._doorbells = self.os.mmap(0, abi.DOORBELL_PROCESS_SLICE, osapi.PROT_READ | osapi.PROT_WRITE,
                                       osapi.MAP_SHARED, self.kfd_fd, pm4_q.doorbell_mmap_offset)
        self.pm4_ring_va = self.pm4_ring_buf.va
        self.pm4_words = np.frombuffer(ffi.buffer(ffi.cast("char *", self.pm4_ring_va), ring_bytes),
                                       np.uint32)
        self.sdma_words = np.frombuffer(ffi.buffer(ffi.cast("char *", self.sdma_ring_buf.va), ring_bytes),
                                        np.uint32)
        self.pm4_publish = self.os.doorbell_publisher(self.ctl.va + 8,
                                                      self._doorbells + pm4_q.doorbell_byte_offset)
        self.sdma_publish = self.os.doorbell_publisher(self.ctl.va + 24,
                                                       self._doorbells + sdma_q.doorbell_byte_offset)
        common: dict[str, Any] = dict(device=self.name, check=self.check_fault, detail=self.progress_report,
                                      timeout_s=self.timeout_s)
        cp_rptr, sdma_rptr = CounterRetire(ctl_words, "CP read pointer", 0), \
            CounterRetire(ctl_words, "SDMA read pointer", 2)
        self.pm4_ring = Ring("PM4 ring", ring_bytes // 4, DWORDS, cp_rptr, pad=self._pad_pm4, **common)
        self.sdma_ring = Ring("SDMA ring", ring_bytes, BYTES, sdma_rptr, pad=self._pad_sdma, **common)

    def _pad_pm4(self, slot: int, n: int) -> None:
        # NOP packets the CP reads past (each at most a header + PACKET3_MAX_PAYLOAD dwords)
        while n:
            k = min(n, regs.PACKET3_MAX_PAYLOAD)
            self.pm4_words[slot:slot + k] = np.asarray(pm4.nop(k), np.uint32)
            slot, n = slot + k, n - k

    def _pad_sdma(self, slot: int, n: int) -> None:
        dword, left = slot // 4, n // 4  # SDMA spans are whole dwords (reserved 4-byte aligned)
        while left:
            k = min(left, regs.SDMA_NOP_COUNT_MASK + 1)
            self.sdma_words[dword:dword + k] = np.asarray(sdma.nop(k), np.uint32)
            dword, left = dword + k, left - k

    # -- memory -------------------------------------------------------------------------------------------
    def alloc_memory(self, nbytes: int, kind: str, *, executable: bool = False) -> AMDBuffer:
        """A KFD allocation of `kind` ("vram": CPU-visible VRAM, "gtt": system memory), mapped at the same VA
        on the CPU and the GPU. Call under `submit_lock`."""
        size = _round_up(max(nbytes, 1), PAGE)
        flags = abi.KFD_IOC_ALLOC_MEM_FLAGS_WRITABLE
        if executable:
            flags |= abi.KFD_IOC_ALLOC_MEM_FLAGS_EXECUTABLE
        if kind == "vram":
            flags |= abi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM | abi.KFD_IOC_ALLOC_MEM_FLAGS_PUBLIC
        elif kind == "gtt":
            flags |= abi.KFD_IOC_ALLOC_MEM_FLAGS_GTT | abi.KFD_IOC_ALLOC_MEM_FLAGS_COHERENT | \
                abi.KFD_IOC_ALLOC_MEM_FLAGS_UNCACHED
        else:
            raise ValueError(f"memory kind {kind!r}: use 'vram' or 'gtt'")
        va = self.va.alloc(size, PAGE)
        try:
            call = self._ioctl(abi.alloc_memory(self.gpu_id, va, size, flags))
        except OSError as e:
            self.va.free(va)
            if "ENOMEM" in str(e):
                raise MemoryError(f"{self!r}: {e}") from e
            raise
        got = abi.decode_alloc(call)
        buf = AMDBuffer(va, size, got.handle, kind)
        try:
            self._ioctl(abi.map_memory(got.handle, [self.gpu_id]))
            self.os.mmap(va, size, osapi.PROT_READ | osapi.PROT_WRITE, osapi.MAP_SHARED | osapi.MAP_FIXED,
                         self.drm_fd, got.mmap_offset)
        except BaseException:
            self._release(buf, mapped=False)
            raise
        self._buffers[va] = buf
        return buf

    def _release(self, buf: AMDBuffer, mapped: bool = True) -> None:
        # Put the reservation back over the range, then unmap from the GPU and free (each step best effort
        # at teardown: the KFD process end frees what is left).
        self.os.mmap(buf.va, buf.size, osapi.PROT_NONE,
                     osapi.MAP_PRIVATE | osapi.MAP_ANONYMOUS | osapi.MAP_NORESERVE | osapi.MAP_FIXED, -1, 0)
        try:
            self._ioctl(abi.unmap_memory(buf.handle, [self.gpu_id]))
        except OSError:
            if mapped:
                raise
        self._ioctl(abi.free_memory(buf.handle))
        self.va.free(buf.va)

    def free_memory(self, buf: AMDBuffer) -> None:
        """Release an allocation now (the caller knows the GPU is done with it). Call under `submit_lock`."""
        if self._buffers.pop(buf.va, None) is not None:
            self._release(buf)

    def free_after_timeline(self, buf: AMDBuffer) -> None:
        """Release `buf` once every piece of work submitted on the timeline so far has finished (safe from
        finalizers: it only appends)."""
        if self.closed:
            return
        value, signal = self.timeline_value - 1, self.timeline_signal
        self._deferred.append((lambda: signal.value >= value, buf))

    def free_after_ring(self, buf: AMDBuffer, retire: list[int]) -> None:
        """Release a bound queue's block once the PM4 ring passed its last replay."""
        if self.closed:
            return
        self._deferred.append((lambda: self.pm4_ring.retired() >= retire[0], buf))

    def reap(self) -> int:
        """Release the deferred allocations whose work is done; returns how many."""
        if self.closed or not self._deferred:
            return 0
        freed = 0
        with self.submit_lock:
            for _ in range(len(self._deferred)):
                ready, buf = self._deferred.popleft()
                if ready():
                    self.free_memory(buf)
                    freed += 1
                else:
                    self._deferred.append((ready, buf))
        return freed

    # -- faults -------------------------------------------------------------------------------------------
    def _fault_events(self) -> None:
        """KFD reports GPU page faults and hangs/resets through MEMORY and HW_EXCEPTION events; the first
        event of the process brings the event page (a GTT allocation the KFD process keeps until it ends, so
        it is not in `_buffers`: FREE_MEMORY_OF_GPU refuses it). Then the SIGNAL event host waits sleep on
        (its mailbox in the event page; the queues write it and interrupt after every signal)."""
        page = self.alloc_memory(abi.EVENT_PAGE_BYTES, "gtt")
        del self._buffers[page.va]
        mem = abi.decode_event(self._ioctl(abi.create_event(abi.KFD_IOC_EVENT_MEMORY,
                                                             event_page_handle=page.handle)))
        self._event_ids.append(mem.event_id)
        self._memory_event = mem.event_id
        hw = abi.decode_event(self._ioctl(abi.create_event(abi.KFD_IOC_EVENT_HW_EXCEPTION)))
        self._event_ids.append(hw.event_id)
        if not self.interrupts:
            return
        try:
            sig = abi.decode_event(self._ioctl(abi.create_event(abi.KFD_IOC_EVENT_SIGNAL, auto_reset=True)))
        except OSError:  # no event slot left (or an older KFD): host waits poll instead
            self.interrupts = False
            return
        self._signal_event_ids = [sig.event_id]
        self.signal_event = sig
        self.event_mailbox = page.va + sig.slot_index * abi.EVENT_SLOT_BYTES

    def event_target(self) -> tuple[int, int]:
        """(mailbox VA, event id) that a graph template's interrupt packets bind to here. Without a SIGNAL
        event: a spare dword of the queue-control page and id 0, so a graph that carries the packets still
        runs (its interrupt wakes nobody)."""
        if self.signal_event is None:
            return self.ctl.va + CTL_SPARE_OFFSET, 0
        return self.event_mailbox, self.signal_event.event_id

    def _event_wait(self, value: int, seconds: float) -> None:
        """The signals' `event_wait` hook: a sleep of 1 ms or more is spent in WAIT_EVENTS on the SIGNAL event
        until a signal write's interrupt (or `seconds`, rounded up to whole ms); shorter ones sleep (see
        EVENT_WAIT_MIN_S). It may return early or late by one interrupt: the wait loop checks the value
        again."""
        ids = self._signal_event_ids
        if self.closed or not ids or seconds < EVENT_WAIT_MIN_S:
            time.sleep(seconds)
            return
        self.event_waits += 1
        try:
            self._ioctl(abi.wait_events(ids, max(1, math.ceil(seconds * MS_PER_S))))
        except OSError:  # the fd went away under a late waiter: poll
            time.sleep(seconds)

    def _poll_fault_events(self) -> None:
        """WAIT_EVENTS with no wait on the fault events, at most every FAULT_POLL_S (each is an ioctl)."""
        now = time.monotonic()
        if not self._event_ids or now - self._last_fault_poll < FAULT_POLL_S:
            return
        self._last_fault_poll = now
        call = self._ioctl(abi.wait_events(self._event_ids, abi.KFD_EVENT_TIMEOUT_IMMEDIATE))
        got = abi.decode_wait(call, [self._memory_event])
        if got.completed:
            self._kfd_fault = "; ".join(str(f) for f in got.faults) or \
                "KFD signalled a hardware exception (GPU hang or reset)"

    # -- signals ------------------------------------------------------------------------------------------
    def _signal_pool(self) -> None:
        pool = self.alloc_memory(SIGNAL_POOL_BYTES, "gtt")
        self._signal_free.extend(range(pool.va + pool.size - SIGNAL_BYTES, pool.va - 1, -SIGNAL_BYTES))

    def new_signal(self, value: int = 0, name: str | None = None) -> Signal:
        with self.submit_lock:
            self.check_open()
            if not self._signal_free:
                self._signal_pool()
            addr = self._signal_free.pop()
        kind = _MockSignal if self.mock is not None else Signal
        sig = kind(value, address=addr, owner=self.name, name=name, compare_bits=32,
                   event_wait=self._event_wait if self.signal_event is not None else None)
        weakref.finalize(sig, self._free_signal, addr)
        return sig

    def _free_signal(self, addr: int) -> None:
        if not self.closed:
            self._signal_free.append(addr)

    # -- HCQ API ------------------------------------------------------------------------------------------
    def queue(self) -> AMDComputeQueue:
        return AMDComputeQueue(self)

    def copy_queue(self) -> AMDCopyQueue:
        return AMDCopyQueue(self)

    def program(self, name: str, lib: bytes, launch: LaunchSpec | None = None) -> AMDProgram:
        return AMDProgram(self, name, lib, launch)

    def code_object(self, program: Any) -> AMDCodeObject:
        """The code object of a program loaded here (or of a graph template's stand-in for one)."""
        if getattr(program, "device", None) is not self or getattr(program, "fn_addr", None) is None:
            raise TypeError(f"{program!r} is not a program loaded on {self.name}")
        if isinstance(program, AMDProgram):
            return program.co
        key = (program.name, bytes(program.lib))
        co = self._code_objects.get(key)
        if co is None:
            co = self._code_objects[key] = load_code_object(key[1], self.arch, kernel=program.name)
        return co

    def program_loaded(self, program: AMDProgram) -> None:
        """Tell the mock's dispatch validator about a kernel (real hardware needs nothing)."""
        if self.mock is not None:
            self.mock.register_program(program.co, program.image_va)

    def copy_program(self) -> AMDProgram:
        if self._copy_program is None:
            lib = self.compiler.compile(COPY_KERNEL_IR)
            contract = LaunchSpec((COPY_NBYTES, 1, 1), (COPY_BLOCK, 1, 1), buffers=2, scalars=(COPY_NBYTES,))
            self._copy_program = AMDProgram(self, COPY_KERNEL, lib, contract)
        return self._copy_program

    def copy_kernel(self, dst: Value, src: Value, nbytes: Value) -> KernelLaunch:
        """A same-device copy on the compute queue, as a launch of the copy kernel."""
        if isinstance(nbytes, int) and not 0 <= nbytes <= COPY_MAX_BYTES:
            raise ValueError(f"{self.name}: a copy of {nbytes} bytes (the copy kernel moves at most "
                             f"{COPY_MAX_BYTES} in one launch)")
        return KernelLaunch(self.copy_program(), (dst, src, nbytes), (nbytes, 1, 1), (COPY_BLOCK, 1, 1))

    def graph_copy(self, dst: Value, src: Value, nbytes: Value) -> KernelLaunch:
        return self.copy_kernel(dst, src, nbytes)

    def check_fault(self) -> None:
        if self.closed:
            raise DeviceFault(f"{self.name} is closed")
        if self.mock is not None and self.mock.fault is not None:
            raise DeviceFault(f"{self.name}: GPU fault (mock command processor): {self.mock.fault}")
        if self._kfd_fault is None:
            self._poll_fault_events()
        if self._kfd_fault is not None:
            raise DeviceFault(f"{self.name}: {self._kfd_fault}")

    def progress_report(self) -> str:
        where = (f"PM4 ring: read {self.pm4_ring.retired()} of {self.pm4_ring.write} dwords; SDMA ring: read "
                 f"{self.sdma_ring.retired()} of {self.sdma_ring.write} bytes")
        if self.mock is not None:
            where += "; " + self.mock.status()
        return where

    def synchronize(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        try:
            super().synchronize(timeout_s)
        except DeviceTimeout as e:  # say where the rings and the CP stand
            detail = self.progress_report()
            if self.mock is not None:
                detail += "; " + self.mock.signal_history(self.timeline_signal.address, "the timeline signal")
            raise DeviceTimeout(e.device, e.queue, e.signal, e.expected, e.current, e.timeout_s,
                                detail) from None
        self.reap()

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self.mock is None or self.mock.fault is None:
                try:
                    super().synchronize(min(self.timeout_s, 2.0))
                except Exception:  # noqa: S110 - a hung or faulted device is still torn down
                    pass
        finally:
            self._teardown()

    def _teardown(self) -> None:
        self.closed = True
        os_iface = self.os
        for qid in self._queue_ids:
            try:
                self._ioctl(abi.destroy_queue(qid))
            except OSError:
                pass
        self._queue_ids.clear()
        for eid in self._event_ids + self._signal_event_ids:
            try:
                self._ioctl(abi.destroy_event(eid))
            except OSError:
                pass
        self._event_ids.clear()
        self._signal_event_ids.clear()
        for buf in list(self._buffers.values()):
            try:
                self._release(buf)
            except OSError:
                pass
        self._buffers.clear()
        self._deferred.clear()
        if self._doorbells:
            os_iface.munmap(self._doorbells, abi.DOORBELL_PROCESS_SLICE)
            self._doorbells = 0
        if self._va_base:
            os_iface.munmap(self._va_base, VA_BYTES)
            self._va_base = 0
        for fd in reversed(self._fds):
            try:
                os_iface.close(fd)
            except OSError:
                pass
        self._fds.clear()
        if self.mock is not None:
            self.mock.shutdown()


class MockAMD:
    """The mock KFD + command-processor model as one GPU (see the module docstring)."""

    POLL_S = 0.0005  # how often the GPU thread re-runs queues that wait on memory the host may write

    def __init__(self, profile: Any = None, *, execute: bool = True) -> None:
        from rawgrad.drivers.amd.mock.cp import CommandProcessor
        from rawgrad.drivers.amd.mock.kfd import GFX1100, MockKFD
        from rawgrad.drivers.amd.mock.rdna3.interp import MemoryMap
        from rawgrad.drivers.amd.topology import gfx_target_name
        self.profile = profile or GFX1100
        arch = gfx_target_name(dict(self.profile.properties)["gfx_target_version"])
        self.kfd = MockKFD(self.profile)
        self.memory = MemoryMap()
        self.cp = CommandProcessor(self.memory, arch, execute=execute)
        self.lock = threading.RLock()  # the CP and its memory map: one user at a time
        self.fault: Exception | None = None
        self._cp_queues: dict[int, Any] = {}
        self._doorbells: deque[tuple[int, int]] = deque()
        self._wake = threading.Condition(threading.Lock())
        self._stop = False
        self.kfd.on_gpu_map = self._on_gpu_map
        self.kfd.on_queue = self._on_queue
        self.kfd.on_doorbell = self._on_doorbell
        # interrupts the CP raised while it ran, delivered to the KFD after the CP lock is released (the KFD
        # calls the hooks above with its own lock held: taking it under the CP lock could deadlock)
        self._interrupts: list[int] = []
        self.cp.on_interrupt = lambda queue, ctxid: self._interrupts.append(ctxid)
        self._thread = threading.Thread(target=self._run, name="mock AMD GPU", daemon=True)
        self._thread.start()

    # -- KFD hooks (called with the mock KFD's lock held) --------------------------------------------------
    def _on_gpu_map(self, bo: Any, mapped: bool) -> None:
        with self.lock:
            if mapped:
                view = np.frombuffer(self.kfd.host_buffer(bo.va, bo.size), np.uint8)
                self.memory.map(bo.va, view, share=True)
            else:
                self.memory.unmap(bo.va)

    def _on_queue(self, q: Any, created: bool) -> None:
        with self.lock:
            if created:
                is_sdma = q.queue_type == abi.KFD_IOC_QUEUE_TYPE_SDMA
                make = self.cp.sdma_queue if is_sdma else self.cp.pm4_queue
                self._cp_queues[q.queue_id] = make(q.ring_base, q.ring_size, rptr_va=q.read_pointer,
                                                   name=f"{'SDMA' if is_sdma else 'PM4'} queue {q.queue_id}")
            else:
                cq = self._cp_queues.pop(q.queue_id, None)
                if cq is not None:
                    self.cp.queues.remove(cq)

    def _on_doorbell(self, q: Any, value: int) -> None:
        with self._wake:
            self._doorbells.append((q.queue_id, value))
            self._wake.notify()

    def register_program(self, co: AMDCodeObject, image_va: int) -> None:
        with self.lock:
            self.cp.register_kernel(image_va + co.kd_offset, name=co.name, image_va=image_va,
                                    image_size=len(co.image),
                                    max_workgroup_size=co.metadata.max_flat_workgroup_size)

    # -- the GPU thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                if not self._doorbells and not self._stop:
                    self._wake.wait(self.POLL_S if self._blocked() else None)
                if self._stop:
                    return
                rung = list(self._doorbells)
                self._doorbells.clear()
            if self.fault is not None:
                continue
            try:
                with self.lock:
                    for qid, wptr in rung:
                        cq = self._cp_queues.get(qid)
                        if cq is not None:
                            cq.doorbell(wptr)
                    if not rung:
                        self.cp.run()
            except Exception as e:  # a CP fault (GPUFault, CPUnsupported) halts the GPU for the device
                self.fault = e
            finally:
                self._deliver_interrupts()

    def _deliver_interrupts(self) -> None:
        with self.lock:
            ctxids, self._interrupts = self._interrupts, []
        for ctxid in ctxids:
            self.kfd.interrupt(ctxid)

    def _blocked(self) -> bool:
        return any(q.blocked is not None for q in list(self.cp.queues))

    def status(self) -> str:
        with self.lock:
            return "; ".join(q.status() for q in self.cp.queues) or "no CP queues"

    def signal_history(self, addr: int, what: str) -> str:
        """What the CP last wrote to a signal (why a wait on it may never end: no packet wrote it)."""
        with self.lock:
            last = self.cp.signal_writes.get(addr)
        if last is None:
            return f"no RELEASE_MEM or FENCE has written {what} at {addr:#x}"
        return f"the last RELEASE_MEM or FENCE to {what} at {addr:#x} wrote {last & 0xFFFFFFFF}"

    def shutdown(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def leaks(self) -> dict[str, list[str]]:
        return self.kfd.leaks()


def open_device(name: str, mock: bool = False) -> AMDDevice:
    """Registry factory: the real KFD through libc, or the mock GPU when asked (never as a fallback)."""
    index = int(name.partition(":")[2] or 0)
    if not mock:
        return AMDDevice(name, osapi.LibcOS(), index=index)
    m = MockAMD()
    try:
        return AMDDevice(name, mock=m, timeout_s=DEFAULT_TIMEOUT_S * MOCK_TIMEOUT_SCALE)
    except BaseException:
        m.shutdown()
        raise
