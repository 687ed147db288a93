"""Render a linear program (compiler/lower.py, GPU flavor) as Metal Shading Language source for Apple GPUs.

Calling convention (what the Metal driver binds, and what a replay patches):
    kernel void <name>(device T0* buf0 [[buffer(0)]], ..., device Tn* bufn [[buffer(n)]],
                       constant long* vars [[buffer(n+1)]],           // only when the kernel has Variables
                       uint3 tpig [[thread_position_in_grid]], uint3 tpg [[threads_per_grid]],
                       uint lid [[thread_index_in_threadgroup]])
One buffer argument per entry of `prog.globals` in slot order, then every Variable as one 64-bit word of a
single argument buffer `vars` (the same "all scalars are i64 words" layout as the CPU argument words, the PTX
parameters and the AMD kernarg segment, so a captured graph patches the words of one small shared buffer
instead of re-encoding `setBytes` per scalar). `arg_indices(prog)` gives each argument's buffer index.
bool buffers are `device uchar*` (0/1 bytes, as everywhere in rawgrad).

Thread mapping (compiler/target.py index convention): `gidx = x + X * (y + Y * z)` from the thread's
position in the grid and the grid's extent in threads (`threads_per_grid`: whole threadgroups under
dispatchThreadgroups), so any 3-D launch covering the global size runs the kernel; threads at or past the
global size return at once. `lid` is the thread's linear index in its threadgroup (SIMD-groups are formed
from it); group reductions launch 1-D blocks of exactly their local size. Group
reductions: the lanes of one SIMD-group (the target's `simd_width`, 32 on Apple GPUs) combine their
accumulators with a butterfly of `simd_shuffle_xor`, so every lane holds the same bits in the same order
as on the other GPUs (`simd_sum` would leave the order, hence the rounding, to the compiler); a
group of a whole threadgroup then meets in a `threadgroup` array of one slot per SIMD-group between
two `threadgroup_barrier(mem_flags::mem_threadgroup)`, and lane 0 of the group stores.

Types: MSL has no double, so float64 kernels are refused (the Apple target does not list it). float16 and
bfloat16 are loaded, computed in float and rounded back after every operation (as the LLVM and PTX
renderers do); the bfloat16 conversions are written as bit operations (round to nearest even, NaN to a
quiet NaN), so the rounding is rawgrad's, not the Metal compiler's; the buffers are `device bfloat*`
(MSL 3.1). Signed int and long arithmetic that can wrap (+, -, *, negation, <<) goes through the unsigned
type, since a signed overflow is undefined in MSL (a C++14 dialect) but wraps in every other rawgrad
backend; integer division by zero gives 0 and INT_MIN / -1 wraps, as in the LLVM renderer.
Fast math must be off (MTLCompileOptions.fastMathEnabled = NO), so float math keeps IEEE semantics; the
driver sets it. The `vector_groups` of the linear program are rendered as scalar accesses (the Metal
compiler vectorizes adjacent ones; correctness does not depend on it).
"""
from __future__ import annotations

import math
import struct
from typing import Any

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.lower import GROUP_SLOT_BYTES, LinearProgram, lower
from rawgrad.compiler.target import APPLE_GPU, APPLE_TRIPLE, Target
from rawgrad.dtype import DType, dtypes

__all__ = ["MSLRenderer", "arg_indices", "msl_type", "render_msl"]

# MSL names of rawgrad's element types (MSL specification, "Scalar data types"); bool buffers hold bytes.
_MSL_TYPES = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short",
              dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long",
              dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.bfloat16: "bfloat",
              dtypes.float32: "float"}
# the unsigned type signed arithmetic wraps through; 8/16-bit values are promoted to int in C++ and their
# products fit 32 bits, so they only need the wrap of the final narrowing conversion (uint for ipow)
_UNSIGNED = {"int": "uint", "long": "ulong", "char": "uint", "short": "uint", "uchar": "uint",
             "ushort": "uint", "uint": "uint", "ulong": "ulong"}
VARS_NAME = "vars"
GROUP_NAME = "rg_group"
BF16_SHIFT = 16  # bfloat16 is the top half of a float32's bits

