"""API parity (nn ops): scatter / scatter_reduce, interpolate, 1-d/2-d/3-d pooling (indices, ceil_mode,
count_include_pad, divisor_override), max_unpool, conv_transpose1d/2d/3d, pad modes with negative pads,
attention with grouped K/V heads, and the losses as Tensor methods: values and gradients against numpy
references written here (loops, torch's formulas). Gradients are compared element by element with central
differences of the numpy reference (float64), contracted with a fixed random output weight.

Under DEV=NV NV_MOCK=1 every kernel runs in the mock GPU's PTX interpreter, so the cases are fewer and
smaller there (SMALL)."""
from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from rawgrad.nn import functional as F
from rawgrad.tensor.tensor import Tensor

SMALL = os.environ.get("DEV", "").upper().startswith("NV")
RNG_SEED = 20240611


def pick(cases: list[Any], small: int) -> list[Any]:
    """All the cases on the CPU; the first `small` on the mock GPU."""
    return cases[:small] if SMALL else cases


@pytest.fixture
def g() -> np.random.Generator:
    return np.random.default_rng(RNG_SEED)


def numeric_grads(ref: Callable[..., np.ndarray], arrays: Sequence[np.ndarray], weight: np.ndarray,
                  wrt: Sequence[int], h: float = 1e-6) -> list[np.ndarray]:
    """d sum(ref(*arrays) * weight) / d arrays[i] for i in wrt, by central differences in float64."""
    xs = [np.asarray(a, np.float64) for a in arrays]
    out = []
    for i in wrt:
        grad = np.zeros_like(xs[i])
        for j in range(xs[i].size):
            plus = [x.copy() for x in xs]
            minus = [x.copy() for x in xs]
            plus[i].flat[j] += h
            minus[i].flat[j] -= h
            grad.flat[j] = (np.sum(ref(*plus) * weight) - np.sum(ref(*minus) * weight)) / (2 * h)
        out.append(grad)
    return out


def check_op(fn: Callable[..., Tensor], ref: Callable[..., np.ndarray], arrays: Sequence[np.ndarray],
             wrt: Sequence[int] = (0,), ints: Sequence[Any] = (), rtol: float = 1e-4, atol: float = 1e-5,
             grad_atol: float = 1e-3) -> None:
    """fn(*float tensors, *ints) against ref(*arrays, *ints): the value, and the gradient of the value
    contracted with a random weight with respect to the arrays in wrt (float32 on the device)."""
    ts = [Tensor(np.asarray(a, np.float32), requires_grad=i in wrt) for i, a in enumerate(arrays)]
    out = fn(*ts, *ints)
    expected = ref(*[np.asarray(a, np.float64) for a in arrays], *ints)
    assert tuple(out.shape) == expected.shape, f"shape {out.shape} != expected {expected.shape}"
    weight = np.random.default_rng(5).uniform(0.5, 1.5, size=expected.shape)
    grads = (out * Tensor(weight.astype(np.float32))).sum().gradient(*[ts[i] for i in wrt]) if wrt else []
    Tensor.realize(out, *grads)
    np.testing.assert_allclose(out.numpy(), expected, rtol=rtol, atol=atol)
    ref_grads = numeric_grads(lambda *xs: ref(*xs, *ints), arrays, weight, wrt)
    for i, got, exp in zip(wrt, grads, ref_grads):
        np.testing.assert_allclose(got.numpy(), exp, rtol=1e-3, atol=grad_atol,
                                   err_msg=f"gradient of input {i}")


# ---------------------------------------------------------------------- scatter
def ref_scatter(x: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray | float,
                reduce: str | None = None, include_self: bool = True) -> np.ndarray:
    """torch's loop: every index position in C order writes (or joins the reduce of) its target."""
    out = np.array(x, dtype=np.float64, copy=True)
    groups: dict[tuple[int, ...], list[float]] = {}
    for p in itertools.product(*[range(s) for s in index.shape]):
        q = list(p)
        q[dim] = int(index[p]) % x.shape[dim]
        v = float(src if np.isscalar(src) else src[p])  # type: ignore[index]
        groups.setdefault(tuple(q), []).append(v)
    for q, vs in groups.items():
        if reduce is None:
            out[q] = vs[-1]
            continue
        allv = ([float(x[q])] if include_self else []) + vs
        fn = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max, "amin": np.min}[reduce]
        out[q] = fn(allv)
    return out


