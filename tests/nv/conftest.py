"""Fixtures: a mock NVIDIA kernel driver per test, a device brought up on it, and Device["NV"] on the mock."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.mock import AMPERE, H100, GPUProfile, MockNV
from rawgrad.hcq import Device

PROFILES = {"h100": H100, "ampere": AMPERE}
SMALL_WINDOW = 1 << 30  # keep reserved address space small in tests


@pytest.fixture(params=sorted(PROFILES))
def profile(request: pytest.FixtureRequest) -> GPUProfile:
    return PROFILES[request.param]


@pytest.fixture
def mock(profile: GPUProfile) -> Iterator[MockNV]:
    m = MockNV(profile)
    yield m
    m.shutdown()


def make_device(m: MockNV, **kw: object) -> NVDevice:
    kw.setdefault("gpfifo_entries", 64)
    kw.setdefault("window_size", SMALL_WINDOW)
    kw.setdefault("timeout_s", 5.0)
    return NVDevice(m, **kw)  # type: ignore[arg-type]


@pytest.fixture
def dev(mock: MockNV) -> Iterator[NVDevice]:
    d = make_device(mock)
    yield d
    d.close()
    assert all(not v for v in mock.leaks().values()), mock.leaks()


@pytest.fixture
def nv(monkeypatch: pytest.MonkeyPatch, profile: GPUProfile) -> Iterator[str]:
    """Device["NV"] on the mock with this profile (selected explicitly: NV_MOCK=1), closed and
    leak-checked afterwards."""
    monkeypatch.setenv("NV_MOCK", "1")
    monkeypatch.setenv("NV_MOCK_PROFILE", next(k for k, v in PROFILES.items() if v is profile))
    Device.close("NV")
    d: Any = Device["NV"]
    yield "NV"
    gc.collect()
    Device.close("NV")
    assert all(not v for v in d.owned_mock.leaks().values()), d.owned_mock.leaks()
