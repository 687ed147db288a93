"""Render a linear program (compiler/lower.py) as LLVM IR text.

`LLVMEmitter` is the shared part of every LLVM target: values, casts, ALU, loops, accumulators and memory
access. A target subclasses it for its ABI only: how arguments arrive, which address spaces buffers and
allocas live in, how the global range maps onto workers and how a group reduction combines (the CPU below;
AMD GPUs in renderer/amdgpu.py).

CPU calling convention (what the CPU command processor calls):
    void @name(ptr %args, i64 %start, i64 %end)
`args` holds 8-byte words: the buffer addresses by slot, then the Variable values in the program's
order; the kernel covers global indices [start, min(end, global size)): the command processor splits the
launch's linear grid (the product of its 3-D global size, compiler/target.py) into such ranges, and indices
past the kernel's own global size do nothing, as on a GPU.

Loop counters and accumulators live in allocas in the entry block; LLVM's mem2reg turns them into
SSA registers, and its loop and SLP vectorizers do the SIMD work. Accumulator updates carry the
`reassoc` flag so float reductions may be vectorized (the order of a sum is not part of its meaning).
bfloat16 values are held as float in registers and stored as the top 16 bits, rounded to nearest even.
"""
from __future__ import annotations

import math
import struct
from typing import Any

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.lower import LinearProgram, lower
from rawgrad.compiler.target import Target, host_cpu_target
from rawgrad.dtype import DType, dtypes

# inline exp2 for float32: the clamp range (2**128 is inf, 2**-150 rounds to 0) and e**(f ln 2)'s Taylor
# coefficients (ln2)**k / k!, k = 0..7
EXP2_CLAMP_HI = 128.0
EXP2_CLAMP_LO = -150.0
EXP2_TAYLOR = tuple(math.log(2) ** k / math.factorial(k) for k in range(8))
F32_EXPONENT_BIAS = 127  # IEEE 754 binary32
F32_MANTISSA_BITS = 23

# bfloat16 rounding constants (round-to-nearest-even on the float32 bit pattern)
_BF16_ROUND_BIAS = 0x7FFF
_BF16_QUIET_NAN = 0x7FC0


def reg_type(dt: DType) -> str:
    """The LLVM type of a value in registers."""
    if dt == dtypes.bfloat16:
        return "float"
    return dt.llvm


def mem_type(dt: DType) -> str:
    """The LLVM type of an element in memory."""
    if dt == dtypes.bool:
        return "i8"
    if dt == dtypes.bfloat16:
        return "i16"
    return dt.llvm


def _float_const(v: float, dt: DType) -> str:
    if dt == dtypes.float16:
        import numpy as np
        bits = int(np.array([v], dtype=np.float16).view(np.uint16)[0])
        return f"0xH{bits:04X}"
    if dt in (dtypes.float32, dtypes.bfloat16):
        import numpy as np
        v = float(np.float32(v)) if not math.isnan(v) else v
    return "0x" + struct.pack(">d", v).hex().upper()


def const_text(v: Any, dt: DType) -> str:
    if dt.is_bool:
        return "1" if v else "0"
    if dt.is_int:
        return str(int(v))
    return _float_const(float(v), dt)


_INTRINSIC_SUFFIX = {"float": "f32", "double": "f64", "half": "f16"}
_UNARY_INTRINSIC = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}


