"""nn layers (forward against numpy, gradients against finite differences) and state-dict walking."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad import nn
from rawgrad.dtype import dtypes
from rawgrad.nn.state import get_parameters, get_state_dict, load_state_dict
from rawgrad.tensor.tensor import Tensor
from tests.test_autograd import grad_check


@pytest.fixture
def r() -> np.random.Generator:
    return np.random.default_rng(4321)


def _conv_ref(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0) -> np.ndarray:
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, _, h, wd = x.shape
    cout, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, cout, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out


def test_linear(r: np.random.Generator) -> None:
    Tensor.manual_seed(1)
    lin = nn.Linear(5, 3)
    assert lin.weight.shape == (3, 5) and lin.bias is not None and lin.bias.shape == (3,)
    assert lin.weight.requires_grad and lin.weight.dtype == dtypes.float32
    w = lin.weight.numpy()
    assert np.abs(w).max() <= 1 / np.sqrt(5) and w.std() > 0.05
    x = r.normal(size=(4, 5)).astype(np.float32)
    np.testing.assert_allclose(lin(Tensor(x)).numpy(), x @ w.T + lin.bias.numpy(), rtol=1e-5, atol=1e-6)
    assert nn.Linear(5, 3, bias=False).bias is None


def test_equal_shaped_parameters_get_their_own_gradients() -> None:
    a, b = nn.LayerNorm(4), nn.LayerNorm(4)  # both start as ones/zeros: must not share a graph node
    x = Tensor(np.arange(8.0, dtype=np.float32).reshape(2, 4))
    (a(x).sum() + 2 * b(x).square().sum()).backward()
    assert a.weight.grad is not None and b.weight.grad is not None
    assert not np.allclose(a.weight.grad.numpy(), b.weight.grad.numpy())


def test_conv2d_layer(r: np.random.Generator) -> None:
    conv = nn.Conv2d(2, 3, 3, stride=2, padding=1)
    assert conv.weight.shape == (3, 2, 3, 3)
    x = r.normal(size=(2, 2, 7, 6)).astype(np.float32)
    ref = _conv_ref(x, conv.weight.numpy(), 2, 1) + conv.bias.numpy().reshape(1, 3, 1, 1)  # type: ignore
    np.testing.assert_allclose(conv(Tensor(x)).numpy(), ref, rtol=1e-4, atol=1e-5)


def test_conv_transpose2d_layer_shape_and_inverse_of_conv_gradient(r: np.random.Generator) -> None:
    up = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1, bias=False)
    assert up.weight.shape == (4, 2, 3, 3)
    x = Tensor(r.normal(size=(1, 4, 5, 5)).astype(np.float32))
    y = up(x)
    assert y.shape == (1, 2, 10, 10)
    # conv_transpose is the input-gradient of conv2d with the same weight
    z = Tensor(np.zeros((1, 2, 10, 10), np.float32), requires_grad=True)
    (gz,) = (z.conv2d(up.weight, stride=2, padding=1) * x).sum().gradient(z)
    np.testing.assert_allclose(y.numpy(), gz.numpy(), rtol=1e-4, atol=1e-5)


def test_batchnorm2d_train_and_eval(r: np.random.Generator) -> None:
    bn = nn.BatchNorm2d(3, momentum=0.25)
    x = (r.normal(size=(4, 3, 2, 2)) * [[[[1.0]], [[2.0]], [[3.0]]]] + 5).astype(np.float32)
    with Tensor.train():
        y = bn(Tensor(x)).numpy()
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    np.testing.assert_allclose(y, (x - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5),
                               rtol=1e-4, atol=1e-4)
    Tensor.realize(bn.running_mean, bn.running_var, bn.num_batches_tracked)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.25 * mean, rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.75 + 0.25 * x.var((0, 2, 3), ddof=1), rtol=1e-5)
    assert bn.num_batches_tracked.item() == 1
    ye = bn(Tensor(x)).numpy()  # eval: the running statistics
    rm, rv = bn.running_mean.numpy(), bn.running_var.numpy()
    np.testing.assert_allclose(ye, (x - rm[:, None, None]) / np.sqrt(rv[:, None, None] + 1e-5), rtol=1e-4)
    with pytest.raises(ValueError, match="BatchNorm2d"):
        bn(Tensor(x[:, :, 0]))
    with pytest.raises(ValueError, match=r"expected \(N, 3"):
        nn.BatchNorm1d(3)(Tensor(np.ones((2, 4), np.float32)))


def test_batchnorm_unrealized_updates_do_not_chain(r: np.random.Generator) -> None:
    bn = nn.BatchNorm1d(2)
    with Tensor.train():
        for _ in range(3):
            bn(Tensor(r.normal(size=(8, 2)).astype(np.float32)))
    assert bn.num_batches_tracked.item() == 3
    assert len(bn.running_mean.uop.toposort()) < 40  # one step's graph, not three chained


def test_norm_layers_forward(r: np.random.Generator) -> None:
    x = r.normal(size=(2, 4, 3, 3)).astype(np.float32)
    ln = nn.LayerNorm((3, 3))
    d = x - x.mean((2, 3), keepdims=True)
    np.testing.assert_allclose(ln(Tensor(x)).numpy(), d / np.sqrt((d * d).mean((2, 3), keepdims=True) + 1e-5),
                               rtol=1e-4, atol=1e-5)
    rms = nn.RMSNorm(3)
    np.testing.assert_allclose(rms(Tensor(x)).numpy(), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6),
                               rtol=1e-4, atol=1e-5)
    gn = nn.GroupNorm(2, 4)
    g = x.reshape(2, 2, -1)
    ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(gn(Tensor(x)).numpy(), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="groups"):
        nn.GroupNorm(3, 4)


def test_norm_layer_gradients(r: np.random.Generator) -> None:
    f64 = dtypes.float64
    ln, gn = nn.LayerNorm(4, dtype=f64), nn.GroupNorm(2, 4, dtype=f64)
    bn, rms = nn.BatchNorm2d(4, dtype=f64), nn.RMSNorm(3, dtype=f64)

    def with_params(layer: object, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        layer.weight, layer.bias = w, b  # type: ignore[attr-defined]
        return layer(x)  # type: ignore[operator]
    x = r.normal(size=(2, 4, 3, 4))
    grad_check(lambda t, w, b: with_params(ln, t, w, b), x, r.normal(size=4), r.normal(size=4))
    grad_check(lambda t, w, b: with_params(gn, t, w, b), x, r.normal(size=4), r.normal(size=4))
    with Tensor.train():
        grad_check(lambda t, w, b: with_params(bn, t, w, b), x, r.normal(size=4), r.normal(size=4))
    grad_check(lambda t, w: with_params(rms, t, w, None), x[..., :3], r.normal(size=3))


def test_embedding(r: np.random.Generator) -> None:
    emb = nn.Embedding(5, 3)
    ids = Tensor(np.array([[0, 4, 4], [2, 0, 1]]))
    out = emb(ids)
    np.testing.assert_allclose(out.numpy(), emb.weight.numpy()[[[0, 4, 4], [2, 0, 1]]])
    out.sum().backward()
    assert emb.weight.grad is not None
    np.testing.assert_allclose(emb.weight.grad.numpy()[:, 0], [2, 1, 1, 0, 2])
    with pytest.raises(TypeError, match="integer"):
        emb(Tensor(np.ones(2, np.float32)))


def test_dropout_layer() -> None:
    d = nn.Dropout(0.25)
    x = Tensor.ones(400)
    assert (d(x).numpy() == 1).all()
    with Tensor.train():
        y = d(x).numpy()
    assert np.allclose(y[y != 0], 1 / 0.75) and 50 < (y == 0).sum() < 150
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


class _Block:
    def __init__(self) -> None:
        self.conv = nn.Conv2d(1, 2, 3)
        self.norms = [nn.BatchNorm2d(2), nn.LayerNorm(2)]
        self.heads = {"a": nn.Linear(2, 2), "b": nn.Linear(2, 1, bias=False)}
        self.tied = self.heads["a"].weight  # a second path to the same tensor
        self.parent = self  # a cycle
        self._private = Tensor.ones(3)
        self.scale = 2.0


def test_state_dict_walks_attributes_lists_dicts() -> None:
    sd = get_state_dict(_Block())
    assert list(sd) == ["conv.weight", "conv.bias", "norms.0.weight", "norms.0.bias",
                        "norms.0.running_mean", "norms.0.running_var", "norms.0.num_batches_tracked",
                        "norms.1.weight", "norms.1.bias", "heads.a.weight", "heads.a.bias", "heads.b.weight"]
    params = get_parameters(_Block())
    assert len(params) == 12 and len({id(p) for p in params}) == 12
    seq = nn.Sequential(nn.Linear(2, 3), Tensor.relu, nn.Linear(3, 1))
    assert list(get_state_dict(seq)) == ["layers.0.weight", "layers.0.bias", "layers.2.weight",
                                         "layers.2.bias"]


def test_load_state_dict() -> None:
    src, dst = nn.Linear(3, 2), nn.Linear(3, 2)
    load_state_dict(dst, {k: v.numpy() for k, v in get_state_dict(src).items()})
    np.testing.assert_array_equal(dst.weight.numpy(), src.weight.numpy())
    with pytest.raises(KeyError, match="missing keys"):
        load_state_dict(dst, {"weight": src.weight})
    with pytest.raises(ValueError, match="shape"):
        load_state_dict(dst, {"weight": np.zeros((3, 3)), "bias": np.zeros(2)})
