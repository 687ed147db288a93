"""Zero-copy movement ops: a `View` is (shape, strides, offset, mask) over a flat buffer, and a
`ShapeTracker` is a stack of views for the cases one view cannot express.

Element `(i0, i1, ...)` of a view reads `offset + sum(i_k * strides[k])` when every `i_k` lies in
`mask[k] = [start, end)`, and reads 0 otherwise (padding). A later view in a ShapeTracker indexes
the row-major elements of the view before it. Sizes may be symbolic (`int | UOp`, "sint"); every
derived size is simplified so equal sizes become the same int or the same hash-consed UOp.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rawgrad.compiler.ir import Ops, UOp, Variable, prod, sint_to_uop
from rawgrad.compiler.symbolic import simplify, ssimplify_int, sum_parts
from rawgrad.dtype import dtypes
from rawgrad.errors import ShapeError

SInt = Any  # int | UOp

# ---------------------------------------------------------------------- sint helpers


def _s(x: SInt) -> SInt:
    return ssimplify_int(x) if isinstance(x, UOp) else int(x)


def _eq(a: SInt, b: SInt) -> bool:
    """Provably equal (symbolic sizes compare by their simplified difference)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a is b:
        return True
    d = _s(sint_to_uop(a) - b)
    return isinstance(d, int) and d == 0


def _cmp(a: SInt, b: SInt) -> int | None:
    """-1, 0 or 1 for a <, ==, > b where the bounds decide it; None where they cannot."""
    if isinstance(a, int) and isinstance(b, int):
        return (a > b) - (a < b)
    d = _s(sint_to_uop(a) - b)
    if isinstance(d, int):
        return (d > 0) - (d < 0)
    if d.vmin > 0:
        return 1
    if d.vmax < 0:
        return -1
    if d.vmin == d.vmax == 0:
        return 0
    return None


def _smax(a: SInt, b: SInt) -> SInt:
    c = _cmp(a, b)
    if c is not None:
        return a if c >= 0 else b
    return _s(sint_to_uop(a).maximum(b))


def _smin(a: SInt, b: SInt) -> SInt:
    c = _cmp(a, b)
    if c is not None:
        return a if c <= 0 else b
    return _s(sint_to_uop(a).minimum(b))


