"""Fusion is asserted by kernel counts; the compiled path is checked against numpy and the interpreter."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rawgrad.compiler.ir import Ops
from rawgrad.tensor.realize import GlobalCounters
from rawgrad.tensor.schedule import create_schedule
from rawgrad.tensor.tensor import Tensor

rng = np.random.default_rng(7)


def kernels_for(*outs: Tensor) -> int:
    items, _ = create_schedule([o.uop for o in outs])
    return sum(1 for it in items if it.ast is not None)


def run_counted(t: Tensor) -> tuple[np.ndarray, int]:
    GlobalCounters.reset()
    out = t.numpy()
    return out, GlobalCounters.kernel_count


def rand(*shape: int) -> tuple[Tensor, np.ndarray]:
    a = rng.standard_normal(shape).astype(np.float32)
    return Tensor(a).realize(), a


def test_fused_elementwise_into_reduce_is_one_kernel():
    (a, na), (b, nb), (c, nc) = rand(16, 32), rand(16, 32), rand(16, 32)
    out, n = run_counted(((a * b + c).relu()).sum())
    assert n == 1
    np.testing.assert_allclose(out, np.maximum(na * nb + nc, 0).sum(), rtol=1e-5)


def test_softmax_last_axis_is_at_most_three_kernels():
    a, na = rand(8, 33)
    out, n = run_counted(a.softmax(-1))
    assert n <= 3
    e = np.exp(na - na.max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_chain_of_ten_elementwise_ops_is_one_kernel():
    na = np.abs(rng.standard_normal(100).astype(np.float32))
    a = Tensor(na).realize()
    ops = [lambda t: t * 1.5, lambda t: t + 2, lambda t: t.relu(), lambda t: t - 0.5, lambda t: t.sqrt(),
           lambda t: t * t, lambda t: t.exp(), lambda t: t.log(), lambda t: t.neg(), lambda t: t.abs()]
    nops = [lambda t: t * np.float32(1.5), lambda t: t + np.float32(2), lambda t: np.maximum(t, 0),
            lambda t: t - np.float32(0.5), np.sqrt, lambda t: t * t, np.exp, np.log, np.negative, np.abs]
    x, nx = a, na
    for f, g in zip(ops, nops):
        x, nx = f(x), g(nx)
    out, n = run_counted(x)
    assert n == 1
    np.testing.assert_allclose(out, nx, rtol=1e-5)


def test_movement_ops_cost_nothing():
    a, na = rand(6, 8)
    t = a.permute(1, 0).reshape(4, 2, 6).flip(1).pad(((0, 0), (1, 1), (0, 2)))[:, 1:3, ::2] * 2
    out, n = run_counted(t)
    assert n == 1
    expect = np.pad(na.T.reshape(4, 2, 6)[:, ::-1], ((0, 0), (1, 1), (0, 2)))[:, 1:3, ::2] * 2
    np.testing.assert_allclose(out, expect)


def test_reduce_fuses_with_elementwise_after_it():
    a, na = rand(32, 16)
    out, n = run_counted(a.sum(axis=1) * 2 + 1)
    assert n == 1
    np.testing.assert_allclose(out, na.sum(axis=1) * 2 + 1, rtol=1e-5, atol=1e-5)
    out, n = run_counted(a.mean())
    assert n == 1


def test_expanded_computed_value_is_stored_not_recomputed():
    a, na = rand(64, 64)
    b, nb = rand(64, 64)
    h = (a * 0.5).exp()
    # h is broadcast along the matmul's N axis: it must be stored once, not recomputed per column
    assert kernels_for(h @ b) == 2
    out, _ = run_counted(h @ b)
    np.testing.assert_allclose(out, np.exp(na * np.float32(0.5)) @ nb, rtol=1e-4, atol=1e-4)


def test_realize_several_outputs_together():
    a, na = rand(10, 10)
    x, y = a.sum(0), (a * 3).max(axis=1)
    GlobalCounters.reset()
    Tensor.realize(x, y)
    assert GlobalCounters.kernel_count == 2
    np.testing.assert_allclose(x.numpy(), na.sum(0), rtol=1e-5)
    np.testing.assert_allclose(y.numpy(), (na * 3).max(1), rtol=1e-5)


def test_padded_computed_values_are_zero_not_f_of_zero():
    a = Tensor(np.array([1.0, 2.0, 4.0], np.float32))
    t = (1 / a).pad(((2, 1),))  # f(0) = inf: the pad region must still be 0
    np.testing.assert_array_equal(t.numpy(), np.array([0, 0, 1, 0.5, 0.25, 0], np.float32))


def test_matmul_shapes_and_register_tiles():
    for m, k, n in [(1, 1, 1), (3, 5, 7), (64, 32, 48), (17, 64, 16)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-5)
    x = rng.standard_normal((2, 3, 8, 16)).astype(np.float32)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    np.testing.assert_allclose((Tensor(x) @ Tensor(w)).numpy(), x @ w, rtol=1e-4, atol=1e-5)


def test_compiled_matches_reference_interpreter(monkeypatch):
    a, na = rand(5, 7)
    graph = lambda t: ((t * t).sum(1, keepdim=True) - t.max(axis=0)).softmax(-1).cumsum(0)
    compiled = graph(a).numpy()
    monkeypatch.setenv("REFERENCE", "1")
    reference = graph(Tensor(na)).numpy()
    np.testing.assert_allclose(compiled, reference, rtol=1e-5, atol=1e-6)


def test_kernel_ast_is_one_store_with_views():
    a, _ = rand(4, 4)
    items, _ = create_schedule([(a + 1).sum(0).uop])
    (item,) = items
    assert item.ast is not None and item.ast.op is Ops.SINK
    (store,) = item.ast.src
    assert store.op is Ops.STORE and store.src[1].op is Ops.VIEW


def test_debug_output_names_kernels_and_code():
    code = ("from rawgrad.tensor.tensor import Tensor\n"
            "a = Tensor([1.0, 2.0, 3.0])\n"
            "print((a * 2 + 1).sum().item())\n")
    env = {**os.environ, "DEBUG": "4"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    # DEBUG=4: the generated code (LLVM IR on the CPU, PTX on NV, AMDGPU LLVM IR on AMD, MSL on METAL)
    from rawgrad.hcq import Device
    code_marker = {"NV": ".entry ", "AMD": "define amdgpu_kernel void @", "METAL": "kernel void "}
    assert code_marker.get(Device.DEFAULT, "define void @") in res.stdout
    assert "***" in res.stdout and " us" in res.stdout  # DEBUG=2: kernel name and time
    assert res.stdout.strip().splitlines()[-1] == "15.0"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "uint32", "int64", "bool"])
def test_every_dtype_round_trips_through_a_kernel(dtype):
    from rawgrad.dtype import dtypes
    dt = getattr(dtypes, dtype)
    t = Tensor([[0, 1, 2], [3, 4, 5]]).cast(dt)
    out = (t.permute(1, 0) + t.permute(1, 0)).numpy()
    base = np.array([[0, 1, 2], [3, 4, 5]]).T
    expect = (base.astype(bool) | base.astype(bool)) if dt == dtypes.bool else base * 2
    np.testing.assert_array_equal(out.astype(np.float64), expect.astype(np.float64))


def test_symbolic_shrink_compiles_once_for_every_value():
    from rawgrad.compiler.ir import Variable
    from rawgrad.tensor.buffers import buffer_numpy
    x = Tensor(np.arange(10, dtype=np.float32)).realize()
    GlobalCounters.reset()
    for k in (1, 4, 7, 10):
        y = (x.shrink(((0, Variable("n", 1, 10).bind(k)),)) * 2).sum()
        y.realize()
        assert buffer_numpy(y.uop.base)[0] == 2 * sum(range(k))
    assert GlobalCounters.kernels_compiled <= 1  # one kernel serves every value of n


def test_numpy_of_a_symbolic_shape_uses_the_bound_value():
    from rawgrad.compiler.ir import Variable
    x = Tensor(np.arange(10, dtype=np.float32)).realize()
    n = Variable("n", 1, 10)
    for k in (3, 6):
        np.testing.assert_array_equal((x.shrink(((0, n.bind(k)),)) * 2).numpy(), np.arange(k) * 2)
