"""The hardware queue base: the HCQ command vocabulary, patch points and replay.

A driver subclass encodes each command into machine words (`_emit`); the base keeps the words, the patch
points and the objects the commands refer to. Any numeric operand may be a symbolic `UOp` (a
DEFINE_VAR, or integer arithmetic over DEFINE_VARs): `_emit` records a patch point at its word and
`submit(device, var_vals)` evaluates the expression and rewrites only the words whose value changed
since this queue's previous submit. After `bind(device)` the words live in device-visible memory, so a
replay is one patch pass plus one doorbell.

Where a changed word goes is the driver's choice: the host words, and the bound copy `_bound_words`,
which is any object taking `bound[index] = word`. By default it is the block of words in device-visible
memory; a driver whose patch targets are API state (Metal's indirect command buffers set kernel arguments
and launch sizes through setters) binds a `patch.PatchHook` there instead, and each changed word becomes a
call. The generated patch writer and the generic submit store the same way, so memory words pay nothing
for the hook.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rawgrad.compiler.ir import UOp
from rawgrad.hcq.allocator import HCQBuffer
from rawgrad.hcq.patch import PatchGroup, PatchPoint, WordWriter, compile_expr, compile_word_writer, sym_eval
from rawgrad.hcq.signal import Signal

if TYPE_CHECKING:
    from rawgrad.hcq.device import HCQDevice
    from rawgrad.hcq.program import Program

__all__ = ["HWQueue", "KernelArg", "PatchPoint", "Value", "sym_eval"]

Value = int | UOp
KernelArg = HCQBuffer | int | UOp


class HWQueue:
    """A sequence of HCQ commands for one device kind. Every command method returns self.

    Drivers implement `_wait`, `_signal`, `_timestamp`, `_exec`, `_copy`, `_memory_barrier`, `_bind`
    and `_submit`, encoding through `_emit`. `WORD_BITS` is the driver's word width (64 on the CPU,
    32 for GPU pushbuffers).

    Threads: build a queue on one thread. A driver's `submit` runs under the device's `submit_lock` (a
    bound queue is patched in place, and the ring is shared); a caller whose queue signals the timeline
    holds that lock from reading `timeline_value` until the submit (as Program.__call__ does).
    """

    WORD_BITS = 64
    # Variables the queue resolves itself when a template is laid out (`_load_layout`), e.g. where its data
    # region lands: a saved graph may use them although they are neither relocations nor arguments
    LAYOUT_VARIABLES: tuple[UOp, ...] = ()

    def __init__(self) -> None:
        self._words: list[int] = []
        self._patches: list[PatchPoint] = []
        self._last: list[int | None] = []
        self._refs: list[object] = []
        self._array: np.ndarray | None = None
        # the bound copy of the words, indexable by word (a numpy array or a typed cffi pointer), or a
        # patch.PatchHook when the device takes patches through an API
        self._bound_words: Any = None
        # one PatchGroup per distinct patch expression, built on the first submit after the patch points
        # last changed
        self._plan: list[PatchGroup] | None = None
        self._writer: WordWriter | None = None  # the same for a bound queue's replay, as generated code
        self.bound_device: HCQDevice | None = None
        # why commands may no longer be added (bound, or laid out for running by a driver); None while open
        self._frozen: str | None = None
        self.name = f"{type(self).__name__}@{id(self):#x}"

    # ------------------------------------------------------------------ encoder helpers for drivers
    def _emit(self, *words: Value) -> int:
        """Append words (symbolic ones become patch points); returns the index of the first."""
        if self._frozen is not None:
            self._refuse_commands()
        start = len(self._words)
        mask = (1 << self.WORD_BITS) - 1
        for w in words:
            if isinstance(w, UOp):
                self._add_patch(PatchPoint(len(self._words), w))
                self._words.append(0)
            elif isinstance(w, int):
                self._words.append(w & mask)
            else:
                raise TypeError(f"queue operand must be an int or a symbolic UOp, got {type(w).__name__}")
        self._array = None
        return start

    def _emit_wide(self, value: Value, nwords: int) -> int:
        """Append a value spread little-endian over `nwords` words (a 64-bit address on a 32-bit ring)."""
        start = len(self._words)
        if isinstance(value, UOp):
            self._emit(*([0] * nwords))
            for i in range(nwords):
                self._add_patch(PatchPoint(start + i, value, i * self.WORD_BITS))
        elif isinstance(value, int):
            self._emit(*[(value >> (i * self.WORD_BITS)) for i in range(nwords)])
        else:
            self._emit(value)  # raises the operand TypeError
        return start

    def _refuse_commands(self) -> None:
        raise RuntimeError(f"{self.name} {self._frozen}; build a new queue to add commands")

    def _add_patch(self, p: PatchPoint) -> None:
        self._patches.append(p)
        self._last.append(None)
        self._plan = self._writer = None

    def _fold_variable(self, var: UOp, value: int) -> None:
        """Resolve `var` for good (a driver's layout variable once its bound block is placed, e.g. a data
        region's base): a patch point over `var` alone becomes a constant word now, one over `var` and others
        keeps only the others, so a replay evaluates only what really changes."""
        const = UOp.const(var.dt, value)
        mask = (1 << self.WORD_BITS) - 1
        patches: list[PatchPoint] = []
        last: list[int | None] = []
        for p, prev in zip(self._patches, self._last, strict=True):
            variables = p.expr.variables()
            if var not in variables:
                patches.append(p)
                last.append(prev)
            elif variables == [var]:
                self._set_word(p.index, (sym_eval(p.expr, {var: value}) >> p.shift) & mask)
            else:
                patches.append(PatchPoint(p.index, p.expr.substitute({var: const}), p.shift))
                last.append(None)
        self._replace_patches(patches, last)

    def _replace_patches(self, patches: list[PatchPoint], last: list[int | None]) -> None:
        """For drivers that resolve some patch points for good (e.g. once a queue's address is fixed)."""
        self._patches, self._last, self._plan, self._writer = patches, last, None, None

    def _changed_words(self, vals: Mapping[UOp, int]) -> list[tuple[int, int, int]]:
        """(patch position, word index, new word) of every patch point whose word differs under `vals`."""
        mask = (1 << self.WORD_BITS) - 1
        last = self._last
        changed: list[tuple[int, int, int]] = []
        for evaluate, slots in self._plan if self._plan is not None else self._patch_plan():
            value = evaluate(vals)
            for pos, index, shift in slots:
                word = (value >> shift) & mask
                if last[pos] != word:
                    changed.append((pos, index, word))
        return changed

    def _write_changed_words(self, vals: Mapping[UOp, int]) -> None:
        """A bound queue's patch pass: every changed word into the host words, the bound copy (memory words
        or a PatchHook) and the last-written list, through the generated writer."""
        writer = self._writer
        if writer is None:
            writer = self._writer = compile_word_writer(self._patches, self.WORD_BITS)
        writer(vals, self._words, self._bound_words, self._last)
        self._array = None  # words() rebuilds its copy when asked

    def _patch_plan(self) -> list[PatchGroup]:
        by_expr: dict[UOp, list[tuple[int, int, int]]] = {}
        for pos, p in enumerate(self._patches):
            by_expr.setdefault(p.expr, []).append((pos, p.index, p.shift))
        self._plan = [(compile_expr(e), slots) for e, slots in by_expr.items()]
        return self._plan

    def _set_word(self, index: int, value: int) -> None:
        self._words[index] = value
        if self._array is not None:
            self._array[index] = value
        if self._bound_words is not None:
            self._bound_words[index] = value

    def words(self) -> np.ndarray:
        """The encoded words as a uint64 array (cached until the next command is added)."""
        if self._array is None:
            self._array = np.array(self._words, dtype=np.uint64)
        return self._array

    @property
    def patch_points(self) -> list[PatchPoint]:
        return list(self._patches)

    def layout(self) -> tuple[np.ndarray, list[PatchPoint], int]:
        """The queue as a graph template stores it: its words, their patch points, and how many of the
        words at the end are a data region (words the commands point at but that never run as commands:
        NV's QMDs and constant banks; 0 for a driver without one)."""
        return self.words(), self.patch_points, 0

    def _load_layout(self, words: Sequence[int], patches: Sequence[PatchPoint], data_words: int) -> None:
        """Rebuild an open queue from a `layout()` (a graph template being instantiated)."""
        if data_words:
            raise ValueError(f"{type(self).__name__} has no data region; the layout has {data_words} words")
        self._emit(*words)
        for p in patches:
            self._add_patch(p)

    # ------------------------------------------------------------------ the vocabulary
    def wait(self, signal: Signal, value: Value) -> HWQueue:
        """Stall the queue until `signal.value >= value`."""
        self._refs.append(signal)
        self._wait(signal, value)
        return self

    def signal(self, signal: Signal, value: Value) -> HWQueue:
        """After all prior work of this queue, write `value` into `signal`."""
        self._refs.append(signal)
        self._signal(signal, value)
        return self

    def timestamp(self, signal: Signal) -> HWQueue:
        """Write the device clock (ns) into the signal's timestamp slot."""
        self._refs.append(signal)
        self._timestamp(signal)
        return self

    def exec(self, program: Program, args: Sequence[KernelArg], global_size: Sequence[Value] = (1, 1, 1),
             local_size: Sequence[int] | None = None) -> HWQueue:
        """Launch `program` over a 3-D grid: `global_size` threads per dimension (ints or symbolic), in blocks
        of `local_size` threads (concrete; None: the program's launch contract, else one thread). `args` are
        buffers (passed as addresses) then integer scalars. Kernels number threads x-fastest over the whole
        grid (compiler/target.py), so any 3-D shape covering a kernel's global size runs it."""
        contract = getattr(program, "launch", None)
        if local_size is None:
            local_size = contract.local_size if contract is not None else (1, 1, 1)
        if len(global_size) != 3 or len(local_size) != 3:
            raise ValueError(f"global_size and local_size need 3 entries, got {global_size}, {local_size}")
        for v in local_size:  # (a loop, not any(): this runs on every eager launch)
            if type(v) is not int or v < 1:
                raise ValueError(f"{program.name}: local size must be three positive ints (a block is fixed "
                                 f"when the launch is encoded), got {tuple(local_size)}")
        for g in global_size:
            if type(g) is int:
                if g < 0:
                    raise ValueError(f"{program.name}: negative global size {tuple(global_size)}")
            elif not isinstance(g, UOp):
                raise ValueError(f"{program.name}: global size must be three ints >= 0 or symbolic UOps, got "
                                 f"{tuple(global_size)}")
        if contract is not None and contract.exact_local and tuple(local_size) != contract.local_size:
            raise ValueError(f"{program.name} runs only in blocks of {contract.local_size} threads (its "
                             f"launch contract), got {tuple(local_size)}")
        if contract is not None and len(args) != contract.args:
            raise ValueError(f"{program.name} takes {contract.buffers} buffers and {len(contract.scalars)} "
                             f"scalars ({contract.args} arguments), got {len(args)}")
        self._refs.append(program)
        words: list[Value] = []
        for a in args:
            if isinstance(a, HCQBuffer):
                self._refs.append(a)
                words.append(a.va_addr)
            elif isinstance(a, (int, UOp)) and not isinstance(a, bool):
                words.append(a)
            else:
                raise TypeError(f"kernel argument must be an HCQBuffer, int or UOp, got {type(a).__name__}")
        self._exec(program, words, tuple(global_size), tuple(local_size))
        return self

    def copy(self, dst: Value, src: Value, nbytes: Value) -> HWQueue:
        """Copy `nbytes` from address `src` to address `dst` (ranges may overlap)."""
        self._copy(dst, src, nbytes)
        return self

    def memory_barrier(self) -> HWQueue:
        """Make prior writes visible to later work on this queue."""
        self._memory_barrier()
        return self

    def bind(self, device: HCQDevice) -> HWQueue:
        """Place the encoded commands in `device`-visible memory so `submit` replays them in one go."""
        if self.bound_device is not None:
            raise RuntimeError(f"{self.name} is already bound to {self.bound_device.name}")
        self._bind(device)
        self.bound_device = device
        self._frozen = f"is bound to {device.name}"
        return self

    def submit(self, device: HCQDevice, var_vals: Mapping[UOp, int] | None = None) -> HWQueue:
        """Resolve the patch points from `var_vals`, rewrite the changed words, ring the doorbell."""
        if self.bound_device is not None and self.bound_device is not device:
            raise ValueError(f"{self.name} is bound to {self.bound_device.name}, not {device.name}")
        if self._patches:
            changed = self._changed_words(var_vals if var_vals is not None else {})
            if changed:
                self._before_patch(device)
                for pos, index, word in changed:
                    self._set_word(index, word)
                    self._last[pos] = word
        self._submit(device)
        return self

    def busy(self, device: HCQDevice) -> bool:
        """Whether a bound queue's last run may still be reading its words, so that a submit now would
        first wait for it (False for a driver that never makes a submit wait)."""
        return False

    # ------------------------------------------------------------------ driver hooks
    def _before_patch(self, device: HCQDevice) -> None:
        """Called before words are rewritten; a bound queue waits here until its last run retired."""

    def _wait(self, signal: Signal, value: Value) -> None:
        raise NotImplementedError

    def _signal(self, signal: Signal, value: Value) -> None:
        raise NotImplementedError

    def _timestamp(self, signal: Signal) -> None:
        raise NotImplementedError

    def _exec(self, program: Program, args: list[Value], global_size: tuple[Value, ...],
              local_size: tuple[int, ...]) -> None:
        raise NotImplementedError

    def _copy(self, dst: Value, src: Value, nbytes: Value) -> None:
        raise NotImplementedError

    def _memory_barrier(self) -> None:
        raise NotImplementedError

    def _bind(self, device: HCQDevice) -> None:
        raise NotImplementedError

    def _submit(self, device: HCQDevice) -> None:
        raise NotImplementedError
