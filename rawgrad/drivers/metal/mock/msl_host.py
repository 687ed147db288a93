"""The mock Apple GPU's compiler and shader cores: rendered MSL compiled as C++ with the system compiler
through the Metal shim header (msl_shim.h next to this file), and run on the host.

- `type_check` / `type_check_one`: compile kernels with `-fsyntax-only` (the fake `newLibraryWithSource`
  calls `type_check_one`: a kernel that does not compile is an NSError, as on a Mac).
- `HostKernels`: builds one kernel into a shared library with a launch harness and runs a dispatch over a
  3-D grid of threadgroups. A kernel without barriers or SIMD shuffles runs each lane as a plain call; one
  with them runs every lane of a threadgroup as its own thread, so `threadgroup_barrier` (a `std::barrier`)
  and `simd_shuffle_xor` really synchronize, and lanes that make different numbers of barrier calls are
  reported as a barrier mismatch. Built libraries are cached by a hash of the source in a private directory
  (`tempfile.mkdtemp`: mode 0700, a fresh name) removed by `close()` (and at exit).

The harness passes each kernel parameter that carries a Metal thread attribute from the thread's place in
the grid, so the kernel's own signature decides what it gets (MSL specification, "Attributes for kernel
function input arguments").
"""
from __future__ import annotations

import atexit
import hashlib
import math
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import cffi
import numpy as np

from rawgrad.compiler.lower import LinearProgram

__all__ = ["CXX", "SHIM", "HostKernels", "MSLHostError", "host_kernels", "run_on_host", "run_source",
           "type_check", "type_check_one"]

SHIM = Path(__file__).resolve().parent / "msl_shim.h"
CXX = shutil.which("g++") or shutil.which("clang++")
CXX_FLAGS = ["-Wno-attributes", "-x", "c++"]
CHECK_STD = "-std=c++17"  # type checks and sequential runs; lanes as threads need C++20 (std::barrier)
_INCLUDE = "#include <metal_stdlib>"
# A host build that takes longer than this is stuck (a kernel builds in about a second).
BUILD_TIMEOUT_S = 120.0
# Apple GPUs run SIMD-groups of 32 lanes (compiler/target.py APPLE_SIMD_WIDTH).
SIMD_WIDTH = 32
_SIG = re.compile(r"kernel void (\w+)\((.*?)\) \{", re.S)
_BUFFER = re.compile(r"device (\w+)\* (\w+) \[\[buffer\((\d+)\)\]\]")
_VARS = re.compile(r"constant long\* (\w+) \[\[buffer\((\d+)\)\]\]")
_BUILTIN = re.compile(r"(uint3|uint) (\w+) \[\[(\w+)\]\]")
# C++ expressions (in the harness's loop variables) for each thread attribute the kernels may declare
_ATTRIBUTES = {
    "threadgroup_position_in_grid": {"uint": "gx", "uint3": "uint3(gx, gy, gz)"},
    "thread_position_in_threadgroup": {"uint": "lx", "uint3": "uint3(lx, ly, lz)"},
    "thread_index_in_threadgroup": {"uint": "lin"},
    "thread_position_in_grid": {"uint": "gx * LX + lx",
                                "uint3": "uint3(gx * LX + lx, gy * LY + ly, gz * LZ + lz)"},
    "threads_per_grid": {"uint": "GX * LX", "uint3": "uint3(GX * LX, GY * LY, GZ * LZ)"},
    "threads_per_threadgroup": {"uint": "LX", "uint3": "uint3(LX, LY, LZ)"},
    "threadgroups_per_grid": {"uint": "GX", "uint3": "uint3(GX, GY, GZ)"},
}


