"""Render a linear program (compiler/lower.py) as PTX text for NVIDIA GPUs (sm_80 and newer).

Calling convention (the NV device fills the parameter buffer, constant bank 0, against it):
    .visible .entry <name>(.param .u64 <name>_param_0, ..., .param .s64 <name>_param_<k>, ...)
One `.param .u64` per buffer of `prog.globals` in slot order (its global address), then one
`.param .s64` per entry of `prog.variables` in order. Variables are 64-bit because rawgrad's Variables
are `dtypes.index` (int64) and every index expression over them is 64-bit; a 32-bit parameter would only
save bytes and cost a conversion per use. `param_layout(prog)` gives each parameter's name, byte offset
and size (natural alignment, offsets from 0: every parameter is 8 bytes, so parameter k is at 8 * k).

Thread mapping: one thread per global index. The index is linear over the whole launched grid (the launch
contract of compiler/target.py): `gidx = x + X * (y + Y * z)` with `x = ctaid.x * ntid.x + tid.x` (the same
for y and z) and `X = nctaid.x * ntid.x`, `Y = nctaid.y * ntid.y`, so a kernel runs the same under a 1-D, 2-D
or 3-D launch; threads with `gidx >= global_size` do nothing. `global_size` may be symbolic: the kernel
computes it from the Variable parameters. The block comes from the program's launch contract
(`prog.launch.local_size`); `launch_dims(global_size)` gives the 1-D grid for blocks of the target's size.
Every processor number (warp width, threads per block, vector width) comes from the `Target`
(`compiler.target.nv_target(arch)`). Lowering is for that GPU target: no register tiles, every output axis
in the global index. An
elementwise kernel with 32-bit output may give each thread 4 neighbouring outputs (`vector_groups` of the
linear program): those stores, and the loads proven consecutive and 16-byte aligned, become one
`ld`/`st.global.v4` each, so a memory-bound kernel issues a quarter of the memory instructions. A group
reduction (`group_size` a warp or `block_threads`) runs a warp or the whole block per output: the lanes'
accumulators meet through `shfl.sync.bfly` (and, for a block, one shared-memory slot per warp between two
`bar.sync`), and lane 0 of the group stores.

Registers: bool is a predicate (`.pred`) and a byte (0/1) in memory; integers of up to 32 bits live in
`.b32` registers, sign- or zero-extended from their width after every operation that can wrap
(`cvt.s8.s32` etc.), so compares, shifts and divisions see the value of the narrow type; 64-bit integers
in `.b64`. float16 and bfloat16 are loaded, converted to float32 for math, and rounded back to their
type after every operation (as the LLVM renderer does for bfloat16), float64 is native.

Precision of the math instructions (the PTX ISA's bounds for the approximate forms):
- EXP2: `ex2.approx.f32` (at most 2 ulp from the correctly rounded result, PTX ISA 9.7.3.21);
- LOG2: `lg2.approx.f32` (absolute error 2**-22 for inputs in (0.5, 2), relative 2**-22 elsewhere, 9.7.3.20);
- float32 SIN: the float64 routine below, rounded once to float32, not `sin.approx.f32`: that one is bounded
  only by 2**-20.5 absolute in [-2 pi, 2 pi] and 2**-14.7 in [-100 pi, 100 pi], with no bound beyond
  (9.7.3.18), which loses small sines' relative accuracy and large arguments (positions) altogether;
- SQRT `sqrt.rn`, RECIP `rcp.rn`, FDIV `div.rn`: IEEE round-to-nearest, exact like the CPU;
- float64 EXP2/LOG2/SIN: PTX has no float64 forms, so they are branch-free double-precision routines
  built from IEEE-exact operations (range reduction + polynomials; within 1-2 ulp in the tests, SIN for
  |x| up to ~1e9), identical on hardware and in the mock interpreter;
- POW is exp2(y * log2|x|) through the float64 routines (float32 operands widened, the result rounded once),
  with the sign and special cases of C's pow (x < 0 with a non-integer y is NaN, y == 0 or x == 1 gives 1):
  with `lg2.approx.f32` the exponent's error, up to |y log2 x| * 2**-22, would reach the result.
Integer division by zero gives 0 and INT_MIN / -1 wraps (guarded, as the LLVM renderer does).
"""
from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.lower import GROUP_SLOT_BYTES, LinearProgram, lower
from rawgrad.compiler.renderer.f64_math import (
    ATANH_F64_TERMS,
    EXP2_F64_MAX_ARG,
    EXP2_F64_MIN_ARG,
    EXP_F64_TERMS,
    F64_EXPONENT_BIAS,
    F64_EXPONENT_MASK,
    F64_MANTISSA_BITS,
    F64_MIN_NORMAL,
    PIO2_F64_PARTS,
    SIN_F64_TERMS,
    SUBNORMAL_SCALE_BITS,
)
from rawgrad.compiler.target import Target, nv_target
from rawgrad.dtype import DType, dtypes

PTX_VERSION = "7.8"  # PTX ISA 7.8 (CUDA 11.8): the first with sm_90
DEFAULT_ARCH = "sm_90"  # Hopper (H100/H200)
ADDRESS_SIZE = 64
DEFAULT_TARGET = nv_target(DEFAULT_ARCH)
PARAM_SIZE = 8  # every parameter is a .u64 pointer or an .s64 Variable value
SHFL_ALL_LANES = "0xffffffff"  # shfl.sync membermask: every lane of the warp takes part
MAX_GRID_X = 2 ** 31 - 1  # the x dimension of a grid (CUDA programming guide, compute capability >= 3.0)

# register classes: (PTX register type, name prefix)
_CLASSES = {"pred": (".pred", "%p"), "b16": (".b16", "%h"), "b32": (".b32", "%r"), "b64": (".b64", "%rd"),
            "f32": (".f32", "%f"), "f64": (".f64", "%fd")}


