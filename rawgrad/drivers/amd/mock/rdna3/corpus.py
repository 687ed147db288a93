"""The RDNA3 corpus: hand-written LLVM IR `amdgpu_kernel`s in the shapes rawgrad's kernels take, compiled for
gfx1100 by rawgrad's AMDGPUCompiler. tools/amd_optable.py derives the opcode table from them (and from the
AMDGPU renderer's kernels), and tests/amd runs them on the interpreter against numpy.

Each kernel maps work-item (x, y) of workgroup (x, y) to the element the IR computes; the launch geometry the
tests use sits next to the IR in `CorpusKernel`. The compiler follows AMD-METAL-FACTS.md section 1.8:
triple and datalayout are set before parsing (allocas then land in addrspace(5)); every emission (assembly,
object) parses the IR afresh, because AMDGPU codegen rewrites the module it runs on and a second emission
from one module aborts the process.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from rawgrad.compiler.target import AMD_TRIPLE
from rawgrad.compiler.toolchain import AMDGPU_FEATURES

TRIPLE, FEATURES = AMD_TRIPLE, AMDGPU_FEATURES  # what the table's provenance header names
CPU = "gfx1100"  # RDNA3, the mock's ISA (AMD-METAL-FACTS.md section 1.1)
OPT_LEVEL = 3

_DECLS = """
declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workitem.id.y()
declare i32 @llvm.amdgcn.workgroup.id.x()
declare i32 @llvm.amdgcn.workgroup.id.y()
declare void @llvm.amdgcn.s.barrier()
declare float @llvm.maxnum.f32(float, float)
declare float @llvm.minnum.f32(float, float)
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.exp2.f32(float)
declare float @llvm.log2.f32(float)
declare float @llvm.sqrt.f32(float)
declare float @llvm.fabs.f32(float)
declare float @llvm.floor.f32(float)
declare i32 @llvm.smin.i32(i32, i32)
declare i32 @llvm.umax.i32(i32, i32)
declare i32 @llvm.smax.i32(i32, i32)
declare double @llvm.fma.f64(double, double, double)
declare double @llvm.floor.f64(double)
declare double @llvm.trunc.f64(double)
declare double @llvm.rint.f64(double)
declare double @llvm.fabs.f64(double)
declare double @llvm.sqrt.f64(double)
declare double @llvm.ldexp.f64.i32(double, i32)
declare half @llvm.maxnum.f16(half, half)
declare i32 @llvm.amdgcn.ds.bpermute(i32, i32)
declare i32 @llvm.bitreverse.i32(i32)
declare i32 @llvm.fshr.i32(i32, i32, i32)
declare i32 @llvm.ctlz.i32(i32, i1)
declare i32 @llvm.cttz.i32(i32, i1)
declare i32 @llvm.amdgcn.sffbh.i32(i32)
declare i32 @llvm.amdgcn.perm(i32, i32, i32)
declare <2 x half> @llvm.maxnum.v2f16(<2 x half>, <2 x half>)
declare <2 x half> @llvm.minnum.v2f16(<2 x half>, <2 x half>)
declare <2 x half> @llvm.fma.v2f16(<2 x half>, <2 x half>, <2 x half>)
"""

# a barrier as an AMD renderer writes it: workgroup-scope release, s_barrier, acquire (tinygrad's AMD-LLVM)
_BARRIER = """  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire"""


@dataclass(frozen=True)
class CorpusKernel:
    """One kernel: its name (the IR function), the IR body, and the workgroup size it was written for."""

    name: str
    ir: str
    local: tuple[int, int]  # workgroup size (x, y); the IR hard-codes it in its index arithmetic


def _kernel(name: str, params: str, body: str, local: tuple[int, int]) -> CorpusKernel:
    size = local[0] * local[1]
    ir = (f"define amdgpu_kernel void @{name}({params}) #0 {{\n{body}\n}}\n"
          f'attributes #0 = {{ "amdgpu-flat-work-group-size"="1,{size}" nounwind }}\n')
    return CorpusKernel(name, ir, local)


_GLOBAL_INDEX = """  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 64
  %i = add i32 %base, %tid
  %inb = icmp slt i32 %i, %n
  br i1 %inb, label %body, label %done
