"""Fixtures for the Metal bridge on the mock Objective-C runtime: every test that uses `objc` ends with the
runtime's ledger checked (no fault, no leaked object, no open autorelease pool)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from rawgrad.drivers.metal.mock.objc_fake import FakeObjCRuntime
from rawgrad.drivers.metal.objc import ObjC


@pytest.fixture
def fake() -> FakeObjCRuntime:
    return FakeObjCRuntime()


@pytest.fixture
def objc(fake: FakeObjCRuntime) -> Iterator[ObjC]:
    yield ObjC(fake)
    fake.assert_balanced()
