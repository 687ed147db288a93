"""Signals and device time for every kind of device: memory-word signals (with `compare_bits` and a
driver-event wait hook), object signals (an API value with no memory word, as Metal's MTLSharedEvent),
`DeviceClock.ticks_to_ns`, and the profiler on a device that cannot timestamp kernels inside a replay.

The object-signal, patch-hook and clock paths run on `ApiDevice` below: a small test device in the shape of
an API-driven GPU (signals are event objects, a queue is a command buffer run by a worker thread, a bound
queue is an "indirect command buffer" changed only through setter calls, time is the command buffer's start
and end in seconds). It is test code, not a driver.
"""
from __future__ import annotations

import queue as queue_mod
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rawgrad.compiler.ir import Variable
from rawgrad.drivers.cpu.device import CPUDevice
from rawgrad.hcq import signal as signal_mod
from rawgrad.hcq.allocator import Allocator, HCQBuffer
from rawgrad.hcq.device import HCQDevice
from rawgrad.hcq.errors import DeviceFault, DeviceTimeout
from rawgrad.hcq.patch import PatchHook
from rawgrad.hcq.profile import EAGER, REPLAY, Profiler, launch
from rawgrad.hcq.program import Program
from rawgrad.hcq.queue import HWQueue, Value
from rawgrad.hcq.signal import NS_CLOCK, DeviceClock, ObjectSignal, Signal, device_clock

# Command opcodes of the test queue's words: [op, operand, operand] per command.
OP_WAIT, OP_SIGNAL, OP_TIMESTAMP, OP_EXEC = 1, 2, 3, 4
WORDS_PER_COMMAND = 3
# Metal reports a command buffer's GPUStartTime / GPUEndTime in seconds, and an indirect command buffer
# cannot timestamp each of its kernels.
SECONDS_CLOCK = DeviceClock("s", 1e9, kernel_timestamps_in_replay=False)


class SharedEvent:
    """Stands in for MTLSharedEvent: a 64-bit value behind an API, with a blocking wait."""

    def __init__(self, value: int = 0) -> None:
        self._value = value
        self._cond = threading.Condition()
        self.blocking_waits = 0  # how often a host waiter blocked in the API

    @property
    def signaled_value(self) -> int:
        with self._cond:
            return self._value

    @signaled_value.setter
    def signaled_value(self, value: int) -> None:
        with self._cond:
            self._value = value
            self._cond.notify_all()

    def wait_until_signaled(self, value: int, timeout_s: float, *, host: bool = True) -> bool:
        with self._cond:
            self.blocking_waits += host  # (the device's own waits are not counted)
            return self._cond.wait_for(lambda: self._value >= value, timeout_s)


class EventSignal(ObjectSignal):
    """An object signal over a SharedEvent; the host's wait blocks in the event's API."""

    def __init__(self, value: int = 0, *, owner: str = "API", name: str | None = None) -> None:
        super().__init__(owner=owner, name=name)
        self.event = SharedEvent(value)

    def _read(self) -> int:
        return self.event.signaled_value

    def _write(self, value: int) -> None:
        self.event.signaled_value = value

    def _event_wait(self, value: int, seconds: float) -> None:
        self.event.wait_until_signaled(value, seconds)


class ApiProgram(Program):
    """A "kernel" that is a Python callable run by the device's worker."""

    def __init__(self, device: HCQDevice, name: str, fn: Callable[[], None]) -> None:
        super().__init__(device, name, b"")
        self.fn = fn


class ApiQueue(HWQueue):
    """Commands as words [op, object index, value]; objects (signals, programs) are referred to by index,
    as an API refers to them by handle. A bound queue's commands live in `icb`, changed only through its
    PatchHook (`set_calls` records each call)."""

    def __init__(self) -> None:
        super().__init__()
        self.objects: list[Any] = []
        self.icb: list[int] | None = None
        self.set_calls: list[tuple[int, int]] = []

    def _obj(self, obj: object) -> int:
        self.objects.append(obj)
        return len(self.objects) - 1

    def _wait(self, signal: Signal, value: Value) -> None:
        self._emit(OP_WAIT, self._obj(signal), value)

    def _signal(self, signal: Signal, value: Value) -> None:
        self._emit(OP_SIGNAL, self._obj(signal), value)

    def _timestamp(self, signal: Signal) -> None:
        self._emit(OP_TIMESTAMP, self._obj(signal), 0)

    def _exec(self, program: Program, args: list[Value], global_size: tuple[Value, ...],
              local_size: tuple[int, ...]) -> None:
        self._emit(OP_EXEC, self._obj(program), global_size[0])

    def _bind(self, device: Any) -> None:
        self.icb = list(self._words)
        self._bound_words = PatchHook(self._set_command_word)

    def _set_command_word(self, index: int, word: int) -> None:
        assert self.icb is not None
        self.set_calls.append((index, word))
        self.icb[index] = word

    def _submit(self, device: Any) -> None:
        assert isinstance(device, ApiDevice)
        words = list(self.icb) if self.icb is not None else list(self._words)
        device.commit(words, list(self.objects))

    def _copy(self, dst: Value, src: Value, nbytes: Value) -> None:
        raise NotImplementedError("the API test device has no memory")

    def _memory_barrier(self) -> None:
        pass


