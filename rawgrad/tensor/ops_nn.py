"""Tensor methods for neural-network layers beyond tensor.py's core (scatter, interpolation, transposed
convolution, unpooling, 1-d/3-d pooling, losses), composed from core ops, so autograd differentiates them
like any other composition. tensor.py mixes this class into `Tensor`; new tensors are built through the
instance (`type(x)(...)`, `type(x).arange(...)`), so this module never imports tensor.py.

Where torch leaves a result undefined or differs by backend, the choice made here:
- `scatter` (no reduce) with repeated indices along `dim`: the last one along `dim` lands (what torch's
  CPU loop does). `max_unpool*` inherits it; its gradient then reaches only that element.
- `scatter_reduce(amax/amin)`: the gradient is shared evenly between all elements equal to the result,
  self included when include_self (torch's rule). Integer `mean` rounds down, as torch.
- Losses' `mean` without class weights divides by the number of non-ignored targets, at least 1 (torch
  gives NaN when every target is ignored).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from rawgrad.dtype import least_upper_float
from rawgrad.tensor.common import _to_tuple
from rawgrad.tensor.indexing import _defer_index_check, _masked_sum

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor

_REDUCES = ("sum", "prod", "mean", "amax", "amin")
_INTERP_DIMS = {"linear": (1,), "bilinear": (2,), "bicubic": (2,), "trilinear": (3,), "nearest": (1, 2, 3),
                "nearest-exact": (1, 2, 3), "area": (1, 2, 3)}


def _t(x: NNOps) -> Tensor:
    """The mixin's self as the Tensor it always is."""
    return cast("Tensor", x)


def reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    """A loss's `reduction` argument as torch takes it (the Tensor methods and nn.functional share it)."""
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _extreme(dt: Any, largest: bool) -> Any:
    """The identity of max (largest=False) / min (largest=True) for dtype dt."""
    if dt.is_float:
        return math.inf if largest else -math.inf
    if dt.is_bool:
        return largest
    info = np.iinfo(dt.np)
    return int(info.max) if largest else int(info.min)


