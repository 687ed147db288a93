"""The benchmarks measure both sides the same way (structure only: nothing here compares timings).

- bench dispatch: every column goes through one timing function; under "sync" each side's sync hook and
  readback run after every call, under "async" the sync runs once per block; the table names its protocol.
- bench infer: both sides are summarized by the same statistic (p50 and p90 of the same kind of per-call
  times), and the GPT-2 logits are compared with torch's when torch is installed.
- bench saved-graph runs end to end (a tiny chain, one fresh process).
"""
from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from rawgrad import Device
from rawgrad.cli import bench as bench_mod
from rawgrad.cli import bench_dispatch as bd
from rawgrad.cli import bench_infer

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _counted(side: bd.Side) -> tuple[bd.Side, dict[str, int]]:
    counts = {"call": 0, "sync": 0, "readback": 0}

    def call() -> Any:
        counts["call"] += 1
        return side.call()

    def sync() -> None:
        counts["sync"] += 1
        side.sync()

    def readback(out: Any) -> np.ndarray:
        counts["readback"] += 1
        return side.readback(out)
    return bd.Side(side.name, call, sync, readback, side.note), counts


@pytest.fixture(scope="module")
def sides() -> list[bd.Side]:
    # every framework importable here: rawgrad eager + replay and numpy always, torch / tinygrad if present
    return bd.make_sides(2, Device[Device.DEFAULT])


def test_sides_cover_rawgrad_and_the_baselines(sides: list[bd.Side]) -> None:
    names = [s.name for s in sides]
    assert {"rawgrad eager", "rawgrad replay", "numpy"} <= set(names)
    assert ("torch" in names) == HAS_TORCH
    if importlib.util.find_spec("tinygrad") is not None:  # present, or its failure is reported
        assert "tinygrad jit" in names or "tinygrad" in bd._UNAVAILABLE


def test_sync_protocol_syncs_and_reads_back_after_every_call_on_every_side(sides: list[bd.Side]) -> None:
    for side in sides:
        counted, counts = _counted(side)
        bd.time_per_kernel(counted, 2, "sync", repeats=3, calls=5)
        # one sync before timing, then a sync and a readback after each of the 3 timed calls
        assert counts == {"call": 3, "sync": 4, "readback": 3}, side.name


def test_async_protocol_syncs_once_per_block_on_every_side(sides: list[bd.Side]) -> None:
    for side in sides:
        counted, counts = _counted(side)
        bd.time_per_kernel(counted, 2, "async", repeats=2, calls=4)
        assert counts == {"call": 8, "sync": 3, "readback": 0}, side.name


def test_sync_readback_is_the_chain_result_on_every_side(sides: list[bd.Side]) -> None:
    for side in sides:
        out = side.call()
        side.sync()
        got = side.readback(out)
        assert isinstance(got, np.ndarray) and got.shape == (bd.ELEMENTS,), side.name
        # rawgrad and tinygrad chains read x = 0 and add 2; numpy and torch start from zeros too
        np.testing.assert_array_equal(got, np.full(bd.ELEMENTS, 2, np.float32), err_msg=side.name)


def test_unknown_protocol_is_refused(sides: list[bd.Side]) -> None:
    with pytest.raises(ValueError, match="unknown protocol"):
        bd.time_per_kernel(sides[0], 2, "readback-only-on-one-side", repeats=1, calls=1)


def test_bench_dispatch_times_every_column_under_each_protocol(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[str, str]] = []
    real = bd.time_per_kernel

    def recording(side: bd.Side, n: int, protocol: str, repeats: int, calls: int) -> float:
        seen.append((side.name, protocol))
        return real(side, n, protocol, 1, 1)
    monkeypatch.setattr(bd, "time_per_kernel", recording)
    rows = bd.bench_dispatch((1,), ("async", "sync"), frameworks=("rawgrad", "numpy"))
    out = capsys.readouterr().out
    assert [r["protocol"] for r in rows] == ["async", "sync"]
    for protocol in ("async", "sync"):
        assert f"protocol: {protocol} (every column)" in out
        assert {name for name, p in seen if p == protocol} == {"rawgrad eager", "rawgrad replay", "numpy"}
        assert f"rawgrad replay: {protocol}; numpy: {protocol}" in out
    for r in rows:
        assert {"rawgrad eager_s", "rawgrad replay_s", "numpy_s", "submit_s"} <= set(r)


# ------------------------------------------------------------------------------------------ bench infer
def test_infer_rows_use_one_statistic_for_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    ours, theirs = [0.010, 0.011, 0.012, 0.030], [0.020, 0.021, 0.022, 0.090]
    row = bench_infer.make_row("case", "things/s", 4, ours, theirs)
    assert row["statistic"] == "p50"
    assert set(row["rawgrad_stats"]) == set(row["torch_stats"]) == {"p50", "p90", "n"}
    assert row["rawgrad_stats"] == bench_infer.summarize(ours)
    assert row["torch_stats"] == bench_infer.summarize(theirs)
    assert row["rawgrad"] == pytest.approx(4 / np.median(ours))
    assert row["torch"] == pytest.approx(4 / np.median(theirs))
    bench_infer.print_rows([row])
    out = capsys.readouterr().out
    assert "rawgrad p50" in out and "torch p50" in out and out.count("p90") >= 3
    assert "throughput = units / p50" in out


def test_parity_failure_is_loud(capsys: pytest.CaptureFixture[str]) -> None:
    row = bench_infer.make_row("GPT-2 x", "tokens/s", 1, [0.01], [0.01])
    row.update(max_abs_diff=0.5, tolerance=1e-3, compared="logits", captures=1)
    with pytest.raises(bench_infer.ParityError, match="above the tolerance"):
        bench_infer.report_parity([row])
    assert "max |rawgrad - torch| of logits = 5.00e-01" in capsys.readouterr().out
    row["max_abs_diff"] = float("nan")
    with pytest.raises(bench_infer.ParityError):
        bench_infer.report_parity([row])


def test_gpt2_bench_times_both_sides_per_step_and_checks_logits() -> None:
    from rawgrad.models import gpt2
    row = bench_infer.bench_gpt2(3, gpt2.GPT2Config.tiny())
    assert row["rawgrad_stats"]["n"] == 3
    if HAS_TORCH:
        assert row["torch_stats"]["n"] == row["rawgrad_stats"]["n"]
        assert set(row["torch_stats"]) == set(row["rawgrad_stats"])
        assert row["compared"].startswith("logits")
        assert row["max_abs_diff"] <= row["tolerance"]
    else:
        assert row["torch_stats"] is None and "max_abs_diff" not in row


# -------------------------------------------------------------------------- saved graph, BLAS environment
def test_saved_graph_bench_runs_in_a_fresh_process(capsys: pytest.CaptureFixture[str]) -> None:
    rows = bench_mod.bench_saved_graph(kernels=3, elements=16, runs=1)
    assert len(rows) == 1 and rows[0]["compiled_by_load"] == 0 and rows[0]["all_equal"]
    assert "load + first replay + readback" in capsys.readouterr().out


def test_tests_never_rerun_without_the_blas_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert bench_mod.run_without_blas_overrides(["bench", "cpu"]) is None  # inside pytest: never re-run
    assert "numpy" in bench_mod.blas_description()
