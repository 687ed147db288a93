"""Compile a representative corpus of rawgrad kernels for AMD GPUs and check every code object.

Run as a script (tests/amd/test_amd_corpus.py starts it in a subprocess: an LLVM abort there kills only this
process, and the test reports its stderr). It schedules a set of tensor ops (nothing runs) and takes the
kernel ASTs; for each AMD target it lowers every AST with the GPU flavor, renders it with the AMDGPU
renderer, compiles it, loads the code object with our loader and compares the kernel descriptor and
metadata with what the renderer asked for. It prints one JSON object: per target the number of kernels,
group-reduction kernels, LDS kernels, and every mismatch found.
"""
from __future__ import annotations

import json
import re
import sys

import numpy as np

from rawgrad import Tensor, dtypes
from rawgrad.compiler.amdgpu_code import load_code_object
from rawgrad.compiler.elf import ElfFile
from rawgrad.compiler.renderer.amdgpu import AMDGPURenderer, kernarg_bytes
from rawgrad.compiler.toolchain import AMDGPUCompiler
from rawgrad.tensor.schedule import create_schedule

R_AMDGPU_REL64 = 5  # the one relocation a kernel without constant tables carries (AMDGPUUsage)


def capture_kernels() -> dict:
    """Kernel AST -> symbol name for every kernel the scheduler makes for the op list (nothing runs)."""
    kernels: dict = {}
    for t in tensor_ops():
        items, _ = create_schedule([t.uop])
        for si in items:
            if si.ast is not None and si.ast not in kernels:
                kernels[si.ast] = f"{re.sub(r'[^A-Za-z0-9_]', '_', si.name)}_{len(kernels)}"
    return kernels


def tensor_ops():  # type: ignore[no-untyped-def]
    a, b, m = Tensor.randn(8, 64), Tensor.randn(8, 64), Tensor.randn(64, 16)
    yield (a * b + 1).relu()                                    # elementwise
    yield a.exp()
    yield a.log2()
    yield a.sin()
    yield a.sqrt()
    yield a.pow(b)
    yield a.abs().pow(2.5)                                      # transcendental
    yield a.sum(1)
    yield a.max(axis=1)
    yield a.sum()
    yield a.mean(0)
    yield a.softmax(-1)                                         # reductions (wave groups)
    yield Tensor.randn(4, 4096).sum(1)                          # a block group (LDS + barriers)
    yield a @ m                                                 # matmul
    yield a.cast(dtypes.float16) * 2
    yield a.cast(dtypes.bfloat16) + 1                           # half / bf16 casts
    d = a.cast(dtypes.float64)
    yield d.exp()
    yield d.log2()
    yield d.sin()
    yield d.pow(d)
    yield d.sqrt()
    yield d.sum(1)                                              # f64 transcendentals (decomposed)
    h = a.cast(dtypes.float16)
    yield h.exp()
    yield h.sin()
    yield h.sum(1)
    yield h.max(axis=1)
    i = Tensor(np.arange(64, dtype=np.int32).reshape(8, 8))
    yield i // 3
    yield i % 5
    yield i.sum(1)
    yield i.max(axis=1)
    yield a.cast(dtypes.int64) // 2
    yield (a > 0).where(a, b)
    yield a.argmax(1)
    emb, idx = Tensor.randn(10, 16), Tensor(np.array([1, 3, 9], dtype=np.int32))
    yield emb[idx]                                              # gather
    yield Tensor.rand(32, 32)                                   # random


def check_target(arch: str, kernels: dict) -> dict:
    renderer, compiler = AMDGPURenderer(arch), AMDGPUCompiler(arch, cache_dir="")
    problems: list[str] = []
    groups = lds = 0
    for ast, name in kernels.items():
        prog = renderer.lower(ast, name)
        obj = compiler.compile(renderer.render(prog))
        co = load_code_object(obj, arch)
        kd, meta = co.descriptor, co.metadata
        groups += prog.group_size > 1
        lds += kd.group_segment_fixed_size > 0
        karg = kernarg_bytes(prog)
        want = {"lds": prog.launch.shared_bytes, "kernarg": karg, "meta kernarg": karg,
                "max flat workgroup": prog.launch.local_size[0], "wave32": arch == "gfx1100",
                "wavefront": 32 if arch == "gfx1100" else 64, "scratch": 0, "hidden args": 0,
                "wgp mode": False, "relocations": [R_AMDGPU_REL64],
                "args": len(prog.globals) + len(prog.variables)}
        got = {"lds": kd.group_segment_fixed_size, "kernarg": kd.kernarg_size,
               "meta kernarg": meta.kernarg_segment_size, "max flat workgroup": meta.max_flat_workgroup_size,
               "wave32": kd.wave32, "wavefront": meta.wavefront_size,
               "scratch": kd.private_segment_fixed_size,
               "hidden args": sum(a.value_kind.startswith("hidden") for a in meta.args),
               "wgp mode": kd.wgp_mode, "args": len(meta.args),
               "relocations": sorted({r.type for r in ElfFile.parse(obj).relocations})}
        problems += [f"{arch} {name}: {k} is {got[k]!r}, renderer asked for {want[k]!r}" for k in want
                     if got[k] != want[k]]
    return {"kernels": len(kernels), "group_kernels": groups, "lds_kernels": lds, "problems": problems}


def main() -> None:
    kernels = capture_kernels()
    archs = sys.argv[1:] or ["gfx1100", "gfx942"]
    print(json.dumps({arch: check_target(arch, kernels) for arch in archs}))


if __name__ == "__main__":
    main()
