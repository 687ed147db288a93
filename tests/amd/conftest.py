"""Helpers for the AMD compile tests: kernel ASTs of tensor ops, and a compiler per target."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from rawgrad.compiler.toolchain import AMDGPUCompiler
from rawgrad.tensor.schedule import create_schedule


def capture(ops: Callable[[], Iterable[Any]]) -> dict[Any, str]:
    """The kernel ASTs (-> symbol names) the scheduler makes for the tensors `ops()` yields (nothing runs)."""
    kernels: dict[Any, str] = {}
    for t in ops():
        items, _ = create_schedule([t.uop])
        for si in items:
            if si.ast is not None and si.ast not in kernels:
                kernels[si.ast] = f"{re.sub(r'[^A-Za-z0-9_]', '_', si.name)}_{len(kernels)}"
    return kernels


@pytest.fixture(scope="module")
def amd_compilers() -> dict[str, AMDGPUCompiler]:
    return {arch: AMDGPUCompiler(arch, cache_dir="") for arch in ("gfx1100", "gfx942")}
