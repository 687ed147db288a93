"""Reverse-mode gradients derived from the tensor-graph UOps themselves.

Tensor ops record nothing: every op is built from a small primitive set (ALU, CAST, REDUCE_AXIS, movement,
CONTIGUOUS, COPY), and each primitive has one rule below that turns the gradient of its output into
gradients of its sources. The gradients are new lazy UOps, so they fuse with each other and with the
forward graph when they are realized (and a JIT can capture a whole training step).

Choices where the derivative is not unique (documented because tests and users depend on them):
- elementwise MAX (maximum, relu, clip): on a tie each side gets half the gradient, as torch's maximum;
  relu(0) therefore has gradient 0.5 (torch gives 0; the point has measure zero).
- REDUCE_AXIS MAX (max, amax): the gradient is split evenly between all maximal elements, as torch's
  full `max()` reduction.
- REDUCE_AXIS MUL (prod): exact with zeros (an element's gradient is the product of the others).
- POW: d/dx is 0 where the exponent is 0, d/dy is 0 where the base is 0 and the exponent >= 0 (torch).
- Comparisons, bitwise ops, TRUNC, IDIV/MOD, BITCAST and casts from or to non-float types pass nothing:
  they are piecewise constant or not real-valued. Only float nodes carry gradients.

This module sits below tensor.py and never imports it: tensors reach it only as objects with a `uop`
(the `GradLeaf` protocol), the process-wide switches it reads (`modes`) live here and Tensor's
`no_grad`/`training` class attributes read and write them, and the one rule that is a tensor-level
composite (GATHER's, a one-hot matmul) is registered by the tensor layer (`register_grad_rule`).
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from contextlib import ContextDecorator
from typing import Any, Protocol

from rawgrad.compiler.ir import COMPARISON, MOVEMENT, Ops, UOp
from rawgrad.dtype import DType, dtypes

_LN_2 = math.log(2.0)


class GradLeaf(Protocol):
    """What the leaf registry needs of a tensor (the Tensor class is the only one)."""

    @property
    def uop(self) -> UOp: ...

    @property
    def dtype(self) -> DType: ...

    @property
    def requires_grad(self) -> bool | None: ...


class GradModes:
    """The process-wide switches, kept here so that this module reads them without importing Tensor;
    `Tensor.no_grad` and `Tensor.training` are views of these two attributes."""

    def __init__(self) -> None:
        self.no_grad = False  # `with no_grad():` refuses backward and keeps no graph history
        self.training = False  # dropout and batch statistics; `with Tensor.train():`


modes = GradModes()

# Gradient rules for ops whose derivative is itself a tensor-level composite (GATHER's is a one-hot
# matmul); the tensor layer that builds the op registers its rule (rawgrad.tensor.indexing for GATHER).
GradRule = Callable[[UOp, UOp], tuple[UOp | None, ...]]
_composite_rules: dict[Ops, GradRule] = {}


def register_grad_rule(op: Ops, rule: GradRule) -> None:
    """rule(node, grad of node) -> the gradients of node's sources (None where none flows)."""
    _composite_rules[op] = rule

# Nodes made by `detach()`: gradients stop there. Kept by identity (not as a new op) so the scheduler
# and the interpreter see an ordinary no-op movement node.
_detached: weakref.WeakSet[UOp] = weakref.WeakSet()

# For a tensor that was realized while its graph led to a tensor requiring grad: its new BUFFER node ->
# the graph it was computed from, so `loss.item(); loss.backward()` still reaches the parameters.
_history: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()

# tensors with requires_grad=True, by id (Tensor.__eq__ is elementwise, so no WeakSet of Tensors)
_leaves: dict[int, weakref.ref[GradLeaf]] = {}
_implicit_leaves: dict[int, weakref.ref[GradLeaf]] = {}  # requires_grad=None tensors made by the user


