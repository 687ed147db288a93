"""The eager schedule cache: a realize of a graph shaped like one already scheduled reuses its schedule.

Scheduling a small graph costs far more Python than launching its kernel (issue 21: ~150 of ~200 us per
eager `(x + 1).realize()`), and an eager loop schedules the same shape over and over with new buffers and
new constants. `schedule` keys a graph by its structure and keeps, per key, a template of the schedule the
scheduler made for it; a later graph with the same key gets the template's kernels with its own buffers
and its own constants bound, without running the scheduler (and so without lowering or compiling: the
kernel ASTs are the cached ones, found in the kernel cache by identity).

The key is the graph in topological order, each node as (op, dtype, arg, source positions), except:
- a BUFFER is (BUFFER, dtype, size, device position): which buffer it is is left out, but whether two
  reads are of one buffer or of two stays in (one node or two in the order);
- a float CONST passed to its kernel as an argument (schedule.py `scalar_arg`) leaves its value out: the
  value is read from the new graph's node and bound as that argument.
Everything the scheduler decides from (fusion, what is stored, views, assigns, dtypes, shapes, bound
Variable values, devices) is in the key, so two graphs with one key get the same schedule but for the
buffers and the argument values, which the template maps back to the new graph's nodes. New buffers
(intermediates and outputs) are made fresh for every realize, as the scheduler would.

The template holds no BUFFER node (that would keep its device memory alive): buffers are positions in
the key or specs of buffers to make.
"""
from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from rawgrad.compiler.ir import Ops, UOp, _arg_key
from rawgrad.dtype import DType, dtypes
from rawgrad.tensor.buffers import new_buffer
from rawgrad.tensor.schedule import (
    ScheduleItem,
    _float_bits,
    _passes_as_argument,
    create_schedule,
    is_scalar_arg,
)

__all__ = ["ScheduleCacheStats", "clear", "schedule", "stats"]

# Templates kept, the oldest dropped first: a process that keeps making new graph shapes does not
# grow without bound (a template is a few hundred bytes per kernel plus its key).
MAX_TEMPLATES = 512
# Graphs with more nodes than this are scheduled without the cache: the key alone costs a walk of the whole
# graph, and a graph this large (a whole model step) has its own cache in TinyJit.
MAX_KEY_NODES = 20_000

# A float constant's key entry: stands where the value would be (the marker is no value an arg can have).
_ARG_MARKER = object()
# Packing a Python float as its dtype's bits without numpy (the rounding is the C cast numpy does too);
# values past the dtype's range raise OverflowError here and go through numpy, which makes them inf.
_STRUCT_BITS = {dtypes.float32: (struct.Struct("<f"), struct.Struct("<i")),
                dtypes.float64: (struct.Struct("<d"), struct.Struct("<q")),
                dtypes.float16: (struct.Struct("<e"), struct.Struct("<h"))}


@dataclass
class ScheduleCacheStats:
    """Counters tests and benchmarks read: `hits` realizes served by a template, `misses` realizes that
    ran the scheduler (and made a template), `uncached` realizes too large to key."""

    hits: int = 0
    misses: int = 0
    uncached: int = 0


_stats = ScheduleCacheStats()


def stats() -> ScheduleCacheStats:
    return _stats


def float_bits(dtype: DType, value: float) -> int:
    """schedule.py `_float_bits` without numpy for the common dtypes (same result)."""
    codec = _STRUCT_BITS.get(dtype)
    if codec is not None:
        try:
            return int(codec[1].unpack(codec[0].pack(value))[0])
        except OverflowError:
            pass
    return _float_bits(dtype, value)


# Where a node keeps its own part of the key, (op, dtype, arg key) (BUFFER: size instead of arg): nodes are
# immutable, and the nodes a repeated eager op reuses (constants, their views, devices) then cost one lookup.
_ENTRY_KEY = "schedule_key_entry"


