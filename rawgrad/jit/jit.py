"""TinyJit: run a function once eagerly, capture the kernels of its second call, replay them afterwards.

A capture turns the launches the function made (`realize.capture_launches`) into one prebuilt queue per
device (`hcq.graph.HCQGraph`). Buffers are sorted into four roles:

- input: the buffer behind a Tensor argument; its address is a patch point, filled in per call;
- output: a buffer the capture wrote and the function returned; a fresh one is allocated per call (its
  address is a patch point too) so results of earlier calls stay intact, unless `reuse_outputs=True`;
- intermediate: created and first written inside the capture, not returned; planned into one arena per
  device, reused by lifetime;
- external: anything else the kernels touch (weights, constants made inside the function, state the
  function assigns to); kept alive by the capture and used in place.

Guards: every call is compared with the capture (structure of the arguments, each Tensor's shape, dtype,
device and buffer size, which arguments share a buffer, the value of every non-Tensor argument). Bound
Variables (`Variable("n", 1, 100).bind(5)`), passed as arguments or inside symbolic input shapes, are
patch points: one capture serves every value in range. Tensor inputs are realized into contiguous
buffers before the graph runs, so an input's strides never reach the kernels: a strided input is copied
(outside the graph) and accepted.
"""
from __future__ import annotations

import functools
import inspect
import operator
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from rawgrad import config
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType
from rawgrad.hcq.device import Device
from rawgrad.hcq.graph import (
    CopyCommand,
    KernelCommand,
    build_template,
    plan_arena,
)
from rawgrad.hcq.queue import sym_eval
from rawgrad.jit.capture import (
    CapturedGraph,
    DeviceGraph,
    JitError,
    OutRef,
    Path,
    TensorGuard,
    _arena_var,
    _ext_var,
    _input_var,
    _output_var,
)
from rawgrad.jit.storage import load_capture, save_capture
from rawgrad.tensor import realize as _realize
from rawgrad.tensor import tensor as _tensor_module
from rawgrad.tensor.buffers import buffer_numpy, buffer_write, new_buffer
from rawgrad.tensor.interpret import is_realized
from rawgrad.tensor.realize import ExecItem
from rawgrad.tensor.schedule import is_scalar_arg
from rawgrad.tensor.tensor import Tensor, pending_view_assigns

__all__ = ["JitError", "TinyJit"]

ReturnT = TypeVar("ReturnT")
MISMATCH_POLICIES = ("error", "recapture")
# Captures made again because a guarded global or closure value changed, before TinyJit gives up: a value
# that changes on most calls would otherwise capture (trace, schedule, build a queue) on every call.
MAX_GUARD_RECAPTURES = 4


# ---------------------------------------------------------------------------------------------- arguments
def _flatten(args: Sequence[Any], kwargs: dict[str, Any]) -> list[tuple[Path, Any]]:
    """Every argument, and the items of list/tuple/dict arguments (one level), with its path. A container
    also appears itself as a marker (its type and keys), so its structure is guarded like a constant."""
    out: list[tuple[Path, Any]] = []
    items: list[tuple[int | str, Any]] = list(enumerate(args)) + sorted(kwargs.items())
    for name, x in items:
        if isinstance(x, (list, tuple)):
            out.append(((name,), ("container", type(x).__name__, len(x))))
            out.extend(((name, i), y) for i, y in enumerate(x))
        elif isinstance(x, dict):
            out.append(((name,), ("container", "dict", tuple(x))))
            out.extend(((name, k), y) for k, y in x.items())
        else:
            out.append(((name,), x))
    return out


def _describe(fn: Callable[..., Any], path: Path) -> str:
    """`argument 0 ('x')`, `argument 'scale'`, `argument 1 ('xs')[2]` for error messages."""
    name = path[0]
    if isinstance(name, int):
        try:
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            label = f"argument {name} ({params[name].name!r})" if name < len(params) else f"argument {name}"
        except (TypeError, ValueError):
            label = f"argument {name}"
    else:
        label = f"argument {name!r}"
    return label if len(path) == 1 else f"{label}[{path[1]!r}]"


def _unbind_shape(shape: tuple[Any, ...], var_vals: dict[UOp, int]) -> tuple[Any, ...]:
    """The shape with bound Variables replaced by the bare Variable; their values go into var_vals."""
    out: list[Any] = []
    for d in shape:
        if isinstance(d, UOp):
            binds = [n for n in d.toposort() if n.op is Ops.BIND]
            for b in binds:
                var, val = b.unbind()
                if var_vals.setdefault(var, val) != val:
                    raise JitError(f"Variable {var.arg[0]!r} is bound to both {var_vals[var]} and {val}")
            d = d.substitute({b: b.src[0] for b in binds}) if binds else d
        out.append(d)
    return tuple(out)


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # arrays and other objects without a truth value: identity was the only test
        return False


