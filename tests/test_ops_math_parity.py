"""PyTorch-parity methods of rawgrad/tensor/ops_math.py against numpy (values, dtypes, edge values) and
their gradients against analytic derivatives or float64 central differences of the numpy reference.

Under DEV=NV (the mock GPU interprets every kernel, so it is slow) the sizes shrink and the dtype sweeps
keep one representative per kind; `-k "not sweep"` drops the widest parametrized cases everywhere."""
import math
import os

import numpy as np
import pytest

from rawgrad.dtype import dtypes
from rawgrad.tensor.tensor import Tensor

same, near = np.testing.assert_array_equal, np.testing.assert_allclose
ON_NV = os.environ.get("DEV", "").upper().startswith("NV")
N = 5 if ON_NV else 9  # the length of sorted / cumulative axes
SWEEP_DTYPES = [dtypes.float32, dtypes.int32] if ON_NV else \
    [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.int32, dtypes.int8]

# name -> (numpy reference, derivative, (low, high) of the test inputs)
UNARY = {
    "atan": (np.arctan, lambda x: 1 / (1 + x * x), (-6.0, 6.0)),
    "asin": (np.arcsin, lambda x: 1 / np.sqrt(1 - x * x), (-0.95, 0.95)),
    "acos": (np.arccos, lambda x: -1 / np.sqrt(1 - x * x), (-0.95, 0.95)),
    "sinh": (np.sinh, np.cosh, (-4.0, 4.0)),
    "cosh": (np.cosh, np.sinh, (-4.0, 4.0)),
    "asinh": (np.arcsinh, lambda x: 1 / np.sqrt(x * x + 1), (-6.0, 6.0)),
    "acosh": (np.arccosh, lambda x: 1 / np.sqrt(x * x - 1), (1.05, 8.0)),
    "atanh": (np.arctanh, lambda x: 1 / (1 - x * x), (-0.95, 0.95)),
    "log10": (np.log10, lambda x: 1 / (x * math.log(10)), (0.05, 50.0)),
    "softsign": (lambda x: x / (1 + np.abs(x)), lambda x: 1 / (1 + np.abs(x)) ** 2, (-5.0, 5.0)),
    "celu": (lambda x: np.where(x > 0, x, np.expm1(x)), lambda x: np.where(x > 0, 1, np.exp(x)), (-4.0, 4.0)),
    "selu": (lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x)),
             lambda x: 1.0507009873554805 * np.where(x > 0, 1, 1.6732632423543772 * np.exp(x)), (-4.0, 4.0)),
}
INT_DOMAIN = {"asin": (-1, 1), "acos": (-1, 1), "atanh": (0, 0), "acosh": (1, 9), "log10": (1, 60)}


def _ref(f, x):
    with np.errstate(all="ignore"):
        return f(np.asarray(x, np.float64))


def _grads(fn, *arrays, upstream=None):
    """d(sum(fn(*tensors) * upstream))/d(each array), from rawgrad's backward."""
    ts = [Tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ts)
    g = np.ones(out.shape) if upstream is None else upstream
    (out * Tensor(g, dtype=out.dtype)).sum().backward()
    Tensor.realize(*[t.grad for t in ts])
    return [t.grad.numpy() for t in ts]