# Lanes of a synchronizing kernel run as fibers on one thread where the harness has a stack switch for the
# host (x86-64 System V); elsewhere as threads (correct, much slower for large reductions).
FIBERS = platform.machine() in ("x86_64", "AMD64")
# Stack of each lane fiber: the kernels keep a few scalars per lane.
FIBER_STACK_BYTES = 128 * 1024
_SWAP_ASM = r"""
asm(".text\n.globl rg_swap\n.type rg_swap,@function\nrg_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
    ".size rg_swap, .-rg_swap\n");
"""


def _fiber_harness(launch: str) -> tuple[tuple[str, str], str, list[str]]:
    """(file-scope part, rg_run body), prelude and flags of the fiber harness for `launch`."""
    scope = f"""{_SWAP_ASM}
static void** slots;
static unsigned GX, GY, GZ, LX, LY, LZ, gx, gy, gz;
static void rg_lane_entry() {{
  metal::rg_fiber_lane* me = metal::rg_cur;
  const unsigned lin = me->lane, lx = lin % LX, ly = lin / LX % LY, lz = lin / (LX * LY);
  {launch}
  me->finished = true;
  rg_swap(&me->sp, metal::rg_sched_sp);
  __builtin_trap();  // a finished lane is never resumed
}}
"""
    body = f"""  slots = slots_; GX = GX_; GY = GY_; GZ = GZ_; LX = LX_; LY = LY_; LZ = LZ_;
  const unsigned L = LX * LY * LZ, S = L < {SIMD_WIDTH}u ? L : {SIMD_WIDTH}u;
  const unsigned long G = (unsigned long)GX * GY * GZ;
  const size_t STACK = {FIBER_STACK_BYTES};
  char* stacks = (char*)std::malloc(STACK * L);
  if (!stacks) return -1;
  std::vector<metal::rg_fiber_lane> lanes(L);
  std::vector<uint64_t> exchange(L);
  std::vector<unsigned> counts(L);
  long bad = 0;
  for (unsigned long group = 0; group < G && !bad; group++) {{
    gx = group % GX; gy = group / GX % GY; gz = group / ((unsigned long)GX * GY);
    for (unsigned l = 0; l < L; l++) {{
      uint64_t* sp = (uint64_t*)(stacks + (size_t)(l + 1) * STACK);  // 16-byte aligned top
      *--sp = 0;  // where the entry's return address would be: it never returns
      *--sp = (uint64_t)(void*)&rg_lane_entry;  // rg_swap's ret lands here
      for (int r = 0; r < 6; r++) *--sp = 0;  // rbp rbx r12-r15
      counts[l] = 0u;
      lanes[l] = metal::rg_fiber_lane{{exchange.data(), l, S, &counts[l], sp, false}};
    }}
    for (unsigned live = L; live;) {{
      live = 0;
      for (unsigned l = 0; l < L; l++) {{
        if (lanes[l].finished) continue;
        metal::rg_cur = &lanes[l];
        rg_swap(&metal::rg_sched_sp, lanes[l].sp);  // to its next barrier or shuffle half, or its end
        live += !lanes[l].finished;
      }}
    }}
    for (unsigned l = 1; l < L; l++)
      if (counts[l] != counts[0]) {{ bad = (long)group * L + l + 1; break; }}
  }}
  std::free(stacks);
  return bad;
"""
    prelude = "#define RG_HOST_FIBERS 1\n#include <cstdlib>\n#include <vector>\n"
    return (scope, body), prelude, ["-std=c++20"]


class MSLHostError(RuntimeError):
    """A kernel could not be built for the host, or its run broke a rule (a barrier mismatch)."""


def _include_dir(root: Path) -> Path:
    inc = root / "inc"
    inc.mkdir(exist_ok=True)
    (inc / "metal_stdlib").write_text(f'#include "{SHIM}"\n')
    return inc


def _compiler() -> str:
    if CXX is None:
        raise MSLHostError("the Metal mock needs a C++ compiler (g++ or clang++) on PATH to build MSL "
                           "through its shim; none was found")
    return CXX


