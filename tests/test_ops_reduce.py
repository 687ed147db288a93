"""Reductions against numpy: axis forms, keepdim, dtypes of results, non-contiguous inputs, 0-d and
size-0 tensors, numerically stable softmax family, argmax ties/NaN and cumsum."""
import numpy as np
import pytest

from rawgrad.dtype import dtypes
from rawgrad.tensor.tensor import Tensor

AXES = [None, 0, -1, (0, 2)]


def test_sum_prod_max_min_mean_axes(data, check):
    a = data((5, 3, 4))
    t = Tensor(a).permute(1, 0, 2)  # reduce a non-contiguous view: (3, 5, 4)
    r = a.transpose(1, 0, 2)
    outs, exp, names = [], [], []
    for ax in AXES:
        for kd in (False, True):
            for name in ("sum", "prod", "max", "min", "mean"):
                outs.append(getattr(t, name)(axis=ax, keepdim=kd))
                exp.append(getattr(np, name)(r, axis=ax, keepdims=kd))
                names.append(f"{name}(axis={ax}, keepdim={kd})")
    outs.append(t.sum(dim=1))
    exp.append(r.sum(1))
    names.append("sum(dim=1)")
    check(outs, exp, names, atol=1e-5)


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.bool], ids=str)
def test_int_and_bool_reductions(dt, data, check):
    a = data((4, 6), dt)
    t = Tensor(a)
    outs = [t.sum(), t.sum(0), t.prod(1), t.max(axis=1), t.min(axis=0), t.any(1), t.all(0), t.max(), t.min()]
    assert outs[0].dtype == dtypes.int64 and outs[2].dtype == dtypes.int64  # torch sums ints to int64
    assert outs[3].dtype == dt and outs[5].dtype == dtypes.bool
    with np.errstate(over="ignore"):
        exp = [a.sum(dtype=np.int64), a.sum(0, dtype=np.int64), a.prod(1, dtype=np.int64), a.max(1), a.min(0),
               a.any(1), a.all(0), a.max(), a.min()]
    check(outs, exp)


@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16], ids=str)
def test_half_reductions_accumulate_wide(dt, data, check):
    a = data((8, 64), dt, 0.0, 4.0)
    t = Tensor(a, dtype=dt)
    outs = [t.sum(1), t.mean(0), t.max(axis=1), t.var(1), t.softmax(-1)[0]]
    assert all(o.dtype == dt for o in outs)
    x = a.astype(np.float64)
    e = np.exp(x[0] - x[0].max())
    check(outs, [x.sum(1), x.mean(0), x.max(1), x.var(1, ddof=1), e / e.sum()])


def test_var_std(data, check):
    a = data((4, 7))
    t = Tensor(a)
    v, m = t.var_mean(1)
    outs = [t.var(), t.var(1), t.var(0, correction=0), t.std(), t.std(1, keepdim=True), t.std(dim=0), v, m,
            Tensor([[1, 2, 4]]).var(1)]
    exp = [a.var(ddof=1), a.var(1, ddof=1), a.var(0), a.std(ddof=1), a.std(1, ddof=1, keepdims=True),
           a.std(0, ddof=1), a.var(1, ddof=1), a.mean(1), np.array([7 / 3])]
    check(outs, exp)
    assert np.isnan(Tensor([2.0]).var().item())  # one element with correction=1: 0/0, as torch


def test_argmax_argmin(check):
    a = np.array([[1.0, 3.0, 3.0, -1.0], [np.nan, 2.0, np.nan, 0.0], [-5.0, -5.0, 2.0, 2.0]], np.float32)
    t = Tensor(a)
    ints = np.array([[3, 7, 7, 1], [0, 0, 2, 2]], np.uint8)
    ti = Tensor(ints)
    outs = [t.argmax(1), t.argmin(1), t.argmax(), t[::2].argmax(0), t.argmax(1, keepdim=True),
            ti.argmax(1), ti.argmin(1), ti.argmin(), Tensor([False, True, True]).argmax(),
            Tensor([True, False, False]).argmin(), Tensor(5.0).argmax()]
    assert outs[0].dtype == dtypes.int64
    exp = [np.argmax(a, 1), np.argmin(a, 1), np.argmax(a), np.argmax(a[::2], 0), np.argmax(a, 1)[:, None],
           np.argmax(ints, 1), np.argmin(ints, 1), np.argmin(ints), 1, 1, 0]
    check(outs, [np.asarray(e, np.int64) for e in exp])


