"""Lower a kernel (SINK of one STORE, see tensor/schedule.py) to a linear program of loops.

The kernel's loop space is `full_shape`: the output shape, with the reduced axes at their input size.
Output axes are looped outside, reduce axes inside. The leading output axes form the *global range*
that the device splits across workers (CPU threads); the kernel receives [start, end) of it.
Optimizations (compiler/opt.py) may *upcast* output axes: split an axis by a factor and unroll the
factor, so one iteration computes a small register tile (matmul) and loads are shared.

The linear program is a list of statement UOps in execution order:
  RANGE (loop begins; also usable as the loop counter value), ENDRANGE, DEFINE_ACC (an accumulator,
  initialised where it appears), ACC_UPDATE (acc = value), STORE(INDEX(buf, idx), value)
with expression DAGs (ALU, CAST, BITCAST, CONST, LOAD(INDEX[, valid]), LOAD(acc), DEFINE_VAR, SPECIAL)
hanging off them. A renderer emits each expression where it is first needed inside its loop.

Every processor number comes from the `Target` (compiler/target.py): its kind (CPU or GPU), SIMD or warp
width, the threads per block its renderer writes kernels for, and its widest vector access.

Vector memory access (GPU target): an elementwise kernel whose output is 32-bit and whose innermost output
axis divides by the target's vector lanes (its widest vector access over 4 bytes: 4 on NV and AMD) is
lowered with that axis upcast, so each thread computes that many neighbouring outputs. Every group of lane
loads (and the lane stores) proven to read consecutive elements from an index that is a multiple of the
lane count is listed in `LinearProgram.vector_groups`, and the PTX renderer turns each group into one vector
`ld`/`st` (16 bytes: `.v4` of 32-bit lanes).
Buffers start at least 256-byte aligned (allocations are page-aligned, arena offsets are 256-aligned), so
the proof on the index is all the alignment a vector access needs. Groups that cannot be proven (masked
loads, reshapes that split the axis, broadcasts) stay scalar; if the stores cannot be proven the kernel
is lowered again without the upcast. NOOPT=1 turns this off (one output per thread, scalar access).

Group reductions (GPU target): a reduce whose innermost reduce axis divides by a warp (the target's
`simd_width`) gives each output a group of threads: one warp, or a whole block (`block_threads`) when the
axis is long (`GROUP_MIN_ELEMENTS_PER_LANE` elements per thread of the block or more, so each lane still has
several to add). Global index g is then output g // group and lane
g % group; lane l adds elements l, l + group, ... so neighbouring threads read neighbouring elements (one
coalesced line per warp instead of one line per thread), and GROUP_COMBINE merges the lanes' accumulators
(warp shuffles; for a block, then the warps' results through shared memory). With one thread per output the
GPU would run a single thread for a full sum and a few hundred for a decode step's matrix-vector products.
Inputs read with a known stride > 1 along the reduce axis keep one thread per output: there neighbouring
outputs are the neighbouring elements, so that is the coalesced order.

The program's launch contract (`LinearProgram.launch`, a `LaunchSpec`) is written here: a global size of
`(global_size, 1, 1)` threads, the local size the target runs it in (a group reduction's block is exactly its
group when the group is a block), the shared memory a block group needs, and the argument layout.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rawgrad import config
from rawgrad.compiler.ir import ALU, Ops, UOp, prod
from rawgrad.compiler.opt import KernelOpts, choose_opts
from rawgrad.compiler.symbolic import simplify
from rawgrad.compiler.target import LaunchSpec, Target, host_cpu_target
from rawgrad.dtype import DType, dtypes

if TYPE_CHECKING:
    from rawgrad.compiler.view import ShapeTracker

_IDX = dtypes.index
# Vector access is for 32-bit elements (the renderers move them as .b32 lanes without conversion).
GPU_VECTOR_ELEMENT_BYTES = 4
# A reduce axis gets a whole block per output (rather than a warp) when each thread of the block still adds
# at least this many elements: below that the block's barriers and shared-memory round cost more than the
# extra threads save.
GROUP_MIN_ELEMENTS_PER_LANE = 16
# Bytes of shared memory per warp a block group exchanges its partial results through (one accumulator of up
# to 64 bits; the renderer declares it).
GROUP_SLOT_BYTES = 8


@dataclass
class LinearProgram:
    """What a renderer receives: statements in order plus the kernel's calling convention."""

    name: str
    statements: list[UOp]
    globals: list[UOp]  # DEFINE_GLOBAL by slot
    variables: list[UOp]  # DEFINE_VAR in argument order (after the buffers)
    global_size: Any  # int or UOp over `variables`: how many global indices the kernel covers
    launch: LaunchSpec  # the launch contract (compiler/target.py): 3-D sizes, shared memory, arguments
    target: Target  # what it was lowered for
    opts: KernelOpts = field(default_factory=KernelOpts)
    # LOAD or STORE UOps in lane order, each group proven to access consecutive elements starting at a
    # multiple of the group's size (see the module docstring); empty on the CPU target
    vector_groups: list[tuple[UOp, ...]] = field(default_factory=list)
    # threads that cooperate on one output (group reductions, see the module docstring); 1 = one per output
    group_size: int = 1


