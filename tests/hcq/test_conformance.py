"""HCQ queue conformance: every device kind in conftest.KINDS must pass each of these, written once against
the HCQ API (queues, signals, the timeline, programs, the allocator, HCQGraph) with no driver code."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from rawgrad.hcq import DeviceFault, DeviceTimeout, HCQBuffer, HCQDevice, HWQueue, Signal
from rawgrad.hcq.graph import CopyCommand, HCQGraph, KernelCommand, address_var, build_template
from rawgrad.hcq.signal import device_clock

from .conftest import SMALL_RING_SLOTS, TIMEOUT_S, DeviceKind
from .kernels import MAX_N, ScaleAdd, download, scale_add, upload

# A host wait that is expected to time out: long enough that a healthy device is not mistaken for a hang.
SHORT_S = 0.2
# How long the host holds a gate shut while the device (or a submit) waits on it.
HOLD_S = 0.15


@pytest.fixture(scope="module")
def kernel(device: HCQDevice) -> ScaleAdd:
    return scale_add(device)


def _inputs(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-1000, 1000, MAX_N, dtype=np.int32)


def _zeros(dev: HCQDevice) -> HCQBuffer:
    return upload(dev, np.zeros(MAX_N, np.int32))


def _open_gate_later(signal: Signal, value: int, after_s: float = HOLD_S) -> threading.Timer:
    timer = threading.Timer(after_s, lambda: setattr(signal, "value", value))
    timer.start()
    return timer


# ------------------------------------------------------------------------------ signals and the timeline
def test_timeline_values_are_consecutive_and_the_signal_never_goes_back(device: HCQDevice) -> None:
    tl = device.timeline_signal
    device.synchronize(TIMEOUT_S)
    first = device.timeline_value
    seen = [tl.value]
    values = []
    for _ in range(20):
        values.append(device.timeline_submit()[0])
        seen.append(tl.value)
    device.synchronize(TIMEOUT_S)
    seen.append(tl.value)
    assert values == list(range(first, first + 20)) and device.timeline_value == first + 20
    assert seen == sorted(seen) and seen[-1] == values[-1]


def test_wait_and_signal_order_work_across_queues(device: HCQDevice) -> None:
    gate, mid, done = (device.new_signal(0, name=n) for n in ("gate", "mid", "done"))
    first = device.queue().wait(gate, 2).signal(mid, 5)  # held by the host
    second = device.queue().wait(mid, 5).signal(done, 7)  # held by the first queue
    first.submit(device)
    second.submit(device)
    time.sleep(0.02)
    assert (mid.value, done.value) == (0, 0)  # both really wait
    gate.value = 3  # >= 2: a wait is satisfied by any value at or past its target
    done.wait(7, TIMEOUT_S, queue=second.name, check=device.check_fault)
    assert (mid.value, done.value) == (5, 7)
    # the timeline orders work too: a queue submitted after others starts after they finished
    out = device.new_signal(0, name="after")
    value, _ = device.timeline_submit(lambda q: q.signal(out, mid.value + done.value))
    device.timeline_signal.wait(value, TIMEOUT_S, check=device.check_fault)
    assert out.value == 12


# ------------------------------------------------------------------------------ timestamps
def test_timestamps_are_monotonic_nanoseconds(device: HCQDevice, kernel: ScaleAdd) -> None:
    stamps = [device.new_signal(name=f"t{i}") for i in range(4)]
    x, out = upload(device, _inputs()), _zeros(device)
    device.synchronize(TIMEOUT_S)
    h0 = time.perf_counter_ns()
    device.timeline_submit(lambda q: q.timestamp(stamps[0]).exec(kernel.program, [out, x, 64], (64, 1, 1))
                           .timestamp(stamps[1]))
    device.synchronize(TIMEOUT_S)
    time.sleep(0.05)  # a host-measured gap the device clock must see as about 50 ms
    device.timeline_submit(lambda q: q.timestamp(stamps[2]).memory_barrier().timestamp(stamps[3]))
    device.synchronize(TIMEOUT_S)
    wall_ns = time.perf_counter_ns() - h0
    t = [device_clock(device).ticks_to_ns(s.timestamp) for s in stamps]  # device ticks -> ns (AMD: 10 ns)
    assert 0 < t[0] <= t[1] <= t[2] <= t[3], t
    gap_ns = t[2] - t[1]
    assert 0.5 * 50e6 <= gap_ns <= wall_ns, f"device clock not in ns: {gap_ns} ns for a 50 ms host sleep"
    assert t[3] - t[0] <= wall_ns


# ------------------------------------------------------------------------------ kernels
@pytest.mark.parametrize("n, local", [(1, (1, 1, 1)), (100, (1, 1, 1)), (MAX_N, (1, 1, 1)), (96, (32, 1, 1)),
                                      (200, (64, 1, 1))])
def test_exec_1d(device: HCQDevice, kernel: ScaleAdd, n: int, local: tuple[int, int, int]) -> None:
    x_np = _inputs(n)
    x, out = upload(device, x_np), _zeros(device)
    device.timeline_submit(lambda q: q.exec(kernel.program, [out, x, n], (n, 1, 1), local))
    got = download(device, out)
    np.testing.assert_array_equal(got[:n], ScaleAdd.expected(x_np, n))
    assert not got[n:].any(), "the launch wrote past its global size"
    device.allocator.free(x)
    device.allocator.free(out)


@pytest.mark.parametrize("global_size, local", [((16, 4, 1), (4, 2, 1)), ((8, 4, 2), (2, 2, 2)),
                                                 ((10, 3, 1), (4, 2, 1)), ((3, 5, 7), (2, 2, 2))],
                         ids=["2d", "3d", "2d-ragged", "3d-ragged"])
def test_exec_multidimensional(fresh: Callable[..., HCQDevice], global_size: tuple[int, int, int],
                               local: tuple[int, int, int]) -> None:
    """A kernel indexes by all three dimensions: every one of its n = x*y*z indices runs exactly once, also
    when the local size does not divide the global size (the grid rounds up; the extra threads do nothing)."""
    dev = fresh()  # a launch shape a kernel was not built for may fault the device
    kernel = scale_add(dev)
    n = int(np.prod(global_size))
    x_np = _inputs(n)
    x, out = upload(dev, x_np), _zeros(dev)
    dev.timeline_submit(lambda q: q.exec(kernel.program, [out, x, n], global_size, local))
    got = download(dev, out)
    np.testing.assert_array_equal(got[:n], ScaleAdd.expected(x_np, n))
    assert not got[n:].any(), "the launch wrote past the kernel's global size"


def test_exec_covers_only_the_kernels_global_size(device: HCQDevice, kernel: ScaleAdd) -> None:
    """A launch wider than the kernel's global size (n) runs nothing past it, on every device."""
    n = 37
    x_np = _inputs(5)
    x, out = upload(device, x_np), _zeros(device)
    device.timeline_submit(lambda q: q.exec(kernel.program, [out, x, n], (8, 4, 2)))  # 64 threads, n = 37
    got = download(device, out)
    np.testing.assert_array_equal(got[:n], ScaleAdd.expected(x_np, n))
    assert not got[n:].any(), "threads past the kernel's global size wrote"