body:"""

_G = "ptr addrspace(1) noalias"

# out = relu(a * b + c), out2 = a / b, out3 = exp2(min(a, 8)) + sqrt(|b|) + floor(c) ... (f32 elementwise)
EW_F32 = _kernel("ew_f32", f"{_G} %out, {_G} %out2, {_G} %out3, {_G} %a, {_G} %b, {_G} %c, i32 %n",
                 _GLOBAL_INDEX + """
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %pb = getelementptr float, ptr addrspace(1) %b, i32 %i
  %pc = getelementptr float, ptr addrspace(1) %c, i32 %i
  %va = load float, ptr addrspace(1) %pa
  %vb = load float, ptr addrspace(1) %pb
  %vc = load float, ptr addrspace(1) %pc
  %m = fmul float %va, %vb
  %s = fadd float %m, %vc
  %r = call float @llvm.maxnum.f32(float %s, float 0.0)
  %po = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %r, ptr addrspace(1) %po
  %d = fdiv float %va, %vb
  %po2 = getelementptr float, ptr addrspace(1) %out2, i32 %i
  store float %d, ptr addrspace(1) %po2
  %am = call float @llvm.minnum.f32(float %va, float 8.0)
  %e = call float @llvm.exp2.f32(float %am)
  %ab = call float @llvm.fabs.f32(float %vb)
  %q = call float @llvm.sqrt.f32(float %ab)
  %fl = call float @llvm.floor.f32(float %vc)
  %t1 = fadd float %e, %q
  %t2 = call float @llvm.fma.f32(float %fl, float 0.5, float %t1)
  %lg = call float @llvm.log2.f32(float %t1)
  %t3 = fsub float %t2, %lg
  %po3 = getelementptr float, ptr addrspace(1) %out3, i32 %i
  store float %t3, ptr addrspace(1) %po3
  br label %done
done:
  ret void""", (64, 1))

# integer elementwise: arithmetic, bit ops, shifts, compares/selects, signed and unsigned division
EW_I32 = _kernel("ew_i32", f"{_G} %out, {_G} %out2, {_G} %a, {_G} %b, i32 %n", _GLOBAL_INDEX + """
  %pa = getelementptr i32, ptr addrspace(1) %a, i32 %i
  %pb = getelementptr i32, ptr addrspace(1) %b, i32 %i
  %va = load i32, ptr addrspace(1) %pa
  %vb = load i32, ptr addrspace(1) %pb
  %m = mul i32 %va, %vb
  %sh = ashr i32 %va, 3
  %x = xor i32 %m, %sh
  %sl = shl i32 %vb, 2
  %s = add i32 %x, %sl
  %mn = call i32 @llvm.smin.i32(i32 %va, i32 %vb)
  %r0 = sub i32 %s, %mn
  %lt = icmp ult i32 %va, %vb
  %o = or i32 %va, 255
  %an = and i32 %vb, 65535
  %sel = select i1 %lt, i32 %o, i32 %an
  %r = add i32 %r0, %sel
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %i
  store i32 %r, ptr addrspace(1) %po
  %bz = icmp eq i32 %vb, 0
  %den = select i1 %bz, i32 7, i32 %vb
  %q = sdiv i32 %va, %den
  %ua = call i32 @llvm.umax.i32(i32 %va, i32 1)
  %u = urem i32 %ua, %den
  %qu = add i32 %q, %u
  %po2 = getelementptr i32, ptr addrspace(1) %out2, i32 %i
  store i32 %qu, ptr addrspace(1) %po2
  br label %done
done:
  ret void""", (64, 1))

# casts: f32 -> f16, f16 -> f32, i32 <-> f32, u8 -> f32, and 64-bit integer math
CAST = _kernel("cast", f"{_G} %oh, {_G} %of, {_G} %oi, {_G} %ol, {_G} %a, {_G} %h, {_G} %ia, {_G} %u8, "
               "i32 %n",
               _GLOBAL_INDEX + """
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %va = load float, ptr addrspace(1) %pa
  %vh = fptrunc float %va to half
  %poh = getelementptr half, ptr addrspace(1) %oh, i32 %i
  store half %vh, ptr addrspace(1) %poh
  %ph = getelementptr half, ptr addrspace(1) %h, i32 %i
  %hv = load half, ptr addrspace(1) %ph
  %hm = fmul half %hv, 0xH4000
  %hf = fpext half %hm to float
  %pi = getelementptr i32, ptr addrspace(1) %ia, i32 %i
  %iv = load i32, ptr addrspace(1) %pi
  %if = sitofp i32 %iv to float
  %pu = getelementptr i8, ptr addrspace(1) %u8, i32 %i
  %uv = load i8, ptr addrspace(1) %pu
  %uf = uitofp i8 %uv to float
  %f1 = fadd float %hf, %if
  %f2 = fadd float %f1, %uf
  %pof = getelementptr float, ptr addrspace(1) %of, i32 %i
  store float %f2, ptr addrspace(1) %pof
  %fi = fptosi float %va to i32
  %fu = fptoui float %hf to i32
  %ii = add i32 %fi, %fu
  %poi = getelementptr i32, ptr addrspace(1) %oi, i32 %i
  store i32 %ii, ptr addrspace(1) %poi
  %w = sext i32 %iv to i64
  %w2 = mul i64 %w, 3000000019
  %w3 = lshr i64 %w2, 7
  %pol = getelementptr i64, ptr addrspace(1) %ol, i32 %i
  store i64 %w3, ptr addrspace(1) %pol
  br label %done
