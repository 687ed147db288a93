"""A PTX interpreter in numpy: the mock GPU runs our kernels with it (no hardware needed).

Execution model: the threads of a batch of blocks run together, one numpy array per register with one
lane per thread. Control flow is per lane: every lane has its own program counter and each step runs the
instruction at the lowest pc among live lanes, for the lanes at that pc (masked by the guard predicate).
That is exact for divergent branches and loops with different trip counts, and reconverges as soon as the
lanes' pcs meet again. `bar.sync` requires every live (not exited) thread of the block at the same
barrier, else PTXError (hardware would hang or be undefined). `shfl.sync.bfly` likewise needs every lane of
the warp at the instruction, with the full membermask. A launch that runs more than `max_steps`
steps (one step = one instruction for the lanes at one pc) raises PTXError.

Adversarial scheduling (`PTXModule(..., adversarial=True)` or `launch(..., adversarial=True)`; the default is
the env var PTX_ADVERSARIAL=1, which CI sets): lockstep lanes would make a missing or misplaced `bar.sync`
harmless, so in this mode the warps of a block (a warp = 32 consecutive linear thread ids) run one at a time
between barriers: in barrier epoch e (the code between two completed barriers of the block), in the order
`warp_order(nwarps, e, seed)`: the last warp first, down to warp 0, rotated left by (e + seed) % nwarps, so
each epoch starts with another warp. A warp runs until each of its threads waits at a `bar.sync` or has
exited; when every warp has, the barrier completes (all live threads of the block must wait at the same
`bar.sync`, else PTXError). The blocks of a batch are independent and run the same warp position together.
Kernels with neither `bar.sync` nor shared memory run in lockstep as before (no order to vary). Lanes of one
warp still run together (the SIMT model; `shfl.sync` stays whole-warp). Limitation: sm_70+ has independent
thread scheduling, so on hardware the lanes of a warp may also interleave between reconvergence points;
intra-warp exchanges through shared memory without `__syncwarp` (`bar.warp.sync`) are not reported.

Race detector (always on for kernels with shared memory, in both modes; it costs little: per byte of shared
memory the writer warp and a reader bit per warp, reset when a barrier completes): within one barrier epoch
of a block, a read of bytes another warp wrote, or a write to bytes another warp read or wrote, raises
PTXError "<kernel>: line N: '<instr>': shared-memory race in block B: warp W reads/writes K bytes at shared
address A and warp V wrote/read byte A' at line M in the same barrier epoch, without bar.sync between". The
set of accesses in an epoch does not depend on the order warps run in, so lockstep runs report the same
races; adversarial order also makes the racing values wrong, as they could be on hardware.

Memory: `.global` goes through a `GlobalMemory` (the mock GPU's address space); `.shared` is one byte
array per block, `.local` one per thread, `.param` the launch's parameter buffer. Generic addresses of
shared and local memory (from `cvta.shared`/`cvta.local`) live in windows at `GENERIC_SHARED_BASE` and
`GENERIC_LOCAL_BASE`; every other generic address is global (as on hardware, where generic global
addresses equal global ones). Accesses must be aligned to their size (PTXError otherwise). The
interpreter asks `GlobalMemory.load` for unsigned integers of the access width (uint8/16/32/64) and
passes `store` values of those types, so a memory only moves bytes; faults it raises propagate unchanged.
Races through global memory are not detected.

Numerics: integer ops wrap; exact float ops round to their type (numpy). The approximate float32
instructions return a result off by the full error bound the PTX ISA documents (section 9.7.3), in a
direction given by a hash of the input bits (so both signs occur and results are not exactly rounded):
ex2.approx 2 ulp from the correctly rounded result; lg2.approx 2^-22 absolute for inputs in (0.5, 2), 2^-22
relative elsewhere; sin/cos.approx 2^-20.5 absolute in [-2pi, 2pi], 2^-14.7 in [-100pi, 100pi] (results kept
in [-1, 1]); beyond that the ISA gives no bound: the interpreter records a line in `PTXModule.warnings` and
models a float32 argument reduction (error about |x| * 2^-22); tanh.approx 2^-11 relative; rsqrt.approx
2^-22.9 relative; sqrt.approx 2^-23 relative; rcp.approx 1 ulp; div.approx 2 ulp for |b| in [2^-126, 2^126]
and a sign-preserving zero (NaN for infinite a) for larger |b|; div.full 2 ulp. The ISA's tables of special
inputs (zeros, infinities, NaN) are exact. The .f64 approximations (rcp/rsqrt.approx.f64) are exactly
rounded; ex2/lg2/sin/cos/tanh need `.approx` and have no .f64 form (PTXError). `.ftz` on a float32 instruction
(arithmetic, min/max, the approximations, setp, cvt with a float32 source or destination) flushes subnormal
inputs and results to zero of the same sign; without it subnormals are kept; .ftz on other types is
ignored. cvt from integer to float honours only round-to-nearest (other modes round to nearest too);
float-to-float cvt honours .rn/.rz/.rm/.rp. Integer division by zero gives all ones (hardware leaves it
unspecified).
"""
from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rawgrad.drivers.nv.mock.ptx_parse import (
    MAX_THREADS_PER_BLOCK,
    TYPES,
    Entry,
    Instr,
    Operand,
    PTXError,
    parse,
)

__all__ = ["GlobalMemory", "PTXError", "PTXModule", "NumpyMemory", "MemoryFault", "GENERIC_SHARED_BASE",
           "GENERIC_LOCAL_BASE"]

GENERIC_SHARED_BASE = 0xFE00_0000_0000_0000  # generic-address window of the block's shared memory
GENERIC_LOCAL_BASE = 0xFF00_0000_0000_0000  # generic-address window of the thread's local memory
GENERIC_WINDOW = 1 << 48
MAX_BATCH_LANES = 16384  # threads run together in one numpy step (several blocks when blocks are small)
WARP_SIZE = 32

_U = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_S = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
_F = {16: np.float16, 32: np.float32, 64: np.float64}
_BF16_QUIET_NAN = 0x7FFF  # the canonical NaN cvt.rn.bf16.f32 produces on hardware


class GlobalMemory(Protocol):
    """The address space kernels read and write (implemented by the mock GPU, and NumpyMemory here)."""

    def load(self, addresses: np.ndarray, dtype: np.dtype) -> np.ndarray: ...

    def store(self, addresses: np.ndarray, values: np.ndarray) -> None: ...


class MemoryFault(Exception):
    """An access outside every allocation of a NumpyMemory."""


