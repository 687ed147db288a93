"""Real-hardware smoke tests (NV-FACTS section 10 steps 1-11). Skipped unless /dev/nvidiactl exists."""

from __future__ import annotations

import os

import numpy as np
import pytest

from rawgrad.drivers.nv import pushbuf as pb
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.gpfifo import read_u64, write_u64
from rawgrad.drivers.osapi import LibcOS

pytestmark = [
    pytest.mark.nv,
    pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="no NVIDIA GPU (/dev/nvidiactl)"),
]


def test_hw_bringup_semaphores_and_copy() -> None:
    import cffi

    ffi = cffi.FFI()
    with NVDevice(LibcOS(), gpfifo_entries=1024, timeout_s=10.0) as d:
        sig = d.alloc_signal()
        d.compute.submit(pb.sem_release(pb.PushBuffer(), d.host, sig, 0x1234_5678_9ABC))
        d.wait_signal(sig, 0x1234_5678_9ABC)
        assert read_u64(sig + 8) != 0
        gate, out = d.alloc_signal(), d.alloc_signal()
        q = pb.sem_acquire(pb.PushBuffer(), d.host, gate, 5)
        d.copy.submit(pb.sem_release(q, d.host, out, 7))
        assert read_u64(out) == 0
        write_u64(gate, 5)
        d.wait_signal(out, 7)
        n = (1 << 20) + 123
        src, vram, dst = d.alloc_host(n), d.alloc_vram(n), d.alloc_host(n)
        pattern = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
        np.frombuffer(ffi.buffer(ffi.cast("char *", src.va), n), np.uint8)[:] = pattern
        q = pb.ce_copy(pb.PushBuffer(), d.copy_info, vram.va, src.va, n)
        pb.ce_copy(q, d.copy_info, dst.va, vram.va, n)
        d.copy.submit(d.signal_next(q))
        d.wait_signal(d.timeline, d.timeline_value)
        assert np.array_equal(np.frombuffer(ffi.buffer(ffi.cast("char *", dst.va), n), np.uint8), pattern)
