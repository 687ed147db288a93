"""The AMD HCQ queues: `AMDComputeQueue` (PM4 on the compute queue) and `AMDCopyQueue` (SDMA).

A compute queue is one block of PM4 dwords: WAIT_REG_MEM for waits (the CP compares 32 bits, so signal
values stay below 2**32), RELEASE_MEM for signals and timestamps, ACQUIRE_MEM for barriers and
`pm4.encode_dispatch` for launches. Kernarg segments live *in the queue's own block*, in a data region after
the commands behind one NOP packet that makes the CP skip it (AMD-METAL-FACTS 1.4; the AMD twin of NV's
QMD region): every kernarg pointer is ``DATA_BASE + offset``, a patch point resolved at submit (the ring slot
of an unbound submit, or the bound block), so a captured graph is relocatable and patching a launch's
arguments is a word rewrite like any other.

An unbound submit copies the whole block into the PM4 ring and rings the doorbell once. A bound queue sits
in GTT memory; a replay writes one INDIRECT_BUFFER packet (plus a 1-dword NOP after it, so the ring's read
pointer passes that NOP only once the IB has finished: that is how a rebind waits for the previous run).

The device is `device.AMDDevice` (named here for types only: device.py imports this module).
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rawgrad.compiler.amdgpu_code import AMDCodeObject
from rawgrad.compiler.ir import UOp, Variable
from rawgrad.drivers.amd import pm4, regs, sdma
from rawgrad.drivers.amd.regs import DataSel, IntSel
from rawgrad.hcq.device import HCQDevice
from rawgrad.hcq.memory import ffi
from rawgrad.hcq.program import Program
from rawgrad.hcq.queue import HWQueue, PatchPoint, Value
from rawgrad.hcq.signal import Signal

if TYPE_CHECKING:
    from rawgrad.drivers.amd.device import AMDDevice

__all__ = ["DATA_BASE", "EVENT_ID", "EVENT_MAILBOX", "AMDComputeQueue", "AMDCopyQueue"]

# The user GPUVM aperture ends below 2**47 on gfx9/gfx11 (kfd_flat_memory.c): every GPU VA is below it.
GPU_VA_LIMIT = 1 << 47
# Where a queue's data region (kernarg segments) is when it runs; resolved at submit.
DATA_BASE = Variable("amd.data_base", 0, GPU_VA_LIMIT - 1)
# The device's KFD SIGNAL event as a graph template names it (its mailbox address and its id, which is also
# the trigger data the mailbox gets): both belong to one process, so a template (and a saved graph) carries
# them as layout variables that bind resolves for the device it runs on.
EVENT_MAILBOX = Variable("amd.event_mailbox", 0, GPU_VA_LIMIT - 1)
EVENT_ID = Variable("amd.event_id", 0, 0xFFFFFFFF)
DWORD = 4
DWORD_MASK = 0xFFFFFFFF
# Kernarg segments start 16-byte aligned (AMDGPUUsage: the CP requires it): 4 dwords.
DATA_ALIGN_DWORDS = regs.KERNARG_SEGMENT_ALIGN // DWORD
# A replay: INDIRECT_BUFFER (4 dwords) then a 1-dword NOP the ring's read pointer passes once the IB is done.
REPLAY_DWORDS = 5
# A PM4 NOP's payload field holds at most this many dwords (PACKET3 count is 14 bits).
MAX_NOP_PAYLOAD = regs.PACKET3_MAX_PAYLOAD

# A data-region word: a plain 32-bit value, or (expression, shift) resolved at submit.
DataWord = int | tuple[UOp, int]


def _sym(v: Value, shift: int = 0) -> DataWord:
    return ((v >> shift) & DWORD_MASK) if isinstance(v, int) else (v, shift)


class _AMDQueue(HWQueue):
    """What both AMD queues share: 32-bit packet words and symbolic operands placed as patch points."""

    WORD_BITS = 32

    def __init__(self, device: AMDDevice) -> None:
        super().__init__()
        self.device = device

    def _packet(self, words: list[int], subs: Mapping[int, tuple[Value, int]] | None = None) -> int:
        """Emit a packet built with placeholder ints; `subs` puts (value, shift) at word index: ints are
        written, symbolic values become patch points."""
        start = self._emit(*words)
        for i, (v, shift) in (subs or {}).items():
            if isinstance(v, UOp):
                self._words[start + i] = 0
                self._add_patch(PatchPoint(start + i, v, shift))
            else:
                self._words[start + i] = (v >> shift) & DWORD_MASK
        self._array = None
        return start


class AMDComputeQueue(_AMDQueue):
    """HCQ commands for the PM4 compute queue (see the module docstring)."""

    LAYOUT_VARIABLES = (DATA_BASE, EVENT_MAILBOX, EVENT_ID)

    def __init__(self, device: AMDDevice) -> None:
        super().__init__(device)
        self._data: list[DataWord] = []
        self._sealed = False
        self._fetch_dwords = 0  # once sealed: the commands (what an IB makes the CP fetch)
        self._data_at = 0  # once sealed: the word index where the data region starts
        self._block: Any = None  # the bound copy's memory (an AMDBuffer)
        self._retire = [0]  # PM4 ring position after the last replay's trailing NOP (shared w/ finalizer)
        self._event_vars = False  # whether a patch point names EVENT_MAILBOX / EVENT_ID

    # -- the vocabulary -----------------------------------------------------------------------------------
    # Signal addresses may be symbolic (a graph template relocates them): packets are built at address 0
    # and the address words (low, high) become patch points like any operand.
    def _wait(self, signal: Signal, value: Value) -> None:
        addr: Value = signal.address
        self._packet(pm4.wait_reg_mem(0, 0), {2: (addr, 0), 3: (addr, 32), 4: (value, 0)})

    def _signal(self, signal: Signal, value: Value) -> None:
        addr: Value = signal.address
        words = pm4.release_mem(self.device.fam, addr=0, data_sel=DataSel.VALUE64, value=0)
        self._packet(words, {3: (addr, 0), 4: (addr, 32), 5: (value, 0), 6: (value, 32)})
        event = self.device.signal_event
        if event is None:
            return
        # wake host waits (AMD-METAL-FACTS 1.4): the event's trigger data into its mailbox, then an interrupt
        # carrying the event id once that write landed. A graph template's signal (symbolic address) names the
        # event through layout variables instead: the mailbox and the id belong to this process, and bind
        # resolves them for the device the graph runs on.
        words = pm4.release_mem(self.device.fam, addr=0, data_sel=DataSel.VALUE64, value=0,
                                int_sel=IntSel.INTERRUPT_AFTER_WRITE, writeback=False)
        if isinstance(addr, int):
            mailbox: Value = self.device.event_mailbox
            eid: Value = event.event_id
            trigger: Value = event.trigger_data
        else:
            mailbox, eid, trigger = EVENT_MAILBOX, EVENT_ID, EVENT_ID  # KFD: trigger data == event id
            self._event_vars = True
        self._packet(words, {3: (mailbox, 0), 4: (mailbox, 32), 5: (trigger, 0), 7: (eid, 0)})

    def _timestamp(self, signal: Signal) -> None:
        addr: Value = signal.timestamp_address
        words = pm4.timestamp(self.device.fam, 0)
        clock_at = len(pm4.release_mem(self.device.fam, writeback=False))  # the drain, then the clock write
        self._packet(words, {clock_at + 3: (addr, 0), clock_at + 4: (addr, 32)})

    def _memory_barrier(self) -> None:
        self._emit(*pm4.acquire_mem(self.device.fam))

    def _copy(self, dst: Value, src: Value, nbytes: Value) -> None:
        # The compute queue has no DMA engine the mock models: a copy kernel does it (like NV's compute
        # channel); the graph encodes the same launch through `AMDDevice.graph_copy`.
        k = self.device.copy_kernel(dst, src, nbytes)
        self.exec(k.program, list(k.args), k.global_size, k.local_size)

    def _exec(self, program: Program, args: list[Value], global_size: tuple[Value, ...],
              local_size: tuple[int, ...]) -> None:
        # `program` is an AMDProgram, or a graph template's stand-in whose entry (`fn_addr`: the image base)
        # is a relocation; the code object comes from its binary either way.
        co = self.device.code_object(program)
        image_va: Value = program.fn_addr  # type: ignore[attr-defined]
        if any(isinstance(g, int) and g == 0 for g in global_size):
            return  # nothing to run (a DISPATCH_DIRECT of 0 workgroups is a fault)
        contract = program.launch
        block = contract.local_size if contract is not None else tuple(int(v) for v in local_size)
        local = (int(block[0]), int(block[1]), int(block[2]))
        grid: list[Value]
        if local[1] == local[2] == 1:
            # The renderer's kernels index by workgroup.id.x * L + workitem.id.x with their block L baked into
            # the code (renderer/amdgpu.py), numbering threads x-fastest over the whole launch: any launch
            # shape runs as one dimension of its product of threads, in the kernel's own blocks.
            total: Value = global_size[0]
            for g in global_size[1:]:
                total = total * g
            grid = [(total + (local[0] - 1)) // local[0], 1, 1]
        else:
            grid = [(g + (b - 1)) // b for g, b in zip(global_size, local)]
        kernarg_off = self._kernargs(co, args)
        packets = pm4.encode_dispatch(co, 0, 0, (1, 1, 1), local, fam=self.device.fam)
        kva: Value = DATA_BASE + DWORD * kernarg_off
        code: Value = image_va + co.entry_offset
        pgm = packets.patch["pgm_lo"]
        subs: dict[int, tuple[Value, int]] = {packets.kernarg_lo: (kva, 0), packets.kernarg_lo + 1: (kva, 32),
                                              pgm: (code, regs.PGM_ADDR_SHIFT),
                                              pgm + 1: (code, 32 + regs.PGM_ADDR_SHIFT)}
        for i, g in enumerate(grid):
            if isinstance(g, int) and not 1 <= g <= DWORD_MASK:
                raise ValueError(f"{co.name}: {g} workgroups in dimension {i} (1..2**32-1)")
            subs[packets.grid[i]] = (g, 0)
        self._packet(packets.words, subs)

    def _kernargs(self, co: AMDCodeObject, args: list[Value]) -> int:
        """Lay the kernarg segment out in the data region (the metadata's explicit argument offsets);
        returns its dword offset there."""
        meta = co.metadata
        explicit = [a for a in meta.args if not a.value_kind.startswith("hidden")]
        if len(explicit) != len(args):
            raise ValueError(f"{co.name} takes {len(explicit)} arguments, got {len(args)}")
        size = max(co.descriptor.kernarg_size, meta.kernarg_segment_size, DWORD)
        words: list[DataWord] = [0] * (-(-size // DWORD))
        for a, v in zip(explicit, args):
            if a.offset % DWORD or a.size not in (4, 8):
                raise ValueError(f"{co.name}: argument {a.name} ({a.size} bytes at {a.offset}) is not a "
                                 f"whole dword or two")
            words[a.offset // DWORD] = _sym(v)
            if a.size == 8:
                words[a.offset // DWORD + 1] = _sym(v, 32)
        return self._add_data(words)

    def _add_data(self, words: list[DataWord]) -> int:
        if self._frozen is not None:
            self._refuse_commands()
        at = -(-len(self._data) // DATA_ALIGN_DWORDS) * DATA_ALIGN_DWORDS
        self._data.extend([0] * (at - len(self._data)))
        self._data.extend(words)
        return at

    # -- templates ----------------------------------------------------------------------------------------
    def layout(self) -> tuple[np.ndarray, list[PatchPoint], int]:
        if self._sealed:
            raise RuntimeError(f"{self.name} was laid out for running already; its layout is not a template")
        words = self._words + [w if isinstance(w, int) else 0 for w in self._data]
        patches = self.patch_points + [PatchPoint(len(self._words) + i, w[0], w[1])
                                       for i, w in enumerate(self._data) if not isinstance(w, int)]
        return np.array(words, dtype=np.uint64), patches, len(self._data)

    def _load_layout(self, words: Sequence[int], patches: Sequence[PatchPoint], data_words: int) -> None:
        split = len(words) - data_words
        self._emit(*words[:split])
        data: list[DataWord] = [int(w) for w in words[split:]]
        for p in patches:
            if p.index < split:
                self._add_patch(p)
                self._event_vars |= bool({EVENT_MAILBOX, EVENT_ID} & set(p.expr.variables()))
            else:
                data[p.index - split] = (p.expr, p.shift)
        self._add_data(data)

    # -- bind / submit ------------------------------------------------------------------------------------
    def _seal(self) -> None:
        """Lay the queue out for running, once: the commands, then (if there is data) one NOP whose body is
        the alignment padding and the data region, so the CP skips it."""
        if self._sealed:
            return
        self._fetch_dwords = len(self._words)
        if self._data:
            pad = -(self._fetch_dwords + 1) % DATA_ALIGN_DWORDS
            body = pad + len(self._data)
            if body > MAX_NOP_PAYLOAD:
                raise ValueError(f"{self.name}: {len(self._data)} dwords of kernargs exceed one NOP's body; "
                                 f"split the work over several queues")
            self._emit(pm4.header(regs.PM4Op.NOP, body), *([0] * pad))
            self._data_at = len(self._words)
            for w in self._data:
                if isinstance(w, int):
                    self._emit(w)
                else:
                    self._emit(0)
                    self._add_patch(PatchPoint(len(self._words) - 1, w[0], w[1]))
        else:
            self._data_at = len(self._words)
        self._sealed = True
        self._frozen = "was laid out for running (its kernarg region follows its commands)"

    def _bind(self, device: HCQDevice) -> None:
        dev = self.device
        if device is not dev:
            raise ValueError(f"{self.name} was built for {dev.name}, not {device.name}")
        self._seal()
        if not self._fetch_dwords:
            raise ValueError(f"{self.name}: an empty queue cannot be bound")
        words = self.words().astype(np.uint32)
        with dev.submit_lock:
            buf = dev.alloc_memory(words.nbytes, "gtt")
        ffi.memmove(ffi.cast("void *", buf.va), words.tobytes(), words.nbytes)
        self._bound_words = ffi.cast("uint32_t *", buf.va)
        self._block = buf
        weakref.finalize(self, dev.free_after_ring, buf, self._retire)
        self._fold_variable(DATA_BASE, buf.va + DWORD * self._data_at)  # a bound block never moves
        mailbox, eid = dev.event_target()
        self._fold_variable(EVENT_MAILBOX, mailbox)
        self._fold_variable(EVENT_ID, eid)

    def _before_patch(self, device: HCQDevice) -> None:
        if self._block is not None:  # rewritten in place: its previous run must be done with the words
            self.device.pm4_ring.wait_retired(self._retire[0], queue=f"{self.name} (its previous run)")

    def busy(self, device: HCQDevice) -> bool:
        return self._block is not None and self.device.pm4_ring.retired() < self._retire[0]

    def submit(self, device: HCQDevice, var_vals: Mapping[UOp, int] | None = None) -> HWQueue:
        dev = self.device
        if device is not dev:
            raise ValueError(f"{self.name} was built for {dev.name}, not {device.name}")
        with dev.submit_lock:
            dev.check_fault()
            if self._block is not None:
                return super().submit(device, var_vals)
            self._seal()
            if not self._words:
                return self
            ring = dev.pm4_ring
            n = len(self._words)
            slot = ring.reserve(n, DATA_ALIGN_DWORDS, self.name)
            vals = dict(var_vals) if var_vals else {}
            vals[DATA_BASE] = dev.pm4_ring_va + DWORD * (slot + self._data_at)
            if self._event_vars:  # a template's queue submitted unbound: its interrupt packets' event
                vals[EVENT_MAILBOX], vals[EVENT_ID] = dev.event_target()
            self._slot = slot
            return super().submit(device, vals)

    def _submit(self, device: HCQDevice) -> None:
        dev = self.device
        ring = dev.pm4_ring
        if self._block is None:
            words = np.asarray(self._words, dtype=np.uint32)
            dev.pm4_words[self._slot:self._slot + len(words)] = words
            dev.pm4_publish(ring.commit(len(words)))
            dev.pm4_submissions += 1
            return
        slot = ring.reserve(REPLAY_DWORDS, 1, self.name)
        packet = pm4.indirect_buffer(self._block.va, self._fetch_dwords) + pm4.nop(1)
        dev.pm4_words[slot:slot + REPLAY_DWORDS] = np.asarray(packet, dtype=np.uint32)
        self._retire[0] = ring.commit(REPLAY_DWORDS)
        dev.pm4_publish(self._retire[0])
        dev.pm4_submissions += 1


class AMDCopyQueue(_AMDQueue):
    """HCQ commands for the SDMA queue: COPY_LINEAR, FENCE (32-bit signal writes), POLL_REGMEM waits and
    TIMESTAMP. It cannot launch kernels and is not bound (a replay uses the compute queue)."""

    def _wait(self, signal: Signal, value: Value) -> None:
        addr: Value = signal.address
        self._packet(sdma.poll_regmem(0, 0), {1: (addr, 0), 2: (addr, 32), 3: (value, 0)})

    def _signal(self, signal: Signal, value: Value) -> None:
        addr: Value = signal.address
        self._packet(sdma.fence(self.device.fam, 0, 0), {1: (addr, 0), 2: (addr, 32), 3: (value, 0)})
        event = self.device.signal_event
        if event is not None and isinstance(addr, int):  # wake host waits: mailbox FENCE, then TRAP
            self._emit(*sdma.fence(self.device.fam, self.device.event_mailbox, event.trigger_data),
                       *sdma.trap(event.event_id))

    def _timestamp(self, signal: Signal) -> None:
        addr: Value = signal.timestamp_address
        self._packet(sdma.timestamp(0), {1: (addr, 0), 2: (addr, 32)})

    def _memory_barrier(self) -> None:
        """SDMA packets complete in order and the engine writes memory directly: nothing to flush."""

    def _exec(self, program: Program, args: list[Value], global_size: tuple[Value, ...],
              local_size: tuple[int, ...]) -> None:
        raise TypeError(f"{self.name}: the SDMA engine cannot launch kernels; use the compute queue")

    def _copy(self, dst: Value, src: Value, nbytes: Value) -> None:
        if not (isinstance(dst, int) and isinstance(src, int) and isinstance(nbytes, int)):
            raise TypeError(f"{self.name}: SDMA copies take concrete addresses and sizes (a replay copies on "
                            "the compute queue)")
        most = self.device.fam.sdma_copy_max_bytes
        for off in range(0, nbytes, most):
            self._emit(*sdma.copy_linear(self.device.fam, dst + off, src + off, min(most, nbytes - off)))

    def _bind(self, device: HCQDevice) -> None:
        raise NotImplementedError(f"{self.name}: SDMA queues are submitted, not bound (bind a compute queue)")

    def _submit(self, device: HCQDevice) -> None:
        dev = self.device
        if device is not dev:
            raise ValueError(f"{self.name} was built for {dev.name}, not {device.name}")
        with dev.submit_lock:
            dev.check_fault()
            if not self._words:
                return
            words = np.asarray(self._words, dtype=np.uint32)
            ring = dev.sdma_ring
            slot = ring.reserve(words.nbytes, DWORD, self.name)
            dev.sdma_words[slot // DWORD:slot // DWORD + len(words)] = words
            dev.sdma_publish(ring.commit(words.nbytes))
