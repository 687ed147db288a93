"""The CI policy on the AMD mock (tests/ci_policy.py): under DEV=AMD AMD_MOCK=1 it counts the kernels the
mock command processor executes per test, fails a test that launched none when RAWGRAD_REQUIRE_DEVICE_KERNELS
is set (what keeps .ci/amd-slice honest), writes the slice without tests over RAWGRAD_SLICE_MAX_SECONDS unless
they are marked device_slice_keep, and gives the next test a fresh device after one left the mock faulted."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent

# the repository's own pytest_configure (tests/conftest.py), loaded under another name so that the
# temporary directory's conftest can use it
CONFTEST = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("rawgrad_tests_conftest", {str(TESTS / "conftest.py")!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
pytest_configure = module.pytest_configure
"""

TESTS_SOURCE = """
import time
import numpy as np
import pytest
from rawgrad import Tensor


def test_launches_a_kernel():
    assert (Tensor(np.arange(8, dtype=np.float32), device="AMD") * 2).numpy().tolist()[3] == 6.0


def test_launches_nothing():
    assert 1 + 1 == 2


def test_slow_but_launches():
    (Tensor(np.ones(4, np.float32), device="AMD") + 1).numpy()
    time.sleep(1.2)


@pytest.mark.device_slice_keep
def test_slow_and_kept():
    (Tensor(np.ones(4, np.float32), device="AMD") + 2).numpy()
    time.sleep(1.2)


def test_leaves_the_gpu_faulted():
    from rawgrad import Device
    (Tensor(np.ones(4, np.float32), device="AMD") + 3).numpy()
    dev = Device["AMD"]
    dev.mock.fault = RuntimeError("injected fault")  # as if the command processor had halted
    with pytest.raises(Exception, match="injected fault"):
        (Tensor(np.ones(4, np.float32), device="AMD") + 3).numpy()


def test_runs_on_a_fresh_device_after_the_fault():
    assert (Tensor(np.ones(4, np.float32), device="AMD") + 4).numpy().tolist() == [5.0] * 4
"""


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_policy_cases.py").write_text(TESTS_SOURCE)
    # the parent's own CI settings (RAWGRAD_ALLOWED_SKIPS=.ci/allowed-skips is relative to the repository)
    # and mock choice do not apply to the child
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RAWGRAD_") and k != "NV_MOCK"}
    full = {**inherited, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "DEV": "AMD",
            "AMD_MOCK": "1", **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), str(tmp_path / "test_policy_cases.py")], capture_output=True,
                          text=True, env=full, cwd=tmp_path, timeout=300)


def test_kernel_counts_required_kernels_and_the_written_slice(tmp_path: Path) -> None:
    slice_file = tmp_path / "slice"
    res = _pytest(tmp_path, RAWGRAD_REQUIRE_DEVICE_KERNELS="1", RAWGRAD_WRITE_DEVICE_SLICE=str(slice_file),
                  RAWGRAD_SLICE_MAX_SECONDS="1.0")
    out = res.stdout
    assert res.returncode != 0, out  # a passing test launched no kernel: the run fails
    assert "launched no kernel on the device: test_policy_cases.py::test_launches_nothing" in out, out
    assert "5 of 6 passed tests launched at least one kernel on the mock AMD GPU" in out, out
    assert "left out of the slice" in out and "test_slow_but_launches" in out, out
    written = slice_file.read_text().split()
    assert "problem(s); the run fails" in out and out.count("launched no kernel on the device") == 1, out
    # in run order; the 1.2-s test is over the limit, the one marked device_slice_keep stays (the first test
    # brings the device up and compiles: on a loaded machine it may take over 1 s too, so it is not checked)
    names = [w.partition("::")[2] for w in written]
    assert names[-3:] == ["test_slow_and_kept", "test_leaves_the_gpu_faulted",
                          "test_runs_on_a_fresh_device_after_the_fault"], written
    assert "test_slow_but_launches" not in names and "test_launches_nothing" not in names, written