def test_exec_takes_the_block_from_the_launch_contract(device: HCQDevice, kernel: ScaleAdd) -> None:
    contract = kernel.program.launch
    assert contract is not None and contract.buffers == 2 and contract.scalars == (kernel.n,)
    assert contract.global_size == (kernel.n, 1, 1)
    assert device.target is not None and contract.local_size == device.target.local_size(kernel.n)
    x_np = _inputs(6)
    x, out = upload(device, x_np), _zeros(device)
    device.timeline_submit(lambda q: q.exec(kernel.program, [out, x, 200], (200, 1, 1)))  # no local size
    np.testing.assert_array_equal(download(device, out)[:200], ScaleAdd.expected(x_np, 200))


@pytest.mark.parametrize("local", [(0, 1, 1), (4, 1), (2.0, 1, 1)], ids=["zero", "2-d", "float"])
def test_exec_refuses_a_bad_local_size(device: HCQDevice, kernel: ScaleAdd, local: tuple) -> None:
    with pytest.raises(ValueError, match="local"):
        device.queue().exec(kernel.program, [0, 0, 4], (4, 1, 1), local)


def test_exec_refuses_a_wrong_argument_count(device: HCQDevice, kernel: ScaleAdd) -> None:
    with pytest.raises(ValueError, match="2 buffers and 1 scalars"):
        device.queue().exec(kernel.program, [0, 0], (4, 1, 1))


# ------------------------------------------------------------------------------ copies
@pytest.mark.parametrize("nbytes", [1, 4, 1000, 4099])
def test_copies_host_to_device_to_device_to_host(device: HCQDevice, nbytes: int) -> None:
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    src = upload(device, data)
    dst = upload(device, np.zeros(nbytes + 64, np.uint8))
    np.testing.assert_array_equal(download(device, src, np.uint8), data)  # host -> device -> host
    # device -> device, into the middle of the destination
    device.timeline_submit(lambda q: q.copy(dst.va_addr + 32, src.va_addr, nbytes))
    got = download(device, dst, np.uint8)
    np.testing.assert_array_equal(got[32:32 + nbytes], data)
    assert not got[:32].any() and not got[32 + nbytes:].any(), "the copy wrote outside its range"
    device.allocator.free(src)
    device.allocator.free(dst)


def test_memory_barrier_makes_a_kernel_result_visible_to_a_copy(device: HCQDevice, kernel: ScaleAdd) -> None:
    x_np = _inputs(7)
    x, out, copy = upload(device, x_np), _zeros(device), _zeros(device)
    gate = device.new_signal(0, name="gate")
    # the whole sequence is queued before the gate opens, so nothing runs early by accident
    device.timeline_submit(lambda q: q.wait(gate, 1).exec(kernel.program, [out, x, MAX_N], (MAX_N, 1, 1))
                           .memory_barrier().copy(copy.va_addr, out.va_addr, 4 * MAX_N))
    gate.value = 1
    np.testing.assert_array_equal(download(device, copy), ScaleAdd.expected(x_np, MAX_N))


