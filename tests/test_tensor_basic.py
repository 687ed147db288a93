"""Tensor creation, dtypes, data access, realize/assign/setitem and the clear-error cases."""
import numpy as np
import pytest

from rawgrad.compiler.ir import Ops
from rawgrad.dtype import dtypes
from rawgrad.tensor.tensor import DEFAULT_DEVICE, Tensor

ALL_DTYPES = dtypes.all()


def test_from_python_data():
    assert Tensor(3).dtype == dtypes.int32 and Tensor(3.5).dtype == dtypes.float32
    assert Tensor(True).dtype == dtypes.bool and Tensor(3).shape == ()
    t = Tensor([[1, 2], [3, 4]])
    assert t.dtype == dtypes.int32 and t.shape == (2, 2) and t.tolist() == [[1, 2], [3, 4]]
    assert Tensor([1.5, 2]).dtype == dtypes.float32 and Tensor([True, False]).dtype == dtypes.bool
    assert Tensor([]).shape == (0,) and Tensor([]).numpy().shape == (0,)
    assert Tensor(2.5).item() == 2.5 and Tensor([7]).item() == 7
    assert Tensor([1, 2], dtype=dtypes.float16).numpy().dtype == np.float16
    assert Tensor(Tensor([1, 2]), dtype="float32").tolist() == [1.0, 2.0]
    assert Tensor([Tensor([1, 2]), Tensor([3, 4])]).tolist() == [[1, 2], [3, 4]]
    assert Tensor(300, dtype=dtypes.uint8).item() == 44  # Python ints wrap into the dtype like a CAST


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=str)
def test_numpy_roundtrip_every_dtype(dt, data, close):
    a = data((3, 4), dt)
    t = Tensor(a, dtype=dt)
    assert t.dtype == dt and t.shape == (3, 4) and t.device == DEFAULT_DEVICE
    close(t, a)  # no kernel: the data is already a buffer
    if dt.np_name is not None:
        assert Tensor(a.astype(dt.np)).dtype == dt  # numpy arrays keep their dtype


def test_creation_helpers(close):
    ts = [Tensor.zeros(2, 3), Tensor.ones((2, 3), dtype=dtypes.int8), Tensor.full((2,), 7),
          Tensor.full((), 1.5), Tensor.arange(5), Tensor.arange(1, 2, 0.25), Tensor.arange(10, 0, -3),
          Tensor.linspace(0, 1, 5), Tensor.eye(3), Tensor.eye(2, 3, dtype=dtypes.int32),
          Tensor.zeros(0, 3)]
    Tensor.realize(*ts)
    exp = [np.zeros((2, 3)), np.ones((2, 3), np.int8), np.full(2, 7), np.array(1.5), np.arange(5),
           np.arange(1, 2, 0.25), np.arange(10, 0, -3), np.linspace(0, 1, 5), np.eye(3),
           np.eye(2, 3, dtype=np.int32), np.zeros((0, 3))]
    for t, e in zip(ts, exp):
        close(t, e)
    assert ts[1].dtype == dtypes.int8 and ts[2].dtype == dtypes.int32 and ts[4].dtype == dtypes.int32
    assert ts[5].dtype == dtypes.float32
    x = Tensor([[1.0, 2.0]], dtype=dtypes.float16)
    assert x.zeros_like().dtype == dtypes.float16 and x.ones_like().shape == (1, 2)
    assert x.full_like(3, dtype=dtypes.int32).tolist() == [[3, 3]]
    assert Tensor.empty(2, 2).shape == (2, 2)
    assert Tensor.empty(4, dtype=dtypes.int16).numpy().dtype == np.int16