def test_scatter_values_and_gradients(g):
    x, src = g.normal(size=(4, 5)), g.normal(size=(3, 5))
    idx0 = np.array([[0, 1, 2, 3, 0], [2, 0, 1, 1, 3], [1, 3, 0, 2, 2]])  # duplicates along dim 0
    check_op(lambda a, b: a.scatter(0, Tensor(idx0), b), lambda a, b: ref_scatter(a, 0, idx0, b), [x, src],
             wrt=(0, 1))
    # dim 1, index smaller than self and src in the other dims, negative indices wrap
    idx1 = np.array([[4, 0, -1], [1, 2, 3], [0, 0, 1]])
    check_op(lambda a, b: a.scatter(1, Tensor(idx1), b), lambda a, b: ref_scatter(a, 1, idx1, b), [x, src],
             wrt=(0, 1))
    # scalar value, reduce='add' / 'multiply' (torch's older API)
    t, tix = Tensor(x.astype(np.float32)), Tensor(idx0)
    outs = [t.scatter(0, tix, value=2.5), t.scatter(0, tix, 1.5, reduce="add"),
            t.scatter(0, tix, Tensor(src.astype(np.float32)), reduce="multiply")]
    exp = [ref_scatter(x, 0, idx0, 2.5), ref_scatter(x, 0, idx0, 1.5, "sum"),
           ref_scatter(x, 0, idx0, src, "prod")]
    Tensor.realize(*outs)
    for o, e in zip(outs, exp):
        np.testing.assert_allclose(o.numpy(), e, rtol=1e-5, atol=1e-5)
    # 3-d, scatter along the middle dim; ints keep their dtype
    x3, i3 = g.integers(-9, 9, size=(2, 4, 3)), g.integers(0, 4, size=(2, 6, 3))
    s3 = g.integers(-9, 9, size=(2, 6, 3))
    o3 = Tensor(x3.astype(np.int32)).scatter(1, Tensor(i3), Tensor(s3.astype(np.int32)))
    np.testing.assert_array_equal(o3.numpy(), ref_scatter(x3, 1, i3, s3).astype(np.int32))
    with pytest.raises(ValueError, match="exactly one of src or value"):
        t.scatter(0, tix)
    with pytest.raises(ValueError, match="index shape"):
        t.scatter(1, Tensor(np.zeros((5, 2), np.int64)), 1.0)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(g, reduce, include_self):
    if SMALL and reduce in ("prod", "amin") and include_self:
        pytest.skip("fewer cases on the mock GPU")
    x, src = g.normal(size=(3, 4)), g.normal(size=(3, 6))
    idx = np.array([[0, 1, 1, 3, 0, 1], [2, 2, 2, 0, 0, 3], [1, 0, 3, 3, 3, 0]])  # row 2 col 1 never hit
    check_op(lambda a, b: a.scatter_reduce(1, Tensor(idx), b, reduce, include_self=include_self),
             lambda a, b: ref_scatter(a, 1, idx, b, reduce, include_self), [x, src], wrt=(0, 1))


