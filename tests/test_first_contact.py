"""A new user's first lines, written with PyTorch habits, run unchanged but for the import (issue 16)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from rawgrad import Tensor, TinyJit, nn
from rawgrad.dtype import dtypes


@pytest.fixture(autouse=True)
def _eval_mode_afterwards() -> Iterator[None]:
    """model.train() sets the process-wide Tensor.training; every test here leaves it off again."""
    yield
    Tensor.training = False


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.drop(self.fc1(x).relu()))


def test_the_first_ten_pytorch_lines() -> None:
    x = Tensor.randn(3, 4, requires_grad=True)
    w = Tensor.ones(4, 2, requires_grad=True)
    assert "tensor([" in repr(w) and "requires_grad=True" in repr(w)
    assert np.array(w).shape == (4, 2)
    loss = (x @ w).relu().sum()
    loss.backward()
    assert x.grad is not None and w.grad is not None
    xv = np.array(x)
    np.testing.assert_allclose(w.grad.numpy(), xv.T @ ((xv @ np.ones((4, 2))) > 0), rtol=1e-6)

    model = Net()
    names = [n for n, _ in model.named_parameters()]
    assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    opt = nn.optim.SGD(list(model.parameters()), lr=0.1)
    data = Tensor(np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32))
    target = Tensor(np.random.default_rng(1).integers(0, 2, 16).astype(np.int32))
    # Compare eval-mode losses (no dropout) before and after training: a train-mode loss carries a dropout
    # mask, so comparing it with an eval-mode loss depended on the weights and masks the global RNG gave
    # (it failed whenever another test file ran first).
    initial = nn.cross_entropy(model(data), target).item()
    model.train()
    assert model.training and model.fc1.training and Tensor.training
    for _ in range(20):
        opt.zero_grad()
        step_loss = nn.cross_entropy(model(data), target)
        step_loss.backward()
        opt.step()
    model.eval()
    assert not Tensor.training
    final = nn.cross_entropy(model(data), target).item()
    assert final < initial, (initial, final)

    state = model.state_dict()
    other = Net()
    other.load_state_dict(state)
    np.testing.assert_array_equal(other(data).numpy(), model(data).numpy())

    @TinyJit
    def predict(inp: Tensor) -> Tensor:
        return model(inp).softmax(-1)
    want = model(data).softmax(-1).numpy()
    for _ in range(4):
        np.testing.assert_allclose(predict(data).numpy(), want, rtol=1e-6)


def test_tinygrad_style_backward_without_requires_grad() -> None:
    w = Tensor([[1.0, 2.0], [3.0, 4.0]])
    x = Tensor([1.0, -1.0])
    (x @ w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[1, 1], [-1, -1]])
    assert dtypes.int32.max == 2 ** 31 - 1 and dtypes.uint8.min == 0


def test_where_with_only_a_condition_gives_coordinates_like_torch() -> None:
    cond = np.array([[True, False, True], [False, True, False]])
    got = Tensor(cond).where()
    for g, w in zip(got, np.where(cond)):
        np.testing.assert_array_equal(g.numpy(), w)


def test_elu_gradient_is_finite_for_large_inputs() -> None:
    x = Tensor([100.0, 0.5, -1.0], requires_grad=True)
    x.elu().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0, np.exp(-1.0)], rtol=1e-6)


def test_a_torch_style_sequential_cnn_trains() -> None:
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(4 * 4 * 4, 3), nn.LogSoftmax(dim=1))
    x = Tensor(rng.standard_normal((8, 1, 8, 8)).astype(np.float32))
    y = Tensor(rng.integers(0, 3, 8).astype(np.int32))
    opt = nn.optim.Adam(list(model.parameters()), lr=0.01)
    losses = []
    model.train()
    try:
        for _ in range(10):
            opt.zero_grad()
            loss = model(x).nll_loss(y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        model.eval()  # Tensor.training is process-wide: leave it as the other tests expect
    assert losses[-1] < losses[0], losses
    for layer, want in [(nn.GELU(), None), (nn.SiLU(), None), (nn.Tanh(), np.tanh), (nn.Sigmoid(), None),
                        (nn.Identity(), lambda a: a),
                        (nn.LeakyReLU(0.1), lambda a: np.where(a > 0, a, 0.1 * a)),
                        (nn.Softmax(dim=-1), None), (nn.AvgPool2d(2), None)]:
        out = layer(x)
        if want is not None:
            np.testing.assert_allclose(out.numpy(), want(x.numpy()), rtol=1e-5, atol=1e-6)
        assert out.shape[0] == 8