done:
  ret void""", (64, 1))

# row sums: workgroup r (64 lanes, two waves) sums row r of a [rows, n] matrix; strided partial sums, then a
# tree through LDS with a barrier per level; lane 0 writes out[r]
REDUCE = _kernel("reduce_sum", f"{_G} %out, {_G} %a, i32 %n", """\
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %row = call i32 @llvm.amdgcn.workgroup.id.x()
  %rowbase = mul i32 %row, %n
  br label %loop
loop:
  %j = phi i32 [ %tid, %0 ], [ %jn, %lbody ]
  %acc = phi float [ 0.0, %0 ], [ %accn, %lbody ]
  %more = icmp slt i32 %j, %n
  br i1 %more, label %lbody, label %tree
lbody:
  %idx = add i32 %rowbase, %j
  %p = getelementptr float, ptr addrspace(1) %a, i32 %idx
  %v = load float, ptr addrspace(1) %p
  %accn = fadd float %acc, %v
  %jn = add i32 %j, 64
  br label %loop
tree:
  %slot = getelementptr [64 x float], ptr addrspace(3) @lds, i32 0, i32 %tid
  store float %acc, ptr addrspace(3) %slot
""" + _BARRIER + """
  br label %level
level:
  %half = phi i32 [ 32, %tree ], [ %hn, %after ]
  %act = icmp ult i32 %tid, %half
  br i1 %act, label %add, label %after
add:
  %other = add i32 %tid, %half
  %po = getelementptr [64 x float], ptr addrspace(3) @lds, i32 0, i32 %other
  %x = load float, ptr addrspace(3) %slot
  %y = load float, ptr addrspace(3) %po
  %z = fadd float %x, %y
  store float %z, ptr addrspace(3) %slot
  br label %after
after:
""" + _BARRIER + """
  %hn = lshr i32 %half, 1
  %fin = icmp eq i32 %hn, 0
  br i1 %fin, label %write, label %level
write:
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %w, label %done
w:
  %res = load float, ptr addrspace(3) @lds
  %pout = getelementptr float, ptr addrspace(1) %out, i32 %row
  store float %res, ptr addrspace(1) %pout
  br label %done
done:
  ret void""", (64, 1))

# C[M, N] = A[M, K] @ B[K, N] with 16x16 tiles staged through LDS; workgroup (16, 16) = 8 waves; edges of
# sizes that are not a multiple of 16 load zeros
MATMUL = _kernel("matmul_tiled", f"{_G} %c, {_G} %a, {_G} %b, i32 %M, i32 %N, i32 %K", """\
  %tx = call i32 @llvm.amdgcn.workitem.id.x()
  %ty = call i32 @llvm.amdgcn.workitem.id.y()
  %bx = call i32 @llvm.amdgcn.workgroup.id.x()
  %by = call i32 @llvm.amdgcn.workgroup.id.y()
  %col0 = mul i32 %bx, 16
  %col = add i32 %col0, %tx
  %row0 = mul i32 %by, 16
  %row = add i32 %row0, %ty
  %rowok = icmp slt i32 %row, %M
  %colok = icmp slt i32 %col, %N
  %tyx = mul i32 %ty, 16
  %lidx = add i32 %tyx, %tx
  %sa = getelementptr [256 x float], ptr addrspace(3) @ta, i32 0, i32 %lidx
  %sb = getelementptr [256 x float], ptr addrspace(3) @tb, i32 0, i32 %lidx
  br label %tile
tile:
  %k0 = phi i32 [ 0, %0 ], [ %k0n, %inner_end ]
  %acc = phi float [ 0.0, %0 ], [ %accf, %inner_end ]
  %ka = add i32 %k0, %tx
  %kaok = icmp slt i32 %ka, %K
  %aok = and i1 %rowok, %kaok
  br i1 %aok, label %lda, label %za
lda:
  %ai0 = mul i32 %row, %K
  %ai = add i32 %ai0, %ka
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %ai
  %av = load float, ptr addrspace(1) %pa
  br label %za
za:
  %aval = phi float [ %av, %lda ], [ 0.0, %tile ]
  store float %aval, ptr addrspace(3) %sa
  %kb = add i32 %k0, %ty
  %kbok = icmp slt i32 %kb, %K
  %bok = and i1 %kbok, %colok
  br i1 %bok, label %ldb, label %zb
ldb:
  %bi0 = mul i32 %kb, %N
  %bi = add i32 %bi0, %col
  %pb = getelementptr float, ptr addrspace(1) %b, i32 %bi
  %bv = load float, ptr addrspace(1) %pb
  br label %zb
