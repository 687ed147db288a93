"""Device-independent HCQ core: signals, the allocator base, patch points, the device registry."""
import threading
import time

import numpy as np
import pytest

from rawgrad.compiler.ir import UOp
from rawgrad.hcq import Allocator, Device, DeviceTimeout, HCQBuffer, HWQueue, Signal, sym_eval
from rawgrad.hcq.signal import wait_until

# Generous bound for "returns quickly" on a loaded 2-core machine.
QUICK_S = 2.0


# ---------------------------------------------------------------------- signals
def test_signal_memory_layout():
    s = Signal(5, name="s")
    assert s.value == 5 and s.timestamp == 0
    s.value = 2**64 - 1
    assert s.value == 2**64 - 1
    assert s.address % 8 == 0 and s.timestamp_address == s.address + 8
    view = Signal(None, address=s.address, name="alias")  # a view of existing words keeps them
    assert view.value == 2**64 - 1


def test_signal_wait_times_out_with_a_clear_message():
    s = Signal(3, owner="DEV9", name="ready")
    t0 = time.perf_counter()
    with pytest.raises(DeviceTimeout) as info:
        s.wait(4, timeout_s=0.05, queue="q7")
    took = time.perf_counter() - t0
    assert 0.05 <= took < QUICK_S
    msg = str(info.value)
    for part in ("DEV9", "q7", "ready", ">= 4", "current value 3", "0.05"):
        assert part in msg
    assert info.value.expected == 4 and info.value.current == 3
    assert isinstance(info.value, TimeoutError)


def test_signal_wait_sees_a_later_write():
    s = Signal(0)
    timer = threading.Timer(0.02, lambda: setattr(s, "value", 9))
    timer.start()
    try:
        s.wait(9, timeout_s=5)
    finally:
        timer.cancel()
    assert s.value == 9


def test_signal_wait_check_hook_aborts():
    s = Signal(0)

    def dead() -> None:
        raise RuntimeError("device died")
    with pytest.raises(RuntimeError, match="device died"):
        s.wait(1, timeout_s=5, check=dead)


def test_idle_wait_does_not_burn_a_core():
    s = Signal(0)
    c0 = time.process_time()
    with pytest.raises(DeviceTimeout):
        s.wait(1, timeout_s=0.3)
    assert time.process_time() - c0 < 0.15  # mostly asleep, not spinning


def test_wait_until_hooks_driver_sleep_check_and_timeout_error():
    """The one wait loop: a driver's event wait replaces the sleep, its fault check runs between naps, and
    its DeviceTimeout is what a timeout raises."""
    naps: list[float] = []
    state = {"ready": False}

    def event_wait(seconds: float) -> None:  # a driver event: the device answers on the third wait
        naps.append(seconds)
        state["ready"] = len(naps) >= 3
    wait_until(lambda: state["ready"], 5.0, lambda: DeviceTimeout("D", "q", "s", 1, 0, 5.0), sleep=event_wait)
    assert len(naps) == 3 and all(0 < n <= 5.0 for n in naps)

    checks = []
    err = DeviceTimeout("DEV3", "queue9", "thing", 2, 1, 0.02)
    with pytest.raises(DeviceTimeout) as info:
        wait_until(lambda: False, 0.02, lambda: err, check=lambda: checks.append(1))
    assert info.value is err and checks


def test_drivers_have_no_wait_loop_of_their_own():
    from rawgrad.drivers.nv import device as nv_device
    from rawgrad.drivers.nv import gpfifo
    assert not hasattr(gpfifo, "poll_until") and gpfifo.wait_until is wait_until
    assert nv_device.wait_until is wait_until