class ApiAllocator(Allocator):
    def _alloc(self, nbytes: int) -> HCQBuffer:
        raise NotImplementedError("the API test device has no memory")


class ApiDevice(HCQDevice):
    """Runs each submitted queue as one command buffer on a worker thread, in order."""

    clock = SECONDS_CLOCK

    def __init__(self, name: str = "API") -> None:
        self._buffers: queue_mod.Queue[tuple[list[int], list[Any]] | None] = queue_mod.Queue()
        self._fault: BaseException | None = None
        super().__init__(name, ApiAllocator())
        self._worker = threading.Thread(target=self._run, name=f"{name} worker", daemon=True)
        self._worker.start()

    def new_signal(self, value: int = 0, name: str | None = None) -> Signal:
        return EventSignal(value, owner=self.name, name=name)  # type: ignore[return-value]

    def queue(self) -> ApiQueue:
        return ApiQueue()

    def check_fault(self) -> None:
        if self._fault is not None:
            raise DeviceFault(f"{self.name}: {self._fault!r}")

    def commit(self, words: list[int], objects: list[Any]) -> None:
        self.check_fault()
        self._buffers.put((words, objects))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._buffers.put(None)
            self._worker.join(5.0)

    def _run(self) -> None:
        while (item := self._buffers.get()) is not None:
            try:
                self._run_buffer(*item)
            except BaseException as e:  # the device stops, as a GPU channel would after a fault
                self._fault = e
                return

    @staticmethod
    def _run_buffer(words: list[int], objects: list[Any]) -> None:
        """One command buffer: its first timestamp command gets the buffer's start time and its last one
        the end time (seconds, as Metal's GPUStartTime / GPUEndTime); those in between are not written."""
        commands = [words[i:i + WORDS_PER_COMMAND] for i in range(0, len(words), WORDS_PER_COMMAND)]
        stamps = [k for k, (op, _, _) in enumerate(commands) if op == OP_TIMESTAMP]
        start = time.perf_counter()
        for k, (op, obj, value) in enumerate(commands):
            if op == OP_WAIT:
                signal: EventSignal = objects[obj]
                while not signal.event.wait_until_signaled(value, 1.0, host=False):
                    pass
            elif op == OP_SIGNAL:
                objects[obj].value = value
            elif op == OP_EXEC:
                objects[obj].fn()
            elif op == OP_TIMESTAMP and stamps and k == stamps[0] and len(stamps) > 1:
                objects[obj].record_timestamp(start)
            elif op == OP_TIMESTAMP and stamps and k == stamps[-1]:
                objects[obj].record_timestamp(time.perf_counter())


# ------------------------------------------------------------------------------ fixtures
KERNEL_S = 0.003  # how long a test kernel runs: long enough to see in a timestamp, short for the suite
TIMEOUT_S = 10.0


@pytest.fixture
def api() -> Iterator[ApiDevice]:
    dev = ApiDevice()
    yield dev
    dev.close()


@pytest.fixture
def profiler() -> Iterator[Any]:
    from rawgrad.hcq.profile import PROFILER
    PROFILER.reset()
    yield PROFILER
    PROFILER.reset()


def _sleeper(dev: HCQDevice, name: str) -> ApiProgram:
    return ApiProgram(dev, name, lambda: time.sleep(KERNEL_S))


# ------------------------------------------------------------------------------ memory-word signals
def test_memory_signal_compare_bits_bounds_the_values_it_takes() -> None:
    s = Signal(5, compare_bits=32, name="amd-like")
    assert s.compare_bits == 32 and Signal().compare_bits == 64
    s.wait(5, 0.01)  # already reached: no check needed
    with pytest.raises(ValueError, match="amd-like.*does not fit the 32 bits"):
        s.wait(1 << 32, 0.01)  # the device could never see it: an error, not a 0.01 s timeout
    with pytest.raises(ValueError, match="does not fit the 32 bits"):
        Signal(1 << 32, compare_bits=32)
    with pytest.raises(ValueError, match="compare_bits"):
        Signal(compare_bits=65)


