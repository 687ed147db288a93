"""The PTX interpreter's adversarial checks: warps run one at a time between barriers with a shared-memory
race detector (a misplaced or missing bar.sync is reported, though lockstep lanes would compute the right
answer), and approximate instructions off by the error bounds the PTX ISA documents, with .ftz honoured."""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.renderer.ptx import PTXRenderer, launch_dims, param_layout
from rawgrad.compiler.target import NV_SM90
from rawgrad.drivers.nv.mock.ptx_interp import (
    DIV_APPROX_MAX_ULP,
    EX2_MAX_ULP,
    LG2_MAX_ABS_ERROR,
    LG2_MAX_REL_ERROR,
    RCP_APPROX_MAX_ULP,
    RSQRT_MAX_REL_ERROR,
    SIN_COS_FAR_ABS_ERROR,
    SIN_COS_NEAR_ABS_ERROR,
    NumpyMemory,
    PTXError,
    PTXModule,
    warp_order,
)
from rawgrad.tensor.buffers import buffer_numpy, is_allocated
from rawgrad.tensor.schedule import create_schedule

HEADER = ".version 7.8\n.target sm_90\n.address_size 64\n"
RNG = np.random.default_rng(7)
THREADS = 128  # 4 warps per block
RACE = "shared-memory race in block 0: "

# ---------------------------------------------------------------------- shared-memory reduction
# Block sums of 128 values: every thread puts its value in buf[tid]; B0; threads < 64 add buf[tid + 64]
# (written by warps 2 and 3) into buf[tid]; B1; threads < 32 add buf[tid + 32] (written by warp 1); B2;
# thread 0 adds up buf[0..31] (warp 0's own bytes) and stores the block's sum.
BLOCK_REDUCE = """
.visible .entry block_reduce(.param .u64 out, .param .u64 inp)
{
  .shared .align 4 .f32 buf[128];
  .reg .pred %p<4>;
  .reg .b32 %r<8>;
  .reg .b64 %rd<12>;
  .reg .f32 %f<8>;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd2, [inp];
  mov.u32 %r1, %tid.x;
  mov.u32 %r2, %ctaid.x;
  mad.lo.u32 %r3, %r2, 128, %r1;
  mul.wide.u32 %rd3, %r3, 4;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
  mov.u64 %rd5, buf;
  mul.wide.u32 %rd6, %r1, 4;
  add.s64 %rd7, %rd5, %rd6;
  st.shared.f32 [%rd7], %f1;
  bar.sync 0; // B0
  setp.lt.u32 %p1, %r1, 64;
  @%p1 ld.shared.f32 %f2, [%rd7+256];
  @%p1 ld.shared.f32 %f3, [%rd7];
  @%p1 add.f32 %f3, %f3, %f2;
  @%p1 st.shared.f32 [%rd7], %f3;
  bar.sync 0; // B1
  setp.lt.u32 %p2, %r1, 32;
  @%p2 ld.shared.f32 %f4, [%rd7+128];
  @%p2 ld.shared.f32 %f5, [%rd7];
  @%p2 add.f32 %f5, %f5, %f4;
  @%p2 st.shared.f32 [%rd7], %f5;
  bar.sync 0; // B2
  setp.ne.u32 %p3, %r1, 0;
  @%p3 ret;
  mov.f32 %f6, 0f00000000;
  mov.u32 %r4, 0;
SUM:
  ld.shared.f32 %f7, [%rd5];
  add.f32 %f6, %f6, %f7;
  add.s64 %rd5, %rd5, 4;
  add.u32 %r4, %r4, 1;
  setp.lt.u32 %p3, %r4, 32;
  @%p3 bra SUM;
  mul.wide.u32 %rd8, %r2, 4;
  add.s64 %rd9, %rd1, %rd8;
  st.global.f32 [%rd9], %f6;
  ret;
}
"""
STEP2_LOADS = "  @%p2 ld.shared.f32 %f4, [%rd7+128];\n  @%p2 ld.shared.f32 %f5, [%rd7];\n"


