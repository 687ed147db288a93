"""Optimizers and learning-rate schedules.

A step is built from lazy tensor ops and written back with `assign`, then everything it touches is
realized in one call, so a JIT can capture the whole update. The learning rate is a realized 0-d
tensor (not a Python float baked into the kernels): a schedule changes its value without changing any
kernel.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from rawgrad.compiler.ir import Ops
from rawgrad.tensor.autograd import no_grad
from rawgrad.tensor.tensor import Tensor


def _zeros_like(p: Tensor) -> Tensor:
    """Optimizer state: a fresh buffer per parameter (an uploaded one: lazy zeros of equal shape would be
    one shared graph node)."""
    return Tensor(np.zeros(p.shape, np.float32), dtype=p.dtype, device=p.device, requires_grad=False)


def _scalar_state(value: float, device: str) -> Tensor:
    return Tensor(np.array(value, np.float32), device=device, requires_grad=False)


class Optimizer:
    """Holds the parameters (tensors with requires_grad; None counts as True, as tinygrad) and the
    buffers (tensors given with requires_grad=False, e.g. BatchNorm running statistics), which are
    realized with every step so their pending updates run."""

    def __init__(self, params: Iterable[Tensor], lr: float):
        given = list({id(t): t for t in params}.values())
        if not given:
            raise ValueError("optimizer got an empty parameter list")
        for t in given:
            if not isinstance(t, Tensor):
                raise TypeError(f"optimizer parameters must be Tensors, got {type(t).__name__}")
            if t.requires_grad is None and t.dtype.is_float:
                t.requires_grad = True
        self.params = [t for t in given if t.requires_grad]
        self.buffers = [t for t in given if not t.requires_grad]
        if not self.params:
            raise ValueError(f"none of the {len(given)} tensors given to the optimizer has "
                             "requires_grad=True (create them with requires_grad=True or call "
                             ".requires_grad_())")
        if lr < 0:
            raise ValueError(f"learning rate must be >= 0, got {lr}")
        self.device = self.params[0].device
        self.lr = _scalar_state(lr, self.device)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        """Apply one update to every parameter that has a gradient, and realize it."""
        Tensor.realize(*self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        """Build the update (lazy assigns) and return the tensors to realize, without realizing them."""
        with_grad = [p for p in self.params if p.grad is not None]
        if not with_grad:
            raise RuntimeError("optimizer step() with no gradients: call loss.backward() first")
        for p in with_grad:
            assert p.grad is not None
            if p.grad.shape != p.shape:
                raise ValueError(f"gradient of shape {p.grad.shape} for a parameter of shape {p.shape}")
        with no_grad():
            state = self._update(with_grad)
        pending = [b for b in self.buffers if b.uop.op is Ops.ASSIGN]
        return with_grad + state + pending

    def _update(self, params: list[Tensor]) -> list[Tensor]:
        """Assign the new values into params; return the optimizer state tensors that were assigned."""
        raise NotImplementedError

    def _lr(self, p: Tensor) -> Tensor:
        return self.lr.cast(p.dtype)


class SGD(Optimizer):
    """Stochastic gradient descent with (Nesterov) momentum and L2 weight decay, as torch.optim.SGD
    with dampening 0: buf = momentum * buf + g; the first step starts from buf = 0, which is buf = g."""

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr)
        if nesterov and momentum <= 0:
            raise ValueError("nesterov momentum needs momentum > 0")
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.bufs = [_zeros_like(p) for p in self.params] if momentum else []

    def _update(self, params: list[Tensor]) -> list[Tensor]:
        touched = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad + p * self.weight_decay if self.weight_decay else p.grad
            if self.momentum:
                buf = self.bufs[i].assign(self.bufs[i] * self.momentum + g)
                touched.append(buf)
                g = g + buf * self.momentum if self.nesterov else buf
            p.assign(p - g * self._lr(p))
        return touched


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; weight_decay is L2 added to the gradient (torch's Adam).
    Betas as tinygrad (b1, b2) or torch (betas=(b1, b2))."""

    decoupled = False

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0, betas: Sequence[float] | None = None):
        super().__init__(params, lr)
        if betas is not None:
            b1, b2 = betas
        for name, b in (("b1", b1), ("b2", b2)):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Adam {name} must be in [0, 1), got {b}")
        self.b1, self.b2, self.eps, self.weight_decay = b1, b2, eps, weight_decay
        self.m = [_zeros_like(p) for p in self.params]
        self.v = [_zeros_like(p) for p in self.params]
        # b1**t and b2**t as tensors, so the step count is data, not a constant in the kernels
        self.b1_t = _scalar_state(1.0, self.device)
        self.b2_t = _scalar_state(1.0, self.device)

    def _update(self, params: list[Tensor]) -> list[Tensor]:
        self.b1_t.assign(self.b1_t * self.b1)
        self.b2_t.assign(self.b2_t * self.b2)
        touched = [self.b1_t, self.b2_t]
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad
            if self.weight_decay and not self.decoupled:
                g = g + p * self.weight_decay
            m = self.m[i].assign(self.m[i] * self.b1 + g * (1 - self.b1))
            v = self.v[i].assign(self.v[i] * self.b2 + g * g * (1 - self.b2))
            m_hat = m / (1 - self.b1_t).cast(p.dtype)
            v_hat = v / (1 - self.b2_t).cast(p.dtype)
            update = m_hat / (v_hat.sqrt() + self.eps)
            lr = self._lr(p)
            base = p * (1 - lr * self.weight_decay) if self.weight_decay and self.decoupled else p
            p.assign(base - update * lr)
            touched += [m, v]
        return touched


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p -= lr * weight_decay * p each step."""

    decoupled = True

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.01, betas: Sequence[float] | None = None):
        super().__init__(params, lr, b1, b2, eps, weight_decay, betas)


# ---------------------------------------------------------------------- learning-rate schedules
class LRScheduler:
    """Sets optimizer.lr to `get_lr()` for the current epoch; `step()` moves to the next epoch. The
    schedules are closed forms of the epoch (what torch's chained forms give when nothing else touches
    the learning rate)."""

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        self.base_lr = float(optimizer.lr.item())
        self.epoch_counter = 0
        self.last_lr = self.base_lr
        self._apply()

    def get_lr(self) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.epoch_counter += 1
        self._apply()

    def _apply(self) -> None:
        lr = self.get_lr()
        if lr != self.last_lr:  # each change is one tiny kernel; skip the ones that change nothing
            self.optimizer.lr.assign(Tensor(np.array(lr, np.float32), device=self.optimizer.device)).realize()
        self.last_lr = lr

    def get_last_lr(self) -> list[float]:
        return [self.last_lr]


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(epoch)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float]):
        self.lr_lambda = lr_lambda
        super().__init__(optimizer)

    def get_lr(self) -> float:
        return self.base_lr * float(self.lr_lambda(self.epoch_counter))


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        if step_size <= 0:
            raise ValueError(f"StepLR step_size must be positive, got {step_size}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def get_lr(self) -> float:
        return self.base_lr * self.gamma ** (self.epoch_counter // self.step_size)


class MultiStepLR(LRScheduler):
    """lr = base_lr * gamma ** (number of milestones <= epoch)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer)

    def get_lr(self) -> float:
        return self.base_lr * self.gamma ** sum(1 for m in self.milestones if m <= self.epoch_counter)


class ExponentialLR(LRScheduler):
    """lr = base_lr * gamma ** epoch."""

    def __init__(self, optimizer: Optimizer, gamma: float):
        self.gamma = gamma
        super().__init__(optimizer)

    def get_lr(self) -> float:
        return self.base_lr * self.gamma ** self.epoch_counter


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (periodic past T_max)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):  # noqa: N803 torch's name
        if T_max <= 0:
            raise ValueError(f"CosineAnnealingLR T_max must be positive, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def get_lr(self) -> float:
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * self.epoch_counter
                                                                            / self.T_max)) / 2
