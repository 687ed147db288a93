"""Matrix-vector kernels with a few rows (a decode batch) share each weight load across the rows."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad import Device, Tensor
from rawgrad.compiler.opt import MAX_SHARED_ROWS
from rawgrad.tensor.schedule import create_schedule


def _matvec_opts(rows: int) -> tuple[dict[int, int], bool]:
    x = Tensor.ones(rows, 64, device="CPU").contiguous().realize()
    w = Tensor.ones(48, 64, device="CPU").contiguous().realize()  # (out, in): Linear's layout
    items, _ = create_schedule([(x @ w.T).uop])
    (item,) = items
    assert item.ast is not None
    prog = Device["CPU"].renderer.lower(item.ast, "k")  # type: ignore[union-attr]
    return prog.opts.upcast, prog.opts.vectorize_reduce


@pytest.mark.parametrize("rows", [2, 3, 4, MAX_SHARED_ROWS])
def test_few_rows_are_unrolled_and_the_reduce_stays_vectorized(rows: int) -> None:
    upcast, vectorize = _matvec_opts(rows)
    assert upcast == {0: rows} and vectorize


def test_many_rows_keep_the_plain_dot_product_kernel() -> None:
    upcast, vectorize = _matvec_opts(MAX_SHARED_ROWS + 1)
    assert upcast == {} and not vectorize


@pytest.mark.parametrize("rows", [1, 3, 8, 9])
def test_results_match_numpy(rows: int) -> None:
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 1, 200)).astype(np.float32)
    w = rng.standard_normal((77, 200)).astype(np.float32)
    got = (Tensor(x, device="CPU") @ Tensor(w, device="CPU").T).numpy()
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-4)
