"""Renderers: how a device turns a kernel AST into source its compiler accepts.

A device owns one renderer, made for its `Target` (compiler/target.py) by `renderer_for`, so a driver names
the processor it has, never a renderer module or a renderer's constants. `lower` picks the loop structure
for that kind of processor (a CPU wants one global range split across cores and register tiles; a GPU wants
one thread per output element) and writes the kernel's launch contract; `render` prints the linear program
in the device's language (LLVM IR, PTX, ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rawgrad.compiler.ir import UOp
    from rawgrad.compiler.lower import LinearProgram
    from rawgrad.compiler.target import Target

__all__ = ["Renderer", "renderer_for"]


class Renderer(Protocol):
    """What `get_kernel` needs from a device to go from an AST to compilable source."""

    language: str  # "llvm", "ptx": also names the cache namespace of compiled binaries
    target: Target  # the processor it writes kernels for

    def lower(self, ast: UOp, name: str) -> LinearProgram: ...

    def render(self, prog: LinearProgram) -> str: ...


def renderer_for(target: Target) -> Renderer:
    """The renderer that writes kernels for `target`: LLVM IR for a CPU, PTX for an NVIDIA GPU, LLVM IR
    for an AMD GPU, MSL source for an Apple GPU."""
    from rawgrad.compiler.target import AMD_TRIPLE, APPLE_TRIPLE, NV_TRIPLE
    if not target.is_gpu:
        from rawgrad.compiler.renderer.llvm import LLVMRenderer
        return LLVMRenderer(target)
    if target.triple == NV_TRIPLE:
        from rawgrad.compiler.renderer.ptx import PTXRenderer
        return PTXRenderer(target)
    if target.triple == AMD_TRIPLE:
        from rawgrad.compiler.renderer.amdgpu import AMDGPURenderer
        return AMDGPURenderer(target)
    if target.triple == APPLE_TRIPLE:
        from rawgrad.compiler.renderer.msl import MSLRenderer
        return MSLRenderer(target)
    raise NotImplementedError(f"no renderer writes kernels for {target.name} ({target.triple}) yet")