zb:
  %bval = phi float [ %bv, %ldb ], [ 0.0, %za ]
  store float %bval, ptr addrspace(3) %sb
""" + _BARRIER + """
  br label %inner
inner:
  %kk = phi i32 [ 0, %zb ], [ %kkn, %inner ]
  %acc2 = phi float [ %acc, %zb ], [ %accn, %inner ]
  %ia = add i32 %tyx, %kk
  %pta = getelementptr [256 x float], ptr addrspace(3) @ta, i32 0, i32 %ia
  %kk16 = mul i32 %kk, 16
  %ib = add i32 %kk16, %tx
  %ptb = getelementptr [256 x float], ptr addrspace(3) @tb, i32 0, i32 %ib
  %x = load float, ptr addrspace(3) %pta
  %y = load float, ptr addrspace(3) %ptb
  %accn = call float @llvm.fma.f32(float %x, float %y, float %acc2)
  %kkn = add i32 %kk, 1
  %kdone = icmp eq i32 %kkn, 16
  br i1 %kdone, label %inner_end, label %inner
inner_end:
  %accf = phi float [ %accn, %inner ]
""" + _BARRIER + """
  %k0n = add i32 %k0, 16
  %more = icmp slt i32 %k0n, %K
  br i1 %more, label %tile, label %store
store:
  %ok = and i1 %rowok, %colok
  br i1 %ok, label %st, label %done
st:
  %ci0 = mul i32 %row, %N
  %ci = add i32 %ci0, %col
  %pc = getelementptr float, ptr addrspace(1) %c, i32 %ci
  store float %accf, ptr addrspace(1) %pc
  br label %done
done:
  ret void""", (16, 16))

# a divergent branch with a per-lane loop: lanes with a[i] > 0 run i % 7 steps of x = x * 0.5 + 1, the others
# take -2 * a[i]; the lanes of one wave take both sides and loop different counts
DIVERGENT = _kernel("divergent", f"{_G} %out, {_G} %a, i32 %n", _GLOBAL_INDEX + """
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %va = load float, ptr addrspace(1) %pa
  %pos = fcmp ogt float %va, 0.0
  br i1 %pos, label %lp_pre, label %neg
lp_pre:
  %cnt = urem i32 %i, 7
  br label %lp
lp:
  %k = phi i32 [ 0, %lp_pre ], [ %kn, %lpb ]
  %x = phi float [ %va, %lp_pre ], [ %xn, %lpb ]
  %go = icmp ult i32 %k, %cnt
  br i1 %go, label %lpb, label %join
lpb:
  %xh = fmul float %x, 0.5
  %xn = fadd float %xh, 1.0
  %kn = add i32 %k, 1
  br label %lp
neg:
  %nv = fmul float %va, -2.0
  br label %join
join:
  %r = phi float [ %x, %lp ], [ %nv, %neg ]
  %po = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %r, ptr addrspace(1) %po
  br label %done
done:
  ret void""", (64, 1))

# lane 0 of workgroup (x, y) writes y * 1000 + x to out[y * gx + x]: where the workgroup ids come from (LLVM
# pads USER_SGPR_COUNT, so they are not in s2/s3; AMD-METAL-FACTS.md section 1.8)
WGID = _kernel("wgid", f"{_G} %out, i32 %gx", """\
  %x = call i32 @llvm.amdgcn.workgroup.id.x()
  %y = call i32 @llvm.amdgcn.workgroup.id.y()
  %t = call i32 @llvm.amdgcn.workitem.id.x()
  %first = icmp eq i32 %t, 0
  br i1 %first, label %w, label %done
w:
  %row = mul i32 %y, %gx
  %slot = add i32 %row, %x
  %v0 = mul i32 %y, 1000
  %v = add i32 %v0, %x
  %p = getelementptr i32, ptr addrspace(1) %out, i32 %slot
  store i32 %v, ptr addrspace(1) %p
  br label %done
