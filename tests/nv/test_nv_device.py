"""The NV device as an HCQ device on the mock GPU: every queue command, bind + patch-on-submit, cross-queue
waits, the timeline, kernels (hand-written PTX and the renderer's), Tensor ops and TinyJit replays."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor, TinyJit, Variable
from rawgrad.compiler import elf
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.target import LaunchSpec
from rawgrad.drivers.nv import _probe
from rawgrad.drivers.nv import pushbuf as pb
from rawgrad.drivers.nv.cubin import (
    NoAssemblerError,
    NVCompiler,
    Section,
    append_section,
    find_nvjitlink,
    program_info,
    ptx_params,
    write_elf,
)
from rawgrad.drivers.nv.hcq import NVCopyQueue, NVHCQDevice, open_device
from rawgrad.drivers.nv.mock import H100, GPUProfile, MockNV
from rawgrad.drivers.nv.qmd import QMDV03, QMDV04, qmd_for_class
from rawgrad.hcq import Device, DeviceFault, DeviceTimeout, HCQBuffer, sym_eval
from rawgrad.hcq.graph import address_var

from .conftest import SMALL_WINDOW

# The block of the hand-written kernels below (their .maxntid), named by their launch contracts.
BLOCK = 128
KERNELS = """
.version 7.8
.target {arch}
.address_size 64

.visible .entry fill(.param .u64 out, .param .s64 n, .param .s64 k)
.maxntid 128, 1, 1
{{
  .reg .pred %p<2>;
  .reg .b32 %r<5>;
  .reg .b64 %rd<8>;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.s32 %r4, %r1, %r2, %r3;
  cvt.s64.s32 %rd1, %r4;
  ld.param.s64 %rd2, [n];
  setp.ge.s64 %p1, %rd1, %rd2;
  @%p1 bra DONE;
  ld.param.u64 %rd3, [out];
  ld.param.s64 %rd4, [k];
  mul.lo.s64 %rd5, %rd1, %rd4;
  shl.b64 %rd6, %rd1, 3;
  add.s64 %rd7, %rd3, %rd6;
  st.global.s64 [%rd7], %rd5;
DONE:
  ret;
}}