@dataclass
class _Call:
    """One call's arguments, sorted out and checked against nothing yet."""

    leaves: list[tuple[Path, Any]]
    tensor_idx: list[int]  # leaf indices of the Tensors
    buffers: list[UOp]  # the BUFFER behind each Tensor
    guards: list[TensorGuard]
    aliases: tuple[int, ...]  # per Tensor: index of the first Tensor reading the same buffer
    var_vals: dict[UOp, int]  # from bound Variable arguments and symbolic input shapes
    key: tuple[Any, ...]  # what selects a capture: structure, tensor guards, aliases

    @staticmethod
    def of(args: Sequence[Any], kwargs: dict[str, Any]) -> _Call:
        leaves = _flatten(args, kwargs)
        tensor_idx = [i for i, (_, x) in enumerate(leaves) if isinstance(x, Tensor)]
        pending = [leaves[i][1] for i in tensor_idx if not is_realized(leaves[i][1].uop)]
        if pending:
            # one realize for all of them: the graph reads inputs as whole contiguous buffers
            Tensor.realize(*pending)
        var_vals: dict[UOp, int] = {}
        buffers: list[UOp] = []
        guards: list[TensorGuard] = []
        first: dict[UOp, int] = {}
        kinds: list[Any] = []
        for path, x in leaves:
            if isinstance(x, Tensor):
                base = x.uop.base
                if base.op is not Ops.BUFFER:
                    raise JitError(f"input tensor at {path} did not realize to a buffer ({base.op})")
                buffers.append(base)
                shape = _unbind_shape(x.shape, var_vals)
                guards.append(TensorGuard(shape, x.dtype, base.device, base.arg[1]))
                kinds.append((path, "tensor"))
            elif isinstance(x, UOp) and x.op is Ops.BIND:
                var, val = x.unbind()
                if var_vals.setdefault(var, val) != val:
                    raise JitError(f"Variable {var.arg[0]!r} is bound to both {var_vals[var]} and {val}")
                kinds.append((path, "var", var))
            elif isinstance(x, UOp) and x.op is Ops.DEFINE_VAR:
                raise JitError(f"Variable {x.arg[0]!r} passed to a jitted function must be bound "
                               f"(Variable(...).bind(value))")
            else:
                kinds.append((path, "const"))
        aliases = tuple(first.setdefault(b, k) for k, b in enumerate(buffers))
        key = (tuple(kinds), tuple(guards), aliases)
        return _Call(leaves, tensor_idx, buffers, guards, aliases, var_vals, key)


# A TinyJit keeps the last few argument patterns it served this way; past this many the table is cleared (a
# loop over ever-new input Tensors then pays the full _Call.of, as before).
MAX_FAST_CALLS = 16


@dataclass
class _FastCall:
    """What `_Call.of` found for one tuple of positional Tensor arguments, kept to skip it next time.

    A Tensor's UOp is immutable and interned: the same UOp objects again mean the same shapes (bound
    Variable values included), dtypes, devices, buffers and buffer sharing, and a realized UOp stays
    realized. Only weak references are held, so a kept entry never keeps a user's input buffer alive; the
    guards on globals/closures and the capture lookup still run on every call."""

    refs: tuple[weakref.ref[UOp], ...]
    bases: tuple[weakref.ref[UOp], ...]
    call: _Call  # its `leaves` and `buffers` are dropped (they would hold the Tensors); rebuilt per hit

    def match(self, uops: list[UOp]) -> list[UOp] | None:
        """The input BUFFER nodes when `uops` are the very nodes this entry was made from, else None."""
        for r, u in zip(self.refs, uops, strict=True):
            if r() is not u:
                return None
        bufs = [r() for r in self.bases]
        return bufs if None not in bufs else None  # type: ignore[return-value]


def _fast_key(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], list[UOp]] | None:
    """(identity key, UOps) when every argument is a positional Tensor (the common call), else None."""
    if kwargs or not args:
        return None
    uops = []
    for a in args:
        if type(a) is not Tensor:
            return None
        uops.append(a.uop)
    return tuple(map(id, uops)), uops


# ---------------------------------------------------------------------------------------------- captures
def _encode_return(x: Any, ref: Callable[[Tensor], OutRef]) -> Any:
    """The return value with every Tensor replaced by where its buffer comes from after a replay."""
    if isinstance(x, Tensor):
        return ("tensor", ref(x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_encode_return(y, ref) for y in x])
    if isinstance(x, dict):
        return ("dict", [(k, _encode_return(y, ref)) for k, y in x.items()])
    return ("const", x)


def _collect_tensors(x: Any) -> list[Tensor]:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _collect_tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _collect_tensors(y)]
    return []


def _pending_writes() -> list[Tensor]:
    """Every assign not yet run: writes into views in the order made, then whole-buffer writes."""
    views = pending_view_assigns()
    seen = {id(t) for t in views}
    whole = [t for r in list(_tensor_module._pending_assigns.values())
             if (t := r()) is not None and id(t) not in seen]
    return views + whole


def _flush_pending_writes() -> None:
    """Run the assigns made before a call. A replay reads state buffers directly, so a write still
    pending in the lazy graph (`w.assign(...)` outside the function) would otherwise be skipped by it."""
    if _tensor_module._pending_assigns or _tensor_module._pending_view_assigns:
        writes = _pending_writes()
        if writes:
            Tensor.realize(*writes)


