"""The AMD HCQ device on the mock GPU (mock KFD + command-processor model + RDNA3 interpreter): bring-up and
teardown through the OS seam, signals, the PM4 and SDMA queues, kernels, bound replay, faults, timeouts.

These run without AMD_MOCK: each test opens its own mock explicitly (the registry's AMD kind needs it)."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rawgrad import Tensor, dtypes
from rawgrad.drivers.amd import abi, pm4, regs
from rawgrad.drivers.amd.device import AMD_CLOCK, AMDDevice, MockAMD
from rawgrad.drivers.amd.queues import AMDComputeQueue
from rawgrad.hcq import DeviceFault, DeviceTimeout, HCQBuffer, Program
from rawgrad.hcq.device import DeviceRegistry, DeviceUnavailable
from rawgrad.hcq.graph import CopyCommand, HCQGraph, address_var, build_template
from rawgrad.tensor.schedule import create_schedule

N = 64
TIMEOUT_S = 20.0


@pytest.fixture
def mock() -> Iterator[MockAMD]:
    m = MockAMD()
    yield m
    m.shutdown()


@pytest.fixture
def dev(mock: MockAMD) -> Iterator[AMDDevice]:
    d = AMDDevice("AMD", mock=mock, timeout_s=TIMEOUT_S)
    yield d
    d.close()


def _upload(dev: AMDDevice, data: np.ndarray) -> HCQBuffer:
    buf = dev.allocator.alloc(data.nbytes)
    dev.allocator.copyin(buf, memoryview(np.ascontiguousarray(data)))
    return buf


def _download(dev: AMDDevice, buf: HCQBuffer, n: int = N) -> np.ndarray:
    out = np.empty(n, np.int32)
    dev.allocator.copyout(memoryview(out), buf)
    return out


def _scale_add(dev: AMDDevice) -> Program:
    """out[i] = 3 * x[i] + 1 over N int32 (a fixed size: no symbolic bound), rendered for gfx1100."""
    x = Tensor.empty(N, dtype=dtypes.int32, device="CPU")
    items, _ = create_schedule([(x * 3 + 1).uop])
    (item,) = [it for it in items if it.ast is not None]
    assert dev.renderer is not None
    linear = dev.renderer.lower(item.ast, "amd_scale_add")
    assert not linear.variables
    return dev.program(linear.name, dev.compiler.compile(dev.renderer.render(linear)), linear.launch)


def test_bring_up_uses_kfd_and_close_leaves_nothing(mock: MockAMD) -> None:
    dev = AMDDevice("AMD", mock=mock)
    assert (dev.arch, dev.clock) == ("gfx1100", AMD_CLOCK) and AMD_CLOCK.ticks_to_ns(3) == 30
    calls = mock.kfd.calls
    assert calls[:2] == ["GET_VERSION", "ACQUIRE_VM"] and calls.count("CREATE_QUEUE") == 2
    kinds = sorted(q.queue_type for q in mock.kfd.queues.values())
    assert kinds == [abi.KFD_IOC_QUEUE_TYPE_COMPUTE, abi.KFD_IOC_QUEUE_TYPE_SDMA]
    assert len(mock.cp.queues) == 2  # mirrored into the command-processor model
    buf = _upload(dev, np.arange(N, dtype=np.int32))
    np.testing.assert_array_equal(_download(dev, buf), np.arange(N))
    dev.close()
    leaks = mock.leaks()
    assert all(not v for v in leaks.values()), leaks
    assert not mock.memory._bases, "the CP's memory map still holds allocations"
    with pytest.raises(DeviceFault):
        dev.check_fault()


def test_cp_memory_shares_the_driver_pages(dev: AMDDevice, mock: MockAMD) -> None:
    buf = _upload(dev, np.full(N, 7, np.int32))
    dev.synchronize()
    assert mock.memory.read(buf.va_addr, np.int32, N).tolist() == [7] * N  # the GPU sees the host's write
    with mock.lock:
        mock.memory.store(np.array([buf.va_addr], np.uint64), np.full((1, 4), 9, np.uint8))
    assert _download(dev, buf)[0] == 0x09090909  # and the host sees the GPU's


def test_signals_are_gtt_slots_compared_in_32_bits(dev: AMDDevice, mock: MockAMD) -> None:
    s = dev.new_signal(3, name="s")
    assert s.compare_bits == 32 and s.value == 3
    bo = mock.kfd.mapped_bo(s.address, 16)
    assert bo is not None and bo.kind == "gtt"
    with pytest.raises(ValueError, match="32 bits"):
        s.wait(1 << 32, 0.01)


def test_wait_and_signal_across_queues_and_timeline(dev: AMDDevice) -> None:
    gate, done = dev.new_signal(0), dev.new_signal(0)
    dev.queue().wait(gate, 2).signal(done, 9).submit(dev)
    time.sleep(0.02)
    assert done.value == 0  # the CP really waits on memory
    gate.value = 2
    done.wait(9, TIMEOUT_S, check=dev.check_fault)
    values = [dev.timeline_submit()[0] for _ in range(5)]
    dev.synchronize(TIMEOUT_S)
    assert dev.timeline_signal.value == values[-1] == dev.timeline_value - 1


def test_kernel_runs_with_kernargs_in_the_ring(dev: AMDDevice, mock: MockAMD) -> None:
    prog = _scale_add(dev)
    x_np = np.arange(N, dtype=np.int32) - 20
    x, out = _upload(dev, x_np), _upload(dev, np.zeros(N, np.int32))
    start, end = dev.new_signal(), dev.new_signal()
    dev.timeline_submit(lambda q: q.timestamp(start).exec(prog, [out, x], (N, 1, 1)).timestamp(end))
    np.testing.assert_array_equal(_download(dev, out), 3 * x_np + 1)
    rec = mock.cp.dispatches[-1]
    assert rec.executed and rec.kernel == "amd_scale_add"
    assert dev.pm4_ring_va <= rec.kernarg_va < dev.pm4_ring_va + dev.pm4_ring.capacity * 4
    assert 0 < start.timestamp <= end.timestamp


def test_any_launch_shape_runs_in_the_kernels_block(dev: AMDDevice) -> None:
    prog = _scale_add(dev)
    x_np = np.arange(N, dtype=np.int32)
    x, out = _upload(dev, x_np), _upload(dev, np.zeros(N, np.int32))
    dev.timeline_submit(lambda q: q.exec(prog, [out, x], (4, 4, 4), (2, 2, 1)))  # 64 threads, 3-D
    np.testing.assert_array_equal(_download(dev, out), 3 * x_np + 1)


def test_compute_queue_copy_and_sdma_copy(dev: AMDDevice) -> None:
    data = np.arange(N, dtype=np.int32) * 7
    src = _upload(dev, data)
    mid, dst = _upload(dev, np.zeros(N, np.int32)), _upload(dev, np.zeros(N, np.int32))
    dev.timeline_submit(lambda q: q.copy(mid.va_addr + 4, src.va_addr, 4 * (N - 2)))  # the copy kernel
    got = _download(dev, mid)
    assert got[0] == 0 and got[-1] == 0 and (got[1:-1] == data[:-2]).all()
    done = dev.new_signal(0)
    dev.synchronize()
    dev.copy_queue().copy(dst.va_addr, mid.va_addr, 4 * N).signal(done, 1).submit(dev)  # SDMA
    done.wait(1, TIMEOUT_S, check=dev.check_fault)
    np.testing.assert_array_equal(_download(dev, dst), got)
    with pytest.raises(TypeError, match="cannot launch kernels"):
        dev.copy_queue().exec(_scale_add(dev), [dst, src], (N, 1, 1))


def test_bound_replay_patches_the_copy(dev: AMDDevice) -> None:
    src, dst, n = address_var("t.src"), address_var("t.dst"), address_var("t.n")
    template, programs = build_template(dev, [CopyCommand(dst, src, n)])
    graph = HCQGraph(dev, template, programs, {})
    assert template.data_words > 0  # the copy kernel's kernargs travel in the block's data region
    bufs = [_upload(dev, np.arange(N, dtype=np.int32) + 100 * k) for k in range(3)]
    outs = [_upload(dev, np.zeros(N, np.int32)) for _ in range(3)]
    for k, nbytes in ((0, 8), (2, 4 * N), (1, 12)):
        graph.submit({src: bufs[k].va_addr, dst: outs[k].va_addr, n: nbytes})
        dev.synchronize(TIMEOUT_S)
        got = _download(dev, outs[k])
        want = np.arange(N, dtype=np.int32) + 100 * k
        assert (got[:nbytes // 4] == want[:nbytes // 4]).all() and not got[nbytes // 4:].any()


def test_a_broken_packet_is_a_device_fault(dev: AMDDevice) -> None:
    q = dev.queue()
    q._emit(0)  # a type-0 PM4 header
    dev.timeline_submit(queue=q)
    with pytest.raises(DeviceFault, match="PM4 header"):
        dev.synchronize(TIMEOUT_S)
    with pytest.raises(DeviceFault):
        dev.timeline_submit()  # a faulted device takes no new work


def test_a_wrong_rsrc2_is_caught_by_the_dispatch_validator(dev: AMDDevice) -> None:
    prog = _scale_add(dev)
    x, out = _upload(dev, np.zeros(N, np.int32)), _upload(dev, np.zeros(N, np.int32))
    q = AMDComputeQueue(dev).exec(prog, [out, x], (N, 1, 1))
    rsrc = pm4.encode_dispatch(prog.co, 0, 0, (1, 1, 1), (1, 1, 1)).patch["rsrc2"]
    q._words[rsrc] ^= 1 << 7  # flip RSRC2 ENABLE_SGPR_WORKGROUP_ID_X
    dev.timeline_submit(queue=q)
    with pytest.raises(DeviceFault, match="COMPUTE_PGM_RSRC2"):
        dev.synchronize(TIMEOUT_S)


def test_a_wait_nobody_signals_times_out_naming_the_device(mock: MockAMD) -> None:
    dev = AMDDevice("AMD", mock=mock, timeout_s=0.2)
    try:
        gate = dev.new_signal(0)
        value, q = dev.timeline_submit(lambda q: q.wait(gate, 1))
        with pytest.raises(DeviceTimeout) as info:
            dev.timeline_signal.wait(value, 0.2, queue=q.name, check=dev.check_fault)
        assert info.value.device == "AMD" and q.name in str(info.value)
        with pytest.raises(DeviceTimeout, match=r"synchronize.*PM4 ring: read \d+ of \d+ dwords.*blocked"):
            dev.synchronize(0.1)  # says where the rings stand and what the CP waits on
        gate.value = 1
        dev.synchronize(TIMEOUT_S)
    finally:
        dev.close()


def test_small_ring_wraps(mock: MockAMD) -> None:
    dev = AMDDevice("AMD", mock=mock, ring_bytes=abi.KFD_MIN_QUEUE_RING_SIZE)
    try:
        seq = dev.new_signal(0)
        for i in range(1, 200):
            dev.timeline_submit(lambda q, i=i: q.wait(seq, i - 1).signal(seq, i))
        dev.synchronize(TIMEOUT_S)
        assert seq.value == 199 and dev.pm4_ring.write > 4 * dev.pm4_ring.capacity
    finally:
        dev.close()
    assert not any(mock.leaks().values())


def test_registry_needs_amd_mock_or_dev_kfd(monkeypatch: pytest.MonkeyPatch) -> None:
    import rawgrad.drivers.amd as amd
    monkeypatch.delenv("AMD_MOCK", raising=False)
    monkeypatch.setattr(amd.os.path, "exists", lambda p: False)
    reg = DeviceRegistry()
    reg.register("AMD", amd._open, probe=amd._probe)
    with pytest.raises(DeviceUnavailable, match="/dev/kfd is missing"):
        reg["AMD"]
    monkeypatch.setenv("AMD_MOCK", "1")
    dev = reg["AMD"]
    try:
        assert isinstance(dev, AMDDevice) and dev.mock is not None and regs.family(dev.arch).wave_size == 32
    finally:
        reg.close_all()


def test_shared_memory_map_needs_writable_contiguous_bytes() -> None:
    from rawgrad.drivers.amd.mock.rdna3.interp import MemoryMap
    mem = MemoryMap()
    backing = np.zeros(64, np.uint8)
    mem.map(0x1000, backing, share=True)
    mem.store(np.array([0x1004], np.uint64), np.full((1, 2), 5, np.uint8))
    assert backing[4:6].tolist() == [5, 5]  # no copy: the store landed in the caller's array
    for bad in (np.zeros(16, np.int32), np.zeros(32, np.uint8)[::2], np.frombuffer(bytes(16), np.uint8)):
        with pytest.raises(ValueError, match="writable, contiguous uint8"):
            mem.map(0x9000, bad, share=True)


def test_fma_of_two_scalars_and_a_lane_vector_has_the_lanes_shape() -> None:
    # found by matrix-vector products on the AMD device: v_fma_f32 with both factors from SGPRs
    from rawgrad.drivers.amd.mock.rdna3.interp import _fma32
    a, b = np.full((1, 1), 3, np.float32), np.full((1, 1), 0.5, np.float32)
    c = np.arange(32, dtype=np.float32).reshape(1, 32)
    np.testing.assert_array_equal(_fma32(a, b, c), c + np.float32(1.5))


def test_ring_padding_longer_than_one_nop_packet(mock: MockAMD) -> None:
    # a big ring's tail can be longer than one PM4 NOP (16383 dwords): the padding is several packets
    dev = AMDDevice("AMD", mock=mock, ring_bytes=128 << 10)
    try:
        ring, n = dev.pm4_ring, regs.PACKET3_MAX_PAYLOAD + 5
        dev.synchronize()
        pos = ring.write
        dev._pad_pm4(ring.reserve(n), n)
        dev.pm4_publish(ring.commit(n))
        done = dev.new_signal(0)
        dev.queue().signal(done, 1).submit(dev)
        done.wait(1, TIMEOUT_S, check=dev.check_fault)
        # the CP read past the padding (the signal's value lands before the CP writes its read pointer back)
        ring.wait_retired(pos + n + 1, queue="after the padding")
        assert ring.retired() > pos + n
    finally:
        dev.close()


def test_gfx942_runs_at_packet_level() -> None:
    # MI300X (CPX partition) profile: wave64 code, the gfx9 ACQUIRE_MEM dialect; the CP validates and records
    # each dispatch without executing gfx942 machine code (labelled packet level only)
    from rawgrad.drivers.amd.mock.kfd import GFX942
    mock = MockAMD(GFX942, execute=False)
    dev = AMDDevice("AMD", mock=mock)
    try:
        assert (dev.arch, dev.fam.wave_size) == ("gfx942", 64)
        s = dev.new_signal(0)
        a, b = dev.allocator.alloc(256), dev.allocator.alloc(256)
        dev.timeline_submit(lambda q: q.copy(b.va_addr, a.va_addr, 256).memory_barrier().signal(s, 4))
        dev.synchronize(TIMEOUT_S)
        rec = mock.cp.dispatches[-1]
        assert s.value == 4 and rec.kernel == "rawgrad_amd_copy" and not rec.executed
    finally:
        dev.close()
    assert not any(mock.leaks().values())


def test_an_unmapped_kernarg_pointer_is_caught_by_the_dispatch_validator(dev: AMDDevice) -> None:
    prog = _scale_add(dev)
    x, out = _upload(dev, np.zeros(N, np.int32)), _upload(dev, np.zeros(N, np.int32))
    q = AMDComputeQueue(dev).exec(prog, [out, x], (N, 1, 1))
    at = pm4.encode_dispatch(prog.co, 0, 0, (1, 1, 1), (1, 1, 1)).kernarg_lo  # the exec is the queue's start
    keep = [p for p in q._patches if p.index not in (at, at + 1)]  # drop the DATA_BASE relocation ...
    q._replace_patches(keep, [None] * len(keep))
    q._words[at], q._words[at + 1] = 0x1000, 0  # ... and point the kernel at a page nothing maps
    dev.timeline_submit(queue=q)
    with pytest.raises(DeviceFault, match="kernarg pointer"):
        dev.synchronize(TIMEOUT_S)


def test_mock_waits_for_the_default_timeout_last_longer(dev: AMDDevice,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import rawgrad.hcq.signal as signal_module
    from rawgrad.drivers.amd.device import MOCK_TIMEOUT_SCALE
    from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S
    seen: list[float] = []
    monkeypatch.setattr(signal_module, "wait_until", lambda ready, timeout_s, *a, **k: seen.append(timeout_s))
    s = dev.new_signal(0)
    s.wait(1)  # the interpreter is slow: the library default is scaled on the mock ...
    s.wait(1, 0.5)  # ... an explicit timeout is kept
    assert seen == [DEFAULT_TIMEOUT_S * MOCK_TIMEOUT_SCALE, 0.5]


def test_a_kfd_memory_fault_event_is_a_device_fault(dev: AMDDevice, mock: MockAMD) -> None:
    # how real hardware reports a bad address: KFD signals the MEMORY event (here injected into the mock)
    assert mock.kfd.calls.count("CREATE_EVENT") == 3  # MEMORY, HW_EXCEPTION, and the SIGNAL event waits use
    dev.check_fault()
    mock.kfd.inject_memory_fault(0xDEAD000, write=True)
    time.sleep(0.002)  # past the poll interval
    with pytest.raises(DeviceFault, match="GPU memory fault at VA 0xdead000"):
        dev.check_fault()
    with pytest.raises(DeviceFault, match="0xdead000"):
        dev.timeline_submit()  # and it stays faulted


def test_a_kfd_hw_exception_is_a_device_fault(dev: AMDDevice, mock: MockAMD) -> None:
    mock.kfd.inject_hw_exception()
    time.sleep(0.002)
    with pytest.raises(DeviceFault, match="hardware exception"):
        dev.synchronize(TIMEOUT_S)


def test_a_saved_graph_replays_on_amd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the AMD compute queue lays its data region out at amd.data_base: a saved graph must accept it
    from rawgrad import Device, Tensor, TinyJit
    monkeypatch.setenv("AMD_MOCK", "1")
    try:
        f = TinyJit(lambda x: (x * 3 + 1).contiguous())
        a = np.arange(40, dtype=np.float32)
        for k in range(3):
            np.testing.assert_array_equal(f(Tensor(a + k, device="AMD")).numpy(), (a + k) * 3 + 1)
        path = str(tmp_path / "amd.rgjit")
        f.save(path)
        g = TinyJit.load(path)
        np.testing.assert_array_equal(g(Tensor(a - 5, device="AMD")).numpy(), (a - 5) * 3 + 1)
    finally:
        Device.close("AMD")


def test_host_waits_sleep_in_wait_events_and_wake_on_the_interrupt(dev: AMDDevice, mock: MockAMD) -> None:
    # the SIGNAL event: a signal write is followed by a mailbox write + interrupt (RELEASE_MEM INT_SEL 2 on
    # PM4, FENCE + TRAP on SDMA) that wakes the host's WAIT_EVENTS; sleeps under 1 ms stay plain sleeps
    ev = dev.signal_event
    assert ev is not None and dev.event_mailbox
    assert mock.kfd.events[ev.event_id].event_type == abi.KFD_IOC_EVENT_SIGNAL
    gate, done = dev.new_signal(0), dev.new_signal(0)
    assert done.event_wait is not None
    dev.queue().wait(gate, 1).signal(done, 7).submit(dev)
    dev.copy_queue().signal(gate, 1).submit(dev)
    done.wait(7, TIMEOUT_S, check=dev.check_fault)
    assert done.value == 7
    queues = {name for name, ctxid in mock.cp.interrupts if ctxid == ev.event_id}
    assert any("PM4" in q for q in queues) and any("SDMA" in q for q in queues), mock.cp.interrupts
    # a wait longer than the loop's first ~1.3 ms of short sleeps spends the rest in WAIT_EVENTS, and the
    # interrupt of the signal that ends it wakes it well before its timeout
    waits = dev.event_waits
    late = dev.new_signal(0)
    timer = threading.Timer(0.2, lambda: dev.queue().signal(late, 1).submit(dev))
    t0 = time.perf_counter()
    timer.start()
    try:
        late.wait(1, TIMEOUT_S, check=dev.check_fault)
    finally:
        timer.join()
    assert late.value == 1 and time.perf_counter() - t0 < TIMEOUT_S / 2
    assert dev.event_waits > waits and "WAIT_EVENTS" in mock.kfd.calls


def test_without_the_signal_event_host_waits_poll(mock: MockAMD) -> None:
    dev = AMDDevice("AMD", mock=mock, timeout_s=TIMEOUT_S, interrupts=False)
    try:
        assert dev.signal_event is None and mock.kfd.calls.count("CREATE_EVENT") == 2
        s = dev.new_signal(0)
        assert s.event_wait is None
        dev.queue().signal(s, 3).submit(dev)
        s.wait(3, TIMEOUT_S, check=dev.check_fault)
        assert s.value == 3 and dev.event_waits == 0 and not mock.cp.interrupts  # no mailbox, no interrupt
    finally:
        dev.close()
    assert not any(mock.leaks().values())


def test_a_kfd_without_free_event_slots_falls_back_to_polling(mock: MockAMD,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real = mock.kfd.ioctl

    def no_signal_events(fd: int, request: int, args: object) -> object:
        signal_event = getattr(args, "event_type", None) == abi.KFD_IOC_EVENT_SIGNAL
        if request == abi.CREATE_EVENT.request and signal_event:
            raise OSError(28, "CREATE_EVENT: all signal event slots are in use (ENOSPC)")
        return real(fd, request, args)

    monkeypatch.setattr(mock.kfd, "ioctl", no_signal_events)
    dev = AMDDevice("AMD", mock=mock, timeout_s=TIMEOUT_S)
    try:
        assert dev.signal_event is None and not dev.interrupts
        s = dev.new_signal(0)
        dev.queue().signal(s, 2).submit(dev)
        s.wait(2, TIMEOUT_S, check=dev.check_fault)
        assert s.value == 2
    finally:
        dev.close()


# -- broken encodings caught end to end: a Tensor computed on DEV=AMD (the registry's mock device), with one
# piece of the driver's encoding broken by the test; the mock must report the exact field, never compute.
@pytest.fixture
def amd_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The registry's "AMD" device on the mock, opened fresh for the test and closed after it."""
    from rawgrad import Device
    monkeypatch.setenv("AMD_MOCK", "1")
    Device.close("AMD")
    yield "AMD"
    Device.close("AMD")