.visible .entry add1(.param .u64 out, .param .u64 inp, .param .s64 n)
.maxntid 128, 1, 1
{{
  .reg .pred %p<2>;
  .reg .b32 %r<5>;
  .reg .b64 %rd<10>;
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mad.lo.s32 %r4, %r1, %r2, %r3;
  cvt.s64.s32 %rd1, %r4;
  ld.param.s64 %rd2, [n];
  setp.ge.s64 %p1, %rd1, %rd2;
  @%p1 bra DONE;
  shl.b64 %rd3, %rd1, 3;
  ld.param.u64 %rd4, [inp];
  add.s64 %rd5, %rd4, %rd3;
  ld.global.s64 %rd6, [%rd5];
  add.s64 %rd7, %rd6, 1;
  ld.param.u64 %rd8, [out];
  add.s64 %rd9, %rd8, %rd3;
  st.global.s64 [%rd9], %rd7;
DONE:
  ret;
}}
"""


@pytest.fixture
def mock(profile: GPUProfile) -> Iterator[MockNV]:
    m = MockNV(profile, execute_kernels=True)
    yield m
    m.shutdown()


def make(m: MockNV, **kw: Any) -> NVHCQDevice:
    kw.setdefault("gpfifo_entries", 64)
    kw.setdefault("window_size", SMALL_WINDOW)
    kw.setdefault("timeout_s", 5.0)
    return NVHCQDevice("NV", m, **kw)


@pytest.fixture
def dev(mock: MockNV) -> Iterator[NVHCQDevice]:
    d = make(mock)
    yield d
    d.close()
    gc.collect()
    assert all(not v for v in mock.leaks().values()), mock.leaks()


@pytest.fixture
def progs(dev: NVHCQDevice) -> dict[str, Any]:
    """The hand-written kernels with their launch contracts: one thread per index, blocks of BLOCK (their
    .maxntid); a launch that names no block runs in those."""
    lib = dev.compiler.compile(KERNELS.format(arch=dev.arch))
    n, k = Variable("progs.n", 0, 1 << 40), Variable("progs.k", -(1 << 40), 1 << 40)
    contracts = {"fill": LaunchSpec((n, 1, 1), (BLOCK, 1, 1), buffers=1, scalars=(n, k)),
                 "add1": LaunchSpec((n, 1, 1), (BLOCK, 1, 1), buffers=2, scalars=(n,))}
    return {name: dev.program(name, lib, contracts[name]) for name in ("fill", "add1")}


def host(dev: NVHCQDevice, buf: Any, dtype: Any = np.int64) -> np.ndarray:
    out = np.empty(buf.size // np.dtype(dtype).itemsize, dtype)
    dev.allocator.copyout(memoryview(out), buf)
    return out


def run(dev: NVHCQDevice, q: Any, var_vals: dict[UOp, int] | None = None) -> int:
    """Submit `q` (which must end with a timeline signal of dev.timeline_value) and wait for it."""
    value = dev.timeline_value
    q.submit(dev, var_vals)
    dev.timeline_value = value + 1
    dev.synchronize(timeout_s=10)
    return value


# ------------------------------------------------------------------------------------------ device basics
def test_device_identity_and_layout(dev: NVHCQDevice, profile: GPUProfile) -> None:
    assert dev.arch == ("sm_90" if profile is H100 else "sm_86")
    assert dev.qmd_class is (QMDV04 if profile is H100 else QMDV03)
    assert dev.sass_version == (0x90 if profile is H100 else 0x86)
    assert dev.is_mock and dev.renderer is not None and dev.renderer.language == "ptx"
    assert qmd_for_class(dev.nv.compute_class) is dev.qmd_class


def test_signals_live_in_gpu_mapped_host_pages(dev: NVHCQDevice) -> None:
    sigs = [dev.new_signal(i) for i in range(300)]  # more than one 4 KiB page of 16-byte slots
    pages = {s.address & ~0xFFF for s in sigs}
    assert len(pages) >= 2 and all(s.address % 16 == 0 for s in sigs)
    assert all(dev.nv.buffers[p].kind == "host" for p in pages)  # OS-descriptor pages, UVM-mapped
    assert [s.value for s in sigs[:3]] == [0, 1, 2] and sigs[5].timestamp == 0
    addrs = {s.address for s in sigs}
    del sigs
    gc.collect()
    again = [dev.new_signal() for _ in range(10)]
    assert {s.address for s in again} <= addrs  # slots are recycled


def test_wait_signal_timestamp_and_barrier_on_both_queues(dev: NVHCQDevice) -> None:
    gate, out, ts = dev.new_signal(0), dev.new_signal(0), dev.new_signal(0)
    gate.value = 3
    v = dev.timeline_value
    before = dev.nv.read_timer_ns()
    q = dev.queue().wait(dev.timeline_signal, v - 1).wait(gate, 3).timestamp(ts).memory_barrier()
    run(dev, q.signal(out, 0x1_2345_6789).signal(dev.timeline_signal, v))
    assert out.value == 0x1_2345_6789 and before <= ts.timestamp <= dev.nv.read_timer_ns()
    ts2 = dev.new_signal()
    v = dev.timeline_value
    cq = dev.copy_queue().wait(dev.timeline_signal, v - 1).memory_barrier().timestamp(ts2)
    run(dev, cq.signal(out, 7).signal(dev.timeline_signal, v))
    assert out.value == 7 and ts2.timestamp >= ts.timestamp
    with pytest.raises(ValueError, match="timestamp on NV rewrites"):
        dev.queue().timestamp(dev.timeline_signal)


def test_wait_times_out_then_completes(dev: NVHCQDevice) -> None:
    sig = dev.new_signal(0)
    dev.queue().wait(sig, 1).signal(dev.timeline_signal, dev.timeline_value).submit(dev)
    dev.timeline_value += 1
    with pytest.raises(DeviceTimeout, match="NV: synchronize timed out.*timeline >= 1") as e:
        dev.synchronize(timeout_s=0.1)
    assert "compute channel: GPGet" in str(e.value) and "copy channel: GPGet" in str(e.value)
    assert "Work on the compute channel has not retired" in str(e.value)
    sig.value = 1  # the GPU was really waiting: releasing it lets the work finish
    dev.synchronize(timeout_s=5)


def test_cross_queue_wait_really_blocks(dev: NVHCQDevice) -> None:
    a, b, done = dev.new_signal(0), dev.new_signal(0), dev.new_signal(0)
    # copy queue waits for the compute queue, which waits for the CPU
    dev.copy_queue().wait(a, 1).signal(done, 2).submit(dev)
    dev.queue().wait(b, 1).signal(a, 1).submit(dev)
    time.sleep(0.05)
    assert a.value == 0 and done.value == 0
    b.value = 1
    done.wait(2, timeout_s=5, check=dev.check_fault)
    assert a.value == 1


def test_copy_queue_copies_with_patched_operands(dev: NVHCQDevice) -> None:
    n = 3 * 4096 + 5
    src, dst = dev.allocator.alloc(n), dev.allocator.alloc(n)
    data = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    dev.allocator.copyin(src, memoryview(data))
    d_var, s_var, n_var = address_var("dst"), address_var("src"), Variable("nbytes", 1, 1 << 20)
    wait, sig = Variable("w", 0, 1 << 40), Variable("s", 0, 1 << 40)
    q = NVCopyQueue(dev).wait(dev.timeline_signal, wait).copy(d_var, s_var, n_var)
    q.signal(dev.timeline_signal, sig).bind(dev)
    ch = dev.nv.copy
    for size, off in ((n, 0), (100, 7), (4096, 1)):
        v = dev.timeline_value
        put, retired = ch.put, ch.retire_value
        run(dev, q, {d_var: dst.va_addr + off, s_var: src.va_addr, n_var: size, wait: v - 1, sig: v})
        # a replay of a bound queue is one GP entry (the block retires itself), no ring segment
        assert (ch.put - put) % ch.entries == 1 and ch.retire_value == retired + 1 == ch.retired()
        assert np.array_equal(host(dev, dst, np.uint8)[off:off + size], data[:size])
    big = np.arange(5 << 20, dtype=np.uint8)  # more than the staging buffer: chunked host copies
    buf = dev.allocator.alloc(big.nbytes)
    dev.allocator.copyin(buf, memoryview(big))
    assert np.array_equal(host(dev, buf, np.uint8), big)
    for b in (src, dst, buf):
        dev.allocator.free(b)
    with pytest.raises(TypeError, match="cannot launch kernels"):
        NVCopyQueue(dev).exec(Any, [], (1, 1, 1))  # type: ignore[arg-type]


def test_compute_queue_copies_with_the_copy_kernel(dev: NVHCQDevice, mock: MockNV) -> None:
    """The compute channel has no copy engine: `copy` there is a kernel, 16 bytes per thread when dst, src
    and the size are 16-byte aligned, bytes otherwise; operands and size may be patched per submit."""
    n = 5000
    src, dst = dev.allocator.alloc(n), dev.allocator.alloc(n)
    data = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    dev.allocator.copyin(src, memoryview(data))
    d_var, s_var, n_var = address_var("dst"), address_var("src"), Variable("nbytes", 0, n)
    wait, sig = Variable("w", 0, 1 << 40), Variable("s", 0, 1 << 40)
    q = dev.queue().wait(dev.timeline_signal, wait).copy(d_var, s_var, n_var)
    q.signal(dev.timeline_signal, sig).bind(dev)
    for size, doff, soff in ((4096, 0, 0), (100, 7, 3), (33, 16, 0), (1, 0, 5), (0, 0, 0), (n, 0, 0)):
        poison = np.full(n, 0xAB, np.uint8)
        dev.allocator.copyin(dst, memoryview(poison))
        v = dev.timeline_value
        run(dev, q, {d_var: dst.va_addr + doff, s_var: src.va_addr + soff, n_var: size, wait: v - 1, sig: v})
        got = host(dev, dst, np.uint8)
        assert np.array_equal(got[doff:doff + size], data[soff:soff + size]), (size, doff, soff)
        assert (got[:doff] == 0xAB).all() and (got[doff + size:] == 0xAB).all()  # nothing outside
    assert any(launch.entry == "rawgrad_copy" for launch in mock.gpu.launches)
    for b in (src, dst):
        dev.allocator.free(b)


# ------------------------------------------------------------------------------------------- kernels
def test_program_image_and_launch(dev: NVHCQDevice, mock: MockNV, progs: dict[str, Any]) -> None:
    fill = progs["fill"]
    assert fill.fn_addr == fill.image.va + fill.info.text_offset and fill.info.param_offset in (0x160, 0x210)
    n = 1000
    out = dev.allocator.alloc(8 * n)
    fill(out, global_size=(n, 1, 1), vals=(n, 3), wait=True)
    np.testing.assert_array_equal(host(dev, out), np.arange(n) * 3)
    launch = mock.gpu.launches[-1]
    assert launch.entry == "fill" and launch.grid == (8, 1, 1) and launch.block == (128, 1, 1)
    assert len(launch.qmd) == dev.qmd_class.SIZE_BYTES and launch.qmd_va % 256 == 0
    with pytest.raises(ValueError, match=r"fill takes 1 buffers and 2 scalars \(3 arguments\)"):
        dev.queue().exec(fill, [out], (4, 1, 1))


def test_the_block_comes_from_the_launch_contract(dev: NVHCQDevice, mock: MockNV,
                                                 progs: dict[str, Any]) -> None:
    """The driver defaults nothing: a launch runs in the contract's block (its global size from the contract
    and the scalars when not given); a program without a contract and no local size runs one thread per
    block; the contract is completed with the image's registers."""
    fill = progs["fill"]
    assert fill.launch.registers == (fill.info.registers or None)
    n = 300
    out = dev.allocator.alloc(8 * n)
    fill(out, vals=(n, 2), wait=True)  # no sizes at all
    assert (mock.gpu.launches[-1].grid, mock.gpu.launches[-1].block) == ((3, 1, 1), (BLOCK, 1, 1))
    np.testing.assert_array_equal(host(dev, out), np.arange(n) * 2)
    bare = dev.program("fill", dev.compiler.compile(KERNELS.format(arch=dev.arch)))
    assert bare.launch is None
    bare(out, global_size=(n, 1, 1), vals=(n, 5), wait=True)
    assert (mock.gpu.launches[-1].grid, mock.gpu.launches[-1].block) == ((n, 1, 1), (1, 1, 1))
    np.testing.assert_array_equal(host(dev, out), np.arange(n) * 5)
    dev.allocator.free(out)