def _finish_call(ret: Any) -> None:
    """Realize what one call made: its pending writes into views of state (first: the returned values may
    read them) and the Tensors it returned, then every other assign the call left pending.

    The last step is why a capture sees `state.assign(state + x)` when the return value does not read
    `state`: without it that write would run after the capture ended (at the next read of `state`), so
    no replay would contain it. It runs after the returned values so that they read what the function
    read (the old contents), as an eager call would."""
    outs = pending_view_assigns() + _collect_tensors(ret)
    if outs:
        Tensor.realize(*outs)
    rest = _pending_writes()
    if rest:
        Tensor.realize(*rest)


def _capture(fn: Callable[..., Any], name: str, call: _Call, args: Sequence[Any], kwargs: dict[str, Any],
             reuse_outputs: bool) -> tuple[Any, CapturedGraph]:
    """Run `fn` once while recording its launches; returns its result and the capture."""
    # Buffers created from here on (higher uids) are the capture's own; a 0-element node costs no memory.
    first_uid = new_buffer(call.buffers[0].device if call.buffers else Device.DEFAULT, 0, _any_dtype()).arg[0]
    rng_start = Tensor._rng_counter
    ret, record, rng_made = _record_launches(fn, name, args, kwargs)
    roles = _BufferRoles(name, call, record, first_uid)
    returned = _encode_return(ret, roles.ref)
    roles.plan_arenas()
    var_vals: dict[UOp, int] = {}
    for ei in record:
        # a kernel's float constants are its own arguments (each kernel numbers them from 0): they are bound
        # to their values in its launch (_kernel_command), not variables of the graph
        var_vals.update((v, val) for v, val in ei.var_vals.items() if not is_scalar_arg(v))
    commands: dict[str, list[Any]] = {}  # per device, in the order devices are first used
    kernels = 0
    for ei in record:
        if not ei.bufs:
            continue
        dev = ei.bufs[0].device
        roles.use_device(dev)
        cmd = _copy_command(name, ei, roles, dev) if ei.kernel is None else \
            _kernel_command(name, ei, roles, dev, var_vals)
        commands.setdefault(dev, []).append(cmd)
        kernels += ei.kernel is not None

    graphs = []
    profile = config.PROFILE()
    for dev in roles.device_order:
        template, programs = build_template(Device[dev], commands[dev])
        profiled = build_template(Device[dev], commands[dev], profile=True)[0] if profile else None
        graphs.append(DeviceGraph(dev, template, roles.arena_bytes(dev), programs, profiled))
    passed = set(call.var_vals)  # Variables passed in (as arguments or in input shapes)
    consts = [(p, x) for p, x in call.leaves if not isinstance(x, Tensor) and
              not (isinstance(x, UOp) and x.op is Ops.BIND)]
    externals, out_bufs = roles.externals, roles.out_bufs
    cap = CapturedGraph(call.key, consts,
                        {v: val for v, val in var_vals.items() if v not in passed}, graphs,
                        sorted(externals, key=externals.__getitem__),
                        [(b.device, b.arg[1], _dtype(b)) for b in sorted(out_bufs, key=out_bufs.__getitem__)],
                        returned, kernels, reuse_outputs)
    # Random draws: their key buffers are externals the kernels read; a replay writes the key the same
    # draw would get eagerly (seed, counter at the call + its offset) into each before it launches.
    cap.rng_draws = Tensor._rng_counter - rng_start
    cap.rng_keys = [(externals[b], counter - rng_start) for b, counter in rng_made if b in externals]
    cap.written = roles.written_in_place(record)
    cap.link()
    return ret, cap


def _record_launches(fn: Callable[..., Any], name: str, args: Sequence[Any],
                     kwargs: dict[str, Any]) -> tuple[Any, list[ExecItem], list[tuple[UOp, int]]]:
    """Run `fn` with launches recorded instead of only run: its result, the launches, and the (key buffer,
    counter) of each random draw it made."""
    seedings = Tensor._seedings
    rng_made: list[tuple[UOp, int]] = []
    _realize.readback_guards.append(name)
    Tensor._rng_recorders.append(rng_made)
    try:
        with _realize.capture_launches() as record:
            ret = fn(*args, **kwargs)
            _finish_call(ret)
    finally:
        Tensor._rng_recorders.remove(rng_made)
        _realize.readback_guards.remove(name)
    if Tensor._seedings != seedings:
        raise JitError(f"{name}: Tensor.manual_seed was called inside the captured function; a replay "
                       f"cannot reseed (it runs no Python). Seed outside the jitted function")
    return ret, record, rng_made


