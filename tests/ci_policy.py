"""What a test run must prove, beyond "nothing failed" (loaded by tests/conftest.py).

Two checks a plain pytest run cannot make:

- **Skips that must not happen here.** With ``RAWGRAD_ALLOWED_SKIPS=<file>`` (CI sets it to
  ``.ci/allowed-skips``), every skipped test's reason must match one of the file's regular expressions
  (one per line, ``#`` comments). Anything else skipped fails the session: a missing ptxas, tokenizer or
  weights package would otherwise turn whole groups of tests into silent skips that still end green.
- **Kernels that were never assembled.** ``RAWGRAD_REQUIRE_SASS=1`` fails the session when NV kernel images
  fell back to PTX only (no ptxas found) although the run compiled NV kernels.
- **Tests that claim a device but never used it.** Under ``DEV=NV NV_MOCK=1`` (or ``DEV=AMD AMD_MOCK=1``,
  ``DEV=METAL METAL_MOCK=1``) every kernel the mock GPU executes is counted per test. The summary says how
  many tests launched at least one kernel.
  ``RAWGRAD_WRITE_DEVICE_SLICE=<file>`` writes the node ids of the tests that did (``.ci/nv-slice`` is made
  this way); ``RAWGRAD_REQUIRE_DEVICE_KERNELS=1`` fails the session when a test that passed launched none,
  so the NV, AMD and Metal slices can never again count tests that ran nothing on the device.
  ``RAWGRAD_SLICE_MAX_SECONDS=<s>`` leaves tests that took longer than that (setup + call + teardown) out of
  the written slice and lists them: the AMD slice must fit its CI stage's time budget. A test marked
  ``device_slice_keep`` (an acceptance test the slice exists for) stays whatever it costs.
  On the AMD mock a command-processor fault halts the GPU for good (as a real GPU fault kills the queue):
  after a test that left the mock faulted, the device is closed so the next test opens a fresh one instead
  of failing on the previous test's fault.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_kernels = {"current": 0}
_per_test: dict[str, int] = {}
_passed: dict[str, None] = {}  # in the order the tests ran (a dict keeps insertion order)
_seconds: dict[str, float] = {}  # setup + call + teardown time per test
_keep: set[str] = set()  # tests marked device_slice_keep
DRAIN_TIMEOUT_S = 10.0  # how long a test's queued AMD-mock work may take to finish after the test
_skips: list[tuple[str, str]] = []


def mock_kind() -> str | None:
    """"NV", "AMD" or "METAL" when DEV names that kind and its mock (NV_MOCK=1 / AMD_MOCK=1 / METAL_MOCK=1)
    is asked for; else None."""
    dev = os.environ.get("DEV", "").upper()
    for kind in ("NV", "AMD", "METAL"):
        if dev.startswith(kind) and os.environ.get(f"{kind}_MOCK", "0") not in ("", "0"):
            return kind
    return None


def counting_mock_kernels() -> bool:
    return mock_kind() is not None


def _count_calls(owner: Any, method: str) -> None:
    original: Callable[..., Any] = getattr(owner, method)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        _kernels["current"] += 1
        return original(self, *args, **kwargs)

    setattr(owner, method, counted)


def install_kernel_counter() -> None:
    """Count every kernel the mock GPU executes (the GPU's side: a kernel queued but never run is not
    counted)."""
    if mock_kind() == "AMD":
        # the AMD mock's command processor runs a validated DISPATCH_DIRECT on the RDNA3 interpreter through
        # CommandProcessor._execute (a dispatch recorded but not executed is not counted)
        from rawgrad.drivers.amd.mock import cp
        _count_calls(cp.CommandProcessor, "_execute")
        return
    if mock_kind() == "METAL":
        # the fake Metal runtime's GPU runs each dispatch's MSL on the host through gpu.run_dispatch, which a
        # MockMetalGPU takes as its kernel runner when it is made (after this runs: devices open lazily)
        from rawgrad.drivers.metal.mock import gpu

        original = gpu.run_dispatch

        def counted_dispatch(d: Any) -> None:
            _kernels["current"] += 1
            original(d)

        gpu.run_dispatch = counted_dispatch  # type: ignore[assignment]
        return
    # the mock NV GPU runs every kernel through PTXModule.launch (its PTX interpreter): count there
    from rawgrad.drivers.nv.mock import ptx_interp
    _count_calls(ptx_interp.PTXModule, "launch")


def _amd_devices() -> list[Any]:
    import sys
    if "rawgrad.drivers.amd.device" not in sys.modules:
        return []
    from rawgrad.hcq.device import Device
    return [Device[n] for n in Device.opened() if n.partition(":")[0] == "AMD"]


def _drain_amd_mock() -> None:
    """Let the mock AMD GPU finish what the test queued: its command processor runs on its own thread, so a
    test that realizes without reading back may end before its kernels ran, and they would count for the
    next test. A device that cannot finish (faulted, hung) is left to `_reopen_faulted_amd_mock`."""
    for dev in _amd_devices():
        if getattr(dev, "closed", False) or getattr(getattr(dev, "mock", None), "fault", None) is not None:
            continue
        try:
            dev.synchronize(DRAIN_TIMEOUT_S)
        except Exception:  # noqa: S110 - the test's own outcome already says what went wrong
            pass


def _reopen_faulted_amd_mock() -> None:
    """Close the AMD mock device if a test left its command processor halted on a fault (see the module
    docstring); the registry opens a fresh one on the next use."""
    from rawgrad.hcq.device import Device
    for dev in _amd_devices():
        mock = getattr(dev, "mock", None)
        if getattr(dev, "closed", False) or (mock is not None and mock.fault is not None):
            Device.close(dev.name)


def allowed_skip_patterns() -> list[re.Pattern[str]] | None:
    path = os.environ.get("RAWGRAD_ALLOWED_SKIPS")
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f]
    return [re.compile(ln) for ln in lines if ln and not ln.startswith("#")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    before = _kernels["current"]
    if item.get_closest_marker("device_slice_keep") is not None:
        _keep.add(item.nodeid)
    yield
    if mock_kind() == "AMD":
        _drain_amd_mock()
    _per_test[item.nodeid] = _kernels["current"] - before
    if mock_kind() == "AMD":
        _reopen_faulted_amd_mock()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skips.append((report.nodeid, reason))
    if report.when == "call" and report.passed:
        _passed[report.nodeid] = None
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration


def _too_slow() -> dict[str, float]:
    """Tests over RAWGRAD_SLICE_MAX_SECONDS (none when it is unset), with their seconds."""
    limit = os.environ.get("RAWGRAD_SLICE_MAX_SECONDS")
    if not limit:
        return {}
    return {n: t for n, t in _seconds.items() if t > float(limit) and n not in _keep}


def _problems() -> list[str]:
    problems: list[str] = []
    patterns = allowed_skip_patterns()
    if patterns is not None:
        for nodeid, reason in _skips:
            if not any(p.search(reason) for p in patterns):
                problems.append(f"skipped but required here: {nodeid}: {reason}")
    if os.environ.get("RAWGRAD_REQUIRE_SASS", "0") not in ("", "0"):
        problems.extend(_sass_problems())
    if counting_mock_kernels() and os.environ.get("RAWGRAD_REQUIRE_DEVICE_KERNELS", "0") not in ("", "0"):
        for nodeid in _passed:
            if _per_test.get(nodeid, 0) == 0:
                problems.append(f"launched no kernel on the device: {nodeid}")
    return problems


def _sass_problems() -> list[str]:
    """With the nv extra installed, every kernel image must carry real SASS: a PTX-only fallback means the
    mock interpreted code ptxas never saw, and the SASS-to-PTX checks were skipped."""
    import sys
    cubin = sys.modules.get("rawgrad.drivers.nv.cubin")
    if cubin is None:
        return []  # no NV kernel was compiled in this run
    out = []
    if cubin.find_ptxas() is None:
        out.append("ptxas is not installed (pip install -e '.[nv]'), so NV kernels were never assembled")
    if cubin.ptx_only_fallbacks():
        out.append(f"{cubin.ptx_only_fallbacks()} NV kernel image(s) fell back to PTX only (no assembler)")
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if counting_mock_kernels():
        out = os.environ.get("RAWGRAD_WRITE_DEVICE_SLICE")
        if out:
            with open(out, "w", encoding="utf-8") as f:
                # in run order, not sorted: a module-scoped fixture's kernels count for the test that set
                # it up, and that test must stay first when the slice runs
                f.writelines(f"{n}\n" for n in _passed if _per_test.get(n, 0) > 0 and n not in _too_slow())
    if _problems() and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if counting_mock_kernels():
        ran = [n for n in _per_test if n in _passed]
        launched = sum(1 for n in ran if _per_test[n] > 0)
        terminalreporter.write_line(f"rawgrad: {launched} of {len(ran)} passed tests launched at least one "
                                    f"kernel on the mock {mock_kind()} GPU ({sum(_per_test.values())} "
                                    f"kernels in all)")
        for n, t in sorted(_too_slow().items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"rawgrad: left out of the slice (took {t:.1f} s > "
                                        f"RAWGRAD_SLICE_MAX_SECONDS): {n}")
    problems = _problems()
    for p in problems:
        terminalreporter.write_line(f"rawgrad CI policy: {p}", red=True)
    if problems:
        terminalreporter.write_line(f"rawgrad CI policy: {len(problems)} problem(s); the run fails", red=True)