def test_chained_launches_and_folded_release(dev: NVHCQDevice, mock: MockNV, progs: dict[str, Any]) -> None:
    n = 300
    a, b, c = (dev.allocator.alloc(8 * n) for _ in range(3))
    before = len(mock.gpu.launches)
    v = dev.timeline_value
    q = dev.queue().wait(dev.timeline_signal, v - 1).exec(progs["fill"], [a, n, 2], (n, 1, 1))
    q.exec(progs["add1"], [b, a, n], (n, 1, 1)).exec(progs["add1"], [c, b, n], (n, 1, 1))
    q.signal(dev.timeline_signal, v)
    t0 = dev.nv.read_timer_ns()
    run(dev, q)
    # the timeline was released by the last QMD (payload + timestamp record), not by a host semaphore
    assert dev.timeline_signal.value == v and dev.timeline_signal.timestamp >= t0
    np.testing.assert_array_equal(host(dev, c), np.arange(n) * 2 + 2)  # each kernel saw the previous one
    launches = mock.gpu.launches[before:]
    assert [x.chained for x in launches] == [False, True, True]  # one SEND_PCAS, two dependent QMDs
    assert [x.entry for x in launches] == ["fill", "add1", "add1"]
    sends = [w for w in q.words() if int(w) == pb.MethodHeader(pb.SecOp.INC_METHOD, pb.SUBCH_COMPUTE,
                                                              pb.NVC7C0_SEND_PCAS_A, 1).encode()]
    assert len(sends) == 1


