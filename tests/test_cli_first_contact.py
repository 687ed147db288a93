"""First contact on the command line: errors are one line that names the fix (and `python -m rawgrad
doctor`) with a non-zero exit code, slow steps show progress, compile counts tell new from cached, and
tools/nv_hw_session.sh fails when a stage fails."""
from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rawgrad import progress

ROOT = Path(__file__).resolve().parents[1]
HAS_NVIDIA_DRIVER = os.path.exists("/dev/nvidiactl")
no_gpu = pytest.mark.skipif(HAS_NVIDIA_DRIVER, reason="an NVIDIA driver is present: NV opens here")
DOCTOR = "python -m rawgrad doctor"
TIMEOUT_S = 120


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DEV", "NV_MOCK", "DEBUG", progress.ENV)}
    env.update(extra)
    return env


def _rawgrad(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rawgrad", *args], capture_output=True, text=True,
                          env=_env(**env), cwd=ROOT, timeout=TIMEOUT_S)


def _one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    """The process failed with exactly one line on stderr, no traceback, pointing at the doctor."""
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr and lines[0].startswith("rawgrad: error: ")
    assert DOCTOR in lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------------------ errors
@no_gpu
def test_dev_nv_without_a_gpu_is_one_line() -> None:
    line = _one_error_line(_rawgrad("infer", "gpt2", "--size", "tiny", "--tokens", "2", DEV="NV"))
    assert "cannot open device NV" in line and "/dev/nvidiactl is missing" in line
    assert "DEV=CPU" in line and "NV_MOCK=1" in line


@no_gpu
def test_infer_minilm_with_dev_nv_without_a_gpu_is_one_line() -> None:
    line = _one_error_line(_rawgrad("infer", "minilm", DEV="NV"))
    # the device, or (without the MiniLM packages) what to install: either way one line with the fix
    assert "/dev/nvidiactl is missing" in line or "pip install" in line


@no_gpu
def test_library_device_nv_raises_a_clear_exception() -> None:
    code = textwrap.dedent("""
        from rawgrad import Tensor
        from rawgrad.hcq.device import DeviceUnavailable
        try:
            Tensor([1.0, 2.0], device="NV").numpy()
        except DeviceUnavailable as e:
            assert isinstance(e, OSError)
            print(e)
        """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=ROOT,
                       timeout=TIMEOUT_S)
    assert p.returncode == 0, p.stderr
    assert "cannot open device NV: /dev/nvidiactl is missing" in p.stdout and DOCTOR in p.stdout


def test_bad_weights_path_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-checkpoint"
    line = _one_error_line(_rawgrad("infer", "gpt2", "--weights", str(missing), "--tokens", "2"))
    assert str(missing) in line and "no such checkpoint" in line and ".safetensors" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    line = _one_error_line(_rawgrad("infer", "gpt2", "--weights", str(empty), "--tokens", "2"))
    assert "no .safetensors file" in line


@no_gpu
def test_bench_gpu_without_a_gpu_is_one_line() -> None:
    line = _one_error_line(_rawgrad("bench", "gpu", "--quick"))
    assert "bench gpu needs an NVIDIA GPU" in line and "/dev/nvidiactl" in line


@no_gpu
def test_debug_shows_the_traceback() -> None:
    p = _rawgrad("bench", "gpu", "--quick", DEBUG="1")
    assert p.returncode != 0 and "Traceback" in p.stderr and "DeviceUnavailable" in p.stderr


# ------------------------------------------------------------------------------------------------ progress
def _phase_output(mode: str, work: float = 0.0, **kw: object) -> str:
    os.environ[progress.ENV] = mode
    try:
        out = io.StringIO()
        with progress.Phase("step", stream=out, **kw) as ph:  # type: ignore[arg-type]
            time.sleep(work)
            ph.update(3)
        return out.getvalue()
    finally:
        del os.environ[progress.ENV]


def test_progress_is_one_line_per_phase_when_not_a_terminal() -> None:
    text = _phase_output("", total=3, unit="tokens")  # a StringIO is not a terminal
    assert text.splitlines() == [text.strip()] and text.startswith("step [" + "#" * progress.WIDTH + "]")
    assert "3/3 tokens in" in text
    assert _phase_output("off") == ""


def test_progress_lines_mode_speaks_every_few_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.2)
    monkeypatch.setattr(progress, "TICK_S", 0.05)
    text = _phase_output("lines", work=0.7, describe=lambda: "busy")
    lines = text.splitlines()
    assert lines[0] == "step ..." and lines[-1].startswith("step: 3 done") and "(busy)" in lines[-1]
    assert sum("running" in line for line in lines) >= 2  # while the work ran, not only around it


