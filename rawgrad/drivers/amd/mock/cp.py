"""A command-processor model for the mock AMD GPU: executes PM4 compute rings (with indirect buffers) and
SDMA copy rings over the interpreter's `MemoryMap`, with a register file and a dispatch validator.

What it models (../shared/AMD-METAL-FACTS.md sections 1.4-1.7, 2.1, 2.4):

- **Rings.** A PM4 queue's pointers count dwords, an SDMA queue's count bytes (facts section 1.2, step 8).
  `doorbell(wptr)` publishes work; the model runs every queue until each is idle or blocked, and writes the
  read pointer (a 64-bit count that never wraps; the ring offset is it modulo the ring size) back to the
  queue's rptr word when one is given. Packets are read from memory where the host wrote them, so a
  torn or truncated packet is seen as the GPU would see it.
- **PM4.** SET_SH_REG / SET_UCONFIG_REG write the register file; DISPATCH_DIRECT validates and runs the
  kernel; RELEASE_MEM writes a 32-bit or 64-bit value or the clock and may raise an interrupt (recorded in
  `interrupts`, passed to `on_interrupt`); WAIT_REG_MEM compares 32 bits of memory (or a register) and
  blocks the queue until true; INDIRECT_BUFFER runs an IB (two levels: ring -> IB1 -> IB2) and returns;
  ACQUIRE_MEM and EVENT_WRITE are checked for shape and otherwise no-ops (memory is sequentially consistent;
  see docs/amd.md). Any other opcode is `CPUnsupported`, never skipped.
- **SDMA.** COPY_LINEAR, FENCE, TRAP, POLL_REGMEM (memory), TIMESTAMP GET_GLOBAL and NOP.
- **Clock.** The GPU clock counts 10-ns ticks (100 MHz, as on gfx11 and gfx942). The model's default clock
  reads the host's monotonic `perf_counter_ns` divided by 10 and never returns the same tick twice, so a
  kernel's start and end timestamps bracket the time the interpreter took; `ticks * 10` is nanoseconds.
- **Dispatch validator.** At each DISPATCH_DIRECT: COMPUTE_PGM_LO/HI must be the code entry of a kernel
  descriptor the model was told about (`load_code_object`/`register_kernel`); the descriptor is read from
  GPU memory; RSRC1/RSRC2/RSRC3 must equal the descriptor's (RSRC1's PRIV bit and RSRC2's LDS_SIZE field
  excepted); the LDS allocation must cover the descriptor's group segment; CS_W32_EN must match the
  descriptor's wave32 bit (gfx9.4.3 has no wave32); each NUM_THREAD must be non-zero and the workgroup no
  larger than the metadata's max flat workgroup size; the user SGPRs the descriptor asks for must be ones a
  PM4 dispatch provides and fit in USER_SGPR_COUNT; COMPUTE_USER_DATA_0/1 must be a 16-byte aligned pointer
  that maps the descriptor's whole kernarg segment; a kernel with scratch needs TMPRING_SIZE. A violation is
  a `GPUFault` whose `field` names the register or packet field, and the queue halts.
- **Profiles.** gfx1100: validated dispatches run on the RDNA3 interpreter. gfx942: packet level only;
  dispatches are validated and recorded, and running one is `CPUnsupported` ("gfx942 machine code is never
  executed"); `execute=False` records without running on either profile.

Kernarg: the interpreter maps the kernarg segment itself, so the model hands it the bytes at the USER_DATA
pointer as they are at DISPATCH_DIRECT (a snapshot mapped at `KERNARG_SNAPSHOT_VA`, which must stay free).
A kernel that writes its own kernarg segment is not modelled; rawgrad's never do.
"""
from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rawgrad.compiler.amdgpu_code import (
    KCP_ENABLE_SGPR_DISPATCH_ID,
    KCP_ENABLE_SGPR_DISPATCH_PTR,
    KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT,
    KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR,
    KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER,
    KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE,
    KCP_ENABLE_SGPR_QUEUE_PTR,
    KD_SIZE,
    AMDCodeObject,
    KernelDescriptor,
)
from rawgrad.drivers.amd import regs
from rawgrad.drivers.amd.mock.rdna3.interp import (
    DEFAULT_MAX_STEPS,
    KERNARG_VA,
    MemoryFault,
    MemoryMap,
    MockUnsupported,
    Program,
    RDNA3Fault,
    run,
)
from rawgrad.drivers.amd.regs import CompareFunc, DataSel, PM4Op, SDMAOp

__all__ = ["CPUnsupported", "CommandProcessor", "DispatchRecord", "FakeClock", "GPUFault", "GPUHang",
           "LoadedKernel", "PM4Queue", "SDMAQueue", "SignalTimeout"]