def test_timeline_orders_compute_and_copy_queues(dev: NVHCQDevice, progs: dict[str, Any]) -> None:
    n = 500
    a, b, c = (dev.allocator.alloc(8 * n) for _ in range(3))
    tl = dev.timeline_signal
    v = dev.timeline_value  # three submissions on two channels, queued before the host waits for any
    dev.queue().wait(tl, v - 1).exec(progs["fill"], [a, n, 4], (n, 1, 1)).signal(tl, v).submit(dev)
    dev.copy_queue().wait(tl, v).copy(b.va_addr, a.va_addr, 8 * n).signal(tl, v + 1).submit(dev)
    dev.queue().wait(tl, v + 1).exec(progs["add1"], [c, b, n], (n, 1, 1)).signal(tl, v + 2).submit(dev)
    dev.timeline_value = v + 3
    dev.synchronize(timeout_s=10)
    np.testing.assert_array_equal(host(dev, c), np.arange(n) * 4 + 1)


def test_launch_after_host_command_waits_for_idle(dev: NVHCQDevice, progs: dict[str, Any]) -> None:
    n = 64
    a, b = dev.allocator.alloc(8 * n), dev.allocator.alloc(8 * n)
    s = dev.new_signal()
    v = dev.timeline_value
    q = dev.queue().wait(dev.timeline_signal, v - 1).exec(progs["fill"], [a, n, 5], (n, 1, 1))
    q.wait(s, 0).exec(progs["add1"], [b, a, n], (n, 1, 1)).signal(dev.timeline_signal, v)
    wfi = pb.MethodHeader(pb.SecOp.INC_METHOD, pb.SUBCH_HOST, pb.NVC56F_WFI, 1).encode()
    assert wfi in [int(w) for w in q.words()]  # the second chain starts only after the first kernel
    run(dev, q)
    np.testing.assert_array_equal(host(dev, b), np.arange(n) * 5 + 1)


