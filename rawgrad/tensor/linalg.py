# mypy: disable-error-code="misc"
# (the methods annotate `self: Tensor`, the class they are mixed into; mypy files that under "misc")
"""Tensor linear algebra: dot/matmul (numpy's batching and broadcasting), linear, einsum (explicit or
implicit output, repeated letters, ellipsis) and scaled dot-product attention.

A matrix product is one broadcast multiply and a sum over the contracted axis, which the scheduler fuses
into a single reduce kernel; einsum is the same idea over any number of operands (one product, one sum).
"""
from __future__ import annotations

import math
import string
from typing import TYPE_CHECKING, Any

from rawgrad.dtype import DTypeLike, dtypes, promote_types
from rawgrad.errors import ArgumentError, ShapeError
from rawgrad.tensor.common import _broadcast_shapes

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor


class LinalgOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()

    def dot(self: Tensor, w: Tensor, dtype: DTypeLike | None = None) -> Tensor:
        """Matrix product with numpy/torch batching and broadcasting, as one multiply + sum over the
        contracted axis (the scheduler fuses it into a single reduce kernel)."""
        if not isinstance(w, type(self)):
            w = self._as_tensor(w)
        if self.ndim == 0 or w.ndim == 0:
            raise ShapeError(f"matmul needs at least 1 dim on both sides, got {self.shape} @ {w.shape}")
        x, y = self, w
        if x.dtype != y.dtype:
            dt = promote_types(x.dtype, y.dtype)
            x, y = x.cast(dt), y.cast(dt)
        xm = x.reshape(1, x.shape[0]) if x.ndim == 1 else x
        ym = y.reshape(y.shape[0], 1) if y.ndim == 1 else y
        if xm.shape[-1] != ym.shape[-2]:
            raise ShapeError(f"matmul: inner dimensions differ: {self.shape} @ {w.shape} "
                             f"({xm.shape[-1]} != {ym.shape[-2]})")
        try:
            _broadcast_shapes(xm.shape[:-2], ym.shape[:-2])
        except ValueError:
            raise ShapeError(f"matmul: batch dims of {self.shape} and {w.shape} cannot broadcast") from None
        n, k, m = xm.shape[-2], xm.shape[-1], ym.shape[-1]
        a = xm.reshape(xm.shape[:-2] + (n, 1, k))
        b = ym.transpose(-1, -2).reshape(ym.shape[:-2] + (1, m, k))
        out = (a * b).sum(-1, dtype=dtype or x.dtype)
        if x.ndim == 1:
            out = out.squeeze(-2)
        if y.ndim == 1:
            out = out.squeeze(-1)
        return out

    def matmul(self: Tensor, x: Tensor, reverse: bool = False) -> Tensor:
        return x.dot(self) if reverse else self.dot(x)

    def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """tinygrad's linear: weight is (in, out) (a 1-d weight scales elementwise). torch's
        F.linear(x, w, b) with w of shape (out, in) is `x.linear(w.T, b)`."""
        x = self * weight if weight.ndim == 1 else self.dot(weight)
        return x if bias is None else x + bias

    @classmethod
    def einsum(cls: type[Tensor], formula: str, *operands: Any) -> Tensor:
        """General einsum: explicit or implicit output, repeated letters (diagonals), ellipsis."""
        raw = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) \
            else list(operands)
        ops = [t if isinstance(t, cls) else cls(t) for t in raw]
        f = formula.replace(" ", "")
        lhs, arrow, rhs = f.partition("->")
        ins = lhs.split(",")
        if len(ins) != len(ops):
            raise ArgumentError(f"einsum {formula!r} names {len(ins)} operands, got {len(ops)}")
        spare = [c for c in string.ascii_letters if c not in f]
        n_ell = max([t.ndim - (len(s) - 3) for s, t in zip(ins, ops) if "..." in s], default=0)
        ell = "".join(spare[:n_ell])
        subs: list[str] = []
        for i, (s, t) in enumerate(zip(ins, ops)):
            if "..." in s:
                k = t.ndim - (len(s) - 3)
                if k < 0:
                    raise ShapeError(f"einsum: operand {i} of shape {t.shape} has too few dims for {s!r}")
                s = s.replace("...", ell[n_ell - k:])
            if len(s) != t.ndim or not s.isalpha() and s:
                raise ShapeError(f"einsum: operand {i} has shape {t.shape} but subscripts {ins[i]!r}")
            subs.append(s)
        if arrow:
            out = rhs.replace("...", ell)
        else:
            counts = {c: lhs.count(c) for c in set(lhs) if c.isalpha()}
            out = ell + "".join(sorted(c for c, n in counts.items() if n == 1))
        tensors: list[Tensor] = []
        for i, t in enumerate(ops):
            tensors_i, subs[i] = _einsum_diagonals(t, subs[i])
            tensors.append(tensors_i)
        sizes: dict[str, Any] = {}
        for s, t in zip(subs, tensors):
            for c, n in zip(s, t.shape):
                if sizes.get(c, 1) != 1 and n != 1 and sizes[c] != n:
                    raise ArgumentError(f"einsum: letter {c!r} has sizes {sizes[c]} and {n}")
                if n != 1 or c not in sizes:
                    sizes[c] = n
        for c in out:
            if c not in sizes:
                raise ArgumentError(f"einsum: output letter {c!r} does not appear in the inputs")
        summed = sorted(c for c in sizes if c not in out)
        letters = list(out) + summed
        full = tuple(sizes[c] for c in letters)
        dt = tensors[0].dtype
        for t in tensors[1:]:
            dt = promote_types(dt, t.dtype)
        prod_t: Tensor | None = None
        for s, t in zip(subs, tensors):
            present = [c for c in letters if c in s]
            t = t.permute([s.index(c) for c in present])
            t = t.reshape(tuple(t.shape[present.index(c)] if c in s else 1 for c in letters))
            t = t.cast(dt).expand(full)
            prod_t = t if prod_t is None else prod_t * t
        assert prod_t is not None
        if not summed:
            return prod_t
        return prod_t.sum(tuple(range(len(out), len(letters))), dtype=dt)

    # ------------------------------------------------------------------ attention
    def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor,
                                     attn_mask: Tensor | None = None,
                                     dropout_p: float = 0.0, is_causal: bool = False,
                                     scale: float | None = None, enable_gqa: bool = False) -> Tensor:
        """softmax(q @ k^T * scale + mask) @ v, as torch; a bool mask keeps the True positions. With
        enable_gqa, key and value heads (dim -3) are repeated (each head r times in a row, torch's
        repeat_interleave) up to the query's head count, which must be a multiple of theirs."""
        q = self
        if enable_gqa and q.ndim >= 3 and key.ndim >= 3 and value.ndim >= 3:
            hq = q.shape[-3]

            def heads(t: Tensor, what: str) -> Tensor:
                h = t.shape[-3]
                if h == hq:
                    return t
                if hq % h:
                    raise ShapeError(f"attention: query has {hq} heads, not a multiple of the {h} of {what}")
                s = t.shape
                x = t.reshape(s[:-2] + (1,) + s[-2:]).expand(s[:-2] + (hq // h,) + s[-2:])
                return x.reshape(s[:-3] + (hq,) + s[-2:])
            key, value = heads(key, f"key {key.shape}"), heads(value, f"value {value.shape}")
        if q.shape[-1] != key.shape[-1]:
            raise ShapeError(f"attention: query {q.shape} and key {key.shape} differ in the last dim")
        sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        scores = (q @ key.transpose(-1, -2)) * sc
        if is_causal:
            if attn_mask is not None:
                raise ArgumentError("attention: give attn_mask or is_causal, not both")
            lq, lk = q.shape[-2], key.shape[-2]
            attn_mask = type(q).ones(lq, lk, dtype=dtypes.bool, device=q.device).tril()
        if attn_mask is not None:
            scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype.is_bool else scores + attn_mask
        return scores.softmax(-1).dropout(dropout_p) @ value


def _einsum_diagonals(t: Tensor, s: str) -> tuple[Tensor, str]:
    """Collapse a repeated letter in one operand to its diagonal ('ii' -> 'i')."""
    while len(set(s)) != len(s):
        c = next(ch for ch in s if s.count(ch) > 1)
        p1 = s.index(c)
        p2 = s.index(c, p1 + 1)
        n = t.shape[p1]
        if t.shape[p2] != n:
            raise ShapeError(f"einsum: repeated letter {c!r} has sizes {n} and {t.shape[p2]}")
        others = [i for i in range(t.ndim) if i not in (p1, p2)]
        lead = tuple(t.shape[i] for i in others)
        x = t.permute(others + [p1, p2]).reshape(lead + (n * n,))
        x = x.pad([(0, 0)] * len(lead) + [(0, n)]).reshape(lead + (n, n + 1))
        t = x.shrink([None] * len(lead) + [None, (0, 1)]).reshape(lead + (n,))
        s = "".join(s[i] for i in others) + c
    return t, s
