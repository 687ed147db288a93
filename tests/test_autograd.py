"""Gradients from the UOp graph against central finite differences in float64.

Each check differentiates a scalar f(inputs) (non-scalar outputs are contracted with a fixed random
weight, so the seed gradient is not all ones) and compares the analytic directional derivative
<grad, v> with (f(x + h v) - f(x - h v)) / 2h for a few random directions v: a wrong entry anywhere in
the gradient changes the dot product, and it costs two evaluations per direction instead of two per
element.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from rawgrad.dtype import dtypes
from rawgrad.nn.functional import conv_transpose2d
from rawgrad.tensor.tensor import Tensor

Fn = Callable[..., Tensor]


def _scalar_of(fn: Fn, weights: list[np.ndarray | None]) -> Callable[..., Tensor]:
    def f(*ts: Tensor) -> Tensor:
        out = fn(*ts)
        if not out.dtype.is_float:
            raise TypeError("checked functions must return floats")
        if out.numel() == 1:
            return out.reshape(())
        if weights[0] is None:
            weights[0] = np.random.default_rng(99).uniform(0.5, 1.5, size=out.shape)
        return (out * Tensor(weights[0])).sum()
    return f


def grad_check(fn: Fn, *arrays: np.ndarray, directions: int = 3, h: float = 1e-6,
               rtol: float = 1e-6, atol: float = 1e-8) -> list[np.ndarray]:
    """Check fn's gradient w.r.t. every float64 input against central differences; returns the grads."""
    xs = [np.asarray(a, np.float64) for a in arrays]
    f = _scalar_of(fn, [None])
    ts = [Tensor(x, requires_grad=True) for x in xs]
    grads = f(*ts).gradient(*ts)
    Tensor.realize(*grads)
    gs = [g.numpy() for g in grads]
    for g, x in zip(gs, xs):
        assert g.shape == x.shape and g.dtype == np.float64
        assert np.all(np.isfinite(g)), f"non-finite gradient {g}"
    rng = np.random.default_rng(7)
    for _ in range(directions):
        vs = [rng.normal(size=x.shape) for x in xs]
        plus = f(*[Tensor(np.asarray(x + h * v)) for x, v in zip(xs, vs)])
        minus = f(*[Tensor(np.asarray(x - h * v)) for x, v in zip(xs, vs)])
        Tensor.realize(plus, minus)
        numeric = (plus.item() - minus.item()) / (2 * h)
        analytic = sum(float((g * v).sum()) for g, v in zip(gs, vs))
        assert math.isclose(analytic, numeric, rel_tol=max(rtol, 1e-5), abs_tol=max(atol, 1e-6)), \
            f"directional derivative: analytic {analytic} vs numeric {numeric}"
    return gs


@pytest.fixture
def r() -> np.random.Generator:
    return np.random.default_rng(1234)


# ---------------------------------------------------------------------- elementwise
UNARY: dict[str, tuple[Fn, float, float]] = {  # name: (fn, low, high) of the inputs
    "neg": (lambda x: -x, -2, 2), "exp": (Tensor.exp, -2, 2), "exp2": (Tensor.exp2, -2, 2),
    "log": (Tensor.log, 0.2, 3), "log2": (Tensor.log2, 0.2, 3), "sqrt": (Tensor.sqrt, 0.2, 3),
    "rsqrt": (Tensor.rsqrt, 0.2, 3), "reciprocal": (Tensor.reciprocal, 0.3, 3), "sin": (Tensor.sin, -3, 3),
    "cos": (Tensor.cos, -3, 3), "tan": (Tensor.tan, -1, 1), "tanh": (Tensor.tanh, -2, 2),
    "sigmoid": (Tensor.sigmoid, -3, 3), "relu": (Tensor.relu, -2, 2),
    "leaky_relu": (Tensor.leaky_relu, -2, 2),
    "elu": (Tensor.elu, -2, 2), "gelu": (Tensor.gelu, -2, 2), "gelu_tanh": (lambda x: x.gelu("tanh"), -2, 2),
    "silu": (Tensor.silu, -2, 2), "softplus": (Tensor.softplus, -3, 3), "mish": (Tensor.mish, -2, 2),
    "abs": (Tensor.abs, -2, 2), "square": (Tensor.square, -2, 2), "erf": (Tensor.erf, -1.5, 1.5),
    "hardswish": (Tensor.hardswish, -2, 2), "logsigmoid": (Tensor.logsigmoid, -3, 3),
    "pow_scalar": (lambda x: x ** 3, -2, 2), "pow_frac": (lambda x: x ** 1.5, 0.2, 2),
    "rpow": (lambda x: 2.0 ** x, -2, 2), "clip": (lambda x: x.clip(-1, 1), -2, 2),
    "sign_times": (lambda x: x.sign() * x * x, -2, 2), "floor_mix": (lambda x: x.floor() + x * x, -2, 2),
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name: str, r: np.random.Generator) -> None:
    fn, lo, hi = UNARY[name]
    x = r.uniform(lo, hi, size=(3, 4))
    if name in ("relu", "leaky_relu", "abs", "clip", "sign_times", "floor_mix", "elu"):
        x = np.where(np.abs(x - np.round(x)) < 0.05, x + 0.1, x)  # keep off the kinks
        x = np.where(np.abs(np.abs(x) - 1) < 0.05, x * 1.1, x)
    grad_check(fn, x)


