"""Several Python threads sharing one device: eager ops, one TinyJit shared by every thread and one TinyJit
per thread, all checked against numpy; then the device must still work. And a capture in one thread must
not record the kernels another thread launches meanwhile.

Under DEV=NV (the mock GPU interprets every kernel, so it is slow) the op count is much smaller.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rawgrad import Device, Tensor
from rawgrad.jit import TinyJit

ON_NV = os.environ.get("DEV", "").upper().startswith("NV")
THREADS = 4
OPS_PER_THREAD = 200 if ON_NV else 2000
# A thread that has not finished by then is wedged (a healthy run takes a few seconds on the CPU); joining
# with a deadline keeps a hang a failure instead of a stuck test run.
JOIN_TIMEOUT_S = 600.0 if ON_NV else 120.0
SHAPE = (4, 8)


def _run_threads(targets: list[Callable[[], None]], timeout_s: float) -> None:
    """Start every target together, join them within one deadline; re-raise the first error."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrapped(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait()
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)
        return run

    threads = [threading.Thread(target=wrapped(t), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    stuck = sum(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    assert stuck == 0, f"{stuck} thread(s) still running after {timeout_s} s: the device is wedged"


def _shared_fn(x: Tensor, y: Tensor) -> Tensor:
    return x * y + 3


def test_threads_mixed_ops_share_one_device() -> None:
    shared = TinyJit(_shared_fn)
    done = [0] * THREADS
    dev = Device[Device.DEFAULT]
    stop = threading.Event()
    backwards: list[tuple[int, int]] = []

    def watch_timeline() -> None:
        """The timeline signal must never go backwards (submissions signal it in the order they reserved)."""
        last = dev.timeline_signal.value
        while not stop.is_set():
            now = dev.timeline_signal.value
            if now < last:
                backwards.append((last, now))
            last = now
            time.sleep(0.0005)

    def worker(tid: int) -> Callable[[], None]:
        def own_fn(x: Tensor) -> Tensor:
            return (x + tid) * (tid + 2) - 1  # tid is baked in: each thread has its own capture

        own = TinyJit(own_fn)

        def run() -> None:
            rng = np.random.default_rng(tid)
            for i in range(OPS_PER_THREAD):
                kind = i % 6
                a = rng.integers(-50, 50, size=SHAPE).astype(np.int32)
                b = rng.integers(-50, 50, size=SHAPE).astype(np.int32)
                what = f"thread {tid} op {i} (kind {kind})"
                if kind == 0:  # the report's loop: eager elementwise, read back at once
                    np.testing.assert_array_equal((Tensor(a) * 2 + 1).numpy(), a * 2 + 1, err_msg=what)
                elif kind == 1:  # reduce
                    np.testing.assert_array_equal(Tensor(a).sum(axis=1).numpy(), a.sum(axis=1), err_msg=what)
                elif kind == 2:  # matmul on floats
                    x = rng.standard_normal(SHAPE).astype(np.float32)
                    w = rng.standard_normal(SHAPE[::-1]).astype(np.float32)
                    np.testing.assert_allclose((Tensor(x) @ Tensor(w)).numpy(), x.astype(np.float64) @ w,
                                               rtol=1e-5, atol=1e-5, err_msg=what)
                elif kind in (3, 4):  # the TinyJit every thread calls
                    got = shared(Tensor(a), Tensor(b)).numpy()
                    np.testing.assert_array_equal(got, a * b + 3, err_msg=what)
                else:  # this thread's own TinyJit
                    np.testing.assert_array_equal(own(Tensor(a)).numpy(), (a + tid) * (tid + 2) - 1,
                                                  err_msg=what)
                done[tid] += 1
        return run

    watcher = threading.Thread(target=watch_timeline, daemon=True)
    watcher.start()
    try:
        _run_threads([worker(t) for t in range(THREADS)], JOIN_TIMEOUT_S)
    finally:
        stop.set()
        watcher.join(5)
    assert done == [OPS_PER_THREAD] * THREADS
    assert not backwards, f"the timeline signal went backwards: {backwards[:5]}"
    assert shared.replays > 0 and len(shared.captures) == 1
    # the device is still healthy: a final op works and the timeline drains
    np.testing.assert_array_equal((Tensor(np.arange(6, dtype=np.int32)) + 1).numpy(), np.arange(1, 7))
    dev.synchronize(timeout_s=10)
    assert dev.timeline_signal.value == dev.timeline_value - 1


def test_capture_records_only_its_own_thread() -> None:
    capturing = threading.Event()  # thread A is inside its capture
    b_ran = threading.Event()  # thread B launched (and read back) its kernels meanwhile
    state: dict[str, Any] = {"hold": False}

    def a_fn(x: Tensor) -> Tensor:
        y = (x * 5).realize()  # a kernel launched while the capture records
        if state["hold"]:
            capturing.set()
            assert b_ran.wait(60), "thread B never ran"
        return y + 2

    # The same function captured with nobody else running: how many kernels its capture holds.
    alone = TinyJit(a_fn)
    for _ in range(2):
        alone(Tensor(np.arange(8, dtype=np.int32))).numpy()
    assert alone.last is not None

    jit = TinyJit(a_fn)
    b_results: list[tuple[Tensor, np.ndarray]] = []

    def thread_a() -> None:
        rng = np.random.default_rng(1)
        jit(Tensor(np.arange(8, dtype=np.int32))).numpy()  # eager call
        state["hold"] = True
        try:
            jit(Tensor(np.arange(8, dtype=np.int32))).numpy()  # the capture, while B runs
        finally:
            state["hold"] = False
        assert jit.last is not None
        assert jit.last.kernel_count == alone.last.kernel_count, "a capture recorded another thread's kernels"
        for _ in range(5):
            a = rng.integers(-100, 100, size=8).astype(np.int32)
            np.testing.assert_array_equal(jit(Tensor(a)).numpy(), a * 5 + 2)

    def thread_b() -> None:
        assert capturing.wait(60), "thread A never started its capture"
        try:
            rng = np.random.default_rng(2)
            for _ in range(3):
                a = rng.integers(-100, 100, size=8).astype(np.int32)
                t = Tensor(a) * 7 - 4
                # a readback here is legal: the capture (and its readback guard) belongs to thread A
                np.testing.assert_array_equal(t.numpy(), a * 7 - 4)
                b_results.append((t, a * 7 - 4))
        finally:
            b_ran.set()

    _run_threads([thread_a, thread_b], JOIN_TIMEOUT_S)
    # A's replays ran after B's kernels: they must not have rewritten B's buffers
    for t, want in b_results:
        np.testing.assert_array_equal(t.numpy(), want)