def test_properties_and_repr():
    t = Tensor.ones(2, 3, 4)
    assert t.ndim == 3 and t.numel() == 24 and t.size() == (2, 3, 4) and t.size(-1) == 4
    assert len(t) == 2 and t.lazydata is t.uop and t.element_size() == 4 and t.nbytes() == 96
    assert repr(Tensor([[1.5, 2.0]])) == "tensor([[1.5, 2. ]], dtype=float32, device=" + DEFAULT_DEVICE + ")"
    assert repr(Tensor([1, 2], dtype="int8")).startswith("tensor([1, 2], dtype=int8")
    assert "..." in str(Tensor.arange(5000))  # abbreviated like torch
    np.testing.assert_array_equal(np.array(Tensor([[1, 2], [3, 4]])), [[1, 2], [3, 4]])
    assert np.asarray(Tensor([1.5]), dtype=np.float64).dtype == np.float64
    assert t.requires_grad is None and t.grad is None
    assert Tensor([1.0], requires_grad=True).detach().requires_grad is False
    with pytest.raises(TypeError, match="0-d"):
        len(Tensor(1.0))
    assert [r.tolist() for r in Tensor([[1, 2], [3, 4]])] == [[1, 2], [3, 4]]
    assert bool(Tensor([3])) and float(Tensor(2.5)) == 2.5


CAST_SRC = np.array([-2.7, -0.5, 0.0, 0.4, 1.5, 3.99, 100.2, 250.0], np.float32)


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64, dtypes.bool,
                                dtypes.float16, dtypes.bfloat16, dtypes.float64], ids=str)
def test_cast_from_float(dt, close):
    out = Tensor(CAST_SRC).cast(dt)
    assert out.dtype == dt
    if dt.is_bool:
        close(out, CAST_SRC != 0)
    elif dt.is_int:  # truncation toward zero, then wrap (values fit in int16 first)
        close(out, np.trunc(CAST_SRC).astype(np.int16).astype(dt.np))
    elif dt == dtypes.bfloat16:
        bits = out.bitcast(dtypes.uint16).numpy()
        from rawgrad.dtype import f32_to_bf16_bits
        np.testing.assert_array_equal(bits, f32_to_bf16_bits(CAST_SRC))
    else:
        close(out, CAST_SRC.astype(dt.np))


def test_cast_between_ints_and_shorthands(close):
    a = np.array([-129, -1, 0, 1, 255, 300, 70000], np.int64)
    t = Tensor(a)
    outs = [t.cast(dtypes.int8), t.cast(dtypes.uint16), t.bool(), t.float(), t.half(), t.int(),
            Tensor([True, False]).long(), t.cast(dtypes.uint8).cast(dtypes.int32)]
    Tensor.realize(*outs)
    with np.errstate(over="ignore"):
        exp = [a.astype(np.int8), a.astype(np.uint16), a != 0, a.astype(np.float32), a.astype(np.float16),
               a.astype(np.int32), np.array([1, 0]), a.astype(np.uint8).astype(np.int32)]
    for o, e in zip(outs, exp):
        close(o, e)
    assert t.double().dtype == dtypes.float64 and t.short().dtype == dtypes.int16


def test_bitcast(close):
    f = np.array([1.0, -2.5, 0.0, np.inf], np.float32)
    close(Tensor(f).bitcast(dtypes.uint32), f.view(np.uint32))
    close(Tensor(f.view(np.int32)).bitcast("float32"), f)
    h = np.array([1.0, -0.5], np.float16)
    close(Tensor(h).bitcast(dtypes.int16), h.view(np.int16))
    with pytest.raises(TypeError, match=r"float32 \(4 bytes\) to dtypes.int16 \(2 bytes\)|4 bytes"):
        Tensor(f).bitcast(dtypes.int16)


def test_realize_many_at_once_and_shared_work():
    a = Tensor([1.0, 2.0])
    b, c = a * 2, a + 1
    Tensor.realize(b, c)
    assert b.uop.base.op is Ops.BUFFER and c.uop.base.op is Ops.BUFFER
    assert b.tolist() == [2.0, 4.0] and c.tolist() == [2.0, 3.0]
    assert b.realize() is b


def test_to_device_clone_contiguous():
    t = Tensor([1, 2, 3])
    assert t.to("cpu").device == "CPU" and t.to(DEFAULT_DEVICE) is t
    assert t.to(dtype=dtypes.float32).dtype == dtypes.float32
    c = t.clone()
    c[0] = 9
    assert t.tolist() == [1, 2, 3] and c.tolist() == [9, 2, 3]
    assert t[::-1].contiguous().tolist() == [3, 2, 1]