BINARY: dict[str, Fn] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "pow": lambda a, b: a.abs() ** b, "maximum": Tensor.maximum,
    "minimum": Tensor.minimum, "where": lambda a, b: (a > b).where(a * a, b * 3),
    "mixed": lambda a, b: (a * b).exp() / (1 + b * b) - a.sin() * b,
}


@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name: str, r: np.random.Generator) -> None:
    a = r.uniform(0.5, 2, size=(2, 3)) * r.choice([-1, 1], size=(2, 3))
    b = r.uniform(0.5, 2, size=(2, 3))
    grad_check(BINARY[name], a, b)


@pytest.mark.parametrize("shapes", [((3, 1), (1, 4)), ((4,), (2, 3, 4)), ((2, 1, 3), (5, 1)), ((), (2, 2))])
def test_broadcasting_sums_back(shapes: tuple[tuple[int, ...], ...], r: np.random.Generator) -> None:
    a, b = r.normal(size=shapes[0]), r.normal(size=shapes[1])
    ga, gb = grad_check(lambda x, y: x * y + x.exp() * y, a, b)
    assert ga.shape == a.shape and gb.shape == b.shape


def test_scalar_operands(r: np.random.Generator) -> None:
    grad_check(lambda x: 3 - 2 * x / 5 + 1 / (x * x + 1), r.normal(size=(5,)))


# ---------------------------------------------------------------------- movement and indexing
MOVEMENT: dict[str, Fn] = {
    "reshape": lambda x: x.reshape(4, 6) * Tensor(np.arange(24.0).reshape(4, 6)),
    "permute": lambda x: x.permute(2, 0, 1).reshape(4, 6).cumsum(1),
    "transpose": lambda x: x.transpose(0, 2) @ Tensor(np.ones((2, 1))),
    "expand": lambda x: x[:, :1, :].expand(2, 5, 4),
    "pad": lambda x: x.pad(((1, 0), (0, 2), (1, 1))).cumsum(2),
    "pad_value": lambda x: x.pad((1, 2), value=3.0).exp(),
    "pad_reflect": lambda x: x.pad((2, 1), mode="reflect").square(),
    "pad_replicate": lambda x: x.pad((1, 2, 0, 1), mode="replicate").square(),
    "slice_step": lambda x: x[:, ::2, 1:3],
    "slice_negative": lambda x: x[::-1, 2:0:-1, ::-3],
    "flip": lambda x: x.flip(1, 2).cumsum(1),
    "repeat": lambda x: x.repeat(2, 1, 2),
    "cat": lambda x: Tensor.cat(x, x * 2, x.exp(), dim=1),
    "stack": lambda x: Tensor.stack(x[0], x[1] * x[1], dim=2),
    "split": lambda x: x.split(1, dim=1)[1] * x.split(2, dim=1)[0].sum(1, keepdim=True),
    "squeeze": lambda x: x[:, :1].squeeze(1).unsqueeze(0),
    "flatten": lambda x: x.flatten(1) * Tensor(np.arange(12.0)),
    "int_index": lambda x: x[1, 2] * x[0, -1, 3],
    "tril": lambda x: x.tril(),
}


@pytest.mark.parametrize("name", list(MOVEMENT))
def test_movement(name: str, r: np.random.Generator) -> None:
    grad_check(MOVEMENT[name], r.normal(size=(2, 3, 4)))


