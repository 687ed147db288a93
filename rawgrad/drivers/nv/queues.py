"""The NV HCQ queues: `NVComputeQueue` (compute channel) and `NVCopyQueue` (copy channel) over a shared
`_NVQueue`, and the words they encode.

A queue is one block of 32-bit pushbuffer words: host semaphore acquires/releases (NV-FACTS 4.6), WFI +
MEMBAR, copy-engine transfers, and kernel launches as QMDs (qmd.py). The QMDs and their constant banks live
*in the queue's own block*, in a data region after the commands: the GP entry covers only the commands, so
the front end never parses the data, and the compute engine reads each QMD and bank from memory. Every
address into the data is ``DATA_BASE + offset`` (a patch point resolved at submit: the ring slot, or the
bound block), so a captured graph is relocatable like on the CPU, and patching a launch's grid, arguments or
release payload is a word rewrite like any other. Consecutive launches are chained through DEPENDENT_QMD0 and
a signal right after a launch is folded into the QMD's release slot (NV-FACTS 5.2); a launch after other
commands waits for idle first, so kernels in one queue never overlap.

The device the queues run on is `hcq.NVHCQDevice` (named here for types only: hcq.py imports this module).
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from rawgrad.compiler.ir import UOp, Variable
from rawgrad.drivers.nv import pushbuf as pbuf
from rawgrad.drivers.nv.cubin import ProgramInfo, program_info
from rawgrad.drivers.nv.device import GPU_VA_LIMIT, NVDevice
from rawgrad.drivers.nv.gpfifo import Channel
from rawgrad.drivers.nv.memory import NVBuffer, round_up
from rawgrad.drivers.nv.program import SM_REGISTERS, max_threads_for_registers
from rawgrad.drivers.nv.qmd import QMD, sym_bits
from rawgrad.hcq.device import HCQDevice
from rawgrad.hcq.memory import ffi
from rawgrad.hcq.program import Program
from rawgrad.hcq.queue import HWQueue, PatchPoint, Value
from rawgrad.hcq.signal import Signal

if TYPE_CHECKING:
    from rawgrad.drivers.nv.hcq import NVHCQDevice

__all__ = ["DATA_BASE", "NVComputeQueue", "NVCopyQueue"]

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
        self._fold_variable(DATA_BASE, buf.va + DWORD * self._data_at)  # a bound block never moves
        self._gp_entry = pbuf.GPEntry(buf.va, self._fetch_dwords).encode()  # the whole replay, one entry

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



def _free_block(dev_ref: weakref.ref[NVHCQDevice], buf: NVBuffer, ch: Channel, retire: list[int]) -> None:
    dev = dev_ref()
    if dev is not None:  # freed once the channel has retired the block's last run
        dev.defer_free(buf, lambda: ch.retired() >= retire[0])


class NVComputeQueue(_NVQueue):
    """HCQ commands for the compute channel (kernels, host semaphores, barriers)."""

    LAYOUT_VARIABLES = (DATA_BASE,)

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


def _as_nv(device: Any) -> NVHCQDevice:
    # An NVHCQDevice (hcq.py, which imports this module, so the class is not named at run time): an HCQ
    # device driving an NVDevice, the channels a queue submits to.
    if not (isinstance(device, HCQDevice) and isinstance(getattr(device, "nv", None), NVDevice)):
        raise TypeError(f"an NV queue cannot run on {device!r}")
    return cast("NVHCQDevice", device)