def _block_sums(src: str, blocks: int = 6, **kw: object) -> tuple[np.ndarray, np.ndarray]:
    x = RNG.integers(-50, 50, blocks * THREADS).astype(np.float32)  # small integers: any order sums exactly
    mem = NumpyMemory()
    inp, out = mem.alloc(x), mem.alloc(blocks * 4)
    params = struct.pack("<QQ", out, inp)
    PTXModule(HEADER + src).launch("block_reduce", (blocks, 1, 1), (THREADS, 1, 1), params, mem,
                                   **kw)  # type: ignore[arg-type]
    return mem.read(out, np.float32, blocks), x.reshape(blocks, THREADS).sum(1)


def test_warp_order_is_reversed_then_rotated_per_epoch():
    assert warp_order(4, 0) == [3, 2, 1, 0]
    assert warp_order(4, 1) == [2, 1, 0, 3]
    assert warp_order(4, 2, seed=1) == [0, 3, 2, 1]
    assert warp_order(1, 5) == [0]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_correct_shared_memory_reduction_passes_adversarial_scheduling(seed: int):
    got, ref = _block_sums(BLOCK_REDUCE, adversarial=True, seed=seed)
    np.testing.assert_array_equal(got, ref)


def test_barrier_moved_after_the_reads_is_reported():
    # B1 after step 2's loads: warp 0 reads buf[32..63], which warp 1 wrote in the same epoch
    moved = BLOCK_REDUCE.replace("  bar.sync 0; // B1\n", "")
    moved = moved.replace(STEP2_LOADS, STEP2_LOADS + "  bar.sync 0;\n")
    assert moved.count("bar.sync") == 3
    for adversarial in (True, False):  # the race detector runs in lockstep mode too
        with pytest.raises(PTXError, match=r"block_reduce: line 31: '@%p2 ld\.shared\.f32 %f4, "
                                           r"\[%rd7\+128\];': " + RACE + r"warp 0 reads 4 bytes at shared "
                                           r"address 0x80 and warp 1 wrote byte 0x80 at line 29 in the same "
                                           r"barrier epoch, without bar\.sync between"):
            _block_sums(moved, adversarial=adversarial)


def test_barrier_removed_is_reported():
    # without B0, warp 1 reads buf[96..127] that warp 3 (which runs first) wrote in the same epoch
    removed = BLOCK_REDUCE.replace("  bar.sync 0; // B0\n", "")
    with pytest.raises(PTXError, match=r"block_reduce: line \d+: '@%p1 ld\.shared\.f32 %f2, \[%rd7\+256\];': "
                                       + RACE + r"warp 1 reads 4 bytes at shared address 0x180 and warp 3 "
                                       r"wrote byte 0x180 at line 23"):
        _block_sums(removed, adversarial=True)


def test_a_write_after_another_warps_read_is_reported():
    # without B1, step 1 and step 2 share an epoch; seed 2 runs warp 0 first in it: it reads buf[32..63]
    # (step 2) before warp 1 writes them (step 1), so it would add stale values; the write is reported
    racy = BLOCK_REDUCE.replace("  bar.sync 0; // B1\n", "")
    assert warp_order(4, 1, seed=2)[0] == 0
    with pytest.raises(PTXError, match=r"block_reduce: line \d+: '@%p1 st\.shared\.f32 \[%rd7\], %f3;': "
                                       + RACE + r"warp 1 writes 4 bytes at shared address 0x80 and warp 0 "
                                       r"read byte 0x80 at line \d+ in the same barrier epoch"):
        _block_sums(racy, adversarial=True, seed=2)


# Every thread stores its warp index to out[0] (a global-memory race the mock does not report), then waits at
# a barrier: the value left is that of the warp that ran last.
LAST_WARP = """
.visible .entry last_warp(.param .u64 out)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [out];
  mov.u32 %r1, %warpid;
  st.global.u32 [%rd1], %r1;
  bar.sync 0;
  ret;
}
"""