def test_advanced_indexing(r: np.random.Generator) -> None:
    idx = Tensor(np.array([[0, 2], [2, 2]]))  # repeated index: gradients add up
    grad_check(lambda x: x[idx].sum(-1) * x[1:2, [0, 3]], r.normal(size=(3, 4)))


def test_gather_and_embedding(r: np.random.Generator) -> None:
    index = Tensor(np.array([[0, 1, 1], [2, 0, 2]]))
    grad_check(lambda x: x.gather(1, index).square(), r.normal(size=(2, 4)))
    ids = Tensor(np.array([[1, 0, 1], [3, 3, 2]]))
    (g,) = grad_check(lambda w: ids.embedding(w).exp(), r.normal(size=(4, 2)))
    assert g[1].sum() != 0 and g[3].sum() != 0


# ---------------------------------------------------------------------- reductions
REDUCTIONS: dict[str, Fn] = {
    "sum_all": lambda x: x.sum(), "sum_axis": lambda x: x.sum(1),
    "sum_axes_keep": lambda x: x.sum((0, 2), True),
    "mean": lambda x: x.mean(-1), "var": lambda x: x.var(1), "std": lambda x: x.std((0, 1)),
    "max_axis": lambda x: x.max(axis=1), "min_axis": lambda x: x.min(axis=2), "max_all": lambda x: x.max(),
    "prod": lambda x: x.prod(1), "logsumexp": lambda x: x.logsumexp(2), "cumsum": lambda x: x.cumsum(1),
    "softmax": lambda x: x.softmax(-1), "log_softmax": lambda x: x.log_softmax(1),
    "layernorm": lambda x: x.layernorm(), "norm2": lambda x: x.square().sum(-1).sqrt(),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction(name: str, r: np.random.Generator) -> None:
    grad_check(REDUCTIONS[name], r.normal(size=(2, 3, 4)))


def test_max_ties_split_evenly() -> None:
    x = Tensor(np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]), requires_grad=True)
    (g,) = x.max(axis=1).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [[0, 0.5, 0.5, 0], [0.25, 0.25, 0.25, 0.25]])


def test_maximum_tie_splits_half() -> None:
    a = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = Tensor(np.array([1.0, 5.0, 0.0]), requires_grad=True)
    ga, gb = a.maximum(b).sum().gradient(a, b)
    np.testing.assert_allclose(ga.numpy(), [0.5, 0, 1])
    np.testing.assert_allclose(gb.numpy(), [0.5, 1, 0])


def test_prod_with_zeros() -> None:
    x = Tensor(np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 4.0], [1.0, 2.0, 5.0]]), requires_grad=True)
    (g,) = x.prod(1).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [[0, 6, 0], [0, 0, 0], [10, 5, 2]])


# ---------------------------------------------------------------------- linear algebra and nn ops
def test_matmul(r: np.random.Generator) -> None:
    grad_check(lambda a, b: a @ b, r.normal(size=(3, 4)), r.normal(size=(4, 2)))
    grad_check(lambda a, b: a @ b, r.normal(size=(2, 1, 3, 4)), r.normal(size=(3, 4, 2)))
    grad_check(lambda a, b: a @ b, r.normal(size=(4,)), r.normal(size=(4, 3)))
    grad_check(lambda a, b: Tensor.einsum("ij,kj->ik", a, b), r.normal(size=(2, 3)), r.normal(size=(4, 3)))


@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1}, {"dilation": 2, "padding": (1, 0)},
                                {"groups": 2}])
def test_conv2d(kw: dict, r: np.random.Generator) -> None:
    cin = 4 if kw.get("groups") else 2
    cin_g = cin // kw.get("groups", 1)
    grad_check(lambda x, w, b: x.conv2d(w, b, **kw), r.normal(size=(2, cin, 5, 6)),
               r.normal(size=(4, cin_g, 3, 2)), r.normal(size=(4,)))


def _conv_transpose_ref(x: np.ndarray, w: np.ndarray, stride: int, padding: int, output_padding: int,
                        groups: int, dilation: int) -> np.ndarray:
    """The definition: every input pixel scatters its kernel-weighted copy into the output."""
    n, cin, h, wd = x.shape
    _, cout_g, kh, kw = w.shape
    full_h = (h - 1) * stride + dilation * (kh - 1) + 1 + output_padding
    full_w = (wd - 1) * stride + dilation * (kw - 1) + 1 + output_padding
    out = np.zeros((n, cout_g * groups, full_h, full_w))
    cin_g = cin // groups
    for c in range(cin):
        g = c // cin_g
        for i in range(h):
            for j in range(wd):
                for a in range(kh):
                    for b in range(kw):
                        oi, oj = i * stride + a * dilation, j * stride + b * dilation
                        out[:, g * cout_g:(g + 1) * cout_g, oi, oj] += x[:, c, i, j, None] * w[c, :, a, b]
    return out[:, :, padding:full_h - padding, padding:full_w - padding]


