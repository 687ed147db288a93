"""Layers as plain callable objects holding Tensors (tinygrad style; torch's names and defaults).

Parameters are realized when a layer is made, each into its own buffer: two lazy `Tensor.zeros(8)` are
the same graph node, and gradients are found by node, so unrealized parameters of equal shape would
share one gradient.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rawgrad.dtype import DTypeLike, dtypes, to_dtype
from rawgrad.nn.functional import _realize_pending, batch_norm, conv_transpose2d, group_norm
from rawgrad.nn.module import Module
from rawgrad.tensor.tensor import Tensor

IntOrPair = int | Sequence[int]


def _filled(shape: tuple[int, ...], value: float, dtype: DTypeLike | None, requires_grad: bool) -> Tensor:
    """A new buffer holding `value` everywhere (uploaded, so no kernel and never shared)."""
    dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
    return Tensor(np.full(shape, value, np.float64), dtype=dt, requires_grad=requires_grad)


def _uniform(shape: tuple[int, ...], bound: float, dtype: DTypeLike | None) -> Tensor:
    t = Tensor.uniform(*shape, low=-bound, high=bound, dtype=dtype or dtypes.default_float).realize()
    return t.requires_grad_()


def _pair(x: IntOrPair, n: int = 2) -> tuple[int, ...]:
    return (x,) * n if isinstance(x, int) else tuple(x)


class Linear(Module):
    """y = x @ weight.T + bias, weight (out_features, in_features) as torch; U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: DTypeLike | None = None):
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform((out_features, in_features), bound, dtype)
        self.bias = _uniform((out_features,), bound, dtype) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.linear(self.weight.T, self.bias)