def reduce_identity(op: Ops, dtype: DType) -> Any:
    if op is Ops.ADD:
        return False if dtype.is_bool else 0
    if op is Ops.MUL:
        return True if dtype.is_bool else 1
    if op is Ops.MAX:
        return dtype.min
    raise ValueError(f"unknown reduce op {op}")


def _c(v: int) -> UOp:
    return UOp.const(_IDX, v)


def _sint(v: Any) -> UOp:
    return v if isinstance(v, UOp) else _c(v)


class _Lowerer:
    def __init__(self, ast: UOp, name: str, target: Target, vector_lanes: int = 1,
                 group_reduce: bool = False):
        if not (ast.op is Ops.SINK and len(ast.src) == 1 and ast.src[0].op is Ops.STORE):
            raise ValueError("a kernel must be a SINK of exactly one STORE")
        self.ast = ast
        self.name = name
        self.target = target
        self.store = ast.src[0]
        self.out_global, out_view, self.value = self.store.src
        self.out_st: ShapeTracker = out_view.arg
        self.out_shape = self.out_st.shape
        reduces = [n for n in self.value.toposort() if n.op is Ops.REDUCE_AXIS]
        if len(reduces) > 1:
            raise ValueError("a kernel may hold at most one reduce")
        self.reduce = reduces[0] if reduces else None
        self.full_shape: tuple[Any, ...] = self.reduce.arg[2] if self.reduce is not None else self.out_shape
        self.reduce_axes: tuple[int, ...] = tuple(self.reduce.arg[1]) if self.reduce is not None else ()
        self.globals = sorted({n for n in ast.toposort() if n.op is Ops.DEFINE_GLOBAL}, key=lambda g: g.arg)
        variables: set[UOp] = {n for n in ast.toposort() if n.op is Ops.DEFINE_VAR}
        for d in self.full_shape:
            if isinstance(d, UOp):
                variables.update(d.variables())
        for n in ast.toposort():
            if n.op is Ops.VIEW:  # shapes, strides, offsets and masks may all name Variables
                variables.update(n.arg.variables())
        self.variables = sorted(variables, key=lambda v: v.arg)
        self.statements: list[UOp] = []
        self.loop_count = 0
        self.vector_lanes = vector_lanes
        self.group_reduce = group_reduce

    def _range(self, start: UOp, end: UOp, kind: str) -> UOp:
        r = UOp(Ops.RANGE, _IDX, (start, end), (self.loop_count, kind))
        self.loop_count += 1
        self.statements.append(r)
        return r

    def lower(self) -> LinearProgram:
        n = len(self.full_shape)
        out_axes = [i for i in range(n) if i not in self.reduce_axes]
        loads = [x for x in self.value.toposort() if x.op is Ops.LOAD]
        opts = choose_opts(self.full_shape, out_axes, self.reduce_axes, [ld.src[1].arg for ld in loads],
                           self.out_st, self.target)
        vector_axis = self._vector_axis(out_axes)
        if vector_axis is not None:
            opts.upcast[vector_axis] = self.vector_lanes
        # loop extent of each axis after upcasting
        extent = [self.full_shape[i] // opts.upcast[i] if i in opts.upcast else self.full_shape[i]
                  for i in range(n)]
        ordered = opts.loop_order if opts.loop_order is not None else out_axes
        loop_axes = [i for i in ordered if not _is_one(extent[i])]
        global_axes = loop_axes[:opts.global_axes]
        inner_axes = loop_axes[opts.global_axes:]
        group = self._reduce_group_size(loads)
        global_size = prod(extent[i] for i in global_axes) * group
        base: dict[int, UOp] = {i: _c(0) for i in range(n)}
        most = global_size if isinstance(global_size, int) else int(global_size.vmax)
        start = UOp(Ops.SPECIAL, _IDX, (), ("start", most))
        end = UOp(Ops.SPECIAL, _IDX, (), ("end", most))
        g = self._range(start, end, "global")
        out_g = g // group if group > 1 else g  # which output this thread works on
        stride: Any = 1
        for i in reversed(global_axes):
            idx = out_g // stride if not (isinstance(stride, int) and stride == 1) else out_g
            base[i] = idx if i == global_axes[0] else idx % extent[i]
            stride = stride * extent[i]
        out_ranges = []
        for i in inner_axes:
            base[i] = self._range(_c(0), _sint(extent[i]), "loop")
            out_ranges.append(base[i])
        upcast_out = [i for i in out_axes if i in opts.upcast]
        combos = list(itertools.product(*[range(opts.upcast[i]) for i in upcast_out]))

        def idxs_for(combo: tuple[int, ...], rbase: dict[int, UOp]) -> list[UOp]:
            out = []
            for i in range(n):
                b = rbase.get(i, base[i])
                if i in opts.upcast:
                    b = b * opts.upcast[i] + combo[upcast_out.index(i)]
                out.append(b)
            return out

        reduce_values: dict[tuple[int, ...], UOp] = {}
        if self.reduce is not None:
            rop = self.reduce.arg[0]
            out_dt = self.reduce.dtype
            assert out_dt is not None
            # half-precision sums and products accumulate in float32 (as torch does); max needs no width
            wide = out_dt in (dtypes.float16, dtypes.bfloat16) and rop is not Ops.MAX
            dt = dtypes.float32 if wide else out_dt
            accs = {}
            for k, combo in enumerate(combos):
                acc = UOp(Ops.DEFINE_ACC, dt, (UOp.const(dt, reduce_identity(rop, dt)),), k)
                self.statements.append(acc)
                accs[combo] = acc
            rbase: dict[int, UOp] = {}
            red_ranges = []
            for i in self.reduce_axes:
                if group > 1 and i == self.reduce_axes[-1]:
                    # lane l of the group takes elements l, l + group, ...: a warp reads one contiguous run
                    r = self._range(_c(0), _c(self.full_shape[i] // group), "reduce")
                    rbase[i] = r * group + g % group
                else:
                    r = self._range(_c(0), _sint(self.full_shape[i]), "reduce")
                    rbase[i] = r
                red_ranges.append(r)
            memo: dict[UOp, UOp] = {}
            for combo in combos:
                idxs = idxs_for(combo, rbase)
                memo.clear()
                val = self.expr(self.reduce.src[0], idxs, idxs, memo)
                if val.dtype != dt:
                    val = UOp(Ops.CAST, dt, (val,))
                acc = accs[combo]
                cur = UOp(Ops.LOAD, dt, (acc,), "acc")
                self.statements.append(UOp(Ops.ACC_UPDATE, None, (acc, _combine(rop, cur, val))))
            for r in reversed(red_ranges):
                self.statements.append(UOp(Ops.ENDRANGE, None, (r,)))
            if group > 1:
                for acc in accs.values():
                    self.statements.append(UOp(Ops.GROUP_COMBINE, None, (acc,), (rop, group)))
            reduce_values = {}
            for combo, acc in accs.items():
                final = UOp(Ops.LOAD, dt, (acc,), "final")
                reduce_values[combo] = final if dt == out_dt else UOp(Ops.CAST, out_dt, (final,))
        lane_stores: list[UOp] = []
        lane_loads: dict[UOp, list[UOp]] = {}  # kernel LOAD -> its lowered load in each lane
        for combo in combos:
            out_idxs = idxs_for(combo, {i: _c(0) for i in self.reduce_axes})
            memo = {}
            if self.reduce is not None:
                memo[self.reduce] = reduce_values[combo]
            val = self.expr(self.value, out_idxs, out_idxs, memo)
            idx, valid = self.out_st.to_indexed_uops(out_idxs)
            index = UOp(Ops.INDEX, _IDX, (self.out_global, simplify(idx)))
            store = UOp(Ops.STORE, None, (index, val))
            self.statements.append(store)
            lane_stores.append(store)
            for node, lowered in memo.items():
                if node.op is Ops.LOAD:
                    lane_loads.setdefault(node, []).append(lowered)
        for r in reversed(out_ranges):
            self.statements.append(UOp(Ops.ENDRANGE, None, (r,)))
        self.statements.append(UOp(Ops.ENDRANGE, None, (g,)))
        # a block group's global size is a multiple of the block, a warp group's of the warp: either way the
        # block is whole groups (and exactly the group for a block group, whose warps meet in shared memory)
        local = self.target.local_size(global_size)
        shared = group // self.target.simd_width * GROUP_SLOT_BYTES if group > self.target.simd_width else 0
        launch = LaunchSpec((global_size, 1, 1), local, len(self.globals), tuple(self.variables), shared,
                            exact_local=group > 1)
        launch.check_target(self.target)
        prog = LinearProgram(self.name, self.statements, self.globals, self.variables, global_size, launch,
                             self.target, opts, group_size=group)
        if vector_axis is not None and self._vector_group(lane_stores):
            prog.vector_groups = [tuple(lane_stores)] + [tuple(lanes) for lanes in lane_loads.values()
                                                         if self._vector_group(lanes)]
        return prog

    def _reduce_group_size(self, loads: list[UOp]) -> int:
        """Threads per output for a group reduction (see the module docstring); 1 for none."""
        if not self.group_reduce or self.reduce is None or not self.reduce_axes:
            return 1
        if self.reduce.dtype is None or self.reduce.dtype.is_bool:
            return 1
        axis = self.reduce_axes[-1]
        size = self.full_shape[axis]
        warp, block = self.target.simd_width, self.target.block_threads
        if not isinstance(size, int) or size % warp != 0:
            return 1
        long_axis = size >= GROUP_MIN_ELEMENTS_PER_LANE * block and size % block == 0
        group = block if long_axis else warp
        # Any reduce is correct split this way; whether it is faster depends on how the inputs are read.
        # A known stride > 1 (or symbolic) along the axis means one thread per output reads coalesced
        # instead (neighbouring outputs are neighbouring elements); a stride the view cannot state
        # (None: a reshape of a permuted view, e.g. attention heads merged back) reads runs, kept grouped.
        reads = loads + [n for n in self.value.toposort() if n.op is Ops.GATHER]
        for node in reads:
            st = node.src[1].arg
            if tuple(st.shape) != tuple(self.full_shape):
                continue  # read at the output index: the same element for every lane
            stride = st.real_strides()[axis]
            if stride is not None and not (isinstance(stride, int) and stride in (0, 1)):
                return 1
        return group

    def _vector_axis(self, out_axes: list[int]) -> int | None:
        """The output axis to upcast for vector access, or None (see the module docstring)."""
        lanes = self.vector_lanes
        out_dt = self.out_global.dtype
        if lanes == 1 or self.reduce is not None or out_dt is None or out_dt.is_bool or \
                out_dt.itemsize != GPU_VECTOR_ELEMENT_BYTES:
            return None
        live = [ax for ax in out_axes if not _is_one(self.full_shape[ax])]
        if not live:
            return None
        size = self.full_shape[live[-1]]
        return live[-1] if isinstance(size, int) and size % lanes == 0 else None

    def _vector_group(self, lanes: list[UOp]) -> bool:
        """Whether these per-lane loads (or stores) can be one vector access: unmasked 32-bit elements at
        consecutive indices, the first a multiple of the lane count."""
        if len(lanes) != self.vector_lanes or len(set(lanes)) != len(lanes):
            return False
        indexes = [u.src[0] for u in lanes]
        if any(u.op is Ops.LOAD and len(u.src) != 1 for u in lanes) or \
                any(ix.op is not Ops.INDEX or ix.src[0] is not indexes[0].src[0] for ix in indexes):
            return False
        dt = indexes[0].src[0].dtype
        if dt is None or dt.is_bool or dt.itemsize != GPU_VECTOR_ELEMENT_BYTES:
            return False
        first = indexes[0].src[1]
        if not simplify(first % _c(self.vector_lanes)).is_const(0):
            return False
        return all(simplify(ix.src[1] - first).is_const(k) for k, ix in enumerate(indexes))

    def expr(self, node: UOp, full_idxs: list[UOp], out_idxs: list[UOp], memo: dict[UOp, UOp]) -> UOp:
        hit = memo.get(node)
        if hit is not None:
            return hit
        op = node.op
        if op is Ops.LOAD:
            glob, view = node.src
            idx, valid = self._index(view.arg, full_idxs, out_idxs)
            index = UOp(Ops.INDEX, _IDX, (glob, idx))
            out = UOp(Ops.LOAD, node.dtype, (index,) if valid.is_const(True) else (index, valid))
        elif op is Ops.CONST:
            value = UOp.const(node.dtype, node.arg)  # type: ignore[arg-type]
            if node.src:
                _, valid = self._index(node.src[0].arg, full_idxs, out_idxs)
                if valid.is_const(False):
                    value = UOp.const(node.dtype, 0)  # type: ignore[arg-type]
                elif not valid.is_const(True):
                    value = UOp(Ops.WHERE, node.dtype, (valid, value, UOp.const(node.dtype, 0)))  # type: ignore
            out = value
        elif op is Ops.DEFINE_VAR:
            out = node
        elif op is Ops.GATHER:
            out = self._gather(node, full_idxs, out_idxs, memo)
        elif op in ALU or op in (Ops.CAST, Ops.BITCAST):
            srcs = tuple(self.expr(s, full_idxs, out_idxs, memo) for s in node.src)
            out = UOp(op, node.dtype, srcs, node.arg)
        else:
            raise NotImplementedError(f"lowering cannot handle {op} inside a kernel value")
        memo[node] = out
        return out

    def _gather(self, node: UOp, full_idxs: list[UOp], out_idxs: list[UOp], memo: dict[UOp, UOp]) -> UOp:
        """A table load at row = the index value (see Ops.GATHER); out-of-range rows read 0."""
        glob, view, index_value = node.src
        rows, cols = node.arg
        pos, valid = self._index(view.arg, full_idxs, out_idxs)
        row = self.expr(index_value, full_idxs, out_idxs, memo)
        if row.dtype != _IDX:
            row = UOp(Ops.CAST, _IDX, (row,))
        below_end = UOp(Ops.CMPLT, dtypes.bool, (row, _c(rows)))
        not_negative = UOp(Ops.NOT, dtypes.bool, (UOp(Ops.CMPLT, dtypes.bool, (row, _c(0))),))
        in_table = UOp(Ops.AND, dtypes.bool, (below_end, not_negative))
        valid = in_table if valid.is_const(True) else UOp(Ops.AND, dtypes.bool, (valid, in_table))
        col = simplify(UOp(Ops.MOD, _IDX, (pos, _c(cols))))
        address = UOp(Ops.ADD, _IDX, (UOp(Ops.MUL, _IDX, (row, _c(cols))), col))
        index = UOp(Ops.INDEX, _IDX, (glob, simplify(address)))
        return UOp(Ops.LOAD, node.dtype, (index, valid))

    def _index(self, st: ShapeTracker, full_idxs: list[UOp], out_idxs: list[UOp]) -> tuple[UOp, UOp]:
        idxs = full_idxs if tuple(st.shape) == tuple(self.full_shape) else out_idxs
        idx, valid = st.to_indexed_uops(idxs)
        return simplify(idx), simplify(valid)


def _is_one(dim: Any) -> bool:
    return isinstance(dim, int) and dim == 1


def _combine(op: Ops, acc: UOp, val: UOp) -> UOp:
    if op is Ops.ADD:
        return UOp(Ops.OR if acc.dtype == dtypes.bool else Ops.ADD, acc.dtype, (acc, val))
    if op is Ops.MUL:
        return UOp(Ops.AND if acc.dtype == dtypes.bool else Ops.MUL, acc.dtype, (acc, val))
    if op is Ops.MAX:
        return UOp(Ops.MAX, acc.dtype, (acc, val))
    raise ValueError(op)


def lower(ast: UOp, name: str = "kernel", target: Target | None = None) -> LinearProgram:
    """Turn one kernel AST into a linear program (see module docstring).

    `target` (default: this host's CPU) decides the loop structure: a CPU target gets register tiles and a
    global range split across cores; a GPU target no tiles and every output axis in the global range: one
    thread per output element, or per vector of outputs when they can be stored as one vector, or a warp or
    block per output of a group reduction (see opt.choose_opts)."""
    if target is None:
        target = host_cpu_target()
    if not isinstance(target, Target):
        raise TypeError(f"lower: target must be a compiler.target.Target, got {target!r}")
    if target.is_gpu and not config.NOOPT():
        lanes = target.vector_lanes(GPU_VECTOR_ELEMENT_BYTES)
        prog = _Lowerer(ast, name, target, vector_lanes=lanes, group_reduce=True).lower()
        if prog.vector_groups or not prog.opts.upcast:
            return prog  # vectorized (stores proven), or no axis was eligible: nothing to undo
        # the upcast output stores could not be proven consecutive and aligned: one output per thread
    return _Lowerer(ast, name, target).lower()
