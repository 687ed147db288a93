"""The Metal HCQ device on the mock runtime (DEV=METAL METAL_MOCK=1): tensors run through the bridge with the
rendered MSL executed on the host, TinyJit replays as one command buffer executing an indirect command buffer
(ICB), saved graphs load and replay in a fresh process, the ledger is balanced after close, and each fault
the brief lists is a clear error."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rawgrad import Device, Tensor, TinyJit
from rawgrad.drivers.metal.api import MTL_RESOURCE_STORAGE_SHARED, Method
from rawgrad.drivers.metal.device import MetalDevice, open_mock
from rawgrad.drivers.metal.mock.objc_fake import FakeObjCRuntime, MockObjCFault
from rawgrad.drivers.metal.objc import ObjCError
from rawgrad.hcq import DeviceTimeout

SHORT_S = 0.2


@pytest.fixture
def metal(monkeypatch: pytest.MonkeyPatch) -> Iterator[MetalDevice]:
    """The registry's METAL device on the mock; closed after the test with its ledger checked."""
    monkeypatch.setenv("METAL_MOCK", "1")
    Device.close("METAL")
    dev = Device["METAL"]
    assert isinstance(dev, MetalDevice)
    rt = dev.objc.rt
    assert isinstance(rt, FakeObjCRuntime)
    yield dev
    Device.close("METAL")
    rt.assert_balanced()  # every buffer, event, pipeline, ICB and command buffer released, no fault


@pytest.fixture
def fresh() -> Iterator[MetalDevice]:
    dev = open_mock("METAL", timeout_s=5.0)
    yield dev
    if not dev.closed:
        dev.close()


def test_tensor_ops_run_on_the_mock_and_the_ledger_balances(metal: MetalDevice) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 40)).astype(np.float32), rng.standard_normal((8, 40)).astype(np.float32)
    ta, tb = Tensor(a, device="METAL"), Tensor(b, device="METAL")
    np.testing.assert_allclose((ta * tb + 1).relu().numpy(), np.maximum(a * b + 1, 0), rtol=1e-6)
    np.testing.assert_allclose(ta.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)  # SIMD-group butterfly
    np.testing.assert_allclose((ta @ tb.T).numpy(), a @ b.T, rtol=1e-5, atol=1e-5)
    rt = metal.objc.rt
    assert isinstance(rt, FakeObjCRuntime) and len(rt.dispatches) >= 3


def test_tinyjit_replays_as_one_icb_command_buffer(metal: MetalDevice) -> None:
    rt = metal.objc.rt
    assert isinstance(rt, FakeObjCRuntime)
    f = TinyJit(lambda x, y: ((x * 2 + y).relu() * 3).sum(1).contiguous())
    rng = np.random.default_rng(1)
    for k in range(4):
        x = rng.standard_normal((4, 32)).astype(np.float32)
        y = rng.standard_normal((4, 32)).astype(np.float32)
        before = rt.icb_runs
        got = f(Tensor(x, device="METAL"), Tensor(y, device="METAL")).numpy()
        np.testing.assert_allclose(got, (np.maximum(x * 2 + y, 0) * 3).sum(1), rtol=1e-5, atol=1e-5)
        if k >= 2:  # captured on the second call; later calls replay the ICB
            assert rt.icb_runs > before, f"call {k} did not execute an indirect command buffer"


def test_a_symbolic_jit_replay_patches_sizes_and_scalars(metal: MetalDevice) -> None:
    from rawgrad.compiler.ir import Variable
    n = Variable("metal_test.n", 1, 64)
    f = TinyJit(lambda x, k: (x[:k] * 2 + 1).contiguous())
    base = np.arange(64, dtype=np.float32)
    x = Tensor(base, device="METAL").realize()
    for size in (5, 9, 30, 64, 3):
        got = f(x, n.bind(size))
        np.testing.assert_array_equal(got.numpy()[:size], base[:size] * 2 + 1)


