"""Kernel compilation: IR, lowering, renderers (LLVM IR, PTX) and the toolchains that build them.

`compile_counts()` / `total_compiles()` read every compiler's process-wide counters in one place, so a
caller (a test of a saved graph, say) can check that a code path compiled nothing on any device.
"""
from __future__ import annotations

import sys

__all__ = ["compile_counts", "total_compiles"]


def compile_counts() -> dict[str, int]:
    """Process-wide counts of compiler use, cache hits included (a hit still means something asked to
    compile): "kernels" = kernels lowered, rendered and compiled by the realize loop (any device);
    "llvm" = LLVMCompiler.compile calls (kernels and the CPU command processor); "nv" = NVCompiler.compile
    calls (ptxas / nvJitLink runs, their cache hits, PTX-only images). The NV compiler is counted once its
    module is imported: before that it cannot have run. Counters only grow unless reset, so compare a
    value taken before with one taken after."""
    from rawgrad.compiler.toolchain import LLVMCompiler
    from rawgrad.tensor.realize import GlobalCounters
    llvm = LLVMCompiler.stats
    counts = {"kernels": GlobalCounters.kernels_compiled, "llvm": llvm.compiles + llvm.cache_hits}
    cubin = sys.modules.get("rawgrad.drivers.nv.cubin")
    if cubin is not None:
        nv = cubin.NVCompiler.stats
        counts["nv"] = nv.assembled + nv.memory_hits + nv.disk_hits + nv.ptx_only
    return counts


def total_compiles() -> int:
    """The sum of `compile_counts()`."""
    return sum(compile_counts().values())
