"""The Metal compute queue: the HCQ vocabulary recorded as 64-bit words, turned into a command buffer at
submit.

Words (one command after another; every operand one word, so any of them can be a patch point):
    WAIT       [OP_WAIT, event handle, value]           encodeWaitForEvent:value:
    SIGNAL     [OP_SIGNAL, event handle, value]         encodeSignalEvent:value:
    TIMESTAMP  [OP_TIMESTAMP, event handle]             the command buffer's GPUStartTime or GPUEndTime
    EXEC       [OP_EXEC, pipeline handle, buffers, scalars, gx, gy, gz, lx, ly, lz, args...]
    COPY       [OP_COPY, dst address, src address, bytes]   a blit encoder's copyFromBuffer:...
    BARRIER    [OP_BARRIER]                             memoryBarrierWithScope:MTLBarrierScopeBuffers
An event handle is the MTLSharedEvent object (`MetalSignal.address`), a pipeline handle the
MTLComputePipelineState object (`MetalProgram.fn_addr`), an address a buffer's `gpuAddress` plus an offset:
all plain words, so a graph template relocates them like any other device's.

Eager submit (`MetalDevice.commit`): waits and signals go between encoders, consecutive execs share one
compute encoder (buffers by `setBuffer`, the scalar words by `setBytes`), copies a blit encoder.

Bound (a TinyJit graph, `_bind`): every exec becomes one command of an indirect command buffer (ICB): its
pipeline, `setKernelBuffer` per buffer, the scalar words in one argument buffer the ICB commands point into,
`concurrentDispatchThreadgroups`, and a barrier on every command after the first of a run (kernels of a graph
depend on each other in order). A replay is one command buffer: the timeline wait, a compute encoder that
makes every buffer resident (`useResource:usage:`) and runs the ICB's commands (`executeCommandsInBuffer:
withRange:`), blit copies between runs, the timeline signal. Patched words reach the ICB through a
`PatchHook`: a scalar is written into the argument buffer at once; an address or a launch size marks its
command, which is re-encoded (`setKernelBuffer` / `concurrentDispatchThreadgroups`) before the commit.
"""
from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rawgrad.hcq.patch import PatchHook
from rawgrad.hcq.queue import HWQueue, Value
from rawgrad.hcq.signal import Signal

if TYPE_CHECKING:
    from rawgrad.drivers.metal.device import MetalBuffer, MetalDevice
    from rawgrad.hcq.device import HCQDevice
    from rawgrad.hcq.program import Program

__all__ = ["MetalQueue", "msl_arguments"]

OP_WAIT, OP_SIGNAL, OP_TIMESTAMP, OP_EXEC, OP_COPY, OP_BARRIER = 1, 2, 3, 4, 5, 6
# words of each command before its variable part (an exec's arguments)
_FIXED = {OP_WAIT: 3, OP_SIGNAL: 3, OP_TIMESTAMP: 2, OP_EXEC: 10, OP_COPY: 4, OP_BARRIER: 1}
EXEC_HEADER = 10

_BUFFER_ARG = re.compile(r"device \w+\* buf\d+ \[\[buffer\(\d+\)\]\]")
_VARS_ARG = re.compile(r"constant long\* \w+ \[\[buffer\(\d+\)\]\]")
_signatures: dict[tuple[bytes, str], tuple[int, bool]] = {}


def msl_arguments(lib: bytes, name: str) -> tuple[int, bool]:
    """(buffer arguments, whether it reads scalar words) of kernel `name` in the MSL source `lib`, as the
    renderer writes them (compiler/renderer/msl.py calling convention)."""
    key = (bytes(lib), name)
    hit = _signatures.get(key)
    if hit is None:
        text = key[0].decode("utf-8", "replace")
        m = re.search(rf"kernel void {re.escape(name)}\((.*?)\) \{{", text, re.S)
        if m is None:
            raise ValueError(f"the MSL source has no kernel named {name!r}")
        hit = _signatures[key] = (len(_BUFFER_ARG.findall(m.group(1))), bool(_VARS_ARG.search(m.group(1))))
    return hit


