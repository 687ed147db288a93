# mypy: disable-error-code="misc"
# (the methods annotate `self: Tensor`, the class they are mixed into; mypy files that under "misc")
"""Tensor indexing: `x[...]` and `x[...] = v` with numpy's rules (ints, slices with steps, None,
Ellipsis, bool masks, integer index tensors and lists, bound Variables as moving windows), gather,
one_hot, embedding and the row gather (Ops.GATHER) they share, plus the out-of-range checks for
indices that live on the device.

A basic index (ints, slices, None, Ellipsis) is planned once (`_IndexPlan`) as shrink, flip and
take-every-step movement ops, so `__setitem__` can run the same steps backwards. Advanced indices are a
row gather when there is a single integer index on the first axis, and a one-hot compare plus a masked
sum (one reduce kernel) otherwise. This module also gives autograd the gradient of GATHER, which is a
tensor-level composite (`IndexingOps._gather_grad`, which tensor.py registers).
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp, shrink_size
from rawgrad.dtype import dtypes
from rawgrad.errors import ArgumentTypeError, ShapeError, TensorIndexError
from rawgrad.hcq.errors import DeviceClosedError
from rawgrad.tensor import realize as _realize
from rawgrad.tensor.common import _broadcast_shapes, _prod
from rawgrad.tensor.interpret import is_realized

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor


def _symbolic_window(it: Any, size: Any, dim: int) -> tuple[Any, Any] | None:
    """(start, end) of an index that names a bound Variable: `v` (one element) or `v:v+n` (step 1);
    None for plain ints, slices of ints and tensors. Bounds are checked over the Variable's range."""
    start: Any
    end: Any
    if isinstance(it, UOp):
        start, end = it, it + 1
    elif isinstance(it, slice) and (isinstance(it.start, UOp) or isinstance(it.stop, UOp)):
        if it.step not in (None, 1):
            raise TensorIndexError(f"a slice with a symbolic bound takes step 1, got {it!r}")
        start = 0 if it.start is None else it.start
        end = size if it.stop is None else it.stop
    else:
        return None
    lo, hi = (start.vmin if isinstance(start, UOp) else start), (end.vmax if isinstance(end, UOp) else end)
    if lo < 0 or (isinstance(size, int) and hi > size):
        raise TensorIndexError(f"a symbolic index can reach [{lo}, {hi}), outside dimension {dim} of size "
                               f"{size}")
    return start, end


# ---------------------------------------------------------------------- basic-indexing plan
@dataclass
class _IndexPlan:
    """What a basic (int/slice/None/Ellipsis) index does per dim of the source tensor, so that
    __setitem__ can run the same steps backwards."""

    shrink: list[tuple[int, int]] = field(default_factory=list)
    flip: list[bool] = field(default_factory=list)
    step: list[tuple[int, int]] = field(default_factory=list)  # (|step|, count) per dim
    out_shape: list[int] = field(default_factory=list)  # after dropping ints and adding Nones
    advanced: list[tuple[int, Tensor]] = field(default_factory=list)  # (axis in result, index tensor)
    adv_pos: int | None = None  # where the broadcast index dims go; None: in front (not adjacent)
    host_checked: set[int] = field(default_factory=set)  # ids of index tensors already checked on the host


# ---------------------------------------------------------------------- out-of-range index checks


# "any index out of range" flag; the flags are computed and read at the next host read (numpy(), item(),
# tolist()) of this thread, and before any indexed write, and a set flag raises IndexError there. Until then
# an out-of-range read gives 0 (a load is never made outside the table). TinyJit replays run no Python,
# so they check nothing: docs/reliability.md lists this.
MAX_PENDING_INDEX_CHECKS = 64  # flags held before they are checked anyway (each keeps its index alive)


class _PendingIndexChecks(threading.local):
    def __init__(self) -> None:
        self.flags: list[tuple[Tensor, str]] = []


_pending_index_checks = _PendingIndexChecks()


def _defer_index_check(index: Tensor, size: int, what: str) -> None:
    if index.numel() == 0 or not isinstance(size, int) or any(not isinstance(d, int) for d in index.shape):
        return
    bad = ((index < -size) | (index >= size)).any()
    message = f"{what}: an index is out of range for a dimension of size {size} (valid: {-size}..{size - 1})"
    _pending_index_checks.flags.append((bad, message))
    if len(_pending_index_checks.flags) >= MAX_PENDING_INDEX_CHECKS and not _realize.readback_guards:
        check_pending_indices()


