"""Compile rendered MSL with the system C++ compiler through tests/metal/msl_shim.h: type-check many kernels
in one g++ run, or build one barrier-free kernel into a shared library and run it on the host (a loop over
threadgroups and lanes, each lane a plain call)."""
from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import cffi
import numpy as np

from rawgrad.compiler.lower import LinearProgram

SHIM = Path(__file__).resolve().parent / "msl_shim.h"
CXX = shutil.which("g++") or shutil.which("clang++")
CXX_FLAGS = ["-std=c++17", "-Wno-attributes", "-x", "c++"]
_INCLUDE = "#include <metal_stdlib>"


def _include_dir(root: Path) -> Path:
    inc = root / "inc"
    inc.mkdir(exist_ok=True)
    (inc / "metal_stdlib").write_text(f'#include "{SHIM}"\n')
    return inc


def type_check(sources: dict[str, str]) -> None:
    """Compile every kernel (name -> MSL) as C++ through the shim; raise naming the first that fails."""
    assert CXX is not None
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        inc = _include_dir(root)
        parts = [_INCLUDE]
        for k, src in enumerate(sources.values()):  # one namespace per kernel: their helpers repeat
            assert src.startswith(_INCLUDE)
            parts.append(f"namespace k{k} {{\n{src[len(_INCLUDE):]}\n}}")
        unit = root / "all.metal"
        unit.write_text("\n".join(parts))
        res = subprocess.run([CXX, *CXX_FLAGS, "-fsyntax-only", f"-I{inc}", str(unit)], capture_output=True,
                             text=True)
        if res.returncode == 0:
            return
        for name, src in sources.items():  # find the culprit
            one = root / "one.metal"
            one.write_text(src)
            r = subprocess.run([CXX, *CXX_FLAGS, "-fsyntax-only", f"-I{inc}", str(one)], capture_output=True,
                               text=True)
            if r.returncode:
                raise AssertionError(f"kernel {name} does not compile as MSL-through-the-shim:\n{r.stderr}")
        raise AssertionError(f"the kernels compile one by one but not together:\n{res.stderr}")


def run_on_host(prog: LinearProgram, source: str, buffers: list[np.ndarray], scalars: list[int]) -> None:
    """Run a barrier-free kernel over its whole launch; writes land in `buffers` (numpy arrays, in place)."""
    assert CXX is not None
    if "threadgroup_barrier(" in source.split("kernel void", 1)[1] or "rg_shfl(" in source.split(
            "kernel void", 1)[1]:
        raise ValueError(f"{prog.name} uses barriers or SIMD shuffles: lanes cannot run one after another")
    sig = re.search(r"kernel void \w+\((.*)\) \{", source)
    assert sig is not None
    types = re.findall(r"device (\w+)\* buf\d+", sig.group(1))
    local = prog.launch.local_size[0]
    groups = max(1, math.ceil(prog.launch.global_for_scalars(scalars)[0] / local))
    call = [f"({t}*)bufs[{k}]" for k, t in enumerate(types)] + (["vars"] if prog.variables else [])
    launch = f"{prog.name}({', '.join(call + ['g', 'l'])});"
    harness = (f'{source}\nextern "C" void rg_run(void** bufs, const long* vars, unsigned groups) {{\n'
               f"  (void)vars;\n  for (unsigned g = 0; g < groups; g++)\n"
               f"    for (unsigned l = 0; l < {local}u; l++) {launch}\n}}\n")
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        inc = _include_dir(root)
        (root / "k.metal").write_text(harness)
        lib_path = root / "k.so"
        subprocess.run([CXX, *CXX_FLAGS, "-O1", "-shared", "-fPIC", f"-I{inc}", str(root / "k.metal"), "-o",
                        str(lib_path)], check=True, capture_output=True, text=True)
        ffi = cffi.FFI()
        ffi.cdef("void rg_run(void **bufs, const long *vars, unsigned groups);")
        lib = ffi.dlopen(str(lib_path))
        ptrs = ffi.new("void *[]", [ffi.cast("void *", b.ctypes.data) for b in buffers] or [ffi.NULL])
        vars_ = ffi.new("long[]", scalars or [0])
        lib.rg_run(ptrs, vars_, groups)
        ffi.dlclose(lib)