def _last_warp(**kw: object) -> int:
    mem = NumpyMemory()
    out = mem.alloc(4)
    PTXModule(HEADER + LAST_WARP).launch("last_warp", (1, 1, 1), (THREADS, 1, 1), struct.pack("<Q", out), mem,
                                         **kw)  # type: ignore[arg-type]
    return int(mem.read(out, np.uint32, 1)[0])


def test_adversarial_mode_runs_warps_one_at_a_time_and_follows_the_env_var(monkeypatch: pytest.MonkeyPatch):
    for seed in range(4):
        assert _last_warp(adversarial=True, seed=seed) == warp_order(4, 0, seed)[-1]
    monkeypatch.setenv("PTX_ADVERSARIAL", "0")
    assert _last_warp() == 3  # lockstep: one store for all lanes, the highest lane's value lands last
    monkeypatch.setenv("PTX_ADVERSARIAL", "1")
    assert _last_warp() == 0  # warps 3, 2, 1, 0
    assert _last_warp(adversarial=False) == 3  # a launch's own setting wins
    assert _last_warp(seed=1) == 3  # warps 2, 1, 0, 3


def test_divergent_barrier_inside_a_warp_is_still_reported():
    split = """
.visible .entry split()
{
  .reg .pred %p<2>;
  .reg .b32 %r<2>;
  mov.u32 %r1, %tid.x;
  setp.lt.u32 %p1, %r1, 48;
  @%p1 bra OVER;
  bar.sync 0;
OVER:
  ret;
}
"""
    with pytest.raises(PTXError, match=r"split: line 12: 'bar.sync 0;'.*only part of block 0.*divergent"):
        PTXModule(HEADER + split).launch("split", (1, 1, 1), (64, 1, 1), b"", NumpyMemory(), adversarial=True)
    # whole warps that exited do not hold the barrier up
    PTXModule(HEADER + split.replace("48", "32")).launch("split", (2, 1, 1), (64, 1, 1), b"", NumpyMemory(),
                                                          adversarial=True)


# ---------------------------------------------------------------------- the compiler's block group reduction
def _compiled_row_sums(x: np.ndarray) -> tuple[str, object]:
    items, _ = create_schedule([Tensor(x).sum(1).uop])
    assert len(items) == 1 and items[0].ast is not None
    renderer = PTXRenderer()
    prog = renderer.lower(items[0].ast, "rows")
    # a block per output: shuffles, shared slots, 2 bar.sync; the launch contract names that block
    assert prog.group_size == NV_SM90.block_threads and prog.launch.local_size == (prog.group_size, 1, 1)
    return renderer.render(prog), prog


def _launch_rows(text: str, prog: object, x: np.ndarray, **kw: object) -> np.ndarray:
    mem = NumpyMemory()
    out, inp = mem.alloc(x.shape[0] * 4), mem.alloc(x)
    layout = param_layout(prog)  # type: ignore[arg-type]
    params = b"".join(struct.pack("<Q", a) for a in (out, inp))
    assert [off for _, off, _ in layout] == [0, 8]
    grid, block = launch_dims(x.shape[0] * NV_SM90.block_threads)
    PTXModule(text).launch("rows", grid, block, params, mem, **kw)  # type: ignore[arg-type]
    return mem.read(out, np.float32, x.shape[0])


def test_compiler_block_group_reduction_passes_adversarial_scheduling():
    x = RNG.standard_normal((5, 4096)).astype(np.float32)
    text, prog = _compiled_row_sums(x)
    assert text.count("bar.sync 0;") == 2 and ".shared" in text
    for seed in range(4):
        np.testing.assert_allclose(_launch_rows(text, prog, x, adversarial=True, seed=seed), x.sum(1),
                                   rtol=1e-5, atol=1e-4)