def _node_entry(node: UOp) -> tuple[Any, ...]:
    e: tuple[Any, ...] | None = node._cached.get(_ENTRY_KEY)
    if e is None:
        op = node.op
        if op is Ops.BUFFER:
            e = (op, node.dtype, node.arg[1])
        elif op is Ops.CONST and _passes_as_argument(node.dtype, node.arg):  # type: ignore[arg-type]
            e = (op, node.dtype, _ARG_MARKER)
        else:
            e = (op, node.dtype, _arg_key(node.arg))
        node._cached[_ENTRY_KEY] = e
    return e


def _graph_key(outs: list[UOp]) -> tuple[_Key, list[UOp], dict[UOp, int]] | None:
    """(key, nodes in key order, position of each node); None past MAX_KEY_NODES. Each entry is the node's
    own part (_node_entry) and the positions of its sources."""
    nodes: list[UOp] = []
    index: dict[UOp, int] = {}
    entries: list[Any] = []
    # iterative post-order (deep graphs must not hit the recursion limit), sources in order
    stack: list[tuple[UOp, bool]] = [(o, False) for o in reversed(outs)]
    pop, push, get = stack.pop, stack.append, index.__getitem__
    while stack:
        node, expanded = pop()
        if node in index:
            continue
        if expanded:
            index[node] = len(nodes)
            nodes.append(node)
            entries.append((_node_entry(node), tuple(map(get, node.src))))
            continue
        push((node, True))
        for s in reversed(node.src):
            if s not in index:
                push((s, False))
        if len(stack) > MAX_KEY_NODES:  # (a wide graph pushes many before any is numbered)
            return None
    if len(nodes) > MAX_KEY_NODES:
        return None
    entries.append(tuple(map(get, outs)))
    return _Key(tuple(entries)), nodes, index


class _Key:
    """A graph key that hashes once: a tuple's hash is not cached, and a dict lookup, a store and an
    eviction would each hash every entry again (thousands for a model step)."""

    __slots__ = ("entries", "h")

    def __init__(self, entries: tuple[Any, ...]) -> None:
        self.entries, self.h = entries, hash(entries)

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self.h == other.h and self.entries == other.entries


# A buffer in a template: a position in the key (>= 0, an input buffer of the new graph) or ~k (< 0), the
# k-th buffer made fresh for this realize.
BufRef = int


@dataclass(frozen=True)
class _ItemTemplate:
    ast: UOp | None
    bufs: tuple[BufRef, ...]
    var_vals: dict[UOp, int]  # the Variables bound in the graph (their values are in the key)
    scalars: tuple[tuple[UOp, DType, int], ...]  # (argument variable, dtype, key position of its CONST)
    name: str


@dataclass(frozen=True)
class _Template:
    new_buffers: tuple[tuple[str, int, DType], ...]  # (device, size, dtype) of each fresh buffer
    items: tuple[_ItemTemplate, ...]
    results: tuple[Any, ...]  # per out: an encoded node (see _encode)
    assigns: tuple[int, ...] = ()  # key positions of the ASSIGN nodes (the caller marks them as run)


def _encode(u: UOp, index: dict[UOp, int], bufref: Any) -> Any:
    """A result node as the template keeps it: ("n", key position) for a node of the graph, ("b", ref) for
    a buffer, else ("u", op, dtype, arg, sources) rebuilt over them."""
    if u in index:
        return ("n", index[u])
    if u.op is Ops.BUFFER:
        return ("b", bufref(u))
    return ("u", u.op, u.dtype, u.arg, tuple(_encode(s, index, bufref) for s in u.src))


def _decode(enc: Any, nodes: list[UOp], bufs: list[UOp]) -> UOp:
    kind = enc[0]
    if kind == "n":
        return nodes[enc[1]]
    if kind == "b":
        ref = enc[1]
        return nodes[ref] if ref >= 0 else bufs[~ref]
    return UOp(enc[1], enc[2], tuple(_decode(s, nodes, bufs) for s in enc[4]), enc[3])


