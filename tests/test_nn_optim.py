"""Optimizers against numpy transcriptions of torch.optim's update rules, and learning-rate schedules."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from rawgrad import nn
from rawgrad.compiler.ir import Ops
from rawgrad.nn import optim
from rawgrad.nn.state import get_parameters
from rawgrad.tensor.tensor import Tensor

C = np.array([1.0, 2.0, 0.5, 3.0], np.float32)
D = np.array([0.3, -1.0, 2.0, 0.0], np.float32)
P0 = np.array([1.0, -2.0, 0.5, 4.0], np.float32)


def _grad(p: np.ndarray) -> np.ndarray:
    return C * p + D  # d/dp of sum(C p^2 / 2 + D p)


def _run(make: Callable[[list[Tensor]], optim.Optimizer], steps: int = 4) -> np.ndarray:
    p = Tensor(P0.copy(), requires_grad=True)
    opt = make([p])
    for _ in range(steps):
        opt.zero_grad()
        (Tensor(C) * p * p / 2 + Tensor(D) * p).sum().backward()
        opt.step()
        assert p.uop.op is not Ops.ASSIGN  # the step realized the parameter
    return p.numpy()


def _sgd_ref(lr: float, momentum: float = 0.0, wd: float = 0.0, nesterov: bool = False,
             steps: int = 4) -> np.ndarray:
    p, buf = P0.astype(np.float64), None
    for _ in range(steps):
        g = _grad(p) + wd * p
        if momentum:
            buf = g if buf is None else momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def _adam_ref(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, wd: float = 0.0,
              decoupled: bool = False, steps: int = 4) -> np.ndarray:
    p = P0.astype(np.float64)
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t in range(1, steps + 1):
        g = _grad(p)
        if decoupled:
            p = p * (1 - lr * wd)
        elif wd:
            g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


@pytest.mark.parametrize("kw", [{}, {"momentum": 0.9}, {"momentum": 0.8, "nesterov": True},
                                {"momentum": 0.5, "weight_decay": 0.1}, {"weight_decay": 0.2}])
def test_sgd(kw: dict) -> None:
    got = _run(lambda ps: optim.SGD(ps, lr=0.1, **kw))
    ref = _sgd_ref(0.1, kw.get("momentum", 0.0), kw.get("weight_decay", 0.0), kw.get("nesterov", False))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [{}, {"weight_decay": 0.1}, {"betas": (0.8, 0.99), "eps": 1e-6}])
def test_adam(kw: dict) -> None:
    got = _run(lambda ps: optim.Adam(ps, lr=0.05, **kw))
    b1, b2 = kw.get("betas", (0.9, 0.999))
    ref = _adam_ref(0.05, b1, b2, kw.get("eps", 1e-8), kw.get("weight_decay", 0.0))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_adamw() -> None:
    got = _run(lambda ps: optim.AdamW(ps, lr=0.05, weight_decay=0.1))
    np.testing.assert_allclose(got, _adam_ref(0.05, wd=0.1, decoupled=True), rtol=1e-5, atol=1e-6)


def test_optimizer_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([])
    frozen = Tensor(np.ones(3, np.float32), requires_grad=False)
    with pytest.raises(ValueError, match="requires_grad"):
        optim.Adam([frozen])
    p = Tensor(np.ones(3, np.float32))  # requires_grad None: an optimizer trains it
    opt = optim.SGD([p, frozen], lr=0.1)
    assert p.requires_grad and len(opt.params) == 1 and opt.params[0] is p and opt.buffers[0] is frozen
    with pytest.raises(RuntimeError, match="backward"):
        opt.step()
    with pytest.raises(ValueError, match="nesterov"):
        optim.SGD([p], nesterov=True)


def test_step_realizes_batchnorm_statistics() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = optim.SGD(get_parameters(model), lr=0.1)
    bn = model[1]
    assert any(b is bn.running_mean for b in opt.buffers)
    assert all(p is not bn.running_mean for p in opt.params)
    x = Tensor(np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32))
    with Tensor.train():
        model(x).square().sum().backward()
    assert bn.running_mean.uop.op is Ops.ASSIGN
    opt.step()
    assert bn.running_mean.uop.op is not Ops.ASSIGN and bn.num_batches_tracked.item() == 1


def test_parameters_without_gradient_are_skipped() -> None:
    a = Tensor(np.ones(2, np.float32), requires_grad=True)
    b = Tensor(np.ones(2, np.float32), requires_grad=True)
    opt = optim.SGD([a, b], lr=0.5)
    (a * 2).sum().backward()
    opt.step()
    np.testing.assert_allclose(a.numpy(), [0, 0])
    np.testing.assert_allclose(b.numpy(), [1, 1])


SCHEDULES: dict[str, tuple[Callable[[optim.Optimizer], optim.LRScheduler], Callable[[int], float]]] = {
    "step": (lambda o: optim.StepLR(o, step_size=2, gamma=0.5), lambda e: 0.5 ** (e // 2)),
    "multistep": (lambda o: optim.MultiStepLR(o, [1, 4], gamma=0.1), lambda e: 0.1 ** ((e >= 1) + (e >= 4))),
    "exponential": (lambda o: optim.ExponentialLR(o, 0.9), lambda e: 0.9 ** e),
    "cosine": (lambda o: optim.CosineAnnealingLR(o, T_max=4, eta_min=0.1),
               lambda e: 0.1 + 0.9 * (1 + math.cos(math.pi * e / 4)) / 2),
    "lambda": (lambda o: optim.LambdaLR(o, lambda e: 1 / (e + 1)), lambda e: 1 / (e + 1)),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_lr_schedules(name: str) -> None:
    make, factor = SCHEDULES[name]
    opt = optim.SGD([Tensor(np.ones(2, np.float32), requires_grad=True)], lr=1.0)
    sched = make(opt)
    for epoch in range(6):
        assert math.isclose(opt.lr.item(), factor(epoch), rel_tol=1e-6), (epoch, opt.lr.item())
        assert math.isclose(sched.get_last_lr()[0], factor(epoch), rel_tol=1e-12)
        sched.step()


def test_learning_rate_is_data_not_a_constant() -> None:
    p = Tensor(np.ones(2, np.float32), requires_grad=True)
    opt = optim.SGD([p], lr=1.0)
    optim.LambdaLR(opt, lambda e: 0.0)
    p.sum().backward()
    opt.step()
    np.testing.assert_array_equal(p.numpy(), [1, 1])
