"""Kernels from the AMDGPU renderer, compiled for gfx1100 and loaded by compiler/amdgpu_code.py, run on the
RDNA3 interpreter (drivers/amd/mock/rdna3) and give the CPU device's answer: the compile path end to end,
wave-group (ds_bpermute) and block-group (LDS + barriers) reductions and the float64 routines included.

A case whose machine code needs an instruction the interpreter does not have yet is a strict xfail on
MockUnsupported: it turns into a failure (to be moved to the passing list) once the interpreter has it."""
from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.amdgpu_code import load_code_object
from rawgrad.compiler.renderer.amdgpu import AMDGPURenderer
from rawgrad.compiler.toolchain import amdgpu_compiler
from rawgrad.drivers.amd.mock.rdna3 import interp
from rawgrad.tensor.schedule import create_schedule

ARCH = "gfx1100"
BUFFER_VA_STRIDE = 1 << 28  # buffer k is mapped at (k + 1) * this: far apart, 256-byte aligned
U64 = (1 << 64) - 1


def run_on_rdna3(f: Callable[..., Tensor], *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(interpreter result, CPU device result, group size) of the single kernel `f` makes from `arrays`."""
    inputs = [Tensor(a).realize() for a in arrays]
    want = f(*inputs).numpy()
    items, _ = create_schedule([f(*inputs).uop])
    kernels = [si for si in items if si.ast is not None]
    assert len(kernels) == 1, [si.name for si in kernels]
    si = kernels[0]
    renderer = AMDGPURenderer(ARCH)
    prog = renderer.lower(si.ast, "k")
    co = load_code_object(amdgpu_compiler(ARCH).compile(renderer.render(prog)), ARCH)
    memory = interp.MemoryMap()
    addresses = []
    out = None
    for k, buf in enumerate(si.bufs):
        va = (k + 1) * BUFFER_VA_STRIDE
        if k == 0:
            out = memory.map(va, np.zeros(want.size, want.dtype))
        else:
            src = next(t for t in inputs if buf in t.uop.toposort())
            memory.map(va, np.ascontiguousarray(src.numpy()))
        addresses.append(va)
    words = addresses + [si.var_vals[v] & U64 for v in prog.variables]
    size, local = int(prog.global_size), prog.launch.local_size[0]
    interp.run(interp.Program.from_code_object(co), memory, struct.pack(f"<{len(words)}Q", *words),
               (-(-size // local), 1, 1), (local, 1, 1))
    assert out is not None
    return np.frombuffer(out.tobytes(), want.dtype).reshape(want.shape), want, prog.group_size


_rng = np.random.default_rng(0)
A = _rng.standard_normal((8, 64)).astype(np.float32)
B = _rng.standard_normal((8, 64)).astype(np.float32)
M = _rng.standard_normal((64, 16)).astype(np.float32)
LONG = _rng.standard_normal((4, 4096)).astype(np.float32)

# name -> (function, inputs, rtol, group size the lowering picks on gfx1100)
CASES = {
    "elementwise": (lambda x, y: (x * y + 1).relu(), (A, B), 0, 1),
    "sum_wave": (lambda x: x.sum(1), (A,), 1e-6, 32),
    "max_wave": (lambda x: x.max(axis=1), (A,), 0, 32),
    "sum_block_lds": (lambda x: x.sum(1), (LONG,), 1e-6, 128),
    "exp": (lambda x: x.exp(), (A,), 1e-6, 1),
    "sin_through_f64": (lambda x: x.sin(), (A,), 1e-6, 1),
    "f64_exp2": (lambda x: x.exp2(), (A.astype(np.float64) * 40,), 1e-15, 1),
    "f64_sin": (lambda x: x.sin(), (A.astype(np.float64) * 100,), 1e-15, 1),
    "f64_sum": (lambda x: x.sum(1), (A.astype(np.float64),), 1e-15, 32),
    "half": (lambda x: (x * 2).exp(), (A.astype(np.float16),), 1e-3, 1),
    "matmul": (lambda x, y: x @ y, (A, M), 1e-6, 1),
    "int_div": (lambda x: x // 3, (np.arange(-32, 32, dtype=np.int32),), 0, 1),
    "i64_sum": (lambda x: x.sum(0), (np.arange(64, dtype=np.int64).reshape(64, 1) * 3,), 0, 32),
    "pow_through_f64": (lambda x, y: x.abs().pow(y), (A, B), 1e-6, 1),
    "f64_log2": (lambda x: x.abs().log2(), (A.astype(np.float64),), 1e-15, 1),
}


def _check(case: tuple) -> None:  # type: ignore[type-arg]
    f, arrays, rtol, group = case
    got, want, used_group = run_on_rdna3(f, *arrays)
    assert used_group == group
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-3)


@pytest.mark.parametrize("name", list(CASES))
def test_rendered_kernel_runs_on_rdna3(name: str) -> None:
    _check(CASES[name])