@pytest.mark.parametrize("stride,padding,output_padding,groups,dilation",
                         [(1, 0, 0, 1, 1), (2, 1, 1, 1, 1), (2, 0, 0, 2, 1), (1, 1, 0, 1, 2),
                          (3, 2, 2, 1, 1)])
def test_conv_transpose2d(stride: int, padding: int, output_padding: int, groups: int, dilation: int,
                          r: np.random.Generator) -> None:
    x, w, b = r.normal(size=(2, 4, 3, 4)), r.normal(size=(4, 3, 3, 2)), r.normal(size=(3 * groups,))
    fn = lambda x_, w_, b_: conv_transpose2d(x_, w_, b_, stride, padding, output_padding, groups,  # noqa: E731
                                             dilation)
    out = fn(Tensor(x), Tensor(w), Tensor(b)).numpy()
    ref = _conv_transpose_ref(x, w, stride, padding, output_padding, groups, dilation) \
        + b.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10)
    grad_check(fn, x, w, b, directions=2)


def test_pooling(r: np.random.Generator) -> None:
    x = r.normal(size=(2, 2, 6, 5))
    grad_check(lambda t: t.max_pool2d((2, 2)), x)
    grad_check(lambda t: t.max_pool2d(3, stride=2, padding=1), x)
    grad_check(lambda t: t.avg_pool2d((3, 2), stride=1), x)


def test_attention(r: np.random.Generator) -> None:
    q, k, v = (r.normal(size=(2, 3, 4)) for _ in range(3))
    grad_check(lambda a, b, c: a.scaled_dot_product_attention(b, c), q, k, v)
    grad_check(lambda a, b, c: a.scaled_dot_product_attention(b, c, is_causal=True), q, k, v)


def test_cross_entropy_like(r: np.random.Generator) -> None:
    from rawgrad.nn.functional import binary_cross_entropy_with_logits, cross_entropy
    y = Tensor(np.array([2, 0, 1]))
    grad_check(lambda z: cross_entropy(z, y, label_smoothing=0.1), r.normal(size=(3, 4)))
    t = Tensor(r.uniform(size=(3, 4)))
    grad_check(lambda z: binary_cross_entropy_with_logits(z, t), r.normal(size=(3, 4)))


# ---------------------------------------------------------------------- casts and dtypes
def test_cast_float_to_float_and_int_stops() -> None:
    x = Tensor(np.array([1.5, -2.25, 3.0]), requires_grad=True)
    (g,) = (x.float() * 2).sum().gradient(x)
    assert g.dtype == dtypes.float64
    np.testing.assert_allclose(g.numpy(), [2, 2, 2])
    (g,) = (x.int().float() * x).sum().gradient(x)  # the int path carries nothing
    np.testing.assert_allclose(g.numpy(), [1, -2, 3])


def test_float32_gradients(r: np.random.Generator) -> None:
    a = r.normal(size=(3, 4)).astype(np.float32)
    x = Tensor(a, requires_grad=True)
    (g,) = (x.tanh() * x).sum().gradient(x)
    assert g.dtype == dtypes.float32
    np.testing.assert_allclose(g.numpy(), np.tanh(a) + a * (1 - np.tanh(a) ** 2), rtol=1e-5, atol=1e-6)


def test_against_torch(r: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    a, w = r.normal(size=(2, 3, 6, 6)), r.normal(size=(4, 3, 3, 3))
    x, wt = Tensor(a, requires_grad=True), Tensor(w, requires_grad=True)
    loss = x.conv2d(wt, padding=1).relu().max_pool2d().log_softmax(1).sum()
    gx, gw = loss.gradient(x, wt)
    ta, tw = torch.tensor(a, requires_grad=True), torch.tensor(w, requires_grad=True)
    tl = torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(ta, tw, padding=1).relu(), 2)
    tl.log_softmax(1).sum().backward()
    np.testing.assert_allclose(gx.numpy(), ta.grad.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-8, atol=1e-10)