def _tensor_work(device: str) -> np.ndarray:
    x = np.arange(N, dtype=np.float32)
    return (Tensor(x, device=device) * 3 + 1).numpy()


def test_tensor_with_a_wrong_rsrc2_is_a_device_fault(amd_registry: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from rawgrad.drivers.amd import queues
    real = pm4.encode_dispatch

    def wrong_rsrc2(*args: object, **kwargs: object) -> pm4.DispatchPackets:
        d = real(*args, **kwargs)  # type: ignore[arg-type]
        d.words[d.patch["rsrc2"]] ^= 1 << 7  # ENABLE_SGPR_WORKGROUP_ID_X off: the kernel's ids would be 0
        return d

    monkeypatch.setattr(queues.pm4, "encode_dispatch", wrong_rsrc2)
    with pytest.raises(DeviceFault, match=r"COMPUTE_PGM_RSRC2.*bits 0x80 differ"):
        _tensor_work(amd_registry)


def test_tensor_whose_signal_lost_its_release_mem_times_out_saying_why(
        amd_registry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rawgrad.drivers.amd import device as amd_device
    monkeypatch.setattr(amd_device, "MOCK_TIMEOUT_SCALE", 0.02)  # the default 30 s wait lasts 0.6 s here
    monkeypatch.setattr(AMDComputeQueue, "_signal", lambda self, signal, value: None)  # no RELEASE_MEM
    with pytest.raises(DeviceTimeout, match=r"timed out after 0.6 s.*idle.*no RELEASE_MEM or FENCE has "
                                            r"written the timeline signal"):
        _tensor_work(amd_registry)


def test_tensor_whose_kernarg_segment_is_smaller_than_the_descriptor_says(
        amd_registry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the descriptor in GPU memory asks for a 1 MiB kernarg segment; the driver laid out the real (small) one
    # at the end of its ring's data region, so the pointer does not map what the descriptor demands
    import dataclasses

    from rawgrad.drivers.amd import device as amd_device
    real = amd_device.load_code_object
    huge = 1 << 20

    def bigger_kernarg(lib: bytes, arch: str, kernel: str | None = None) -> object:
        co = real(lib, arch, kernel=kernel)
        image = bytearray(co.image)
        image[co.kd_offset + 8:co.kd_offset + 12] = huge.to_bytes(4, "little")  # kernarg_size@8 (AMDGPUUsage)
        return dataclasses.replace(co, image=bytes(image))

    monkeypatch.setattr(amd_device, "load_code_object", bigger_kernarg)
    with pytest.raises(DeviceFault, match=rf"COMPUTE_USER_DATA_0/1 \(kernarg pointer\).*does not map the "
                                          rf"{huge}-byte kernarg segment"):
        _tensor_work(amd_registry)


def test_tensor_reading_an_unmapped_address_is_a_device_fault(amd_registry: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # a kernel argument (the input buffer's pointer) replaced by a page nothing maps: the kernel's load faults
    real = AMDComputeQueue._kernargs
    bad = 0x7000_0000

    def unmapped_input(self: AMDComputeQueue, co: object, args: list[object]) -> int:
        if len(args) >= 2 and isinstance(args[1], int):
            args = [args[0], bad, *args[2:]]
        return real(self, co, args)  # type: ignore[arg-type]

    monkeypatch.setattr(AMDComputeQueue, "_kernargs", unmapped_input)
    with pytest.raises(DeviceFault, match=rf"GPU fault.*{bad:#x}"):
        _tensor_work(amd_registry)


def test_sleeps_under_a_millisecond_stay_plain_sleeps(dev: AMDDevice, mock: MockAMD) -> None:
    # WAIT_EVENTS counts whole ms: the wait loop's short sleeps (20 us doubling) must not each become a 1-ms
    # event wait, or a short wait would be seen up to 1 ms late
    before, calls = dev.event_waits, mock.kfd.calls.count("WAIT_EVENTS")
    dev._event_wait(1, 0.0002)
    assert dev.event_waits == before
    t0 = time.perf_counter()
    dev._event_wait(1, 0.002)  # nothing signals: WAIT_EVENTS times out after its 2 ms
    assert dev.event_waits == before + 1 and mock.kfd.calls.count("WAIT_EVENTS") > calls
    assert time.perf_counter() - t0 >= 0.0015


def test_a_replayed_graph_interrupts_through_its_bound_event_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a graph template's signals have symbolic addresses: their interrupt packets name the event through the
    # layout variables amd.event_mailbox / amd.event_id, which bind resolves to this device's event
    from rawgrad import Device, TinyJit
    from rawgrad.drivers.amd.queues import EVENT_ID, EVENT_MAILBOX, AMDComputeQueue
    assert {EVENT_MAILBOX, EVENT_ID} <= set(AMDComputeQueue.LAYOUT_VARIABLES)  # saved graphs accept them
    monkeypatch.setenv("AMD_MOCK", "1")
    Device.close("AMD")
    try:
        dev = Device["AMD"]
        assert isinstance(dev, AMDDevice) and dev.signal_event is not None and dev.mock is not None
        f = TinyJit(lambda x: (x * 2 + 1).contiguous())
        a = np.arange(64, dtype=np.float32)
        for k in range(2):  # eager, capture
            f(Tensor(a + k, device="AMD")).numpy()
        x = Tensor(a + 5, device="AMD").realize()
        dev.synchronize()
        before = [c for _, c in dev.mock.cp.interrupts].count(dev.signal_event.event_id)
        np.testing.assert_array_equal(f(x).numpy(), (a + 5) * 2 + 1)  # the replay: one INDIRECT_BUFFER
        assert f.replays == 1
        after = [c for _, c in dev.mock.cp.interrupts].count(dev.signal_event.event_id)
        assert after > before, "the replayed block raised no interrupt for the device's event"
    finally:
        Device.close("AMD")
