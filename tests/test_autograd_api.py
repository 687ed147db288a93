"""The autograd entry points on Tensor: backward/.grad, gradient(), detach, no_grad, train, errors."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad.compiler.ir import Ops
from rawgrad.dtype import dtypes
from rawgrad.nn import no_grad
from rawgrad.tensor.autograd import compute_gradients
from rawgrad.tensor.tensor import Tensor


def test_backward_fills_grad_of_leaves_only() -> None:
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    c = Tensor(np.array([4.0, 5.0, 6.0]))  # requires_grad None: not a leaf to fill
    h = x * c
    (h.sum() * 2).backward()
    assert x.grad is not None and c.grad is None and h.grad is None
    np.testing.assert_allclose(x.grad.numpy(), [8, 10, 12])


def test_backward_accumulates_and_zero_grad_by_none() -> None:
    w = Tensor(np.array([1.0, -2.0]), requires_grad=True)
    (w * w).sum().backward()
    (w * 3).sum().backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), [5, -1])
    w.grad = None
    w.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [1, 1])


def test_backward_with_explicit_gradient() -> None:
    x = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]]), requires_grad=True)
    (x * x).backward(Tensor(np.array([[1.0, 0.0], [0.5, 2.0]])))
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), [[2, 0], [3, 16]])


def test_backward_non_scalar_without_gradient_is_an_error() -> None:
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"non-scalar.*\(2, 3\)"):
        (x * 2).backward()
    with pytest.raises(ValueError, match="does not match"):
        (x * 2).backward(Tensor(np.ones(3)))


def test_backward_without_leaves_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="requires_grad"):
        (Tensor(np.ones(3)) * 2).sum().backward()


def test_gradient_does_not_touch_grad_and_finds_intermediates() -> None:
    x = Tensor(np.array([0.5, -1.0]), requires_grad=True)
    h = x.exp()
    y = (h * h).sum()
    gh, gx = y.gradient(h, x)
    assert x.grad is None
    np.testing.assert_allclose(gh.numpy(), 2 * np.exp([0.5, -1.0]))
    np.testing.assert_allclose(gx.numpy(), 2 * np.exp([1.0, -2.0]))


def test_gradient_wrt_tensor_not_in_graph_is_an_error() -> None:
    x = Tensor(np.ones(3), requires_grad=True)
    other = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(ValueError, match="target 1 .* not in the graph"):
        (x * 2).sum().gradient(x, other)


def test_gradient_through_non_differentiable_path_is_zero() -> None:
    x = Tensor(np.array([1.0, 5.0, 3.0]), requires_grad=True)
    (g,) = (x.argmax().float() + x.floor()).sum().gradient(x)  # in the graph, but piecewise constant
    np.testing.assert_array_equal(g.numpy(), [0, 0, 0])


def test_only_float_tensors_require_grad() -> None:
    with pytest.raises(TypeError, match="float"):
        Tensor(np.array([1, 2]), requires_grad=True)
    with pytest.raises(TypeError, match="float"):
        Tensor(np.array([1.0]) > 0).requires_grad_()


def test_detach_stops_gradients() -> None:
    x = Tensor(np.array([2.0, 3.0]), requires_grad=True)
    (g,) = (x * x.detach()).sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), [2, 3])
    s = Tensor(np.array(4.0), requires_grad=True)  # 0-d takes another detach node
    (gs,) = (s * s.detach() + s).gradient(s)
    assert gs.item() == 5.0
    assert not x.detach().requires_grad
    np.testing.assert_allclose(x.detach().numpy(), [2, 3])


def test_backward_after_realizing_the_loss() -> None:
    w = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = (w * 3).exp()
    h.realize()  # an intermediate realized on its own: its graph is remembered
    loss = (h.log() * w).sum()
    assert abs(loss.item() - 15.0) < 1e-12  # realized before backward, as a training loop prints it
    loss.backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), 6 * np.array([1.0, 2.0]))


def test_no_grad_refuses_backward_and_restores() -> None:
    x = Tensor(np.ones(2), requires_grad=True)
    with no_grad():
        assert Tensor.no_grad
        y = (x * 2).sum()
        with pytest.raises(RuntimeError, match="no_grad"):
            y.backward()
    assert not Tensor.no_grad
    y.backward()  # a graph built under no_grad is still a graph
    assert x.grad is not None

    @no_grad()
    def f() -> bool:
        return Tensor.no_grad
    assert f() and not Tensor.no_grad


def test_train_context_and_decorator() -> None:
    assert not Tensor.training
    with Tensor.train():
        assert Tensor.training
        with Tensor.train(False):
            assert not Tensor.training
        assert Tensor.training
    assert not Tensor.training

    @Tensor.train()
    def f() -> bool:
        return Tensor.training
    assert f() and not Tensor.training


def test_dropout_only_in_training() -> None:
    x = Tensor.ones(200)
    assert (x.dropout(0.5).numpy() == 1).all()
    with Tensor.train():
        y = x.dropout(0.5).numpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 40 < (y == 0).sum() < 160


def test_gradients_are_lazy_graphs() -> None:
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    (g,) = (x.sin() * x).sum().gradient(x)
    assert g.uop.op not in (Ops.BUFFER,) and g.uop.base.op is not Ops.BUFFER  # nothing ran yet
    np.testing.assert_allclose(g.numpy(), np.cos([1.0, 2.0]) * [1.0, 2.0] + np.sin([1.0, 2.0]))


def test_compute_gradients_on_uops() -> None:
    a = Tensor(np.array([1.0, 2.0, 3.0]))
    b = Tensor(np.array([4.0, 5.0, 6.0]))
    root = (a * b).sum()
    one = Tensor(np.array(1.0))
    grads = compute_gradients(root.uop, one.uop, [a.uop, b.uop])
    np.testing.assert_allclose(Tensor(grads[a.uop]).numpy(), [4, 5, 6])
    np.testing.assert_allclose(Tensor(grads[b.uop]).numpy(), [1, 2, 3])
    with pytest.raises(ValueError, match="does not match"):
        compute_gradients(root.uop, a.uop, [a.uop])


def test_float16_gradient_keeps_dtype() -> None:
    x = Tensor(np.array([0.5, 1.5], np.float16), requires_grad=True)
    (g,) = (x * x).sum().gradient(x)
    assert g.dtype == dtypes.float16
    np.testing.assert_allclose(g.numpy().astype(np.float32), [1.0, 3.0])