U32 = 0xFFFFFFFF
KERNARG_SNAPSHOT_VA = KERNARG_VA  # where the interpreter maps the dispatch's kernarg snapshot
MAX_IB_DEPTH = 2  # ring -> IB1 -> IB2: the two indirect levels the model accepts; deeper is a fault
INTERRUPTS_KEPT = 1024  # the `interrupts` record keeps at least this many of the latest (a test's window)
DEFAULT_MAX_PACKETS = 1_000_000  # packets one run() may execute before the model calls it a runaway
EXECUTED_ARCHS = ("gfx1100",)  # profiles whose machine code the model runs (the RDNA3 interpreter)
# code-property bits for user SGPRs a PM4 dispatch cannot provide (no HSA dispatch packet or queue object)
_PM4_MISSING_USER_SGPRS = {KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER: "private segment buffer",
                           KCP_ENABLE_SGPR_DISPATCH_PTR: "dispatch ptr",
                           KCP_ENABLE_SGPR_QUEUE_PTR: "queue ptr",
                           KCP_ENABLE_SGPR_DISPATCH_ID: "dispatch id",
                           KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT: "flat scratch init",
                           KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE: "private segment size"}
_RSRC2_LDS = regs.RSRC2_LDS_SIZE_MASK << regs.RSRC2_LDS_SIZE_SHIFT
_RSRC2_USER_SGPR_SHIFT, _RSRC2_USER_SGPR_MASK = 1, 0x1F  # AMDGPUUsage compute_pgm_rsrc2 USER_SGPR_COUNT


class GPUFault(Exception):
    """What the hardware would report as a fault or a hung queue: `field` names the register or packet field
    at fault; the message says where (queue, ring or IB offset, packet) and what was expected."""

    def __init__(self, fault_field: str, message: str, *, va: int | None = None) -> None:
        self.field, self.detail, self.va = fault_field, message, va
        self.where = ""
        super().__init__(f"{fault_field}: {message}")

    def located(self, where: str) -> GPUFault:
        """The same fault with its place in the command stream prefixed (once)."""
        if not self.where:
            self.where = where
            self.args = (f"{where}: {self.args[0]}",)
        return self


class GPUHang(GPUFault):
    """A queue waits for something nothing left on the GPU will do."""


class SignalTimeout(GPUHang):
    """A host wait for a signal value that no pending packet will write."""


class CPUnsupported(GPUFault, NotImplementedError):
    """Something the model does not emulate (an opcode, a profile's execution); never silently skipped."""


