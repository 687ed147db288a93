"""The Tensor: a lazy handle on one tensor-graph UOp, with the PyTorch/tinygrad API on top.

Every op builds new UOps out of the primitive set in `rawgrad.compiler.ir` (ALU, movement, REDUCE_AXIS,
CAST/BITCAST, CONTIGUOUS, ASSIGN, COPY); nothing runs until `realize()`/`numpy()`. The Tensor is where
broadcasting and dtype promotion happen, so every ALU node it builds already has sources of one shape
and (except WHERE's condition and shift amounts) one dtype.

Gradients are derived from the UOp graph itself (every op below is built from a small primitive set with
known derivatives; see `rawgrad.tensor.autograd`), so ops record nothing: `backward()` and `gradient()`
walk the graph back to the tensors that have `requires_grad`.

This module holds the core every other method is built on: construction, shape/dtype/device, the
internal helpers (`_operands` broadcasts and promotes, `_alu` builds a node, `_float_fn`), realize and
the host reads, assign (with the bookkeeping of pending assigns), the autograd entry points, casts and
the process-wide switches. The methods are grouped by theme in mixin modules, combined into `Tensor`
here: creation.py (constructors, random numbers), movement.py, elementwise.py (arithmetic, comparisons,
logic, unary math), reduce.py (reductions, softmax, layer norm), indexing.py, linalg.py (matmul, einsum,
attention), conv.py (convolution, pooling), ops_math.py and ops_nn.py.
"""
from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, cast

import numpy as np

from rawgrad.compiler.ir import Ops, UOp, _arg_key
from rawgrad.compiler.symbolic import sym_infer
from rawgrad.dtype import (
    DType,
    DTypeLike,
    bf16_bits_to_f32,
    dtypes,
    least_upper_float,
    promote_types,
    result_type_with_scalar,
    to_dtype,
)
from rawgrad.errors import ArgumentError, ArgumentTypeError, ShapeError, TensorIndexError
from rawgrad.tensor import autograd as _autograd
from rawgrad.tensor import realize as _realize
from rawgrad.tensor.buffers import buffer_from_numpy, buffer_numpy, is_allocated, writable_view
from rawgrad.tensor.common import (
    _HALF_TYPES,
    Axis,
    Scalar,
    _broadcast_shapes,
    _canon_device,
    _check_int_fits,
    _is_scalar,
    _np_to_host,
    _prod,
    _scalar,
    default_device,
)
from rawgrad.tensor.conv import ConvOps
from rawgrad.tensor.creation import CreationOps, threefry2x32  # noqa: F401 (threefry2x32: re-exported)
from rawgrad.tensor.elementwise import ElementwiseOps
from rawgrad.tensor.indexing import (  # noqa: F401 (embedding: re-exported for tests)
    IndexingOps,
    check_pending_indices,
    embedding,
)
from rawgrad.tensor.interpret import is_realized
from rawgrad.tensor.linalg import LinalgOps
from rawgrad.tensor.movement import MovementOps
from rawgrad.tensor.ops_math import MathOps
from rawgrad.tensor.ops_nn import NNOps
from rawgrad.tensor.reduce import ReduceOps


def __getattr__(name: str) -> Any:
    # `DEFAULT_DEVICE` stays importable, resolved lazily (PEP 562)
    if name == "DEFAULT_DEVICE":
        return default_device()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------- pending assigns
# tensors whose uop is an unrealized ASSIGN, by id (a WeakSet would compare Tensors with their
# elementwise __eq__)
_pending_assigns: dict[int, weakref.ref[Tensor]] = {}
_executed_assigns: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# pending assigns into a view of a buffer, by id, with their creation order, held strongly:
# `x[:, p:p+1].assign(row)` usually drops the view's Tensor at once, and the write must still reach x
# before x is next read
_pending_view_assigns: dict[int, tuple[int, Tensor]] = {}
_view_assign_order = itertools.count()


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


# Constant graphs `Tensor._full` made, by (shape, dtype, value type, value key, device); cleared when full
# (a bound on memory, not an LRU: refilling costs one graph build per key).
FULL_GRAPHS_KEPT = 4096
_full_graphs: dict[tuple[Any, ...], UOp] = {}

REPR_MAX_ELEMENTS = 1000  # print abbreviates past this many elements (torch's default threshold)
REPR_EDGE_ITEMS = 3  # elements shown at each end of an abbreviated axis (torch's default)


class _TensorType(type):
    """Tensor's metaclass, for two class attributes only: `Tensor.no_grad` and `Tensor.training` read
    and write the switches in `rawgrad.tensor.autograd.modes`, so autograd's context managers and
    `Tensor.training = True` share one state without autograd importing this module."""

    @property
    def no_grad(cls) -> bool:
        """True inside `with rawgrad.no_grad():`: backward is refused and no graph history is kept."""
        return _autograd.modes.no_grad

    @no_grad.setter
    def no_grad(cls, flag: bool) -> None:
        _autograd.modes.no_grad = flag

    @property
    def training(cls) -> bool:
        """Dropout and batch statistics; `with Tensor.train():` or `Tensor.training = True`."""
        return _autograd.modes.training

    @training.setter
    def training(cls, flag: bool) -> None:
        _autograd.modes.training = flag