def test_scatter_reduce_ties_and_ints():
    # amax ties: torch shares the gradient evenly between every element equal to the result (self included)
    x = Tensor(np.array([1.0, 0.0], np.float32), requires_grad=True)
    s = Tensor(np.array([1.0, 1.0, 0.5], np.float32), requires_grad=True)
    out = x.scatter_reduce(0, Tensor(np.array([0, 0, 1])), s, "amax")
    gx, gs = out.sum().gradient(x, s)
    np.testing.assert_allclose(out.numpy(), [1.0, 0.5])
    np.testing.assert_allclose(gx.numpy(), [1 / 3, 0.0], rtol=1e-6)
    np.testing.assert_allclose(gs.numpy(), [1 / 3, 1 / 3, 1.0], rtol=1e-6)
    # integer mean rounds down (floor, as torch)
    xi = Tensor(np.array([0, 7, -3], np.int32))
    si = Tensor(np.array([2, -4, 1, 5], np.int32))
    mean = xi.scatter_reduce(0, Tensor(np.array([0, 0, 1, 2])), si, "mean")
    np.testing.assert_array_equal(mean.numpy(), [(0 + 2 - 4) // 3, (7 + 1) // 2, (-3 + 5) // 2])
    with pytest.raises(ValueError, match="reduce must be one of"):
        xi.scatter_reduce(0, Tensor(np.array([0])), si, "max")


# ---------------------------------------------------------------------- interpolate
def _src_index(o: int, n_in: int, n_out: int, scale: float | None, mode: str, align: bool) -> Any:
    """torch's per-axis source coordinate (float32 arithmetic, as torch computes it for float inputs)."""
    f = np.float32
    s = f(1.0 / scale) if scale else f(n_in) / f(n_out)
    if mode == "nearest":
        return min(int(np.floor(f(o) * s)), n_in - 1)
    if mode == "nearest-exact":
        return min(int(np.floor((f(o) + f(0.5)) * s)), n_in - 1)
    if align:
        return float(f(n_in - 1) / f(n_out - 1) * f(o)) if n_out > 1 else 0.0
    return float(s * (f(o) + f(0.5)) - f(0.5))


def _taps(o: int, n_in: int, n_out: int, scale: float | None, mode: str,
          align: bool) -> list[tuple[int, float]]:
    src = _src_index(o, n_in, n_out, scale, mode, align)
    if mode.startswith("nearest"):
        return [(src, 1.0)]
    if mode == "bicubic":
        fl = math.floor(src)
        t, a = src - fl, -0.75
        c1 = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # noqa: E731
        c2 = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # noqa: E731
        ws = [c2(t + 1), c1(t), c1(1 - t), c2(2 - t)]
        return [(min(max(fl - 1 + k, 0), n_in - 1), w) for k, w in enumerate(ws)]
    if mode == "area":
        lo, hi = (o * n_in) // n_out, -(-((o + 1) * n_in) // n_out)
        return [(i, 1.0 / (hi - lo)) for i in range(lo, hi)]
    src = max(src, 0.0)
    i0 = int(src)
    lam = min(max(src - i0, 0.0), 1.0)
    return [(i0, 1 - lam), (min(i0 + 1, n_in - 1), lam)]


def ref_interpolate(x: np.ndarray, size: Sequence[int], mode: str, align: bool = False,
                    scales: Sequence[float | None] | None = None) -> np.ndarray:
    """Separable resampling, one spatial axis after another, each output a weighted sum of its taps."""
    out = np.asarray(x, np.float64)
    for j, n_out in enumerate(size):
        ax = 2 + j
        n_in = out.shape[ax]
        sc = scales[j] if scales else None
        rows = []
        for o in range(n_out):
            acc = 0.0
            for i, w in _taps(o, n_in, n_out, sc, mode, align):
                acc = acc + w * np.take(out, i, axis=ax)
            rows.append(acc)
        out = np.stack(rows, axis=ax)
    return out


INTERP = [  # (input shape, size or None, scale_factor or None, mode, align_corners)
    ((1, 2, 5), (8,), None, "linear", False),
    ((2, 1, 4, 3), (3, 7), None, "bilinear", False),
    ((1, 2, 6), (4,), None, "nearest", None),
    ((1, 1, 3, 4), None, 2.0, "nearest", None),
    ((1, 1, 4, 5), (6, 3), None, "bilinear", True),
    ((1, 1, 2, 3, 3), (3, 5, 2), None, "trilinear", False),
    ((1, 1, 5, 4), None, 1.5, "nearest-exact", None),
    ((1, 2, 5), None, 1.7, "linear", False),
    ((1, 1, 3, 2, 4), None, (2.0, 1.5, 0.5), "nearest", None),
    ((1, 1, 4, 4), (7, 5), None, "bicubic", False),
    ((1, 1, 4, 3), (5, 5), None, "bicubic", True),
    ((1, 1, 7, 5), (3, 2), None, "area", None),
    ((1, 1, 2, 3, 2), (4, 3, 3), None, "trilinear", True),
    ((1, 1, 5), (2,), None, "linear", True),
]


@pytest.mark.parametrize("case", pick(INTERP, 6), ids=lambda c: f"{c[3]}-{len(c[0])}d")
def test_interpolate(g, case):
    shape, size, sf, mode, align = case
    nd = len(shape) - 2
    x = g.normal(size=shape)
    if size is None:
        sfs = (sf,) * nd if isinstance(sf, float) else sf
        out_size = tuple(int(math.floor(i * s)) for i, s in zip(shape[2:], sfs))
        scales: Sequence[float | None] | None = sfs
    else:
        out_size, scales = size, None
    check_op(lambda a: a.interpolate(size, sf, mode, align),
             lambda a: ref_interpolate(a, out_size, mode, bool(align), scales), [x])


def test_interpolate_known_values_and_errors():
    x = Tensor(np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32))
    # torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear") (align_corners=False)
    exp = [[1.0, 1.25, 1.75, 2.0], [1.5, 1.75, 2.25, 2.5], [2.5, 2.75, 3.25, 3.5], [3.0, 3.25, 3.75, 4.0]]
    np.testing.assert_allclose(x.interpolate(scale_factor=2, mode="bilinear").numpy()[0, 0], exp)
    np.testing.assert_allclose(F.interpolate(Tensor(np.arange(5.0).reshape(1, 1, 5)), size=3).numpy()[0, 0],
                               [0, 1, 3])
    ints = Tensor(np.arange(6, dtype=np.int32).reshape(1, 1, 6)).interpolate(size=4)
    assert ints.dtype == Tensor([1]).dtype and ints.numpy().tolist() == [[[0, 1, 3, 4]]]
    with pytest.raises(ValueError, match="mode 'bilinear' needs a \\[4\\]-d input"):
        Tensor.ones(1, 1, 4).interpolate(size=3, mode="bilinear")
    with pytest.raises(ValueError, match="align_corners is only for"):
        Tensor.ones(1, 1, 4).interpolate(size=3, mode="nearest", align_corners=True)
    with pytest.raises(ValueError, match="exactly one of size or scale_factor"):
        Tensor.ones(1, 1, 4).interpolate()


# ---------------------------------------------------------------------- pooling and unpooling
def _windows(spatial: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int],
             pads: Sequence[int], ceil: bool) -> list[tuple[int, list[tuple[int, ...]], list[int]]]:
    """Per output position (flat): the window's input coordinates (padding included as out-of-range)."""
    outs = []
    for i, kk, ss, dd, p in zip(spatial, k, s, d, pads):
        span = dd * (kk - 1) + 1
        num = i + 2 * p - span
        o = (-(-num // ss) if ceil else num // ss) + 1
        if ceil and (o - 1) * ss >= i + p:
            o -= 1
        outs.append(o)
    res = []
    for opos in itertools.product(*[range(o) for o in outs]):
        starts = [op * ss - p for op, ss, p in zip(opos, s, pads)]
        per_dim = [[st + j * dd for j in range(kk)] for st, kk, dd in zip(starts, k, d)]
        coords = list(itertools.product(*per_dim))
        res.append((0, coords, outs))
    return res


def ref_max_pool(x: np.ndarray, k: Sequence[int], s: Sequence[int], d: Sequence[int], pads: Sequence[int],
                 ceil: bool) -> tuple[np.ndarray, np.ndarray]:
    n = len(k)
    spatial = x.shape[-n:]
    wins = _windows(spatial, k, s, d, pads, ceil)
    outs = wins[0][2]
    lead = x.shape[:-n]
    vals = np.zeros(lead + (len(wins),))
    idx = np.zeros(lead + (len(wins),), np.int64)
    for w, (_, coords, _) in enumerate(wins):
        for li in itertools.product(*[range(v) for v in lead]):
            best, bi = -np.inf, -1
            for c in coords:
                if all(0 <= ci < si for ci, si in zip(c, spatial)):
                    v = x[li + tuple(c)]
                    if v > best or bi < 0:
                        best, bi = v, int(np.ravel_multi_index(c, spatial))
            vals[li + (w,)], idx[li + (w,)] = best, bi
    return vals.reshape(lead + tuple(outs)), idx.reshape(lead + tuple(outs))


def ref_avg_pool(x: np.ndarray, k: Sequence[int], s: Sequence[int], pads: Sequence[int], ceil: bool,
                 include_pad: bool, divisor: int | None) -> np.ndarray:
    """torch's avg_pool loop: the divisor counts the window inside input + padding (include_pad), else
    inside the input; ceil_mode's overhang never counts."""
    n = len(k)
    spatial = x.shape[-n:]
    wins = _windows(spatial, k, s, (1,) * n, pads, ceil)
    lead = x.shape[:-n]
    out = np.zeros(lead + (len(wins),))
    for w, (_, coords, _) in enumerate(wins):
        inside = [c for c in coords if all(0 <= ci < si for ci, si in zip(c, spatial))]
        padded = [c for c in coords if all(-p <= ci < si + p for ci, si, p in zip(c, spatial, pads))]
        total = sum(x[(...,) + tuple(c)] for c in inside)
        div = divisor if divisor else len(padded) if include_pad else len(inside)
        out[..., w] = total / div
    return out.reshape(lead + tuple(wins[0][2]))


MAXPOOL = [  # (shape, kernel, stride, dilation, padding, ceil_mode)
    ((1, 2, 6, 7), (2, 2), None, 1, 0, False),
    ((1, 1, 7, 8), (3, 3), 2, 1, 1, False),
    ((2, 1, 10), (3,), 2, 1, 1, True),
    ((1, 1, 5, 6), (2, 3), (2, 2), (2, 1), (1, 1), True),
    ((1, 1, 4, 5, 5), (2, 2, 3), 2, 1, (0, 1, 1), False),
    ((1, 1, 5, 4, 4), (3, 2, 2), (2, 2, 1), 1, (1, 0, 1), True),
]


@pytest.mark.parametrize("case", pick(MAXPOOL, 5), ids=lambda c: f"{len(c[1])}d")
def test_max_pool_values_indices_gradients(g, case):
    shape, k, st, dl, pad, ceil = case
    n = len(k)
    x = g.permutation(int(np.prod(shape))).reshape(shape) / 7.0  # distinct: no ties for the gradient
    kt = tuple(k)
    stt = kt if st is None else (st,) * n if isinstance(st, int) else tuple(st)
    dlt = (dl,) * n if isinstance(dl, int) else tuple(dl)
    pdt = (pad,) * n if isinstance(pad, int) else tuple(pad)
    pool = {1: Tensor.max_pool1d, 2: Tensor.max_pool2d, 3: Tensor.max_pool3d}[n]
    check_op(lambda a: pool(a, k, st, dl, pad, ceil),
             lambda a: ref_max_pool(a, kt, stt, dlt, pdt, ceil)[0], [x])
    vals, idx = pool(Tensor(x.astype(np.float32)), k, st, dl, pad, ceil, return_indices=True)
    assert idx.dtype.name == "int64"
    np.testing.assert_array_equal(idx.numpy(), ref_max_pool(x, kt, stt, dlt, pdt, ceil)[1])


def test_max_pool_indices_first_maximum():
    x = Tensor(np.array([[[[1.0, 3.0, 3.0], [3.0, 0.0, 2.0], [5.0, 5.0, 5.0]]]], np.float32))
    vals, idx = x.max_pool2d(2, stride=1, return_indices=True)
    np.testing.assert_array_equal(vals.numpy()[0, 0], [[3, 3], [5, 5]])
    np.testing.assert_array_equal(idx.numpy()[0, 0], [[1, 1], [6, 7]])
    ints = Tensor(np.array([[[4, -2, 9, 9, 1]]], np.int32)).max_pool1d(2, 1, padding=1, return_indices=True)
    np.testing.assert_array_equal(ints[0].numpy(), [[[4, 4, 9, 9, 9, 1]]])
    np.testing.assert_array_equal(ints[1].numpy(), [[[0, 0, 2, 2, 3, 4]]])


AVGPOOL = [  # (shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    ((1, 2, 7, 6), (3, 3), 2, 1, True, True, None),
    ((1, 1, 7, 6), (3, 2), (2, 3), (1, 1), True, False, None),
    ((2, 1, 9), (4,), 3, 2, True, True, None),
    ((1, 1, 6, 5), (2, 2), 2, 1, False, False, None),
    ((1, 1, 5, 5), (3, 3), 2, 1, True, True, 4),
    ((1, 1, 4, 5, 4), (2, 3, 2), 2, (1, 1, 0), True, True, None),
    ((1, 1, 5, 4, 4), (3, 2, 2), (2, 2, 1), (1, 0, 1), True, False, None),
    ((1, 1, 11), (3,), 3, 0, True, False, None),
]


@pytest.mark.parametrize("case", pick(AVGPOOL, 6), ids=lambda c: f"{len(c[1])}d-ceil{c[4]}-pad{c[5]}")
def test_avg_pool(g, case):
    shape, k, st, pad, ceil, incl, div = case
    n = len(k)
    x = g.normal(size=shape)
    stt = (st,) * n if isinstance(st, int) else tuple(st)
    pdt = (pad,) * n if isinstance(pad, int) else tuple(pad)
    pool = {1: Tensor.avg_pool1d, 2: Tensor.avg_pool2d, 3: Tensor.avg_pool3d}[n]
    check_op(lambda a: pool(a, k, st, 1, pad, ceil, incl, div),
             lambda a: ref_avg_pool(a, tuple(k), stt, pdt, ceil, incl, div), [x])
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]  # torch's argument order
    out = fn(Tensor(x.astype(np.float32)), k, st, pad, ceil, incl, div)
    np.testing.assert_allclose(out.numpy(), ref_avg_pool(x, tuple(k), stt, pdt, ceil, incl, div), atol=1e-5)


def ref_max_unpool(x: np.ndarray, idx: np.ndarray, out_spatial: Sequence[int]) -> np.ndarray:
    n = len(out_spatial)
    lead = x.shape[:-n]
    out = np.zeros(lead + tuple(out_spatial))
    flat_out = out.reshape(lead + (-1,))
    xf, idf = x.reshape(lead + (-1,)), idx.reshape(lead + (-1,))
    for li in itertools.product(*[range(v) for v in lead]):
        for j in range(xf.shape[-1]):
            flat_out[li + (int(idf[li + (j,)]),)] = xf[li + (j,)]
    return out


UNPOOL = [  # (shape, kernel, stride, padding, output_size)
    ((1, 2, 6, 6), 2, None, 0, None),
    ((2, 1, 7, 5), 3, 2, 1, None),
    ((1, 1, 5, 7), (2, 3), (2, 2), 0, (5, 7)),
    ((1, 2, 9), 3, 2, 1, None),
    ((1, 1, 4, 4, 6), 2, 2, 0, None),
]


@pytest.mark.parametrize("case", pick(UNPOOL, 5), ids=lambda c: f"{len(c[0]) - 2}d")
def test_max_unpool(g, case):
    shape, k, st, pad, osize = case
    n = len(shape) - 2
    x = g.permutation(int(np.prod(shape))).reshape(shape).astype(np.float64)
    pool = {1: Tensor.max_pool1d, 2: Tensor.max_pool2d, 3: Tensor.max_pool3d}[n]
    unpool = {1: Tensor.max_unpool1d, 2: Tensor.max_unpool2d, 3: Tensor.max_unpool3d}[n]
    pooled, idx = pool(Tensor(x.astype(np.float32)), k, st, 1, pad, return_indices=True)
    p_np, i_np = pooled.numpy().astype(np.float64), idx.numpy()
    kt = (k,) * n if isinstance(k, int) else tuple(k)
    stt = kt if st is None else (st,) * n if isinstance(st, int) else tuple(st)
    pdt = (pad,) * n if isinstance(pad, int) else tuple(pad)
    out_sp = osize or tuple((i - 1) * s - 2 * p + kk for i, s, p, kk in zip(p_np.shape[-n:], stt, pdt, kt))
    check_op(lambda a: unpool(a, Tensor(i_np), k, st, pad, osize),
             lambda a: ref_max_unpool(a, i_np, out_sp), [p_np])
    if n == 2:  # round trip through torch's functional names
        back = F.max_unpool2d(pooled, idx, k, st, pad, tuple(shape[-2:]))
        kept = back.numpy() != 0
        np.testing.assert_array_equal(back.numpy()[kept], x.astype(np.float32)[kept])


def test_max_unpool_repeated_index_last_wins():
    vals = Tensor(np.array([[[2.0, 5.0, 7.0]]], np.float32))
    out = vals.max_unpool1d(Tensor(np.array([[[1, 1, 3]]])), 2, output_size=(4,))
    np.testing.assert_array_equal(out.numpy(), [[[0.0, 5.0, 0.0, 7.0]]])


# ---------------------------------------------------------------------- transposed convolution
def ref_conv_transpose(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: Sequence[int],
                       padding: Sequence[int], out_pad: Sequence[int], groups: int,
                       dilation: Sequence[int]) -> np.ndarray:
    """The definition: each input element adds input * kernel at out[i * stride - padding + k * dilation]."""
    nd = w.ndim - 2
    bs, cin = x.shape[:2]
    cout_g = w.shape[1]
    ks, ins = w.shape[2:], x.shape[2:]
    outs = [(i - 1) * s - 2 * p + d * (k - 1) + op + 1
            for i, s, p, d, k, op in zip(ins, stride, padding, dilation, ks, out_pad)]
    full = [o + 2 * p for o, p in zip(outs, padding)]
    out = np.zeros((bs, cout_g * groups) + tuple(full))
    cin_g = cin // groups
    for gi in range(groups):
        xs = x[:, gi * cin_g:(gi + 1) * cin_g]
        ws = w[gi * cin_g:(gi + 1) * cin_g]
        for ipos in itertools.product(*[range(i) for i in ins]):
            xv = xs[(slice(None), slice(None)) + ipos]  # (N, cin_g)
            for kpos in itertools.product(*[range(k) for k in ks]):
                opos = tuple(i * s + k * d for i, s, k, d in zip(ipos, stride, kpos, dilation))
                out[(slice(None), slice(gi * cout_g, (gi + 1) * cout_g)) + opos] += \
                    xv @ ws[(slice(None), slice(None)) + kpos]
    crop = tuple(slice(p, p + o) for p, o in zip(padding, outs))
    out = out[(slice(None), slice(None)) + crop]
    return out if b is None else out + b.reshape((1, -1) + (1,) * nd)


CONVT = [  # (x shape, w shape, stride, padding, output_padding, groups, dilation)
    ((1, 2, 4, 3), (2, 3, 3, 2), 2, 1, 1, 1, 1),
    ((2, 4, 3, 3), (4, 1, 2, 3), (1, 2), (0, 1), (0, 1), 2, (2, 1)),
    ((1, 2, 5), (2, 2, 3), 3, 2, 2, 1, 1),
    ((1, 2, 4), (2, 3, 2), 1, 0, 0, 2, 2),
    ((1, 2, 2, 3, 2), (2, 1, 2, 2, 2), 2, (1, 0, 1), (1, 0, 0), 1, 1),
    ((1, 1, 6, 6), (1, 2, 3, 3), 1, 3, 0, 1, 1),  # padding larger than the kernel reach: crops
]


@pytest.mark.parametrize("case", pick(CONVT, 5), ids=lambda c: f"{len(c[0]) - 2}d")
def test_conv_transpose(g, case):
    xs, ws, st, pad, op, groups, dl = case
    nd = len(xs) - 2
    tup = lambda v: (v,) * nd if isinstance(v, int) else tuple(v)  # noqa: E731
    x, w, b = g.normal(size=xs), g.normal(size=ws), g.normal(size=(ws[1] * groups,))
    meth = {1: Tensor.conv_transpose1d, 2: Tensor.conv_transpose2d, 3: Tensor.conv_transpose3d}[nd]
    check_op(lambda a, c, e: meth(a, c, e, groups, st, dl, pad, op),
             lambda a, c, e: ref_conv_transpose(a, c, e, tup(st), tup(pad), tup(op), groups, tup(dl)),
             [x, w, b], wrt=(0, 1, 2))
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]  # torch's order
    out = fn(Tensor(x.astype(np.float32)), Tensor(w.astype(np.float32)), None, st, pad, op, groups, dl)
    np.testing.assert_allclose(out.numpy(), ref_conv_transpose(x, w, None, tup(st), tup(pad), tup(op), groups,
                                                               tup(dl)), rtol=1e-4, atol=1e-4)