def type_check(sources: dict[str, str]) -> None:
    """Compile every kernel (name -> MSL) as C++ through the shim; raise naming the first that fails."""
    cxx = _compiler()
    with tempfile.TemporaryDirectory(prefix="rawgrad-msl-check-") as d:
        root = Path(d)
        inc = _include_dir(root)
        parts = [_INCLUDE]
        for k, src in enumerate(sources.values()):  # one namespace per kernel: their helpers repeat
            if not src.startswith(_INCLUDE):
                raise MSLHostError(f"MSL source does not start with {_INCLUDE!r}")
            parts.append(f"namespace k{k} {{\n{src[len(_INCLUDE):]}\n}}")
        unit = root / "all.metal"
        unit.write_text("\n".join(parts))
        check = [cxx, *CXX_FLAGS, CHECK_STD, "-fsyntax-only", f"-I{inc}"]
        res = subprocess.run([*check, str(unit)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if res.returncode == 0:
            return
        for name, src in sources.items():  # find the culprit
            one = root / "one.metal"
            one.write_text(src)
            r = subprocess.run([*check, str(one)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            if r.returncode:
                raise MSLHostError(f"kernel {name} does not compile as MSL-through-the-shim:\n{r.stderr}")
        raise MSLHostError(f"the kernels compile one by one but not together:\n{res.stderr}")


def type_check_one(source: str) -> str | None:
    """None when `source` compiles through the shim, else the compiler's message (the fake Metal compiler)."""
    try:
        type_check({"kernel": source})
    except MSLHostError as e:
        return str(e)
    return None


def _body(source: str) -> str:
    return source.split("kernel void", 1)[1]


class _Built:
    """One kernel built for the host: its library, entry point and the parameters it binds."""

    def __init__(self, lib: Any, ffi: cffi.FFI, buffers: list[int], vars_index: int | None,
                 lanes: bool) -> None:
        self.lib, self.ffi, self.buffers, self.vars_index, self.lanes = lib, ffi, buffers, vars_index, lanes


class HostKernels:
    """Builds kernels for the host once per source (cached by hash in a private directory) and runs
    dispatches; `close()` unloads them and removes the directory."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._built: dict[tuple[str, str], _Built] = {}
        self._lock = threading.Lock()
        self.builds = 0  # host compiler runs (a cache hit runs none)

    def _root(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="rawgrad-msl-"))  # 0700, a name no one else holds
            (self._dir / "inc").mkdir()
            (self._dir / "inc" / "metal_stdlib").write_text(f'#include "{SHIM}"\n')
        return self._dir

    def close(self) -> None:
        with self._lock:
            for b in self._built.values():
                b.ffi.dlclose(b.lib)
            self._built.clear()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None

    def build(self, source: str, name: str) -> _Built:
        key = (hashlib.sha256(source.encode()).hexdigest(), name)
        with self._lock:
            hit = self._built.get(key)
            if hit is None:
                hit = self._built[key] = self._build(source, name, key[0])
            return hit

    def _build(self, source: str, name: str, digest: str) -> _Built:
        cxx = _compiler()
        sig = next((m for m in _SIG.finditer(source) if m.group(1) == name), None)
        if sig is None:
            raise MSLHostError(f"the MSL source has no kernel named {name!r}")
        params = [p.strip() for p in sig.group(2).split(",")]
        call: list[str] = []
        buffers: list[int] = []
        vars_index: int | None = None
        for p in params:
            if (m := _BUFFER.fullmatch(p)) is not None:
                buffers.append(int(m.group(3)))
                call.append(f"({m.group(1)}*)slots[{m.group(3)}]")
            elif (m := _VARS.fullmatch(p)) is not None:
                vars_index = int(m.group(2))
                call.append(f"(const long*)slots[{m.group(2)}]")
            elif (m := _BUILTIN.fullmatch(p)) is not None:
                expr = _ATTRIBUTES.get(m.group(3), {}).get(m.group(1))
                if expr is None:
                    raise MSLHostError(f"{name}: the host harness has no value for parameter {p!r}")
                call.append(expr)
            else:
                raise MSLHostError(f"{name}: the host harness cannot bind parameter {p!r}")
        launch = f"{name}({', '.join(call)});"
        lanes = "threadgroup_barrier(" in _body(source) or "rg_shfl(" in _body(source)
        scope = ""  # file-scope code the harness needs before its entry point
        grid = ("  for (unsigned gz = 0; gz < GZ; gz++) for (unsigned gy = 0; gy < GY; gy++)\n"
                "  for (unsigned gx = 0; gx < GX; gx++) {\n")
        if lanes:
            # One thread per lane for the whole dispatch (not per threadgroup: making threads dominated the
            # run time); each threadgroup gets fresh barriers, made by lane 0 between two waits of `step`
            # (a lane that returns early drops out of its group's barriers, never out of `step`).
            body = f"""  const unsigned L = LX * LY * LZ, S = L < {SIMD_WIDTH}u ? L : {SIMD_WIDTH}u;
  const unsigned long G = (unsigned long)GX * GY * GZ;
  struct Group {{
    std::barrier<> block;
    std::vector<std::unique_ptr<std::barrier<>>> simds;
    Group(unsigned L, unsigned S) : block(L) {{
      for (unsigned s = 0; s < L; s += S) simds.emplace_back(new std::barrier<>(L - s < S ? L - s : S));
    }}
  }};
  std::unique_ptr<Group> cur;
  std::barrier<> step(L);
  std::vector<uint64_t> exchange(L);
  std::vector<unsigned> counts(L, 0u);
  long bad = 0;
  std::vector<std::thread> threads;
  for (unsigned lin = 0; lin < L; lin++) threads.emplace_back([&, lin] {{
    const unsigned lx = lin % LX, ly = lin / LX % LY, lz = lin / (LX * LY);
    for (unsigned long group = 0; group < G; group++) {{
      if (lin == 0) {{
        cur.reset(new Group(L, S));
        for (auto& c : counts) c = 0u;
      }}
      step.arrive_and_wait();  // the group's barriers exist
      const unsigned gx = group % GX, gy = group / GX % GY, gz = group / ((unsigned long)GX * GY);
      (void)gx; (void)gy; (void)gz;
      metal::rg_ctx = metal::rg_lane{{&cur->block, cur->simds[lin / S].get(), exchange.data(), lin, S,
                                     &counts[lin]}};
      {launch}
      cur->block.arrive_and_drop();  // a lane that has returned no longer holds the others at a barrier
      cur->simds[lin / S]->arrive_and_drop();
      step.arrive_and_wait();  // every lane is done with this group
      if (lin == 0)
        for (unsigned l = 1; l < L; l++)
          if (counts[l] != counts[0]) {{ bad = (long)group * L + l + 1; break; }}
      step.arrive_and_wait();  // `bad` is seen by every lane
      if (bad) break;
    }}
  }});
  for (auto& t : threads) t.join();
  return bad;
"""
            prelude = "#define RG_HOST_LANES 1\n#include <memory>\n#include <thread>\n#include <vector>\n"
            std = ["-std=c++20", "-pthread"]
            if FIBERS:
                (scope, body), prelude, std = _fiber_harness(launch)
        else:
            body = (f"{grid}    for (unsigned lz = 0; lz < LZ; lz++) for (unsigned ly = 0; ly < LY; ly++)\n"
                    f"    for (unsigned lx = 0; lx < LX; lx++) {{\n"
                    f"      const unsigned lin = lx + LX * (ly + LY * lz); (void)lin;\n"
                    f"      {launch}\n    }}\n"
                    f"  }}\n  return 0;\n")
            prelude, std = "", [CHECK_STD]
        entry = ('extern "C" long rg_run(void** slots, unsigned GX, unsigned GY, unsigned GZ, unsigned LX, '
                 'unsigned LY, unsigned LZ)')
        if lanes and FIBERS:
            entry = ('extern "C" long rg_run(void** slots_, unsigned GX_, unsigned GY_, unsigned GZ_, '
                     'unsigned LX_, unsigned LY_, unsigned LZ_)')
        harness = f"{prelude}{source}\n{scope}{entry} {{\n{body}}}\n"
        root = self._root()
        stem = f"{digest[:32]}_{name}"
        src_path, lib_path = root / f"{stem}.metal", root / f"{stem}.so"
        src_path.write_text(harness)
        res = subprocess.run([cxx, *CXX_FLAGS, *std, "-O1", "-shared", "-fPIC", f"-I{root / 'inc'}",
                              str(src_path), "-o", str(lib_path)], capture_output=True, text=True,
                             timeout=BUILD_TIMEOUT_S)
        self.builds += 1
        if res.returncode:
            raise MSLHostError(f"{name}: host build of the MSL failed:\n{res.stderr}")
        ffi = cffi.FFI()
        ffi.cdef("long rg_run(void **slots, unsigned GX, unsigned GY, unsigned GZ, unsigned LX, unsigned LY, "
                 "unsigned LZ);")
        return _Built(ffi.dlopen(str(lib_path)), ffi, buffers, vars_index, lanes)

    def run(self, source: str, name: str, slots: dict[int, int], groups: tuple[int, int, int],
            local: tuple[int, int, int]) -> None:
        """Run kernel `name` over `groups` threadgroups of `local` threads, with argument-table slot k at host
        address `slots[k]` (buffers and the scalar words alike). A missing slot is an error naming it."""
        b = self.build(source, name)
        need = b.buffers + ([b.vars_index] if b.vars_index is not None else [])
        missing = [k for k in need if k not in slots]
        if missing:
            raise MSLHostError(f"{name}: argument table slots {missing} are not bound (the kernel reads "
                               f"{sorted(need)})")
        top = max(need, default=0) + 1
        table = b.ffi.new("void *[]", [b.ffi.cast("void *", slots.get(k, 0)) for k in range(top)])
        bad = b.lib.rg_run(table, *groups, *local)
        if bad:
            per = local[0] * local[1] * local[2]
            g, lane = divmod(bad - 1, per)
            raise MSLHostError(f"{name}: barrier mismatch in threadgroup {g}: lane {lane} made a different "
                               f"number of threadgroup_barrier calls than lane 0")


_shared: HostKernels | None = None
_shared_lock = threading.Lock()


def host_kernels() -> HostKernels:
    """The process's kernel cache (one set of builds for every mock device; removed at exit)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = HostKernels()
            atexit.register(_shared.close)
        return _shared


def run_source(source: str, name: str, pointers: list[int], vars_ptr: int | None, groups: int | tuple,
               local: int | tuple, kernels: HostKernels | None = None) -> None:
    """Run kernel `name` with buffer k at `pointers[k]` and the scalar words at `vars_ptr` (slot after the
    buffers), over `groups` threadgroups of `local` lanes (ints: 1-D)."""
    g = (groups, 1, 1) if isinstance(groups, int) else tuple(groups)
    lo = (local, 1, 1) if isinstance(local, int) else tuple(local)
    slots = dict(enumerate(pointers))
    if vars_ptr is not None:
        slots[len(pointers)] = vars_ptr
    (kernels or host_kernels()).run(source, name, slots, g, lo)  # type: ignore[arg-type]


def run_on_host(prog: LinearProgram, source: str, buffers: list[np.ndarray], scalars: list[int]) -> None:
    """Run a kernel over its whole 1-D launch; writes land in `buffers` (numpy arrays, in place)."""
    local = prog.launch.local_size[0]
    groups = max(1, math.ceil(prog.launch.global_for_scalars(scalars)[0] / local))
    words = np.array(scalars or [0], dtype=np.int64)
    run_source(source, prog.name, [b.ctypes.data for b in buffers], words.ctypes.data if scalars else None,
               groups, local)
