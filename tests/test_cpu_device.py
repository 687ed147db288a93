"""The CPU device: every HCQ command through the native command processor."""
import threading
import time

import numpy as np
import pytest

from rawgrad.compiler.ir import UOp
from rawgrad.compiler.toolchain import host_compiler
from rawgrad.drivers.cpu import CPUDevice, CPUQueue, Op
from rawgrad.drivers.cpu.hostos import HostOS
from rawgrad.hcq import DeviceFault, DeviceTimeout

# Worker threads for the shared test device: more than the 2 cores of the CI box, and not a divisor of
# the grid sizes below, so uneven shares and oversubscription are both exercised.
TEST_THREADS = 3
# Every host wait in these tests; far above what any of them needs.
TIMEOUT_S = 10.0

# out[i] = i * args[1] + args[2] for i in [start, end)
FILL_IR = r"""
define void @fill(ptr %args, i64 %start, i64 %end) {
entry:
  %bi = load i64, ptr %args
  %buf = inttoptr i64 %bi to ptr
  %kp = getelementptr i64, ptr %args, i64 1
  %k = load i64, ptr %kp
  %cp = getelementptr i64, ptr %args, i64 2
  %c = load i64, ptr %cp
  %e = icmp ult i64 %start, %end
  br i1 %e, label %loop, label %done
loop:
  %i = phi i64 [%start, %entry], [%i1, %loop]
  %m = mul i64 %i, %k
  %v = add i64 %m, %c
  %p = getelementptr i64, ptr %buf, i64 %i
  store i64 %v, ptr %p
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %end
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""

# out[i] = start of the share that wrote it: shows how the grid was split across the workers
MARK_IR = r"""
define void @mark(ptr %args, i64 %start, i64 %end) {
entry:
  %bi = load i64, ptr %args
  %buf = inttoptr i64 %bi to ptr
  br label %loop
loop:
  %i = phi i64 [%start, %entry], [%i1, %loop]
  %p = getelementptr i64, ptr %buf, i64 %i
  store i64 %start, ptr %p
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %end
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""

# out[i] = the native thread that ran index i (pthread_self)
WHO_IR = r"""
declare i64 @pthread_self()
define void @who(ptr %args, i64 %start, i64 %end) {
entry:
  %bi = load i64, ptr %args
  %buf = inttoptr i64 %bi to ptr
  %me = call i64 @pthread_self()
  br label %loop
loop:
  %i = phi i64 [%start, %entry], [%i1, %loop]
  %p = getelementptr i64, ptr %buf, i64 %i
  store volatile i64 %me, ptr %p
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %end
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""

# out[i] = args[1] + ... + args[NSUM]: an argument list spanning several records
NSUM = 11
SUM_IR = "define void @sumargs(ptr %args, i64 %start, i64 %end) {\nentry:\n" + "".join(
    f"  %p{j} = getelementptr i64, ptr %args, i64 {j}\n  %a{j} = load i64, ptr %p{j}\n"
    for j in range(NSUM + 1)) + "  %s1 = add i64 0, %a1\n" + "".join(
    f"  %s{j} = add i64 %s{j - 1}, %a{j}\n" for j in range(2, NSUM + 1)) + r"""
  %buf = inttoptr i64 %a0 to ptr
  br label %loop
loop:
  %i = phi i64 [%start, %entry], [%i1, %loop]
  %q = getelementptr i64, ptr %buf, i64 %i
  store i64 %s""" + str(NSUM) + r""", ptr %q
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %end
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""


@pytest.fixture(scope="module")
def dev():
    d = CPUDevice("CPU:7", threads=TEST_THREADS)
    d.ring_timeout_s = TIMEOUT_S
    yield d
    d.close()


@pytest.fixture(scope="module")
def progs(dev):
    cc = host_compiler()
    return {name: dev.program(name, cc.compile(ir))
            for name, ir in (("fill", FILL_IR), ("mark", MARK_IR), ("sumargs", SUM_IR),
                                       ("who", WHO_IR))}


def read_i64(dev, buf, n):
    out = np.empty(n, dtype=np.int64)
    dev.allocator.copyout(memoryview(out), buf)
    return out


def test_exec_large_grid_every_element(dev, progs):
    n = 1_000_003
    buf = dev.allocator.alloc(n * 8)
    elapsed = progs["fill"](buf, global_size=(n, 1, 1), vals=(3, -7), wait=True)
    assert isinstance(elapsed, float) and 0 < elapsed < TIMEOUT_S
    assert np.array_equal(read_i64(dev, buf, n), np.arange(n, dtype=np.int64) * 3 - 7)
    dev.allocator.free(buf)


def test_exec_is_cut_into_one_share_per_thread(dev, progs):
    n = 100_000
    buf = dev.allocator.alloc(n * 8)
    progs["mark"](buf, global_size=(n, 1, 1))
    dev.synchronize(TIMEOUT_S)
    starts = np.unique(read_i64(dev, buf, n))
    assert starts.tolist() == [n * t // TEST_THREADS for t in range(TEST_THREADS)]
    dev.allocator.free(buf)


def test_workers_take_part(dev, progs):
    # Shares are claimed dynamically, so which thread runs which share is up to the scheduler; over a
    # few launches the workers must show up next to the front end.
    n = 1 << 18
    buf = dev.allocator.alloc(n * 8)
    seen: set[int] = set()
    for _ in range(200):
        progs["who"](buf, global_size=(n, 1, 1), wait=True)
        seen |= set(np.unique(read_i64(dev, buf, n)).tolist())
        if len(seen) == TEST_THREADS:
            break
    assert len(seen) > 1
    dev.allocator.free(buf)


def test_exec_many_arguments_and_tiny_grids(dev, progs):
    buf = dev.allocator.alloc(4 * 8)
    vals = tuple(range(10, 10 + NSUM))
    for n in (0, 1, 2, 4):  # 0: nothing runs; 1: runs inline; 2: fewer items than workers
        dev.allocator.copyin(buf, memoryview(np.full(4, -1, dtype=np.int64)))
        progs["sumargs"](buf, global_size=(n, 1, 1), vals=vals, wait=True)
        assert read_i64(dev, buf, 4).tolist() == [sum(vals)] * n + [-1] * (4 - n)
    dev.allocator.free(buf)


def test_exec_3d_global_size_runs_the_product_as_one_linear_range(dev, progs):
    # the EXEC record carries x, y and z; the processor runs x*y*z indices, x fastest (the launch contract)
    n = (250, 3, 2)
    total = n[0] * n[1] * n[2]
    buf = dev.allocator.alloc((total + 8) * 8)
    dev.allocator.copyin(buf, memoryview(np.full(total + 8, -1, dtype=np.int64)))
    progs["fill"](buf, global_size=n, vals=(2, 5), wait=True)
    got = read_i64(dev, buf, total + 8)
    assert np.array_equal(got[:total], np.arange(total, dtype=np.int64) * 2 + 5)
    assert (got[total:] == -1).all(), "the launch ran past x*y*z"
    dev.allocator.free(buf)


def test_exec_rejects_bad_launches(dev, progs):
    with pytest.raises(ValueError, match="global size"):
        dev.queue().exec(progs["fill"], [], (4, -2, 1))
    with pytest.raises(ValueError, match="local size"):
        dev.queue().exec(progs["fill"], [], (4, 2, 1), (0, 1, 1))
    with pytest.raises(TypeError, match="HCQBuffer, int or UOp"):
        dev.queue().exec(progs["fill"], [1.0], (4, 1, 1))


@pytest.mark.parametrize("nbytes", [1, 4096 + 3, 3 * 1024 * 1024 + 5])
def test_copy(dev, nbytes):
    src, dst = dev.allocator.alloc(nbytes), dev.allocator.alloc(nbytes)
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    dev.allocator.copyin(src, memoryview(data))
    v = dev.next_timeline_value()
    dev.queue().copy(dst.va_addr, src.va_addr, nbytes).signal(dev.timeline_signal, v).submit(dev)
    dev.synchronize(TIMEOUT_S)
    out = np.empty(nbytes, dtype=np.uint8)
    dev.allocator.copyout(memoryview(out), dst)
    assert np.array_equal(out, data)
    dev.allocator.free(src)
    dev.allocator.free(dst)


def test_overlapping_copy_is_a_memmove(dev):
    n = 1 << 20
    buf = dev.allocator.alloc(n + 8)
    data = np.arange(n // 8 + 1, dtype=np.int64)
    dev.allocator.copyin(buf, memoryview(data))
    v = dev.next_timeline_value()
    dev.queue().copy(buf.va_addr + 8, buf.va_addr, n).signal(dev.timeline_signal, v).submit(dev)
    dev.synchronize(TIMEOUT_S)
    out = read_i64(dev, buf, n // 8 + 1)
    assert out[0] == 0 and np.array_equal(out[1:], data[:-1])
    dev.allocator.free(buf)


def test_timestamps_are_monotonic_device_clock(dev, progs):
    a, b = dev.new_signal(name="t0"), dev.new_signal(name="t1")
    buf = dev.allocator.alloc(1 << 16)
    host_before = time.monotonic_ns()
    v = dev.next_timeline_value()
    (dev.queue().timestamp(a).exec(progs["fill"], [buf, 1, 0], (1 << 13, 1, 1)).memory_barrier()
     .timestamp(b).signal(dev.timeline_signal, v).submit(dev))
    dev.synchronize(TIMEOUT_S)
    assert host_before <= a.timestamp <= b.timestamp <= time.monotonic_ns()
    dev.allocator.free(buf)


def test_wait_on_a_host_signal(dev):
    gate, done = dev.new_signal(name="gate"), dev.new_signal(name="done")
    dev.queue().wait(gate, 2).signal(done, 1).submit(dev)
    time.sleep(0.02)
    assert done.value == 0
    gate.value = 2
    done.wait(1, TIMEOUT_S)


def test_cross_queue_wait_between_devices(dev):
    other = CPUDevice("CPU:8", threads=1)
    try:
        shared, done = dev.new_signal(name="shared"), dev.new_signal(name="done")
        dev.queue().wait(shared, 5).signal(done, 1).submit(dev)  # queue A waits ...
        time.sleep(0.02)
        assert done.value == 0
        other.queue().signal(shared, 5).submit(other)  # ... on what queue B signals later
        done.wait(1, TIMEOUT_S)
        dev.synchronize(TIMEOUT_S)
    finally:
        other.close()


def test_host_wait_on_unsignalled_value_times_out(dev):
    v = dev.next_timeline_value()
    dev.queue().signal(dev.timeline_signal, v).submit(dev)
    t0 = time.perf_counter()
    with pytest.raises(DeviceTimeout, match=r"CPU:7: .* timeline >= 1000000 \(current value"):
        dev.timeline_signal.wait(1_000_000, timeout_s=0.05)
    assert time.perf_counter() - t0 < 2


def test_bound_queue_patches_symbolic_values(dev, progs):
    n = UOp.variable("n", 1, 100)
    k = UOp.variable("k", 0, 1000)
    step = UOp.variable("step", 0, 1000)
    cap = 100
    buf = dev.allocator.alloc(cap * 8)
    sig, expr_sig = dev.new_signal(name="replay"), dev.new_signal(name="expr")
    q = (dev.queue().exec(progs["fill"], [buf, k, 1], (n, 1, 1)).signal(expr_sig, n * 1000 + k)
         .signal(sig, step).bind(dev))
    # the launch size n, the scalar k, the expression, the step
    assert [p.expr for p in q.patch_points] == [n, k, n * 1000 + k, step]
    for i, (nv, kv) in enumerate([(10, 2), (50, 2), (50, 3), (100, 0), (1, 7)], start=1):
        dev.allocator.copyin(buf, memoryview(np.full(cap, -1, dtype=np.int64)))
        q.submit(dev, {n: nv, k: kv, step: i})
        sig.wait(i, TIMEOUT_S)
        out = read_i64(dev, buf, cap)
        assert np.array_equal(out[:nv], np.arange(nv) * kv + 1) and (out[nv:] == -1).all()
        assert expr_sig.value == nv * 1000 + kv
    with pytest.raises(ValueError, match="outside its range"):
        q.submit(dev, {n: 101, k: 0, step: 9})
    with pytest.raises(RuntimeError, match="bound"):
        q.memory_barrier()
    dev.synchronize(TIMEOUT_S)
    dev.allocator.free(buf)


def test_bound_queue_back_to_back_replays(dev):
    # Patching waits for the block's previous run to retire, so quick replays never see torn values.
    v = UOp.variable("v", 0, 10**6)
    sig, log = dev.new_signal(name="count"), dev.new_signal(name="log")
    q = dev.queue().wait(sig, v).signal(log, v + 1).signal(sig, v + 1).bind(dev)
    for i in range(300):
        q.submit(dev, {v: i})
    sig.wait(300, TIMEOUT_S)
    assert log.value == 300


def test_ring_backpressure_with_a_small_ring():
    small = CPUDevice("CPU:9", threads=2, ring_records=8)
    small.ring_timeout_s = TIMEOUT_S
    try:
        sig = small.new_signal()
        for i in range(1, 501):  # 3 records each: wraps the 8-record ring ~190 times, with padding
            small.queue().wait(sig, i - 1).memory_barrier().signal(sig, i).submit(small)
        sig.wait(500, TIMEOUT_S)
        assert small.write_index >= 1500 and small.read_index == small.write_index
        with pytest.raises(ValueError, match="does not fit a ring of 8"):
            prog_args = [0] * (8 * 8)
            q = CPUQueue()
            q._record(Op.EXEC, 0, 0, len(prog_args), 8, extra=prog_args)  # 9 records
            q.submit(small)
    finally:
        small.close()


def test_full_ring_times_out_then_recovers():
    small = CPUDevice("CPU:10", threads=1, ring_records=4)
    try:
        gate, done = small.new_signal(name="gate"), small.new_signal(name="done")
        small.queue().wait(gate, 1).submit(small)
        small.ring_timeout_s = 0.05
        with pytest.raises(DeviceTimeout, match="command ring read index"):
            for i in range(10):
                small.queue().signal(done, i).submit(small)
        gate.value = 1  # the stalled WAIT retires and the ring drains
        small.ring_timeout_s = TIMEOUT_S
        small.queue().signal(done, 99).submit(small)
        done.wait(99, TIMEOUT_S)
    finally:
        small.close()


def test_unknown_record_is_a_device_fault():
    bad = CPUDevice("CPU:11", threads=1)
    try:
        q = CPUQueue()
        q._emit(0x77, 0, 0, 0, 0, 0, 0, 0)
        q._cmd_ends.append(1)
        q.submit(bad)
        with pytest.raises(DeviceFault, match="unknown opcode 119"):
            bad.timeline_signal.wait(1, TIMEOUT_S, check=bad.check_fault)
    finally:
        bad.close()


def test_allocator_cache_and_double_free(dev):
    a = dev.allocator.alloc(12345)
    addr = a.va_addr
    assert addr % 4096 == 0
    dev.allocator.free(a)
    b = dev.allocator.alloc(12345)
    assert b is a and b.va_addr == addr
    dev.allocator.as_buffer(b)[:4] = b"abcd"
    dev.allocator.free(b)
    with pytest.raises(ValueError, match="double free"):
        dev.allocator.free(b)


def test_close_releases_everything_even_when_stuck():
    hostos = HostOS()
    d = CPUDevice("CPU:12", threads=2, hostos=hostos)
    buf = d.allocator.alloc(1 << 20)
    d.allocator.free(buf)  # into the cache
    d.queue().wait(d.new_signal(), 1).submit(d)  # the front end stalls on a WAIT nobody satisfies
    t0 = time.perf_counter()
    d.close(drain_timeout_s=0.05)
    assert time.perf_counter() - t0 < 5
    assert d.closed and hostos.mapped_bytes == 0
    with pytest.raises(DeviceFault, match="closed"):
        d.synchronize(0.1)
    d.close()  # idempotent


def test_idle_device_does_not_burn_cpu(dev):
    dev.synchronize(TIMEOUT_S)
    time.sleep(0.05)  # let the spinning phase end
    c0, t0 = time.process_time(), time.perf_counter()
    time.sleep(0.3)
    busy = (time.process_time() - c0) / (time.perf_counter() - t0)
    assert busy < 0.2  # all TEST_THREADS asleep, not one core each


def test_submission_from_threads_is_not_required_but_host_waits_are(dev):
    # Waiting on signals from several host threads at once is fine (waits only read memory).
    sig = dev.new_signal()
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            sig.wait(1, TIMEOUT_S)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
    ts = [threading.Thread(target=waiter) for _ in range(3)]
    for t in ts:
        t.start()
    dev.queue().signal(sig, 1).submit(dev)
    for t in ts:
        t.join(TIMEOUT_S)
    assert not errors and not any(t.is_alive() for t in ts)


def test_retired_bound_queue_patch_checks_every_value_before_writing(dev):
    # A bound queue whose last run retired is patched by the generated writer (CPUQueue.submit's fast
    # path): a missing or out-of-range value raises before any word changes, and nothing is submitted.
    v, w = UOp.variable("v", 0, 1000), UOp.variable("w", 0, 1000)
    out = dev.new_signal(name="out")
    q = dev.queue().signal(out, v * 1000 + w).bind(dev)
    q.submit(dev, {v: 1, w: 2})
    out.wait(1002, TIMEOUT_S)  # (a bare queue is no timeline work: synchronize would not wait for it)
    dev.wait_retired(dev.write_index)
    words = q._bound_words.copy()
    written = dev.write_index
    with pytest.raises(KeyError, match="no value for variable 'w'"):
        q.submit(dev, {v: 7})
    with pytest.raises(ValueError, match="outside its range"):
        q.submit(dev, {v: 7, w: 1001})
    assert np.array_equal(q._bound_words, words) and dev.write_index == written
    q.submit(dev, {v: 3, w: 4})
    out.wait(3004, TIMEOUT_S)
    assert out.value == 3004
