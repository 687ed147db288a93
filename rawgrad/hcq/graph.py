"""Prebuilt command queues for captured graphs: what TinyJit replays.

A captured graph is encoded once as a *template*: the device's own queue encoder run over the commands with
every operand that differs between processes (kernel entry points, the arena, constant buffers, the
timeline signal) given as a *relocation* variable, and every operand that differs between replays (input
and output addresses, symbolic sizes, timeline values) as a *patch* variable. Both are DEFINE_VARs, so the
template's words plus its patch list are position independent: that pair is what a saved graph stores,
and its patch list doubles as the relocation table.

`HCQGraph` instantiates a template on a live device: relocations become constant words, only the replay
patch points stay symbolic, and the queue is bound once. A replay is `HWQueue.submit(device, var_vals)`:
the queue rewrites the words whose value changed and rings one doorbell (on the CPU one RUN_BLOCK record,
so no Python runs per kernel).

A bound queue is patched in place, so a replay must wait until the previous run of that queue has retired.
To let the host queue replay k+1 while the device still runs replay k, the graph keeps up to
`MAX_BOUND_COPIES` bound copies and takes them in turn; a second copy is only made the first time a replay
finds the copy it wants still running, so a loop that synchronizes every step never pays for one.

With PROFILE=1 a template can be encoded with `timestamp` commands around each kernel (`profile=True`);
their signals are relocations too, filled by the HCQGraph with signals it owns, and each replay's
timestamps are recorded by hcq.profile. A template built without it has no extra commands.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rawgrad.compiler.ir import UOp, Variable
from rawgrad.hcq.patch import free_variables
from rawgrad.hcq.profile import PROFILER, REPLAY
from rawgrad.hcq.queue import HWQueue, PatchPoint, Value, sym_eval

if TYPE_CHECKING:
    from rawgrad.hcq.device import HCQDevice
    from rawgrad.hcq.program import Program

__all__ = ["ARENA_ALIGNMENT", "CopyCommand", "HCQGraph", "KernelCommand", "QueueTemplate", "address_var",
           "build_template", "plan_arena"]

# Addresses and timeline values are unsigned 64-bit words.
WORD64_MAX = 2**64 - 1
# Bound copies of a graph's queue: two is double buffering, enough for the host to queue the next replay
# while the device runs the current one.
MAX_BOUND_COPIES = 2
# Arena offsets are aligned to this many bytes: more than any vector load the renderers emit assumes
# (an AVX-512 register is 64 bytes) and a multiple of every cache line we care about.
ARENA_ALIGNMENT = 256

# Patch variables the graph owns: the timeline values a replay waits for and signals.
TIMELINE_WAIT = Variable("graph.timeline_wait", 0, WORD64_MAX)
TIMELINE_SIGNAL = Variable("graph.timeline_signal", 0, WORD64_MAX)
# Relocation the graph owns: where this process keeps the device's timeline signal.
TIMELINE_ADDRESS = Variable("reloc.timeline", 0, WORD64_MAX)


def address_var(name: str) -> UOp:
    """A 64-bit symbolic address (a relocation or a patch point, depending on who fills it in)."""
    return Variable(name, 0, WORD64_MAX)


def program_var(index: int) -> UOp:
    """The relocation for the entry point of the template's `index`-th program."""
    return address_var(f"reloc.program{index}")


def profile_var(index: int, end: bool) -> UOp:
    """The relocation for the signal timestamped before (or after, `end`) the `index`-th kernel."""
    return address_var(f"reloc.profile{index}.{'end' if end else 'start'}")


@dataclass
class KernelCommand:
    """One launch: buffer addresses then integer scalars in `args`, a 3-D `global_size` in threads (ints or
    symbolic patch points; a bare value means `(value, 1, 1)`), and the block: `local_size` (None: the
    program's launch contract, as `HWQueue.exec`)."""

    program: Program
    args: list[Value]
    global_size: Value | tuple[Value, Value, Value]
    local_size: tuple[int, int, int] | None = None

    @property
    def dims(self) -> tuple[Value, Value, Value]:
        """The 3-D global size."""
        g = self.global_size
        return g if isinstance(g, tuple) else (g, 1, 1)


@dataclass
class CopyCommand:
    """A same-device copy of `nbytes` from `src` to `dst`."""

    dst: Value
    src: Value
    nbytes: Value


Command = KernelCommand | CopyCommand


@dataclass
class QueueTemplate:
    """A relocatable encoding of one device's queue (see the module docstring)."""

    queue_kind: str  # the HWQueue subclass that encoded it: a loader must have the same encoder
    word_bits: int
    words: np.ndarray  # uint64, zero where a patch point or relocation goes
    patches: list[PatchPoint]
    program_names: list[str] = field(default_factory=list)  # program_var(k) refers to program_names[k]
    # Kernel names of the timestamp pairs (profile_var(k, ...) brackets profile_names[k]); empty unless
    # encoded with profile=True.
    profile_names: list[str] = field(default_factory=list)
    # The last `data_words` words are the queue's data region, not commands (HWQueue.layout)
    data_words: int = 0


