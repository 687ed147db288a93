"""Process-wide compile counters, read in one place.

Every compiler (the LLVM toolchain here, NV's PTX assembler in its driver, the realize loop's kernel
count above) registers a reader of its own counters when its module is imported, so this module names no
layer above it: a counter that was never registered belongs to code that never ran. Counters only grow
(unless a test resets its own), so callers compare a value taken before a step with one taken after.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CompileCount", "compile_counts", "compile_sources", "register_compile_counter", "total_compiles"]


@dataclass(frozen=True)
class CompileCount:
    """One counter's state: `calls` asked to compile (cache hits included), `new` real compiler runs,
    `cached` artefacts read back from the disk cache."""

    calls: int
    new: int = 0
    cached: int = 0


_READERS: dict[str, Callable[[], CompileCount]] = {}


def register_compile_counter(name: str, read: Callable[[], CompileCount]) -> None:
    """Make `read` part of every count under `name` (registering a name again replaces its reader)."""
    _READERS[name] = read


def compile_counts() -> dict[str, int]:
    """Compile requests so far per registered counter: "kernels" = kernels lowered, rendered and compiled
    by the realize loop (any device); "llvm" = LLVMCompiler.compile calls (kernels and the CPU command
    processor); "nv" = NVCompiler.compile calls (ptxas / nvJitLink runs, cache hits, PTX-only images)."""
    return {name: read().calls for name, read in _READERS.items()}


def total_compiles() -> int:
    """The sum of `compile_counts()`."""
    return sum(compile_counts().values())


def compile_sources() -> dict[str, int]:
    """Compiler work so far by where the result came from: "new" = real compiler runs, "cached" =
    artefacts read back from the disk cache. Take it before and after a step; the differences are what the
    step compiled and what it found on disk."""
    counts = [read() for read in _READERS.values()]
    return {"new": sum(c.new for c in counts), "cached": sum(c.cached for c in counts)}
