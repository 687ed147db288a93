"""Shared fixtures: numpy comparison with per-dtype tolerances and seeded inputs. The CI checks (required
skips, device kernel counts, PTX-only fallbacks) are a plugin in tests/ci_policy.py."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rawgrad.dtype import DType, bf16_bits_to_f32, dtypes, f32_to_bf16_bits


def pytest_configure(config: pytest.Config) -> None:
    import ci_policy  # tests/ is on sys.path (rootdir conftest)
    config.addinivalue_line("markers", "device_slice_keep: stays in a device slice however long it takes "
                                       "(an acceptance test the slice exists for; RAWGRAD_SLICE_MAX_SECONDS)")
    if ci_policy.counting_mock_kernels():
        ci_policy.install_kernel_counter()
    config.pluginmanager.register(ci_policy, "rawgrad_ci_policy")


# float16 and bfloat16 results are compared with references rounded the same way; the tolerance is a
# few units in the last place (bfloat16 has 8 significant bits, so ~1e-2 relative).
TOLERANCES: dict[DType, tuple[float, float]] = {
    dtypes.float64: (1e-9, 1e-12), dtypes.float32: (1e-5, 1e-6),
    dtypes.float16: (2e-3, 1e-3), dtypes.bfloat16: (1e-2, 1e-2),
}

FLOATS = [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64]
SIGNED = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64]
UNSIGNED = [dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64]
INTS = SIGNED + UNSIGNED


def round_to(a: np.ndarray, dt: DType) -> np.ndarray:
    """What numpy data becomes when stored as dt (bfloat16 rounded and returned as float32)."""
    if dt == dtypes.bfloat16:
        return bf16_bits_to_f32(f32_to_bf16_bits(np.asarray(a, np.float32))).reshape(np.shape(a))
    return np.asarray(a).astype(dt.np)


def assert_close(actual: Any, expected: Any, dt: DType | None = None, rtol: float | None = None,
                 atol: float | None = None) -> None:
    """Compare a Tensor (or array) with numpy: exact for ints and bools, per-dtype tolerance for floats."""
    from rawgrad.tensor.tensor import Tensor
    if isinstance(actual, Tensor):
        dt = dt or actual.dtype
        actual = actual.numpy()
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    if dt is None or not dt.is_float:
        np.testing.assert_array_equal(actual, expected)
        return
    r, a = TOLERANCES[dt]
    np.testing.assert_allclose(actual.astype(np.float64), np.asarray(expected, np.float64),
                               rtol=rtol if rtol is not None else r, atol=atol if atol is not None else a,
                               equal_nan=True)


def random_data(rng: np.random.Generator, shape: tuple[int, ...], dt: DType,
                low: float = -3.0, high: float = 3.0) -> np.ndarray:
    """Random values that dt holds exactly (returned in dt's numpy compute type; bf16 as float32)."""
    if dt.is_bool:
        return rng.random(shape) < 0.5
    if dt.is_int:
        lo = max(int(low) * 10, int(dt.min))
        hi = min(int(high) * 10, int(dt.max))
        return rng.integers(lo, hi + 1, size=shape).astype(dt.np)
    return round_to(rng.uniform(low, high, size=shape), dt)


def check_all(outs: list[Any], expected: list[Any], names: list[str] | None = None, **tol: Any) -> None:
    """Compare many results with one realize and few kernels: results of one dtype and shape are
    stacked into a single tensor (one kernel per group instead of one per result)."""
    from rawgrad.tensor.tensor import Tensor
    assert len(outs) == len(expected)
    groups: dict[Any, list[int]] = {}
    for i, o in enumerate(outs):
        groups.setdefault((o.dtype, o.shape), []).append(i)
    stacked = {k: Tensor.stack(*[outs[i] for i in idx]) if len(idx) > 1 else outs[idx[0]]
               for k, idx in groups.items()}
    Tensor.realize(*stacked.values())
    for k, idx in groups.items():
        arr = stacked[k].numpy()
        for j, i in enumerate(idx):
            label = names[i] if names else f"result {i}"
            try:
                assert_close(arr[j] if len(idx) > 1 else arr, expected[i], dt=k[0], **tol)
            except AssertionError as e:
                raise AssertionError(f"{label} ({k[0]}, shape {k[1]}): {e}") from None


@pytest.fixture
def check() -> Callable[..., None]:
    return check_all


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture
def close() -> Callable[..., None]:
    return assert_close


@pytest.fixture
def data(rng: np.random.Generator) -> Callable[..., np.ndarray]:
    return lambda shape, dt=dtypes.float32, low=-3.0, high=3.0: random_data(rng, shape, dt, low, high)