def launch_dims(global_size: int, block_threads: int = DEFAULT_TARGET.block_threads) \
        -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) covering `global_size` threads in 1-D blocks of `block_threads`; at least one block,
    since a launch needs one."""
    if global_size < 0:
        raise ValueError(f"global size must be >= 0, got {global_size}")
    blocks = max(1, -(-global_size // block_threads))
    if blocks > MAX_GRID_X:
        raise ValueError(f"global size {global_size} needs {blocks} blocks, more than a grid holds")
    return (blocks, 1, 1), (block_threads, 1, 1)


def shfl_clamp(warp: int) -> str:
    """The shfl.sync `c` operand for one segment spanning the whole warp: the highest lane index in the low
    bits, segment mask 0 (PTX ISA, shfl.sync)."""
    return hex(warp - 1)


def param_name(prog: LinearProgram, k: int) -> str:
    return f"{prog.name}_param_{k}"


def param_layout(prog: LinearProgram) -> list[tuple[str, int, int]]:
    """(name, byte offset, size) of every kernel parameter, in declaration order."""
    count = len(prog.globals) + len(prog.variables)
    return [(param_name(prog, k), k * PARAM_SIZE, PARAM_SIZE) for k in range(count)]


# ---------------------------------------------------------------------- dtype tables
def reg_class(dt: DType) -> str:
    """Which register class holds a value of `dt` (see the module docstring)."""
    if dt.is_bool:
        return "pred"
    if dt.is_int:
        return "b64" if dt.itemsize == 8 else "b32"
    return "f64" if dt == dtypes.float64 else "f32"


def op_type(dt: DType) -> str:
    """The instruction type suffix for arithmetic on values of `dt` held in registers."""
    if dt.is_bool:
        return "pred"
    if dt.is_int:
        return ("u" if dt.is_unsigned else "s") + ("64" if dt.itemsize == 8 else "32")
    return "f64" if dt == dtypes.float64 else "f32"


def _narrow_type(dt: DType) -> str | None:
    """The cvt type that re-extends an 8/16-bit integer held in a 32-bit register; None if not narrow."""
    if dt.is_int and dt.itemsize < 4:
        return ("u" if dt.is_unsigned else "s") + str(dt.itemsize * 8)
    return None


def _mem_type(dt: DType) -> str:
    """The ld/st type of an element of `dt` in memory."""
    if dt.is_bool:
        return "u8"
    if dt.is_int:
        return ("u" if dt.is_unsigned else "s") + str(dt.itemsize * 8)
    if dt in (dtypes.float16, dtypes.bfloat16):
        return "b16"
    return "f64" if dt == dtypes.float64 else "f32"


def _raw_class(dt: DType) -> str:
    """Register class a load of `dt` lands in before conversion to its register form."""
    if dt.is_bool or dt == dtypes.bfloat16:
        return "b32"
    if dt == dtypes.float16:
        return "b16"
    return reg_class(dt)


def float_imm(v: float, dt: DType) -> str:
    """A PTX float immediate: 0f + 8 hex digits (f32) or 0d + 16 (f64), bit-exact, NaN and inf included."""
    if dt == dtypes.float64:
        return "0d" + struct.pack(">d", float(v)).hex().upper()
    return "0f" + np.array([v], dtype=np.float32).view(np.uint32)[0].item().to_bytes(4, "big").hex().upper()


def _int_imm(v: Any, dt: DType) -> str:
    bits = dt.itemsize * 8
    val = int(v) & ((1 << bits) - 1)
    if not dt.is_unsigned and val >= 1 << (bits - 1):
        val -= 1 << bits
    return str(val)


class _Emitter:
    def __init__(self, prog: LinearProgram, target: Target):
        self.prog = prog
        self.target = target
        self.arch = target.isa
        self.warp = target.simd_width
        self.body: list[str] = []
        self.consts: list[str] = []  # constant materializations, hoisted to the kernel's prologue
        self.const_regs: dict[tuple[str, str], str] = {}
        self.counts = {c: 0 for c in _CLASSES}
        self.labels = 0
        # one scope per open loop; a value is emitted in the outermost scope it can live in (loop-invariant
        # code is hoisted): marks[k] is where code of scope k goes while deeper loops are open
        self.scopes: list[dict[UOp, str]] = [{}]
        self.marks: list[int] = []
        self.level_of: dict[UOp, int] = {}
        self.emit_level = 0
        self.loops: dict[UOp, tuple[str, str, str]] = {}  # RANGE -> (counter, head label, exit label)
        self.acc_regs: dict[UOp, str] = {}
        self.exit_label = self.label("exit")
        # vector access (lower.py): each lane's LOAD/STORE -> its group, lanes in order
        self.vector_group_of = {u: group for group in prog.vector_groups for u in group}
        # group reductions (lower.py): the thread's lane in its block, and the predicate "lane == 0" that
        # gates stores (every lane holds the combined result; one of them writes it)
        block = target.block_threads
        if prog.group_size not in (1, self.warp, block):
            raise ValueError(f"{prog.name}: a thread group of {prog.group_size} threads; the PTX renderer "
                             f"runs groups of one warp ({self.warp}) or one block ({block})")
        if prog.group_size == block and prog.launch.local_size != (block, 1, 1):
            raise ValueError(f"{prog.name}: a block group of {block} threads needs a local size of "
                             f"({block}, 1, 1), the launch contract says {prog.launch.local_size}")
        self.lane = ""
        self.store_gate: str | None = None

    # ------------------------------------------------------------------ helpers
    def reg(self, cls: str) -> str:
        n = self.counts[cls]
        self.counts[cls] = n + 1
        return f"{_CLASSES[cls][1]}{n}"

    def label(self, stem: str) -> str:
        self.labels += 1
        return f"$L_{stem}_{self.labels}"

    def ins(self, text: str) -> None:
        self.put("\t" + text + ";")

    def put_label(self, name: str) -> None:
        self.put(name + ":")

    def put(self, line: str) -> None:
        level = self.emit_level
        if level >= len(self.marks):
            self.body.append(line)
            return
        self.body.insert(self.marks[level], line)
        for j in range(level, len(self.marks)):
            self.marks[j] += 1

    def open_scope(self) -> None:
        self.marks.append(len(self.body))
        self.scopes.append({})
        self.emit_level = len(self.marks)

    def close_scope(self) -> None:
        for u in self.scopes.pop():
            self.level_of.pop(u, None)
        self.marks.pop()
        self.emit_level = len(self.marks)

    def op(self, cls: str, text: str) -> str:
        """Emit `text` (an instruction whose destination is written as {d}) into a new register."""
        d = self.reg(cls)
        self.ins(text.format(d=d))
        return d

    def const(self, v: Any, dt: DType) -> str:
        """A register holding constant `v` of `dt` (materialized once, in the prologue)."""
        cls = reg_class(dt)
        if dt.is_bool:
            text = "1" if v else "0"
        elif dt.is_int:
            text = _int_imm(v, dt)
        else:
            text = float_imm(float(v), dt)
        key = (cls, text if not dt.is_int else f"{op_type(dt)}:{text}")
        hit = self.const_regs.get(key)
        if hit is not None:
            return hit
        r = self.reg(cls)
        self.consts.append(f"\tmov.{op_type(dt)} {r}, {text};")
        self.const_regs[key] = r
        return r

    def lookup(self, u: UOp) -> str | None:
        for scope in reversed(self.scopes):
            if u in scope:
                return scope[u]
        return None

    # ------------------------------------------------------------------ kernel
    def render(self) -> str:
        p = self.prog
        params = [f"\t.param .u64 {param_name(p, g.arg)}" for g in p.globals]
        if [g.arg for g in p.globals] != list(range(len(p.globals))):
            raise ValueError(f"{p.name}: buffer slots must be 0..n-1, got {[g.arg for g in p.globals]}")
        params += [f"\t.param .s64 {param_name(p, len(p.globals) + k)}" for k in range(len(p.variables))]
        for g in p.globals:
            raw = self.op("b64", f"ld.param.u64 {{d}}, [{param_name(p, g.arg)}]")
            self.scopes[0][g] = self.op("b64", f"cvta.to.global.u64 {{d}}, {raw}")
        for k, v in enumerate(p.variables):
            self.scopes[0][v] = self.op("b64", f"ld.param.s64 {{d}}, [{param_name(p, len(p.globals) + k)}]")
        prologue_end = len(self.body)
        for st in p.statements:
            self.statement(st)
        self.put_label(self.exit_label)
        self.ins("ret")
        decls = [f"\t.reg {_CLASSES[c][0]} {_CLASSES[c][1]}<{n}>;" for c, n in self.counts.items() if n]
        body = self.body[:prologue_end] + self.consts + self.body[prologue_end:]
        if p.group_size > self.warp:
            decls.append(f"\t.shared .align {GROUP_SLOT_BYTES} .b8 {self.group_buffer}"
                         f"[{p.launch.shared_bytes}];")
        head = [f".version {PTX_VERSION}", f".target {self.arch}", f".address_size {ADDRESS_SIZE}", "",
                f".visible .entry {p.name}(", ",\n".join(params), ")",
                self.block_directive(), "{"]
        return "\n".join(head + decls + [""] + body + ["}", ""])

    def block_directive(self) -> str:
        """`.reqntid` with the contract's block for a kernel that runs only in it (a group reduction), else
        `.maxntid` with the most threads a block of the renderer's kernels has (PTX ISA, performance-tuning
        directives: either bounds the registers ptxas may give a thread)."""
        launch = self.prog.launch
        if launch.exact_local:
            x, y, z = launch.local_size
            return f".reqntid {x}, {y}, {z}"
        return f".maxntid {self.target.block_threads}, 1, 1"

    @property
    def group_buffer(self) -> str:
        """The shared-memory array GROUP_COMBINE exchanges accumulators through: one slot per warp."""
        return f"{self.prog.name}_group"

    # ------------------------------------------------------------------ statements
    def statement(self, st: UOp) -> None:
        op = st.op
        if op is Ops.RANGE and st.arg[1] == "global":
            self.global_index(st)
        elif op is Ops.RANGE:
            start, end = self.value(st.src[0]), self.value(st.src[1])
            ctr = self.reg("b64")
            head, exit_ = self.label("loop"), self.label("end")
            self.open_scope()
            self.ins(f"mov.b64 {ctr}, {start}")
            self.put_label(head)
            done = self.op("pred", f"setp.ge.s64 {{d}}, {ctr}, {end}")
            self.ins(f"@{done} bra {exit_}")
            self.loops[st] = (ctr, head, exit_)
            self.scopes[-1][st] = ctr
            self.level_of[st] = self.emit_level
        elif op is Ops.ENDRANGE:
            r = st.src[0]
            if r.arg[1] == "global":
                return  # the guard at the top already sent surplus threads to the exit
            ctr, head, exit_ = self.loops[r]
            self.ins(f"add.s64 {ctr}, {ctr}, {self.const(1, dtypes.int64)}")
            self.ins(f"bra.uni {head}")
            self.put_label(exit_)
            self.close_scope()
        elif op is Ops.DEFINE_ACC:
            assert st.dtype is not None
            acc = self.reg(reg_class(st.dtype))
            self.ins(f"mov.{op_type(st.dtype)} {acc}, {self.value(st.src[0])}")
            self.acc_regs[st] = acc
        elif op is Ops.ACC_UPDATE:
            target, val = st.src
            self.ins(f"mov.{op_type(target.dt)} {self.acc_regs[target]}, {self.value(val)}")
        elif op is Ops.GROUP_COMBINE:
            self.group_combine(st)
        elif op is Ops.STORE:
            group = self.vector_group_of.get(st)
            if group is not None:
                if st is group[0]:  # the first lane stores the whole vector; the others are in it
                    self.vector_store(group)
                return
            index, val = st.src
            glob = index.src[0]
            assert glob.dtype is not None
            addr = self.address(index)
            stored = self.to_memory(self.value(val), glob.dtype)
            gate = f"@{self.store_gate} " if self.store_gate is not None else ""
            self.ins(f"{gate}st.global.{_mem_type(glob.dtype)} [{addr}], {stored}")
        else:
            raise NotImplementedError(f"PTX renderer: unexpected statement {op}")

    def grid_axis(self, axis: str) -> tuple[str, str, str]:
        """(thread's index along `axis` over the grid, the grid's extent along it in threads, tid.axis):
        ctaid * ntid + tid and nctaid * ntid, 64-bit."""
        block = self.op("b32", f"mov.u32 {{d}}, %ctaid.{axis}")
        width = self.op("b32", f"mov.u32 {{d}}, %ntid.{axis}")
        count = self.op("b32", f"mov.u32 {{d}}, %nctaid.{axis}")
        tid = self.op("b32", f"mov.u32 {{d}}, %tid.{axis}")
        wide = self.op("b64", f"mul.wide.u32 {{d}}, {block}, {width}")
        tid64 = self.op("b64", f"cvt.u64.u32 {{d}}, {tid}")
        index = self.op("b64", f"add.s64 {{d}}, {wide}, {tid64}")
        extent = self.op("b64", f"mul.wide.u32 {{d}}, {count}, {width}")
        return index, extent, tid

    def global_index(self, st: UOp) -> None:
        """gidx = x + X * (y + Y * z) over the launched grid (module docstring); threads past the global size
        jump to the exit."""
        x, width, lane = self.grid_axis("x")
        y, height, _ = self.grid_axis("y")
        z, _, _ = self.grid_axis("z")
        plane = self.op("b64", f"mad.lo.s64 {{d}}, {z}, {height}, {y}")
        gidx = self.op("b64", f"mad.lo.s64 {{d}}, {plane}, {width}, {x}")
        size = self.prog.global_size
        limit = self.value(size) if isinstance(size, UOp) else self.const(int(size), dtypes.int64)
        out = self.op("pred", f"setp.ge.s64 {{d}}, {gidx}, {limit}")
        self.ins(f"@{out} bra {self.exit_label}")
        self.scopes[0][st] = gidx
        self.level_of[st] = 0
        self.lane = lane
        group = self.prog.group_size
        if group > 1:
            # groups are whole warps or the whole block, and the global size is a multiple of the group:
            # the guard above sends whole groups to the exit, so every lane of a live group reaches its
            # shuffles and barriers. Lane 0 of the group stores.
            in_group = self.op("b32", f"and.b32 {{d}}, {lane}, {self.const(group - 1, dtypes.uint32)}")
            zero = self.const(0, dtypes.uint32)
            self.store_gate = self.op("pred", f"setp.eq.u32 {{d}}, {in_group}, {zero}")

    def group_combine(self, st: UOp) -> None:
        """Combine one accumulator across the group: five butterfly shuffles leave every lane holding its
        warp's result (a warp group is done). For a block group, lane 0 of each warp then puts that in the
        shared slot of its warp, and after a barrier every lane combines the slots in order, so all lanes
        hold the same bits. The closing barrier keeps the slots intact until every lane has read them (a
        second accumulator reuses them)."""
        acc = st.src[0]
        rop, group = st.arg
        dt = acc.dt
        reg = self.acc_regs[acc]
        t = op_type(dt)
        offset = self.warp // 2
        while offset >= 1:
            other = self.shuffle_xor(reg, reg_class(dt), offset)
            self.ins(f"mov.{t} {reg}, {self.alu(rop, dt, (acc, acc), [reg, other])}")
            offset //= 2
        if group == self.warp:
            return
        base = self.op("b64", f"mov.u64 {{d}}, {self.group_buffer}")
        warp = self.op("b32", f"shr.u32 {{d}}, {self.lane}, {self.warp.bit_length() - 1}")
        warp64 = self.op("b64", f"cvt.u64.u32 {{d}}, {warp}")
        slot_bytes = self.const(GROUP_SLOT_BYTES, dtypes.int64)
        slot = self.op("b64", f"mad.lo.s64 {{d}}, {warp64}, {slot_bytes}, {base}")
        in_warp = self.op("b32", f"and.b32 {{d}}, {self.lane}, {self.const(self.warp - 1, dtypes.uint32)}")
        first = self.op("pred", f"setp.eq.u32 {{d}}, {in_warp}, {self.const(0, dtypes.uint32)}")
        self.ins(f"@{first} st.shared.{t} [{slot}], {reg}")
        self.ins("bar.sync 0")
        self.ins(f"ld.shared.{t} {reg}, [{base}]")
        for k in range(1, group // self.warp):
            other = self.reg(reg_class(dt))
            self.ins(f"ld.shared.{t} {other}, [{base}+{k * GROUP_SLOT_BYTES}]")
            self.ins(f"mov.{t} {reg}, {self.alu(rop, dt, (acc, acc), [reg, other])}")
        self.ins("bar.sync 0")

    def shuffle_xor(self, value: str, cls: str, lane_mask: int) -> str:
        """The register `value` of lane (this lane ^ lane_mask) of the warp; 64-bit values move as two
        32-bit halves (shfl moves 32 bits)."""
        def shfl(v: str, into: str) -> str:  # .b32 takes any 32-bit register, .f32 ones too
            return self.op(into, f"shfl.sync.bfly.b32 {{d}}, {v}, {lane_mask}, {shfl_clamp(self.warp)}, "
                                 f"{SHFL_ALL_LANES}")
        if cls in ("b32", "f32"):
            return shfl(value, cls)
        lo, hi = self.reg("b32"), self.reg("b32")
        self.ins(f"mov.b64 {{{lo}, {hi}}}, {value}")
        out = self.reg(cls)
        self.ins(f"mov.b64 {out}, {{{shfl(lo, 'b32')}, {shfl(hi, 'b32')}}}")
        return out

    # ------------------------------------------------------------------ memory
    def address(self, index: UOp) -> str:
        glob, idx = index.src
        assert glob.dtype is not None and idx.dtype is not None
        i = self.value(idx)
        if reg_class(idx.dtype) != "b64":
            i = self.cast(i, idx.dtype, dtypes.int64)
        size = self.const(glob.dtype.itemsize, dtypes.int64)
        return self.op("b64", f"mad.lo.s64 {{d}}, {i}, {size}, {self.value(glob)}")

    def from_memory(self, raw: str, dt: DType) -> str:
        if dt.is_bool:
            return self.op("pred", f"setp.ne.u32 {{d}}, {raw}, {self.const(0, dtypes.uint32)}")
        if dt == dtypes.bfloat16:
            return self.bf16_bits_to_f32(raw)
        if dt == dtypes.float16:
            return self.op("f32", f"cvt.f32.f16 {{d}}, {raw}")
        return raw

    def to_memory(self, v: str, dt: DType) -> str:
        if dt.is_bool:
            one, zero = self.const(1, dtypes.uint32), self.const(0, dtypes.uint32)
            return self.op("b32", f"selp.u32 {{d}}, {one}, {zero}, {v}")
        if dt == dtypes.bfloat16:
            return self.op("b16", f"cvt.rn.bf16.f32 {{d}}, {v}")
        if dt == dtypes.float16:
            return self.op("b16", f"cvt.rn.f16.f32 {{d}}, {v}")
        return v

    def bf16_bits_to_f32(self, bits: str) -> str:
        """bfloat16 bits (zero-extended in a .b32 or a .b16 register) -> the float32 they are the top of."""
        if bits.startswith("%h"):
            bits = self.op("b32", f"cvt.u32.u16 {{d}}, {bits}")
        shifted = self.op("b32", f"shl.b32 {{d}}, {bits}, 16")
        return self.op("f32", f"mov.b32 {{d}}, {shifted}")

    def vector_store(self, group: tuple[UOp, ...]) -> None:
        """One st.global.v4 for lanes storing consecutive 32-bit elements (proven by the lowerer); 32-bit
        values are stored as they are held, so no lane needs converting."""
        index = group[0].src[0]
        glob = index.src[0]
        assert glob.dtype is not None
        values = [self.value(st.src[1]) for st in group]
        addr = self.address(index)
        self.ins(f"st.global.v{len(group)}.{_mem_type(glob.dtype)} [{addr}], {{{', '.join(values)}}}")

    def vector_load(self, u: UOp, group: tuple[UOp, ...]) -> str:
        """One ld.global.v4 for every lane of `u`'s group; the other lanes' registers are recorded at the
        level `u` is being emitted at, so their own value() calls find them."""
        assert u.dtype is not None
        regs = [self.reg(_raw_class(u.dtype)) for _ in group]
        addr = self.address(group[0].src[0])
        self.ins(f"ld.global.v{len(group)}.{_mem_type(u.dtype)} {{{', '.join(regs)}}}, [{addr}]")
        for lane, reg in zip(group, regs, strict=True):
            if lane is not u:
                self.scopes[self.emit_level][lane] = reg
                self.level_of[lane] = self.emit_level
        return regs[group.index(u)]

    def load(self, u: UOp) -> str:
        assert u.dtype is not None
        group = self.vector_group_of.get(u)
        if group is not None:
            return self.vector_load(u, group)
        dt = u.dtype
        addr = self.address(u.src[0])
        raw = self.reg(_raw_class(dt))
        mt = _mem_type(dt)
        if len(u.src) == 2:
            # masked: the address may be outside the buffer, so only lanes whose mask holds load
            valid = self.value(u.src[1])
            cls = _raw_class(dt)
            zero = "0" if cls[0] != "f" else float_imm(0.0, dtypes.float64 if cls == "f64" else dt)
            self.ins(f"mov.{cls} {raw}, {zero}")
            self.ins(f"@{valid} ld.global.{mt} {raw}, [{addr}]")
        else:
            self.ins(f"ld.global.{mt} {raw}, [{addr}]")
        return self.from_memory(raw, dt)

    # ------------------------------------------------------------------ expressions
    def value(self, u: UOp) -> str:
        hit = self.lookup(u)
        if hit is not None:
            return hit
        if u.op is Ops.CONST:
            assert u.dtype is not None
            return self.const(u.arg, u.dtype)
        deepest = len(self.marks)
        if u.op is Ops.LOAD or not u.src:
            # memory and accumulator reads stay where they are: a loop that runs zero times must not
            # read, and an accumulator changes inside its loop
            level = deepest
        else:
            for s in u.src:
                self.value(s)
            level = max((self.level_of.get(s, 0) for s in u.src), default=0)
        saved, self.emit_level = self.emit_level, level
        try:
            out = self._value(u)
        finally:
            self.emit_level = saved
        self.scopes[level][u] = out
        self.level_of[u] = level
        return out

    def _value(self, u: UOp) -> str:
        op, dt = u.op, u.dtype
        if op is Ops.LOAD:
            if u.src[0].op is Ops.DEFINE_ACC:
                return self.acc_regs[u.src[0]]
            return self.load(u)
        if op is Ops.SPECIAL:
            raise NotImplementedError(f"PTX renderer: SPECIAL {u.arg} outside the global range")
        if op is Ops.CAST:
            return self.cast(self.value(u.src[0]), u.src[0].dt, u.dt)
        if op is Ops.BITCAST:
            return self.bitcast(self.value(u.src[0]), u.src[0].dt, u.dt)
        assert dt is not None
        return self.alu(op, dt, u.src, [self.value(s) for s in u.src])

    # ------------------------------------------------------------------ rounding to narrow types
    def fix(self, v: str, dt: DType) -> str:
        """Bring a raw 32-bit result back to `dt`: re-extend narrow ints, round float16/bfloat16."""
        narrow = _narrow_type(dt)
        if narrow is not None:
            return self.op("b32", f"cvt.{narrow}.{op_type(dt)} {{d}}, {v}")
        if dt == dtypes.float16:
            h = self.op("b16", f"cvt.rn.f16.f32 {{d}}, {v}")
            return self.op("f32", f"cvt.f32.f16 {{d}}, {h}")
        if dt == dtypes.bfloat16:
            return self.bf16_bits_to_f32(self.op("b16", f"cvt.rn.bf16.f32 {{d}}, {v}"))
        return v

    # ------------------------------------------------------------------ conversions
    def cast(self, v: str, src: DType, dst: DType) -> str:
        if src == dst:
            return v
        sc, dc = reg_class(src), reg_class(dst)
        if dst.is_bool:
            zero = self.const(0, src)
            cmp = "neu" if src.is_float else "ne"  # NaN is truthy, as `x != 0` is
            return self.op("pred", f"setp.{cmp}.{op_type(src)} {{d}}, {v}, {zero}")
        if src.is_bool:
            one, zero = self.const(1, dst), self.const(0, dst)
            return self.op(dc, f"selp.{op_type(dst)} {{d}}, {one}, {zero}, {v}")
        if src.is_int and dst.is_int:
            if _narrow_type(dst) is not None:
                return self.op("b32", f"cvt.{_narrow_type(dst)}.{op_type(src)} {{d}}, {v}")
            if sc == dc:
                return v  # same bits: the source was already extended from its width as C converts
            return self.op(dc, f"cvt.{op_type(dst)}.{op_type(src)} {{d}}, {v}")
        if src.is_float and dst.is_int:
            if _narrow_type(dst) is not None:
                # 8/16-bit results go through int32 and wrap, as the CPU renderer (and numpy on x86) do;
                # a direct cvt.rzi.s8 would saturate 250.0 to 127 where the CPU gives -6
                wide = self.op("b32", f"cvt.rzi.s32.{op_type(src)} {{d}}, {v}")
                return self.cast(wide, dtypes.int32, dst)
            # truncation toward zero, as C; out-of-range values saturate (undefined in C)
            return self.op(dc, f"cvt.rzi.{op_type(dst)}.{op_type(src)} {{d}}, {v}")
        if src.is_int and dst.is_float:
            if dst == dtypes.float16:
                h = self.op("b16", f"cvt.rn.f16.{op_type(src)} {{d}}, {v}")
                return self.op("f32", f"cvt.f32.f16 {{d}}, {h}")
            out = self.op(dc, f"cvt.rn.{op_type(dst)}.{op_type(src)} {{d}}, {v}")
            return self.fix(out, dst)
        # float -> float
        if sc == dc:
            return self.fix(v, dst)  # f16/bf16/f32 share .f32 registers: round to the narrower type
        if dst == dtypes.float16 and src == dtypes.float64:
            h = self.op("b16", f"cvt.rn.f16.f64 {{d}}, {v}")  # one rounding, not two through float32
            return self.op("f32", f"cvt.f32.f16 {{d}}, {h}")
        rnd = "rn." if dc == "f32" else ""
        out = self.op(dc, f"cvt.{rnd}{op_type(dst)}.{op_type(src)} {{d}}, {v}")
        return self.fix(out, dst)

    def bitcast(self, v: str, src: DType, dst: DType) -> str:
        if src.itemsize != dst.itemsize:
            raise ValueError(f"bitcast needs equal sizes: {src} -> {dst}")
        # to the integer bits
        if src in (dtypes.float16, dtypes.bfloat16):
            kind = "f16" if src == dtypes.float16 else "bf16"
            h = self.op("b16", f"cvt.rn.{kind}.f32 {{d}}, {v}")
            bits = self.op("b32", f"cvt.u32.u16 {{d}}, {h}")
        elif src.is_float:
            bits = self.op("b32" if src.itemsize == 4 else "b64", f"mov.b{src.itemsize * 8} {{d}}, {v}")
        elif src.is_bool:
            bits = self.cast(v, src, dtypes.uint8)
        else:
            bits = v
        # from the integer bits
        if dst == dtypes.float16:
            h = self.op("b16", f"cvt.u16.u32 {{d}}, {bits}")
            return self.op("f32", f"cvt.f32.f16 {{d}}, {h}")
        if dst == dtypes.bfloat16:
            return self.bf16_bits_to_f32(bits)  # the shift drops the sign extension of an int16
        if dst.is_float:
            return self.op(reg_class(dst), f"mov.b{dst.itemsize * 8} {{d}}, {bits}")
        if dst.is_bool:
            return self.op("pred", f"setp.ne.u32 {{d}}, {bits}, {self.const(0, dtypes.uint32)}")
        narrow = _narrow_type(dst)
        return self.op("b32", f"cvt.{narrow}.u32 {{d}}, {bits}") if narrow is not None else bits

    # ------------------------------------------------------------------ ALU
    def alu(self, op: Ops, dt: DType, srcs: tuple[UOp, ...], s: list[str]) -> str:
        sdt = srcs[0].dt
        t = op_type(sdt)
        cls = reg_class(dt)
        if op is Ops.WHERE:
            if dt.is_bool:
                yes = self.op("pred", f"and.pred {{d}}, {s[0]}, {s[1]}")
                notc = self.op("pred", f"not.pred {{d}}, {s[0]}")
                no = self.op("pred", f"and.pred {{d}}, {notc}, {s[2]}")
                return self.op("pred", f"or.pred {{d}}, {yes}, {no}")
            return self.op(cls, f"selp.{op_type(dt)} {{d}}, {s[1]}, {s[2]}, {s[0]}")
        if sdt.is_bool:
            return self.bool_alu(op, s)
        if op is Ops.MULACC:
            text = "fma.rn" if sdt.is_float else "mad.lo"
            return self.fix(self.op(cls, f"{text}.{t} {{d}}, {s[0]}, {s[1]}, {s[2]}"), dt)
        if op is Ops.NEG:
            return self.fix(self.op(cls, f"neg.{t if sdt.is_float else 's' + t[1:]} {{d}}, {s[0]}"), dt)
        if op is Ops.NOT:
            if sdt.is_float:
                raise NotImplementedError(f"PTX renderer: NOT on {sdt}")
            return self.fix(self.op(cls, f"not.b{t[1:]} {{d}}, {s[0]}"), dt)
        if op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC):
            if not sdt.is_float:
                raise NotImplementedError(f"PTX renderer: {op} on {sdt}")
            return self.fix(self.float_unary(op, sdt, s[0]), dt)
        if op is Ops.POW:
            powed = self.float_pow(sdt, s[0], s[1]) if sdt.is_float else self.int_pow(sdt, s[0], s[1])
            return self.fix(powed, dt)
        if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            if sdt.is_float:
                cmp = {Ops.CMPLT: "lt", Ops.CMPNE: "neu", Ops.CMPEQ: "eq"}[op]  # NaN != x holds, as in C
            else:
                cmp = {Ops.CMPLT: "lt", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}[op]
            return self.op("pred", f"setp.{cmp}.{t} {{d}}, {s[0]}, {s[1]}")
        if op is Ops.MAX:
            if t == "f32":
                # .NaN: a NaN input wins, as in the LLVM renderer's llvm.maximum
                return self.fix(self.op(cls, f"max.NaN.f32 {{d}}, {s[0]}, {s[1]}"), dt)
            if t == "f64":  # max.NaN has no f64 form: pick a NaN (a + b) where either input is one
                m = self.op(cls, f"max.f64 {{d}}, {s[0]}, {s[1]}")
                nan = self.op("pred", f"setp.nan.f64 {{d}}, {s[0]}, {s[1]}")
                both = self.op(cls, f"add.f64 {{d}}, {s[0]}, {s[1]}")
                return self.op(cls, f"selp.f64 {{d}}, {both}, {m}, {nan}")
            return self.op(cls, f"max.{t} {{d}}, {s[0]}, {s[1]}")
        if op in (Ops.IDIV, Ops.MOD):
            if sdt.is_float:
                return self.fix(self.float_div_mod(op, t, s[0], s[1]), dt)
            return self.fix(self.int_div(op, sdt, srcs[1], s[0], s[1]), dt)
        if op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV) and sdt.is_float:
            name = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.FDIV: "div.rn"}[op]
            return self.fix(self.op(cls, f"{name}.{t} {{d}}, {s[0]}, {s[1]}"), dt)
        if op in (Ops.ADD, Ops.SUB, Ops.MUL):
            name = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul.lo"}[op]
            return self.fix(self.op(cls, f"{name}.{t} {{d}}, {s[0]}, {s[1]}"), dt)
        if op in (Ops.AND, Ops.OR, Ops.XOR):
            name = {Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}[op]
            return self.op(cls, f"{name}.b{t[1:]} {{d}}, {s[0]}, {s[1]}")
        if op in (Ops.SHL, Ops.SHR) and sdt.is_int:
            # the amount is converted to the shifted type first (interpret.py), then read as .u32
            amount = self.cast(s[1], srcs[1].dt, sdt)
            if reg_class(sdt) == "b64":
                amount = self.op("b32", f"cvt.u32.u64 {{d}}, {amount}")
            if op is Ops.SHL:
                return self.fix(self.op(cls, f"shl.b{t[1:]} {{d}}, {s[0]}, {amount}"), dt)
            return self.op(cls, f"shr.{t} {{d}}, {s[0]}, {amount}")
        raise NotImplementedError(f"PTX renderer: {op} on {sdt}")

    def bool_alu(self, op: Ops, s: list[str]) -> str:
        # bool arithmetic saturates like torch's: + is or, * is and, - is xor; max is or
        simple = {Ops.ADD: "or", Ops.OR: "or", Ops.MAX: "or", Ops.MUL: "and", Ops.AND: "and",
                  Ops.SUB: "xor", Ops.XOR: "xor", Ops.CMPNE: "xor"}
        if op in simple:
            return self.op("pred", f"{simple[op]}.pred {{d}}, {s[0]}, {s[1]}")
        if op is Ops.NOT:
            return self.op("pred", f"not.pred {{d}}, {s[0]}")
        if op is Ops.CMPEQ:
            ne = self.op("pred", f"xor.pred {{d}}, {s[0]}, {s[1]}")
            return self.op("pred", f"not.pred {{d}}, {ne}")
        if op is Ops.CMPLT:  # false < true only
            na = self.op("pred", f"not.pred {{d}}, {s[0]}")
            return self.op("pred", f"and.pred {{d}}, {na}, {s[1]}")
        if op is Ops.MULACC:
            m = self.op("pred", f"and.pred {{d}}, {s[0]}, {s[1]}")
            return self.op("pred", f"or.pred {{d}}, {m}, {s[2]}")
        raise NotImplementedError(f"PTX renderer: {op} on bool")

    def float_unary(self, op: Ops, sdt: DType, x: str) -> str:
        t = op_type(sdt)
        cls = reg_class(sdt)
        if op is Ops.SQRT:
            return self.op(cls, f"sqrt.rn.{t} {{d}}, {x}")
        if op is Ops.RECIP:
            return self.op(cls, f"rcp.rn.{t} {{d}}, {x}")
        if op is Ops.TRUNC:
            return self.op(cls, f"cvt.rzi.{t}.{t} {{d}}, {x}")
        if op is Ops.SIN and t == "f32":  # sin.approx.f32 is too coarse (module docstring)
            wide = self.op("f64", f"cvt.f64.f32 {{d}}, {x}")
            return self.op(cls, f"cvt.rn.f32.f64 {{d}}, {self.sin_f64(wide)}")
        name = {Ops.EXP2: "ex2", Ops.LOG2: "lg2"}.get(op)
        if t == "f32" and name is not None:
            return self.op(cls, f"{name}.approx.f32 {{d}}, {x}")
        # float64: PTX has no f64 forms of these; straight-line double-precision routines instead
        return {Ops.EXP2: self.exp2_f64, Ops.LOG2: self.log2_f64, Ops.SIN: self.sin_f64}[op](x)

    # ---------------------------------------------------------------- float64 transcendentals
    # Branch-free, built from IEEE-exact operations (fma.rn, cvt.rni, integer bit work), so hardware and the
    # mock interpreter compute the same bits. Accuracy: a few ulp (polynomial truncation well below 1 ulp).
    def f64(self, v: float) -> str:
        return self.const(v, dtypes.float64)

    def i64(self, v: int) -> str:
        return self.const(v, dtypes.int64)

    def horner_f64(self, t: str, coeffs: list[float]) -> str:
        """coeffs[0] + t*(coeffs[1] + t*(...)), highest degree innermost, with fused multiply-adds."""
        acc = self.f64(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.op("f64", f"fma.rn.f64 {{d}}, {acc}, {t}, {self.f64(c)}")
        return acc

    def pow2_int_f64(self, n: str) -> str:
        """2**n for an integral float64 n in [-1022, 1023], built from the exponent bits."""
        ni = self.op("b64", f"cvt.rni.s64.f64 {{d}}, {n}")
        biased = self.op("b64", f"add.s64 {{d}}, {ni}, {self.i64(F64_EXPONENT_BIAS)}")
        bits = self.op("b64", f"shl.b64 {{d}}, {biased}, {F64_MANTISSA_BITS}")
        return self.op("f64", f"mov.b64 {{d}}, {bits}")

    def exp2_f64(self, x: str) -> str:
        """2**x = 2**n * e**(f*ln2) with n = round(x), |f| <= 1/2; the scale is applied in two halves so
        results down to the subnormal range and up to overflow come out right."""
        lo, hi = self.f64(EXP2_F64_MIN_ARG), self.f64(EXP2_F64_MAX_ARG)
        xc = self.op("f64", f"max.f64 {{d}}, {x}, {lo}")
        xc = self.op("f64", f"min.f64 {{d}}, {xc}, {hi}")
        n = self.op("f64", f"cvt.rni.f64.f64 {{d}}, {xc}")
        f = self.op("f64", f"sub.f64 {{d}}, {xc}, {n}")
        t = self.op("f64", f"mul.f64 {{d}}, {f}, {self.f64(math.log(2.0))}")
        poly = self.horner_f64(t, [1.0 / math.factorial(k) for k in range(EXP_F64_TERMS)])
        half = self.op("f64", f"mul.f64 {{d}}, {n}, {self.f64(0.5)}")
        n1 = self.op("f64", f"cvt.rmi.f64.f64 {{d}}, {half}")
        n2 = self.op("f64", f"sub.f64 {{d}}, {n}, {n1}")
        r = self.op("f64", f"mul.f64 {{d}}, {poly}, {self.pow2_int_f64(n1)}")
        r = self.op("f64", f"mul.f64 {{d}}, {r}, {self.pow2_int_f64(n2)}")
        is_nan = self.op("pred", f"setp.nan.f64 {{d}}, {x}, {x}")
        return self.op("f64", f"selp.f64 {{d}}, {x}, {r}, {is_nan}")  # min/max would drop a NaN

    def log2_f64(self, x: str) -> str:
        """log2(x) = e + log2(m), m in [sqrt(1/2), sqrt(2)), log2(m) = 2*atanh((m-1)/(m+1))/ln2; subnormal
        inputs are scaled by 2**54 first. Negative -> NaN, 0 -> -inf, inf -> inf, NaN -> NaN."""
        small = self.op("pred", f"setp.lt.f64 {{d}}, {x}, {self.f64(F64_MIN_NORMAL)}")
        scaled = self.op("f64", f"mul.f64 {{d}}, {x}, {self.f64(2.0 ** SUBNORMAL_SCALE_BITS)}")
        xs = self.op("f64", f"selp.f64 {{d}}, {scaled}, {x}, {small}")
        bias = self.op("f64", f"selp.f64 {{d}}, {self.f64(-SUBNORMAL_SCALE_BITS)}, {self.f64(0.0)}, {small}")
        bits = self.op("b64", f"mov.b64 {{d}}, {xs}")
        exp_field = self.op("b64", f"shr.u64 {{d}}, {bits}, {F64_MANTISSA_BITS}")
        exp_field = self.op("b64", f"and.b64 {{d}}, {exp_field}, {self.i64(F64_EXPONENT_MASK)}")
        e_int = self.op("b64", f"sub.s64 {{d}}, {exp_field}, {self.i64(F64_EXPONENT_BIAS)}")
        mant = self.op("b64", f"and.b64 {{d}}, {bits}, {self.i64((1 << F64_MANTISSA_BITS) - 1)}")
        mant = self.op("b64", f"or.b64 {{d}}, {mant}, {self.i64(F64_EXPONENT_BIAS << F64_MANTISSA_BITS)}")
        m = self.op("f64", f"mov.b64 {{d}}, {mant}")  # in [1, 2)
        e = self.op("f64", f"cvt.rn.f64.s64 {{d}}, {e_int}")
        big = self.op("pred", f"setp.gt.f64 {{d}}, {m}, {self.f64(math.sqrt(2.0))}")
        m_half = self.op("f64", f"mul.f64 {{d}}, {m}, {self.f64(0.5)}")
        m = self.op("f64", f"selp.f64 {{d}}, {m_half}, {m}, {big}")
        e_up = self.op("f64", f"add.f64 {{d}}, {e}, {self.f64(1.0)}")
        e = self.op("f64", f"selp.f64 {{d}}, {e_up}, {e}, {big}")
        e = self.op("f64", f"add.f64 {{d}}, {e}, {bias}")
        num = self.op("f64", f"sub.f64 {{d}}, {m}, {self.f64(1.0)}")
        den = self.op("f64", f"add.f64 {{d}}, {m}, {self.f64(1.0)}")
        s_ = self.op("f64", f"div.rn.f64 {{d}}, {num}, {den}")
        s2 = self.op("f64", f"mul.f64 {{d}}, {s_}, {s_}")
        # atanh(s)/s = sum s^(2k)/(2k+1); times 2/ln2 for log2
        series = self.horner_f64(s2, [1.0 / (2 * k + 1) for k in range(ATANH_F64_TERMS)])
        lg = self.op("f64", f"mul.f64 {{d}}, {series}, {s_}")
        lg = self.op("f64", f"fma.rn.f64 {{d}}, {lg}, {self.f64(2.0 / math.log(2.0))}, {e}")
        # special values, last wins: x == inf -> inf, x == 0 -> -inf, x < 0 or NaN -> NaN
        is_inf = self.op("pred", f"setp.eq.f64 {{d}}, {x}, {self.f64(math.inf)}")
        lg = self.op("f64", f"selp.f64 {{d}}, {x}, {lg}, {is_inf}")
        is_zero = self.op("pred", f"setp.eq.f64 {{d}}, {x}, {self.f64(0.0)}")
        lg = self.op("f64", f"selp.f64 {{d}}, {self.f64(-math.inf)}, {lg}, {is_zero}")
        bad = self.op("pred", f"setp.ltu.f64 {{d}}, {x}, {self.f64(0.0)}")  # unordered: NaN too
        return self.op("f64", f"selp.f64 {{d}}, {self.f64(math.nan)}, {lg}, {bad}")

    def sin_f64(self, x: str) -> str:
        """sin(x): x = k*pi/2 + r with a three-part (Cody-Waite) pi/2, |r| <= pi/4, then the sine or cosine
        polynomial by quadrant. Accurate to a few ulp for |x| up to ~1e9; inf and NaN give NaN."""
        k = self.op("f64", f"mul.f64 {{d}}, {x}, {self.f64(2.0 / math.pi)}")
        k = self.op("f64", f"cvt.rni.f64.f64 {{d}}, {k}")
        r = x
        for part in PIO2_F64_PARTS:
            neg_k = self.op("f64", f"neg.f64 {{d}}, {k}")
            r = self.op("f64", f"fma.rn.f64 {{d}}, {neg_k}, {self.f64(part)}, {r}")
        r2 = self.op("f64", f"mul.f64 {{d}}, {r}, {r}")
        sin_coeffs = [(-1.0) ** j / math.factorial(2 * j + 1) for j in range(SIN_F64_TERMS)]
        cos_coeffs = [(-1.0) ** j / math.factorial(2 * j) for j in range(SIN_F64_TERMS + 1)]
        sin_r = self.op("f64", f"mul.f64 {{d}}, {self.horner_f64(r2, sin_coeffs)}, {r}")
        cos_r = self.horner_f64(r2, cos_coeffs)
        # quadrant = k mod 4 (k may be negative: two's complement `and` gives the right residue)
        ki = self.op("b64", f"cvt.rni.s64.f64 {{d}}, {k}")
        q = self.op("b64", f"and.b64 {{d}}, {ki}, {self.i64(3)}")
        odd_bit = self.op("b64", f"and.b64 {{d}}, {q}, {self.i64(1)}")
        use_cos = self.op("pred", f"setp.ne.s64 {{d}}, {odd_bit}, {self.i64(0)}")
        v = self.op("f64", f"selp.f64 {{d}}, {cos_r}, {sin_r}, {use_cos}")
        sign_bit = self.op("b64", f"and.b64 {{d}}, {q}, {self.i64(2)}")
        negate = self.op("pred", f"setp.ne.s64 {{d}}, {sign_bit}, {self.i64(0)}")
        neg_v = self.op("f64", f"neg.f64 {{d}}, {v}")
        return self.op("f64", f"selp.f64 {{d}}, {neg_v}, {v}, {negate}")

    def float_pow(self, sdt: DType, x: str, y: str) -> str:
        """C's pow through exp2(y * log2|x|), with its sign and special cases (module docstring), in float64
        with the double-precision exp2/log2 routines; float32 operands are widened and the result rounded."""
        t = op_type(sdt)
        if t == "f32":
            wx = self.op("f64", f"cvt.f64.f32 {{d}}, {x}")
            wy = self.op("f64", f"cvt.f64.f32 {{d}}, {y}")
            return self.op("f32", f"cvt.rn.f32.f64 {{d}}, {self.float_pow(dtypes.float64, wx, wy)}")
        fdt = dtypes.float64
        one, half, zero = self.const(1.0, fdt), self.const(0.5, fdt), self.const(0.0, fdt)
        ax = self.op(t, f"abs.{t} {{d}}, {x}")
        prod_ = self.op(t, f"mul.{t} {{d}}, {self.log2_f64(ax)}, {y}")
        mag = self.exp2_f64(prod_)
        y_int = self.op(t, f"cvt.rzi.{t}.{t} {{d}}, {y}")
        is_int = self.op("pred", f"setp.eq.{t} {{d}}, {y_int}, {y}")
        y_half = self.op(t, f"mul.{t} {{d}}, {y}, {half}")
        y_half_int = self.op(t, f"cvt.rzi.{t}.{t} {{d}}, {y_half}")
        odd = self.op("pred", f"setp.ne.{t} {{d}}, {y_half_int}, {y_half}")
        neg_mag = self.op(t, f"neg.{t} {{d}}, {mag}")
        signed = self.op(t, f"selp.{t} {{d}}, {neg_mag}, {mag}, {odd}")
        nan = self.const(math.nan, fdt)
        neg_result = self.op(t, f"selp.{t} {{d}}, {signed}, {nan}, {is_int}")
        x_neg = self.op("pred", f"setp.lt.{t} {{d}}, {x}, {zero}")
        r = self.op(t, f"selp.{t} {{d}}, {neg_result}, {mag}, {x_neg}")
        y_zero = self.op("pred", f"setp.eq.{t} {{d}}, {y}, {zero}")
        x_one = self.op("pred", f"setp.eq.{t} {{d}}, {x}, {one}")
        trivial = self.op("pred", f"or.pred {{d}}, {y_zero}, {x_one}")
        return self.op(t, f"selp.{t} {{d}}, {one}, {r}, {trivial}")

    def int_pow(self, sdt: DType, a: str, b: str) -> str:
        """Exponentiation by squaring (wrapping); a negative exponent gives 1/a**n truncated."""
        t, cls = op_type(sdt), reg_class(sdt)
        one, zero = self.const(1, sdt), self.const(0, sdt)
        result, base, exp = self.reg(cls), self.reg(cls), self.reg(cls)
        self.ins(f"mov.{t} {result}, {one}")
        self.ins(f"mov.{t} {base}, {a}")
        self.ins(f"mov.{t} {exp}, {b}")
        loop, negative, done = self.label("pow"), self.label("pow_neg"), self.label("pow_done")
        if not sdt.is_unsigned:
            is_neg = self.op("pred", f"setp.lt.{t} {{d}}, {exp}, {zero}")
            self.ins(f"@{is_neg} bra {negative}")
        self.put_label(loop)
        finished = self.op("pred", f"setp.eq.{t} {{d}}, {exp}, {zero}")
        self.ins(f"@{finished} bra {done}")
        low = self.op(cls, f"and.b{t[1:]} {{d}}, {exp}, {one}")
        odd = self.op("pred", f"setp.ne.{t} {{d}}, {low}, {zero}")
        self.ins(f"@{odd} mul.lo.{t} {result}, {result}, {base}")
        self.ins(f"mul.lo.{t} {base}, {base}, {base}")
        self.ins(f"shr.u{t[1:]} {exp}, {exp}, 1")
        self.ins(f"bra {loop}")
        if not sdt.is_unsigned:
            self.put_label(negative)
            minus_one = self.const(-1, sdt)
            b_low = self.op(cls, f"and.b{t[1:]} {{d}}, {b}, {one}")
            b_odd = self.op("pred", f"setp.ne.{t} {{d}}, {b_low}, {zero}")
            sign = self.op(cls, f"selp.{t} {{d}}, {minus_one}, {one}, {b_odd}")
            a_m1 = self.op("pred", f"setp.eq.{t} {{d}}, {a}, {minus_one}")
            a_1 = self.op("pred", f"setp.eq.{t} {{d}}, {a}, {one}")
            tmp = self.op(cls, f"selp.{t} {{d}}, {sign}, {zero}, {a_m1}")
            self.ins(f"selp.{t} {result}, {one}, {tmp}, {a_1}")
        self.put_label(done)
        return result

    def int_div(self, op: Ops, sdt: DType, divisor: UOp, a: str, b: str) -> str:
        """C division / remainder; x / 0 and x % 0 give 0, INT_MIN / -1 wraps (no undefined result)."""
        t, cls = op_type(sdt), reg_class(sdt)
        name = "div" if op is Ops.IDIV else "rem"
        if divisor.op is Ops.CONST and divisor.arg != 0 and (sdt.is_unsigned or divisor.arg != -1):
            return self.op(cls, f"{name}.{t} {{d}}, {a}, {b}")  # the common case: index math by a size
        zero, one = self.const(0, sdt), self.const(1, sdt)
        is_zero = self.op("pred", f"setp.eq.{t} {{d}}, {b}, {zero}")
        if sdt.is_unsigned:
            safe = self.op(cls, f"selp.{t} {{d}}, {one}, {b}, {is_zero}")
            q = self.op(cls, f"{name}.{t} {{d}}, {a}, {safe}")
            return self.op(cls, f"selp.{t} {{d}}, {zero}, {q}, {is_zero}")
        is_m1 = self.op("pred", f"setp.eq.{t} {{d}}, {b}, {self.const(-1, sdt)}")
        bad = self.op("pred", f"or.pred {{d}}, {is_zero}, {is_m1}")
        safe = self.op(cls, f"selp.{t} {{d}}, {one}, {b}, {bad}")
        q = self.op(cls, f"{name}.{t} {{d}}, {a}, {safe}")
        # b == -1: a / -1 = -a (wrapping) and a % -1 = 0
        m1_result = self.op(cls, f"neg.{t} {{d}}, {a}") if op is Ops.IDIV else zero
        fixed = self.op(cls, f"selp.{t} {{d}}, {zero}, {m1_result}, {is_zero}")
        return self.op(cls, f"selp.{t} {{d}}, {fixed}, {q}, {bad}")

    def float_div_mod(self, op: Ops, t: str, a: str, b: str) -> str:
        """Float IDIV is trunc(a / b); MOD is C's fmod, a - b * trunc(a / b)."""
        cls = "f64" if t == "f64" else "f32"
        q = self.op(cls, f"div.rn.{t} {{d}}, {a}, {b}")
        qt = self.op(cls, f"cvt.rzi.{t}.{t} {{d}}, {q}")
        if op is Ops.IDIV:
            return qt
        prod_ = self.op(cls, f"mul.{t} {{d}}, {qt}, {b}")
        return self.op(cls, f"sub.{t} {{d}}, {a}, {prod_}")


def render_ptx(prog: LinearProgram, target: Target = DEFAULT_TARGET) -> str:
    """PTX text for one kernel (see the module docstring for its calling convention)."""
    if not target.isa.startswith("sm_"):
        raise ValueError(f"the PTX renderer writes NVIDIA kernels, not {target.name}")
    return _Emitter(prog, target).render()


class PTXRenderer:
    """The NVIDIA renderer: one thread per output element, printed as PTX."""

    language = "ptx"

    def __init__(self, arch: str | Target = DEFAULT_ARCH) -> None:
        self.target = arch if isinstance(arch, Target) else nv_target(arch)
        self.arch = self.target.isa

    def lower(self, ast: UOp, name: str) -> LinearProgram:
        return lower(ast, name, self.target)

    def render(self, prog: LinearProgram) -> str:
        return render_ptx(prog, self.target)