def _exact_div(a: SInt, b: SInt) -> SInt | None:
    """a / b when b divides a exactly (provably), else None."""
    if isinstance(a, int) and isinstance(b, int):
        return a // b if b != 0 and a % b == 0 else None
    if isinstance(b, int) and b == 0:
        return None
    if not isinstance(b, int) and b.vmin <= 0:
        return None
    q = _s(sint_to_uop(a) // b)
    return q if _eq(_s(q * b if isinstance(q, UOp) else sint_to_uop(b) * q), a) else None


def _fmt(shape: tuple[SInt, ...]) -> str:
    return "(" + ", ".join(x.render() if isinstance(x, UOp) else str(x) for x in shape) + \
        ("," if len(shape) == 1 else "") + ")"


def strides_for_shape(shape: tuple[SInt, ...]) -> tuple[SInt, ...]:
    """Row-major strides; a size-1 dimension gets stride 0 (it never moves the index)."""
    out: list[SInt] = []
    acc: SInt = 1
    for s in reversed(shape):
        out.append(0 if _eq(s, 1) else acc)
        acc = _s(acc * s) if isinstance(acc, int) and isinstance(s, int) else _s(sint_to_uop(acc) * s)
    return tuple(reversed(out))


def _prod(xs: tuple[SInt, ...] | list[SInt]) -> SInt:
    return _s(prod(xs)) if any(isinstance(x, UOp) for x in xs) else prod(xs)


def _check_shape(shape: tuple[SInt, ...], what: str) -> tuple[SInt, ...]:
    out = tuple(_s(s) for s in shape)
    for s in out:
        if (isinstance(s, int) and s < 0) or (isinstance(s, UOp) and s.vmax < 0):
            raise ShapeError(f"{what}: negative size in shape {_fmt(out)}")
    return out


# ---------------------------------------------------------------------- View


@dataclass(frozen=True)
class View:
    """One strided, optionally masked window onto a flat buffer."""

    shape: tuple[SInt, ...]
    strides: tuple[SInt, ...]
    offset: SInt
    mask: tuple[tuple[SInt, SInt], ...] | None
    contiguous: bool

    @staticmethod
    def create(shape: tuple[SInt, ...], strides: tuple[SInt, ...] | None = None, offset: SInt = 0,
               mask: tuple[tuple[SInt, SInt], ...] | None = None) -> View:
        """Build a view in canonical form, so that equal views compare (and hash) equal."""
        shape = _check_shape(tuple(shape), "View")
        n = len(shape)
        if any(isinstance(s, int) and s == 0 for s in shape):
            # no elements: nothing can be read, so every zero-size view is the same
            return View(shape, (0,) * n, 0, None, True)
        st = strides_for_shape(shape) if strides is None else tuple(_s(x) for x in strides)
        if len(st) != n:
            raise ShapeError(f"View: {len(st)} strides for shape {_fmt(shape)}")
        # a size-1 dimension is only ever indexed at 0
        st = tuple(0 if _eq(s, 1) else x for s, x in zip(shape, st))
        off = _s(offset)
        if mask is not None:
            if len(mask) != n:
                raise ShapeError(f"View: mask {mask} does not match shape {_fmt(shape)}")
            mask = tuple((_s(b), _s(e)) for b, e in mask)
            if any(_cmp(e, b) in (-1, 0) for b, e in mask):
                # one empty dimension hides every element
                return View(shape, (0,) * n, 0, ((0, 0),) * n, False)
            # a dimension masked down to one index reads that index wherever it is valid: fold it
            # into the offset so the stride no longer blocks merging dimensions in reshape
            new_st = list(st)
            for i, (b, e) in enumerate(mask):
                if _eq(_add(e, _neg(b)), 1):
                    off = _add(off, _mul(b, st[i]))
                    new_st[i] = 0
            st = tuple(new_st)
            if all(_eq(b, 0) and _eq(e, s) for (b, e), s in zip(mask, shape)):
                mask = None
        contiguous = mask is None and _eq(off, 0) and \
            all(_eq(a, b) for a, b in zip(st, strides_for_shape(shape)))
        return View(shape, st, off, mask, contiguous)

    @property
    def size(self) -> SInt:
        return _prod(self.shape)

    # ------------------------------------------------------------------ movement
    def permute(self, order: tuple[int, ...]) -> View:
        order = tuple(order)
        if sorted(order) != list(range(len(self.shape))):
            raise ShapeError(f"permute: {order} is not an ordering of the {len(self.shape)} axes of "
                             f"shape {_fmt(self.shape)}")
        return View.create(tuple(self.shape[i] for i in order), tuple(self.strides[i] for i in order),
                           self.offset, tuple(self.mask[i] for i in order) if self.mask is not None else None)

    def expand(self, new_shape: tuple[SInt, ...]) -> View:
        new_shape = _check_shape(tuple(new_shape), "expand")
        if len(new_shape) != len(self.shape):
            raise ShapeError(f"expand: cannot expand shape {_fmt(self.shape)} to {_fmt(new_shape)} "
                             "(different number of dims)")
        strides, mask = list(self.strides), list(self.mask) if self.mask is not None else None
        for i, (s, ns) in enumerate(zip(self.shape, new_shape)):
            if _eq(s, ns):
                continue
            if not _eq(s, 1):
                raise ShapeError(f"expand: cannot expand shape {_fmt(self.shape)} to {_fmt(new_shape)}: "
                                 f"dim {i} has size {_fmt((s,))[1:-2]}, only size-1 dims can grow")
            strides[i] = 0
            if mask is not None:
                mask[i] = (0, ns)
        if any(isinstance(s, int) and s == 0 for s in self.shape):
            return View.create(new_shape)
        return View.create(new_shape, tuple(strides), self.offset, tuple(mask) if mask is not None else None)

    def pad(self, arg: tuple[tuple[SInt, SInt], ...]) -> View:
        arg = tuple((_s(b), _s(a)) for b, a in arg)
        if len(arg) != len(self.shape):
            raise ShapeError(f"pad: {len(arg)} (before, after) pairs for shape {_fmt(self.shape)}")
        for b, a in arg:
            if _cmp(b, 0) == -1 or _cmp(a, 0) == -1:
                raise ShapeError(f"pad: negative padding {arg} for shape {_fmt(self.shape)}")
        if all(_eq(b, 0) and _eq(a, 0) for b, a in arg):
            return self
        new_shape = tuple(_add(_add(s, b), a) for s, (b, a) in zip(self.shape, arg))
        offset = self.offset
        for (b, _), st in zip(arg, self.strides):
            offset = _add(offset, _neg(_mul(b, st)))
        old_mask = self.mask if self.mask is not None else tuple((0, s) for s in self.shape)
        mask = tuple((_add(mb, b), _add(me, b)) for (mb, me), (b, _) in zip(old_mask, arg))
        if any(isinstance(s, int) and s == 0 for s in self.shape):
            mask = tuple((0, 0) for _ in new_shape)
        return View.create(new_shape, self.strides, offset, mask)

    def shrink(self, arg: tuple[tuple[SInt, SInt], ...]) -> View:
        arg = tuple((_s(b), _s(e)) for b, e in arg)
        if len(arg) != len(self.shape):
            raise ShapeError(f"shrink: {len(arg)} (start, end) pairs for shape {_fmt(self.shape)}")
        for (b, e), s in zip(arg, self.shape):
            if _cmp(b, 0) == -1 or _cmp(e, b) == -1 or _cmp(e, s) == 1:
                raise ShapeError(f"shrink: {arg} is out of range for shape {_fmt(self.shape)}")
        if all(_eq(b, 0) and _eq(e, s) for (b, e), s in zip(arg, self.shape)):
            return self
        new_shape = tuple(_add(e, _neg(b)) for b, e in arg)
        offset = self.offset
        for (b, _), st in zip(arg, self.strides):
            offset = _add(offset, _mul(b, st))
        mask = None
        if self.mask is not None:
            mask = tuple((_smax(0, _add(mb, _neg(b))), _smin(ns, _smax(0, _add(me, _neg(b)))))
                         for (mb, me), (b, _), ns in zip(self.mask, arg, new_shape))
        return View.create(new_shape, self.strides, offset, mask)

    def flip(self, arg: tuple[bool, ...]) -> View:
        arg = tuple(bool(f) for f in arg)
        if len(arg) != len(self.shape):
            raise ShapeError(f"flip: {len(arg)} flags for shape {_fmt(self.shape)}")
        offset, strides = self.offset, list(self.strides)
        mask = list(self.mask) if self.mask is not None else None
        for i, f in enumerate(arg):
            if not f:
                continue
            s = self.shape[i]
            offset = _add(offset, _mul(_add(s, -1), strides[i]))
            strides[i] = _neg(strides[i])
            if mask is not None:
                mb, me = mask[i]
                mask[i] = (_add(s, _neg(me)), _add(s, _neg(mb)))
        return View.create(self.shape, tuple(strides), offset, tuple(mask) if mask is not None else None)

    def stride(self, steps: tuple[int, ...]) -> View:
        """Every `steps[i]`-th element along each dim (a negative step walks backwards); int sizes only."""
        if len(steps) != len(self.shape) or any(not isinstance(k, int) or k == 0 for k in steps):
            raise ShapeError(f"stride: steps {steps} must be non-zero ints, one per dim of "
                             f"{_fmt(self.shape)}")
        v = self.flip(tuple(k < 0 for k in steps))
        if any(not isinstance(s, int) for s, k in zip(v.shape, steps) if abs(k) != 1):
            raise ShapeError(f"stride: symbolic dims of {_fmt(self.shape)} cannot be stepped")
        new_shape = tuple(s if abs(k) == 1 else (s + abs(k) - 1) // abs(k) for s, k in zip(v.shape, steps))
        strides = tuple(_mul(st, abs(k)) for st, k in zip(v.strides, steps))
        mask = None
        if v.mask is not None:
            # element j is old index j*k: valid when mb <= j*k < me
            mask = tuple((mb, me) if abs(k) == 1 else (-(-mb // abs(k)), -(-me // abs(k)))
                         for (mb, me), k in zip(v.mask, steps))
        return View.create(new_shape, strides, v.offset, mask)

    def reshape(self, new_shape: tuple[SInt, ...]) -> View | None:
        """The same elements in a new shape, or None when one view cannot express it."""
        new_shape = _check_shape(tuple(new_shape), "reshape")
        if not _eq(self.size, _prod(new_shape)):
            raise ShapeError(f"reshape: cannot reshape {_fmt(self.shape)} ({self.size} elements) to "
                             f"{_fmt(new_shape)} ({_prod(new_shape)} elements)")
        if len(new_shape) == len(self.shape) and all(_eq(a, b) for a, b in zip(self.shape, new_shape)):
            return self
        if any(isinstance(s, int) and s == 0 for s in new_shape) or self.contiguous:
            return View.create(new_shape)
        if self.mask is not None and any(_cmp(e, b) in (-1, 0) for b, e in self.mask):
            return _view_reading_nothing(new_shape)
        strides = _reshape_strides(self.shape, self.strides, new_shape)
        if strides is None:
            return None
        mask = None
        if self.mask is not None:
            mask = _reshape_mask(self.shape, self.mask, new_shape)
            if mask is None:
                return None
        return View.create(new_shape, strides, self.offset, mask)

    # ------------------------------------------------------------------ indexing
    def to_indexed(self, idxs: list[UOp]) -> tuple[UOp, UOp]:
        """(buffer index, validity) of the element at `idxs` (not yet simplified)."""
        if self.mask is not None and any(_cmp(e, b) in (-1, 0) for b, e in self.mask):
            return UOp.const(dtypes.index, 0), UOp.const(dtypes.bool, False)
        idx = sint_to_uop(self.offset)
        for i, st in zip(idxs, self.strides):
            if not (isinstance(st, int) and st == 0):
                idx = idx + i * st
        valid = UOp.const(dtypes.bool, True)
        if self.mask is not None:
            for i, (b, e), s in zip(idxs, self.mask, self.shape):
                if not _eq(b, 0):
                    valid = valid.logical_and(sint_to_uop(b).lt(i + 1))
                if not _eq(e, s):
                    valid = valid.logical_and(i.lt(e))
        return idx, valid


def _view_reading_nothing(shape: tuple[SInt, ...]) -> View | None:
    """A view of `shape` whose every element is invalid, or None for a 0-d shape: a mask is one
    interval per dimension, so a 0-d view cannot say "nothing is valid". Callers then keep the masked
    view below it (a 0-d element read through an empty pad/stack/cat piece must stay invalid, never
    become the unmasked element 0)."""
    if not shape:
        return None
    return View.create(shape, mask=tuple((0, 0) for _ in shape))


def _sym(*xs: SInt) -> bool:
    return any(isinstance(x, UOp) for x in xs)


def _add(a: SInt, b: SInt) -> SInt:
    return _s(sint_to_uop(a) + b) if _sym(a, b) else a + b


def _mul(a: SInt, b: SInt) -> SInt:
    return _s(sint_to_uop(a) * b) if _sym(a, b) else a * b


def _neg(a: SInt) -> SInt:
    return _mul(a, -1)


def _reshape_strides(shape: tuple[SInt, ...], strides: tuple[SInt, ...],
                     new_shape: tuple[SInt, ...]) -> tuple[SInt, ...] | None:
    """Strides for `new_shape` over the same elements, or None if some new dim is not linear."""
    # merge neighbouring dims that continue each other linearly into [size, innermost stride]
    groups: list[list[SInt]] = []
    for s, st in zip(shape, strides):
        if _eq(s, 1):
            continue
        if groups and _eq(groups[-1][1], _mul(st, s)):
            groups[-1] = [_mul(groups[-1][0], s), st]
        else:
            groups.append([s, st])
    out: list[SInt] = []
    gi = 0
    for ns in new_shape:
        if _eq(ns, 1):
            out.append(0)
            continue
        if gi >= len(groups):
            return None
        # a new dim takes the outermost factor of what is left of the current group
        rest = _exact_div(groups[gi][0], ns)
        if rest is None:
            return None
        out.append(_mul(groups[gi][1], rest))
        groups[gi][0] = rest
        if _eq(rest, 1):
            gi += 1
    return tuple(out) if gi == len(groups) else None


def _reshape_mask(shape: tuple[SInt, ...], mask: tuple[tuple[SInt, SInt], ...],
                  new_shape: tuple[SInt, ...]) -> tuple[tuple[SInt, SInt], ...] | None:
    """The mask in `new_shape`, or None when the valid region is not a box there."""
    out: list[tuple[SInt, SInt]] = []
    i = j = 0
    while i < len(shape) or j < len(new_shape):
        if i < len(shape) and _eq(shape[i], 1):
            i += 1  # size-1 dims are masked (0, 1) once the view is known to be non-empty
            continue
        if j < len(new_shape) and _eq(new_shape[j], 1):
            out.append((0, 1))
            j += 1
            continue
        if i >= len(shape) or j >= len(new_shape):
            return None
        if _eq(shape[i], new_shape[j]):
            out.append(mask[i])
            i, j = i + 1, j + 1
            continue
        # the smallest run of old dims and new dims with equal element counts
        oi, nj = [i], [j]
        po, pn = shape[i], new_shape[j]
        while not _eq(po, pn):
            if not (isinstance(po, int) and isinstance(pn, int)):
                return None  # symbolic runs only work dim by dim
            if po < pn:
                i += 1
                if i >= len(shape):
                    return None
                oi.append(i)
                po *= shape[i]
            else:
                j += 1
                if j >= len(new_shape):
                    return None
                nj.append(j)
                pn *= new_shape[j]
        i, j = i + 1, j + 1
        old = [(shape[k], mask[k]) for k in oi]
        new = [new_shape[k] for k in nj]
        if all(_eq(b, 0) and _eq(e, s) for s, (b, e) in old):
            out.extend((0, s) for s in new)
            continue
        if any(not isinstance(x, int) for s, (b, e) in old for x in (s, b, e)):
            return None
        box = _box_to_interval(old)
        if box is None:
            return None
        new_box = _interval_to_box(box[0], box[1], new)
        if new_box is None:
            return None
        out.extend(new_box)
    return tuple(out)


def _box_to_interval(dims: list[tuple[int, tuple[int, int]]]) -> tuple[int, int] | None:
    """The row-major flat interval covered by a box, or None when the box is not one interval."""
    inner = [k for k, (s, (b, e)) in enumerate(dims) if not (b == 0 and e == s)]
    jj = inner[-1]  # the innermost dim that is not whole: every dim outside it must be one index
    if any(e - b != 1 for _, (b, e) in dims[:jj]):
        return None
    base, step = 0, 1
    for s, _ in dims[jj + 1:]:
        step *= s
    mult = step * dims[jj][0]
    for s, (b, _) in reversed(dims[:jj]):
        base += b * mult
        mult *= s
    return base + dims[jj][1][0] * step, base + dims[jj][1][1] * step


def _interval_to_box(lo: int, hi: int, dims: list[int]) -> list[tuple[int, int]] | None:
    """The box in `dims` covering exactly the flat interval [lo, hi), or None."""
    inner = 1
    for jj in range(len(dims) - 1, -1, -1):
        outer = inner * dims[jj]
        if lo % inner == 0 and hi % inner == 0 and lo // outer == (hi - 1) // outer:
            # every dim outside jj holds the single coordinate that lo and hi-1 share
            outer_dims: list[tuple[int, int]] = []
            scale = outer
            for s in reversed(dims[:jj]):
                d = (lo // scale) % s
                outer_dims.append((d, d + 1))
                scale *= s
            outer_dims.reverse()
            box = outer_dims + [((lo // inner) % dims[jj], ((hi - 1) // inner) % dims[jj] + 1)]
            return box + [(0, s) for s in dims[jj + 1:]]
        inner = outer
    return None


# ---------------------------------------------------------------------- index helpers


def _default_idxs(shape: tuple[SInt, ...]) -> list[UOp]:
    return [Variable(f"idx{i}", 0, max(0, int(s.vmax if isinstance(s, UOp) else s) - 1))
            for i, s in enumerate(shape)]


def _unravel(shape: tuple[SInt, ...], flat: UOp) -> list[UOp]:
    """Row-major coordinates of `flat` in `shape` (the outermost needs no remainder: it is in range
    wherever the index is valid)."""
    out: list[UOp] = []
    acc: SInt = 1
    for k in range(len(shape) - 1, -1, -1):
        s = shape[k]
        if _eq(s, 1):
            out.append(UOp.const(dtypes.index, 0))
            continue
        q = flat if isinstance(acc, int) and acc == 1 else flat // sint_to_uop(acc)
        out.append(q if k == 0 else q % sint_to_uop(s))
        acc = _mul(acc, s)
    return list(reversed(out))


def _affine(u: UOp, idxs: list[UOp]) -> tuple[list[SInt], SInt] | None:
    """u = offset + sum(coef_k * idxs[k]) with coefficients free of idxs: (coefs, offset), else None."""
    ids = set(idxs)
    terms, const = sum_parts(u)
    coefs: dict[UOp, SInt] = {}
    rest: SInt = const
    for base, k in terms.items():
        factors: list[UOp] = []
        stack = [base]
        while stack:
            f = stack.pop()
            if f.op is Ops.MUL:
                stack.extend(f.src)
            else:
                factors.append(f)
        hits = [f for f in factors if f in ids]
        others = [f for f in factors if f not in ids]
        if len(hits) > 1 or any(n in ids for f in others for n in f.toposort()):
            return None
        coef: SInt = _mul(k, _prod(tuple(others))) if others else k
        if hits:
            coefs[hits[0]] = _add(coefs.get(hits[0], 0), coef)
        else:
            rest = _add(rest, coef)
    return [coefs.get(i, 0) for i in idxs], rest


def _valid_to_mask(valid: UOp, idxs: list[UOp], shape: tuple[SInt, ...],
                   start: tuple[tuple[SInt, SInt], ...]) -> tuple[tuple[SInt, SInt], ...] | None:
    """The box `start` narrowed by a validity expression, or None when the validity is not a box."""
    box: list[list[SInt]] = [[b, e] for b, e in start]
    if valid.is_const(False):
        # a 0-d view has no dimension to carry an empty mask: such a validity is not a (0-d) box
        return tuple((0, 0) for _ in shape) if shape else None
    clauses, stack = [], [valid]
    while stack:
        c = stack.pop()
        if c.op is Ops.AND:
            stack.extend(c.src)
        elif not c.is_const(True):
            clauses.append(c)
    for c in clauses:
        negated = c.op is Ops.NOT
        if negated:
            c = c.src[0]
        if c.op is not Ops.CMPLT:
            return None
        aff = _affine(simplify(c.src[0] - c.src[1]), idxs)  # lhs - rhs < 0
        if aff is None:
            return None
        coefs, k = aff
        used = [(n, a) for n, a in enumerate(coefs) if not (isinstance(a, int) and a == 0)]
        if len(used) != 1 or not (isinstance(used[0][1], int) and used[0][1] in (1, -1)):
            return None
        dim, a = used[0]
        # a*i + k < 0 means i < -k when a == 1 and i >= k + 1 when a == -1; negation swaps the side
        bound = _neg(k) if a == 1 else _add(k, 1)
        if (a == 1) != negated:
            box[dim][1] = _smin(box[dim][1], bound)
        else:
            box[dim][0] = _smax(box[dim][0], bound)
    return tuple((_smin(_smax(b, 0), s), _smax(_smin(e, s), 0)) for (b, e), s in zip(box, shape))


def _narrowed(v: View, idxs: list[UOp]) -> dict[UOp, UOp]:
    """Stand-ins for the loop variables of masked dims, bounded by the mask as well as the loop."""
    if v.mask is None:
        return {}
    out: dict[UOp, UOp] = {}
    for k, (i, (b, e)) in enumerate(zip(idxs, v.mask)):
        if i.op not in (Ops.DEFINE_VAR, Ops.RANGE, Ops.SPECIAL) or i in out:
            continue
        lo = max(int(i.vmin), int(b.vmin if isinstance(b, UOp) else b))
        hi = min(int(i.vmax), int(e.vmax if isinstance(e, UOp) else e) - 1)
        if lo <= hi and (lo, hi) != (i.vmin, i.vmax):
            out[i] = Variable(f"masked{k}_{i.render()}", lo, hi)
    return out


def _contiguous_order(v: View) -> list[int] | None:
    """The dims of `v` (size > 1, stride != 0), innermost first, if they lay out a contiguous block
    (stride 1, then each stride = the previous dim's stride * size); else None. Symbolic strides are
    matched by provable equality, so this works where sizes are Variables."""
    dims = [i for i, (sz, st) in enumerate(zip(v.shape, v.strides)) if not _eq(sz, 1) and not _eq(st, 0)]
    order: list[int] = []
    want: SInt = 1
    while len(order) < len(dims):
        nxt = next((i for i in dims if i not in order and _eq(v.strides[i], want)), None)
        if nxt is None:
            return None
        order.append(nxt)
        want = _mul(want, v.shape[nxt])
    return order


def _merge_layout_view(v1: View, v2: View) -> View | None:
    """v2 on top of v1 when v2 only permutes, expands and reshapes v1's elements (no mask, no offset):
    reshape v1 to v2's underlying contiguous shape, then carry the strides over. This is the case
    attention's head split produces, and it needs no div/mod, so it also works with symbolic sizes
    (where composing index expressions would)."""
    if v2.mask is not None or not _eq(v2.offset, 0) or v1.mask is not None:
        return None
    order = _contiguous_order(v2)
    if order is None:
        return None
    layout = tuple(v2.shape[i] for i in reversed(order))  # outermost first
    if not _eq(_prod(layout), v1.size):
        return None  # v2 reads a part of v1 only (or the same elements twice): not a pure relayout
    base = v1.reshape(layout) if layout else v1
    if base is None or base.mask is not None:
        return None
    strides: list[SInt] = [0] * len(v2.shape)
    for pos, i in enumerate(reversed(order)):
        strides[i] = base.strides[pos] if layout else 0
    return View.create(v2.shape, tuple(strides), base.offset, None)


def _merge_views(v1: View, v2: View) -> View | None:
    """One view equal to v2 applied on top of v1, or None."""
    if v1.contiguous:
        return v2
    if v2.contiguous and _eq(v1.size, v2.size):
        return v1.reshape(v2.shape)
    if any(isinstance(s, int) and s == 0 for s in v2.shape):
        return View.create(v2.shape)
    empty = lambda v: v.mask is not None and any(_cmp(e, b) in (-1, 0) for b, e in v.mask)
    if empty(v2):
        return v2  # it reads nothing, whatever is below it
    if empty(v1):
        return _view_reading_nothing(v2.shape)
    direct = _merge_layout_view(v1, v2)
    if direct is not None:
        return direct
    # compose the two index functions symbolically; if the result is affine in the loop indices and
    # its validity is a box, one view computes exactly the same thing. Outside v2's mask nothing is
    # read, so the indices are bounded by that mask, which lets div/mod of padded indices vanish.
    box = v2.mask if v2.mask is not None else tuple((0, s) for s in v2.shape)
    idxs = [Variable(f"idx{i}", int(b.vmin if isinstance(b, UOp) else b),
                     int(e.vmax if isinstance(e, UOp) else e) - 1) for i, (b, e) in enumerate(box)]
    flat, _ = v2.to_indexed(idxs)
    idx, valid1 = v1.to_indexed(_unravel(v1.shape, simplify(flat)))
    aff = _affine(simplify(idx), idxs)
    if aff is None:
        return None
    mask = _valid_to_mask(simplify(valid1), idxs, v2.shape, box)
    if mask is None:
        return None
    strides, offset = aff
    return View.create(v2.shape, tuple(strides), offset, mask)


# ---------------------------------------------------------------------- ShapeTracker


@dataclass(frozen=True)
class ShapeTracker:
    """A stack of views: each later view indexes the row-major elements of the one before it."""

    views: tuple[View, ...]

    def __post_init__(self) -> None:
        if not self.views:
            raise ShapeError("a ShapeTracker needs at least one view")

    @staticmethod
    def from_shape(shape: tuple[SInt, ...]) -> ShapeTracker:
        return ShapeTracker((View.create(tuple(shape)),))

    @property
    def shape(self) -> tuple[SInt, ...]:
        return self.views[-1].shape

    @property
    def size(self) -> SInt:
        """Number of elements of `shape` (not of the underlying buffer; see `real_size`)."""
        return self.views[-1].size

    @property
    def contiguous(self) -> bool:
        """Exactly the identity on a buffer of `size` elements."""
        return len(self.views) == 1 and self.views[0].contiguous

    @property
    def consecutive_axes(self) -> tuple[int, ...]:
        """Axes whose (single-view, unmasked) stride is 1: they read neighbouring elements."""
        rs = self.real_strides()
        return tuple(i for i, st in enumerate(rs) if isinstance(st, int) and st == 1)

    def variables(self) -> set[UOp]:
        """Every DEFINE_VAR in the sizes, strides, offsets and masks."""
        out: set[UOp] = set()
        for v in self.views:
            vals = [*v.shape, *v.strides, v.offset, *(x for m in (v.mask or ()) for x in m)]
            for x in vals:
                if isinstance(x, UOp):
                    out.update(x.variables())
        return out

    # ------------------------------------------------------------------ movement
    def _with_last(self, v: View) -> ShapeTracker:
        st = ShapeTracker(self.views[:-1] + (v,))
        return st.simplify() if len(st.views) > 1 else st

    def reshape(self, new_shape: tuple[SInt, ...]) -> ShapeTracker:
        new_shape = tuple(new_shape)
        v = self.views[-1].reshape(new_shape)
        if v is None:
            return ShapeTracker(self.views + (View.create(new_shape),))
        return self._with_last(v)

    def permute(self, order: tuple[int, ...]) -> ShapeTracker:
        return self._with_last(self.views[-1].permute(order))

    def expand(self, new_shape: tuple[SInt, ...]) -> ShapeTracker:
        return self._with_last(self.views[-1].expand(new_shape))

    def pad(self, arg: tuple[tuple[SInt, SInt], ...]) -> ShapeTracker:
        return self._with_last(self.views[-1].pad(arg))

    def shrink(self, arg: tuple[tuple[SInt, SInt], ...]) -> ShapeTracker:
        return self._with_last(self.views[-1].shrink(arg))

    def flip(self, arg: tuple[bool, ...]) -> ShapeTracker:
        return self._with_last(self.views[-1].flip(arg))

    def stride(self, steps: tuple[int, ...]) -> ShapeTracker:
        return self._with_last(self.views[-1].stride(steps))

    def simplify(self) -> ShapeTracker:
        """Merge neighbouring views wherever one view expresses both."""
        views = list(self.views)
        k = len(views) - 1
        while k >= 1:
            merged = _merge_views(views[k - 1], views[k])
            if merged is None:
                k -= 1
                continue
            views[k - 1:k + 1] = [merged]
            k = min(k, len(views) - 1)
        return ShapeTracker(tuple(views))

    def __add__(self, other: ShapeTracker) -> ShapeTracker:
        """`self + other`: apply `other`'s movement on top of `self` (other's first view indexes
        self's elements)."""
        if _cmp(_buffer_extent(other.views[0]), self.size) == 1:
            raise ShapeError(f"cannot stack a ShapeTracker over {_fmt(other.views[0].shape)} on one of shape "
                             f"{_fmt(self.shape)}: it reads past the {self.size} elements")
        out = self
        for v in other.views:
            out = ShapeTracker(out.views + (v,)).simplify()
        return out

    # ------------------------------------------------------------------ indexing
    def to_indexed_uops(self, idxs: list[UOp] | None = None) -> tuple[UOp, UOp]:
        """(index into the flat buffer, validity) of the element at `idxs`, one index per dim of
        `shape` (default: variables idx0, idx1, ... bounded by the shape)."""
        if idxs is None:
            idxs = _default_idxs(self.shape)
        idxs = [sint_to_uop(i) for i in idxs]
        if len(idxs) != len(self.shape):
            raise ShapeError(f"to_indexed_uops: {len(idxs)} indices for shape {_fmt(self.shape)}")
        last = self.views[-1]
        _, valid = last.to_indexed(idxs)
        # the index only matters where the last view's mask holds: work with the loop variables
        # narrowed to the mask (so a padded index can split through div/mod), then put them back
        narrowed = _narrowed(last, idxs)
        idx, _ = last.to_indexed([narrowed.get(i, i) for i in idxs])
        idx, inner = simplify(idx), UOp.const(dtypes.bool, True)
        for v in reversed(self.views[:-1]):
            idx, more = v.to_indexed(_unravel(v.shape, idx))
            idx, inner = simplify(idx), inner.logical_and(more)
        if narrowed:
            back = {n: i for i, n in narrowed.items()}
            idx, inner = idx.substitute(back), inner.substitute(back)
        return simplify(idx), simplify(valid.logical_and(inner))

    def real_strides(self) -> tuple[SInt | None, ...]:
        """Per-dim stride of the buffer index, None for a dim the index does not follow linearly
        (validity is not considered)."""
        v = self.views[-1]
        if len(self.views) == 1:
            return v.strides
        idxs = _default_idxs(self.shape)
        idx, _ = self.to_indexed_uops(idxs)
        terms, _ = sum_parts(idx)
        ids = set(idxs)
        out: dict[UOp, SInt | None] = {i: 0 for i in idxs}
        for base, k in terms.items():
            aff = _affine(base * k, idxs)
            if aff is None:
                for n in base.toposort():
                    if n in ids:
                        out[n] = None
                continue
            for i, c in zip(idxs, aff[0]):
                if out[i] is not None and not (isinstance(c, int) and c == 0):
                    out[i] = _add(out[i], c)
        return tuple(out[i] for i in idxs)

    def real_size(self) -> SInt:
        """Elements the underlying buffer must hold: one past the largest index read."""
        if any(isinstance(s, int) and s == 0 for s in self.shape):
            return 0
        v = self.views[0]
        return _buffer_extent(v)


def _buffer_extent(v: View) -> SInt:
    """One past the largest buffer index a single view reads (0 if it reads nothing)."""
    if any(isinstance(s, int) and s == 0 for s in v.shape):
        return 0
    if v.mask is not None and any(_cmp(e, b) in (-1, 0) for b, e in v.mask):
        return 0
    box = v.mask if v.mask is not None else tuple((0, s) for s in v.shape)
    hi = v.offset
    for (b, e), st in zip(box, v.strides):
        # the largest contribution of a dim is at one end of its valid range
        hi = _add(hi, _smax(_mul(b, st), _mul(_add(e, -1), st)))
    return _add(hi, 1)
