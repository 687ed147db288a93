"""Cases that once returned a wrong value without an error (issue 15 §1), each checked against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.view import ShapeTracker

X = np.array([0.25, 0.5, 0.75, 1.0], np.float32)


def test_one_element_of_a_lazy_stack_pad_or_cat() -> None:
    # a 0-d read through an all-masked view piece used to lose the mask (stack summed its pieces)
    x = Tensor(X)
    st = np.stack([X, X, X])
    for i in range(3):
        for j in range(4):
            assert Tensor.stack(x, x, x)[i, j].item() == st[i, j]
    padded = np.pad(X, (1, 0), constant_values=3.0)
    for i in range(5):
        assert x.pad(((1, 0),), value=3.0)[i].item() == padded[i]
    cat = np.concatenate([X, X])
    for i in range(8):
        assert x.cat(x)[i].item() == cat[i]


def test_a_0d_view_of_nothing_stays_invalid() -> None:
    empty_piece = ShapeTracker.from_shape((4,)).pad(((1, 0),)).shrink(((0, 1),))
    _, valid = empty_piece.reshape(()).to_indexed_uops()
    assert valid.is_const(False)
    # and element 1 of the same pad is a real read
    _, valid = ShapeTracker.from_shape((4,)).pad(((1, 0),)).shrink(((1, 2),)).reshape(()).to_indexed_uops()
    assert valid.is_const(True)


def test_mixed_int_and_tensor_indices_put_broadcast_dims_where_numpy_does() -> None:
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5).astype(np.int32)
    keys: list[Any] = [(1, slice(None), [0, 2], slice(0, 2)), (slice(None), 1, slice(None), [0, 3]),
                       (slice(None), [0, 1], slice(None), [2, 3]), ([1, 0], slice(None), [[0], [2]], 1),
                       (Ellipsis, [0, 1]), (1, [0, 2], [1, 3]), (slice(None), [0, 2], [1, 3], slice(1, 3))]
    for key in keys:
        want = x[key]
        for as_tensor in (False, True):
            k = tuple(Tensor(np.array(i, np.int32)) if as_tensor and isinstance(i, list) else i for i in key)
            got = Tensor(x)[k].numpy()
            assert got.shape == want.shape, (key, got.shape, want.shape)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64])
def test_integer_pow_matches_the_reference_rule_and_wraps(dt: Any) -> None:
    rng = np.random.default_rng(7)
    signed = np.issubdtype(dt, np.signedinteger)
    base = rng.integers(-5 if signed else 0, 9, size=300).astype(dt)
    exp = rng.integers(-4 if signed else 0, 70, size=300).astype(dt)
    want = np.where(exp >= 0, np.power(base, np.maximum(exp, 0).astype(dt)), 0).astype(dt)
    if signed:  # 1 / a**n truncated toward zero: only |a| == 1 survives a negative exponent
        inv = np.where(base == 1, 1, np.where(base == -1, np.where(exp % 2 == 0, 1, -1), 0)).astype(dt)
        want = np.where(exp < 0, inv, want)
    np.testing.assert_array_equal((Tensor(base) ** Tensor(exp)).numpy(), want)


def test_negative_scalar_exponent_of_an_int_tensor_is_refused() -> None:
    with pytest.raises(ValueError, match="negative integer powers"):
        Tensor([2]) ** -1
    assert (Tensor([2.0]) ** -1).item() == 0.5
    assert (Tensor([0]) ** 0).item() == 1


@pytest.mark.parametrize("make", [lambda: Tensor([1]) + 2 ** 70, lambda: Tensor([1], dtype="int8") * 300,
                                  lambda: Tensor.full((2,), 256, dtype="uint8"),
                                  lambda: Tensor([1]) - 2 ** 31 - 1])
def test_python_ints_that_do_not_fit_the_dtype_are_refused(make: Any) -> None:
    with pytest.raises(OverflowError, match="out of range"):
        make()


def test_out_of_range_indices_raise_index_error() -> None:
    data = np.arange(5, dtype=np.int32)
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        Tensor(data)[[1, 9]]
    with pytest.raises(IndexError, match="index -6 is out of bounds"):
        Tensor(data)[np.array([-6])]
    with pytest.raises(IndexError, match="out of range"):
        Tensor(data)[Tensor([0, 7])].numpy()
    with pytest.raises(IndexError, match="gather"):
        Tensor(data.reshape(5, 1)).gather(0, Tensor([[5]])).numpy()
    with pytest.raises(IndexError, match="embedding"):
        Tensor([4]).embedding(Tensor(np.ones((4, 2), np.float32))).numpy()
    # in range, negatives wrap like numpy
    np.testing.assert_array_equal(Tensor(data)[Tensor([0, -2])].numpy(), data[[0, -2]])


def test_out_of_range_index_writes_nothing() -> None:
    t = Tensor(np.zeros(5, np.int32))
    with pytest.raises(IndexError):
        t[[1, 9]] = 7
    with pytest.raises(IndexError):
        t[Tensor([1, 9])] = 7
    np.testing.assert_array_equal(t.numpy(), np.zeros(5, np.int32))
    t[[1, -1]] = 7
    np.testing.assert_array_equal(t.numpy(), [0, 7, 0, 0, 7])


def test_a_bool_mask_must_match_the_dimensions_it_indexes() -> None:
    x = np.arange(6).reshape(2, 3)
    with pytest.raises(IndexError, match="boolean index of shape"):
        Tensor(x)[[True, False, True]]
    with pytest.raises(IndexError, match="boolean index of shape"):
        Tensor(x)[:, np.array([True, False])]
    np.testing.assert_array_equal(Tensor(x)[:, [True, False, True]].numpy(), x[:, [True, False, True]])
    np.testing.assert_array_equal(Tensor(x)[x > 2].numpy(), x[x > 2])


def test_index_checks_of_a_closed_device_do_not_break_the_next_read() -> None:
    # found by the tensor.py split: an embedding on a device closed before anything was read left its deferred
    # flag behind, and the thread's next unrelated numpy() raised DeviceClosedError
    from rawgrad.hcq.device import Device
    table = Tensor(np.arange(12, dtype=np.float32).reshape(6, 2), device="CPU:7")
    idx = Tensor(np.array([1, 5], np.int32), device="CPU:7") + 0  # computed: only the device knows its values
    table[idx].realize()
    Device.close("CPU:7")
    with pytest.warns(RuntimeWarning, match="index check.*CPU:7.*closed"):
        np.testing.assert_array_equal((Tensor([1.0, 2.0]) * 3).numpy(), [3, 6])
