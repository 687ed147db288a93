"""Every id in the device slices CI runs (.ci/nv-slice, .ci/amd-slice, .ci/metal-slice) still names a test.

A renamed test or parameter leaves a stale id that fails its CI stage only after the default stage (about
four minutes in); collecting each slice here fails the default stage at once and names the slice. Collection
only: nothing runs on the mocks."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SLICES = {"nv-slice": {"DEV": "NV", "NV_MOCK": "1"}, "amd-slice": {"DEV": "AMD", "AMD_MOCK": "1"},
          "metal-slice": {"DEV": "METAL", "METAL_MOCK": "1"}}


@pytest.mark.parametrize("name", sorted(SLICES))
def test_every_slice_id_names_a_test(name: str) -> None:
    path = ROOT / ".ci" / name
    ids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    assert ids and len(ids) == len(set(ids)), f"{path}: empty or with repeated ids"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAWGRAD_")}
    env.update(SLICES[name])
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                          f"@.ci/{name}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f".ci/{name} has ids that no longer name a test:\n{res.stdout[-3000:]}"
    assert f"{len(ids)} tests collected" in res.stdout, res.stdout[-2000:]
