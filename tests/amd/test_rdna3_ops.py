"""The AMDGPU renderer's kernels on the RDNA3 interpreter: every distinct kernel of the op list in
tools/amd_optable.py (elementwise, transcendental, reductions through wave groups and LDS block groups,
matmul, half/double casts, integer division, argmax, gather) is rendered for gfx1100, compiled, loaded by
rawgrad's loader and run on the mock with the exact buffers the CPU device saw; its output must match.
The decoder must also name every instruction of every such kernel as LLVM's listing does."""
from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rawgrad.compiler.amdgpu_code import load_code_object
from rawgrad.compiler.ir import UOp, prod
from rawgrad.compiler.symbolic import sym_infer
from rawgrad.drivers.amd.mock.rdna3 import corpus, listing
from rawgrad.drivers.amd.mock.rdna3.interp import MemoryMap, Program, run

ROOT = Path(__file__).resolve().parents[2]
BASE, GAP = 0x1_0000_0000, 0x1000_0000
FILL = 0xA5  # byte pattern the output buffer starts with
MIN_KERNELS = 42  # the op list yields 44 distinct kernels today; fewer means ops stopped reaching the capture
# CPU and AMD lower transcendental functions differently (libm-style vs the renderer's decompositions and
# v_exp/v_log), so float results agree to a tolerance; integer and bool results must be identical
RTOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12}


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location("amd_optable", ROOT / "tools" / "amd_optable.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclasses look their module up while being defined
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def captured() -> list[Any]:
    tool = _tool()
    return [(cap, *tool.render_for_mock(cap.ast, cap.name)) for cap in tool.capture_renderer_kernels()]


def _run_on_mock(cap: Any, prog: Any, ir: str) -> tuple[np.ndarray, list[str]]:
    c = corpus.compile_ir(cap.name, ir)
    problems = listing.mismatches(c.obj, c.asm, cap.name)
    program = Program.from_code_object(load_code_object(c.obj, corpus.CPU, kernel=cap.name))
    mem = MemoryMap()
    views = []
    for slot, arr in enumerate(cap.inputs):
        if slot == 0:  # the output: a fill pattern, so an element the kernel never writes cannot pass
            arr = np.full(arr.nbytes, FILL, np.uint8)
        views.append(mem.map(BASE + slot * GAP, arr if arr.size else np.zeros(1, arr.dtype)))
    words = [BASE + slot * GAP for slot in range(len(cap.inputs))]
    words += [int(cap.var_vals[v]) for v in prog.variables]
    kernarg = struct.pack(f"<{len(words)}q", *words)
    threads = int(sym_infer(prog.global_size, cap.var_vals)) if not isinstance(prog.global_size, int) \
        else prog.global_size
    local = prog.launch.local_size
    run(program, mem, kernarg, (max(1, -(-threads // local[0])), 1, 1), local)
    return views[0].view(cap.output.dtype)[:cap.output.size], problems


def test_renderer_kernels_match_cpu(captured: list[Any]) -> None:
    assert len(captured) >= MIN_KERNELS
    failures = []
    for cap, prog, ir in captured:
        got, problems = _run_on_mock(cap, prog, ir)
        failures += problems
        want = cap.output
        # a symbolic output holds fewer elements than its buffer (sized for the largest value): compare those,
        # and the rest must still hold the fill pattern (nothing written past the launch's elements)
        store_view = cap.ast.src[0].src[1].arg
        n_out = prod(int(sym_infer(d, cap.var_vals)) if isinstance(d, UOp) else d for d in store_view.shape)
        if n_out < want.size:
            if (got[n_out:].view(np.uint8) != FILL).any():
                failures.append(f"{cap.name}: wrote past its {n_out} elements")
            got, want = got[:n_out], want[:n_out]
        if want.dtype.kind == "f":
            close = np.isclose(got, want, rtol=RTOL[want.dtype], atol=RTOL[want.dtype], equal_nan=True)
        else:
            close = got == want
        if not close.all():
            k = int(np.argmin(close))
            failures.append(f"{cap.name}: {int((~close).sum())}/{want.size} differ, e.g. [{k}] "
                            f"mock {got[k]!r} cpu {want[k]!r}")
    assert failures == []