done:
  ret void""", (32, 1))

# float64: arithmetic, fma, the v_div_*_f64 division expansion, rounding, ldexp, compares, conversions, sqrt
EW_F64 = _kernel("ew_f64", f"{_G} %out, {_G} %out2, {_G} %outi, {_G} %a, {_G} %b, i32 %n", _GLOBAL_INDEX + """
  %pa = getelementptr double, ptr addrspace(1) %a, i32 %i
  %pb = getelementptr double, ptr addrspace(1) %b, i32 %i
  %va = load double, ptr addrspace(1) %pa
  %vb = load double, ptr addrspace(1) %pb
  %m = fmul double %va, %vb
  %s = fadd double %m, %va
  %f = call double @llvm.fma.f64(double %va, double %vb, double %s)
  %d = fdiv double %f, %vb
  %fl = call double @llvm.floor.f64(double %d)
  %tr = call double @llvm.trunc.f64(double %va)
  %rn = call double @llvm.rint.f64(double %vb)
  %x1 = fadd double %fl, %tr
  %x2 = fadd double %x1, %rn
  %ld = call double @llvm.ldexp.f64.i32(double %x2, i32 3)
  %gt = fcmp ogt double %va, %vb
  %sel = select i1 %gt, double %ld, double %d
  %un = fcmp uno double %va, %vb
  %sel2 = select i1 %un, double 0.0, double %sel
  %po = getelementptr double, ptr addrspace(1) %out, i32 %i
  store double %sel2, ptr addrspace(1) %po
  %ab = call double @llvm.fabs.f64(double %va)
  %sq = call double @llvm.sqrt.f64(double %ab)
  %f32 = fptrunc double %sq to float
  %id = sitofp i32 %i to double
  %nd = uitofp i32 %n to double
  %sum = fadd double %id, %nd
  %fe = fpext float %f32 to double
  %z = fadd double %fe, %sum
  %zt = fptrunc double %z to float
  %po2 = getelementptr float, ptr addrspace(1) %out2, i32 %i
  store float %zt, ptr addrspace(1) %po2
  %ui = fptoui double %ab to i32
  %poi = getelementptr i32, ptr addrspace(1) %outi, i32 %i
  store i32 %ui, ptr addrspace(1) %poi
  br label %done
done:
  ret void""", (64, 1))

# float16: arithmetic, max, an ordered compare + select, and an f32 fma of widened halves narrowed back
# (v_fma_mixlo_f16)
EW_F16 = _kernel("ew_f16", f"{_G} %out, {_G} %out2, {_G} %a, {_G} %b, {_G} %c, i32 %n", _GLOBAL_INDEX + """
  %pa = getelementptr half, ptr addrspace(1) %a, i32 %i
  %pb = getelementptr half, ptr addrspace(1) %b, i32 %i
  %pc = getelementptr float, ptr addrspace(1) %c, i32 %i
  %ha = load half, ptr addrspace(1) %pa
  %hb = load half, ptr addrspace(1) %pb
  %vc = load float, ptr addrspace(1) %pc
  %m = fmul half %ha, %hb
  %mx = call half @llvm.maxnum.f16(half %m, half %hb)
  %o = fcmp ord half %ha, %mx
  %sel = select i1 %o, half %mx, half 0xH3C00
  %po = getelementptr half, ptr addrspace(1) %out, i32 %i
  store half %sel, ptr addrspace(1) %po
  %fa = fpext half %ha to float
  %fb = fpext half %hb to float
  %fm = call float @llvm.fma.f32(float %fa, float %fb, float %vc)
  %t = fptrunc float %fm to half
  %po2 = getelementptr half, ptr addrspace(1) %out2, i32 %i
  store half %t, ptr addrspace(1) %po2
  br label %done
done:
  ret void""", (64, 1))

# a wave-level sum through ds_bpermute (the renderer's wave-group reduction): butterfly over lane ^ 16..1,
# then lane 0 of each wave writes its wave's sum; every lane stays active (out-of-range items add 0)
_BFLY = "".join(f"""
  %l{k} = xor i32 %lane, {m}
  %a{k} = shl i32 %l{k}, 2
  %b{k} = bitcast float %v{k} to i32
  %g{k} = call i32 @llvm.amdgcn.ds.bpermute(i32 %a{k}, i32 %b{k})
  %f{k} = bitcast i32 %g{k} to float
  %v{k + 1} = fadd float %v{k}, %f{k}""" for k, m in enumerate((16, 8, 4, 2, 1)))
WAVE_SUM = _kernel("wave_sum", f"{_G} %out, {_G} %a, i32 %n", """\
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %wg = call i32 @llvm.amdgcn.workgroup.id.x()
  %base = mul i32 %wg, 64
  %i = add i32 %base, %tid
  %inb = icmp slt i32 %i, %n
  %safe = select i1 %inb, i32 %i, i32 0
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %safe
  %raw = load float, ptr addrspace(1) %pa
  %v0 = select i1 %inb, float %raw, float 0.0
  %lane = and i32 %tid, 31""" + _BFLY + """
  %first = icmp eq i32 %lane, 0
  br i1 %first, label %w, label %done
w:
  %wave = lshr i32 %i, 5
  %po = getelementptr float, ptr addrspace(1) %out, i32 %wave
  store float %v5, ptr addrspace(1) %po
  br label %done