class _SymbolicSignal:
    """Stands in for a Signal while encoding a template: its address is a relocation."""

    def __init__(self, address: UOp, name: str = "timeline") -> None:
        self.address = address
        self.timestamp_address = address + 8  # the slot after the value word (hcq/signal.py layout)
        self.name = f"{name} (relocatable)"


class _SymbolicProgram:
    """Stands in for a Program while encoding a template: its entry point is a relocation."""

    def __init__(self, program: Program, entry: UOp) -> None:
        self.name, self.device, self.lib = program.name, program.device, program.lib
        self.launch = program.launch  # the contract travels with the stand-in (HWQueue.exec reads it)
        self.fn_addr = entry  # what the CPU encoder reads (drivers/cpu/device.py CPUQueue._exec)

    def __repr__(self) -> str:
        return f"SymbolicProgram({self.name!r})"


def build_template(device: HCQDevice, commands: Sequence[Command],
                   profile: bool = False) -> tuple[QueueTemplate, list[Program]]:
    """Encode `wait(timeline) -> commands... -> signal(timeline)` with relocatable operands; returns the
    template and the programs its relocations refer to, in order. `profile` puts a `timestamp` before and
    after each kernel."""
    q = device.queue()
    timeline: Any = _SymbolicSignal(TIMELINE_ADDRESS)
    programs: list[Program] = []
    proxies: dict[int, Any] = {}  # Any: a _SymbolicProgram stands in for the Program
    profiled: list[str] = []
    q.wait(timeline, TIMELINE_WAIT)

    def proxy_for(program: Program) -> Any:  # Any: a _SymbolicProgram stands in for the Program
        proxy = proxies.get(id(program))
        if proxy is None:
            proxy = proxies[id(program)] = _SymbolicProgram(program, program_var(len(programs)))
            programs.append(program)
        return proxy

    for cmd in commands:
        if isinstance(cmd, KernelCommand):
            proxy = proxy_for(cmd.program)
            if profile:
                k = len(profiled)
                start: Any = _SymbolicSignal(profile_var(k, end=False), f"profile {k} start")
                end: Any = _SymbolicSignal(profile_var(k, end=True), f"profile {k} end")
                q.timestamp(start).exec(proxy, cmd.args, cmd.dims, cmd.local_size).timestamp(end)
                profiled.append(cmd.program.name)
            else:
                q.exec(proxy, cmd.args, cmd.dims, cmd.local_size)
        elif isinstance(cmd, CopyCommand):
            # a device whose compute queue copies with a kernel (NV) encodes it as that kernel, so its entry
            # point is a relocation like every other program's and the graph can be saved
            kernel = device.graph_copy(cmd.dst, cmd.src, cmd.nbytes)
            if kernel is None:
                q.copy(cmd.dst, cmd.src, cmd.nbytes)
            else:
                q.exec(proxy_for(kernel.program), kernel.args, kernel.global_size, kernel.local_size)
        else:
            raise TypeError(f"not a graph command: {cmd!r}")
    q.signal(timeline, TIMELINE_SIGNAL)
    words, patches, data_words = q.layout()
    template = QueueTemplate(type(q).__name__, q.WORD_BITS, np.array(words, dtype=np.uint64, copy=True),
                             patches, [p.name for p in programs], profiled, data_words)
    return template, programs


def _instantiate(template: QueueTemplate, device: HCQDevice, relocs: Mapping[UOp, int]) -> HWQueue:
    """A bound queue: relocations resolved to constant words, replay patch points left symbolic."""
    q = device.queue()
    if type(q).__name__ != template.queue_kind or q.WORD_BITS != template.word_bits:
        raise ValueError(f"graph was encoded for {template.queue_kind} ({template.word_bits}-bit words); "
                         f"{device.name} uses {type(q).__name__} ({q.WORD_BITS}-bit words)")
    words = [int(w) for w in template.words]
    mask = (1 << template.word_bits) - 1
    dynamic: list[PatchPoint] = []
    for p in template.patches:
        variables = free_variables(p.expr)  # a BIND (a kernel's float constant) is a value, not a variable
        if all(v in relocs for v in variables):
            words[p.index] |= (sym_eval(p.expr, relocs) >> p.shift) & mask
            continue
        bound = {v: UOp.const(v.dt, relocs[v]) for v in variables if v in relocs}
        dynamic.append(PatchPoint(p.index, p.expr.substitute(bound) if bound else p.expr, p.shift))
    q._load_layout(words, dynamic, template.data_words)  # the words are already encoded
    return q.bind(device)


