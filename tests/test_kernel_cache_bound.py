"""Loaded kernels are bounded (issue 15 §7): past RAWGRAD_MAX_LOADED_KERNELS the least recently used are
unloaded once nothing holds them, so a process that keeps making new shapes does not run out of mappings."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from rawgrad import Tensor, TinyJit
from rawgrad.compiler import elf
from rawgrad.tensor import realize


def _loaded_images() -> int:
    """CPU kernel images still mapped (every live one holds ~95 KB and 2 mappings)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, elf.LoadedImage) and not o.closed)


def test_new_shapes_do_not_grow_the_loaded_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAWGRAD_MAX_LOADED_KERNELS", "8")
    before = _loaded_images()
    keep = TinyJit(lambda x: x * 3 + 1)
    for _ in range(3):  # a capture holds its kernels: they must stay loaded and keep working
        keep(Tensor(np.ones(5, np.float32)))
    for n in range(1, 40):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal((Tensor(x) * 2 + n).numpy(), x * 2 + n)
        assert len(realize._kernel_cache) <= 8
    # 8 cached + 8 just evicted (released at the next eviction) + the capture's; unbounded growth was ~40
    assert _loaded_images() <= before + 16 + 2
    np.testing.assert_array_equal(keep(Tensor(np.full(5, 2, np.float32))).numpy(), np.full(5, 7))
    # an evicted kernel is rebuilt on demand and still right
    np.testing.assert_array_equal((Tensor(np.arange(3, dtype=np.float32)) * 2 + 3).numpy(), [3, 5, 7])
