"""Every kernel of a representative op corpus compiles for gfx1100 and gfx942 and loads with the descriptor
and metadata the renderer asked for (tests/amd/amd_corpus.py, in a subprocess: an LLVM abort would otherwise
kill pytest)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CORPUS = Path(__file__).with_name("amd_corpus.py")
ROOT = Path(__file__).resolve().parents[2]
# the op list in amd_corpus.py yields this many distinct kernels today; fewer means ops stopped reaching it
MIN_KERNELS = 35


def test_corpus_compiles_and_loads_for_both_targets() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "RAWGRAD_CACHE_DIR": ""}
    proc = subprocess.run([sys.executable, str(CORPUS), "gfx1100", "gfx942"], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, f"corpus compile died (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for arch in ("gfx1100", "gfx942"):
        r = report[arch]
        assert r["problems"] == [], "\n".join(r["problems"])
        assert r["kernels"] >= MIN_KERNELS, r
        assert r["group_kernels"] >= 5, r  # wave-group reductions (ds_bpermute butterflies) are in the corpus
        assert r["lds_kernels"] >= 1, r  # and a block group (LDS slots + barriers)