def test_softmax_family_is_stable(data, check):
    a = data((3, 5)) * 10
    a[0] += 1000.0  # would overflow exp without the max subtraction
    a[1, :2] = -np.inf
    t = Tensor(a)
    m = a.max(1, keepdims=True)
    e = np.exp(a - m)
    lse = np.log(e.sum(1, keepdims=True)) + m
    outs = [t.softmax(-1), t.log_softmax(1), t.logsumexp(1), t.logsumexp(1, keepdim=True),
            t.softmax(0), Tensor([-np.inf, -np.inf]).logsumexp(0), t.softmax(dim=-1, dtype=dtypes.float64)]
    e0 = np.exp(a - a.max(0, keepdims=True))
    with np.errstate(invalid="ignore"):
        exp = [e / e.sum(1, keepdims=True), a - lse, lse[:, 0], lse, e0 / e0.sum(0, keepdims=True),
               np.float32(-np.inf), e / e.sum(1, keepdims=True)]
    check(outs, exp, atol=1e-6)


def test_cumsum(data, check):
    a = data((3, 5))
    ints = np.array([[1, -2, 3], [4, 5, -6]], np.int8)
    t = Tensor(a)
    outs = [t.cumsum(0), t.cumsum(1), t.cumsum(-1)[:, ::-1], Tensor(ints).cumsum(1),
            Tensor([True, False, True]).cumsum(0), Tensor(2.0).cumsum(0), t.T.cumsum(dim=1)]
    assert outs[3].dtype == dtypes.int64
    exp = [a.cumsum(0), a.cumsum(1), a.cumsum(-1)[:, ::-1], ints.cumsum(1, dtype=np.int64),
           np.array([1, 1, 2]), np.float32(2.0), a.T.cumsum(1)]
    check(outs, exp, atol=1e-5)


def test_zero_dim_and_empty_reductions(check):
    z = Tensor(3.0)
    e = Tensor.zeros(0, 3)
    outs = [z.sum(), z.sum(0), z.max(), z.mean(-1), e.sum(0), e.sum(), e.prod(0), e.any(0), e.all(),
            e.sum(1), e.max(axis=1), e.mean()]
    with np.errstate(invalid="ignore"):
        three = np.float32(3)
        exp = [three, three, three, three, np.zeros(3), np.float32(0), np.ones(3), np.zeros(3, bool),
               np.bool_(True), np.zeros(0), np.zeros(0), np.float32(np.nan)]
    check(outs, exp)
    with pytest.raises(IndexError, match="axis 1 is out of range for a tensor of 0 dims"):
        z.sum(1)
    with pytest.raises(ValueError, match="repeats a dimension"):
        Tensor.ones(2, 2).sum((0, -2))


def test_long_row_reductions(rng: np.random.Generator) -> None:
    # rows of >= 2048 elements: on a GPU each output gets a whole thread block (warp shuffles, then shared
    # memory between two barriers), the path a misplaced barrier breaks; checked against numpy
    x = rng.standard_normal((3, 4096)).astype(np.float32)
    t = Tensor(x)
    np.testing.assert_allclose(t.sum(1).numpy(), x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-3)
    np.testing.assert_array_equal(t.max(axis=1).numpy(), x.max(1))
    ints = rng.integers(-1000, 1000, (2, 2048)).astype(np.int32)
    np.testing.assert_array_equal(Tensor(ints).sum(1).numpy(), ints.sum(1))
