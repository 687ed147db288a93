"""The HCQ conformance suite's devices: every test in tests/hcq runs once per kind in `KINDS`.

A new device (AMD, Metal) joins the suite by one entry in `KINDS`: how to tell whether this machine has
one, how to open a fresh instance (with a small command ring and short waits when a test asks), and one
queue whose run that device reports as a fault. Nothing else in the suite knows about drivers.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rawgrad.hcq import HCQDevice, HWQueue

# Waits in the suite: far above what any step needs, so only a real hang reaches them.
TIMEOUT_S = 20.0
# A ring this many slots deep (CPU records, NV GPFIFO entries) wraps many times in the backpressure tests.
SMALL_RING_SLOTS = 16


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device the suite runs on."""

    name: str
    # why this machine cannot run it (None: it can)
    unavailable: Callable[[], str | None]
    # a fresh device: `ring_slots` (None: the driver's default) and how long a ring-full submit waits
    open: Callable[[int | None, float], HCQDevice]
    # a queue whose run the device reports as a fault (it does not have to be a kernel)
    faulting_queue: Callable[[HCQDevice], HWQueue]


def _open_cpu(ring_slots: int | None, timeout_s: float) -> HCQDevice:
    from rawgrad.drivers.cpu.device import DEFAULT_RING_RECORDS, CPUDevice
    dev = CPUDevice("CPU", threads=2, ring_records=ring_slots or DEFAULT_RING_RECORDS)
    dev.ring_timeout_s = timeout_s
    return dev


def _cpu_fault(dev: HCQDevice) -> HWQueue:
    q = dev.queue()
    q._emit(0x77, 0, 0, 0, 0, 0, 0, 0)  # a record with an opcode the command processor does not know
    q._cmd_ends.append(1)  # type: ignore[attr-defined]
    return q


NV_SMALL_PUSHBUFFER = 0x4000


def _nv_kwargs(ring_slots: int | None, timeout_s: float) -> dict[str, Any]:
    kw: dict[str, Any] = {"timeout_s": timeout_s, "window_size": 1 << 32}
    if ring_slots is not None:
        kw.update(gpfifo_entries=ring_slots, pushbuf_bytes=NV_SMALL_PUSHBUFFER)
    return kw


def _open_nv_mock(ring_slots: int | None, timeout_s: float) -> HCQDevice:
    from rawgrad.drivers.nv.hcq import NVHCQDevice
    from rawgrad.drivers.nv.mock import H100, MockNV
    mock = MockNV(H100, execute_kernels=True)
    try:
        return NVHCQDevice("NV", mock, owned_mock=mock, **_nv_kwargs(ring_slots, timeout_s))
    except BaseException:
        mock.shutdown()
        raise


def _open_nv(ring_slots: int | None, timeout_s: float) -> HCQDevice:
    from rawgrad.drivers.nv.hcq import NVHCQDevice
    from rawgrad.drivers.osapi import LibcOS
    return NVHCQDevice("NV", LibcOS(), **_nv_kwargs(ring_slots, timeout_s))


def _nv_fault(dev: HCQDevice) -> HWQueue:
    from rawgrad.drivers.nv import pushbuf as pb
    q = dev.queue()
    # a method header with SEC_OP 6 (reserved): the front end stops the channel (an RC error)
    q._emit((6 << 29) | (1 << 16) | (pb.NVC56F_SEM_ADDR_LO >> 2), 0)
    return q


def _no_nvidia() -> str | None:
    return None if os.path.exists("/dev/nvidiactl") else "no /dev/nvidiactl: no NVIDIA GPU here"


# The mock AMD GPU (mock KFD + command-processor model + RDNA3 interpreter): in-process and fast (the suite's
# AMD cases take ~2 s), so it runs everywhere, like the mock NV GPU.
AMD_SMALL_RING_BYTES = 1024  # KFD's smallest ring (KFD_MIN_QUEUE_RING_SIZE): 256 PM4 dwords


