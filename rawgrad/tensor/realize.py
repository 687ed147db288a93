"""The realize loop: schedule lazy graphs into kernels, compile them (cached), launch them on devices.

`REFERENCE=1` evaluates through the numpy reference interpreter instead (rawgrad.tensor.interpret),
which tests use as the oracle for the compiled path.
"""
from __future__ import annotations

import contextlib
import dataclasses
import pickle
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rawgrad import config
from rawgrad.compiler.cache_kernels import CachedKernel, KernelDiskCache, ast_key, code_version
from rawgrad.compiler.counters import CompileCount, register_compile_counter
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.lower import LinearProgram
from rawgrad.compiler.symbolic import sym_infer
from rawgrad.hcq.device import Device
from rawgrad.tensor import schedule_cache
from rawgrad.tensor.buffers import buffer_numpy, buffer_write, device_memory
from rawgrad.tensor.schedule import ScheduleItem


class GlobalCounters:
    """Process-wide counters (tests assert fusion with `kernel_count`)."""

    kernel_count = 0
    kernels_compiled = 0
    kernel_disk_hits = 0  # of kernels_compiled, those loaded from the AST-keyed disk cache (no lowering)
    kernel_time_s = 0.0

    @classmethod
    def reset(cls) -> None:
        cls.kernel_count = 0
        cls.kernels_compiled = 0
        cls.kernel_disk_hits = 0
        cls.kernel_time_s = 0.0


# the realize loop's kernels (lowered, rendered, compiled; a compiler cache hit counts too); those loaded
# from the AST-keyed disk cache are artefacts read back from disk (no compiler runs for them)
register_compile_counter("kernels", lambda: CompileCount(GlobalCounters.kernels_compiled, 0,
                                                         GlobalCounters.kernel_disk_hits))


@dataclass
class CompiledKernel:
    """A kernel ready to launch: the device program plus what a launch needs to fill in."""

    name: str
    program: Any  # hcq Program
    linear: LinearProgram
    source: str
    # the launch contract's global size when it names no Variable (the common case: no work per launch)
    static_global: tuple[int, int, int] | None = field(init=False)

    def __post_init__(self) -> None:
        self.static_global = self.linear.launch.static_global

    def launch(self, bufs: list[Any], var_vals: dict[UOp, int], wait: bool = False,
               profile: bool = False) -> float | None:
        """Run once with the launch contract's sizes (the program's blocks); `profile` brackets the exec
        with device timestamps recorded by hcq.profile."""
        vals = tuple(var_vals[v] for v in self.linear.variables)
        spec = self.linear.launch
        gsize = self.static_global if self.static_global is not None else spec.global_for(var_vals)
        if profile:
            from rawgrad.hcq import profile as hcq_profile
            return hcq_profile.launch(self.program, bufs, gsize, spec.local_size, vals=vals, wait=wait)
        return self.program(*bufs, global_size=gsize, local_size=spec.local_size, vals=vals, wait=wait)


@dataclass
class ExecItem:
    """One launch as it ran: what a capture (TinyJit) records to replay later."""

    kernel: CompiledKernel | None  # None for a copy
    bufs: list[UOp]  # BUFFER nodes by slot
    var_vals: dict[UOp, int]


