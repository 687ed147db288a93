"""The Tensor: a lazy handle on one tensor-graph UOp, with the PyTorch/tinygrad API on top.

Every op builds new UOps out of the primitive set in `rawgrad.compiler.ir` (ALU, movement, REDUCE_AXIS,
CAST/BITCAST, CONTIGUOUS, ASSIGN, COPY); nothing runs until `realize()`/`numpy()`. The Tensor is where
broadcasting and dtype promotion happen, so every ALU node it builds already has sources of one shape
and (except WHERE's condition and shift amounts) one dtype.

Gradients are derived from the UOp graph itself (every op below is built from a small primitive set with
known derivatives; see `rawgrad.tensor.autograd`), so ops record nothing: `backward()` and `gradient()`
walk the graph back to the tensors that have `requires_grad`.
"""
from __future__ import annotations

import itertools
import math
import string
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, overload

import numpy as np

from rawgrad.compiler.ir import Ops, UOp, shrink_size
from rawgrad.compiler.symbolic import sym_infer
from rawgrad.dtype import (
    DType,
    DTypeLike,
    bf16_bits_to_f32,
    dtypes,
    f32_to_bf16_bits,
    least_upper_float,
    promote_types,
    result_type_with_scalar,
    to_dtype,
)
from rawgrad.errors import ArgumentError, ArgumentTypeError, ShapeError, TensorIndexError
from rawgrad.hcq.device import Device  # noqa: E402
from rawgrad.tensor import autograd as _autograd
from rawgrad.tensor import realize as _realize
from rawgrad.tensor.buffers import buffer_from_numpy, buffer_numpy, is_allocated, new_buffer, writable_view
from rawgrad.tensor.ops_math import MathOps, ValuesIndices
from rawgrad.tensor.ops_nn import NNOps

_default_device: str | None = None


def default_device() -> str:
    """DEV from the environment, else the best device the registry detects; resolved on first use (not at
    import: importing rawgrad probes no driver, and a bad DEV is reported where a tensor is first made)."""
    global _default_device
    if _default_device is None:
        _default_device = Device.DEFAULT
    return _default_device


def __getattr__(name: str) -> Any:
    # `DEFAULT_DEVICE` stays importable, resolved lazily (PEP 562)
    if name == "DEFAULT_DEVICE":
        return default_device()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

Scalar = int | float | bool
TensorLike = "Tensor | Scalar | list | tuple | np.ndarray"
Axis = int | Sequence[int] | None

_LOG2_E = 1.0 / math.log(2.0)
_LN_2 = math.log(2.0)
_HALF_TYPES = (dtypes.float16, dtypes.bfloat16)
# Threefry-2x32 rotation constants and key-schedule parity (Salmon et al., "Parallel random numbers: as
# easy as 1, 2, 3", SC'11, the Random123 reference for threefry2x32 with 20 rounds).
_THREEFRY_ROT = (13, 15, 26, 6, 17, 29, 16, 24)
_THREEFRY_PARITY = 0x1BD11BDA

# tensors whose uop is an unrealized ASSIGN, by id (a WeakSet would compare Tensors with their
# elementwise __eq__)
_pending_assigns: dict[int, weakref.ref[Tensor]] = {}
_executed_assigns: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# pending assigns into a view of a buffer, by id, with their creation order, held strongly:
# `x[:, p:p+1].assign(row)` usually drops the view's Tensor at once, and the write must still reach x
# before x is next read
_pending_view_assigns: dict[int, tuple[int, Tensor]] = {}
_view_assign_order = itertools.count()


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


def pending_view_assigns() -> list[Tensor]:
    """Every assign into a view not yet run, in the order made (TinyJit runs them at the end of a call,
    so a write into state that the function does not read back still lands in that call)."""
    return [t for _, t in sorted(_pending_view_assigns.values(), key=lambda e: e[0])]


def _view_assigns_read_by(tensors: Sequence[Tensor]) -> list[Tensor]:
    """The pending assigns into views (x[:, p:p+1].assign(row)) whose buffer these tensors read, or that
    such an assign's own value reads, in the order they were made.

    Such an assign is held by the view's Tensor, which nothing else in the graph refers to, so without
    this `x.numpy()` would read x before the write (a pending assign into a whole buffer instead replaces
    that tensor's graph, and its readers see it through the ASSIGN node). They are scheduled ahead of
    the tensors in the same realize, so the work they share is done once and every read of the buffer
    comes after the write. When a view assign is itself realized, only the ones made before it count:
    later writes did not exist when its value was built."""
    own = [_pending_view_assigns[id(t)][0] for t in tensors if id(t) in _pending_view_assigns]
    limit = min(own) if own else math.inf
    earlier = sorted((e for e in _pending_view_assigns.values() if e[0] < limit), key=lambda e: e[0])
    if not earlier:
        return []
    nodes: set[UOp] = set()
    for t in tensors:
        nodes.update(t.uop.toposort())
    chosen: dict[int, tuple[int, Tensor]] = {}
    grew = True
    while grew:  # a chosen write's value may read another buffer with an earlier pending write
        grew = False
        for seq, p in earlier:
            if id(p) in chosen or p.uop.op is not Ops.ASSIGN or p.uop in nodes:
                continue  # an assign inside these graphs already runs there, in graph order
            view = writable_view(p.uop.src[0])
            if view is not None and view[0] in nodes:
                chosen[id(p)] = (seq, p)
                nodes.update(p.uop.toposort())
                grew = True
    return [p for _, p in sorted(chosen.values(), key=lambda e: e[0])]


# ---------------------------------------------------------------------- small helpers
def _canon_device(device: str | None) -> str:
    return default_device() if device is None else Device.canonicalize(str(device))


def _prod(xs: Sequence[Any]) -> Any:
    out: Any = 1
    for x in xs:
        out = out * x
    return out


MAX_NUMEL = 2 ** 63 - 1  # element indices are int64 in every kernel


def _dim(s: Any, what: str, allow_minus_one: bool = False) -> Any:
    """One size the user passed: an int >= 0 (or -1 where it means "infer"/"keep") or a symbolic size.
    Checked where the user passes it, so a float or a negative size fails here with its name, not later
    inside the scheduler or the allocator."""
    if isinstance(s, UOp):
        return s
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
        raise ArgumentTypeError(f"{what}: sizes must be integers, got {s!r} ({type(s).__name__})")
    s = int(s)
    if s < 0 and not (allow_minus_one and s == -1):
        raise ArgumentError(f"{what}: negative size {s}")
    return s


def _check_numel(shape: tuple[Any, ...], what: str) -> None:
    n = 1
    for d in shape:
        if isinstance(d, int):
            n *= d
    if n > MAX_NUMEL:
        raise ShapeError(f"{what}: shape {shape} has {n} elements, more than an int64 index addresses")


