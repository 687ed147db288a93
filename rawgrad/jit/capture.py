"""What one TinyJit capture holds and how it replays: the Tensor guards, the per-device queue templates and
programs, the buffer plan, and the encoding of the return value.

It lives apart from jit.py (which captures) so that jit/storage.py can read and write captures without
importing the module that calls it: jit.py imports storage for `TinyJit.save` / `TinyJit.load`, and both
import this module.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType
from rawgrad.hcq.device import Device, HCQDevice
from rawgrad.hcq.graph import HCQGraph, QueueTemplate, address_var
from rawgrad.hcq.program import Program
from rawgrad.tensor.buffers import (
    MEMORY_KEY,
    DeviceMemory,
    allocated_buffer,
    buffer_write,
    device_memory,
    device_node,
)
from rawgrad.tensor.tensor import Tensor

if TYPE_CHECKING:  # a type only: jit.py builds the calls and imports this module
    from rawgrad.jit.jit import _Call

__all__ = ["CapturedGraph", "DeviceGraph", "JitError", "OutRef", "Path", "TensorGuard"]


class JitError(ValueError):
    """A call that a capture cannot serve (a guard failed), or a graph that cannot be captured."""


# A leaf's path: (position or keyword name,) for an argument, (name, key) for an item of a list, tuple
# or dict argument.
Path = tuple[Any, ...]


class TensorGuard(NamedTuple):
    """What a Tensor argument must look like to reuse a capture. (A NamedTuple: every call builds and
    hashes one per Tensor argument, and a tuple does both in C.)"""

    shape: tuple[Any, ...]  # bound Variables replaced by the Variable
    dtype: DType
    device: str
    buffer_size: int  # elements of the buffer behind it (symbolic shapes read a max-size buffer)

    def differences(self, other: TensorGuard) -> list[str]:
        diffs = []
        if self.shape != other.shape:
            diffs.append(f"shape {_fmt_shape(other.shape)} (captured with {_fmt_shape(self.shape)})")
        if self.dtype != other.dtype:
            diffs.append(f"dtype {other.dtype} (captured with {self.dtype})")
        if self.device != other.device:
            diffs.append(f"device {other.device} (captured with {self.device})")
        if not diffs and self.buffer_size != other.buffer_size:
            diffs.append(f"a buffer of {other.buffer_size} elements (captured with {self.buffer_size})")
        return diffs


def _fmt_shape(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(d.render() if isinstance(d, UOp) else str(d) for d in shape) + \
        ("," if len(shape) == 1 else "") + ")"


# How a returned Tensor is found after a replay: (role, index, reshape or None, dtype).
# role "out": fresh output buffer k; "in": the buffer of input Tensor k; "ext": external buffer k.
OutRef = tuple[str, int, "tuple[Any, ...] | None", DType]


@dataclass
class DeviceGraph:
    """The part of a capture that runs on one device."""

    device: str
    template: QueueTemplate
    arena_bytes: int
    programs: list[Program]
    # `template` with timestamps around each kernel, made when PROFILE=1 at capture: what link() binds
    # then. Never saved, so a saved graph replays without profiling commands.
    profiled: QueueTemplate | None = None


@dataclass
class CapturedGraph:
    """Everything one capture needs to replay (and to be saved): guards, graphs, buffer plan, outputs."""

    key: tuple[Any, ...]
    consts: list[tuple[Path, Any]]  # non-Tensor, non-Variable leaves and their captured values
    baked: dict[UOp, int]  # values of Variables not passed in (bound inside the function)
    devices: list[DeviceGraph]
    externals: list[UOp]  # BUFFER nodes used in place
    outputs: list[tuple[str, int, DType]]  # (device, elements, dtype) of each fresh output buffer
    returned: Any  # the return value's shape (see _encode_return)
    kernel_count: int
    reuse_outputs: bool = False
    _graphs: list[HCQGraph] = field(default_factory=list)
    _arenas: list[DeviceMemory] = field(default_factory=list)
    _kept_outputs: list[UOp] | None = None
    # Random numbers: how far one call advances Tensor._rng_counter, and (external index, counter offset)
    # of each key buffer the kernels read. Not saved: TinyJit.save refuses a capture with rng_draws.
    rng_draws: int = 0
    rng_keys: list[tuple[int, int]] = field(default_factory=list)
    # ("in", slot) / ("ext", index) of each buffer the kernels write in place (for JIT_VERIFY)
    written: list[tuple[str, int]] = field(default_factory=list)
    # what the guards read at capture (see TinyJit: Tensor.training, globals and closure cells), and
    # the Tensors among them, held so that their ids stay theirs while the capture compares against them
    guard_state: tuple[Any, ...] | None = None
    guard_refs: list[Tensor] = field(default_factory=list)
    guard_values: list[Any] = field(default_factory=list)  # the guarded objects themselves (same order)

    def link(self) -> None:
        """Allocate the arenas and bind one queue per device (once per capture or load)."""
        graphs, arenas = [], []
        ext_relocs = {_ext_var(j): device_memory(b).address for j, b in enumerate(self.externals)}
        for d, dg in enumerate(self.devices):
            dev: HCQDevice = Device[dg.device]
            arena = DeviceMemory(dev, dg.arena_bytes)
            arenas.append(arena)
            relocs = {**ext_relocs, _arena_var(d): arena.address}
            template = dg.profiled if dg.profiled is not None else dg.template
            graphs.append(HCQGraph(dev, template, dg.programs, relocs))
        self._graphs, self._arenas = graphs, arenas
        # What every replay needs, made once: the DEVICE node, size and bytes of each fresh output, the
        # patch-point keys, and a shortcut for the usual return value (one fresh output, no reshape).
        self._out_specs = [(Device[dev], device_node(dev), size, dt, size * dt.itemsize)
                           for dev, size, dt in self.outputs]
        self._out_vars = [_output_var(k) for k in range(len(self.outputs))]
        kind, body = self.returned
        self._single_out = body[1] if kind == "tensor" and body[0] == "out" and body[2] is None else None

    def written_buffers(self, call: _Call) -> list[UOp]:
        return [call.buffers[k] if role == "in" else self.externals[k] for role, k in self.written]

    def replay(self, call: _Call) -> Any:
        if self.rng_draws:
            # the keys the same draws would get from an eager call now; buffer_write first waits for
            # the previous replay's kernels, which may still be reading these buffers
            base = Tensor._rng_counter
            for j, offset in self.rng_keys:
                buffer_write(self.externals[j], Tensor._rng_key(base + offset))
            Tensor._rng_counter = base + self.rng_draws
        vals = dict(self.baked)
        if call.var_vals:
            vals.update(call.var_vals)
        for slot, b in enumerate(call.buffers):
            vals[_input_var(slot)] = device_memory(b).address  # (also refuses a buffer of a closed device)
        outs = self._output_buffers()
        for var, b in zip(self._out_vars, outs, strict=True):
            vals[var] = b._cached[MEMORY_KEY].address
        for g in self._graphs:
            g.submit(vals)
        if self._single_out is not None:
            return Tensor._of(outs[self._single_out])
        return _decode_return(self.returned, outs, call.buffers, self.externals, vals)

    def _output_buffers(self) -> list[UOp]:
        """Fresh output buffers, their memory allocated (or the kept ones, with reuse_outputs)."""
        if self.reuse_outputs and self._kept_outputs is not None:
            return self._kept_outputs
        outs = [allocated_buffer(*spec) for spec in self._out_specs]
        if self.reuse_outputs:
            self._kept_outputs = outs
        return outs


# Made once per slot: building (interning) a UOp costs microseconds, and every replay needs these keys.
@functools.cache
def _input_var(slot: int) -> UOp:
    return address_var(f"jit.input{slot}")


@functools.cache
def _output_var(k: int) -> UOp:
    return address_var(f"jit.output{k}")


def _ext_var(j: int) -> UOp:
    return address_var(f"reloc.buffer{j}")


def _arena_var(d: int) -> UOp:
    return address_var(f"reloc.arena{d}")


def _decode_return(enc: Any, outs: list[UOp], ins: list[UOp], ext: list[UOp], vals: dict[UOp, int]) -> Any:
    kind, body = enc
    if kind == "tensor":
        role, index, reshape, dtype = body
        buf = (outs if role == "out" else ins if role == "in" else ext)[index]
        shape = _rebind(reshape, vals)
        return Tensor._of(buf if shape is None else UOp(Ops.RESHAPE, dtype, (buf,), shape))
    if kind in ("list", "tuple"):
        items = [_decode_return(y, outs, ins, ext, vals) for y in body]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _decode_return(y, outs, ins, ext, vals) for k, y in body}
    return body


def _rebind(shape: tuple[Any, ...] | None, var_vals: dict[UOp, int]) -> tuple[Any, ...] | None:
    if shape is None:
        return None
    return tuple(d.substitute({v: v.bind(var_vals[v]) for v in d.variables()}) if isinstance(d, UOp) else d
                 for d in shape)
