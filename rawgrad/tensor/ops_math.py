# mypy: disable-error-code="misc"
# (the methods annotate `self: Tensor`, the class they are mixed into; mypy files that under "misc")
"""Tensor methods for math, comparison, cumulative, sorting and shape helpers, composed from the core
ops in tensor.py (which mixes this class into `Tensor`). Nothing here adds a new kernel op: every method
is a composition the scheduler fuses like hand-written code, and autograd differentiates it like any other.
New tensors are built through the instance (`type(self)(...)`, `type(self).arange(...)`), so this module
never imports tensor.py, which imports it.

Notes that hold for the whole file:
- Float functions of int/bool inputs compute in the default float; float16/bfloat16 compute in float32 and
  round once (as `Tensor._float_fn`).
- Where a composite picks between two formulas with `where`, the unused branch is fed a harmless input
  (the "double where"), so its inf/NaN cannot turn a zero gradient into NaN.
- Sorting (sort, argsort, topk) ranks by counting: element i's position is the number of elements that
  must come before it (smaller, or equal with a lower index), so the result is stable, and NaN sorts as
  the largest value as in torch. That is O(n^2) compares per sorted row (n = the sorted axis length), in
  two reduce kernels with nothing n*n-sized written to memory; fine for n up to a few thousand. A bitonic
  network (O(n log^2 n)) would need log^2 n separate kernels and is left out.
- cumprod, cummax, cummin and logcumsumexp are lower-triangular masked reductions (n^2 work), as cumsum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from rawgrad.dtype import DType, DTypeLike, dtypes, least_upper_float, to_dtype
from rawgrad.tensor.indexing import _masked_sum

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor

_LN_2 = math.log(2.0)
_LOG10_2 = math.log10(2.0)
_TAN_PI_8 = math.tan(math.pi / 8)
_BIG = 2.0 ** 28  # above this, asinh/acosh are log(2x) to far below float64's rounding
# atan(u) / u as a polynomial in u*u for |u| <= tan(pi/8): a Chebyshev least-squares fit made for this
# file, max error 1.4e-15 (so float64 results are good to a few ulp; float32 to rounding)
_ATAN_COEFFS = (0.9999999999999993, -0.3333333333322464, 0.19999999978837593, -0.14285712686902882,
                0.11111049585343807, -0.09089541974216601, 0.07673651810006352, -0.06506641058716663,
                0.05026770854021795, -0.025342041106590094)
# sinh(x) / x as a polynomial in x*x, the Taylor series to x^14 (error < 1e-17 relative for |x| <= 0.5)
_SINH_COEFFS = tuple(1.0 / math.factorial(2 * k + 1) for k in range(8))
# atanh(s) / s as a polynomial in s*s, its Taylor series (error < 1e-18 for |s| <= 1/9, i.e. |y| <= 1/4)
_ATANH_COEFFS = tuple(1.0 / (2 * k + 1) for k in range(9))
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


class ValuesIndices(NamedTuple):
    """(values, indices), as torch's return types of sort/topk/cummax/cummin."""
    values: Tensor
    indices: Tensor


def _poly(s: Tensor, coeffs: Sequence[float]) -> Tensor:
    """coeffs[0] + coeffs[1]*s + ... by Horner's rule."""
    acc = s * coeffs[-1] + coeffs[-2]
    for c in reversed(coeffs[:-2]):
        acc = acc * s + c
    return acc


def _atan(x: Tensor) -> Tensor:
    """atan of a float tensor: reduce |x| to [0, 1] (1/x) and then to |u| <= tan(pi/8) ((t-1)/(t+1))."""
    ax = x.abs()
    big = ax > 1
    t = big.where(big.where(ax, 1).reciprocal(), ax)
    mid = t > _TAN_PI_8
    u = mid.where((t - 1) / (t + 1), t)
    r = u * _poly(u * u, _ATAN_COEFFS) + mid.cast(x.dtype) * (math.pi / 4)
    r = big.where(math.pi / 2 - r, r)
    return (x < 0).where(-r, r)


def _log1p(y: Tensor) -> Tensor:
    """log(1 + y), exact for small y on every backend (a device's LOG2 may be an approximation that is
    poor near 1): 2 atanh(s) with s = y / (2 + y) as a series for |y| <= 1/4, log(1 + y) beyond."""
    small = y.abs() <= 0.25
    ys, yb = small.where(y, 0), small.where(0, y)
    s = ys / (2 + ys)
    return small.where(2 * s * _poly(s * s, _ATANH_COEFFS), (1 + yb).log())