def _make_template(items: list[ScheduleItem], results: list[UOp], index: dict[UOp, int]) -> _Template | None:
    """The template of a schedule just made, or None when it cannot be one (a float constant argument that
    is not a node of the graph: nothing in the key would say where its value comes from)."""
    new_refs: dict[UOp, int] = {}
    specs: list[tuple[str, int, DType]] = []

    def bufref(b: UOp) -> BufRef:
        pos = index.get(b)
        if pos is not None:
            return pos
        k = new_refs.get(b)
        if k is None:
            k = new_refs[b] = len(specs)
            assert b.dtype is not None
            specs.append((b.device, b.arg[1], b.dtype))
        return ~k

    its = []
    for si in items:
        scalar_vars = [v for v in si.var_vals if is_scalar_arg(v)]
        if len(scalar_vars) != len(si.scalar_sources) or any(c not in index for c in si.scalar_sources):
            return None
        scalars = tuple((v, c.dt, index[c]) for v, c in zip(scalar_vars, si.scalar_sources))
        static = {v: x for v, x in si.var_vals.items() if not is_scalar_arg(v)}
        its.append(_ItemTemplate(si.ast, tuple(bufref(b) for b in si.bufs), static, scalars, si.name))
    res = tuple(_encode(r, index, bufref) for r in results)
    assigns = tuple(sorted(i for n, i in index.items() if n.op is Ops.ASSIGN))
    return _Template(tuple(specs), tuple(its), res, assigns)


def _instantiate(t: _Template, nodes: list[UOp]) -> tuple[list[ScheduleItem], list[UOp]]:
    fresh = [new_buffer(dev, size, dt) for dev, size, dt in t.new_buffers]
    items = []
    for it in t.items:
        bufs = [nodes[r] if r >= 0 else fresh[~r] for r in it.bufs]
        if it.scalars:
            var_vals = dict(it.var_vals)
            for var, dt, pos in it.scalars:
                var_vals[var] = float_bits(dt, nodes[pos].arg)
        else:
            var_vals = it.var_vals
        items.append(ScheduleItem(it.ast, bufs, var_vals, it.name))
    return items, [_decode(r, nodes, fresh) for r in t.results]


# Templates by key, oldest first: past MAX_TEMPLATES the oldest made is dropped (first in, first out: a hit
# does not reorder, which would cost a lock and another lookup on every eager realize).
_templates: OrderedDict[_Key, _Template] = OrderedDict()
_lock = threading.Lock()


def clear() -> None:
    """Drop every template (tests; the next realize of each shape schedules again)."""
    with _lock:
        _templates.clear()


def schedule(outs: list[UOp]) -> tuple[list[ScheduleItem], list[UOp]]:
    """create_schedule(outs), from a template when a graph of the same structure was scheduled before."""
    items, results, _ = schedule_noting_assigns(outs)
    return items, results


def schedule_noting_assigns(outs: list[UOp]) -> tuple[list[ScheduleItem], list[UOp], list[UOp]]:
    """`schedule`, and the ASSIGN nodes of the graph (found by the key's walk, which sees every node: the
    caller that marks assigns as run then needs no walk of its own)."""
    keyed = _graph_key(outs)
    if keyed is None:
        _stats.uncached += 1
        assigns = list(dict.fromkeys(n for o in outs for n in o.toposort() if n.op is Ops.ASSIGN))
        return (*create_schedule(outs), assigns)
    key, nodes, index = keyed
    t = _templates.get(key)
    if t is not None:
        _stats.hits += 1
        return (*_instantiate(t, nodes), [nodes[i] for i in t.assigns])
    _stats.misses += 1
    assigns = [n for n in nodes if n.op is Ops.ASSIGN]
    items, results = create_schedule(outs)
    made = _make_template(items, results, index)
    if made is None:
        return items, results, assigns
    with _lock:
        _templates[key] = made
        while len(_templates) > MAX_TEMPLATES:
            _templates.popitem(last=False)
    return items, results, assigns