def test_timeline_submit_reserves_a_value_only_for_work_that_was_queued():
    dev = Device["CPU"]
    dev.synchronize()
    before = dev.timeline_value
    value, q = dev.timeline_submit()
    assert value == before and dev.timeline_value == before + 1
    words = q.words()  # wait(timeline, v - 1) then signal(timeline, v)
    assert before - 1 in words and before in words

    def refuse(q: HWQueue) -> None:
        raise ValueError("bad launch")
    with pytest.raises(ValueError, match="bad launch"):
        dev.timeline_submit(refuse)
    with pytest.raises(RuntimeError, match="refused"):
        dev.timeline_replay(lambda v, _: (_ for _ in ()).throw(RuntimeError("refused")), None)
    assert dev.timeline_value == before + 1  # no gap: synchronize returns
    dev.synchronize(timeout_s=5)
    tl = dev.timeline_signal
    replayed = dev.timeline_replay(lambda v, q: (v, q.wait(tl, v - 1).signal(tl, v).submit(dev)), dev.queue())
    assert replayed[0] == before + 1 and dev.timeline_value == before + 2
    dev.synchronize(timeout_s=5)


# ---------------------------------------------------------------------- allocator base
class HostBytesAllocator(Allocator):
    """Backed by bytearrays; counts driver calls."""

    def __init__(self, cache_limit: int = 1 << 20) -> None:
        super().__init__(cache_limit)
        self.mem: dict[int, bytearray] = {}
        self.driver_allocs = self.driver_frees = 0
        self._next = 0x1000

    def _alloc(self, nbytes: int) -> HCQBuffer:
        self.driver_allocs += 1
        buf = HCQBuffer(self._next, nbytes)
        self.mem[self._next] = bytearray(nbytes)
        self._next += 1 << 20
        return buf

    def _free(self, buf: HCQBuffer) -> None:
        self.driver_frees += 1
        del self.mem[buf.va_addr]

    def _copyin(self, buf: HCQBuffer, src: memoryview) -> None:
        self.mem[buf.va_addr][:src.nbytes] = src

    def _copyout(self, dst: memoryview, buf: HCQBuffer) -> None:
        dst[:] = self.mem[buf.va_addr][:dst.nbytes]


def test_allocator_cache_reuse():
    a = HostBytesAllocator()
    b1 = a.alloc(100)
    a.free(b1)
    assert a.cached_bytes == 100
    assert a.alloc(100) is b1 and a.driver_allocs == 1  # served from the cache
    b2 = a.alloc(200)
    assert b2 is not b1 and a.driver_allocs == 2
    a.free(b1)
    a.free(b2)
    a.free_cache()
    assert a.cached_bytes == 0 and a.driver_frees == 2 and not a.mem


def test_allocator_cache_is_bounded_lru():
    a = HostBytesAllocator(cache_limit=300)
    bufs = [a.alloc(100) for _ in range(4)]
    for b in bufs:
        a.free(b)
    assert a.cached_bytes == 300 and a.driver_frees == 1
    assert bufs[0].va_addr not in a.mem  # the least recently freed went back to the driver
    big = a.alloc(1000)
    a.free(big)  # larger than the whole cache: released at once
    assert a.driver_frees == 2


def test_allocator_double_free_and_views():
    a = HostBytesAllocator()
    b = a.alloc(64)
    v = b.view(16, 16)
    assert v.va_addr == b.va_addr + 16 and v.base is b
    with pytest.raises(ValueError, match="view"):
        a.free(v)
    with pytest.raises(ValueError, match="outside"):
        b.view(60, 8)
    a.free(b)
    with pytest.raises(ValueError, match="double free.*already freed"):
        a.free(b)
    with pytest.raises(ValueError, match="double free or foreign"):
        a.free(HCQBuffer(0x5000, 8))
    with pytest.raises(ValueError, match="positive"):
        a.alloc(0)


def test_allocator_copies_check_sizes():
    a = HostBytesAllocator()
    b = a.alloc(16)
    src = np.arange(4, dtype=np.int32)
    a.copyin(b, memoryview(src))
    out = np.zeros(4, dtype=np.int32)
    a.copyout(memoryview(out), b)
    assert (out == src).all()
    with pytest.raises(ValueError, match="copyin of 32 bytes"):
        a.copyin(b, memoryview(bytes(32)))
    with pytest.raises(ValueError, match="copyout of 24 bytes"):
        a.copyout(memoryview(bytearray(24)), b)