def _open_amd_mock(ring_slots: int | None, timeout_s: float) -> HCQDevice:
    from rawgrad.drivers.amd.device import DEFAULT_RING_BYTES, AMDDevice, MockAMD
    mock = MockAMD()
    try:
        return AMDDevice("AMD", mock=mock, timeout_s=timeout_s,
                         ring_bytes=AMD_SMALL_RING_BYTES if ring_slots is not None else DEFAULT_RING_BYTES)
    except BaseException:
        mock.shutdown()
        raise


def _amd_fault(dev: HCQDevice) -> HWQueue:
    q = dev.queue()
    q._emit(0)  # a type-0 PM4 header: the compute queue takes type-3 packets only, the CP halts
    return q


# The mock Apple GPU (fake Objective-C runtime; kernels are the rendered MSL built by g++ and run on the
# host).
# Its "ring" is the command queue's window of uncompleted command buffers.
def _open_metal_mock(ring_slots: int | None, timeout_s: float) -> HCQDevice:
    from rawgrad.drivers.metal.device import DEFAULT_MAX_COMMAND_BUFFERS, open_mock
    return open_mock("METAL", timeout_s=timeout_s,
                     max_command_buffers=ring_slots or DEFAULT_MAX_COMMAND_BUFFERS)


# A kernel whose lanes disagree on a barrier: undefined on a GPU, a failed command buffer on the mock.
METAL_FAULT_KERNEL = ("#include <metal_stdlib>\nusing namespace metal;\n"
                      "kernel void conformance_uneven(device float* buf0 [[buffer(0)]], "
                      "uint lid [[thread_index_in_threadgroup]]) {\n"
                      "  if (lid < 3u) threadgroup_barrier(mem_flags::mem_threadgroup);\n"
                      "  buf0[lid] = 1.0f;\n}\n")


def _metal_fault(dev: HCQDevice) -> HWQueue:
    prog = dev.program("conformance_uneven", METAL_FAULT_KERNEL.encode())
    buf = dev.allocator.alloc(64)
    return dev.queue().exec(prog, [buf], (8, 1, 1), (8, 1, 1))


def _no_cxx() -> str | None:
    from rawgrad.drivers.metal.mock.msl_host import CXX
    return None if CXX is not None else "no C++ compiler for the Metal mock"


KINDS = [
    DeviceKind("CPU", lambda: None, _open_cpu, _cpu_fault),
    DeviceKind("NV-mock", lambda: None, _open_nv_mock, _nv_fault),  # the mock GPU needs no hardware
    DeviceKind("NV", _no_nvidia, _open_nv, _nv_fault),
    DeviceKind("AMD-mock", lambda: None, _open_amd_mock, _amd_fault),  # gfx1100 on the mock KFD + RDNA3
    DeviceKind("METAL-mock", _no_cxx, _open_metal_mock, _metal_fault),  # fake ObjC runtime + host-run MSL
]


@pytest.fixture(scope="module", params=KINDS, ids=[k.name for k in KINDS])
def kind(request: pytest.FixtureRequest) -> DeviceKind:
    k: DeviceKind = request.param
    why = k.unavailable()
    if why is not None:
        pytest.skip(why)
    return k


@pytest.fixture(scope="module")
def device(kind: DeviceKind) -> Iterator[HCQDevice]:
    """A fresh device of this kind per test module (not the registry's: tests here may wedge or fault it)."""
    dev = kind.open(None, TIMEOUT_S)
    try:
        yield dev
    finally:
        dev.close()


@pytest.fixture
def fresh(kind: DeviceKind) -> Iterator[Callable[..., HCQDevice]]:
    """Opens extra devices of this kind for one test (a small ring, a fault) and closes them after it."""
    opened: list[HCQDevice] = []

    def open_device(ring_slots: int | None = None, timeout_s: float = TIMEOUT_S) -> HCQDevice:
        dev = kind.open(ring_slots, timeout_s)
        opened.append(dev)
        return dev
    yield open_device
    for dev in opened:
        dev.close()