class NumpyMemory:
    """A GlobalMemory for tests: allocations are numpy byte arrays keyed by their base address."""

    BASE = 0x10_0000_0000  # first address handed out; far from 0 so a null pointer faults
    ALIGN = 256  # allocation alignment (what cudaMalloc guarantees)

    def __init__(self) -> None:
        self.regions: dict[int, np.ndarray] = {}
        self._next = self.BASE

    def alloc(self, data: np.ndarray | int) -> int:
        """Place `data` (bytes of any array, or a zeroed size in bytes) in memory; returns its address."""
        buf = np.zeros(data, np.uint8) if isinstance(data, int) else \
            np.ascontiguousarray(data).reshape(-1).view(np.uint8).copy()
        va = self._next
        self.regions[va] = buf
        # a gap after each allocation, so running off the end faults instead of reading a neighbour
        self._next = va + -(-max(buf.size, 1) // self.ALIGN) * self.ALIGN + self.ALIGN
        return va

    def read(self, va: int, dtype: Any, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        return self.load(np.uint64(va) + np.arange(count, dtype=np.uint64) * np.uint64(dt.itemsize), dt)

    def _locate(self, addresses: np.ndarray, size: int) -> tuple[np.ndarray, list[int]]:
        bases = sorted(self.regions)
        addr = addresses.astype(np.uint64).reshape(-1)
        which = np.searchsorted(np.array(bases, dtype=np.uint64), addr, side="right") - 1
        if which.size and (which < 0).any():
            bad = int(addr[which < 0][0])
            raise MemoryFault(f"access of {size} bytes at {bad:#x}: not in any allocation")
        for k in np.unique(which):
            base = bases[int(k)]
            sel = which == k
            end = addr[sel] - np.uint64(base) + np.uint64(size)
            if (end > np.uint64(self.regions[base].size)).any():
                bad = int(addr[sel][end > np.uint64(self.regions[base].size)][0])
                raise MemoryFault(f"access of {size} bytes at {bad:#x}: past the end of the allocation at "
                                  f"{base:#x} ({self.regions[base].size} bytes)")
        return which, bases

    def load(self, addresses: np.ndarray, dtype: np.dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        which, bases = self._locate(addresses, dt.itemsize)
        addr = addresses.astype(np.uint64).reshape(-1)
        out = np.empty((addr.size, dt.itemsize), np.uint8)
        lanes = np.arange(dt.itemsize, dtype=np.int64)
        for k in np.unique(which):
            base = bases[int(k)]
            sel = which == k
            off = (addr[sel] - np.uint64(base)).astype(np.int64)
            out[sel] = self.regions[base][off[:, None] + lanes]
        return out.view(dt).reshape(addresses.shape)

    def store(self, addresses: np.ndarray, values: np.ndarray) -> None:
        vals = np.ascontiguousarray(values).reshape(-1)
        size = vals.dtype.itemsize
        which, bases = self._locate(addresses, size)
        addr = addresses.astype(np.uint64).reshape(-1)
        raw = vals.view(np.uint8).reshape(-1, size)
        lanes = np.arange(size, dtype=np.int64)
        for k in np.unique(which):
            base = bases[int(k)]
            sel = which == k
            off = (addr[sel] - np.uint64(base)).astype(np.int64)
            self.regions[base][off[:, None] + lanes] = raw[sel]


# ---------------------------------------------------------------------- values and bits
@dataclass(frozen=True)
class _T:
    """An instruction type: kind (b/u/s/f/bf/pred) and bits; `np` holds its values."""

    kind: str
    bits: int

    @property
    def np(self) -> Any:
        if self.kind == "pred":
            return np.bool_
        if self.kind in "bu":
            return _U[self.bits]
        if self.kind == "s":
            return _S[self.bits]
        if self.kind == "bf":
            return np.float32  # bfloat16 values are held as float32 numbers
        return _F[self.bits]

    @property
    def is_float(self) -> bool:
        return self.kind in ("f", "bf")


def _t(name: str) -> _T:
    k, b = TYPES[name]
    return _T(k, b)


def _bf16_round_bits(f: np.ndarray) -> np.ndarray:
    """float32 values -> bfloat16 bits, round to nearest even; NaN -> the canonical NaN."""
    bits = np.asarray(f, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return np.where(np.isnan(f), np.uint32(_BF16_QUIET_NAN), rounded).astype(np.uint16)


def to_bits(vals: Any, t: _T) -> np.ndarray:
    """Values of type t -> their bit patterns (unsigned ints of t's width)."""
    if t.kind == "pred":
        return np.asarray(vals, np.bool_)
    if t.kind == "bf":
        return _bf16_round_bits(np.asarray(vals, np.float32))
    return np.asarray(vals).astype(t.np, copy=False).view(_U[t.bits])


def from_bits(bits: np.ndarray, t: _T) -> np.ndarray:
    if t.kind == "pred":
        return bits.astype(np.bool_, copy=False)
    if t.kind == "bf":
        return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return bits.view(t.np)


def _resize_bits(bits: np.ndarray, to_bits_: int, signed: bool) -> np.ndarray:
    """Truncate, or zero-/sign-extend, unsigned bit patterns to another width."""
    frm = bits.dtype.itemsize * 8
    if frm == to_bits_:
        return bits
    if frm > to_bits_ or not signed:
        return bits.astype(_U[to_bits_])
    return bits.view(_S[frm]).astype(_S[to_bits_]).view(_U[to_bits_])


class _Fault(Exception):
    """A fault inside one instruction; the launch loop adds kernel, line and text."""


# ---------------------------------------------------------------------- per-launch state
class _State:
    """Registers, memories and thread ids of the lanes of one batch of blocks."""

    def __init__(self, entry: Entry, grid: tuple[int, int, int], block: tuple[int, int, int],
                 first_block: int, nblocks: int, params: np.ndarray, memory: GlobalMemory,
                 notes: list[str] | None = None):
        self.entry = entry
        self.notes = notes if notes is not None else []
        self.first_block = first_block
        self.line = 0  # source line of the instruction running now (the race detector records it)
        self.memory = memory
        self.params = params
        nthreads = block[0] * block[1] * block[2]
        self.nthreads = nthreads
        self.nlanes = nthreads * nblocks
        lane = np.arange(self.nlanes, dtype=np.int64)
        self.block_of_lane = lane // nthreads
        t = lane % nthreads
        tid = (t % block[0], (t // block[0]) % block[1], t // (block[0] * block[1]))
        b = first_block + self.block_of_lane
        ctaid = (b % grid[0], (b // grid[0]) % grid[1], b // (grid[0] * grid[1]))
        self.specials: dict[str, Any] = {}
        for c, k in zip("xyz", range(3)):
            self.specials[f"%tid.{c}"] = tid[k].astype(np.uint32)
            self.specials[f"%ctaid.{c}"] = ctaid[k].astype(np.uint32)
            self.specials[f"%ntid.{c}"] = np.uint32(block[k])
            self.specials[f"%nctaid.{c}"] = np.uint32(grid[k])
        self.specials["%laneid"] = (t % WARP_SIZE).astype(np.uint32)
        self.specials["%warpid"] = (t // WARP_SIZE).astype(np.uint32)
        self.specials["%nwarpid"] = np.uint32(-(-nthreads // WARP_SIZE))
        self.warp_in_block = t // WARP_SIZE  # a warp is 32 consecutive linear thread ids of a block
        self.regs: dict[str, np.ndarray] = {}
        for name, (kind, bits) in entry.regs.items():
            self.regs[name] = np.zeros(self.nlanes, np.bool_ if kind == "pred" else _U[max(bits, 8)])
        self.shared = np.zeros((nblocks, entry.shared_size), np.uint8)
        self.local = np.zeros((self.nlanes, entry.local_size), np.uint8)
        self.races = _RaceTracker(nblocks, entry.shared_size) if entry.shared_size else None

    def note(self, instr: Instr, message: str) -> None:
        """Record a warning about an instruction (once per kernel and line) in the module's list."""
        head = f"{self.entry.name}: line {instr.line}: "
        if not any(n.startswith(head) for n in self.notes):
            self.notes.append(f"{head}{instr.text!r}: {message}")


class _RaceTracker:
    """Shared-memory accesses of the current barrier epoch of each block, per byte: the warp that wrote it
    (-1: none), the warps that read it (a bit per warp; at most 32 warps in a block) and the lines."""

    def __init__(self, nblocks: int, size: int):
        self.writer = np.full((nblocks, size), -1, np.int16)
        self.wline = np.zeros((nblocks, size), np.int32)
        self.readers = np.zeros((nblocks, size), np.uint32)
        self.rline = np.zeros((nblocks, size), np.int32)

    def new_epoch(self, blocks: Any) -> None:
        """A bar.sync completed for `blocks` (row indices or a slice): their accesses are ordered now."""
        self.writer[blocks] = -1
        self.readers[blocks] = 0

    def access(self, st: _State, rows: np.ndarray, cols: np.ndarray, warps: np.ndarray, store: bool) -> None:
        """Check then record one instruction's accesses: lane k touches bytes cols[k] of block rows[k]."""
        r = rows[:, None]
        w = warps[:, None].astype(np.int16)
        bit = (np.uint32(1) << warps.astype(np.uint32))[:, None]
        wrote = self.writer[r, cols]
        clash = (wrote >= 0) & (wrote != w)
        if clash.any():
            self._report(st, rows, cols, warps, clash, wrote, self.wline, store, "wrote")
        if store:
            read = self.readers[r, cols] & ~bit
            if read.any():
                other = _lowest_bit(read)
                self._report(st, rows, cols, warps, read != 0, other, self.rline, store, "read")
            self.writer[r, cols] = w
            self.wline[r, cols] = st.line
            twice = self.writer[r, cols] != w  # two warps wrote the same bytes in this one instruction
            if twice.any():
                self._report(st, rows, cols, warps, twice, self.writer[r, cols], self.wline, store, "wrote")
        else:
            shape = cols.shape
            np.bitwise_or.at(self.readers, (np.broadcast_to(r, shape), cols), np.broadcast_to(bit, shape))
            self.rline[r, cols] = st.line

    def _report(self, st: _State, rows: np.ndarray, cols: np.ndarray, warps: np.ndarray, bad: np.ndarray,
                other: np.ndarray, lines: np.ndarray, store: bool, did: str) -> None:
        k, byte = (int(x[0]) for x in np.nonzero(bad))
        block, addr, at = int(rows[k]), int(cols[k, 0]), int(cols[k, byte])
        raise _Fault(f"shared-memory race in block {st.first_block + block}: warp {int(warps[k])} "
                     f"{'writes' if store else 'reads'} {cols.shape[1]} bytes at shared address {addr:#x} "
                     f"and warp {int(other[k, byte])} {did} byte {at:#x} at line {int(lines[block, at])} in "
                     "the same barrier epoch, without bar.sync between")


def _lowest_bit(v: np.ndarray) -> np.ndarray:
    """Index of the lowest set bit of each uint32 (0 where none is set)."""
    return np.log2((v & (~v + np.uint32(1))).astype(np.float64) + (v == 0)).astype(np.int64)


Sel = Any  # slice(None) (every lane) or an index array of the lanes an instruction runs for
Reader = Callable[[_State, Sel], Any]


# ---------------------------------------------------------------------- operand access
def _reader(op: Operand, t: _T, entry: Entry) -> Reader:
    """A function giving the operand's values as type t for the selected lanes."""
    if op.kind == "reg":
        name = op.name
        rkind, rbits = entry.regs[name]
        if t.kind == "pred" or rkind == "pred":
            if not (t.kind == "pred" and rkind == "pred"):
                raise ValueError(f"{name} is {'a' if rkind == 'pred' else 'not a'} predicate")
            return lambda st, sel: st.regs[name][sel]
        rbits = max(rbits, 8)
        if rbits == t.bits:
            return lambda st, sel: from_bits(st.regs[name][sel], t)
        signed = t.kind == "s"
        return lambda st, sel: from_bits(_resize_bits(st.regs[name][sel], t.bits, signed), t)
    if op.kind == "not":
        inner = _reader(op.parts[0], t, entry)
        if t.kind != "pred":
            raise ValueError("'!' applies to predicates only")
        return lambda st, sel: ~inner(st, sel)
    if op.kind == "imm":
        v = _imm_value(op, t)
        return lambda st, sel: v
    if op.kind == "sreg":
        name = op.name

        def special(st: _State, sel: Sel) -> Any:
            v = st.specials[name]
            v = v[sel] if isinstance(v, np.ndarray) else v
            return np.asarray(v).astype(t.np) if t.bits != 32 or t.kind not in "bus" else v
        return special
    if op.kind == "sym":
        addr = _symbol_address(op.name, entry)
        v2 = np.asarray(addr).astype(t.np)
        return lambda st, sel: v2
    raise ValueError(f"operand of kind {op.kind} cannot be read here")


def _symbol_address(name: str, entry: Entry) -> int:
    for p in entry.params:
        if p.name == name:
            return p.offset
    if name in entry.shared:
        return entry.shared[name]
    if name in entry.local:
        return entry.local[name]
    raise ValueError(f"unknown symbol {name!r}")


def _symbol_space(name: str, entry: Entry) -> str:
    if any(p.name == name for p in entry.params):
        return "param"
    if name in entry.shared:
        return "shared"
    if name in entry.local:
        return "local"
    raise ValueError(f"unknown symbol {name!r}")


def _imm_value(op: Operand, t: _T) -> Any:
    v = op.value
    if t.kind == "pred":
        return np.bool_(v != 0)
    if t.is_float:
        if op.fkind == "int" and t.kind == "f":
            # an integer literal in a float instruction is its value (ptxas accepts e.g. `mov.f32 %f, 0`)
            return np.asarray(float(v)).astype(t.np)[()]
        return np.asarray(float(v)).astype(t.np)[()]
    if op.fkind == "f32bits" and t.bits == 32 or op.fkind == "f64bits" and t.bits == 64:
        # a float literal in a bit-type instruction (mov.b32 %r, 0f3F800000) is its bit pattern
        return np.asarray(v, np.float32 if t.bits == 32 else np.float64).view(_U[t.bits]).view(t.np)[()]
    if op.fkind != "int":
        raise ValueError(f"float immediate {v!r} in an integer instruction")
    return np.asarray(int(v) & ((1 << t.bits) - 1)).astype(_U[t.bits]).view(t.np)[()]


def _writer(op: Operand, t: _T, entry: Entry) -> Callable[[_State, Sel, Any], None]:
    """A function storing values of type t into the operand (a register or the sink `_`)."""
    if op.kind == "sink":
        return lambda st, sel, v: None
    if op.kind != "reg":
        raise ValueError(f"destination must be a register, got {op.kind}")
    name = op.name
    rkind, rbits = entry.regs[name]
    if (rkind == "pred") != (t.kind == "pred"):
        raise ValueError(f"{name} is {'a' if rkind == 'pred' else 'not a'} predicate")
    if t.kind == "pred":
        def write_pred(st: _State, sel: Sel, v: Any) -> None:
            st.regs[name][sel] = v
        return write_pred
    rbits = max(rbits, 8)
    signed = t.kind == "s"

    def write(st: _State, sel: Sel, v: Any) -> None:
        st.regs[name][sel] = _resize_bits(to_bits(v, t), rbits, signed)
    return write


# ---------------------------------------------------------------------- memory
def _address_reader(op: Operand, entry: Entry) -> tuple[Reader, str | None]:
    """(address reader as uint64, the state space a bare symbol names or None)."""
    if op.kind != "addr":
        raise ValueError("expected an address operand [..]")
    off = np.uint64(op.value & (2 ** 64 - 1))
    if not op.parts:
        return (lambda st, sel: off), None
    base = op.parts[0]
    if base.kind == "sym":
        a = np.uint64(_symbol_address(base.name, entry)) + off
        return (lambda st, sel: a), _symbol_space(base.name, entry)
    if base.kind != "reg":
        raise ValueError("address base must be a register or a symbol")
    rbits = max(entry.regs[base.name][1], 8)
    r = _reader(base, _T("u", rbits), entry)
    if rbits == 64:
        return (lambda st, sel: r(st, sel) + off), None
    return (lambda st, sel: r(st, sel).astype(np.uint64) + off), None


def _space_access(st: _State, sel: Sel, space: str, addr: np.ndarray, size: int,
                  values: np.ndarray | None) -> np.ndarray | None:
    """Load (values None) or store `size`-byte elements in a per-block / per-lane / param byte space."""
    if space == "shared":
        mem, rows, limit = st.shared, st.block_of_lane, st.entry.shared_size
    elif space == "local":
        mem, rows, limit = st.local, np.arange(st.nlanes), st.entry.local_size
    else:
        mem, rows, limit = st.params[None, :], np.zeros(st.nlanes, np.int64), st.params.size
    a = np.broadcast_to(np.asarray(addr, np.uint64), np.shape(rows[sel])).astype(np.int64)
    if a.size and (a.min() < 0 or a.max() + size > limit):
        bad = int(a[(a < 0) | (a + size > limit)][0])
        raise _Fault(f"{space} access of {size} bytes at offset {bad:#x} outside the {limit}-byte "
                     f"{space} space")
    cols = a[:, None] + np.arange(size)
    r = rows[sel][:, None]
    if space == "shared" and st.races is not None:
        st.races.access(st, rows[sel], cols, st.warp_in_block[sel], values is not None)
    if values is None:
        return np.ascontiguousarray(mem[r, cols]).view(_U[size * 8]).reshape(-1)
    if space == "param":
        raise _Fault("kernel parameters are read-only")
    mem[r, cols] = np.ascontiguousarray(values.astype(_U[size * 8])).view(np.uint8).reshape(-1, size)
    return None


def _check_aligned(addr: Any, size: int) -> None:
    a = np.asarray(addr, np.uint64)
    if a.size and (a % np.uint64(size)).any():
        bad = int(a[a % np.uint64(size) != 0][0]) if a.ndim else int(a)
        raise _Fault(f"misaligned {size}-byte access at address {bad:#x}")


def _mem_load(st: _State, sel: Sel, space: str, addr: Any, size: int) -> np.ndarray:
    """Bits (uint of size*8) of one element per selected lane."""
    _check_aligned(addr, size)
    n = st.nlanes if isinstance(sel, slice) else len(sel)
    a = np.broadcast_to(np.asarray(addr, np.uint64), (n,))
    if space == "generic":
        out = np.empty(n, _U[size * 8])
        glob = np.ones(n, bool)
        for sp, base in (("shared", GENERIC_SHARED_BASE), ("local", GENERIC_LOCAL_BASE)):
            inside = (a >= np.uint64(base)) & (a < np.uint64(base + GENERIC_WINDOW))
            if inside.any():
                sub = _lanes(sel, st.nlanes)[inside]
                out[inside] = _space_access(st, sub, sp, a[inside] - np.uint64(base), size, None)  # type: ignore
                glob &= ~inside
        if glob.any():
            out[glob] = np.asarray(st.memory.load(a[glob].copy(), np.dtype(_U[size * 8]))).view(_U[size * 8])
        return out
    if space == "global":
        return np.asarray(st.memory.load(a.copy(), np.dtype(_U[size * 8]))).view(_U[size * 8])
    return _space_access(st, sel, space, a, size, None)  # type: ignore[return-value]


def _mem_store(st: _State, sel: Sel, space: str, addr: Any, size: int, bits: np.ndarray) -> None:
    _check_aligned(addr, size)
    n = st.nlanes if isinstance(sel, slice) else len(sel)
    a = np.broadcast_to(np.asarray(addr, np.uint64), (n,))
    b = np.broadcast_to(np.asarray(bits).astype(_U[size * 8]), (n,))
    if space == "generic":
        glob = np.ones(n, bool)
        for sp, base in (("shared", GENERIC_SHARED_BASE), ("local", GENERIC_LOCAL_BASE)):
            inside = (a >= np.uint64(base)) & (a < np.uint64(base + GENERIC_WINDOW))
            if inside.any():
                sub = _lanes(sel, st.nlanes)[inside]
                _space_access(st, sub, sp, a[inside] - np.uint64(base), size, b[inside])
                glob &= ~inside
        if glob.any():
            st.memory.store(a[glob].copy(), b[glob].copy())
        return
    if space == "global":
        st.memory.store(a.copy(), b.copy())
        return
    _space_access(st, sel, space, a, size, b)


def _lanes(sel: Sel, nlanes: int) -> np.ndarray:
    return np.arange(nlanes) if isinstance(sel, slice) else np.asarray(sel)


# ---------------------------------------------------------------------- instruction compilers
_SPACES = {"global", "shared", "local", "param", "const"}
_CACHE_HINTS = {"ca", "cg", "cs", "lu", "cv", "wb", "wt", "nc", "volatile", "relaxed", "weak", "acquire",
                "release", "cta", "gpu", "sys", "L1::no_allocate", "L1::evict_last", "L1::evict_first",
                "L1::evict_normal", "L1::evict_unchanged", "L2::64B", "L2::128B", "L2::256B"}
_FLOAT_RND = {"rn", "rz", "rm", "rp"}
_INT_RND = {"rni", "rzi", "rmi", "rpi"}
_CMP = {"eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu", "gtu", "geu",
        "num", "nan"}

Exec = Callable[[_State, Sel], None]


@dataclass
class _Compiled:
    """One instruction ready to run: `kind` says how the launch loop treats it."""

    kind: str  # "op" (run then fall through), "bra", "exit", "bar"
    run: Exec | None
    target: int = -1
    guard: tuple[str, bool] | None = None
    instr: Instr | None = None
    line: int = 0


def _split_mods(instr: Instr, allowed: set[str]) -> tuple[list[_T], set[str]]:
    """The instruction's types (in order) and its other modifiers; unknown modifiers raise."""
    types, other = [], set()
    for m in instr.mods:
        if m in TYPES:
            types.append(_t(m))
        elif m in allowed:
            other.add(m)
        else:
            raise ValueError(f"unsupported modifier .{m} for {instr.base}")
    return types, other


def _need(instr: Instr, n: int) -> list[Operand]:
    if len(instr.operands) != n:
        raise ValueError(f"{instr.base} takes {n} operands, got {len(instr.operands)}")
    return instr.operands


def _one_type(types: list[_T], instr: Instr) -> _T:
    if len(types) != 1:
        raise ValueError(f"{instr.base} needs exactly one type")
    return types[0]


def _compile(instr: Instr, entry: Entry) -> _Compiled:
    base = instr.base
    fn = _COMPILERS.get(base)
    if fn is None:
        raise ValueError(f"unknown instruction {'.'.join((base,) + instr.mods)!r}")
    if instr.guard is not None and entry.regs[instr.guard[0]][0] != "pred":
        raise ValueError(f"guard {instr.guard[0]} is not a predicate register")
    out = fn(instr, entry)
    out.guard = instr.guard
    out.instr = instr
    out.line = instr.line
    return out


def _c_mov(instr: Instr, entry: Entry) -> _Compiled:
    types, _ = _split_mods(instr, set())
    t = _one_type(types, instr)
    d, a = _need(instr, 2)
    if a.kind == "vec":  # pack: element 0 in the low bits
        n = len(a.parts)
        et = _T("b", t.bits // n)
        readers = [_reader(p, et, entry) for p in a.parts]
        w = _writer(d, _T("b", t.bits), entry)

        def pack(st: _State, sel: Sel) -> None:
            acc = np.zeros(1, _U[t.bits])
            for k, r in enumerate(readers):
                acc = acc | (np.asarray(r(st, sel)).astype(_U[t.bits]) << _U[t.bits](k * et.bits))
            w(st, sel, acc)
        return _Compiled("op", pack)
    if d.kind == "vec":  # unpack
        n = len(d.parts)
        et = _T("b", t.bits // n)
        r = _reader(a, _T("b", t.bits), entry)
        writers = [_writer(p, et, entry) for p in d.parts]

        def unpack(st: _State, sel: Sel) -> None:
            v = np.asarray(r(st, sel))
            for k, wr in enumerate(writers):
                wr(st, sel, (v >> _U[t.bits](k * et.bits)).astype(_U[et.bits]))
        return _Compiled("op", unpack)
    if a.kind == "sym" and _symbol_space(a.name, entry) == "param":
        raise ValueError("taking the address of a kernel parameter is not supported")
    r = _reader(a, t, entry)
    w = _writer(d, t, entry)
    return _Compiled("op", lambda st, sel: w(st, sel, r(st, sel)))


def _c_ld_st(instr: Instr, entry: Entry) -> _Compiled:
    is_load = instr.base in ("ld", "ldu")
    vec = 1
    space = "generic"
    types: list[_T] = []
    for m in instr.mods:
        if m in TYPES:
            types.append(_t(m))
        elif m in _SPACES:
            space = m
        elif m in ("v2", "v4", "v8"):
            vec = int(m[1:])
        elif m in _CACHE_HINTS or m.startswith("L2::cache_hint"):
            continue
        else:
            raise ValueError(f"unsupported modifier .{m} for {instr.base}")
    t = _one_type(types, instr)
    if space == "const":
        raise ValueError("the .const state space is not supported")
    if t.kind == "pred":
        raise ValueError("ld/st of .pred is not allowed")
    ops = _need(instr, 2)
    reg_op, addr_op = (ops[0], ops[1]) if is_load else (ops[1], ops[0])
    addr_r, sym_space = _address_reader(addr_op, entry)
    if sym_space is not None:
        if space == "generic":
            space = sym_space
        elif space != sym_space:
            raise ValueError(f"symbol is in .{sym_space}, not .{space}")
    if space == "param" and not is_load:
        raise ValueError("st.param is not supported in kernels")
    elems = list(reg_op.parts) if reg_op.kind == "vec" else [reg_op]
    if len(elems) != vec:
        raise ValueError(f"{'.v' + str(vec) if vec > 1 else 'a scalar'} access needs {vec} registers")
    size = t.bits // 8
    bt = _T("b" if t.kind != "s" else "s", t.bits) if not t.is_float else t
    if is_load:
        writers = [_writer(e, bt, entry) for e in elems]

        def load(st: _State, sel: Sel) -> None:
            a = addr_r(st, sel)
            if vec > 1:
                _check_aligned(a, size * vec)
            for k, w in enumerate(writers):
                w(st, sel, from_bits(_mem_load(st, sel, space, a + np.uint64(k * size), size), bt))
        return _Compiled("op", load)
    readers = [_reader(e, bt, entry) for e in elems]

    def store(st: _State, sel: Sel) -> None:
        a = addr_r(st, sel)
        if vec > 1:
            _check_aligned(a, size * vec)
        for k, r in enumerate(readers):
            _mem_store(st, sel, space, a + np.uint64(k * size), size, to_bits(r(st, sel), bt))
    return _Compiled("op", store)


def _c_cvta(instr: Instr, entry: Entry) -> _Compiled:
    to = "to" in instr.mods
    spaces = [m for m in instr.mods if m in ("global", "shared", "local", "const", "param")]
    types, _ = _split_mods(instr, {"to", "global", "shared", "local"})
    t = _one_type(types, instr)
    if len(spaces) != 1 or t.kind not in "bu" or t.bits not in (32, 64):
        raise ValueError("cvta needs one of .global/.shared/.local and .u32/.u64")
    d, a = _need(instr, 2)
    r, w = _reader(a, t, entry), _writer(d, t, entry)
    base = {"global": 0, "shared": GENERIC_SHARED_BASE, "local": GENERIC_LOCAL_BASE}[spaces[0]]
    delta = np.asarray(base & ((1 << t.bits) - 1)).astype(t.np)[()]
    if to:
        return _Compiled("op", lambda st, sel: w(st, sel, np.asarray(r(st, sel)) - delta))
    return _Compiled("op", lambda st, sel: w(st, sel, np.asarray(r(st, sel)) + delta))


def _round_float_to(v: np.ndarray, dt: _T, mode: str) -> np.ndarray:
    """float64 values -> values of float type dt (f16/bf16/f32/f64) with rounding mode rn/rz/rm/rp."""
    v = np.asarray(v, np.float64)
    if dt.kind == "bf":
        nearest = from_bits(_bf16_round_bits(v.astype(np.float32)), dt)
    else:
        nearest = v.astype(dt.np)
    if mode == "rn" or dt.bits == 64:
        return nearest
    back = nearest.astype(np.float64)
    if mode == "rz":
        move = np.abs(back) > np.abs(v)
        toward = np.zeros_like(v)
    elif mode == "rm":
        move, toward = back > v, np.full_like(v, -np.inf)
    else:
        move, toward = back < v, np.full_like(v, np.inf)
    if dt.kind == "bf":
        bits = _bf16_round_bits(nearest).astype(np.int32)
        step = np.where((toward > back) == (back >= 0), 1, -1)
        stepped = from_bits((bits + step).astype(np.uint16), dt)
        return np.where(move & np.isfinite(v), stepped, nearest)
    stepped = np.nextafter(nearest, toward.astype(dt.np))
    return np.where(move & np.isfinite(v), stepped, nearest)


def _c_cvt(instr: Instr, entry: Entry) -> _Compiled:
    types, mods = _split_mods(instr, _FLOAT_RND | _INT_RND | {"ftz", "sat"})
    if len(types) != 2:
        raise ValueError("cvt needs a destination and a source type")
    dt, at = types
    if "pred" in (dt.kind, at.kind):
        raise ValueError("cvt does not convert predicates")
    d, a = _need(instr, 2)
    r, w = _reader(a, at, entry), _writer(d, dt, entry)
    if "ftz" in mods:  # float32 subnormal sources and results flush to sign-preserving zero
        r0, w0 = r, w
        if at.kind == "f" and at.bits == 32:
            r = lambda st, sel: _flush_f32(r0(st, sel))  # noqa: E731
        if dt.kind == "f" and dt.bits == 32:
            w = lambda st, sel, v: w0(st, sel, _flush_f32(v))  # noqa: E731
    irnd = next((m for m in mods if m in _INT_RND), None)
    frnd = next((m for m in mods if m in _FLOAT_RND), None)
    sat = "sat" in mods
    if at.is_float and not dt.is_float:
        if irnd is None:
            raise ValueError("float-to-integer cvt needs .rni/.rzi/.rmi/.rpi")
        rnd = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[irnd]
        lo, hi = (0, 2 ** dt.bits - 1) if dt.kind in "bu" else (-(2 ** (dt.bits - 1)), 2 ** (dt.bits - 1) - 1)

        def f2i(st: _State, sel: Sel) -> None:
            v = rnd(np.asarray(r(st, sel), np.float64))
            # saturate to the destination's range; NaN converts to 0 (PTX ISA, cvt)
            v = np.where(np.isnan(v), 0, np.clip(v, lo, hi))
            w(st, sel, np.asarray(v).astype(np.int64 if dt.kind == "s" or dt.bits < 64 else np.uint64)
              .astype(dt.np))
        return _Compiled("op", f2i)
    if not at.is_float and dt.is_float:
        def i2f(st: _State, sel: Sel) -> None:
            v = np.asarray(r(st, sel))
            if dt.bits == 64 or dt.kind == "bf" or at.bits == 64:
                f = _round_float_to(v.astype(np.float64), dt, "rn")
            else:
                f = v.astype(dt.np)
            if sat:
                f = np.clip(f, 0, 1)
            w(st, sel, f)
        return _Compiled("op", i2f)
    if at.is_float and dt.is_float:
        if irnd is not None:
            rnd2 = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[irnd]

            def f2f_int(st: _State, sel: Sel) -> None:
                v = rnd2(np.asarray(r(st, sel), np.float64))
                w(st, sel, _round_float_to(v, dt, "rn"))
            return _Compiled("op", f2f_int)
        narrowing = dt.bits < at.bits or (dt.kind == "bf" and at.kind == "f" and at.bits == 32) or \
            (dt.kind != at.kind and dt.bits == at.bits)
        mode = frnd or "rn"
        if narrowing and frnd is None:
            raise ValueError("narrowing float cvt needs a rounding modifier (.rn/.rz/.rm/.rp)")

        def f2f(st: _State, sel: Sel) -> None:
            v = _round_float_to(np.asarray(r(st, sel), np.float64), dt, mode)
            if sat:
                v = np.where(np.isnan(v), 0, np.clip(v, 0, 1)).astype(v.dtype)
            w(st, sel, v)
        return _Compiled("op", f2f)

    # integer -> integer: wrap (chop) or, with .sat, clamp to the destination range
    lo2, hi2 = (0, 2 ** dt.bits - 1) if dt.kind in "bu" else (-(2 ** (dt.bits - 1)), 2 ** (dt.bits - 1) - 1)

    def i2i(st: _State, sel: Sel) -> None:
        v = np.asarray(r(st, sel))
        if sat:
            wide = v.astype(np.float64) if v.dtype == np.uint64 else v.astype(np.int64)
            w(st, sel, np.clip(wide, lo2, hi2).astype(dt.np))
            return
        # chop to a narrower type, or extend by the source's signedness to a wider one
        bits = _resize_bits(v.view(_U[at.bits]), dt.bits, at.kind == "s")
        w(st, sel, from_bits(bits, dt))
    return _Compiled("op", i2i)


def _mulhi(a: np.ndarray, b: np.ndarray, t: _T) -> np.ndarray:
    if t.bits < 64:
        wide = np.int64 if t.kind == "s" else np.uint64
        return ((np.asarray(a).astype(wide) * np.asarray(b).astype(wide)) >> wide(t.bits)).astype(t.np)
    # 64 x 64 -> high 64: four 32-bit partial products (unsigned), then the signed correction
    ua, ub = np.asarray(a).view(np.uint64) if np.asarray(a).dtype != np.uint64 else np.asarray(a), \
        np.asarray(b).view(np.uint64) if np.asarray(b).dtype != np.uint64 else np.asarray(b)
    mask = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    al, ah, bl, bh = ua & mask, ua >> s32, ub & mask, ub >> s32
    ll, lh, hl, hh = al * bl, al * bh, ah * bl, ah * bh
    mid = (ll >> s32) + (lh & mask) + (hl & mask)
    hi = hh + (lh >> s32) + (hl >> s32) + (mid >> s32)
    if t.kind == "s":
        zero = np.uint64(0)
        hi = hi - np.where(np.asarray(a) < 0, ub, zero) - np.where(np.asarray(b) < 0, ua, zero)
    return hi.astype(np.uint64).view(t.np)


def _idiv(a: np.ndarray, b: np.ndarray, t: _T, rem: bool) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(a, t.np), np.asarray(b, t.np))
    zero = b == 0
    safe = np.where(zero, np.asarray(1, t.np), b).astype(t.np)
    q = a // safe
    r = a - q * safe
    if t.kind == "s":  # floor -> truncation toward zero
        fix = (r != 0) & ((a < 0) != (safe < 0))
        q = np.where(fix, q + np.asarray(1, t.np), q).astype(t.np)
        r = (a - q * safe).astype(t.np)
    ones = np.asarray(-1 if t.kind == "s" else 2 ** t.bits - 1).astype(t.np)
    return np.where(zero, a if rem else ones, r if rem else q).astype(t.np)


def _shift(a: np.ndarray, amount: np.ndarray, t: _T, left: bool) -> np.ndarray:
    amt = np.asarray(amount).astype(np.uint64)
    big = amt >= np.uint64(t.bits)
    clamped = np.minimum(amt, np.uint64(t.bits - 1)).astype(t.np)
    av = np.asarray(a, t.np)
    if left:
        return np.where(big, np.asarray(0, t.np), np.left_shift(av, clamped)).astype(t.np)
    shifted = np.right_shift(av, clamped)
    if t.kind == "s":
        return shifted.astype(t.np)  # a clamped arithmetic shift fills with the sign, as PTX's does
    return np.where(big, np.asarray(0, t.np), shifted).astype(t.np)


def _float_fn(f: Callable[[np.ndarray], np.ndarray]) -> Callable[[Any, _T], Any]:
    """Apply a float64 function and round once to the instruction type (the 'exact' approximation)."""
    return lambda a, t: f(np.asarray(a, np.float64)).astype(t.np)


def _minmax(a: Any, b: Any, t: _T, is_max: bool, nan: bool) -> Any:
    if t.is_float:
        if nan:
            return (np.maximum if is_max else np.minimum)(a, b)
        return (np.fmax if is_max else np.fmin)(a, b)  # PTX min/max return the non-NaN input
    return (np.maximum if is_max else np.minimum)(a, b)


# ---------------------------------------------------------------------- approximate instructions
# Error bounds the PTX ISA documents for the approximate float32 instructions (PTX ISA 9.x, section 9.7.3
# "Floating Point Instructions"). The interpreter returns a result that is off by the full bound (see
# `_approx_direction` for the sign), so a kernel that relies on more accuracy than the ISA promises fails
# its tolerance here as it could on hardware.
EX2_MAX_ULP = 2  # 9.7.3.21 ex2: "maximum ulp error is 2 ulp from correctly rounded result" (full range)
LG2_ABS_RANGE = (0.5, 2.0)  # 9.7.3.20 lg2: the open input interval with an absolute error bound ...
LG2_MAX_ABS_ERROR = 2.0 ** -22  # ... of 2^-22
LG2_MAX_REL_ERROR = 2.0 ** -22  # 9.7.3.20: relative error 2^-22 for positive finite inputs outside it
SIN_COS_NEAR_RANGE = 2 * math.pi  # 9.7.3.18 sin / 9.7.3.19 cos: absolute error 2^-20.5 in [-2pi, 2pi] ...
SIN_COS_NEAR_ABS_ERROR = 2.0 ** -20.5
SIN_COS_FAR_RANGE = 100 * math.pi  # ... 2^-14.7 in [-100pi, 100pi]; outside only "best effort", no bound
SIN_COS_FAR_ABS_ERROR = 2.0 ** -14.7
TANH_MAX_REL_ERROR = 2.0 ** -11  # 9.7.3.22 tanh.approx.f32: relative error over the entire range
RSQRT_MAX_REL_ERROR = 2.0 ** -22.9  # 9.7.3.16 rsqrt.approx.f32: relative error, positive finite range
SQRT_APPROX_MAX_REL_ERROR = 2.0 ** -23  # 9.7.3.15 sqrt.approx.f32: relative error, positive finite range
RCP_APPROX_MAX_ULP = 1  # 9.7.3.13 rcp.approx.f32: "maximum ulp error is 1 across the full range"
DIV_APPROX_MAX_ULP = 2  # 9.7.3.8 div.approx.f32 (|b| in [2^-126, 2^126]) and div.full.f32 (full range)
DIV_APPROX_MAX_DIVISOR = 2.0 ** 126  # 9.7.3.8: for 2^126 < |b| < 2^128 div.approx gives a sign-preserving
# zero (NaN when a is infinite): it computes a * (1/b), and 1/b is flushed
F32_MIN_NORMAL = 2.0 ** -126  # .ftz flushes float32 values of smaller magnitude (subnormals) to +-0
F32_MAX_FINITE_BITS = 0x7F7FFFFF
F32_SIGN_BIT = 0x80000000
_DIRECTION_HASH = 0x9E3779B1  # Fibonacci hashing multiplier: spreads input bits into the top bit
_ALWAYS_APPROX = {"ex2", "lg2", "sin", "cos", "tanh", "rsqrt"}  # PTX >= 1.4 requires .approx on these
_F32_ONLY = {"ex2", "lg2", "sin", "cos", "tanh"}  # no .f64 forms in the ISA (rsqrt/rcp/sqrt have them)


def _flush_f32(v: Any) -> Any:
    """.ftz: float32 subnormals -> zero of the same sign (NaN, zero, normal and infinite values unchanged)."""
    a = np.asarray(v, np.float32)
    tiny = np.abs(a) < np.float32(F32_MIN_NORMAL)
    return np.where(tiny, np.copysign(np.float32(0), a), a).astype(np.float32)


def _approx_direction(*inputs: Any) -> np.ndarray:
    """+1 or -1 per element: which way an approximate result is off by its full error bound. A hash of the
    inputs' float32 bits: deterministic, and both signs occur over any handful of inputs, so results are
    neither always rounded up nor always exactly rounded."""
    h = np.zeros(np.broadcast(*inputs).shape, np.uint32)
    for k, x in enumerate(inputs):
        bits = np.asarray(x, np.float32).view(np.uint32)
        h = (h ^ (bits + np.uint32(k))) * np.uint32(_DIRECTION_HASH)
    return np.where(h >> np.uint32(31), -1.0, 1.0)


def _step_ulps(r: np.ndarray, ulps: Any) -> np.ndarray:
    """float32 values moved by `ulps` units in the last place away from zero (negative: toward zero); zero,
    infinite and NaN values stay, and the magnitude stays within [0, largest finite]."""
    r = np.asarray(r, np.float32)
    bits = r.view(np.uint32).astype(np.int64)
    mag = np.clip((bits & ~F32_SIGN_BIT & 0xFFFFFFFF) + np.asarray(ulps, np.int64), 0, F32_MAX_FINITE_BITS)
    moved = ((bits & F32_SIGN_BIT) | mag).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(r) & (r != 0), moved, r).astype(np.float32)


def _off_by(exact: np.ndarray, bound: Any, direction: np.ndarray) -> np.ndarray:
    """float32 result = exact + direction * bound (float64 exact and absolute bound), rounded to float32 and
    pulled back one ulp where that rounding carried it past the bound."""
    exact = np.asarray(exact, np.float64)
    r = (exact + direction * bound).astype(np.float32)
    over = np.abs(r.astype(np.float64) - exact) > bound
    back = np.nextafter(r, exact.astype(np.float32))
    finite = np.isfinite(exact)
    return np.where(over & finite, back, np.where(finite, r, exact.astype(np.float32)))


def _approx_ex2(a: Any) -> np.ndarray:
    x = np.asarray(a, np.float64)
    r = np.exp2(x).astype(np.float32)
    r = _step_ulps(r, (_approx_direction(a) * EX2_MAX_ULP).astype(np.int64))
    return np.where(x == 0, np.float32(1), r).astype(np.float32)  # the ISA's table: ex2(+-0) = +1.0


def _approx_lg2(a: Any) -> np.ndarray:
    x = np.asarray(a, np.float64)
    exact = np.log2(x)  # NaN below 0, -inf at +-0, +inf at +inf: the ISA's table
    lo, hi = LG2_ABS_RANGE
    bound = np.where((x > lo) & (x < hi), LG2_MAX_ABS_ERROR, np.abs(exact) * LG2_MAX_REL_ERROR)
    return _off_by(exact, bound, _approx_direction(a))


def _best_effort_turns(x: np.ndarray) -> np.ndarray:
    """The argument in radians after a float32-precision reduction by 2pi (x * float32(1/2pi) rounded to
    float32, its fraction back to radians): what the ISA's "best effort" outside [-100pi, 100pi] can mean;
    its error grows with |x| (about |x| * 2^-22 radians)."""
    turns = (x.astype(np.float32) * np.float32(1 / (2 * math.pi))).astype(np.float64)
    return (turns - np.rint(turns)) * (2 * math.pi)


def _approx_sin_cos(a: Any, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    x = np.asarray(a, np.float64)
    ax = np.abs(x)
    far = np.isfinite(x) & (ax > SIN_COS_FAR_RANGE)
    exact = fn(np.where(far, _best_effort_turns(x), x))
    bound = np.where(ax <= SIN_COS_NEAR_RANGE, SIN_COS_NEAR_ABS_ERROR, SIN_COS_FAR_ABS_ERROR)
    bound = np.minimum(bound, 1 - np.abs(exact))  # the error stays inside [-1, 1]
    r = _off_by(exact, bound, _approx_direction(a))
    zero = np.asarray(fn(np.zeros(1)))[0]  # the ISA's table: sin(+-0) = +-0, cos(+-0) = +1.0
    return np.where(x == 0, np.float32(1) if zero == 1 else np.asarray(a, np.float32), r).astype(np.float32)


def _approx_rel(fn: Callable[[np.ndarray], np.ndarray], rel: float, clip: float | None = None) \
        -> Callable[[Any], np.ndarray]:
    def approx(a: Any) -> np.ndarray:
        exact = fn(np.asarray(a, np.float64))
        bound = np.abs(exact) * rel
        if clip is not None:
            bound = np.minimum(bound, clip - np.abs(exact))
        return _off_by(exact, bound, _approx_direction(a))
    return approx


def _approx_rcp(a: Any) -> np.ndarray:
    r = (1 / np.asarray(a, np.float64)).astype(np.float32)
    return _step_ulps(r, (_approx_direction(a) * RCP_APPROX_MAX_ULP).astype(np.int64))


def _approx_div(a: Any, b: Any, full: bool) -> np.ndarray:
    a64, b64 = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    ulps = (_approx_direction(a, b) * DIV_APPROX_MAX_ULP).astype(np.int64)
    r = _step_ulps((a64 / b64).astype(np.float32), ulps)
    if full:
        return r
    huge = np.isfinite(b64) & (np.abs(b64) > DIV_APPROX_MAX_DIVISOR)
    flushed = np.where(np.isinf(a64), np.nan, np.copysign(0.0, a64) * np.sign(b64))
    return np.where(huge, flushed.astype(np.float32), r).astype(np.float32)


_APPROX_UNARY: dict[str, Callable[[Any], np.ndarray]] = {
    "ex2": _approx_ex2, "lg2": _approx_lg2,
    "sin": lambda a: _approx_sin_cos(a, np.sin), "cos": lambda a: _approx_sin_cos(a, np.cos),
    "tanh": _approx_rel(np.tanh, TANH_MAX_REL_ERROR, clip=1.0),
    "rsqrt": _approx_rel(lambda x: 1 / np.sqrt(x), RSQRT_MAX_REL_ERROR),
    "sqrt": _approx_rel(np.sqrt, SQRT_APPROX_MAX_REL_ERROR), "rcp": _approx_rcp,
}


_UNARY_FLOAT: dict[str, Callable[[Any, _T], Any]] = {
    "sqrt": _float_fn(np.sqrt), "rsqrt": _float_fn(lambda x: 1 / np.sqrt(x)),
    "rcp": _float_fn(lambda x: 1 / x), "ex2": _float_fn(np.exp2), "lg2": _float_fn(np.log2),
    "sin": _float_fn(np.sin), "cos": _float_fn(np.cos), "tanh": _float_fn(np.tanh),
}


def _c_arith(instr: Instr, entry: Entry) -> _Compiled:
    base = instr.base
    allowed = {"lo", "hi", "wide", "rn", "rz", "rm", "rp", "ftz", "sat", "approx", "full", "NaN", "xorsign",
               "abs", "cc"}
    types, mods = _split_mods(instr, allowed)
    if "cc" in mods or "xorsign" in mods or "abs" in mods:
        raise ValueError(f"unsupported modifier on {base}")
    t = _one_type(types, instr)
    ops = instr.operands
    nsrc = {"neg": 1, "abs": 1, "not": 1, "cnot": 1, "popc": 1, "clz": 1, "mad": 3, "fma": 3}.get(base, 2)
    if base in _UNARY_FLOAT:
        nsrc = 1
    _need(instr, nsrc + 1)
    wide = "wide" in mods
    dt = _T(t.kind, t.bits * 2) if wide else t
    if base in ("popc", "clz"):
        dt = _T("u", 32)
    if base in ("shl", "shr"):
        readers = [_reader(ops[1], t, entry), _reader(ops[2], _T("u", 32), entry)]
    elif base in ("mad",) and wide:
        readers = [_reader(ops[1], t, entry), _reader(ops[2], t, entry), _reader(ops[3], dt, entry)]
    else:
        readers = [_reader(o, t, entry) for o in ops[1:]]
    w = _writer(ops[0], dt, entry)
    f = _arith_fn(base, t, mods)
    if "ftz" in mods and t.kind == "f" and t.bits == 32:
        f = _with_ftz(f)
    if base in ("sin", "cos"):
        r0 = readers[0]

        def trig(st: _State, sel: Sel) -> None:
            a = r0(st, sel)
            far = np.isfinite(a) & (np.abs(a) > SIN_COS_FAR_RANGE)
            if far.any():
                st.note(instr, f"{base}.approx of {int(np.count_nonzero(far))} input(s) outside "
                               f"[-100pi, 100pi] (e.g. {float(np.asarray(a)[far][0])!r}): the PTX ISA bounds "
                               "no error there (9.7.3.18/19); the result models a float32 argument reduction")
            w(st, sel, f(a))
        return _Compiled("op", trig)
    if nsrc == 1:
        r0 = readers[0]
        return _Compiled("op", lambda st, sel: w(st, sel, f(r0(st, sel))))
    if nsrc == 2:
        r0, r1 = readers
        return _Compiled("op", lambda st, sel: w(st, sel, f(r0(st, sel), r1(st, sel))))
    r0, r1, r2 = readers
    return _Compiled("op", lambda st, sel: w(st, sel, f(r0(st, sel), r1(st, sel), r2(st, sel))))


def _with_ftz(f: Callable[..., Any]) -> Callable[..., Any]:
    """.ftz on a float32 instruction: subnormal inputs and results flushed to sign-preserving zero."""
    return lambda *args: _flush_f32(f(*[_flush_f32(a) for a in args]))


def _arith_fn(base: str, t: _T, mods: set[str]) -> Callable[..., Any]:
    if t.kind == "pred":
        pred_ops: dict[str, Callable[..., Any]] = {
            "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor, "not": np.logical_not}
        if base not in pred_ops:
            raise ValueError(f"{base} does not take .pred")
        return pred_ops[base]
    if t.kind == "bf" or (t.kind == "f" and t.bits == 16 and base in _UNARY_FLOAT):
        raise ValueError(f"{base} on .{'bf16' if t.kind == 'bf' else 'f16'} is not supported")
    if base in _UNARY_FLOAT:
        if not t.is_float:
            raise ValueError(f"{base} needs a float type")
        if base in _ALWAYS_APPROX and "approx" not in mods:
            raise ValueError(f"{base} needs .approx (required since PTX ISA 1.4)")
        if base in _F32_ONLY and t.bits != 32:
            raise ValueError(f"{base} has no .f{t.bits} form (.f32 only)")
        if t.bits == 32 and (base in _ALWAYS_APPROX or "approx" in mods):
            return _APPROX_UNARY[base]
        uf = _UNARY_FLOAT[base]
        return lambda a: uf(a, t)
    flt = t.is_float
    sat = "sat" in mods
    if base in ("add", "sub", "mul"):
        if base == "mul" and not flt:
            if "hi" in mods:
                return lambda a, b: _mulhi(a, b, t)
            if "wide" in mods:
                wt = _T(t.kind, t.bits * 2).np
                return lambda a, b: np.asarray(a).astype(wt) * np.asarray(b).astype(wt)
        op = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[base]
        if flt and sat:
            return lambda a, b: np.clip(op(a, b), 0, 1)
        if sat and t.kind == "s" and t.bits == 32:  # add.sat.s32 clamps instead of wrapping
            return lambda a, b: np.clip(op(np.asarray(a, np.int64), np.asarray(b, np.int64)),
                                        -(2 ** 31), 2 ** 31 - 1).astype(np.int32)
        return lambda a, b: np.asarray(op(a, b)).astype(t.np)
    if base in ("mad", "fma"):
        if flt:
            # fma rounds once: do it in float64 (exact for f32 products) and round to the type
            return lambda a, b, c: (np.asarray(a, np.float64) * np.asarray(b, np.float64) +
                                    np.asarray(c, np.float64)).astype(t.np) if t.bits < 64 else \
                np.asarray(a) * np.asarray(b) + np.asarray(c)
        if "hi" in mods:
            return lambda a, b, c: (_mulhi(a, b, t) + np.asarray(c, t.np)).astype(t.np)
        if "wide" in mods:
            wt = _T(t.kind, t.bits * 2).np
            return lambda a, b, c: (np.asarray(a).astype(wt) * np.asarray(b).astype(wt) + np.asarray(c, wt))
        return lambda a, b, c: (np.asarray(a, t.np) * np.asarray(b, t.np) + np.asarray(c, t.np)).astype(t.np)
    if base == "div":
        if flt and t.bits == 32 and ("approx" in mods or "full" in mods):
            full = "full" in mods
            return lambda a, b: _approx_div(a, b, full)
        if flt:
            return lambda a, b: np.asarray(np.divide(a, b)).astype(t.np)
        return lambda a, b: _idiv(a, b, t, rem=False)
    if base == "rem":
        if flt:
            raise ValueError("rem takes integer types")
        return lambda a, b: _idiv(a, b, t, rem=True)
    if base in ("min", "max"):
        nan = "NaN" in mods
        is_max = base == "max"
        return lambda a, b: np.asarray(_minmax(a, b, t, is_max, nan)).astype(t.np)
    if base in ("and", "or", "xor", "not", "cnot", "popc", "clz"):
        if flt:
            raise ValueError(f"{base} takes bit or integer types")
        if base == "not":
            return lambda a: np.invert(np.asarray(a, t.np))
        if base == "cnot":
            return lambda a: (np.asarray(a) == 0).astype(t.np)
        if base == "popc":
            return lambda a: _popc(np.asarray(a).astype(_U[t.bits]))
        if base == "clz":
            return lambda a: _clz(np.asarray(a).astype(_U[t.bits]), t.bits)
        bop = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[base]
        return lambda a, b: bop(np.asarray(a, t.np), np.asarray(b, t.np))
    if base in ("shl", "shr"):
        left = base == "shl"
        return lambda a, b: _shift(a, b, t, left)
    if base == "neg":
        return lambda a: np.negative(np.asarray(a, t.np))
    if base == "abs":
        return lambda a: np.abs(np.asarray(a, t.np))
    raise ValueError(f"unknown instruction {base}")


def _popc(u: np.ndarray) -> np.ndarray:
    count = np.zeros(u.shape, np.uint32)
    v = u.copy()
    one = u.dtype.type(1)
    for _ in range(u.dtype.itemsize * 8):
        count += (v & one).astype(np.uint32)
        v = v >> one
    return count


def _clz(u: np.ndarray, bits: int) -> np.ndarray:
    out = np.full(u.shape, bits, np.uint32)
    for k in range(bits):
        hit = (u >> u.dtype.type(k)) & u.dtype.type(1) == 1
        out = np.where(hit, np.uint32(bits - 1 - k), out)
    return out


def _compare(cmp: str, a: Any, b: Any, t: _T) -> Any:
    a, b = np.asarray(a), np.asarray(b)
    base = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
            "ge": np.greater_equal, "lo": np.less, "ls": np.less_equal, "hi": np.greater,
            "hs": np.greater_equal}
    if not t.is_float:
        if cmp not in base:
            raise ValueError(f"compare .{cmp} needs a float type")
        return base[cmp](a, b)
    nan = np.isnan(a) | np.isnan(b)
    if cmp == "num":
        return ~nan
    if cmp == "nan":
        return nan
    if cmp.endswith("u") and cmp[:-1] in base:
        return base[cmp[:-1]](a, b) | nan
    if cmp == "ne":
        return np.not_equal(a, b) & ~nan  # ordered: false when either is NaN
    return base[cmp](a, b)


def _c_setp(instr: Instr, entry: Entry) -> _Compiled:
    cmps = [m for m in instr.mods if m in _CMP]
    bools = [m for m in instr.mods if m in ("and", "or", "xor")]
    types, _ = _split_mods(instr, _CMP | {"and", "or", "xor", "ftz"})
    t = _one_type(types, instr)
    if len(cmps) != 1:
        raise ValueError("setp needs one compare operator")
    cmp = cmps[0]
    _compare(cmp, np.zeros(1, t.np), np.zeros(1, t.np), t)  # validates the operator for the type
    ops = instr.operands
    if len(ops) not in (3, 4) or (len(ops) == 4) != bool(bools):
        raise ValueError("setp takes p[|q], a, b[, c] (c with a boolean operator)")
    dst = ops[0]
    wp, wq = (_writer(dst.parts[0], _T("pred", 1), entry), _writer(dst.parts[1], _T("pred", 1), entry)) \
        if dst.kind == "pair" else (_writer(dst, _T("pred", 1), entry), None)
    ra, rb = _reader(ops[1], t, entry), _reader(ops[2], t, entry)
    rc = _reader(ops[3], _T("pred", 1), entry) if len(ops) == 4 else None
    bop = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[bools[0]] if bools else None

    ftz = "ftz" in instr.mods and t.kind == "f" and t.bits == 32

    def setp(st: _State, sel: Sel) -> None:
        a, b = ra(st, sel), rb(st, sel)
        res = _compare(cmp, _flush_f32(a) if ftz else a, _flush_f32(b) if ftz else b, t)
        if bop is not None and rc is not None:
            c = rc(st, sel)
            p, q = bop(res, c), bop(~res, c)
        else:
            p, q = res, ~res
        wp(st, sel, p)
        if wq is not None:
            wq(st, sel, q)
    return _Compiled("op", setp)


def _c_selp(instr: Instr, entry: Entry) -> _Compiled:
    types, _ = _split_mods(instr, set())
    t = _one_type(types, instr)
    d, a, b, c = _need(instr, 4)
    ra, rb, rc = _reader(a, t, entry), _reader(b, t, entry), _reader(c, _T("pred", 1), entry)
    w = _writer(d, t, entry)

    def selp(st: _State, sel: Sel) -> None:
        w(st, sel, np.asarray(np.where(rc(st, sel), ra(st, sel), rb(st, sel))).astype(t.np))
    return _Compiled("op", selp)


def _c_bra(instr: Instr, entry: Entry) -> _Compiled:
    _split_mods(instr, {"uni"})
    (target,) = _need(instr, 1)
    if target.kind != "sym" or target.name not in entry.labels:
        raise ValueError(f"branch to an unknown label {target.name or target.kind!r}")
    return _Compiled("bra", None, target=entry.labels[target.name])


def _c_exit(instr: Instr, entry: Entry) -> _Compiled:
    _split_mods(instr, {"uni"})
    _need(instr, 0)
    return _Compiled("exit", None)


def _c_bar(instr: Instr, entry: Entry) -> _Compiled:
    _split_mods(instr, {"sync", "aligned", "cta"})
    if "sync" not in instr.mods and instr.base == "barrier":
        raise ValueError("only barrier.sync is supported")
    if instr.base == "bar" and "sync" not in instr.mods:
        raise ValueError("only bar.sync is supported")
    ops = instr.operands
    if len(ops) > 2 or (ops and ops[0].kind != "imm"):
        raise ValueError("bar.sync takes an immediate barrier id (and optionally a thread count)")
    count = int(ops[1].value) if len(ops) == 2 and ops[1].kind == "imm" else None
    return _Compiled("bar", None, target=-1 if count is None else count)


FULL_WARP_MASK = 0xFFFFFFFF  # shfl.sync membermask naming all 32 lanes
BFLY_CLAMP = 0x1F  # shfl.sync.bfly's c operand for one segment spanning the whole warp


def _c_shfl(instr: Instr, entry: Entry) -> _Compiled:
    """shfl.sync.bfly.b32 d[|p], a, b, c, membermask: lane i reads a from lane i ^ b of its warp.

    Only the whole-warp form is supported (c = 0x1f, membermask all ones, every lane of the warp
    executing it, blocks of whole warps): anything else raises, so a kernel relying on partial-warp
    semantics the mock does not model fails here instead of computing something plausible."""
    types, mods = _split_mods(instr, {"sync", "bfly"})
    t = _one_type(types, instr)
    if mods != {"sync", "bfly"} or t.kind != "b" or t.bits != 32:
        raise ValueError("only shfl.sync.bfly.b32 is supported")
    d, a, b, c, mask = _need(instr, 5)
    if c.kind != "imm" or _imm_value(c, t) != BFLY_CLAMP:
        raise ValueError(f"shfl.sync.bfly needs c = {BFLY_CLAMP:#x} (one segment: the whole warp)")
    if mask.kind != "imm" or _imm_value(mask, t) != FULL_WARP_MASK:
        raise ValueError(f"shfl.sync needs membermask {FULL_WARP_MASK:#x} (the whole warp)")
    pred_w = None
    if d.kind == "pair":
        d, p = d.parts
        pred_w = _writer(p, _T("pred", 1), entry)
    ra, rb, w = _reader(a, t, entry), _reader(b, t, entry), _writer(d, t, entry)

    def shfl(st: _State, sel: Sel) -> None:
        if st.nthreads % WARP_SIZE:
            raise _Fault(f"shfl.sync in a block of {st.nthreads} threads (the mock needs whole warps)")
        if isinstance(sel, slice):  # every lane of the batch is here: whole warps by construction
            lanes = np.arange(st.nlanes)
        else:
            lanes = np.asarray(sel)
            if len(np.unique(lanes // WARP_SIZE)) * WARP_SIZE != lanes.size:
                raise _Fault("shfl.sync reached by only part of a warp (the membermask names all 32 lanes)")
        in_warp = lanes % WARP_SIZE
        source = lanes - in_warp + (in_warp ^ (np.asarray(rb(st, sel)) & (WARP_SIZE - 1)))
        w(st, sel, np.asarray(ra(st, slice(None)))[source])
        if pred_w is not None:
            pred_w(st, sel, np.ones(lanes.size, np.bool_))
    return _Compiled("op", shfl)


def _c_nop(instr: Instr, entry: Entry) -> _Compiled:
    return _Compiled("op", lambda st, sel: None)


_COMPILERS: dict[str, Callable[[Instr, Entry], _Compiled]] = {
    "mov": _c_mov, "ld": _c_ld_st, "ldu": _c_ld_st, "st": _c_ld_st, "cvta": _c_cvta, "cvt": _c_cvt,
    "setp": _c_setp, "selp": _c_selp, "bra": _c_bra, "ret": _c_exit, "exit": _c_exit,
    "bar": _c_bar, "barrier": _c_bar, "membar": _c_nop, "fence": _c_nop, "shfl": _c_shfl,
    **{name: _c_arith for name in ("add", "sub", "mul", "mad", "fma", "div", "rem", "min", "max", "and", "or",
                                   "xor", "not", "cnot", "shl", "shr", "neg", "abs", "popc", "clz",
                                   *_UNARY_FLOAT)},
}


# ---------------------------------------------------------------------- module
@dataclass
class _Kernel:
    entry: Entry
    code: list[_Compiled]


_module_cache: dict[str, dict[str, _Kernel]] = {}


ADVERSARIAL_ENV = "PTX_ADVERSARIAL"  # PTX_ADVERSARIAL=1: adversarial warp scheduling unless a launch says


def adversarial_default() -> bool:
    """Whether launches schedule adversarially when neither the launch nor the module says (the env var)."""
    return os.environ.get(ADVERSARIAL_ENV, "0") not in ("", "0")


def warp_order(nwarps: int, epoch: int, seed: int = 0) -> list[int]:
    """The order the warps of a block run in between barrier `epoch` and the next (adversarial mode): last
    warp first (a reduction's warp 0 usually consumes what the others produce), rotated left by
    (epoch + seed) % nwarps, so each epoch starts with another warp."""
    rev = list(range(nwarps - 1, -1, -1))
    k = (epoch + seed) % max(nwarps, 1)
    return rev[k:] + rev[:k]


# Steps (instructions at one pc for the lanes there) a launch may take before it is called runaway. At
# ~150k steps/s on these machines this is ~10 minutes, the mock device's wait timeout: a long but finite
# kernel (a 1024x1024 full sum run by one thread takes ~32M) completes, a loop that never ends still fails.
MAX_STEPS = 100_000_000


class PTXModule:
    """Parsed (and validated) PTX; `launch` runs one entry on a grid of blocks.

    `adversarial` (None: the PTX_ADVERSARIAL env var at launch time) and `seed` are the defaults of
    `launch`'s; `warnings` collects what an approximate instruction was asked outside its documented range
    (one line per kernel line), for tests to assert on."""

    def __init__(self, source: str, *, adversarial: bool | None = None, seed: int = 0) -> None:
        key = hashlib.sha256(source.encode()).hexdigest()
        hit = _module_cache.get(key)
        if hit is None:
            module = parse(source)
            hit = {}
            for name, entry in module.entries.items():
                code = []
                for ins in entry.instrs:
                    try:
                        code.append(_compile(ins, entry))
                    except (ValueError, KeyError) as e:
                        raise PTXError(f"{name}: line {ins.line}: {ins.text!r}: {e}") from None
                hit[name] = _Kernel(entry, code)
            _module_cache[key] = hit
        self.entries: dict[str, _Kernel] = hit
        self.adversarial = adversarial
        self.seed = seed
        self.warnings: list[str] = []

    def launch(self, entry: str, grid: tuple[int, int, int], block: tuple[int, int, int], params: bytes,
               memory: GlobalMemory, *, max_steps: int = MAX_STEPS, adversarial: bool | None = None,
               seed: int | None = None) -> None:
        """Run `entry` over `grid` blocks of `block` threads with the raw parameter buffer `params`.

        adversarial: run the warps of each block one at a time between barriers, in `warp_order`, and
        report shared-memory races (module docstring); None takes the module's setting, then the env var.
        Kernels without bar.sync and shared memory run in lockstep either way (nothing to reorder)."""
        kernel = self.entries.get(entry)
        if kernel is None:
            raise PTXError(f"no entry named {entry!r} (have {sorted(self.entries)})")
        e = kernel.entry
        grid3, block3 = tuple(int(x) for x in grid), tuple(int(x) for x in block)
        if len(grid3) != 3 or len(block3) != 3 or min(grid3 + block3) < 1:
            raise PTXError(f"{entry}: grid {grid} and block {block} need three dimensions >= 1")
        nthreads = math.prod(block3)
        if nthreads > MAX_THREADS_PER_BLOCK:
            raise PTXError(f"{entry}: block {block} has {nthreads} threads, more than "
                           f"{MAX_THREADS_PER_BLOCK}")
        if e.maxntid is not None and nthreads > math.prod(e.maxntid):
            raise PTXError(f"{entry}: block {block} exceeds the kernel's .maxntid {e.maxntid}")
        if len(params) < e.param_size:
            raise PTXError(f"{entry}: parameter buffer of {len(params)} bytes, the kernel needs "
                           f"{e.param_size}")
        adv = adversarial if adversarial is not None else \
            self.adversarial if self.adversarial is not None else adversarial_default()
        serial = adv and (e.shared_size > 0 or any(c.kind == "bar" for c in kernel.code))
        pbuf = np.frombuffer(bytes(params), np.uint8).copy()
        nblocks = math.prod(grid3)
        per_batch = max(1, min(nblocks, MAX_BATCH_LANES // nthreads))
        steps = 0
        for first in range(0, nblocks, per_batch):
            st = _State(e, grid3, block3, first, min(per_batch, nblocks - first), pbuf, memory,  # type: ignore[arg-type]
                        notes=self.warnings)
            if serial:
                steps = _run_serialized(kernel, st, steps, max_steps, nthreads,
                                        self.seed if seed is None else seed)
            else:
                steps = _run(kernel, st, steps, max_steps, nthreads)


def _run(kernel: _Kernel, st: _State, steps: int, max_steps: int, nthreads: int) -> int:
    """Run one batch of blocks to completion; returns the step count so far."""
    code = kernel.code
    name = kernel.entry.name
    n = st.nlanes
    alive = np.ones(n, bool)
    pc = np.zeros(n, np.int64)
    uniform, upc = True, 0  # all live lanes at one pc: the common case, no per-lane bookkeeping
    all_sel: Sel = slice(None)
    with np.errstate(all="ignore"):
        while True:
            if uniform:
                cur = upc
                active = alive
                act_sel = all_sel
            else:
                live = pc[alive]
                if live.size == 0:
                    break
                cur = int(live.min())
                active = alive & (pc == cur)
                act_sel = np.nonzero(active)[0]
            steps += 1
            if steps > max_steps:
                raise PTXError(f"{_where(name, code[cur])}: ran more than max_steps={max_steps} steps "
                               "(an endless loop?)")
            c = code[cur]
            st.line = c.line
            try:
                if c.guard is not None:
                    g = st.regs[c.guard[0]]
                    gmask = active & (~g if c.guard[1] else g)
                    sel = np.nonzero(gmask)[0]
                else:
                    gmask = active
                    sel = act_sel
                if c.kind == "op":
                    if c.run is not None and (c.guard is None or sel.size):
                        c.run(st, sel)
                    taken = None
                elif c.kind == "bra":
                    taken = gmask
                elif c.kind == "exit":
                    alive = alive & ~gmask
                    all_sel = slice(None) if alive.all() else np.nonzero(alive)[0]
                    taken = None
                else:  # barrier
                    _barrier(st, c, alive, active, gmask, nthreads)
                    taken = None
            except _Fault as f:
                raise PTXError(f"{_where(name, c)}: {f}") from None
            # advance
            if uniform:
                if taken is None:
                    upc = cur + 1
                else:
                    nt = int(np.count_nonzero(taken))
                    if nt == 0:
                        upc = cur + 1
                    elif nt == int(np.count_nonzero(alive)):
                        upc = c.target
                    else:
                        pc = np.where(taken, c.target, cur + 1)
                        uniform = False
                if uniform and not alive.any():
                    break
            else:
                pc = np.where(active, cur + 1, pc)
                if taken is not None:
                    pc = np.where(taken, c.target, pc)
                live = pc[alive]
                if live.size == 0:
                    break
                lo = int(live.min())
                if lo == int(live.max()):
                    uniform, upc = True, lo
                    all_sel = slice(None) if alive.all() else np.nonzero(alive)[0]
            if uniform and upc >= len(code):
                break
    return steps


def _where(name: str, c: _Compiled) -> str:
    """'kernel: line N: 'text'' for error messages."""
    ins = c.instr
    return f"{name}: line {ins.line}: {ins.text!r}" if ins is not None else f"{name}: line ?"


def _barrier(st: _State, c: _Compiled, alive: np.ndarray, active: np.ndarray, gmask: np.ndarray,
             nthreads: int) -> None:
    """bar.sync: every live thread of each block that reaches it must be here together."""
    if c.target not in (-1, nthreads):
        raise _Fault(f"bar.sync with a thread count of {c.target} (block has {nthreads}) is not supported")
    if not np.array_equal(gmask, active):
        raise _Fault("bar.sync under a predicate that differs between threads")
    blocks_here = np.zeros(int(st.block_of_lane.max()) + 1, bool)
    blocks_here[st.block_of_lane[active]] = True
    missing = alive & ~active & blocks_here[st.block_of_lane]
    if missing.any():
        lane = int(np.nonzero(missing)[0][0])
        raise _Fault(f"bar.sync reached by only part of block {int(st.block_of_lane[lane])}: thread "
                     f"{lane % nthreads} is live elsewhere (divergent barrier)")
    if st.races is not None:
        st.races.new_epoch(blocks_here)


# ---------------------------------------------------------------------- adversarial scheduling
def _run_serialized(kernel: _Kernel, st: _State, steps: int, max_steps: int, nthreads: int, seed: int) -> int:
    """Run one batch of blocks with the warps of each block one at a time: in each barrier epoch, warp
    `warp_order(...)[0]` of every block of the batch runs until each of its threads waits at a bar.sync or
    has exited, then the next warp, and so on; then the barrier completes for every block (all its live
    threads must wait at the same bar.sync) and the next epoch starts. The blocks of a batch are independent,
    so one warp position runs for all of them together. Returns the step count so far."""
    n = st.nlanes
    alive = np.ones(n, bool)
    pc = np.zeros(n, np.int64)
    nwarps = -(-nthreads // WARP_SIZE)
    lanes_of_warp = [np.nonzero(st.warp_in_block == w)[0] for w in range(nwarps)]
    epoch = 0
    with np.errstate(all="ignore"):
        while True:
            for w in warp_order(nwarps, epoch, seed):
                lanes = lanes_of_warp[w]
                lanes = lanes[alive[lanes]]
                if lanes.size:
                    steps = _run_to_barrier(kernel, st, lanes, pc, alive, steps, max_steps)
            waiting = np.nonzero(alive)[0]
            if waiting.size == 0:
                return steps
            _complete_barrier(kernel, st, waiting, pc, nthreads)
            pc[waiting] += 1
            epoch += 1


def _run_to_barrier(kernel: _Kernel, st: _State, lanes: np.ndarray, pc: np.ndarray, alive: np.ndarray,
                    steps: int, max_steps: int) -> int:
    """Run `lanes` (per-lane pcs, lowest pc first as in `_run`) until each waits at a bar.sync (its pc left
    there) or has exited (alive cleared)."""
    code = kernel.code
    name = kernel.entry.name
    ncode = len(code)
    run, rpc = lanes, pc[lanes].copy()
    while run.size:
        cur = int(rpc.min())
        if cur >= ncode:  # ran off the end of the code: done, like ret
            done = rpc >= ncode
            alive[run[done]] = False
            run, rpc = run[~done], rpc[~done]
            continue
        steps += 1
        c = code[cur]
        if steps > max_steps:
            raise PTXError(f"{_where(name, c)}: ran more than max_steps={max_steps} steps (an endless loop?)")
        here = rpc == cur
        every = bool(here.all())
        sel = run if every else run[here]
        st.line = c.line
        try:
            if c.guard is None:
                gm = None
                gsel = sel
            else:
                g = st.regs[c.guard[0]][sel]
                gm = ~g if c.guard[1] else g
                gsel = sel[gm]
            leave = None  # positions in `run` (among `here`) that stop running
            if c.kind == "op":
                if c.run is not None and gsel.size:
                    c.run(st, gsel)
                nxt: Any = cur + 1
            elif c.kind == "bra":
                nxt = c.target if gm is None else np.where(gm, c.target, cur + 1)
            elif c.kind == "exit":
                alive[gsel] = False
                nxt = cur + 1
                leave = here.copy() if gm is None else _positions(here, gm)
            else:  # bar.sync: wait here, unless the guard is false for all (then it is skipped)
                if gm is not None and gm.any() and not gm.all():
                    raise _Fault("bar.sync under a predicate that differs between threads")
                nxt = cur + 1
                if gm is None or gm.all():
                    _check_converged(st, run, here, sel)
                    pc[sel] = cur
                    leave = here.copy()
        except _Fault as f:
            raise PTXError(f"{_where(name, c)}: {f}") from None
        if every:
            rpc[:] = nxt
        else:
            rpc[here] = nxt
        if leave is not None:
            run, rpc = run[~leave], rpc[~leave]
    return steps


def _check_converged(st: _State, run: np.ndarray, here: np.ndarray, sel: np.ndarray) -> None:
    """bar.sync is .aligned: every live thread of the warp executes it together, none is elsewhere."""
    if here.all():
        return
    blocks_here = np.zeros(int(st.block_of_lane.max()) + 1, bool)
    blocks_here[st.block_of_lane[sel]] = True
    elsewhere = run[~here]
    elsewhere = elsewhere[blocks_here[st.block_of_lane[elsewhere]]]
    if elsewhere.size:
        lane = int(elsewhere[0])
        block = st.first_block + int(st.block_of_lane[lane])
        raise _Fault(f"bar.sync reached by only part of block {block}: thread {lane % st.nthreads} is live "
                     "elsewhere (divergent barrier)")


def _positions(here: np.ndarray, sub: np.ndarray) -> np.ndarray:
    """A mask over all positions: those of `here` whose entry in `sub` (one per true of `here`) is true."""
    out = np.zeros(here.shape, bool)
    out[np.nonzero(here)[0][sub]] = True
    return out


def _complete_barrier(kernel: _Kernel, st: _State, waiting: np.ndarray, pc: np.ndarray,
                      nthreads: int) -> None:
    """Every live thread waits at a bar.sync: those of one block must wait at the same one."""
    blocks = st.block_of_lane[waiting]
    at = pc[waiting]
    first = np.full(int(st.block_of_lane.max()) + 1, len(kernel.code), np.int64)
    np.minimum.at(first, blocks, at)
    c = kernel.code[int(at.min())]
    odd = at != first[blocks]
    if odd.any():
        k = int(np.nonzero(odd)[0][0])
        lane, b = int(waiting[k]), int(blocks[k])
        c = kernel.code[int(first[b])]
        raise PTXError(f"{_where(kernel.entry.name, c)}: bar.sync reached by only part of block "
                       f"{st.first_block + b}: thread {lane % nthreads} waits at line "
                       f"{kernel.code[int(at[k])].line} instead (divergent barrier)")
    for p in np.unique(at):
        c = kernel.code[int(p)]
        if c.target not in (-1, nthreads):
            raise PTXError(f"{_where(kernel.entry.name, c)}: bar.sync with a thread count of {c.target} "
                           f"(block has {nthreads}) is not supported")
    if st.races is not None:
        st.races.new_epoch(slice(None))
