"""The mock catches broken encodings: each test breaks one thing the driver encodes (a QMD field moved, a
struct of the wrong size, a semaphore released to the wrong address) and checks the run fails visibly
(a fault, an ioctl error or a timeout) or gives a wrong result the test detects, never a silent pass.

The mock decodes QMDs with its own bit table (mock/gpu.py), not qmd.py's, so moving a field in qmd.py
makes the driver and the mock disagree, which is what a real GPU would do."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rawgrad.drivers.nv import abi
from rawgrad.drivers.nv.hcq import NVHCQDevice, _NVQueue
from rawgrad.drivers.nv.mock import H100, GPUProfile, MockNV
from rawgrad.drivers.nv.mock import gpu as G
from rawgrad.drivers.nv.qmd import MAX_CONSTANT_BUFFERS, QMD, QMDV03, QMDV04
from rawgrad.drivers.nv.rm import NVError
from rawgrad.hcq import DeviceFault, DeviceTimeout, HCQError

from . import test_qmd_headers as H
from .conftest import SMALL_WINDOW
from .test_nv_device import KERNELS

N = 200
K = 3
EXPECTED = np.arange(N) * K + 1
SHORT_TIMEOUT_S = 0.5


@pytest.fixture
def mock(profile: GPUProfile) -> Iterator[MockNV]:
    m = MockNV(profile, execute_kernels=True)
    yield m
    m.shutdown()
    gc.collect()
    assert all(not v for v in m.leaks().values()), m.leaks()


def make(m: MockNV) -> NVHCQDevice:
    return NVHCQDevice("NV", m, gpfifo_entries=64, window_size=SMALL_WINDOW, timeout_s=SHORT_TIMEOUT_S)


def run_chain(d: NVHCQDevice) -> np.ndarray:
    """fill -> add1 (chained QMDs) -> timeline release folded into the last QMD; returns the output."""
    lib = d.compiler.compile(KERNELS.format(arch=d.arch))
    fill, add1 = d.program("fill", lib), d.program("add1", lib)
    a, b = d.allocator.alloc(8 * N), d.allocator.alloc(8 * N)
    v = d.timeline_value
    q = d.queue().wait(d.timeline_signal, v - 1).exec(fill, [a, N, K], (N, 1, 1))
    q.exec(add1, [b, a, N], (N, 1, 1)).signal(d.timeline_signal, v).submit(d)
    d.timeline_value = v + 1
    d.synchronize(timeout_s=SHORT_TIMEOUT_S)
    out = np.empty(N, np.int64)
    d.allocator.copyout(memoryview(out), b)
    return out


def test_the_unbroken_chain_passes(mock: MockNV) -> None:
    d = make(mock)
    try:
        np.testing.assert_array_equal(run_chain(d), EXPECTED)
    finally:
        d.close()


def _moved_fields(layout: type[QMD]) -> list[str]:
    v04 = layout is QMDV04
    return ["GRID_WIDTH" if v04 else "CTA_RASTER_WIDTH", "CTA_THREAD_DIMENSION0", "PROGRAM_ADDRESS_LOWER",
            "CONSTANT_BUFFER_ADDR_LOWER_SHIFTED60" if v04 else "CONSTANT_BUFFER_ADDR_LOWER0",
            "QMD_MAJOR_VERSION",
            "REGISTER_COUNT" if v04 else "REGISTER_COUNT_V", "SHARED_MEMORY_SIZE", "DEPENDENT_QMD0_POINTER",
            "RELEASE_SEMAPHORE0_PAYLOAD_LOWER" if v04 else "RELEASE0_PAYLOAD_LOWER",
            "RELEASE_SEMAPHORE0_ADDR_LOWER" if v04 else "RELEASE0_ADDRESS_LOWER"]


FIELD_CASES = [(layout, f) for layout in (QMDV04, QMDV03) for f in _moved_fields(layout)]


@pytest.mark.parametrize("layout,field", FIELD_CASES, ids=[f"{lay.NAME}-{f}" for lay, f in FIELD_CASES])
@pytest.mark.parametrize("shift", [32, -8], ids=["next-dword", "byte-down"])
def test_moved_qmd_field_is_caught(monkeypatch: pytest.MonkeyPatch, layout: type[QMD], field: str,
                                   shift: int) -> None:
    profile = H100 if layout is QMDV04 else _ampere()
    m = MockNV(profile, execute_kernels=True)
    hi, lo = layout.FIELDS[field]
    monkeypatch.setitem(layout.FIELDS, field, (hi + shift, lo + shift))  # the driver's table slipped
    d = make(m)
    try:
        try:
            out = run_chain(d)
        except (HCQError, TimeoutError) as e:  # a GR/MMU fault on the channel, or a release that never came
            assert isinstance(e, (DeviceFault, DeviceTimeout)) or "timed out" in str(e), e
            if isinstance(e, DeviceFault):
                assert m.gpu.faults, "a DeviceFault must come from a recorded GPU fault"
            return
        assert not np.array_equal(out, EXPECTED), f"{layout.NAME}.{field} moved {shift} bits went unnoticed"
    finally:
        d.close()
        m.shutdown()
        gc.collect()
        assert all(not v for v in m.leaks().values()), m.leaks()


def _ampere() -> GPUProfile:
    from rawgrad.drivers.nv.mock import AMPERE
    return AMPERE


def _written_fields(layout: type[QMD]) -> set[str]:
    """Every field the driver's builders write, for a launch that uses all of them: every constant bank,
    every release slot and a dependent QMD."""
    q = layout()
    q.launch(shared_bytes=0x100, registers=32, barriers=1, sass_version=0x90, local_bytes_per_thread=0x240)
    q.grid(3, 2, 1).block(64, 2, 1).program(0x12_3456_7800, 0x300)
    for i in range(MAX_CONSTANT_BUFFERS):
        q.constant_buffer(i, 0x10_0000_0000 + 0x1000 * i, 0x200)
    while q.release(0x20_0000_0000, 7):
        pass
    q.chain(0x30_0000_0000)
    return set(q.values)


@pytest.mark.parametrize("version", ["V03", "V04"])
def test_every_field_the_driver_writes_is_decoded_by_the_mock(version: str) -> None:
    """The driver's written fields against the MOCK's own decoder tables (gpu._V03/_V04 and the _MORE
    tables), both named through NVIDIA's header (test_qmd_headers.py), so a field the driver writes but the
    mock never reads fails here; the mock's extra table is checked against the header's bit ranges too."""
    layout, plain, indexed, _, table, mock_names = H.LAYOUTS[version]
    ours = H.header_ranges(plain, indexed)  # qmd.py names (NAME0)
    header = H.header_ranges(plain, indexed, header_style=True)  # header names (NAME(0)), same order
    to_header = dict(zip(ours, header, strict=True))
    more = G._QMD_MORE[layout.MAJOR_VERSION]
    wrong = {k: ((lo + width - 1, lo), header.get(k)) for k, (lo, width) in more.items()
             if header.get(k) != (lo + width - 1, lo)}
    assert not wrong, f"mock {version} extra fields (ours as (hi, lo), header) differ: {wrong}"
    decoded = {mock_names[k] for k in table} | set(more)
    written = {to_header[f] for f in _written_fields(layout)}
    assert not written - decoded, f"{version}: the driver writes fields the mock never decodes: " \
                                  f"{sorted(written - decoded)}"


def test_moved_field_cases_name_real_fields() -> None:
    for layout in (QMDV03, QMDV04):
        assert all(f in layout.FIELDS for f in _moved_fields(layout))


# ------------------------------------------------------------------------------------------- struct sizes
class _DriftedABI:
    """The driver's view of the ABI with one struct a few bytes off (a stale or wrong header)."""

    def __init__(self, real: abi.NVABI, ctype: str, delta: int) -> None:
        self._real, self._ctype, self._delta = real, ctype, delta
        self.ffi = _DriftedFFI(real.ffi, ctype, delta)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def sizeof(self, ctype: str) -> int:
        return self._real.sizeof(ctype) + (self._delta if ctype == self._ctype else 0)

    def rm_request(self, escape: int, ctype: str) -> int:
        return abi.iowr(abi.NV_IOCTL_MAGIC, escape, self.sizeof(ctype))