done:
  ret void""", (64, 1))

# 64-bit integer compares and shifts, and 32-bit bit tricks (mulhi, bitreverse, funnel shift, 3-input ops)
INT64 = _kernel("int64", f"{_G} %out, {_G} %out2, {_G} %a, {_G} %b, i32 %n", _GLOBAL_INDEX + """
  %pa = getelementptr i64, ptr addrspace(1) %a, i32 %i
  %pb = getelementptr i64, ptr addrspace(1) %b, i32 %i
  %va = load i64, ptr addrspace(1) %pa
  %vb = load i64, ptr addrspace(1) %pb
  %c1 = icmp slt i64 %va, %vb
  %c2 = icmp ugt i64 %va, 128
  %c3 = icmp eq i64 %va, %vb
  %amt = and i64 %vb, 63
  %sh = ashr i64 %va, %amt
  %sl = lshr i64 %vb, 5
  %x = select i1 %c1, i64 %sh, i64 %sl
  %y = select i1 %c2, i64 %x, i64 %va
  %z = select i1 %c3, i64 7, i64 %y
  %po = getelementptr i64, ptr addrspace(1) %out, i32 %i
  store i64 %z, ptr addrspace(1) %po
  %lo = trunc i64 %va to i32
  %lb = trunc i64 %vb to i32
  %wa = sext i32 %lo to i64
  %wb = sext i32 %lb to i64
  %pr = mul i64 %wa, %wb
  %ph = ashr i64 %pr, 32
  %mh = trunc i64 %ph to i32
  %rev = call i32 @llvm.bitreverse.i32(i32 %lo)
  %fs = call i32 @llvm.fshr.i32(i32 %lo, i32 %lb, i32 %lb)
  %x1 = xor i32 %lo, %lb
  %x3 = xor i32 %x1, %mh
  %m1 = call i32 @llvm.smax.i32(i32 %lo, i32 %lb)
  %m3 = call i32 @llvm.smax.i32(i32 %m1, i32 %rev)
  %xa = add i32 %x1, %rev
  %r1 = add i32 %x3, %m3
  %r2 = add i32 %r1, %xa
  %r3 = add i32 %r2, %fs
  %po2 = getelementptr i32, ptr addrspace(1) %out2, i32 %i
  store i32 %r3, ptr addrspace(1) %po2
  br label %done
done:
  ret void""", (64, 1))

# per-lane bit counts, byte permutes and a 24-bit multiply-add (v_clz_i32_u32, v_ctz_i32_b32, v_cls_i32,
# v_perm_b32, v_mad_u32_u24): out[6 i + k]; packed f16 math (v_pk_max/min/add/mul/fma_f16, with op_sel
# swapping halves and neg): outh[5 i + k]
BITS_PACKED = _kernel("bits_packed", f"{_G} %out, {_G} %outh, {_G} %a, {_G} %b, {_G} %c, {_G} %ha, {_G} %hb, "
                      "i32 %n", _GLOBAL_INDEX + """
  %pa = getelementptr i32, ptr addrspace(1) %a, i32 %i
  %pb = getelementptr i32, ptr addrspace(1) %b, i32 %i
  %pc = getelementptr i32, ptr addrspace(1) %c, i32 %i
  %va = load i32, ptr addrspace(1) %pa
  %vb = load i32, ptr addrspace(1) %pb
  %vc = load i32, ptr addrspace(1) %pc
  %clz = call i32 @llvm.ctlz.i32(i32 %va, i1 false)
  %ctz = call i32 @llvm.cttz.i32(i32 %vb, i1 false)
  %cls = call i32 @llvm.amdgcn.sffbh.i32(i32 %va)
  %perm = call i32 @llvm.amdgcn.perm(i32 %va, i32 %vb, i32 %vc)
  %clsb = call i32 @llvm.amdgcn.sffbh.i32(i32 %vb)
  %a24 = and i32 %va, 16777215
  %b24 = lshr i32 %vb, 8
  %m24 = mul i32 %a24, %b24
  %mad = add i32 %m24, %vc
  %o = mul i32 %i, 5
  %oi = mul i32 %i, 6
  %q5 = getelementptr i32, ptr addrspace(1) %out, i32 %oi
  %o1 = add i32 %o, 1
  %o2 = add i32 %o, 2
  %o3 = add i32 %o, 3
  %o4 = add i32 %o, 4
  %q0 = getelementptr i32, ptr addrspace(1) %q5, i32 1
  %q1 = getelementptr i32, ptr addrspace(1) %q5, i32 2
  %q2 = getelementptr i32, ptr addrspace(1) %q5, i32 3
  %q3 = getelementptr i32, ptr addrspace(1) %q5, i32 4
  %q4 = getelementptr i32, ptr addrspace(1) %q5, i32 5
  store i32 %mad, ptr addrspace(1) %q5
  store i32 %clz, ptr addrspace(1) %q0
  store i32 %ctz, ptr addrspace(1) %q1
  store i32 %cls, ptr addrspace(1) %q2
  store i32 %perm, ptr addrspace(1) %q3
  store i32 %clsb, ptr addrspace(1) %q4
  %pha = getelementptr <2 x half>, ptr addrspace(1) %ha, i32 %i
  %phb = getelementptr <2 x half>, ptr addrspace(1) %hb, i32 %i
  %x = load <2 x half>, ptr addrspace(1) %pha
  %y = load <2 x half>, ptr addrspace(1) %phb
  %ys = shufflevector <2 x half> %y, <2 x half> poison, <2 x i32> <i32 1, i32 0>
  %mx = call <2 x half> @llvm.maxnum.v2f16(<2 x half> %x, <2 x half> %ys)
  %mn = call <2 x half> @llvm.minnum.v2f16(<2 x half> %x, <2 x half> %y)
  %ny = fneg <2 x half> %y
  %ad = fadd <2 x half> %x, %ny
  %mu = fmul <2 x half> %x, %y
  %fm = call <2 x half> @llvm.fma.v2f16(<2 x half> %x, <2 x half> %ys, <2 x half> %y)
  %h0 = getelementptr <2 x half>, ptr addrspace(1) %outh, i32 %o
  %h1 = getelementptr <2 x half>, ptr addrspace(1) %outh, i32 %o1
  %h2 = getelementptr <2 x half>, ptr addrspace(1) %outh, i32 %o2
  %h3 = getelementptr <2 x half>, ptr addrspace(1) %outh, i32 %o3
  %h4 = getelementptr <2 x half>, ptr addrspace(1) %outh, i32 %o4
  store <2 x half> %mx, ptr addrspace(1) %h0
  store <2 x half> %mn, ptr addrspace(1) %h1
  store <2 x half> %ad, ptr addrspace(1) %h2
  store <2 x half> %mu, ptr addrspace(1) %h3
  store <2 x half> %fm, ptr addrspace(1) %h4
  br label %done