def test_conv_transpose_errors():
    with pytest.raises(ValueError, match="output_padding"):
        Tensor.ones(1, 1, 3).conv_transpose1d(Tensor.ones(1, 1, 2), stride=2, output_padding=2)
    with pytest.raises(ValueError, match="3-d weight"):
        Tensor.ones(1, 1, 3, 3).conv_transpose1d(Tensor.ones(1, 1, 2, 2))


# ---------------------------------------------------------------------- pad modes and negative pads
def ref_pad(x: np.ndarray, flat: Sequence[int], mode: str, value: float = 0.0) -> np.ndarray:
    """torch's F.pad: flat (left, right) pairs from the last dim backwards; negative amounts crop first."""
    pairs = [(0, 0)] * x.ndim
    for i in range(len(flat) // 2):
        pairs[x.ndim - 1 - i] = (flat[2 * i], flat[2 * i + 1])
    crop = tuple(slice(max(-b, 0), x.shape[d] - max(-a, 0)) for d, (b, a) in enumerate(pairs))
    y = x[crop]
    pos = [(max(b, 0), max(a, 0)) for b, a in pairs]
    if mode == "constant":
        return np.pad(y, pos, constant_values=value)
    return np.pad(y, pos, mode={"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode])


PADS = [
    ((2, 3, 5), (2, 1), "reflect"), ((2, 3, 5), (-1, 3), "reflect"), ((1, 2, 4, 5), (1, -2, 3, 1), "reflect"),
    ((2, 3, 5), (3, -2), "replicate"), ((1, 2, 4, 5), (-1, 2, 2, 0), "replicate"),
    ((2, 3, 5), (-2, 3), "circular"), ((1, 2, 4, 5), (2, 2, -1, 3), "circular"),
    ((1, 1, 2, 3, 4), (1, 1, -1, 2, 1, 0), "circular"), ((1, 1, 3, 3, 4), (2, -1, 1, 1, 0, 2), "reflect"),
    ((2, 3, 5), (-1, -2), "constant"), ((2, 4, 5), (2, -1, -3, 1), "constant"),
]


@pytest.mark.parametrize("case", pick(PADS, 8), ids=lambda c: f"{c[2]}-{c[1]}")
def test_pad_modes_negative(g, case):
    shape, flat, mode = case
    x = g.normal(size=shape)
    check_op(lambda a: a.pad(flat, mode=mode), lambda a: ref_pad(a, flat, mode), [x])
    if mode == "constant":
        out = Tensor(x.astype(np.float32)).pad(flat, value=2.5)
        np.testing.assert_allclose(out.numpy(), ref_pad(x, flat, mode, 2.5), rtol=1e-6)


def test_pad_errors():
    with pytest.raises(ValueError, match="reflect padding"):
        Tensor.ones(1, 3).pad((3, 0), mode="reflect")
    with pytest.raises(ValueError, match="reflect padding"):  # after the crop only 2 remain
        Tensor.ones(1, 4).pad((2, -2), mode="reflect")
    with pytest.raises(ValueError, match="pad mode"):
        Tensor.ones(1, 3).pad((1, 1), mode="symmetric")


# ---------------------------------------------------------------------- attention with grouped K/V
def ref_sdpa(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False) -> np.ndarray:
    r = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, r, axis=-3), np.repeat(v, r, axis=-3)
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("heads", pick([(4, 2, True), (6, 2, False), (3, 3, False)], 1))
def test_sdpa_gqa(g, heads):
    hq, hk, causal = heads
    q, k, v = g.normal(size=(1, hq, 3, 4)), g.normal(size=(1, hk, 3, 4)), g.normal(size=(1, hk, 3, 2))
    check_op(lambda a, b, c: a.scaled_dot_product_attention(b, c, is_causal=causal, enable_gqa=True),
             lambda a, b, c: ref_sdpa(a, b, c, causal), [q, k, v], wrt=(0, 1, 2))


def test_sdpa_gqa_errors():
    q, k = Tensor.ones(1, 4, 2, 2), Tensor.ones(1, 3, 2, 2)
    with pytest.raises(ValueError, match="not a multiple"):
        q.scaled_dot_product_attention(k, k, enable_gqa=True)


# ---------------------------------------------------------------------- losses as Tensor methods
def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def ref_cross_entropy(x: np.ndarray, y: np.ndarray, reduction: str = "mean", smoothing: float = 0.0,
                      weight: np.ndarray | None = None, ignore: int = -100) -> np.ndarray:
    """torch's formulas with classes on axis 1: the nll part and the smoothing part, weighted mean."""
    cd = 0 if x.ndim == 1 else 1
    lp = np.moveaxis(_log_softmax(x, cd), cd, -1)  # classes last
    c = lp.shape[-1]
    w = np.ones(c) if weight is None else weight
    yy = np.asarray(y).reshape(lp.shape[:-1])
    valid = yy != ignore
    safe = np.where(valid, yy, 0)
    picked = np.take_along_axis(lp, safe[..., None], -1)[..., 0]
    wt = np.where(valid, w[safe], 0.0)
    loss = -picked * wt
    if smoothing:
        loss = np.where(valid, (1 - smoothing) * loss - smoothing * (lp * w).sum(-1) / c, 0.0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.asarray(loss.sum())
    den = wt.sum() if weight is not None else max(valid.sum(), 1)
    return np.asarray(loss.sum() / den)


LOSSES = [  # (logits shape, reduction, label_smoothing, weighted, ignore a target)
    ((5, 4), "mean", 0.0, False, False),
    ((5, 4), "sum", 0.1, False, True),
    ((3, 4, 2), "none", 0.0, True, True),
    ((3, 4, 2), "mean", 0.2, True, True),
    ((4,), "mean", 0.0, False, False),
    ((6, 3), "mean", 0.0, True, False),
]


@pytest.mark.parametrize("case", pick(LOSSES, 3), ids=lambda c: f"{len(c[0])}d-{c[1]}-ls{c[2]}-w{c[3]}")
def test_cross_entropy_and_nll(g, case):
    shape, red, ls, weighted, ignore = case
    x = g.normal(size=shape)
    c = shape[1] if len(shape) > 1 else shape[0]
    yshape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
    y = g.integers(0, c, size=yshape)
    if ignore:
        y.flat[1] = 1
        y.flat[0] = 1  # ignore_index=1 below: a real class index, so the mask matters
    w = g.uniform(0.5, 2.0, size=c) if weighted else None
    ig = 1 if ignore else -100
    wt = None if w is None else Tensor(w.astype(np.float32))
    check_op(lambda a: a.cross_entropy(Tensor(y), red, ls, weight=wt, ignore_index=ig),
             lambda a: ref_cross_entropy(a, y, red, ls, w, ig), [x])
    # nll_loss on log-probabilities (tinygrad's argument order) and the functional spelling
    check_op(lambda a: a.log_softmax(1 if len(shape) > 1 else 0).nll_loss(Tensor(y), wt, ig, red),
             lambda a: ref_cross_entropy(a, y, red, 0.0, w, ig), [x])
    fx = F.nll_loss(Tensor(x.astype(np.float32)).log_softmax(1 if len(shape) > 1 else 0), Tensor(y), red, ig,
                    weight=wt)
    np.testing.assert_allclose(fx.numpy(), ref_cross_entropy(x, y, red, 0.0, w, ig), rtol=1e-5, atol=1e-6)


def test_cross_entropy_probabilities_and_sparse(g):
    x = g.normal(size=(4, 5))
    p = g.dirichlet(np.ones(5), size=4)
    w = g.uniform(0.5, 2.0, size=5)

    def ref_prob(a: np.ndarray, t: np.ndarray, ls: float = 0.0, wt: np.ndarray | None = None) -> np.ndarray:
        t = t * (1 - ls) + ls / 5
        return np.asarray((-(_log_softmax(a, 1) * t * (1 if wt is None else wt)).sum(1)).mean())
    check_op(lambda a, b: a.cross_entropy(b, label_smoothing=0.1), lambda a, b: ref_prob(a, b, 0.1), [x, p],
             wrt=(0, 1))
    check_op(lambda a: a.cross_entropy(Tensor(p.astype(np.float32)), weight=Tensor(w.astype(np.float32))),
             lambda a: ref_prob(a, p.astype(np.float32), 0.0, w), [x])
    # tinygrad's sparse_categorical_crossentropy: classes last, ignore_index=-1 by default
    z = g.normal(size=(2, 3, 4))
    y = g.integers(0, 4, size=(2, 3))
    y[0, 1] = -1
    flat_ref = lambda a, r: ref_cross_entropy(a.reshape(-1, 4), y.reshape(-1), r, 0.1, None, -1)  # noqa: E731
    check_op(lambda a: a.sparse_categorical_crossentropy(Tensor(y), label_smoothing=0.1),
             lambda a: flat_ref(a, "mean"), [z])
    out = Tensor(z.astype(np.float32)).sparse_categorical_crossentropy(Tensor(y), label_smoothing=0.1,
                                                                       reduction="none")
    np.testing.assert_allclose(out.numpy(), flat_ref(z, "none").reshape(2, 3), rtol=1e-5, atol=1e-6)
    fs = F.sparse_categorical_crossentropy(Tensor(z.astype(np.float32)), Tensor(y), label_smoothing=0.1)
    np.testing.assert_allclose(fs.numpy(), flat_ref(z, "mean"), rtol=1e-5)


def test_binary_losses(g):
    p, t = g.uniform(0.05, 0.95, size=(3, 4)), g.uniform(0, 1, size=(3, 4))
    z, pw = g.normal(size=(3, 4)) * 3, g.uniform(0.5, 3, size=(4,))

    def ref_bce(a: np.ndarray, y: np.ndarray) -> np.ndarray:
        loss = -(y * np.maximum(np.log(a), -100) + (1 - y) * np.maximum(np.log(1 - a), -100))
        return np.asarray(loss.mean())

    def ref_bce_logits(a: np.ndarray, y: np.ndarray, pos: np.ndarray | None = None, red: str = "mean") -> Any:
        s = 1 / (1 + np.exp(-a))
        loss = -((1 if pos is None else pos) * y * np.log(s) + (1 - y) * np.log(1 - s))
        return np.asarray(loss.mean() if red == "mean" else loss.sum() if red == "sum" else loss)
    check_op(lambda a, b: a.binary_crossentropy(b), ref_bce, [p, t], wrt=(0, 1))
    check_op(lambda a, b: a.binary_crossentropy_logits(b), ref_bce_logits, [z, t], wrt=(0, 1))
    check_op(lambda a, b: a.binary_crossentropy_logits(b, "sum", Tensor(pw.astype(np.float32))),
             lambda a, b: ref_bce_logits(a, b, pw, "sum"), [z, t], wrt=(0, 1))
    f1 = F.binary_cross_entropy(Tensor(p.astype(np.float32)), Tensor(t.astype(np.float32)), "none")
    f2 = F.binary_cross_entropy_with_logits(Tensor(z.astype(np.float32)), Tensor(t.astype(np.float32)),
                                            pos_weight=Tensor(pw.astype(np.float32)))
    np.testing.assert_allclose(f1.numpy(), -(t * np.log(p) + (1 - t) * np.log(1 - p)), rtol=1e-5)
    np.testing.assert_allclose(f2.numpy(), ref_bce_logits(z, t, pw), rtol=1e-5)
    # the probability form stays finite at 0 and 1 (logs clamped at -100, as torch)
    ones = Tensor(np.array([1.0, 1.0], np.float32))
    edge = Tensor(np.array([0.0, 1.0], np.float32)).binary_crossentropy(ones)
    np.testing.assert_allclose(edge.numpy(), 50.0)