def test_memory_signal_event_wait_replaces_the_sleep() -> None:
    woken = threading.Event()
    calls: list[tuple[int, float]] = []

    def event_wait(value: int, seconds: float) -> None:  # a driver's interrupt wait (KFD WAIT_EVENTS)
        calls.append((value, seconds))
        woken.wait(seconds)

    s = Signal(0, name="gpu", event_wait=event_wait)
    timer = threading.Timer(0.05, lambda: (setattr(s, "value", 3), woken.set()))
    timer.start()
    s.wait(3, TIMEOUT_S)
    timer.join()
    assert s.value == 3 and calls and all(v == 3 and 0 < t <= signal_mod.SLEEP_CAP_S for v, t in calls)


def test_memory_signal_event_wait_still_times_out_with_names() -> None:
    s = Signal(0, owner="AMD", name="gate", event_wait=lambda value, seconds: time.sleep(seconds))
    with pytest.raises(DeviceTimeout) as info:
        s.wait(1, 0.05, queue="q7")
    e = info.value
    assert (e.device, e.queue, e.signal, e.expected, e.current) == ("AMD", "q7", "gate", 1, 0)


# ------------------------------------------------------------------------------ object signals
def test_object_signal_value_lives_behind_the_api() -> None:
    s = EventSignal(4, name="shared event")
    assert s.value == 4 and s.event.signaled_value == 4
    s.value = 9
    assert s.event.signaled_value == 9
    with pytest.raises(TypeError, match="shared event.*object signal: it has no memory word"):
        _ = s.address
    with pytest.raises(ValueError, match="does not fit"):
        s.value = -1


def test_a_memory_word_queue_refuses_an_object_signal() -> None:
    dev = CPUDevice("CPU:obj", threads=1)
    try:
        with pytest.raises(TypeError, match="object signal"):
            dev.queue().wait(EventSignal(0, name="metal event"), 1)
    finally:
        dev.close()


def test_object_signal_wait_blocks_in_the_api() -> None:
    s = EventSignal(0, name="ev")
    timer = threading.Timer(0.05, lambda: setattr(s, "value", 2))
    timer.start()
    s.wait(2, TIMEOUT_S)
    timer.join()
    assert s.value == 2 and s.event.blocking_waits >= 1


def test_object_signal_wait_times_out_naming_it() -> None:
    s = EventSignal(1, owner="METAL", name="ev")
    with pytest.raises(DeviceTimeout) as info:
        s.wait(2, 0.05, queue="command buffer 3")
    assert (info.value.device, info.value.queue, info.value.signal, info.value.current) == (
        "METAL", "command buffer 3", "ev", 1)


def test_api_device_runs_the_timeline_on_object_signals(api: ApiDevice) -> None:
    assert isinstance(api.timeline_signal, EventSignal)
    gate = api.new_signal(0, name="gate")
    ran: list[int] = []
    prog = ApiProgram(api, "mark", lambda: ran.append(len(ran)))
    api.timeline_submit(lambda q: q.wait(gate, 1).exec(prog, []))
    api.timeline_submit(lambda q: q.exec(prog, []))
    time.sleep(0.02)
    assert ran == []  # the device waits on the gate, an object signal
    timeline: Any = api.timeline_signal
    host_waits = timeline.event.blocking_waits
    timer = threading.Timer(0.05, lambda: setattr(gate, "value", 1))
    timer.start()
    api.synchronize(TIMEOUT_S)  # through the timeline's event wait
    timer.join()
    assert ran == [0, 1] and api.timeline_signal.value == api.timeline_value - 1
    assert timeline.event.blocking_waits > host_waits  # the host waited in the event's API, not a sleep