def test_compiler_block_group_reduction_with_the_first_barrier_gone_is_reported():
    # without the barrier between the slot stores and the slot loads, the one left is after the loads
    x = RNG.standard_normal((5, 4096)).astype(np.float32)
    text, prog = _compiled_row_sums(x)
    racy = text.replace("\tbar.sync 0;\n", "", 1)
    assert racy.count("bar.sync 0;") == 1
    with pytest.raises(PTXError, match=r"rows: line \d+: '@%p\d+ st\.shared\.f32 \[%rd\d+\], %f0;': " + RACE +
                                       r"warp 2 writes 4 bytes at shared address 0x10 and warp 3 read "
                                       r"byte 0x10 at line \d+ in the same barrier epoch"):
        _launch_rows(racy, prog, x, adversarial=True)


# ---------------------------------------------------------------------- approximate instructions
UNARY = """
.visible .entry unary(.param .u64 out, .param .u64 inp)
{
  .reg .b32 %r<2>;
  .reg .b64 %rd<6>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [out];
  ld.param.u64 %rd2, [inp];
  mov.u32 %r1, %tid.x;
  mul.wide.u32 %rd3, %r1, 4;
  add.s64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
  OP %f2, %f1;
  add.s64 %rd5, %rd1, %rd3;
  st.global.f32 [%rd5], %f2;
  ret;
}
"""


def _run_line(line: str, x: np.ndarray) -> tuple[np.ndarray, PTXModule]:
    """Run UNARY with `line` (reading %f1, writing %f2) on the float32 values x, one thread each."""
    x = np.asarray(x, np.float32)
    mem = NumpyMemory()
    inp, out = mem.alloc(x), mem.alloc(x.size * 4)
    mod = PTXModule(HEADER + UNARY.replace("OP %f2, %f1;", line))
    mod.launch("unary", (1, 1, 1), (x.size, 1, 1), struct.pack("<QQ", out, inp), mem)
    return mem.read(out, np.float32, x.size), mod