def test_bind_and_patch_on_submit(dev: NVHCQDevice, mock: MockNV, progs: dict[str, Any]) -> None:
    out_var, n_var, k_var = address_var("out"), Variable("n", 1, 4096), Variable("k", -100, 100)
    wait, sig = Variable("w", 0, 1 << 40), Variable("s", 0, 1 << 40)
    q = dev.queue().wait(dev.timeline_signal, wait)
    q.exec(progs["fill"], [out_var, n_var, k_var], (n_var, 1, 1)).signal(dev.timeline_signal, sig)
    q.bind(dev)
    bufs = [dev.allocator.alloc(8 * 4096) for _ in range(2)]
    for i, (n, k) in enumerate([(1, 7), (129, -3), (4096, 2), (129, 1)]):
        buf = bufs[i % 2]
        v = dev.timeline_value
        run(dev, q, {out_var: buf.va_addr, n_var: n, k_var: k, wait: v - 1, sig: v})
        np.testing.assert_array_equal(host(dev, buf)[:n], np.arange(n) * k)
        assert mock.gpu.launches[-1].grid == (-(-n // 128), 1, 1)  # ceil(n / block) computed at submit
    with pytest.raises(KeyError, match="no value for variable 'k'"):
        q.submit(dev, {out_var: bufs[0].va_addr, n_var: 1, wait: 0, sig: 0})
    grid_expr = dev.launch_dims((n_var, 1, 1), (BLOCK, 1, 1))[0][0]
    assert isinstance(grid_expr, UOp) and sym_eval(grid_expr, {n_var: 257}) == 3


def test_qmds_and_banks_stay_out_of_the_fetched_commands(dev: NVHCQDevice, mock: MockNV,
                                                        progs: dict[str, Any]) -> None:
    """The front end fetches only a queue's commands: its QMDs and constant banks sit in a data region
    after them, read by the compute engine from memory. So a chain of launches costs the PBDMA the same
    methods whatever its length, and no method carries QMD or bank words."""
    n = 64
    a = dev.allocator.alloc(8 * n)

    def chain(kernels: int, bound: bool) -> tuple[int, Any]:
        v = dev.timeline_value
        q = dev.queue().wait(dev.timeline_signal, v - 1)
        q.exec(progs["fill"], [a, n, 1], (n, 1, 1))
        for _ in range(kernels - 1):
            q.exec(progs["add1"], [a, a, n], (n, 1, 1))
        q.signal(dev.timeline_signal, v)
        if bound:
            q.bind(dev)
        before = mock.gpu.methods_executed
        run(dev, q)
        np.testing.assert_array_equal(host(dev, a), np.arange(n) + kernels - 1)
        return mock.gpu.methods_executed - before, q

    for bound in (False, True):
        short, _ = chain(2, bound)
        long, q = chain(20, bound)
        assert long == short, (bound, short, long)  # chained launches add data, not commands
        assert short < 64  # wait, one SEND_PCAS pair, shader-cache invalidation, retirement: a few dozen
    words, patches, data_words = dev.queue().exec(progs["fill"], [a, n, 1], (n, 1, 1)).layout()
    qmd = dev.qmd_class()
    assert data_words > qmd.dwords and len(words) - data_words < 32  # the launch is mostly data
    with pytest.raises(RuntimeError, match="is bound to NV; build a new queue"):
        q.exec(progs["fill"], [a, n, 1], (n, 1, 1))
    unbound = dev.queue().signal(dev.timeline_signal, dev.timeline_value)
    unbound.submit(dev)
    dev.timeline_value += 1
    dev.synchronize(timeout_s=10)
    with pytest.raises(RuntimeError, match="was laid out for running"):
        unbound.exec(progs["fill"], [a, n, 1], (n, 1, 1))
    with pytest.raises(RuntimeError, match="was laid out for running"):
        unbound.layout()
    dev.allocator.free(a)


def test_replay_refuses_a_faulted_channel(mock: MockNV) -> None:
    """A replay reads its own channel's error notifier before writing anything: once RM has reported an
    error there, the replay raises DeviceFault instead of ringing a dead channel's doorbell."""
    d = make(mock)
    lib = d.compiler.compile(KERNELS.format(arch=d.arch))
    a = d.allocator.alloc(8 * 16)
    w, s = Variable("w", 0, 1 << 40), Variable("s", 0, 1 << 40)
    q = d.queue().wait(d.timeline_signal, w).exec(d.program("fill", lib), [a, 16, 3], (16, 1, 1))
    q.signal(d.timeline_signal, s).bind(d)
    v = d.timeline_value
    run(d, q, {w: v - 1, s: v})
    status = d.nv.compute._notifier_status
    submissions = d.nv.compute.submissions
    status[0] = 0xFFFF  # what RM writes into the notifier on a channel error
    with pytest.raises(DeviceFault, match="compute channel error"):
        q.submit(d, {w: v, s: v + 1})
    assert d.nv.compute.submissions == submissions  # nothing was published
    status[0] = 0
    d.close()
    with pytest.raises(DeviceFault, match="is closed"):
        q.submit(d, {w: v, s: v + 1})
    gc.collect()


def test_kernel_fault_surfaces_as_device_fault(mock: MockNV) -> None:
    d = make(mock)
    try:
        lib = d.compiler.compile(KERNELS.format(arch=d.arch))
        fill = d.program("fill", lib)
        bad = d.nv.window_base + d.nv.window_size - 0x10000  # inside the window, never mapped
        fill(HCQBuffer(bad, 32), global_size=(4, 1, 1), vals=(4, 1))
        with pytest.raises(DeviceFault, match="Xid-style code\\) 31.*kernel store of 8 bytes at unmapped"):
            d.synchronize(timeout_s=5)
        assert mock.gpu.faults[-1].va == bad and mock.gpu.faults[-1].kind == "MMU_FAULT"
        with pytest.raises(DeviceFault):
            d.queue().signal(d.timeline_signal, 99).submit(d)  # the channel is dead (RC), like hardware
    finally:
        d.close()
    assert all(not v for v in mock.leaks().values()), mock.leaks()


def test_programs_and_buffers_are_released(mock: MockNV) -> None:
    d = make(mock)
    lib = d.compiler.compile(KERNELS.format(arch=d.arch))
    p = d.program("fill", lib)
    va = p.image.va
    assert va in d.nv.buffers
    del p
    gc.collect()
    d.synchronize()  # released once the GPU is done with it (nothing waits inside a finalizer)
    assert va not in d.nv.buffers  # the image is freed with its program
    bufs = [d.allocator.alloc(1000) for _ in range(4)]
    for b in bufs:
        d.allocator.free(b)
    d.allocator.free_cache()
    d.synchronize()
    assert all(b.va_addr not in d.nv.buffers for b in bufs)
    d.close()
    assert all(not v for v in mock.leaks().values()), mock.leaks()


# ------------------------------------------------------------------------------------------- QMD builders
def test_qmd_fields_checks_and_symbolic_words() -> None:
    q = QMDV04()
    with pytest.raises(ValueError, match="GRID_HEIGHT = 0x10000 does not fit bits 1071:1056"):
        q.set("GRID_HEIGHT", 1 << 16)
    with pytest.raises(KeyError, match="no field 'GRID_WIDTH_TYPO'"):
        q.set("GRID_WIDTH_TYPO", 1)
    base = Variable("base", 0, 1 << 40)
    q.grid(base // 7, 2).constant_buffer(0, base + 0x1C0, 0x240).program(0x12_3456_7800, 0x300)
    words = q.words()
    assert len(words) == 96 and isinstance(words[32], UOp) and words[33] == 2  # GRID_WIDTH is dword 32
    at = 0x40_0000_0000
    assert sym_eval(words[32], {base: at}) == (at // 7) & 0xFFFFFFFF  # masked to the 32-bit field
    assert sym_eval(words[48], {base: at}) == ((at + 0x1C0) >> 6) & 0xFFFFFFFF  # ADDR_LOWER_SHIFTED6
    assert sym_eval(words[49], {base: at}) == ((at + 0x1C0) >> 38) | ((0x240 >> 4) << 19)  # upper | size
    assert words[38] == 0x3456_7800 and words[39] == 0x12  # PROGRAM_ADDRESS lower / upper
    for layout in (QMDV03, QMDV04):  # no two fields of a table share a bit
        bits: dict[int, str] = {}
        for name, (hi, lo) in layout.FIELDS.items():
            assert hi >= lo and hi < 8 * layout.SIZE_BYTES, name
            for b in range(lo, hi + 1):
                assert b not in bits, f"{layout.NAME}: {name} overlaps {bits[b]}"
                bits[b] = name
    assert QMDV03().release(0x1000, 5) and QMDV03().chain(0x2000).get("DEPENDENT_QMD0_POINTER") == 0x20
    for layout in (QMDV03, QMDV04):  # a constant bank holds at most 64 KiB
        layout().constant_buffer(0, 0x1000, 0x10000)
        with pytest.raises(ValueError, match="constant buffer 0 of 65552 bytes exceeds the 65536-byte limit"):
            layout().constant_buffer(0, 0x1000, 0x10010)


# ------------------------------------------------------------------------------------------- images
def test_ptx_only_image_and_appended_section(dev: NVHCQDevice) -> None:
    src = KERNELS.format(arch=dev.arch)
    lib = NVCompiler(dev.arch, "none").compile(src)
    info = program_info(lib, "add1", dev.arch)
    assert info.ptx == src and not info.has_sass and info.text_offset % 128 == 0
    assert [(p.name, p.offset, p.size) for p in info.params] == [("out", 0, 8), ("inp", 8, 8), ("n", 16, 8)]
    params = ptx_params(".entry k(.param .u32 a, .param .u64 .ptr.global .align 16 b, .param .u8 c[3])", "k")
    assert [(p.name, p.type, p.offset, p.size) for p in params] == [("a", ".u32", 0, 4), ("b", ".u64", 16, 8),
                                                                    ("c", ".u8", 24, 3)]
    # a cubin keeps every byte where it was when the PTX section is appended (only the ELF header changes)
    base = write_elf([Section(".text.k", elf.SHT_PROGBITS, elf.SHF_EXECINSTR, b"\x01" * 256, 128)])
    grown = append_section(base, ".rawgrad.ptx", b"ptx!")
    assert grown[64:len(base)] == base[64:]
    f = elf.ElfFile.parse(grown)
    assert f.section(".text.k").data == b"\x01" * 256 and f.section(".rawgrad.ptx").data == b"ptx!"
    if find_nvjitlink() is None:
        with pytest.raises(NoAssemblerError, match="nvJitLink"):
            NVCompiler(dev.arch, "nvjitlink")


# ------------------------------------------------------------------------------------------- registry
def test_probe_and_factory_never_fall_back_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a real NVIDIA driver is present")
    monkeypatch.setenv("NV_MOCK", "1")
    monkeypatch.delenv("DEV", raising=False)
    assert not _probe() and Device.DEFAULT != "NV"  # the mock is never auto-detected
    monkeypatch.setenv("NV_MOCK", "0")
    with pytest.raises(Exception, match="/dev/nvidiactl"):
        open_device("NV")  # the real driver path, without a driver: fails loudly
    monkeypatch.setenv("NV_MOCK", "1")
    monkeypatch.setenv("NV_MOCK_PROFILE", "volta")
    with pytest.raises(ValueError, match="NV_MOCK_PROFILE='volta'"):
        open_device("NV")
    monkeypatch.setenv("NV_MOCK_PROFILE", "ampere")
    d = open_device("NV:1")
    try:
        assert d.arch == "sm_86" and d.name == "NV:1" and d.qmd_class is QMDV03
    finally:
        d.close()
    assert all(not v for v in d.owned_mock.leaks().values())


# ------------------------------------------------------------------------------------------- tensors
def test_tensor_ops_on_nv(nv: str) -> None:
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((5, 7)).astype(np.float32)
    b_np = rng.standard_normal((7, 3)).astype(np.float32)
    a, b = Tensor(a_np, device=nv), Tensor(b_np, device=nv)
    np.testing.assert_allclose((a * 2 + 1).exp().numpy(), np.exp(a_np * 2 + 1), rtol=1e-5)  # elementwise
    np.testing.assert_allclose(a.sum(axis=1).numpy(), a_np.sum(axis=1), rtol=1e-5, atol=1e-6)  # reduce
    np.testing.assert_allclose(a.max().numpy(), a_np.max())
    np.testing.assert_allclose((a @ b).numpy(), a_np @ b_np, rtol=1e-5, atol=1e-5)  # matmul
    moved = a.permute(1, 0)[1:4, ::2].flip(0)  # movement ops
    np.testing.assert_array_equal(moved.numpy(), a_np.T[1:4, ::2][::-1])
    np.testing.assert_array_equal(a.pad(((1, 0), (0, 2))).numpy(), np.pad(a_np, ((1, 0), (0, 2))))
    i = Tensor(np.arange(10, dtype=np.int32), device=nv)
    np.testing.assert_array_equal((i * 3 % 7).numpy(), np.arange(10) * 3 % 7)


def test_symbolic_shape_on_nv(nv: str) -> None:
    n = Variable("n", 1, 16)
    x_np = np.arange(16, dtype=np.float32)
    x = Tensor(x_np, device=nv)
    for k in (3, 16):
        y = (x[:n.bind(k)] * 2).sum()
        np.testing.assert_allclose(y.numpy(), (x_np[:k] * 2).sum())


def test_tinyjit_capture_and_replay_on_nv(nv: str) -> None:
    dev: Any = Device[nv]
    rng = np.random.default_rng(1)
    w = Tensor(rng.standard_normal((8, 4)).astype(np.float32), device=nv)

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return ((x @ w).relu() + 1).sum(axis=1)

    for i in range(4):
        x_np = rng.standard_normal((3, 8)).astype(np.float32)
        before = dev.nv.compute.submissions
        got = step(Tensor(x_np, device=nv)).numpy()
        np.testing.assert_allclose(got, (np.maximum(x_np @ w.numpy(), 0) + 1).sum(axis=1), rtol=1e-5)
        if i >= 2:  # a replay is one submission of the bound queue
            assert dev.nv.compute.submissions - before == 1
    assert step.last is not None and step.last.kernel_count >= 2
