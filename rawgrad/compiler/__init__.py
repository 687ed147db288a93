"""Kernel compilation: IR, lowering, renderers (LLVM IR, PTX) and the toolchains that build them.

`compile_counts()` / `total_compiles()` (compiler/counters.py) read every compiler's process-wide counters in
one place, so a caller (a test of a saved graph, say) can check that a code path compiled nothing on any
device.
"""
from __future__ import annotations

from rawgrad.compiler.counters import compile_counts, compile_sources, total_compiles

__all__ = ["compile_counts", "compile_sources", "total_compiles"]