def test_saved_graph_loads_and_replays_in_a_fresh_process(metal: MetalDevice, tmp_path: Path) -> None:
    f = TinyJit(lambda x: (x * 3 + 1).exp2().contiguous())
    a = np.linspace(-2, 2, 48, dtype=np.float32)
    for k in range(3):
        got = f(Tensor(a + k, device="METAL")).numpy()
        np.testing.assert_allclose(got, np.exp2((a + k) * 3 + 1), rtol=1e-6)
    path = tmp_path / "metal.rgjit"
    f.save(str(path))
    eager = (Tensor(a - 0.5, device="METAL") * 3 + 1).exp2().numpy()
    script = textwrap.dedent(f"""
        import numpy as np
        from rawgrad import Device, Tensor, TinyJit
        g = TinyJit.load({str(path)!r})
        a = np.linspace(-2, 2, 48, dtype=np.float32)
        out = g(Tensor(a - 0.5, device="METAL")).numpy()
        rt = Device["METAL"].objc.rt
        assert rt.icb_runs >= 1, "the loaded graph did not replay as an ICB"
        np.save({str(tmp_path / 'out.npy')!r}, out)
        Device.close("METAL")
        rt.assert_balanced()
    """)
    env = dict(os.environ, DEV="METAL", METAL_MOCK="1")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), eager)


# ------------------------------------------------------------------------------ faults
def test_unknown_selector_is_refused_by_the_table_and_by_the_runtime(fresh: MetalDevice) -> None:
    with pytest.raises(KeyError, match="'frobnicate' is not in the Metal method table"):
        fresh.objc.send(fresh.dev, "frobnicate")
    with pytest.raises(MockObjCFault, match=r"-\[MTLDevice frobnicate\]: unrecognized selector"):
        fresh.objc._send(Method("frobnicate", "void"), fresh.dev, ())


def test_a_prototype_mismatch_is_caught(fresh: MetalDevice) -> None:
    with pytest.raises(MockObjCFault, match="called through prototype"):  # the event takes a uint64_t
        fresh.objc._send(Method("setSignaledValue:", "void", ("uint32_t",)), fresh.timeline_signal.address,
                         (1,))
    fresh.objc.rt.faults.clear()  # (recorded as well; this test made it on purpose)


def test_a_leaked_object_fails_the_ledger() -> None:
    dev = open_mock("METAL", timeout_s=5.0)
    rt = dev.objc.rt
    assert isinstance(rt, FakeObjCRuntime)
    stray = dev.objc.new(dev.dev, "newBufferWithLength:options:", 64, MTL_RESOURCE_STORAGE_SHARED)
    dev.close()
    with pytest.raises(MockObjCFault, match=r"1 object\(s\) leaked: <MTLBuffer"):
        rt.assert_balanced()
    stray.release()
    rt.assert_balanced()


def test_a_wait_that_never_completes_times_out_naming_the_signal(fresh: MetalDevice) -> None:
    gate = fresh.new_signal(0, name="gate")
    with pytest.raises(DeviceTimeout, match="gate >= 1"):
        gate.wait(1, SHORT_S)
    value, q = fresh.timeline_submit(lambda q: q.wait(gate, 1))
    with pytest.raises(DeviceTimeout, match="synchronize timed out"):
        fresh.synchronize(SHORT_S)
    gate.value = 1
    fresh.synchronize(5.0)
    assert fresh.timeline_signal.value == value


def test_msl_that_does_not_compile_is_a_clear_error(fresh: MetalDevice) -> None:
    bad = b"#include <metal_stdlib>\nkernel void k(device float* buf0 [[buffer(0)]]) { buf0[0] = nope; }\n"
    with pytest.raises(ObjCError, match="(?s)newLibraryWithSource.*Compilation failed.*nope.*NSError code 3"):
        fresh.program("k", bad)


def test_a_full_command_buffer_window_times_out_naming_the_queue() -> None:
    dev = open_mock("METAL", timeout_s=SHORT_S, max_command_buffers=2)
    try:
        gate = dev.new_signal(0, name="gate")
        dev.timeline_submit(lambda q: q.wait(gate, 1))
        dev.timeline_submit()
        with pytest.raises(DeviceTimeout, match="command buffer window full"):
            dev.timeline_submit()
        gate.value = 1
        dev.synchronize(5.0)
    finally:
        dev.close()