@dataclass
class Command:
    """One decoded command: its opcode and the index of its first word."""

    op: int
    at: int
    nwords: int


@dataclass
class _IcbCommand:
    """What the bound queue knows about one exec of its ICB."""

    at: int  # word index of the exec
    buffers: int
    scalars: int
    arg_offset: int  # byte offset of its scalar words in the argument buffer
    bound: list[Any] = field(default_factory=list)  # the MetalBuffer set at each buffer index


def decode(words: list[int]) -> list[Command]:
    out: list[Command] = []
    i = 0
    while i < len(words):
        op = words[i]
        if op not in _FIXED:
            raise ValueError(f"word {i}: {op:#x} is not a Metal queue opcode")
        n = _FIXED[op] + (words[i + 2] + words[i + 3] if op == OP_EXEC else 0)
        out.append(Command(op, i, n))
        i += n
    return out


class MetalQueue(HWQueue):
    """A Metal compute queue (see the module docstring)."""

    WORD_BITS = 64

    def __init__(self, device: MetalDevice) -> None:
        super().__init__()
        self.device = device
        # bound state
        self._icb: Any = None  # Ref of the MTLIndirectCommandBuffer
        self._argbuf: MetalBuffer | None = None
        self._icb_cmds: list[_IcbCommand] = []
        self._word_role: dict[int, tuple[str, int, int]] = {}  # word -> (role, ICB command, slot)
        self._dirty: set[tuple[str, int, int]] = set()
        self._broken: str | None = None
        self._last_run: Any = None  # the in-flight record of this bound queue's last replay

    # ------------------------------------------------------------------ encoding
    def _wait(self, signal: Signal, value: Value) -> None:
        self._emit(OP_WAIT, signal.address, value)

    def _signal(self, signal: Signal, value: Value) -> None:
        self._emit(OP_SIGNAL, signal.address, value)

    def _timestamp(self, signal: Signal) -> None:
        self._emit(OP_TIMESTAMP, signal.address)  # the event handle: the driver records the time on it

    def _memory_barrier(self) -> None:
        self._emit(OP_BARRIER)

    def _copy(self, dst: Value, src: Value, nbytes: Value) -> None:
        self._emit(OP_COPY, dst, src, nbytes)

    def _exec(self, program: Program, args: list[Value], global_size: tuple[Value, ...],
              local_size: tuple[int, ...]) -> None:
        nbuf, has_vars = msl_arguments(program.lib, program.name)
        nscalars = len(args) - nbuf
        if nscalars < 0 or (nscalars > 0) != has_vars:
            raise ValueError(f"{program.name} takes {nbuf} buffers{' and scalars' if has_vars else ''}, got "
                             f"{len(args)} arguments")
        threads = local_size[0] * local_size[1] * local_size[2]
        limit = self.device.max_threads_per_threadgroup
        if threads > limit:
            raise ValueError(f"{program.name}: local size {tuple(local_size)} is {threads} threads; a Metal "
                             f"threadgroup holds at most {limit}")
        fn: Any = getattr(program, "fn_addr", None)
        if fn is None:
            raise TypeError(f"{program!r} is not a Metal program")
        self._emit(OP_EXEC, fn, nbuf, nscalars, *global_size, *local_size, *args)

    # ------------------------------------------------------------------ eager submit
    def _submit(self, device: HCQDevice) -> None:
        dev = self.device
        if device is not dev:
            raise ValueError(f"{self.name} belongs to {dev.name}, not {device.name}")
        if self._icb is not None:
            self._replay()
            return
        dev.commit(self._words, decode(self._words), self.name)

    # ------------------------------------------------------------------ bound replay (ICB)
    def _bind(self, device: HCQDevice) -> None:
        dev = self.device
        if device is not dev:
            raise ValueError(f"{self.name} belongs to {dev.name}, not {device.name}")
        cmds = decode(self._words)
        execs = [c for c in cmds if c.op == OP_EXEC]
        scalar_words = 0
        for c in execs:
            nbuf, nscal = self._words[c.at + 2], self._words[c.at + 3]
            self._icb_cmds.append(_IcbCommand(c.at, nbuf, nscal, 8 * scalar_words))
            scalar_words += nscal
        for k, ic in enumerate(self._icb_cmds):
            for j in range(ic.buffers):
                self._word_role[ic.at + EXEC_HEADER + j] = ("buf", k, j)
            for j in range(ic.scalars):
                self._word_role[ic.at + EXEC_HEADER + ic.buffers + j] = ("scalar", k, j)
            for j in range(4, 10):
                self._word_role[ic.at + j] = ("dims", k, 0)
            self._word_role[ic.at + 1] = ("pipeline", k, 0)
        self._argbuf = dev.alloc_buffer(max(8, 8 * scalar_words))
        self._icb = dev.new_icb(max(1, len(execs)), max([ic.buffers + 1 for ic in self._icb_cmds] or [1]))
        # a part whose words are patch points is encoded at the first replay, when they have values
        patched = {self._word_role[p.index] for p in self._patches if p.index in self._word_role}
        for k, ic in enumerate(self._icb_cmds):
            for j in range(ic.scalars):
                self._write_scalar(k, j, self._words[ic.at + EXEC_HEADER + ic.buffers + j])
            ic.bound = [None] * ic.buffers
            later = {role for role in patched if role[1] == k and role[0] != "scalar"}
            dev.encode_icb_command(self, k, first=(k == 0), skip=later)
            self._dirty.update(later)
        self._bound_words = PatchHook(self._patched)
        # a dropped graph gives its ICB and argument buffer back (a command buffer still running retains them)
        weakref.finalize(self, _release_bound, weakref.ref(dev), self._icb, self._argbuf)

    def _patched(self, index: int, word: int) -> None:
        """A changed word of the bound queue (the PatchHook): a scalar goes into the argument buffer now; an
        address, a launch size or a pipeline marks its ICB command for re-encoding before the commit."""
        role = self._word_role.get(index)
        if role is None:
            return  # a wait/signal value or a copy operand: read from the words when the replay is encoded
        kind, k, slot = role
        if kind == "scalar":
            self._write_scalar(k, slot, word)
        else:
            self._dirty.add(role)

    def _write_scalar(self, k: int, slot: int, word: int) -> None:
        assert self._argbuf is not None
        ic = self._icb_cmds[k]
        self.device.write_word(self._argbuf, ic.arg_offset + 8 * slot, word)

    def busy(self, device: HCQDevice) -> bool:
        return self._last_run is not None and not self.device.finished(self._last_run)

    def _before_patch(self, device: HCQDevice) -> None:
        if self._last_run is not None:  # the ICB and its argument buffer are rewritten in place
            self.device.wait_run(self._last_run, self.name)

    def _replay(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"{self.name} is unusable: {self._broken}")
        dev = self.device
        if self._last_run is not None and self._dirty:
            dev.wait_run(self._last_run, self.name)
        try:
            for kind, k, slot in sorted(self._dirty):
                dev.encode_icb_command(self, k, first=(k == 0), only=kind,
                                       slot=slot if kind == "buf" else None)
        except Exception as e:
            self._broken = f"a patched ICB command could not be re-encoded ({e})"
            raise
        self._dirty.clear()
        self._last_run = dev.commit(self._words, decode(self._words), self.name, bound=self)



def _release_bound(dev_ref: weakref.ref[MetalDevice], icb: Any, argbuf: MetalBuffer | None) -> None:
    dev = dev_ref()
    if dev is not None:
        dev.release_bound(icb, argbuf)
