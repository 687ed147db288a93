"""The CPU device's host waits (issue 21): a host waiting on a signal spins briefly, then sleeps on the
signal's futex word, and the processor's SIGNAL record wakes it; no fixed naps on the way. And the eager
launch fast path (CPUProgram.__call__) keeps the checks of the general path."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.drivers.cpu import CPUDevice
from rawgrad.drivers.cpu.processor import FUTEX_TIMEOUT_NS, HOST_SPIN_NS
from rawgrad.drivers.cpu.records import CTX
from rawgrad.hcq import DeviceTimeout
from rawgrad.tensor.realize import capture_launches

TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def dev():
    d = CPUDevice("CPU:9", threads=2)
    yield d
    d.close()


def _waiters(d: CPUDevice) -> int:
    return int(d._native.ctx[CTX.HOST_WAITERS])


def _blocked_wait_then_signal(d: CPUDevice) -> float:
    """Seconds from the SIGNAL record's submit to the return of a host wait that was asleep on it."""
    sig = d.new_signal()
    out: dict[str, float | bool] = {}

    def waiter() -> None:
        out["ok"] = d._native.wait_signal(sig.address, 1, TIMEOUT_S)  # one native wait, no Python slices
        out["t"] = time.perf_counter()
    th = threading.Thread(target=waiter)
    th.start()
    deadline = time.perf_counter() + TIMEOUT_S
    while _waiters(d) == 0:  # past the spin: counted as asleep on the futex word
        assert time.perf_counter() < deadline and th.is_alive(), "the host wait never went to sleep"
        time.sleep(HOST_SPIN_NS / 1e9)
    t0 = time.perf_counter()
    d.queue().signal(sig, 1).submit(d)
    th.join(TIMEOUT_S)
    assert not th.is_alive() and out["ok"] is True
    assert _waiters(d) == 0
    return float(out["t"]) - t0


def test_a_sleeping_host_wait_is_woken_by_the_signal_record(dev):
    # Without the wake the sleeper would only see the value at the end of its futex slice (50 ms); the
    # best of three leaves room for a busy machine.
    best = min(_blocked_wait_then_signal(dev) for _ in range(3))
    assert best < FUTEX_TIMEOUT_NS / 1e9 / 2, f"woken after {best * 1e3:.1f} ms"


def test_a_value_the_host_writes_is_seen_without_a_wake(dev):
    sig = dev.new_signal()
    threading.Timer(0.02, lambda: setattr(sig, "value", 3)).start()  # no SIGNAL record: no futex wake
    t0 = time.perf_counter()
    sig.wait(3, TIMEOUT_S)
    assert time.perf_counter() - t0 < 1.0
    assert _waiters(dev) == 0


def test_a_host_wait_times_out_and_leaves_no_waiter_counted(dev):
    sig = dev.new_signal()
    t0 = time.perf_counter()
    assert dev._native.wait_signal(sig.address, 1, 0.03) is False
    assert 0.02 <= time.perf_counter() - t0 < 2.0
    with pytest.raises(DeviceTimeout, match="CPU:9"):
        sig.wait(1, timeout_s=0.03)
    assert _waiters(dev) == 0


def test_a_closed_device_wait_returns_at_once():
    d = CPUDevice("CPU:10", threads=1)
    sig = d.new_signal()
    d.close()
    t0 = time.perf_counter()
    assert d._native.wait_signal(sig.address, 1, 5.0) is False
    assert time.perf_counter() - t0 < 1.0


def test_eager_fast_launch_keeps_the_general_checks():
    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    with capture_launches() as rec:
        y = (x * 2.5).realize()
    np.testing.assert_array_equal(y.numpy(), np.arange(8, dtype=np.float32) * np.float32(2.5))
    (item,) = rec
    assert item.kernel is not None
    prog = item.kernel.program
    with pytest.raises(ValueError, match="arguments"):  # one buffer and the scalar missing
        prog(y.uop.base._cached["device_memory"].hcq_buffer, global_size=(8, 1, 1))
    with pytest.raises(ValueError, match="negative global size"):
        prog(*(b._cached["device_memory"].hcq_buffer for b in item.bufs), global_size=(-1, 1, 1),
             vals=tuple(item.var_vals.values()))
