"""The MSL renderer (compiler/renderer/msl.py): a representative set of tensor ops renders for the Apple GPU
target, every kernel type-checks as C++ through the Metal shim header, and kernels run on the host through
the same shim (reductions with lanes as threads) with the CPU device's results."""
from __future__ import annotations

import re

import numpy as np
import pytest

from rawgrad import Tensor, dtypes
from rawgrad.compiler.renderer import renderer_for
from rawgrad.compiler.renderer.msl import MSLRenderer, arg_indices, const_text, render_msl
from rawgrad.compiler.target import APPLE_GPU, NV_SM90
from rawgrad.drivers.metal.mock.msl_host import CXX, MSLHostError, run_on_host, run_source, type_check
from rawgrad.tensor.buffers import buffer_numpy
from rawgrad.tensor.schedule import create_schedule

needs_cxx = pytest.mark.skipif(CXX is None, reason="no g++ or clang++ on this machine to check MSL with")


def tensor_ops():  # type: ignore[no-untyped-def]
    a, b, m = Tensor.randn(8, 64), Tensor.randn(8, 64), Tensor.randn(64, 16)
    yield (a * b + 1).relu()
    yield a.exp()
    yield a.log2()
    yield a.sin()
    yield a.sqrt()
    yield a.pow(b)
    yield a.sum(1)                                   # SIMD-group reduction
    yield a.max(axis=1)
    yield a.sum(0)                                   # strided reduce: one thread per output
    yield a.softmax(-1)
    yield Tensor.randn(4, 4096).sum(1)               # a threadgroup reduction (barriers)
    yield a @ m
    yield a.cast(dtypes.float16) * 2
    yield a.cast(dtypes.bfloat16) + 1
    h = a.cast(dtypes.float16)
    yield h.exp()
    yield h.sum(1)
    bf = a.cast(dtypes.bfloat16)
    yield bf.max(axis=1)
    i = Tensor(np.arange(64, dtype=np.int32).reshape(8, 8))
    yield i // 3
    yield i % 5
    yield i.sum(1)
    yield i.max(axis=1)
    yield a.cast(dtypes.int64) // 2
    yield a.cast(dtypes.int8) * 3
    yield a.cast(dtypes.uint8) + 250
    yield (a > 0).where(a, b)
    yield (a > 0) & (b < 0)
    yield a.argmax(1)
    emb, idx = Tensor.randn(10, 16), Tensor(np.array([1, 3, 9], dtype=np.int32))
    yield emb[idx]
    yield Tensor.rand(32, 32)


def capture() -> dict[str, str]:
    r = MSLRenderer()
    out: dict[str, str] = {}
    seen: set = set()
    for t in tensor_ops():
        items, _ = create_schedule([t.uop])
        for si in items:
            if si.ast is None or si.ast in seen:
                continue
            seen.add(si.ast)
            name = f"{re.sub(r'[^A-Za-z0-9_]', '_', si.name)}_{len(out)}"
            out[name] = r.render(r.lower(si.ast, name))
    return out


@pytest.fixture(scope="module")
def kernels() -> dict[str, str]:
    return capture()


def test_renderer_for_maps_the_apple_target() -> None:
    r = renderer_for(APPLE_GPU)
    assert isinstance(r, MSLRenderer) and r.language == "msl" and r.target is APPLE_GPU
    with pytest.raises(ValueError, match="Apple GPU kernels, not nv-sm_90"):
        MSLRenderer(NV_SM90)


def test_kernels_render_with_metal_calling_convention(kernels: dict[str, str]) -> None:
    assert len(kernels) >= 25
    for name, src in kernels.items():
        head = src.split(f"kernel void {name}(", 1)[1].split(") {", 1)[0]
        idx = re.findall(r"buf(\d+) \[\[buffer\((\d+)\)\]\]", head)
        slots = [int(a) for a, _ in idx]
        assert slots == list(range(len(slots))) and slots, name
        assert all(a == b for a, b in idx), name  # buffer slot k is argument index k
        if "constant long* vars" in head:  # the scalar words come right after the buffers
            assert f"vars [[buffer({len(slots)})]]" in head, name
        assert "double" not in src and "fast" not in src, name
    assert any("device uchar* buf0" in s and "(uchar)(" in s for s in kernels.values())  # bool output
    assert any("device char* buf0" in s for s in kernels.values())