# Helpers every kernel carries (MSL allows plain inline functions and templates next to a kernel).
_HELPERS = """\
static inline float rg_fmax(float a, float b) {
  return (isnan(a) || isnan(b)) ? a + b : (a == b ? (signbit(a) ? b : a) : (a > b ? a : b));
}
static inline float rg_bf16_load(bfloat b) { return as_type<float>(uint(as_type<ushort>(b)) << 16); }
static inline bfloat rg_bf16_store(float v) {
  uint bits = as_type<uint>(v);
  uint rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return as_type<bfloat>(ushort(isnan(v) ? 0x7fc0u : rounded));
}
static inline float rg_bf16_round(float v) { return rg_bf16_load(rg_bf16_store(v)); }
template <typename T, typename U> static inline T rg_sdiv(T a, T b) {
  return b == T(0) ? T(0) : (b == T(-1) ? T(U(0) - U(a)) : T(a / b));
}
template <typename T> static inline T rg_smod(T a, T b) {
  return (b == T(0) || b == T(-1)) ? T(0) : T(a % b);
}
template <typename T> static inline T rg_udiv(T a, T b) { return b == T(0) ? T(0) : T(a / b); }
template <typename T> static inline T rg_umod(T a, T b) { return b == T(0) ? T(0) : T(a % b); }
template <typename T, typename U> static inline T rg_ipow(T a, T b, bool is_signed) {
  if (is_signed && b < T(0)) return a == T(1) ? T(1) : (a == T(-1) ? ((b & T(1)) ? T(-1) : T(1)) : T(0));
  U r = U(1), x = U(a), e = U(b);
  while (e != U(0)) { if (e & U(1)) r = U(r * x); x = U(x * x); e = U(e >> 1); }
  return T(r);
}
static inline float rg_shfl(float v, ushort m) { return simd_shuffle_xor(v, m); }
static inline int rg_shfl(int v, ushort m) { return simd_shuffle_xor(v, m); }
static inline uint rg_shfl(uint v, ushort m) { return simd_shuffle_xor(v, m); }
static inline bool rg_shfl(bool v, ushort m) { return simd_shuffle_xor(ushort(v), m) != 0; }
static inline char rg_shfl(char v, ushort m) { return char(simd_shuffle_xor(int(v), m)); }
static inline uchar rg_shfl(uchar v, ushort m) { return uchar(simd_shuffle_xor(uint(v), m)); }
static inline short rg_shfl(short v, ushort m) { return short(simd_shuffle_xor(int(v), m)); }
static inline ushort rg_shfl(ushort v, ushort m) { return ushort(simd_shuffle_xor(uint(v), m)); }
static inline ulong rg_shfl(ulong v, ushort m) {
  uint2 w = as_type<uint2>(v);
  return as_type<ulong>(uint2(simd_shuffle_xor(w.x, m), simd_shuffle_xor(w.y, m)));
}
static inline long rg_shfl(long v, ushort m) { return as_type<long>(rg_shfl(as_type<ulong>(v), m)); }
"""


def msl_type(dt: DType) -> str:
    """The MSL type of an element of `dt` (refuses float64, which Metal does not have)."""
    try:
        return _MSL_TYPES[dt]
    except KeyError:
        raise ValueError(f"MSL renderer: Metal has no {dt.name} type (MSL has no 64-bit float)") from None


def reg_type(dt: DType) -> str:
    """The type a value of `dt` is computed in: float for the 16-bit floats, else its own."""
    return "float" if dt in (dtypes.float16, dtypes.bfloat16) else msl_type(dt)


def mem_type(dt: DType) -> str:
    return "uchar" if dt == dtypes.bool else msl_type(dt)


def arg_indices(prog: LinearProgram) -> dict[str, int]:
    """Buffer argument index of each kernel argument: `buf<slot>` per buffer, then `vars` if any."""
    out = {f"buf{g.arg}": g.arg for g in prog.globals}
    if prog.variables:
        out[VARS_NAME] = len(prog.globals)
    return out


def _float_literal(v: float, dt: DType) -> str:
    if dt == dtypes.float32 or dt in (dtypes.float16, dtypes.bfloat16):
        if math.isfinite(v):
            f32 = struct.unpack("<f", struct.pack("<f", v))[0]
            if math.isfinite(f32):
                return f"{f32!r}f"
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        return f"as_type<float>({bits:#x}u)"
    raise ValueError(f"MSL renderer: no {dt.name} constants")