def _shape_arg(shape: tuple[Any, ...], what: str = "shape") -> tuple[int, ...]:
    """Accept f(2, 3) and f((2, 3)) alike, as torch and tinygrad do."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = tuple(_dim(s, f"{what} {tuple(shape)}") for s in shape)
    _check_numel(out, what)
    return out


def _broadcast_shapes(*shapes: tuple[Any, ...]) -> tuple[Any, ...]:
    nd = max(len(s) for s in shapes)
    padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if not (isinstance(d, int) and d == 1)}
        if len(sizes) > 1:
            raise ShapeError(f"cannot broadcast {tuple(shapes[0])} with {tuple(shapes[1])}"
                             if len(shapes) == 2 else f"cannot broadcast shapes {[tuple(s) for s in shapes]}")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _to_tuple(x: int | Sequence[int], n: int, what: str, positive: bool = False) -> tuple[int, ...]:
    t = (x,) * n if isinstance(x, (int, np.integer)) else tuple(x)
    if len(t) != n:
        raise ArgumentError(f"{what} needs 1 or {n} values, got {t}")
    for v in t:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ArgumentTypeError(f"{what} must be integers, got {x!r}")
        if positive and v < 1:
            raise ArgumentError(f"{what} must be >= 1, got {x!r}")
    return tuple(int(v) for v in t)


def _np_to_host(arr: np.ndarray, dt: DType) -> np.ndarray:
    """Convert numpy data to dt's host layout (bfloat16 as bits; casts follow CAST's rules)."""
    if dt == dtypes.bfloat16:
        return f32_to_bf16_bits(np.asarray(arr, dtype=np.float32)).reshape(np.shape(arr))
    if dt.is_bool:
        return np.asarray(arr) != 0
    with np.errstate(all="ignore"):
        return np.asarray(arr).astype(dt.np)


def _scalar(x: Any) -> Any:
    """numpy scalars behave like Python scalars in promotion."""
    return x.item() if isinstance(x, np.generic) else x


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (int, float, bool, np.generic))


def _with_grad(t: Tensor, requires_grad: bool | None) -> Tensor:
    """A factory's result: requires_grad as asked, or an implicit leaf (tinygrad's None) by default."""
    if requires_grad is not None:
        t.requires_grad = requires_grad
    else:
        _autograd.register_implicit_leaf(t)
    return t


def _random_leaf(t: Tensor, requires_grad: bool | None) -> Tensor:
    """A random factory's result. Asked to require gradients it is realized now, so it is a leaf holding
    fixed values (as in torch) and not a generator graph that later uses would differentiate through."""
    if requires_grad:
        t = t.realize()
    return _with_grad(t, requires_grad)


def _check_int_fits(v: Any, dt: DType) -> None:
    """A Python int that an integer dtype cannot hold is refused (as numpy 2 does), never truncated."""
    if isinstance(v, int) and not isinstance(v, bool) and dt.is_int and not dt.min <= v <= dt.max:
        raise OverflowError(f"Python integer {v} is out of range for {dt} ({dt.min}..{dt.max})")


_NO_ARG: Any = object()  # "argument not given", where None is a meaningful value
REPR_MAX_ELEMENTS = 1000  # print abbreviates past this many elements (torch's default threshold)
REPR_EDGE_ITEMS = 3  # elements shown at each end of an abbreviated axis (torch's default)


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
# Indices known on the host (ints, lists, numpy arrays) are checked when the index is built. Indices that
# live on the device (an index Tensor) would need a sync to check, so each such use records a lazy
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
    for group in by_device.values():
        values = Tensor.stack(*[t for t, _ in group]).numpy() if len(group) > 1 else [group[0][0].numpy()]
        for (_, message), v in zip(group, values):
            if bool(v):
                raise TensorIndexError(message)


def _check_host_index(data: np.ndarray, size: int, dim: int) -> None:
    if data.size and (int(data.min()) < -size or int(data.max()) >= size):
        bad = int(data.max()) if int(data.max()) >= size else int(data.min())
        raise TensorIndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


class Tensor(MathOps, NNOps):
    """A lazily evaluated n-dimensional array on a device (more methods in ops_math.py and ops_nn.py)."""

    training: ClassVar[bool] = False  # dropout and batch statistics; `with Tensor.train():`
    no_grad: ClassVar[bool] = False  # `with rawgrad.no_grad():` refuses backward and keeps no graph history
    _seed: ClassVar[int] = 0
    _rng_counter: ClassVar[int] = 0
    __hash__ = object.__hash__  # __eq__ is elementwise, identity stays the hash

    def __init__(self, data: Any, device: str | None = None, dtype: DTypeLike | None = None,
                 requires_grad: bool | None = None):
        dt = to_dtype(dtype) if dtype is not None else None
        dev = _canon_device(device)
        data_leaf = False
        if isinstance(data, UOp) and data.shape == () and data.device == "?":
            # a symbolic size (a bound Variable, or an expression of one: `x.sum(0) / n`) used as a value:
            # anchor it on the device with a 0 constant, the kernel then reads the Variable as an argument
            sdt: DType = dt or (data.dtype if data.dtype is not None and data.dtype != dtypes.index
                                else dtypes.int64)
            sym = data if data.dtype == sdt else UOp(Ops.CAST, sdt, (data,))
            uop = UOp(Ops.ADD, sdt, (UOp.const(sdt, 0, UOp(Ops.DEVICE, arg=dev)), sym))
        elif isinstance(data, UOp):
            uop = data
        elif isinstance(data, Tensor):
            uop = data.uop
            if device is None:
                dev = uop.device
        elif isinstance(data, (list, tuple)) and data and all(isinstance(x, Tensor) for x in data):
            uop = Tensor.stack(*data).uop
            dev = uop.device
        elif _is_scalar(data):
            v = _scalar(data)
            uop = UOp.const(dt or dtypes.from_py(v), v, UOp(Ops.DEVICE, arg=dev))
        else:
            try:
                arr = np.asarray(data)
            except ValueError:
                raise ArgumentTypeError(f"cannot make a Tensor from ragged {type(data).__name__} data") \
                    from None
            if arr.dtype == object:
                raise ArgumentTypeError(f"cannot make a Tensor from {type(data).__name__} "
                                        "(ragged or mixed data?)")
            if dt is None:
                if isinstance(data, np.ndarray):
                    dt = dtypes.from_np(arr.dtype)
                else:  # Python data: defaults as torch/tinygrad (bool, default int, default float)
                    dt = dtypes.bool if arr.dtype == np.bool_ else dtypes.default_int \
                        if arr.dtype.kind in "iu" else dtypes.default_float
            buf = buffer_from_numpy(_np_to_host(arr, dt), dt, dev)
            uop = UOp(Ops.RESHAPE, dt, (buf,), arr.shape)
            data_leaf = True
        if dt is not None and uop.dtype != dt:
            uop = UOp(Ops.CAST, dt, (uop,))
        if isinstance(data, (UOp, Tensor)) and device is not None and uop.device != dev:
            uop = UOp(Ops.COPY, uop.dtype, (uop,), dev)
        self.uop: UOp = uop
        self.grad: Tensor | None = None
        self.requires_grad = requires_grad
        if data_leaf and requires_grad is None:
            _autograd.register_implicit_leaf(self)

    # ------------------------------------------------------------------ properties
    @property
    def lazydata(self) -> UOp:
        return self.uop

    @lazydata.setter
    def lazydata(self, u: UOp) -> None:
        self.uop = u

    @property
    def shape(self) -> tuple[Any, ...]:
        return self.uop.shape

    @property
    def ndim(self) -> int:
        return len(self.uop.shape)

    @property
    def dtype(self) -> DType:
        assert self.uop.dtype is not None
        return self.uop.dtype

    @property
    def device(self) -> str:
        return self.uop.device

    def numel(self) -> Any:
        return _prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> Any:
        return self.numel() * self.element_size()

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[self._axis(dim)]

    @property
    def T(self) -> Tensor:
        return self.permute(*range(self.ndim - 1, -1, -1))

    def __repr__(self) -> str:
        """Values like torch's repr (this realizes the tensor; big ones are abbreviated), then dtype and
        device. Inside a TinyJit capture, or for a symbolic shape, only the shape is shown: reading values
        there would freeze them into the capture."""
        head = f"shape={self.shape}, dtype={self.dtype.name}, device={self.device}"
        if not all(isinstance(d, int) for d in self.shape):
            return f"<Tensor {head} (symbolic shape: not read)>"
        try:
            _realize.check_readback("repr")
        except RuntimeError:
            return f"<Tensor {head} (not read inside a TinyJit capture)>"
        with np.printoptions(threshold=REPR_MAX_ELEMENTS, edgeitems=REPR_EDGE_ITEMS, precision=4):
            body = np.array2string(self.numpy(), separator=", ", prefix="tensor(")
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}, dtype={self.dtype.name}, device={self.device}{grad})"

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """np.array(t) / np.asarray(t): the values (bfloat16 as float32), converted to `dtype` if given."""
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise ArgumentTypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        return (self[i] for i in range(len(self)))

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    # ------------------------------------------------------------------ internals
    def _new(self, u: UOp) -> Tensor:
        return Tensor(u)

    def _axis(self, a: int, extra: int = 0) -> int:
        """Normalise one axis; `extra` widens the range (unsqueeze can address one past the end)."""
        nd = self.ndim + extra
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise ArgumentTypeError(f"axis must be an int, got {a!r}")
        lim = max(nd, 1)  # a 0-d tensor accepts axis 0 / -1 like torch
        if not -lim <= a < lim:
            raise TensorIndexError(f"axis {a} is out of range for a tensor of {self.ndim} dims "
                             f"(shape {self.shape})")
        return int(a) % lim

    def _axes(self, axis: Axis) -> tuple[int, ...]:
        if axis is None:
            return tuple(range(self.ndim))
        if not isinstance(axis, (int, np.integer, tuple, list)):
            raise ArgumentTypeError(f"axis must be an int or a tuple of ints, got {axis!r}")
        axs = [self._axis(a) for a in ((axis,) if isinstance(axis, (int, np.integer)) else axis)]
        if len(set(axs)) != len(axs):
            raise ShapeError(f"axis {axis} repeats a dimension")
        return tuple(sorted(axs)) if self.ndim else ()

    def _const(self, value: Any, dtype: DType | None = None, shape: tuple[Any, ...] | None = None) -> Tensor:
        return Tensor._full(self.shape if shape is None else shape, value, dtype or self.dtype, self.device)

    @staticmethod
    def _full(shape: tuple[Any, ...], value: Any, dt: DType, device: str) -> Tensor:
        u = UOp.const(dt, value, UOp(Ops.DEVICE, arg=device))
        if len(shape):
            u = UOp(Ops.RESHAPE, dt, (u,), (1,) * len(shape))
            u = UOp(Ops.EXPAND, dt, (u,), tuple(shape))
        return Tensor(u)

    def _alu(self, op: Ops, *others: Tensor, dtype: DType | None = None) -> Tensor:
        out = dtype if dtype is not None else self.dtype
        return Tensor(UOp(op, out, (self.uop,) + tuple(o.uop for o in others)))

    def _broadcast_to(self, shape: tuple[Any, ...]) -> Tensor:
        if self.shape == tuple(shape):
            return self
        x = self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if self.ndim < len(shape) else self
        return x.expand(shape)

    def _as_tensor(self, x: Any) -> Tensor:
        return x if isinstance(x, Tensor) else Tensor(x, device=self.device)

    def _operands(self, other: Any, reverse: bool = False, dtype: DType | None = None) \
            -> tuple[Tensor, Tensor]:
        """Promote and broadcast self and other to one dtype and shape (other may be a Python scalar)."""
        if _is_scalar(other):
            v = _scalar(other)
            dt = dtype or result_type_with_scalar(self.dtype, v)
            _check_int_fits(v, dt)
            a = self.cast(dt)
            b = a._const(v)
        else:
            o = self._as_tensor(other)
            if o.device != self.device:
                raise ArgumentError(f"operands are on different devices: {self.device} and {o.device}")
            dt = dtype or promote_types(self.dtype, o.dtype)
            shape = _broadcast_shapes(self.shape, o.shape)
            a, b = self.cast(dt)._broadcast_to(shape), o.cast(dt)._broadcast_to(shape)
        return (b, a) if reverse else (a, b)

    def _binary(self, op: Ops, other: Any, reverse: bool = False, out: DType | None = None) -> Tensor:
        a, b = self._operands(other, reverse)
        return a._alu(op, b, dtype=out)

    def _float_fn(self, fn: Any) -> Tensor:
        """Run a float-only composite: ints become float32; half types compute in float32 and round back
        once, so e.g. exp(x) in float16 has float16's rounding error and not the sum of its steps'."""
        dt = least_upper_float(self.dtype)
        if dt in _HALF_TYPES:
            return fn(self.cast(dtypes.float32)).cast(dt)
        return fn(self.cast(dt))

    # ------------------------------------------------------------------ creation
    # Every factory takes dtype, device and requires_grad (torch's keywords); requires_grad=None is
    # tinygrad's "tracked if a loss depends on it".
    @staticmethod
    def empty(*shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        shp, dt = _shape_arg(shape), to_dtype(dtype)
        buf = new_buffer(_canon_device(device), int(_prod(shp)), dt)
        return _with_grad(Tensor(UOp(Ops.RESHAPE, dt, (buf,), shp)), requires_grad)

    @staticmethod
    def full(shape: Any, fill_value: Scalar, dtype: DTypeLike | None = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        shp = _shape_arg(shape if isinstance(shape, tuple) else (shape,))
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(_scalar(fill_value))
        _check_int_fits(_scalar(fill_value), dt)
        return _with_grad(Tensor._full(shp, _scalar(fill_value), dt, _canon_device(device)), requires_grad)

    @staticmethod
    def zeros(*shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        return Tensor.full(_shape_arg(shape), 0, to_dtype(dtype), device, requires_grad)

    @staticmethod
    def ones(*shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        return Tensor.full(_shape_arg(shape), 1, to_dtype(dtype), device, requires_grad)

    def full_like(self, fill_value: Scalar, dtype: DTypeLike | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return Tensor.full(self.shape, fill_value, dtype or self.dtype, device or self.device, requires_grad)

    def zeros_like(self, dtype: DTypeLike | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        return self.full_like(0, dtype, device, requires_grad)

    def ones_like(self, dtype: DTypeLike | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return self.full_like(1, dtype, device, requires_grad)

    def empty_like(self, dtype: DTypeLike | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        return Tensor.empty(self.shape, dtype=dtype or self.dtype, device=device or self.device,
                            requires_grad=requires_grad)

    @staticmethod
    def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1,
               dtype: DTypeLike | None = None, device: str | None = None,
               requires_grad: bool | None = None) -> Tensor:
        """Values start, start+step, ... below stop. The values are uploaded (an arange has no kernel of
        its own), so ops that compare against positions read them like any input."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ArgumentError("arange step must not be zero")
        all_int = all(isinstance(_scalar(v), int) for v in (start, stop, step))
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int if all_int else dtypes.default_float
        n = max(0, math.ceil((stop - start) / step))
        vals = np.add(start, np.multiply(np.arange(n, dtype=np.int64 if all_int else np.float64), step))
        return Tensor(vals, device=device, dtype=dt, requires_grad=requires_grad)

    @staticmethod
    def linspace(start: float, end: float, steps: int, dtype: DTypeLike | None = None,
                 device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        if steps < 0:
            raise ArgumentError(f"linspace needs steps >= 0, got {steps}")
        return Tensor(np.linspace(start, end, steps), device=device, dtype=dtype or dtypes.default_float,
                      requires_grad=requires_grad)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: DTypeLike | None = None, device: str | None = None,
            requires_grad: bool | None = None) -> Tensor:
        n = _dim(n, "eye(n)")
        m = n if m is None else _dim(m, "eye(m)")
        rows = Tensor.arange(n, device=device).reshape(n, 1)
        eye = (rows == Tensor.arange(m, device=device).reshape(1, m)).cast(to_dtype(dtype))
        return _with_grad(eye, requires_grad)

    # ------------------------------------------------------------------ random numbers
    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        """Reset the generator: the same seed replays the same sequence of random tensors."""
        Tensor._seed = int(seed)
        Tensor._rng_counter = 0
        Tensor._seedings += 1

    # Recorders of the key buffers _random_bits uploads, each a list of (key BUFFER node, counter value
    # used). TinyJit opens one around a capture: a replay runs no Python, so it has to know which
    # buffers hold the keys to write the next counters into them before it launches.
    _rng_recorders: ClassVar[list[list[tuple[UOp, int]]]] = []
    # How many times manual_seed ran: TinyJit refuses a capture that reseeds (its replays could not).
    _seedings: ClassVar[int] = 0

    @staticmethod
    def _rng_key(counter: int) -> np.ndarray:
        """The Threefry key for one _random_bits call: (folded seed, call counter) as two uint32 words."""
        seed = Tensor._seed
        return np.array([(seed ^ (seed >> 32)) & 0xFFFFFFFF, counter & 0xFFFFFFFF], np.uint32)

    @staticmethod
    def _random_bits(n: int, device: str) -> Tensor:
        """n uniformly random uint32 words: Threefry-2x32 (20 rounds) run with tensor ops on the device.

        Key = (seed, call counter), counter block = (position, 0). The key is uploaded as data rather
        than baked into the graph as constants, so every call shares one kernel (and a TinyJit replay
        can write the next key into the same buffer)."""
        u32 = dtypes.uint32
        counter = Tensor._rng_counter
        key = Tensor._rng_key(counter)
        Tensor._rng_counter += 1
        if n == 0:
            return Tensor.zeros(0, dtype=u32, device=device)
        half = (n + 1) // 2
        kt = Tensor(key, device=device)
        for rec in Tensor._rng_recorders:
            rec.append((kt.uop.base, counter))
        x0, x1 = threefry2x32(Tensor.arange(half, dtype=u32, device=device),
                              Tensor.zeros(half, dtype=u32, device=device),
                              kt[0:1].expand(half), kt[1:2].expand(half))
        bits = x0.cat(x1)
        return bits[:n] if 2 * half != n else bits

    @staticmethod
    def rand(*shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        """Uniform in [0, 1)."""
        shp, dt, dev = _shape_arg(shape), to_dtype(dtype), _canon_device(device)
        if not dt.is_float:
            raise ArgumentTypeError(f"rand needs a float dtype, got {dt}")
        # keep only as many random bits as dt's mantissa holds, so rounding can never reach 1.0
        mant = {dtypes.float16: 10, dtypes.bfloat16: 7}.get(dt, 23)
        bits = Tensor._random_bits(int(_prod(shp)), dev)
        one_to_two = ((bits >> (32 - mant)) << (23 - mant)) | 0x3F800000  # float32 in [1, 2)
        return _random_leaf((one_to_two.bitcast(dtypes.float32) - 1.0).cast(dt).reshape(shp), requires_grad)

    @staticmethod
    def randn(*shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        """Standard normal (Box-Muller on two uniforms)."""
        shp, dt = _shape_arg(shape), to_dtype(dtype)
        u = Tensor.rand(2, *shp, device=device)
        r = (1.0 - u[0]).log().mul(-2.0).sqrt()  # 1 - u is in (0, 1], so the log is finite
        return _random_leaf((r * (u[1] * (2 * math.pi)).cos()).cast(dt), requires_grad)

    @staticmethod
    def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, dtype: DTypeLike | None = None,
                device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        dt = to_dtype(dtype)
        return _random_leaf((Tensor.rand(*shape, device=device) * (high - low) + low).cast(dt),
                            requires_grad)

    @staticmethod
    def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, dtype: DTypeLike | None = None,
               device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        return _random_leaf((Tensor.randn(*shape, device=device) * std + mean).cast(to_dtype(dtype)),
                            requires_grad)

    @staticmethod
    def randint(*shape: Any, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32,
                device: str | None = None) -> Tensor:
        """Integers uniform in [low, high)."""
        if high <= low:
            raise ArgumentError(f"randint needs low < high, got [{low}, {high})")
        # float32 keeps every backend able to run it (no float64 on some GPUs); its 23 random bits are
        # plenty for the ranges randint is used with
        u = Tensor.rand(*shape, device=device)
        return (u * (high - low)).floor().cast(dtypes.int64).add(low).cast(to_dtype(dtype))

    def rand_like(self, dtype: DTypeLike | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return Tensor.rand(self.shape, dtype=dtype or self.dtype, device=device or self.device,
                           requires_grad=requires_grad)

    def randn_like(self, dtype: DTypeLike | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        return Tensor.randn(self.shape, dtype=dtype or self.dtype, device=device or self.device,
                            requires_grad=requires_grad)

    @staticmethod
    def scaled_uniform(*shape: Any, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        shp = _shape_arg(shape)
        return Tensor.uniform(*shp, low=-1.0, high=1.0, dtype=dtype, device=device) * \
            (_prod(shp) ** -0.5)

    @staticmethod
    def glorot_uniform(*shape: Any, dtype: DTypeLike | None = None, device: str | None = None) -> Tensor:
        shp = _shape_arg(shape)
        bound = (6 / (shp[0] + _prod(shp[1:]))) ** 0.5
        return Tensor.uniform(*shp, low=-bound, high=bound, dtype=dtype, device=device)

    @staticmethod
    def kaiming_uniform(*shape: Any, a: float = 0.01, dtype: DTypeLike | None = None,
                        device: str | None = None) -> Tensor:
        shp = _shape_arg(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(_prod(shp[1:]))
        return Tensor.uniform(*shp, low=-bound, high=bound, dtype=dtype, device=device)

    @staticmethod
    def kaiming_normal(*shape: Any, a: float = 0.01, dtype: DTypeLike | None = None,
                       device: str | None = None) -> Tensor:
        shp = _shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(_prod(shp[1:]))
        return Tensor.normal(*shp, mean=0.0, std=std, dtype=dtype, device=device)

    def dropout(self, p: float = 0.5) -> Tensor:
        """Zero elements with probability p and scale the rest by 1/(1-p); identity unless training."""
        if not Tensor.training or p == 0:
            return self
        if not 0 <= p <= 1:
            raise ArgumentError(f"dropout probability must be in [0, 1], got {p}")
        keep = Tensor.rand(self.shape, device=self.device) >= p
        return keep.where(self * (1.0 / (1.0 - p)) if p < 1 else self * 0, 0)

    # ------------------------------------------------------------------ realize and data
    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and `others`, scheduled together in one call; `Tensor.realize(a, b)`)."""
        from rawgrad.tensor.interpret import is_realized
        asked = (self, *others)
        if _pending_view_assigns:
            # the writes first (the schedule keeps order): those these tensors read, then the asked ones in
            # the order they were made, then the rest
            writes = sorted((t for t in asked if id(t) in _pending_view_assigns),
                            key=lambda t: _pending_view_assigns[id(t)][0])
            others = tuple(t for t in asked if id(t) not in _pending_view_assigns)
            asked = (*_view_assigns_read_by(asked), *writes, *others)
        tensors = [t for t in asked if not is_realized(t.uop)]
        if not tensors:
            return self
        # An ASSIGN that already ran must not run again when an older graph that contains it is
        # realized: it is replaced by its target, which now holds the data.
        nodes: set[UOp] = set()
        for t in tensors:
            topo = t.uop.toposort()
            if _executed_assigns and any(n in _executed_assigns for n in topo):
                t.uop = t.uop.substitute({n: _executed_assigns[n] for n in topo if n in _executed_assigns})
                topo = t.uop.toposort()
            nodes.update(topo)
        # a pending assign that feeds these graphs runs now, so its tensor is marked done now too
        chosen = {id(t) for t in tensors}
        for ref in list(_pending_assigns.values()):
            p = ref()
            if p is not None and p.uop in nodes and id(p) not in chosen:
                tensors.append(p)
                chosen.add(id(p))
        before = [t.uop for t in tensors]
        done = _realize.realize(*before)
        _autograd.remember_history(before, done)  # so backward() still works on a realized loss
        for t, u in zip(tensors, done):
            t.uop = u
            _pending_assigns.pop(id(t), None)
            _pending_view_assigns.pop(id(t), None)
        for n in nodes:
            if n.op is Ops.ASSIGN:
                _executed_assigns[n] = n.src[0]
        return self

    def numpy(self) -> np.ndarray:
        """The data as a numpy array (bfloat16 comes back as float32)."""
        _realize.check_readback("Tensor.numpy()")
        check_pending_indices()
        self.realize()
        base = self.uop.base
        # a symbolic dim reads as the value its bound Variable has (the buffer is sized for the maximum)
        shape = tuple(d if isinstance(d, int) else int(sym_infer(d, {})) for d in self.shape)
        data = buffer_numpy(base)[:_prod(shape)].reshape(shape)
        return bf16_bits_to_f32(data).reshape(shape) if self.dtype == dtypes.bfloat16 else data

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ShapeError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.numpy().reshape(-1)[0].item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def to(self, device: Any = None, dtype: DTypeLike | None = None) -> Tensor:
        """torch's forms: to(device), to(dtype), to(device, dtype), to(other_tensor)."""
        if isinstance(device, Tensor):
            device, dtype = device.device, device.dtype
        elif isinstance(device, DType):
            device, dtype = None, device
        x = self if dtype is None else self.cast(to_dtype(dtype))
        dev = _canon_device(device) if device is not None else self.device
        return x if dev == x.device else Tensor(UOp(Ops.COPY, x.dtype, (x.uop,), dev))

    def cpu(self) -> Tensor:
        return self.to("CPU")

    def detach(self) -> Tensor:
        """The same value with no gradient flowing back through it."""
        return Tensor(_autograd.detach_uop(self.uop), requires_grad=False)

    def contiguous(self) -> Tensor:
        return self._alu(Ops.CONTIGUOUS)

    def clone(self) -> Tensor:
        """A copy with its own buffer (a COPY to the same device always makes a new one)."""
        return Tensor(UOp(Ops.COPY, self.dtype, (self.uop,), self.device), requires_grad=self.requires_grad)

    def assign(self, x: Any) -> Tensor:
        """Write x (broadcast and cast to self) into this tensor's buffer when next realized. A
        shrink/reshape/permute/flip view of a realized tensor writes into that tensor's elements only
        (`cache[:, p:p+1].assign(row)`, p an int or a bound Variable); it runs no later than the next
        realize that reads the viewed tensor."""
        from rawgrad.tensor.interpret import is_realized
        v = self._as_tensor(x)
        if v.device != self.device:
            raise ArgumentError(f"assign from {v.device} into a tensor on {self.device}")
        if v.shape != self.shape:
            try:
                shape: tuple[Any, ...] | None = _broadcast_shapes(self.shape, v.shape)
            except ValueError:
                shape = None
            if shape != self.shape:
                raise ShapeError(f"cannot assign a value of shape {v.shape} to shape {self.shape}")
            v = v._broadcast_to(self.shape)
        if self.uop.op is Ops.ASSIGN:  # chain onto a pending assign: both run in one realize, in order
            target = self.uop.src[0]
        else:
            view = writable_view(self.uop)
            if not is_realized(self.uop) and (view is None or not is_allocated(view[0])):
                self.realize()
            # a shrink/reshape/permute/flip view of a realized buffer stays the target: the write lands
            # in that buffer's viewed elements only (x[:, p:p+1].assign(row))
            target = self.uop
        self.uop = UOp(Ops.ASSIGN, self.dtype, (target, v.cast(self.dtype).uop))
        key = id(self)
        _pending_assigns[key] = weakref.ref(self, lambda _r: _pending_assigns.pop(key, None))
        if not is_realized(target):
            _pending_view_assigns[key] = (next(_view_assign_order), self)
        return self

    # ------------------------------------------------------------------ autograd
    @property
    def requires_grad(self) -> bool | None:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool | None) -> None:
        _autograd.register_leaf(self, flag)  # backward() finds its leaves through this registry
        self._requires_grad = flag

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.requires_grad = requires_grad
        return self

    @staticmethod
    def train(mode: bool = True) -> _autograd.train:
        """`with Tensor.train():` (or as a decorator) turns on Tensor.training inside the block."""
        return _autograd.train(mode)

    def _grad_root(self, gradient: Tensor | None, what: str) -> tuple[UOp, UOp]:
        if Tensor.no_grad:
            raise RuntimeError(f"{what}() inside no_grad: gradients are switched off")
        if not self.dtype.is_float:
            raise ArgumentTypeError(f"{what}() needs a float tensor, got {self.dtype}")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"{what}() of a non-scalar tensor (shape {self.shape}) needs a gradient "
                                   "argument of the same shape")
            g = self._const(1.0)
        else:
            g = self._as_tensor(gradient).cast(self.dtype)
            if g.shape != self.shape:
                raise ShapeError(f"{what}(): gradient of shape {g.shape} does not match shape {self.shape}")
        return self.uop, g.uop

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Accumulate d(self)/d(leaf) into `.grad` of every tensor with requires_grad in self's graph."""
        root, g = self._grad_root(gradient, "backward")
        root = _autograd.with_history(root, _autograd.leaf_nodes())
        nodes = set(root.toposort())
        # the tensors with requires_grad=True; if the graph has none, the tensors the user made without
        # saying (None: tinygrad's "tracked if used"). Marking any leaf gives torch's rule: only marked
        # leaves get a .grad. An explicit requires_grad=False never gets one.
        leaves = _autograd.leaves_in(nodes) or _autograd.implicit_leaves_in(nodes)
        if not leaves:
            raise RuntimeError("backward(): no tensor in this graph has requires_grad=True (a tensor "
                               "realized under no_grad keeps no graph to walk back through)")
        grads = _autograd.compute_gradients(root, g, list({t.uop: None for t in leaves}))
        for t in leaves:
            gt = Tensor(grads[t.uop])
            t.grad = gt if t.grad is None else t.grad + gt
        return self

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """d(self)/d(target) for each target, without touching any `.grad` (tinygrad's API)."""
        root, g = self._grad_root(gradient, "gradient")
        root = _autograd.with_history(root, {t.uop for t in targets})
        grads = _autograd.compute_gradients(root, g, [t.uop for t in targets])
        for i, t in enumerate(targets):
            if t.uop not in grads:
                raise ArgumentError(f"gradient(): target {i} (shape {t.shape}) is not in the graph of "
                                 "this tensor")
        return [Tensor(grads[t.uop]) for t in targets]

    # ------------------------------------------------------------------ dtypes
    def cast(self, dtype: DTypeLike) -> Tensor:
        dt = to_dtype(dtype)
        return self if dt == self.dtype else self._alu(Ops.CAST, dtype=dt)

    def bitcast(self, dtype: DTypeLike) -> Tensor:
        dt = to_dtype(dtype)
        if dt.itemsize != self.dtype.itemsize:
            raise ArgumentTypeError(f"bitcast from {self.dtype} ({self.dtype.itemsize} bytes) to {dt} "
                            f"({dt.itemsize} bytes): item sizes must match")
        return self if dt == self.dtype else self._alu(Ops.BITCAST, dtype=dt)

    def is_floating_point(self) -> bool:
        return self.dtype.is_float

    # ------------------------------------------------------------------ arithmetic
    def add(self, x: Any, alpha: Scalar = 1) -> Tensor:
        return self._binary(Ops.ADD, x if alpha == 1 else x * alpha)

    def sub(self, x: Any, alpha: Scalar = 1) -> Tensor:
        return self._binary(Ops.SUB, x if alpha == 1 else x * alpha)

    def mul(self, x: Any) -> Tensor:
        return self._binary(Ops.MUL, x)

    def div(self, x: Any, rounding_mode: str | None = None, reverse: bool = False) -> Tensor:
        """True division (ints give float32); rounding_mode 'trunc' or 'floor' as torch."""
        a, b = self._operands(x, reverse)
        if rounding_mode == "floor":
            return a._floordiv(b)
        if rounding_mode == "trunc":
            return a._alu(Ops.IDIV, b) if a.dtype.is_int else (a / b).trunc()
        if rounding_mode is not None:
            raise ArgumentError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        if not a.dtype.is_float:
            dt = least_upper_float(a.dtype)
            a, b = a.cast(dt), b.cast(dt)
        return a._alu(Ops.FDIV, b)

    def _floordiv(self, b: Tensor) -> Tensor:
        if self.dtype.is_float:
            return (self / b).floor()
        if self.dtype.is_bool:
            raise ArgumentTypeError("floor division is not defined for bool tensors")
        q, r = self._alu(Ops.IDIV, b), self._alu(Ops.MOD, b)
        # C truncates toward zero; floor differs by one when the remainder and divisor differ in sign
        fix = (r != 0) & ((r < 0) != (b < 0))
        return fix.where(q - 1, q)

    def floor_divide(self, x: Any) -> Tensor:
        a, b = self._operands(x)
        return a._floordiv(b)

    def remainder(self, x: Any, reverse: bool = False) -> Tensor:
        """Python/torch modulo: the result takes the divisor's sign."""
        a, b = self._operands(x, reverse)
        if a.dtype.is_float:
            return a - (a / b).floor() * b
        if a.dtype.is_bool:
            raise ArgumentTypeError("% is not defined for bool tensors")
        r = a._alu(Ops.MOD, b)
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def mod(self, x: Any) -> Tensor:
        return self.remainder(x)

    def fmod(self, x: Any) -> Tensor:
        """C remainder: the result takes the dividend's sign."""
        a, b = self._operands(x)
        if a.dtype.is_float:
            return a - (a / b).trunc() * b
        return a._alu(Ops.MOD, b)

    def pow(self, x: Any, reverse: bool = False) -> Tensor:
        if not reverse and _is_scalar(x) and not isinstance(_scalar(x), bool):
            e = _scalar(x)
            if e == 2:
                return self * self
            if e == 1 and isinstance(e, int):
                return self
        if not reverse and _is_scalar(x) and isinstance(_scalar(x), int) and self.dtype.is_bool:
            return self.cast(dtypes.int32).pow(x)
        if not reverse and _is_scalar(x) and isinstance(_scalar(x), int) and _scalar(x) < 0 \
                and (self.dtype.is_int or self.dtype.is_bool):
            # numpy and torch refuse this too: the answer (1/a**n truncated) is 0 for almost every a
            raise ArgumentError(f"integers to negative integer powers are not allowed ({self.dtype} ** "
                             f"{_scalar(x)}); cast to a float dtype first")
        return self._binary(Ops.POW, x, reverse)

    def neg(self) -> Tensor:
        if self.dtype.is_bool:
            raise ArgumentTypeError("negation is not defined for bool tensors; use ~ or logical_not")
        return self._alu(Ops.NEG)

    def __add__(self, x: Any) -> Tensor:
        return self.add(x)

    def __radd__(self, x: Any) -> Tensor:
        return self._binary(Ops.ADD, x, reverse=True)

    def __sub__(self, x: Any) -> Tensor:
        return self.sub(x)

    def __rsub__(self, x: Any) -> Tensor:
        return self._binary(Ops.SUB, x, reverse=True)

    def __mul__(self, x: Any) -> Tensor:
        return self.mul(x)

    def __rmul__(self, x: Any) -> Tensor:
        return self._binary(Ops.MUL, x, reverse=True)

    def __truediv__(self, x: Any) -> Tensor:
        return self.div(x)

    def __rtruediv__(self, x: Any) -> Tensor:
        return self.div(x, reverse=True)

    def __floordiv__(self, x: Any) -> Tensor:
        return self.floor_divide(x)

    def __rfloordiv__(self, x: Any) -> Tensor:
        a, b = self._operands(x, reverse=True)
        return a._floordiv(b)

    def __mod__(self, x: Any) -> Tensor:
        return self.remainder(x)

    def __rmod__(self, x: Any) -> Tensor:
        return self.remainder(x, reverse=True)

    def __pow__(self, x: Any) -> Tensor:
        return self.pow(x)

    def __rpow__(self, x: Any) -> Tensor:
        return self.pow(x, reverse=True)

    def __neg__(self) -> Tensor:
        return self.neg()

    def __abs__(self) -> Tensor:
        return self.abs()

    def __matmul__(self, x: Tensor) -> Tensor:
        return self.matmul(x)

    def __rmatmul__(self, x: Any) -> Tensor:
        return self._as_tensor(x).matmul(self)

    # ------------------------------------------------------------------ comparisons and logic
    def _compare(self, op: Ops, x: Any, reverse: bool = False) -> Tensor:
        return self._binary(op, x, reverse, out=dtypes.bool)

    def __lt__(self, x: Any) -> Tensor:
        return self._compare(Ops.CMPLT, x)

    def __gt__(self, x: Any) -> Tensor:
        return self._compare(Ops.CMPLT, x, reverse=True)

    def __le__(self, x: Any) -> Tensor:
        a, b = self._operands(x)
        # not (b < a) would be True for NaN, so floats need the explicit equality
        return a._alu(Ops.CMPLT, b, dtype=dtypes.bool) | a._alu(Ops.CMPEQ, b, dtype=dtypes.bool) \
            if a.dtype.is_float else b._alu(Ops.CMPLT, a, dtype=dtypes.bool).logical_not()

    def __ge__(self, x: Any) -> Tensor:
        a, b = self._operands(x)
        return b.__le__(a)

    def __eq__(self, x: Any) -> Tensor:  # type: ignore[override]
        return self._compare(Ops.CMPEQ, x)

    def __ne__(self, x: Any) -> Tensor:  # type: ignore[override]
        return self._compare(Ops.CMPNE, x)

    def lt(self, x: Any) -> Tensor:
        return self < x

    def gt(self, x: Any) -> Tensor:
        return self > x

    def le(self, x: Any) -> Tensor:
        return self <= x

    def ge(self, x: Any) -> Tensor:
        return self >= x

    def eq(self, x: Any) -> Tensor:
        return self == x

    def ne(self, x: Any) -> Tensor:
        return self != x

    def _bitwise(self, op: Ops, x: Any, name: str, reverse: bool = False) -> Tensor:
        a, b = self._operands(x, reverse)
        if a.dtype.is_float:
            raise ArgumentTypeError(f"{name} is not defined for dtype {a.dtype} (needs an int or bool "
                                    "tensor)")
        return a._alu(op, b)

    def bitwise_and(self, x: Any) -> Tensor:
        return self._bitwise(Ops.AND, x, "bitwise_and")

    def bitwise_or(self, x: Any) -> Tensor:
        return self._bitwise(Ops.OR, x, "bitwise_or")

    def bitwise_xor(self, x: Any) -> Tensor:
        return self._bitwise(Ops.XOR, x, "bitwise_xor")

    def bitwise_not(self) -> Tensor:
        if self.dtype.is_float:
            raise ArgumentTypeError(f"bitwise_not is not defined for dtype {self.dtype} "
                            "(needs an int or bool tensor)")
        return self._alu(Ops.NOT)

    def __and__(self, x: Any) -> Tensor:
        return self.bitwise_and(x)

    def __rand__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.AND, x, "bitwise_and", reverse=True)

    def __or__(self, x: Any) -> Tensor:
        return self.bitwise_or(x)

    def __ror__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.OR, x, "bitwise_or", reverse=True)

    def __xor__(self, x: Any) -> Tensor:
        return self.bitwise_xor(x)

    def __rxor__(self, x: Any) -> Tensor:
        return self._bitwise(Ops.XOR, x, "bitwise_xor", reverse=True)

    def __invert__(self) -> Tensor:
        return self.bitwise_not()

    def _shift(self, op: Ops, x: Any, name: str) -> Tensor:
        if not self.dtype.is_int:
            raise ArgumentTypeError(f"{name} is not defined for dtype {self.dtype} (needs an int tensor)")
        if _is_scalar(x):
            amount = self._const(int(_scalar(x)))
            return self._alu(op, amount)
        a, b = self._operands(x)
        if not a.dtype.is_int:
            raise ArgumentTypeError(f"{name} needs an int shift amount, got {self._as_tensor(x).dtype}")
        return a._alu(op, b)

    def lshift(self, x: Any) -> Tensor:
        return self._shift(Ops.SHL, x, "<<")

    def rshift(self, x: Any) -> Tensor:
        """Arithmetic for signed types, logical for unsigned ones (as torch)."""
        return self._shift(Ops.SHR, x, ">>")

    def __lshift__(self, x: Any) -> Tensor:
        return self.lshift(x)

    def __rshift__(self, x: Any) -> Tensor:
        return self.rshift(x)

    def logical_not(self) -> Tensor:
        return self.bool()._alu(Ops.NOT)

    def logical_and(self, x: Any) -> Tensor:
        return self.bool()._binary(Ops.AND, self._as_tensor(x).bool())

    def logical_or(self, x: Any) -> Tensor:
        return self.bool()._binary(Ops.OR, self._as_tensor(x).bool())

    def logical_xor(self, x: Any) -> Tensor:
        return self.bool()._binary(Ops.XOR, self._as_tensor(x).bool())

    @overload
    def where(self: Tensor, x: Any, y: Any) -> Tensor: ...

    @overload
    def where(self: Tensor) -> tuple[Tensor, ...]: ...

    def where(self: Tensor, x: Any = _NO_ARG, y: Any = _NO_ARG) -> Any:
        """`cond.where(x, y)` (also `Tensor.where(cond, x, y)`): x where cond is true, else y. With no x and
        y it is torch.where(cond): the coordinates of the true elements (nonzero(as_tuple=True))."""
        if x is _NO_ARG and y is _NO_ARG:
            return self.nonzero(as_tuple=True)
        if x is _NO_ARG or y is _NO_ARG:
            raise ArgumentError("where(cond, x, y) needs both x and y (or neither, for the coordinates)")
        cond = self.bool()
        if isinstance(x, Tensor) or isinstance(y, Tensor) or not _is_scalar(x) or not _is_scalar(y):
            if not isinstance(x, Tensor) and not _is_scalar(x):
                x = cond._as_tensor(x)
            if not isinstance(y, Tensor) and not _is_scalar(y):
                y = cond._as_tensor(y)
            if isinstance(x, Tensor) and isinstance(y, Tensor):
                dt = promote_types(x.dtype, y.dtype)
            else:
                t, s = (x, y) if isinstance(x, Tensor) else (y, x)
                dt = result_type_with_scalar(t.dtype, _scalar(s))
        else:
            dt = promote_types(dtypes.from_py(_scalar(x)), dtypes.from_py(_scalar(y)))
        shapes = [cond.shape] + [v.shape for v in (x, y) if isinstance(v, Tensor)]
        shape = _broadcast_shapes(*shapes) if len(shapes) > 1 else cond.shape
        xs = [v.cast(dt)._broadcast_to(shape) if isinstance(v, Tensor) else cond._const(_scalar(v), dt, shape)
              for v in (x, y)]
        return cond._broadcast_to(shape)._alu(Ops.WHERE, xs[0], xs[1], dtype=dt)

    def maximum(self, x: Any) -> Tensor:
        a, b = self._operands(x)
        return a._alu(Ops.OR, b) if a.dtype.is_bool else a._alu(Ops.MAX, b)

    def minimum(self, x: Any) -> Tensor:
        a, b = self._operands(x)
        if a.dtype.is_bool:
            return a._alu(Ops.AND, b)
        if a.dtype.is_int:  # ~ reverses the order of signed and unsigned ints alike, without overflow
            return ~((~a)._alu(Ops.MAX, ~b))
        return -((-a)._alu(Ops.MAX, -b))

    def clip(self, min_: Any = None, max_: Any = None) -> Tensor:
        """Bounds selected with where, so the gradient is 1 on [min_, max_] including the bounds and 0
        outside (torch's clamp), NaN stays NaN, and min_ > max_ gives max_ everywhere (torch)."""
        if min_ is None and max_ is None:
            raise ArgumentError("clip needs at least one of min_ and max_")
        x = self
        if min_ is not None:
            lo, x = x._operands(min_, reverse=True)
            x = (x < lo).where(lo, x)
        if max_ is not None:
            hi, x = x._operands(max_, reverse=True)
            x = (x > hi).where(hi, x)
        return x

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 (torch's names)
        return self.clip(min, max)

    def isnan(self) -> Tensor:
        return self != self if self.dtype.is_float else self._const(False, dtypes.bool)

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        if not self.dtype.is_float or not (detect_positive or detect_negative):
            return self._const(False, dtypes.bool)
        if not detect_negative:
            return self == math.inf
        return (self == -math.inf) if not detect_positive else (self == math.inf) | (self == -math.inf)

    def isfinite(self) -> Tensor:
        return (self.isinf() | self.isnan()).logical_not()

    # ------------------------------------------------------------------ unary math
    def exp(self) -> Tensor:
        return self._float_fn(lambda x: (x * _LOG2_E)._alu(Ops.EXP2))

    def exp2(self) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.EXP2))

    def log(self) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.LOG2) * _LN_2)

    def log2(self) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.LOG2))

    def sqrt(self) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.SQRT))

    def rsqrt(self) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.SQRT)._alu(Ops.RECIP))

    def reciprocal(self) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.RECIP))

    def sin(self) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.SIN))

    def cos(self) -> Tensor:
        return self._float_fn(lambda x: (math.pi / 2 - x)._alu(Ops.SIN))

    def tan(self) -> Tensor:
        return self._float_fn(lambda x: x.sin() / x.cos())

    def square(self) -> Tensor:
        return self * self

    def abs(self) -> Tensor:
        """|x| with torch's gradient sign(x) (0 at 0: the x*x branch is 0 there with slope 0); -0.0 gives
        +0.0 and NaN stays NaN."""
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        return (self > 0).where(self, (self < 0).where(-self, self * self))

    def sign(self) -> Tensor:
        if self.dtype.is_bool:
            return self
        s = (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype) if not self.dtype.is_unsigned \
            else (self > 0).cast(self.dtype)
        return s + self * 0 if self.dtype.is_float else s  # `x * 0` keeps NaN as NaN

    def trunc(self) -> Tensor:
        return self._alu(Ops.TRUNC) if self.dtype.is_float else self

    def floor(self) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self > t).where(t + 1, t)

    def round(self) -> Tensor:
        """Round half to even, like torch and numpy."""
        if not self.dtype.is_float:
            return self
        f = self.floor()
        diff = self - f
        f_is_odd = (f - (f * 0.5).floor() * 2) != 0
        up = (diff > 0.5) | ((diff == 0.5) & f_is_odd)
        return up.where(f + 1, f)

    def relu(self) -> Tensor:
        """max(x, 0) with torch's gradient: 0 at x == 0 (maximum() would split a tie), NaN stays NaN."""
        if self.dtype.is_bool:
            return self
        return (self > 0).where(self, (self == self).where(self._const(0), self))

    def relu6(self) -> Tensor:
        return self.relu().minimum(6)

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        return (self < 0).where(self * neg_slope, self)

    def elu(self, alpha: float = 1.0) -> Tensor:
        # the exp branch gets min(x, 0): unused for x > 0, it would overflow there and make the gradient NaN
        return self._float_fn(lambda x: (x > 0).where(x, (x.minimum(0).exp() - 1) * alpha))

    def sigmoid(self) -> Tensor:
        """1 / (1 + e^-x) computed from e^-|x| <= 1, so neither the value nor the gradient overflows for
        large |x| (the plain form's gradient is inf/inf = NaN at x = -300)."""
        def fn(x: Tensor) -> Tensor:
            nonneg = x >= 0
            z = nonneg.where(-x, x).exp()  # e^-|x|, with slope -1 / +1 on each side (correct at 0)
            p = (1 + z)._alu(Ops.RECIP)
            return nonneg.where(p, z * p)
        return self._float_fn(fn)

    def logsigmoid(self) -> Tensor:
        return -(-self).softplus()

    def hardsigmoid(self) -> Tensor:
        return self._float_fn(lambda x: (x / 6 + 0.5).clip(0, 1))

    def hardswish(self) -> Tensor:
        return self._float_fn(lambda x: x * (x + 3).clip(0, 6) / 6)

    def hardtanh(self, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        return self.clip(min_val, max_val)

    def tanh(self) -> Tensor:
        return self._float_fn(lambda x: (x * 2).sigmoid() * 2 - 1)

    def erf(self) -> Tensor:
        """Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 (plus float32 rounding, ~3e-7 in all)."""
        def fn(x: Tensor) -> Tensor:
            ax = x.abs()
            t = (1 + 0.3275911 * ax)._alu(Ops.RECIP)
            poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                                  + t * 1.061405429))))
            return x.sign() * (1 - poly * (-(ax * ax)).exp())
        return self._float_fn(fn)

    def gelu(self, approximate: str = "none") -> Tensor:
        """torch's gelu: exact (erf) by default, approximate='tanh' for the tanh form."""
        if approximate == "tanh":
            return self._float_fn(
                lambda x: 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh()))
        if approximate != "none":
            raise ArgumentError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._float_fn(lambda x: 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf()))

    def quick_gelu(self) -> Tensor:
        return self * (self * 1.702).sigmoid()

    def silu(self) -> Tensor:
        return self._float_fn(lambda x: x * x.sigmoid())

    def swish(self) -> Tensor:
        return self.silu()

    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta x)) / beta, written as max(z, 0) + log(1 + exp(-|z|)) so it cannot overflow;
        above `threshold` it is the identity, as torch."""
        def fn(x: Tensor) -> Tensor:
            z = x * beta
            sp = (z.maximum(0) + (1 + (-z.abs()).exp()).log()) * (1 / beta)
            return (z > threshold).where(x, sp)
        return self._float_fn(fn)

    def mish(self) -> Tensor:
        return self * self.softplus().tanh()

    # ------------------------------------------------------------------ reductions
    def _reduce(self, rop: Ops, axis: Axis, keepdim: bool) -> Tensor:
        axes = self._axes(axis)
        x = self
        if axes:
            x = Tensor(UOp(Ops.REDUCE_AXIS, self.dtype, (self.uop,), (rop, axes)))
        if keepdim:
            return x
        return x.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def _no_empty(self, axis: Axis, name: str) -> None:
        for a in self._axes(axis):
            if self.shape[a] == 0:
                raise ShapeError(f"{name}() over axis {a} of size 0 (shape {self.shape}) has no identity")

    @staticmethod
    def _acc_dtype(dt: DType, dtype: DTypeLike | None) -> DType:
        if dtype is not None:
            return to_dtype(dtype)
        return dtypes.int64 if dt.is_int or dt.is_bool else dt  # torch sums ints and bools to int64

    def sum(self, axis: Axis = None, keepdim: bool = False, dtype: DTypeLike | None = None, *,
            dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis
        return self.cast(self._acc_dtype(self.dtype, dtype))._reduce(Ops.ADD, axis, keepdim)

    def prod(self, axis: Axis = None, keepdim: bool = False, dtype: DTypeLike | None = None, *,
             dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis
        return self.cast(self._acc_dtype(self.dtype, dtype))._reduce(Ops.MUL, axis, keepdim)

    def max(self, dim: Any = None, keepdim: bool = False, *, axis: Axis = None) -> Any:
        """torch's max: no dim -> the 0-d maximum; an int dim (positional or dim=) -> a (values, indices)
        named tuple, indices the first position of the maximum as argmax; a Tensor -> the elementwise
        maximum (torch.max(a, b)). tinygrad's values-only reduction is `max(axis=..., keepdim=...)`
        (keyword axis, an int or a tuple) or amax; a tuple dim also reduces to values only."""
        if isinstance(dim, Tensor):
            return self.maximum(dim)
        if axis is None and isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
            return ValuesIndices(self._max(int(dim), keepdim), self.argmax(int(dim), keepdim))
        return self._max(axis if axis is not None else dim, keepdim)

    def min(self, dim: Any = None, keepdim: bool = False, *, axis: Axis = None) -> Any:
        """torch's min; the forms as `max` (values-only: `min(axis=...)` or amin)."""
        if isinstance(dim, Tensor):
            return self.minimum(dim)
        if axis is None and isinstance(dim, (int, np.integer)) and not isinstance(dim, bool):
            return ValuesIndices(self._min(int(dim), keepdim), self.argmin(int(dim), keepdim))
        return self._min(axis if axis is not None else dim, keepdim)

    def _max(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The values-only max reduction (what internal code calls)."""
        self._no_empty(axis, "max")
        if self.dtype.is_bool:  # reduce bools as bytes: a 1-bit MAX is not what every backend means
            return self.cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).cast(dtypes.bool)
        return self._reduce(Ops.MAX, axis, keepdim)

    def _min(self, axis: Axis = None, keepdim: bool = False) -> Tensor:
        """The values-only min reduction."""
        self._no_empty(axis, "min")
        if self.dtype.is_bool:
            return self.logical_not()._max(axis, keepdim).logical_not()
        if self.dtype.is_int:
            return ~((~self)._max(axis, keepdim))
        return -((-self)._max(axis, keepdim))

    def any(self, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis
        return self.bool().cast(dtypes.uint8)._reduce(Ops.MAX, axis, keepdim).bool()

    def all(self, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis
        return self.logical_not().any(axis, keepdim).logical_not()

    def _count(self, axis: Axis) -> Any:
        return _prod([self.shape[a] for a in self._axes(axis)])

    def mean(self, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None,
             dtype: DTypeLike | None = None) -> Tensor:
        axis = dim if dim is not None else axis
        n = self._count(axis)
        x = self if dtype is None else self.cast(to_dtype(dtype))
        return x._float_fn(lambda v: v.sum(axis, keepdim) / n)

    def var(self, axis: Axis = None, keepdim: bool = False, correction: Scalar = 1, *,
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
                count = Tensor(n, device=x.device).cast(x.dtype)
                return (d * d).sum(axis, keepdim) / (count - correction).maximum(0)
            return (d * d).sum(axis, keepdim) / max(0, n - correction)
        return self._float_fn(fn)

    def std(self, axis: Axis = None, keepdim: bool = False, correction: Scalar = 1, *,
            dim: Axis = None, unbiased: bool | None = None) -> Tensor:
        return self.var(axis, keepdim, correction, dim=dim, unbiased=unbiased).sqrt()

    def var_mean(self, axis: Axis = None, keepdim: bool = False, correction: Scalar = 1, *,
                 dim: Axis = None, unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
        axis = dim if dim is not None else axis
        return self.var(axis, keepdim, correction, unbiased=unbiased), self.mean(axis, keepdim)

    def std_mean(self, axis: Axis = None, keepdim: bool = False, correction: Scalar = 1, *,
                 dim: Axis = None, unbiased: bool | None = None) -> tuple[Tensor, Tensor]:
        axis = dim if dim is not None else axis
        return self.std(axis, keepdim, correction, unbiased=unbiased), self.mean(axis, keepdim)

    def argmax(self, axis: int | None = None, keepdim: bool = False, *, dim: int | None = None) -> Tensor:
        """Index of the first maximum (a NaN counts as the maximum, as numpy); int64 like torch."""
        axis = dim if dim is not None else axis
        if axis is None:
            r = self.flatten().argmax(0)
            return r.reshape((1,) * self.ndim) if keepdim else r
        ax = self._axis(axis)
        if self.ndim == 0:
            return Tensor._full((), 0, dtypes.int64, self.device)
        self._no_empty(ax, "argmax")
        n = self.shape[ax]
        hit = self == self._max(ax, keepdim=True)
        if self.dtype.is_float:
            hit = hit | self.isnan()
        # n - i is largest for the first hit, so a MAX finds it
        rev = (n - Tensor.arange(n, dtype=dtypes.int64, device=self.device))
        rev = rev.reshape((n,) + (1,) * (self.ndim - ax - 1))
        return n - hit.where(rev, 0)._max(ax, keepdim)

    def argmin(self, axis: int | None = None, keepdim: bool = False, *, dim: int | None = None) -> Tensor:
        flipped = self.logical_not() if self.dtype.is_bool else ~self if self.dtype.is_int else -self
        return flipped.argmax(axis, keepdim, dim=dim)

    def logsumexp(self, axis: Axis = None, keepdim: bool = False, *, dim: Axis = None) -> Tensor:
        axis = dim if dim is not None else axis

        def fn(x: Tensor) -> Tensor:
            m = x._max(axis, keepdim=True)
            m = m.isinf().where(0, m)  # all -inf (or an inf) must not turn into inf - inf = NaN
            s = (x - m).exp().sum(axis, keepdim=True).log() + m
            return s if keepdim else s.reshape(tuple(d for i, d in enumerate(x.shape)
                                                     if i not in x._axes(axis)))
        return self._float_fn(fn)

    def softmax(self, axis: int = -1, dtype: DTypeLike | None = None, *, dim: int | None = None) -> Tensor:
        axis = dim if dim is not None else axis
        x = self if dtype is None else self.cast(to_dtype(dtype))

        def fn(v: Tensor) -> Tensor:
            e = (v - v._max(axis, keepdim=True)).exp()
            return e / e.sum(axis, keepdim=True)
        return x._float_fn(fn)

    def log_softmax(self, axis: int = -1, dtype: DTypeLike | None = None, *,
                    dim: int | None = None) -> Tensor:
        axis = dim if dim is not None else axis
        x = self if dtype is None else self.cast(to_dtype(dtype))

        def fn(v: Tensor) -> Tensor:
            z = v - v._max(axis, keepdim=True)
            return z - z.exp().sum(axis, keepdim=True).log()
        return x._float_fn(fn)

    def cumsum(self, axis: int = 0, dtype: DTypeLike | None = None, *, dim: int | None = None) -> Tensor:
        """Running sum: a lower-triangular masked sum (n*n work, fine for the sizes it is used at)."""
        axis = dim if dim is not None else axis
        x = self.cast(self._acc_dtype(self.dtype, dtype))
        if self.ndim == 0:
            self._axis(axis)
            return x
        ax = self._axis(axis)
        n = self.shape[ax]
        xt = x.transpose(ax, -1)
        pos = Tensor.arange(n, device=self.device)
        lower = pos.reshape(n, 1) >= pos.reshape(1, n)  # lower[i, j]: element j counts toward output i
        out = lower.where(xt.unsqueeze(-2), 0).sum(-1, dtype=x.dtype)
        return out.transpose(ax, -1)

    # ------------------------------------------------------------------ movement
    def reshape(self, *shape: Any) -> Tensor:
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
        return self if new == self.shape else Tensor(UOp(Ops.RESHAPE, self.dtype, (self.uop,), new))

    def view(self, *shape: Any) -> Tensor:
        return self.reshape(*shape)

    def permute(self, *order: Any, dims: Any = None) -> Tensor:
        order = (dims,) if dims is not None else order  # torch's keyword
        o = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (tuple, list)) else order
        if len(o) != self.ndim:
            raise ShapeError(f"permute order {o} does not match the {self.ndim} dims of shape {self.shape}")
        norm = tuple(self._axis(a) for a in o)
        if sorted(norm) != list(range(self.ndim)):
            raise ShapeError(f"permute order {o} is not a permutation of the dims of shape {self.shape}")
        if norm == tuple(range(self.ndim)):
            return self
        return Tensor(UOp(Ops.PERMUTE, self.dtype, (self.uop,), norm))

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = self._axis(dim0), self._axis(dim1)
        if self.ndim == 0:
            return self
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    def expand(self, *shape: Any) -> Tensor:
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
        return x if new == x.shape else Tensor(UOp(Ops.EXPAND, self.dtype, (x.uop,), new))

    def expand_as(self, x: Tensor) -> Tensor:
        return self.expand(x.shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._axis(start_dim), self._axis(end_dim)
        return self.reshape(self.shape[:s] + (_prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        d = self._axis(dim)
        return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])

    def squeeze(self, dim: Axis = None) -> Tensor:
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        axes = self._axes(dim)
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in axes and s == 1)))

    def unsqueeze(self, dim: int) -> Tensor:
        d = self._axis(dim, extra=1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def pad(self, padding: Sequence[Any], value: Scalar = 0.0, mode: str = "constant") -> Tensor:
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
        out = Tensor(UOp(Ops.PAD, x.dtype, (x.uop,), tuple(pads)))
        if _scalar(value) == 0 and not (isinstance(value, float) and math.copysign(1, value) < 0):
            return out
        inside = Tensor(UOp(Ops.PAD, dtypes.bool, (x._const(True, dtypes.bool).uop,), tuple(pads)))
        return inside.where(out, x._const(_scalar(value), shape=out.shape))

    def _pad_from_edges(self, pads: list[tuple[Any, Any]], mode: str) -> Tensor:
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
            x = Tensor.cat(*[t for t in (left, x, right) if t.shape[d] != 0], dim=d)
        return x

    def shrink(self, arg: Sequence[tuple[Any, Any] | None]) -> Tensor:
        if len(arg) != self.ndim:
            raise ShapeError(f"shrink {tuple(arg)} needs one entry per dim of shape {self.shape}")
        norm = tuple((0, s) if a is None else (a[0], a[1]) for a, s in zip(arg, self.shape))
        for (b, e), s in zip(norm, self.shape):
            if isinstance(b, int) and isinstance(e, int) and isinstance(s, int) and not 0 <= b <= e <= s:
                raise ShapeError(f"shrink {norm} is out of bounds for shape {self.shape}")
        if all(b == 0 and e == s for (b, e), s in zip(norm, self.shape)):
            return self
        return Tensor(UOp(Ops.SHRINK, self.dtype, (self.uop,), norm))

    def flip(self, *dims: Any, **kw: Any) -> Tensor:
        if "dims" in kw:  # torch's keyword
            dims = (kw.pop("dims"),)
        if kw:
            raise ArgumentTypeError(f"flip got unexpected keyword arguments {sorted(kw)}")
        d = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        axes = self._axes(d)
        if not axes:
            return self
        return Tensor(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in axes for i in range(self.ndim))))

    def repeat(self, *repeats: Any) -> Tensor:
        """Tile the tensor (torch's repeat; numpy's tile)."""
        reps = tuple(repeats[0]) if len(repeats) == 1 and isinstance(repeats[0], (tuple, list)) else repeats
        reps = tuple(_dim(r, f"repeat {reps}") for r in reps)
        if len(reps) < self.ndim:
            raise ShapeError(f"repeat {reps} needs at least {self.ndim} values for shape {self.shape}")
        base = (1,) * (len(reps) - self.ndim) + self.shape
        interleaved = tuple(v for s in base for v in (1, s))
        x = self.reshape(interleaved).expand(tuple(v for r, s in zip(reps, base) for v in (r, s)))
        return x.reshape(tuple(r * s for r, s in zip(reps, base)))

    def cat(self, *args: Tensor, dim: int = 0) -> Tensor:
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

    def stack(self, *args: Tensor, dim: int = 0) -> Tensor:
        tensors = list(self) + list(args) if isinstance(self, (list, tuple)) else [self, *args]
        d = tensors[0]._axis(dim, extra=1)
        return Tensor.cat(*[t.unsqueeze(d) for t in tensors], dim=d)

    def split(self, split_size: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
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

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        if chunks <= 0:
            raise ShapeError(f"chunk needs a positive number of chunks, got {chunks}")
        n = self.shape[self._axis(dim)]
        return self.split(max(1, math.ceil(n / chunks)), dim)

    def tril(self, diagonal: int = 0) -> Tensor:
        return self._tri(diagonal, lower=True)

    def triu(self, diagonal: int = 0) -> Tensor:
        return self._tri(diagonal, lower=False)

    def _tri(self, diagonal: int, lower: bool) -> Tensor:
        if self.ndim < 2:
            raise ShapeError(f"tril/triu need at least 2 dims, got shape {self.shape}")
        r, c = self.shape[-2:]
        rows = Tensor.arange(r, device=self.device).reshape(r, 1) + diagonal
        cols = Tensor.arange(c, device=self.device).reshape(1, c)
        mask = (rows >= cols) if lower else (rows <= cols)
        return mask.where(self, self._const(0))  # a tensor zero keeps self's dtype (bool stays bool)

    # ------------------------------------------------------------------ indexing
    def _index_plan(self, indices: Any) -> tuple[_IndexPlan, Tensor]:
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
                it = Tensor(data, device=self.device)
                host_checked.add(id(it))
            elif isinstance(it, list):
                it = Tensor(np.zeros(0, np.int32), device=self.device)
            if isinstance(it, Tensor) and it.dtype.is_bool:
                first = start if start is not None else 0
                covered = tuple(self.shape[first:first + it.ndim])
                if covered != it.shape:
                    raise TensorIndexError(f"boolean index of shape {it.shape} does not match the indexed "
                                     f"dimensions {first}..{first + it.ndim - 1} of shape {covered}")
                coords = [Tensor(c.astype(np.int64), device=self.device) for c in np.nonzero(it.numpy())]
                host_checked.update(id(c) for c in coords)
                norm.extend(coords)
                continue
            if isinstance(it, Tensor) and it.dtype.is_float:
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
        has_adv = any(isinstance(it, Tensor) for it in norm)
        adv_items: list[int] = []
        out_dims_before_first_adv = 0
        for pos, it in enumerate(norm):
            if it is None:
                plan.out_shape.append(1)
                if not adv_items:
                    out_dims_before_first_adv += 1
                continue
            size = self.shape[dim]
            if isinstance(it, bool) or not isinstance(it, (int, slice, Tensor, UOp)):
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
                assert isinstance(it, Tensor)  # a UOp index is a symbolic window, handled above
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

    def _index_item_dims(self, items: list[Any]) -> list[int | None]:
        """The first source dimension each index item applies to (None for None/Ellipsis), so host-known
        indices and bool masks can be checked against the dimension they index."""
        def width(it: Any) -> int:
            if it is None or it is Ellipsis:
                return 0
            if isinstance(it, (Tensor, np.ndarray)) and it.dtype in (np.bool_, dtypes.bool):
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

    def _apply_basic(self, plan: _IndexPlan) -> Tensor:
        x = self.shrink(plan.shrink).flip(tuple(i for i, f in enumerate(plan.flip) if f))
        for axis, (step, n) in enumerate(plan.step):
            x = x._take_every(axis, step, n)
        return x.reshape(tuple(plan.out_shape))

    def _take_every(self, axis: int, step: int, n: int) -> Tensor:
        """Elements 0, step, 2*step, ... (n of them) along axis, from movement ops only."""
        if step == 1 or n == 0:
            return self
        pre, post = self.shape[:axis], self.shape[axis + 1:]
        pads = [(0, 0)] * self.ndim
        pads[axis] = (0, n * step - self.shape[axis])
        x = self.pad(pads).reshape(pre + (n, step) + post)
        return x.shrink([None] * axis + [None, (0, 1)] + [None] * len(post)).reshape(pre + (n,) + post)

    def _spread_every(self, axis: int, step: int, n: int) -> Tensor:
        """The inverse of _take_every: put element i at i*step, zeros in between."""
        if step == 1 or n == 0:
            return self
        pre, post = self.shape[:axis], self.shape[axis + 1:]
        x = self.reshape(pre + (n, 1) + post)
        x = x.pad([(0, 0)] * (axis + 1) + [(0, step - 1)] + [(0, 0)] * len(post))
        x = x.reshape(pre + (n * step,) + post)
        return x.shrink([None] * axis + [(0, (n - 1) * step + 1)] + [None] * len(post))

    def __getitem__(self, indices: Any) -> Tensor:
        plan, _ = self._index_plan(indices)
        y = self._apply_basic(plan)
        if not plan.advanced:
            return y
        return y._gather_advanced(plan)

    def _gather_advanced(self, plan: _IndexPlan) -> Tensor:
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
            pos = Tensor.arange(n, device=self.device).reshape((1,) * (nb + j) + (n,) + (1,) * (k - j - 1))
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

    def __setitem__(self, indices: Any, value: Any) -> None:
        """Write value into the indexed elements (realizes; a view of another tensor is copied first,
        so the write does not reach the tensor it was viewed from)."""
        from rawgrad.tensor.interpret import is_realized
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

    def _unindex_mask(self, plan: _IndexPlan, v: Tensor) -> Tensor:
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

    def _scatter_advanced(self, indices: Any, v: Tensor) -> Tensor:
        """Advanced-index writes: find each element's flat position through the same index, then a
        one-hot compare against every position (numel x selected work). With repeated indices it is
        undefined which value lands, as in torch."""
        n = int(self.numel())
        flat_pos = Tensor.arange(n, device=self.device).reshape(self.shape)[indices].flatten()
        m = flat_pos.shape[0]
        hit = flat_pos.reshape(1, m) == Tensor.arange(n, device=self.device).reshape(n, 1)
        vals = _masked_sum(hit, v.flatten().reshape(1, m).expand(n, m), (1,))
        return hit.any(1).reshape(self.shape).where(vals.reshape(self.shape), self)

    def gather(self, dim: int, index: Tensor) -> Tensor:
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
        hit = it.unsqueeze(-1) == Tensor.arange(n, device=self.device)
        return _masked_sum(hit, x.unsqueeze(-2)._broadcast_to(hit.shape), (hit.ndim - 1,)).transpose(d, -1)

    def one_hot(self, num_classes: int) -> Tensor:
        if not self.dtype.is_int:
            raise ArgumentTypeError(f"one_hot needs an int tensor, got {self.dtype}")
        return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device)).cast(dtypes.int64)

    def embedding(self, weight: Tensor) -> Tensor:
        """`indices.embedding(weight)` = weight[indices] (torch.nn.functional.embedding(indices, weight))."""
        if weight.ndim != 2:
            raise ShapeError(f"embedding weight must be 2-d (num, dim), got shape {weight.shape}")
        if not self.dtype.is_int:
            raise ArgumentTypeError(f"embedding indices must be integers, got {self.dtype}")
        _defer_index_check(self, weight.shape[0], "embedding")
        return weight._take_rows(self)

    def _take_rows(self, indices: Tensor) -> Tensor:
        """self[indices] along the first axis, numpy's wrap for negative indices; each output element is
        one load from the row the index names (Ops.GATHER). Rows outside the table read as 0."""
        n, rest = self.shape[0], self.shape[1:]
        indices = (indices < 0).where(indices + n, indices)
        table = self.reshape(n, _prod(rest))
        out = Tensor(UOp(Ops.GATHER, self.dtype, (table.uop, indices.uop)))
        return out.reshape(*indices.shape, *rest)

    # ------------------------------------------------------------------ linear algebra
    def dot(self, w: Tensor, dtype: DTypeLike | None = None) -> Tensor:
        """Matrix product with numpy/torch batching and broadcasting, as one multiply + sum over the
        contracted axis (the scheduler fuses it into a single reduce kernel)."""
        if not isinstance(w, Tensor):
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

    def matmul(self, x: Tensor, reverse: bool = False) -> Tensor:
        return x.dot(self) if reverse else self.dot(x)

    def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """tinygrad's linear: weight is (in, out) (a 1-d weight scales elementwise). torch's
        F.linear(x, w, b) with w of shape (out, in) is `x.linear(w.T, b)`."""
        x = self * weight if weight.ndim == 1 else self.dot(weight)
        return x if bias is None else x + bias

    @staticmethod
    def einsum(formula: str, *operands: Any) -> Tensor:
        """General einsum: explicit or implicit output, repeated letters (diagonals), ellipsis."""
        raw = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) \
            else list(operands)
        ops = [t if isinstance(t, Tensor) else Tensor(t) for t in raw]
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

    # ------------------------------------------------------------------ convolution and pooling
    def _pool(self, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> Tensor:
        """Sliding windows over the last len(kernel) dims: (..., *out, *kernel), movement ops only."""
        nk = len(kernel)
        lead = self.ndim - nk
        x = self
        for j, (k, s, d) in enumerate(zip(kernel, stride, dilation)):
            x = x._windows(lead + 2 * j, k, s, d)  # each done axis leaves (out, k) behind it
        # now (..., o1, k1, o2, k2, ...): move the kernel dims to the end
        order = list(range(lead)) + [lead + 2 * j for j in range(nk)] + [lead + 2 * j + 1 for j in range(nk)]
        return x.permute(order)

    def _windows(self, axis: int, k: int, s: int, d: int) -> Tensor:
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

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: Any = 1,
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
        pads = Tensor._resolve_padding(padding, kernel, dl, st)
        dt = promote_types(self.dtype, weight.dtype)
        x = self.cast(dt).pad([(0, 0), (0, 0)] + pads)._pool(kernel, st, dl)  # (N, Cin, *out, *kernel)
        out = x.shape[2:2 + nd]
        x = x.reshape((bs, groups, 1, cin_g) + out + kernel)
        w = weight.cast(dt).reshape((1, groups, cout // groups, cin_g) + (1,) * nd + kernel)
        red = (3,) + tuple(range(4 + nd, 4 + 2 * nd))
        ret = (x * w).sum(red, dtype=dt).reshape((bs, cout) + out)
        return ret if bias is None else ret + bias.reshape((1, cout) + (1,) * nd)

    def conv1d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: Any = 1,
               dilation: Any = 1, padding: Any = 0) -> Tensor:
        return self.conv2d(weight, bias, groups, stride, dilation, padding)

    def _pool_args(self, kernel_size: Any, stride: Any, dilation: Any, padding: Any, n: int = 2) \
            -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], list[tuple[int, int]]]:
        k = _to_tuple(kernel_size, n, "kernel_size")
        st = k if stride is None else _to_tuple(stride, n, "stride")
        dl = _to_tuple(dilation, n, "dilation")
        pads = Tensor._resolve_padding(padding, k, dl, st)
        if self.ndim < n:
            raise ShapeError(f"pooling over {n} dims needs at least {n} dims, got shape {self.shape}")
        return k, st, dl, pads

    def _max_pool(self, n: int, kernel_size: Any, stride: Any, dilation: Any, padding: Any, ceil_mode: bool,
                  return_indices: bool) -> Tensor | tuple[Tensor, Tensor]:
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
        pos = Tensor.arange(plane, dtype=dtypes.int32, device=self.device).reshape(spatial)
        pos = pos.pad(pads, value=plane)._pool(k, st, dl)
        hit = win == out.reshape(out.shape + (1,) * n)
        if self.dtype.is_float:
            hit = hit | win.isnan()
        return out, hit.where(pos, plane)._min(axes).cast(dtypes.int64)

    def max_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: bool = False, return_indices: bool = False) -> Any:
        """Max pooling over the last 2 dims (tinygrad's argument order). With return_indices, also the
        int64 indices max_unpool2d takes. On ties the gradient is split between the maxima of a window
        (torch gives it to the first)."""
        return self._max_pool(2, kernel_size, stride, dilation, padding, ceil_mode, return_indices)

    def _avg_pool(self, n: int, kernel_size: Any, stride: Any, dilation: Any, padding: Any, ceil_mode: bool,
                  count_include_pad: bool, divisor_override: int | None) -> Tensor:
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

    def avg_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: bool = False, count_include_pad: bool = True,
                   divisor_override: int | None = None) -> Tensor:
        """Average pooling over the last 2 dims (tinygrad's argument order, torch's options)."""
        return self._avg_pool(2, kernel_size, stride, dilation, padding, ceil_mode, count_include_pad,
                              divisor_override)

    # ------------------------------------------------------------------ normalisation and attention
    def layernorm(self, axis: Axis = -1, eps: float = 1e-5) -> Tensor:
        """Normalise to zero mean, unit (biased) variance over axis; no affine part (tinygrad)."""
        def fn(x: Tensor) -> Tensor:
            d = x - x.mean(axis, keepdim=True)
            return d * ((d * d).mean(axis, keepdim=True) + eps).rsqrt()
        return self._float_fn(fn)

    def layer_norm(self, normalized_shape: int | Sequence[int], weight: Tensor | None = None,
                   bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
        """torch.nn.functional.layer_norm over the trailing normalized_shape dims."""
        ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if tuple(self.shape[self.ndim - len(ns):]) != ns:
            raise ShapeError(f"layer_norm: normalized_shape {ns} does not match the end of {self.shape}")
        x = self.layernorm(tuple(range(self.ndim - len(ns), self.ndim)), eps)
        if weight is not None:
            x = x * weight
        return x if bias is None else x + bias

    def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
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
            attn_mask = Tensor.ones(lq, lk, dtype=dtypes.bool, device=q.device).tril()
        if attn_mask is not None:
            scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype.is_bool else scores + attn_mask
        return scores.softmax(-1).dropout(dropout_p) @ value

    # ------------------------------------------------------------------ dtype shorthands
    # (last in the class: these names shadow the builtins int/float/bool for whatever follows them
    # in the class body, annotations included)
    def float(self) -> Tensor:
        return self.cast(dtypes.float32)

    def half(self) -> Tensor:
        return self.cast(dtypes.float16)

    def bfloat16(self) -> Tensor:
        return self.cast(dtypes.bfloat16)

    def double(self) -> Tensor:
        return self.cast(dtypes.float64)

    def int(self) -> Tensor:
        return self.cast(dtypes.int32)

    def long(self) -> Tensor:
        return self.cast(dtypes.int64)

    def short(self) -> Tensor:
        return self.cast(dtypes.int16)

    def bool(self) -> Tensor:
        return self.cast(dtypes.bool)


# ---------------------------------------------------------------------- module-level helpers
def _masked_sum(mask: Tensor, vals: Tensor, axes: tuple[int, ...]) -> Tensor:
    """Sum of vals where mask holds (exactly one hit per output in the callers): a where, not a multiply,
    so that NaN/inf elsewhere cannot leak in; bools use any."""
    if vals.dtype.is_bool:
        return (mask & vals).any(axes)
    return mask.where(vals, 0).sum(axes, dtype=vals.dtype)


def _ceil_extra(i: int, k: int, s: int, d: int, before: int, after: int) -> int:
    """Extra right padding ceil_mode needs (torch: the last window must start inside input or left pad)."""
    span = d * (k - 1) + 1
    padded = i + before + after
    o = -(-(padded - span) // s) + 1
    if (o - 1) * s >= i + before:
        o -= 1
    return max(0, (o - 1) * s + span - padded)


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


def threefry2x32(x0: Tensor, x1: Tensor, k0: Tensor, k1: Tensor) -> tuple[Tensor, Tensor]:
    """Threefry-2x32 with 20 rounds on uint32 tensors: counter (x0, x1), key (k0, k1) -> two words."""
    ks = (k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for r in range(20):
        rot = _THREEFRY_ROT[r % 8]
        x0 = x0 + x1
        x1 = ((x1 << rot) | (x1 >> (32 - rot))) ^ x0
        if r % 4 == 3:  # key injection after every 4 rounds
            s = r // 4 + 1
            x0 = x0 + ks[s % 3]
            x1 = x1 + ks[(s + 1) % 3] + s
    return x0, x1


def embedding(indices: Tensor, weight: Tensor) -> Tensor:
    """torch.nn.functional.embedding: rows of weight picked by integer indices."""
    return indices.embedding(weight)
