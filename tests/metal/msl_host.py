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


def _body(source: str) -> str:
    return source.split("kernel void", 1)[1]


def run_on_host(prog: LinearProgram, source: str, buffers: list[np.ndarray], scalars: list[int]) -> None:
    """Run a barrier-free kernel over its whole launch; writes land in `buffers` (numpy arrays, in place)."""
    local = prog.launch.local_size[0]
    groups = max(1, math.ceil(prog.launch.global_for_scalars(scalars)[0] / local))
    words = np.array(scalars or [0], dtype=np.int64)
    run_source(source, prog.name, [b.ctypes.data for b in buffers], words.ctypes.data if scalars else None,
               groups, local)


def run_source(source: str, name: str, pointers: list[int], vars_ptr: int | None, groups: int,
               local: int) -> None:
    """Build `source` with a harness that calls kernel `name` for threadgroups 0..groups-1 and lanes
    0..local-1, one after another, with buffer k at `pointers[k]` and the scalar words at `vars_ptr`."""
    assert CXX is not None
    if "threadgroup_barrier(" in _body(source) or "rg_shfl(" in _body(source):
        raise ValueError(f"{name} uses barriers or SIMD shuffles: lanes cannot run one after another")
    sig = re.search(r"kernel void \w+\((.*)\) \{", source)
    assert sig is not None
    types = re.findall(r"device (\w+)\* buf\d+", sig.group(1))
    if len(types) != len(pointers):
        raise ValueError(f"{name} takes {len(types)} buffers, the launch binds {len(pointers)}")
    has_vars = "constant long* vars" in sig.group(1)
    if has_vars and vars_ptr is None:
        raise ValueError(f"{name} reads scalar words, the launch binds none")
    call = [f"({t}*)bufs[{k}]" for k, t in enumerate(types)] + (["vars"] if has_vars else [])
    launch = f"{name}({', '.join(call + ['g', 'l'])});"
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
        ptrs = ffi.new("void *[]", [ffi.cast("void *", p) for p in pointers] or [ffi.NULL])
        lib.rg_run(ptrs, ffi.cast("long *", vars_ptr or 0), groups)
        ffi.dlclose(lib)


def type_check_one(source: str) -> str | None:
    """None when `source` compiles through the shim, else the compiler's message (a fake Metal compiler)."""
    try:
        type_check({"kernel": source})
    except AssertionError as e:
        return str(e)
    return None
