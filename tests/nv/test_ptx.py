"""The PTX renderer and the numpy PTX interpreter of the mock GPU.

Hand-written kernels pin down the interpreter (divergence, loops, shared memory and barriers, predicates,
special registers, errors); kernels from the real scheduler, rendered by PTXRenderer and interpreted,
are compared with numpy, which checks renderer and interpreter together without a GPU.
"""
from __future__ import annotations

import re
import struct
from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor, Variable
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.renderer.ptx import PTXRenderer, launch_dims, param_layout, reg_class
from rawgrad.compiler.symbolic import sym_infer
from rawgrad.compiler.target import NV_SM90
from rawgrad.drivers.nv.mock.ptx_interp import MemoryFault, NumpyMemory, PTXError, PTXModule
from rawgrad.dtype import DType, bf16_bits_to_f32, dtypes, f32_to_bf16_bits
from rawgrad.tensor.buffers import buffer_numpy, is_allocated
from rawgrad.tensor.schedule import create_schedule

HEADER = ".version 7.8\n.target sm_90\n.address_size 64\n"
# the renderer's block and warp come from its target (compiler/target.py)
THREADS_PER_BLOCK = NV_SM90.block_threads
WARP_SIZE = NV_SM90.simd_width


# ---------------------------------------------------------------------- helpers
def run_on_ptx(*tensors: Tensor) -> list[np.ndarray]:
    """Schedule `tensors` on the CPU, run every kernel as PTX in the interpreter; return host arrays."""
    items, results = create_schedule([t.uop for t in tensors])
    mem = NumpyMemory()
    addr: dict[UOp, int] = {}
    renderer = PTXRenderer()
    var_vals: dict[UOp, int] = {}

    def va(buf: UOp) -> int:
        if buf not in addr:
            assert buf.dtype is not None
            addr[buf] = mem.alloc(buffer_numpy(buf)) if is_allocated(buf) else \
                mem.alloc(max(buf.arg[1], 1) * buf.dtype.itemsize)
        return addr[buf]

    for k, si in enumerate(items):
        var_vals.update(si.var_vals)
        if si.ast is None:  # a copy
            dst, src = si.bufs
            assert src.dtype is not None
            data = mem.read(va(src), src.dtype.np, src.arg[1])
            mem.store(va(dst) + np.arange(data.size, dtype=np.uint64) * np.uint64(data.itemsize), data)
            continue
        prog = renderer.lower(si.ast, f"{re.sub(r'[^A-Za-z0-9_]', '_', si.name)}_{k}")
        src_text = renderer.render(prog)
        layout = param_layout(prog)
        words = [va(si.bufs[g.arg]) for g in prog.globals] + [si.var_vals[v] for v in prog.variables]
        params = bytearray(layout[-1][1] + layout[-1][2])
        for (_, off, size), w in zip(layout, words):
            params[off:off + size] = struct.pack("<q" if size == 8 else "<i", w)
        gsize = int(sym_infer(prog.global_size, si.var_vals))
        grid, block = launch_dims(gsize, prog.launch.local_size[0])  # the block of the launch contract
        PTXModule(src_text).launch(prog.name, grid, block, bytes(params), mem)
    out = []
    for t, r in zip(tensors, results):
        buf = r.base
        assert buf.dtype is not None
        shape = tuple(int(sym_infer(d, var_vals)) if isinstance(d, UOp) else d for d in t.shape)
        data = mem.read(va(buf), buf.dtype.np, int(np.prod(shape)))
        if t.dtype == dtypes.bfloat16:
            data = bf16_bits_to_f32(data)
        out.append(data.reshape(shape))
    return out


def ptx1(t: Tensor) -> np.ndarray:
    return run_on_ptx(t)[0]


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 precision (held as float32)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(np.asarray(x, np.float32))).reshape(np.shape(x))


def launch(src: str, entry: str, grid: tuple[int, int, int], block: tuple[int, int, int], fmt: str,
           *args: int, mem: NumpyMemory | None = None, **kw: Any) -> NumpyMemory:
    mem = mem if mem is not None else NumpyMemory()
    PTXModule(HEADER + src).launch(entry, grid, block, struct.pack(fmt, *args), mem, **kw)
    return mem


RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------- hand-written kernels
DIVERGE = """
.visible .entry diverge(.param .u64 out, .param .u32 n)
{
  .reg .pred %p<4>;
  .reg .b32 %r<10>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [n];
  mov.u32 %r2, %tid.x;
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mad.lo.u32 %r5, %r3, %r4, %r2;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 exit;
  // sum of 0..(gid % 7) in a loop whose trip count differs per thread, then an if/else on parity
  rem.u32 %r6, %r5, 7;
  mov.u32 %r7, 0;
  mov.u32 %r8, 0;
LOOP:
  setp.gt.u32 %p2, %r8, %r6;
  @%p2 bra AFTER;
  add.u32 %r7, %r7, %r8;
  add.u32 %r8, %r8, 1;
  bra LOOP;
AFTER:
  and.b32 %r9, %r5, 1;
  setp.eq.u32 %p3, %r9, 0;
  @%p3 bra EVEN;
  neg.s32 %r7, %r7;
  bra STORE;
EVEN:
  mul.lo.s32 %r7, %r7, 10;
STORE:
  mul.wide.u32 %rd2, %r5, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.s32 [%rd3], %r7;
}
"""


def test_divergent_loops_and_branches():
    n = 300
    mem = NumpyMemory()
    out = mem.alloc(n * 4)
    launch(DIVERGE, "diverge", (3, 1, 1), (128, 1, 1), "<QI", out, n, mem=mem)
    g = np.arange(n)
    tri = (g % 7) * (g % 7 + 1) // 2
    np.testing.assert_array_equal(mem.read(out, np.int32, n), np.where(g % 2 == 0, tri * 10, -tri))