def test_icb_commands_must_have_their_buffers_made_resident(fresh: MetalDevice) -> None:
    """Apple: an ICB's commands reach only resources the executing encoder declared with useResource."""
    objc = fresh.objc
    buf = fresh.alloc_buffer(64)
    src = (b"#include <metal_stdlib>\nusing namespace metal;\n"
           b"kernel void one(device float* buf0 [[buffer(0)]], uint lid [[thread_index_in_threadgroup]]) "
           b"{ buf0[lid] = 1.0f; }\n")
    prog = fresh.program("one", src)
    icb = fresh.new_icb(1, 1)
    cmd = objc.send(icb, "indirectComputeCommandAtIndex:", 0)
    objc.send(cmd, "setComputePipelineState:", prog.pipeline)
    objc.send(cmd, "setKernelBuffer:offset:atIndex:", buf.ref, 0, 0)
    objc.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (4, 1, 1))
    with objc.autorelease_pool():
        cb = objc.send(fresh.queue_ref, "commandBuffer")
        enc = objc.send(cb, "computeCommandEncoder")
        objc.send(enc, "executeCommandsInBuffer:withRange:", icb, (0, 1))  # no useResource
        objc.send(enc, "endEncoding")
        with pytest.raises(MockObjCFault, match="not made resident with useResource"):
            objc.send(cb, "commit")
    fresh.objc.rt.faults.clear()


def test_a_kernel_fault_fails_its_command_buffer_and_the_device(fresh: MetalDevice) -> None:
    src = (b"#include <metal_stdlib>\nusing namespace metal;\n"
           b"kernel void uneven(device float* buf0 [[buffer(0)]], uint lid [[thread_index_in_threadgroup]]) "
           b"{\n  if (lid < 3u) threadgroup_barrier(mem_flags::mem_threadgroup);\n  buf0[lid] = 1.0f;\n}\n")
    prog = fresh.program("uneven", src)
    buf = fresh.allocator.alloc(64)
    fresh.timeline_submit(lambda q: q.exec(prog, [buf], (8, 1, 1), (8, 1, 1)))
    from rawgrad.hcq import DeviceFault
    with pytest.raises(DeviceFault, match="barrier mismatch in threadgroup 0: lane 3"):
        fresh.synchronize(5.0)


def test_the_first_mac_smoke_passes_on_the_mock() -> None:
    """rawgrad/drivers/metal/smoke.py, the step-by-step check for the first Mac, rehearsed on the mock (it
    found a bound-replay bug: a command mixing a fixed and a patched buffer lost the fixed one)."""
    from rawgrad.drivers.metal.smoke import run_steps
    dev = open_mock("METAL", timeout_s=10.0)
    rt = dev.objc.rt
    assert isinstance(rt, FakeObjCRuntime)
    lines: list[str] = []
    try:
        assert run_steps(dev, lines.append), "\n".join(lines)
    finally:
        dev.close()
    assert len(lines) == 5 and all(line.startswith("ok") for line in lines)
    rt.assert_balanced()


def test_a_dropped_graph_releases_its_icb_and_argument_buffer(fresh: MetalDevice) -> None:
    import gc

    from rawgrad.compiler.ir import Variable
    from rawgrad.drivers.metal.mock.objc_fake import FakeBuffer, FakeICB
    from rawgrad.hcq.graph import HCQGraph, KernelCommand, address_var, build_template
    rt = fresh.objc.rt
    assert isinstance(rt, FakeObjCRuntime)
    src = (b"#include <metal_stdlib>\nusing namespace metal;\n"
           b"kernel void fill(device float* buf0 [[buffer(0)]], constant long* vars [[buffer(1)]], "
           b"uint lid [[thread_index_in_threadgroup]]) { buf0[lid] = (float)vars[0]; }\n")
    prog = fresh.program("fill", src)
    n, dst = Variable("metal_test.fill", 0, 100), address_var("metal_test.dst")

    def live(cls: type) -> int:
        return sum(1 for o in rt.leaks() if isinstance(o, cls))

    buffers = live(FakeBuffer)
    template, programs = build_template(fresh, [KernelCommand(prog, [dst, n], (4, 1, 1), (4, 1, 1))])
    graph = HCQGraph(fresh, template, programs, {})
    out = fresh.allocator.alloc(16)
    graph.submit({dst: out.va_addr, n: 7})
    fresh.synchronize(5.0)
    got = np.empty(4, np.float32)
    fresh.allocator.copyout(got.data, out)
    np.testing.assert_array_equal(got, np.full(4, 7, np.float32))
    assert live(FakeICB) == 1 and live(FakeBuffer) == buffers + 2  # the output and the argument buffer
    del graph
    gc.collect()
    fresh.reap()
    assert live(FakeICB) == 0 and live(FakeBuffer) == buffers + 1
