"""End-to-end training on scikit-learn's bundled 8x8 digits (1797 images, no download): an MLP and a
small CNN must each reach >= 97% accuracy on a held-out fifth of the data."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from rawgrad import nn
from rawgrad.nn import optim
from rawgrad.nn.state import get_parameters
from rawgrad.tensor.tensor import Tensor

Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@pytest.fixture(scope="module")
def digits() -> Split:
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    perm = np.random.default_rng(0).permutation(len(x))
    test, train = perm[:360], perm[360:]
    return x[train], y[train].astype(np.int32), x[test], y[test].astype(np.int32)


def _train(model: Callable[[Tensor], Tensor], data: Split, shape: tuple[int, ...], steps: int,
           batch: int, lr: float) -> float:
    xtr, ytr, xte, yte = data
    opt = optim.Adam(get_parameters(model), lr=lr)
    sched = optim.CosineAnnealingLR(opt, T_max=steps, eta_min=lr / 10)
    rng = np.random.default_rng(1)
    losses = []
    with Tensor.train():
        for _ in range(steps):
            idx = rng.integers(0, len(xtr), batch)
            loss = nn.cross_entropy(model(Tensor(xtr[idx].reshape((-1,) + shape))), Tensor(ytr[idx]))
            opt.zero_grad()
            loss.backward()
            # the loss is realized with the update: a graph still reading the parameters would see the
            # new values once the step has assigned them
            Tensor.realize(loss, *opt.schedule_step())
            sched.step()
            losses.append(loss.item())
    first, last = losses[0], np.mean(losses[-10:])
    assert last < first / 5, f"loss went from {first} to {last}"
    with nn.no_grad():
        pred = model(Tensor(xte.reshape((-1,) + shape))).argmax(1).numpy()
    return float((pred == yte).mean())


def test_mlp_on_digits(digits: Split) -> None:
    Tensor.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), Tensor.relu, nn.Linear(256, 10))
    acc = _train(model, digits, (64,), steps=150, batch=128, lr=1e-2)
    assert acc >= 0.97, f"MLP test accuracy {acc:.3f}"


def test_cnn_on_digits(digits: Split) -> None:
    Tensor.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), Tensor.relu,
                          lambda t: t.flatten(1), nn.Linear(16 * 8 * 8, 10))
    acc = _train(model, digits, (1, 8, 8), steps=100, batch=128, lr=5e-3)  # evaluated with running stats
    assert acc >= 0.97, f"CNN test accuracy {acc:.3f}"


def test_jitted_training_step_matches_eager() -> None:
    """One captured step (forward, backward, optimizer update) replays with the data as input."""
    from rawgrad import TinyJit
    from rawgrad.nn import Linear
    from rawgrad.nn.functional import cross_entropy
    from rawgrad.nn.optim import SGD
    from rawgrad.tensor.realize import GlobalCounters

    def make() -> tuple[Linear, Linear, SGD]:
        Tensor.manual_seed(0)
        l1, l2 = Linear(8, 16), Linear(16, 3)
        return l1, l2, SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.1, momentum=0.9)

    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int32))
            for _ in range(6)]

    def step(l1: Linear, l2: Linear, opt: SGD, x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = cross_entropy(l2(l1(x).relu()), y)
            loss.backward()
            Tensor.realize(loss, *opt.schedule_step())
        return loss

    l1, l2, opt = make()
    eager = [step(l1, l2, opt, Tensor(x), Tensor(y)).numpy() for x, y in data]
    eager_w = l2.weight.numpy()
    l1, l2, opt = make()
    jitted = TinyJit(lambda x, y: step(l1, l2, opt, x, y))
    losses = []
    for i, (x, y) in enumerate(data):
        GlobalCounters.reset()
        losses.append(jitted(Tensor(x), Tensor(y)).numpy())
        if i >= 2:  # replays schedule and compile nothing
            assert GlobalCounters.kernels_compiled == 0
    assert len(jitted.captures) == 1
    np.testing.assert_array_equal(np.array(losses), np.array(eager))
    np.testing.assert_array_equal(l2.weight.numpy(), eager_w)