# ---------------------------------------------------------------------- small UOp builders
def _alu(op: Ops, *srcs: UOp) -> UOp:
    dt = dtypes.bool if op in COMPARISON else srcs[-1].dtype if op is Ops.WHERE else srcs[0].dtype
    return UOp(op, dt, srcs)


def _const_like(u: UOp, value: Any) -> UOp:
    """`value` broadcast to u's shape, dtype and device (built as Tensor builds its constants)."""
    assert u.dtype is not None
    c = UOp.const(u.dtype, value, UOp(Ops.DEVICE, arg=u.device))
    if u.shape:
        c = UOp(Ops.RESHAPE, u.dtype, (c,), (1,) * len(u.shape))
        c = UOp(Ops.EXPAND, u.dtype, (c,), tuple(u.shape))
    return c


def _expand_to(g: UOp, shape: tuple[Any, ...]) -> UOp:
    return g if tuple(g.shape) == tuple(shape) else UOp(Ops.EXPAND, g.dtype, (g,), tuple(shape))


def _is_float(u: UOp) -> bool:
    return u.dtype is not None and u.dtype.is_float


# ---------------------------------------------------------------------- the rules
def _alu_grads(n: UOp, g: UOp) -> tuple[UOp | None, ...]:
    op, src = n.op, n.src
    x = src[0]
    if op is Ops.NEG:
        return (_alu(Ops.NEG, g),)
    if op is Ops.EXP2:
        return (_alu(Ops.MUL, g, _alu(Ops.MUL, n, _const_like(n, _LN_2))),)
    if op is Ops.LOG2:
        return (_alu(Ops.FDIV, g, _alu(Ops.MUL, x, _const_like(x, _LN_2))),)
    if op is Ops.SIN:  # cos(x) = sin(pi/2 - x): the IR has no COS
        return (_alu(Ops.MUL, g, _alu(Ops.SIN, _alu(Ops.SUB, _const_like(x, math.pi / 2), x))),)
    if op is Ops.SQRT:
        return (_alu(Ops.FDIV, g, _alu(Ops.MUL, n, _const_like(n, 2.0))),)
    if op is Ops.RECIP:
        return (_alu(Ops.NEG, _alu(Ops.MUL, g, _alu(Ops.MUL, n, n))),)
    if op is Ops.WHERE:
        c, a, b = src
        zero = _const_like(g, 0.0)
        return (None, _alu(Ops.WHERE, c, g, zero), _alu(Ops.WHERE, c, zero, g))
    if op is Ops.MULACC:
        a, b, _c = src
        return (_alu(Ops.MUL, g, b), _alu(Ops.MUL, g, a), g)
    if len(src) != 2:
        return (None,) * len(src)
    y = src[1]
    if op is Ops.ADD:
        return (g, g)
    if op is Ops.SUB:
        return (g, _alu(Ops.NEG, g))
    if op is Ops.MUL:
        return (_alu(Ops.MUL, g, y), _alu(Ops.MUL, g, x))
    if op is Ops.FDIV:
        gx = _alu(Ops.FDIV, g, y)
        return (gx, _alu(Ops.NEG, _alu(Ops.MUL, gx, n)))  # -g x / y^2 = -(g / y) * (x / y)
    if op is Ops.MAX:
        zero, half = _const_like(g, 0.0), _alu(Ops.MUL, g, _const_like(g, 0.5))
        tie = _alu(Ops.CMPEQ, x, y)
        gx = _alu(Ops.WHERE, _alu(Ops.CMPLT, y, x), g, _alu(Ops.WHERE, tie, half, zero))
        gy = _alu(Ops.WHERE, _alu(Ops.CMPLT, x, y), g, _alu(Ops.WHERE, tie, half, zero))
        return (gx, gy)
    if op is Ops.POW:
        zero = _const_like(g, 0.0)
        y_minus_1 = _alu(Ops.SUB, y, _const_like(y, 1.0))
        gx = _alu(Ops.MUL, g, _alu(Ops.MUL, y, _alu(Ops.POW, x, y_minus_1)))
        gx = _alu(Ops.WHERE, _alu(Ops.CMPEQ, y, _const_like(y, 0.0)), zero, gx)
        ln_x = _alu(Ops.MUL, _alu(Ops.LOG2, x), _const_like(x, _LN_2))
        gy = _alu(Ops.MUL, g, _alu(Ops.MUL, n, ln_x))
        base_zero = _alu(Ops.AND, _alu(Ops.CMPEQ, x, _const_like(x, 0.0)),
                         _alu(Ops.NOT, _alu(Ops.CMPLT, y, _const_like(y, 0.0))))
        return (gx, _alu(Ops.WHERE, base_zero, zero, gy))
    return (None, None)  # comparisons, bitwise, IDIV, MOD: piecewise constant