def const_text(v: Any, dt: DType) -> str:
    if dt == dtypes.bool:
        return "true" if v else "false"
    if dt.is_float:
        return _float_literal(float(v), dt)
    t = msl_type(dt)
    iv = int(v)
    if dt == dtypes.int64 and iv == -(1 << 63):
        return "(long)(-9223372036854775807L - 1)"
    suffix = {"long": "L", "ulong": "UL", "uint": "u"}.get(t, "")
    return f"({t}){iv}{suffix}" if suffix == "" else f"{iv}{suffix}"


class _Emitter:
    def __init__(self, prog: LinearProgram) -> None:
        self.prog = prog
        target = prog.target
        if target.triple != APPLE_TRIPLE:
            raise ValueError(f"MSL renderer: {prog.name} was lowered for {target.name}, not an Apple GPU")
        if prog.launch.local_size[1:] != (1, 1) or tuple(prog.launch.global_size[1:]) != (1, 1):
            raise ValueError(f"MSL renderer: {prog.name} has a {prog.launch.global_size} launch of "
                             f"{prog.launch.local_size} blocks; kernels are 1-D")
        if [g.arg for g in prog.globals] != list(range(len(prog.globals))):
            raise ValueError(f"{prog.name}: buffer slots must be 0..n-1, got {[g.arg for g in prog.globals]}")
        self.simd = target.simd_width
        self.local = prog.launch.local_size[0]
        group = prog.group_size
        if group > 1 and group not in (self.simd, target.block_threads):
            raise ValueError(f"MSL renderer: {prog.name} has a group of {group} threads; the renderer "
                             f"combines groups of one SIMD-group ({self.simd}) or one block "
                             f"({target.block_threads})")
        if group > self.simd and self.local != group:
            raise ValueError(f"MSL renderer: block group of {group} threads needs a block of exactly that "
                             f"size, the launch has {self.local}")
        self.group_slots = group // self.simd if group > self.simd else 0
        if self.group_slots * GROUP_SLOT_BYTES != prog.launch.shared_bytes:
            raise ValueError(f"MSL renderer: the launch declares {prog.launch.shared_bytes} shared bytes, "
                             f"the group combine needs {self.group_slots * GROUP_SLOT_BYTES}")
        self.lines: list[str] = []
        self.depth = 1
        self.counter = 0
        self.scopes: list[dict[UOp, str]] = [{}]
        self.accs: dict[UOp, str] = {}
        self.store_gate: str | None = None

    # ------------------------------------------------------------------ text
    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def tmp(self, t: str, expr: str) -> str:
        self.counter += 1
        name = f"v{self.counter}"
        self.emit(f"{t} {name} = {expr};")
        return name

    def lookup(self, u: UOp) -> str | None:
        for scope in reversed(self.scopes):
            if u in scope:
                return scope[u]
        return None

    def render(self) -> str:
        p = self.prog
        args = [f"device {mem_type(g.dt)}* buf{g.arg} [[buffer({g.arg})]]" for g in p.globals]
        if p.variables:
            args.append(f"constant long* {VARS_NAME} [[buffer({len(p.globals)})]]")
        args += ["uint3 tpig [[thread_position_in_grid]]", "uint3 tpg [[threads_per_grid]]",
                 "uint lid [[thread_index_in_threadgroup]]"]
        for k, v in enumerate(p.variables):  # named by position: a Variable's own name may hold dots
            self.scopes[0][v] = f"var{k}"
            self.emit(f"const long var{k} = {VARS_NAME}[{k}];  // {v.arg[0]}")
        for st in p.statements:
            self.statement(st)
        head = ["#include <metal_stdlib>", "using namespace metal;", "", _HELPERS,
                f"kernel void {p.name}({', '.join(args)}) {{"]
        return "\n".join(head + self.lines + ["}", ""])

    # ------------------------------------------------------------------ statements
    def statement(self, st: UOp) -> None:
        op = st.op
        if op is Ops.RANGE and st.arg[1] == "global":
            self.global_index(st)
        elif op is Ops.RANGE:
            start, end = self.value(st.src[0]), self.value(st.src[1])
            ctr = f"i{st.arg[0]}"
            self.emit(f"for (long {ctr} = {start}; {ctr} < {end}; {ctr}++) {{")
            self.depth += 1
            self.scopes.append({st: ctr})
        elif op is Ops.ENDRANGE:
            if st.src[0].arg[1] == "global":
                return  # surplus threads returned at the guard
            self.scopes.pop()
            self.depth -= 1
            self.emit("}")
        elif op is Ops.DEFINE_ACC:
            self.counter += 1
            name = f"acc{st.arg}_{self.counter}"
            self.emit(f"{reg_type(st.dt)} {name} = {self.value(st.src[0])};")
            self.accs[st] = name
        elif op is Ops.ACC_UPDATE:
            acc, val = st.src
            self.emit(f"{self.accs[acc]} = {self.value(val)};")
            self.forget_acc_loads(acc)
        elif op is Ops.GROUP_COMBINE:
            self.group_combine(st)
        elif op is Ops.STORE:
            index, val = st.src
            glob, idx = index.src
            stored = self.to_memory(self.value(val), glob.dt)
            line = f"buf{glob.arg}[{self.value(idx)}] = {stored};"
            self.emit(f"if ({self.store_gate}) {line}" if self.store_gate else line)
        else:
            raise NotImplementedError(f"MSL renderer: unexpected statement {op}")

    def forget_acc_loads(self, acc: UOp) -> None:
        scope = self.scopes[-1]
        self.scopes[-1] = {k: s for k, s in scope.items() if not (k.op is Ops.LOAD and k.src[0] is acc)}

    def global_index(self, st: UOp) -> None:
        """gidx = x + X * (y + Y * z) over the launched grid (compiler/target.py index convention: any 3-D
        grid covering the global size runs the kernel); threads at or past the global size return (whole
        groups: see lower.py)."""
        self.emit("const long gidx = (long)tpig.x + (long)tpg.x * ((long)tpig.y + (long)tpg.y * "
                  "(long)tpig.z);")
        size = self.prog.global_size
        limit = self.value(size) if isinstance(size, UOp) else f"{int(size)}L"
        self.emit(f"if (gidx >= {limit}) return;")
        self.scopes[0][st] = "gidx"
        group = self.prog.group_size
        if group > 1:
            self.store_gate = f"(lid & {group - 1}u) == 0u"

    def group_combine(self, st: UOp) -> None:
        """Butterfly over the SIMD-group; block groups then meet through the threadgroup slots."""
        acc = st.src[0]
        rop, group = st.arg
        dt = acc.dt
        t = reg_type(dt)
        name = self.accs[acc]
        mask = min(group, self.simd) // 2
        while mask >= 1:
            other = self.tmp(t, f"rg_shfl({name}, (ushort){mask})")
            self.emit(f"{name} = {self.alu(rop, dt, (acc, acc), [name, other])};")
            mask //= 2
        if group > self.simd:
            # MSL allows threadgroup variables only at kernel function scope: the combine follows the loops
            if self.depth != 1:
                raise ValueError(f"MSL renderer: {self.prog.name} combines a group inside a loop")
            # one array of the accumulator's type (<= GROUP_SLOT_BYTES per slot: within the launch's
            # shared_bytes); a kernel has one reduce, hence one combine
            slots = f"{GROUP_NAME}{acc.arg}"
            self.emit(f"threadgroup {t} {slots}[{self.group_slots}];")
            shift = self.simd.bit_length() - 1
            self.emit(f"if ((lid & {self.simd - 1}u) == 0u) {slots}[lid >> {shift}] = {name};")
            self.emit("threadgroup_barrier(mem_flags::mem_threadgroup);")
            self.emit(f"{name} = {slots}[0];")
            for k in range(1, self.group_slots):
                other = self.tmp(t, f"{slots}[{k}]")
                self.emit(f"{name} = {self.alu(rop, dt, (acc, acc), [name, other])};")
            self.emit("threadgroup_barrier(mem_flags::mem_threadgroup);")
        self.forget_acc_loads(acc)

    # ------------------------------------------------------------------ memory
    @staticmethod
    def from_memory(raw: str, dt: DType) -> str:
        if dt == dtypes.bool:
            return f"({raw} != 0)"
        if dt == dtypes.bfloat16:
            return f"rg_bf16_load({raw})"
        if dt == dtypes.float16:
            return f"float({raw})"
        return raw

    @staticmethod
    def to_memory(v: str, dt: DType) -> str:
        if dt == dtypes.bool:
            return f"(uchar)({v} ? 1 : 0)"
        if dt == dtypes.bfloat16:
            return f"rg_bf16_store({v})"
        if dt == dtypes.float16:
            return f"half({v})"
        return v

    # ------------------------------------------------------------------ expressions
    def value(self, u: UOp) -> str:
        if u.op is Ops.CONST:
            return const_text(u.arg, u.dt)
        hit = self.lookup(u)
        if hit is not None:
            return hit
        out = self.tmp(reg_type(u.dt), self._expr(u))
        self.scopes[-1][u] = out
        return out

    def _expr(self, u: UOp) -> str:
        op, dt = u.op, u.dt
        if op is Ops.LOAD:
            if u.src[0].op is Ops.DEFINE_ACC:
                return self.accs[u.src[0]]
            glob, idx = u.src[0].src
            loaded = self.from_memory(f"buf{glob.arg}[{self.value(idx)}]", dt)
            if len(u.src) == 2:  # masked: only evaluated (read) where the mask holds
                return f"{self.value(u.src[1])} ? {loaded} : {const_text(0, dt)}"
            return loaded
        if op is Ops.SPECIAL:
            raise NotImplementedError(f"MSL renderer: SPECIAL {u.arg} outside the global range")
        if op is Ops.CAST:
            return self.cast(self.value(u.src[0]), u.src[0].dt, dt)
        if op is Ops.BITCAST:
            return self.bitcast(self.value(u.src[0]), u.src[0].dt, dt)
        return self.alu(op, dt, u.src, [self.value(s) for s in u.src])

    def round_to(self, expr: str, dt: DType) -> str:
        """16-bit float results are rounded to their type after every operation."""
        if dt == dtypes.float16:
            return f"float(half({expr}))"
        if dt == dtypes.bfloat16:
            return f"rg_bf16_round({expr})"
        return expr

    def cast(self, v: str, src: DType, dst: DType) -> str:
        if src == dst:
            return v
        if dst == dtypes.bool:
            return f"({v} != {const_text(0, src)})"
        if dst in (dtypes.float16, dtypes.bfloat16):
            return self.round_to(f"float({v})" if src != dtypes.float32 else v, dst)
        return f"({reg_type(dst)})({v})"

    def bitcast(self, v: str, src: DType, dst: DType) -> str:
        if src in (dtypes.float16, dtypes.bfloat16):
            v = f"as_type<ushort>({self.to_memory(v, src)})"
            src = dtypes.uint16
        if dst in (dtypes.float16, dtypes.bfloat16):
            return self.from_memory(f"as_type<{msl_type(dst)}>((ushort)({v}))", dst)
        if src.itemsize != dst.itemsize:
            raise ValueError(f"MSL renderer: bitcast {src.name} -> {dst.name} changes the size")
        return f"as_type<{reg_type(dst)}>({v})"

    def alu(self, op: Ops, dt: DType, srcs: tuple[UOp, ...], s: list[str]) -> str:
        sdt = srcs[0].dt
        t = reg_type(sdt)
        if op is Ops.WHERE:
            return f"({s[0]} ? {s[1]} : {s[2]})"
        if sdt == dtypes.bool:
            return self.bool_alu(op, s)
        if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            return f"({s[0]} {dict([(Ops.CMPLT, '<'), (Ops.CMPNE, '!='), (Ops.CMPEQ, '==')])[op]} {s[1]})"
        if sdt.is_float:
            return self.round_to(self.float_alu(op, s), dt)
        return self.int_alu(op, sdt, t, srcs, s)

    @staticmethod
    def bool_alu(op: Ops, s: list[str]) -> str:
        # bool arithmetic saturates like torch's: + and max are or, * is and, - is xor
        simple = {Ops.ADD: "||", Ops.OR: "||", Ops.MAX: "||", Ops.MUL: "&&", Ops.AND: "&&",
                  Ops.SUB: "!=", Ops.XOR: "!=", Ops.CMPNE: "!=", Ops.CMPEQ: "=="}
        if op in simple:
            return f"({s[0]} {simple[op]} {s[1]})"
        if op is Ops.NOT:
            return f"(!{s[0]})"
        if op is Ops.CMPLT:
            return f"(!{s[0]} && {s[1]})"
        if op is Ops.MULACC:
            return f"(({s[0]} && {s[1]}) || {s[2]})"
        raise NotImplementedError(f"MSL renderer: {op} on bool")

    @staticmethod
    def float_alu(op: Ops, s: list[str]) -> str:
        unary = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}
        if op in unary:
            return f"{unary[op]}({s[0]})"
        if op is Ops.NEG:
            return f"(-{s[0]})"
        if op is Ops.RECIP:
            return f"(1.0f / {s[0]})"
        binary = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/"}
        if op in binary:
            return f"({s[0]} {binary[op]} {s[1]})"
        if op is Ops.MULACC:
            return f"({s[0]} * {s[1]} + {s[2]})"
        if op is Ops.MAX:
            return f"rg_fmax({s[0]}, {s[1]})"
        if op is Ops.POW:
            return f"pow({s[0]}, {s[1]})"
        if op is Ops.IDIV:
            return f"trunc({s[0]} / {s[1]})"
        if op is Ops.MOD:  # C's fmod as a - b * trunc(a / b), as the PTX renderer computes it
            return f"({s[0]} - {s[1]} * trunc({s[0]} / {s[1]}))"
        raise NotImplementedError(f"MSL renderer: float {op}")

    @staticmethod
    def int_alu(op: Ops, sdt: DType, t: str, srcs: tuple[UOp, ...], s: list[str]) -> str:
        signed = not sdt.is_unsigned
        u = _UNSIGNED[t]

        def wrap(expr: str) -> str:  # through the unsigned type: signed overflow is undefined in MSL
            return f"({t})({expr})"
        if op is Ops.NEG:
            return wrap(f"({u})0 - ({u}){s[0]}")
        if op is Ops.NOT:
            return f"({t})(~{s[0]})"
        if op in (Ops.ADD, Ops.SUB, Ops.MUL):
            sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*"}[op]
            return wrap(f"({u}){s[0]} {sym} ({u}){s[1]}")
        if op is Ops.MULACC:
            return wrap(f"({u}){s[0]} * ({u}){s[1]} + ({u}){s[2]}")
        if op in (Ops.AND, Ops.OR, Ops.XOR):
            return f"({t})({s[0]} {dict([(Ops.AND, '&'), (Ops.OR, '|'), (Ops.XOR, '^')])[op]} {s[1]})"
        if op is Ops.SHL:
            return wrap(f"({u}){s[0]} << ({t}){s[1]}")
        if op is Ops.SHR:  # arithmetic for signed types, logical for unsigned ones
            return f"({t})({s[0]} >> ({t}){s[1]})"
        if op is Ops.MAX:
            return f"({s[0]} > {s[1]} ? {s[0]} : {s[1]})"
        if op is Ops.IDIV:
            return f"rg_sdiv<{t}, {u}>({s[0]}, {s[1]})" if signed else f"rg_udiv<{t}>({s[0]}, {s[1]})"
        if op is Ops.MOD:
            return f"rg_smod<{t}>({s[0]}, {s[1]})" if signed else f"rg_umod<{t}>({s[0]}, {s[1]})"
        if op is Ops.POW:
            return f"rg_ipow<{t}, {u}>({s[0]}, ({t}){s[1]}, {'true' if signed else 'false'})"
        raise NotImplementedError(f"MSL renderer: {op} on {sdt.name}")


def render_msl(prog: LinearProgram) -> str:
    """MSL source of one kernel (see the module docstring for its calling convention)."""
    for u in prog.globals:
        msl_type(u.dt)  # float64 buffers are refused with a clear error before anything is written
    return _Emitter(prog).render()


class MSLRenderer:
    """The Apple GPU renderer: one thread per output element (or a group per output), printed as MSL."""

    language = "msl"

    def __init__(self, target: Target = APPLE_GPU) -> None:
        if target.triple != APPLE_TRIPLE:
            raise ValueError(f"the MSL renderer writes Apple GPU kernels, not {target.name}")
        self.target = target

    def lower(self, ast: UOp, name: str) -> LinearProgram:
        return lower(ast, name, self.target)

    def render(self, prog: LinearProgram) -> str:
        return render_msl(prog)