class _DriftedFFI:
    def __init__(self, real: Any, ctype: str, delta: int) -> None:
        self._real, self._ctype, self._delta = real, ctype, delta

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def sizeof(self, x: Any) -> int:
        n = int(self._real.sizeof(x))
        if not isinstance(x, str) and self._real.typeof(x).cname == self._ctype:
            n += self._delta
        return n


@pytest.mark.parametrize("ctype,delta,expect", [
    ("NVOS21_PARAMETERS", 8, "NV_ESC_RM_ALLOC.*EINVAL"),  # escape wrapper: NV_ERR_INVALID_ARGUMENT-style
    ("nv_ioctl_nvos33_parameters_with_fd", -8, "NV_ESC_RM_MAP_MEMORY.*EINVAL"),
    ("NV2080_CTRL_GR_GET_INFO_PARAMS", 4, "GR_GET_INFO.*NV_ERR_INVALID_PARAM_STRUCT"),  # control params
])
def test_wrong_struct_size_fails_bring_up_cleanly(mock: MockNV, monkeypatch: pytest.MonkeyPatch, ctype: str,
                                                  delta: int, expect: str) -> None:
    drifted = _DriftedABI(abi.abi_for_branch("580"), ctype, delta)
    monkeypatch.setattr(abi, "abi_for_branch", lambda branch: drifted)  # the mock already holds the real one
    with pytest.raises(NVError, match=expect):
        make(mock)
    # the half-built device released everything it had made (the fixture checks mock.leaks())


