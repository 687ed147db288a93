"""Renderers: how a device turns a kernel AST into source its compiler accepts.

A device owns one renderer. `lower` picks the loop structure for that kind of processor (a CPU wants
one global range split across cores and register tiles; a GPU wants one thread per output element),
`render` prints the linear program in the device's language (LLVM IR, PTX, ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rawgrad.compiler.ir import UOp
    from rawgrad.compiler.lower import LinearProgram

__all__ = ["Renderer"]


class Renderer(Protocol):
    """What `get_kernel` needs from a device to go from an AST to compilable source."""

    language: str  # "llvm", "ptx": also names the cache namespace of compiled binaries

    def lower(self, ast: UOp, name: str) -> LinearProgram: ...

    def render(self, prog: LinearProgram) -> str: ...