def _reduce_grads(n: UOp, g: UOp) -> UOp | None:
    x = n.src[0]
    rop, axes = n.arg[0], n.arg[1]
    if rop is Ops.ADD:
        return _expand_to(g, x.shape)
    if rop is Ops.MAX:
        hit = _alu(Ops.CMPEQ, x, _expand_to(n, x.shape))
        count = UOp(Ops.REDUCE_AXIS, x.dtype, (UOp(Ops.CAST, x.dtype, (hit,)),), (Ops.ADD, axes))
        share = _expand_to(_alu(Ops.FDIV, g, count), x.shape)
        return _alu(Ops.WHERE, hit, share, _const_like(x, 0.0))
    if rop is Ops.MUL:
        # out / x is the product of the others unless x is 0; there the product of the others is the
        # product of the non-zeros if x is the only zero, else 0
        zero = _const_like(x, 0.0)
        is_zero = _alu(Ops.CMPEQ, x, zero)
        nonzero_prod = UOp(Ops.REDUCE_AXIS, x.dtype, (_alu(Ops.WHERE, is_zero, _const_like(x, 1.0), x),),
                           (Ops.MUL, axes))
        n_zeros = UOp(Ops.REDUCE_AXIS, x.dtype, (UOp(Ops.CAST, x.dtype, (is_zero,)),), (Ops.ADD, axes))
        one_zero = _alu(Ops.CMPEQ, n_zeros, _const_like(n_zeros, 1.0))
        at_zero = _alu(Ops.WHERE, one_zero, nonzero_prod, _const_like(nonzero_prod, 0.0))
        g_full = _expand_to(g, x.shape)
        safe_x = _alu(Ops.WHERE, is_zero, _const_like(x, 1.0), x)
        others = _alu(Ops.WHERE, is_zero, _expand_to(at_zero, x.shape),
                      _alu(Ops.FDIV, _expand_to(n, x.shape), safe_x))
        return _alu(Ops.MUL, g_full, others)
    raise NotImplementedError(f"no gradient rule for REDUCE_AXIS {rop}")


def _movement_grad(n: UOp, g: UOp) -> UOp:
    x = n.src[0]
    op, arg = n.op, n.arg
    if op is Ops.RESHAPE:
        return UOp(Ops.RESHAPE, g.dtype, (g,), tuple(x.shape))
    if op is Ops.PERMUTE:
        inverse = tuple(sorted(range(len(arg)), key=lambda i: arg[i]))
        return UOp(Ops.PERMUTE, g.dtype, (g,), inverse)
    if op is Ops.EXPAND:
        axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, n.shape)) if a != b)
        return UOp(Ops.REDUCE_AXIS, g.dtype, (g,), (Ops.ADD, axes)) if axes else g
    if op is Ops.PAD:
        return UOp(Ops.SHRINK, g.dtype, (g,), tuple((b, b + s) for (b, _), s in zip(arg, x.shape)))
    if op is Ops.SHRINK:
        return UOp(Ops.PAD, g.dtype, (g,), tuple((b, s - e) for (b, e), s in zip(arg, x.shape)))
    if op is Ops.FLIP:
        return UOp(Ops.FLIP, g.dtype, (g,), arg)
    raise NotImplementedError(f"no gradient rule for {op}")