class HCQGraph:
    """One device's captured work as a bound queue; `submit(var_vals)` replays it on the timeline."""

    def __init__(self, device: HCQDevice, template: QueueTemplate, programs: Sequence[Program],
                 relocs: Mapping[UOp, int]) -> None:
        if len(programs) != len(template.program_names):
            raise ValueError(f"template needs {len(template.program_names)} programs, got {len(programs)}")
        full = dict(relocs)
        for k, prog in enumerate(programs):
            entry = getattr(prog, "fn_addr", None)
            if entry is None:
                raise NotImplementedError(f"graphs of {type(prog).__name__} programs are not supported yet")
            full[program_var(k)] = int(entry)
        full[TIMELINE_ADDRESS] = device.timeline_signal.address
        # The graph owns its timestamp signals: the bound queue writes them on every replay.
        self.profile_pairs = [(device.new_signal(name=f"graph profile {k} start"),
                               device.new_signal(name=f"graph profile {k} end"))
                              for k in range(len(template.profile_names))]
        for k, (start, end) in enumerate(self.profile_pairs):
            full[profile_var(k, end=False)], full[profile_var(k, end=True)] = start.address, end.address
        self.device, self.template, self.programs = device, template, list(programs)
        self._relocs = full
        self.queue = _instantiate(template, device, full)
        self.copies = [self.queue]  # bound copies, replayed in turn (see the module docstring)
        self._next_copy = 0
        self._profile_lock = threading.Lock()
        self.patch_variables = sorted({v for p in self.queue.patch_points for v in free_variables(p.expr)},
                                      key=lambda v: v.arg)

    def submit(self, var_vals: Mapping[UOp, int]) -> int:
        """Replay once after all earlier work of the device's timeline; returns the timeline value it
        signals. Raises (before anything runs) if a variable is missing or out of range."""
        if not self.profile_pairs:
            return self.device.timeline_replay(self._replay, var_vals)[0]
        # The profiler's lock is never taken under a device's lock (it waits for device work while held,
        # and allocates signals): this graph's own lock orders reading the previous replay's timestamps,
        # this replay and its record, against another thread replaying the same graph.
        with self._profile_lock:
            PROFILER.settle(self)  # this replay rewrites the same timestamp slots: read the last one's first
            value, queue = self.device.timeline_replay(self._replay, var_vals)
            PROFILER.add(self.device, value, self.template.profile_names, self.profile_pairs, REPLAY,
                         queue.name, owner=self)
        return value

    def _replay(self, value: int, var_vals: Mapping[UOp, int]) -> tuple[int, HWQueue]:
        """Replay as timeline value `value`: run by the device's timeline_replay, under its lock, which covers
        choosing and patching a bound copy (patched in place, so two threads must not write one at once) and
        the submit that signals the value; the value is reserved only once the work is queued."""
        dev = self.device
        vals = dict(var_vals)
        vals[TIMELINE_WAIT], vals[TIMELINE_SIGNAL] = value - 1, value
        k = self._next_copy
        queue = self.copies[k]
        if len(self.copies) < MAX_BOUND_COPIES and queue.busy(dev):
            queue = _instantiate(self.template, dev, self._relocs)  # instead of waiting for it to retire
            self.copies.append(queue)
            k = len(self.copies) - 1
        queue.submit(dev, vals)
        self._next_copy = (k + 1) % len(self.copies)
        return value, queue


def plan_arena(sizes: Sequence[int], lifetimes: Sequence[tuple[int, int]],
               alignment: int = ARENA_ALIGNMENT) -> tuple[list[int], int]:
    """Offsets for buffers of `sizes` bytes live over inclusive step ranges `lifetimes`, such that two
    buffers overlap in memory only if their lifetimes do not overlap; returns (offsets, arena bytes).

    Buffers are placed in order of first use, each at the lowest aligned gap among the buffers still live
    (first fit), so a chain of temporaries reuses a few slots instead of growing the arena."""
    if len(sizes) != len(lifetimes):
        raise ValueError(f"{len(sizes)} sizes but {len(lifetimes)} lifetimes")
    offsets = [0] * len(sizes)
    live: list[tuple[int, int, int]] = []  # (offset, end offset, last step), sorted by offset
    total = 0
    for i in sorted(range(len(sizes)), key=lambda k: (lifetimes[k][0], -sizes[k])):
        first, last = lifetimes[i]
        if first > last:
            raise ValueError(f"buffer {i}: lifetime {lifetimes[i]} ends before it starts")
        live = [e for e in live if e[2] >= first]
        need = -(-max(sizes[i], 1) // alignment) * alignment
        at = 0
        for start, end, _ in live:
            if start - at >= need:
                break
            at = max(at, end)
        offsets[i] = at
        live.append((at, at + need, last))
        live.sort()
        total = max(total, at + need)
    return offsets, total

