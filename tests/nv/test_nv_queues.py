"""Queue encoders end to end on the mock GPU: semaphores, cross-queue waits, copies, ring backpressure,
fault detection and launch recording."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rawgrad.drivers.nv import pushbuf as pb
from rawgrad.drivers.nv.device import NVDevice
from rawgrad.drivers.nv.gpfifo import DeviceTimeout, NVChannelError, read_u32, read_u64, write_u64
from rawgrad.drivers.nv.mock import H100, MockNV

from .conftest import make_device


def view(addr: int, n: int) -> np.ndarray:
    import cffi

    ffi = cffi.FFI()
    return np.frombuffer(ffi.buffer(ffi.cast("char *", addr), n), dtype=np.uint8)


def test_release_writes_payload_and_timestamp(dev: NVDevice) -> None:
    sig = dev.alloc_signal()
    before = dev.read_timer_ns()
    dev.compute.submit(pb.sem_release(pb.PushBuffer(), dev.host, sig, 0x1234_5678_9ABC))
    dev.wait_signal(sig, 0x1234_5678_9ABC, timeout_s=5)
    assert read_u64(sig) == 0x1234_5678_9ABC
    assert before <= read_u64(sig + 8) <= dev.read_timer_ns()
    assert dev.compute.gp_get() == dev.compute.put  # GPGet caught up with GPPut
    rec = dev.alloc_signal()
    dev.copy.submit(pb.timestamp(pb.PushBuffer(), dev.host, rec))
    dev.copy.wait_idle()
    assert read_u64(rec) == 0 and read_u64(rec + 8) >= read_u64(sig + 8)


def test_cross_queue_wait_really_waits(dev: NVDevice) -> None:
    gate, out = dev.alloc_signal(), dev.alloc_signal()
    # copy queue: wait for gate >= 5 (set by the compute queue), then release out = 7
    q = pb.sem_acquire(pb.PushBuffer(), dev.host, gate, 5)
    pb.sem_release(q, dev.host, out, 7)
    dev.copy.submit(q)
    time.sleep(0.05)
    assert read_u64(out) == 0  # blocked: nothing released gate yet
    # compute queue: itself blocked on a CPU-written value, then releases gate = 5
    cpu_gate = dev.alloc_signal()
    c = pb.sem_acquire(pb.PushBuffer(), dev.host, cpu_gate, 1)
    pb.sem_release(c, dev.host, gate, 5)
    dev.compute.submit(c)
    time.sleep(0.05)
    assert read_u64(gate) == 0 and read_u64(out) == 0
    write_u64(cpu_gate, 1)  # the CPU unblocks compute, which unblocks copy
    dev.wait_signal(out, 7, timeout_s=5)
    assert read_u64(gate) == 5


def test_wait_times_out_with_names(dev: NVDevice) -> None:
    sig = dev.alloc_signal()
    want = f"NV:0: host timed out .* signal {sig:#x} >= 3 \\(current value 0\\)"
    with pytest.raises(DeviceTimeout, match=want):
        dev.wait_signal(sig, 3, timeout_s=0.05)


@pytest.mark.parametrize("nbytes", [1, 4096, 0x12345])
def test_copy_engine_copies_bytes(dev: NVDevice, nbytes: int) -> None:
    src, vram, dst = dev.alloc_host(nbytes), dev.alloc_vram(nbytes), dev.alloc_host(nbytes)
    pattern = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    view(src.va, nbytes)[:] = pattern
    done = dev.alloc_signal()
    q = pb.ce_copy(pb.PushBuffer(), dev.copy_info, vram.va, src.va, nbytes)
    pb.ce_copy(q, dev.copy_info, dst.va, vram.va, nbytes)
    pb.ce_sem_release(q, dev.copy_info, done, 0x1_0000_0002)
    dev.copy.submit(q)
    dev.wait_signal(done, 0x1_0000_0002, timeout_s=5)
    assert np.array_equal(view(dst.va, nbytes), pattern)
    assert np.array_equal(view(vram.va, nbytes), pattern)  # the BAR1 CPU mapping sees the same bytes
    assert read_u64(done + 8) > 0  # four-word release wrote a timestamp
    for b in (src, vram, dst):
        dev.free(b)


def test_memory_barrier_orders_a_write_before_a_copy_after_it(dev: NVDevice, mock: MockNV) -> None:
    """A value written on the compute queue before its memory barrier is what the copy engine reads after
    it (the copy queue waits on a release the compute queue makes after the barrier, then has its own
    barrier); the cache invalidate and non-stall interrupt in the stream do not stop what follows; and the
    barrier's MEM_OP is decoded, not just skipped (another operation in its place faults). The mock runs
    methods in order, so it cannot show what a missing barrier would break: that needs hardware."""
    data, gate, done = dev.alloc_signal(), dev.alloc_signal(), dev.alloc_signal()
    dst = dev.alloc_host(16)
    value = 0xC0FF_EE00_0000_0042
    c = pb.sem_acquire(pb.PushBuffer(), dev.host, gate, 1)
    pb.memory_barrier(c)
    pb.ce_copy(c, dev.copy_info, dst.va, data, 8)
    pb.ce_sem_release(c, dev.copy_info, done, 3)
    dev.copy.submit(c)
    time.sleep(0.02)
    assert read_u64(done) == 0 and read_u64(dst.va) == 0  # the copy waits for the gate
    q = pb.sem_release(pb.PushBuffer(), dev.host, data, value)  # the write
    pb.memory_barrier(q)
    pb.invalidate_shader_caches(q)
    pb.non_stall_interrupt(q)
    pb.sem_release(q, dev.host, gate, 1)
    dev.compute.submit(q)
    dev.wait_signal(done, 3, timeout_s=5)
    assert read_u64(gate) == 1 and read_u64(dst.va) == value  # the copy saw the write
    assert not mock.gpu.faults
    # the barrier's last word is MEM_OP_D with OPERATION (bits 31:27) = MEMBAR; any other operation faults
    words = pb.memory_barrier(pb.PushBuffer()).words
    assert words[-1] >> 27 == 5  # MEM_OP_D_OPERATION_MEMBAR
    bad = pb.PushBuffer()
    bad.words.extend(words[:-1] + [(0x1F << 27) | (words[-1] & ((1 << 27) - 1))])
    dev.compute.submit(bad)
    with pytest.raises(NVChannelError):
        dev.compute.wait_idle(timeout_s=5)
    assert "MEM_OP_D operation 0x1f" in str(mock.gpu.faults[0])
    dev.free(dst)


def test_gpfifo_wraparound_with_backpressure() -> None:
    m = MockNV(H100)
    d = make_device(m, gpfifo_entries=8, pushbuf_bytes=0x1000, timeout_s=0.3)
    try:
        gate, count = d.alloc_signal(), d.alloc_signal()
        d.compute.submit(pb.sem_acquire(pb.PushBuffer(), d.host, gate, 1))  # the GPU stalls here
        # 7 more entries fit: 8 slots, one kept empty; the stalled entry was already fetched (GPGet moved)
        for i in range(1, 8):
            d.compute.submit(pb.sem_release(pb.PushBuffer(), d.host, count, i))
        with pytest.raises(DeviceTimeout, match="free GPFIFO entry"):
            d.compute.submit(pb.sem_release(pb.PushBuffer(), d.host, count, 99))
        assert read_u64(count) == 0  # nothing overwritten, nothing ran past the acquire
        write_u64(gate, 1)
        d.compute.wait_idle(timeout_s=5)
        assert read_u64(count) == 7
        # many more submissions: the ring (8 entries) and the 4 KiB pushbuffer wrap many times
        words_per_submit = 0
        for i in range(8, 120):
            q = pb.sem_release(pb.PushBuffer(), d.host, count, i)
            words_per_submit = len(q) + 6  # + the channel's retirement release
            d.compute.submit(q)
        d.compute.wait_idle(timeout_s=5)
        assert read_u64(count) == 119 and d.compute.put == (1 + 1 + 7 + 112) % 8 == d.compute.gp_get()
        assert 112 * 4 * words_per_submit > 0x1000  # the pushbuffer ring really wrapped
    finally:
        d.close()
        m.shutdown()
    assert all(not v for v in m.leaks().values()), m.leaks()


def test_pushbuffer_backpressure_waits_for_retirement() -> None:
    m = MockNV(H100)
    d = make_device(m, pushbuf_bytes=0x1000, timeout_s=0.3)
    try:
        gate, scratch = d.alloc_signal(), d.alloc_signal()
        big = pb.sem_acquire(pb.PushBuffer(), d.host, gate, 1)
        for _ in range(100):  # ~2.4 KiB of no-op releases behind a blocked acquire
            pb.sem_release(big, d.host, scratch, 0, timestamp=False)
        d.compute.submit(big)
        with pytest.raises(DeviceTimeout, match="pushbuffer space"):
            d.compute.submit(big)  # would overwrite dwords the GPU has not consumed
        write_u64(gate, 1)
        d.compute.submit(big)
        d.compute.wait_idle(timeout_s=5)
    finally:
        d.close()
        m.shutdown()


def test_bad_method_opcode_faults_the_channel(dev: NVDevice, mock: MockNV) -> None:
    q = pb.PushBuffer()
    q.words.append((6 << 29) | (1 << 16) | (0x5C >> 2))  # SEC_OP 6 is reserved
    q.words.append(0)
    dev.compute.submit(q)
    with pytest.raises(NVChannelError, match="compute channel error.*info32 \\(Xid-style code\\) 32"):
        dev.compute.wait_idle(timeout_s=5)
    f = mock.gpu.faults[0]
    assert "invalid SEC_OP 6" in str(f) and "method 0x005c" in str(f) and f.pb_address is not None
    assert f.pb_address == dev.compute.pb_addr + 4 * (dev.compute.pb_head // 4 - len(q) - 6)
    with pytest.raises(NVChannelError):
        dev.compute.submit(pb.PushBuffer())  # the channel stays dead, like after an RC error


def test_release_to_unmapped_address_is_an_mmu_fault(dev: NVDevice, mock: MockNV) -> None:
    bad = dev.window_base + dev.window_size - 0x100  # inside the window but never mapped to the GPU
    dev.copy.submit(pb.sem_release(pb.PushBuffer(), dev.host, bad, 1))
    with pytest.raises(NVChannelError, match="Xid-style code\\) 31"):
        dev.copy.wait_idle(timeout_s=5)
    assert f"faulting VA {bad + 8:#x}" in str(mock.gpu.faults[0]) or f"{bad:#x}" in str(mock.gpu.faults[0])


def test_misaligned_semaphore_encoding_is_caught(dev: NVDevice, mock: MockNV) -> None:
    sig = dev.alloc_signal()
    q = pb.PushBuffer()  # hand-built release with timestamp to an 8-byte (not 16-byte) aligned address
    ex = pb.SemExecute(pb.SemOp.RELEASE, release_timestamp=True).encode()
    q.inc(pb.SUBCH_HOST, pb.NVC56F_SEM_ADDR_LO, (sig + 8) & 0xFFFFFFFF, (sig + 8) >> 32, 1, 0, ex)
    dev.compute.submit(q)
    with pytest.raises(NVChannelError):
        dev.compute.wait_idle(timeout_s=5)
    assert mock.gpu.faults[0].kind == "SEMAPHORE_ALIGNMENT"


def test_engine_method_without_set_object_faults() -> None:
    m = MockNV(H100)
    d = make_device(m)
    try:
        q = pb.ce_copy(pb.PushBuffer(), d.copy_info, d.signal_page.va, d.signal_page.va + 0x800, 16)
        d.compute.submit(q)  # the copy class is not bound on the compute channel's subchannel 4
        with pytest.raises(NVChannelError):
            d.compute.wait_idle(timeout_s=5)
        assert "subchannel 4 with no SET_OBJECT" in str(m.gpu.faults[0])
    finally:
        d.close()
        m.shutdown()


def _launch(d: NVDevice) -> tuple[int, pb.PushBuffer]:
    qmd = d.alloc_vram(0x1000)
    view(qmd.va, 384)[:] = np.arange(384) % 251
    q = pb.invalidate_shader_caches(pb.PushBuffer())
    q.inc(pb.SUBCH_COMPUTE, pb.NVC7C0_SEND_PCAS_A, qmd.va >> 8)
    q.inc(pb.SUBCH_COMPUTE, pb.NVC7C0_SEND_SIGNALING_PCAS2_B, 9)
    return qmd.va, q


def test_qmd_launch_is_recorded_not_run(dev: NVDevice, mock: MockNV, profile) -> None:  # type: ignore
    qva, q = _launch(dev)
    dev.compute.submit(dev.signal_next(q))
    dev.wait_signal(dev.timeline, dev.timeline_value, timeout_s=5)
    (launch,) = mock.gpu.launches
    assert launch.qmd_va == qva and launch.pcas_action == 9
    assert len(launch.qmd) == (384 if profile is H100 else 256) and launch.qmd[:4] == bytes([0, 1, 2, 3])


def test_garbage_qmd_faults_when_kernels_execute() -> None:
    m = MockNV(H100, execute_kernels=True)
    d = make_device(m)
    try:
        qva, q = _launch(d)  # 0, 1, 2, ... is no QMD: the version field is wrong
        d.compute.submit(q)
        with pytest.raises(NVChannelError, match="Xid-style code\\) 13"):
            d.compute.wait_idle(timeout_s=5)
        f = m.gpu.faults[0]
        assert f.kind == "GR" and f.va == qva  # rejected while decoding (QMD_TYPE 6 is no grid launch)
        assert f.method == pb.NVC7C0_SEND_SIGNALING_PCAS2_B
    finally:
        d.close()
        m.shutdown()


def test_userd_gpput_written_before_doorbell(dev: NVDevice, mock: MockNV) -> None:
    fences = mock.fence_count
    dev.copy.submit(pb.PushBuffer())
    dev.copy.wait_idle()
    assert mock.fence_count == fences + 2
    assert read_u32(dev.copy.userd_addr + pb.USERD_GP_PUT) == dev.copy.put