class _BufferRoles:
    """What each buffer a capture touches is to the graph: an input slot, an output the graph allocates
    per call, an intermediate in the device's arena, or an external (state created outside and kept)."""

    def __init__(self, name: str, call: _Call, record: Sequence[ExecItem], first_uid: int) -> None:
        self.name, self.first_uid = name, first_uid
        self.slot_of = {b: k for k, b in enumerate(call.buffers)}
        self.first_use: dict[UOp, tuple[int, bool]] = {}  # buffer -> (item index, only written there)
        self.last_use: dict[UOp, int] = {}
        for i, ei in enumerate(record):
            for b in ei.bufs:
                if b not in self.first_use:
                    self.first_use[b] = (i, all(k == 0 for k, c in enumerate(ei.bufs) if c is b))
                self.last_use[b] = i
        self.out_bufs: dict[UOp, int] = {}
        self.externals: dict[UOp, int] = {}
        self.arena_plan: dict[str, tuple[dict[UOp, int], int]] = {}  # device -> (offsets, bytes)
        self.device_order: list[str] = []

    def created_here(self, b: UOp) -> bool:
        return b.arg[0] > self.first_uid

    def ref(self, t: Tensor) -> OutRef:
        """How the capture returns `t` (called for every returned tensor before `plan_arenas`)."""
        u = t.uop
        base = u.base
        if base.op is not Ops.BUFFER:
            raise JitError(f"{self.name}: a returned tensor did not realize to a buffer ({base.op})")
        reshape = _unbind_shape(u.arg, {}) if u.op is Ops.RESHAPE else None
        assert base.dtype is not None
        if base in self.slot_of:
            return ("in", self.slot_of[base], reshape, base.dtype)
        if self.created_here(base) and self.first_use.get(base, (0, False))[1]:
            return ("out", self.out_bufs.setdefault(base, len(self.out_bufs)), reshape, base.dtype)
        return ("ext", self.externals.setdefault(base, len(self.externals)), reshape, base.dtype)

    def plan_arenas(self) -> None:
        """Place the intermediates (made here, first written, neither input nor returned) per device, in that
        device's arena, sharing space between buffers whose lifetimes do not overlap."""
        intermediates = [b for b, (_, write_only) in self.first_use.items() if self.created_here(b) and
                         write_only and b not in self.out_bufs and b not in self.slot_of]
        for dev in sorted({b.device for b in intermediates}):
            bufs = [b for b in intermediates if b.device == dev]
            sizes = [b.arg[1] * _itemsize(b) for b in bufs]
            offsets, total = plan_arena(sizes, [(self.first_use[b][0], self.last_use[b]) for b in bufs])
            self.arena_plan[dev] = (dict(zip(bufs, offsets, strict=True)), total)

    def use_device(self, dev: str) -> None:
        if dev not in self.device_order:
            self.device_order.append(dev)

    def arena_bytes(self, dev: str) -> int:
        return self.arena_plan.get(dev, ({}, 0))[1]

    def address(self, b: UOp, dev: str) -> Any:
        """The buffer's address in a command on `dev`: a variable the graph fills in (input, output, arena
        base + offset, external)."""
        if b.device != dev:
            raise JitError(f"{self.name}: a kernel on {dev} uses a buffer on {b.device}")
        if b in self.slot_of:
            return _input_var(self.slot_of[b])
        if b in self.out_bufs:
            return _output_var(self.out_bufs[b])
        offsets = self.arena_plan.get(dev, ({}, 0))[0]
        if b in offsets:
            arena = _arena_var(self.device_order.index(dev))
            return arena + offsets[b] if offsets[b] else arena
        return _ext_var(self.externals.setdefault(b, len(self.externals)))

    def written_in_place(self, record: Sequence[ExecItem]) -> list[tuple[str, int]]:
        """("in", slot) / ("ext", index) of the state the kernels write in place: what JIT_VERIFY compares."""
        written: dict[tuple[str, int], None] = {}
        for ei in record:
            if ei.bufs:
                b = ei.bufs[0]
                if b in self.slot_of:
                    written[("in", self.slot_of[b])] = None
                elif b in self.externals:
                    written[("ext", self.externals[b])] = None
        return list(written)


def _copy_command(name: str, ei: ExecItem, roles: _BufferRoles, dev: str) -> CopyCommand:
    dst, src = ei.bufs
    if src.device != dst.device:
        raise JitError(f"{name}: copies between devices ({src.device} -> {dst.device}) cannot be "
                       f"captured yet; move the data before calling the jitted function")
    return CopyCommand(roles.address(dst, dev), roles.address(src, dev), dst.arg[1] * _itemsize(dst))


def _kernel_command(name: str, ei: ExecItem, roles: _BufferRoles, dev: str,
                    var_vals: dict[UOp, int]) -> KernelCommand:
    """One launch: buffer addresses, then the kernel's variables (graph patch points) and float constants
    (bound to their values), over the kernel's launch contract with symbolic sizes as patch points."""
    ck = ei.kernel
    assert ck is not None
    contract = ck.linear.launch  # the kernel's launch contract: 3-D global size (patch points), block
    dims: list[Any] = []
    for g in contract.global_size:
        if isinstance(g, UOp):
            try:
                sym_eval(g, var_vals)
            except TypeError as e:
                raise JitError(f"{name}: kernel {ck.name} has a launch size the graph cannot patch: "
                               f"{e}") from e
            if not g.variables():
                g = sym_eval(g, {})
        dims.append(g)
    args = [roles.address(b, dev) for b in ei.bufs] + \
        [v.bind(ei.var_vals[v]) if is_scalar_arg(v) else v for v in ck.linear.variables]
    return KernelCommand(ck.program, args, (dims[0], dims[1], dims[2]), contract.local_size)