BLOCK_SUM = """
.visible .entry block_sum(.param .u64 out, .param .u64 inp)
{
  .shared .align 4 .f32 buf[128];
  .reg .pred %p<3>;
  .reg .b32 %r<10>;
  .reg .b64 %rd<10>;
  .reg .f32 %f<4>;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd2, [inp];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mad.lo.u32 %r4, %r2, %r3, %r1;
  mul.wide.u32 %rd3, %r4, 4;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
  mov.u64 %rd5, buf;
  mul.wide.u32 %rd6, %r1, 4;
  add.s64 %rd7, %rd5, %rd6;
  st.shared.f32 [%rd7], %f1;
  bar.sync 0;
  shr.u32 %r5, %r3, 1;
STEP:
  setp.eq.u32 %p1, %r5, 0;
  @%p1 bra DONE;
  setp.lt.u32 %p2, %r1, %r5;
  @!%p2 bra SKIP;
  add.u32 %r6, %r1, %r5;
  mul.wide.u32 %rd8, %r6, 4;
  add.s64 %rd9, %rd5, %rd8;
  ld.shared.f32 %f2, [%rd9];
  ld.shared.f32 %f3, [%rd7];
  add.f32 %f3, %f3, %f2;
  st.shared.f32 [%rd7], %f3;
SKIP:
  bar.sync 0;
  shr.u32 %r5, %r5, 1;
  bra.uni STEP;
DONE:
  setp.ne.u32 %p1, %r1, 0;
  @%p1 ret;
  ld.shared.f32 %f1, [buf];
  mul.wide.u32 %rd3, %r2, 4;
  add.s64 %rd4, %rd1, %rd3;
  st.global.f32 [%rd4], %f1;
  ret;
}
"""


def test_shared_memory_tree_reduction_with_barriers():
    blocks, threads = 5, 64
    x = RNG.integers(-8, 8, blocks * threads).astype(np.float32)  # small ints: every order sums exactly
    mem = NumpyMemory()
    inp, out = mem.alloc(x), mem.alloc(blocks * 4)
    launch(BLOCK_SUM, "block_sum", (blocks, 1, 1), (threads, 1, 1), "<QQ", out, inp, mem=mem)
    np.testing.assert_array_equal(mem.read(out, np.float32, blocks), x.reshape(blocks, threads).sum(1))


SPECIALS = """
.visible .entry specials(.param .u64 out)
{
  .reg .b32 %r<16>;
  .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %tid.y;
  mov.u32 %r3, %tid.z;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %ntid.y;
  mov.u32 %r6, %ntid.z;
  mov.u32 %r7, %ctaid.x;
  mov.u32 %r8, %ctaid.y;
  mov.u32 %r9, %ctaid.z;
  mov.u32 %r10, %nctaid.x;
  mov.u32 %r11, %nctaid.y;
  mov.u32 %r12, %nctaid.z;
  mov.u32 %r13, %laneid;
  mov.u32 %r14, %warpid;
  // linear thread id: ((ctaid.z * nctaid.y + ctaid.y) * nctaid.x + ctaid.x) * threads + tid linear
  mad.lo.u32 %r15, %r9, %r11, %r8;
  mad.lo.u32 %r15, %r15, %r10, %r7;
  mul.lo.u32 %r0, %r4, %r5;
  mul.lo.u32 %r0, %r0, %r6;
  mul.lo.u32 %r15, %r15, %r0;
  mad.lo.u32 %r0, %r3, %r5, %r2;
  mad.lo.u32 %r0, %r0, %r4, %r1;
  add.u32 %r15, %r15, %r0;
  mul.wide.u32 %rd2, %r15, 64;
  add.s64 %rd3, %rd1, %rd2;
  st.global.v2.u32 [%rd3], {%r1, %r2};
  st.global.v2.u32 [%rd3+8], {%r3, %r4};
  st.global.u32 [%rd3+16], %r5;
  st.global.u32 [%rd3+20], %r6;
  st.global.u32 [%rd3+24], %r13;
  st.global.u32 [%rd3+28], %r14;
  st.global.v4.u32 [%rd3+32], {%r7, %r8, %r9, %r10};
  st.global.u32 [%rd3+48], %r11;
  st.global.u32 [%rd3+52], %r12;
}
"""


