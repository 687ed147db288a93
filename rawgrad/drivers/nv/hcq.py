"""The NVIDIA GPU as an HCQ device: `NVHCQDevice` over the bring-up in device.py, and `open_device`, the
registry factory (`Device["NV"]`).

`NVHCQDevice` owns an `NVDevice` (RM/UVM objects, the compute and copy GPFIFO channels) and speaks the HCQ
vocabulary on top of it: signals are 16-byte slots (u64 value, u64 timestamp) in GPU-mapped host pages
(NV-FACTS 8); host<->device copies go through a pinned host staging buffer on the copy engine, on the device
timeline; buffers the GPU may still use are freed later (`reap`); the SLM buffer is set up at init and grown
for kernels that need more local memory. The pieces it hands out live beside it:

- queues.py: `NVComputeQueue` / `NVCopyQueue` (the pushbuffer words, QMD launches, bind and submit);
- allocator.py: `NVAllocator` (VRAM buffers);
- program.py: `NVProgram` (kernel images), launch limits, the same-device copy kernel.

Their names stay importable from here.
"""
from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from rawgrad import config
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.renderer import renderer_for
from rawgrad.compiler.target import LaunchSpec, nv_target
from rawgrad.drivers.nv import pushbuf as pbuf
from rawgrad.drivers.nv.allocator import NVAllocator as NVAllocator
from rawgrad.drivers.nv.cubin import NVCompiler
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.gpfifo import NVChannelError
from rawgrad.drivers.nv.memory import NVBuffer, round_up
from rawgrad.drivers.nv.program import (
    COPY_BLOCK_THREADS,
    COPY_KERNEL,
    COPY_KERNEL_PTX,
    COPY_NBYTES,
    MAX_BLOCK,
    MAX_GRID,
    MAX_THREADS_PER_BLOCK,
    copy_threads,
)
from rawgrad.drivers.nv.program import NVProgram as NVProgram
from rawgrad.drivers.nv.qmd import qmd_for_class
from rawgrad.drivers.nv.queues import DATA_BASE as DATA_BASE
from rawgrad.drivers.nv.queues import NVComputeQueue as NVComputeQueue
from rawgrad.drivers.nv.queues import NVCopyQueue as NVCopyQueue
from rawgrad.drivers.nv.queues import _hi32 as _hi32
from rawgrad.drivers.nv.queues import _lo32 as _lo32
from rawgrad.drivers.nv.queues import _NVQueue as _NVQueue
from rawgrad.drivers.osapi import LibcOS, OSInterface
from rawgrad.hcq.device import HCQDevice
from rawgrad.hcq.errors import DeviceFault, DeviceTimeout
from rawgrad.hcq.memory import ffi
from rawgrad.hcq.program import KernelLaunch
from rawgrad.hcq.queue import Value
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, Signal

__all__ = ["DATA_BASE", "NVAllocator", "NVComputeQueue", "NVCopyQueue", "NVHCQDevice", "NVProgram",
           "open_device"]

# SEND_SIGNALING_PCAS2_B action (NV-FACTS 5.2): PREFETCH_SCHEDULE, tinygrad's; NVK uses 3, libcuda 0xA.
PCAS_ACTION_PREFETCH_SCHEDULE = 9

# Shader local memory (NV-FACTS 5.6): per-thread bytes with no stack, and the SLM buffer rounding.
SLM_PER_THREAD = 0x240
SLM_WARP_THREADS = 32
SLM_THREAD_ROUND = 0x200
SLM_TPC_ROUND = 0x8000
SLM_TOTAL_ROUND = 0x20000
SLM_MAX_SM_COUNT = 0xFF

# Host<->device copies go through this much pinned host memory at a time.
STAGING_BYTES = 2 << 20
# How long close() lets queued work drain before tearing the device down.
CLOSE_DRAIN_S = 2.0
# The mock GPU interprets PTX, thousands of times slower than hardware (the README's 1024x1024 example
# runs about 3.5 minutes there): its waits for the default timeout (DEFAULT_TIMEOUT_S, and the channels'
# default when the registry opens it) are this many times longer. A timeout given explicitly is kept as it
# is, and real hardware never scales.
MOCK_TIMEOUT_SCALE = 20.0
NV_CHANNEL_TIMEOUT_S = 10.0  # NVDevice's default channel timeout, scaled for the mock by open_device


