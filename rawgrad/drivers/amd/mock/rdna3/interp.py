"""An RDNA3 (gfx11, wave32) interpreter in numpy: runs the exact machine code of a loaded code object.

Execution model (the PTX interpreter's, at wave granularity; ../shared/AMD-METAL-FACTS.md section 2.4):
the waves of a batch of workgroups run together; registers are numpy arrays with one row per wave. Each step
runs the instruction at the lowest program counter among the runnable waves, for every wave at that pc.
Divergence inside a wave is the compiler's business (EXEC-mask instructions) and is run as written; waves
differ only in scalar branches. `s_barrier` parks a wave until every wave of its workgroup that has not ended
is parked, then releases them together.

Launch state (AMDGPUUsage, "Initial Kernel Execution State"; the facts and the user-SGPR trap are in
AMD-METAL-FACTS.md section 1.8): the user SGPRs the kernel descriptor asks for are loaded from s0 upwards
(only the kernarg segment pointer is supported: any other request raises MockUnsupported). The workgroup ids
X, Y, Z that rsrc2 enables follow at s[USER_SGPR_COUNT] (rsrc2 bits 5:1), never at a fixed register.
v0 holds the work-item ids packed (X in bits 9:0, Y in 19:10, Z in 29:20), as on gfx11. EXEC holds the
wave's live lanes (a partial last wave has fewer). The float denorm modes come from rsrc1 (bits 17:16 for
f32, 19:18 for f16/f64): 0 flushes inputs and results, 1 results only, 2 inputs only, 3 neither.

Memory: global and scalar loads go through `MemoryMap`, a table of mapped ranges; any byte outside them is
a `MemoryFault` naming the address, size, instruction and wave. LDS is one byte array per workgroup of the
descriptor's group_segment_fixed_size; an access past it faults here (hardware reads 0 and drops the write,
which would hide the bug). Memory is sequentially consistent: s_waitcnt, caches and their invalidations are
not modelled (see docs/amd.md).

Numerics (RDNA3 ISA manual, VALU chapters): integer ops wrap; f32/f16 add, mul, fma, sqrt, conversions are
correctly rounded to nearest even, as the hardware's IEEE ops are (f32/f16 fma through float64 with
round-to-odd, so no double rounding; f64 fma as Dekker's exact product plus round-to-odd sums, Boldo and
Melquiond, with exact Fractions only near overflow and underflow). The transcendental ops v_exp_f32,
v_log_f32, v_rcp_f32 and v_rcp_iflag_f32 are approximations on hardware (about 1 ulp); here they return the
correctly rounded value, so tests compare them with a tolerance. v_div_scale/fmas/fixup follow the ISA
pseudocode (V_DIV_FMAS_F32 scales by 2^64 or 2^-64 depending on the exponent of its third operand).

Any opcode without semantics here raises `MockUnsupported(mnemonic)`; nothing is guessed.

Speed: every instruction is one set of numpy operations over all the waves at its pc (2048 waves, 65536
lanes, per batch); loads in flight are queued per instruction, not per wave; a step that every wave of the
batch runs indexes the register files with slices; global accesses that stay in one mapping are one gather.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np

from rawgrad.compiler.amdgpu_code import (
    KCP_ENABLE_SGPR_DISPATCH_ID,
    KCP_ENABLE_SGPR_DISPATCH_PTR,
    KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT,
    KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR,
    KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER,
    KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE,
    KCP_ENABLE_SGPR_QUEUE_PTR,
    RSRC1_VGPR_GRANULES_MASK,
    AMDCodeObject,
    KernelDescriptor,
)
from rawgrad.drivers.amd.mock.rdna3.decode import (
    EXEC_LO,
    M0,
    NUM_SGPRS,
    SGPR_NULL,
    VCC_LO,
    DecodeError,
    Instr,
    Operand,
    decode,
    mnemonic_base,
)

__all__ = ["MemoryFault", "MemoryMap", "MockUnsupported", "Program", "RDNA3Fault", "RunStats", "denorm_modes",
           "run", "vgpr_count"]

WAVE = 32  # lanes per wave: the mock runs wave32 code only (KD code property bit 10)
SGPR_FILE = 128  # scalar operand encodings 0..127 (s0..s105, vcc, null, m0, exec) held in one array
VGPR_GRANULE_WAVE32 = 8  # rsrc1 GRANULATED_WORKITEM_VGPR_COUNT unit on gfx10/11 wave32 (AMDGPUUsage)
WORKITEM_ID_BITS = 10  # v0 packs the X/Y/Z work-item ids in 10-bit fields on gfx11 (AMDGPUUsage)
MAX_WAVES_PER_BATCH = 2048  # waves run together in one numpy step (several workgroups when they are small)
KERNARG_ALIGN = 16  # HSA: kernarg segments are 16-byte aligned and sized; LLVM widens kernarg loads to the
# aligned end (matmul_tiled's s_load_b128 of its last three i32 reads 4 bytes past .kernarg_segment_size)
KERNARG_VA = 0x7F00_0000_0000  # where run() maps the kernarg segment unless told otherwise
DEFAULT_MAX_STEPS = 2_000_000  # steps (instructions for one set of waves) before a launch is called runaway
_UNSUPPORTED_USER_SGPRS = {KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER: "private segment buffer",
                           KCP_ENABLE_SGPR_DISPATCH_PTR: "dispatch ptr",
                           KCP_ENABLE_SGPR_QUEUE_PTR: "queue ptr",
                           KCP_ENABLE_SGPR_DISPATCH_ID: "dispatch id",
                           KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT: "flat scratch init",
                           KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE: "private segment size"}
DENORM_FLUSH_IN_OUT, DENORM_FLUSH_OUT, DENORM_FLUSH_IN, DENORM_KEEP = 0, 1, 2, 3  # FLOAT_DENORM_MODE values


class RDNA3Fault(Exception):
    """The kernel did something the hardware would fault on or that has no defined result (a GPU fault)."""


class MemoryFault(RDNA3Fault):
    """An access to an address no mapping covers (global, scalar) or past the workgroup's LDS."""


class MockUnsupported(RDNA3Fault, NotImplementedError):
    """The interpreter has no semantics for this instruction (or launch feature); never silently skipped."""

    def __init__(self, mnemonic: str, detail: str = "") -> None:
        self.mnemonic = mnemonic
        more = f" ({detail})" if detail else ""
        super().__init__(f"{mnemonic}: not implemented by the RDNA3 interpreter{more}")


# ---------------------------------------------------------------------- kernel descriptor fields
def vgpr_count(kd: KernelDescriptor) -> int:
    """VGPRs per lane the descriptor allocates (rsrc1 GRANULATED_WORKITEM_VGPR_COUNT, wave32 granules)."""
    return ((kd.compute_pgm_rsrc1 & RSRC1_VGPR_GRANULES_MASK) + 1) * VGPR_GRANULE_WAVE32


def denorm_modes(kd: KernelDescriptor) -> tuple[int, int]:
    """(FLOAT_DENORM_MODE_32, FLOAT_DENORM_MODE_16_64) from rsrc1 bits 17:16 and 19:18."""
    return (kd.compute_pgm_rsrc1 >> 16) & 3, (kd.compute_pgm_rsrc1 >> 18) & 3


