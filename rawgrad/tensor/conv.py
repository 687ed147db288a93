# mypy: disable-error-code="misc"
# (the methods annotate `self: Tensor`, the class they are mixed into; mypy files that under "misc")
"""Tensor convolution and pooling: conv1d/conv2d (any number of spatial dims, groups, stride, dilation,
padding as an int, a tuple, torch's flat F.pad order, 'same' or 'valid'), max_pool2d (with torch's
indices) and avg_pool2d (ceil_mode, count_include_pad, divisor_override), over n-d helpers.

Windows are cut with movement ops only (`_pool`/`_windows`: expand, pad, reshape, shrink), so a
convolution is one broadcast multiply and a sum, fused into one reduce kernel like a matmul.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from rawgrad.dtype import dtypes, least_upper_float, promote_types
from rawgrad.errors import ArgumentError, ShapeError
from rawgrad.tensor.common import _prod, _to_tuple

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor


class ConvOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()

    def _pool(self: Tensor, kernel: tuple[int, ...], stride: tuple[int, ...],
              dilation: tuple[int, ...]) -> Tensor:
        """Sliding windows over the last len(kernel) dims: (..., *out, *kernel), movement ops only."""
        nk = len(kernel)
        lead = self.ndim - nk
        x = self
        for j, (k, s, d) in enumerate(zip(kernel, stride, dilation)):
            x = x._windows(lead + 2 * j, k, s, d)  # each done axis leaves (out, k) behind it
        # now (..., o1, k1, o2, k2, ...): move the kernel dims to the end
        order = list(range(lead)) + [lead + 2 * j for j in range(nk)] + [lead + 2 * j + 1 for j in range(nk)]
        return x.permute(order)

    def _windows(self: Tensor, axis: int, k: int, s: int, d: int) -> Tensor:
        """Replace dim `axis` (size i) by (out, k) with result[o, j] = x[o*s + j*d].

        Repeating x k times and re-reading the flat copy with a row length of i + d shifts row j by j*d;
        every read window stays inside the first k*i elements, so the padding is never read."""
        i = self.shape[axis]
        span = d * (k - 1) + 1
        if i < span:
            raise ShapeError(f"window of {k} (dilation {d}) does not fit in size {i} (shape {self.shape})")
        o = (i - span) // s + 1
        pre, post = self.shape[:axis], self.shape[axis + 1:]
        x = self.reshape(pre + (1, i) + post).expand(pre + (k, i) + post).reshape(pre + (k * i,) + post)
        x = x.pad([(0, 0)] * axis + [(0, k * d)] + [(0, 0)] * len(post))
        x = x.reshape(pre + (k, i + d) + post)
        x = x.shrink([None] * (axis + 1) + [(0, (o - 1) * s + 1)] + [None] * len(post))
        x = x._take_every(axis + 1, s, o)
        return x.transpose(axis, axis + 1)

    @staticmethod
    def _resolve_padding(padding: Any, kernel: tuple[int, ...], dilation: tuple[int, ...],
                         stride: tuple[int, ...]) -> list[tuple[int, int]]:
        n = len(kernel)
        if isinstance(padding, str):
            if padding == "valid":
                return [(0, 0)] * n
            if padding == "same":
                if any(s != 1 for s in stride):
                    raise ArgumentError("padding='same' needs stride 1")
                totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
                return [(t // 2, t - t // 2) for t in totals]
            raise ArgumentError(f"padding must be an int, a tuple, 'same' or 'valid', got {padding!r}")
        if isinstance(padding, int):
            return [(padding, padding)] * n
        p = tuple(padding)
        if len(p) == n:
            return [(v, v) for v in p]
        if len(p) == 2 * n:  # torch F.pad order: last dim first
            return [(p[2 * (n - 1 - i)], p[2 * (n - 1 - i) + 1]) for i in range(n)]
        raise ArgumentError(f"padding {p} needs 1, {n} or {2 * n} values")

    def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: Any = 1,
               dilation: Any = 1, padding: Any = 0) -> Tensor:
        """Convolution (cross-correlation, as torch) over the last weight.ndim - 2 dims; tinygrad's
        argument order. x: (N, Cin, *spatial), weight: (Cout, Cin // groups, *kernel)."""
        if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
            raise ArgumentError(f"conv: groups must be a positive int, got {groups!r}")
        nd = weight.ndim - 2
        if nd < 1 or self.ndim != nd + 2:
            raise ShapeError(f"conv: input {self.shape} and weight {weight.shape} need (N, C, *spatial) and "
                             f"(Cout, Cin/groups, *kernel) with the same number of spatial dims")
        bs, cin = self.shape[:2]
        cout, cin_g = weight.shape[:2]
        kernel = tuple(weight.shape[2:])
        if cin != cin_g * groups or cout % groups:
            raise ShapeError(f"conv: input {self.shape} has {cin} channels; weight {weight.shape} with "
                             f"groups={groups} expects {cin_g * groups} (and Cout divisible by groups)")
        st = _to_tuple(stride, nd, "stride", positive=True)
        dl = _to_tuple(dilation, nd, "dilation", positive=True)
        pads = self._resolve_padding(padding, kernel, dl, st)
        dt = promote_types(self.dtype, weight.dtype)
        x = self.cast(dt).pad([(0, 0), (0, 0)] + pads)._pool(kernel, st, dl)  # (N, Cin, *out, *kernel)
        out = x.shape[2:2 + nd]
        x = x.reshape((bs, groups, 1, cin_g) + out + kernel)
        w = weight.cast(dt).reshape((1, groups, cout // groups, cin_g) + (1,) * nd + kernel)
        red = (3,) + tuple(range(4 + nd, 4 + 2 * nd))
        ret = (x * w).sum(red, dtype=dt).reshape((bs, cout) + out)
        return ret if bias is None else ret + bias.reshape((1, cout) + (1,) * nd)

    def conv1d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: Any = 1,
               dilation: Any = 1, padding: Any = 0) -> Tensor:
        return self.conv2d(weight, bias, groups, stride, dilation, padding)

    def _pool_args(self: Tensor, kernel_size: Any, stride: Any, dilation: Any, padding: Any, n: int = 2) \
            -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], list[tuple[int, int]]]:
        k = _to_tuple(kernel_size, n, "kernel_size")
        st = k if stride is None else _to_tuple(stride, n, "stride")
        dl = _to_tuple(dilation, n, "dilation")
        pads = self._resolve_padding(padding, k, dl, st)
        if self.ndim < n:
            raise ShapeError(f"pooling over {n} dims needs at least {n} dims, got shape {self.shape}")
        return k, st, dl, pads

    def _max_pool(self: Tensor, n: int, kernel_size: Any, stride: Any, dilation: Any, padding: Any,
                  ceil_mode: bool, return_indices: bool) -> Tensor | tuple[Tensor, Tensor]:
        """Max over windows of the last n dims. The indices (int64) are torch's: the flat position inside
        each (unpadded) spatial plane of the first maximum in window order."""
        k, st, dl, pads = self._pool_args(kernel_size, stride, dilation, padding, n)
        spatial = tuple(self.shape[-n:])
        if ceil_mode:
            pads = [(b, a + _ceil_extra(i, k_, s, d, b, a))
                    for (b, a), i, k_, s, d in zip(pads, spatial, k, st, dl)]
        low: Any = -math.inf if self.dtype.is_float else False if self.dtype.is_bool \
            else int(np.iinfo(self.dtype.np).min)
        axes = tuple(range(self.ndim, self.ndim + n))
        win = self.pad([(0, 0)] * (self.ndim - n) + pads, value=low)._pool(k, st, dl)
        out = win._max(axes)
        if not return_indices:
            return out
        plane = int(_prod(spatial))
        # positions in window order increase with the flat input position, so the first maximum is the
        # smallest position among the maxima (padding reads as `plane`, never picked while a real one is)
        pos = type(self).arange(plane, dtype=dtypes.int32, device=self.device).reshape(spatial)
        pos = pos.pad(pads, value=plane)._pool(k, st, dl)
        hit = win == out.reshape(out.shape + (1,) * n)
        if self.dtype.is_float:
            hit = hit | win.isnan()
        return out, hit.where(pos, plane)._min(axes).cast(dtypes.int64)

    def max_pool2d(self: Tensor, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                   padding: Any = 0, ceil_mode: bool = False, return_indices: bool = False) -> Any:
        """Max pooling over the last 2 dims (tinygrad's argument order). With return_indices, also the
        int64 indices max_unpool2d takes. On ties the gradient is split between the maxima of a window
        (torch gives it to the first)."""
        return self._max_pool(2, kernel_size, stride, dilation, padding, ceil_mode, return_indices)

    def _avg_pool(self: Tensor, n: int, kernel_size: Any, stride: Any, dilation: Any, padding: Any,
                  ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Tensor:
        """Mean over windows of the last n dims, torch's divisors: the window's positions inside the
        padded input (count_include_pad) or inside the input; ceil_mode's extra positions never count."""
        k, st, dl, pads = self._pool_args(kernel_size, stride, dilation, padding, n)
        spatial = tuple(self.shape[-n:])
        extra = [_ceil_extra(i, k_, s, d, b, a) if ceil_mode else 0
                 for (b, a), i, k_, s, d in zip(pads, spatial, k, st, dl)]
        full = [(b, a + e) for (b, a), e in zip(pads, extra)]
        ft = least_upper_float(self.dtype)
        axes = tuple(range(self.ndim, self.ndim + n))
        total = self.pad([(0, 0)] * (self.ndim - n) + full)._pool(k, st, dl).sum(axes, dtype=ft)
        if divisor_override is not None:
            if not isinstance(divisor_override, (int, np.integer)) or divisor_override == 0:
                raise ArgumentError(f"divisor_override must be a non-zero int, got {divisor_override!r}")
            return total / int(divisor_override)
        if count_include_pad and not any(extra):
            return total / _prod(k)
        ones = self._const(1.0, ft, spatial)
        if count_include_pad:
            ones = ones.pad(pads, value=1.0).pad([(0, e) for e in extra])
        else:
            ones = ones.pad(full)
        return total / ones._pool(k, st, dl).sum(tuple(range(n, 2 * n)))

    def avg_pool2d(self: Tensor, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                   padding: Any = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                   divisor_override: int | None = None) -> Tensor:
        """Average pooling over the last 2 dims (tinygrad's argument order, torch's options)."""
        return self._avg_pool(2, kernel_size, stride, dilation, padding, ceil_mode, count_include_pad,
                              divisor_override)


def _ceil_extra(i: int, k: int, s: int, d: int, before: int, after: int) -> int:
    """Extra right padding ceil_mode needs (torch: the last window must start inside input or left pad)."""
    span = d * (k - 1) + 1
    padded = i + before + after
    o = -(-(padded - span) // s) + 1
    if (o - 1) * s >= i + before:
        o -= 1
    return max(0, (o - 1) * s + span - padded)