class Conv2d(Module):
    """2-d convolution, weight (out, in // groups, kh, kw) as torch (torch's default init bound)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrPair, stride: IntOrPair = 1,
                 padding: IntOrPair | str = 0, dilation: IntOrPair = 1, groups: int = 1, bias: bool = True,
                 dtype: DTypeLike | None = None):
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: channels {in_channels} -> {out_channels} must divide by "
                             f"groups={groups}")
        self.kernel_size = _pair(kernel_size)
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.padding = padding
        bound = 1.0 / math.sqrt(in_channels // groups * math.prod(self.kernel_size))
        self.weight = _uniform((out_channels, in_channels // groups, *self.kernel_size), bound, dtype)
        self.bias = _uniform((out_channels,), bound, dtype) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


class ConvTranspose2d(Module):
    """Transposed 2-d convolution, weight (in, out // groups, kh, kw) as torch."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrPair, stride: IntOrPair = 1,
                 padding: IntOrPair = 0, output_padding: IntOrPair = 0, dilation: IntOrPair = 1,
                 groups: int = 1, bias: bool = True, dtype: DTypeLike | None = None):
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"ConvTranspose2d: channels {in_channels} -> {out_channels} must divide by "
                             f"groups={groups}")
        self.kernel_size = _pair(kernel_size)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation, self.groups = dilation, groups
        bound = 1.0 / math.sqrt(out_channels // groups * math.prod(self.kernel_size))
        self.weight = _uniform((in_channels, out_channels // groups, *self.kernel_size), bound, dtype)
        self.bias = _uniform((out_channels,), bound, dtype) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                self.groups, self.dilation)


class BatchNorm(Module):
    """Batch normalization over every axis but 1 (channels). In training, normalizes with the batch's
    statistics and moves the running ones by `momentum` (running_var takes the unbiased variance, as
    torch); otherwise normalizes with the running statistics.

    The running statistics are updated with `assign`; pass `get_parameters(model)` to the optimizer
    (it realizes tensors without requires_grad along with each step) or realize them yourself."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True,
                 track_running_stats: bool = True, momentum: float = 0.1, dtype: DTypeLike | None = None):
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.track_running_stats = track_running_stats
        self.weight = _filled((num_features,), 1.0, dtype, True) if affine else None
        self.bias = _filled((num_features,), 0.0, dtype, True) if affine else None
        if track_running_stats:
            self.running_mean = _filled((num_features,), 0.0, dtype, False)
            self.running_var = _filled((num_features,), 1.0, dtype, False)
            self.num_batches_tracked = Tensor(np.zeros((), np.int64), requires_grad=False)

    def _check(self, x: Tensor) -> None:
        if x.ndim < 2 or x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) got input of shape {x.shape}; "
                             f"expected (N, {self.num_features}, ...)")

    def __call__(self, x: Tensor) -> Tensor:
        self._check(x)
        track = self.track_running_stats
        if Tensor.training and track:
            _realize_pending(self.num_batches_tracked)
            self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        return batch_norm(x, self.running_mean if track else None, self.running_var if track else None,
                          self.weight, self.bias, Tensor.training or not track, self.momentum, self.eps)


class BatchNorm1d(BatchNorm):
    """BatchNorm over (N, C) or (N, C, L)."""

    def _check(self, x: Tensor) -> None:
        if x.ndim not in (2, 3):
            raise ValueError(f"BatchNorm1d needs (N, C) or (N, C, L) input, got shape {x.shape}")
        super()._check(x)


class BatchNorm2d(BatchNorm):
    """BatchNorm over (N, C, H, W)."""

    def _check(self, x: Tensor) -> None:
        if x.ndim != 4:
            raise ValueError(f"BatchNorm2d needs (N, C, H, W) input, got shape {x.shape}")
        super()._check(x)


class LayerNorm(Module):
    """Normalize over the trailing `normalized_shape` dims, then scale and shift elementwise."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, dtype: DTypeLike | None = None):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) \
            else tuple(normalized_shape)
        self.eps = eps
        self.weight = _filled(self.normalized_shape, 1.0, dtype, True) if elementwise_affine else None
        self.bias = _filled(self.normalized_shape, 0.0, dtype, True) if elementwise_affine and bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.layer_norm(self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(Module):
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True,
                 dtype: DTypeLike | None = None):
        self.eps = eps
        self.weight = _filled((dim,), 1.0, dtype, True) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        y = x * (x.square().mean(-1, keepdim=True) + self.eps).rsqrt()
        return y if self.weight is None else y * self.weight


class GroupNorm(Module):
    """Normalize each group of num_channels // num_groups channels (with all spatial positions)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 dtype: DTypeLike | None = None):
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: {num_channels} channels do not split into {num_groups} groups")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight = _filled((num_channels,), 1.0, dtype, True) if affine else None
        self.bias = _filled((num_channels,), 0.0, dtype, True) if affine else None

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm({self.num_groups}, {self.num_channels}) got input of shape "
                             f"{x.shape}")
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class Embedding(Module):
    """Rows of a (num_embeddings, embedding_dim) table picked by integer indices; N(0, 1) init."""

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: DTypeLike | None = None):
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Tensor.randn(num_embeddings, embedding_dim,
                                   dtype=dtype or dtypes.default_float).realize().requires_grad_()

    def __call__(self, idx: Tensor) -> Tensor:
        if idx.dtype.is_float:
            raise TypeError(f"Embedding needs integer indices, got {idx.dtype}")
        return idx.embedding(self.weight)


class Dropout(Module):
    """Zero each element with probability p while Tensor.training (scaling the rest by 1/(1-p))."""

    def __init__(self, p: float = 0.5):
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        return x.dropout(self.p)


class Sequential(Module):
    """Call layers (any callables, e.g. Tensor.relu) in order; a list, so state dicts number them."""

    def __init__(self, *layers: Callable[[Tensor], Tensor]):
        self.layers = list(layers)

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def __getitem__(self, i: int) -> Any:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)


# ---------------------------------------------------------------------------------------------------------
# Stateless layers: torch's module names for the Tensor methods, so
# `nn.Sequential(nn.Linear(4, 8), nn.ReLU())` reads as in torch. `inplace` is accepted and ignored
# (rawgrad tensors are values, never updated in place).
class ReLU(Module):
    def __init__(self, inplace: bool = False):
        pass

    def __call__(self, x: Tensor) -> Tensor:
        return x.relu()


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        self.negative_slope = negative_slope

    def __call__(self, x: Tensor) -> Tensor:
        return x.leaky_relu(self.negative_slope)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        self.approximate = approximate

    def __call__(self, x: Tensor) -> Tensor:
        return x.gelu(self.approximate)


class _Elementwise(Module):
    """A layer that applies one Tensor method (named by the subclass) to its input."""

    method = ""

    def __init__(self, inplace: bool = False):
        pass

    def __call__(self, x: Tensor) -> Tensor:
        return getattr(x, self.method)()


class SiLU(_Elementwise):
    method = "silu"


class Sigmoid(_Elementwise):
    method = "sigmoid"


class Tanh(_Elementwise):
    method = "tanh"


class Identity(Module):
    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def __call__(self, x: Tensor) -> Tensor:
        return x


class Softmax(Module):
    def __init__(self, dim: int = -1):
        self.dim = dim

    def __call__(self, x: Tensor) -> Tensor:
        return x.softmax(self.dim)


class LogSoftmax(Softmax):
    def __call__(self, x: Tensor) -> Tensor:
        return x.log_softmax(self.dim)


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        self.start_dim, self.end_dim = start_dim, end_dim

    def __call__(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)


class MaxPool2d(Module):
    def __init__(self, kernel_size: IntOrPair, stride: IntOrPair | None = None, padding: IntOrPair = 0,
                 dilation: IntOrPair = 1, ceil_mode: bool = False):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def __call__(self, x: Tensor) -> Tensor:
        return x.max_pool2d(self.kernel_size, self.stride, self.dilation, self.padding, self.ceil_mode)


class AvgPool2d(Module):
    def __init__(self, kernel_size: IntOrPair, stride: IntOrPair | None = None, padding: IntOrPair = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True):
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def __call__(self, x: Tensor) -> Tensor:
        return x.avg_pool2d(self.kernel_size, self.stride, 1, self.padding, self.ceil_mode,
                            self.count_include_pad)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size: int | Sequence[int | None] | None):
        self.output_size = output_size

    def __call__(self, x: Tensor) -> Tensor:
        return x.adaptive_avg_pool2d(self.output_size)
