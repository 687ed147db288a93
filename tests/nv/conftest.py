"""Fixtures: a mock NVIDIA kernel driver per test, and a device brought up on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.mock import AMPERE, H100, GPUProfile, MockNV

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