def _pairs(xt: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """xt (..., n) as (..., n, n) grids: x[i] down the rows, x[j] along the columns, and the int64
    positions i and j. Everything is broadcast before any ALU op, so the compares that follow fuse into
    the reduce that consumes them (an ALU result that is then expanded gets a kernel of its own)."""
    n = xt.shape[-1]
    shape = xt.shape[:-1] + (n, n)
    pos = type(xt).arange(n, dtype=dtypes.int64, device=xt.device)
    return (xt.unsqueeze(-1).expand(shape), xt.unsqueeze(-2).expand(shape),
            pos.reshape(n, 1).expand(shape), pos.reshape(1, n).expand(shape))


def _take_last(x: Tensor, idx: Tensor) -> Tensor:
    """x[..., idx[..., r]] along the last axis (idx (..., k) of int64, in range): a one-hot masked sum."""
    n = x.shape[-1]
    hit = idx.unsqueeze(-1) == type(x).arange(n, dtype=dtypes.int64, device=x.device)
    return _masked_sum(hit, x.unsqueeze(-2)._broadcast_to(hit.shape), (hit.ndim - 1,))


def _order_key(x: Tensor, largest: bool) -> Tensor:
    """A tensor whose ascending MAX order is x's (largest) or reversed x's order (smallest)."""
    if x.dtype.is_bool:
        x = x.cast(dtypes.uint8)
    if largest:
        return x
    return ~x if x.dtype.is_int else -x


def _lowest(dt: DType) -> Any:
    """The smallest value of an int or float dtype."""
    if dt.is_float:
        return -math.inf
    return 0 if dt.is_unsigned else -(2 ** (8 * dt.itemsize - 1))


def _after(a: Tensor, b: Tensor) -> Tensor:
    """a > b with NaN the largest value (torch's sort order); bools compare as 0/1."""
    if a.dtype.is_bool:
        a, b = a.cast(dtypes.uint8), b.cast(dtypes.uint8)
    gt = a > b
    return gt | (a.isnan() & b.isnan().logical_not()) if a.dtype.is_float else gt


def _same(a: Tensor, b: Tensor) -> Tensor:
    """a == b with NaN equal to NaN."""
    eq = a == b
    return eq | (a.isnan() & b.isnan()) if a.dtype.is_float else eq


class MathOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()

    # ------------------------------------------------------------------ dtype helpers
    def astype(self: Tensor, dtype: DTypeLike) -> Tensor:
        """Alias of cast (tinygrad/numpy)."""
        return self.cast(dtype)

    def type_as(self: Tensor, other: Tensor) -> Tensor:
        """self cast to other's dtype."""
        return self.cast(other.dtype)

    # ------------------------------------------------------------------ inverse trig and hyperbolic
    def atan(self: Tensor) -> Tensor:
        """Arctangent (a fitted polynomial after range reduction; float64 to a few ulp)."""
        return self._float_fn(_atan)

    def asin(self: Tensor) -> Tensor:
        """Arcsine, as 2 atan(x / (1 + sqrt(1 - x^2))); NaN outside [-1, 1]."""
        return self._float_fn(lambda x: 2 * _atan(x / (1 + ((1 - x) * (1 + x)).sqrt())))

    def acos(self: Tensor) -> Tensor:
        """Arccosine, as 2 atan(sqrt((1 - x) / (1 + x))); NaN outside [-1, 1]."""
        return self._float_fn(lambda x: 2 * _atan(((1 - x) / (1 + x)).sqrt()))

    def sinh(self: Tensor) -> Tensor:
        """Hyperbolic sine (a Taylor series for |x| <= 0.5, exp(x - ln2) - exp(-x - ln2) beyond)."""
        def fn(x: Tensor) -> Tensor:
            small = x.abs() <= 0.5
            xs, xb = small.where(x, 0), small.where(0, x)
            return small.where(xs * _poly(xs * xs, _SINH_COEFFS), (xb - _LN_2).exp() - (-xb - _LN_2).exp())
        return self._float_fn(fn)

    def cosh(self: Tensor) -> Tensor:
        """Hyperbolic cosine, exp(x - ln2) + exp(-x - ln2) (finite wherever the result is)."""
        return self._float_fn(lambda x: (x - _LN_2).exp() + (-x - _LN_2).exp())

    def asinh(self: Tensor) -> Tensor:
        """Inverse hyperbolic sine: log1p(|x| + x^2 / (1 + sqrt(1 + x^2))), log(2|x|) for huge |x|."""
        def fn(x: Tensor) -> Tensor:
            ax = x.abs()
            big = ax > _BIG
            a, b = big.where(1, ax), big.where(ax, 1)
            r = big.where(b.log() + _LN_2, _log1p(a + a * a / (1 + (1 + a * a).sqrt())))
            return (x < 0).where(-r, r)
        return self._float_fn(fn)

    def acosh(self: Tensor) -> Tensor:
        """Inverse hyperbolic cosine: log1p(t + sqrt(t (t + 2))) with t = x - 1, log(2x) for huge x."""
        def fn(x: Tensor) -> Tensor:
            big = x > _BIG
            t, b = big.where(0, x - 1), big.where(x, 1)
            r = big.where(b.log() + _LN_2, _log1p(t + (t * (t + 2)).sqrt()))
            return (x < 1).where(math.nan, r)  # t (t + 2) > 0 again below -1
        return self._float_fn(fn)

    def atanh(self: Tensor) -> Tensor:
        """Inverse hyperbolic tangent: (log1p(x) - log1p(-x)) / 2; +-inf at +-1, NaN beyond."""
        return self._float_fn(lambda x: (_log1p(x) - _log1p(-x)) * 0.5)

    def log10(self: Tensor) -> Tensor:
        """Base-10 logarithm."""
        return self._float_fn(lambda x: x.log2() * _LOG10_2)

    # ------------------------------------------------------------------ binary math
    def _float_pair(self: Tensor, other: Any) -> tuple[Tensor, Tensor, DType]:
        """self and other promoted, broadcast and cast to the float type they compute in (float32 for
        halves), with the result dtype."""
        a, b = self._operands(other)
        dt = least_upper_float(a.dtype)
        cdt = dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt
        return a.cast(cdt), b.cast(cdt), dt

    def logaddexp(self: Tensor, other: Any) -> Tensor:
        """log(exp(self) + exp(other)) without overflow: max + log1p(exp(-|self - other|))."""
        a, b, dt = self._float_pair(other)
        d = (a == b).where(0, -(a - b).abs())  # equal infinities: no inf - inf
        return (a.maximum(b) + _log1p(d.exp())).cast(dt)

    def copysign(self: Tensor, other: Any) -> Tensor:
        """|self| with the sign bit of other (-0.0 and NaN signs included); ints promote to float."""
        a, b = self._operands(other)
        if not a.dtype.is_float:
            dt = least_upper_float(a.dtype)
            a, b = a.cast(dt), b.cast(dt)
        bits = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[a.dtype.itemsize]
        return ((a.bitcast(bits) < 0) == (b.bitcast(bits) < 0)).where(a, -a)

    def lerp(self: Tensor, end: Any, weight: Any) -> Tensor:
        """self + weight * (end - self), exact at weight 1 like torch (ints promote to float instead of
        raising)."""
        a, e, dt = self._float_pair(end)
        d = e - a
        if isinstance(weight, (int, float)):
            out = a + d * weight if abs(weight) < 0.5 else e - d * (1 - weight)
        else:
            w = weight.cast(a.dtype)
            out = (w.abs() < 0.5).where(a + d * w, e - d * (1 - w))
        return out.cast(dt)

    # ------------------------------------------------------------------ activations
    def celu(self: Tensor, alpha: float = 1.0) -> Tensor:
        """max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
        def fn(x: Tensor) -> Tensor:
            pos = x > 0
            return pos.where(x, ((pos.where(0, x) / alpha).exp() - 1) * alpha)
        return self._float_fn(fn)

    def selu(self: Tensor) -> Tensor:
        """scale * (max(0, x) + min(0, alpha (exp(x) - 1))) with torch's alpha and scale."""
        def fn(x: Tensor) -> Tensor:
            pos = x > 0
            return pos.where(x, (pos.where(0, x).exp() - 1) * _SELU_ALPHA) * _SELU_SCALE
        return self._float_fn(fn)

    def softsign(self: Tensor) -> Tensor:
        """x / (1 + |x|)."""
        return self._float_fn(lambda x: x / (1 + x.abs()))

    def softmin(self: Tensor, dim: int = -1, dtype: DTypeLike | None = None) -> Tensor:
        """softmax(-x) (F.softmin; dim defaults to -1 instead of torch's deprecated implicit choice)."""
        x = self if dtype is None else self.cast(to_dtype(dtype))
        return (x.logical_not() if x.dtype.is_bool else -x).softmax(dim)

    def normalize(self: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        """F.normalize: x / max(||x||_p over dim, eps)."""
        def fn(x: Tensor) -> Tensor:
            ax = x.abs()
            if p == math.inf:
                norm = ax._max(dim, keepdim=True).maximum(eps)
            elif p == 1:
                norm = ax.sum(dim, keepdim=True).maximum(eps)
            elif p == 2:  # max(sqrt(s), eps) as sqrt(max(s, eps^2)): no sqrt'(0) = inf for a zero row
                norm = (x * x).sum(dim, keepdim=True).maximum(eps * eps).sqrt()
            else:
                norm = (ax ** p).sum(dim, keepdim=True).maximum(eps ** p) ** (1 / p)
            return x / norm
        return self._float_fn(fn)

    # ------------------------------------------------------------------ comparison
    def isclose(self: Tensor, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
                equal_nan: bool = False) -> Tensor:
        """|self - other| <= atol + rtol |other|, or equal (infinities are close only to themselves)."""
        a, b = self._operands(other)
        eq = a == b
        if not a.dtype.is_float:  # ints: exact |a - b| (no wraparound), compared in the default float
            a, b = (a.cast(dtypes.int64), b.cast(dtypes.int64)) if a.dtype.is_bool else (a, b)
            diff = (a.maximum(b) - a.minimum(b)).cast(dtypes.default_float)
            return eq | (diff <= b.abs().cast(dtypes.default_float) * rtol + atol)
        near = (a - b).abs() <= b.abs() * rtol + atol
        close = eq | (a.isfinite() & b.isfinite() & near)
        return close | (a.isnan() & b.isnan()) if equal_nan else close

    def allclose(self: Tensor, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
                 equal_nan: bool = False) -> bool:
        """isclose everywhere, as a Python bool (realizes)."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    # ------------------------------------------------------------------ masks and data-dependent shapes
    def masked_fill(self: Tensor, mask: Tensor, value: Any) -> Tensor:
        """value (cast to self's dtype) where mask is true, else self."""
        v = value if isinstance(value, type(self)) else type(self)(value, device=self.device)
        return mask.bool().where(v.cast(self.dtype), self)

    def masked_select(self: Tensor, mask: Tensor) -> Tensor:
        """The elements where mask (broadcast with self) is true, as 1-d (realizes the mask)."""
        shape = tuple(np.broadcast_shapes(self.shape, mask.shape))
        picked = np.flatnonzero(mask.bool()._broadcast_to(shape).numpy())
        return self._broadcast_to(shape).flatten()._take_rows(type(self)(picked.astype(np.int64),
                                                                          device=self.device))

    def nonzero(self: Tensor, as_tuple: bool = False) -> Tensor | tuple[Tensor, ...]:
        """Indices of the nonzero elements, (n, ndim) int64 or one 1-d tensor per dim (realizes)."""
        nz = (self != 0).numpy()
        if as_tuple:  # torch treats a 0-d tensor as 1-d here
            flat = nz.reshape(-1) if nz.ndim == 0 else nz
            return tuple(type(self)(i.astype(np.int64), device=self.device) for i in np.nonzero(flat))
        return type(self)(np.argwhere(nz).astype(np.int64), device=self.device)

    # ------------------------------------------------------------------ cumulative
    def cumprod(self: Tensor, dim: int = 0, dtype: DTypeLike | None = None) -> Tensor:
        """Running product (ints and bools accumulate in int64 like torch)."""
        x = self.cast(self._acc_dtype(self.dtype, dtype))
        if self.ndim == 0:
            self._axis(dim)
            return x
        ax = self._axis(dim)
        _, xj, i, j = _pairs(x.transpose(ax, -1))
        return (j <= i).where(xj, 1).prod(-1, dtype=x.dtype).transpose(ax, -1)

    def _cum_extreme(self: Tensor, dim: int, largest: bool) -> ValuesIndices:
        """cummax/cummin: the index is the last one holding the running extreme; a NaN sticks (torch)."""
        ax = self._axis(dim)
        if self.ndim == 0:
            return ValuesIndices(self, type(self)._full((), 0, dtypes.int64, self.device))
        xt = self.transpose(ax, -1)
        _, xj, i, j = _pairs(xt)
        key, lower = _order_key(xj, largest), j <= i
        nan = key.isnan() if key.dtype.is_float else None
        pool = lower if nan is None else lower & nan.logical_not()
        best = pool.where(key, _lowest(key.dtype))._max(-1, keepdim=True)  # (..., i, 1), NaNs left out
        hit = lower & (key == best)
        if nan is not None:
            hit = (lower & nan).any(-1, keepdim=True).where(lower & nan, hit)
        idx = hit.where(j, 0)._max(-1)
        return ValuesIndices(_take_last(xt, idx).transpose(ax, -1), idx.transpose(ax, -1))

    def cummax(self: Tensor, dim: int) -> ValuesIndices:
        """Running maximum and its index (the last one on ties, as torch)."""
        return self._cum_extreme(dim, largest=True)

    def cummin(self: Tensor, dim: int) -> ValuesIndices:
        """Running minimum and its index (the last one on ties, as torch)."""
        return self._cum_extreme(dim, largest=False)

    def logcumsumexp(self: Tensor, dim: int) -> Tensor:
        """log(cumsum(exp(x))), each prefix shifted by its own maximum so nothing under- or overflows."""
        ax = self._axis(dim)
        if self.ndim == 0:
            return self._float_fn(lambda x: x)

        def fn(x: Tensor) -> Tensor:
            _, xj, i, j = _pairs(x.transpose(ax, -1))
            lower = j <= i
            m = lower.where(xj, -math.inf)._max(-1, keepdim=True)
            m = m.isinf().where(0, m).detach()  # an all -inf (or +inf) prefix must not give inf - inf
            s = lower.where(xj - m, -math.inf).exp().sum(-1).log() + m.squeeze(-1)
            return s.transpose(ax, -1)
        return self._float_fn(fn)

    # ------------------------------------------------------------------ sorting
    def _ranked(self: Tensor, dim: int, descending: bool, k: int | None = None) -> ValuesIndices:
        """The first k (default all) elements in sorted order along dim, by counting ranks (stable)."""
        if self.ndim == 0:
            self._axis(dim)
            return ValuesIndices(self, type(self)._full((), 0, dtypes.int64, self.device))
        ax = self._axis(dim)
        n = self.shape[ax]
        k = n if k is None else k
        xt = self.transpose(ax, -1)
        ki, kj, i, j = _pairs(xt)
        first = _after(kj, ki) if descending else _after(ki, kj)  # j goes before i
        rank = (first | (_same(ki, kj) & (j < i))).sum(-1)  # (..., i): where element i lands
        pos = type(self).arange(k, dtype=dtypes.int64, device=self.device)
        hit = rank.unsqueeze(-2) == pos.reshape(k, 1)  # (..., r, i)
        vals = _masked_sum(hit, xt.unsqueeze(-2)._broadcast_to(hit.shape), (hit.ndim - 1,))
        src = type(self).arange(n, dtype=dtypes.int64, device=self.device).reshape(1, n)
        idx = _masked_sum(hit, src._broadcast_to(hit.shape), (hit.ndim - 1,))
        return ValuesIndices(vals.transpose(ax, -1), idx.transpose(ax, -1))

    def sort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:
        """(values, indices) sorted along dim; always stable, NaN sorts as the largest (O(n^2), see top)."""
        return self._ranked(dim, descending)

    def argsort(self: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
        """Indices that sort along dim (stable; see sort)."""
        return self._ranked(dim, descending).indices

    def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
        """The k largest (or smallest) along dim, always in sorted order; ties keep the lower index."""
        n = self.shape[self._axis(dim)] if self.ndim else 1
        if not 0 <= k <= n:
            raise ValueError(f"topk: k={k} is out of range for size {n} (shape {self.shape})")
        return self._ranked(dim, largest, k)

    # ------------------------------------------------------------------ shape helpers
    def roll(self: Tensor, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Rotate elements along dims by shifts (flattened first when dims is None)."""
        if dims is None:
            if not isinstance(shifts, int):
                raise ValueError("roll: shifts must be one int when dims is None")
            return self.flatten().roll(shifts, 0).reshape(self.shape)
        sh = (shifts,) if isinstance(shifts, int) else tuple(shifts)
        ds = (dims,) if isinstance(dims, int) else tuple(dims)
        if len(sh) != len(ds):
            raise ValueError(f"roll: {len(sh)} shifts for {len(ds)} dims")
        x = self
        for s, d in zip(sh, ds):
            ax, n = x._axis(d), x.shape[x._axis(d)]
            s = s % n if n else 0
            if s:
                cut = [(n - s, n) if i == ax else None for i in range(x.ndim)]
                rest = [(0, n - s) if i == ax else None for i in range(x.ndim)]
                x = x.shrink(cut).cat(x.shrink(rest), dim=ax)
        return x

    def diag(self: Tensor, diagonal: int = 0) -> Tensor:
        """1-d -> the 2-d matrix with it on the given diagonal; 2-d -> that diagonal as 1-d."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ValueError(f"diag needs a 1-d or 2-d tensor, got shape {self.shape}")
        n, k = self.shape[0], diagonal
        m = self.unsqueeze(1).pad(((0, 0), (0, n))).flatten().shrink(((0, n * n),)).reshape(n, n)
        return m.pad(((0, k), (k, 0)) if k >= 0 else ((-k, 0), (0, -k)))

    def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal of the (dim1, dim2) planes, as a new last dim (a view, like torch)."""
        a, b = self._axis(dim1), self._axis(dim2)
        if a == b:
            raise ValueError(f"diagonal: dim1 and dim2 are both {a}")
        rest = [i for i in range(self.ndim) if i not in (a, b)]
        x = self.permute(rest + [a, b])
        r, c = x.shape[-2:]
        ro, co = (0, min(offset, c)) if offset >= 0 else (min(-offset, r), 0)
        size = max(0, min(r - ro, c - co))
        lead = x.shape[:-2]
        x = x.shrink([None] * len(lead) + [(ro, ro + size), (co, co + size)]).reshape(lead + (size * size,))
        x = x.pad([(0, 0)] * len(lead) + [(0, size)]).reshape(lead + (size, size + 1))
        return x.shrink([None] * len(lead) + [None, (0, 1)]).reshape(lead + (size,))

    @staticmethod
    def meshgrid(*tensors: Any, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids from 0-d/1-d tensors (a list of them also works); indexing 'ij' or 'xy'."""
        one_list = len(tensors) == 1 and isinstance(tensors[0], (list, tuple))
        ts = list(tensors[0]) if one_list else list(tensors)
        if indexing not in ("ij", "xy"):
            raise ValueError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
        if any(t.ndim > 1 for t in ts):
            raise ValueError("meshgrid takes 0-d or 1-d tensors")
        axes = list(range(len(ts)))
        if indexing == "xy" and len(ts) >= 2:
            axes[0], axes[1] = 1, 0
        shape = [0] * len(ts)
        for t, ax in zip(ts, axes):
            shape[ax] = t.numel()
        return tuple(t.reshape([shape[i] if i == ax else 1 for i in range(len(ts))]).expand(shape)
                     for t, ax in zip(ts, axes))

    def repeat_interleave(self: Tensor, repeats: int | Sequence[int] | Tensor,
                          dim: int | None = None) -> Tensor:
        """Repeat each element along dim (flattened when None); repeats per element realize to the host."""
        x, ax = (self.flatten(), 0) if dim is None else (self, self._axis(dim))
        n = x.shape[ax]
        reps = np.asarray(repeats.numpy() if isinstance(repeats, type(self)) else repeats).reshape(-1)
        if reps.size == 1:
            r = int(reps[0])
            if r < 0:
                raise ValueError(f"repeat_interleave: repeats must be >= 0, got {r}")
            y = x.unsqueeze(ax + 1)
            y = y.expand(y.shape[:ax + 1] + (r,) + y.shape[ax + 2:])
            return y.reshape(x.shape[:ax] + (n * r,) + x.shape[ax + 1:])
        if reps.size != n or (reps < 0).any():
            raise ValueError(f"repeat_interleave: need {n} repeats >= 0 for dim {ax}, got {reps.tolist()}")
        rows = type(self)(np.repeat(np.arange(n, dtype=np.int64), reps), device=self.device)
        return x.transpose(0, ax)._take_rows(rows).transpose(0, ax)

    def unfold(self: Tensor, dimension: int, size: int, step: int) -> Tensor:
        """Tensor.unfold: windows of `size` every `step` along dimension, as a new last dim (size >= 1)."""
        ax = self._axis(dimension)
        if size < 1 or step < 1:
            raise ValueError(f"unfold: size and step must be >= 1, got size={size}, step={step}")
        if self.ndim == 0:
            if size != 1:
                raise ValueError(f"unfold: size {size} does not fit a 0-d tensor")
            return self.reshape(1)
        if size > self.shape[ax]:
            raise ValueError(f"unfold: size {size} exceeds dim {ax} of shape {self.shape}")
        w = self._windows(ax, size, step, 1)  # (..., out, size, ...)
        return w.permute([i for i in range(w.ndim) if i != ax + 1] + [ax + 1])

    # ------------------------------------------------------------------ torch habits: reductions
    def amax(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The values-only max over dim (an int, a tuple, or None for all)."""
        return self._max(dim, keepdim)

    def amin(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The values-only min over dim (an int, a tuple, or None for all)."""
        return self._min(dim, keepdim)

    def median(self: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
        """torch's median: the lower of the two middle values for an even count. No dim -> a 0-d tensor
        over all elements; a dim -> (values, indices). NaN sorts last (torch propagates it instead)."""
        if dim is None:
            flat = self.flatten()
            return flat.sort(0).values[(flat.shape[0] - 1) // 2]
        ax = self._axis(dim)
        mid = (self.shape[ax] - 1) // 2
        s = self.sort(ax)
        pick = (slice(None),) * ax + (slice(mid, mid + 1),)
        v, i = s.values[pick], s.indices[pick]
        return ValuesIndices(v, i) if keepdim else ValuesIndices(v.squeeze(ax), i.squeeze(ax))

    def mode(self: Tensor, dim: int = -1, keepdim: bool = False) -> ValuesIndices:
        """torch's mode along dim: the most frequent value (the smallest on a tie) and the last index
        where it occurs. O(n^2) compares per row, as sort."""
        ax = self._axis(dim) if self.ndim else 0
        x = (self.reshape(1) if self.ndim == 0 else self).transpose(ax, -1)
        a, b, _, j = _pairs(x)
        counts = _same(a, b).cast(dtypes.int32).sum(-1)  # (..., n): how often x[i] occurs
        best = counts._max(-1, keepdim=True)
        key = _order_key(x, largest=False)  # max of key = the smallest value
        chosen = (counts == best).where(key, _lowest(key.dtype))._max(-1, keepdim=True)
        hit = (counts == best) & (key == chosen)
        n = x.shape[-1]
        pos = type(self).arange(n, dtype=dtypes.int64, device=self.device)
        values = hit.where(x, x._const(0))._max(-1, keepdim=True) if x.dtype.is_bool else \
            _take_last(x, hit.where(pos, -1)._max(-1, keepdim=True))
        idx = (_same(x, values) & (j[..., 0, :] >= 0)).where(pos, -1)._max(-1, keepdim=True)
        values, idx = values.transpose(ax, -1), idx.transpose(ax, -1)
        if self.ndim == 0:
            return ValuesIndices(values.reshape(()), idx.reshape(()))
        return ValuesIndices(values, idx) if keepdim else ValuesIndices(values.squeeze(ax), idx.squeeze(ax))

    def norm(self: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False,
             dtype: DTypeLike | None = None) -> Tensor:
        """torch's vector norm over dim (all elements when None): p in 'fro'/2, inf, -inf, 0, or any
        other number (sum |x|^p)^(1/p)."""
        x = self if dtype is None else self.cast(to_dtype(dtype))
        a = x.abs()
        if p in ("fro", 2, 2.0):
            return a._float_fn(lambda v: v.square().sum(dim, keepdim).sqrt())
        if p == math.inf:
            return a._max(dim, keepdim)
        if p == -math.inf:
            return a._min(dim, keepdim)
        if p == 0:
            return (a != 0).cast(least_upper_float(x.dtype)).sum(dim, keepdim)
        if isinstance(p, str):
            raise ValueError(f"norm: p={p!r} is not supported (only vector norms)")
        return a._float_fn(lambda v: (v ** p).sum(dim, keepdim) ** (1.0 / p))

    def equal(self: Tensor, other: Tensor) -> bool:
        """torch.equal: same shape and every element equal (a Python bool)."""
        return self.shape == other.shape and bool((self == other).all().item())

    # ------------------------------------------------------------------ torch habits: shape
    def t(self: Tensor) -> Tensor:
        """Transpose a tensor of at most 2 dims (torch's t)."""
        if self.ndim > 2:
            raise ValueError(f"t() expects a tensor with <= 2 dims, got shape {self.shape}")
        return self if self.ndim < 2 else self.transpose(0, 1)

    @property
    def mT(self: Tensor) -> Tensor:  # noqa: N802 (torch's name)
        """The last two dims swapped."""
        if self.ndim < 2:
            raise ValueError(f"mT needs at least 2 dims, got shape {self.shape}")
        return self.transpose(-2, -1)

    def dim(self: Tensor) -> int:
        """The number of dims (torch's dim(); ndim is the property)."""
        return self.ndim

    def ndimension(self: Tensor) -> int:
        return self.ndim

    def nelement(self: Tensor) -> Any:
        return self.numel()

    def view_as(self: Tensor, other: Tensor) -> Tensor:
        return self.view(other.shape)

    def reshape_as(self: Tensor, other: Tensor) -> Tensor:
        return self.reshape(other.shape)

    def unbind(self: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
        """The slices along dim, that dim removed."""
        ax = self._axis(dim)
        return tuple(self[(slice(None),) * ax + (i,)] for i in range(self.shape[ax]))

    def narrow(self: Tensor, dim: int, start: Any, length: int) -> Tensor:
        """The length elements from start along dim (a negative start counts from the end)."""
        ax = self._axis(dim)
        start = int(start.item()) if hasattr(start, "item") and not isinstance(start, int) else start
        if start < 0:
            start += self.shape[ax]
        if start < 0 or length < 0 or start + length > self.shape[ax]:
            raise IndexError(f"narrow: start {start}, length {length} out of range for dim {ax} of "
                             f"shape {self.shape}")
        return self[(slice(None),) * ax + (slice(start, start + length),)]

    def index_select(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """The entries along dim at a 1-d (or 0-d) int index."""
        idx = index if isinstance(index, type(self)) else type(self)(np.asarray(index, np.int64),
                                                                      device=self.device)
        if idx.ndim > 1:
            raise ValueError(f"index_select needs a 1-d index, got shape {idx.shape}")
        if not idx.dtype.is_int:
            raise TypeError(f"index_select needs an int index, got {idx.dtype}")
        ax = self._axis(dim) if self.ndim else 0
        x = self.reshape(1) if self.ndim == 0 else self
        out = x.transpose(0, ax)._take_rows(idx.reshape(-1)).transpose(0, ax)
        return out.reshape(()) if self.ndim == 0 else out

    # ------------------------------------------------------------------ torch habits: math aliases
    def clamp_min(self: Tensor, min: Any) -> Tensor:  # noqa: A002 (torch's name)
        return self.clip(min, None)

    def clamp_max(self: Tensor, max: Any) -> Tensor:  # noqa: A002 (torch's name)
        return self.clip(None, max)

    def true_divide(self: Tensor, other: Any) -> Tensor:
        return self.div(other)

    def mm(self: Tensor, other: Tensor) -> Tensor:
        """2-d @ 2-d."""
        if self.ndim != 2 or other.ndim != 2:
            raise ValueError(f"mm needs 2-d tensors, got {self.shape} and {other.shape}")
        return self.matmul(other)

    def bmm(self: Tensor, other: Tensor) -> Tensor:
        """3-d @ 3-d with the same batch size."""
        if self.ndim != 3 or other.ndim != 3 or self.shape[0] != other.shape[0]:
            raise ValueError(f"bmm needs 3-d tensors with one batch size, got {self.shape} and {other.shape}")
        return self.matmul(other)

    def mv(self: Tensor, vec: Tensor) -> Tensor:
        """2-d @ 1-d."""
        if self.ndim != 2 or vec.ndim != 1:
            raise ValueError(f"mv needs a 2-d and a 1-d tensor, got {self.shape} and {vec.shape}")
        return self.matmul(vec)

    def outer(self: Tensor, vec2: Tensor) -> Tensor:
        """The outer product of two 1-d tensors."""
        if self.ndim != 1 or vec2.ndim != 1:
            raise ValueError(f"outer needs 1-d tensors, got {self.shape} and {vec2.shape}")
        return self.unsqueeze(1) * vec2.unsqueeze(0)

    def ger(self: Tensor, vec2: Tensor) -> Tensor:
        return self.outer(vec2)

    def type(self: Tensor, dtype: DTypeLike | None = None) -> Any:
        """type(dtype) casts (torch); type() names the dtype."""
        if dtype is None:
            return f"rawgrad.{self.dtype.name}"
        return self.cast(to_dtype(dtype))

    # ------------------------------------------------------------------ torch habits: constructors
    def new_full(self: Tensor, size: Any, fill_value: Any, dtype: DTypeLike | None = None,
                 device: str | None = None, requires_grad: bool = False) -> Tensor:
        """A tensor of size filled with fill_value, self's dtype and device unless given."""
        if isinstance(size, tuple) and len(size) == 1 and isinstance(size[0], (tuple, list)):
            size = size[0]  # new_zeros((2, 3)) as well as new_zeros(2, 3)
        shape = tuple(size) if isinstance(size, (tuple, list)) else (size,)
        return type(self).full(shape, fill_value, dtype or self.dtype, device or self.device,
                               requires_grad or None)

    def new_zeros(self: Tensor, *size: Any, dtype: DTypeLike | None = None, device: str | None = None,
                  requires_grad: bool = False) -> Tensor:
        return self.new_full(size, 0, dtype, device, requires_grad)

    def new_ones(self: Tensor, *size: Any, dtype: DTypeLike | None = None, device: str | None = None,
                 requires_grad: bool = False) -> Tensor:
        return self.new_full(size, 1, dtype, device, requires_grad)

    def new_empty(self: Tensor, *size: Any, dtype: DTypeLike | None = None, device: str | None = None,
                  requires_grad: bool = False) -> Tensor:
        return self.new_full(size, 0, dtype, device, requires_grad)

    def new_tensor(self: Tensor, data: Any, dtype: DTypeLike | None = None, device: str | None = None,
                   requires_grad: bool = False) -> Tensor:
        """A new tensor of data, self's dtype and device unless given (torch's default)."""
        if isinstance(data, type(self)):
            data = data.numpy()
        return type(self)(data, dtype=dtype or self.dtype, device=device or self.device,
                          requires_grad=requires_grad or None)

    # ------------------------------------------------------------------ torch habits: in-place forms
    def _inplace(self: Tensor, value: Tensor) -> Tensor:
        """Write value into self (assign, cast to self's dtype) and return self, as torch's `op_`."""
        self.assign(value.cast(self.dtype) if value.dtype != self.dtype else value)
        return self

    def add_(self: Tensor, other: Any, alpha: Any = 1) -> Tensor:
        return self._inplace(self.add(other, alpha))

    def sub_(self: Tensor, other: Any, alpha: Any = 1) -> Tensor:
        return self._inplace(self.sub(other, alpha))

    def mul_(self: Tensor, other: Any) -> Tensor:
        return self._inplace(self.mul(other))

    def div_(self: Tensor, other: Any, rounding_mode: str | None = None) -> Tensor:
        return self._inplace(self.div(other, rounding_mode))

    def pow_(self: Tensor, exponent: Any) -> Tensor:
        return self._inplace(self.pow(exponent))

    def zero_(self: Tensor) -> Tensor:
        return self._inplace(self.zeros_like())

    def fill_(self: Tensor, value: Any) -> Tensor:
        return self._inplace(self.full_like(value.item() if hasattr(value, "item") else value))

    def copy_(self: Tensor, src: Any) -> Tensor:
        return self._inplace(self._as_tensor(src).to(self.device))

    def clamp_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 (torch's names)
        return self._inplace(self.clip(min, max))

    def clip_(self: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 (torch's names)
        return self._inplace(self.clip(min, max))

    def masked_fill_(self: Tensor, mask: Tensor, value: Any) -> Tensor:
        return self._inplace(self.masked_fill(mask, value))

    def abs_(self: Tensor) -> Tensor:
        return self._inplace(self.abs())

    def neg_(self: Tensor) -> Tensor:
        return self._inplace(self.neg())

    def exp_(self: Tensor) -> Tensor:
        return self._inplace(self.exp())

    def sqrt_(self: Tensor) -> Tensor:
        return self._inplace(self.sqrt())

    def relu_(self: Tensor) -> Tensor:
        return self._inplace(self.relu())

    def sigmoid_(self: Tensor) -> Tensor:
        return self._inplace(self.sigmoid())

    def tanh_(self: Tensor) -> Tensor:
        return self._inplace(self.tanh())

    def uniform_(self: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
        return self._inplace(type(self).uniform(*self.shape, low=a, high=b, dtype=self.dtype,
                                                device=self.device))

    def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
        return self._inplace(type(self).normal(*self.shape, mean=mean, std=std, dtype=self.dtype,
                                               device=self.device))

    # ------------------------------------------------------------------ torch habits: more aliases
    def count_nonzero(self: Tensor, dim: Any = None) -> Tensor:
        return (self != 0).sum(dim)

    def nansum(self: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        return (self.isnan().where(0, self) if self.dtype.is_float else self).sum(dim, keepdim)

    def nan_to_num(self: Tensor, nan: float = 0.0, posinf: float | None = None,
                   neginf: float | None = None) -> Tensor:
        """NaN -> nan, +inf -> posinf (default the dtype's largest), -inf -> neginf (its lowest)."""
        if not self.dtype.is_float:
            return self
        np_name = self.dtype.np_name
        big = 3.3895313892515355e38 if np_name is None else float(np.finfo(np.dtype(np_name)).max)  # bf16
        hi = big if posinf is None else posinf
        lo = -big if neginf is None else neginf
        return self.isnan().where(nan, (self == math.inf).where(hi, (self == -math.inf).where(lo, self)))

    def movedim(self: Tensor, source: int, destination: int) -> Tensor:
        s, d = self._axis(source), self._axis(destination)
        order = [i for i in range(self.ndim) if i != s]
        order.insert(d, s)
        return self.permute(order)

    def moveaxis(self: Tensor, source: int, destination: int) -> Tensor:
        return self.movedim(source, destination)

    def swapaxes(self: Tensor, axis0: int, axis1: int) -> Tensor:
        return self.transpose(axis0, axis1)

    def swapdims(self: Tensor, dim0: int, dim1: int) -> Tensor:
        return self.transpose(dim0, dim1)

    def split_with_sizes(self: Tensor, split_sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        return self.split(list(split_sizes), dim)

    def tile(self: Tensor, dims: Sequence[int]) -> Tensor:
        """repeat with dims padded by leading 1s to self.ndim (torch's tile)."""
        reps = (1,) * (self.ndim - len(dims)) + tuple(dims)
        return self.repeat(*reps)

    def diff(self: Tensor, n: int = 1, dim: int = -1) -> Tensor:
        x, ax = self, self._axis(dim)
        for _ in range(n):
            k = x.shape[ax]
            x = x.narrow(ax, 1, k - 1) - x.narrow(ax, 0, k - 1)
        return x

    def trace(self: Tensor) -> Tensor:
        return self.diagonal().sum()

    def cross(self: Tensor, other: Tensor, dim: int = -1) -> Tensor:
        """The cross product along a dim of size 3."""
        ax = self._axis(dim)
        a = [self.narrow(ax, i, 1) for i in range(3)]
        b = [other.narrow(ax, i, 1) for i in range(3)]
        return type(self).cat(a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2],
                              a[0] * b[1] - a[1] * b[0], dim=ax)

    def addmm(self: Tensor, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
        return self * beta + mat1.mm(mat2) * alpha

    def baddbmm(self: Tensor, batch1: Tensor, batch2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
        return self * beta + batch1.bmm(batch2) * alpha

    def addcmul(self: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Any = 1) -> Tensor:
        return self + tensor1 * tensor2 * value

    def addcdiv(self: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Any = 1) -> Tensor:
        return self + tensor1 / tensor2 * value

    def float_power(self: Tensor, exponent: Any) -> Tensor:
        return self.cast(dtypes.float64).pow(exponent)

    def log1p(self: Tensor) -> Tensor:
        return self._float_fn(_log1p)

    def expm1(self: Tensor) -> Tensor:
        """exp(x) - 1, accurate near 0 (the product form that cancels exp's rounding)."""
        def fn(x: Tensor) -> Tensor:
            u = x.exp()
            um1 = u - 1
            ok = (um1 != 0) & (u.isinf().logical_not())
            return ok.where(um1 * x / ok.where(u.log(), 1), (u == 1).where(x, um1))
        return self._float_fn(fn)

    def frac(self: Tensor) -> Tensor:
        return self - self.trunc()

    def logit(self: Tensor, eps: float | None = None) -> Tensor:
        x = self if eps is None else self.clip(eps, 1 - eps)
        return x._float_fn(lambda v: (v / (1 - v)).log())

    def xlogy(self: Tensor, other: Any) -> Tensor:
        """x * log(y), 0 where x == 0 (unless y is NaN)."""
        y = self._as_tensor(other)
        def fn(x: Tensor) -> Tensor:
            yy = y.cast(x.dtype)
            return ((x == 0) & yy.isnan().logical_not()).where(0, x * yy.log())
        return self._float_fn(fn)

    # ------------------------------------------------------------------ torch habits: splitting, counting
    def tensor_split(self: Tensor, indices_or_sections: int | Sequence[int] | Tensor,
                     dim: int = 0) -> tuple[Tensor, ...]:
        """torch's tensor_split: an int n gives n parts, the first size % n one longer; a list of indices
        cuts before each (indices clamp to the dim, so parts may be empty)."""
        ax = self._axis(dim)
        n = self.shape[ax]
        ios = indices_or_sections
        if isinstance(ios, type(self)):
            ios = int(ios.item()) if ios.ndim == 0 else [int(v) for v in ios.numpy().reshape(-1)]
        if isinstance(ios, int):
            if ios <= 0:
                raise ValueError(f"tensor_split needs a positive number of sections, got {ios}")
            q, r = divmod(n, ios)
            sizes = [q + 1] * r + [q] * (ios - r)
            cuts = [sum(sizes[:i]) for i in range(ios + 1)]
        else:
            cuts = [0] + [min(max(i + n if i < 0 else i, 0), n) for i in ios] + [n]
        return tuple(self[(slice(None),) * ax + (slice(a, max(a, b)),)] for a, b in zip(cuts, cuts[1:]))

    def rot90(self: Tensor, k: int = 1, dims: Sequence[int] = (0, 1)) -> Tensor:
        """Rotate by 90 degrees k times in the plane of dims, from dims[0] towards dims[1] (torch's)."""
        if len(dims) != 2:
            raise ValueError(f"rot90 needs two dims, got {dims}")
        d0, d1 = self._axis(dims[0]), self._axis(dims[1])
        if d0 == d1:
            raise ValueError(f"rot90 needs two different dims, got {dims}")
        k %= 4
        if k == 1:
            return self.flip(d1).transpose(d0, d1)
        if k == 2:
            return self.flip(d0, d1)
        if k == 3:
            return self.flip(d0).transpose(d0, d1)
        return self

    def unique(self: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002 (torch's name)
               return_counts: bool = False, dim: int | None = None) -> Any:
        """The distinct values (or slices along dim), always sorted; with the int64 inverse indices and
        counts when asked. Realizes: the result's shape depends on the data, so it is computed in numpy
        and is not differentiable."""
        a = self.numpy()
        axis = None if dim is None else self._axis(dim)
        vals, inv, cnt = np.unique(a, return_inverse=True, return_counts=True, axis=axis)
        out = type(self)(vals, dtype=self.dtype, device=self.device)
        if not (return_inverse or return_counts):
            return out
        res = [out]
        if return_inverse:
            inv_shape = a.shape if axis is None else (a.shape[axis],)
            res.append(type(self)(inv.reshape(inv_shape).astype(np.int64), device=self.device))
        if return_counts:
            res.append(type(self)(cnt.astype(np.int64), device=self.device))
        return tuple(res)

    def bincount(self: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
        """Counts of each value of a 1-d non-negative int tensor (weights summed instead when given).
        Realizes the maximum for the output length, max(self) + 1 or minlength."""
        if self.ndim != 1 or not self.dtype.is_int:
            raise ValueError(f"bincount needs a 1-d int tensor, got shape {self.shape} {self.dtype}")
        lo, hi = (int(self.min().item()), int(self.max().item())) if self.shape[0] else (0, -1)
        if lo < 0:
            raise ValueError("bincount needs non-negative values")
        n = max(hi + 1, minlength)
        hit = self.unsqueeze(-1) == type(self).arange(n, device=self.device).cast(self.dtype)
        if weights is None:
            return hit.cast(dtypes.int64).sum(0)
        w = weights if weights.dtype.is_float else weights.cast(dtypes.float64)
        return hit.where(w.unsqueeze(-1), 0).sum(0).cast(w.dtype)

    def histc(self: Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> Tensor:  # noqa: A002
        """Histogram of bins equal-width bins over [min, max] (torch's histc): min == max == 0 takes the
        data's range (realizing it), elements outside are left out, the max edge falls in the last bin."""
        lo, hi = float(min), float(max)
        if lo == hi == 0 and self.numel() > 0:
            lo, hi = float(self.min().item()), float(self.max().item())
        if lo == hi:  # torch widens an empty range by 1 each side
            lo, hi = lo - 1, hi + 1
        if lo > hi:
            raise ValueError(f"histc: max {hi} is below min {lo}")
        dt = self.dtype if self.dtype.is_float else dtypes.default_float
        x = self.flatten().cast(dt)
        idx = ((x - lo) * (bins / (hi - lo))).floor().cast(dtypes.int32).clip(0, bins - 1)
        inside = (x >= lo) & (x <= hi)
        hit = (idx.unsqueeze(-1) == type(self).arange(bins, device=self.device)) & inside.unsqueeze(-1)
        return hit.cast(dt).sum(0)