def _itemsize(b: UOp) -> int:
    return _dtype(b).itemsize


def _dtype(b: UOp) -> DType:
    assert b.dtype is not None, b
    return b.dtype


def _any_dtype() -> DType:
    from rawgrad.dtype import dtypes
    return dtypes.uint8


# ---------------------------------------------------------------------------------------------- guards
_GUARDED_SCALARS = (bool, int, float, str, type(None))
_MISSING = object()  # an unbound global or an empty closure cell


def _code_names(code: types.CodeType) -> list[str]:
    """The global names a code object and the code nested in it (lambdas, comprehensions) may read."""
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.extend(_code_names(c))
    return names


def _guard_token(v: Any) -> Any:
    """What a guarded value is compared by: a Tensor by identity (its `==` is elementwise), anything else
    by type and value (1, 1.0 and True bake into different dtypes)."""
    return ("tensor", id(v)) if isinstance(v, Tensor) else (type(v), v)


def _cell_value(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _MISSING


class _Guards:
    """The globals and closure variables a function reads that a capture bakes in: Python scalars, None
    (their values become kernel constants or choose the graph) and Tensors (their buffers become the
    capture's externals). Chosen once, at the first capture, from the function's code: the names it (and
    code nested in it) loads that are module globals, and its closure cells, whose values then are of
    those kinds."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        f: Any = fn
        while True:  # a bound method or a functools.partial: the function underneath
            if isinstance(f, types.MethodType):
                f = f.__func__
            elif isinstance(f, functools.partial):
                f = f.func
            else:
                break
        self.globals: dict[str, Any] = {}
        self.global_names: list[str] = []
        self.cells: list[types.CellType] = []
        self.labels: list[str] = ["Tensor.training"]
        code = getattr(f, "__code__", None)
        if not isinstance(code, types.CodeType):
            return  # a callable object or a builtin: nothing to read (see docs/reliability.md)
        self.globals = getattr(f, "__globals__", {})
        for n in dict.fromkeys(_code_names(code)):
            v = self.globals.get(n, _MISSING)
            if isinstance(v, (*_GUARDED_SCALARS, Tensor)):
                self.global_names.append(n)
                self.labels.append(f"global {n!r}")
        for n, cell in zip(code.co_freevars, getattr(f, "__closure__", None) or (), strict=False):
            if isinstance(_cell_value(cell), (*_GUARDED_SCALARS, Tensor)):
                self.cells.append(cell)
                self.labels.append(f"closure variable {n!r}")

    def values(self) -> list[Any]:
        g = self.globals
        return [Tensor.training, *[g.get(n, _MISSING) for n in self.global_names],
                *[_cell_value(c) for c in self.cells]]

    def state(self) -> tuple[Any, ...]:
        """What one call compares with its capture (a tuple compare: a few microseconds)."""
        return tuple(_guard_token(v) for v in self.values())

    def describe_change(self, old: tuple[Any, ...], new: tuple[Any, ...]) -> str:
        for label, a, b in zip(self.labels, old, new, strict=True):
            if a != b:
                if a[0] == "tensor" or b[0] == "tensor":
                    return f"{label} is a different Tensor object than at capture"
                return f"{label} is {_short(b[1])} but was {_short(a[1])} at capture"
        return "a guarded value changed"


# ---------------------------------------------------------------------------------------------- TinyJit
class TinyJit(Generic[ReturnT]):
    """Decorator: call 1 runs `fn` eagerly, call 2 captures the kernels it launches, later calls replay
    them as prebuilt command queues.

    on_mismatch: what a call whose Tensor arguments differ from the capture (shape, dtype, device, buffer
    size, which arguments share a buffer, structure of the arguments) does: "error" (default) raises
    JitError naming the argument and the difference; "recapture" captures again for the new signature
    (captures are kept per signature). A different non-Tensor argument always raises: its value was baked
    into the kernels. reuse_outputs=True lets each replay write into the same output buffers (faster;
    Tensors returned by an earlier call then change).

    What a replay does besides launching the kernels, so that it behaves as an eager call:

    - writes: every assign the function makes is run inside the capture (also one whose Tensor the
      return value does not read), so each replay repeats it; assigns still pending from before a call
      are run before it, since a replay reads the state buffers directly.
    - random numbers: each replay writes the keys its draws would get eagerly (current seed, current
      Tensor._rng_counter + the draw's offset in the call) into the captured key buffers and advances
      Tensor._rng_counter by the call's draws, so eager call 1, capture, replays 3..N give the numbers
      of N eager calls. Tensor.manual_seed inside the function is refused at capture.
    - Tensor.training: part of every guard. A call in the other mode uses a capture made in that mode
      (made on first need, then kept), never the one made in the other mode.
    - globals and closure variables: at capture the values of the module globals the function's code
      names and of its closure cells are recorded when they are Python scalars (bool, int, float,
      str) or None (compared by type and value) or Tensors (compared by identity: rebinding the name to
      another Tensor counts as a change, assigning into the same Tensor does not). A call that finds one
      changed captures again (captures per guard state are kept, so values that alternate reuse them);
      after `max_recaptures` such re-captures it raises JitError naming the variable instead.
      Attributes of objects, globals read by other functions the function calls, and the contents of
      lists, dicts or arrays are not guarded: see docs/reliability.md ("TinyJit guards"), and
      JIT_VERIFY=N (every N-th call also runs eagerly and must agree with the replay).
    """

    def __init__(self, fn: Callable[..., ReturnT] | None, *, on_mismatch: str = "error",
                 reuse_outputs: bool = False, max_recaptures: int = MAX_GUARD_RECAPTURES) -> None:
        if on_mismatch not in MISMATCH_POLICIES:
            raise ValueError(f"on_mismatch must be one of {MISMATCH_POLICIES}, got {on_mismatch!r}")
        self.fn = fn
        self.on_mismatch = on_mismatch
        self.reuse_outputs = reuse_outputs
        self.max_recaptures = max_recaptures
        self.recaptures = 0  # captures made again because a guarded global/closure value changed
        self._guards: _Guards | None = None
        # every capture by (argument key, guard state); `captures` holds the one in use per argument key
        self._variants: dict[tuple[Any, ...], CapturedGraph] = {}
        self.calls = 0
        self.captures: dict[tuple[Any, ...], CapturedGraph] = {}
        self.last: CapturedGraph | None = None
        self.replays = 0  # calls served by a captured graph
        self.kernels_replayed = 0  # kernels those replays launched (eager launches count in GlobalCounters)
        # Calls from several threads take turns: the call count, the captures and a graph's bound queues are
        # shared. Re-entrant: the function may call itself inside its capture (that runs eagerly).
        self._lock = threading.RLock()
        self._fast: dict[tuple[int, ...], _FastCall] = {}  # see _call_of
        if fn is not None:
            functools.update_wrapper(self, fn)
        self.name = getattr(fn, "__qualname__", "loaded graph") if fn is not None else "loaded graph"

    def __repr__(self) -> str:
        return f"TinyJit({self.name}, calls={self.calls}, captures={len(self.captures)})"

    def __get__(self, obj: Any, objtype: type | None = None) -> TinyJit[ReturnT]:
        """On a method: one TinyJit (one cache) per instance."""
        if obj is None or self.fn is None:
            return self
        try:
            store = vars(obj)
        except TypeError:
            raise TypeError(f"TinyJit on a method needs instances with a __dict__; "
                            f"{type(obj).__name__} has none") from None
        key = f"__tinyjit_{id(self):x}"
        jit = store.get(key)
        if jit is None:
            jit = store[key] = TinyJit(self.fn.__get__(obj, objtype), on_mismatch=self.on_mismatch,
                                       reuse_outputs=self.reuse_outputs, max_recaptures=self.max_recaptures)
        return jit

    def reset(self) -> None:
        """Forget every capture; the next call runs eagerly again."""
        self.calls, self.captures, self.last = 0, {}, None
        self._variants, self.recaptures = {}, 0
        self._fast = {}

    def __call__(self, *args: Any, **kwargs: Any) -> ReturnT:
        with self._lock:
            return self._call_locked(*args, **kwargs)

    def _call_locked(self, *args: Any, **kwargs: Any) -> ReturnT:
        if _realize._captures and self.fn is not None:
            # Called inside another capture: run the Python so the outer capture records these kernels.
            return self._eager(args, kwargs)
        _flush_pending_writes()
        if self.fn is not None and self.calls == 0:
            self.calls += 1
            return self._eager(args, kwargs)
        call = self._call_of(args, kwargs)
        cap = self.captures.get(call.key)
        if cap is None:
            if self.fn is None:
                self._mismatch(call, recapture_possible=False)
            if self.last is not None and self.on_mismatch == "error":
                self._mismatch(call, recapture_possible=True)
        elif cap.guard_state is not None and self._guards is not None:
            values = self._guards.values()
            kept = cap.guard_values
            # the very objects seen at capture (the usual call) have its tokens; anything else is compared
            # by token (an equal value in another object, or a change)
            if len(values) != len(kept) or not all(map(operator.is_, values, kept)):
                state = tuple(_guard_token(v) for v in values)
                if state != cap.guard_state:
                    cap = self._guard_changed(call.key, cap, state)
        if cap is None:
            self.calls += 1
            assert self.fn is not None
            if self._guards is None:
                self._guards = _Guards(self.fn)
            values = self._guards.values()  # before the function runs: what it will read
            ret, cap = _capture(self.fn, self.name, call, args, kwargs, self.reuse_outputs)
            cap.guard_state = tuple(_guard_token(v) for v in values)
            cap.guard_refs = [v for v in values if isinstance(v, Tensor)]
            cap.guard_values = values
            self.captures[call.key] = self._variants[(call.key, cap.guard_state)] = cap
            self.last = cap
            return ret  # type: ignore[no-any-return]
        self._check_consts(cap, call)
        self.calls += 1
        self.last = cap
        self.replays += 1
        self.kernels_replayed += cap.kernel_count
        every = config.JIT_VERIFY() if self.fn is not None else 0
        if every and self.calls % every == 0:
            return self._verified_replay(cap, call, args, kwargs)  # type: ignore[no-any-return]
        return cap.replay(call)  # type: ignore[no-any-return]

    def _call_of(self, args: Sequence[Any], kwargs: dict[str, Any]) -> _Call:
        """`_Call.of`, served from `_fast` when the arguments are the same Tensor UOps as a recent call."""
        fk = _fast_key(args, kwargs)
        if fk is not None:
            ent = self._fast.get(fk[0])
            bufs = ent.match(fk[1]) if ent is not None else None
            if bufs is not None:
                c = ent.call  # type: ignore[union-attr]
                return _Call([((i,), a) for i, a in enumerate(args)], c.tensor_idx, bufs, c.guards, c.aliases,
                             c.var_vals, c.key)
        call = _Call.of(args, kwargs)
        if fk is not None:
            uops = [a.uop for a in args]  # after _Call.of: pending inputs were realized, their UOps replaced
            if len(self._fast) >= MAX_FAST_CALLS:
                self._fast.clear()
            self._fast[tuple(map(id, uops))] = _FastCall(
                tuple(weakref.ref(u) for u in uops), tuple(weakref.ref(b) for b in call.buffers),
                _Call([], call.tensor_idx, [], call.guards, call.aliases, call.var_vals, call.key))
        return call

    def _guard_changed(self, key: tuple[Any, ...], cap: CapturedGraph,
                       state: tuple[Any, ...]) -> CapturedGraph | None:
        """The capture made for this guard state (kept from before), or None to capture again. Raises
        once globals/closure values have forced max_recaptures captures."""
        known = self._variants.get((key, state))
        if known is not None:
            self.captures[key] = known
            return known
        assert self._guards is not None and cap.guard_state is not None
        if state[1:] != cap.guard_state[1:]:  # not only Tensor.training: counted
            if self.recaptures >= self.max_recaptures:
                raise JitError(f"TinyJit({self.name}): {self._guards.describe_change(cap.guard_state, state)}"
                               f"; its value is baked into the captured kernels, and guarded values "
                               f"changed {self.recaptures} times already (max_recaptures="
                               f"{self.max_recaptures}). Pass values that change as Tensor arguments or "
                               f"bound Variables, or keep them constant")
            self.recaptures += 1
        return None

    def _eager(self, args: Sequence[Any], kwargs: dict[str, Any]) -> ReturnT:
        assert self.fn is not None
        ret = self.fn(*args, **kwargs)
        _finish_call(ret)
        return ret

    def _verified_replay(self, cap: CapturedGraph, call: _Call, args: Sequence[Any],
                         kwargs: dict[str, Any]) -> Any:
        """JIT_VERIFY: replay, then run the same call eagerly from the same starting state (buffers the
        capture writes restored, same random counter) and compare outputs and written state. The eager
        run's writes are the ones kept (they equal the replay's, or this raises)."""
        state = cap.written_buffers(call)
        before = [buffer_numpy(b) for b in state]
        rng = Tensor._rng_counter
        ret = cap.replay(call)
        got = [t.numpy() for t in _collect_tensors(ret)]
        got_state = [buffer_numpy(b) for b in state]
        for b, data in zip(state, before, strict=True):
            buffer_write(b, data)
        Tensor._rng_counter = rng
        want = [t.numpy() for t in _collect_tensors(self._eager(args, kwargs))]
        if len(want) != len(got):
            raise JitError(f"JIT_VERIFY: TinyJit({self.name}) call {self.calls}: the replay returned "
                           f"{len(got)} tensors, an eager run {len(want)}")
        labels = [f"returned tensor {i}" for i in range(len(got))] + \
            [f"{'input' if role == 'in' else 'state'} buffer {k} (written in place)"
             for role, k in cap.written]
        want_state = [buffer_numpy(b) for b in state]
        for label, a, w in zip(labels, got + got_state, want + want_state, strict=True):
            problem = _differs(a, w)
            if problem:
                raise JitError(f"JIT_VERIFY: TinyJit({self.name}) call {self.calls}: the replay's {label} "
                               f"differs from an eager run of the same call ({problem}). Something the "
                               f"function reads changed in a way the guards do not see (see "
                               f"docs/reliability.md, 'TinyJit guards'): pass it as an argument")
        return ret

    def _label(self, path: Path) -> str:
        return _describe(self.fn, path) if self.fn is not None else _describe(lambda: None, path)

    def _check_consts(self, cap: CapturedGraph, call: _Call) -> None:
        if not cap.consts:
            return
        values = [(p, x) for p, x in call.leaves if not isinstance(x, Tensor) and
                  not (isinstance(x, UOp) and x.op is Ops.BIND)]
        for (path, old), (_, new) in zip(cap.consts, values, strict=True):
            if not _same_value(old, new):
                raise JitError(f"TinyJit({self.name}): {self._label(path)} is {_short(new)} but the capture "
                               f"was made with {_short(old)}; non-Tensor arguments are baked into the "
                               f"captured kernels. Pass a Tensor or a bound Variable for values that change, "
                               f"or use a separate TinyJit")

    def _mismatch(self, call: _Call, recapture_possible: bool) -> None:
        ref = self.last if self.last is not None else next(iter(self.captures.values()), None)
        hint = " (pass on_mismatch='recapture' to capture again for new shapes)" if recapture_possible else \
            " (a loaded graph cannot capture again)"
        if ref is None:
            raise JitError(f"TinyJit({self.name}): nothing captured to replay")
        old_kinds, old_guards, old_alias = ref.key
        new_kinds, new_guards, new_alias = call.key
        if [k[:2] for k in old_kinds] != [k[:2] for k in new_kinds]:
            raise JitError(f"TinyJit({self.name}): the arguments differ in structure from the capture: "
                           f"captured {_structure(old_kinds)}, got {_structure(new_kinds)}{hint}")
        tensor_paths = [k[0] for k in new_kinds if k[1] == "tensor"]
        for path, old, new in zip(tensor_paths, old_guards, new_guards, strict=True):
            diffs = old.differences(new)
            if diffs:
                raise JitError(f"TinyJit({self.name}): {self._label(path)} has {'; '.join(diffs)}{hint}")
        if old_alias != new_alias:
            raise JitError(f"TinyJit({self.name}): the Tensor arguments share buffers differently than at "
                           f"capture (captured {old_alias}, got {new_alias}: equal numbers read the same "
                           f"buffer){hint}")
        for (path, *old_var), (_, *new_var) in zip(old_kinds, new_kinds, strict=True):
            if old_var != new_var:
                raise JitError(f"TinyJit({self.name}): {self._label(path)} is a different Variable than at "
                               f"capture{hint}")
        raise JitError(f"TinyJit({self.name}): call does not match the capture{hint}")

    # saving is in rawgrad.jit.storage (kept apart: file format, hashing, trust checks)
    def save(self, path: str) -> None:
        """Write the most recent capture to `path` (kernel binaries, queue, buffer plan, guards, the device
        identity), atomically and readable by its owner only: a temporary file created exclusively in the
        same folder, fsynced, renamed into place (a symlink at `path` or at any temporary name is never
        followed)."""
        if self.last is None:
            raise JitError(f"TinyJit({self.name}): nothing captured yet; call the function twice "
                           f"before save()")
        if self.last.rng_draws:
            # the file format has no place for the key buffers a replay rewrites: a loaded graph would
            # draw the same numbers on every call
            raise JitError(f"TinyJit({self.name}): the capture draws random numbers (Tensor.rand, "
                           f"dropout, ...); saved graphs cannot carry the random state yet")
        save_capture(self.last, path)

    @staticmethod
    def load(path: str, *, allow_untrusted: bool = False) -> TinyJit[Any]:
        """A callable that replays a graph saved with `save` (no tracing, no compiling).

        Raises `GraphFileError` (a JitError, hence a ValueError) for a path that is not a regular file (a
        symlink, a FIFO...), a file another user owns or others can write (unless `allow_untrusted`), a
        truncated or corrupted file, an older format ("re-save"), any manifest field out of bounds, or a
        graph made for a device other than the one its label names here (see rawgrad/jit/storage.py)."""
        cap = load_capture(path, allow_untrusted=allow_untrusted)
        jit: TinyJit[Any] = TinyJit(None, reuse_outputs=cap.reuse_outputs)
        jit.name = f"loaded graph {path!r}"
        jit.captures[cap.key] = cap
        jit.last = cap
        return jit


def _differs(a: np.ndarray, b: np.ndarray) -> str:
    """Why two results of the same call disagree ('' if they agree): exact for integers and bools, a
    float tolerance for floats (the same kernels run either way; the tolerance only absorbs a different
    order of floating-point work if the eager schedule differs)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype.kind == "f":
        tol = 1e-2 if a.dtype.itemsize <= 2 else 1e-5
        ok = np.isclose(a, b, rtol=tol, atol=tol / 10, equal_nan=True)
    else:
        ok = a == b
    if bool(np.all(ok)):
        return ""
    i = int(np.flatnonzero(~np.asarray(ok).reshape(-1))[0])
    return f"element {i}: replay {a.reshape(-1)[i]!r}, eager {b.reshape(-1)[i]!r}"


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


def _structure(kinds: Sequence[Any]) -> str:
    return "[" + ", ".join(f"{_path_str(k[0])}: {k[1]}" for k in kinds) + "]"


def _path_str(path: Path) -> str:
    return str(path[0]) if len(path) == 1 else f"{path[0]}[{path[1]!r}]"
