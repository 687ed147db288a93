"""matmul/einsum, convolution, pooling, normalisation and attention against numpy references."""
import numpy as np
import pytest

from rawgrad.dtype import dtypes
from rawgrad.tensor.tensor import Tensor


def test_matmul_shapes_and_broadcasting(data, check):
    a, b = data((3, 4)), data((4, 5))
    v, w = data((4,)), data((2, 1, 4, 5))
    x3 = data((2, 3, 4))
    ta, tb, tv, tw, tx = Tensor(a), Tensor(b), Tensor(v), Tensor(w), Tensor(x3)
    outs = [ta @ tb, ta.matmul(tb), ta.dot(tv), tv @ tb, tv @ tv, tx @ tb, tx @ tw, ta @ tw,
            ta.linear(tb, Tensor(v[:1]).expand(5)), ta.linear(Tensor(v)),
            Tensor([[1, 2]], dtype=dtypes.int8) @ Tensor([[3], [100]], dtype=dtypes.int8)]
    assert outs[-1].dtype == dtypes.int8  # integer matmul keeps its dtype (and wraps)
    exp = [a @ b, a @ b, a @ v, v @ b, v @ v, x3 @ b, x3 @ w, a @ w, a @ b + v[0], a * v,
           np.array([[3 + 200 - 256]], np.int8)]
    check(outs, exp, atol=1e-5)
    f16 = Tensor(a, dtype=dtypes.float16) @ Tensor(b, dtype=dtypes.float16)
    check([f16], [(a.astype(np.float16).astype(np.float32) @ b.astype(np.float16).astype(np.float32))],
          rtol=5e-3, atol=5e-3)
    with pytest.raises(ValueError, match=r"batch dims of \(2, 3, 4\) and \(3, 4, 5\)"):
        tx @ Tensor.ones(3, 4, 5)
    with pytest.raises(ValueError, match="at least 1 dim"):
        Tensor(1.0) @ ta


def test_matmul_on_views(data, check):
    a, b = data((4, 3)), data((5, 4))
    ta, tb = Tensor(a), Tensor(b)
    check([ta.T @ tb.T, ta[::-1].T @ tb[::-1].T.flip(1)], [a.T @ b.T, a[::-1].T @ b[::-1].T[:, ::-1]],
          atol=1e-5)


EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("b...d,bd->b...", [(2, 3, 4, 5), (2, 5)]),
    ("iij->ij", [(3, 3, 2)]),
    ("i,i,i->", [(5,), (5,), (5,)]),
    ("ba,ab", [(3, 4), (4, 3)]),
]


def test_einsum(data, check):
    outs, exp = [], []
    for formula, shapes in EINSUM:
        arrays = [data(s) for s in shapes]
        outs.append(Tensor.einsum(formula, *[Tensor(x) for x in arrays]))
        exp.append(np.einsum(formula, *arrays))
    outs.append(Tensor.einsum("ij,jk->ik", [Tensor(np.eye(2)), Tensor(np.ones((2, 2)))]))
    exp.append(np.ones((2, 2)))
    check(outs, exp, [f for f, _ in EINSUM] + ["list operands"], atol=1e-5)
    with pytest.raises(ValueError, match="names 2 operands, got 1"):
        Tensor.einsum("ij,jk", Tensor.ones(2, 2))
    with pytest.raises(ValueError, match="letter 'j' has sizes 3 and 4"):
        Tensor.einsum("ij,jk", Tensor.ones(2, 3), Tensor.ones(4, 2))


def _ref_conv(x, w, b, stride, pads, dil, groups):
    x = np.pad(x, ((0, 0), (0, 0)) + tuple(pads))
    n, _, hh, ww = x.shape
    co, cg, kh, kw = w.shape
    oh, ow = (hh - dil[0] * (kh - 1) - 1) // stride[0] + 1, (ww - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, co, oh, ow))
    og = co // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = x[:, g * cg:(g + 1) * cg, i * dil[0]:i * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                          j * dil[1]:j * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
                wg = w[g * og:(g + 1) * og, :, i, j]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg)
    return out if b is None else out + b[None, :, None, None]


CONVS = [  # (x shape, weight shape, groups, stride, dilation, padding, reference padding)
    ((2, 4, 7, 6), (6, 4, 3, 3), 1, 1, 1, 0, [(0, 0), (0, 0)]),
    ((1, 4, 8, 8), (4, 2, 3, 2), 2, (2, 1), 1, 1, [(1, 1), (1, 1)]),
    ((1, 3, 9, 9), (2, 3, 3, 3), 1, 2, 2, (2, 1), [(2, 2), (1, 1)]),
    ((2, 2, 5, 6), (3, 2, 2, 3), 1, 1, (2, 1), "same", [(1, 1), (1, 1)]),
    ((1, 4, 5, 5), (4, 1, 3, 3), 4, 3, 1, 2, [(2, 2), (2, 2)]),  # depthwise, stride bigger than the kernel
]


