"""The bring-up smoke run on the mock (driver steps in rawgrad/drivers/nv/smoke.py, the Tensor step and the
command in rawgrad/cli/nv_smoke.py): every step passes, a failing step is recorded without stopping
unrelated ones, and the PCAS fallback finds an action the GPU accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rawgrad.cli import nv_smoke
from rawgrad.cli.main import main as cli_main
from rawgrad.drivers.nv import smoke
from rawgrad.drivers.nv.mock import gpu as mock_gpu
from rawgrad.hcq import Device

STEPS = ["environment", "bringup", "timer", "host_semaphore", "acquire", "copy_engine", "hcq_device",
         "first_kernel", "chained_kernels", "tensor_ops", "fault"]
DRIVER_STEPS = [s for s in STEPS if s != "tensor_ops"]  # the Tensor step is the cli layer's


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NV_MOCK", "1")  # the smoke run sets these itself; monkeypatch restores them
    monkeypatch.setenv("NV_MOCK_PROFILE", "h100")
    Device.close("NV")


def test_smoke_run_on_the_mock(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    assert cli_main(["smoke", "--mock", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    steps = {s["name"]: s for s in doc["steps"]}
    assert doc["mock"] is True and list(steps) == STEPS
    assert all(s["status"] == "ok" for s in steps.values()), [(s["name"], s["error"]) for s in doc["steps"]]
    assert steps["bringup"]["details"]["compute_class"] == "0xcbc0"
    assert steps["host_semaphore"]["details"]["timestamp_ns"] > 0
    assert steps["first_kernel"]["details"]["pcas_action"] == "0x9"
    assert steps["chained_kernels"]["details"]["two_kernels_ns"] > 0
    fault = steps["fault"]["details"]
    assert fault["raised"] == "DeviceFault" and "31" in fault["message"]
    assert fault["after"].startswith("device unusable")  # the channel is dead after a fault, and says so
    assert "NV" not in Device.opened()


def test_a_failing_step_does_not_hide_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_timer(self: smoke.SmokeRun) -> dict[str, object]:
        raise OSError(5, "PTIMER read failed")

    monkeypatch.setattr(smoke.SmokeRun, "timer", broken_timer)
    results = {r.name: r for r in nv_smoke.run_smoke(mock=True)}
    assert results["timer"].status == "fail" and "PTIMER read failed" in results["timer"].error
    assert results["host_semaphore"].status == "ok" and results["first_kernel"].status == "ok"
    text = smoke.render(list(results.values()))
    assert "timer" in text and "fail" in text


def test_kernel_step_falls_back_to_another_pcas_action(monkeypatch: pytest.MonkeyPatch) -> None:
    # a GPU that schedules only on action 3: action 9 launches nothing, the step retries on a fresh device
    monkeypatch.setattr(mock_gpu, "_SCHEDULING_PCAS_ACTIONS", (3,))
    monkeypatch.setattr(smoke, "STEP_TIMEOUT_S", 1.0)
    results = {r.name: r for r in nv_smoke.run_smoke(mock=True)}
    kernel = results["first_kernel"]
    assert kernel.status == "ok", kernel.error
    assert kernel.details["pcas_action"] == "0x3" and "0x9" in kernel.details["failed_actions"]
    assert results["tensor_ops"].status == "ok"


def test_driver_steps_run_without_the_tensor_layer() -> None:
    # the driver's own run has every driver-level step; the Tensor step is added from the cli layer
    results = smoke.run_smoke(mock=True)
    assert [r.name for r in results] == DRIVER_STEPS
    assert all(r.status == "ok" for r in results), [(r.name, r.error) for r in results]
    assert "NV" not in Device.opened()
