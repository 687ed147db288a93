# mypy: disable-error-code="misc"
# (the methods annotate `self: Tensor`, the class they are mixed into; mypy files that under "misc")
"""Tensor reductions and what is built directly on them: sum, prod, max/min (torch's (values, indices)
forms and the values-only `_max`/`_min` internal code calls), any/all, mean, var/std (and their
*_mean pairs), argmax/argmin, logsumexp, softmax/log_softmax, cumsum, and layer normalisation.

Every reduction is one REDUCE_AXIS node (ADD, MUL or MAX) that keeps the reduced dims as 1; `keepdim=False`
is a reshape after it. min is a MAX of the negated (or bit-inverted) values, so backends need only MAX.
Int and bool sums accumulate in int64 as torch does; float16/bfloat16 means and variances compute in
float32 and round once (`Tensor._float_fn`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType, DTypeLike, dtypes, to_dtype
from rawgrad.errors import ShapeError
from rawgrad.tensor.common import Axis, Scalar, _prod
from rawgrad.tensor.ops_math import ValuesIndices

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor


class ReduceOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()

    def _reduce(self: Tensor, rop: Ops, axis: Axis, keepdim: bool) -> Tensor:
        axes = self._axes(axis)
        x = self
        if axes:
            x = self._new(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (rop, axes)))
        if keepdim:
            return x
        return x.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def _no_empty(self: Tensor, axis: Axis, name: str) -> None:
        for a in self._axes(axis):
            if self.shape[a] == 0:
                raise ShapeError(f"{name}() over axis {a} of size 0 (shape {self.shape}) has no identity")

    @staticmethod
    def _acc_dtype(dt: DType, dtype: DTypeLike | None) -> DType:
        if dtype is not None:
            return to_dtype(dtype)
        return dtypes.int64 if dt.is_int or dt.is_bool else dt  # torch sums ints and bools to int64

    def sum(self: Tensor, axis: Axis = None, keepdim: bool = False, dtype: DTypeLike | None = None, *,
            dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis
        return self.cast(self._acc_dtype(self.dtype, dtype))._reduce(Ops.ADD, axis, keepdim)

    def prod(self: Tensor, axis: Axis = None, keepdim: bool = False, dtype: DTypeLike | None = None, *,
             dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis
        return self.cast(self._acc_dtype(self.dtype, dtype))._reduce(Ops.MUL, axis, keepdim)

    def max(self: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Axis = None) -> Any:
        """torch's max: no dim -> the 0-d maximum; an int dim (positional or dim=) -> a (values, indices)
        named tuple, indices the first position of the maximum as argmax; a Tensor -> the elementwise
        maximum (torch.max(a, b)). tinygrad's values-only reduction is `max(axis=..., keepdim=...)`
        (keyword axis, an int or a tuple) or amax; a tuple dim also reduces to values only."""
        if isinstance(dim, type(self)):
            return self.maximum(dim)
        if axis is None and isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
            return ValuesIndices(self._max(int(dim), keepdim), self.argmax(int(dim), keepdim))
        return self._max(axis if axis is not None else dim, keepdim)

    def min(self: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Axis = None) -> Any:
        """torch's min; the forms as `max` (values-only: `min(axis=...)` or amin)."""
        if isinstance(dim, type(self)):
            return self.minimum(dim)
        if axis is None and isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
            return ValuesIndices(self._min(int(dim), keepdim), self.argmin(int(dim), keepdim))
        return self._min(axis if axis is not None else dim, keepdim)

    def _max(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The values-only max reduction (what internal code calls)."""
        self._no_empty(axis, "max")
        if self.dtype.is_bool:  # reduce bools as bytes: a 1-bit MAX is not what every backend means
            return self.cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
        return self._reduce(Ops.MAX, axis, keepdim)

    def _min(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The values-only min reduction."""
        self._no_empty(axis, "min")
        if self.dtype.is_bool:
            return self.logical_not()._max(axis, keepdim).logical_not()
        if self.dtype.is_int:
            return ~((~self)._max(axis, keepdim))
        return -((-self)._max(axis, keepdim))

    def any(self: Tensor, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis
        return self.bool().cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).bool()

    def all(self: Tensor, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis
        return self.logical_not().any(axis, keepdim).logical_not()

    def _count(self: Tensor, axis: Axis) -> Any:
        return _prod([self.shape[a] for a in self._axes(axis)])

    def mean(self: Tensor, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None,
             dtype: DTypeLike | None = None) -> Tensor:
        axis = dim if dim is not None else axis
        n = self._count(axis)
        x = self if dtype is None else self.cast(to_dtype(dtype))
        return x._float_fn(lambda v: v.sum(axis, keepdim) / n)

    def var(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: Scalar = 1, *,
            dim: Axis = None, unbiased: bool | None = None) -> Tensor:
        """Variance with Bessel's correction by default (torch's correction=1; unbiased=False is
        correction=0). The second positional argument is keepdim (tinygrad's order), not unbiased."""
        axis = dim if dim is not None else axis
        if unbiased is not None:
            correction = 1 if unbiased else 0
        n = self._count(axis)

        def fn(x: Tensor) -> Tensor:
            d = x - x.mean(axis, keepdim=True)
            if isinstance(n, UOp):  # a symbolic count: the divisor is computed on the device
                count = type(x)(n, device=x.device).cast(x.dtype)
                return (d * d).sum(axis, keepdim) / (count - correction).maximum(0)
            return (d * d).sum(axis, keepdim) / max(0, n - correction)
        return self._float_fn(fn)

    def std(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: Scalar = 1, *,
            dim: Axis = None, unbiased: bool | None = None) -> Tensor:
        return self.var(axis, keepdim, correction, dim=dim, unbiased=unbiased).sqrt()

    def var_mean(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: Scalar = 1, *,
                 dim: Axis = None, unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
        axis = dim if dim is not None else axis
        return self.var(axis, keepdim, correction, unbiased=unbiased), self.mean(axis, keepdim)

    def std_mean(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: Scalar = 1, *,
                 dim: Axis = None, unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
        axis = dim if dim is not None else axis
        return self.std(axis, keepdim, correction, unbiased=unbiased), self.mean(axis, keepdim)

    def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False, *,
               dim: int | None = None) -> Tensor:
        """Index of the first maximum (a NaN counts as the maximum, as numpy); int64 like torch."""
        axis = dim if dim is not None else axis
        if axis is None:
            r = self.flatten().argmax(0)
            return r.reshape((1,) * self.ndim) if keepdim else r
        ax = self._axis(axis)
        if self.ndim == 0:
            return self._full((), 0, dtypes.int64, self.device)
        self._no_empty(ax, "argmax")
        n = self.shape[ax]
        hit = self == self._max(ax, keepdim=True)
        if self.dtype.is_float:
            hit = hit | self.isnan()
        # n - i is largest for the first hit, so a MAX finds it
        rev = (n - type(self).arange(n, dtype=dtypes.int64, device=self.device))
        rev = rev.reshape((n,) + (1,) * (self.ndim - ax - 1))
        return n - hit.where(rev, 0)._max(ax, keepdim)

    def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False, *,
               dim: int | None = None) -> Tensor:
        flipped = self.logical_not() if self.dtype.is_bool else ~self if self.dtype.is_int else -self
        return flipped.argmax(axis, keepdim, dim=dim)

    def logsumexp(self: Tensor, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis

        def fn(x: Tensor) -> Tensor:
            m = x._max(axis, keepdim=True)
            m = m.isinf().where(0, m)  # all -inf (or an inf) must not turn into inf - inf = NaN
            s = (x - m).exp().sum(axis, keepdim=True).log() + m
            return s if keepdim else s.reshape(tuple(d for i, d in enumerate(x.shape)
                                                     if i not in x._axes(axis)))
        return self._float_fn(fn)

    def softmax(self: Tensor, axis: int = -1, dtype: DTypeLike | None = None, *,
                dim: int | None = None) -> Tensor:
        axis = dim if dim is not None else axis
        x = self if dtype is None else self.cast(to_dtype(dtype))

        def fn(v: Tensor) -> Tensor:
            e = (v - v._max(axis, keepdim=True)).exp()
            return e / e.sum(axis, keepdim=True)
        return x._float_fn(fn)

    def log_softmax(self: Tensor, axis: int = -1, dtype: DTypeLike | None = None, *,
                    dim: int | None = None) -> Tensor:
        axis = dim if dim is not None else axis
        x = self if dtype is None else self.cast(to_dtype(dtype))

        def fn(v: Tensor) -> Tensor:
            z = v - v._max(axis, keepdim=True)
            return z - z.exp().sum(axis, keepdim=True).log()
        return x._float_fn(fn)

    def cumsum(self: Tensor, axis: int = 0, dtype: DTypeLike | None = None, *,
               dim: int | None = None) -> Tensor:
        """Running sum: a lower-triangular masked sum (n*n work, fine for the sizes it is used at)."""
        axis = dim if dim is not None else axis
        x = self.cast(self._acc_dtype(self.dtype, dtype))
        if self.ndim == 0:
            self._axis(axis)
            return x
        ax = self._axis(axis)
        n = self.shape[ax]
        xt = x.transpose(ax, -1)
        pos = type(self).arange(n, device=self.device)
        lower = pos.reshape(n, 1) >= pos.reshape(1, n)  # lower[i, j]: element j counts toward output i
        out = lower.where(xt.unsqueeze(-2), 0).sum(-1, dtype=x.dtype)
        return out.transpose(ax, -1)

    # ------------------------------------------------------------------ normalisation
    def layernorm(self: Tensor, axis: Axis = -1, eps: float = 1e-5) -> Tensor:
        """Normalise to zero mean, unit (biased) variance over axis; no affine part (tinygrad)."""
        def fn(x: Tensor) -> Tensor:
            d = x - x.mean(axis, keepdim=True)
            return d * ((d * d).mean(axis, keepdim=True) + eps).rsqrt()
        return self._float_fn(fn)

    def layer_norm(self: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None,
                   bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
        """torch.nn.functional.layer_norm over the trailing normalized_shape dims."""
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if tuple(self.shape[self.ndim - len(ns):]) != ns:
            raise ShapeError(f"layer_norm: normalized_shape {ns} does not match the end of {self.shape}")
        x = self.layernorm(tuple(range(self.ndim - len(ns), self.ndim)), eps)
        if weight is not None:
            x = x * weight
        return x if bias is None else x + bias