def test_progress_falls_back_to_lines_without_tqdm() -> None:
    code = ("import sys; sys.modules['tqdm'] = None\n"
            "from rawgrad import progress; print(progress.mode())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=_env(**{progress.ENV: "bar"}), timeout=TIMEOUT_S)
    assert p.stdout.strip() == "lines", p.stderr


def test_progress_bar_mode_draws_with_tqdm() -> None:
    pytest.importorskip("tqdm")
    text = _phase_output("bar", total=3, unit="tokens")
    assert "step" in text and "3/3 tokens" in text


def test_failed_phase_leaves_the_error_alone() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError), progress.Phase("step", stream=out):
        raise RuntimeError("boom")
    assert out.getvalue() == ""


def test_weight_callback_closes_itself() -> None:
    out = io.StringIO()
    bar = progress.Phase("weights", unit="B", stream=out)
    for done in range(0, 4 * 2**20 + 1, 2**20):
        bar(done, 4 * 2**20)
    assert bar.closed and "4.0/4.0 MiB" in out.getvalue()


def test_infer_gpt2_reports_each_slow_phase_and_compile_sources(tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    runs = [_rawgrad("infer", "gpt2", "--size", "tiny", "--tokens", "3", RAWGRAD_CACHE_DIR=cache)
            for _ in range(2)]
    for p in runs:
        assert p.returncode == 0, p.stderr
        assert "building GPT-2 tiny (random weights): done" in p.stderr
        assert "generating 3 tokens [" in p.stderr
    first = [w for w in runs[0].stdout.split() if w.startswith(("compiled=", "cached="))]
    second = [w for w in runs[1].stdout.split() if w.startswith(("compiled=", "cached="))]
    assert first[0] != "compiled=0" and first[1] == "cached=0"
    assert second[0] == "compiled=0" and second[1] != "cached=0"  # a warm disk cache compiles nothing


# ------------------------------------------------------------------------------------------------ mock waits
def test_mock_signals_scale_only_the_default_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from rawgrad.drivers.nv import hcq
    from rawgrad.hcq.errors import DeviceTimeout

    sig = hcq._ScaledDefaultSignal(0, scale=4.0)
    with pytest.raises(DeviceTimeout) as explicit:
        sig.wait(1, 0.02)
    assert explicit.value.timeout_s == 0.02  # an explicit timeout is kept
    monkeypatch.setattr(hcq, "DEFAULT_TIMEOUT_S", 0.01)
    with pytest.raises(DeviceTimeout) as default:
        sig.wait(1, 0.01)
    assert default.value.timeout_s == pytest.approx(0.04)


# ------------------------------------------------------------------------------------------------ the session
def _fake_python(tmp_path: Path, fail_on: str) -> Path:
    """A python3 stand-in: fails when its arguments contain `fail_on`, else succeeds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\necho "fake python3 $*"\ncase "$*" in *{fail_on}*) exit 3;; esac\nexit 0\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _session(tmp_path: Path, *stages: str, fail_on: str) -> subprocess.CompletedProcess[str]:
    bin_dir = _fake_python(tmp_path, fail_on)
    env = _env(OUT=str(tmp_path / "out"), PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(["bash", str(ROOT / "tools" / "nv_hw_session.sh"), *stages], capture_output=True,
                          text=True, env=env, timeout=TIMEOUT_S)


def test_nv_hw_session_parses() -> None:
    subprocess.run(["bash", "-n", str(ROOT / "tools" / "nv_hw_session.sh")], check=True, timeout=TIMEOUT_S)


def test_nv_hw_session_fails_when_a_stage_fails(tmp_path: Path) -> None:
    p = _session(tmp_path, "smoke", "hw", "decode", fail_on="tests/nv")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "hw: rc=3" in p.stdout and "FAILED" in p.stdout
    assert "failed stages: hw " in p.stdout and "decode: rc=0" in p.stdout  # later stages still ran


def test_nv_hw_session_passes_when_every_stage_passes(tmp_path: Path) -> None:
    p = _session(tmp_path, "smoke", "hw", fail_on="no-such-argument")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all stages passed" in p.stdout and "failed stages" not in p.stdout


def test_nv_hw_session_env_stage_fails_on_its_checks_only(tmp_path: Path) -> None:
    p = _session(tmp_path, "env", fail_on="doctor")  # nvidia-smi and ptxas are missing here: informational
    assert p.returncode == 1 and "failed stages: env" in p.stdout, p.stdout


def test_unknown_device_and_too_many_tokens_are_one_line() -> None:
    import os
    import subprocess
    import sys
    env = {**os.environ, "DEV": "FOO"}
    proc = subprocess.run([sys.executable, "-m", "rawgrad", "demo"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "rawgrad: error: unknown device 'FOO'" in proc.stderr
    cmd = [sys.executable, "-m", "rawgrad", "infer", "gpt2", "--size", "tiny", "--tokens", "40"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "ask for at most" in proc.stderr