def test_bound_queue_patches_go_through_the_hook(api: ApiDevice) -> None:
    """A bound queue's changed values reach the device only as setter calls (PatchHook), on both patch
    paths: the generated writer (`_write_changed_words`, the replay path) and the generic submit."""
    n = Variable("n", 0, 1000)
    out = api.new_signal(0, name="out")
    q = api.queue()
    wait_v, signal_v = Variable("w", 0, 2**62), Variable("s", 0, 2**62)
    q.wait(api.timeline_signal, wait_v).signal(out, n).signal(api.timeline_signal, signal_v).bind(api)
    for k, value in enumerate([7, 7, 12]):
        q.set_calls.clear()
        api.timeline_replay(lambda v, val: q.submit(api, {n: val, wait_v: v - 1, signal_v: v}), value)
        api.synchronize(TIMEOUT_S)
        assert out.value == value
        changed = {i for i, _ in q.set_calls}
        # the first replay sets all three values; the second only the timeline pair; the third also n
        assert len(changed) == [3, 2, 3][k], q.set_calls
    q.set_calls.clear()
    q._write_changed_words({n: 12, wait_v: 0, signal_v: 1})  # the generated writer: only wait/signal moved
    assert sorted(w for _, w in q.set_calls) == [0, 1] and q.icb is not None
    assert all(q.icb[i] == w for i, w in q.set_calls)


# ------------------------------------------------------------------------------ device time
def test_ticks_to_ns_per_clock() -> None:
    assert NS_CLOCK.ticks_to_ns(1234) == 1234
    amd = DeviceClock("10-ns tick", 10)  # AMD's 100 MHz counter
    assert amd.ticks_to_ns(1234) == 12340 and isinstance(amd.ticks_to_ns(2**62), int)
    assert amd.ticks_to_ns(2**62) == 10 * 2**62  # exact: no float rounding for integer clocks
    assert SECONDS_CLOCK.ticks_to_ns(1.5) == 1_500_000_000 and SECONDS_CLOCK.ticks_to_ns(2e-6) == 2000


def test_device_clock_defaults_to_ns(api: ApiDevice) -> None:
    cpu = CPUDevice("CPU:clock", threads=1)
    try:
        assert device_clock(cpu) is NS_CLOCK and NS_CLOCK.kernel_timestamps_in_replay
    finally:
        cpu.close()
    assert device_clock(api) is SECONDS_CLOCK and not SECONDS_CLOCK.kernel_timestamps_in_replay


def test_profiler_converts_eager_timestamps_to_ns(api: ApiDevice, profiler: Profiler) -> None:
    prog = _sleeper(api, "sleepy")
    t0 = time.perf_counter_ns()
    seconds = launch(prog, [], (1, 1, 1), wait=True)
    t1 = time.perf_counter_ns()
    assert seconds is not None and KERNEL_S <= seconds < 1.0
    launch(prog, [], (1, 1, 1))
    events = profiler.events()
    assert [e.kind for e in events] == [EAGER, EAGER] and [e.name for e in events] == ["sleepy", "sleepy"]
    for e in events:  # the device's seconds became ns on the host's perf_counter scale
        assert KERNEL_S * 1e9 <= e.duration_ns < 1e9 and t0 <= events[0].start_ns <= t1


def test_profiler_reports_a_whole_replay_when_kernels_cannot_be_timestamped(api: ApiDevice,
                                                                          profiler: Profiler) -> None:
    """On a device whose clock has kernel_timestamps_in_replay=False only a bound queue's first and last
    timestamps are written (its command buffer's start and end): the profiler reports one row per replay,
    naming its kernels, instead of per-kernel rows read from stamps that were never written."""
    a, b = _sleeper(api, "a"), _sleeper(api, "b")
    pairs = [(api.new_signal(name="a start"), api.new_signal(name="a end")),
             (api.new_signal(name="b start"), api.new_signal(name="b end"))]
    wait_v, signal_v = Variable("w", 0, 2**62), Variable("s", 0, 2**62)
    q = api.queue().wait(api.timeline_signal, wait_v)
    for prog, (start, end) in zip((a, b), pairs, strict=True):
        q.timestamp(start).exec(prog, []).timestamp(end)
    q.signal(api.timeline_signal, signal_v).bind(api)
    owner = object()
    for _ in range(2):
        profiler.settle(owner)
        value, _ = api.timeline_replay(
            lambda v, arg: (v, q.submit(api, {wait_v: v - 1, signal_v: v})), None)
        profiler.add(api, value, ["a", "b"], pairs, REPLAY, q.name, owner=owner)
    events = profiler.events()
    assert len(events) == 2 and all(e.kind == REPLAY and e.kernels == ("a", "b") for e in events), events
    assert all(e.name == "replay of 2 kernels" and e.duration_ns >= 2 * KERNEL_S * 1e9 for e in events)
    assert pairs[0][1].timestamp == 0 and pairs[1][0].timestamp == 0  # the inner stamps were never written
    assert events[0].end_ns <= events[1].start_ns
    trace = profiler.chrome_trace()["traceEvents"]
    assert [t["args"]["kernels"] for t in trace if t["ph"] == "X"] == [["a", "b"], ["a", "b"]]