def test_group_reductions_use_simd_shuffles_and_barriers(kernels: dict[str, str]) -> None:
    shuffled = [n for n, s in kernels.items() if "= rg_shfl(" in s]
    barriered = [n for n, s in kernels.items() if "threadgroup_barrier(mem_flags::mem_threadgroup);" in s]
    assert shuffled and barriered and set(barriered) <= set(shuffled)
    for n in barriered:  # one slot per SIMD-group of a 128-thread block, between two barriers
        assert kernels[n].count("threadgroup_barrier(") == 2
        assert re.search(r"threadgroup (float|int|long|uint|bool) rg_group\d+\[4\];", kernels[n])
        assert "if ((lid & 127u) == 0u) buf0[" in kernels[n]


def test_half_and_bfloat_buffers_and_rounding(kernels: dict[str, str]) -> None:
    half = [s for s in kernels.values() if "device half*" in s]
    bf = [s for s in kernels.values() if "device bfloat*" in s]
    assert half and bf
    assert any("float(half(" in s for s in half)  # rounded back after an op
    assert all("rg_bf16_store(" in s or "rg_bf16_load(" in s for s in bf)


@needs_cxx
def test_every_rendered_kernel_type_checks_through_the_shim(kernels: dict[str, str]) -> None:
    type_check(kernels)


@needs_cxx
def test_shim_check_catches_a_broken_kernel(kernels: dict[str, str]) -> None:
    name, src = next(iter(kernels.items()))
    broken = src.replace("const long gidx", "const lon gidx")
    with pytest.raises(MSLHostError, match=f"kernel {name} does not compile"):
        type_check({name: broken})


def test_float64_is_refused_with_a_clear_error() -> None:
    d = Tensor.randn(4, 4).cast(dtypes.float64).exp()
    items, _ = create_schedule([d.uop])
    r = MSLRenderer()
    with pytest.raises(ValueError, match="Metal has no float64 type"):
        for si in items:
            if si.ast is not None:
                render_msl(r.lower(si.ast, "k"))


def test_constants() -> None:
    assert const_text(1.5, dtypes.float32) == "1.5f"
    assert const_text(float("inf"), dtypes.float32) == "as_type<float>(0x7f800000u)"
    assert const_text(-(1 << 63), dtypes.int64) == "(long)(-9223372036854775807L - 1)"
    assert const_text(7, dtypes.uint32) == "7u" and const_text(-3, dtypes.int8) == "(char)-3"


def _single_kernel(t: Tensor):  # type: ignore[no-untyped-def]
    items, _ = create_schedule([t.uop])
    (si,) = [s for s in items if s.ast is not None]
    return si