def test_assign():
    w = Tensor([1.0, 2.0, 3.0]).realize()
    old = w.uop.base
    w.assign(w * 10)
    w.assign(w + 1)  # a second assign builds on the first before anything runs
    assert w.tolist() == [11.0, 21.0, 31.0] and w.uop.base is old  # same buffer, new data
    assert w.tolist() == [11.0, 21.0, 31.0]  # a realized assign does not run again
    v = Tensor.zeros(2, 2).contiguous()
    v.assign(5)  # broadcast scalars
    assert v.tolist() == [[5.0, 5.0], [5.0, 5.0]]
    # a pending assign that feeds another graph runs once, inside that graph's realize
    p = Tensor([1, 2]).realize()
    p.assign(p + 1)
    q = p * 2
    assert q.tolist() == [4, 6] and p.tolist() == [2, 3]
    with pytest.raises(ValueError, match=r"shape \(3,\) to shape \(2, 2\)"):
        v.assign(Tensor([1.0, 2.0, 3.0]))


def test_setitem(close):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = Tensor(base.copy())
    ref = base.copy()
    t[1] = -1.0
    ref[1] = -1.0
    t[:, ::-2] = Tensor([7.0, 8.0, 9.0])
    ref[:, ::-2] = [7.0, 8.0, 9.0]
    t[2:, 1:5:3] = Tensor([[1.0, 2.0], [3.0, 4.0]])
    ref[2:, 1:5:3] = [[1.0, 2.0], [3.0, 4.0]]
    t[..., 0, None] = 0.5
    ref[..., 0, None] = 0.5
    t[Tensor([0, 3]), 2] = Tensor([100.0, 200.0])
    ref[[0, 3], 2] = [100.0, 200.0]
    close(t, ref)
    b = Tensor([True, False, True])
    b[1] = True
    assert b.tolist() == [True, True, True]
    with pytest.raises(ValueError, match=r"shape \(4,\) to indexed shape \(6,\)"):
        t[0] = Tensor([1.0, 2.0, 3.0, 4.0])


def test_errors_name_shapes_and_axes():
    a, b = Tensor.ones(3, 4), Tensor.ones(5)
    with pytest.raises(ValueError, match=r"cannot broadcast \(3, 4\) with \(5,\)"):
        a + b
    with pytest.raises(ValueError, match=r"inner dimensions differ: \(3, 4\) @ \(5,\)"):
        a @ b
    with pytest.raises(IndexError, match=r"axis 2 is out of range .* \(shape \(3, 4\)\)"):
        a.sum(2)
    with pytest.raises(ValueError, match=r"cannot reshape \(3, 4\) \(12 elements\) to \(5,\)"):
        a.reshape(5)
    with pytest.raises(ValueError, match=r"cannot reshape \(3, 4\) to \(5, -1\): -1 cannot be inferred"):
        a.reshape(5, -1)
    with pytest.raises(ValueError, match="only one dimension can be -1"):
        a.reshape(-1, -1)
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        a[3]
    with pytest.raises(IndexError, match="index -5 is out of bounds for dimension 1 with size 4"):
        a[0, -5]
    with pytest.raises(IndexError, match="too many indices"):
        a[0, 0, 0]
    with pytest.raises(TypeError, match="bitwise_and is not defined for dtype dtypes.float32"):
        a & a
    with pytest.raises(TypeError, match="<< is not defined for dtype dtypes.float32"):
        a << 1
    with pytest.raises(ValueError, match=r"cannot expand \(3, 4\) to \(3, 5\)"):
        a.expand(3, 5)
    with pytest.raises(ValueError, match=r"permute order \(0, 0\)"):
        a.permute(0, 0)
    with pytest.raises(ValueError, match=r"cat: shape \(5,\) does not match \(3, 4\)|cat: shape"):
        a.cat(b)
    with pytest.raises(ValueError, match="max\\(\\) over axis 0 of size 0"):
        Tensor.zeros(0, 2).max(0)
    with pytest.raises(TypeError, match="cannot make a Tensor"):
        Tensor([[1, 2], [3]])
    with pytest.raises(ValueError, match="item\\(\\) needs a tensor with one element"):
        a.item()
    with pytest.raises(ValueError, match="split sizes"):
        a.split([1, 1], dim=0)