class FakeClock:
    """The GPU clock: 10-ns ticks from the host's monotonic nanoseconds, strictly increasing between reads."""

    def __init__(self, source_ns: Callable[[], int] = time.perf_counter_ns) -> None:
        self._source, self._last = source_ns, -1

    def __call__(self) -> int:
        self._last = max(self._source() // regs.NS_PER_TICK, self._last + 1)
        return self._last


@dataclass(frozen=True)
class LoadedKernel:
    """A kernel the model knows: its descriptor and code entry in GPU memory, and the metadata bound the
    validator needs (the 64-byte descriptor carries no workgroup-size limit)."""

    name: str
    kd_va: int
    code_va: int
    image_va: int
    image_size: int
    max_workgroup_size: int


@dataclass
class DispatchRecord:
    """One validated DISPATCH_DIRECT: what ran, where its kernarg segment was, and its clock span."""

    kernel: str
    queue: str
    grid: tuple[int, int, int]
    local: tuple[int, int, int]
    kernarg_va: int
    lds_bytes: int
    executed: bool
    start_ticks: int
    end_ticks: int


@dataclass
class _Frame:
    """Where a queue reads: its ring (pointers in queue units, wrapping) or an indirect buffer (dwords)."""

    base: int
    size: int  # ring bytes, or IB dwords
    pos: int  # ring: read pointer in queue units; IB: dword index
    end: int  # ring: write pointer; IB: size
    ring: bool


class _Queue:
    kind = ""
    unit = 4  # bytes per pointer unit

    def __init__(self, cp: CommandProcessor, name: str, ring_va: int, ring_bytes: int,
                 rptr_va: int | None) -> None:
        if ring_bytes <= 0 or ring_bytes & (ring_bytes - 1) or ring_bytes % 4:
            raise ValueError(f"{name}: ring of {ring_bytes} bytes; rings are a power of two dwords")
        cp._load(ring_va, ring_bytes, "ring")  # the ring must be mapped (raises GPUFault otherwise)
        self.cp, self.name, self.rptr_va = cp, name, rptr_va
        self.frames = [_Frame(ring_va, ring_bytes, 0, 0, True)]
        self.blocked: str | None = None
        self.fault: GPUFault | None = None
        self.packets = 0
        self.last_packet = ""

    # ----------------------------------------------------------------- host side
    @property
    def ring_va(self) -> int:
        return self.frames[0].base

    @property
    def ring_bytes(self) -> int:
        return self.frames[0].size

    @property
    def rptr(self) -> int:
        return self.frames[0].pos

    @property
    def wptr(self) -> int:
        return self.frames[0].end

    def doorbell(self, wptr: int) -> None:
        """The host wrote packets up to `wptr` (queue units) and rang the doorbell: run the GPU."""
        ring = self.frames[0]
        if self.fault is not None:
            raise GPUFault("doorbell", f"{self.name} halted after an earlier fault: {self.fault}")
        if wptr < ring.end:
            raise self._halt(GPUFault("doorbell", f"write pointer went back from {ring.end} to {wptr}"))
        if (wptr - ring.pos) * self.unit > ring.size:
            raise self._halt(GPUFault("doorbell", f"write pointer {wptr} is {wptr - ring.pos} units ahead of "
                                                  f"the read pointer {ring.pos}: more than the ring holds"))
        if wptr * self.unit % 4:
            raise self._halt(GPUFault("doorbell", f"write pointer {wptr} is not on a dword boundary"))
        ring.end = wptr
        self.cp.run()

    @property
    def idle(self) -> bool:
        return len(self.frames) == 1 and self.frames[0].pos == self.frames[0].end and self.blocked is None

    def status(self) -> str:
        if self.fault is not None:
            return f"{self.name}: halted by a fault"
        if self.blocked is not None:
            return f"{self.name}: blocked, {self.blocked}"
        if self.idle:
            return f"{self.name}: idle after {self.packets} packets (last {self.last_packet or 'none'})"
        return f"{self.name}: {self.wptr - self.rptr} units pending"

    # ----------------------------------------------------------------- GPU side
    def _where(self) -> str:
        ring = self.frames[0]
        parts = [f"{self.name} ring {'dword' if self.unit == 4 else 'byte'} {ring.pos}"]
        for depth, f in enumerate(self.frames[1:], 1):
            parts.append(f"IB{depth} at {f.base:#x} dword {f.pos}")
        return ", ".join(parts)

    def _halt(self, fault: GPUFault) -> GPUFault:
        self.fault = fault.located(self._where())
        return self.fault

    def _word(self, f: _Frame, k: int) -> int:
        """Dword k (counting from the frame's read position) of the current frame."""
        if f.ring:
            off = (f.pos * self.unit + 4 * k) % f.size
        else:
            off = 4 * (f.pos + k)
        return self.cp._u32(f.base + off, "command fetch")

    def _available(self, f: _Frame) -> int:
        """Dwords published and not yet read in this frame."""
        return (f.end - f.pos) * self.unit // 4

    def _advance(self, f: _Frame, dwords: int) -> None:
        f.pos += dwords * 4 // self.unit

    def step(self, budget: int) -> int:
        """Execute packets until idle, blocked or `budget` packets; returns how many ran."""
        if self.fault is not None:
            return 0
        done = 0
        try:
            while done < budget:
                f = self.frames[-1]
                if self._available(f) == 0:
                    if f.ring:
                        break
                    self.frames.pop()  # the IB is finished: back to the frame that called it
                    continue
                length, name = self._length(f)
                if length > self._available(f):
                    raise GPUFault(name, f"packet of {length} dwords but only {self._available(f)} are "
                                         f"{'published' if f.ring else 'left in the IB'}")
                words = [self._word(f, k) for k in range(length)]
                self.blocked = None
                if not self._execute(f, words, name):
                    return done  # a wait that is not satisfied yet: the packet stays at the read pointer
                done += 1
                self.packets += 1
                self.last_packet = name
        except GPUFault as e:
            raise self._halt(e) from None
        finally:
            self._write_rptr()
        return done

    def _write_rptr(self) -> None:
        if self.rptr_va is not None:
            self.cp._store(self.rptr_va, struct.pack("<Q", self.rptr), "rptr write-back")

    def _length(self, f: _Frame) -> tuple[int, str]:
        raise NotImplementedError

    def _execute(self, f: _Frame, words: list[int], name: str) -> bool:
        raise NotImplementedError


class PM4Queue(_Queue):
    """A PM4 compute queue (pointers in dwords)."""

    kind = "pm4"
    unit = 4

    def _length(self, f: _Frame) -> tuple[int, str]:
        h = self._word(f, 0)
        kind = h >> regs.PACKET_TYPE_SHIFT
        if kind == regs.PACKET_TYPE2:
            return 1, "PACKET2"
        if kind != regs.PACKET_TYPE3:
            raise GPUFault("PM4 header", f"{h:#010x} is a type-{kind} packet; the compute queue takes type 3")
        op = (h >> regs.PACKET3_OPCODE_SHIFT) & regs.PACKET3_OPCODE_MASK
        count = (h >> regs.PACKET3_COUNT_SHIFT) & regs.PACKET3_COUNT_MASK
        name = PM4Op(op).name if op in PM4Op._value2member_map_ else f"PM4 opcode {op:#04x}"
        if op == PM4Op.NOP and count == regs.NOP_ONE_DWORD_COUNT:
            return 1, name
        return count + 2, name

    def _execute(self, f: _Frame, words: list[int], name: str) -> bool:
        cp = self.cp
        p = words[1:]
        code = (words[0] >> regs.PACKET3_OPCODE_SHIFT) & regs.PACKET3_OPCODE_MASK
        op = PM4Op(code) if code in PM4Op._value2member_map_ else None
        if name == "PACKET2" or op == PM4Op.NOP:
            self._advance(f, len(words))
            return True
        if op == PM4Op.SET_SH_REG or op == PM4Op.SET_UCONFIG_REG:
            start = regs.SET_SH_REG_START if op == PM4Op.SET_SH_REG else regs.SET_UCONFIG_REG_START
            reg = start + (p[0] & 0xFFFF)
            if op == PM4Op.SET_SH_REG and reg + len(p) - 1 > regs.SET_SH_REG_END:
                raise GPUFault("SET_SH_REG offset", f"registers {reg:#x}.. run past the SH range")
            for i, v in enumerate(p[1:]):
                cp.regs[reg + i] = v
        elif op == PM4Op.DISPATCH_DIRECT:
            _expect(name, p, 4)
            cp._dispatch(self, (p[0], p[1], p[2]), p[3])
        elif op == PM4Op.RELEASE_MEM:
            _expect(name, p, 7)
            cp._release_mem(self, p)
        elif op == PM4Op.WAIT_REG_MEM:
            _expect(name, p, 6)
            if not cp._wait_reg_mem(self, p):
                return False
        elif op == PM4Op.ACQUIRE_MEM:
            if len(words) != cp.fam.acquire_mem_dwords:
                raise GPUFault("ACQUIRE_MEM", f"{len(words)} dwords; the {cp.fam.name} layout has "
                                              f"{cp.fam.acquire_mem_dwords}")
        elif op == PM4Op.EVENT_WRITE:
            _expect(name, p, 1, at_least=True)
        elif op == PM4Op.INDIRECT_BUFFER:
            _expect(name, p, 3)
            addr, ctl = p[0] | (p[1] & 0xFFFF) << 32, p[2]
            if not ctl & regs.INDIRECT_BUFFER_VALID:
                raise GPUFault("INDIRECT_BUFFER.VALID", f"bit 23 clear in {ctl:#010x}: the CP ignores the IB")
            if addr % regs.INDIRECT_BUFFER_ADDR_ALIGN:
                raise GPUFault("INDIRECT_BUFFER address", f"{addr:#x} is not dword aligned", va=addr)
            size = ctl & regs.INDIRECT_BUFFER_SIZE_MASK
            if size == 0:
                raise GPUFault("INDIRECT_BUFFER.IB_SIZE", "0 dwords")
            if len(self.frames) > MAX_IB_DEPTH:
                raise GPUFault("INDIRECT_BUFFER", f"nested deeper than {MAX_IB_DEPTH} levels")
            cp._load(addr, 4 * size, "INDIRECT_BUFFER range")  # the whole IB must be mapped
            self._advance(f, len(words))  # the CP comes back after the IB
            self.frames.append(_Frame(addr, size, 0, size, False))
            return True
        else:
            raise CPUnsupported(name, "not modelled by the command processor")
        self._advance(f, len(words))
        return True


class SDMAQueue(_Queue):
    """An SDMA copy queue (pointers in bytes)."""

    kind = "sdma"
    unit = 1

    _LENGTHS = {SDMAOp.COPY: regs.SDMA_COPY_LINEAR_DWORDS, SDMAOp.FENCE: regs.SDMA_FENCE_DWORDS,
                SDMAOp.TRAP: regs.SDMA_TRAP_DWORDS, SDMAOp.POLL_REGMEM: regs.SDMA_POLL_REGMEM_DWORDS,
                SDMAOp.TIMESTAMP: regs.SDMA_TIMESTAMP_DWORDS}

    def _length(self, f: _Frame) -> tuple[int, str]:
        h = self._word(f, 0)
        op = h & regs.SDMA_OP_MASK
        if op == SDMAOp.NOP:
            return 1 + ((h >> regs.SDMA_NOP_COUNT_SHIFT) & regs.SDMA_NOP_COUNT_MASK), "SDMA NOP"
        if op not in self._LENGTHS:
            name = SDMAOp(op).name if op in SDMAOp._value2member_map_ else f"opcode {op}"
            raise CPUnsupported(f"SDMA {name}", "not modelled by the SDMA engine model")
        return self._LENGTHS[SDMAOp(op)], f"SDMA {SDMAOp(op).name}"

    def _execute(self, f: _Frame, words: list[int], name: str) -> bool:
        cp = self.cp
        h = words[0]
        op, sub = h & regs.SDMA_OP_MASK, (h >> regs.SDMA_SUB_OP_SHIFT) & regs.SDMA_SUB_OP_MASK
        if op == SDMAOp.COPY:
            if sub != regs.SDMA_SUBOP_COPY_LINEAR:
                raise CPUnsupported("SDMA COPY sub_op", f"{sub} (only COPY_LINEAR is modelled)")
            count_mask = (cp.fam.sdma_copy_max_bytes - 1)
            if words[1] & ~count_mask:
                raise GPUFault("SDMA COPY_LINEAR.COUNT", f"{words[1]:#x} has bits above the {cp.fam.name} "
                                                         f"count field ({count_mask:#x})")
            n = (words[1] & count_mask) + 1
            src, dst = words[3] | words[4] << 32, words[5] | words[6] << 32
            data = cp._load(src, n, "SDMA COPY_LINEAR source")
            cp._store(dst, data, "SDMA COPY_LINEAR destination")
        elif op == SDMAOp.FENCE:
            addr = words[1] | words[2] << 32
            if addr % 4:
                raise GPUFault("SDMA FENCE address", f"{addr:#x} is not dword aligned", va=addr)
            cp._store(addr, struct.pack("<I", words[3]), "SDMA FENCE address", signal=True)
        elif op == SDMAOp.TRAP:
            cp._interrupt(self, words[1] & regs.SDMA_TRAP_INT_CONTEXT_MASK)
        elif op == SDMAOp.POLL_REGMEM:
            if not h & regs.SDMA_POLL_MEM_POLL:
                raise CPUnsupported("SDMA POLL_REGMEM.MEM_POLL", "register polling is not modelled")
            func = CompareFunc((h >> regs.SDMA_POLL_FUNC_SHIFT) & 0x7)
            addr = words[1] | words[2] << 32
            if addr % 4:
                raise GPUFault("SDMA POLL_REGMEM address", f"{addr:#x} is not dword aligned", va=addr)
            if not cp._poll(self, name, addr, words[3], words[4], func):
                return False
        elif op == SDMAOp.TIMESTAMP:
            if sub != regs.SDMA_SUBOP_TIMESTAMP_GET_GLOBAL:
                raise CPUnsupported("SDMA TIMESTAMP sub_op", f"{sub} (only GET_GLOBAL is modelled)")
            addr = words[1] | words[2] << 32
            if addr % 8:
                raise GPUFault("SDMA TIMESTAMP address", f"{addr:#x} is not 8-byte aligned", va=addr)
            cp._store(addr, struct.pack("<Q", cp.clock()), "SDMA TIMESTAMP address")
        self._advance(f, len(words))
        return True


def _expect(name: str, payload: list[int], n: int, at_least: bool = False) -> None:
    if len(payload) < n or (len(payload) != n and not at_least):
        raise GPUFault(name, f"{len(payload)} payload dwords, the packet has {n}")


def _compare(value: int, func: CompareFunc, reference: int) -> bool:
    return {CompareFunc.ALWAYS: True, CompareFunc.LT: value < reference, CompareFunc.LE: value <= reference,
            CompareFunc.EQ: value == reference, CompareFunc.NE: value != reference,
            CompareFunc.GE: value >= reference, CompareFunc.GT: value > reference}[func]


class CommandProcessor:
    """The GPU front end of the mock: queues, register file, known kernels, dispatch validator."""

    def __init__(self, memory: MemoryMap, arch: str = "gfx1100", *, execute: bool = True,
                 clock: Callable[[], int] | None = None, max_packets: int = DEFAULT_MAX_PACKETS,
                 max_kernel_steps: int = DEFAULT_MAX_STEPS) -> None:
        self.memory, self.fam = memory, regs.family(arch)
        self.execute, self.clock = execute, clock or FakeClock()
        self.max_packets, self.max_kernel_steps = max_packets, max_kernel_steps
        self.regs: dict[int, int] = {}
        self.kernels: dict[int, LoadedKernel] = {}  # by code entry VA
        self.queues: list[_Queue] = []
        self.dispatches: list[DispatchRecord] = []
        self.interrupts: list[tuple[str, int]] = []
        self.on_interrupt: Callable[[str, int], None] | None = None
        self.signal_writes: dict[int, int] = {}  # address -> last 32/64-bit value a signal packet wrote
        self._programs: dict[int, tuple[bytes, Program]] = {}

    # ----------------------------------------------------------------- setup
    def load_code_object(self, co: AMDCodeObject, image_va: int) -> LoadedKernel:
        """Map the loader's image of `co` at `image_va` and make its kernel known to the validator."""
        if co.arch != self.fam.arch:
            raise ValueError(f"{co.name}: code object for {co.arch}, command processor for {self.fam.arch}")
        self.memory.map(image_va, co.image)
        return self.register_kernel(image_va + co.kd_offset, name=co.name, image_va=image_va,
                                    image_size=len(co.image),
                                    max_workgroup_size=co.metadata.max_flat_workgroup_size)

    def register_kernel(self, kd_va: int, *, name: str, image_va: int, image_size: int,
                        max_workgroup_size: int) -> LoadedKernel:
        """A kernel whose image the driver already put in GPU memory at `image_va`, descriptor at `kd_va`."""
        if kd_va % 64:
            raise ValueError(f"{name}: kernel descriptor at {kd_va:#x} is not 64-byte aligned")
        kd = KernelDescriptor.decode(self._load(kd_va, KD_SIZE, "kernel descriptor"))
        code_va = kd_va + kd.kernel_code_entry_byte_offset
        if not image_va <= code_va < image_va + image_size:
            raise ValueError(f"{name}: code entry {code_va:#x} lies outside the image")
        k = LoadedKernel(name, kd_va, code_va, image_va, image_size, max_workgroup_size)
        self.kernels[code_va] = k
        return k

    def pm4_queue(self, ring_va: int, ring_bytes: int, *, rptr_va: int | None = None,
                  name: str | None = None) -> PM4Queue:
        q = PM4Queue(self, name or f"pm4 queue {len(self.queues)}", ring_va, ring_bytes, rptr_va)
        self.queues.append(q)
        return q

    def sdma_queue(self, ring_va: int, ring_bytes: int, *, rptr_va: int | None = None,
                   name: str | None = None) -> SDMAQueue:
        q = SDMAQueue(self, name or f"sdma queue {len(self.queues)}", ring_va, ring_bytes, rptr_va)
        self.queues.append(q)
        return q

    # ----------------------------------------------------------------- running
    def run(self) -> None:
        """Run every queue until each is idle, blocked on a wait, or halted; queues take turns, so a wait on
        one queue is released by a signal from another."""
        budget = self.max_packets
        while True:
            progress = 0
            for q in self.queues:
                progress += q.step(budget - progress)
                if progress >= budget:
                    raise GPUHang("command processor", f"more than {self.max_packets} packets in one run "
                                                       "(an indirect buffer that calls itself?)")
            budget -= progress
            if not progress:
                return

    def drain(self) -> None:
        """Run until every queue is idle; a queue still blocked on a wait is a GPUHang naming the wait."""
        self.run()
        blocked = [q for q in self.queues if q.blocked is not None]
        if blocked:
            raise GPUHang("WAIT", "; ".join(f"{q._where()}: {q.blocked}" for q in blocked)
                          + " -- nothing left on any queue will change it")

    def wait_signal(self, addr: int, value: int, func: CompareFunc = CompareFunc.GE) -> int:
        """The host's wait for a 32-bit signal (AMD compares 32 bits): run the GPU, then either the condition
        holds (returns the value) or nothing pending can write it (SignalTimeout saying why)."""
        self.run()
        got = self._u32(addr, "host wait")
        if _compare(got, func, value):
            return got
        if addr in self.signal_writes:
            last = f"the last packet to write it stored {self.signal_writes[addr]}"
        else:
            last = "no RELEASE_MEM or FENCE has written it"
        state = "; ".join(q.status() for q in self.queues) or "no queues"
        raise SignalTimeout("host wait", f"signal at {addr:#x} holds {got}, the host waits for "
                                         f"{regs.COMPARE_SYMBOL[func]} {value}; {last}; the GPU can do "
                                         f"nothing more ({state})", va=addr)

    # ----------------------------------------------------------------- memory
    def _load(self, va: int, n: int, what: str) -> bytes:
        try:
            return self.memory.load(np.array([va], np.uint64), n, what)[0].tobytes()
        except MemoryFault as e:
            raise GPUFault(what, f"{n} bytes at {va:#x} are not mapped ({self.memory.describe(va)})",
                           va=va) from e

    def _store(self, va: int, data: bytes, what: str, *, signal: bool = False) -> None:
        try:
            self.memory.store(np.array([va], np.uint64), np.frombuffer(data, np.uint8)[None, :], what)
        except MemoryFault as e:
            raise GPUFault(what, f"{len(data)} bytes at {va:#x} are not mapped ({self.memory.describe(va)})",
                           va=va) from e
        if signal:
            self.signal_writes[va] = int.from_bytes(data, "little")

    def _u32(self, va: int, what: str) -> int:
        return int.from_bytes(self._load(va, 4, what), "little")

    def _interrupt(self, q: _Queue, ctxid: int) -> None:
        self.interrupts.append((q.name, ctxid))
        if len(self.interrupts) > 2 * INTERRUPTS_KEPT:  # a device interrupts after every signal: keep recent
            del self.interrupts[:-INTERRUPTS_KEPT]
        if self.on_interrupt is not None:
            self.on_interrupt(q.name, ctxid)

    # ----------------------------------------------------------------- PM4 packets
    def _release_mem(self, q: _Queue, p: list[int]) -> None:
        data_sel = (p[1] >> regs.RELEASE_MEM_DATA_SEL_SHIFT) & regs.RELEASE_MEM_DATA_SEL_MASK
        int_sel = (p[1] >> regs.RELEASE_MEM_INT_SEL_SHIFT) & regs.RELEASE_MEM_INT_SEL_MASK
        addr = p[2] | p[3] << 32
        if data_sel == DataSel.VALUE32:
            if addr % 4:
                raise GPUFault("RELEASE_MEM address", f"{addr:#x} is not dword aligned", va=addr)
            self._store(addr, struct.pack("<I", p[4]), "RELEASE_MEM address", signal=True)
        elif data_sel == DataSel.VALUE64:
            if addr % 8:
                raise GPUFault("RELEASE_MEM address", f"{addr:#x} is not 8-byte aligned", va=addr)
            self._store(addr, struct.pack("<II", p[4], p[5]), "RELEASE_MEM address", signal=True)
        elif data_sel in (DataSel.GPU_CLOCK, DataSel.SYSTEM_CLOCK):
            if addr % 8:
                raise GPUFault("RELEASE_MEM address", f"{addr:#x} is not 8-byte aligned", va=addr)
            self._store(addr, struct.pack("<Q", self.clock()), "RELEASE_MEM address")
        elif data_sel != DataSel.NONE:
            raise GPUFault("RELEASE_MEM.DATA_SEL", f"{data_sel} is reserved")
        if int_sel in (1, 2):
            self._interrupt(q, p[6])
        elif int_sel:
            raise GPUFault("RELEASE_MEM.INT_SEL", f"{int_sel} is not modelled")

    def _wait_reg_mem(self, q: _Queue, p: list[int]) -> bool:
        func = CompareFunc(p[0] & regs.WAIT_REG_MEM_FUNCTION_MASK) \
            if p[0] & regs.WAIT_REG_MEM_FUNCTION_MASK <= CompareFunc.GT else None
        if func is None:
            raise GPUFault("WAIT_REG_MEM.FUNCTION", f"{p[0] & 7} is reserved")
        space = (p[0] >> regs.WAIT_REG_MEM_MEM_SPACE_SHIFT) & 1
        operation = (p[0] >> regs.WAIT_REG_MEM_OPERATION_SHIFT) & 3
        if space == regs.WAIT_MEM_SPACE_MEMORY:
            addr = p[1] | p[2] << 32
            if addr % 4:
                raise GPUFault("WAIT_REG_MEM address", f"{addr:#x} is not dword aligned", va=addr)
            return self._poll(q, "WAIT_REG_MEM", addr, p[3], p[4], func)
        # register space: the HDP flush handshake (write the request register, poll the done register); the
        # model's flush completes at once, so the done register reads back the requested bits
        if operation == regs.WAIT_OPERATION_WRITE_WAIT:
            self.regs[p[1]] = p[3]
            self.regs[p[2]] = self.regs.get(p[2], 0) | (p[3] & p[4])
            reg = p[2]
        else:
            reg = p[1]
        value = self.regs.get(reg, 0) & p[4]
        if _compare(value, func, p[3]):
            return True
        q.blocked = (f"WAIT_REG_MEM on register {reg:#x} = {value:#x}, waits for "
                     f"& {p[4]:#x} {regs.COMPARE_SYMBOL[func]} {p[3]:#x}")
        return False

    def _poll(self, q: _Queue, name: str, addr: int, reference: int, mask: int, func: CompareFunc) -> bool:
        value = self._u32(addr, f"{name} address") & mask
        if _compare(value, func, reference):
            return True
        q.blocked = (f"{name} on memory {addr:#x}: (value {value} & {mask:#x}) "
                     f"{regs.COMPARE_SYMBOL[func]} {reference} is false")
        return False

    # ----------------------------------------------------------------- dispatch
    def _reg(self, reg: int) -> int:
        return self.regs.get(reg, 0)

    def _dispatch(self, q: _Queue, grid: tuple[int, int, int], initiator: int) -> None:
        fam = self.fam
        pgm = ((self._reg(regs.COMPUTE_PGM_HI) << 32) | self._reg(regs.COMPUTE_PGM_LO)) << regs.PGM_ADDR_SHIFT
        k = self.kernels.get(pgm)
        if k is None:
            known = ", ".join(f"{v.name} at {a:#x}" for a, v in self.kernels.items()) or "none loaded"
            raise GPUFault("COMPUTE_PGM_LO/HI", f"{pgm:#x} is not the code entry of any kernel descriptor "
                                                f"({known})", va=pgm)
        kd = KernelDescriptor.decode(self._load(k.kd_va, KD_SIZE, "kernel descriptor"))
        if k.kd_va + kd.kernel_code_entry_byte_offset != pgm:
            now = k.kd_va + kd.kernel_code_entry_byte_offset
            raise GPUFault("kernel descriptor", f"{k.name}: the descriptor at {k.kd_va:#x} now points at "
                                                f"{now:#x}, not {pgm:#x}")
        self._check_rsrc(k, kd)
        lds = ((self._reg(regs.COMPUTE_PGM_RSRC2) >> regs.RSRC2_LDS_SIZE_SHIFT) & regs.RSRC2_LDS_SIZE_MASK) \
            * regs.LDS_GRANULE_BYTES
        if lds < kd.group_segment_fixed_size:
            raise GPUFault("COMPUTE_PGM_RSRC2.LDS_SIZE", f"{k.name}: {lds} bytes of LDS allocated, the "
                                                         f"descriptor's group segment needs "
                                                         f"{kd.group_segment_fixed_size}")
        self._check_wave(k, kd, initiator)
        local = self._check_local(k)
        for d, n in zip("XYZ", grid):
            if n == 0:
                raise GPUFault(f"DISPATCH_DIRECT.DIM_{d}", f"{k.name}: 0 workgroups")
        kernarg_va = self._check_user_data(k, kd)
        if kd.private_segment_fixed_size and not self._reg(regs.COMPUTE_TMPRING_SIZE):
            raise GPUFault("COMPUTE_TMPRING_SIZE", f"{k.name} needs {kd.private_segment_fixed_size} bytes of "
                                                   "scratch per work-item but TMPRING_SIZE is 0")
        for i, d in enumerate("XYZ"):
            if self._reg(regs.COMPUTE_START_X + i):
                raise CPUnsupported(f"COMPUTE_START_{d}", "dispatch start offsets are not modelled")
        kernarg = self._load(kernarg_va, kd.kernarg_size, "kernarg segment") if kd.kernarg_size else b""
        rec = DispatchRecord(k.name, q.name, grid, local, kernarg_va, lds, False, self.clock(), 0)
        self.dispatches.append(rec)
        if self.execute:
            if fam.arch not in EXECUTED_ARCHS:
                raise CPUnsupported("DISPATCH_DIRECT", f"{k.name}: validated for {fam.arch}, but {fam.arch} "
                                                       "machine code is never executed by the model (packet "
                                                       "level only; execute=False records dispatches)")
            self._execute(k, kd, kernarg, grid, local)
            rec.executed = True
        rec.end_ticks = self.clock()

    def _check_rsrc(self, k: LoadedKernel, kd: KernelDescriptor) -> None:
        r1, r2 = self._reg(regs.COMPUTE_PGM_RSRC1), self._reg(regs.COMPUTE_PGM_RSRC2)
        r3 = self._reg(self.fam.compute_pgm_rsrc3)
        diff1 = (r1 ^ kd.compute_pgm_rsrc1) & ~regs.RSRC1_PRIV
        diff2 = (r2 ^ kd.compute_pgm_rsrc2) & ~_RSRC2_LDS
        if diff1:
            raise GPUFault("COMPUTE_PGM_RSRC1", f"{k.name}: {r1:#010x}, the descriptor's is "
                                                f"{kd.compute_pgm_rsrc1:#010x} (bits {diff1:#x} differ)")
        if diff2:
            ours = (r2 >> _RSRC2_USER_SGPR_SHIFT) & _RSRC2_USER_SGPR_MASK
            theirs = kd.user_sgpr_count
            more = f"; USER_SGPR_COUNT {ours} vs {theirs}" if ours != theirs else ""
            raise GPUFault("COMPUTE_PGM_RSRC2", f"{k.name}: {r2:#010x}, the descriptor's is "
                                                f"{kd.compute_pgm_rsrc2:#010x} (bits {diff2:#x} differ"
                                                f"{more})")
        if r3 != kd.compute_pgm_rsrc3:
            raise GPUFault("COMPUTE_PGM_RSRC3", f"{k.name}: {r3:#010x}, the descriptor's is "
                                                f"{kd.compute_pgm_rsrc3:#010x}")

    def _check_wave(self, k: LoadedKernel, kd: KernelDescriptor, initiator: int) -> None:
        if not initiator & regs.INITIATOR_COMPUTE_SHADER_EN:
            raise GPUFault("DISPATCH_INITIATOR.COMPUTE_SHADER_EN", f"{k.name}: clear in {initiator:#x}")
        w32 = bool(initiator & regs.INITIATOR_CS_W32_EN)
        if self.fam.has_cs_w32:
            if w32 != kd.wave32:
                raise GPUFault("DISPATCH_INITIATOR.CS_W32_EN", f"{k.name}: {int(w32)}, but the descriptor's "
                                                               f"wave32 bit is {int(kd.wave32)}")
        elif w32 or kd.wave32:
            raise GPUFault("DISPATCH_INITIATOR.CS_W32_EN", f"{k.name}: {self.fam.arch} runs wave64 only "
                                                           f"(CS_W32_EN {int(w32)}, descriptor wave32 "
                                                           f"{int(kd.wave32)})")

    def _check_local(self, k: LoadedKernel) -> tuple[int, int, int]:
        dims = []
        for i, d in enumerate("XYZ"):
            v = self._reg(regs.COMPUTE_NUM_THREAD_X + i)
            if v & ~regs.NUM_THREAD_FULL_MASK:
                raise CPUnsupported(f"COMPUTE_NUM_THREAD_{d}.NUM_THREAD_PARTIAL",
                                    "partial workgroups are not modelled")
            if v == 0:
                raise GPUFault(f"COMPUTE_NUM_THREAD_{d}", f"{k.name}: 0 work-items")
            dims.append(v)
        local = (dims[0], dims[1], dims[2])
        threads = local[0] * local[1] * local[2]
        if threads > k.max_workgroup_size:
            raise GPUFault("COMPUTE_NUM_THREAD_X/Y/Z", f"{k.name}: workgroup {local} = {threads} work-items, "
                                                       f"the kernel's max flat workgroup size is "
                                                       f"{k.max_workgroup_size}")
        return local

    def _check_user_data(self, k: LoadedKernel, kd: KernelDescriptor) -> int:
        props = kd.kernel_code_properties
        missing = [n for bit, n in _PM4_MISSING_USER_SGPRS.items() if props & bit]
        if missing:
            raise GPUFault("kernel descriptor", f"{k.name} asks for the {', '.join(missing)} user SGPRs, "
                                                "which a PM4 dispatch does not provide")
        if not props & KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR:
            return 0  # no arguments at all: nothing to check
        if kd.user_sgpr_count < 2:
            raise GPUFault("COMPUTE_PGM_RSRC2.USER_SGPR_COUNT",
                           f"{k.name}: {kd.user_sgpr_count}, the kernarg pointer alone needs 2")
        va = self._reg(regs.COMPUTE_USER_DATA_0) | self._reg(regs.COMPUTE_USER_DATA_0 + 1) << 32
        what = "COMPUTE_USER_DATA_0/1 (kernarg pointer)"
        if va % regs.KERNARG_SEGMENT_ALIGN:
            raise GPUFault(what, f"{k.name}: {va:#x} is not {regs.KERNARG_SEGMENT_ALIGN}-byte aligned", va=va)
        try:
            self.memory.load(np.array([va], np.uint64), max(kd.kernarg_size, 1), what)
        except MemoryFault:
            raise GPUFault(what, f"{k.name}: {va:#x} does not map the {kd.kernarg_size}-byte kernarg segment "
                                 f"({self.memory.describe(va)})", va=va) from None
        return va

    def _execute(self, k: LoadedKernel, kd: KernelDescriptor, kernarg: bytes, grid: tuple[int, int, int],
                 local: tuple[int, int, int]) -> None:
        image = self._load(k.image_va, k.image_size, "kernel image")
        cached = self._programs.get(k.kd_va)
        if cached is None or cached[0] != image or cached[1].kd != kd:
            cached = (image, Program(image, k.code_va - k.image_va, kd, k.name))
            self._programs[k.kd_va] = cached
        try:
            run(cached[1], self.memory, kernarg, grid, local, kernarg_va=KERNARG_SNAPSHOT_VA,
                max_steps=self.max_kernel_steps)
        except MockUnsupported as e:
            raise CPUnsupported("kernel", str(e)) from e
        except RDNA3Fault as e:
            raise GPUFault("kernel", str(e), va=getattr(e, "va", None)) from e

