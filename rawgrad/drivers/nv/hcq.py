"""The NVIDIA GPU as an HCQ device: queues, signals, allocator and programs over the bring-up in device.py.

`NVHCQDevice` owns an `NVDevice` (RM/UVM objects, the compute and copy GPFIFO channels) and speaks the HCQ
vocabulary on top of it:

- signals are 16-byte slots (u64 value, u64 timestamp) in GPU-mapped host pages (NV-FACTS 8);
- `NVComputeQueue` encodes a pushbuffer for the compute channel: host semaphore acquire/release
  (NV-FACTS 4.6), WFI + MEMBAR, and kernel launches as QMDs (qmd.py). The QMDs and their constant banks
  live *in the queue's own block*, in a data region after the commands: the GP entry covers only the
  commands, so the front end never parses the data, and the compute engine reads each QMD and bank from
  memory. A queue is therefore one position-independent block of 32-bit words: every address into its data
  is ``DATA_BASE + offset`` (a patch point resolved at submit: the ring slot, or the bound block), a
  captured graph is relocatable like on the CPU, and patching a launch's grid, arguments or release payload
  is a word rewrite like any other;
- consecutive launches are chained through DEPENDENT_QMD0 and a signal right after a launch is folded
  into the QMD's release slot (NV-FACTS 5.2); a launch after other commands waits for idle first, so
  kernels in one queue never overlap;
- `NVCopyQueue` drives the copy engine; the allocator's host<->device copies go through a pinned host
  staging buffer with it, on the device timeline.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rawgrad import config
from rawgrad.compiler.ir import Ops, UOp, Variable
from rawgrad.compiler.renderer import renderer_for
from rawgrad.compiler.target import LaunchSpec, nv_target
from rawgrad.drivers.nv import pushbuf as pbuf
from rawgrad.drivers.nv.cubin import NVCompiler, ProgramInfo, program_info, relocate
from rawgrad.drivers.nv.device import GPU_VA_LIMIT, NVDevice
from rawgrad.drivers.nv.gpfifo import Channel, NVChannelError
from rawgrad.drivers.nv.memory import NVBuffer, round_up
from rawgrad.drivers.nv.qmd import QMD, qmd_for_class, sym_bits
from rawgrad.drivers.osapi import LibcOS, OSInterface
from rawgrad.hcq.allocator import Allocator, HCQBuffer
from rawgrad.hcq.device import HCQDevice
from rawgrad.hcq.errors import DeviceFault, DeviceTimeout
from rawgrad.hcq.memory import ffi
from rawgrad.hcq.program import KernelLaunch, Program
from rawgrad.hcq.queue import HWQueue, PatchPoint, Value, sym_eval
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, Signal

__all__ = ["DATA_BASE", "NVAllocator", "NVComputeQueue", "NVCopyQueue", "NVHCQDevice", "NVProgram",
           "open_device"]

# Where a queue's data region (QMDs, constant banks) is when the queue runs (in the pushbuffer ring slot, or
# in the bound block, after the commands): every address a queue holds into itself is an expression of
# this, resolved at submit.
DATA_BASE = Variable("nv.data_base", 0, GPU_VA_LIMIT - 1)
# A queue's commands end with a release of its channel's retirement counter (so a run is one GP entry and
# the ring knows when its space is free); the value is this variable, resolved at submit to the channel's
# next retirement value.
RETIRE_VALUE = Variable("nv.retire_value", 0, 2**63 - 1)
# Queues and their data regions start 256-byte aligned so QMDs can be (SEND_PCAS_A and
# DEPENDENT_QMD*_POINTER take VA >> 8).
QUEUE_ALIGN = 256
QMD_ALIGN_DWORDS = QUEUE_ALIGN // 4
DWORD = 4
DWORD_MASK = 0xFFFFFFFF

# SEND_SIGNALING_PCAS2_B action (NV-FACTS 5.2): PREFETCH_SCHEDULE, tinygrad's; NVK uses 3, libcuda 0xA.
PCAS_ACTION_PREFETCH_SCHEDULE = 9

# Constant bank 0 prefix (NV-FACTS 7.4): block dims at 0x00, grid dims at 0x0C, the shared and local
# window bases at 0x18 / 0x20, the initial stack pointer at 0x28 (0xFFFDC0 = 16 MiB - 0x240), dynamic
# shared memory bytes at 0x2C; 0x118 (sm_8x) and 0x208 (sm_90) must stay 0 (plain-VA global accesses).
CBANK_BLOCK_DIM = 0x00
CBANK_GRID_DIM = 0x0C
CBANK_SHARED_WINDOW = 0x18
CBANK_LOCAL_WINDOW = 0x20
CBANK_STACK_POINTER = 0x28
CBANK_DYNAMIC_SHARED = 0x2C
INITIAL_STACK_POINTER = 0xFFFDC0
CBANK_ALIGN = 64  # V04 binds bank VA >> 6; V03 is happy with it too

# Launch limits (NV-FACTS 5.6): threads per block, block and grid extents per dimension, and what a kernel's
# registers allow: 65536 registers per SM, allocated per warp in units of 256, warps in groups of 4.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
SM_REGISTERS = 65536
REGISTER_ALLOC_UNIT = 256
WARP_ALLOC_GRANULE = 4
WARP_THREADS = 32

# Shader local memory (NV-FACTS 5.6): per-thread bytes with no stack, and the SLM buffer rounding.
SLM_PER_THREAD = 0x240
SLM_WARP_THREADS = 32
SLM_THREAD_ROUND = 0x200
SLM_TPC_ROUND = 0x8000
SLM_TOTAL_ROUND = 0x20000
SLM_MAX_SM_COUNT = 0xFF

# Host<->device copies go through this much pinned host memory at a time.
STAGING_BYTES = 2 << 20
# An image is loaded with one spare page after it: instruction prefetch may run past the end (NV-FACTS 7.2).
IMAGE_GUARD_BYTES = 0x1000
PAGE = 0x1000
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

# Same-device copies on the compute channel (which has no copy-engine object): a kernel where thread i
# moves bytes [16 i, 16 i + 16), as one 16-byte load/store when dst, src and the size are 16-byte aligned,
# else byte by byte. Ranges must not overlap (graph copies are between distinct live buffers). It indexes
# by x only: its launches are 1-D, in blocks of COPY_BLOCK_THREADS (its .maxntid and launch contract).
COPY_KERNEL = "rawgrad_copy"
COPY_BYTES_PER_THREAD = 16
COPY_BLOCK_THREADS = 128
COPY_KERNEL_PTX = """.version 7.8
.target {arch}
.address_size 64
.visible .entry rawgrad_copy(.param .u64 dst, .param .u64 src, .param .u64 nbytes)
.maxntid {block}, 1, 1
{{
  .reg .pred %p<3>;
  .reg .b32 %r<7>;
  .reg .b64 %rd<10>;
  ld.param.u64 %rd0, [dst];
  ld.param.u64 %rd1, [src];
  ld.param.u64 %rd2, [nbytes];
  cvta.to.global.u64 %rd0, %rd0;
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r0, %ctaid.x;
  mov.u32 %r1, %ntid.x;
  mov.u32 %r2, %tid.x;
  mul.wide.u32 %rd3, %r0, %r1;
  cvt.u64.u32 %rd4, %r2;
  add.u64 %rd3, %rd3, %rd4;
  shl.b64 %rd5, %rd3, 4;
  setp.ge.u64 %p0, %rd5, %rd2;
  @%p0 bra DONE;
  or.b64 %rd6, %rd0, %rd1;
  or.b64 %rd6, %rd6, %rd2;
  and.b64 %rd6, %rd6, 15;
  setp.ne.u64 %p1, %rd6, 0;
  @%p1 bra BYTES;
  add.u64 %rd7, %rd1, %rd5;
  add.u64 %rd8, %rd0, %rd5;
  ld.global.v4.u32 {{%r3, %r4, %r5, %r6}}, [%rd7];
  st.global.v4.u32 [%rd8], {{%r3, %r4, %r5, %r6}};
  bra DONE;
BYTES:
  add.u64 %rd9, %rd5, 16;
  min.u64 %rd9, %rd9, %rd2;
LOOP:
  add.u64 %rd7, %rd1, %rd5;
  add.u64 %rd8, %rd0, %rd5;
  ld.global.u8 %r3, [%rd7];
  st.global.u8 [%rd8], %r3;
  add.u64 %rd5, %rd5, 1;
  setp.lt.u64 %p2, %rd5, %rd9;
  @%p2 bra LOOP;
DONE:
  ret;
}}
"""


def _lo32(v: Value) -> Value:
    return v & DWORD_MASK if isinstance(v, int) else v  # a patch point keeps the low 32 bits itself


def _hi32(v: Value) -> Value:
    return sym_bits(v, 32, 32)


class _NVQueue(HWQueue):
    """What both NV queues share: 32-bit pushbuffer words, host semaphores, bind and submit."""

    WORD_BITS = 32

    def __init__(self, device: NVHCQDevice) -> None:
        super().__init__()
        self.device = device
        self._block: NVBuffer | None = None  # the bound copy of the words
        self._bound_channel: Channel | None = None  # the channel the bound block runs on
        self._start = 0  # ring offset reserved by the current unbound submit
        self._retire: list[int] = [0]  # the channel retirement value of the last submit (shared w/ finalizer)
        # QMDs and constant banks, appended after the commands when the queue is sealed (words or symbolic)
        self._data: list[Value] = []
        self._sealed_for: NVHCQDevice | None = None  # the device whose channel the retirement release names
        self._fetch_dwords = 0  # once sealed: the commands, i.e. what the GP entry makes the front end fetch
        self._data_at = 0  # once sealed: the word index where the data region starts

    def _channel(self, dev: NVHCQDevice) -> Channel:
        raise NotImplementedError

    # -- encoding helpers --------------------------------------------------------------------------------
    def _method(self, subch: int, method: int, *data: Value) -> int:
        """An incrementing method with `data` (ints or symbolic 32-bit words); returns the header index."""
        at = self._emit(pbuf.MethodHeader(pbuf.SecOp.INC_METHOD, subch, method, len(data)).encode())
        if data:
            self._emit(*data)
        return at

    def _host_sem(self, address: Value, payload: Value, execute: pbuf.SemExecute) -> None:
        host = self.device.nv.host
        if isinstance(address, int):
            host.sem_addr_hi.put(address >> 32, "SEM_ADDR_HI")
        self._method(pbuf.SUBCH_HOST, pbuf.NVC56F_SEM_ADDR_LO, _lo32(address), _hi32(address), _lo32(payload),
                     _hi32(payload), execute.encode())

    def _acquire(self, signal: Signal, value: Value) -> None:
        # 64-bit wrap-around >= (tinygrad's 0x01000003 form), no TSG switch: both channels share one TSG
        self._host_sem(signal.address, value, pbuf.SemExecute(pbuf.SemOp.ACQ_CIRC_GEQ, payload_64bit=True))

    def _release(self, address: Value, value: Value, *, timestamp: bool) -> None:
        ex = pbuf.SemExecute(pbuf.SemOp.RELEASE, payload_64bit=True, release_wfi=True,
                             release_timestamp=timestamp)
        self._host_sem(address, value, ex)

    def _timestamp_release(self, signal: Signal) -> None:
        # The GPU writes a 16-byte record: payload at +0, PTIMER ns at +8. The value word is set to 0, so a
        # timestamp must not go to a signal whose value matters (the timeline).
        if signal is self.device.timeline_signal:
            raise ValueError(f"{self.name}: a timestamp on NV rewrites the signal's value word; use a "
                             f"separate signal, not the {self.device.name} timeline")
        self._release(signal.address, 0, timestamp=True)

    def _end_open_work(self) -> None:
        """Close whatever a following command could still fold into (the compute queue's QMD chain)."""

    def _barrier_words(self) -> None:
        self._emit(*pbuf.memory_barrier(pbuf.PushBuffer()).words)

    def _add_data(self, words: list[Value], align_dwords: int = 1) -> int:
        """Append words to the data region (at an `align_dwords`-aligned offset); returns their offset."""
        if self._frozen is not None:
            self._refuse_commands()
        at = round_up(len(self._data), align_dwords)
        self._data.extend([0] * (at - len(self._data)))
        self._data.extend(words)
        return at

    def layout(self) -> tuple[np.ndarray, list[PatchPoint], int]:
        """An open queue's commands, then its data region right after them (as a template stores it)."""
        if self._sealed_for is not None:
            raise RuntimeError(f"{self.name} was laid out for running already; its layout is not a template")
        words = self._words + [w & DWORD_MASK if isinstance(w, int) else 0 for w in self._data]
        patches = self.patch_points + [PatchPoint(len(self._words) + i, w) for i, w in enumerate(self._data)
                                       if not isinstance(w, int)]
        return np.array(words, dtype=np.uint64), patches, len(self._data)

    def _load_layout(self, words: Sequence[int], patches: Sequence[PatchPoint], data_words: int) -> None:
        split = len(words) - data_words
        self._emit(*words[:split])
        data: list[Value] = [int(w) for w in words[split:]]
        for p in patches:
            if p.index < split:
                self._add_patch(p)
            elif p.shift or data[p.index - split]:  # data words are whole 32-bit values, never split
                raise ValueError(f"{self.name}: data word {p.index - split} is not one whole patch point")
            else:
                data[p.index - split] = p.expr
        self._add_data(data)

    # -- bind / submit -----------------------------------------------------------------------------------
    def _seal(self, dev: NVHCQDevice) -> None:
        """Lay the queue out for running, once: the commands end with the channel's retirement release
        (so a run is one GP entry and retires itself), then the data region follows at a 256-byte
        aligned offset, outside what the GP entry fetches. No commands can be added afterwards."""
        if self._sealed_for is not None:
            if self._sealed_for is not dev:
                raise ValueError(f"{self.name} was laid out for {self._sealed_for.name}, not {dev.name}; "
                                 f"build a new queue for that device")
            return
        self._end_open_work()
        self._release(self._channel(dev).retire_addr, RETIRE_VALUE, timestamp=False)
        self._fetch_dwords = len(self._words)
        if self._data:
            self._emit(*([0] * ((-self._fetch_dwords) % QMD_ALIGN_DWORDS)))
        self._data_at = len(self._words)
        self._emit(*self._data)
        self._sealed_for = dev
        self._frozen = "was laid out for running (its data region follows its commands)"

    def _bind(self, device: Any) -> None:
        dev = _as_nv(device)
        self._seal(dev)  # the block retires itself: a replay is one GP entry + doorbell, nothing after it
        words = self.words().astype(np.uint32)
        with dev.submit_lock:  # the driver's memory bookkeeping is not thread-safe: one caller at a time
            buf = dev.nv.alloc_vram(max(words.nbytes, DWORD))  # CPU-mapped; page aligned: QMDs stay aligned
        ffi.memmove(ffi.cast("void *", buf.va), words.tobytes(), words.nbytes)
        self._bound_words = ffi.cast("uint32_t *", buf.va)  # a typed pointer: the fastest per-word writes
        self._block, self._bound_channel = buf, self._channel(dev)
        weakref.finalize(self, _free_block, weakref.ref(dev), buf, self._bound_channel, self._retire)
        self._fold_data_base(buf.va + DWORD * self._data_at)
        self._gp_entry = pbuf.GPEntry(buf.va, self._fetch_dwords).encode()  # the whole replay, one entry

    def _fold_data_base(self, data_base: int) -> None:
        """A bound block never moves: resolve every DATA_BASE patch point (QMD, bank and chain addresses,
        three per launch) now, so a replay evaluates only the patch points that really change (timeline
        values, inputs) instead of work proportional to the number of launches."""
        const = UOp.const(DATA_BASE.dt, data_base)
        patches: list[PatchPoint] = []
        last: list[int | None] = []
        for p, prev in zip(self._patches, self._last, strict=True):
            variables = p.expr.variables()
            if DATA_BASE not in variables:
                patches.append(p)
                last.append(prev)
            elif variables == [DATA_BASE]:
                self._set_word(p.index, (sym_eval(p.expr, {DATA_BASE: data_base}) >> p.shift) & DWORD_MASK)
            else:
                patches.append(PatchPoint(p.index, p.expr.substitute({DATA_BASE: const}), p.shift))
                last.append(None)
        self._replace_patches(patches, last)

    def _before_patch(self, device: Any) -> None:
        ch = self._bound_channel
        if ch is not None:  # the block is rewritten in place: its previous run must have retired
            ch.wait_retired(self._retire[0], queue=f"{self.name} (its previous run)")

    def busy(self, device: HCQDevice) -> bool:
        ch = self._bound_channel
        return ch is not None and ch._retired[0] < self._retire[0]

    def submit(self, device: HCQDevice, var_vals: Mapping[UOp, int] | None = None) -> HWQueue:
        """Resolve patch points (this queue's own data address and retirement value included) and submit
        to the channel."""
        if self._block is not None:
            if device is not self.bound_device:
                return super().submit(device, var_vals)  # raises: bound to another device
            return self._replay(device, var_vals)  # type: ignore[arg-type]  # bound: an NVHCQDevice
        dev = _as_nv(device)
        with dev.submit_lock:  # an unbound queue: copied into the pushbuffer ring
            dev.check_fault()
            dev.reap()
            self._seal(dev)
            ch = self._channel(dev)
            self._start = ch.reserve(DWORD * len(self._words), QUEUE_ALIGN, self.name)
            vals = dict(var_vals) if var_vals else {}
            vals[DATA_BASE] = ch.pb_addr + self._start + DWORD * self._data_at
            vals[RETIRE_VALUE] = ch.retire_value + 1
            return super().submit(device, vals)

    def _replay(self, dev: NVHCQDevice, var_vals: Mapping[UOp, int] | None) -> HWQueue:
        """A bound queue's submit, kept short because it is TinyJit's replay: the generated patch writer
        rewrites the words that changed in the block, then one GP entry + doorbell."""
        ch = self._bound_channel
        assert ch is not None
        with dev.submit_lock:
            # Only this channel's notifier is read here (a fault elsewhere surfaces in any wait, whose poll
            # checks every channel); the full check then raises with the driver's report.
            status = ch._notifier_status
            if dev.closed or (status is not None and status[0]):
                dev.check_fault()
            if dev._deferred:
                dev.reap()
            value = ch.retire_value + 1
            vals: dict[UOp, int] = {RETIRE_VALUE: value}
            if var_vals:
                vals.update(var_vals)
            if ch._retired[0] < self._retire[0]:  # the block is rewritten in place: its last run must be done
                self._before_patch(dev)
            self._write_changed_words(vals)
            self._retire[0] = ch.submit_bound(self._gp_entry, value)
        return self

    def _submit(self, device: Any) -> None:
        # (a bound queue never gets here: _replay submits it)
        ch = self._channel(_as_nv(device))
        self._retire[0] = ch.commit(self._start, self.words().astype(np.uint32).tobytes(), self._fetch_dwords)


# The copy kernel's byte count, in its launch contract (its global size is an expression of it).
COPY_NBYTES = Variable("nv.copy_nbytes", 0, GPU_VA_LIMIT - 1)


def copy_threads(nbytes: Value) -> Value:
    """Threads of a copy-kernel launch: one per 16 bytes."""
    return (nbytes + (COPY_BYTES_PER_THREAD - 1)) // COPY_BYTES_PER_THREAD


def _free_block(dev_ref: weakref.ref[NVHCQDevice], buf: NVBuffer, ch: Channel, retire: list[int]) -> None:
    dev = dev_ref()
    if dev is not None:  # freed once the channel has retired the block's last run
        dev.defer_free(buf, lambda: ch.retired() >= retire[0])


class NVComputeQueue(_NVQueue):
    """HCQ commands for the compute channel (kernels, host semaphores, barriers)."""

    def __init__(self, device: NVHCQDevice) -> None:
        super().__init__(device)
        self._tail: tuple[QMD, int] | None = None  # open chain: the last QMD and its offset in the data
        self._wfi_pending = False  # a launch ran since the last wait-for-idle

    def _channel(self, dev: NVHCQDevice) -> Channel:
        return dev.nv.compute

    def _break_chain(self) -> None:
        self._tail = None

    def _end_open_work(self) -> None:
        self._break_chain()
        self._wfi_pending = False  # the retirement release that follows waits for idle

    def _wait(self, signal: Signal, value: Value) -> None:
        self._break_chain()
        self._acquire(signal, value)

    def _signal(self, signal: Signal, value: Value) -> None:
        if self._tail is not None:
            qmd, at = self._tail
            if qmd.release(signal.address, value):  # released by the compute engine when the kernel is done
                self._rewrite(qmd, at)
                return
        self._break_chain()
        self._release(signal.address, value, timestamp=False)
        self._wfi_pending = False

    def _timestamp(self, signal: Signal) -> None:
        self._break_chain()
        self._timestamp_release(signal)
        self._wfi_pending = False

    def _memory_barrier(self) -> None:
        self._break_chain()
        self._barrier_words()
        self._wfi_pending = False

    def _copy(self, dst: Value, src: Value, nbytes: Value) -> None:
        # The compute channel has no copy-engine object: a copy kernel (non-overlapping ranges). Bulk and
        # host copies use the copy queue (`copy_queue()`), which runs the copy engine.
        k = self.device.copy_kernel(dst, src, nbytes)
        self._exec(k.program, list(k.args), k.global_size, k.local_size)

    def _exec(self, program: Program, args: list[Value], global_size: tuple[Value, ...],
              local_size: tuple[int, ...]) -> None:
        dev = self.device
        info = program_info(bytes(program.lib), program.name, dev.arch)
        entry = getattr(program, "fn_addr", None)
        if entry is None:
            raise TypeError(f"{program!r} is not an NV program")
        grid, block = dev.launch_dims(global_size, local_size)
        if info.registers and math.prod(block) > max_threads_for_registers(info.registers):
            raise ValueError(f"{program.name}: a block of {block} threads needs more than the "
                             f"{SM_REGISTERS} registers of an SM at {info.registers} registers per thread")
        bank = self._bank(info, args, grid, block)
        qmd = dev.qmd_class()
        qmd.launch(shared_bytes=info.shared_bytes, registers=info.registers, sass_version=dev.sass_version,
                   local_bytes_per_thread=info.local_bytes)
        qmd.grid(*grid).block(*block).program(entry, max(info.text_bytes, 1))
        # In the data region: the QMD (256-byte aligned), then bank 0 right after it.
        qmd_at = round_up(len(self._data), QMD_ALIGN_DWORDS)
        bank_at = qmd_at + qmd.dwords
        qmd.constant_buffer(0, DATA_BASE + DWORD * bank_at, len(bank) * DWORD)
        # Other constant banks (ptxas's bank 2 constants, bank 4 global addresses) sit at fixed offsets in
        # the loaded image, so they are placed from the entry point: that also holds for a graph template's
        # stand-in program, whose entry is a relocation and which has no `constant_banks` of its own.
        for index, offset, size in info.constant_banks:
            qmd.constant_buffer(index, entry + (offset - info.text_offset), size)
        qmd_va = DATA_BASE + DWORD * qmd_at
        if self._add_data(qmd.words() + bank, QMD_ALIGN_DWORDS) != qmd_at:
            raise AssertionError(f"{self.name}: QMD placed away from its computed offset")
        if self._tail is not None:  # the previous launch schedules this one when it completes
            prev, at = self._tail
            prev.chain(qmd_va)
            self._rewrite(prev, at)
        else:
            if self._wfi_pending:  # a launch earlier in this queue must finish before this one starts
                self._method(pbuf.SUBCH_HOST, pbuf.NVC56F_WFI, pbuf.WFI_SCOPE_ALL)
            self._emit(*pbuf.invalidate_shader_caches(pbuf.PushBuffer()).words)
            self._method(pbuf.SUBCH_COMPUTE, pbuf.NVC7C0_SEND_PCAS_A, sym_bits(qmd_va, 8, 32))
            self._method(pbuf.SUBCH_COMPUTE, pbuf.NVC7C0_SEND_SIGNALING_PCAS2_B, dev.pcas_action)
        self._tail = (qmd, qmd_at)
        self._wfi_pending = True

    def _bank(self, info: ProgramInfo, args: list[Value], grid: tuple[Value, ...],
              block: tuple[int, ...]) -> list[Value]:
        """Constant bank 0 as 32-bit words: the driver prefix, then the kernel parameters."""
        if len(args) != len(info.params):
            raise ValueError(f"{info.name} takes {len(info.params)} arguments "
                             f"({', '.join(p.name for p in info.params)}), got {len(args)}")
        size = round_up(info.param_offset + info.param_bytes, CBANK_ALIGN)
        words: list[Value] = [0] * (size // DWORD)
        for i, v in enumerate(block):
            words[CBANK_BLOCK_DIM // DWORD + i] = v
        for i, g in enumerate(grid):
            words[CBANK_GRID_DIM // DWORD + i] = g
        for off, value in ((CBANK_SHARED_WINDOW, pbuf.SHARED_MEMORY_WINDOW),
                           (CBANK_LOCAL_WINDOW, pbuf.LOCAL_MEMORY_WINDOW)):
            words[off // DWORD], words[off // DWORD + 1] = value & DWORD_MASK, value >> 32
        words[CBANK_STACK_POINTER // DWORD] = INITIAL_STACK_POINTER
        words[CBANK_DYNAMIC_SHARED // DWORD] = 0
        for p, arg in zip(info.params, args):
            at = info.param_offset + p.offset
            if p.size == 8 and at % 8 == 0:
                words[at // DWORD], words[at // DWORD + 1] = _lo32(arg), _hi32(arg)
            elif p.size == 4 and at % 4 == 0:
                words[at // DWORD] = _lo32(arg)
            elif isinstance(arg, int) and p.size < 4:  # sub-word scalars share a word with their neighbours
                w = words[at // DWORD]
                if not isinstance(w, int):
                    raise ValueError(f"{info.name}: parameter {p.name} shares a word with a symbolic value")
                shift = 8 * (at % 4)
                words[at // DWORD] = (w & ~(((1 << (8 * p.size)) - 1) << shift)) | \
                    ((arg & ((1 << (8 * p.size)) - 1)) << shift)
            else:
                raise ValueError(f"{info.name}: cannot place parameter {p.name} ({p.type}, {p.size} bytes at "
                                 f"{p.offset}) from {arg!r}")
        return words

    def _rewrite(self, qmd: QMD, at: int) -> None:
        """Update a QMD already in the data region (chaining, a folded release)."""
        if self._frozen is not None:
            self._refuse_commands()
        self._data[at:at + qmd.dwords] = qmd.words()


class NVCopyQueue(_NVQueue):
    """HCQ commands for the copy channel: copy-engine transfers and semaphores, host acquires."""

    def _channel(self, dev: NVHCQDevice) -> Channel:
        return dev.nv.copy

    def _wait(self, signal: Signal, value: Value) -> None:
        self._acquire(signal, value)

    def _signal(self, signal: Signal, value: Value) -> None:
        info = self.device.nv.copy_info
        if not info.has_payload_upper:  # AMPERE_DMA_COPY_A: no 64-bit CE payload, use the host release
            self._release(signal.address, value, timestamp=False)
            return
        # CE four-word release after a flush: payload + timestamp (NV-FACTS 6.2)
        addr = signal.address
        if isinstance(addr, int) and addr % 16:
            raise ValueError(f"copy-engine semaphore VA {addr:#x} must be 16-byte aligned")
        self._method(pbuf.SUBCH_COPY, pbuf.NVC7B5_SET_SEMAPHORE_A, sym_bits(addr, 32, info.upper.width),
                     _lo32(addr), _lo32(value), _hi32(value))
        launch = pbuf.LaunchDma(pbuf.DataTransfer.NONE, pbuf.CopySemaphore.RELEASE_FOUR_WORD, flush=True,
                                payload_64bit=True)
        self._method(pbuf.SUBCH_COPY, pbuf.NVC7B5_LAUNCH_DMA, launch.encode())

    def _timestamp(self, signal: Signal) -> None:
        self._timestamp_release(signal)

    def _memory_barrier(self) -> None:
        self._barrier_words()

    def _exec(self, program: Program, args: list[Value], global_size: tuple[Value, ...],
              local_size: tuple[Value, ...]) -> None:
        raise TypeError(f"{self.name}: the copy engine cannot launch kernels; use the compute queue")

    def _copy(self, dst: Value, src: Value, nbytes: Value) -> None:
        info = self.device.nv.copy_info
        if isinstance(nbytes, int):
            chunks: list[tuple[Value, Value]] = [(off, min(nbytes - off, pbuf.COPY_MAX_CHUNK))
                                                 for off in range(0, nbytes, pbuf.COPY_MAX_CHUNK)]
        else:
            if nbytes.vmax > pbuf.COPY_MAX_CHUNK:
                raise ValueError(f"symbolic copy size {nbytes.render()} may exceed one copy-engine launch")
            chunks = [(0, nbytes)]
        launch = pbuf.LaunchDma(pbuf.DataTransfer.NON_PIPELINED).encode()
        for off, n in chunks:
            s = src + off if off else src
            d = dst + off if off else dst
            upper = info.upper.width
            self._method(pbuf.SUBCH_COPY, pbuf.NVC7B5_OFFSET_IN_UPPER, sym_bits(s, 32, upper), _lo32(s),
                         sym_bits(d, 32, upper), _lo32(d))
            self._method(pbuf.SUBCH_COPY, pbuf.NVC7B5_LINE_LENGTH_IN, _lo32(n))
            self._method(pbuf.SUBCH_COPY, pbuf.NVC7B5_LAUNCH_DMA, launch)


class NVProgram(Program):
    """A kernel image uploaded to VRAM by the copy engine; `fn_addr` is the entry point's GPU VA. Its launch
    contract, when given, is completed with the registers and shared memory the image declares."""

    def __init__(self, device: NVHCQDevice, name: str, lib: bytes, launch: LaunchSpec | None = None) -> None:
        self.info = program_info(bytes(lib), name, device.arch)
        if launch is not None:
            if len(self.info.params) != launch.args:
                raise ValueError(f"{name}: the image takes {len(self.info.params)} parameters, its launch "
                                 f"contract {launch.args}")
            launch = launch.with_resources(shared_bytes=max(launch.shared_bytes, self.info.shared_bytes),
                                           registers=self.info.registers or None)
        super().__init__(device, name, lib, launch)
        if not self.info.has_sass and not device.is_mock:
            raise RuntimeError(f"{name}: the image has no SASS (built without ptxas or nvJitLink, e.g. on "
                               f"the mock); only the mock GPU runs PTX-only images")
        # The file goes to VRAM verbatim (its .text is 128-byte aligned in the file), followed by module
        # data and bank copies, relocated for the address it lands at (cubin.image_layout).
        layout = self.info.layout
        with device.submit_lock:  # the driver's memory bookkeeping is not thread-safe: one caller at a time
            self.image = device.nv.alloc_vram(round_up(layout.size, PAGE) + IMAGE_GUARD_BYTES, cpu_map=False)
            try:
                device.copy_in(self.image.va, memoryview(relocate(bytes(lib), layout, self.image.va)))
            except BaseException:
                device.nv.free(self.image)
                raise
        self.fn_addr: int = self.image.va + self.info.text_offset
        if self.info.local_bytes > device.slm_per_thread:  # this kernel spills or keeps a stack
            device.grow_local_memory(self.info.local_bytes)
        self.constant_banks = tuple((index, self.image.va + off, size)
                                    for index, off, size in self.info.constant_banks)
        weakref.finalize(self, _free_image, weakref.ref(device), self.image)


def _free_image(dev_ref: weakref.ref[NVHCQDevice], buf: NVBuffer) -> None:
    dev = dev_ref()
    if dev is not None:  # freed once the launches queued so far (which may fetch this code) are done
        dev.defer_free_after_timeline(buf)


class NVAllocator(Allocator):
    """VRAM buffers (not CPU-mapped; the copy engine moves data through a pinned host staging buffer)."""

    def __init__(self, device: NVHCQDevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, nbytes: int) -> HCQBuffer:
        dev = self.device
        dev.reap()
        try:
            with dev.submit_lock:  # the driver's memory bookkeeping is not thread-safe: one caller at a time
                buf = dev.nv.alloc_vram(nbytes, cpu_map=False)
        except Exception as e:
            if "NO_MEMORY" not in str(e) and not isinstance(e, MemoryError):
                raise
            dev.synchronize()  # memory waiting for the GPU to finish with it may be enough
            if not dev.reap():
                raise MemoryError(str(e)) from e
            with dev.submit_lock:
                buf = dev.nv.alloc_vram(nbytes, cpu_map=False)
        return HCQBuffer(buf.va, nbytes, buf)

    def _free(self, buf: HCQBuffer) -> None:
        # Queued kernels may still use the memory: release it once the timeline has passed them.
        self.device.defer_free_after_timeline(buf.meta)

    def _copyin(self, buf: HCQBuffer, src: memoryview) -> None:
        self.device.copy_in(buf.va_addr, src)

    def _copyout(self, dst: memoryview, buf: HCQBuffer) -> None:
        self.device.copy_out(dst, buf.va_addr)


def _as_nv(device: Any) -> NVHCQDevice:
    if not isinstance(device, NVHCQDevice):
        raise TypeError(f"an NV queue cannot run on {device!r}")
    return device


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


def max_threads_for_registers(registers: int) -> int:
    """The most threads one block may have when each uses `registers` registers (NV-FACTS 5.6)."""
    per_warp = round_up(registers * WARP_THREADS, REGISTER_ALLOC_UNIT)
    warps = SM_REGISTERS // per_warp // WARP_ALLOC_GRANULE * WARP_ALLOC_GRANULE
    return warps * WARP_THREADS


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