def _source_positions(n_in: int, n_out: int, scale: float | None, mode: str, align_corners: bool,
                      ft: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per output position along one axis: the integer taps and their weights (taps, n_out) (torch's index
    arithmetic, in the float type torch computes it in: float32, or float64 for float64 inputs)."""
    dst = np.arange(n_out, dtype=ft)
    if mode in ("nearest", "nearest-exact"):
        s = ft(1.0 / scale) if scale else ft(n_in) / ft(n_out)
        off = ft(0.5) if mode == "nearest-exact" else ft(0.0)
        if n_out == n_in:
            idx = np.arange(n_out)
        elif n_out == 2 * n_in and mode == "nearest":
            idx = np.arange(n_out) >> 1
        else:
            idx = np.minimum(np.floor((dst + off) * s).astype(np.int64), n_in - 1)
        return idx[None], np.ones((1, n_out), ft)
    if align_corners:
        s = ft(n_in - 1) / ft(n_out - 1) if n_out > 1 else ft(0.0)
        src = s * dst
    else:
        s = ft(1.0 / scale) if scale else ft(n_in) / ft(n_out)
        src = s * (dst + ft(0.5)) - ft(0.5)
    if mode == "bicubic":
        i0 = np.floor(src)
        t = (src - i0).astype(ft)
        a = ft(-0.75)

        def near(x: np.ndarray) -> np.ndarray:  # |x| <= 1
            return ((a + 2) * x - (a + 3)) * x * x + 1

        def far(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
            return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        w = np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)]).astype(ft)
        taps = np.clip(i0.astype(np.int64)[None] + np.arange(-1, 3)[:, None], 0, n_in - 1)
        return taps, w
    src = np.maximum(src, ft(0.0))
    i0 = src.astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam = np.clip(src - i0, 0, 1).astype(ft)
    return np.stack([i0, i1]), np.stack([(1 - lam).astype(ft), lam])


class NNOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()

    # ------------------------------------------------------------------ scatter
    def _scatter(self, dim: int, index: Tensor, src: Any, reduce: str | None,
                 include_self: bool, what: str) -> Tensor:
        """One-hot formulation: for every output row along `dim` (n of them) and every index position along
        `dim` (m of them), hit[..., k, j] = index[..., j] == k; then a masked reduce over j."""
        x = _t(self)
        d = x._axis(dim)
        if not isinstance(index, type(x)) or not index.dtype.is_int:
            raise TypeError(f"{what}: index must be an integer Tensor")
        if index.ndim != x.ndim:
            raise ValueError(f"{what}: index has {index.ndim} dims, self {x.shape} has {x.ndim}")
        if isinstance(src, type(x)):
            if src.ndim != x.ndim:
                raise ValueError(f"{what}: src has {src.ndim} dims, self {x.shape} has {x.ndim}")
            for i, (a, b, c) in enumerate(zip(index.shape, x.shape, src.shape)):
                if a > c or (i != d and a > b):
                    raise ValueError(f"{what}: index shape {index.shape} exceeds self {x.shape} or src "
                                     f"{src.shape} at dim {i}")
            sv = src.cast(x.dtype).shrink([(0, s) for s in index.shape])
        else:
            for i, (a, b) in enumerate(zip(index.shape, x.shape)):
                if i != d and a > b:
                    raise ValueError(f"{what}: index shape {index.shape} exceeds self {x.shape} at dim {i}")
            sv = x._const(src, shape=tuple(index.shape))
        n, m = x.shape[d], index.shape[d]
        if index.numel() == 0:
            return x
        _defer_index_check(index, n, what)
        it = index.transpose(d, -1)
        it = (it < 0).where(it + n, it)
        xt = x.transpose(d, -1)  # (*rest, n)
        hit = it.unsqueeze(-2) == type(x).arange(n, device=x.device).reshape(n, 1)  # (*rest_i, n, m)
        grow = [(0, b - a) for a, b in zip(it.shape[:-1], xt.shape[:-1])] + [(0, 0), (0, 0)]
        hit = hit.pad(grow)  # rows of self that no index reaches get no hit
        vals = sv.transpose(d, -1).unsqueeze(-2).pad(grow)._broadcast_to(hit.shape)
        if reduce is None:  # the last hit along dim lands
            pos = type(x).arange(m, device=x.device)
            last = hit.where(pos, -1)._max(-1, keepdim=True)
            out = _masked_sum(hit & (pos == last), vals, (hit.ndim - 1,))
            return hit.any(-1).where(out, xt).transpose(d, -1)
        if include_self:
            hit = hit.cat(hit._const(True, shape=hit.shape[:-1] + (1,)), dim=-1)
            vals = vals.cat(xt.unsqueeze(-1), dim=-1)
        ax = hit.ndim - 1
        dt = x.dtype
        if reduce in ("sum", "mean"):
            out = _masked_sum(hit, vals, (ax,))
            if reduce == "mean":
                count = hit.sum(ax).maximum(1)
                out = out / count.cast(dt) if dt.is_float else (out // count.cast(dt)).cast(dt)
        elif reduce == "prod":
            out = hit.where(vals, True if dt.is_bool else 1).prod(ax, dtype=dt)
        elif reduce == "amax":
            out = hit.where(vals, _extreme(dt, False))._max(ax)
        else:
            out = hit.where(vals, _extreme(dt, True))._min(ax)
        return hit.any(ax).where(out.cast(dt), xt).transpose(d, -1)

    def scatter(self, dim: int, index: Tensor, src: Any = None, reduce: str | None = None, *,
                value: Any = None) -> Tensor:
        """torch.Tensor.scatter: out[..., index[i][j], ...] = src[i][j] along dim (src a Tensor or a scalar;
        torch's `value=` keyword also names the scalar). reduce='add'/'multiply' combine with self (torch's
        older API). Repeated indices without reduce: the last one along dim wins."""
        x = _t(self)
        if (src is None) == (value is None):
            raise ValueError("scatter: give exactly one of src or value")
        if reduce not in (None, "add", "multiply"):
            raise ValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
        r = None if reduce is None else "sum" if reduce == "add" else "prod"
        return x._scatter(dim, index, src if value is None else value, r, True, "scatter")

    def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                       include_self: bool = True) -> Tensor:
        """torch.Tensor.scatter_reduce: every src element is combined into out[..., index, ...] with
        reduce in sum/prod/mean/amax/amin; include_self counts self's value as one more element."""
        x = _t(self)
        if reduce not in _REDUCES:
            raise ValueError(f"scatter_reduce: reduce must be one of {_REDUCES}, got {reduce!r}")
        return x._scatter(dim, index, src, reduce, include_self, "scatter_reduce")

    # ------------------------------------------------------------------ interpolation
    def interpolate(self, size: int | Sequence[int] | None = None,
                    scale_factor: float | Sequence[float] | None = None, mode: str = "nearest",
                    align_corners: bool | None = None, recompute_scale_factor: bool | None = None) -> Tensor:
        """torch.nn.functional.interpolate over the spatial dims of (N, C, *spatial): modes nearest,
        nearest-exact, linear (3-d), bilinear / bicubic (4-d), trilinear (5-d), area. Separable: each
        spatial axis is resampled by gathering its 1, 2 or 4 source taps (static, computed on the host)."""
        x = _t(self)
        if mode not in _INTERP_DIMS:
            raise ValueError(f"interpolate: unknown mode {mode!r} (one of {', '.join(_INTERP_DIMS)})")
        nd = x.ndim - 2
        if nd not in _INTERP_DIMS[mode]:
            raise ValueError(f"interpolate: mode {mode!r} needs a {[d + 2 for d in _INTERP_DIMS[mode]]}-d "
                             f"input (N, C, *spatial), got shape {x.shape}")
        linear = mode in ("linear", "bilinear", "bicubic", "trilinear")
        if align_corners is not None and not linear:
            raise ValueError("interpolate: align_corners is only for the linear, bilinear, bicubic and "
                             "trilinear modes")
        if (size is None) == (scale_factor is None):
            raise ValueError("interpolate: give exactly one of size or scale_factor")
        ins = [int(s) for s in x.shape[2:]]
        scales: list[float | None]
        if size is not None:
            outs = [int(s) for s in ((size,) * nd if isinstance(size, int) else tuple(size))]
            scales = [None] * nd
        else:
            assert scale_factor is not None
            sf = (float(scale_factor),) * nd if isinstance(scale_factor, (int, float)) \
                else tuple(float(s) for s in scale_factor)
            if len(sf) != nd or any(s <= 0 for s in sf):
                raise ValueError(f"interpolate: scale_factor needs {nd} positive values, got {scale_factor}")
            outs = [int(math.floor(i * s)) for i, s in zip(ins, sf)]
            scales = [None] * nd if recompute_scale_factor else list(sf)
        if len(outs) != nd or any(o < 1 for o in outs):
            raise ValueError(f"interpolate: output size {tuple(outs)} needs {nd} positive values")
        ft = np.float64 if x.dtype.itemsize == 8 and x.dtype.is_float else np.float32
        x = x if mode.startswith("nearest") else x.cast(least_upper_float(x.dtype))
        for j, (i, o, s) in enumerate(zip(ins, outs, scales)):
            ax = 2 + j
            if mode == "area":
                lo = (np.arange(o) * i) // o
                hi = -((-(np.arange(o) + 1) * i) // o)
                cols = np.arange(i)
                mask = (cols[None] >= lo[:, None]) & (cols[None] < hi[:, None])  # (o, i)
                xm = x.transpose(ax, -1).unsqueeze(-2)  # (..., 1, i)
                summed = type(x)(mask, device=x.device).where(xm, 0).sum(-1)
                width = type(x)((hi - lo).astype(ft), device=x.device).cast(x.dtype)
                x = (summed / width).transpose(ax, -1)
                continue
            taps, w = _source_positions(i, o, s, mode, bool(align_corners), ft)
            if mode.startswith("nearest") and np.array_equal(taps[0], np.arange(i)):
                continue
            front = x.transpose(0, ax)
            acc: Tensor | None = None
            for t, wt in zip(taps, w):
                g = front._take_rows(type(x)(t.astype(np.int32), device=x.device))
                if not mode.startswith("nearest"):
                    g = g * type(x)(wt, device=x.device).cast(x.dtype).reshape((o,) + (1,) * (x.ndim - 1))
                acc = g if acc is None else acc + g
            assert acc is not None
            x = acc.transpose(0, ax)
        return x

    # ------------------------------------------------------------------ pooling and unpooling
    def max_pool1d(self, kernel_size: Any = 2, stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: bool = False, return_indices: bool = False) -> Any:
        """Max pooling over the last dim (see max_pool2d)."""
        x = _t(self)
        return x._max_pool(1, kernel_size, stride, dilation, padding, ceil_mode, return_indices)

    def max_pool3d(self, kernel_size: Any = 2, stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: bool = False, return_indices: bool = False) -> Any:
        """Max pooling over the last 3 dims (see max_pool2d)."""
        x = _t(self)
        return x._max_pool(3, kernel_size, stride, dilation, padding, ceil_mode, return_indices)

    def avg_pool1d(self, kernel_size: Any = 2, stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: bool = False, count_include_pad: bool = True,
                   divisor_override: int | None = None) -> Tensor:
        """Average pooling over the last dim (see avg_pool2d)."""
        x = _t(self)
        return x._avg_pool(1, kernel_size, stride, dilation, padding, ceil_mode, count_include_pad,
                              divisor_override)

    def avg_pool3d(self, kernel_size: Any = 2, stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: bool = False, count_include_pad: bool = True,
                   divisor_override: int | None = None) -> Tensor:
        """Average pooling over the last 3 dims (see avg_pool2d)."""
        x = _t(self)
        return x._avg_pool(3, kernel_size, stride, dilation, padding, ceil_mode, count_include_pad,
                              divisor_override)

    def _adaptive_pool(self, output_size: Any, reduce: str) -> Tensor:
        """Pool the last two dims into output_size windows, torch's: window i along a dim of size n
        pooled to m spans [floor(i*n/m), ceil((i+1)*n/m)). Windows are rectangles, so each dim is
        pooled in turn."""
        x = _t(self)
        if x.ndim < 2:
            raise ValueError(f"adaptive pooling needs at least 2 dims, got shape {x.shape}")
        sizes = (output_size, output_size) if output_size is None or isinstance(output_size, int) \
            else tuple(output_size)
        if len(sizes) != 2:
            raise ValueError(f"adaptive 2-d pooling needs an int or a pair, got {output_size}")
        for ax, m in zip((x.ndim - 2, x.ndim - 1), sizes):
            n = x.shape[ax]
            m = n if m is None else m
            if m <= 0:
                raise ValueError(f"adaptive pooling output size must be positive, got {output_size}")
            if m == n:
                continue
            parts = []
            for i in range(m):
                lo, hi = (i * n) // m, -((-(i + 1) * n) // m)
                w = x.narrow(ax, lo, hi - lo)
                parts.append(w.mean(ax, keepdim=True) if reduce == "avg" else w.amax(ax, keepdim=True))
            x = type(x).cat(*parts, dim=ax)
        return x

    def adaptive_avg_pool2d(self, output_size: Any) -> Tensor:
        """Average pooling of the last two dims to output_size (an int, a pair; None keeps that dim)."""
        return _t(self)._adaptive_pool(output_size, "avg")

    def adaptive_max_pool2d(self, output_size: Any) -> Tensor:
        """Max pooling of the last two dims to output_size (an int, a pair; None keeps that dim)."""
        return _t(self)._adaptive_pool(output_size, "max")

    def _max_unpool(self, n: int, indices: Tensor, kernel_size: Any, stride: Any, padding: Any,
                    output_size: Sequence[int] | None) -> Tensor:
        x = _t(self)
        if x.ndim < n + 1 or tuple(indices.shape) != tuple(x.shape):
            raise ValueError(f"max_unpool: input {x.shape} needs (N, C, *spatial) and indices of the same "
                             f"shape, got {indices.shape}")
        k = _to_tuple(kernel_size, n, "kernel_size", positive=True)
        st = k if stride is None else _to_tuple(stride, n, "stride", positive=True)
        pd = _to_tuple(padding, n, "padding")
        ins = x.shape[-n:]
        if output_size is None:
            outs = tuple((i - 1) * s - 2 * p + kk for i, s, p, kk in zip(ins, st, pd, k))
        else:
            outs = tuple(int(v) for v in tuple(output_size)[-n:])
            if len(outs) != n:
                raise ValueError(f"max_unpool: output_size {output_size} needs {n} spatial sizes")
        lead = tuple(x.shape[:-n])
        plane = math.prod(outs)
        flat = x.reshape(lead + (-1,))
        target = x._const(0, shape=lead + (plane,))
        return target.scatter(-1, indices.reshape(lead + (-1,)), flat).reshape(lead + outs)

    def max_unpool1d(self, indices: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                     output_size: Sequence[int] | None = None) -> Tensor:
        """Inverse of max_pool1d(return_indices=True): values at their indices, zeros elsewhere."""
        x = _t(self)
        return x._max_unpool(1, indices, kernel_size, stride, padding, output_size)

    def max_unpool2d(self, indices: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                     output_size: Sequence[int] | None = None) -> Tensor:
        """torch.nn.functional.max_unpool2d: each value written at its flat index in its channel plane
        (of output_size, default (in - 1) * stride - 2 * padding + kernel_size), zeros elsewhere."""
        x = _t(self)
        return x._max_unpool(2, indices, kernel_size, stride, padding, output_size)

    def max_unpool3d(self, indices: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0,
                     output_size: Sequence[int] | None = None) -> Tensor:
        """Inverse of max_pool3d(return_indices=True)."""
        x = _t(self)
        return x._max_unpool(3, indices, kernel_size, stride, padding, output_size)

    # ------------------------------------------------------------------ transposed convolution
    def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                         stride: Any = 1, dilation: Any = 1, padding: Any = 0,
                         output_padding: Any = 0) -> Tensor:
        """Transposed convolution over the last weight.ndim - 2 dims (tinygrad's argument order; torch's
        meaning): x (N, Cin, *spatial), weight (Cin, Cout // groups, *kernel). Written as the convolution it
        is the input-gradient of: spread the input by the stride, pad by dilation * (kernel - 1) - padding
        (+ output_padding after), correlate with the flipped, in/out-swapped kernel."""
        x = _t(self)
        nd = weight.ndim - 2
        if nd < 1 or x.ndim != nd + 2:
            raise ValueError(f"conv_transpose: input {x.shape} and weight {weight.shape} need (N, Cin, "
                             "*spatial) and (Cin, Cout/groups, *kernel) with the same number of spatial dims")
        if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
            raise ValueError(f"conv_transpose: groups must be a positive int, got {groups!r}")
        cin, cout_g = weight.shape[:2]
        kernel = tuple(weight.shape[2:])
        if x.shape[1] != cin or cin % groups:
            raise ValueError(f"conv_transpose: input {x.shape} has {x.shape[1]} channels, weight "
                             f"{weight.shape} expects {cin} (divisible by groups={groups})")
        st = _to_tuple(stride, nd, "stride", positive=True)
        dl = _to_tuple(dilation, nd, "dilation", positive=True)
        pd, op = _to_tuple(padding, nd, "padding"), _to_tuple(output_padding, nd, "output_padding")
        for o, s, d in zip(op, st, dl):
            if o < 0 or o >= max(s, d):
                raise ValueError(f"output_padding {op} must be smaller than stride {st} or dilation {dl}")
        y = x
        for j, s in enumerate(st):  # s - 1 zeros between neighbours along each spatial axis
            y = y._spread_every(2 + j, s, y.shape[2 + j])
        edge = [d * (k - 1) - p for k, d, p in zip(kernel, dl, pd)]
        y = y.pad([(0, 0), (0, 0)] + [(e, e + o) for e, o in zip(edge, op)])
        cin_g = cin // groups
        w = weight.reshape((groups, cin_g, cout_g) + kernel).transpose(1, 2)
        w = w.reshape((groups * cout_g, cin_g) + kernel).flip(tuple(range(2, 2 + nd)))
        return y.conv2d(w, bias, groups=groups, dilation=dl)

    def conv_transpose1d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                         stride: Any = 1, dilation: Any = 1, padding: Any = 0,
                         output_padding: Any = 0) -> Tensor:
        x = _t(self)
        if weight.ndim != 3:
            raise ValueError(f"conv_transpose1d needs a 3-d weight (Cin, Cout/groups, k), got {weight.shape}")
        return x.conv_transpose2d(weight, bias, groups, stride, dilation, padding, output_padding)

    def conv_transpose3d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                         stride: Any = 1, dilation: Any = 1, padding: Any = 0,
                         output_padding: Any = 0) -> Tensor:
        x = _t(self)
        if weight.ndim != 5:
            raise ValueError(f"conv_transpose3d needs a 5-d weight (Cin, Cout/groups, kd, kh, kw), got "
                             f"{weight.shape}")
        return x.conv_transpose2d(weight, bias, groups, stride, dilation, padding, output_padding)

    # ------------------------------------------------------------------ losses
    def nll_loss(self, Y: Tensor, weight: Tensor | None = None, ignore_index: int = -100,  # noqa: N803
                 reduction: str = "mean") -> Tensor:
        """Negative log-likelihood of log-probabilities (N, C, *extra) (or (C,)) at class indices Y
        (N, *extra) (or ()); weight: per-class weights (C,), mean divides by the picked weights' sum."""
        x = _t(self)
        if Y.dtype.is_float:
            raise TypeError(f"nll_loss needs integer class indices, got {Y.dtype}")
        lp = x.unsqueeze(0) if x.ndim == 1 else x
        lp = lp.permute([0, *range(2, lp.ndim), 1]) if lp.ndim > 2 else lp  # classes last
        if tuple(lp.shape[:-1]) != (tuple(Y.shape) if x.ndim > 1 else (1,) + tuple(Y.shape)):
            raise ValueError(f"nll_loss: input {x.shape} and target {Y.shape} do not match")
        hit = _class_hit(Y, lp.shape[-1], ignore_index)
        if x.ndim == 1:
            hit = hit.reshape(lp.shape)
        loss = -hit.where(lp, 0).sum(-1)
        if weight is not None:
            loss = loss * _picked_weight(hit, weight, lp.dtype)
        if x.ndim == 1:
            loss = loss.reshape(())
        if reduction == "mean":
            return loss.sum() / _mean_divisor(hit, weight, lp.dtype)
        return reduce_loss(loss, reduction)

    def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,  # noqa: N803
                      *, weight: Tensor | None = None, ignore_index: int = -100) -> Tensor:
        """Softmax cross-entropy of logits (N, C, *extra) (or (C,)) against class indices (N, *extra) or
        class probabilities (the logits' shape); torch's label_smoothing, weight and ignore_index."""
        x = _t(self)
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        cdim = 0 if x.ndim == 1 else 1
        n_cls = x.shape[cdim]
        logp = x.log_softmax(cdim)
        wshape = (n_cls,) + (1,) * (x.ndim - cdim - 1)
        if weight is not None and tuple(weight.shape) != (n_cls,):
            raise ValueError(f"cross_entropy: weight must have shape ({n_cls},), got {weight.shape}")
        if Y.dtype.is_float:  # probabilities
            if tuple(Y.shape) != tuple(x.shape):
                raise ValueError(f"cross_entropy: probability target {Y.shape} must match logits {x.shape}")
            t = Y * (1 - label_smoothing) + label_smoothing / n_cls
            if weight is not None:
                t = t * weight.reshape(wshape)
            return reduce_loss(-(logp * t).sum(cdim), reduction)
        loss = logp.nll_loss(Y, weight, ignore_index, "none")
        if label_smoothing:
            wl = logp if weight is None else logp * weight.reshape(wshape)
            smooth = -wl.sum(cdim) / n_cls
            loss = (Y != ignore_index).where(loss * (1 - label_smoothing) + smooth * label_smoothing, 0)
        if reduction == "mean":
            hit = _class_hit(Y, n_cls, ignore_index)
            return loss.sum() / _mean_divisor(hit, weight, logp.dtype)
        return reduce_loss(loss, reduction)

    def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1,  # noqa: N803
                                        label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
        """tinygrad's loss: softmax cross-entropy of logits (..., C) (classes last) against integer labels
        (...); targets equal to ignore_index count for nothing."""
        x = _t(self)
        flat = x.reshape(-1, x.shape[-1])
        loss = flat.cross_entropy(Y.reshape(-1), reduction, label_smoothing, ignore_index=ignore_index)
        return loss.reshape(Y.shape) if reduction == "none" else loss

    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:  # noqa: N803
        """-(Y log p + (1 - Y) log(1 - p)) for probabilities p = self, the logs clamped at -100 (torch)."""
        x = _t(self)
        return reduce_loss(-(Y * x.log().maximum(-100) + (1 - Y) * (1 - x).log().maximum(-100)), reduction)

    def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean",  # noqa: N803
                                   pos_weight: Tensor | None = None) -> Tensor:
        """Binary cross-entropy on sigmoid(self) written with logsigmoid, so large logits stay finite;
        pos_weight scales the positive term (torch's binary_cross_entropy_with_logits)."""
        x = _t(self)
        ls = x.logsigmoid()
        if pos_weight is None:
            return reduce_loss((1 - Y) * x - ls, reduction)
        return reduce_loss((1 - Y) * x - (1 + (pos_weight - 1) * Y) * ls, reduction)


def _class_hit(Y: Tensor, n_cls: int, ignore_index: int) -> Tensor:  # noqa: N803
    """(..., C) bool: Y == class, all false where Y is ignore_index."""
    return (Y.unsqueeze(-1) == type(Y).arange(n_cls, device=Y.device)) & (Y != ignore_index).unsqueeze(-1)


def _picked_weight(hit: Tensor, weight: Tensor, dt: Any) -> Tensor:
    """weight[Y] per target (0 where ignored)."""
    return hit.where(weight.cast(dt), 0).sum(-1)


def _mean_divisor(hit: Tensor, weight: Tensor | None, dt: Any) -> Tensor:
    """What a loss's 'mean' divides by: the picked class weights' sum, or the number of counted targets
    (at least 1: all ignored gives 0, not torch's NaN)."""
    if weight is None:
        return hit.any(-1).sum().maximum(1)
    return _picked_weight(hit, weight, dt).sum()