done:
  ret void""", (64, 1))

# three-input min/max/median and packed 16-bit integer math (v_max3_f32, v_min3_f32, v_med3_i32 from a clamp,
# v_pk_mul_lo_u16): out[4 i + k] as 32-bit words; b holds both a float and, read as <2 x i16>, two halves
MINMAX3 = _kernel("minmax3", f"{_G} %out, {_G} %a, {_G} %b, {_G} %c, i32 %n", _GLOBAL_INDEX + """
  %pa = getelementptr float, ptr addrspace(1) %a, i32 %i
  %pb = getelementptr float, ptr addrspace(1) %b, i32 %i
  %pc = getelementptr float, ptr addrspace(1) %c, i32 %i
  %va = load float, ptr addrspace(1) %pa
  %vb = load float, ptr addrspace(1) %pb
  %vc = load float, ptr addrspace(1) %pc
  %m1 = call float @llvm.maxnum.f32(float %va, float %vb)
  %mx = call float @llvm.maxnum.f32(float %m1, float %vc)
  %n1 = call float @llvm.minnum.f32(float %va, float %vb)
  %mn = call float @llvm.minnum.f32(float %n1, float %vc)
  %ia = bitcast float %va to i32
  %lo = call i32 @llvm.smax.i32(i32 %ia, i32 -1000000)
  %md = call i32 @llvm.smin.i32(i32 %lo, i32 1000000)
  %hb = bitcast float %vb to <2 x i16>
  %hc = bitcast float %vc to <2 x i16>
  %pm = mul <2 x i16> %hb, %hc
  %pmi = bitcast <2 x i16> %pm to i32
  %mxi = bitcast float %mx to i32
  %mni = bitcast float %mn to i32
  %o = mul i32 %i, 4
  %q0 = getelementptr i32, ptr addrspace(1) %out, i32 %o
  %q1 = getelementptr i32, ptr addrspace(1) %q0, i32 1
  %q2 = getelementptr i32, ptr addrspace(1) %q0, i32 2
  %q3 = getelementptr i32, ptr addrspace(1) %q0, i32 3
  store i32 %mxi, ptr addrspace(1) %q0
  store i32 %mni, ptr addrspace(1) %q1
  store i32 %md, ptr addrspace(1) %q2
  store i32 %pmi, ptr addrspace(1) %q3
  br label %done