def _source_grads(n: UOp, g: UOp) -> tuple[UOp | None, ...]:
    """Gradients of n's sources given the gradient g of n (None: no gradient flows to that source)."""
    op = n.op
    if n in _detached or not _is_float(n):
        return (None,) * len(n.src)
    if op in MOVEMENT:
        grads: tuple[UOp | None, ...] = (_movement_grad(n, g),)
    elif op is Ops.REDUCE_AXIS:
        grads = (_reduce_grads(n, g),)
    elif op is Ops.CAST:
        grads = (UOp(Ops.CAST, n.src[0].dtype, (g,)),)  # only float -> float reaches here (filter below)
    elif op is Ops.CONTIGUOUS:
        grads = (g,)
    elif op is Ops.COPY:
        x = n.src[0]
        grads = (g if x.device == n.device else UOp(Ops.COPY, g.dtype, (g,), x.device),)
    elif op is Ops.GATHER:
        rule = _composite_rules.get(op)
        if rule is None:
            raise NotImplementedError(f"no gradient rule registered for {op} (rawgrad.tensor.indexing "
                                      "registers it)")
        grads = rule(n, g)
    elif op is Ops.BITCAST or op is Ops.ASSIGN:
        grads = (None,) * len(n.src)
    else:
        grads = _alu_grads(n, g)
    # ints and bools take no gradient (WHERE's condition, a float cast of an int, ...)
    return tuple(gr if gr is not None and _is_float(s) else None for s, gr in zip(n.src, grads))


# ---------------------------------------------------------------------- the backward walk
def compute_gradients(root: UOp, root_grad: UOp, targets: list[UOp]) -> dict[UOp, UOp]:
    """d(root)/d(target) for every target in root's graph, contracted with root_grad (root's shape).

    Targets reached only through non-differentiable ops get zeros; targets that are not in the graph at
    all are left out of the result (the caller decides whether that is an error)."""
    if tuple(root_grad.shape) != tuple(root.shape):
        raise ValueError(f"gradient of shape {root_grad.shape} does not match the output shape {root.shape}")
    wanted = set(targets)
    topo = root.toposort()
    # nodes with a target below them (not through a detach): only those need gradients
    leads: set[UOp] = set()
    for node in topo:
        if node in wanted or (node not in _detached and any(s in leads for s in node.src)):
            leads.add(node)
    grads: dict[UOp, UOp] = {root: root_grad}
    for node in reversed(topo):
        g = grads.get(node)
        if g is None or node not in leads or not node.src:
            continue
        for s, gs in zip(node.src, _source_grads(node, g)):
            if gs is None or s not in leads:
                continue
            prev = grads.get(s)
            grads[s] = gs if prev is None else _alu(Ops.ADD, prev, gs)
    in_graph = set(topo)
    return {t: grads[t] if t in grads else _const_like(t, 0.0) for t in targets if t in in_graph}


# ---------------------------------------------------------------------- detach and graph history
def detach_uop(u: UOp) -> UOp:
    """A node equal to u through which no gradient flows. A zero PAD (a 0-d value: a reshape there and
    back) is a no-op nothing else builds, so marking it cannot stop gradients anywhere else."""
    assert u.dtype is not None
    if u.shape:
        node = UOp(Ops.PAD, u.dtype, (u,), tuple((0, 0) for _ in u.shape))
    else:
        node = UOp(Ops.RESHAPE, u.dtype, (UOp(Ops.RESHAPE, u.dtype, (u,), (1,)),), ())
    _detached.add(node)
    return node


