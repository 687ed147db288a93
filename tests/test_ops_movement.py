"""Movement ops and indexing against numpy."""
import numpy as np
import pytest

from rawgrad.dtype import dtypes
from rawgrad.tensor.tensor import Tensor


def test_shape_ops(data, check):
    a = data((2, 3, 4))
    t = Tensor(a)
    outs = [t.reshape(4, -1), t.view(6, 4), t.reshape((3, 8)), t.permute(2, 0, 1), t.permute((1, 2, 0)),
            t.transpose(0, 2), t.transpose(), t.T, t[:, :1].expand(2, 5, 4), t[:, :1].expand(3, -1, 2, -1),
            t.flatten(), t.flatten(1), t.flatten(0, 1), t.unflatten(2, (2, 2)),
            t.reshape(2, 1, 12, 1).squeeze(), t.reshape(2, 1, 12, 1).squeeze(1),
            t.reshape(1, 24, 1).squeeze((0, 2)), t.unsqueeze(-1),
            t.unsqueeze(0), t.flip(0), t.flip((1, 2)), t.repeat(2, 1, 3), t.repeat(2, 1, 1, 1),
            t.permute(2, 0, 1).contiguous(), t.expand_as(t), t.reshape(24)[::5]]
    exp = [a.reshape(4, -1), a.reshape(6, 4), a.reshape(3, 8), a.transpose(2, 0, 1), a.transpose(1, 2, 0),
           a.swapaxes(0, 2), a.swapaxes(1, 0), a.T, np.broadcast_to(a[:, :1], (2, 5, 4)),
           np.broadcast_to(a[:, :1], (3, 2, 2, 4)),
           a.reshape(-1), a.reshape(2, 12), a.reshape(6, 4), a.reshape(2, 3, 2, 2), a.reshape(2, 12),
           a.reshape(2, 12, 1), a.reshape(24), a[..., None], a[None], a[::-1], a[:, ::-1, ::-1],
           np.tile(a, (2, 1, 3)), np.tile(a, (2, 1, 1, 1)), a.transpose(2, 0, 1), a, a.reshape(24)[::5]]
    check(outs, exp)
    assert t.T.shape == (4, 3, 2) and t.size(1) == 3


def test_expand_broadcast_shape_errors():
    t = Tensor.ones(2, 3)
    with pytest.raises(ValueError, match=r"cannot expand \(2, 3\) to \(4,\)"):
        t.expand(4)
    with pytest.raises(IndexError, match=r"axis 4 is out of range .* \(shape \(2, 3\)\)"):
        t.unsqueeze(4)
    with pytest.raises(ValueError, match=r"shrink .* is out of bounds for shape \(2, 3\)"):
        t.shrink(((0, 3), None))
    with pytest.raises(ValueError, match=r"flat padding \(1, 1, 1\)"):
        t.pad((1, 1, 1))


def test_pad_shrink(data, check):
    a = data((3, 4))
    t = Tensor(a)
    outs = [t.pad((1, 2)), t.pad((1, 0, 0, 2)), t.pad(((1, 1), None)), t.pad(((0, 0), (2, 1)), value=-7.5),
            t.pad((-1, 2, 1, -1)), t.shrink(((1, 3), (0, 2))), t.shrink((None, (1, 4))),
            Tensor([1, 2], dtype=dtypes.int8).pad((1, 1), value=9), Tensor([True]).pad((1, 0), value=True)]
    exp = [np.pad(a, ((0, 0), (1, 2))), np.pad(a, ((0, 2), (1, 0))), np.pad(a, ((1, 1), (0, 0))),
           np.pad(a, ((0, 0), (2, 1)), constant_values=-7.5), np.pad(a, ((1, 0), (0, 2)))[:, 1:],
           a[1:3, 0:2], a[:, 1:4], np.array([9, 1, 2, 9], np.int8), np.array([True, True])]
    exp[4] = np.pad(a[:-1], ((1, 0), (0, 0)))
    exp[4] = np.pad(exp[4][:, 1:], ((0, 0), (0, 2)))
    modes = [("reflect", "reflect"), ("replicate", "edge"), ("circular", "wrap")]
    outs += [t.pad((2, 1, 0, 2), mode=m) for m, _ in modes]
    exp += [np.pad(a, ((0, 2), (2, 1)), mode=nm) for _, nm in modes]
    check(outs, exp)
    with pytest.raises(ValueError, match="reflect padding"):
        t.pad((4, 0), mode="reflect")


def test_cat_stack_split_chunk(data, check):
    a, b = data((2, 3)), data((2, 5))
    ta, tb = Tensor(a), Tensor(b)
    ti = Tensor([[1, 2, 3]], dtype=dtypes.int8)
    parts = ta.cat(tb, dim=1).split([1, 4, 3], dim=1)
    outs = [ta.cat(tb, dim=1), Tensor.cat([ta, tb, ta], dim=-1), ta.cat(ti, ta), ta.stack(ta * 2),
            Tensor.stack([ta, ta], dim=2), Tensor.stack(ta, ta, dim=-1), *parts, *tb.split(2, dim=1),
            *tb.chunk(2, dim=1), Tensor([True, False]).cat(Tensor([True])),
            Tensor.stack(Tensor(1.0), Tensor(2.0))]
    ab = np.concatenate([a, b], 1)
    exp = [ab, np.concatenate([a, b, a], -1), np.concatenate([a, [[1, 2, 3]], a]), np.stack([a, a * 2]),
           np.stack([a, a], 2), np.stack([a, a], -1), ab[:, :1], ab[:, 1:5], ab[:, 5:], b[:, :2], b[:, 2:4],
           b[:, 4:], b[:, :3], b[:, 3:], np.array([True, False, True]), np.array([1.0, 2.0])]
    check(outs, exp)
    assert ta.cat(ti).dtype == dtypes.float32 and len(Tensor.ones(7).chunk(3)) == 3


