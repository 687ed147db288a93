"""Compile every kernel the op tests produce for gfx1100 and gfx942, and load each code object.

    python3 tests/amd/amd_op_kernels.py [pytest args...]      (about 2 minutes on 2 cores)

Runs the op test files under pytest with this file as a plugin: every kernel AST the CPU renderer is asked
to lower is also lowered for each AMD target, rendered, compiled and loaded, and the descriptor is checked
against the renderer's launch contract (LDS bytes, kernarg size, max flat workgroup size). Scratch use is
counted, not failed: it is legal code the RDNA3 mock cannot run. The default test suite runs the quicker
representative corpus (test_amd_corpus.py); this is the exhaustive check.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

OP_TESTS = ["tests/test_ops_elementwise.py", "tests/test_ops_reduce.py", "tests/test_ops_nn.py",
            "tests/test_ops_movement.py", "tests/test_gather.py", "tests/test_tensor_random.py",
            "tests/test_nn.py", "tests/test_ops_math_parity.py"]
ARCHS = ("gfx1100", "gfx942")
REPORT_ENV = "AMD_OP_KERNELS_REPORT"

_seen: set[Any] = set()
_stats: dict[str, Any] = {"kernels": 0, "compiled": 0, "scratch": [], "failures": []}


def _check(ast: Any, name: str) -> None:
    from rawgrad.compiler.amdgpu_code import load_code_object
    from rawgrad.compiler.renderer.amdgpu import AMDGPURenderer, kernarg_bytes
    from rawgrad.compiler.toolchain import amdgpu_compiler
    _stats["kernels"] += 1
    for arch in ARCHS:
        try:
            r = AMDGPURenderer(arch)
            prog = r.lower(ast, name)
            co = load_code_object(amdgpu_compiler(arch).compile(r.render(prog)), arch)
            kd = co.descriptor
            if (kd.group_segment_fixed_size, kd.kernarg_size, co.metadata.max_flat_workgroup_size) != \
                    (prog.launch.shared_bytes, kernarg_bytes(prog), prog.launch.local_size[0]):
                raise AssertionError(f"descriptor {kd} does not match the launch {prog.launch}")
            if kd.private_segment_fixed_size:
                _stats["scratch"].append(f"{arch} {name}: {kd.private_segment_fixed_size} bytes per lane")
            _stats["compiled"] += 1
        except Exception as e:  # recorded and reported; an LLVM abort would end the run (exit status)
            _stats["failures"].append(f"{arch} {name}: {type(e).__name__}: {str(e)[:300]}")


def pytest_configure(config: Any) -> None:
    from rawgrad.compiler.renderer.llvm import LLVMRenderer
    original = LLVMRenderer.lower

    def spy(self: Any, ast: Any, name: str) -> Any:
        if ast not in _seen:
            _seen.add(ast)
            _check(ast, name)
        return original(self, ast, name)

    LLVMRenderer.lower = spy  # type: ignore[method-assign]


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    Path(os.environ[REPORT_ENV]).write_text(json.dumps(_stats))


def main() -> int:
    import tempfile
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        path = [str(Path(__file__).parent), str(root), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, REPORT_ENV: str(report), "RAWGRAD_CACHE_DIR": "",
               "PYTHONPATH": os.pathsep.join(path)}
        args = sys.argv[1:] or OP_TESTS
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "amd_op_kernels", *args]
        proc = subprocess.run(cmd, cwd=root, env=env)
        if not report.exists():
            print(f"pytest ended (status {proc.returncode}) without a report: an LLVM abort?",
                  file=sys.stderr)
            return 1
        stats = json.loads(report.read_text())
    print(f"{stats['kernels']} distinct kernels, {stats['compiled']} of {stats['kernels'] * len(ARCHS)} "
          f"compiled and loaded for {', '.join(ARCHS)}; {len(stats['scratch'])} use scratch")
    for line in stats["scratch"] + stats["failures"]:
        print("  " + line)
    return 1 if stats["failures"] or proc.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