# (tensor, tolerance in float32 units in the last place at the scale of the operands, max(|x|, 1)): 0 is
# bit-exact. The CPU device's LLVM may contract a * b + c into one fused multiply-add (its IR allows
# `contract`, as Metal's compiler may), the host build of the MSL does not: the product's rounding (an ulp
# at the operands' scale, ~1 here) then differs, however small the cancelled result is.
FMA_ULPS = 2
HOST_CASES = {
    "fused_elementwise": lambda a, b: ((a * b * 0.37 + 1).relu(), FMA_ULPS),
    "exp2_log2": lambda a, b: ((a.abs() + 0.5).log2() + b.exp2(), 4),  # libm vs the CPU's inline exp2
    "strided_sum": lambda a, b: (a.sum(0), FMA_ULPS),
    "half": lambda a, b: ((a.cast(dtypes.float16) * 3 + b.cast(dtypes.float16)), 0),
    "bfloat": lambda a, b: ((a.cast(dtypes.bfloat16) * 3 - 1), 0),
    "int_div_mod": lambda a, b: ((a * 100).cast(dtypes.int32) // 7 + (b * 100).cast(dtypes.int32) % 5, 0),
    "where": lambda a, b: ((a > b).where(a, b * 2), 0),
    # signed overflow wraps (through the unsigned type), as on every other backend
    "int32_wrap": lambda a, b: ((a * 1e4).cast(dtypes.int32) * 300007 + 2147483000, 0),
    "int8_wrap": lambda a, b: ((a * 50).cast(dtypes.int8) * 7, 0),
    "int_div_by_zero": lambda a, b: ((a * 10).cast(dtypes.int32) // (b * 2).cast(dtypes.int32), 0),
    "int64_mod": lambda a, b: ((a * 1e6).cast(dtypes.int64) % (b * 50).cast(dtypes.int64), 0),
    "bool_logic": lambda a, b: (((a > 0) & (b < 0)) | (a > 1), 0),
    "half_mulacc": lambda a, b: (a.cast(dtypes.float16) * b.cast(dtypes.float16) + 0.5, 0),
    "bfloat_in_float_out": lambda a, b: ((a * 3).cast(dtypes.bfloat16).cast(dtypes.float32).exp2(), 4),
}


@needs_cxx
@pytest.mark.parametrize("case", sorted(HOST_CASES))
def test_barrier_free_kernels_run_on_the_host_like_the_cpu_device(case: str) -> None:
    rng = np.random.default_rng(7)
    a = Tensor(rng.standard_normal((16, 24)).astype(np.float32)).realize()
    b = Tensor(rng.standard_normal((16, 24)).astype(np.float32)).realize()
    t, ulps = HOST_CASES[case](a, b)
    si = _single_kernel(t)
    r = MSLRenderer()
    prog = r.lower(si.ast, f"host_{case}")
    src = r.render(prog)
    out_buf = si.bufs[0]
    out = np.zeros(out_buf.arg[1], dtype=out_buf.dtype.np)
    args = [out] + [buffer_numpy(x) for x in si.bufs[1:]]
    scalars = [int(si.var_vals[v]) for v in prog.variables]
    assert set(arg_indices(prog)) == {f"buf{k}" for k in range(len(args))} | ({"vars"} if scalars else set())
    run_on_host(prog, src, args, scalars)
    expect = t.numpy().reshape(-1)
    got = out.astype(np.float32) if out_buf.dtype == dtypes.bfloat16 else out
    if out_buf.dtype == dtypes.bfloat16:  # held as bits on the host
        got = (out.astype(np.uint32) << 16).view(np.float32)
    if ulps:
        scale = np.maximum(np.abs(expect), 1).astype(np.float32)
        err = np.where(got == expect, 0.0, np.abs(got.astype(np.float64) - expect) / np.spacing(scale))
        assert err.max() <= ulps, f"{case}: {err.max()} ulp"
    else:
        np.testing.assert_array_equal(got, expect)


# group reductions: every lane a thread, shuffles and barriers synchronize; the butterfly adds in another
# order than the CPU's loop, so float sums agree to rounding, integer ones exactly
def _normal(seed: int, shape: tuple[int, ...]) -> Tensor:
    return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


REDUCE_CASES = {
    "simd_group_sum": (lambda: _normal(1, (8, 64)), lambda x: x.sum(1), 32),
    "block_group_sum": (lambda: _normal(2, (2, 4096)), lambda x: x.sum(1), 128),
    "simd_group_int_max": (lambda: Tensor(np.random.default_rng(3).integers(-1000, 1000, (4, 64), np.int32)),
                           lambda x: x.max(axis=1), 32),
}


@needs_cxx
@pytest.mark.parametrize("case", sorted(REDUCE_CASES))
def test_group_reductions_run_with_lanes_as_threads(case: str) -> None:
    make, op, group = REDUCE_CASES[case]
    x = make().realize()
    t = op(x)
    si = _single_kernel(t)
    r = MSLRenderer()
    prog = r.lower(si.ast, f"red_{case}")
    assert prog.group_size == group
    src = r.render(prog)
    assert "rg_shfl(" in src and (("threadgroup_barrier(" in src) == (group > APPLE_GPU.simd_width))
    out = np.zeros(si.bufs[0].arg[1], dtype=si.bufs[0].dtype.np)
    run_on_host(prog, src, [out] + [buffer_numpy(b) for b in si.bufs[1:]],
                [int(si.var_vals[v]) for v in prog.variables])
    expect = t.numpy().reshape(-1)
    if out.dtype.kind == "f":
        np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-4)
    else:
        np.testing.assert_array_equal(out, expect)


@needs_cxx
def test_barrier_mismatch_is_caught() -> None:
    """A barrier only some lanes reach (undefined on a GPU: a hang or a race) fails the host run."""
    src = ("#include <metal_stdlib>\nusing namespace metal;\n"
           "kernel void uneven(device float* buf0 [[buffer(0)]], uint gid [[threadgroup_position_in_grid]], "
           "uint lid [[thread_position_in_threadgroup]]) {\n"
           "  if (lid < 3u) threadgroup_barrier(mem_flags::mem_threadgroup);\n  buf0[lid] = 1.0f;\n}\n")
    out = np.zeros(8, np.float32)
    with pytest.raises(MSLHostError, match="barrier mismatch in threadgroup 0: lane 3"):
        run_source(src, "uneven", [out.ctypes.data], None, 1, 8)