def register_leaf(t: GradLeaf, flag: bool | None) -> None:
    key = id(t)
    if flag:
        if not t.dtype.is_float:
            raise TypeError(f"only float tensors can require gradients, got {t.dtype}")
        _leaves[key] = weakref.ref(t, lambda _r: _leaves.pop(key, None))
    else:
        _leaves.pop(key, None)
    if flag is not None:
        _implicit_leaves.pop(key, None)


def register_implicit_leaf(t: GradLeaf) -> None:
    """A tensor the user made (from data or a factory) with requires_grad=None: tinygrad's "tracked if
    used". backward() gives it a .grad when its loss depends on it and no tensor in that graph has
    requires_grad=True (then torch's rule holds: only those). Results of ops are never implicit leaves."""
    if t.dtype.is_float:
        key = id(t)
        _implicit_leaves[key] = weakref.ref(t, lambda _r: _implicit_leaves.pop(key, None))


def implicit_leaves_in(nodes: set[UOp]) -> list[GradLeaf]:
    found = []
    for ref in list(_implicit_leaves.values()):
        t = ref()
        if t is not None and t.requires_grad is None and t.uop in nodes:
            found.append(t)
    return found


def leaves_in(nodes: set[UOp]) -> list[GradLeaf]:
    """Live tensors with requires_grad=True whose current node is one of `nodes`."""
    found = []
    for ref in list(_leaves.values()):
        t = ref()
        if t is not None and t.uop in nodes:
            found.append(t)
    return found


def leaf_nodes() -> set[UOp]:
    return {t.uop for r in list(_leaves.values()) if (t := r()) is not None}


def remember_history(before: list[UOp], after: tuple[UOp, ...]) -> None:
    """Called by realize: keep the graph behind each result that leads to a tensor requiring grad."""
    if modes.no_grad or not _leaves:
        return
    leaves = leaf_nodes()
    for old, new in zip(before, after):
        if old is new or old.op is Ops.ASSIGN or old in leaves:
            continue  # an assign's target or a leaf itself is where a graph starts, not a step in one
        if not leaves.isdisjoint(old.toposort()):
            _history[new] = old


def with_history(root: UOp, keep: set[UOp]) -> UOp:
    """root with every realized node that has a remembered graph replaced by that graph (repeatedly:
    the graph may read earlier realized results). Nodes in `keep` and anything under a detach stay."""
    for _ in range(1000):  # each round reaches strictly older graphs; the bound only guards bugs
        memo: dict[UOp, UOp] = {}
        changed = False
        for node in root.toposort():
            if node in _detached:
                memo[node] = node  # rebuilding it would make a new, unmarked node
            elif node in _history and node not in keep:
                memo[node] = _history[node]
                changed = True
            else:
                new_src = tuple(memo[s] for s in node.src)
                memo[node] = node if new_src == node.src else node.replace(src=new_src)
        root = memo[root]
        if not changed:
            return root
    raise RuntimeError("graph history does not terminate")


# ---------------------------------------------------------------------- context managers
class no_grad(ContextDecorator):  # noqa: N801 - torch's name
    """`with no_grad():` (or as a decorator): no gradient bookkeeping, and backward() is refused."""

    def __init__(self, disable: bool = True):
        self.disable = disable
        self.prev: list[bool] = []

    def __enter__(self) -> no_grad:
        self.prev.append(modes.no_grad)
        modes.no_grad = self.disable
        return self

    def __exit__(self, *exc: object) -> None:
        modes.no_grad = self.prev.pop()


def enable_grad() -> no_grad:
    return no_grad(False)


class train(ContextDecorator):  # noqa: N801 - tinygrad's name
    """`with Tensor.train():` sets Tensor.training (dropout, batch statistics) inside the block."""

    def __init__(self, mode: bool = True):
        self.mode = mode
        self.prev: list[bool] = []

    def __enter__(self) -> train:
        self.prev.append(modes.training)
        modes.training = self.mode
        return self

    def __exit__(self, *exc: object) -> None:
        modes.training = self.prev.pop()
