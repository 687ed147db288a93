"""One DeviceTimeout for every driver: NV ring and signal timeouts are rawgrad.hcq.DeviceTimeout."""
from __future__ import annotations

import pytest

import rawgrad.hcq
from rawgrad.drivers.nv import gpfifo
from rawgrad.drivers.nv import pushbuf as pb
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.gpfifo import write_u64
from rawgrad.drivers.nv.mock import H100, MockNV


def test_nv_has_no_timeout_class_of_its_own() -> None:
    assert gpfifo.DeviceTimeout is rawgrad.hcq.DeviceTimeout


def test_nv_ring_timeout_is_caught_as_hcq_device_timeout() -> None:
    m = MockNV(H100)
    d = NVDevice(m, gpfifo_entries=4, window_size=1 << 30, timeout_s=0.05)  # type: ignore[arg-type]
    try:
        gate = d.alloc_signal()
        d.compute.submit(pb.sem_acquire(pb.PushBuffer(), d.host, gate, 1))  # the GPU stalls here
        caught = None
        for _ in range(8):  # 4 GPFIFO slots: the ring fills and the next submit times out
            try:
                d.compute.submit(pb.PushBuffer())
            except rawgrad.hcq.DeviceTimeout as e:
                caught = e
                break
        assert caught is not None, "a full GPFIFO ring never timed out"
        assert isinstance(caught, TimeoutError) and caught.device == "NV:0"
        assert "compute channel" in caught.queue and "free GPFIFO entry" in caught.signal
        assert caught.timeout_s == 0.05 and caught.current < caught.expected
        with pytest.raises(rawgrad.hcq.DeviceTimeout, match="compute retirement counter"):
            d.compute.wait_idle(timeout_s=0.05)
        write_u64(gate, 1)
        d.compute.wait_idle(timeout_s=5)
    finally:
        d.close()
        m.shutdown()