def test_conv2d(data, check):
    outs, exp = [], []
    for xs, ws, groups, stride, dil, pad, ref_pad in CONVS:
        x, w, b = data(xs), data(ws), data((ws[0],))
        st = stride if isinstance(stride, tuple) else (stride, stride)
        dl = dil if isinstance(dil, tuple) else (dil, dil)
        outs.append(Tensor(x).conv2d(Tensor(w), Tensor(b), groups=groups, stride=stride, dilation=dil,
                                     padding=pad))
        exp.append(_ref_conv(x, w, b, st, ref_pad, dl, groups))
    x1, w1 = data((2, 3, 10)), data((4, 3, 3))
    outs.append(Tensor(x1).conv1d(Tensor(w1), padding=1))
    exp.append(_ref_conv(x1[:, :, None], w1[:, :, None], None, (1, 1), [(0, 0), (1, 1)], (1, 1), 1)[:, :, 0])
    check(outs, exp, atol=1e-4)
    with pytest.raises(ValueError, match=r"input \(1, 3, 5, 5\) has 3 channels; weight \(2, 2, 3, 3\)"):
        Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(2, 2, 3, 3))


def _ref_pool(x, k, s, d, pads, fn, fill):
    x = np.pad(x, ((0, 0), (0, 0)) + tuple(pads), constant_values=fill)
    hh, ww = x.shape[2:]
    oh, ow = (hh - d * (k[0] - 1) - 1) // s[0] + 1, (ww - d * (k[1] - 1) - 1) // s[1] + 1
    wins = [x[:, :, i * d:i * d + s[0] * (oh - 1) + 1:s[0], j * d:j * d + s[1] * (ow - 1) + 1:s[1]]
            for i in range(k[0]) for j in range(k[1])]
    return fn(np.stack(wins), axis=0)


def test_pooling(data, check):
    x = data((2, 3, 7, 8))
    t = Tensor(x)
    outs = [t.max_pool2d(), t.max_pool2d((3, 3), stride=2, padding=1), t.max_pool2d(2, stride=1, dilation=2),
            t.avg_pool2d(), t.avg_pool2d((3, 2), stride=(2, 3), padding=(1, 1)),
            t.avg_pool2d(3, stride=2, padding=1, count_include_pad=False),
            t.max_pool2d(3, stride=2, ceil_mode=True),
            Tensor(np.arange(16, dtype=np.int32).reshape(1, 1, 4, 4)).max_pool2d(padding=1)]
    exp = [_ref_pool(x, (2, 2), (2, 2), 1, [(0, 0), (0, 0)], np.max, 0),
           _ref_pool(x, (3, 3), (2, 2), 1, [(1, 1), (1, 1)], np.max, -np.inf),
           _ref_pool(x, (2, 2), (1, 1), 2, [(0, 0), (0, 0)], np.max, 0),
           _ref_pool(x, (2, 2), (2, 2), 1, [(0, 0), (0, 0)], np.mean, 0),
           _ref_pool(x, (3, 2), (2, 3), 1, [(1, 1), (1, 1)], np.mean, 0),
           _ref_pool(x, (3, 3), (2, 2), 1, [(1, 1), (1, 1)], np.sum, 0) /
           _ref_pool(np.ones((1, 1, 7, 8)), (3, 3), (2, 2), 1, [(1, 1), (1, 1)], np.sum, 0),
           _ref_pool(x, (3, 3), (2, 2), 1, [(0, 0), (0, 1)], np.max, -np.inf),
           _ref_pool(np.arange(16).reshape(1, 1, 4, 4), (2, 2), (2, 2), 1, [(1, 1)] * 2, np.max, -10 ** 9)]
    check(outs, exp, atol=1e-5)
    assert outs[-1].dtype == dtypes.int32


def test_layernorm_and_attention(data, check):
    x = data((2, 3, 8))
    w, b = data((8,)), data((8,))
    t = Tensor(x)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    ln = (x - mu) / np.sqrt(var + 1e-5)
    mu2, var2 = x.mean((1, 2), keepdims=True), x.var((1, 2), keepdims=True)
    q, k, v = data((2, 2, 5, 4)), data((2, 2, 6, 4)), data((2, 2, 6, 3))
    mask = data((5, 6), dtypes.bool)
    mask[:, 0] = True

    def ref_attn(bias, scale=0.5):
        s = q @ k.swapaxes(-1, -2) * scale + bias
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v
    causal = np.where(np.tril(np.ones((5, 6), bool)), 0.0, -np.inf)
    tq, tk, tv = Tensor(q), Tensor(k), Tensor(v)
    outs = [t.layernorm(), t.layer_norm(8, Tensor(w), Tensor(b)), t.layernorm((1, 2), eps=1e-3),
            t.layer_norm((3, 8)), tq.scaled_dot_product_attention(tk, tv),
            tq.scaled_dot_product_attention(tk, tv, is_causal=True),
            tq.scaled_dot_product_attention(tk, tv, attn_mask=Tensor(mask), scale=0.3),
            tq.scaled_dot_product_attention(tk, tv, attn_mask=Tensor(causal.astype(np.float32)))]
    exp = [ln, ln * w + b, (x - mu2) / np.sqrt(var2 + 1e-3), (x - mu2) / np.sqrt(var2 + 1e-5), ref_attn(0),
           ref_attn(causal), ref_attn(np.where(mask, 0.0, -np.inf), 0.3), ref_attn(causal)]
    check(outs, exp, atol=1e-5)
    with pytest.raises(ValueError, match=r"normalized_shape \(4,\) does not match the end of \(2, 3, 8\)"):
        t.layer_norm(4)


def test_dropout():
    t = Tensor.ones(1000)
    assert t.dropout(0.5) is t  # not training
    Tensor.training = True
    try:
        out = t.dropout(0.25).numpy()
    finally:
        Tensor.training = False
    kept = out != 0
    assert np.allclose(out[kept], 1 / 0.75) and 0.65 < kept.mean() < 0.85