# ---------------------------------------------------------------------- global memory
class MemoryMap:
    """The GPU virtual address space the kernel sees: mapped ranges backed by numpy byte arrays. Every access
    must lie wholly inside one mapping; anything else is a MemoryFault."""

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._bufs: list[np.ndarray] = []
        self._table: tuple[np.ndarray, np.ndarray] | None = None  # (bases, ends) as arrays, rebuilt on change

    def map(self, va: int, data: np.ndarray | bytes | int, *, share: bool = False) -> np.ndarray:
        """Map `data` (an array's bytes, bytes, or a zeroed size) at `va`; returns the backing byte array
        (a view the caller may read back). `share=True` maps a contiguous uint8 array itself, no copy: the
        GPU then sees and writes the same pages (the mock KFD's memfd-backed allocations)."""
        if share:
            if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or not data.flags.c_contiguous \
                    or not data.flags.writeable:
                raise ValueError("a shared mapping needs a writable, contiguous uint8 array")
            buf = data.reshape(-1)
        elif isinstance(data, int):
            buf = np.zeros(data, np.uint8)
        elif isinstance(data, bytes | bytearray):
            buf = np.frombuffer(bytes(data), np.uint8).copy()
        else:
            buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8).copy()
        if va < 0 or buf.size == 0:
            raise ValueError(f"cannot map {buf.size} bytes at {va:#x}")
        for base, b in zip(self._bases, self._bufs):
            if va < base + b.size and base < va + buf.size:
                raise ValueError(f"mapping [{va:#x}, {va + buf.size:#x}) overlaps "
                                 f"[{base:#x}, {base + b.size:#x})")
        k = int(np.searchsorted(self._bases, va))
        self._bases.insert(k, va)
        self._bufs.insert(k, buf)
        self._table = None
        return buf

    def unmap(self, va: int) -> None:
        k = self._bases.index(va)
        del self._bases[k], self._bufs[k]
        self._table = None

    def _locate(self, addr: np.ndarray, size: int, what: str) -> tuple[np.ndarray, np.ndarray]:
        """(mapping index, offset) per address, after checking [addr, addr+size) lies inside one mapping."""
        if self._table is None:
            self._table = (np.array(self._bases, np.uint64),
                           np.array([b + buf.size for b, buf in zip(self._bases, self._bufs)], np.uint64))
        bases, ends = self._table
        if len(bases):
            # the whole span of the accesses inside the mapping of the lowest address: one mapping for all
            k = int(np.searchsorted(bases, addr.min(), side="right")) - 1
            if k >= 0 and int(addr.max()) + size <= int(ends[k]):
                return np.full(addr.shape, k, np.int64), (addr - bases[k]).astype(np.int64)
        which = np.searchsorted(bases, addr, side="right").astype(np.int64) - 1
        if not len(bases):
            raise MemoryFault(f"{what} of {size} bytes at {int(addr[0]):#x}: nothing is mapped")
        inside = np.maximum(which, 0)
        ok = (which >= 0) & (addr + np.uint64(size) <= ends[inside])
        if not ok.all():
            bad = int(addr[~ok][0])
            raise MemoryFault(f"{what} of {size} bytes at {bad:#x}: not inside any mapping "
                              f"({self.describe(bad)})")
        return which, (addr - bases[inside]).astype(np.int64)

    def _words(self, k: int, off: np.ndarray, size: int) -> np.ndarray | None:
        """Mapping k viewed as 32-bit words, when every access of `size` bytes at `off` is whole aligned
        words (the common case: one gather per word instead of one per byte); else None."""
        buf = self._bufs[k]
        if size % 4 or buf.size % 4 or (off & 3).any():
            return None
        return buf.view(np.uint32)

    def describe(self, va: int) -> str:
        """Where `va` is relative to the nearest mappings (for fault messages)."""
        k = int(np.searchsorted(self._bases, va, side="right")) - 1
        parts = []
        if k >= 0:
            end = self._bases[k] + self._bufs[k].size
            parts.append(f"{va - end} bytes past the end of [{self._bases[k]:#x}, {end:#x})" if va >= end
                         else f"inside [{self._bases[k]:#x}, {end:#x})")
        if k + 1 < len(self._bases):
            parts.append(f"{self._bases[k + 1] - va} bytes before [{self._bases[k + 1]:#x}, ...)")
        return "; ".join(parts) or "nothing is mapped"

    def load(self, addr: np.ndarray, size: int, what: str = "load") -> np.ndarray:
        """Bytes [addr, addr+size) for each address: uint8[n, size]."""
        addr = np.asarray(addr, np.uint64).reshape(-1)
        out = np.empty((addr.size, size), np.uint8)
        if addr.size == 0:
            return out
        which, off = self._locate(addr, size, what)
        k0 = int(which[0])
        if (which == k0).all():  # one mapping (a buffer): no per-mapping split
            words = self._words(k0, off, size)
            if words is not None:
                got = words[(off >> 2)[:, None] + np.arange(size // 4)]
                return got.view(np.uint8).reshape(addr.size, size)
            return self._bufs[k0][off[:, None] + np.arange(size)]
        span = np.arange(size)
        for k in np.unique(which):
            sel = which == k
            out[sel] = self._bufs[int(k)][off[sel][:, None] + span]
        return out

    def store(self, addr: np.ndarray, data: np.ndarray, what: str = "store") -> None:
        """Write data (uint8[n, size]) to [addr, addr+size) for each address, in lane order."""
        addr = np.asarray(addr, np.uint64).reshape(-1)
        if addr.size == 0:
            return
        size = data.shape[1]
        which, off = self._locate(addr, size, what)
        k0 = int(which[0])
        if (which == k0).all():  # one mapping; later lanes win where addresses repeat, as in the loop below
            words = self._words(k0, off, size)
            if words is not None:
                words[(off >> 2)[:, None] + np.arange(size // 4)] = np.ascontiguousarray(data).view(np.uint32)
            else:
                self._bufs[k0][off[:, None] + np.arange(size)] = data
            return
        span = np.arange(size)
        for k in np.unique(which):
            sel = which == k
            self._bufs[int(k)][off[sel][:, None] + span] = data[sel]

    def read(self, va: int, dtype: Any, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        return self.load(np.array([va], np.uint64), dt.itemsize * count)[0].view(dt).copy()


# ---------------------------------------------------------------------- program and state
class Program:
    """A loaded kernel: the code image (as the loader laid it out), the kernel's entry offset in it, and its
    descriptor. Instructions are decoded from the image on first execution and cached by pc."""

    def __init__(self, image: bytes, entry: int, kd: KernelDescriptor, name: str = "kernel") -> None:
        self.image, self.entry, self.kd, self.name = bytes(image), entry, kd, name
        self._cache: dict[int, Instr] = {}

    @staticmethod
    def from_code_object(co: AMDCodeObject) -> Program:
        """The kernel of a code object as rawgrad's loader (compiler/amdgpu_code.py) laid it out."""
        return Program(co.image, co.entry_offset, co.descriptor, co.name)

    def at(self, pc: int) -> Instr:
        ins = self._cache.get(pc)
        if ins is None:
            try:
                ins = decode(self.image, pc)
            except DecodeError as e:
                raise RDNA3Fault(f"{self.name}: illegal instruction at pc {pc - self.entry:#x}: {e}") from e
            self._cache[pc] = ins
        return ins


@dataclass
class RunStats:
    """What a launch did: steps (one instruction for a set of waves), waves run, steps by mnemonic."""

    steps: int = 0
    waves: int = 0
    executed: dict[str, int] | None = None


RUNNING, PARKED, ENDED = 0, 1, 2
_LANES = np.arange(WAVE, dtype=np.uint32)


VMCNT, LGKMCNT = "vmcnt", "lgkmcnt"
# s_waitcnt simm16 fields on gfx11 (checked against LLVM's encodings of vmcnt(N) / lgkmcnt(N) in the corpus)
WAITCNT_VM_SHIFT, WAITCNT_LGKM_SHIFT, WAITCNT_COUNT_MASK = 10, 4, 0x3F

# one deferred register write of a load, for the k waves that issued it: ("v", reg, lanes bool[k, 32],
# uint32[k, 32]) replaces those lanes, ("v_lo16"/"v_hi16", ...) replaces one half of them, ("s", reg, None,
# uint32[k]) an SGPR
_Write = tuple[str, int, Any, Any]


@dataclass
class _Load:
    """A load in flight: the waves that issued it together, which of them it has not completed for yet
    (an s_waitcnt completes it wave by wave), and the register writes it will make."""

    pc: int
    waves: np.ndarray
    pending: np.ndarray
    writes: list[_Write]


class _State:
    def __init__(self, prog: Program, memory: MemoryMap, nwaves: int, nvgprs: int, ngroups: int) -> None:
        self.prog, self.memory = prog, memory
        self.s = np.zeros((nwaves, SGPR_FILE), np.uint32)
        self.v = np.zeros((nvgprs, nwaves, WAVE), np.uint32)
        self.scc = np.zeros(nwaves, np.uint32)
        self.pc = np.full(nwaves, prog.entry, np.int64)
        self.status = np.full(nwaves, RUNNING, np.int8)
        self.group = np.zeros(nwaves, np.int64)  # workgroup of each wave, as an index into lds
        self.wave_in_group = np.zeros(nwaves, np.int64)
        lds_bytes = max(prog.kd.group_segment_fixed_size, 1)
        self.lds = np.zeros((ngroups, lds_bytes), np.uint8)
        self.lds_size = prog.kd.group_segment_fixed_size
        # the race detector's record of the current barrier epoch, per LDS byte: the wave (in its group) that
        # wrote it (-1: none) and a bit per wave that read it; a group has at most 1024 / 32 = 32 waves
        self.lds_writer = np.full((ngroups, lds_bytes), -1, np.int8)
        self.lds_readers = np.zeros((ngroups, lds_bytes), np.uint32)
        # loads in flight (see _defer): per counter, the loads in issue order (each for all the waves that
        # issued it together); per register, how many loads in flight write it and the pc of the latest
        self.in_flight: dict[str, list[_Load]] = {VMCNT: [], LGKMCNT: []}
        self.in_flight_count = {VMCNT: np.zeros(nwaves, np.int32), LGKMCNT: np.zeros(nwaves, np.int32)}
        self.v_pending = np.zeros((nvgprs, nwaves), np.int32)
        self.v_pending_pc = np.zeros((nvgprs, nwaves), np.int64)
        self.s_pending = np.zeros((nwaves, SGPR_FILE), np.int32)
        self.s_pending_pc = np.zeros((nwaves, SGPR_FILE), np.int64)
        # per register: the sum of its pending counts over the waves, so most checks need no array work
        self.v_pend_total = [0] * nvgprs
        self.s_pend_total = [0] * SGPR_FILE
        self.dn32, self.dn16 = denorm_modes(prog.kd)
        # the wave set of a step where every wave of the batch is at the same pc (the common case): code that
        # indexes registers by it uses a slice, a view, instead of gathering and scattering rows (see _ix)
        self.all_waves = np.arange(nwaves)
        self.every_lane: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def vread(self, reg: int, w: np.ndarray, lanes: Any = slice(None)) -> np.ndarray:
        """VGPR reg of waves w (optionally selected lanes), after checking no load in flight writes it."""
        _check_pending(self, "v", reg, w, "reads")
        return self.v[reg][w, lanes] if not isinstance(lanes, slice) else self.v[reg][_ix(self, w)]

    def exec_mask(self, w: np.ndarray) -> np.ndarray:
        """bool[k, 32]: the lanes EXEC enables in each selected wave."""
        return ((self.s[_ix(self, w), EXEC_LO][:, None] >> _LANES) & 1).astype(bool)

    def mask_of(self, reg: int, w: np.ndarray) -> np.ndarray:
        return ((self.s[_ix(self, w), reg][:, None] >> _LANES) & 1).astype(bool)


def _ix(st: _State, w: np.ndarray) -> Any:
    """How to index the wave axis for waves w: a slice when w is every wave of the batch, else w itself."""
    return slice(None) if w is st.all_waves else w


def _pack_mask(bits: np.ndarray) -> np.ndarray:
    """bool[k, 32] -> uint32[k] with lane i in bit i."""
    return (bits.astype(np.uint32) << _LANES).sum(axis=1, dtype=np.uint64).astype(np.uint32)


# ---------------------------------------------------------------------- loads in flight
# Loads complete when the program waits for them: a load's register writes are queued and made when an
# s_waitcnt brings its counter (vmcnt for global loads, lgkmcnt for scalar and LDS loads) down past it, as
# on hardware, where a register read before that wait sees the old value. The queues complete in issue order
# (true for vmcnt loads and for LDS; LLVM waits lgkmcnt(0) whenever scalar loads, which may return out of
# order, are in flight). Reading or writing a register that a load in flight will write is reported as a
# missing s_waitcnt instead of computing with the stale value.
def _check_pending(st: _State, kind: str, reg: int, w: np.ndarray, what: str, n: int = 1) -> None:
    if not any((st.v_pend_total if kind == "v" else st.s_pend_total)[reg:reg + n]):
        return  # no load in flight writes these registers in any wave (the common case, checked cheaply)
    ix = _ix(st, w)
    pend = st.v_pending[reg:reg + n][:, ix] if kind == "v" else st.s_pending[ix, reg:reg + n].T
    if pend.any():
        r, k = (int(x) for x in np.argwhere(pend)[0])
        wave = int(w[k])
        pc = int(st.v_pending_pc[reg + r, wave] if kind == "v" else st.s_pending_pc[wave, reg + r])
        raise RDNA3Fault(f"{what} {kind}{reg + r} while {st.prog.at(pc).name} at pc {pc - st.prog.entry:#x}, "
                         f"which loads it, is still in flight: a missing s_waitcnt (wave {wave})")


def _defer(st: _State, ins: Instr, counter: str, w: np.ndarray, writes: list[_Write]) -> None:
    """Queue a load's writes for waves w (each write's values have a row per wave of w)."""
    st.in_flight[counter].append(_Load(ins.pc, w, np.ones(len(w), bool), writes))
    st.in_flight_count[counter][w] += 1
    for kind, reg, _, _ in writes:
        if kind == "s":
            st.s_pending[w, reg] += 1
            st.s_pending_pc[w, reg] = ins.pc
            st.s_pend_total[reg] += len(w)
        else:
            st.v_pending[reg, w] += 1
            st.v_pending_pc[reg, w] = ins.pc
            st.v_pend_total[reg] += len(w)


def _complete(st: _State, counter: str, w: np.ndarray, keep: int) -> None:
    """Make the writes of the oldest loads of each wave of w until at most `keep` remain in flight."""
    count = st.in_flight_count[counter]
    if not (count[w] > keep).any():
        return
    loads = st.in_flight[counter]
    chosen = np.zeros(len(count), bool)
    chosen[w] = True
    newer = np.zeros(len(count), np.int32)  # per wave: its pending loads seen so far, newest first
    done: list[tuple[_Load, np.ndarray]] = []
    for load in reversed(loads):
        mine = load.pending & chosen[load.waves]
        if not mine.any():
            continue
        newer[load.waves[mine]] += 1
        finish = mine & (newer[load.waves] > keep)
        if finish.any():
            done.append((load, finish))
    for load, finish in reversed(done):  # oldest first: two loads may write one register
        whole = load.waves is st.all_waves and bool(finish.all())
        sub: Any = slice(None) if whole else load.waves[finish]
        nsub = len(load.waves) if whole else len(sub)
        for kind, reg, lanes, vals in load.writes:
            if kind == "s":
                st.s[sub, reg] = vals if whole else vals[finish]
                st.s_pending[sub, reg] -= 1
                st.s_pend_total[reg] -= nsub
                continue
            cur = st.v[reg][sub]
            new = vals if whole else vals[finish]
            if kind == "v_lo16":
                new = (cur & np.uint32(0xFFFF0000)) | new
            elif kind == "v_hi16":
                new = (cur & np.uint32(0xFFFF)) | (new << np.uint32(16))
            st.v[reg][sub] = np.where(lanes if whole else lanes[finish], new, cur)
            st.v_pending[reg, sub] -= 1
            st.v_pend_total[reg] -= nsub
        load.pending &= ~finish
        count[sub] -= 1
    st.in_flight[counter] = [load for load in loads if load.pending.any()]


def _defer_lanes(st: _State, ins: Instr, counter: str, w: np.ndarray, sel: tuple[np.ndarray, ...],
                 regs: list[tuple[str, int, np.ndarray]]) -> None:
    """Queue per-lane VGPR writes: regs holds (kind, reg, values for the selected (wave, lane) pairs)."""
    every = len(sel[0]) == len(w) * WAVE  # all lanes on: the values are already (wave, lane) ordered
    lanes = np.ones((len(w), WAVE), bool) if every else np.zeros((len(w), WAVE), bool)
    if not every:
        lanes[sel] = True
    writes: list[_Write] = []
    for kind, reg, vals in regs:
        if every:
            full = np.asarray(vals, np.uint32).reshape(len(w), WAVE)
        else:
            full = np.zeros((len(w), WAVE), np.uint32)
            full[sel] = vals
        writes.append((kind, reg, lanes, full))
    _defer(st, ins, counter, w, writes)


# ---------------------------------------------------------------------- float helpers
_FLOAT_TYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64}
_INT_TYPES = {"u32": np.uint32, "i32": np.int32, "b32": np.uint32, "u16": np.uint16, "i16": np.int16,
              "u64": np.uint64, "i64": np.int64, "b64": np.uint64, "u8": np.uint8}
_WIDTH = {"f32": 32, "f16": 16, "f64": 64, "u32": 32, "i32": 32, "b32": 32, "u16": 16, "i16": 16, "u64": 64,
          "i64": 64, "b64": 64}


def _flush(x: np.ndarray, mode: int, inputs: bool) -> np.ndarray:
    """Flush subnormals to signed zero when the denorm mode says so for inputs (or results)."""
    if mode == DENORM_KEEP or mode == (DENORM_FLUSH_OUT if inputs else DENORM_FLUSH_IN):
        return x
    tiny = np.finfo(x.dtype).tiny
    return np.where((np.abs(x) < tiny) & (x != 0), np.copysign(np.zeros_like(x), x), x)


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s, e) with s = a + b rounded and s + e == a + b exactly (Knuth's TwoSum; finite inputs)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _round_odd_fix(s: np.ndarray, err: np.ndarray) -> np.ndarray:
    """s + err (s the rounded sum, err its exact error) rounded to odd: where the sum was inexact and s is
    even, step s one ulp toward err. The direction is err's sign, not s + err (which rounds back to s
    whenever |err| is below half an ulp of s)."""
    bits = np.ascontiguousarray(s).view(np.int64)
    fix = ((bits & 1) == 0) & (err != 0) & np.isfinite(s)
    if not fix.any():
        return s
    # one ulp away from zero where s and err share a sign, toward zero otherwise (s is never 0 here: a sum
    # that rounds to 0 is exact); on the bit pattern, that is +1 or -1
    step = np.where(np.signbit(s) == np.signbit(err), 1, -1) * fix
    return (bits + step).view(np.float64)


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray, out: Any = np.float32) -> np.ndarray:
    """Fused multiply-add rounded once to float32 (or float16): the product of two such floats is exact in
    float64; the sum is computed in float64 rounded to odd (its exact error decides the last bit), which makes
    the final rounding correct (round-to-odd with >= 2 extra bits, Boldo & Melquiond)."""
    p = a.astype(np.float64) * b.astype(np.float64)
    # two scalar (SGPR or constant) factors and a per-lane addend: the result has the lanes' shape
    shape = np.broadcast_shapes(p.shape, np.shape(c))
    p = np.broadcast_to(p, shape)
    c64 = np.broadcast_to(c.astype(np.float64), shape)
    with np.errstate(invalid="ignore", over="ignore"):
        s, err = _two_sum(p, c64)
        return _round_odd_fix(s, err).astype(out)


def _fmax(a: Any, b: Any) -> np.ndarray:
    """IEEE maxNum as v_max_f32 computes it: a NaN operand yields the other one; +0 > -0."""
    pick_a = (a > b) | np.isnan(b) | ((a == b) & ~np.signbit(a))
    return np.where(pick_a, a, b)


def _fmin(a: Any, b: Any) -> np.ndarray:
    pick_a = (a < b) | np.isnan(b) | ((a == b) & np.signbit(a))
    return np.where(pick_a, a, b)


@dataclass(frozen=True)
class _FloatFormat:
    """Per-width constants of the divide helpers (RDNA3 ISA pseudocode of V_DIV_SCALE/FMAS/FIXUP_F32/F64)."""

    dtype: Any
    bits: Any  # the unsigned type of the same width
    mant: int  # stored mantissa bits
    bias: int  # exponent bias
    scale: int  # div_scale / div_fmas scale exponent: 64 for f32, 128 for f64
    big_gap: int  # exponent(N) - exponent(D) at which the quotient nears the largest finite value
    tiny_num: int  # exponent(N) at or below which the numerator is scaled up


_F32_FMT = _FloatFormat(np.float32, np.uint32, 23, 127, 64, 96, 23)
_F64_FMT = _FloatFormat(np.float64, np.uint64, 52, 1023, 128, 768, 53)


def _exponent(x: np.ndarray, fmt: _FloatFormat = _F32_FMT) -> np.ndarray:
    """The biased exponent field (the ISA pseudocode's exponent())."""
    b = np.ascontiguousarray(np.asarray(x, fmt.dtype)).view(fmt.bits)
    return ((b >> fmt.bits(fmt.mant)) & fmt.bits(2 * fmt.bias + 1)).astype(np.int64)


def _exponent32(x: np.ndarray) -> np.ndarray:
    return _exponent(x, _F32_FMT)


def _cvt_f2i(x: np.ndarray, lo: float, hi: float, dtype: Any) -> np.ndarray:
    """float -> integer truncating toward zero, saturating at the type's range; NaN -> 0 (v_cvt_*_f32)."""
    with np.errstate(invalid="ignore"):
        t = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
        return np.clip(t, lo, hi).astype(dtype)


def _div_scale(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray,
               fmt: _FloatFormat = _F32_FMT) -> tuple[np.ndarray, np.ndarray]:
    """V_DIV_SCALE_F32/F64 (RDNA3 ISA pseudocode): s0 is the value to scale (numerator or denominator), s1
    the denominator, s2 the numerator; returns (D, VCC bit)."""
    dt = fmt.dtype
    d = s0.astype(dt).copy()
    tiny = np.finfo(dt).tiny
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        inv = (1.0 / s1.astype(np.float64)).astype(dt) if dt is np.float32 else 1.0 / s1
        q = (s2 / s1).astype(dt)
    e1, e2 = _exponent(s1, fmt), _exponent(s2, fmt)
    zero = (s2 == 0) | (s1 == 0)
    big = ~zero & (e2 - e1 >= fmt.big_gap)
    s1_den = ~zero & ~big & (np.abs(s1) < tiny)
    rest = ~zero & ~big & ~s1_den
    inv_den = np.abs(inv) < tiny
    q_den = (np.abs(q) < tiny) & (q != 0)
    c4 = rest & inv_den & q_den
    c5 = rest & ~c4 & inv_den
    c6 = rest & ~inv_den & q_den
    c7 = rest & ~inv_den & ~q_den & (e2 <= fmt.tiny_num)
    with np.errstate(over="ignore", under="ignore"):
        up = np.ldexp(s0.astype(dt), fmt.scale).astype(dt)
        down = np.ldexp(s0.astype(dt), -fmt.scale).astype(dt)
    d = np.where(zero, dt(np.nan), d)
    d = np.where((big | c4) & (s0 == s1), up, d)
    d = np.where(s1_den | c7, up, d)
    d = np.where(c5, down, d)
    d = np.where(c6 & (s0 == s2), up, d)
    return d.astype(dt), big | c4 | c6


def _div_fmas_scale(r: np.ndarray, s2: np.ndarray, vcc: np.ndarray, fmt: _FloatFormat) -> np.ndarray:
    """V_DIV_FMAS: where VCC is set, scale the fma result by 2^scale if exponent(S2) > bias, else 2^-scale
    (the ISA manual's pseudocode as corrected in tinygrad's emulator; it undoes div_scale's scaling)."""
    up = _exponent(s2, fmt) > fmt.bias
    with np.errstate(over="ignore", under="ignore"):
        scaled = np.where(up, np.ldexp(r, fmt.scale), np.ldexp(r, -fmt.scale)).astype(fmt.dtype)
    return np.where(vcc, scaled, r)


def _div_fixup(s0: np.ndarray, s1: np.ndarray, s2: np.ndarray, fmt: _FloatFormat = _F32_FMT) -> np.ndarray:
    """V_DIV_FIXUP_F32/F64: s0 the quotient, s1 the denominator, s2 the numerator; the ISA special cases."""
    dt = fmt.dtype
    sign = np.signbit(s1) ^ np.signbit(s2)
    inf = np.where(sign, dt(-np.inf), dt(np.inf))
    zero = np.where(sign, dt(-0.0), dt(0.0))
    mag = np.abs(s0)
    d = np.where(np.isnan(s0), inf, np.where(sign, -mag, mag)).astype(dt)
    e1, e2 = _exponent(s1, fmt), _exponent(s2, fmt)
    underflow = -(fmt.bias + fmt.mant)  # exponent gap below which the quotient rounds to zero
    d = np.where(~np.isnan(s1) & ~np.isnan(s2) & (e2 - e1 < underflow) & (s2 != 0) & ~np.isinf(s1), zero, d)
    d = np.where(np.isinf(s1) & ~np.isinf(s2) | (s2 == 0) & (s1 != 0), zero, d)
    d = np.where((s1 == 0) & (s2 != 0) | np.isinf(s2) & ~np.isinf(s1), inf, d)
    d = np.where((s1 == 0) & (s2 == 0) | np.isinf(s1) & np.isinf(s2), dt(np.nan), d)
    d = np.where(np.isnan(s1), s1, d)
    d = np.where(np.isnan(s2), s2, d)
    return d.astype(dt)


def _cmp_class(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """V_CMP_CLASS_F16/F32/F64: is x in one of the classes set in mask (bit 0 signaling NaN, 1 quiet NaN,
    2 -inf, 3 -normal, 4 -subnormal, 5 -0, 6 +0, 7 +subnormal, 8 +normal, 9 +inf)."""
    fi = np.finfo(x.dtype)
    ubits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize]
    bits = np.ascontiguousarray(x).view(ubits)
    nan = np.isnan(x)
    quiet = (bits >> ubits(fi.nmant - 1)) & ubits(1)  # the top mantissa bit marks a quiet NaN
    neg = np.signbit(x)
    sub = (np.abs(x) < fi.tiny) & (x != 0)
    normal = np.isfinite(x) & ~sub & (x != 0)
    cls = np.select([nan & (quiet == 0), nan, np.isinf(x) & neg, normal & neg, sub & neg, (x == 0) & neg,
                     x == 0, sub, normal, np.isinf(x)], list(range(10)), 0).astype(np.uint32)
    return ((mask.astype(np.uint32) >> cls) & np.uint32(1)).astype(bool)


# _fma64's fast path needs Dekker's product error and the sums below to be exact: no factor big enough for
# the Veltkamp split to overflow, no product or sum near the subnormal range or near overflow
_FMA64_BIG, _FMA64_TINY = 2.0**990, 2.0**-960


def _fma64(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Fused multiply-add rounded once to float64 (Boldo & Melquiond, "Emulation of FMA and correctly rounded
    sums: proved algorithms using rounding to odd", IEEE TC 2008): a*b = uh + ul exactly (Dekker), c + uh =
    th + tl exactly (TwoSum), v = tl + ul rounded to odd, result = th + v rounded to nearest. Inputs outside
    the range where those steps are exact (see _FMA64_BIG/_TINY) and non-finite ones take the exact sum as a
    Fraction (CPython rounds int / int correctly)."""
    a, b, c = (np.asarray(v, np.float64) for v in np.broadcast_arrays(a, b, c))
    with np.errstate(all="ignore"):
        uh = a * b
        split = 134217729.0  # 2^27 + 1: Veltkamp split of a double into two 26-bit halves
        ah = a * split - (a * split - a)
        bh = b * split - (b * split - b)
        al, bl = a - ah, b - bh
        ul = ((ah * bh - uh) + ah * bl + al * bh) + al * bl
        th, tl = _two_sum(c, uh)
        v = _round_odd_fix(*_two_sum(tl, ul))
        out = np.where(v == 0, th, th + v)  # th + 0 would turn a -0 sum into +0
        mag_uh, mag_th = np.abs(uh), np.abs(th)
        slow = ~(np.isfinite(a) & np.isfinite(b) & np.isfinite(c)) | (np.abs(a) >= _FMA64_BIG) \
            | (np.abs(b) >= _FMA64_BIG) | ((mag_uh < _FMA64_TINY) & (a != 0) & (b != 0)) \
            | ~(mag_uh < _FMA64_BIG) | ~(mag_th < _FMA64_BIG)
    for idx in zip(*np.nonzero(slow)):
        x, y, z = float(a[idx]), float(b[idx]), float(c[idx])
        if not (np.isfinite(x) and np.isfinite(y)):
            out[idx] = x * y + z  # an infinite or NaN product: IEEE arithmetic on it is exact
            continue
        if not np.isfinite(z):
            out[idx] = z  # a finite product (exact, never rounded to inf) plus inf or NaN
            continue
        exact = Fraction(x) * Fraction(y) + Fraction(z)
        try:
            out[idx] = float(exact) if exact != 0 else x * y + z
        except OverflowError:
            out[idx] = np.inf if exact > 0 else -np.inf
    return out


def _popcount32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.uint32)
    x = x - ((x >> np.uint32(1)) & np.uint32(0x55555555))
    x = (x & np.uint32(0x33333333)) + ((x >> np.uint32(2)) & np.uint32(0x33333333))
    x = (x + (x >> np.uint32(4))) & np.uint32(0x0F0F0F0F)
    return (x * np.uint32(0x01010101)) >> np.uint32(24)


def _i24(x: np.ndarray) -> np.ndarray:
    """The low 24 bits of x as a signed integer (int64), as the *_i24 multiplies read their sources."""
    low = (np.asarray(x, np.uint32) & np.uint32(0xFFFFFF)).astype(np.int64)
    return np.where(low >= 1 << 23, low - (1 << 24), low)


def _bfe_signed(a: np.ndarray, off: np.ndarray, width: np.ndarray) -> np.ndarray:
    """V_BFE_I32: bits [off, off + width) of a, sign-extended from bit width - 1; width 0 gives 0."""
    field = (a.astype(np.uint64) >> off.astype(np.uint64)) & ((np.uint64(1) << width.astype(np.uint64))
                                                              - np.uint64(1))
    sign = np.where(width > 0, (field >> (np.maximum(width, 1) - 1).astype(np.uint64)) & np.uint64(1), 0)
    val = field.astype(np.int64) - (sign.astype(np.int64) << width.astype(np.int64))
    return val.astype(np.int32)


def _bitrev32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.uint32)
    for shift, mask in ((1, 0x55555555), (2, 0x33333333), (4, 0x0F0F0F0F), (8, 0x00FF00FF)):
        m, sh = np.uint32(mask), np.uint32(shift)
        x = ((x >> sh) & m) | ((x & m) << sh)
    return (x >> np.uint32(16)) | (x << np.uint32(16))


def _clz32(x: np.ndarray) -> np.ndarray:
    """Leading zero bits of each uint32 (32 for 0)."""
    x = np.asarray(x, np.uint32)
    n = np.zeros(x.shape, np.int32)
    for shift in (16, 8, 4, 2, 1):  # binary search for the highest set bit
        top = x >> np.uint32(32 - shift) == 0
        n = np.where(top, n + shift, n)
        x = np.where(top, x << np.uint32(shift), x)
    return np.where(x == 0, 32, n)  # the loop leaves n = 31 for 0; 0 has 32 leading zeros


def _find_first(count: np.ndarray, none: np.ndarray) -> np.ndarray:
    """The ISA's V_CLZ/V_CTZ/V_CLS result: the bit count, or -1 (all ones) where `none` (no bit found)."""
    return np.where(none, -1, count).astype(np.int32).view(np.uint32)


def _clz_i32_u32(x: np.ndarray) -> np.ndarray:
    """V_CLZ_I32_U32 / S_CLZ_I32_U32: leading zeros counted from bit 31; -1 when no bit is set."""
    x = np.asarray(x, np.uint32)
    return _find_first(_clz32(x), x == 0)


def _ctz_i32_b32(x: np.ndarray) -> np.ndarray:
    """V_CTZ_I32_B32 / S_CTZ_I32_B32: trailing zeros counted from bit 0; -1 when no bit is set."""
    x = np.asarray(x, np.uint32)
    low = x & (~x + np.uint32(1))  # the lowest set bit alone
    return _find_first(31 - _clz32(low), x == 0)


def _cls_i32(x: np.ndarray) -> np.ndarray:
    """V_CLS_I32 / S_CLS_I32: the index i (1..31), counted from bit 31, of the first bit that differs from
    the sign bit, i.e. how many leading bits equal the sign bit; -1 when all 32 bits are equal (0, -1)."""
    x = np.asarray(x, np.uint32)
    flipped = np.where(x >> np.uint32(31) != 0, ~x, x)  # the sign bit's copies become leading zeros
    return _find_first(_clz32(flipped), (x == 0) | (x == np.uint32(0xFFFFFFFF)))


def _perm_b32(s0: np.ndarray, s1: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """V_PERM_B32: each result byte picked by the matching byte of S2 from the 8 bytes {S0, S1} (S1 is bytes
    0-3, S0 bytes 4-7): selector 0-7 a byte, 8-11 the sign of byte 1/3/5/7 spread to 8 bits, 12 zero,
    13 and above 0xff (RDNA3 ISA, V_PERM_B32 / BYTE_PERMUTE)."""
    s0, s1, sel = np.broadcast_arrays(np.asarray(s0, np.uint32), np.asarray(s1, np.uint32),
                                      np.asarray(sel, np.uint32))
    data = (s0.astype(np.uint64) << np.uint64(32)) | s1.astype(np.uint64)
    out = np.zeros(s0.shape, np.uint32)
    for k in range(4):
        b = (sel >> np.uint32(8 * k)) & np.uint32(0xFF)
        shift = np.minimum(b, 7).astype(np.uint64) * np.uint64(8)
        pick = ((data >> shift) & np.uint64(0xFF)).astype(np.uint32)
        # selectors 8..11 read the top bit of bytes 1, 3, 5, 7
        sign_byte = 2 * (np.clip(b, 8, 11).astype(np.uint64) - np.uint64(8)) + np.uint64(1)
        sign = ((data >> (sign_byte * np.uint64(8) + np.uint64(7))) & np.uint64(1)).astype(np.uint32)
        byte = np.where(b < 8, pick, np.where(b < 12, sign * np.uint32(0xFF),
                                              np.where(b == 12, np.uint32(0), np.uint32(0xFF))))
        out |= byte << np.uint32(8 * k)
    return out


# ---------------------------------------------------------------------- VALU semantics
@dataclass(frozen=True)
class _VOp:
    """A lane-wise VALU operation: D (type dst) = fn(sources of types srcs). `acc`: the destination is also
    the last input (v_fmac). `vcc_in`: the op also reads a lane mask (cndmask's selector, fmas' VCC)."""

    dst: str
    srcs: tuple[str, ...]
    fn: Callable[..., Any]
    acc: bool = False


def _f(fn: Callable[..., Any], n: int = 2, t: str = "f32", **kw: Any) -> _VOp:
    return _VOp(t, (t,) * n, fn, **kw)


def _u(fn: Callable[..., Any], n: int = 2, t: str = "u32") -> _VOp:
    return _VOp(t, (t,) * n, fn)


def _sh(x: Any, bits: int = 5) -> Any:
    return x & np.uint32((1 << bits) - 1)


_F32 = np.float32
_VALU: dict[str, _VOp] = {
    "v_mov_b32": _u(lambda a: a, 1, "b32"),
    "v_add_f32": _f(lambda a, b: a + b),
    "v_sub_f32": _f(lambda a, b: a - b),
    "v_subrev_f32": _f(lambda a, b: b - a),
    "v_mul_f32": _f(lambda a, b: a * b),
    "v_max_f32": _f(_fmax),
    "v_min_f32": _f(_fmin),
    "v_fma_f32": _f(_fma32, 3),
    "v_fmac_f32": _f(_fma32, 3, acc=True),
    "v_fmaak_f32": _f(_fma32, 3),  # D = S0 * S1 + K: the literal is the third source
    "v_fmamk_f32": _f(lambda a, k, b: _fma32(a, k, b), 3),  # D = S0 * K + S1
    "v_floor_f32": _f(np.floor, 1),
    "v_trunc_f32": _f(np.trunc, 1),
    "v_ceil_f32": _f(np.ceil, 1),
    "v_rndne_f32": _f(np.rint, 1),
    "v_sqrt_f32": _f(np.sqrt, 1),
    "v_exp_f32": _f(lambda a: np.exp2(a.astype(np.float64)).astype(_F32), 1),
    "v_log_f32": _f(lambda a: np.log2(a.astype(np.float64)).astype(_F32), 1),
    "v_rcp_f32": _f(lambda a: (1.0 / a.astype(np.float64)).astype(_F32), 1),
    "v_rcp_iflag_f32": _f(lambda a: (1.0 / a.astype(np.float64)).astype(_F32), 1),
    "v_rsq_f32": _f(lambda a: (1.0 / np.sqrt(a.astype(np.float64))).astype(_F32), 1),
    "v_ldexp_f32": _VOp("f32", ("f32", "i32"), lambda a, e: np.ldexp(a, np.clip(e, -400, 400)).astype(_F32)),
    "v_div_fmas_f32": _f(lambda a, b, c: _fma32(a, b, c), 3),  # the VCC scaling is applied in _valu
    "v_div_fixup_f32": _f(_div_fixup, 3),
    "v_add_f64": _f(lambda a, b: a + b, 2, "f64"),
    "v_mul_f64": _f(lambda a, b: a * b, 2, "f64"),
    "v_fma_f64": _f(_fma64, 3, "f64"),
    "v_max_f64": _f(_fmax, 2, "f64"),
    "v_min_f64": _f(_fmin, 2, "f64"),
    "v_floor_f64": _f(np.floor, 1, "f64"),
    "v_ceil_f64": _f(np.ceil, 1, "f64"),
    "v_trunc_f64": _f(np.trunc, 1, "f64"),
    "v_rndne_f64": _f(np.rint, 1, "f64"),
    "v_sqrt_f64": _f(np.sqrt, 1, "f64"),
    "v_rcp_f64": _f(lambda a: 1.0 / a, 1, "f64"),
    "v_rsq_f64": _f(lambda a: 1.0 / np.sqrt(a), 1, "f64"),
    "v_ldexp_f64": _VOp("f64", ("f64", "i32"), lambda a, e: np.ldexp(a, np.clip(e, -2200, 2200))),
    "v_div_fmas_f64": _f(_fma64, 3, "f64"),  # the VCC scaling is applied in _valu
    "v_div_fixup_f64": _f(lambda a, b, c: _div_fixup(a, b, c, _F64_FMT), 3, "f64"),
    "v_cvt_f32_f64": _VOp("f32", ("f64",), lambda a: a.astype(_F32)),
    "v_cvt_f64_f32": _VOp("f64", ("f32",), lambda a: a.astype(np.float64)),
    "v_cvt_f64_i32": _VOp("f64", ("i32",), lambda a: a.astype(np.float64)),
    "v_cvt_f64_u32": _VOp("f64", ("u32",), lambda a: a.astype(np.float64)),
    "v_cvt_i32_f64": _VOp("i32", ("f64",), lambda a: _cvt_f2i(a, -2.0**31, 2.0**31 - 1, np.int32)),
    "v_cvt_u32_f64": _VOp("u32", ("f64",), lambda a: _cvt_f2i(a, 0.0, 2.0**32 - 1, np.uint32)),
    "v_add_f16": _f(lambda a, b: a + b, 2, "f16"),
    "v_sub_f16": _f(lambda a, b: a - b, 2, "f16"),
    "v_mul_f16": _f(lambda a, b: a * b, 2, "f16"),
    "v_max_f16": _f(_fmax, 2, "f16"),
    "v_min_f16": _f(_fmin, 2, "f16"),
    "v_mov_b16": _VOp("u16", ("u16",), lambda a: a),
    "v_cvt_f16_f32": _VOp("f16", ("f32",), lambda a: a.astype(np.float16)),
    "v_cvt_f32_f16": _VOp("f32", ("f16",), lambda a: a.astype(_F32)),
    "v_cvt_f32_i32": _VOp("f32", ("i32",), lambda a: a.astype(_F32)),
    "v_cvt_f32_u32": _VOp("f32", ("u32",), lambda a: a.astype(_F32)),
    "v_cvt_f32_ubyte0": _VOp("f32", ("u32",), lambda a: (a & np.uint32(0xFF)).astype(_F32)),
    "v_cvt_i32_f32": _VOp("i32", ("f32",), lambda a: _cvt_f2i(a, -2.0**31, 2.0**31 - 1, np.int32)),
    "v_cvt_u32_f32": _VOp("u32", ("f32",), lambda a: _cvt_f2i(a, 0.0, 2.0**32 - 1, np.uint32)),
    "v_add_nc_u32": _u(lambda a, b: a + b),
    "v_sub_nc_u32": _u(lambda a, b: a - b),
    "v_subrev_nc_u32": _u(lambda a, b: b - a),
    "v_add3_u32": _u(lambda a, b, c: a + b + c, 3),
    "v_mul_lo_u32": _u(lambda a, b: a * b),
    "v_mul_hi_u32": _u(lambda a, b: ((a.astype(np.uint64) * b.astype(np.uint64)) >> np.uint64(32))
                       .astype(np.uint32)),
    "v_mul_u32_u24": _u(lambda a, b: (a & np.uint32(0xFFFFFF)) * (b & np.uint32(0xFFFFFF))),
    # D = u24(S0) * u24(S1) + S2, the low 32 bits (RDNA3 ISA, V_MAD_U32_U24)
    "v_mad_u32_u24": _u(lambda a, b, c: (a & np.uint32(0xFFFFFF)) * (b & np.uint32(0xFFFFFF)) + c, 3),
    "v_and_b32": _u(lambda a, b: a & b, 2, "b32"),
    "v_or_b32": _u(lambda a, b: a | b, 2, "b32"),
    "v_xor_b32": _u(lambda a, b: a ^ b, 2, "b32"),
    "v_not_b32": _u(lambda a: ~a, 1, "b32"),
    "v_or3_b32": _u(lambda a, b, c: a | b | c, 3, "b32"),
    "v_and_or_b32": _u(lambda a, b, c: (a & b) | c, 3, "b32"),
    "v_lshlrev_b32": _u(lambda a, b: b << _sh(a), 2, "b32"),  # *rev: the shift amount is the first source
    "v_lshrrev_b32": _u(lambda a, b: b >> _sh(a), 2, "b32"),
    "v_ashrrev_i32": _VOp("i32", ("u32", "i32"), lambda a, b: b >> _sh(a).astype(np.int32)),
    "v_lshl_or_b32": _u(lambda a, b, c: (a << _sh(b)) | c, 3, "b32"),
    "v_lshl_add_u32": _u(lambda a, b, c: (a << _sh(b)) + c, 3),
    "v_add_lshl_u32": _u(lambda a, b, c: (a + b) << _sh(c), 3),
    "v_bfe_u32": _u(lambda a, b, c: (a >> _sh(b)) & ((np.uint32(1) << _sh(c)) - np.uint32(1)), 3),
    "v_bfe_i32": _VOp("i32", ("u32", "u32", "u32"), lambda a, b, c: _bfe_signed(a, _sh(b), _sh(c))),
    "v_mul_i32_i24": _VOp("i32", ("u32", "u32"), lambda a, b: (_i24(a) * _i24(b)).astype(np.int32)),
    "v_mul_hi_i32_i24": _VOp("i32", ("u32", "u32"),
                             lambda a, b: ((_i24(a) * _i24(b)) >> 32).astype(np.int32)),
    "v_mul_hi_u32_u24": _u(lambda a, b: (((a & np.uint32(0xFFFFFF)).astype(np.uint64)
                                          * (b & np.uint32(0xFFFFFF))) >> np.uint64(32)).astype(np.uint32)),
    "v_add_nc_u16": _u(lambda a, b: a + b, 2, "u16"),
    "v_sub_nc_u16": _u(lambda a, b: a - b, 2, "u16"),
    "v_mul_lo_u16": _u(lambda a, b: a * b, 2, "u16"),
    "v_mad_u16": _u(lambda a, b, c: a * b + c, 3, "u16"),
    "v_and_b16": _u(lambda a, b: a & b, 2, "u16"),
    "v_or_b16": _u(lambda a, b: a | b, 2, "u16"),
    "v_xor_b16": _u(lambda a, b: a ^ b, 2, "u16"),
    "v_lshlrev_b16": _u(lambda a, b: b << (a & np.uint16(15)), 2, "u16"),
    "v_lshrrev_b16": _u(lambda a, b: b >> (a & np.uint16(15)), 2, "u16"),
    "v_ashrrev_i16": _VOp("i16", ("u16", "i16"), lambda a, b: b >> (a & np.uint16(15)).astype(np.int16)),
    "v_fma_f16": _f(lambda a, b, c: _fma32(a, b, c, np.float16), 3, "f16"),
    "v_trunc_f16": _f(np.trunc, 1, "f16"),
    "v_rcp_f16": _f(lambda a: (1.0 / a.astype(np.float64)).astype(np.float16), 1, "f16"),
    "v_max_i16": _VOp("i16", ("i16", "i16"), np.maximum),
    "v_min_i16": _VOp("i16", ("i16", "i16"), np.minimum),
    "v_max_u16": _u(np.maximum, 2, "u16"),
    "v_min_u16": _u(np.minimum, 2, "u16"),
    "v_max3_i16": _VOp("i16", ("i16",) * 3, lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_i16": _VOp("i16", ("i16",) * 3, lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_u16": _u(lambda a, b, c: np.maximum(np.maximum(a, b), c), 3, "u16"),
    "v_min3_u16": _u(lambda a, b, c: np.minimum(np.minimum(a, b), c), 3, "u16"),
    "v_med3_u16": _u(lambda a, b, c: np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)), 3, "u16"),
    "v_bcnt_u32_b32": _u(lambda a, b: _popcount32(a) + b),
    "v_mad_i32_i24": _VOp("i32", ("u32", "u32", "i32"),
                          lambda a, b, c: (_i24(a) * _i24(b) + c).astype(np.int32)),
    "v_max_i32": _VOp("i32", ("i32", "i32"), np.maximum),
    "v_min_i32": _VOp("i32", ("i32", "i32"), np.minimum),
    "v_max_u32": _u(np.maximum),
    "v_min_u32": _u(np.minimum),
    "v_lshlrev_b64": _VOp("b64", ("u32", "b64"), lambda a, b: b << (a & np.uint32(63)).astype(np.uint64)),
    "v_lshrrev_b64": _VOp("b64", ("u32", "b64"), lambda a, b: b >> (a & np.uint32(63)).astype(np.uint64)),
    "v_ashrrev_i64": _VOp("i64", ("u32", "i64"), lambda a, b: b >> (a & np.uint32(63)).astype(np.int64)),
    "v_alignbit_b32": _u(lambda a, b, c: (((a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64))
                                          >> _sh(c).astype(np.uint64)).astype(np.uint32), 3, "b32"),
    "v_bfrev_b32": _u(_bitrev32, 1, "b32"),
    "v_clz_i32_u32": _VOp("i32", ("u32",), lambda a: _clz_i32_u32(a).view(np.int32)),
    "v_ctz_i32_b32": _VOp("i32", ("b32",), lambda a: _ctz_i32_b32(a).view(np.int32)),
    "v_cls_i32": _VOp("i32", ("u32",), lambda a: _cls_i32(a).view(np.int32)),
    "v_perm_b32": _u(_perm_b32, 3, "b32"),
    "v_xor3_b32": _u(lambda a, b, c: a ^ b ^ c, 3, "b32"),
    "v_xad_u32": _u(lambda a, b, c: (a ^ b) + c, 3),
    "v_max3_i32": _VOp("i32", ("i32",) * 3, lambda a, b, c: np.maximum(np.maximum(a, b), c)),
    "v_min3_i32": _VOp("i32", ("i32",) * 3, lambda a, b, c: np.minimum(np.minimum(a, b), c)),
    "v_max3_u32": _u(lambda a, b, c: np.maximum(np.maximum(a, b), c), 3),
    # RDNA3 ISA: V_MAX3_F32 = v_max_f32(v_max_f32(S0, S1), S2), and V_MIN3_F32 alike (IEEE maxNum/minNum)
    "v_max3_f32": _f(lambda a, b, c: _fmax(_fmax(a, b), c), 3),
    "v_min3_f32": _f(lambda a, b, c: _fmin(_fmin(a, b), c), 3),
    # the median of three: max(min(a, b), min(max(a, b), c))
    "v_med3_i32": _VOp("i32", ("i32",) * 3, lambda a, b, c: np.maximum(np.minimum(a, b),
                                                                      np.minimum(np.maximum(a, b), c))),
    "v_med3_u32": _u(lambda a, b, c: np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c)), 3),
    "v_min3_u32": _u(lambda a, b, c: np.minimum(np.minimum(a, b), c), 3),
    "v_mul_hi_i32": _VOp("i32", ("i32", "i32"), lambda a, b: ((a.astype(np.int64) * b.astype(np.int64))
                                                             >> np.int64(32)).astype(np.int32)),
}

# compares: v_cmp[x]_<op>_<type>; `n*` are the negated ordered float compares (true when unordered)
_CMP_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    "ne": np.not_equal, "lg": lambda a, b: (a < b) | (a > b), "o": lambda a, b: ~(np.isnan(a) | np.isnan(b)),
    "u": lambda a, b: np.isnan(a) | np.isnan(b), "nge": lambda a, b: ~(a >= b),
    "nlg": lambda a, b: ~((a < b) | (a > b)),
    "ngt": lambda a, b: ~(a > b), "nle": lambda a, b: ~(a <= b), "neq": lambda a, b: ~(a == b),
    "nlt": lambda a, b: ~(a < b),
}
_CMP_TYPES = ("f16", "f32", "f64", "i16", "u16", "i32", "u32", "i64", "u64")


@cache  # a pure function of the mnemonic, asked once per VALU step
def _compare_op(base: str) -> tuple[str, Callable[..., Any], bool] | None:
    """(source type, predicate, writes EXEC) for a compare mnemonic base, else None."""
    for prefix, to_exec in (("v_cmpx_", True), ("v_cmp_", False)):
        if base.startswith(prefix):
            rest = base[len(prefix):]
            op, _, ty = rest.rpartition("_")
            if ty in _CMP_TYPES and op in _CMP_OPS:
                return ty, _CMP_OPS[op], to_exec
            if op == "class" and ty in ("f16", "f32", "f64"):
                return "class_" + ty, _cmp_class, to_exec
    return None


def _semantics_known(base: str) -> bool:
    """Whether the interpreter has semantics for a VALU mnemonic base (tests compare this with the table)."""
    return base in _VALU or _compare_op(base) is not None or base in _VALU_SPECIAL


# ---------------------------------------------------------------------- operand access
def _const_bits(op: Operand, ty: str) -> int:
    """The bits an inline constant or literal stands for as an operand of type ty."""
    width = _WIDTH[ty]
    if op.kind == "int":
        return int(op.value) & ((1 << width) - 1)
    if op.kind == "float":
        ft = {16: np.float16, 32: np.float32, 64: np.float64}[width]
        return int(np.array(op.value, ft).view({16: np.uint16, 32: np.uint32, 64: np.uint64}[width]))
    if op.kind == "inv2pi":  # 1/(2*pi) rounded to each width (RDNA3 ISA, inline constant 248)
        return {16: 0x3118, 32: 0x3E22F983, 64: 0x3FC45F306DC9C882}[width]
    if op.kind == "literal":
        lit = int(op.value)
        if width == 64:
            # a 32-bit literal of a double operand is its high half; for integer operands the hardware
            # sign-extends it for signed and zero-extends it for unsigned operands (LLVM SIInstrInfo,
            # isOperandLegal: it encodes only literals both readings agree on unless it knows the sign)
            if ty == "f64":
                return lit << 32
            return (lit - (1 << 32) if ty == "i64" and lit >> 31 else lit) & ((1 << 64) - 1)
        return lit & ((1 << width) - 1)
    raise MockUnsupported(str(op), f"operand kind {op.kind}")


def _read_bits(st: _State, op: Operand, ty: str, w: np.ndarray, hi: bool = False) -> np.ndarray:
    """An operand's bits as unsigned ints of the type's width, shape (k, 32) for VGPRs, (k, 1) for scalars."""
    width = _WIDTH[ty]
    ix = _ix(st, w)
    if op.kind == "vgpr":
        _check_pending(st, "v", op.index, w, "reads", 2 if width == 64 else 1)
        if width == 64:
            lo = st.v[op.index][ix].astype(np.uint64)
            return lo | (st.v[op.index + 1][ix].astype(np.uint64) << np.uint64(32))
        x = st.v[op.index][ix]
    elif op.kind == "sgpr":
        if op.index < NUM_SGPRS:
            _check_pending(st, "s", op.index, w, "reads", 2 if width == 64 else 1)
        if op.index == SGPR_NULL:
            x = np.zeros((len(w), 1), np.uint32)
        elif width == 64:
            lo = st.s[ix, op.index].astype(np.uint64)
            return (lo | (st.s[ix, op.index + 1].astype(np.uint64) << np.uint64(32)))[:, None]
        else:
            x = st.s[ix, op.index][:, None]
    elif op.kind == "scc":
        x = st.scc[ix][:, None]
    else:
        bits = _const_bits(op, ty)
        if width == 64:
            return np.full((1, 1), bits, np.uint64)
        x = np.full((1, 1), bits, np.uint32)
    if width == 16:
        return ((x >> np.uint32(16)) if hi else x & np.uint32(0xFFFF)).astype(np.uint16)
    return x


def _typed(bits: np.ndarray, ty: str) -> np.ndarray:
    if ty in _FLOAT_TYPES:
        return bits.view(_FLOAT_TYPES[ty])
    return bits.view(_INT_TYPES[ty])


def _write_v(st: _State, reg: int, w: np.ndarray, vals: np.ndarray, ty: str, lanes: np.ndarray,
             hi: bool = False) -> None:
    """Write a typed (k, 32)-broadcastable result to VGPR reg (and reg+1 for 64-bit) in the enabled lanes."""
    width = _WIDTH[ty]
    if reg + (2 if width == 64 else 1) > st.v.shape[0]:
        raise RDNA3Fault(f"v{reg} is beyond the {st.v.shape[0]} VGPRs the kernel descriptor allocates")
    _check_pending(st, "v", reg, w, "writes", 2 if width == 64 else 1)
    arr = np.asarray(vals)
    if ty in _FLOAT_TYPES:
        arr = arr.astype(_FLOAT_TYPES[ty])
    bits = np.broadcast_to(arr.astype(_INT_TYPES.get(ty, arr.dtype), copy=False)
                           .view({16: np.uint16, 32: np.uint32, 64: np.uint64}[width]), lanes.shape)
    ix = _ix(st, w)
    if width == 64:
        for half, shift in ((0, 0), (1, 32)):
            cur = st.v[reg + half][ix]
            st.v[reg + half][ix] = np.where(lanes, (bits >> np.uint64(shift)).astype(np.uint32), cur)
        return
    cur = st.v[reg][ix]
    if width == 16:  # a 16-bit result replaces one half of the VGPR and keeps the other (gfx11 true16)
        b32 = bits.astype(np.uint32)
        keep = cur & np.uint32(0xFFFF if hi else 0xFFFF0000)
        new = keep | (b32 << np.uint32(16 if hi else 0))
    else:
        new = bits
    st.v[reg][ix] = np.where(lanes, new, cur)


def _write_s(st: _State, reg: int, w: np.ndarray, vals: np.ndarray) -> None:
    """Write uint32[k] to SGPR reg of the selected waves (writes to null are dropped)."""
    if reg == SGPR_NULL:
        return
    if reg < NUM_SGPRS:
        _check_pending(st, "s", reg, w, "writes")
    if reg >= SGPR_FILE or (reg >= NUM_SGPRS and reg not in (VCC_LO, VCC_LO + 1, M0, EXEC_LO, EXEC_LO + 1)):
        raise RDNA3Fault(f"scalar destination {reg} is not a writable register")
    st.s[_ix(st, w), reg] = np.asarray(vals).astype(np.uint32)


def _write_s64(st: _State, reg: int, w: np.ndarray, vals: np.ndarray) -> None:
    v = np.asarray(vals, np.uint64)
    _write_s(st, reg, w, (v & np.uint64(0xFFFFFFFF)).astype(np.uint32))
    if reg != SGPR_NULL:
        _write_s(st, reg + 1, w, (v >> np.uint64(32)).astype(np.uint32))


# ---------------------------------------------------------------------- VALU execution
# packed (VOP3P) 16-bit operations: each half of the result from the halves op_sel / op_sel_hi pick;
# name -> (sources, function, element type)
_PACKED_F16: dict[str, tuple[int, Callable[..., Any], Any]] = {
    "v_pk_max_f16": (2, _fmax, np.float16), "v_pk_min_f16": (2, _fmin, np.float16),
    "v_pk_add_f16": (2, lambda a, b: a + b, np.float16), "v_pk_mul_f16": (2, lambda a, b: a * b, np.float16),
    "v_pk_fma_f16": (3, lambda a, b, c: _fma32(a, b, c, np.float16), np.float16),
    "v_pk_mul_lo_u16": (2, lambda a, b: a * b, np.uint16),  # the low 16 bits of each product
}
_VALU_SPECIAL = {*_PACKED_F16, "v_readfirstlane_b32", "v_readlane_b32", "v_writelane_b32",
                 "v_cndmask_b32", "v_cndmask_b16", "v_fma_mix_f32", "v_fma_mixlo_f16", "v_fma_mixhi_f16",
                 "v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_add_co_ci_u32", "v_sub_co_ci_u32",
                 "v_subrev_co_ci_u32", "v_mad_u64_u32", "v_mad_i64_i32", "v_div_scale_f32", "v_div_scale_f64"}
_VOP3SD = {"v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_add_co_ci_u32", "v_sub_co_ci_u32",
           "v_subrev_co_ci_u32", "v_div_scale_f32", "v_div_scale_f64", "v_mad_u64_u32", "v_mad_i64_i32"}


def _sources(ins: Instr, half: str = "") -> list[Operand]:
    f = ins.fields
    if ins.fmt == "VOPD":
        return [ins.src(f"src{half}0"), Operand("vgpr", f[f"vsrc{half}1"])]
    if ins.fmt in ("VOP1",):
        return [ins.src("src0")]
    if ins.fmt in ("VOP2", "VOPC"):
        return [ins.src("src0"), Operand("vgpr", f["vsrc1"])]
    return [ins.src("src0"), ins.src("src1"), ins.src("src2")]


def _mods(ins: Instr, base: str) -> tuple[int, int, int]:
    """(abs bits, neg bits, opsel bits) of a VOP3 instruction (none for other encodings)."""
    if ins.fmt != "VOP3":
        return 0, 0, 0
    f = ins.fields
    if base in _VOP3SD:
        return 0, f["neg"], 0
    return f["abs"], f["neg"], f["opsel"]


def _read_src(st: _State, ins: Instr, op: Operand, ty: str, w: np.ndarray, k: int, base: str) -> np.ndarray:
    """Source k of the instruction as a typed array, with VOP3 abs/neg/opsel applied (float types only)."""
    ab, ng, opsel = _mods(ins, base)
    hi = bool(opsel >> k & 1)
    if op.kind == "vgpr" and ins.fmt in ("VOP1", "VOP2", "VOPC") and _WIDTH[ty] == 16 and op.index >= 128:
        op, hi = Operand("vgpr", op.index - 128), True  # 16-bit VOP1/2/C operands: VGPR bit 7 picks .h
    x = _typed(_read_bits(st, op, ty, w, hi=hi), ty)
    if (ab | ng) >> k & 1:
        if ty not in _FLOAT_TYPES:
            raise MockUnsupported(ins.name, f"abs/neg modifier on integer source {k}")
        if ab >> k & 1:
            x = np.abs(x)
        if ng >> k & 1:
            x = -x
    if ty in _FLOAT_TYPES:
        x = _flush(x, st.dn32 if ty == "f32" else st.dn16, inputs=True)
    return x


def _mix_source(st: _State, ins: Instr, op: Operand, w: np.ndarray, k: int) -> np.ndarray:
    """Source k of a v_fma_mix* (VOP3P): op_sel_hi bit k set -> a float16 from the half op_sel bit k picks,
    converted to float32; clear -> the full float32. neg_hi is |x| for these ops, neg negates."""
    f = ins.fields
    opsel_hi = f["opsel_hi"] | (f["opsel_hi2"] << 2)
    if opsel_hi >> k & 1:
        x = _typed(_read_bits(st, op, "f16", w, hi=bool(f["opsel"] >> k & 1)), "f16")
        x = _flush(x, st.dn16, inputs=True).astype(np.float32)
    else:
        x = _flush(_typed(_read_bits(st, op, "f32", w), "f32"), st.dn32, inputs=True)
    if f["neg_hi"] >> k & 1:
        x = np.abs(x)
    if f["neg"] >> k & 1:
        x = -x
    return x


def _finish_float(st: _State, ins: Instr, r: np.ndarray, ty: str) -> np.ndarray:
    if ins.fmt == "VOP3P" and ins.fields["clamp"]:
        r = np.clip(r, 0, 1).astype(r.dtype)
    if ins.fmt == "VOP3":
        if ins.fields["omod"]:
            raise MockUnsupported(ins.name, "output modifier (omod)")
        if ins.fields["clamp"]:
            r = np.clip(r, 0, 1).astype(r.dtype)
    return _flush(r, st.dn32 if ty == "f32" else st.dn16, inputs=False)


def _packed_half(st: _State, ins: Instr, op: Operand, w: np.ndarray, hi: bool, dtype: Any) -> np.ndarray:
    """One 16-bit half of a packed source (bits 31:16 when hi) as dtype. An inline constant has no defined
    upper half here: the interpreter refuses to guess it."""
    if op.kind in ("vgpr", "sgpr", "literal"):
        bits = _read_bits(st, op, "b32", w)
        half = (bits >> np.uint32(16)) if hi else bits & np.uint32(0xFFFF)
        return half.astype(np.uint16).view(dtype)
    if hi:
        raise MockUnsupported(ins.name, f"the upper half of the inline constant {op}")
    return _read_bits(st, op, "f16" if dtype == np.float16 else "u16", w).view(dtype)


def _packed_f16(st: _State, ins: Instr, w: np.ndarray, base: str, srcs: list[Operand], vdst: int,
                lanes: np.ndarray) -> Callable[[], None]:
    """V_PK_*_F16 and V_PK_MUL_LO_U16 (VOP3P): the low result half from the source halves op_sel picks (bit
    k for source k; 0 the low half), negated by neg; the high half from those op_sel_hi picks, negated by
    neg_hi (RDNA3 ISA, "VOP3P" packed math). IEEE f16 arithmetic with the f16 denorm mode, clamp to [0, 1];
    the integer ops wrap and take no neg or clamp."""
    nsrc, fn, dtype = _PACKED_F16[base]
    f = ins.fields
    is_float = dtype == np.float16
    if not is_float and (f["neg"] or f["neg_hi"] or f["clamp"]):
        raise MockUnsupported(ins.name, "neg or clamp on a packed integer operation")
    opsel_hi = f["opsel_hi"] | (f["opsel_hi2"] << 2)
    halves = []
    for sel, neg in ((f["opsel"], f["neg"]), (opsel_hi, f["neg_hi"])):
        vals = []
        for k in range(nsrc):
            x = _packed_half(st, ins, srcs[k], w, bool(sel >> k & 1), dtype)
            if neg >> k & 1:
                x = -x
            vals.append(_flush(x, st.dn16, inputs=True) if is_float else x)
        with np.errstate(all="ignore"):
            r = np.asarray(fn(*vals), dtype)
        if f["clamp"]:
            r = np.clip(r, 0, 1).astype(np.float16)
        halves.append(np.broadcast_to(_flush(r, st.dn16, inputs=False) if is_float else r, lanes.shape))
    lo, hi = (np.ascontiguousarray(h).view(np.uint16).astype(np.uint32) for h in halves)
    return lambda: _write_v(st, vdst, w, lo | (hi << np.uint32(16)), "b32", lanes)


def _valu(st: _State, ins: Instr, w: np.ndarray, base: str, mnemonic: str,
          half: str = "") -> Callable[[], None]:
    """Compute one VALU operation for waves w; returns the write-back (VOPD computes both halves before
    either writes, as both read the old registers)."""
    lanes = st.exec_mask(w)
    f = ins.fields
    srcs = _sources(ins, half)
    vdst = f[f"vdst{half}"] if ins.fmt == "VOPD" else f.get("vdst", 0)
    dst_hi = ins.fmt == "VOP3" and base not in _VOP3SD and bool((ins.fields["opsel"] >> 3) & 1)
    op16 = _VALU.get(base)
    if ins.fmt in ("VOP1", "VOP2") and vdst >= 128 and (base == "v_cndmask_b16" or (
            op16 is not None and _WIDTH.get(op16.dst) == 16)):
        vdst, dst_hi = vdst - 128, True  # a 16-bit VOP1/2 result: VGPR bit 7 picks .h

    cmp = _compare_op(base)
    if cmp is not None:
        ty, pred, to_exec = cmp
        if ty.startswith("class_"):
            a = _read_src(st, ins, srcs[0], ty[len("class_"):], w, 0, base)
            b = _read_src(st, ins, srcs[1], "u32", w, 1, base)
            res = pred(a, b)
        else:
            a = _read_src(st, ins, srcs[0], ty, w, 0, base)
            b = _read_src(st, ins, srcs[1], ty, w, 1, base)
            with np.errstate(invalid="ignore"):
                res = pred(a, b)
        bits = _pack_mask(np.broadcast_to(res, lanes.shape) & lanes)  # inactive lanes write 0
        dst = EXEC_LO if to_exec else (VCC_LO if ins.fmt == "VOPC" else f["vdst"])
        return lambda: _write_s(st, dst, w, bits)

    if base in ("v_cndmask_b32", "v_cndmask_b16"):
        # VOP3 modifiers on cndmask act on the float interpretation of its sources (|x| clears the sign bit)
        wide = base == "v_cndmask_b32"
        ty, uty = ("f32", np.uint32) if wide else ("f16", np.uint16)
        sel_reg = VCC_LO if ins.fmt in ("VOP2", "VOPD") else None
        a = _read_src(st, ins, srcs[0], ty if ins.fmt == "VOP3" else ("b32" if wide else "u16"), w, 0, base)
        b = _read_src(st, ins, srcs[1], ty if ins.fmt == "VOP3" else ("b32" if wide else "u16"), w, 1, base)
        if sel_reg is None:
            if srcs[2].kind != "sgpr":
                raise MockUnsupported(ins.name, f"lane mask from {srcs[2]}")
            sel_reg = srcs[2].index
        sel = st.mask_of(sel_reg, w)
        r = np.where(sel, b.view(uty), a.view(uty))
        return lambda: _write_v(st, vdst, w, r, "b32" if wide else "u16", lanes, hi=dst_hi)

    if base in ("v_readfirstlane_b32", "v_readlane_b32"):
        # a lane's value to an SGPR (vdst names the SGPR): the first active lane (lane 0 when EXEC is 0),
        # or the lane src1 selects modulo the wave size; EXEC does not gate it (RDNA3 ISA, V_READLANE_B32)
        x = np.broadcast_to(_read_src(st, ins, srcs[0], "b32", w, 0, base), lanes.shape)
        if base == "v_readfirstlane_b32":
            lane = np.where(lanes.any(axis=1), np.argmax(lanes, axis=1), 0)
        else:
            lane = (np.broadcast_to(_read_src(st, ins, srcs[1], "u32", w, 1, base), (len(w), 1))[:, 0]
                    % WAVE).astype(np.int64)
        picked = x[np.arange(len(w)), lane]
        return lambda: _write_s(st, vdst, w, picked)

    if base == "v_writelane_b32":
        # a scalar into one lane of vdst (src1 modulo the wave size), whatever EXEC says
        val = np.broadcast_to(_read_src(st, ins, srcs[0], "b32", w, 0, base), (len(w), 1))[:, 0]
        lane = (np.broadcast_to(_read_src(st, ins, srcs[1], "u32", w, 1, base), (len(w), 1))[:, 0]
                % WAVE).astype(np.int64)
        only = np.zeros(lanes.shape, bool)
        only[np.arange(len(w)), lane] = True
        return lambda: _write_v(st, vdst, w, np.broadcast_to(val[:, None], lanes.shape), "b32", only)

    if base in _PACKED_F16:
        return _packed_f16(st, ins, w, base, srcs, vdst, lanes)

    if base in ("v_fma_mix_f32", "v_fma_mixlo_f16", "v_fma_mixhi_f16"):
        vals = [_mix_source(st, ins, srcs[k], w, k) for k in range(3)]
        r32 = _fma32(*vals)
        if base == "v_fma_mix_f32":
            r32 = _finish_float(st, ins, r32, "f32")
            return lambda: _write_v(st, vdst, w, np.broadcast_to(r32, lanes.shape), "f32", lanes)
        r16 = _flush(r32.astype(np.float16), st.dn16, inputs=False)
        hi = base == "v_fma_mixhi_f16"
        return lambda: _write_v(st, vdst, w, np.broadcast_to(r16, lanes.shape), "f16", lanes, hi=hi)

    if base in ("v_add_co_u32", "v_sub_co_u32", "v_subrev_co_u32", "v_add_co_ci_u32", "v_sub_co_ci_u32",
                "v_subrev_co_ci_u32"):
        a = _read_src(st, ins, srcs[0], "u32", w, 0, base).astype(np.int64)
        b = _read_src(st, ins, srcs[1], "u32", w, 1, base).astype(np.int64)
        if "_ci_" in base:
            if ins.fmt == "VOP2":
                cin = st.mask_of(VCC_LO, w).astype(np.int64)
            elif srcs[2].kind == "sgpr":
                cin = st.mask_of(srcs[2].index, w).astype(np.int64)
            else:
                raise MockUnsupported(ins.name, f"carry-in from {srcs[2]}")
        else:
            cin = np.zeros(1, np.int64)
        if base.startswith("v_subrev"):
            a, b = b, a
        full = a + b + cin if base.startswith("v_add") else a - b - cin
        carry = (full >> 32) != 0  # carry out of an add, borrow of a subtract
        r = (full & 0xFFFFFFFF).astype(np.uint32)
        sdst = VCC_LO if ins.fmt == "VOP2" else f["sdst"]
        cbits = _pack_mask(np.broadcast_to(carry, lanes.shape) & lanes)

        def wb() -> None:
            _write_v(st, vdst, w, r, "u32", lanes)
            _write_s(st, sdst, w, cbits)
        return wb

    if base in ("v_mad_u64_u32", "v_mad_i64_i32"):
        signed = base == "v_mad_i64_i32"
        a = _read_src(st, ins, srcs[0], "i32" if signed else "u32", w, 0, base)
        b = _read_src(st, ins, srcs[1], "i32" if signed else "u32", w, 1, base)
        c = _read_src(st, ins, srcs[2], "u64", w, 2, base)
        prod = a.astype(np.int64 if signed else np.uint64) * b.astype(np.int64 if signed else np.uint64)
        r64 = prod.view(np.uint64) + c
        carry = (r64 < c) if not signed else np.zeros(r64.shape, bool)
        cbits = _pack_mask(np.broadcast_to(carry, lanes.shape) & lanes)

        def wb() -> None:
            _write_v(st, vdst, w, r64, "u64", lanes)
            _write_s(st, f["sdst"], w, cbits)
        return wb

    if base in ("v_div_scale_f32", "v_div_scale_f64"):
        fty, fmt = ("f32", _F32_FMT) if base.endswith("f32") else ("f64", _F64_FMT)
        a, b, c = (_read_src(st, ins, srcs[k], fty, w, k, base) for k in range(3))
        a, b, c = np.broadcast_arrays(a, b, c)
        d, vcc = _div_scale(a, b, c, fmt)
        vbits = _pack_mask(np.broadcast_to(vcc, lanes.shape) & lanes)

        def wb() -> None:
            _write_v(st, vdst, w, d, fty, lanes)
            _write_s(st, f["sdst"], w, vbits)
        return wb

    op = _VALU.get(base)
    if op is None:
        raise MockUnsupported(mnemonic)
    vals = []
    nsrc = len(op.srcs) - (1 if op.acc else 0)
    if base in ("v_fmaak_f32", "v_fmamk_f32"):
        if ins.literal is None:
            raise RDNA3Fault(f"{mnemonic} without its literal")
        k_op = Operand("literal", 255, ins.literal)
        ops = [srcs[0], srcs[1], k_op] if base == "v_fmaak_f32" else [srcs[0], k_op, srcs[1]]
    else:
        ops = srcs[:nsrc]
    for k, (o, ty) in enumerate(zip(ops, op.srcs)):
        vals.append(_read_src(st, ins, o, ty, w, k, base))
    if op.acc:
        vals.append(_typed(_read_bits(st, Operand("vgpr", vdst), op.dst, w), op.dst))
    with np.errstate(all="ignore"):
        r = op.fn(*vals)
        if base in ("v_div_fmas_f32", "v_div_fmas_f64"):
            r = _div_fmas_scale(np.asarray(r), vals[2], st.mask_of(VCC_LO, w),
                                _F32_FMT if base.endswith("f32") else _F64_FMT)
    if op.dst in _FLOAT_TYPES:
        r = _finish_float(st, ins, np.asarray(r, _FLOAT_TYPES[op.dst]), op.dst)
    elif ins.fmt == "VOP3" and (ins.fields["clamp"] or ins.fields["omod"]):
        raise MockUnsupported(mnemonic, "clamp/omod on an integer result")
    r = np.broadcast_to(r, lanes.shape)
    return lambda: _write_v(st, vdst, w, r, op.dst, lanes, hi=dst_hi)


# ---------------------------------------------------------------------- SALU
def _s_src(st: _State, op: Operand, w: np.ndarray, width: int = 32) -> np.ndarray:
    """A scalar source as uint32[k] (uint64[k] for width 64)."""
    ty = "b64" if width == 64 else "b32"
    return _read_bits(st, op, ty, w).reshape(-1) if op.kind in ("sgpr", "scc") else \
        np.full(len(w), _const_bits(op, ty), np.uint64 if width == 64 else np.uint32)


def _salu(st: _State, ins: Instr, w: np.ndarray, base: str) -> None:
    f = ins.fields
    if ins.fmt == "SOPK":
        imm = np.int32(np.int16(np.uint16(f["simm16"])))
        if base == "s_movk_i32":
            _write_s(st, f["sdst"], w, np.full(len(w), imm, np.int32).view(np.uint32))
            return
        if base in _SOPK_CMP:
            # SCC = S0 <op> SIMM16, S0 the register in the sdst field; the immediate is sign-extended for
            # the _i32 compares and zero-extended for the _u32 ones (RDNA3 ISA, S_CMPK_*)
            signed = base.endswith("_i32")
            reg = _s_src(st, Operand("sgpr", f["sdst"]), w)
            lhs = reg.view(np.int32).astype(np.int64) if signed else reg.astype(np.int64)
            rhs = int(imm) if signed else f["simm16"]
            st.scc[w] = _CMP_OPS[base.split("_")[2]](lhs, rhs).astype(np.uint32)
            return
        if base in ("s_mulk_i32", "s_addk_i32"):
            # D = D * SIMM16 (SCC unchanged) / D = D + SIMM16 (SCC = signed overflow), SIMM16 sign-extended
            d = _s_src(st, Operand("sgpr", f["sdst"]), w).view(np.int32).astype(np.int64)
            full = d * int(imm) if base == "s_mulk_i32" else d + int(imm)
            _write_s(st, f["sdst"], w, (full & 0xFFFFFFFF).astype(np.uint32))
            if base == "s_addk_i32":
                st.scc[w] = ((full > 2**31 - 1) | (full < -(2**31))).astype(np.uint32)
            return
        if base == "s_waitcnt_vscnt" and f["sdst"] == SGPR_NULL:
            return  # stores land when they execute here, so waiting for them is a no-op
        if base in ("s_waitcnt_vmcnt", "s_waitcnt_lgkmcnt") and f["sdst"] == SGPR_NULL:
            _complete(st, VMCNT if base == "s_waitcnt_vmcnt" else LGKMCNT, w, f["simm16"])
            return
        raise MockUnsupported(ins.name)
    wide = base.endswith(("_b64", "_u64", "_i64"))
    a = _s_src(st, ins.src("ssrc0"), w, 64 if wide else 32)
    if ins.fmt == "SOP1":
        if base == "s_mov_b32":
            _write_s(st, f["sdst"], w, a)
        elif base == "s_mov_b64":
            _write_s64(st, f["sdst"], w, a)
        elif base in ("s_and_saveexec_b32", "s_or_saveexec_b32", "s_and_not1_saveexec_b32",
                      "s_or_not1_saveexec_b32", "s_and_not0_saveexec_b32"):
            old = st.s[w, EXEC_LO].copy()
            new = {"s_and_saveexec_b32": a & old, "s_or_saveexec_b32": a | old,
                   "s_and_not1_saveexec_b32": a & ~old, "s_or_not1_saveexec_b32": a | ~old,
                   "s_and_not0_saveexec_b32": ~a & old}[base]
            _write_s(st, f["sdst"], w, old)
            st.s[w, EXEC_LO] = new
            st.scc[w] = (new != 0).astype(np.uint32)
        elif base in ("s_sext_i32_i8", "s_sext_i32_i16"):
            _write_s(st, f["sdst"], w, a.astype(np.int8 if base.endswith("i8") else np.int16)
                     .astype(np.int32).view(np.uint32))
        elif base == "s_not_b32":
            r = ~a
            _write_s(st, f["sdst"], w, r)
            st.scc[w] = (r != 0).astype(np.uint32)
        elif base in ("s_bitset0_b32", "s_bitset1_b32"):
            # D[S0[4:0]] = 0 / 1, the other bits of D kept; SCC unchanged
            bit = np.uint32(1) << (a & np.uint32(31))
            d = _s_src(st, Operand("sgpr", f["sdst"]), w)
            _write_s(st, f["sdst"], w, (d | bit) if base == "s_bitset1_b32" else (d & ~bit))
        elif base in _SOP1_COUNTS:
            _write_s(st, f["sdst"], w, _SOP1_COUNTS[base](a))  # SCC unchanged (RDNA3 ISA, S_CLZ_I32_U32 ...)
        else:
            raise MockUnsupported(ins.name)
        return
    b_width = 32 if base in ("s_lshl_b64", "s_lshr_b64", "s_ashr_i64", "s_bfe_i64", "s_bfe_u64") else \
        (64 if wide else 32)
    b = _s_src(st, ins.src("ssrc1"), w, b_width)
    if ins.fmt == "SOPC" and wide:
        preds64 = {"s_cmp_eq_u64": a == b, "s_cmp_lg_u64": a != b}
        if base not in preds64:
            raise MockUnsupported(ins.name)
        st.scc[w] = preds64[base].astype(np.uint32)
        return
    if ins.fmt == "SOPC":
        ai, bi = a.view(np.int32), b.view(np.int32)
        preds = {"s_cmp_eq_i32": ai == bi, "s_cmp_lg_i32": ai != bi, "s_cmp_gt_i32": ai > bi,
                 "s_cmp_ge_i32": ai >= bi, "s_cmp_lt_i32": ai < bi, "s_cmp_le_i32": ai <= bi,
                 "s_cmp_eq_u32": a == b, "s_cmp_lg_u32": a != b, "s_cmp_gt_u32": a > b,
                 "s_cmp_ge_u32": a >= b, "s_cmp_lt_u32": a < b, "s_cmp_le_u32": a <= b}
        if base not in preds:
            raise MockUnsupported(ins.name)
        st.scc[w] = preds[base].astype(np.uint32)
        return
    # SOP2
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    scc: np.ndarray | None = None
    if base == "s_add_u32":
        full = a64 + b64
        r, scc = full & 0xFFFFFFFF, full >> 32
    elif base == "s_addc_u32":
        full = a64 + b64 + st.scc[w]
        r, scc = full & 0xFFFFFFFF, full >> 32
    elif base == "s_sub_u32":
        r, scc = (a64 - b64) & 0xFFFFFFFF, (b64 > a64)
    elif base == "s_subb_u32":
        full = a64 - b64 - st.scc[w]
        r, scc = full & 0xFFFFFFFF, full < 0
    elif base in ("s_add_i32", "s_sub_i32"):
        ai, bi = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
        full = ai + bi if base == "s_add_i32" else ai - bi
        r, scc = full & 0xFFFFFFFF, (full > 2**31 - 1) | (full < -(2**31))  # signed overflow
    elif base == "s_mul_i32":
        r = (a64 * b64) & 0xFFFFFFFF
    elif base == "s_mul_hi_u32":
        r = (a.astype(np.uint64) * b.astype(np.uint64)) >> np.uint64(32)
    elif base == "s_mul_hi_i32":
        r = ((a.view(np.int32).astype(np.int64) * b.view(np.int32).astype(np.int64)) >> 32) & 0xFFFFFFFF
    elif base in ("s_lshl1_add_u32", "s_lshl2_add_u32", "s_lshl3_add_u32", "s_lshl4_add_u32"):
        full = (a64 << int(base[6])) + b64  # a 64-bit sum: SCC is its carry out of bit 31
        r, scc = full & 0xFFFFFFFF, full >> 32 != 0
    elif base in ("s_and_b32", "s_or_b32", "s_xor_b32", "s_and_not1_b32", "s_or_not1_b32", "s_nand_b32",
                  "s_nor_b32", "s_xnor_b32"):
        r = {"s_and_b32": a & b, "s_or_b32": a | b, "s_xor_b32": a ^ b, "s_and_not1_b32": a & ~b,
             "s_or_not1_b32": a | ~b, "s_nand_b32": ~(a & b), "s_nor_b32": ~(a | b),
             "s_xnor_b32": ~(a ^ b)}[base]
        scc = r != 0
    elif base in ("s_lshl_b32", "s_lshr_b32"):
        sh = b & np.uint32(31)
        r = (a << sh) if base == "s_lshl_b32" else (a >> sh)
        scc = r != 0
    elif base == "s_ashr_i32":
        r = (a.view(np.int32) >> (b & np.uint32(31)).astype(np.int32)).view(np.uint32)
        scc = r != 0
    elif base in ("s_lshl_b64", "s_lshr_b64"):
        sh = (b & np.uint32(63)).astype(np.uint64)
        r64 = (a << sh) if base == "s_lshl_b64" else (a >> sh)
        _write_s64(st, f["sdst"], w, r64)
        st.scc[w] = (r64 != 0).astype(np.uint32)
        return
    elif base in ("s_bfe_i64", "s_bfe_u64"):  # S1: offset in bits 5:0, width in bits 22:16
        off = (b & np.uint32(63)).astype(np.uint64)
        width = np.minimum((b >> np.uint32(16)) & np.uint32(0x7F), np.uint32(64)).astype(np.uint64)
        ones = (np.uint64(1) << (width % np.uint64(64))) - np.uint64(1)
        mask = np.where(width >= 64, np.uint64(2**64 - 1), ones)
        field = (a >> off) & mask
        if base == "s_bfe_i64":
            sign_bit = np.maximum(width, np.uint64(1)) - np.uint64(1)
            top = np.where(width > 0, (field >> sign_bit) & np.uint64(1), 0)
            field = np.where((top == 1) & (width < 64), field | ~mask, field)
        _write_s64(st, f["sdst"], w, field)
        st.scc[w] = (field != 0).astype(np.uint32)
        return
    elif base in ("s_and_b64", "s_or_b64", "s_xor_b64"):
        r64 = {"s_and_b64": a & b, "s_or_b64": a | b, "s_xor_b64": a ^ b}[base]
        _write_s64(st, f["sdst"], w, r64)
        st.scc[w] = (r64 != 0).astype(np.uint32)
        return
    elif base in ("s_min_i32", "s_max_i32"):
        ai, bi = a.view(np.int32), b.view(np.int32)
        pick = ai < bi if base == "s_min_i32" else ai > bi
        r, scc = np.where(pick, a, b), pick
    elif base in ("s_min_u32", "s_max_u32"):
        pick = a < b if base == "s_min_u32" else a > b
        r, scc = np.where(pick, a, b), pick
    elif base == "s_cselect_b32":
        r = np.where(st.scc[w] != 0, a, b)
    elif base == "s_bfe_i32":  # S1: offset in bits 4:0, width in bits 22:16; the field sign-extended
        off, width = b & np.uint32(31), (b >> np.uint32(16)) & np.uint32(0x7F)
        r = _bfe_signed(a, off, np.minimum(width, np.uint32(32))).view(np.uint32)
        scc = r != 0
    elif base == "s_bfe_u32":
        off, width = b & np.uint32(31), (b >> np.uint32(16)) & np.uint32(0x7F)
        r = (a >> off) & np.where(width >= 32, np.uint32(0xFFFFFFFF),
                                  (np.uint32(1) << (width & np.uint32(31))) - np.uint32(1))
        scc = r != 0
    else:
        raise MockUnsupported(ins.name)
    _write_s(st, f["sdst"], w, np.asarray(r).astype(np.uint64).astype(np.uint32))
    if scc is not None:
        st.scc[w] = np.asarray(scc).astype(np.uint32)


_SOPK_CMP = {f"s_cmpk_{op}_{ty}" for op in ("eq", "lg", "gt", "ge", "lt", "le") for ty in ("i32", "u32")}
_SOP1_COUNTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "s_clz_i32_u32": _clz_i32_u32, "s_ctz_i32_b32": _ctz_i32_b32, "s_cls_i32": _cls_i32}
_NOPS = {"s_waitcnt_depctr", "s_delay_alu", "s_clause", "s_nop", "s_set_inst_prefetch_distance",
         "s_sendmsg", "buffer_gl0_inv", "buffer_gl1_inv"}  # timing and cache controls: memory is coherent
# s_sendmsg sendmsg(MSG_DEALLOC_VGPRS): gfx11 message ID 3 in SIMM16[7:0] with no operation or stream bits
# (LLVM SIDefines.h ID_DEALLOC_VGPRS_GFX11Plus; LLVM emits it before s_endpgm of long kernels). Releasing
# the VGPRs early changes nothing the interpreter models; every other message is refused.
SENDMSG_DEALLOC_VGPRS = 3


def _sopp(st: _State, ins: Instr, w: np.ndarray, base: str) -> bool:
    """Program-control instructions; True when the pc was set (a branch taken or the wave parked/ended)."""
    if base == "s_waitcnt":
        simm = ins.fields["simm16"]
        _complete(st, VMCNT, w, (simm >> WAITCNT_VM_SHIFT) & WAITCNT_COUNT_MASK)
        _complete(st, LGKMCNT, w, (simm >> WAITCNT_LGKM_SHIFT) & WAITCNT_COUNT_MASK)
        return False
    if base in _NOPS:
        if base == "s_sendmsg":
            if ins.fields["simm16"] != SENDMSG_DEALLOC_VGPRS:
                raise MockUnsupported(ins.name, f"message {ins.fields['simm16']:#x}")
            nxt = st.prog.at(ins.pc + ins.size)
            if nxt.mnemonic != "s_endpgm":  # VGPRs released while the wave still runs: they read as garbage
                raise RDNA3Fault(f"sendmsg(MSG_DEALLOC_VGPRS) is followed by {nxt.name}, not s_endpgm")
        return False
    if base == "s_endpgm":
        st.status[w] = ENDED
        return True
    if base == "s_barrier":
        st.status[w] = PARKED
        st.pc[w] += ins.size
        return True
    simm = int(np.int16(np.uint16(ins.fields["simm16"])))
    target = ins.pc + 4 + simm * 4  # branch offsets count dwords from the next instruction (RDNA3 ISA, SOPP)
    conds = {"s_branch": np.ones(len(w), bool), "s_cbranch_scc0": st.scc[w] == 0,
             "s_cbranch_scc1": st.scc[w] != 0, "s_cbranch_execz": st.s[w, EXEC_LO] == 0,
             "s_cbranch_execnz": st.s[w, EXEC_LO] != 0, "s_cbranch_vccz": st.s[w, VCC_LO] == 0,
             "s_cbranch_vccnz": st.s[w, VCC_LO] != 0}
    if base not in conds:
        raise MockUnsupported(ins.name)
    take = conds[base]
    st.pc[w] = np.where(take, target, ins.pc + ins.size)
    return True


# ---------------------------------------------------------------------- memory instructions
def _smem(st: _State, ins: Instr, w: np.ndarray, base: str) -> None:
    sizes = {"s_load_b32": 1, "s_load_b64": 2, "s_load_b128": 4, "s_load_b256": 8, "s_load_b512": 16}
    if base not in sizes:
        raise MockUnsupported(ins.name)
    n = sizes[base]
    f = ins.fields
    addr = _read_bits(st, Operand("sgpr", f["sbase"]), "b64", w).reshape(-1).astype(np.int64)
    off = f["offset"] - (1 << 21) if f["offset"] >> 20 else f["offset"]  # 21-bit signed byte offset
    addr = addr + off
    if f["soffset"] != SGPR_NULL:
        _check_pending(st, "s", f["soffset"], w, "reads")
        addr = addr + st.s[w, f["soffset"]].astype(np.int64)
    addr = (addr & ~3).astype(np.uint64)  # scalar memory ignores the two low address bits (dword access)
    data = st.memory.load(addr, 4 * n, "scalar load").view(np.uint32).reshape(len(w), n)
    sd = f["sdata"]
    if sd + n > NUM_SGPRS:
        raise RDNA3Fault(f"{ins.name} writes s{sd}..s{sd + n - 1}, past s{NUM_SGPRS - 1}")
    for j in range(n):
        _check_pending(st, "s", sd + j, w, "writes")  # an older load in flight to the same SGPR
    _defer(st, ins, LGKMCNT, w, [("s", sd + j, None, data[:, j].copy()) for j in range(n)])


_GLOBAL_LOADS = {"global_load_d16_u8": (1, 1), "global_load_d16_i8": (1, 1), "global_load_d16_hi_u8": (1, 1),
                 "global_load_d16_hi_i8": (1, 1),
                 "global_load_b32": (4, 1), "global_load_b64": (8, 2), "global_load_b96": (12, 3),
                 "global_load_b128": (16, 4), "global_load_u8": (1, 1), "global_load_i8": (1, 1),
                 "global_load_u16": (2, 1), "global_load_i16": (2, 1), "global_load_d16_b16": (2, 1),
                 "global_load_d16_hi_b16": (2, 1)}
_GLOBAL_STORES = {"global_store_b32": 4, "global_store_b64": 8, "global_store_b96": 12,
                  "global_store_b128": 16, "global_store_b8": 1, "global_store_b16": 2,
                  "global_store_d16_hi_b16": 2}
FLAT_SEG_GLOBAL, FLAT_SEG_SCRATCH = 2, 1  # FLAT encoding bits 17:16 (RDNA3 ISA, "FLAT, Scratch and Global")


def _every_lane(st: _State, k: int) -> tuple[np.ndarray, np.ndarray]:
    """np.nonzero of k waves with all 32 lanes on (cached per k: (wave, lane) index pairs in order)."""
    got = st.every_lane.get(k)
    if got is None:
        rows, cols = np.nonzero(np.ones((k, WAVE), bool))
        got = st.every_lane[k] = (rows, cols)
    return got


def _flat(st: _State, ins: Instr, w: np.ndarray, base: str) -> None:
    f = ins.fields
    if f["seg"] == FLAT_SEG_SCRATCH:
        raise MockUnsupported(ins.name, "scratch memory")
    name = base.replace("flat_", "global_", 1)  # flat addresses are global ones here (no LDS aperture)
    lanes = st.exec_mask(w)
    off = f["offset"] - (1 << 13) if f["offset"] >> 12 else f["offset"]  # 13-bit signed byte offset
    if f["saddr"] in (SGPR_NULL, 0x7F):  # "off": a 64-bit address in a VGPR pair
        addr = _read_bits(st, Operand("vgpr", f["addr"]), "b64", w).astype(np.int64)
    else:  # SGPR-pair base plus a 32-bit VGPR offset
        sbase = _read_bits(st, Operand("sgpr", f["saddr"]), "b64", w).astype(np.int64)
        addr = sbase + st.vread(f["addr"], w).astype(np.int64)
    addr = (addr + off).astype(np.uint64)
    every = bool(lanes.all())  # every lane on: the (wave, lane) order is the arrays' own, no gathers
    sel = _every_lane(st, len(w)) if every else np.nonzero(lanes)
    a = addr.reshape(-1) if every else addr[sel]
    if name in _GLOBAL_LOADS:
        size, nregs = _GLOBAL_LOADS[name]
        raw = st.memory.load(a, size, ins.name)
        vdst = f["vdst"]
        if size >= 4:
            words = raw.view(np.uint32).reshape(-1, nregs)
            _defer_lanes(st, ins, VMCNT, w, sel, [("v", vdst + r, words[:, r]) for r in range(nregs)])
            return
        val = raw.view(np.uint8 if size == 1 else np.uint16).reshape(-1)
        # d16 loads write one half of the VGPR and keep the other; a byte is zero- (u8) or sign- (i8)
        # extended to the 16 (d16) or 32 bits it fills
        kind = "v_hi16" if "_d16_hi_" in name else "v_lo16" if "_d16_" in name else "v"
        if name.endswith("_i8") or name.endswith("_i16"):
            new = val.view(np.int8 if size == 1 else np.int16).astype(np.int32).view(np.uint32)
        else:
            new = val.astype(np.uint32)
        if kind != "v":
            new = new & np.uint32(0xFFFF)
        _defer_lanes(st, ins, VMCNT, w, sel, [(kind, vdst, new)])
        return
    if name in _GLOBAL_STORES:
        size = _GLOBAL_STORES[name]
        d = f["data"]
        nregs = max(size // 4, 1)
        if every:
            words = np.stack([st.vread(d + r, w).reshape(-1) for r in range(nregs)], axis=1)
        else:
            words = np.stack([st.vread(d + r, w[sel[0]], sel[1]) for r in range(nregs)], axis=1)
        if name == "global_store_d16_hi_b16":
            words = words >> np.uint32(16)
        raw = words.astype(np.uint32).view(np.uint8).reshape(len(a), 4 * nregs)[:, :size]
        st.memory.store(a, np.ascontiguousarray(raw), ins.name)
        return
    raise MockUnsupported(ins.name)


def _lds_index(st: _State, ins: Instr, w: np.ndarray, sel: tuple[np.ndarray, ...], addr: np.ndarray,
               size: int, store: bool) -> tuple[np.ndarray, np.ndarray]:
    """(workgroup row, byte columns) of LDS accesses of `size` bytes at `addr`, bounds-checked and checked
    for races (see `_lds_race`)."""
    if (addr + size > st.lds_size).any():
        bad = int(addr[addr + size > st.lds_size][0])
        raise MemoryFault(f"LDS access of {size} bytes at {bad:#x}: past the workgroup's {st.lds_size} bytes "
                          "of LDS (group_segment_fixed_size)")
    if (addr % min(size, 4)).any():
        bad = int(addr[(addr % min(size, 4)) != 0][0])
        raise RDNA3Fault(f"misaligned LDS access of {size} bytes at {bad:#x}")
    rows = st.group[w[sel[0]]][:, None]
    cols = addr[:, None] + np.arange(size)
    _lds_race(st, st.wave_in_group[w[sel[0]]], rows, cols, store)
    return rows, cols


def _lds_race(st: _State, waves: np.ndarray, rows: np.ndarray, cols: np.ndarray, store: bool) -> None:
    """Fault on an LDS access another wave of the workgroup made conflicting since the last s_barrier: a read
    of bytes another wave wrote, or a write to bytes another wave read or wrote. Waves are not ordered
    between barriers on hardware, so such code is a race even where this interpreter's lockstep order would
    give the intended value. Lanes of one wave are ordered, so they never race with each other."""
    for k in np.unique(waves):
        m = waves == k
        rr, cc = np.broadcast_to(rows[m], cols[m].shape), cols[m]
        wrote = st.lds_writer[rr, cc]
        clash = (wrote >= 0) & (wrote != k)
        bit = np.uint32(1 << int(k))
        read = (st.lds_readers[rr, cc] & ~bit) if store else np.zeros(cc.shape, np.uint32)
        if clash.any() or read.any():
            i, j = np.argwhere(clash | (read != 0))[0]
            readers = int(read[i, j])
            other = int(wrote[i, j]) if clash[i, j] else (readers & -readers).bit_length() - 1
            raise RDNA3Fault(f"LDS race in workgroup {int(rr[i, 0])} of the batch: wave {int(k)} "
                             f"{'writes' if store else 'reads'} byte {int(cc[i, j]):#x}, which wave {other} "
                             f"{'wrote' if clash[i, j] else 'read'} since the last s_barrier")
        if store:
            st.lds_writer[rr, cc] = k
        else:
            st.lds_readers[rr, cc] |= bit


def _ds(st: _State, ins: Instr, w: np.ndarray, base: str) -> None:
    f = ins.fields
    if f["gds"]:
        raise MockUnsupported(ins.name, "GDS")
    lanes = st.exec_mask(w)
    sel = np.nonzero(lanes)
    a0 = st.vread(f["addr"], w[sel[0]], sel[1]).astype(np.int64)
    off16 = f["offset0"] | (f["offset1"] << 8)
    singles = {"ds_load_b32": 4, "ds_load_b64": 8, "ds_load_b128": 16, "ds_load_u8": 1, "ds_load_u16": 2}
    stores = {"ds_store_b32": 4, "ds_store_b64": 8, "ds_store_b128": 16, "ds_store_b8": 1, "ds_store_b16": 2}
    if base in singles:
        size = singles[base]
        rows, cols = _lds_index(st, ins, w, sel, a0 + off16, size, store=False)
        raw = st.lds[rows, cols]
        if size >= 4:
            words = np.ascontiguousarray(raw).view(np.uint32)
            regs = [("v", f["vdst"] + r, words[:, r]) for r in range(size // 4)]
            _defer_lanes(st, ins, LGKMCNT, w, sel, regs)
        else:
            val = np.ascontiguousarray(raw).view(np.uint8 if size == 1 else np.uint16).reshape(-1)
            _defer_lanes(st, ins, LGKMCNT, w, sel, [("v", f["vdst"], val.astype(np.uint32))])
        return
    if base in stores:
        size = stores[base]
        rows, cols = _lds_index(st, ins, w, sel, a0 + off16, size, store=True)
        words = np.stack([st.vread(f["data0"] + r, w[sel[0]], sel[1]) for r in range(max(size // 4, 1))],
                         axis=1)
        st.lds[rows, cols] = words.astype(np.uint32).view(np.uint8).reshape(len(a0), -1)[:, :size]
        return
    if base in ("ds_bpermute_b32", "ds_permute_b32"):
        # lanes exchange through the LDS crossbar (no LDS memory is touched): bpermute lane i reads data0 of
        # lane ((addr[i] + offset) / 4) mod 32; permute lane i writes its data0 to that lane. Inactive lanes
        # contribute 0 (RDNA3 ISA, DS_BPERMUTE_B32 / DS_PERMUTE_B32)
        addr = ((st.vread(f["addr"], w).astype(np.int64) + off16) >> 2) % WAVE
        data = np.where(lanes, st.vread(f["data0"], w), np.uint32(0))
        rows = np.arange(len(w))[:, None]
        if base == "ds_bpermute_b32":
            got = data[rows, addr]
        else:
            got = np.zeros_like(data)
            rr, ll = np.nonzero(lanes)
            got[rr, addr[rr, ll]] = data[rr, ll]
        _defer_lanes(st, ins, LGKMCNT, w, sel, [("v", f["vdst"], got[sel])])
        return
    two = {"ds_load_2addr_b32": (4, 4, True), "ds_load_2addr_stride64_b32": (4, 256, True),
           "ds_store_2addr_b32": (4, 4, False), "ds_store_2addr_stride64_b32": (4, 256, False),
           "ds_load_2addr_b64": (8, 8, True), "ds_store_2addr_b64": (8, 8, False)}
    if base in two:
        size, unit, load = two[base]
        nw = size // 4
        loaded: list[tuple[str, int, np.ndarray]] = []
        for k, off in enumerate((f["offset0"], f["offset1"])):
            rows, cols = _lds_index(st, ins, w, sel, a0 + off * unit, size, store=not load)
            if load:
                words = np.ascontiguousarray(st.lds[rows, cols]).view(np.uint32)
                loaded += [("v", f["vdst"] + k * nw + r, words[:, r]) for r in range(nw)]
            else:
                src = f["data0"] if k == 0 else f["data1"]
                words = np.stack([st.vread(src + r, w[sel[0]], sel[1]) for r in range(nw)], axis=1)
                st.lds[rows, cols] = words.astype(np.uint32).view(np.uint8).reshape(len(a0), -1)
        if load:
            _defer_lanes(st, ins, LGKMCNT, w, sel, loaded)
        return
    raise MockUnsupported(ins.name)


# ---------------------------------------------------------------------- the launch
def _step(st: _State, ins: Instr, w: np.ndarray) -> None:
    mnemonic = ins.mnemonic
    if mnemonic is None:
        raise MockUnsupported(ins.name, "the opcode table (optable.py) has no entry for it")
    base = mnemonic_base(mnemonic)
    fmt = ins.fmt
    if fmt == "SOPP":
        if _sopp(st, ins, w, base):
            return
    elif fmt in ("SOP1", "SOP2", "SOPC", "SOPK"):
        _salu(st, ins, w, base)
    elif fmt == "SMEM":
        _smem(st, ins, w, base)
    elif fmt in ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P"):
        _valu(st, ins, w, base, mnemonic)()
    elif fmt == "VOPD":
        if ins.mnemonic_y is None:
            raise MockUnsupported(f"<VOPDY opcode {ins.op_y}>", "the opcode table has no entry for it")
        if w is st.all_waves:
            # both halves read the old registers: gather copies, since a slice's views would let the X
            # write-back change what Y writes (a swap through v_dual_mov_b32)
            w = w.copy()
        wx = _valu(st, ins, w, base, mnemonic, "x")
        wy = _valu(st, ins, w, mnemonic_base(ins.mnemonic_y), ins.mnemonic_y, "y")
        wx()
        wy()
    elif fmt == "DS":
        _ds(st, ins, w, base)
    elif fmt == "FLAT":
        _flat(st, ins, w, base)
    elif fmt == "MUBUF" and base in _NOPS:
        pass  # buffer_gl0_inv / buffer_gl1_inv: cache invalidations, no-ops for coherent memory
    else:
        raise MockUnsupported(mnemonic, f"{fmt} instructions")
    st.pc[w] += ins.size


def _init_waves(st: _State, kd: KernelDescriptor, kernarg_va: int, groups: list[tuple[int, int, int]],
                local: tuple[int, int, int]) -> None:
    nthreads = local[0] * local[1] * local[2]
    wpg = -(-nthreads // WAVE)
    ids = np.arange(nthreads)
    tx, ty, tz = ids % local[0], (ids // local[0]) % local[1], ids // (local[0] * local[1])
    packed = (tx | (ty << WORKITEM_ID_BITS) | (tz << 2 * WORKITEM_ID_BITS)).astype(np.uint32)
    if kd.workitem_id_dims == 0:  # only X enabled: Y and Z read as 0
        packed &= np.uint32((1 << WORKITEM_ID_BITS) - 1)
    elif kd.workitem_id_dims == 1:
        packed &= np.uint32((1 << 2 * WORKITEM_ID_BITS) - 1)
    padded = np.zeros(wpg * WAVE, np.uint32)
    padded[:nthreads] = packed
    user = 0
    props = kd.kernel_code_properties
    for bit, what in _UNSUPPORTED_USER_SGPRS.items():
        if props & bit:
            raise MockUnsupported("launch", f"kernel descriptor asks for the {what} user SGPRs")
    for g, gid in enumerate(groups):
        for k in range(wpg):
            wv = g * wpg + k
            st.group[wv] = g
            st.wave_in_group[wv] = k
            if props & KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR:
                st.s[wv, user] = kernarg_va & 0xFFFFFFFF
                st.s[wv, user + 1] = kernarg_va >> 32
            nxt = kd.user_sgpr_count  # system SGPRs start right after the USER_SGPR_COUNT user SGPRs
            for dim, on in enumerate(kd.workgroup_id_enabled):
                if on:
                    st.s[wv, nxt] = gid[dim]
                    nxt += 1
            live = min(WAVE, nthreads - k * WAVE)
            st.s[wv, EXEC_LO] = (1 << live) - 1
            st.v[0][wv] = padded[k * WAVE:(k + 1) * WAVE]


def run(program: Program, memory: MemoryMap, kernarg: bytes, grid: tuple[int, int, int],
        local: tuple[int, int, int], *, kernarg_va: int = KERNARG_VA, max_steps: int = DEFAULT_MAX_STEPS,
        count: bool = False) -> RunStats:
    """Run `program` for `grid` workgroups (x, y, z counts) of `local` work-items each. `kernarg` is copied to
    memory at `kernarg_va` (mapped for the launch) and its address loaded into the kernarg user SGPRs."""
    kd = program.kd
    if not kd.wave32:
        raise MockUnsupported("launch", "wave64 code (the mock runs wave32 only)")
    if len(kernarg) < kd.kernarg_size:
        raise ValueError(f"{program.name}: kernarg segment of {len(kernarg)} bytes, the kernel descriptor "
                         f"needs {kd.kernarg_size}")
    if min(grid) < 1 or min(local) < 1:
        raise ValueError(f"{program.name}: empty launch grid={grid} local={local}")
    if max(local) >= 1 << WORKITEM_ID_BITS:
        raise ValueError(f"{program.name}: local size {local} exceeds the 10-bit work-item id fields")
    if kd.private_segment_fixed_size:
        raise MockUnsupported("launch", "scratch (private segment) memory")
    for dim in (1, 2):
        if local[dim] > 1 and kd.workitem_id_dims < dim:
            raise RDNA3Fault(f"{program.name}: local size {local} but the descriptor enables work-item ids "
                             f"for {kd.workitem_id_dims + 1} dimension(s) only")
    nthreads = local[0] * local[1] * local[2]
    wpg = -(-nthreads // WAVE)
    all_groups = [(x, y, z) for z in range(grid[2]) for y in range(grid[1]) for x in range(grid[0])]
    per_batch = max(1, MAX_WAVES_PER_BATCH // wpg)
    stats = RunStats(executed={} if count else None)
    padded = bytes(kernarg) + bytes(-len(kernarg) % KERNARG_ALIGN)
    memory.map(kernarg_va, padded or bytes(KERNARG_ALIGN))
    try:
        for start in range(0, len(all_groups), per_batch):
            groups = all_groups[start:start + per_batch]
            st = _State(program, memory, len(groups) * wpg, vgpr_count(kd), len(groups))
            _init_waves(st, kd, kernarg_va, groups, local)
            stats.waves += len(groups) * wpg
            _run_batch(st, max_steps - stats.steps, stats)
    finally:
        memory.unmap(kernarg_va)
    return stats


# SOPP instructions after which every wave that ran them is at the next instruction and still running
_STRAIGHT_SOPP = frozenset(_NOPS | {"s_waitcnt"})


def _run_batch(st: _State, budget: int, stats: RunStats) -> None:
    prog = st.prog
    limit = stats.steps + budget
    together = -1  # the pc every wave of the batch is at, all running, when known without looking (else -1)
    while True:
        if together >= 0:
            pc, w = together, st.all_waves
        else:
            running = st.status == RUNNING
            if not running.any():
                parked = st.status == PARKED
                if not parked.any():
                    return
                raise RDNA3Fault(f"{prog.name}: waves wait at s_barrier forever")  # unreachable: see below
            pc = int(st.pc[running].min())
            here = running & (st.pc == pc)
            w = st.all_waves if here.all() else np.nonzero(here)[0]
        ins = prog.at(pc)
        try:
            _step(st, ins, w)
        except RDNA3Fault as e:
            where = f"{prog.name}: pc {pc - prog.entry:#x} {ins.name} (waves {w[:4].tolist()}"
            where += "...)" if len(w) > 4 else ")"
            if isinstance(e, MockUnsupported):
                e.args = (f"{where}: {e.args[0]}",)
                raise
            raise type(e)(f"{where}: {e}") from e
        except IndexError as e:
            raise RDNA3Fault(f"{prog.name}: pc {pc - prog.entry:#x} {ins.name}: register out of range "
                             f"({e})") from e
        stats.steps += 1
        if stats.executed is not None:
            stats.executed[ins.name] = stats.executed.get(ins.name, 0) + 1
        if stats.steps >= limit:
            raise RDNA3Fault(f"{prog.name}: still running after {stats.steps} steps (runaway loop?)")
        if w is st.all_waves and (ins.fmt != "SOPP" or ins.mnemonic in _STRAIGHT_SOPP):
            together = pc + ins.size  # all ran it and none can branch, park or end: all are at the next pc
            continue
        together = -1
        if ins.mnemonic == "s_barrier" or (st.status == PARKED).any():
            _release_barriers(st)


def _release_barriers(st: _State) -> None:
    """Release each workgroup whose every wave that has not ended waits at the barrier."""
    for g in np.unique(st.group[st.status == PARKED]):
        mine = st.group == g
        if not (st.status[mine] == RUNNING).any():
            st.status[mine & (st.status == PARKED)] = RUNNING
            st.lds_writer[g] = -1  # accesses before the barrier are ordered before those after it
            st.lds_readers[g] = 0
