"""Render a linear program (compiler/lower.py, GPU flavor) as LLVM IR for AMD GPUs (`amdgcn-amd-amdhsa`).

Everything but the ABI comes from the shared LLVM renderer (renderer/llvm.py `LLVMEmitter`): values, casts,
ALU, loops and accumulators are the same code as on the CPU. What differs:

- Calling convention: `define amdgpu_kernel void @name(ptr addrspace(1) %buf0, ..., i64 %var_..., ...)`.
  Buffers are global (`addrspace(1)`) pointers, so loads and stores become `global_*` instructions rather
  than flat ones with aperture checks. Every Variable is an explicit `i64` argument: the kernarg segment is
  then an array of 8-byte words (buffer addresses by slot, then scalars), the same layout as the CPU's
  argument words and the PTX parameters, and every patch point of a captured graph is word aligned. No
  hidden arguments appear because the kernel never asks for the dispatch or implicit-argument pointers.
- Thread mapping (compiler/target.py index convention): `gidx = workgroup.id.x * L + workitem.id.x`, where
  L is the launch's local size, a constant in the code and in `"amdgpu-flat-work-group-size"="1,L"` (which
  sets the code object's `.max_flat_workgroup_size`; the driver must not launch larger blocks). Threads with
  `gidx >= global_size` branch to the exit.
- Accumulators and loop counters are allocas in `addrspace(5)` (private), which the AMDGPU backend requires;
  LLVM promotes them to registers.
- Group reductions: a group of one wave (the target's `simd_width`: 32 on gfx1100, 64 on gfx942) combines
  its lanes' accumulators by a butterfly of `llvm.amdgcn.ds.bpermute` (a cross-lane read through the LDS
  crossbar that needs no LDS allocation and no barrier). A group of a whole block then meets in an LDS
  (`addrspace(3)`) array of one 8-byte slot per wave between two workgroup barriers, and every lane
  combines the slots in the same order, so all lanes hold the same bits. Lane 0 of the group stores.
- Transcendentals: the AMDGPU backend has no float64 `exp2`/`log2`/`sin`/`pow` (LLVM aborts the whole
  process: "no libcall available for fexp2", "Cannot select: fpow f64"), so float64 EXP2, LOG2, SIN and POW
  are straight-line double routines built here from IEEE-exact operations (the PTX renderer's method and
  constants). float32 SIN goes through the double routine and is rounded once (the hardware `v_sin_f32`
  works on x / 2 pi and loses large arguments), as does POW of every float type (the backend's float32
  `pow` is `exp(log x * y)`: NaN for any negative x). float32 and float16 EXP2/LOG2 stay the backend's
  native `v_exp`/`v_log` sequences.
"""
from __future__ import annotations

import math

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
from rawgrad.compiler.renderer.llvm import LOOP_METADATA, LLVMEmitter, const_text, reg_type
from rawgrad.compiler.target import AMD_GFX942, AMD_GFX1100, AMD_TRIPLE, Target
from rawgrad.dtype import dtypes

__all__ = ["AMDGPURenderer", "amd_target", "kernarg_bytes", "render_amdgpu"]

# LLVM AMDGPUUsage, "Address Spaces": global 1, local (LDS) 3, private (scratch) 5.
ADDRSPACE_GLOBAL = 1
ADDRSPACE_LOCAL = 3
ADDRSPACE_PRIVATE = 5
# Every kernel argument is an 8-byte word (a buffer address or an i64 scalar), 8-byte aligned.
KERNARG_WORD_BYTES = 8
# ds_bpermute addresses lanes in bytes: lane k is address 4 * k (RDNA3 and CDNA3 ISA guides, DS_BPERMUTE_B32).
BPERMUTE_LANE_SHIFT = 2
BPERMUTE_WORD_BITS = 32  # it moves one 32-bit value per lane
I32_LIMIT = 2 ** 31  # a global index below this fits a signed 32-bit register