def _unary(op: str, x: np.ndarray) -> tuple[np.ndarray, PTXModule]:
    return _run_line(f"{op} %f2, %f1;", x)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 units in the last place (same-sign finite values)."""
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def test_ex2_approx_is_off_by_up_to_2_ulp_and_keeps_the_isa_special_cases():
    x = RNG.uniform(-30, 30, 256).astype(np.float32)
    got, _ = _unary("ex2.approx.f32", x)
    rounded = np.exp2(x.astype(np.float64)).astype(np.float32)
    d = _ulps(got, rounded)
    assert d.max() <= EX2_MAX_ULP and (d == EX2_MAX_ULP).mean() > 0.9  # the full bound, not exactly rounded
    assert (got > rounded).any() and (got < rounded).any()  # both directions occur
    special, _ = _unary("ex2.approx.f32", np.array([0.0, -0.0, -np.inf, np.inf, np.nan], np.float32))
    np.testing.assert_array_equal(special, [1.0, 1.0, 0.0, np.inf, np.nan])


def test_lg2_approx_absolute_error_near_1_and_relative_elsewhere():
    near = RNG.uniform(0.51, 1.99, 128).astype(np.float32)
    far = np.exp2(RNG.uniform(-60, 60, 128)).astype(np.float32)
    far = far[(far <= 0.5) | (far >= 2)]
    got_near, _ = _unary("lg2.approx.f32", near)
    err = np.abs(got_near.astype(np.float64) - np.log2(near.astype(np.float64)))
    assert err.max() <= LG2_MAX_ABS_ERROR and err.max() > LG2_MAX_ABS_ERROR / 2
    assert (got_near != np.log2(near.astype(np.float64)).astype(np.float32)).mean() > 0.9
    got_far, _ = _unary("lg2.approx.f32", far)
    exact = np.log2(far.astype(np.float64))
    rel = np.abs(got_far - exact) / np.abs(exact)
    assert rel.max() <= LG2_MAX_REL_ERROR and rel.max() > LG2_MAX_REL_ERROR / 2
    special, _ = _unary("lg2.approx.f32", np.array([0.0, -0.0, np.inf, -1.0, -np.inf], np.float32))
    np.testing.assert_array_equal(special, [-np.inf, -np.inf, np.inf, np.nan, np.nan])


def test_sin_cos_approx_absolute_error_by_range_and_out_of_range_is_flagged():
    near = RNG.uniform(-2 * math.pi, 2 * math.pi, 256).astype(np.float32)
    for op, fn in (("sin", np.sin), ("cos", np.cos)):
        got, mod = _unary(f"{op}.approx.f32", near)
        err = np.abs(got.astype(np.float64) - fn(near.astype(np.float64)))
        assert err.max() <= SIN_COS_NEAR_ABS_ERROR and np.median(err) > SIN_COS_NEAR_ABS_ERROR / 2, op
        assert mod.warnings == []
    mid = RNG.uniform(-100 * math.pi, 100 * math.pi, 256).astype(np.float32)
    got, mod = _unary("sin.approx.f32", mid)
    err = np.abs(got.astype(np.float64) - np.sin(mid.astype(np.float64)))
    assert err.max() <= SIN_COS_FAR_ABS_ERROR and err.max() > SIN_COS_FAR_ABS_ERROR / 2 and mod.warnings == []
    zeros, _ = _unary("sin.approx.f32", np.array([0.0, -0.0, np.inf], np.float32))
    assert zeros[0] == 0 and np.signbit(zeros[1]) and np.isnan(zeros[2])
    # beyond [-100pi, 100pi] the ISA promises nothing: flagged, and modelled by a float32 argument reduction
    huge = np.array([1e4, -3e5, 0.5], np.float32)
    got, mod = _unary("sin.approx.f32", huge)
    assert len(mod.warnings) == 1
    assert mod.warnings[0].startswith("unary: line 16: 'sin.approx.f32 %f2, %f1;': sin.approx of 2 input(s) "
                                      "outside [-100pi, 100pi] (e.g. 10000.0)")
    assert np.abs(got[:2] - np.sin(huge[:2].astype(np.float64))).max() > 1e-4


def test_rcp_rsqrt_div_approx_within_their_bounds():
    x = np.exp2(RNG.uniform(-20, 20, 128)).astype(np.float32) * RNG.choice([-1, 1], 128).astype(np.float32)
    got, _ = _unary("rcp.approx.f32", x)
    d = _ulps(got, (1 / x.astype(np.float64)).astype(np.float32))
    assert d.max() == RCP_APPROX_MAX_ULP
    got, _ = _unary("rsqrt.approx.f32", np.abs(x))
    exact = 1 / np.sqrt(np.abs(x).astype(np.float64))
    rel = np.abs(got - exact) / exact
    assert rel.max() <= RSQRT_MAX_REL_ERROR and rel.max() > RSQRT_MAX_REL_ERROR / 2
    exact_rcp, _ = _unary("rcp.rn.f32", x)
    np.testing.assert_array_equal(exact_rcp, (1 / x.astype(np.float64)).astype(np.float32))  # .rn: IEEE
    got, _ = _run_line("div.approx.f32 %f2, 0f40400000, %f1;", x)  # 3 / x
    d = _ulps(got, (3 / x.astype(np.float64)).astype(np.float32))
    assert d.max() == DIV_APPROX_MAX_ULP


def test_ftz_flushes_subnormal_inputs_and_results():
    sub = np.array([1e-40, -1e-40, 1e-30, -2.5, 1.5e-39], np.float32)
    keep, _ = _run_line("mul.rn.f32 %f2, %f1, 0f3F800000;", sub)  # times one
    flushed, _ = _run_line("mul.rn.ftz.f32 %f2, %f1, 0f3F800000;", sub)
    np.testing.assert_array_equal(keep, sub)
    np.testing.assert_array_equal(flushed, np.array([0.0, -0.0, sub[2], sub[3], 0.0], np.float32))
    assert not np.signbit(flushed[0]) and np.signbit(flushed[1])
    # ex2 of a subnormal input is 1 (up to the approximation); with .ftz the input is exactly zero -> 1.0
    e, _ = _unary("ex2.approx.ftz.f32", sub[:1])
    assert e[0] == 1.0
    # results: 2^-130 is subnormal, kept without .ftz and flushed with it
    tiny, _ = _unary("ex2.approx.f32", np.array([-130.0], np.float32))
    tiny_ftz, _ = _unary("ex2.approx.ftz.f32", np.array([-130.0], np.float32))
    assert 0 < tiny[0] < 2.0 ** -126 and tiny_ftz[0] == 0.0


def test_approximate_instructions_need_approx_and_f32():
    with pytest.raises(PTXError, match=r"ex2 needs \.approx"):
        PTXModule(HEADER + UNARY.replace("OP", "ex2.f32"))
    with pytest.raises(PTXError, match=r"sin has no \.f64 form"):
        PTXModule(HEADER + UNARY.replace("OP", "sin.approx.f64").replace(".f32 %f<3>", ".f64 %f<3>"))


# ---------------------------------------------------------------------- the renderer's math under the bounds
def _rendered(t: Tensor) -> tuple[np.ndarray, list[str]]:
    """Run every kernel of `t`'s schedule (elementwise, no Variables) through the renderer and interpreter;
    the result and the approximate-instruction warnings of all kernels."""
    items, results = create_schedule([t.uop])
    mem = NumpyMemory()
    addr: dict[object, int] = {}
    warnings: list[str] = []
    renderer = PTXRenderer()
    for k, si in enumerate(items):
        assert si.ast is not None
        prog = renderer.lower(si.ast, f"k{k}")
        for g in prog.globals:
            buf = si.bufs[g.arg]
            if buf not in addr:
                addr[buf] = mem.alloc(buffer_numpy(buf)) if is_allocated(buf) else \
                    mem.alloc(max(buf.arg[1], 1) * buf.dtype.itemsize)
        params = b"".join(struct.pack("<Q", addr[si.bufs[g.arg]]) for g in prog.globals) + \
            b"".join(struct.pack("<q", si.var_vals[v]) for v in prog.variables)  # float constants
        mod = PTXModule(renderer.render(prog))
        grid, block = launch_dims(int(prog.global_size), prog.launch.local_size[0])
        mod.launch(prog.name, grid, block, params, mem)
        warnings += mod.warnings
    out = results[0].base
    return mem.read(addr[out], out.dtype.np, int(np.prod(t.shape))).reshape(t.shape), warnings


def test_renderer_sin_is_accurate_beyond_2pi():
    # sin.approx.f32 is only good to 2^-20.5 in [-2pi, 2pi], 2^-14.7 in [-100pi, 100pi], unbounded beyond:
    # the renderer must not hand it large arguments (rotary embeddings take sines of positions)
    x = np.concatenate([RNG.uniform(-100 * math.pi, 100 * math.pi, 64), RNG.uniform(-1e4, 1e4, 64),
                        RNG.uniform(-1e-3, 1e-3, 16)]).astype(np.float32)
    for name, tensor, ref in (("sin", Tensor(x).sin(), np.sin), ("cos", Tensor(x).cos(), np.cos)):
        got, warnings = _rendered(tensor)
        assert warnings == [], name
        arg = x.astype(np.float64) if name == "sin" else (np.float32(math.pi / 2) - x).astype(np.float64)
        np.testing.assert_allclose(got, ref(arg) if name == "sin" else np.sin(arg), rtol=1e-6, atol=1e-7,
                                   err_msg=name)


def test_renderer_float32_pow_is_accurate_for_large_exponents():
    # exp2(y * lg2|x|) with lg2.approx's 2^-22 error in the exponent loses |y * log2 x| * 2^-22 of relative
    # accuracy: 3**20 would be off by ~1e-5, (-1)**7 by ~1e-6
    x = np.array([3.0, -1.0, 1.5, 10.0, 0.5, 7.0, -2.0, 2.0], np.float32)
    y = np.array([20.0, 7.0, 60.0, -12.0, 100.0, 0.5, 3.0, -126.5], np.float32)
    got, warnings = _rendered(Tensor(x) ** Tensor(y))
    assert warnings == []
    np.testing.assert_allclose(got, np.power(x.astype(np.float64), y).astype(np.float32), rtol=1e-6)
