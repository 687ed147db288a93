"""Row gathers (embedding lookups, x[int_tensor]): one load per element at the indexed address."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rawgrad import GlobalCounters, Tensor, TinyJit, Variable
from rawgrad.compiler.ir import Ops
from rawgrad.tensor.interpret import interpret_realize
from rawgrad.tensor.schedule import create_schedule

RNG = np.random.default_rng(7)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8, np.float64])
def test_embedding_matches_numpy(dtype: Any) -> None:
    table = (RNG.standard_normal((50, 6)) * 10).astype(dtype)
    idx = np.array([[3, 0, 49], [-1, 7, 7]], np.int32)
    got = Tensor(idx).embedding(Tensor(table)).numpy()
    np.testing.assert_array_equal(got, table[idx])


def test_first_axis_integer_index_of_nd_tensor() -> None:
    x = RNG.standard_normal((10, 3, 4)).astype(np.float32)
    idx = np.array([9, 0, -2, 4], np.int64)
    np.testing.assert_array_equal(Tensor(x)[Tensor(idx)].numpy(), x[idx])


def test_rows_outside_the_table_raise_at_the_next_read() -> None:
    table = RNG.standard_normal((4, 3)).astype(np.float32)
    out = Tensor(np.array([0, 4, 1000, -1000], np.int32)).embedding(Tensor(table))
    with pytest.raises(IndexError, match="embedding: an index is out of range for a dimension of size 4"):
        out.numpy()
    # the flag is reported once; the values themselves were computed without a load outside the table
    np.testing.assert_array_equal(out.numpy()[1:], np.zeros((3, 3), np.float32))


def test_the_gather_kernel_reads_zero_outside_the_table_instead_of_faulting() -> None:
    table = RNG.standard_normal((4, 3)).astype(np.float32)
    got = Tensor(table)._take_rows(Tensor(np.array([0, 4, 1000, -1000], np.int32))).numpy()
    np.testing.assert_array_equal(got[0], table[0])
    np.testing.assert_array_equal(got[1:], np.zeros((3, 3), np.float32))


def test_gather_fuses_into_one_kernel_with_its_consumer() -> None:
    table = Tensor(RNG.standard_normal((30, 8)).astype(np.float32)).realize()
    ids = Tensor(np.array([1, 2, 3], np.int32)).realize()
    out = (ids.embedding(table) * 2 + 1).sum(-1)
    items, _ = create_schedule([out.uop])
    assert len(items) == 1
    ast = items[0].ast
    assert ast is not None and any(n.op is Ops.GATHER for n in ast.toposort())
    np.testing.assert_allclose(out.numpy(), (table.numpy()[[1, 2, 3]] * 2 + 1).sum(-1), rtol=1e-6)


def test_computed_indices_fuse_into_the_gather() -> None:
    table = RNG.standard_normal((20, 5)).astype(np.float32)
    raw = np.array([5, 21, 40], np.int32)
    got = (Tensor(raw) % 20).embedding(Tensor(table)).numpy()
    np.testing.assert_array_equal(got, table[raw % 20])


def test_gradient_scatter_adds_repeated_rows() -> None:
    table = RNG.standard_normal((6, 3)).astype(np.float32)
    idx = np.array([[1, 1], [5, 0]], np.int32)
    w = Tensor(table, requires_grad=True)
    scale = RNG.standard_normal((2, 2, 3)).astype(np.float32)
    (Tensor(idx).embedding(w) * Tensor(scale)).sum().backward()
    want = np.zeros_like(table)
    np.add.at(want, idx, scale)
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6)


def test_reference_interpreter_agrees() -> None:
    table = RNG.standard_normal((7, 2)).astype(np.float32)
    idx = np.array([6, -1, 9, 0], np.int32)  # 9 is outside the table: both read it as 0
    out = Tensor(table)._take_rows(Tensor(idx))
    (ref,) = interpret_realize(out.uop)
    np.testing.assert_array_equal(Tensor(ref).numpy(), out.numpy())
    np.testing.assert_array_equal(out.numpy()[2], [0, 0])


def test_symbolic_length_under_jit_compiles_once() -> None:
    table = Tensor(RNG.standard_normal((100, 4)).astype(np.float32)).realize()

    @TinyJit
    def f(ids: Tensor, n: Any) -> Tensor:
        return ids.shrink((None, (0, n))).embedding(table).sum(-1).realize()

    ids = RNG.integers(0, 100, (2, 16)).astype(np.int32)
    for n in (5, 16, 3):
        f(Tensor(ids), Variable("n", 1, 16).bind(n))
    compiled = GlobalCounters.kernels_compiled
    for n in (1, 9, 12):
        out = f(Tensor(ids), Variable("n", 1, 16).bind(n))
        np.testing.assert_allclose(out.numpy(), table.numpy()[ids[:, :n]].sum(-1), rtol=1e-5)
    assert GlobalCounters.kernels_compiled == compiled and len(f.captures) == 1


def test_embedding_rejects_float_indices() -> None:
    with pytest.raises(TypeError, match="indices must be integers"):
        Tensor(np.array([1.0], np.float32)).embedding(Tensor(np.ones((3, 2), np.float32)))