class _ThreadStack(threading.local):
    """A stack of which each thread sees its own copy (`items`); list-like for the few operations callers
    use (append, remove, truth, len, iteration, indexing), so it stands where a module-level list stood."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def append(self, x: Any) -> None:
        self.items.append(x)

    def remove(self, x: Any) -> None:
        self.items.remove(x)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


# The records of the captures open on this thread. Per thread: a capture records the launches its own
# thread makes, never those another thread makes meanwhile (they would be replayed as its own).
_captures = _ThreadStack()


@contextlib.contextmanager
def capture_launches() -> Iterator[list[ExecItem]]:
    """Record every launch (and copy) this thread makes inside the block, in order, while still running
    them."""
    record: list[ExecItem] = []
    _captures.append(record)
    try:
        yield record
    finally:
        _captures.remove(record)


# Names of the functions TinyJit is capturing now on this thread. A host read of device data inside one
# would bake the value read into the capture (a replay runs no Python), so Tensor.numpy() asks
# `check_readback` first; another thread reading its own data meanwhile is not inside the capture.
readback_guards = _ThreadStack()


def check_readback(what: str) -> None:
    """Raise if device data is read on the host while a TinyJit capture is recording."""
    if readback_guards:
        raise RuntimeError(f"{what} inside a TinyJit-captured function ({readback_guards[-1]}): a replay "
                           f"runs no Python, so the value read would be frozen at capture time; return "
                           f"the tensor from the function and read it outside")


# Loaded kernels by (ast, device), least recently used first. Past config.MAX_LOADED_KERNELS the oldest
# are dropped (see _evict), so a process that keeps making new shapes does not grow without bound (each
# loaded CPU kernel is ~95 KB and 2 mappings; the kernel mapping limit is ~65k).
_kernel_cache: OrderedDict[tuple[UOp, str], CompiledKernel] = OrderedDict()
# Kernels dropped by the last eviction: kept referenced until the next one, which first waits for their
# devices, so a launch submitted just before a drop never runs from an unmapped image.
_evicted: list[CompiledKernel] = []
_name_counts: dict[str, int] = {}
_used_names: set[str] = set()
# Held while a kernel missing from the cache is compiled and loaded, so two threads that miss on the same
# kernel build it once and symbol names stay unique; a hit never takes it. Re-entrant: loading a program
# may compile a helper kernel of the driver's. Taken before a device's lock, never under one.
_compile_lock = threading.RLock()


def _symbol_base(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _symbol_name(name: str) -> str:
    """A symbol no kernel of this process uses yet (one from the disk cache counts as used)."""
    base = _symbol_base(name)
    n = _name_counts.get(base, 0)
    while True:
        cand = base if n == 0 else f"{base}_n{n}"
        n += 1
        if cand not in _used_names:
            break
    _name_counts[base] = n
    _used_names.add(cand)
    return cand


# AST-keyed disk caches by folder (rawgrad.compiler.cache_kernels); the folder is the compiler's own.
_kernel_disks: dict[str, KernelDiskCache] = {}
# each renderer target's canonical text, by id (the target itself held, so an id is never reused meanwhile)
_target_texts: dict[int, tuple[Any, str]] = {}


def _kernel_disk(dev: Any, name: str, ast: UOp) -> tuple[KernelDiskCache, str] | None:
    """The AST-keyed disk cache and this kernel's key there, or None when the device's compiler has no
    disk cache or no target key (only the LLVM compilers have both)."""
    compiler = dev.compiler
    folder = getattr(compiler, "cache_dir", None)
    target_key = getattr(compiler, "target_key", None)
    if not folder or not isinstance(target_key, str):
        return None
    disk = _kernel_disks.get(folder)
    if disk is None:
        disk = _kernel_disks[folder] = KernelDiskCache(folder)
    import llvmlite  # the compilers with a target key are llvmlite's; its version is part of the key
    version = code_version(__name__, type(dev.renderer).__module__, type(compiler).__module__)
    # plus what else the lowering reads: the renderer's target (vector width, ...) and NOOPT
    target = dev.renderer.target
    held = _target_texts.get(id(target))
    if held is None or held[0] is not target:
        held = _target_texts[id(target)] = (target, _canonical(target))
    try:
        key = ast_key(ast, _symbol_base(name), type(dev.renderer).__qualname__, type(compiler).__qualname__,
                      held[1], f"NOOPT={int(config.NOOPT())}", target_key, llvmlite.__version__, version)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return None  # an AST argument that cannot be pickled: this kernel is simply not cached on disk
    return disk, key


def get_kernel(ast: UOp, device: str, name: str) -> CompiledKernel:
    """Lower, render, compile and load `ast` for `device`, once per (ast, device)."""
    key = (ast, device)
    hit = _kernel_cache.get(key)
    dev = Device[device]
    if hit is not None and hit.program.device is dev:  # not a program of a closed, reopened device
        with contextlib.suppress(KeyError):  # another thread may have evicted it meanwhile
            _kernel_cache.move_to_end(key)
        return hit
    with _compile_lock:
        hit = _kernel_cache.get(key)
        if hit is not None and hit.program.device is dev:  # another thread built it while this one waited
            return hit
        return _build_kernel(ast, dev, device, name)


def _build_kernel(ast: UOp, dev: Any, device: str, name: str) -> CompiledKernel:
    key = (ast, device)
    if dev.renderer is None:
        raise RuntimeError(f"device {device} has no renderer: it cannot run kernels")
    # DEBUG=4 prints every kernel's generated code, so it lowers and renders even what the disk holds
    disk = _kernel_disk(dev, name, ast)
    ck = _load_cached(dev, disk) if disk is not None and config.DEBUG() < 4 else None
    if ck is None:
        linear = dev.renderer.lower(ast, _symbol_name(name))
        src = dev.renderer.render(linear)
        if config.DEBUG() >= 4:
            print(src)
        compiler = dev.compiler
        lib = compiler.compile(src, work=kernel_work(linear)) if getattr(compiler, "sizes_pipeline", False) \
            else compiler.compile(src)
        ck = CompiledKernel(linear.name, dev.program(linear.name, lib, linear.launch), linear, src)
        if disk is not None:
            disk[0].put(disk[1], CachedKernel(linear.name, tuple(linear.variables), linear.global_size,
                                              linear.launch, lib))
    GlobalCounters.kernels_compiled += 1
    _kernel_cache[key] = ck
    if len(_kernel_cache) > config.MAX_LOADED_KERNELS():
        _evict(len(_kernel_cache) - config.MAX_LOADED_KERNELS())
    return ck


def _canonical(obj: Any) -> str:
    """A repr that is the same in every process: sets are sorted (their order follows string hashing,
    which is randomized per process) and dataclasses are written field by field."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return f"{type(obj).__name__}(" + ",".join(f"{f.name}={_canonical(getattr(obj, f.name))}"
                                                   for f in dataclasses.fields(obj)) + ")"
    if isinstance(obj, (set, frozenset)):
        return "{" + ",".join(sorted(_canonical(v) for v in obj)) + "}"
    if isinstance(obj, (tuple, list)):
        return "(" + ",".join(_canonical(v) for v in obj) + ")"
    return repr(obj)