class LLVMEmitter:
    """Shared LLVM IR rendering; subclasses supply the ABI (see the module docstring)."""

    # LLVM pointer types of buffer arguments and of allocas (address spaces are a target's business)
    global_ptr = "ptr"
    private_ptr = "ptr"
    alloca_addrspace = ""  # text after `alloca T, align N`: ", addrspace(5)" on AMDGPU

    def __init__(self, prog: LinearProgram):
        self.prog = prog
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.declares: set[str] = set()
        self.counter = 0
        self.scopes: list[dict[UOp, str]] = [{}]
        self.loop_labels: dict[UOp, tuple[str, str, str, str, str]] = {}
        self.acc_slots: dict[UOp, str] = {}

    def tmp(self) -> str:
        self.counter += 1
        return f"%v{self.counter}"

    def label(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    def lookup(self, u: UOp) -> str | None:
        for scope in reversed(self.scopes):
            if u in scope:
                return scope[u]
        return None

    # ------------------------------------------------------------------ the function
    def render(self) -> str:
        self.lines.extend(self.header())
        entry_at = len(self.lines)
        self.prologue()
        for st in self.prog.statements:
            self.statement(st)
        self.epilogue()
        self.lines.append("}")
        body = self.lines[:entry_at] + ["  " + a for a in self.allocas] + self.lines[entry_at:]
        head = self.preamble() + [f"declare {d}" for d in sorted(self.declares)]
        return "\n".join(head + [""] + body + ["", *self.attributes(), ""])

    # ------------------------------------------------------------------ ABI hooks (CPU defaults)
    def preamble(self) -> list[str]:
        """Module-level lines before the declarations (globals a target needs)."""
        return []

    def header(self) -> list[str]:
        sig = "ptr noalias nocapture readonly %args, i64 %start, i64 %end"
        return [f"define void @{self.prog.name}({sig}) #0 {{", "entry:"]

    def attributes(self) -> list[str]:
        return ['attributes #0 = { nounwind "no-trapping-math"="true" }']

    def prologue(self) -> None:
        """Bind every buffer and Variable of the program to an SSA value (CPU: words of the args array)."""
        p = self.prog
        for g in p.globals:
            slot = self.tmp()
            self.emit(f"{slot} = getelementptr inbounds i64, ptr %args, i64 {g.arg}")
            word = self.tmp()
            self.emit(f"{word} = load i64, ptr {slot}, align 8")
            ptr = f"%buf{g.arg}"
            self.emit(f"{ptr} = inttoptr i64 {word} to ptr")
            self.scopes[0][g] = ptr
        for k, v in enumerate(p.variables):
            slot = self.tmp()
            self.emit(f"{slot} = getelementptr inbounds i64, ptr %args, i64 {len(p.globals) + k}")
            val = f"%var_{v.arg[0]}"
            self.emit(f"{val} = load i64, ptr {slot}, align 8")
            self.scopes[0][v] = val

    def epilogue(self) -> None:
        self.emit("ret void")

    def global_range(self, st: UOp) -> None:
        """The CPU loops over its slice [start, end) of the global range like over any other range."""
        self.loop_range(st)

    def end_global_range(self, st: UOp) -> None:
        self.end_loop_range(st)

    def group_combine(self, st: UOp) -> None:
        raise NotImplementedError(f"{type(self).__name__}: the CPU lowering has no group reductions")

    def store(self, ptr: str, mem_t: str, v: str) -> None:
        self.emit(f"store {mem_t} {v}, {self.global_ptr} {ptr}")

    def alloca(self, slot: str, t: str) -> None:
        self.allocas.append(f"{slot} = alloca {t}, align 8{self.alloca_addrspace}")

    # ------------------------------------------------------------------ statements
    def statement(self, st: UOp) -> None:
        op = st.op
        if op is Ops.RANGE:
            self.global_range(st) if st.arg[1] == "global" else self.loop_range(st)
        elif op is Ops.ENDRANGE:
            self.end_global_range(st) if st.src[0].arg[1] == "global" else self.end_loop_range(st)
        elif op is Ops.DEFINE_ACC:
            assert st.dtype is not None
            slot = f"%acc{st.arg}_{self.counter}"
            self.counter += 1
            t = reg_type(st.dtype)
            self.alloca(slot, t)
            self.emit(f"store {t} {self.value(st.src[0])}, {self.private_ptr} {slot}")
            self.acc_slots[st] = slot
        elif op is Ops.ACC_UPDATE:
            acc, val = st.src
            assert acc.dtype is not None
            v = self.value(val, reassoc=True)
            self.emit(f"store {reg_type(acc.dtype)} {v}, {self.private_ptr} {self.acc_slots[acc]}")
            self.forget_acc_loads(acc)
        elif op is Ops.GROUP_COMBINE:
            self.group_combine(st)
        elif op is Ops.STORE:
            index, val = st.src
            glob, idx = index.src
            assert glob.dtype is not None
            ptr = self.address(glob, self.value(idx))
            v = self.to_memory(self.value(val), glob.dtype)
            self.store(ptr, mem_type(glob.dtype), v)
        else:
            raise NotImplementedError(f"LLVM renderer: unexpected statement {op}")

    def forget_acc_loads(self, acc: UOp) -> None:
        """The accumulator changed: forget loads of it made in this scope."""
        scope = self.scopes[-1]
        self.scopes[-1] = {k: s for k, s in scope.items() if not (k.op is Ops.LOAD and k.src[0] is acc)}

    def loop_range(self, st: UOp) -> None:
        start = self.value(st.src[0])
        end = self.value(st.src[1])
        slot = f"%ctr{st.arg[0]}"
        self.alloca(slot, "i64")
        self.emit(f"store i64 {start}, {self.private_ptr} {slot}, align 8")
        head, body, latch, exit_ = (self.label("loop_head"), self.label("loop_body"),
                                    self.label("loop_latch"), self.label("loop_exit"))
        self.emit(f"br label %{head}")
        self.lines.append(f"{head}:")
        cur = f"%i{st.arg[0]}"
        self.emit(f"{cur} = load i64, {self.private_ptr} {slot}, align 8")
        cond = self.tmp()
        self.emit(f"{cond} = icmp slt i64 {cur}, {end}")
        self.emit(f"br i1 {cond}, label %{body}, label %{exit_}")
        self.lines.append(f"{body}:")
        self.loop_labels[st] = (slot, cur, head, latch, exit_)
        self.scopes.append({st: cur})

    def end_loop_range(self, st: UOp) -> None:
        r = st.src[0]
        slot, cur, head, latch, exit_ = self.loop_labels[r]
        self.scopes.pop()
        self.emit(f"br label %{latch}")
        self.lines.append(f"{latch}:")
        nxt = self.tmp()
        self.emit(f"{nxt} = add nsw i64 {cur}, 1")
        self.emit(f"store i64 {nxt}, {self.private_ptr} {slot}, align 8")
        # a register-tiled kernel is vectorized across its tile (SLP), not along the reduce loop,
        # whose loads are strided for one of the inputs (rows sharing loads keep the reduce SIMD)
        opts = self.prog.opts
        tiled = bool(opts.upcast) and not opts.vectorize_reduce and r.arg[1] == "reduce"
        self.emit(f"br label %{head}, !llvm.loop !{'2' if tiled else '0'}")
        self.lines.append(f"{exit_}:")

    # ------------------------------------------------------------------ memory helpers
    def address(self, glob: UOp, index: str) -> str:
        """Pointer to element `index` (an already rendered i64) of buffer `glob`."""
        assert glob.dtype is not None
        base, ptr = self.value(glob), self.tmp()
        elem = mem_type(glob.dtype)
        self.emit(f"{ptr} = getelementptr inbounds {elem}, {self.global_ptr} {base}, i64 {index}")
        return ptr

    def bf16_to_float(self, bits: str) -> str:
        """bfloat16 bits (i16) -> the float they are the top half of."""
        wide, shifted, out = self.tmp(), self.tmp(), self.tmp()
        self.emit(f"{wide} = zext i16 {bits} to i32")
        self.emit(f"{shifted} = shl i32 {wide}, 16")
        self.emit(f"{out} = bitcast i32 {shifted} to float")
        return out

    def from_memory(self, raw: str, dt: DType) -> str:
        if dt == dtypes.bool:
            out = self.tmp()
            self.emit(f"{out} = icmp ne i8 {raw}, 0")
            return out
        if dt == dtypes.bfloat16:
            return self.bf16_to_float(raw)
        return raw

    def to_memory(self, v: str, dt: DType) -> str:
        if dt == dtypes.bool:
            out = self.tmp()
            self.emit(f"{out} = zext i1 {v} to i8")
            return out
        if dt == dtypes.bfloat16:
            return self.bf16_bits(v)
        return v

    def bf16_bits(self, v: str) -> str:
        """float -> bfloat16 bits (i16), round to nearest even; NaN -> quiet NaN."""
        bits, hi, lsb, bias, summed, top, isnan, sel, out = (self.tmp() for _ in range(9))
        self.emit(f"{bits} = bitcast float {v} to i32")
        self.emit(f"{hi} = lshr i32 {bits}, 16")
        self.emit(f"{lsb} = and i32 {hi}, 1")
        self.emit(f"{bias} = add i32 {lsb}, {_BF16_ROUND_BIAS}")
        self.emit(f"{summed} = add i32 {bits}, {bias}")
        self.emit(f"{top} = lshr i32 {summed}, 16")
        self.emit(f"{isnan} = fcmp uno float {v}, 0.0")
        self.emit(f"{sel} = select i1 {isnan}, i32 {_BF16_QUIET_NAN}, i32 {top}")
        self.emit(f"{out} = trunc i32 {sel} to i16")
        return out

    def bf16_round(self, v: str) -> str:
        return self.bf16_to_float(self.bf16_bits(v))

    # ------------------------------------------------------------------ expressions
    def value(self, u: UOp, reassoc: bool = False) -> str:
        hit = self.lookup(u)
        if hit is not None:
            return hit
        out = self._value(u, reassoc)
        self.scopes[-1][u] = out
        return out

    def intrinsic(self, name: str, t: str, *args: str) -> str:
        suffix = _INTRINSIC_SUFFIX[t]
        fn = f"@llvm.{name}.{suffix}"
        self.declares.add(f"{t} {fn}({', '.join([t] * len(args))})")
        out = self.tmp()
        self.emit(f"{out} = call {t} {fn}({', '.join(f'{t} {a}' for a in args)})")
        return out

    def _value(self, u: UOp, reassoc: bool) -> str:
        op, dt = u.op, u.dtype
        if op is Ops.CONST:
            assert dt is not None
            return const_text(u.arg, dt)
        if op is Ops.SPECIAL:
            if u.arg[0] == "start":
                return "%start"
            # a launch wider than the kernel's global size runs nothing past it (the launch contract)
            size = self.prog.global_size
            limit = self.value(size) if isinstance(size, UOp) else str(int(size))
            short, out = self.tmp(), self.tmp()
            self.emit(f"{short} = icmp slt i64 %end, {limit}")
            self.emit(f"{out} = select i1 {short}, i64 %end, i64 {limit}")
            return out
        if op is Ops.LOAD:
            assert dt is not None
            if u.src[0].op is Ops.DEFINE_ACC:
                out = self.tmp()
                self.emit(f"{out} = load {reg_type(dt)}, {self.private_ptr} {self.acc_slots[u.src[0]]}")
                return out
            index = u.src[0]
            glob, idx = index.src
            if len(u.src) == 2:
                valid = self.value(u.src[1])
                safe = self.tmp()
                self.emit(f"{safe} = select i1 {valid}, i64 {self.value(idx)}, i64 0")
                ptr = self.address(glob, safe)
                raw = self.tmp()
                self.emit(f"{raw} = load {mem_type(dt)}, {self.global_ptr} {ptr}")
                loaded = self.from_memory(raw, dt)
                out = self.tmp()
                self.emit(f"{out} = select i1 {valid}, {reg_type(dt)} {loaded}, {reg_type(dt)} "
                          f"{const_text(0, dt)}")
                return out
            ptr = self.address(glob, self.value(idx))
            raw = self.tmp()
            self.emit(f"{raw} = load {mem_type(dt)}, {self.global_ptr} {ptr}")
            return self.from_memory(raw, dt)
        if op is Ops.CAST:
            return self.cast(self.value(u.src[0]), u.src[0].dtype, dt)  # type: ignore[arg-type]
        if op is Ops.BITCAST:
            return self.bitcast(self.value(u.src[0]), u.src[0].dtype, dt)  # type: ignore[arg-type]
        srcs = [self.value(s) for s in u.src]
        assert dt is not None
        return self.alu(op, dt, u.src, srcs, reassoc)

    def cast(self, v: str, src: DType, dst: DType) -> str:
        if src == dst:
            return v
        out = self.tmp()
        st, dt_ = reg_type(src), reg_type(dst)
        if dst == dtypes.bool:
            if src.is_float:
                self.emit(f"{out} = fcmp une {st} {v}, {const_text(0, src)}")
            else:
                self.emit(f"{out} = icmp ne {st} {v}, 0")
            return out
        if dst == dtypes.bfloat16:
            as_float = self.cast(v, src, dtypes.float32) if src != dtypes.bfloat16 else v
            return self.bf16_round(as_float)
        if src == dtypes.bfloat16:
            return self.cast(v, dtypes.float32, dst) if dst != dtypes.float32 else v
        if src.is_float and dst.is_float:
            instr = "fpext" if dst.itemsize > src.itemsize else "fptrunc"
        elif src.is_float:
            instr = "fptoui" if dst.is_unsigned else "fptosi"
        elif dst.is_float:
            instr = "uitofp" if (src.is_unsigned or src.is_bool) else "sitofp"
        else:
            sb, db = (1 if src.is_bool else src.itemsize * 8), dst.itemsize * 8
            if sb == db:
                return v
            instr = "trunc" if db < sb else ("zext" if (src.is_unsigned or src.is_bool) else "sext")
        self.emit(f"{out} = {instr} {st} {v} to {dt_}")
        return out

    def bitcast(self, v: str, src: DType, dst: DType) -> str:
        if src == dtypes.bfloat16:
            v, src = self.bf16_bits(v), dtypes.int16
        if dst == dtypes.bfloat16:
            return self.bf16_to_float(self.bitcast(v, src, dtypes.int16) if src != dtypes.int16 else v)
        if reg_type(src) == reg_type(dst):
            return v
        out = self.tmp()
        self.emit(f"{out} = bitcast {reg_type(src)} {v} to {reg_type(dst)}")
        return out

    def alu(self, op: Ops, dt: DType, src_uops: tuple[UOp, ...], s: list[str], reassoc: bool) -> str:
        sdt = src_uops[0].dtype
        assert sdt is not None
        t = reg_type(sdt)
        is_f = sdt.is_float
        flags = "reassoc contract " if reassoc else "contract "
        out = self.tmp()
        if op is Ops.WHERE:
            t2 = reg_type(dt)
            self.emit(f"{out} = select i1 {s[0]}, {t2} {s[1]}, {t2} {s[2]}")
            return out
        if op is Ops.MULACC:
            m = self.tmp()
            self.emit(f"{m} = fmul {flags}{t} {s[0]}, {s[1]}" if is_f else f"{m} = mul {t} {s[0]}, {s[1]}")
            self.emit(f"{out} = fadd {flags}{t} {m}, {s[2]}" if is_f else f"{out} = add {t} {m}, {s[2]}")
            return self._round(out, dt)
        if op is Ops.NEG:
            self.emit(f"{out} = fneg {t} {s[0]}" if is_f else f"{out} = sub {t} 0, {s[0]}")
            return self._round(out, dt)
        if op is Ops.NOT:
            self.emit(f"{out} = xor {t} {s[0]}, {'1' if sdt.is_bool else '-1'}")
            return out
        if op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.TRUNC):
            return self._round(self.float_unary(op, t, s[0]), dt)
        if op is Ops.RECIP:
            self.emit(f"{out} = fdiv {flags}{t} {const_text(1.0, sdt)}, {s[0]}")
            return self._round(out, dt)
        if op is Ops.POW:
            if not is_f:
                return self.int_pow(sdt, s[0], s[1])
            return self._round(self.float_pow(t, s[0], s[1]), dt)
        if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            if is_f:
                pred = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}[op]
                self.emit(f"{out} = fcmp {pred} {t} {s[0]}, {s[1]}")
            else:
                unsigned = sdt.is_unsigned or sdt.is_bool
                pred = {Ops.CMPLT: "ult" if unsigned else "slt", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}[op]
                self.emit(f"{out} = icmp {pred} {t} {s[0]}, {s[1]}")
            return out
        if op is Ops.MAX:
            if is_f:
                return self._round(self.intrinsic("maximum", t, s[0], s[1]), dt)
            cmp = self.tmp()
            pred = "ugt" if (sdt.is_unsigned or sdt.is_bool) else "sgt"
            self.emit(f"{cmp} = icmp {pred} {t} {s[0]}, {s[1]}")
            self.emit(f"{out} = select i1 {cmp}, {t} {s[0]}, {t} {s[1]}")
            return out
        if op in (Ops.IDIV, Ops.MOD):
            return self.int_div(op, sdt, t, src_uops[1], s[0], s[1])
        if is_f:
            instr = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}.get(op)
            if instr is None:
                raise NotImplementedError(f"LLVM renderer: {op} on {sdt}")
            self.emit(f"{out} = {instr} {flags}{t} {s[0]}, {s[1]}")
            return self._round(out, dt)
        if sdt.is_bool and op in (Ops.ADD, Ops.MUL, Ops.SUB):
            # bool arithmetic saturates like torch's: + is or, * is and, - is xor
            op = {Ops.ADD: Ops.OR, Ops.MUL: Ops.AND, Ops.SUB: Ops.XOR}[op]
        instr = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor",
                 Ops.SHL: "shl", Ops.SHR: "lshr" if sdt.is_unsigned else "ashr"}.get(op)
        if instr is None:
            raise NotImplementedError(f"LLVM renderer: {op} on {sdt}")
        b = s[1]
        if op in (Ops.SHL, Ops.SHR) and src_uops[1].dtype != sdt:
            b = self.cast(b, src_uops[1].dtype, sdt)  # type: ignore[arg-type]
        self.emit(f"{out} = {instr} {t} {s[0]}, {b}")
        return out

    def float_unary(self, op: Ops, t: str, x: str) -> str:
        """EXP2/LOG2/SIN/SQRT/TRUNC of a float in register type `t` (a target may replace intrinsics its
        backend cannot lower)."""
        if op is Ops.EXP2 and t == "float":
            return self.exp2_f32(x)
        return self.intrinsic(_UNARY_INTRINSIC[op], t, x)

    def float_pow(self, t: str, x: str, y: str) -> str:
        return self.intrinsic("pow", t, x, y)

    def exp2_f32(self, x: str) -> str:
        """2**x for float32 without a libm call, so loops over it vectorize.

        x = n + f with n = rint(x), |f| <= 0.5; 2**f is the degree-7 Taylor series of e**(f ln 2)
        (truncation error < 6e-9 relative, below float32's 6e-8 epsilon); 2**n is built from exponent
        bits in two halves so that n in [-150, 128] never overflows the exponent field.
        """
        def emit(rhs: str) -> str:
            out = self.tmp()
            self.emit(f"{out} = {rhs}")
            return out
        hi = emit(f"fcmp olt float {x}, {_float_const(EXP2_CLAMP_HI, dtypes.float32)}")
        x1 = emit(f"select i1 {hi}, float {x}, float {_float_const(EXP2_CLAMP_HI, dtypes.float32)}")
        lo = emit(f"fcmp ogt float {x1}, {_float_const(EXP2_CLAMP_LO, dtypes.float32)}")
        xc = emit(f"select i1 {lo}, float {x1}, float {_float_const(EXP2_CLAMP_LO, dtypes.float32)}")
        n = self.intrinsic("rint", "float", xc)
        f = emit(f"fsub float {xc}, {n}")
        acc = _float_const(EXP2_TAYLOR[-1], dtypes.float32)
        for c in reversed(EXP2_TAYLOR[:-1]):
            m = emit(f"fmul contract float {acc}, {f}")
            acc = emit(f"fadd contract float {m}, {_float_const(c, dtypes.float32)}")
        ni = emit(f"fptosi float {n} to i32")
        n1 = emit(f"ashr i32 {ni}, 1")
        n2 = emit(f"sub i32 {ni}, {n1}")
        scaled = acc
        for part in (n1, n2):
            biased = emit(f"add i32 {part}, {F32_EXPONENT_BIAS}")
            bits = emit(f"shl i32 {biased}, {F32_MANTISSA_BITS}")
            scale = emit(f"bitcast i32 {bits} to float")
            scaled = emit(f"fmul float {scaled}, {scale}")
        isnan = emit(f"fcmp uno float {x}, 0.0")
        return emit(f"select i1 {isnan}, float {x}, float {scaled}")

    def int_pow(self, dt: DType, a: str, b: str) -> str:
        """Integer power by squaring in the integer type itself, so it wraps like the reference
        (a trip through double rounded 2**-1 to 1, turned 0**-1 into INT_MIN and lost bits past 2**53).
        Unrolled over the exponent's bits (straight-line code, so the loop around it still vectorizes);
        a negative exponent gives 1/a**n truncated toward zero: 1 for a == 1, +-1 for a == -1, else 0."""
        t = reg_type(dt)
        bits = dt.itemsize * 8 - (0 if dt.is_unsigned else 1)  # a signed exponent's sign bit: below
        result, base = "1", a
        for i in range(bits):
            shifted, bit, is_set, product, chosen = self.tmp(), self.tmp(), self.tmp(), self.tmp(), self.tmp()
            self.emit(f"{shifted} = lshr {t} {b}, {i}")
            self.emit(f"{bit} = and {t} {shifted}, 1")
            self.emit(f"{is_set} = icmp ne {t} {bit}, 0")
            self.emit(f"{product} = mul {t} {result}, {base}")
            self.emit(f"{chosen} = select i1 {is_set}, {t} {product}, {t} {result}")
            result = chosen
            if i + 1 < bits:
                squared = self.tmp()
                self.emit(f"{squared} = mul {t} {base}, {base}")
                base = squared
        if dt.is_unsigned:
            return result
        negative, odd_bit, odd, sign, a_is_m1, a_is_1, small, inverse, out = (self.tmp() for _ in range(9))
        self.emit(f"{negative} = icmp slt {t} {b}, 0")
        self.emit(f"{odd_bit} = and {t} {b}, 1")
        self.emit(f"{odd} = icmp ne {t} {odd_bit}, 0")
        self.emit(f"{sign} = select i1 {odd}, {t} -1, {t} 1")
        self.emit(f"{a_is_m1} = icmp eq {t} {a}, -1")
        self.emit(f"{a_is_1} = icmp eq {t} {a}, 1")
        self.emit(f"{small} = select i1 {a_is_m1}, {t} {sign}, {t} 0")
        self.emit(f"{inverse} = select i1 {a_is_1}, {t} 1, {t} {small}")
        self.emit(f"{out} = select i1 {negative}, {t} {inverse}, {t} {result}")
        return out

    def _round(self, v: str, dt: DType) -> str:
        """bfloat16 arithmetic is done in float and rounded after every op, like the hardware type."""
        return self.bf16_round(v) if dt == dtypes.bfloat16 else v

    def int_div(self, op: Ops, sdt: DType, t: str, divisor: UOp, a: str, b: str) -> str:
        unsigned = sdt.is_unsigned or sdt.is_bool
        instr = ("udiv" if unsigned else "sdiv") if op is Ops.IDIV else ("urem" if unsigned else "srem")
        out = self.tmp()
        safe_const = divisor.op is Ops.CONST and divisor.arg != 0 and (unsigned or divisor.arg != -1)
        if safe_const:
            self.emit(f"{out} = {instr} {t} {a}, {b}")
            return out
        # division by zero (and INT_MIN / -1) trap on x86: divide by 1 instead and give 0 for x/0
        is_zero, bad, safe_b, q = self.tmp(), self.tmp(), self.tmp(), self.tmp()
        self.emit(f"{is_zero} = icmp eq {t} {b}, 0")
        if unsigned:
            self.emit(f"{bad} = or i1 {is_zero}, false")
        else:
            is_m1 = self.tmp()
            self.emit(f"{is_m1} = icmp eq {t} {b}, -1")
            self.emit(f"{bad} = or i1 {is_zero}, {is_m1}")
        self.emit(f"{safe_b} = select i1 {bad}, {t} 1, {t} {b}")
        self.emit(f"{q} = {instr} {t} {a}, {safe_b}")
        if unsigned:
            self.emit(f"{out} = select i1 {is_zero}, {t} 0, {t} {q}")
            return out
        # b == -1: a / -1 = -a and a % -1 = 0 (wrapping, no trap)
        neg, fix = self.tmp(), self.tmp()
        self.emit(f"{neg} = sub {t} 0, {a}")
        minus_one_result = neg if op is Ops.IDIV else "0"
        self.emit(f"{fix} = select i1 {is_zero}, {t} 0, {t} {minus_one_result}")
        self.emit(f"{out} = select i1 {bad}, {t} {fix}, {t} {q}")
        return out


# The loop metadata every loop latch names: !0 plain (must progress), !2 also "do not vectorize this loop".
LOOP_METADATA = ('!0 = distinct !{!0, !1}\n!1 = !{!"llvm.loop.mustprogress"}\n'
                 '!2 = distinct !{!2, !1, !3}\n!3 = !{!"llvm.loop.vectorize.enable", i1 false}\n')


def render_llvm(prog: LinearProgram) -> str:
    """LLVM IR text for one kernel, with the loop metadata the vectorizer reads."""
    return LLVMEmitter(prog).render() + LOOP_METADATA


class LLVMRenderer:
    """The CPU's renderer: loops tiled for the target's SIMD width (default: this host), as LLVM IR."""

    language = "llvm"

    def __init__(self, target: Target | None = None) -> None:
        self.target = target if target is not None else host_cpu_target()
        if self.target.is_gpu:
            raise ValueError(f"the LLVM CPU renderer compiles for a CPU target, not {self.target.name}")

    def lower(self, ast: UOp, name: str) -> LinearProgram:
        return lower(ast, name, self.target)

    def render(self, prog: LinearProgram) -> str:
        return render_llvm(prog)
