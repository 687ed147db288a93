# mypy: disable-error-code="misc"
# (the methods annotate `self: Tensor`, the class they are mixed into; mypy files that under "misc")
"""Tensor methods that move data without computing: reshape/view, permute/transpose, expand, flatten,
squeeze/unsqueeze, pad (constant, reflect, replicate, circular), shrink, flip, repeat, cat/stack,
split/chunk and tril/triu. Each builds one movement UOp (RESHAPE PERMUTE EXPAND PAD SHRINK FLIP) or a
composition of them, so they cost no kernel: the scheduler folds them into the ShapeTracker of the loads
they reach. Sizes are checked here, where the user passed them, so a bad one fails with its name.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import dtypes, promote_types
from rawgrad.errors import ArgumentError, ArgumentTypeError, ShapeError
from rawgrad.tensor.common import Axis, Scalar, _check_numel, _dim, _prod, _scalar

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor


class MovementOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()

    def reshape(self: Tensor, *shape: Any) -> Tensor:
        shp = list(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else list(shape)
        shp = [_dim(s, f"reshape {tuple(shp)}", allow_minus_one=True) for s in shp]
        n = self.numel()
        if shp.count(-1) > 1:
            raise ShapeError(f"reshape {tuple(shp)}: only one dimension can be -1")
        if -1 in shp:
            known = _prod([s for s in shp if s != -1])
            if known == 0 or n % known:
                raise ShapeError(f"cannot reshape {self.shape} to {tuple(shp)}: -1 cannot be inferred")
            shp[shp.index(-1)] = n // known
        for s in shp:
            if isinstance(s, int) and s < 0:
                raise ShapeError(f"cannot reshape {self.shape} to {tuple(shp)}: negative size")
        new = tuple(shp)
        if isinstance(n, int) and isinstance(_prod(new), int) and _prod(new) != n:
            raise ShapeError(f"cannot reshape {self.shape} ({n} elements) to {new} ({_prod(new)} elements)")
        return self if new == self.shape else self._new(UOp(Ops.RESHAPE, self.dtype, (self.uop,), new))

    def view(self: Tensor, *shape: Any) -> Tensor:
        return self.reshape(*shape)

    def permute(self: Tensor, *order: Any, dims: Any = None) -> Tensor:
        order = (dims,) if dims is not None else order  # torch's keyword
        o = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (tuple, list)) else order
        if len(o) != self.ndim:
            raise ShapeError(f"permute order {o} does not match the {self.ndim} dims of shape {self.shape}")
        norm = tuple(self._axis(a) for a in o)
        if sorted(norm) != list(range(self.ndim)):
            raise ShapeError(f"permute order {o} is not a permutation of the dims of shape {self.shape}")
        if norm == tuple(range(self.ndim)):
            return self
        return self._new(UOp(Ops.PERMUTE, self.dtype, (self.uop,), norm))

    def transpose(self: Tensor, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = self._axis(dim0), self._axis(dim1)
        if self.ndim == 0:
            return self
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def expand(self: Tensor, *shape: Any) -> Tensor:
        shp = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        shp = tuple(_dim(s, f"expand {self.shape} to {shp}", allow_minus_one=True) for s in shp)
        if len(shp) < self.ndim:
            raise ShapeError(f"cannot expand {self.shape} to {shp}: fewer dims")
        x = self.reshape((1,) * (len(shp) - self.ndim) + self.shape) if len(shp) > self.ndim else self
        new = tuple(x.shape[i] if isinstance(s, int) and s == -1 else s for i, s in enumerate(shp))
        if any(isinstance(s, int) and s == -1 for s in shp[:len(shp) - self.ndim]):
            raise ShapeError(f"cannot expand {self.shape} to {shp}: -1 is only allowed for existing dims")
        _check_numel(new, "expand")
        for old, s in zip(x.shape, new):
            if old != s and old != 1:
                raise ShapeError(f"cannot expand {self.shape} to {shp}")
        return x if new == x.shape else self._new(UOp(Ops.EXPAND, self.dtype, (x.uop,), new))

    def expand_as(self: Tensor, x: Tensor) -> Tensor:
        return self.expand(x.shape)

    def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._axis(start_dim), self._axis(end_dim)
        return self.reshape(self.shape[:s] + (_prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def unflatten(self: Tensor, dim: int, sizes: Sequence[int]) -> Tensor:
        d = self._axis(dim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])

    def squeeze(self: Tensor, dim: Axis = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        axes = self._axes(dim)
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in axes and s == 1)))

    def unsqueeze(self: Tensor, dim: int) -> Tensor:
        d = self._axis(dim, extra=1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def pad(self: Tensor, padding: Sequence[Any], value: Scalar = 0.0, mode: str = "constant") -> Tensor:
        """Either torch's flat form (left, right of the last dim, then the one before, ...) or one
        (before, after) pair or None per dim. Negative amounts crop, in every mode, before any padding
        (so reflect/replicate/circular read the cropped tensor, as torch's F.pad)."""
        if mode not in ("constant", "reflect", "replicate", "circular"):
            raise ArgumentError(f"pad mode must be constant, reflect, replicate or circular, got {mode!r}")
        pads: list[tuple[Any, Any]] = [(0, 0)] * self.ndim
        if all(isinstance(p, (int, np.integer, UOp)) for p in padding):
            if len(padding) % 2 or len(padding) > 2 * self.ndim:
                raise ShapeError(f"flat padding {tuple(padding)} needs an even length <= {2 * self.ndim} "
                                 f"for shape {self.shape}")
            for i in range(len(padding) // 2):
                pads[self.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
        else:
            if len(padding) != self.ndim:
                raise ShapeError(f"padding {tuple(padding)} needs one entry per dim of shape {self.shape}")
            pads = [(0, 0) if p is None else (p[0], p[1]) for p in padding]
        x = self
        if any(isinstance(b, int) and b < 0 or isinstance(a, int) and a < 0 for b, a in pads):
            x = x.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pads, x.shape)))
            pads = [(max(b, 0), max(a, 0)) for b, a in pads]
        if mode != "constant":
            return x._pad_from_edges(pads, mode)
        if all(b == 0 and a == 0 for b, a in pads):
            return x
        out = self._new(UOp(Ops.PAD, x.dtype, (x.uop,), tuple(pads)))
        if _scalar(value) == 0 and not (isinstance(value, float) and math.copysign(1, value) < 0):
            return out
        inside = self._new(UOp(Ops.PAD, dtypes.bool, (x._const(True, dtypes.bool).uop,), tuple(pads)))
        return inside.where(out, x._const(_scalar(value), shape=out.shape))

    def _pad_from_edges(self: Tensor, pads: list[tuple[Any, Any]], mode: str) -> Tensor:
        """reflect / replicate / circular padding: concatenate slices of the tensor itself, one dim at
        a time (all movement ops, so it fuses into the consumer)."""
        x = self
        for d, (b, a) in enumerate(pads):
            if b == 0 and a == 0:
                continue
            n = x.shape[d]
            limit = n - 1 if mode == "reflect" else n
            if mode != "replicate" and max(b, a) > limit:
                raise ShapeError(f"{mode} padding {(b, a)} does not fit dim {d} of shape {self.shape}")

            def part(lo: int, hi: int, flip: bool = False, _d: int = d, _x: Tensor = x) -> Tensor:
                p = _x.shrink([(lo, hi) if i == _d else None for i in range(_x.ndim)])
                return p.flip(_d) if flip else p
            if mode == "reflect":
                left, right = part(1, b + 1, True), part(n - 1 - a, n - 1, True)
            elif mode == "circular":
                left, right = part(n - b, n), part(0, a)
            else:
                left = part(0, 1).repeat([b if i == d else 1 for i in range(x.ndim)]) if b else part(0, 0)
                right = part(n - 1, n).repeat([a if i == d else 1 for i in range(x.ndim)]) if a \
                    else part(n, n)
            x = type(self).cat(*[t for t in (left, x, right) if t.shape[d] != 0], dim=d)
        return x

    def shrink(self: Tensor, arg: Sequence[tuple[Any, Any] | None]) -> Tensor:
        if len(arg) != self.ndim:
            raise ShapeError(f"shrink {tuple(arg)} needs one entry per dim of shape {self.shape}")
        norm = tuple((0, s) if a is None else (a[0], a[1]) for a, s in zip(arg, self.shape))
        for (b, e), s in zip(norm, self.shape):
            if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
                raise ShapeError(f"shrink {norm} is out of bounds for shape {self.shape}")
        if all(b == 0 and e == s for (b, e), s in zip(norm, self.shape)):
            return self
        return self._new(UOp(Ops.SHRINK, self.dtype, (self.uop,), norm))

    def flip(self: Tensor, *dims: Any, **kw: Any) -> Tensor:
        if "dims" in kw:  # torch's keyword
            dims = (kw.pop("dims"),)
        if kw:
            raise ArgumentTypeError(f"flip got unexpected keyword arguments {sorted(kw)}")
        d = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        axes = self._axes(d)
        if not axes:
            return self
        return self._new(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in axes for i in range(self.ndim))))

    def repeat(self: Tensor, *repeats: Any) -> Tensor:
        """Tile the tensor (torch's repeat; numpy's tile)."""
        reps = tuple(repeats[0]) if len(repeats) == 1 and isinstance(repeats[0], (tuple, list)) else repeats
        reps = tuple(_dim(r, f"repeat {reps}") for r in reps)
        if len(reps) < self.ndim:
            raise ShapeError(f"repeat {reps} needs at least {self.ndim} values for shape {self.shape}")
        base = (1,) * (len(reps) - self.ndim) + self.shape
        interleaved = tuple(v for s in base for v in (1, s))
        x = self.reshape(interleaved).expand(tuple(v for r, s in zip(reps, base) for v in (r, s)))
        return x.reshape(tuple(r * s for r, s in zip(reps, base)))

    def cat(self: Tensor, *args: Tensor, dim: int = 0) -> Tensor:
        """Concatenate along dim: `a.cat(b, c, dim=1)` or `Tensor.cat([a, b, c], dim=1)`."""
        tensors = list(self) + list(args) if isinstance(self, (list, tuple)) else [self, *args]
        if not tensors:
            raise ArgumentError("cat needs at least one tensor")
        first = tensors[0]
        d = first._axis(dim)
        dt = tensors[0].dtype
        for t in tensors[1:]:
            dt = promote_types(dt, t.dtype)
            if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                            if i != d):
                raise ShapeError(f"cat: shape {t.shape} does not match {first.shape} outside dim {d}")
        total = sum(t.shape[d] for t in tensors)
        parts, off = [], 0
        for t in tensors:
            pads = [(0, 0)] * first.ndim
            pads[d] = (off, total - off - t.shape[d])
            off += t.shape[d]
            parts.append(t.cast(dt).pad(pads))
        out = parts[0]
        for p in parts[1:]:  # the padded parts never overlap, so a sum (an OR for bools) merges them
            out = out._alu(Ops.OR if dt.is_bool else Ops.ADD, p)
        return out

    def stack(self: Tensor, *args: Tensor, dim: int = 0) -> Tensor:
        tensors = list(self) + list(args) if isinstance(self, (list, tuple)) else [self, *args]
        d = tensors[0]._axis(dim, extra=1)
        return type(tensors[0]).cat(*[t.unsqueeze(d) for t in tensors], dim=d)

    def split(self: Tensor, split_size: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        d = self._axis(dim)
        n = self.shape[d]
        if isinstance(split_size, int):
            if split_size <= 0:
                raise ArgumentError(f"split size must be positive, got {split_size}")
            sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
        else:
            sizes = list(split_size)
            if sum(sizes) != n:
                raise ShapeError(f"split sizes {sizes} do not add up to {n} (dim {d} of shape {self.shape})")
        out, off = [], 0
        for s in sizes:
            arg: list[tuple[int, int] | None] = [None] * self.ndim
            arg[d] = (off, off + s)
            out.append(self.shrink(arg))
            off += s
        return tuple(out)

    def chunk(self: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        if chunks <= 0:
            raise ShapeError(f"chunk needs a positive number of chunks, got {chunks}")
        n = self.shape[self._axis(dim)]
        return self.split(max(1, math.ceil(n / chunks)), dim)

    def tril(self: Tensor, diagonal: int = 0) -> Tensor:
        return self._tri(diagonal, lower=True)

    def triu(self: Tensor, diagonal: int = 0) -> Tensor:
        return self._tri(diagonal, lower=False)

    def _tri(self: Tensor, diagonal: int, lower: bool) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"tril/triu need at least 2 dims, got shape {self.shape}")
        r, c = self.shape[-2:]
        rows = type(self).arange(r, device=self.device).reshape(r, 1) + diagonal
        cols = type(self).arange(c, device=self.device).reshape(1, c)
        mask = (rows >= cols) if lower else (rows <= cols)
        return mask.where(self, self._const(0))  # a tensor zero keeps self's dtype (bool stays bool)