done:
  ret void""", (64, 1))

# scalar (SALU) forms of uniform kernel arguments: s_mul_hi_u32/i32, s_lshl1/2_add_u32, s_bitset0/1_b32,
# s_mulk_i32, s_cmpk_*, s_clz_i32_u32, s_ctz_i32_b32, s_cls_i32, s_cmp_eq_u64; work-item 0 stores out[0..18]
SCALAR_OPS = _kernel("scalar_ops", f"{_G} %out, i32 %a, i32 %b, i64 %c, i64 %d", """\
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %body, label %done
body:
  %wa = zext i32 %a to i64
  %wb = zext i32 %b to i64
  %pu = mul i64 %wa, %wb
  %phu = lshr i64 %pu, 32
  %r0 = trunc i64 %phu to i32
  %sa = sext i32 %a to i64
  %sb = sext i32 %b to i64
  %ps = mul i64 %sa, %sb
  %phs = lshr i64 %ps, 32
  %r1 = trunc i64 %phs to i32
  %l1 = shl i32 %a, 1
  %r2 = add i32 %l1, %b
  %l2 = shl i32 %b, 2
  %r3 = add i32 %l2, %a
  %bit = and i32 %b, 31
  %one = shl i32 1, %bit
  %notone = xor i32 %one, -1
  %r4 = and i32 %a, %notone
  %r5 = or i32 %a, %one
  %r6 = mul i32 %a, 1000
  %k1 = icmp eq i32 %a, 1000
  %r7 = select i1 %k1, i32 %b, i32 77
  %k2 = icmp ult i32 %b, 4000
  %r8 = select i1 %k2, i32 %a, i32 99
  %k3 = icmp sgt i32 %a, -300
  %r9 = select i1 %k3, i32 %b, i32 55
  %r10 = call i32 @llvm.ctlz.i32(i32 %a, i1 false)
  %r11 = call i32 @llvm.cttz.i32(i32 %b, i1 false)
  %r12 = call i32 @llvm.amdgcn.sffbh.i32(i32 %a)
  %k4 = icmp eq i64 %c, %d
  %r13 = select i1 %k4, i32 %a, i32 %b
  %k5 = icmp ne i64 %c, %d
  %r14 = select i1 %k5, i32 %b, i32 3
  %r15 = call i32 @llvm.amdgcn.sffbh.i32(i32 %b)
  %x0 = add i32 %a, %b
  %x1 = and i32 %x0, -65537
  %x2 = or i32 %x1, 1048576
  %r16 = mul i32 %x2, 1000
  %y0 = add i32 %a, %b
  %r17 = and i32 %y0, -65537
  %y1 = sub i32 %a, %b
  %r18 = or i32 %y1, 1048576""" + "".join(f"""
  %q{k} = getelementptr i32, ptr addrspace(1) %out, i32 {k}
  store i32 %r{k}, ptr addrspace(1) %q{k}""" for k in range(19)) + """
  br label %done
done:
  ret void""", (64, 1))

KERNELS: tuple[CorpusKernel, ...] = (EW_F32, EW_I32, CAST, REDUCE, MATMUL, DIVERGENT, WGID, EW_F64, EW_F16,
                                     WAVE_SUM, INT64, BITS_PACKED, SCALAR_OPS, MINMAX3)

_GLOBALS = {
    "reduce_sum": '@lds = internal addrspace(3) global [64 x float] poison, align 4\n',
    "matmul_tiled": ('@ta = internal addrspace(3) global [256 x float] poison, align 4\n'
                     '@tb = internal addrspace(3) global [256 x float] poison, align 4\n'),
}


def module_text(k: CorpusKernel) -> str:
    """The kernel's whole module (declarations, LDS globals, the function), without triple/datalayout."""
    return _DECLS + _GLOBALS.get(k.name, "") + k.ir


@dataclass(frozen=True)
class Compiled:
    """What LLVM made of one kernel: its assembly listing and its relocatable code object (ELF)."""

    name: str
    asm: str
    obj: bytes


@cache
def _compiler():  # type: ignore[no-untyped-def]
    from rawgrad.compiler.toolchain import AMDGPUCompiler  # the project's AMD compile path

    return AMDGPUCompiler(CPU, opt_level=OPT_LEVEL, cache_dir="")


def llvm_version() -> str:
    import llvmlite.binding as llvm

    return ".".join(str(v) for v in llvm.llvm_version_info)


def compile_ir(name: str, text: str) -> Compiled:
    """Compile an AMDGPU module with rawgrad's AMDGPUCompiler (O3, +cumode, a fresh parse per emission):
    its assembly listing and its relocatable object."""
    c = _compiler()
    return Compiled(name, c.assembly(text), bytes(c.compile(text)))


@cache
def compiled(name: str) -> Compiled:
    """The corpus kernel `name`, compiled (cached for the process)."""
    for k in KERNELS:
        if k.name == name:
            return compile_ir(k.name, module_text(k))
    raise KeyError(f"no corpus kernel named {name!r} (have: {', '.join(k.name for k in KERNELS)})")



def program(name: str):  # type: ignore[no-untyped-def]
    """The corpus kernel `name`, compiled, laid out and relocated by rawgrad's loader
    (compiler/amdgpu_code.py), as an interpreter Program."""
    from rawgrad.compiler.amdgpu_code import load_code_object
    from rawgrad.drivers.amd.mock.rdna3.interp import Program

    return Program.from_code_object(load_code_object(compiled(name).obj, CPU, kernel=name))