# ------------------------------------------------------------------------------ bound replay
def test_bound_replay_patches_arguments_and_launch_sizes(device: HCQDevice, kernel: ScaleAdd) -> None:
    src, dst, mid = address_var("conformance.src"), address_var("conformance.dst"), address_var("conf.mid")
    n = kernel.n
    template, programs = build_template(device, [KernelCommand(kernel.program, [mid, src, n], n),
                                                 CopyCommand(dst, mid, 4 * n)])
    graph = HCQGraph(device, template, programs, {})
    assert {src, dst, mid, n} <= set(graph.patch_variables)
    inputs = [_inputs(seed) for seed in range(3)]
    xs = [upload(device, a) for a in inputs]
    mids, outs = [_zeros(device) for _ in range(3)], [_zeros(device) for _ in range(3)]
    runs = [(0, 0, 5), (1, 2, 200), (2, 1, 1), (0, 0, 77)]  # (input, output, n): every operand changes
    for i, (k, o, size) in enumerate(runs):
        value = graph.submit({src: xs[k].va_addr, mid: mids[o].va_addr, dst: outs[o].va_addr, n: size})
        assert value == device.timeline_value - 1
        device.synchronize(TIMEOUT_S)
        got = download(device, outs[o])
        np.testing.assert_array_equal(got[:size], ScaleAdd.expected(inputs[k], size), err_msg=f"replay {i}")
    # the last replay wrote only its 77 elements over what the first wrote (n = 5)
    assert not download(device, outs[1])[200:].any()
    with pytest.raises(ValueError):
        graph.submit({src: xs[0].va_addr, mid: mids[0].va_addr, dst: outs[0].va_addr, n: MAX_N + 1})
    device.synchronize(TIMEOUT_S)  # a refused replay left no gap in the timeline


# ------------------------------------------------------------------------------ rings, timeouts, faults
def test_ring_wraps_under_backpressure_and_work_completes_in_order(fresh: Callable[..., HCQDevice]) -> None:
    dev = fresh(ring_slots=SMALL_RING_SLOTS)
    gate, seq = dev.new_signal(0, name="gate"), dev.new_signal(0, name="sequence")
    dev.timeline_submit(lambda q: q.wait(gate, 1))  # the device stalls here
    timer = _open_gate_later(gate, 1)
    count = 8 * SMALL_RING_SLOTS  # many times the ring: submits must wait for space, not overwrite
    t0 = time.perf_counter()
    try:
        for i in range(1, count + 1):
            # each queue only proceeds if the one before it ran: out of order would hang, not pass
            dev.timeline_submit(lambda q, i=i: q.wait(seq, i - 1).signal(seq, i))
    finally:
        timer.cancel()
    assert time.perf_counter() - t0 >= 0.5 * HOLD_S, "the ring never filled: the test proves nothing"
    dev.synchronize(TIMEOUT_S)
    assert seq.value == count and dev.timeline_signal.value == dev.timeline_value - 1


def test_host_wait_timeout_names_device_queue_and_values(device: HCQDevice) -> None:
    gate = device.new_signal(0, name="gate")
    value, q = device.timeline_submit(lambda q: q.wait(gate, 1))
    try:
        with pytest.raises(DeviceTimeout) as info:
            device.timeline_signal.wait(value, SHORT_S, queue=q.name, check=device.check_fault)
        e = info.value
        assert (e.device, e.queue, e.expected, e.timeout_s) == (device.name, q.name, value, SHORT_S)
        assert e.current < value and q.name in str(e) and isinstance(e, TimeoutError)
        with pytest.raises(DeviceTimeout, match="synchronize"):
            device.synchronize(SHORT_S)
    finally:
        gate.value = 1
    device.synchronize(TIMEOUT_S)


def test_full_ring_timeout_names_the_queue(fresh: Callable[..., HCQDevice]) -> None:
    dev = fresh(ring_slots=SMALL_RING_SLOTS, timeout_s=SHORT_S)
    gate = dev.new_signal(0, name="gate")
    dev.timeline_submit(lambda q: q.wait(gate, 1))
    queues: list[HWQueue] = []
    with pytest.raises(DeviceTimeout) as info:
        for _ in range(4 * SMALL_RING_SLOTS):
            queues.append(dev.queue().signal(gate, 0))  # (never reached: the device waits for the gate)
            queues[-1].submit(dev)
    e = info.value
    assert e.device == dev.name and queues[-1].name in e.queue, e
    gate.value = 1


def test_device_fault_is_reported_as_device_fault(kind: DeviceKind, fresh: Callable[..., HCQDevice]) -> None:
    dev = fresh(timeout_s=SHORT_S)
    dev.timeline_submit(queue=kind.faulting_queue(dev))
    with pytest.raises(DeviceFault):
        dev.synchronize(TIMEOUT_S)  # reported as a fault, well before the timeout
    with pytest.raises(DeviceFault):
        dev.timeline_submit()  # a faulted device refuses new work instead of queueing it behind the fault