class _ScaledDefaultSignal(Signal):
    """A signal of the mock GPU: a wait for the default timeout lasts `scale` times longer."""

    def __init__(self, *args: Any, scale: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scale = scale

    def wait(self, value: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, queue: str = "host",
             check: Callable[[], None] | None = None) -> None:
        if timeout_s == DEFAULT_TIMEOUT_S:  # the library default (callers pass it on as a value)
            timeout_s *= self.scale
        super().wait(value, timeout_s, queue=queue, check=check)



ARCH_BY_SM_VERSION = {0x800: "sm_80", 0x806: "sm_86", 0x809: "sm_89", 0x900: "sm_90"}  # NV-FACTS 7.1


class NVHCQDevice(HCQDevice):
    """One NVIDIA GPU as an HCQ device (see the module docstring)."""

    def __init__(self, name: str = "NV", os_iface: OSInterface | None = None, *, index: int = 0,
                 owned_mock: Any = None, **nv_kwargs: Any) -> None:
        self.closed = False
        self.closing = False
        self.owned_mock = owned_mock  # a MockNV this device created and must shut down
        # the mock GPU in use, if any: its fault records make DeviceFault messages precise
        self.mock = owned_mock if owned_mock is not None else (
            os_iface if type(os_iface).__name__ == "MockNV" else None)
        self.is_mock = self.mock is not None
        # how much longer a wait for the default timeout lasts here (the mock reports its slowness)
        self.timeout_scale = MOCK_TIMEOUT_SCALE if self.is_mock else 1.0
        # SEND_SIGNALING_PCAS2_B action of a launch that is not chained (NV-FACTS 5.2: 9 = prefetch +
        # schedule; the bring-up smoke run tries 3 and 0xA too if nothing dispatches)
        self.pcas_action = PCAS_ACTION_PREFETCH_SCHEDULE
        self._copy_program: NVProgram | None = None
        # buffers waiting for the GPU to finish with them: (ready?, buffer); see reap(). A deque: finalizers
        # on any thread append while reap() pops, and neither operation can lose the other's item.
        self._deferred: deque[tuple[Callable[[], bool], NVBuffer]] = deque()
        self.nv = NVDevice(os_iface if os_iface is not None else LibcOS(), index=index, name=name,
                           **nv_kwargs)
        try:
            sm = self.nv.gr_info["sm_version"]
            self.arch = ARCH_BY_SM_VERSION.get(sm) or f"sm_{(sm >> 8) * 10 + (sm & 0xF)}"
            # SASS_VERSION in the QMD: major nibble, minor nibble (NV-FACTS 5.4)
            self.sass_version = ((sm & 0xF00) >> 4) | (sm & 0xF)
            self.qmd_class = qmd_for_class(self.nv.compute_class)
            self._staging: NVBuffer | None = None
            self._setup_local_memory()
            renderer = renderer_for(nv_target(self.arch))
            # A real GPU runs SASS only: without ptxas / nvJitLink this fails here, naming what to install.
            compiler = NVCompiler(self.arch, require_sass=not self.is_mock)
            super().__init__(name, NVAllocator(self), compiler, renderer)
        except BaseException:
            self._teardown()
            raise

    def __repr__(self) -> str:
        return f"<NVHCQDevice {self.name} {self.arch}{' (mock)' if self.is_mock else ''}>"

    # -- HCQDevice API ----------------------------------------------------------------------------------
    def new_signal(self, value: int = 0, name: str | None = None) -> Signal:
        with self.submit_lock:  # the driver's memory bookkeeping is not thread-safe: one caller at a time
            addr = self.nv.alloc_signal()
        if self.timeout_scale != 1.0:
            sig: Signal = _ScaledDefaultSignal(value, address=addr, owner=self.name, name=name,
                                               scale=self.timeout_scale)
        else:
            sig = Signal(value, address=addr, owner=self.name, name=name)
        weakref.finalize(sig, self.nv.free_signal, addr)
        return sig

    def queue(self) -> NVComputeQueue:
        return NVComputeQueue(self)

    def copy_queue(self) -> NVCopyQueue:
        return NVCopyQueue(self)

    def program(self, name: str, lib: bytes, launch: LaunchSpec | None = None) -> NVProgram:
        return NVProgram(self, name, lib, launch)

    def copy_program(self) -> NVProgram:
        """The same-device copy kernel (COPY_KERNEL_PTX), built on first use."""
        if self._copy_program is None:
            lib = self.compiler.compile(COPY_KERNEL_PTX.format(arch=self.arch, block=COPY_BLOCK_THREADS))
            contract = LaunchSpec((copy_threads(COPY_NBYTES), 1, 1), (COPY_BLOCK_THREADS, 1, 1), buffers=2,
                                  scalars=(COPY_NBYTES,))
            self._copy_program = NVProgram(self, COPY_KERNEL, lib, contract)
        return self._copy_program

    def copy_kernel(self, dst: Value, src: Value, nbytes: Value) -> KernelLaunch:
        """A same-device copy on the compute channel, as a launch of the copy kernel."""
        return KernelLaunch(self.copy_program(), (dst, src, nbytes), (copy_threads(nbytes), 1, 1),
                            (COPY_BLOCK_THREADS, 1, 1))

    def graph_copy(self, dst: Value, src: Value, nbytes: Value) -> KernelLaunch:
        """A graph's same-device copy as a kernel launch, so a captured graph relocates and saves it like any
        other kernel."""
        return self.copy_kernel(dst, src, nbytes)

    def check_fault(self) -> None:
        if self.closed:
            raise DeviceFault(f"{self.name} is closed")
        try:
            self.nv.check_errors()
        except NVChannelError as e:
            faults = getattr(getattr(self.mock, "gpu", None), "faults", None)
            detail = f"; mock GPU: {faults[-1]}" if faults else ""
            raise DeviceFault(f"{e}{detail}") from e

    def synchronize(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        try:
            super().synchronize(timeout_s)
        except DeviceTimeout as e:
            raise DeviceTimeout(e.device, e.queue, e.signal, e.expected, e.current, e.timeout_s,
                                self.progress_report()) from None
        self.reap()

    def progress_report(self) -> str:
        """Where each channel stands, for a timeout message: GP entries fetched of those published and
        submissions retired of those made, and what a channel that stopped short means."""
        channels = self.nv.channels
        where = "; ".join(f"{ch.name} channel: GPGet {ch.gp_get()} of GPPut {ch.put}, retired {ch.retired()} "
                          f"of {ch.retire_value}" for ch in channels)
        stuck = [ch.name for ch in channels if ch.retired() < ch.retire_value]
        if not stuck:
            return where
        return (f"{where}. Work on the {' and '.join(stuck)} channel has not retired: a wait on a signal "
                f"nobody releases, or a kernel that does not finish. A running kernel cannot be preempted; "
                f"if it is hung, close the device (Device.close('{self.name}') or process exit) to free "
                f"the channels")

    # -- deferred frees ---------------------------------------------------------------------------------
    def defer_free(self, buf: NVBuffer, ready: Callable[[], bool]) -> None:
        """Release `buf` once `ready()` (the GPU is done with it). Safe from finalizers: only appends."""
        if not (self.closed or self.closing):
            self._deferred.append((ready, buf))

    def defer_free_after_timeline(self, buf: NVBuffer) -> None:
        """Release `buf` once all work submitted on the timeline so far has finished."""
        value, signal = self.timeline_value - 1, self.timeline_signal
        self.defer_free(buf, lambda: signal.value >= value)

    def reap(self) -> int:
        """Release the deferred buffers that are ready; returns how many."""
        if self.closed or self.closing or not self._deferred:
            return 0
        freed = 0
        with self.submit_lock:  # one reaper at a time, and no other driver memory call meanwhile
            for _ in range(len(self._deferred)):  # what was queued so far; later appends wait for next time
                ready, buf = self._deferred.popleft()
                if ready():
                    self.nv.free(buf)
                    freed += 1
                else:
                    self._deferred.append((ready, buf))
        return freed

    def launch_dims(self, global_size: Sequence[Value],
                    local_size: Sequence[int]) -> tuple[tuple[Value, ...], tuple[int, ...]]:
        """(grid, block) for a launch of `global_size` threads per dimension in blocks of `local_size` (the
        program's launch contract, taken as it is): the grid rounds each dimension up to whole blocks."""
        if any(not isinstance(v, int) for v in local_size):
            raise ValueError(f"block size must be concrete, got {local_size}")
        block = [int(v) for v in local_size]
        if any(b < 1 or b > most for b, most in zip(block, MAX_BLOCK)) or \
                block[0] * block[1] * block[2] > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"block {tuple(block)} is empty, beyond {MAX_BLOCK} or has more than "
                             f"{MAX_THREADS_PER_BLOCK} threads")
        grid: list[Value] = []
        for g, b, limit in zip(global_size, block, MAX_GRID):
            if isinstance(g, int):
                if g < 0:
                    raise ValueError(f"negative launch size {global_size}")
                count = max(-(-g // b), 1)
                if count > limit:
                    raise ValueError(f"launch of {global_size} threads needs a grid beyond {MAX_GRID}")
                grid.append(count)
            else:
                # a zero-thread launch still runs one block: kernels bounds-check their index
                grid.append(((g + (b - 1)) // b).alu(Ops.MAX, UOp.const(g.dt, 1)))
        return tuple(grid), tuple(block)

    # -- copies through the staging buffer -------------------------------------------------------------
    def _staging_buffer(self) -> NVBuffer:
        if self._staging is None:
            self._staging = self.nv.alloc_host(STAGING_BYTES)
        return self._staging

    def _copy_now(self, dst: int, src: int, nbytes: int) -> None:
        value, q = self.timeline_submit(lambda q: q.copy(dst, src, nbytes), self.copy_queue())
        self.timeline_signal.wait(value, queue=q.name, check=self.check_fault)

    def copy_in(self, dst_va: int, src: memoryview) -> None:
        """Host bytes -> GPU memory at `dst_va`, after everything queued so far (copy engine)."""
        src = memoryview(src).cast("B")
        staging = self._staging_buffer()
        with self.submit_lock:
            for off in range(0, src.nbytes, STAGING_BYTES):
                n = min(STAGING_BYTES, src.nbytes - off)
                ffi.memmove(ffi.cast("void *", staging.va), src[off:off + n], n)
                self._copy_now(dst_va + off, staging.va, n)

    def copy_out(self, dst: memoryview, src_va: int) -> None:
        """GPU memory at `src_va` -> host bytes, after everything queued so far (copy engine)."""
        dst = memoryview(dst).cast("B")
        staging = self._staging_buffer()
        with self.submit_lock:
            for off in range(0, dst.nbytes, STAGING_BYTES):
                n = min(STAGING_BYTES, dst.nbytes - off)
                self._copy_now(staging.va, src_va + off, n)
                ffi.memmove(dst[off:off + n], ffi.cast("void *", staging.va), n)

    # -- bring-up extras ----------------------------------------------------------------------------------
    def _setup_local_memory(self, per_thread: int = SLM_PER_THREAD) -> None:
        """Allocate the SLM backing buffer for `per_thread` bytes of local memory per thread and point the
        compute engine at it (NV-FACTS 5.6, 2.2 step 35)."""
        gr = self.nv.gr_info
        per_warp = round_up(per_thread * SLM_WARP_THREADS, SLM_THREAD_ROUND)
        per_tpc = round_up(per_warp * gr["max_warps_per_sm"] * gr["sm_per_tpc"], SLM_TPC_ROUND)
        total = round_up(per_tpc * gr["tpc_per_gpc"] * gr["gpcs"], SLM_TOTAL_ROUND)
        self.slm = self.nv.alloc_vram(total, cpu_map=False)
        self.slm_per_thread = per_thread
        pb = pbuf.shader_local_memory(pbuf.PushBuffer(), self.nv.compute_class, self.slm.va, per_tpc,
                                      SLM_MAX_SM_COUNT)
        self.nv.compute.submit(pb)
        self.nv.compute.wait_idle()

    def grow_local_memory(self, per_thread: int) -> None:
        """A kernel needs more local memory per thread than the SLM buffer holds (a register spill or a
        stack): wait for the work that uses the old buffer, then set up a bigger one (doubling, so a few
        growing kernels do not each pay a reallocation) and free the old."""
        with self.submit_lock:
            if per_thread <= self.slm_per_thread:
                return
            self.synchronize()
            old = self.slm
            self._setup_local_memory(max(per_thread, 2 * self.slm_per_thread))
            self.nv.free(old)

    # -- teardown -------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Drain (briefly), release every buffer, object, mapping and fd; stop an owned mock GPU."""
        if self.closed:
            return
        self.closing = True
        try:
            self.synchronize(min(CLOSE_DRAIN_S, self.nv.timeout_s))
        except Exception:  # noqa: BLE001 - a faulted or hung device is torn down anyway
            pass
        try:
            self.allocator.free_cache()
        except Exception:  # noqa: BLE001
            pass
        self._teardown()

    def _teardown(self) -> None:
        self.closed = True
        try:
            self.nv.close()
        finally:
            if self.owned_mock is not None:
                self.owned_mock.shutdown()


MOCK_PROFILES = ("h100", "ampere")


def open_device(name: str) -> NVHCQDevice:
    """Registry factory: the real driver through libc, or the mock when NV_MOCK=1 (never as a fallback)."""
    index = int(name.partition(":")[2] or 0)
    if not config.NV_MOCK():
        return NVHCQDevice(name, LibcOS(), index=index)
    from rawgrad.drivers.nv.mock import AMPERE, H100, MockNV
    which = config.NV_MOCK_PROFILE()
    if which not in MOCK_PROFILES:
        raise ValueError(f"NV_MOCK_PROFILE={which!r}; expected one of {', '.join(MOCK_PROFILES)}")
    mock = MockNV(H100 if which == "h100" else AMPERE, execute_kernels=True)
    try:
        # one GPU per mock: every NV:<i> is card 0 of its own mock driver
        return NVHCQDevice(name, mock, owned_mock=mock, timeout_s=NV_CHANNEL_TIMEOUT_S * MOCK_TIMEOUT_SCALE)
    except BaseException:
        mock.shutdown()
        raise
