"""Does NVIDIA's ptxas accept the PTX rawgrad emits, and do our register counts match `ptxas -v`?

The figures in docs/benchmarks.md ("NV without a GPU: ptxas and the replay path") come from this script.
No GPU is needed: the PTX comes from tests run on the mock NV device, ptxas is a host program.

  # 1. collect: run tests on the mock GPU and keep every distinct PTX module NVCompiler is asked to compile
  python3 tools/ptxas_acceptance.py collect /tmp/ptx                 # the CI NV slice (.ci/nv-slice, else
                                                                     # the historical NV file list below)
  python3 tools/ptxas_acceptance.py collect /tmp/ptx tests/test_ops_reduce.py   # or any pytest arguments
  # 2. check: assemble each with ptxas (-arch, -v), count acceptances, compare register counts with what
  #    rawgrad.drivers.nv.cubin.program_info reads from the cubin's .nv.info, and time ptxas per kernel
  python3 tools/ptxas_acceptance.py check /tmp/ptx [--ptxas PATH ...] [--arch sm_90] [--limit N]

Collection runs pytest with NV_ASSEMBLER=none (PTX-only images: the collection does not depend on an
assembler) and loads `tools/ptx_dump_plugin.py`, which writes each module to <dir>/<sha256>.ptx.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The DEV=NV NV_MOCK=1 file list .ci/run used on 2026-11-21 (when the 1088 / 1010 counts were taken).
HISTORICAL_NV_FILES = [
    "tests/test_hcq_core.py", "tests/test_jit.py", "tests/test_jit_graph.py", "tests/test_jit_storage.py",
    "tests/test_ops_elementwise.py", "tests/test_ops_movement.py", "tests/test_ops_reduce.py",
    "tests/test_ops_nn.py", "tests/test_nn.py", "tests/test_nn_optim.py", "tests/test_tensor_random.py",
    "tests/test_codegen.py", "tests/test_gather.py", "tests/test_assign_view.py", "tests/test_safetensors.py",
    "tests/test_autograd.py", "tests/test_autograd_api.py", "tests/test_profile.py", "tests/test_schedule.py",
    "tests/test_tensor_basic.py"]
REGISTERS = re.compile(r"Used (\d+) registers")
FUNCTION = re.compile(r"Compiling entry function '([^']+)'")


def collect(out_dir: str, pytest_args: list[str]) -> int:
    os.makedirs(out_dir, exist_ok=True)
    if not pytest_args:
        slice_file = ROOT / ".ci" / "nv-slice"
        pytest_args = [f"@{slice_file}"] if slice_file.exists() else HISTORICAL_NV_FILES
    env = {**os.environ, "DEV": "NV", "NV_MOCK": "1", "NV_ASSEMBLER": "none", "RAWGRAD_PTX_DUMP": out_dir,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAWGRAD_REQUIRE_SASS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "ptx_dump_plugin", *pytest_args]
    print(f"$ DEV=NV NV_MOCK=1 NV_ASSEMBLER=none RAWGRAD_PTX_DUMP={out_dir} {' '.join(cmd[2:])}", flush=True)
    code = subprocess.call(cmd, env=env, cwd=ROOT)
    print(f"{len(list(Path(out_dir).glob('*.ptx')))} distinct PTX modules in {out_dir} (pytest exit {code})")
    return code


def check(ptx_dir: str, assemblers: list[str], arch: str, limit: int | None) -> int:
    from rawgrad.drivers.nv.cubin import PTX_SECTION, append_section, find_ptxas, program_info, ptx_entries

    files = sorted(Path(ptx_dir).glob("*.ptx"))[:limit]
    if not files:
        print(f"no .ptx files in {ptx_dir} (run `collect` first)")
        return 2
    assemblers = assemblers or [p for p in [find_ptxas()] if p]
    if not assemblers:
        print("no ptxas found: pip install -e '.[nv]' or put a CUDA toolkit's ptxas on PATH")
        return 2
    failed_any = False
    for ptxas in assemblers:
        version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip()
        release = re.search(r"release [\d.]+", version)
        accepted, rejected, reg_equal, reg_checked, mismatches = 0, [], 0, 0, []
        t_total = 0.0
        with tempfile.TemporaryDirectory(prefix="rawgrad-ptxas-check-") as tmp:
            cubin_path = os.path.join(tmp, "k.cubin")
            for f in files:
                ptx = f.read_text()
                t0 = time.perf_counter()
                proc = subprocess.run([ptxas, f"-arch={arch}", "-v", "-o", cubin_path, str(f)],
                                      capture_output=True, text=True)
                t_total += time.perf_counter() - t0
                if proc.returncode != 0:
                    rejected.append((f.name, (proc.stderr + proc.stdout).strip().splitlines()[:3]))
                    continue
                accepted += 1
                # ptxas -v: "Compiling entry function 'k'" ... "Used N registers" per entry, in order
                log = proc.stderr + proc.stdout
                regs = (int(r) for r in REGISTERS.findall(log))
                theirs = dict(zip(FUNCTION.findall(log), regs, strict=False))
                image = append_section(Path(cubin_path).read_bytes(), PTX_SECTION, ptx.encode())
                for entry in ptx_entries(ptx):
                    if entry not in theirs:
                        continue
                    reg_checked += 1
                    ours = program_info(image, entry, arch).registers
                    if ours == theirs[entry]:
                        reg_equal += 1
                    else:
                        mismatches.append((f.name, entry, ours, theirs[entry]))
        name = release.group(0) if release else ptxas
        print(f"{ptxas} ({name}), -arch={arch}: {accepted} of {len(files)} accepted; register counts from "
              f".nv.info equal `ptxas -v` for {reg_equal} of {reg_checked} kernels; ptxas wall time "
              f"{t_total:.2f} s for {len(files)} modules ({t_total / len(files) * 1e3:.1f} ms each)")
        for fname, lines in rejected[:10]:
            print(f"  rejected {fname}: {' | '.join(lines)}")
        for fname, entry, ours, theirs_n in mismatches[:10]:
            print(f"  registers differ in {fname} {entry}: .nv.info {ours}, ptxas -v {theirs_n}")
        failed_any |= bool(rejected or mismatches)
    return 1 if failed_any else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="run tests on the mock NV GPU and keep every PTX module")
    c.add_argument("out_dir")
    c.add_argument("pytest_args", nargs=argparse.REMAINDER, help="pytest arguments (default: the NV slice)")
    k = sub.add_parser("check", help="assemble every collected module with ptxas")
    k.add_argument("ptx_dir")
    k.add_argument("--ptxas", action="append", default=[], help="ptxas binary (repeat for several)")
    k.add_argument("--arch", default="sm_90")
    k.add_argument("--limit", type=int, help="only the first N modules (sorted by name)")
    args = parser.parse_args(argv)
    if args.cmd == "collect":
        return collect(args.out_dir, args.pytest_args)
    return check(args.ptx_dir, args.ptxas, args.arch, args.limit)


if __name__ == "__main__":
    sys.exit(main())