# ---------------------------------------------------------------------- patch points
def test_sym_eval():
    n, m = UOp.variable("n", 1, 100), UOp.variable("m", 0, 10)
    assert sym_eval(n * 4 + m, {n: 5, m: 2}) == 22
    assert sym_eval((n + 7) // 4, {n: 9}) == 4
    assert sym_eval(n.bind(3) * 2, {}) == 6
    with pytest.raises(KeyError, match="'n'"):
        sym_eval(n + 1, {m: 1})
    with pytest.raises(ValueError, match="outside its range"):
        sym_eval(n, {n: 101})


class WordQueue(HWQueue):
    """A queue that encodes every command as (opcode, operands...) 32-bit words, for testing the base."""

    WORD_BITS = 32

    def __init__(self) -> None:
        super().__init__()
        self.submits = 0
        self.before_patch_calls = 0

    def _wait(self, signal, value):
        self._emit(1)
        self._emit_wide(signal.address, 2)
        self._emit_wide(value, 2)

    def _signal(self, signal, value):
        self._emit(2)
        self._emit_wide(signal.address, 2)
        self._emit_wide(value, 2)

    def _before_patch(self, device):
        self.before_patch_calls += 1

    def _submit(self, device):
        self.submits += 1


def test_patch_points_rewrite_only_changed_words():
    v = UOp.variable("v", 0, 2**40)
    s = Signal(0)
    q = WordQueue().wait(s, 7).signal(s, v + 1)
    assert [p.index for p in q.patch_points] == [8, 9] and [p.shift for p in q.patch_points] == [0, 32]
    q.submit(None, {v: 4})
    assert q.words()[8:10].tolist() == [5, 0] and q.before_patch_calls == 1
    q.submit(None, {v: 4})
    assert q.before_patch_calls == 1  # nothing changed, nothing rewritten
    q.submit(None, {v: 2**33})
    assert q.words()[8:10].tolist() == [1, 2] and q.before_patch_calls == 2
    assert q.words()[3:5].tolist() == [7, 0] and q.submits == 3
    with pytest.raises(KeyError):
        q.submit(None, {})


def test_queue_rejects_bad_operands():
    with pytest.raises(TypeError, match="int or a symbolic UOp"):
        WordQueue().signal(Signal(0), 1.5)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- registry
def test_registry_names():
    assert Device.canonicalize("cpu") == "CPU"
    assert Device.canonicalize("CPU:0") == "CPU"
    assert Device.canonicalize("cpu:1") == "CPU:1"
    assert "CPU" in Device.known
    with pytest.raises(ValueError, match="unknown device 'TPU'.*known devices: .*CPU"):
        Device["TPU"]
    with pytest.raises(ValueError, match="non-negative integer"):
        Device.canonicalize("CPU:x")


def test_registry_default(monkeypatch):
    monkeypatch.setenv("DEV", "cpu")
    assert Device.DEFAULT == "CPU"
    monkeypatch.setenv("DEV", "nope")
    with pytest.raises(ValueError, match="unknown device"):
        _ = Device.DEFAULT
    monkeypatch.delenv("DEV")
    assert Device.DEFAULT in Device.known


def test_registry_instance_is_shared():
    dev = Device["cpu"]
    assert dev is Device["CPU"] and dev.name == "CPU"


def test_a_tensor_of_a_closed_device_raises_instead_of_crashing() -> None:
    # NV used to segfault here (its signal memory is unmapped by close); every device must raise the same way
    import numpy as np

    from rawgrad import Tensor
    from rawgrad.hcq import Device, DeviceClosedError
    from rawgrad.tensor.tensor import DEFAULT_DEVICE
    # a second instance of the default kind: closing the default one would break other modules' tensors
    dev = DEFAULT_DEVICE.split(":")[0] + ":7"
    t = (Tensor(np.arange(4, dtype=np.float32), device=dev) * 2).realize()
    Device.close(dev)
    with pytest.raises(DeviceClosedError, match=r"was closed \(Device.close"):
        t.numpy()
    with pytest.raises(DeviceClosedError):
        (t + 1).numpy()
    again = Tensor(np.arange(4, dtype=np.float32), device=dev) * 3
    np.testing.assert_array_equal(again.numpy(), [0, 3, 6, 9])
    Device.close(dev)
