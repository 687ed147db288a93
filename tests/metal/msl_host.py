"""Compile rendered MSL with the system C++ compiler through tests/metal/msl_shim.h: type-check many kernels
in one g++ run, or build one kernel into a shared library and run it on the host: a loop over threadgroups
and lanes, each lane a plain call; or, for a kernel with barriers or SIMD shuffles, each lane of a
threadgroup a thread, so they synchronize as on a GPU."""
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
CXX_FLAGS = ["-Wno-attributes", "-x", "c++"]
CHECK_STD = "-std=c++17"  # type checks and sequential runs; lanes as threads need C++20 (std::barrier)
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
        check = [CXX, *CXX_FLAGS, CHECK_STD, "-fsyntax-only", f"-I{inc}"]
        res = subprocess.run([*check, str(unit)], capture_output=True, text=True)
        if res.returncode == 0:
            return
        for name, src in sources.items():  # find the culprit
            one = root / "one.metal"
            one.write_text(src)
            r = subprocess.run([*check, str(one)], capture_output=True, text=True)
            if r.returncode:
                raise AssertionError(f"kernel {name} does not compile as MSL-through-the-shim:\n{r.stderr}")
        raise AssertionError(f"the kernels compile one by one but not together:\n{res.stderr}")


def _body(source: str) -> str:
    return source.split("kernel void", 1)[1]


def run_on_host(prog: LinearProgram, source: str, buffers: list[np.ndarray], scalars: list[int]) -> None:
    """Run a kernel over its whole launch; writes land in `buffers` (numpy arrays, in place)."""
    local = prog.launch.local_size[0]
    groups = max(1, math.ceil(prog.launch.global_for_scalars(scalars)[0] / local))
    words = np.array(scalars or [0], dtype=np.int64)
    run_source(source, prog.name, [b.ctypes.data for b in buffers], words.ctypes.data if scalars else None,
               groups, local)


def run_source(source: str, name: str, pointers: list[int], vars_ptr: int | None, groups: int,
               local: int, simd_width: int = 32) -> None:
    """Build `source` with a harness that calls kernel `name` for threadgroups 0..groups-1 and lanes
    0..local-1, with buffer k at `pointers[k]` and the scalar words at `vars_ptr`. A kernel with barriers
    or SIMD shuffles runs each lane of a threadgroup as its own thread (real synchronization); lanes that
    make different numbers of threadgroup_barrier calls are a barrier mismatch, raised as an error."""
    assert CXX is not None
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
    lanes = "threadgroup_barrier(" in _body(source) or "rg_shfl(" in _body(source)
    if lanes:
        simd = min(simd_width, local)
        body = f"""  for (unsigned g = 0; g < groups; g++) {{
    std::barrier<> block({local});
    std::vector<std::unique_ptr<std::barrier<>>> simds;
    for (unsigned s = 0; s < {local}u; s += {simd}u) simds.emplace_back(new std::barrier<>({simd}));
    std::vector<uint64_t> exchange({local});
    std::vector<unsigned> counts({local}, 0u);
    std::vector<std::thread> threads;
    for (unsigned l = 0; l < {local}u; l++) threads.emplace_back([&, l] {{
      metal::rg_ctx = metal::rg_lane{{&block, simds[l / {simd}u].get(), exchange.data(), l, {simd}u,
                                     &counts[l]}};
      {launch}
      block.arrive_and_drop();  // a lane that has returned no longer holds the others at a barrier
      simds[l / {simd}u]->arrive_and_drop();
    }});
    for (auto& t : threads) t.join();
    for (unsigned l = 1; l < {local}u; l++) if (counts[l] != counts[0]) return (int)(g * {local}u + l) + 1;
  }}
  return 0;
"""
        prelude = "#define RG_HOST_LANES 1\n#include <memory>\n#include <thread>\n#include <vector>\n"
        std = ["-std=c++20", "-pthread"]
    else:
        body = (f"  for (unsigned g = 0; g < groups; g++)\n"
                f"    for (unsigned l = 0; l < {local}u; l++) {launch}\n  return 0;\n")
        prelude, std = "", [CHECK_STD]
    entry = 'extern "C" int rg_run(void** bufs, const long* vars, unsigned groups)'
    harness = f"{prelude}{source}\n{entry} {{\n  (void)vars;\n{body}}}\n"
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        inc = _include_dir(root)
        (root / "k.metal").write_text(harness)
        lib_path = root / "k.so"
        res = subprocess.run([CXX, *CXX_FLAGS, *std, "-O1", "-shared", "-fPIC", f"-I{inc}",
                              str(root / "k.metal"), "-o", str(lib_path)], capture_output=True, text=True)
        if res.returncode:
            raise AssertionError(f"{name}: host build failed:\n{res.stderr}")
        ffi = cffi.FFI()
        ffi.cdef("int rg_run(void **bufs, const long *vars, unsigned groups);")
        lib = ffi.dlopen(str(lib_path))
        ptrs = ffi.new("void *[]", [ffi.cast("void *", p) for p in pointers] or [ffi.NULL])
        bad = lib.rg_run(ptrs, ffi.cast("long *", vars_ptr or 0), groups)
        ffi.dlclose(lib)
    if bad:
        g, lane = divmod(bad - 1, local)
        raise AssertionError(f"{name}: barrier mismatch in threadgroup {g}: lane {lane} made a different "
                             f"number of threadgroup_barrier calls than lane 0")


def type_check_one(source: str) -> str | None:
    """None when `source` compiles through the shim, else the compiler's message (a fake Metal compiler)."""
    try:
        type_check({"kernel": source})
    except AssertionError as e:
        return str(e)
    return None