def _fd(f_np, arrays, upstream, i=0, h=1e-6):
    """Central differences of sum(f_np(*arrays) * upstream) in float64 w.r.t. arrays[i]."""
    x = np.array(arrays[i], np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[idx] += h
        lo[idx] -= h
        args_hi = [hi if j == i else a for j, a in enumerate(arrays)]
        args_lo = [lo if j == i else a for j, a in enumerate(arrays)]
        grad[idx] = ((f_np(*args_hi) - f_np(*args_lo)) * upstream).sum() / (2 * h)
    return grad


# ---------------------------------------------------------------------- unary math
@pytest.mark.parametrize("dt", SWEEP_DTYPES + ([] if ON_NV else [dtypes.bfloat16]), ids=str)
def test_unary_sweep(dt, data, check):
    outs, exp, names = [], [], []
    for name, (ref, _, (lo, hi)) in UNARY.items():
        if dt.is_int:
            lo, hi = INT_DOMAIN.get(name, (-3, 3))
            a = np.random.default_rng(len(name)).integers(lo, hi + 1, (3, 4)).astype(dt.np)
        else:
            a = data((3, 4), dt, lo, hi)
        out = getattr(Tensor(a, dtype=dt), name)()
        assert out.dtype == (dtypes.float32 if dt.is_int else dt), name
        outs.append(out)
        exp.append(_ref(ref, a.astype(np.float32) if dt == dtypes.float16 else a))
        names.append(name)
    check(outs, exp, names, **({"rtol": 4e-3, "atol": 4e-3} if dt == dtypes.float16 else {}))


def test_sorting_and_cumulative_fuse_into_few_kernels(data):
    from rawgrad.tensor.schedule import create_schedule
    kernels = lambda *outs: sum(1 for it in create_schedule([o.uop for o in outs])[0] if it.ast is not None)
    t = Tensor(data((4, N))).realize()
    assert kernels(*t.sort()) <= 3  # ranks, then values and indices: nothing n*n-sized is stored
    assert kernels(t.cumprod(1)) == 1 and kernels(t.logcumsumexp(1)) <= 3
    assert kernels(t.atan(), t.asinh(), t.acosh(), t.sinh()) <= 4
    same(t.sort().values.numpy(), np.sort(t.numpy(), 1))  # (and run them, so the device sees this test)


def test_unary_edge_values():
    x = np.array([-np.inf, -1e30, -1e5, -1.0, -1e-7, -0.0, 0.0, 1e-7, 0.5, 1.0, 1e5, 1e30, np.inf, np.nan],
                 np.float32)
    for name in ("atan", "sinh", "cosh", "asinh", "asin", "acos", "atanh", "acosh", "log10"):
        ref = {"atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "asin": np.arcsin,
               "acos": np.arccos, "atanh": np.arctanh, "acosh": np.arccosh, "log10": np.log10}[name]
        got, want = getattr(Tensor(x), name)().numpy(), _ref(ref, x).astype(np.float32)
        # (atol: a device LOG2 may be an approximation, log10(1) on the NV mock is 7e-8)
        near(got, want, rtol=2e-6, atol=2e-7, equal_nan=True, err_msg=name)
    # tiny arguments keep their relative precision (log1p / series forms)
    t = np.array([1e-6, -3e-5, 2e-4], np.float32)
    for name, ref in (("sinh", np.sinh), ("asinh", np.arcsinh), ("atanh", np.arctanh), ("atan", np.arctan)):
        near(getattr(Tensor(t), name)().numpy(), ref(t.astype(np.float64)), rtol=1e-6)
    near(Tensor(np.float32(1 + 2 ** -20)).acosh().numpy(), np.arccosh(1 + 2 ** -20),
                               rtol=1e-6)


def test_unary_float64_precision():
    x = np.random.default_rng(3).uniform(-5, 5, 64)
    for name, ref in (("atan", np.arctan), ("sinh", np.sinh), ("asinh", np.arcsinh), ("cosh", np.cosh)):
        near(getattr(Tensor(x), name)().numpy(), ref(x), rtol=1e-14, err_msg=name)
    u = x / 5.5
    for name, ref in (("asin", np.arcsin), ("acos", np.arccos), ("atanh", np.arctanh)):
        near(getattr(Tensor(u), name)().numpy(), ref(u), rtol=1e-13, err_msg=name)


def test_unary_gradients(data):
    names = list(UNARY)
    xs = [data((2, 5), dtypes.float32, *UNARY[n][2]) for n in names]
    ups = [data((2, 5), dtypes.float32) for _ in names]
    grads = _grads(lambda *ts: Tensor.stack(*[getattr(t, n)() for t, n in zip(ts, names)]), *xs,
                   upstream=np.stack(ups))
    for n, x, g, up in zip(names, xs, grads, ups):
        near(g, UNARY[n][1](x.astype(np.float64)) * up, rtol=2e-4, atol=1e-5, err_msg=n)


def test_gradients_stay_finite_at_extremes():
    x = np.array([0.0, 1e-30, 3e9, -3e9, 1e30, 100.0, -100.0], np.float32)
    for name in ("atan", "asinh", "celu", "selu", "softsign"):
        (g,) = _grads(lambda t, n=name: getattr(t, n)(), x)
        assert np.isfinite(g).all(), (name, g)
    for name in ("sinh", "cosh"):  # (their own overflow past 89 gives 0 * inf = NaN, as in torch)
        (g,) = _grads(lambda t, n=name: getattr(t, n)(), x[[0, 1, 5, 6]] * 0.8)
        assert np.isfinite(g).all(), (name, g)
    (g,) = _grads(lambda t: t.acosh(), np.array([2.0, 3e9, 1e30], np.float32))
    near(g, [1 / math.sqrt(3), 1 / 3e9, 1e-30], rtol=1e-5)


# ---------------------------------------------------------------------- binary math
def test_logaddexp(data, check):
    a, b = data((3, 4)), data((4,)) * 5
    specials = np.array([-np.inf, np.inf, -np.inf, 2.0, np.nan], np.float32)
    specials2 = np.array([-np.inf, np.inf, 3.0, -np.inf, 1.0], np.float32)
    ai = np.array([1, 2, 3], np.int32)
    outs = [Tensor(a).logaddexp(Tensor(b)), Tensor(specials).logaddexp(Tensor(specials2)),
            Tensor(a).logaddexp(2.0), Tensor(ai).logaddexp(Tensor(ai)),
            Tensor(a, dtype=dtypes.float16).logaddexp(0)]
    assert outs[3].dtype == dtypes.float32 and outs[4].dtype == dtypes.float16
    with np.errstate(invalid="ignore"):
        nan_ref = np.logaddexp(specials, specials2)
    exp = [np.logaddexp(a, b), nan_ref, np.logaddexp(a, 2.0), np.logaddexp(ai, ai),
           np.logaddexp(a.astype(np.float16), 0)]
    check(outs, exp)
    near(Tensor([1000.0]).logaddexp(Tensor([999.0])).numpy(), np.logaddexp(1000, 999))
    ga, gb = _grads(lambda x, y: x.logaddexp(y), a, np.broadcast_to(b, a.shape).copy())
    sig = 1 / (1 + np.exp(-(a.astype(np.float64) - b)))
    near(ga, sig, rtol=1e-5)
    near(gb, 1 - sig, rtol=1e-4)
    (g,) = _grads(lambda x: x.logaddexp(x), np.array([1.0, -np.inf], np.float32))
    near(g[0], 1.0)


def test_copysign(data):
    a = np.array([1.0, -2.0, 0.0, -0.0, np.inf, np.nan, 3.0, -4.0], np.float32)
    b = np.array([-1.0, 2.0, -0.0, 0.0, -5.0, -1.0, np.nan, -np.inf], np.float32)
    for dt in (dtypes.float32, dtypes.float64, dtypes.float16):
        got = Tensor(a, dtype=dt).copysign(Tensor(b, dtype=dt)).numpy()
        want = np.copysign(a, b).astype(dt.np)
        same(got, want)
        same(np.signbit(got), np.signbit(want))
    out = Tensor([1, -2, 3]).copysign(Tensor([-1, -1, 0]))
    assert out.dtype == dtypes.float32
    same(out.numpy(), [-1.0, -2.0, 3.0])
    same(Tensor([1.0, -2.0]).copysign(-0.0).numpy(), [-1.0, -2.0])
    x, y = data((6,)), data((6,))
    gx, gy = _grads(lambda s, t: s.copysign(t), x, y)
    same(gx, np.sign(x) * np.sign(y))
    same(gy, 0)


def test_lerp(data, check):
    s, e, w = data((3, 4)), data((4,)), data((3, 4), low=-0.5, high=1.5)
    ts, te = Tensor(s), Tensor(e)
    outs = [ts.lerp(te, 0.3), ts.lerp(te, 1.0), ts.lerp(te, Tensor(w)), ts.lerp(2.0, 0.75)]
    exp = [s + 0.3 * (e - s), np.broadcast_to(e, s.shape), s + w * (e - s), s + 0.75 * (2 - s)]
    check(outs, exp)
    assert (Tensor(s).lerp(Tensor(e), 1.0).numpy() == np.broadcast_to(e, s.shape)).all()  # exact at w = 1
    assert Tensor([1, 2]).lerp(Tensor([3, 4]), 0.5).dtype == dtypes.float32
    gs, ge, gw = _grads(lambda a, b, c: a.lerp(b, c), s, np.broadcast_to(e, s.shape).copy(), w)
    near(gs, 1 - w, rtol=1e-5, atol=1e-6)
    near(ge, w, rtol=1e-5, atol=1e-6)
    near(gw, e - s, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- activations and normalize
def _softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def test_celu_alpha_softmin_normalize(data, check):
    x = data((3, 5)).astype(np.float64)
    z = np.zeros((2, 3))
    t = Tensor(x)
    outs = [t.celu(0.5), t.softmin(1), t.softmin(0), t.normalize(), t.normalize(p=1, dim=0),
            t.normalize(p=math.inf, dim=1), t.normalize(p=3, dim=-1), Tensor(z).normalize(dim=0)]
    norm = lambda p, d: np.maximum((np.abs(x) ** p).sum(d, keepdims=True) ** (1 / p), 1e-12)
    exp = [np.where(x > 0, x, 0.5 * np.expm1(x / 0.5)), _softmax(-x, 1), _softmax(-x, 0), x / norm(2, 1),
           x / norm(1, 0), x / np.abs(x).max(1, keepdims=True), x / norm(3, -1), z]
    check(outs, exp)
    assert Tensor([[1, 2]]).softmin(1).dtype == dtypes.float32
    assert Tensor([[1.0, 2.0]], dtype=dtypes.float16).normalize().dtype == dtypes.float16
    up = data((3, 5)).astype(np.float64)
    for p, d in ((2, 1), (1, 0), (3, -1)):
        np_norm = lambda a, p=p, d=d: a / np.maximum((np.abs(a) ** p).sum(d, keepdims=True) ** (1 / p), 1e-12)
        (g,) = _grads(lambda t, p=p, d=d: t.normalize(p=p, dim=d), x, upstream=up)
        near(g, _fd(np_norm, [x], up), rtol=1e-6, atol=1e-7, err_msg=f"p={p}")
    (g,) = _grads(lambda t: t.normalize(dim=0), z)
    assert np.isfinite(g).all()  # a zero row: no 0/0 in the norm's gradient
    (g,) = _grads(lambda t: t.softmin(1), x, upstream=up)
    near(g, _fd(lambda a: _softmax(-a, 1), [x], up), rtol=1e-6, atol=1e-8)
    (g,) = _grads(lambda t: t.celu(0.5), x)
    near(g, np.where(x > 0, 1, np.exp(x / 0.5)), rtol=1e-12)


# ---------------------------------------------------------------------- comparison and masks
def test_isclose_allclose(data):
    a = np.array([1.0, 1.0, np.inf, np.inf, -np.inf, np.nan, 0.0, 1e-9, 100.0], np.float32)
    b = np.array([1.0 + 1e-6, 1.1, np.inf, -np.inf, 5.0, np.nan, 1e-9, 0.0, 100.01], np.float32)
    for kw in ({}, {"equal_nan": True}, {"rtol": 1e-3, "atol": 0.0}, {"rtol": 0.0, "atol": 0.0}):
        same(Tensor(a).isclose(Tensor(b), **kw).numpy(), np.isclose(a, b, **kw), str(kw))
    same(Tensor(a).isclose(1.0).numpy(), np.isclose(a, 1.0))
    x, y = np.array([1, 5, -3, 0], np.int32), np.array([2, 5, -2, 0], np.int64)
    same(Tensor(x).isclose(Tensor(y), atol=1).numpy(), np.isclose(x, y, atol=1))
    same(Tensor(x).isclose(Tensor(y)).numpy(), x == y)
    u, w = np.array([0, 255, 7], np.uint8), np.array([200, 250, 0], np.uint8)
    same(Tensor(u).isclose(Tensor(w), atol=10).numpy(), [False, True, True])
    c = data((4, 3))
    assert Tensor(c).allclose(Tensor(c + 1e-7)) is True
    assert Tensor(c).allclose(Tensor(c + 1e-2)) is False
    nan = Tensor([np.nan])
    assert nan.allclose(nan) is False and nan.allclose(nan, equal_nan=True) is True


def test_isinf_detect_flags():
    x = Tensor([-np.inf, -1.0, np.inf, np.nan])
    same(x.isinf().numpy(), [True, False, True, False])
    same(x.isinf(detect_negative=False).numpy(), [False, False, True, False])
    same(x.isinf(detect_positive=False).numpy(), [True, False, False, False])
    same(x.isinf(False, False).numpy(), [False] * 4)
    same(Tensor([1, 2]).isinf().numpy(), [False, False])


def test_astype_type_as():
    x = Tensor([1.7, -2.2])
    assert x.astype(dtypes.int32).dtype == dtypes.int32 and x.astype("float16").dtype == dtypes.float16
    same(x.type_as(Tensor([1], dtype=dtypes.int64)).numpy(), np.array([1, -2], np.int64))


def test_masked_fill(data):
    x = data((3, 4))
    m = x > 0.5
    same(Tensor(x).masked_fill(Tensor(m), -1.5).numpy(), np.where(m, -1.5, x))
    row = np.array([True, False, False, True])
    same(Tensor(x).masked_fill(Tensor(row), Tensor(np.inf)).numpy(), np.where(row, np.inf, x))
    xi = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = Tensor(xi).masked_fill(Tensor(xi % 2 == 0), 7.9)
    assert out.dtype == dtypes.int32
    same(out.numpy(), np.where(xi % 2 == 0, 7, xi))
    (g,) = _grads(lambda t: t.masked_fill(Tensor(m), 0.0), x)
    same(g, ~m)


def test_masked_select_nonzero_where(data):
    x = data((3, 4))
    m = x > 0
    same(Tensor(x).masked_select(Tensor(m)).numpy(), x[m])
    row = np.array([True, False, True, True])
    same(Tensor(x).masked_select(Tensor(row)).numpy(), x[np.broadcast_to(row, x.shape)])
    assert Tensor(x).masked_select(Tensor(np.zeros((3, 4), bool))).shape == (0,)
    (g,) = _grads(lambda t: t.masked_select(Tensor(m)), x)
    same(g, m)
    a = np.array([[0, 1, 0], [2, 0, 3]], np.int32)
    nz = Tensor(a).nonzero()
    assert nz.dtype == dtypes.int64
    same(nz.numpy(), np.argwhere(a))
    for got, want in zip(Tensor(a).nonzero(as_tuple=True), np.nonzero(a)):
        same(got.numpy(), want)
    same(Tensor([0.0, np.nan, -0.0, 2.0]).nonzero().numpy(), [[1], [3]])
    assert Tensor(5).nonzero().shape == (1, 0) and Tensor(0).nonzero().shape == (0, 0)
    same(Tensor(5).nonzero(as_tuple=True)[0].numpy(), [0])
    assert Tensor(np.zeros((2, 2))).nonzero().shape == (0, 2)


# ---------------------------------------------------------------------- cumulative
def _cum_ref(a, axis, largest):
    """torch's cummax/cummin: ties take the later index, a NaN sticks (its latest index)."""
    a = np.moveaxis(a, axis, -1)
    vals, idx = np.empty_like(a), np.zeros(a.shape, np.int64)
    for pos in np.ndindex(a.shape[:-1]):
        best, bi = None, 0
        for j, v in enumerate(a[pos]):
            better = best is None or (v >= best if largest else v <= best)
            if (isinstance(v, float | np.floating) and np.isnan(v)) or (
                    not (isinstance(best, float | np.floating) and np.isnan(best)) and better):
                best, bi = v, j
            vals[pos + (j,)], idx[pos + (j,)] = best, bi
    return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)


@pytest.mark.parametrize("dt", SWEEP_DTYPES + [dtypes.bool], ids=str)
def test_cumulative_sweep(dt, data):
    a = data((3, N), dt, -2, 2)  # small ints: plenty of ties
    if dt.is_float:
        a[1, 2] = np.nan
    t = Tensor(a, dtype=dt)
    for dim in (1, 0):
        for largest in (True, False):
            v, i = (t.cummax if largest else t.cummin)(dim)
            rv, ri = _cum_ref(a, dim, largest)
            assert v.dtype == dt and i.dtype == dtypes.int64
            same(v.numpy(), rv, f"dim={dim} largest={largest}")
            same(i.numpy(), ri, f"dim={dim} largest={largest}")
    if dt.is_bool:
        return
    cp = t.cumprod(1)
    assert cp.dtype == (dtypes.int64 if dt.is_int else dt)
    ref = np.cumprod(a.astype(np.float64), 1)
    near(cp.numpy().astype(np.float64), ref, rtol=2e-3 if dt == dtypes.float16 else 1e-6)


def test_cumprod_cumulative_extras(data):
    assert Tensor([True, True, False]).cumprod(0).dtype == dtypes.int64
    same(Tensor([2, 3, 4], dtype=dtypes.int8).cumprod(0, dtype=dtypes.float32).numpy(),
                                  [2.0, 6.0, 24.0])
    x = data((2, 5))
    x[0, 2] = 0.0
    (g,) = _grads(lambda t: t.cumprod(1), x)
    near(g, _fd(lambda a: np.cumprod(a, 1), [x.astype(np.float64)], 1.0), rtol=1e-4, atol=1e-5)
    v, i = Tensor(5.0).cummax(0)
    assert v.item() == 5.0 and i.item() == 0


def test_logcumsumexp(data, check):
    a = data((3, N)) * 4
    b = np.array([-np.inf, -np.inf, 0.0, -1000.0, 1000.0, -np.inf], np.float32)
    outs = [Tensor(a).logcumsumexp(1), Tensor(a).logcumsumexp(0), Tensor(b).logcumsumexp(0),
            Tensor(a, dtype=dtypes.float16).logcumsumexp(1)]
    exp = [np.logaddexp.accumulate(a, 1), np.logaddexp.accumulate(a, 0), np.logaddexp.accumulate(b),
           np.logaddexp.accumulate(a.astype(np.float16).astype(np.float64), 1)]
    check(outs, exp, atol=1e-5)
    assert Tensor([1, 2]).logcumsumexp(0).dtype == dtypes.float32
    x = data((2, N)).astype(np.float64)
    up = data((2, N)).astype(np.float64)
    (g,) = _grads(lambda t: t.logcumsumexp(1), x, upstream=up)
    near(g, _fd(lambda v: np.logaddexp.accumulate(v, 1), [x], up), rtol=1e-6, atol=1e-8)


def test_cummax_gradient_goes_to_the_index(data):
    x = np.array([[1.0, 3.0, 2.0, 3.0, 0.5]])
    (g,) = _grads(lambda t: t.cummax(1).values, x)
    same(g, [[1.0, 2.0, 0.0, 2.0, 0.0]])  # a tie moves the index to the later 3
    (g,) = _grads(lambda t: t.cummin(1).values, x)
    same(g, [[4.0, 0.0, 0.0, 0.0, 1.0]])


# ---------------------------------------------------------------------- sorting
def _sort_ref(a, axis, descending):
    """Stable order with NaN the largest (torch), descending keeping equal elements in index order."""
    a = np.moveaxis(a, axis, -1)
    idx = np.zeros(a.shape, np.int64)
    for pos in np.ndindex(a.shape[:-1]):
        row = a[pos]
        key = lambda i, row=row: (bool(np.isnan(row[i])) if row.dtype.kind == "f" else False,
                                  0 if row.dtype.kind == "f" and np.isnan(row[i]) else row[i])
        idx[pos] = sorted(range(len(row)), key=key, reverse=descending)
    return np.moveaxis(np.take_along_axis(a, idx, -1), -1, axis), np.moveaxis(idx, -1, axis)


@pytest.mark.parametrize("dt", SWEEP_DTYPES + [dtypes.uint8, dtypes.bool], ids=str)
def test_sort_sweep(dt, data):
    a = data((3, N), dt, -2, 2) if not dt.is_unsigned else data((3, N), dt, 0, 1)
    if dt.is_float:
        a[0, 1] = a[2, 4] = np.nan
        a[1, :3] = a[1, 4]
    t = Tensor(a, dtype=dt)
    for dim in (1, 0):
        for desc in (False, True):
            v, i = t.sort(dim, descending=desc, stable=True)
            rv, ri = _sort_ref(a, dim, desc)
            assert v.dtype == dt and i.dtype == dtypes.int64
            same(v.numpy(), rv, f"dim={dim} desc={desc}")
            same(i.numpy(), ri, f"dim={dim} desc={desc}")
            same(t.argsort(dim, desc).numpy(), ri)
    for largest in (True, False):
        v, i = t.topk(3, dim=1, largest=largest)
        rv, ri = _sort_ref(a, 1, largest)
        same(v.numpy(), rv[:, :3])
        same(i.numpy(), ri[:, :3])


def test_sort_shapes_and_gradients(data):
    a = data((2, 3, 4))
    v, i = Tensor(a).sort()  # default dim -1
    same(v.numpy(), np.sort(a, -1))
    same(i.numpy(), np.argsort(a, -1, kind="stable"))
    v, i = Tensor(a).topk(2, dim=1, largest=False)
    same(i.numpy(), np.argsort(a, 1, kind="stable")[:, :2])
    assert Tensor(a).topk(0, dim=0).values.shape == (0, 3, 4)
    with pytest.raises(ValueError):
        Tensor(a).topk(5)
    s = Tensor(3.0).sort()
    assert s.values.item() == 3.0 and s.indices.item() == 0
    vals, idx = Tensor(a).sort(1, descending=True)
    assert vals.shape == idx.shape == a.shape
    up = data((2, 3, 4))
    # the gradient of sorted values is the upstream gradient sent back to where each value came from
    (g,) = _grads(lambda t: t.sort(1, descending=True).values, a, upstream=up)
    want = np.zeros_like(a)
    np.put_along_axis(want, np.argsort(-a, 1, kind="stable"), up, 1)
    same(g, want)
    (g,) = _grads(lambda t: t.topk(2, dim=-1).values, a, upstream=up[..., :2])
    want = np.zeros_like(a)
    np.put_along_axis(want, np.argsort(-a, -1, kind="stable")[..., :2], up[..., :2], -1)
    same(g, want)


# ---------------------------------------------------------------------- shape helpers
def test_roll(data):
    a = data((3, 4, 5))
    for shifts, dims in ((1, 0), (-2, 1), ((1, 3), (0, 2)), (7, -1), (0, 1), ((2, -1), (1, 1))):
        same(Tensor(a).roll(shifts, dims).numpy(), np.roll(a, shifts, dims))
    same(Tensor(a).roll(5).numpy(), np.roll(a, 5))
    ai = np.arange(6, dtype=np.int16).reshape(2, 3)
    same(Tensor(ai).roll(-4, 1).numpy(), np.roll(ai, -4, 1))
    up = data((3, 4, 5))
    (g,) = _grads(lambda t: t.roll((1, 3), (0, 2)), a, upstream=up)
    same(g, np.roll(up, (-1, -3), (0, 2)))


def test_diag_diagonal(data):
    v = data((4,))
    for k in (0, 1, -2, 5):
        same(Tensor(v).diag(k).numpy(), np.diag(v, k))
    same(Tensor([True, False]).diag().numpy(), np.diag([True, False]))
    m = data((3, 5))
    for k in (0, 2, -1, -4, 6):
        same(Tensor(m).diag(k).numpy(), np.diag(m, k))
    c = data((2, 3, 4))
    for off, d1, d2 in ((0, 0, 1), (1, 1, 2), (-1, 2, 0), (0, -1, -2), (2, 0, 2)):
        same(Tensor(c).diagonal(off, d1, d2).numpy(), np.diagonal(c, off, d1, d2))
    with pytest.raises(ValueError):
        Tensor(c).diag()
    up = data((4, 4))
    (g,) = _grads(lambda t: t.diag(), v, upstream=up)
    same(g, np.diag(up))
    (g,) = _grads(lambda t: t.diagonal(1, 1, 2), c, upstream=np.ones((2, 3)))
    want = np.zeros_like(c)
    for i in range(3):
        want[:, i, i + 1] = 1
    same(g, want)


def test_meshgrid():
    a, b, c = np.arange(3), np.arange(4.0) * 2, np.array([5, 6])
    for idx in ("ij", "xy"):
        got = Tensor.meshgrid(Tensor(a), Tensor(b), Tensor(c), indexing=idx)
        for g, w in zip(got, np.meshgrid(a, b, c, indexing=idx)):
            same(g.numpy(), w)
        got = Tensor.meshgrid([Tensor(a), Tensor(b)], indexing=idx)
        for g, w in zip(got, np.meshgrid(a, b, indexing=idx)):
            same(g.numpy(), w)
    (only,) = Tensor.meshgrid(Tensor(a))
    same(only.numpy(), a)
    with pytest.raises(ValueError):
        Tensor.meshgrid(Tensor(a), indexing="yx")


def test_repeat_interleave(data):
    a = data((2, 3))
    same(Tensor(a).repeat_interleave(2).numpy(), np.repeat(a, 2))
    same(Tensor(a).repeat_interleave(3, dim=1).numpy(), np.repeat(a, 3, 1))
    same(Tensor(a).repeat_interleave(Tensor([1, 0, 2]), dim=1).numpy(),
                                  np.repeat(a, [1, 0, 2], 1))
    same(Tensor(a).repeat_interleave(Tensor([2, 1]), dim=0).numpy(), np.repeat(a, [2, 1], 0))
    same(Tensor(a).repeat_interleave(Tensor([2]), dim=-1).numpy(), np.repeat(a, 2, -1))
    ai = np.array([[1, 2], [3, 4]], np.int8)
    same(Tensor(ai).repeat_interleave([1, 3], dim=0).numpy(), np.repeat(ai, [1, 3], 0))
    with pytest.raises(ValueError):
        Tensor(a).repeat_interleave(Tensor([1, 2]), dim=1)
    (g,) = _grads(lambda t: t.repeat_interleave(Tensor([1, 0, 2]), dim=1), a)
    same(g, np.broadcast_to([1.0, 0.0, 2.0], a.shape))
    (g,) = _grads(lambda t: t.repeat_interleave(2, dim=0), a)
    same(g, np.full(a.shape, 2.0))


def test_unfold(data):
    from numpy.lib.stride_tricks import sliding_window_view as windows
    a = data((3, 7, 2))
    for dim, size, step in ((1, 3, 1), (1, 2, 2), (1, 7, 3), (0, 2, 1), (-1, 1, 1), (1, 3, 4)):
        want = np.moveaxis(windows(a, size, axis=dim), -1, -1)
        sl = [slice(None)] * 3
        sl[dim] = slice(None, None, step)
        same(Tensor(a).unfold(dim, size, step).numpy(), want[tuple(sl)],
                                      f"{dim} {size} {step}")
    assert Tensor(2.0).unfold(0, 1, 1).shape == (1,)
    with pytest.raises(ValueError):
        Tensor(a).unfold(1, 8, 1)
    (g,) = _grads(lambda t: t.unfold(1, 3, 2), a)
    same(g[0, :, 0], [1, 1, 2, 1, 2, 1, 1])
