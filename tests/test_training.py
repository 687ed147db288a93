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