def test_every_special_register():
    grid, block = (3, 2, 2), (8, 5, 2)
    nthreads, nblocks = int(np.prod(block)), int(np.prod(grid))
    mem = NumpyMemory()
    out = mem.alloc(nthreads * nblocks * 64)
    launch(SPECIALS, "specials", grid, block, "<Q", out, mem=mem)
    got = mem.read(out, np.uint32, nthreads * nblocks * 16).reshape(nblocks, nthreads, 16)[..., :14]
    b = np.arange(nblocks)[:, None]
    t = np.arange(nthreads)[None, :]
    bx, by, bz = b % grid[0], (b // grid[0]) % grid[1], b // (grid[0] * grid[1])
    tx, ty, tz = t % block[0], (t // block[0]) % block[1], t // (block[0] * block[1])
    full = np.ones((nblocks, nthreads), np.int64)
    want = np.stack([tx * full, ty * full, tz * full, *(full * d for d in block), t % 32 * full,
                     t // 32 * full, bx * full, by * full, bz * full, *(full * d for d in grid)], -1)
    np.testing.assert_array_equal(got, want)


PREDICATES = """
.visible .entry preds(.param .u64 out)
{
  .reg .pred %p<8>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  .reg .f32 %f<4>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %tid.x;
  cvt.rn.f32.u32 %f1, %r1;
  setp.lt.and.u32 %p1|%p2, %r1, 20, 1;        // p1 = tid < 20, p2 = tid >= 20
  setp.gt.or.f32 %p3, %f1, 0f41F00000, %p1;   // tid > 30.0 or tid < 20
  and.b32 %r2, %r1, 3;
  setp.eq.xor.u32 %p4, %r2, 0, !%p3;          // (tid % 4 == 0) xor not p3
  not.pred %p5, %p4;
  or.pred %p6, %p2, %p5;
  xor.pred %p7, %p6, %p1;
  selp.u32 %r3, 1, 0, %p3;
  selp.u32 %r4, 2, 0, %p4;
  selp.u32 %r5, 4, 0, %p7;
  add.u32 %r6, %r3, %r4;
  add.u32 %r6, %r6, %r5;
  mov.u32 %r7, 100;
  @!%p4 add.u32 %r6, %r6, %r7;                // predicated arithmetic
  setp.nan.f32 %p1, %f1, %f1;
  @%p1 mov.u32 %r6, 12345;                    // never taken: no NaN here
  mul.wide.u32 %rd2, %r1, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r6;
}
"""


def test_predicates_setp_bool_ops_selp_and_guards():
    n = 64
    mem = NumpyMemory()
    out = mem.alloc(n * 4)
    launch(PREDICATES, "preds", (1, 1, 1), (n, 1, 1), "<Q", out, mem=mem)
    t = np.arange(n)
    p1, p2 = t < 20, t >= 20
    p3 = (t > 30) | p1
    p4 = (t % 4 == 0) ^ ~p3
    p7 = (p2 | ~p4) ^ p1
    want = p3 * 1 + p4 * 2 + p7 * 4 + np.where(~p4, 100, 0)
    np.testing.assert_array_equal(mem.read(out, np.uint32, n), want)


CONVERT = """
.visible .entry conv(.param .u64 out, .param .u64 inp)
{
  .local .align 8 .b8 scratch[16];
  .shared .align 4 .u32 cell[32];
  .reg .pred %p<2>;
  .reg .b16 %h<2>;
  .reg .b32 %r<12>;
  .reg .b64 %rd<12>;
  .reg .f32 %f<6>;
  .reg .f64 %fd<3>;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd2, [inp];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
  cvt.rzi.s32.f32 %r2, %f1;                    // truncation
  cvt.rni.s32.f32 %r3, %f1;                    // round half even
  cvt.rmi.s8.f32 %r4, %f1;                     // floor, saturated to int8, sign-extended
  cvt.rn.f16.f32 %h1, %f1;
  cvt.f32.f16 %f2, %h1;
  cvt.rn.bf16.f32 %h1, %f1;
  cvt.u32.u16 %r5, %h1;
  cvt.f64.f32 %fd1, %f1;
  mul.f64 %fd2, %fd1, 0d4000000000000000;      // * 2.0
  cvt.rn.f32.f64 %f3, %fd2;
  // through local memory and through shared memory by a generic address
  st.local.f32 [scratch+4], %f3;
  ld.local.f32 %f4, [scratch+4];
  mov.u64 %rd5, cell;
  add.s64 %rd6, %rd5, %rd3;
  cvta.shared.u64 %rd7, %rd6;
  st.u32 [%rd7], %r2;
  ld.shared.u32 %r6, [%rd6];
  mul.wide.u32 %rd8, %r1, 24;
  add.s64 %rd9, %rd1, %rd8;
  st.global.s32 [%rd9], %r6;
  st.global.s32 [%rd9+4], %r3;
  st.global.s32 [%rd9+8], %r4;
  st.global.f32 [%rd9+12], %f2;
  st.global.u32 [%rd9+16], %r5;
  st.global.f32 [%rd9+20], %f4;
}
"""


def test_conversions_local_and_shared_generic_addressing():
    x = np.array([1.5, 2.5, -1.5, -2.7, 300.2, -300.2, 0.1, 65504.0, 1e5, -1e5, 3.3e-5, 7.77] * 2,
                 np.float32)
    n = x.size
    mem = NumpyMemory()
    inp, out = mem.alloc(x), mem.alloc(n * 24)
    launch(CONVERT, "conv", (1, 1, 1), (n, 1, 1), "<QQ", out, inp, mem=mem)
    got = mem.read(out, np.uint32, n * 6).reshape(n, 6)
    i32 = got.view(np.int32)
    np.testing.assert_array_equal(i32[:, 0], np.trunc(x).astype(np.int32))
    np.testing.assert_array_equal(i32[:, 1], np.rint(x).astype(np.int32))
    np.testing.assert_array_equal(i32[:, 2], np.clip(np.floor(x), -128, 127).astype(np.int32))
    with np.errstate(over="ignore"):  # 1e5 rounds to inf in float16, as cvt.rn does
        np.testing.assert_array_equal(got[:, 3].view(np.float32), x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(got[:, 4], f32_to_bf16_bits(x).astype(np.uint32))
    np.testing.assert_array_equal(got[:, 5].view(np.float32), x * np.float32(2))


def test_int_division_shifts_and_wide_multiplies():
    src = """
.visible .entry ints(.param .u64 out, .param .u64 a, .param .u64 b)
{
  .reg .b32 %r<12>;
  .reg .b64 %rd<12>;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd2, [a];
  ld.param.u64 %rd3, [b];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd4, %r1, 4;
  add.s64 %rd5, %rd2, %rd4;
  add.s64 %rd6, %rd3, %rd4;
  ld.global.s32 %r2, [%rd5];
  ld.global.s32 %r3, [%rd6];
  div.s32 %r4, %r2, %r3;
  rem.s32 %r5, %r2, %r3;
  and.b32 %r6, %r3, 31;
  shr.s32 %r7, %r2, %r6;
  shr.u32 %r8, %r2, %r6;
  shl.b32 %r9, %r2, %r6;
  mul.hi.s32 %r10, %r2, %r3;
  min.s32 %r11, %r2, %r3;
  mul.wide.u32 %rd7, %r1, 32;
  add.s64 %rd8, %rd1, %rd7;
  st.global.v4.s32 [%rd8], {%r4, %r5, %r7, %r8};
  st.global.v4.s32 [%rd8+16], {%r9, %r10, %r11, %r11};
}
"""
    a = RNG.integers(-2 ** 31, 2 ** 31, 64).astype(np.int32)
    b = RNG.integers(-100, 100, 64).astype(np.int32)
    b[b == 0] = 7
    mem = NumpyMemory()
    pa, pb, out = mem.alloc(a), mem.alloc(b), mem.alloc(64 * 32)
    launch(src, "ints", (1, 1, 1), (64, 1, 1), "<QQQ", out, pa, pb, mem=mem)
    got = mem.read(out, np.int32, 64 * 8).reshape(64, 8)
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    q = np.trunc(a64 / b64).astype(np.int64)
    sh = (b & 31).astype(np.int64)
    np.testing.assert_array_equal(got[:, 0], q)
    np.testing.assert_array_equal(got[:, 1], a64 - q * b64)
    np.testing.assert_array_equal(got[:, 2], a64 >> sh)
    np.testing.assert_array_equal(got[:, 3].view(np.uint32), a.view(np.uint32) >> sh.astype(np.uint32))
    np.testing.assert_array_equal(got[:, 4], ((a64 << sh) & 0xFFFFFFFF).astype(np.uint32).view(np.int32))
    np.testing.assert_array_equal(got[:, 5], (a64 * b64) >> 32)
    np.testing.assert_array_equal(got[:, 6], np.minimum(a, b))


# ---------------------------------------------------------------------- errors
SHUFFLE = """
.visible .entry shuffle(.param .u64 out, .param .u32 lane_mask)
{
  .reg .pred %p<2>;
  .reg .b32 %r<6>;
  .reg .b64 %rd<4>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [out];
  ld.param.u32 %r1, [lane_mask];
  mov.u32 %r2, %tid.x;
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mad.lo.u32 %r5, %r3, %r4, %r2;
  cvt.rn.f32.u32 %f1, %r5;
  // odd threads take a branch (to the next line), even ones fall through: the warp meets at JOIN
  and.b32 %r3, %r5, 1;
  setp.eq.u32 %p1, %r3, 1;
  @%p1 bra JOIN;
JOIN:
  shfl.sync.bfly.b32 %f2|%p1, %f1, %r1, 0x1f, 0xffffffff;
  mul.wide.u32 %rd2, %r5, 4;
  add.s64 %rd3, %rd1, %rd2;
  st.global.f32 [%rd3], %f2;
}
"""


def test_shuffle_butterfly_reads_the_partner_lane_of_the_same_warp():
    blocks, threads = 3, 64
    for lane_mask in (1, 5, 16, 31):
        mem = NumpyMemory()
        out = mem.alloc(blocks * threads * 4)
        launch(SHUFFLE, "shuffle", (blocks, 1, 1), (threads, 1, 1), "<QI", out, lane_mask, mem=mem)
        gid = np.arange(blocks * threads)
        np.testing.assert_array_equal(mem.read(out, np.float32, gid.size), gid ^ lane_mask)
    # part of a warp at a shuffle, a partial membermask, blocks that are not whole warps: all refused
    mem = NumpyMemory()
    out = mem.alloc(64 * 4)
    store = "st.global.f32 [%rd3], %f2;"
    partial = SHUFFLE.replace("@%p1 bra JOIN;\nJOIN:", "@%p1 bra DONE;").replace(store, store + "\nDONE:")
    with pytest.raises(PTXError, match="only part of a warp"):
        launch(partial, "shuffle", (1, 1, 1), (64, 1, 1), "<QI", out, 1, mem=mem)
    with pytest.raises(PTXError, match="whole warps"):
        launch(SHUFFLE, "shuffle", (1, 1, 1), (48, 1, 1), "<QI", out, 1, mem=mem)
    with pytest.raises(PTXError, match="membermask"):
        PTXModule(HEADER + SHUFFLE.replace("0xffffffff", "0x0000ffff"))
    with pytest.raises(PTXError, match="unsupported modifier .down for shfl"):
        PTXModule(HEADER + SHUFFLE.replace("shfl.sync.bfly", "shfl.sync.down"))


def test_unknown_instruction_raises_naming_the_line():
    src = HEADER + (".visible .entry bad()\n{\n  .reg .b32 %r<2>;\n  mov.u32 %r0, 1;\n"
                    "  frobnicate.u32 %r1, %r0;\n}\n")
    with pytest.raises(PTXError, match=r"bad: line 8: 'frobnicate.u32 %r1, %r0;'.*unknown instruction"):
        PTXModule(src)
    with pytest.raises(PTXError, match=r"line 7: 'mov.u32 %r9, 1;'.*undeclared register"):
        PTXModule(src.replace("mov.u32 %r0, 1", "mov.u32 %r9, 1"))


def test_misaligned_access_raises_naming_the_line():
    src = """
.visible .entry mis(.param .u64 p)
{
  .reg .b64 %rd<3>;
  .reg .f32 %f<2>;
  ld.param.u64 %rd1, [p];
  add.s64 %rd2, %rd1, 2;
  ld.global.f32 %f1, [%rd2];
}
"""
    mem = NumpyMemory()
    buf = mem.alloc(64)
    with pytest.raises(PTXError, match=r"mis: line 11: 'ld.global.f32 %f1, \[%rd2\];'.*misaligned 4-byte"):
        launch(src, "mis", (1, 1, 1), (4, 1, 1), "<Q", buf, mem=mem)


def test_memory_fault_endless_loop_and_divergent_barrier():
    oob = """
.visible .entry oob(.param .u64 p)
{
  .reg .b64 %rd<3>;
  .reg .f32 %f<2>;
  ld.param.u64 %rd1, [p];
  add.s64 %rd2, %rd1, 4096;
  ld.global.f32 %f1, [%rd2];
}
"""
    mem = NumpyMemory()
    buf = mem.alloc(64)
    with pytest.raises(MemoryFault, match="past the end"):
        launch(oob, "oob", (1, 1, 1), (1, 1, 1), "<Q", buf, mem=mem)
    spin = ".visible .entry spin()\n{\nL:\n  bra L;\n}\n"
    with pytest.raises(PTXError, match=r"spin: line 7: 'bra L;'.*max_steps=1000"):
        launch(spin, "spin", (1, 1, 1), (32, 1, 1), "<", max_steps=1000)
    split = """
.visible .entry split()
{
  .reg .pred %p<2>;
  .reg .b32 %r<2>;
  mov.u32 %r1, %tid.x;
  setp.lt.u32 %p1, %r1, 16;
  @%p1 bra OVER;
  bar.sync 0;
OVER:
  ret;
}
"""
    with pytest.raises(PTXError, match=r"split: line 12: 'bar.sync 0;'.*only part of block"):
        launch(split, "split", (1, 1, 1), (32, 1, 1), "<")
    # threads that exited do not hold a barrier up
    launch(split.replace("@%p1 bra OVER", "@%p1 ret"), "split", (2, 1, 1), (32, 1, 1), "<")


def test_module_cache_and_launch_checks():
    m1, m2 = PTXModule(HEADER + DIVERGE), PTXModule(HEADER + DIVERGE)
    assert m1.entries is m2.entries  # parsed once per source text
    with pytest.raises(PTXError, match="needs 12"):
        m1.launch("diverge", (1, 1, 1), (1, 1, 1), b"\0" * 8, NumpyMemory())
    with pytest.raises(PTXError, match="no entry named 'nope'"):
        m1.launch("nope", (1, 1, 1), (1, 1, 1), b"", NumpyMemory())


# ---------------------------------------------------------------------- renderer basics
def test_param_layout_launch_dims_and_text():
    n = Variable("n", 1, 40)
    x = Tensor(np.arange(40, dtype=np.float32))
    items, _ = create_schedule([(x.shrink(((0, n.bind(7)),)) + 1).uop])  # 1.0 stays a literal
    prog = PTXRenderer("sm_80").lower(items[-1].ast, "k")  # type: ignore[arg-type]
    text = PTXRenderer("sm_80").render(prog)
    assert [g.arg for g in prog.globals] == [0, 1] and len(prog.variables) == 1
    assert param_layout(prog) == [("k_param_0", 0, 8), ("k_param_1", 8, 8), ("k_param_2", 16, 8)]
    assert ".target sm_80" in text and ".param .s64 k_param_2" in text and ".visible .entry k(" in text
    assert launch_dims(1) == ((1, 1, 1), (THREADS_PER_BLOCK, 1, 1))
    assert launch_dims(THREADS_PER_BLOCK * 3 + 1) == ((4, 1, 1), (THREADS_PER_BLOCK, 1, 1))
    assert reg_class(dtypes.int8) == "b32" and reg_class(dtypes.bool) == "pred"


def test_gpu_lowering_has_no_tiles_and_every_output_axis_global():
    a = Tensor(RNG.standard_normal((16, 32), np.float32))
    b = Tensor(RNG.standard_normal((32, 16), np.float32))
    items, _ = create_schedule([(a @ b).uop])
    prog = PTXRenderer().lower(items[-1].ast, "mm")  # type: ignore[arg-type]
    assert prog.opts.upcast == {} and prog.global_size == 16 * 16
    assert [st.arg[1] for st in prog.statements if st.op is Ops.RANGE] == ["global", "reduce"]


def _gpu_kernel(t: Tensor) -> tuple[Any, str]:
    """The last kernel of `t`'s schedule lowered for the GPU, and its PTX."""
    items, _ = create_schedule([t.uop])
    prog = PTXRenderer().lower(items[-1].ast, "k")  # type: ignore[arg-type]
    return prog, PTXRenderer().render(prog)


def _memory_ops(text: str) -> list[str]:
    """The ld.global/st.global instructions of a kernel, with their types, in order."""
    return re.findall(r"\b((?:ld|st)\.global\.[\w.]+)", text)


def test_contiguous_elementwise_uses_16_byte_vector_loads_and_stores():
    a, b, c = (RNG.standard_normal((8, 64), np.float32) for _ in range(3))
    prog, text = _gpu_kernel(Tensor(a) * Tensor(b) + Tensor(c))
    assert prog.global_size == 8 * 64 // 4 and len(prog.vector_groups) == 4  # the stores + 3 inputs
    assert _memory_ops(text) == ["ld.global.v4.f32"] * 3 + ["st.global.v4.f32"]
    (got,) = run_on_ptx(Tensor(a) * Tensor(b) + Tensor(c))
    np.testing.assert_array_equal(got, a * b + c)


def test_vector_loads_only_where_consecutive_and_aligned():
    x = RNG.standard_normal((8, 12)).astype(np.float32)
    row = RNG.standard_normal(12).astype(np.float32)
    t = Tensor(x)
    cases = {  # tensor, numpy reference, expected loads of the input
        "aligned shrink": (t[:, 4:12] * 2, x[:, 4:12] * 2, ["ld.global.v4.f32"]),
        "shrink by 1": (t[:, 1:9] * 2, x[:, 1:9] * 2, ["ld.global.f32"] * 4),  # index 1 mod 4: scalar
        "transpose": (t.T + 1, x.T + 1, ["ld.global.f32"] * 4),  # lanes 12 elements apart
        "broadcast row": (t + Tensor(row), x + row, ["ld.global.v4.f32"] * 2),
        "broadcast column": (t * t[:, :1], x * x[:, :1], ["ld.global.v4.f32", "ld.global.f32"]),
    }
    for name, (tensor, ref, loads) in cases.items():
        prog, text = _gpu_kernel(tensor)
        assert _memory_ops(text) == loads + ["st.global.v4.f32"], name
        np.testing.assert_array_equal(ptx1(tensor), ref, err_msg=name)
    # padding: the masked loads stay scalar and predicated; the stores are still one vector
    padded = t.pad(((0, 0), (1, 3))) + 1
    _, text = _gpu_kernel(padded)
    assert "st.global.v4.f32" in text and "ld.global.v4" not in text and "@%p" in text
    np.testing.assert_array_equal(ptx1(padded), np.pad(x, ((0, 0), (1, 3))) + 1)


def test_no_vector_access_where_it_cannot_apply():
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    cases = {
        "last axis not a multiple of 4": Tensor(x) + 1,
        "16-bit output": Tensor(np.ones((4, 8), np.float32)).half() * 2,
        "reduce": Tensor(x).sum(1),
    }
    for name, tensor in cases.items():
        prog, text = _gpu_kernel(tensor)
        assert prog.vector_groups == [] and ".v4" not in text and prog.opts.upcast == {}, name
    n = Variable("n", 1, 64).bind(24)  # a symbolic last axis: its size is not known to divide by 4
    prog, text = _gpu_kernel(Tensor(np.ones(64, np.float32)).shrink(((0, n),)) + 1)
    assert prog.vector_groups == [] and ".v4" not in text


def test_noopt_turns_vector_access_off(monkeypatch):
    monkeypatch.setenv("NOOPT", "1")
    prog, text = _gpu_kernel(Tensor(np.ones((4, 8), np.float32)) + 1)
    assert prog.global_size == 32 and _memory_ops(text) == ["ld.global.f32", "st.global.f32"]


def test_vector_access_with_a_symbolic_leading_axis_and_int32():
    n = Variable("rows", 1, 6)
    x = RNG.integers(-100, 100, (6, 8)).astype(np.int32)
    t = Tensor(x).shrink(((0, n.bind(3)), None)) * 3
    prog, text = _gpu_kernel(t)
    assert _memory_ops(text) == ["ld.global.v4.s32", "st.global.v4.s32"]
    np.testing.assert_array_equal(ptx1(t), x[:3] * 3)


def test_row_reductions_split_each_output_across_a_warp_or_a_block():
    bias = RNG.standard_normal(6).astype(np.float32)
    for cols, group in ((512, WARP_SIZE), (4096, THREADS_PER_BLOCK)):  # long rows get the whole block
        x = RNG.standard_normal((6, cols)).astype(np.float32)
        t = Tensor(x).sum(1) + Tensor(bias)  # the bias is read after the combine: one lane stores
        prog, text = _gpu_kernel(t)
        assert prog.group_size == group and prog.global_size == 6 * group
        assert sum(st.op is Ops.GROUP_COMBINE for st in prog.statements) == 1
        assert text.count("shfl.sync.bfly.b32") == 5  # butterfly inside each warp
        if group == WARP_SIZE:
            assert "bar.sync" not in text and ".shared" not in text
        else:  # then the 4 warps' results through shared memory
            assert ".shared .align 8 .b8 k_group[32]" in text and text.count("bar.sync 0") == 2
        assert re.search(r"@%p\d+ st\.global\.f32", text)  # the store is gated on lane 0 of the group
        np.testing.assert_allclose(ptx1(t), x.sum(1) + bias, rtol=1e-5, atol=1e-4)


def test_group_reductions_for_every_reduce_op_and_shape():
    x = RNG.standard_normal((3, 4, 256)).astype(np.float32)
    w = RNG.standard_normal((40, 256)).astype(np.float32)
    v = RNG.standard_normal((2, 256)).astype(np.float32)
    ints = RNG.integers(-1000, 1000, (5, 384)).astype(np.int32)
    table = RNG.standard_normal((11, 256)).astype(np.float32)
    idx = np.array([0, 10, 3, 7], np.int32)
    heads = RNG.standard_normal((4, 3, 64)).astype(np.float32)
    long_rows = RNG.standard_normal((3, 2048))
    long_rows32 = long_rows.astype(np.float32)
    t = Tensor(x)
    cases = {  # tensor, reference, tolerance
        "max": (t.max(axis=2), x.max(2), 0),
        "min of negatives": (-(-t).max(axis=2), x.min(2), 0),
        "sum over two axes": (t.sum((1, 2)), x.sum((1, 2)), 1e-4),
        "full sum": (t.sum(), x.sum(), 1e-3),
        "matrix-vector, weights (out, in)": (Tensor(v) @ Tensor(w).T, v @ w.T, 1e-4),
        "int32 sum": (Tensor(ints).sum(1), ints.sum(1, dtype=np.int32), 0),
        "float16 mean": (Tensor(x).half().mean(2), x.astype(np.float16).astype(np.float32).mean(2), 2e-3),
        # 64-bit accumulators cross lanes as two 32-bit shuffles
        "float64 sum": (Tensor(x.astype(np.float64)).sum(2), x.astype(np.float64).sum(2), 1e-12),
        "int64 max": (Tensor(ints.astype(np.int64) << 20).max(axis=1), (ints.astype(np.int64) << 20).max(1),
                      0),
        # an embedding lookup fused into the reduce (GPT-2's first layer norm)
        "sum of gathered rows": (Tensor(idx).embedding(Tensor(table)).sum(1), table[idx].sum(1), 1e-4),
        # heads merged back (a reshape of a permuted view: no single stride along the reduce) times weights
        "merged heads @ weights": (Tensor(heads).permute(1, 0, 2).reshape(3, 256) @ Tensor(w).T,
                                   heads.transpose(1, 0, 2).reshape(3, 256) @ w.T, 1e-4),
        # long rows: block groups, 64-bit accumulators through shared memory too
        "float64 sum of long rows": (Tensor(long_rows).sum(1), long_rows.sum(1), 1e-12),
        "max of long rows": (Tensor(long_rows32).max(axis=1), long_rows32.max(1), 0),
    }
    for name, (tensor, ref, tol) in cases.items():
        prog, _ = _gpu_kernel(tensor)
        assert prog.group_size == (THREADS_PER_BLOCK if "long rows" in name else WARP_SIZE), name
        np.testing.assert_allclose(ptx1(tensor), ref, rtol=tol, atol=tol, err_msg=name)


def test_reductions_that_stay_one_thread_per_output():
    x = RNG.standard_normal((512, 8)).astype(np.float32)
    cases = {
        "strided along the reduce (column sums read coalesced across outputs)": Tensor(x).sum(0),
        "reduce axis not a multiple of the group": Tensor(x.reshape(16, 256)[:, :200]).sum(1),
        "matmul with a row-major right operand": Tensor(x.T.copy()) @ Tensor(x),
    }
    for name, tensor in cases.items():
        prog, text = _gpu_kernel(tensor)
        assert prog.group_size == 1 and "bar.sync" not in text, name
    n = Variable("k", 128, 512).bind(256)  # a symbolic reduce length
    prog, _ = _gpu_kernel(Tensor(np.ones(512, np.float32)).shrink(((0, n),)).sum())
    assert prog.group_size == 1


def test_group_reduction_with_a_symbolic_output_axis(monkeypatch):
    rows = Variable("rows", 1, 8)
    x = RNG.standard_normal((8, 256)).astype(np.float32)
    t = Tensor(x).shrink(((0, rows.bind(5)), None)).sum(1)
    prog, _ = _gpu_kernel(t)
    assert prog.group_size == WARP_SIZE and isinstance(prog.global_size, UOp)
    np.testing.assert_allclose(ptx1(t), x[:5].sum(1), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("NOOPT", "1")
    assert _gpu_kernel(Tensor(x).sum(1))[0].group_size == 1


# ---------------------------------------------------------------------- scheduler kernels, run as PTX
FLOAT_DTYPES = [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64]


def _round(x: np.ndarray, dt: DType) -> np.ndarray:
    return bf16(x) if dt == dtypes.bfloat16 else np.asarray(x).astype(dt.np)


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
def test_float_elementwise(dt):
    a = _round(RNG.uniform(-3, 3, (5, 37)).astype(np.float32), dt)
    b = _round(RNG.uniform(0.5, 3, (37,)).astype(np.float32), dt)
    ta, tb = Tensor(a, dtype=dt), Tensor(b, dtype=dt)
    got = run_on_ptx(ta * tb - ta / tb, (ta + 1).maximum(tb), tb.sqrt(), -ta, tb.reciprocal())
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    refs = [a64 * b64 - a64 / b64, np.maximum(a64 + 1, b64), np.sqrt(b64), -a64, 1 / b64]
    tol = {dtypes.float32: 1e-6, dtypes.float64: 1e-12, dtypes.float16: 2e-3, dtypes.bfloat16: 2e-2}[dt]
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g.astype(np.float64), np.broadcast_to(r, g.shape), rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint32,
                                dtypes.int64, dtypes.uint64], ids=str)
def test_int_elementwise_wraps_and_divides_like_c(dt):
    info = np.iinfo(dt.np)
    a = RNG.integers(max(info.min, -1000), min(info.max, 1000), (4, 33)).astype(dt.np)
    b = RNG.integers(max(info.min, -9), min(info.max, 9), (33,)).astype(dt.np)
    b[0] = 0  # x // 0 and x % 0 are 0
    ta, tb = Tensor(a), Tensor(b)
    got = run_on_ptx(ta * tb + ta, ta // tb, ta % tb, ta.fmod(tb), ta.maximum(tb), ta ^ tb,
                     (ta < tb).where(ta, tb))
    with np.errstate(all="ignore"):
        safe = np.where(b == 0, 1, b).astype(dt.np)
        zero = b == 0
        refs = [(a * b + a), np.where(zero, 0, a // safe), np.where(zero, 0, np.mod(a, safe)),
                np.where(zero, 0, np.fmod(a, safe)), np.maximum(a, b), a ^ b, np.where(a < b, a, b)]
    for g, ref in zip(got, refs):
        np.testing.assert_array_equal(g, np.asarray(ref).astype(dt.np))


def test_bool_logic_comparisons_and_where():
    a = RNG.standard_normal((6, 21)).astype(np.float32)
    b = RNG.standard_normal((21,)).astype(np.float32)
    ta, tb = Tensor(a), Tensor(b)
    p, q = ta < tb, ta > 0
    got = run_on_ptx(p & q, p | ~q, p ^ q, (ta == tb) | (ta != ta), p.where(ta, tb * 2), p.cast(dtypes.int32))
    pn, qn = a < b, a > 0
    refs = [pn & qn, pn | ~qn, pn ^ qn, (a == b) | (a != a), np.where(pn, a, b * 2), pn.astype(np.int32)]
    for g, r in zip(got, refs):
        np.testing.assert_array_equal(g, np.broadcast_to(r, g.shape))


def test_casts_between_dtype_families():
    x = np.array([-300.7, -128.5, -1.5, -0.4, 0.0, 0.6, 1.5, 127.2, 200.9, 1e4, 30000.5, 3.3], np.float32)
    t = Tensor(x)
    got = run_on_ptx(t.cast(dtypes.int32), t.cast(dtypes.int16), t.cast(dtypes.float16),
                     t.cast(dtypes.bfloat16), t.cast(dtypes.float64), t.cast(dtypes.bool),
                     t.cast(dtypes.int32).cast(dtypes.int8),
                     t.cast(dtypes.int32).cast(dtypes.uint8).cast(dtypes.float32), t.cast(dtypes.int64),
                     t.bitcast(dtypes.int32), t.cast(dtypes.float16).bitcast(dtypes.int16))
    i32 = np.trunc(x).astype(np.int32)
    with np.errstate(all="ignore"):
        refs = [i32, np.trunc(x).astype(np.int16), x.astype(np.float16), bf16(x), x.astype(np.float64),
                x != 0, i32.astype(np.int8), i32.astype(np.uint8).astype(np.float32),
                np.trunc(x).astype(np.int64), x.view(np.int32), x.astype(np.float16).view(np.int16)]
    for g, r in zip(got, refs):
        np.testing.assert_array_equal(g, r)


def test_reductions_sum_max_full_and_half_precision():
    x = RNG.standard_normal((7, 45)).astype(np.float32)
    t = Tensor(x)
    h = Tensor(x.astype(np.float16))
    i = Tensor((x * 10).astype(np.int32))
    got = run_on_ptx(t.sum(1), t.max(axis=0), t.sum(), h.sum(0), i.sum(1), (t > 0).any(1), t.min(axis=1))
    refs = [x.sum(1), x.max(0), x.sum(), x.astype(np.float16).astype(np.float32).sum(0).astype(np.float16),
            (x * 10).astype(np.int32).sum(1), (x > 0).any(1), x.min(1)]
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g, r, rtol=2e-3 if g.dtype == np.float16 else 1e-5, atol=1e-4)


def test_softmax_pieces_exp_log_sin():
    x = RNG.standard_normal((5, 19)).astype(np.float32)
    t = Tensor(x)
    got = run_on_ptx(t.softmax(1), t.log_softmax(1), t.exp(), (t.abs() + 0.1).log(), t.sin(),
                     (t.abs() + 0.5) ** Tensor(np.float32(1.7)), Tensor(x.astype(np.float64)).exp())
    e = np.exp(x - x.max(1, keepdims=True))
    refs = [e / e.sum(1, keepdims=True), np.log(e / e.sum(1, keepdims=True)), np.exp(x),
            np.log(np.abs(x) + 0.1), np.sin(x), (np.abs(x) + 0.5) ** 1.7, np.exp(x.astype(np.float64))]
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_matmul_odd_sizes():
    a = RNG.standard_normal((17, 33)).astype(np.float32)
    b = RNG.standard_normal((33, 9)).astype(np.float32)
    (got,) = run_on_ptx(Tensor(a) @ Tensor(b))
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_movement_ops_permute_pad_shrink_expand_flip():
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    t = Tensor(x)
    got = run_on_ptx(t.permute(2, 0, 1) + 1, t.pad(((1, 0), (0, 2), (2, 1))) * 2,
                     t.shrink(((1, 3), None, (1, 4))), t[:, :1, :].expand(3, 6, 5) - 1, t.flip(1),
                     t.permute(1, 2, 0).pad(((0, 0), (1, 1), (0, 0))).sum(2))
    refs = [np.transpose(x, (2, 0, 1)) + 1, np.pad(x, ((1, 0), (0, 2), (2, 1))) * 2, x[1:3, :, 1:4],
            np.broadcast_to(x[:, :1, :], (3, 6, 5)) - 1, x[:, ::-1], np.pad(np.transpose(x, (1, 2, 0)),
                                                                           ((0, 0), (1, 1), (0, 0))).sum(2)]
    for g, r in zip(got, refs):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", [1, 5, 8])
def test_symbolic_variable_shape(n):
    x_np = np.linspace(-1, 1, 8, dtype=np.float32)
    w_np = np.arange(8, dtype=np.float32)
    v = Variable("n", 1, 8).bind(n)
    x, w = Tensor(x_np), Tensor(w_np)
    got = run_on_ptx((x + w).shrink(((0, v),)) * 3, x.shrink(((0, v),)).sum())
    np.testing.assert_allclose(got[0], ((x_np + w_np) * np.float32(3))[:n], rtol=1e-6)
    np.testing.assert_allclose(got[1], x_np[:n].sum(), rtol=1e-5, atol=1e-6)


def test_pow_shifts_wrapping_and_nan_max():
    xi = np.array([-3, -2, -1, 0, 1, 2, 3, 5, 7, 11, -7, 2], np.int32)
    ei = np.array([0, 1, 2, 3, 5, 7, 11, 3, 2, 1, -1, -2], np.int32)
    xf = np.array([-2.0, -2.0, -0.5, 0.0, 0.0, 1.0, 2.5, 3.0, -1.0, 4.0, 1.7, 9.0], np.float32)
    ef = np.array([3.0, 2.0, 0.5, 2.0, 0.0, np.nan, -1.5, 0.0, 7.0, 0.5, 2.2, -0.5], np.float32)
    i8 = np.array([100, -100, 127, -128, 5, 60, -1, 0, 90, 33, -77, 64], np.int8)
    u8 = np.array([200, 100, 255, 0, 7, 128, 1, 2, 250, 3, 99, 64], np.uint8)
    fn = np.array([1.0, np.nan, -np.inf, 2.0, np.nan, 0.0, -0.0, 5.0, 1.0, 3.0, -1.0, 7.0], np.float32)
    gn = np.array([np.nan, 1.0, 3.0, np.inf, np.nan, -1.0, 1.0, 4.0, 2.0, 3.0, -2.0, 8.0], np.float32)
    ti8, tu8, tfn = Tensor(i8), Tensor(u8), Tensor(fn)
    got = run_on_ptx(Tensor(xi) ** Tensor(ei), Tensor(xf) ** Tensor(ef), ti8 + ti8, ti8 * 3, tu8 + tu8, -ti8,
                     Tensor(xi) << 3, Tensor(xi) >> 1, tu8 >> 2, tfn.maximum(Tensor(gn)), ~ti8, tfn.trunc())
    inv = np.where(xi == 1, 1, np.where(xi == -1, np.where(ei % 2 == 0, 1, -1), 0))
    with np.errstate(all="ignore"):
        refs = [np.where(ei < 0, inv, xi.astype(np.int64) ** np.maximum(ei, 0)).astype(np.int32),
                np.power(xf, ef), i8 + i8, i8 * np.int8(3), u8 + u8, -i8, xi << 3, xi >> 1, u8 >> 2,
                np.maximum(fn, gn), ~i8, np.trunc(fn)]
    for g, r in zip(got, refs):
        assert g.dtype == r.dtype
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, r, rtol=1e-6)
        else:
            np.testing.assert_array_equal(g, r)


def test_embedding_gather_rows():
    table = RNG.standard_normal((11, 6)).astype(np.float32)
    idx = np.array([[0, 10, 3], [-1, 7, 2]], np.int32)
    (got,) = run_on_ptx(Tensor(idx).embedding(Tensor(table)) * 2)
    np.testing.assert_allclose(got, table[idx] * 2, rtol=1e-6)


def _ulp_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest error in units of the last place of the float64 reference (0 where both are equal)."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    ulp = np.spacing(np.abs(want).astype(np.float64))
    err = np.where(same, 0.0, np.abs(got - want) / np.where(ulp > 0, ulp, np.finfo(np.float64).tiny))
    return float(err.max())


def test_float64_transcendentals_are_double_precision():
    rng = np.random.default_rng(5)
    x_exp = np.concatenate([rng.uniform(-60, 60, 400), [-1074.5, -1030.2, -1022.0, -0.0, 0.0, 0.5, 1023.9,
                                                        1024.0, 2000.0, -2000.0, np.inf, -np.inf, np.nan]])
    x_log = np.concatenate([np.exp(rng.uniform(-700, 700, 400)), [5e-324, 1e-310, 2.0 ** -1022, 1.0, 2.0,
                                                                  np.sqrt(2.0), 0.0, -1.0, np.inf, np.nan]])
    x_sin = np.concatenate([rng.uniform(-1e4, 1e4, 400), rng.uniform(-4, 4, 100),
                            [0.0, np.pi / 2, -np.pi, 1e6 + 0.25, np.inf, np.nan]])
    exp2, log2, sin = run_on_ptx(Tensor(x_exp).exp2(), Tensor(x_log).log2(), Tensor(x_sin).sin())
    with np.errstate(all="ignore"):
        assert _ulp_error(exp2, np.exp2(x_exp)) <= 4
        assert _ulp_error(log2, np.log2(x_log)) <= 4
        finite = np.isfinite(x_sin)
        np.testing.assert_allclose(sin[finite], np.sin(x_sin[finite]), rtol=0, atol=4e-16 * 1e4)
        small = np.abs(x_sin) <= 4
        assert _ulp_error(sin[small], np.sin(x_sin[small])) <= 4
    assert np.isnan(sin[~np.isfinite(x_sin)]).all()