AMD_TARGETS = {t.isa: t for t in (AMD_GFX1100, AMD_GFX942)}


def amd_target(isa: str) -> Target:
    """The compiler.target descriptor of an AMD GPU by its gfx name ("gfx1100", "gfx942")."""
    try:
        return AMD_TARGETS[isa]
    except KeyError:
        known = ", ".join(sorted(AMD_TARGETS))
        raise ValueError(f"unknown AMD target {isa!r} (supported: {known})") from None


def kernarg_bytes(prog: LinearProgram) -> int:
    """Size of the kernel's explicit argument segment: one word per buffer and per Variable."""
    return KERNARG_WORD_BYTES * (len(prog.globals) + len(prog.variables))


class AMDGPUEmitter(LLVMEmitter):
    """LLVMEmitter with the amdgpu_kernel ABI (see the module docstring)."""

    global_ptr = f"ptr addrspace({ADDRSPACE_GLOBAL})"
    private_ptr = f"ptr addrspace({ADDRSPACE_PRIVATE})"
    alloca_addrspace = f", addrspace({ADDRSPACE_PRIVATE})"

    def __init__(self, prog: LinearProgram) -> None:
        super().__init__(prog)
        target = prog.target
        if target.triple != AMD_TRIPLE:
            raise ValueError(f"AMDGPU renderer: {prog.name} was lowered for {target.name}, not an AMD GPU")
        self.wave = target.simd_width
        self.local = prog.launch.local_size[0]
        if prog.launch.local_size[1:] != (1, 1) or tuple(prog.launch.global_size[1:]) != (1, 1):
            # a 3-D grid would need the grid's extents (the dispatch packet, a hidden argument); the lowerer
            # writes (n, 1, 1) launches, so the kernel indexes x only
            raise ValueError(f"AMDGPU renderer: {prog.name} has a {prog.launch.global_size} launch of "
                             f"{prog.launch.local_size} blocks; kernels are 1-D")
        group = prog.group_size
        if group > 1 and group not in (self.wave, target.block_threads):
            raise ValueError(f"AMDGPU renderer: {prog.name} has a group of {group} threads; the renderer "
                             f"combines groups of one wave ({self.wave}) or one block "
                             f"({target.block_threads})")
        if group > self.wave and self.local != group:
            raise ValueError(f"AMDGPU renderer: block group of {group} threads needs a block of exactly that "
                             f"size, the launch has {self.local}")
        self.group_slots = group // self.wave if group > self.wave else 0
        if self.group_slots * GROUP_SLOT_BYTES != prog.launch.shared_bytes:
            raise ValueError(f"AMDGPU renderer: the launch declares {prog.launch.shared_bytes} shared bytes, "
                             f"the group combine needs {self.group_slots * GROUP_SLOT_BYTES}")
        # proven vector groups (compiler/lower.py): each group's lanes become one <N x T> load or store
        self.group_of: dict[UOp, tuple[UOp, ...]] = {u: g for g in prog.vector_groups for u in g}
        self.vectors: dict[tuple[UOp, ...], str] = {}
        self.done_label = "done"
        self.tid = ""  # workitem id in the block (i32), set by the global range
        self.store_gate: str | None = None

    # ------------------------------------------------------------------ ABI
    def preamble(self) -> list[str]:
        if not self.group_slots:
            return []
        words = self.prog.launch.shared_bytes // GROUP_SLOT_BYTES
        return [f"{self.group_buffer} = internal addrspace({ADDRSPACE_LOCAL}) global [{words} x i64] "
                f"undef, align {GROUP_SLOT_BYTES}"]

    @property
    def group_buffer(self) -> str:
        return f"@{self.prog.name}_group"

    def header(self) -> list[str]:
        p = self.prog
        if [g.arg for g in p.globals] != list(range(len(p.globals))):
            raise ValueError(f"{p.name}: buffer slots must be 0..n-1, got {[g.arg for g in p.globals]}")
        args = [f"{self.global_ptr} %buf{g.arg}" for g in p.globals]
        args += [f"i64 %var_{v.arg[0]}" for v in p.variables]
        return [f"define amdgpu_kernel void @{p.name}({', '.join(args)}) #0 {{", "entry:"]

    def prologue(self) -> None:
        for g in self.prog.globals:
            self.scopes[0][g] = f"%buf{g.arg}"
        for v in self.prog.variables:
            self.scopes[0][v] = f"%var_{v.arg[0]}"

    def attributes(self) -> list[str]:
        return [f'attributes #0 = {{ nounwind "no-trapping-math"="true" '
                f'"amdgpu-flat-work-group-size"="1,{self.local}" }}']

    def epilogue(self) -> None:
        self.emit("ret void")

    def call(self, ret: str, name: str, args: str = "", params: str = "", attrs: str = "") -> str:
        """Call an intrinsic (declared on first use); returns the result register ('' for void)."""
        self.declares.add(f"{ret} @{name}({params}){attrs}")
        if ret == "void":
            self.emit(f"call void @{name}({args})")
            return ""
        out = self.tmp()
        self.emit(f"{out} = call {ret} @{name}({args})")
        return out

    def global_range(self, st: UOp) -> None:
        """gidx = workgroup.id.x * L + workitem.id.x; threads at or past the global size go to the exit.

        With a static global size below 2**31 - L the launch has fewer than 2**31 threads (the driver rounds
        the size up to whole blocks), so the index and its guard are 32-bit (one VALU compare instead of a
        64-bit pair); the index is then widened for the 64-bit address arithmetic."""
        wg = self.call("i32", "llvm.amdgcn.workgroup.id.x")
        self.tid = self.call("i32", "llvm.amdgcn.workitem.id.x")
        size = self.prog.global_size
        gidx, live = self.tmp(), self.tmp()
        if isinstance(size, int) and size + self.local < I32_LIMIT:
            base, idx32 = self.tmp(), self.tmp()
            self.emit(f"{base} = mul nuw nsw i32 {wg}, {self.local}")
            self.emit(f"{idx32} = add nuw nsw i32 {base}, {self.tid}")
            self.emit(f"{live} = icmp ult i32 {idx32}, {size}")
            self.emit(f"{gidx} = zext i32 {idx32} to i64")
        else:
            wg64, tid64, base = self.tmp(), self.tmp(), self.tmp()
            self.emit(f"{wg64} = zext i32 {wg} to i64")
            self.emit(f"{tid64} = zext i32 {self.tid} to i64")
            self.emit(f"{base} = mul nuw nsw i64 {wg64}, {self.local}")
            self.emit(f"{gidx} = add nuw nsw i64 {base}, {tid64}")
            limit = self.value(size) if isinstance(size, UOp) else str(int(size))
            self.emit(f"{live} = icmp slt i64 {gidx}, {limit}")
        body = self.label("body")
        self.emit(f"br i1 {live}, label %{body}, label %{self.done_label}")
        self.lines.append(f"{body}:")
        self.scopes[0][st] = gidx
        group = self.prog.group_size
        if group > 1:
            # groups are whole waves or the whole block and the global size is a multiple of the group, so
            # the guard above keeps or drops whole groups: every lane of a live group reaches the combine.
            lane = self.tmp()
            self.emit(f"{lane} = and i32 {self.tid}, {group - 1}")
            self.store_gate = self.tmp()
            self.emit(f"{self.store_gate} = icmp eq i32 {lane}, 0")

    def end_global_range(self, st: UOp) -> None:
        self.emit(f"br label %{self.done_label}")
        self.lines.append(f"{self.done_label}:")

    def store(self, ptr: str, mem_t: str, v: str) -> None:
        if self.store_gate is None:
            super().store(ptr, mem_t, v)
            return
        do, skip = self.label("store"), self.label("stored")
        self.emit(f"br i1 {self.store_gate}, label %{do}, label %{skip}")
        self.lines.append(f"{do}:")
        super().store(ptr, mem_t, v)
        self.emit(f"br label %{skip}")
        self.lines.append(f"{skip}:")

    # ------------------------------------------------------------------ vector access
    # A proven group's first lane starts at a multiple of the group's size in elements of a buffer that is at
    # least 256-byte aligned, so one <N x T> access with `align N*size` is exact: one global_load/store_b128
    # for four 32-bit lanes. (Without it LLVM keeps the lanes scalar: the buffers may alias, so it cannot
    # move lane 1's load above lane 0's store.) Lanes load together before any lane stores, as the PTX
    # renderer's v4 accesses do; rawgrad only aliases an output with an input at the same index.
    def statement(self, st: UOp) -> None:
        group = self.group_of.get(st)
        if st.op is not Ops.STORE or group is None:
            super().statement(st)
        elif st is group[0]:  # the first lane stores the whole vector; the others are in it
            glob = st.src[0].src[0]
            assert glob.dtype is not None
            t = reg_type(glob.dtype)
            vec = "undef"
            for k, lane in enumerate(group):
                value = self.value(lane.src[1])
                nxt = self.tmp()
                self.emit(f"{nxt} = insertelement <{len(group)} x {t}> {vec}, {t} {value}, i32 {k}")
                vec = nxt
            ptr = self.address(glob, self.value(st.src[0].src[1]))
            self.emit(f"store <{len(group)} x {t}> {vec}, {self.global_ptr} {ptr}, "
                      f"align {len(group) * glob.dtype.itemsize}")

    def _value(self, u: UOp, reassoc: bool) -> str:
        group = self.group_of.get(u)
        if u.op is not Ops.LOAD or group is None:
            return super()._value(u, reassoc)
        glob = group[0].src[0].src[0]
        assert glob.dtype is not None
        t = reg_type(glob.dtype)
        vec = self.vectors.get(group)
        if vec is None:
            ptr = self.address(glob, self.value(group[0].src[0].src[1]))
            vec = self.tmp()
            self.emit(f"{vec} = load <{len(group)} x {t}>, {self.global_ptr} {ptr}, "
                      f"align {len(group) * glob.dtype.itemsize}")
            self.vectors[group] = vec
        out = self.tmp()
        self.emit(f"{out} = extractelement <{len(group)} x {t}> {vec}, i32 {group.index(u)}")
        return out

    # ------------------------------------------------------------------ group reductions
    def group_combine(self, st: UOp) -> None:
        """Butterfly across the wave, then (block groups) the waves' results through LDS (module doc)."""
        acc = st.src[0]
        rop, group = st.arg
        dt = acc.dtype
        assert dt is not None
        t = reg_type(dt)
        slot = self.acc_slots[acc]
        v = self.tmp()
        self.emit(f"{v} = load {t}, {self.private_ptr} {slot}")
        in_wave = min(group, self.wave)
        lane = self.tmp()
        self.emit(f"{lane} = and i32 {self.tid}, {self.wave - 1}")
        mask = in_wave // 2
        while mask >= 1:
            other = self.shuffle_xor(v, t, lane, mask)
            v = self.alu(rop, dt, (acc, acc), [v, other], False)
            mask //= 2
        if group > self.wave:
            v = self.combine_waves(v, t, rop, acc)
        self.emit(f"store {t} {v}, {self.private_ptr} {slot}")
        self.forget_acc_loads(acc)

    def combine_waves(self, v: str, t: str, rop: Ops, acc: UOp) -> str:
        """Lane 0 of each wave puts its wave's result in the wave's LDS slot; after a barrier every lane
        combines the slots in order; a second barrier keeps the slots until all have read them."""
        lds = f"ptr addrspace({ADDRSPACE_LOCAL})"
        wave_idx, wave_idx64, slot, in_wave, first = (self.tmp() for _ in range(5))
        self.emit(f"{wave_idx} = lshr i32 {self.tid}, {self.wave.bit_length() - 1}")
        self.emit(f"{wave_idx64} = zext i32 {wave_idx} to i64")
        self.emit(f"{slot} = getelementptr inbounds i64, {lds} {self.group_buffer}, i64 {wave_idx64}")
        self.emit(f"{in_wave} = and i32 {self.tid}, {self.wave - 1}")
        self.emit(f"{first} = icmp eq i32 {in_wave}, 0")
        put, after = self.label("lds_put"), self.label("lds_done")
        self.emit(f"br i1 {first}, label %{put}, label %{after}")
        self.lines.append(f"{put}:")
        self.emit(f"store {t} {v}, {lds} {slot}, align {GROUP_SLOT_BYTES}")
        self.emit(f"br label %{after}")
        self.lines.append(f"{after}:")
        self.barrier()
        out = ""
        for k in range(self.group_slots):
            ptr, val = self.tmp(), self.tmp()
            self.emit(f"{ptr} = getelementptr inbounds i64, {lds} {self.group_buffer}, i64 {k}")
            self.emit(f"{val} = load {t}, {lds} {ptr}, align {GROUP_SLOT_BYTES}")
            out = val if k == 0 else self.alu(rop, acc.dtype, (acc, acc), [out, val], False)  # type: ignore
        self.barrier()
        return out

    def barrier(self) -> None:
        """A workgroup barrier that also orders LDS accesses (release before, acquire after)."""
        self.emit('fence syncscope("workgroup") release')
        self.call("void", "llvm.amdgcn.s.barrier", attrs=" convergent nounwind")
        self.emit('fence syncscope("workgroup") acquire')

    def shuffle_xor(self, v: str, t: str, lane: str, mask: int) -> str:
        """The value `v` of lane (lane ^ mask) of this wave, moved as 32-bit words by ds_bpermute."""
        src, addr = self.tmp(), self.tmp()
        self.emit(f"{src} = xor i32 {lane}, {mask}")
        self.emit(f"{addr} = shl i32 {src}, {BPERMUTE_LANE_SHIFT}")
        words = [self.call("i32", "llvm.amdgcn.ds.bpermute", f"i32 {addr}, i32 {w}", "i32, i32",
                           " convergent nounwind readnone") for w in self.to_words(v, t)]
        return self.from_words(words, t)

    def to_words(self, v: str, t: str) -> list[str]:
        bits = _type_bits(t)
        ints = self.tmp()
        if t == f"i{bits}":
            self.emit(f"{ints} = or i{bits} {v}, 0")  # already an integer: a copy keeps the code uniform
        else:
            self.emit(f"{ints} = bitcast {t} {v} to i{bits}")
        if bits < BPERMUTE_WORD_BITS:
            wide = self.tmp()
            self.emit(f"{wide} = zext i{bits} {ints} to i32")
            return [wide]
        if bits == BPERMUTE_WORD_BITS:
            return [ints]
        lo, hi_wide, hi = self.tmp(), self.tmp(), self.tmp()
        self.emit(f"{lo} = trunc i64 {ints} to i32")
        self.emit(f"{hi_wide} = lshr i64 {ints}, 32")
        self.emit(f"{hi} = trunc i64 {hi_wide} to i32")
        return [lo, hi]

    def from_words(self, words: list[str], t: str) -> str:
        bits = _type_bits(t)
        if bits < BPERMUTE_WORD_BITS:
            ints = self.tmp()
            self.emit(f"{ints} = trunc i32 {words[0]} to i{bits}")
        elif bits == BPERMUTE_WORD_BITS:
            ints = words[0]
        else:
            lo, hi, hi_up, ints = self.tmp(), self.tmp(), self.tmp(), self.tmp()
            self.emit(f"{lo} = zext i32 {words[0]} to i64")
            self.emit(f"{hi} = zext i32 {words[1]} to i64")
            self.emit(f"{hi_up} = shl i64 {hi}, 32")
            self.emit(f"{ints} = or i64 {lo}, {hi_up}")
        if t == f"i{bits}":
            return ints
        out = self.tmp()
        self.emit(f"{out} = bitcast i{bits} {ints} to {t}")
        return out

    # ------------------------------------------------------------------ transcendentals
    def float_unary(self, op: Ops, t: str, x: str) -> str:
        if op in (Ops.SQRT, Ops.TRUNC) or (op in (Ops.EXP2, Ops.LOG2) and t in ("float", "half")):
            return self.intrinsic({Ops.SQRT: "sqrt", Ops.TRUNC: "trunc", Ops.EXP2: "exp2",
                                   Ops.LOG2: "log2"}[op], t, x)
        routine = {Ops.EXP2: self.exp2_f64, Ops.LOG2: self.log2_f64, Ops.SIN: self.sin_f64}[op]
        if t == "double":
            return routine(x)
        return self.narrow(routine(self.widen(x, t)), t)

    def float_pow(self, t: str, x: str, y: str) -> str:
        if t == "double":
            return self.pow_f64(x, y)
        return self.narrow(self.pow_f64(self.widen(x, t), self.widen(y, t)), t)

    def widen(self, x: str, t: str) -> str:
        return self.op(f"fpext {t} {x} to double")

    def narrow(self, x: str, t: str) -> str:
        return self.op(f"fptrunc double {x} to {t}")

    def op(self, rhs: str) -> str:
        out = self.tmp()
        self.emit(f"{out} = {rhs}")
        return out

    def d(self, v: float) -> str:
        return const_text(v, dtypes.float64)

    def fma(self, a: str, b: str, c: str) -> str:
        return self.intrinsic("fma", "double", a, b, c)

    def horner(self, t: str, coeffs: list[float]) -> str:
        """coeffs[0] + t*(coeffs[1] + t*(...)) with fused multiply-adds."""
        acc = self.d(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.fma(acc, t, self.d(c))
        return acc

    def to_i64(self, x: str) -> str:
        """An integral double as i64; saturating, so inf and NaN give a defined value (then selected away)."""
        self.declares.add("i64 @llvm.fptosi.sat.i64.f64(double)")
        return self.op(f"call i64 @llvm.fptosi.sat.i64.f64(double {x})")

    def pow2_int(self, n: str) -> str:
        """2**n for an integral double n in [-1022, 1023], built from the exponent bits."""
        biased = self.op(f"add i64 {self.to_i64(n)}, {F64_EXPONENT_BIAS}")
        bits = self.op(f"shl i64 {biased}, {F64_MANTISSA_BITS}")
        return self.op(f"bitcast i64 {bits} to double")

    def exp2_f64(self, x: str) -> str:
        """2**x = 2**n * e**(f ln2), n = rint(x), |f| <= 1/2; the scale in two halves reaches subnormals."""
        low = self.op(f"fcmp olt double {x}, {self.d(EXP2_F64_MIN_ARG)}")
        xc = self.op(f"select i1 {low}, double {self.d(EXP2_F64_MIN_ARG)}, double {x}")
        high = self.op(f"fcmp ogt double {xc}, {self.d(EXP2_F64_MAX_ARG)}")
        xc = self.op(f"select i1 {high}, double {self.d(EXP2_F64_MAX_ARG)}, double {xc}")
        n = self.intrinsic("rint", "double", xc)
        f = self.op(f"fsub double {xc}, {n}")
        t = self.op(f"fmul double {f}, {self.d(math.log(2.0))}")
        poly = self.horner(t, [1.0 / math.factorial(k) for k in range(EXP_F64_TERMS)])
        half = self.op(f"fmul double {n}, {self.d(0.5)}")
        n1 = self.intrinsic("floor", "double", half)
        n2 = self.op(f"fsub double {n}, {n1}")
        r = self.op(f"fmul double {poly}, {self.pow2_int(n1)}")
        r = self.op(f"fmul double {r}, {self.pow2_int(n2)}")
        nan = self.op(f"fcmp uno double {x}, 0.0")
        return self.op(f"select i1 {nan}, double {x}, double {r}")

    def log2_f64(self, x: str) -> str:
        """log2 x = e + log2 m, m in [sqrt(1/2), sqrt 2), log2 m = 2 atanh((m-1)/(m+1)) / ln2; subnormals are
        scaled by 2**54 first. Negative or NaN -> NaN, 0 -> -inf, inf -> inf."""
        small = self.op(f"fcmp olt double {x}, {self.d(F64_MIN_NORMAL)}")
        scaled = self.op(f"fmul double {x}, {self.d(2.0 ** SUBNORMAL_SCALE_BITS)}")
        xs = self.op(f"select i1 {small}, double {scaled}, double {x}")
        bias = self.op(f"select i1 {small}, double {self.d(-SUBNORMAL_SCALE_BITS)}, double {self.d(0.0)}")
        bits = self.op(f"bitcast double {xs} to i64")
        field = self.op(f"lshr i64 {bits}, {F64_MANTISSA_BITS}")
        field = self.op(f"and i64 {field}, {F64_EXPONENT_MASK}")
        e_int = self.op(f"sub i64 {field}, {F64_EXPONENT_BIAS}")
        mant = self.op(f"and i64 {bits}, {(1 << F64_MANTISSA_BITS) - 1}")
        mant = self.op(f"or i64 {mant}, {F64_EXPONENT_BIAS << F64_MANTISSA_BITS}")
        m = self.op(f"bitcast i64 {mant} to double")  # in [1, 2)
        e = self.op(f"sitofp i64 {e_int} to double")
        big = self.op(f"fcmp ogt double {m}, {self.d(math.sqrt(2.0))}")
        m_half = self.op(f"fmul double {m}, {self.d(0.5)}")
        m = self.op(f"select i1 {big}, double {m_half}, double {m}")
        e_up = self.op(f"fadd double {e}, {self.d(1.0)}")
        e = self.op(f"select i1 {big}, double {e_up}, double {e}")
        e = self.op(f"fadd double {e}, {bias}")
        num = self.op(f"fsub double {m}, {self.d(1.0)}")
        den = self.op(f"fadd double {m}, {self.d(1.0)}")
        s = self.op(f"fdiv double {num}, {den}")
        s2 = self.op(f"fmul double {s}, {s}")
        series = self.horner(s2, [1.0 / (2 * k + 1) for k in range(ATANH_F64_TERMS)])
        lg = self.op(f"fmul double {series}, {s}")
        lg = self.fma(lg, self.d(2.0 / math.log(2.0)), e)
        is_inf = self.op(f"fcmp oeq double {x}, {self.d(math.inf)}")
        lg = self.op(f"select i1 {is_inf}, double {x}, double {lg}")
        is_zero = self.op(f"fcmp oeq double {x}, {self.d(0.0)}")
        lg = self.op(f"select i1 {is_zero}, double {self.d(-math.inf)}, double {lg}")
        bad = self.op(f"fcmp ult double {x}, {self.d(0.0)}")  # unordered: NaN too
        return self.op(f"select i1 {bad}, double {self.d(math.nan)}, double {lg}")

    def sin_f64(self, x: str) -> str:
        """sin x: x = k pi/2 + r with a three-part (Cody-Waite) pi/2, |r| <= pi/4, then the sine or cosine
        polynomial by quadrant. inf and NaN give NaN."""
        k = self.op(f"fmul double {x}, {self.d(2.0 / math.pi)}")
        k = self.intrinsic("rint", "double", k)
        neg_k = self.op(f"fneg double {k}")
        r = x
        for part in PIO2_F64_PARTS:
            r = self.fma(neg_k, self.d(part), r)
        r2 = self.op(f"fmul double {r}, {r}")
        sin_coeffs = [(-1.0) ** j / math.factorial(2 * j + 1) for j in range(SIN_F64_TERMS)]
        cos_coeffs = [(-1.0) ** j / math.factorial(2 * j) for j in range(SIN_F64_TERMS + 1)]
        sin_r = self.op(f"fmul double {self.horner(r2, sin_coeffs)}, {r}")
        cos_r = self.horner(r2, cos_coeffs)
        q = self.op(f"and i64 {self.to_i64(k)}, 3")  # k mod 4, also for negative k (two's complement)
        odd = self.op(f"and i64 {q}, 1")
        use_cos = self.op(f"icmp ne i64 {odd}, 0")
        v = self.op(f"select i1 {use_cos}, double {cos_r}, double {sin_r}")
        sign = self.op(f"and i64 {q}, 2")
        negate = self.op(f"icmp ne i64 {sign}, 0")
        neg_v = self.op(f"fneg double {v}")
        return self.op(f"select i1 {negate}, double {neg_v}, double {v}")

    def pow_f64(self, x: str, y: str) -> str:
        """C's pow through exp2(y log2|x|) with its sign and special cases: x < 0 with a non-integer y is
        NaN, an odd integer y keeps x's sign, y == 0 or x == 1 gives 1."""
        ax = self.intrinsic("fabs", "double", x)
        mag = self.exp2_f64(self.op(f"fmul double {self.log2_f64(ax)}, {y}"))
        y_int = self.intrinsic("trunc", "double", y)
        is_int = self.op(f"fcmp oeq double {y_int}, {y}")
        y_half = self.op(f"fmul double {y}, {self.d(0.5)}")
        y_half_int = self.intrinsic("trunc", "double", y_half)
        odd = self.op(f"fcmp one double {y_half_int}, {y_half}")
        neg_mag = self.op(f"fneg double {mag}")
        signed = self.op(f"select i1 {odd}, double {neg_mag}, double {mag}")
        neg_result = self.op(f"select i1 {is_int}, double {signed}, double {self.d(math.nan)}")
        x_neg = self.op(f"fcmp olt double {x}, {self.d(0.0)}")
        r = self.op(f"select i1 {x_neg}, double {neg_result}, double {mag}")
        y_zero = self.op(f"fcmp oeq double {y}, {self.d(0.0)}")
        x_one = self.op(f"fcmp oeq double {x}, {self.d(1.0)}")
        trivial = self.op(f"or i1 {y_zero}, {x_one}")
        return self.op(f"select i1 {trivial}, double {self.d(1.0)}, double {r}")


def _type_bits(t: str) -> int:
    """Bit width of an LLVM scalar register type."""
    named = {"half": 16, "float": 32, "double": 64}
    if t in named:
        return named[t]
    if t.startswith("i") and t[1:].isdigit():
        return int(t[1:])
    raise ValueError(f"AMDGPU renderer: no bit width for type {t!r}")


def render_amdgpu(prog: LinearProgram) -> str:
    """LLVM IR for one AMD GPU kernel (see the module docstring for its calling convention)."""
    return f'target triple = "{AMD_TRIPLE}"\n\n' + AMDGPUEmitter(prog).render() + LOOP_METADATA


class AMDGPURenderer:
    """The AMD GPU renderer: GPU lowering (one thread per output, wave/block group reductions) as LLVM IR."""

    language = "amdgpu"

    def __init__(self, target: Target | str = AMD_GFX1100) -> None:
        self.target = amd_target(target) if isinstance(target, str) else target
        if self.target.triple != AMD_TRIPLE:
            raise ValueError(f"AMDGPURenderer needs an AMD target, got {self.target.name}")

    def lower(self, ast: UOp, name: str) -> LinearProgram:
        return lower(ast, name, self.target)

    def render(self, prog: LinearProgram) -> str:
        return render_amdgpu(prog)