def check_pending_indices() -> None:
    """Compute and read this thread's pending out-of-range flags; raise IndexError for a set one."""
    flags, _pending_index_checks.flags = _pending_index_checks.flags, []
    if not flags:
        return
    by_device: dict[str, list[tuple[Tensor, str]]] = {}
    for f in flags:
        by_device.setdefault(f[0].device, []).append(f)
    for device, group in by_device.items():
        first, *rest = [t for t, _ in group]
        try:
            values = first.stack(*rest).numpy() if rest else [first.numpy()]
        except DeviceClosedError:
            # the indexed work ran on a device closed since: nothing computed there can be read any more, and
            # this thread's next host read (of anything) must not fail for it; say what was not checked
            warnings.warn(f"{len(group)} out-of-range index check(s) of work on {device} were dropped: the "
                          f"device was closed before they were read", RuntimeWarning, stacklevel=2)
            continue
        for (_, message), v in zip(group, values):
            if bool(v):
                raise TensorIndexError(message)


def _check_host_index(data: np.ndarray, size: int, dim: int) -> None:
    if data.size and (int(data.min()) < -size or int(data.max()) >= size):
        bad = int(data.max()) if int(data.max()) >= size else int(data.min())
        raise TensorIndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


class IndexingOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()

    def _index_plan(self: Tensor, indices: Any) -> tuple[_IndexPlan, Tensor]:
        items = list(indices) if isinstance(indices, tuple) else [indices]
        starts = self._index_item_dims(items)
        host_checked: set[int] = set()
        # lists and arrays are index tensors; bool masks become their integer coordinates (this needs
        # the mask's data, so it realizes it: the result's shape depends on it)
        norm: list[Any] = []
        for it, start in zip(items, starts):
            if isinstance(it, (list, np.ndarray)) and not (isinstance(it, list) and len(it) == 0):
                data = np.asarray(it)
                if data.dtype.kind in "iu" and start is not None and start < self.ndim:
                    _check_host_index(data, self.shape[start], start)
                it = type(self)(data, device=self.device)
                host_checked.add(id(it))
            elif isinstance(it, list):
                it = type(self)(np.zeros(0, np.int32), device=self.device)
            if isinstance(it, type(self)) and it.dtype.is_bool:
                first = start if start is not None else 0
                covered = tuple(self.shape[first:first + it.ndim])
                if covered != it.shape:
                    raise TensorIndexError(f"boolean index of shape {it.shape} does not match the indexed "
                                     f"dimensions {first}..{first + it.ndim - 1} of shape {covered}")
                coords = [type(self)(c.astype(np.int64), device=self.device) for c in np.nonzero(it.numpy())]
                host_checked.update(id(c) for c in coords)
                norm.extend(coords)
                continue
            if isinstance(it, type(self)) and it.dtype.is_float:
                raise TensorIndexError(f"index tensors must be int or bool, got {it.dtype}")
            norm.append(int(it) if isinstance(it, np.integer) else it)
        if sum(1 for it in norm if it is Ellipsis) > 1:
            raise TensorIndexError("an index can only have a single ellipsis")
        consumed = sum(1 for it in norm if it is not None and it is not Ellipsis)
        if consumed > self.ndim:
            raise TensorIndexError(f"too many indices for a tensor of {self.ndim} dims (shape {self.shape}): "
                             f"{consumed} given")
        if any(it is Ellipsis for it in norm):
            i = next(j for j, it in enumerate(norm) if it is Ellipsis)
            norm[i:i + 1] = [slice(None)] * (self.ndim - consumed)
        else:
            norm += [slice(None)] * (self.ndim - consumed)

        plan = _IndexPlan(host_checked=host_checked)
        dim = 0
        has_adv = any(isinstance(it, type(self)) for it in norm)
        adv_items: list[int] = []
        out_dims_before_first_adv = 0
        for pos, it in enumerate(norm):
            if it is None:
                plan.out_shape.append(1)
                if not adv_items:
                    out_dims_before_first_adv += 1
                continue
            size = self.shape[dim]
            if isinstance(it, bool) or not isinstance(it, (int, slice, type(self), UOp)):
                raise TensorIndexError(f"unsupported index {it!r} of type {type(it).__name__}")
            symbolic = _symbolic_window(it, size, dim)
            if symbolic is not None:
                # a window that moves with a bound Variable (x[v], x[v:v+n]) is a shrink with a
                # symbolic offset: kernels take the Variable as an argument, so one capture serves all
                n_sym = shrink_size(*symbolic)
                plan.shrink.append(symbolic)
                plan.flip.append(False)
                plan.step.append((1, n_sym))
                if isinstance(it, slice):
                    plan.out_shape.append(n_sym)
                    if not adv_items:
                        out_dims_before_first_adv += 1
                elif has_adv:
                    adv_items.append(pos)
            elif isinstance(it, int):
                if not -size <= it < size:
                    raise TensorIndexError(f"index {it} is out of bounds for dimension {dim} with size "
                                           f"{size}")
                i = it % size
                plan.shrink.append((i, i + 1))
                plan.flip.append(False)
                plan.step.append((1, 1))
                if has_adv:
                    adv_items.append(pos)
            elif isinstance(it, slice):
                start, stop, step = it.indices(size)
                n = len(range(start, stop, step))
                if n == 0:
                    plan.shrink.append((0, 0))
                    plan.flip.append(False)
                elif step > 0:
                    plan.shrink.append((start, start + (n - 1) * step + 1))
                    plan.flip.append(False)
                else:
                    plan.shrink.append((start + (n - 1) * step, start + 1))
                    plan.flip.append(True)
                plan.step.append((abs(step), n))
                plan.out_shape.append(n)
                if not adv_items:
                    out_dims_before_first_adv += 1
            else:
                assert isinstance(it, type(self))  # a UOp index is a symbolic window, handled above
                plan.shrink.append((0, size))
                plan.flip.append(False)
                plan.step.append((1, size))
                plan.advanced.append((len(plan.out_shape), it))
                plan.out_shape.append(size)
                adv_items.append(pos)
            dim += 1
        if plan.advanced:
            adjacent = adv_items == list(range(adv_items[0], adv_items[0] + len(adv_items)))
            plan.adv_pos = out_dims_before_first_adv if adjacent else None
        return plan, self

    def _index_item_dims(self: Tensor, items: list[Any]) -> list[int | None]:
        """The first source dimension each index item applies to (None for None/Ellipsis), so host-known
        indices and bool masks can be checked against the dimension they index."""
        def width(it: Any) -> int:
            if it is None or it is Ellipsis:
                return 0
            if isinstance(it, (type(self), np.ndarray)) and it.dtype in (np.bool_, dtypes.bool):
                return it.ndim
            if isinstance(it, list) and it and np.asarray(it).dtype == np.bool_:
                return np.asarray(it).ndim
            return 1
        widths = [width(it) for it in items]
        ellipsis_extra = max(self.ndim - sum(widths), 0)
        out: list[int | None] = []
        dim = 0
        for it, w in zip(items, widths):
            if it is Ellipsis:
                dim += ellipsis_extra
            out.append(None if it is None or it is Ellipsis else dim)
            dim += w
        return out

    def _apply_basic(self: Tensor, plan: _IndexPlan) -> Tensor:
        x = self.shrink(plan.shrink).flip(tuple(i for i, f in enumerate(plan.flip) if f))
        for axis, (step, n) in enumerate(plan.step):
            x = x._take_every(axis, step, n)
        return x.reshape(tuple(plan.out_shape))

    def _take_every(self: Tensor, axis: int, step: int, n: int) -> Tensor:
        """Elements 0, step, 2*step, ... (n of them) along axis, from movement ops only."""
        if step == 1 or n == 0:
            return self
        pre, post = self.shape[:axis], self.shape[axis + 1:]
        pads = [(0, 0)] * self.ndim
        pads[axis] = (0, n * step - self.shape[axis])
        x = self.pad(pads).reshape(pre + (n, step) + post)
        return x.shrink([None] * axis + [None, (0, 1)] + [None] * len(post)).reshape(pre + (n,) + post)

    def _spread_every(self: Tensor, axis: int, step: int, n: int) -> Tensor:
        """The inverse of _take_every: put element i at i*step, zeros in between."""
        if step == 1 or n == 0:
            return self
        pre, post = self.shape[:axis], self.shape[axis + 1:]
        x = self.reshape(pre + (n, 1) + post)
        x = x.pad([(0, 0)] * (axis + 1) + [(0, step - 1)] + [(0, 0)] * len(post))
        x = x.reshape(pre + (n * step,) + post)
        return x.shrink([None] * axis + [(0, (n - 1) * step + 1)] + [None] * len(post))

    def __getitem__(self: Tensor, indices: Any) -> Tensor:
        plan, _ = self._index_plan(indices)
        y = self._apply_basic(plan)
        if not plan.advanced:
            return y
        return y._gather_advanced(plan)

    def _gather_advanced(self: Tensor, plan: _IndexPlan) -> Tensor:
        """Numpy advanced indexing: one integer index on the first axis is a row gather (a load at the
        indexed address); anything else is a one-hot compare + masked sum (one reduce kernel)."""
        adv_axes = [a for a, _ in plan.advanced]
        idx = [t for _, t in plan.advanced]
        for a, t in zip(adv_axes, idx):
            if id(t) not in plan.host_checked:
                _defer_index_check(t, self.shape[a], "tensor index")
        if adv_axes == [0] and idx[0].dtype.is_int:
            return self._take_rows(idx[0])
        bshape = _broadcast_shapes(*[t.shape for t in idx]) if len(idx) > 1 else idx[0].shape
        rest = [a for a in range(self.ndim) if a not in adv_axes]
        nb, k = len(bshape), len(adv_axes)
        rshape = tuple(self.shape[a] for a in rest)
        nshape = tuple(self.shape[a] for a in adv_axes)
        y = self.permute(rest + adv_axes).reshape(rshape + (1,) * nb + nshape)
        mask: Tensor | None = None
        for j, (a, t) in enumerate(zip(adv_axes, idx)):
            n = self.shape[a]
            t = (t < 0).where(t + n, t)._broadcast_to(bshape)
            pos = type(self).arange(n, device=self.device)
            pos = pos.reshape((1,) * (nb + j) + (n,) + (1,) * (k - j - 1))
            m = t.reshape(bshape + (1,) * k) == pos
            mask = m if mask is None else mask & m
        assert mask is not None
        red = tuple(range(len(rshape) + nb, len(rshape) + nb + k))
        out = _masked_sum(mask.reshape((1,) * len(rshape) + mask.shape), y, red)
        # out is (rest..., broadcast...): numpy puts the broadcast dims at the first advanced index when
        # the advanced indices are adjacent, in front otherwise
        nr = len(rshape)
        p = 0 if plan.adv_pos is None else plan.adv_pos
        order = list(range(p)) + list(range(nr, nr + nb)) + list(range(p, nr))
        return out.permute(order)

    def __setitem__(self: Tensor, indices: Any, value: Any) -> None:
        """Write value into the indexed elements (realizes; a view of another tensor is copied first,
        so the write does not reach the tensor it was viewed from)."""
        if not is_realized(self.uop):
            self.realize()
        plan, _ = self._index_plan(indices)
        target = tuple(plan.out_shape) if not plan.advanced else self[indices].shape
        v = self._as_tensor(value).cast(self.dtype)
        try:
            v = v._broadcast_to(_broadcast_shapes(target, v.shape))
        except ValueError:
            raise ShapeError(f"cannot broadcast value of shape {v.shape} to indexed shape {target}") from None
        if v.shape != target:
            raise ShapeError(f"cannot broadcast value of shape {v.shape} to indexed shape {target}")
        if not plan.advanced:
            new = self._unindex_mask(plan, v)
        else:
            new = self._scatter_advanced(indices, v)
            check_pending_indices()  # an out-of-range device index must fail before anything is written
        self.assign(new).realize()

    def _unindex_mask(self: Tensor, plan: _IndexPlan, v: Tensor) -> Tensor:
        """Run the basic index backwards on v and on an all-true mask, then select."""
        per_dim = tuple(n for _, n in plan.step)
        mask = v._const(True, dtypes.bool, per_dim)
        vals = v.reshape(per_dim)
        for axis, (step, n) in enumerate(plan.step):
            vals, mask = vals._spread_every(axis, step, n), mask._spread_every(axis, step, n)
        flips = tuple(i for i, f in enumerate(plan.flip) if f)
        vals, mask = vals.flip(flips), mask.flip(flips)
        pads = [(b, s - e) for (b, e), s in zip(plan.shrink, self.shape)]
        return mask.pad(pads).where(vals.pad(pads), self)

    def _scatter_advanced(self: Tensor, indices: Any, v: Tensor) -> Tensor:
        """Advanced-index writes: find each element's flat position through the same index, then a
        one-hot compare against every position (numel x selected work). With repeated indices it is
        undefined which value lands, as in torch."""
        n = int(self.numel())
        flat_pos = type(self).arange(n, device=self.device).reshape(self.shape)[indices].flatten()
        m = flat_pos.shape[0]
        hit = flat_pos.reshape(1, m) == type(self).arange(n, device=self.device).reshape(n, 1)
        vals = _masked_sum(hit, v.flatten().reshape(1, m).expand(n, m), (1,))
        return hit.any(1).reshape(self.shape).where(vals.reshape(self.shape), self)

    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[i][j] = self[index[i][j]][j] for dim=0 (torch.gather)."""
        d = self._axis(dim)
        if index.ndim != self.ndim:
            raise ShapeError(f"gather: index has {index.ndim} dims, input {self.shape} has {self.ndim}")
        for i, (a, b) in enumerate(zip(index.shape, self.shape)):
            if i != d and a > b:
                raise ShapeError(f"gather: index shape {index.shape} exceeds input {self.shape} at dim {i}")
        n = self.shape[d]
        _defer_index_check(index, n, "gather")
        x = self.shrink([None if i == d else (0, s) for i, s in enumerate(index.shape)]).transpose(d, -1)
        it = index.transpose(d, -1)
        it = (it < 0).where(it + n, it)
        hit = it.unsqueeze(-1) == type(self).arange(n, device=self.device)
        return _masked_sum(hit, x.unsqueeze(-2)._broadcast_to(hit.shape), (hit.ndim - 1,)).transpose(d, -1)

    def one_hot(self: Tensor, num_classes: int) -> Tensor:
        if not self.dtype.is_int:
            raise ArgumentTypeError(f"one_hot needs an int tensor, got {self.dtype}")
        return (self.unsqueeze(-1) == type(self).arange(num_classes, device=self.device)).cast(dtypes.int64)

    def embedding(self: Tensor, weight: Tensor) -> Tensor:
        """`indices.embedding(weight)` = weight[indices] (torch.nn.functional.embedding(indices, weight))."""
        if weight.ndim != 2:
            raise ShapeError(f"embedding weight must be 2-d (num, dim), got shape {weight.shape}")
        if not self.dtype.is_int:
            raise ArgumentTypeError(f"embedding indices must be integers, got {self.dtype}")
        _defer_index_check(self, weight.shape[0], "embedding")
        return weight._take_rows(self)

    def _take_rows(self: Tensor, indices: Tensor) -> Tensor:
        """self[indices] along the first axis, numpy's wrap for negative indices; each output element is
        one load from the row the index names (Ops.GATHER). Rows outside the table read as 0."""
        n, rest = self.shape[0], self.shape[1:]
        indices = (indices < 0).where(indices + n, indices)
        table = self.reshape(n, _prod(rest))
        out = self._new(UOp(Ops.GATHER, self.dtype, (table.uop, indices.uop)))
        return out.reshape(*indices.shape, *rest)

    @classmethod
    def _gather_grad(cls: type[Tensor], n: UOp, g: UOp) -> tuple[UOp | None, ...]:
        """autograd's rule for GATHER (registered by tensor.py): d(table[rows])/d(table) is a scatter-add
        of the output gradient into the picked rows, written as a one-hot (N, V) matrix contracted with
        the (N, D) gradient (the same kernel a matmul is); the integer rows get none."""
        table, rows = n.src
        v, d = table.shape
        assert g.dtype is not None
        flat_rows = cls(rows).reshape(-1, 1)
        onehot = (flat_rows == cls.arange(v, device=n.device).reshape(1, v)).cast(g.dtype)
        grad_rows = cls(g).reshape(-1, d)
        return (onehot.transpose(0, 1) @ grad_rows).uop, None


# ---------------------------------------------------------------------- module-level helpers
def _masked_sum(mask: Tensor, vals: Tensor, axes: tuple[int, ...]) -> Tensor:
    """Sum of vals where mask holds (exactly one hit per output in the callers): a where, not a multiply,
    so that NaN/inf elsewhere cannot leak in; bools use any."""
    if vals.dtype.is_bool:
        return (mask & vals).any(axes)
    return mask.where(vals, 0).sum(axes, dtype=vals.dtype)


def embedding(indices: Tensor, weight: Tensor) -> Tensor:
    """torch.nn.functional.embedding: rows of weight picked by integer indices."""
    return indices.embedding(weight)