def test_tril_triu(data, check):
    a = data((2, 4, 5))
    t = Tensor(a)
    outs = [t.tril(), t.triu(), t.tril(1), t.triu(-2), Tensor.ones(3, 3, dtype=dtypes.bool).tril()]
    exp = [np.tril(a), np.triu(a), np.tril(a, 1), np.triu(a, -2), np.tril(np.ones((3, 3), bool))]
    assert outs[-1].dtype == dtypes.bool
    check(outs, exp)


INDICES = [
    (1,), (-1,), (slice(None),), (slice(1, None),), (slice(None, None, -1),), (slice(None, None, 2),),
    (slice(3, 0, -2),), (slice(-2, None), 1), (None, 0), (Ellipsis, 1), (1, Ellipsis, None), (0, 2, -1),
    (slice(5, 10),), (slice(None), None, slice(1, 3), None), (slice(2, 2),), (Ellipsis,),
    (1, slice(None, None, -3), slice(0, 5, 4)),
]


def test_basic_getitem(data, check):
    a = data((4, 5, 6))
    t = Tensor(a)
    outs = [t[i if len(i) > 1 else i[0]] for i in INDICES]
    exp = [a[i if len(i) > 1 else i[0]] for i in INDICES]
    check(outs, exp, [str(i) for i in INDICES])
    assert Tensor(a).flip(1)[2, 1:4].shape == (3, 6)


ADVANCED = [
    lambda x: [2, 0, 2],
    lambda x: (x([[0, 1], [3, 2]]),),
    lambda x: (slice(None), x([4, -1, 0])),
    lambda x: (x([0, 3]), x([1, 2])),
    lambda x: (x([0, 3]), slice(None), x([1, 2])),  # separated: broadcast dims go first
    lambda x: (1, slice(None), x([0, 5])),  # an int counts as advanced: separated again
    lambda x: (slice(None), 1, x([0, 5])),  # adjacent
    lambda x: (x([[1], [2]]), x([0, 4]), 0),
    lambda x: (slice(1, 3), None, x([4, 0, 1])),
    lambda x: (Ellipsis, x([1, 0])),
]


def test_advanced_getitem(data, check):
    a = data((4, 5, 6))
    t = Tensor(a)
    outs = [t[f(Tensor)] for f in ADVANCED]
    exp = [a[f(np.array)] for f in ADVANCED]
    check(outs, exp)
    i = np.array([[1, 0], [2, 2]])
    b = np.array([[True, False, True], [False, True, True]])
    outs2 = [Tensor([True, False, True, False])[Tensor([3, 0, 2])], Tensor(a)[Tensor(i, dtype=dtypes.int64)],
             Tensor(a[:2, :3, 0])[Tensor(b)], Tensor([[7, 8], [9, 10]], dtype=dtypes.int8)[Tensor([1]), 0]]
    check(outs2, [np.array([False, True, True]), a[i], a[:2, :3, 0][b], np.array([9], np.int8)])
    with pytest.raises(IndexError, match="int or bool"):
        t[Tensor([0.5])]


def test_gather_one_hot_embedding(data, check):
    a = data((3, 4))
    idx = np.array([[0, 3], [2, 2], [1, 0]])
    w = data((10, 3))
    ids = np.array([[1, 9, 0], [4, 4, 2]])
    t, ti = Tensor(a), Tensor(idx)
    from rawgrad.tensor.tensor import embedding
    outs = [t.gather(1, ti), t.gather(0, Tensor([[2, 0, 1, 1]])), Tensor(ids).one_hot(10),
            Tensor(ids).embedding(Tensor(w)), embedding(Tensor([3]), Tensor(w))]
    exp = [np.take_along_axis(a, idx, 1), np.take_along_axis(a, np.array([[2, 0, 1, 1]]), 0),
           np.eye(10, dtype=np.int64)[ids], w[ids], w[[3]]]
    check(outs, exp)


@pytest.mark.parametrize("dt", [dtypes.bool, dtypes.int8, dtypes.float16, dtypes.bfloat16, dtypes.uint64],
                         ids=str)
def test_movement_every_dtype(dt, data, check):
    a = data((3, 4), dt)
    t = Tensor(a, dtype=dt)
    pipe = t.permute(1, 0)[::-1, 1:].pad(((1, 0), (0, 1))).reshape(3, 5)[:, 1::2]
    ref = np.pad(a.T[::-1, 1:], ((1, 0), (0, 1))).reshape(3, 5)[:, 1::2]
    check([pipe, t.cat(t, dim=0), t[Tensor([2, 0])], t.flip(1).repeat(1, 2)],
          [ref, np.concatenate([a, a]), a[[2, 0]], np.tile(a[:, ::-1], (1, 2))])