# ------------------------------------------------------------------------------------------- semaphores
def test_host_release_to_the_wrong_address_times_out(mock: MockNV, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make(mock)
    real = _NVQueue._release

    def off_by_a_slot(self: _NVQueue, address: Any, value: Any, *, timestamp: bool) -> None:
        real(self, address + 16, value, timestamp=timestamp)  # the next signal slot, not ours

    try:
        monkeypatch.setattr(_NVQueue, "_release", off_by_a_slot)
        sig = d.new_signal(0, name="target")
        d.new_signal(0)  # something mapped where the stray release lands
        d.queue().signal(sig, 1).submit(d)
        with pytest.raises(DeviceTimeout, match="'target'|target >= 1"):
            sig.wait(1, timeout_s=0.2, queue="test", check=d.check_fault)
        assert not mock.gpu.faults  # nothing faulted: only the waiter can notice
    finally:
        monkeypatch.undo()
        d.close()


def test_qmd_release_to_unmapped_address_faults(mock: MockNV, monkeypatch: pytest.MonkeyPatch,
                                                profile: GPUProfile) -> None:
    d = make(mock)
    layout = d.qmd_class
    real = layout.release

    def stray(self: QMD, address: Any, payload: Any) -> bool:
        return real(self, address + (1 << 36), payload)  # far outside every mapping

    try:
        monkeypatch.setattr(layout, "release", stray)
        with pytest.raises(DeviceFault, match="Xid-style code\\) 31.*MMU_FAULT"):
            run_chain(d)
        assert mock.gpu.faults[-1].kind == "MMU_FAULT"
    finally:
        monkeypatch.undo()
        d.close()


def test_misaligned_qmd_release_faults(mock: MockNV, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make(mock)
    layout = d.qmd_class
    real = layout.release

    def misaligned(self: QMD, address: Any, payload: Any) -> bool:
        return real(self, address + 8, payload)  # a four-word release needs 16-byte alignment

    try:
        monkeypatch.setattr(layout, "release", misaligned)
        with pytest.raises(DeviceFault, match="SEMAPHORE_ALIGNMENT"):
            run_chain(d)
    finally:
        monkeypatch.undo()
        d.close()