class Tensor(CreationOps, MovementOps, ElementwiseOps, ReduceOps, IndexingOps, LinalgOps, ConvOps, MathOps,
             NNOps, metaclass=_TensorType):
    """A lazily evaluated n-dimensional array on a device (the methods by theme are in the mixin modules
    named in this module's docstring)."""

    # the random generator's state (creation.py); TinyJit reads and writes it here, on Tensor
    _seed: ClassVar[int] = 0
    _rng_counter: ClassVar[int] = 0
    # Recorders of the key buffers _random_bits uploads, each a list of (key BUFFER node, counter value
    # used). TinyJit opens one around a capture: a replay runs no Python, so it has to know which
    # buffers hold the keys to write the next counters into them before it launches.
    _rng_recorders: ClassVar[list[list[tuple[UOp, int]]]] = []
    # How many times manual_seed ran: TinyJit refuses a capture that reseeds (its replays could not).
    _seedings: ClassVar[int] = 0
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

    @classmethod
    def _of(cls, uop: UOp) -> Tensor:
        """`Tensor(uop)` for a node already on a device (not a bare symbolic size), without __init__'s checks:
        what TinyJit returns per replay. Sets the same attributes __init__ sets for a UOp (requires_grad None
        through its slot: the setter's registry pop finds nothing for a new object)."""
        t = object.__new__(cls)
        t.uop, t.grad, t._requires_grad = uop, None, None
        return t

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
        # u is derived from this Tensor's node, so it is on a device: Tensor(u) would only check that
        return Tensor._of(u)

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
        # A scalar operand (`x + 1`, `x * 0.5`) builds this graph on every eager op; building its 3-4 UOps
        # costs ~10 us of the ~16 us of `x + 1`, so the graphs made recently are kept by what determines
        # them (the value by type and bits: 1, 1.0 and True, 0.0 and -0.0 stay apart).
        key = (tuple(shape), dt, type(value), _arg_key(value), device)
        u = _full_graphs.get(key)
        if u is None:
            u = UOp.const(dt, value, UOp(Ops.DEVICE, arg=device))
            if len(shape):
                u = UOp(Ops.RESHAPE, dt, (u,), (1,) * len(shape))
                u = UOp(Ops.EXPAND, dt, (u,), tuple(shape))
            if len(_full_graphs) >= FULL_GRAPHS_KEPT:
                _full_graphs.clear()
            _full_graphs[key] = u
        return Tensor._of(u)

    def _alu(self, op: Ops, *others: Tensor, dtype: DType | None = None) -> Tensor:
        out = dtype if dtype is not None else self.dtype
        return Tensor._of(UOp(op, out, (self.uop,) + tuple(o.uop for o in others)))

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

    # ------------------------------------------------------------------ realize and data
    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and `others`, scheduled together in one call; `Tensor.realize(a, b)`)."""
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
        if not _executed_assigns and not _pending_assigns:
            # Nothing to substitute and no pending write to add (the usual eager op): no walk of the graph
            # here; the schedule cache's walk reports the ASSIGN nodes to mark as run.
            before = [t.uop for t in tensors]
            done, ran = _realize.realize_noting_assigns(*before)
            self._finish_realize(tensors, before, done, ran)
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
        if _pending_assigns:
            chosen = {id(t) for t in tensors}
            for ref in list(_pending_assigns.values()):
                p = ref()
                if p is not None and p.uop in nodes and id(p) not in chosen:
                    tensors.append(p)
                    chosen.add(id(p))
        before = [t.uop for t in tensors]
        done = _realize.realize(*before)
        assign = Ops.ASSIGN
        self._finish_realize(tensors, before, done, [n for n in nodes if n.op is assign])
        return self

    @staticmethod
    def _finish_realize(tensors: list[Tensor], before: list[UOp], done: tuple[UOp, ...],
                        ran: list[UOp]) -> None:
        """Point the realized tensors at their buffers and mark the ASSIGN nodes `ran` as run."""
        _autograd.remember_history(before, done)  # so backward() still works on a realized loss
        for t, u in zip(tensors, done):
            t.uop = u
        if _pending_assigns or _pending_view_assigns:
            for t in tensors:
                _pending_assigns.pop(id(t), None)
                _pending_view_assigns.pop(id(t), None)
        for n in ran:
            _executed_assigns[n] = n.src[0]

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
        # only Tensors register as leaves (autograd types them by the GradLeaf protocol)
        leaves = cast("list[Tensor]", _autograd.leaves_in(nodes) or _autograd.implicit_leaves_in(nodes))
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



# GATHER's gradient is a one-hot matmul built with Tensor ops (indexing.py); autograd, which cannot import
# this module, gets it here, where the Tensor class exists
_autograd.register_grad_rule(Ops.GATHER, Tensor._gather_grad)