def _load_cached(dev: Any, disk: tuple[KernelDiskCache, str]) -> CompiledKernel | None:
    """The kernel from the AST-keyed disk cache, or None (a miss, a refused entry, or its symbol name
    already taken by another kernel of this process: then it is built under a fresh name)."""
    entry = disk[0].get(disk[1])
    if entry is None or entry.name in _used_names:
        return None
    try:
        program = dev.program(entry.name, entry.lib, entry.launch)
    except Exception:  # an intact entry whose object does not load (e.g. no such symbol): build it again
        disk[0].refused_entries += 1
        return None
    _used_names.add(entry.name)
    GlobalCounters.kernel_disk_hits += 1
    # what a launch and a capture read from the lowered program; the statements are not needed
    linear = LinearProgram(entry.name, [], [], list(entry.variables), entry.global_size, entry.launch,
                           dev.renderer.target)
    return CompiledKernel(entry.name, program, linear, f"; {entry.name}: loaded from the kernel cache")


def kernel_work(linear: LinearProgram) -> int | None:
    """An upper estimate of a kernel's work per call, for the compiler's choice of pipeline: the product of
    every loop's trip count (the global range counted as the launch's threads) times the number of distinct
    nodes in the kernel's statements (its body's size; sequential loops multiply too: an overestimate only
    costs the full pipeline). None when a bound is symbolic: the work is unknown until launch."""
    threads = linear.launch.threads
    if not isinstance(threads, int):
        return None
    work = threads
    seen: set[int] = set()
    stack = list(linear.statements)
    while stack:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        stack.extend(u.src)
        if u.op is Ops.RANGE and u.arg[1] != "global":
            start, end = u.src
            if start.op is not Ops.CONST or end.op is not Ops.CONST:
                return None
            work *= max(int(end.arg) - int(start.arg), 1)
    return work * max(len(seen), 1)


def _evict(n: int) -> None:
    """Drop the `n` least recently used kernels (under _compile_lock). Each is unloaded when the last
    reference goes: a capture or graph that holds it keeps it loaded. Devices are synchronized first, so
    the kernels dropped by the previous eviction have finished every launch before they are released."""
    global _evicted
    devices = {id(ck.program.device): ck.program.device for ck in _evicted}
    dropped = [_kernel_cache.popitem(last=False)[1] for _ in range(n)]
    for dev in devices.values():
        if not dev.closed:
            dev.synchronize()
    _evicted = dropped


def run_schedule(items: list[ScheduleItem]) -> None:

    debug = config.DEBUG()
    profile = config.PROFILE()
    captures = _captures.items  # this thread's open captures (looked up once, not per kernel)
    for si in items:
        if si.ast is None:
            dst, src = si.bufs
            buffer_write(dst, buffer_numpy(src))
            for rec in captures:
                rec.append(ExecItem(None, list(si.bufs), dict(si.var_vals)))
            continue
        if si.bufs[0].arg[1] == 0:
            continue  # an empty output: nothing to compute
        device = si.bufs[0].device
        ck = get_kernel(si.ast, device, si.name)
        mems = [device_memory(b) for b in si.bufs]
        st = time.perf_counter()
        elapsed = ck.launch([m.hcq_buffer for m in mems], si.var_vals, wait=debug >= 2, profile=profile)
        GlobalCounters.kernel_count += 1
        for rec in captures:
            rec.append(ExecItem(ck, list(si.bufs), dict(si.var_vals)))
        if debug >= 2:
            GlobalCounters.kernel_time_s += elapsed or 0.0
            print(f"*** {device:4s} {GlobalCounters.kernel_count:4d} {ck.name:40s} "
                  f"global={int(sym_infer(ck.linear.global_size, si.var_vals)):>10d} bufs={len(si.bufs)} "
                  f"{(elapsed or 0) * 1e6:9.1f} us  (host {(time.perf_counter() - st) * 1e6:7.1f} us)")


def realize(*uops: UOp) -> tuple[UOp, ...]:
    """Compute every uop; return, for each, an equivalent node that reads a contiguous BUFFER
    (the BUFFER itself, or a RESHAPE of it to the uop's shape)."""
    return realize_noting_assigns(*uops)[0]


def realize_noting_assigns(*uops: UOp) -> tuple[tuple[UOp, ...], list[UOp]]:
    """`realize`, and the ASSIGN nodes of the graphs it ran (what Tensor.realize marks as run)."""
    if config.REFERENCE():
        from rawgrad.tensor.interpret import interpret_realize
        assigns = list(dict.fromkeys(n for u in uops for n in u.toposort() if n.op is Ops.ASSIGN))
        return interpret_realize(*uops), assigns
    items, results, assigns = schedule_cache.schedule_noting_assigns(list(uops))
    run_schedule(items)
    return tuple(results), assigns
