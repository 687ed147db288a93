"""The scheduler: cut a lazy tensor graph into kernels.

Rules (each asserted by kernel-count tests):
- movement ops cost nothing: they become ShapeTrackers (index expressions) on the loads they reach;
- elementwise chains fuse into one kernel, and into the reduce that consumes them;
- a reduce fuses into the elementwise ops above it when they see it unbroadcast (so `x.sum(1) * 2`,
  `mean` and `sum(axis)` without keepdim are one kernel); a kernel holds at most one reduce;
- a value is stored to its own buffer when it is requested, marked CONTIGUOUS, assigned, copied, or
  when it would otherwise be recomputed many times: a reduce or any computed value seen through an
  EXPAND that broadcasts it (softmax's max, a matmul input that is itself computed).

A kernel is a SINK of one STORE; its loads are `LOAD(DEFINE_GLOBAL(slot), VIEW(st))` where `st` maps
the kernel's loop space onto the buffer. See compiler/lower.py for what the loop space is.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgrad.compiler.ir import ALU, MOVEMENT, Ops, UOp, Variable, prod
from rawgrad.compiler.view import ShapeTracker
from rawgrad.dtype import DType, dtypes, f32_to_bf16_bits
from rawgrad.tensor.buffers import new_buffer, writable_view

DEPTH_CUT = 1000  # graph levels per kernel walk at most, in graphs deeper than DEEP_GRAPH
# Only graphs deeper than this are cut: building a kernel walks the graph recursively (a few Python frames
# per level, under the 20,000-frame limit create_schedule sets), and a cut changes the order kernels are
# scheduled in, so ordinary graphs (a GPT-2 124M decode step is ~1,200 levels deep) are never cut.
DEEP_GRAPH = 4000


@dataclass
class ScheduleItem:
    """One unit of device work: a kernel (`ast` is its SINK) or a copy (`ast` is None)."""

    ast: UOp | None
    bufs: list[UOp]  # BUFFER nodes by slot: bufs[0] is written, the rest are read
    var_vals: dict[UOp, int] = field(default_factory=dict)
    name: str = ""
    # the graph's CONST nodes behind the kernel's float-constant arguments, in argument order (scalar.0,
    # scalar.1, ...): the schedule cache reads the new constants' values through them
    scalar_sources: tuple[UOp, ...] = ()


# ---------------------------------------------------------------------- scalar constants as kernel arguments
# A float constant in a kernel (`x * 0.37`, a learning rate, an epsilon) is passed as a kernel argument, not
# baked into the code, so `x * 0.37` and `x * 0.38` share one compiled kernel (issue 15 §7: every new
# constant used to compile and load a new kernel). The argument is the constant's bit pattern as a signed
# integer of the dtype's width, carried in the kernel's ordinary i64 scalar slot and bitcast back in the
# kernel: no renderer or queue needs a float argument type, and the value is exact.
# Kept as literals: these few values fold into cheaper code (x * 1, where(m, x, 0), relu) and can create
# at most a few kernels per graph shape; ints (index arithmetic, `% n` strength-reduced by the compiler)
# and bools stay literals too.
SCALAR_ARG_PREFIX = "scalar."
LITERAL_FLOATS = (0.0, 1.0, -1.0)
_FLOAT_BITS = {dtypes.float16: (np.float16, np.int16), dtypes.float32: (np.float32, np.int32),
               dtypes.float64: (np.float64, np.int64)}
_SIGNED_OF_WIDTH = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def is_scalar_arg(var: UOp) -> bool:
    """Is this DEFINE_VAR a float constant passed as a kernel argument (see `scalar_arg`)?"""
    return var.op is Ops.DEFINE_VAR and str(var.arg[0]).startswith(SCALAR_ARG_PREFIX)


def _passes_as_argument(dtype: DType, value: Any) -> bool:
    return dtype.is_float and isinstance(value, float) and value not in LITERAL_FLOATS


def _float_bits(dtype: DType, value: float) -> int:
    """`value` rounded to `dtype` (as a literal of that dtype would be), as a signed integer bit pattern."""
    with np.errstate(over="ignore"):  # a value past the dtype's range becomes inf, as a literal would
        if dtype == dtypes.bfloat16:
            return int(f32_to_bf16_bits(np.array([value], np.float32)).view(np.int16)[0])
        float_type, int_type = _FLOAT_BITS[dtype]
        return int(np.array([value], float_type).view(int_type)[0])


def scalar_arg(dtype: DType, value: float, index: int) -> tuple[UOp, UOp, int]:
    """(the argument variable, the kernel value expression reading it, the argument's value) for the
    `index`-th float constant of a kernel. Variables are named by position in the kernel, not by value, so
    kernels that differ only in their constants have equal ASTs (one compile, one cache entry)."""
    signed = _SIGNED_OF_WIDTH[dtype.itemsize]
    var = Variable(f"{SCALAR_ARG_PREFIX}{index}", int(signed.min), int(signed.max))
    return var, UOp(Ops.BITCAST, dtype, (var.cast(signed),)), _float_bits(dtype, value)


def _has_mask(st: ShapeTracker) -> bool:
    return any(v.mask is not None for v in st.views)


def _unbind(x: Any, var_vals: dict[UOp, int]) -> Any:
    """Replace bound Variables inside a size by the bare Variable, recording the bound value."""
    if not isinstance(x, UOp):
        return x
    binds = [n for n in x.toposort() if n.op is Ops.BIND]
    if not binds:
        return x
    mapping = {}
    for b in binds:
        var, val = b.unbind()
        if var in var_vals and var_vals[var] != val:
            raise ValueError(f"Variable {var.arg[0]!r} bound to both {var_vals[var]} and {val} "
                             "in one realize")
        var_vals[var] = val
        mapping[b] = var
    return x.substitute(mapping)


def _unbind_arg(arg: Any, var_vals: dict[UOp, int]) -> Any:
    if isinstance(arg, tuple):
        return tuple(_unbind_arg(a, var_vals) for a in arg)
    return _unbind(arg, var_vals)


# ShapeTracker results kept across schedules (they are pure functions of hashable, immutable values): a
# model's repeated blocks compose the same views over and over (MiniLM's 6 layers: ~1600 compositions in
# its first eager call, each merging views with symbolic simplification).
VIEW_CACHE_SIZE = 8192


@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def _compose(a: ShapeTracker, b: ShapeTracker) -> ShapeTracker:
    return a + b


@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def _moved(shape: tuple[Any, ...], op: Ops, arg: Any) -> ShapeTracker:
    """The view of a movement op over a contiguous tensor of `shape`."""
    return apply_movement(ShapeTracker.from_shape(shape), op, arg)


@functools.lru_cache(maxsize=VIEW_CACHE_SIZE)
def _contiguous(shape: tuple[Any, ...]) -> ShapeTracker:
    return ShapeTracker.from_shape(shape)


def apply_movement(st: ShapeTracker, op: Ops, arg: Any) -> ShapeTracker:
    if op is Ops.RESHAPE:
        return st.reshape(arg)
    if op is Ops.PERMUTE:
        return st.permute(arg)
    if op is Ops.EXPAND:
        return st.expand(arg)
    if op is Ops.PAD:
        return st.pad(arg)
    if op is Ops.SHRINK:
        return st.shrink(arg)
    if op is Ops.FLIP:
        return st.flip(arg)
    raise AssertionError(op)


def _only_ones_reshape(node: UOp) -> bool:
    """A RESHAPE that only adds or removes size-1 dims (it keeps a reduce fusable)."""
    if node.op is not Ops.RESHAPE:
        return False
    strip = lambda s: tuple(d for d in s if not (isinstance(d, int) and d == 1))
    return strip(node.shape) == strip(node.src[0].shape)


def _contiguous_buffer_view(u: UOp) -> UOp | None:
    """The BUFFER if `u` is the buffer itself or a plain reshape of it; else None."""
    if u.op is Ops.BUFFER:
        return u
    if u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER:
        return u.src[0]
    return None


class _Scheduler:
    def __init__(self, outs: list[UOp]):
        self.var_vals: dict[UOp, int] = {}
        self.items: list[ScheduleItem] = []
        self.realized: dict[UOp, UOp] = {}  # graph node -> BUFFER holding its value (contiguous)
        # ASSIGN into a view: its value sits in its BUFFER (in `realized`) at this ShapeTracker, not
        # contiguously from element 0
        self.assigned_views: dict[UOp, ShapeTracker] = {}
        self.consumers: dict[UOp, int] = {}
        for node in UOp(Ops.SINK, None, tuple(outs)).toposort():
            for s in node.src:
                self.consumers[s] = self.consumers.get(s, 0) + 1
        self.forced: set[UOp] = set()
        self.depth_cuts: list[UOp] = []  # deep computed nodes stored first, bottom up (see _mark_forced)
        self._memory_cache: dict[UOp, bool] = {}
        self._mark_forced(outs)

    # ------------------------------------------------------------------ what must be stored
    def _reads_memory(self, u: UOp) -> bool:
        """Does computing `u` read a buffer or reduce (so recomputing it per broadcast copy costs)?
        Filled for every node in _mark_forced, sources first, so no recursion on deep graphs."""
        return self._memory_cache[u]

    def _mark_forced(self, outs: list[UOp]) -> None:
        depth: dict[UOp, int] = {}
        for node in UOp(Ops.SINK, None, tuple(outs)).toposort():
            self._memory_cache[node] = node.op in (Ops.BUFFER, Ops.REDUCE_AXIS, Ops.COPY, Ops.ASSIGN,
                                                   Ops.CONTIGUOUS, Ops.GATHER) or \
                any(self._memory_cache[s] for s in node.src)
            depth[node] = 1 + max((depth[s] for s in node.src), default=0)
            if depth[node] % DEPTH_CUT == 0 and (node.op in ALU or node.op is Ops.CAST):
                self.depth_cuts.append(node)
            if node.op in (Ops.CONTIGUOUS, Ops.ASSIGN, Ops.COPY):
                self.forced.add(node)
            if node.op is Ops.REDUCE_AXIS and self.consumers.get(node, 0) > 1:
                self.forced.add(node)
            if node.op is Ops.EXPAND:
                base = node.src[0].base
                grows = not all(isinstance(a, int) and isinstance(b, int) and a == b
                                for a, b in zip(node.shape, node.src[0].shape))
                if grows and base.op not in (Ops.BUFFER, Ops.CONST) and self._reads_memory(base):
                    self.forced.add(base)
        if max(depth.values(), default=0) <= DEEP_GRAPH:
            self.depth_cuts = []
        # A chain of 50,000 adds would overflow Python's stack while a kernel is built: every DEPTH_CUT
        # levels the value is stored, and schedule() stores those first, bottom up, so no kernel's walk is
        # deeper than DEPTH_CUT.
        self.forced.update(self.depth_cuts)

    # ------------------------------------------------------------------ entry
    def schedule(self, outs: list[UOp]) -> list[UOp]:
        results = []
        for out in outs:
            if self.depth_cuts:
                # the cuts below this output, bottom up (toposort order), just before the output itself:
                # outputs keep their order, so an assign among them still runs before the reads after it
                below = set(out.toposort())
                for node in self.depth_cuts:
                    if node in below:
                        self.realize_node(node)
            buf = _contiguous_buffer_view(out)
            if buf is not None:
                results.append(out)
                continue
            buf = self.realize_node(out)
            if out in self.assigned_views:
                results.append(out.src[0])  # the target view now reads what was written
                continue
            if any(not isinstance(d, int) for d in out.shape):
                # the buffer is sized for the Variables' maximum and holds the value contiguously in its
                # symbolic shape: its first prod(shape) elements, then that shape
                flat = UOp(Ops.SHRINK, buf.dtype, (buf,), ((0, prod(out.shape)),))
                results.append(UOp(Ops.RESHAPE, buf.dtype, (flat,), out.shape))
                continue
            results.append(buf if len(out.shape) == 1 and out.shape[0] == buf.arg[1] else
                           UOp(Ops.RESHAPE, buf.dtype, (buf,), out.shape))
        return results

    def realize_node(self, node: UOp) -> UOp:
        """Schedule the kernels that put `node`'s value into a buffer; return that BUFFER."""
        if node in self.realized:
            return self.realized[node]
        if node.op is Ops.BUFFER:
            return node
        if node.op is Ops.CONTIGUOUS:
            inner = _contiguous_buffer_view(node.src[0])
            if inner is not None:
                self.realized[node] = inner
                return inner
            buf = self.realize_node(node.src[0])
            self.realized[node] = buf
            return buf
        if node.op is Ops.COPY:
            src_buf = self.realize_node(node.src[0])
            dst = new_buffer(node.arg, src_buf.arg[1], src_buf.dtype)  # type: ignore[arg-type]
            self.items.append(ScheduleItem(None, [dst, src_buf], name=f"copy {src_buf.device}->{node.arg}"))
            self.realized[node] = dst
            return dst
        if node.op is Ops.ASSIGN:
            return self._schedule_assign(node)
        size = prod(node.shape)
        size = _unbind(size, self.var_vals)
        if not isinstance(size, int):
            # symbolic sizes: the buffer is allocated for the largest value the variables can take
            size = int(size.vmax)
        buf = new_buffer(node.device, size, node.dtype)  # type: ignore[arg-type]
        self._schedule_kernel(node, buf, None)
        self.realized[node] = buf
        return buf

    def _schedule_assign(self, node: UOp) -> UOp:
        target, value = node.src
        tbuf = _contiguous_buffer_view(target)
        if tbuf is None:
            tbuf = self.realized.get(target)
        if tbuf is not None:
            self._schedule_kernel(value, tbuf, None)
            self.realized[node] = tbuf
            return tbuf
        view = writable_view(target)
        if view is None:
            raise ValueError("assign target must be a realized tensor or a shrink/reshape/permute/flip view "
                             "of one (call .realize() first)")
        vbuf, chain = view
        # the kernel loops over the view's shape and stores each element where the view maps it in the
        # buffer, so only the viewed elements are written (a Variable offset stays a kernel argument)
        st = ShapeTracker.from_shape(vbuf.shape)
        for m in chain:
            st = apply_movement(st, m.op, _unbind_arg(m.arg, self.var_vals))
        self._schedule_kernel(value, vbuf, st)
        self.realized[node] = vbuf
        self.assigned_views[node] = st
        return vbuf

    # ------------------------------------------------------------------ kernels
    def _schedule_kernel(self, root: UOp, out_buf: UOp, out_view: ShapeTracker | None) -> None:
        """One kernel storing `root` into `out_buf`: contiguously, or through `out_view` (a view of the
        buffer with root's shape) for an assign into a view."""
        kb = _KernelBuilder(self, root, out_buf, out_view)
        ast = kb.build()
        if kb.reads_output_differently:
            # the value reads the buffer it overwrites through another view: compute it aside first
            tmp = self.realize_node(UOp(Ops.CONTIGUOUS, root.dtype, (root,)))
            kb = _KernelBuilder(self, UOp(Ops.RESHAPE, tmp.dtype, (tmp,), root.shape), out_buf, out_view)
            ast = kb.build()
        var_vals = {v: self.var_vals[v] for v in kb.variables if not is_scalar_arg(v)}
        var_vals.update(kb.scalar_vals)
        self.items.append(ScheduleItem(ast, kb.bufs, var_vals, kb.name(), tuple(kb.scalar_nodes)))


class _KernelBuilder:
    def __init__(self, sched: _Scheduler, root: UOp, out_buf: UOp, out_view: ShapeTracker | None = None):
        self.s = sched
        self.root = root
        self.bufs: list[UOp] = [out_buf]
        self.reduce: UOp | None = None
        self.variables: set[UOp] = set()
        self.scalar_vals: dict[UOp, int] = {}  # float constants passed as arguments (see `scalar_arg`)
        self.scalar_nodes: list[UOp] = []  # the CONST node behind each of them, in the same order
        self.reads_output_differently = False
        self.ops_seen: list[str] = []
        self.memo: dict[tuple[UOp, ShapeTracker], UOp] = {}
        self.loop_shape = self._loop_shape()
        self.out_view = out_view
        # where each element of the loop space is stored (a fused reduce's keepdim shape differs from
        # the root's only by size-1 dims, so the view reshapes onto it)
        self.out_st = ShapeTracker.from_shape(self.loop_shape) if out_view is None else \
            out_view.reshape(self.loop_shape)

    def _loop_shape(self) -> tuple[Any, ...]:
        """The kernel's output loop space: the fused reduce's keepdim shape, else the root's shape."""
        stack = [self.root]
        seen = set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n is not self.root and (n in self.s.realized or n in self.s.forced):
                continue
            if n.op is Ops.REDUCE_AXIS:
                return self._shape(n.shape)
            if n.op in ALU or n.op in (Ops.CAST, Ops.BITCAST) or _only_ones_reshape(n):
                stack.extend(n.src)
        return self._shape(self.root.shape)

    def _shape(self, shape: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(_unbind(d, self.s.var_vals) for d in shape)

    def name(self) -> str:
        kind = "r" if self.reduce is not None else "E"
        dims = "_".join(str(d) if isinstance(d, int) else d.render() for d in self.loop_shape) or "scalar"
        return f"{kind}_{dims}"

    def global_for(self, buf: UOp) -> UOp:
        if buf not in self.bufs:
            self.bufs.append(buf)
        return UOp(Ops.DEFINE_GLOBAL, buf.dtype, (), self.bufs.index(buf))

    def build(self) -> UOp:
        out_st = self.out_st
        self.variables.update(out_st.variables())
        root_st = ShapeTracker.from_shape(self._shape(self.root.shape)).reshape(self.loop_shape)
        value = self.visit(self.root, root_st, True, True)
        for d in self.loop_shape:
            if isinstance(d, UOp):
                self.variables.update(d.variables())
        for v in value.toposort():
            if v.op is Ops.DEFINE_VAR:
                self.variables.add(v)
            if v.op is Ops.VIEW:
                self.variables.update(v.arg.variables())
            if v.op is Ops.REDUCE_AXIS:
                for d in v.arg[2]:
                    if isinstance(d, UOp):
                        self.variables.update(d.variables())
        store = UOp(Ops.STORE, None, (self.global_for(self.bufs[0]), UOp(Ops.VIEW, None, (), out_st), value))
        return UOp(Ops.SINK, None, (store,))

    def load(self, buf: UOp, st: ShapeTracker) -> UOp:
        if buf is self.bufs[0] and st != self.out_st and (st.shape == self.loop_shape or
                                                          self.out_view is not None):
            # another lane may overwrite the element before it is read; a view store is checked
            # for every read of its buffer (a reduce reading it runs inside the store's loop)
            self.reads_output_differently = True
        if buf.arg[1] == 0:
            # an empty buffer can only be read through a pad mask that is always false
            return UOp(Ops.CONST, buf.dtype, (UOp(Ops.VIEW, None, (), st),), 0)
        return UOp(Ops.LOAD, buf.dtype, (self.global_for(buf), UOp(Ops.VIEW, None, (), st)))

    def load_value(self, node: UOp, buf: UOp, st: ShapeTracker) -> UOp:
        """Read the stored value of `node` from `buf` (through the view an assign wrote it to)."""
        where = self.s.assigned_views.get(node)
        if where is None:
            where = _contiguous(self._shape(node.shape))
        return self.load(buf, _compose(where, st))

    def visit(self, node: UOp, st: ShapeTracker, single: bool, above_reduce: bool) -> UOp:
        if node.base.op is Ops.CONST:
            # a constant (and the movement ops over it) is not memoized: each use is its own argument, so
            # which constants share an argument never depends on their values (equal constants are one
            # hash-consed node; sharing would make `x * 2.5 + y * 2.5` another kernel than `x * 2.5 + y * 3`)
            return self._visit(node, st, single, above_reduce)
        key = (node, st)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        out = self._visit(node, st, single, above_reduce)
        self.memo[key] = out
        return out

    def _visit(self, node: UOp, st: ShapeTracker, single: bool, above_reduce: bool) -> UOp:
        s = self.s
        if node is not self.root:
            single = single and s.consumers.get(node, 0) <= 1
            if node in s.realized:
                return self.load_value(node, s.realized[node], st)
            if node in s.forced and node.op is not Ops.BUFFER:
                return self.load_value(node, s.realize_node(node), st)
        op = node.op
        if op is Ops.BUFFER:
            return self.load(node, _compose(_contiguous(node.shape), st))
        if op is Ops.CONST:
            if _passes_as_argument(node.dtype, node.arg):  # type: ignore[arg-type]
                self.scalar_nodes.append(node)
                return self.scalar_value(node.dtype, node.arg, st)  # type: ignore[arg-type]
            return UOp(Ops.CONST, node.dtype, (UOp(Ops.VIEW, None, (), st),), node.arg)
        if op in (Ops.DEFINE_VAR, Ops.BIND):
            var = _unbind(node, s.var_vals)
            self.variables.add(var)
            return var if node.dtype == var.dtype else var.cast(node.dtype)  # type: ignore[arg-type]
        if op in MOVEMENT:
            src = node.src[0]
            inner = _moved(self._shape(src.shape), op, _unbind_arg(node.arg, s.var_vals))
            keep = above_reduce and _only_ones_reshape(node)
            composed = _compose(inner, st)
            value = self.visit(src, composed, single, keep)
            if op is Ops.PAD and src.base.op not in (Ops.BUFFER, Ops.CONST) and src.base not in s.realized:
                # the padded region holds zeros, not f(0): mask the computed value, not only its loads
                valid = UOp(Ops.CONST, dtypes.bool, (UOp(Ops.VIEW, None, (), composed),), True)
                value = UOp(Ops.WHERE, node.dtype, (valid, value, UOp(Ops.CONST, node.dtype, (), 0)))
            return value
        if op in ALU or op in (Ops.CAST, Ops.BITCAST):
            srcs = tuple(self.visit(x, st, single, above_reduce) for x in node.src)
            return UOp(op, node.dtype, srcs, node.arg)
        if op is Ops.REDUCE_AXIS:
            fusable = (self.reduce is None and above_reduce and (single or node is self.root)
                       and st.shape == self.loop_shape and self._shape(node.shape) == self.loop_shape
                       and st.contiguous)
            if not fusable:
                buf = s.realize_node(node)
                return self.load(buf, _compose(_contiguous(self._shape(node.shape)), st))
            self.reduce = node
            full = self._shape(node.src[0].shape)
            inner_value = self.visit(node.src[0], ShapeTracker.from_shape(full), single, False)
            rop, axes = node.arg[0], tuple(node.arg[1])
            return UOp(Ops.REDUCE_AXIS, node.dtype, (inner_value,), (rop, axes, full))
        if op is Ops.GATHER:
            return self._gather(node, st, single, above_reduce)
        if op in (Ops.CONTIGUOUS, Ops.COPY, Ops.ASSIGN):
            return self.load_value(node, s.realize_node(node), st)
        raise NotImplementedError(f"scheduler cannot handle {op} in a tensor graph")

    def scalar_value(self, dtype: DType, value: float, st: ShapeTracker) -> UOp:
        """A float constant read from a kernel argument; where `st` pads it, the padding reads 0."""
        var, expr, word = scalar_arg(dtype, value, len(self.scalar_vals))
        self.scalar_vals[var] = word
        if not _has_mask(st):
            return expr
        valid = UOp(Ops.CONST, dtypes.bool, (UOp(Ops.VIEW, None, (), st),), True)
        return UOp(Ops.WHERE, dtype, (valid, expr, UOp(Ops.CONST, dtype, (), 0.0)))

    def _gather(self, node: UOp, st: ShapeTracker, single: bool, above_reduce: bool) -> UOp:
        """Table rows by index: the table is read from a buffer at an address computed from the index
        value, so it must be realized; the index expression fuses like any other value."""
        table, indices = node.src
        tbuf = _contiguous_buffer_view(table)
        if tbuf is None:
            tbuf = self.s.realize_node(table)
        ishape = self._shape(indices.shape)
        out_shape = self._shape(node.shape)
        # the index of output element (s..., d) is indices[s...]: broadcast along the row axis
        idx_st = ShapeTracker.from_shape(ishape).reshape((*ishape, 1)).expand(out_shape) + st
        row = self.visit(indices, idx_st, single, above_reduce)
        # the output space flattened to (N, D): position p holds column p % D of row indices[p // D]
        out_st = ShapeTracker.from_shape(out_shape) + st
        return UOp(Ops.GATHER, node.dtype, (self.global_for(tbuf), UOp(Ops.VIEW, None, (), out_st), row),
                   tuple(table.shape))


def create_schedule(outs: list[UOp]) -> tuple[list[ScheduleItem], list[UOp]]:
    """Kernels (in dependency order) that compute `outs`, and for each out a node reading its buffer."""
    if sys.getrecursionlimit() < 20000:
        sys.setrecursionlimit(20000)
    sched = _Scheduler(outs)
    results = sched.schedule(outs)
    return sched.items, results
