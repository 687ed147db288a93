"""The Objective-C bridge (drivers/metal/objc.py) driven through the mock runtime's libffi trampolines."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from rawgrad.drivers.metal import api
from rawgrad.drivers.metal.api import METHODS, MTL_LANGUAGE_VERSION_3_1, MTL_RESOURCE_STORAGE_SHARED, Method
from rawgrad.drivers.metal.mock.objc_fake import FakeObjCRuntime, FakeObject, MockObjCFault
from rawgrad.drivers.metal.objc import FFI, LibObjC, MetalUnavailable, ObjC, ObjCError

KERNEL = "kernel void add_one(device float* buf0 [[buffer(0)]]) { }"


def compile_pipeline(objc: ObjC, device, source: str = KERNEL, name: str = "add_one"):
    """Library, function and pipeline for `name`; returns the owned pipeline (the rest released)."""
    src = objc.ns_string(source)
    opts = objc.alloc_init("MTLCompileOptions", "init")
    objc.send(opts, "setFastMathEnabled:", False)
    objc.send(opts, "setLanguageVersion:", MTL_LANGUAGE_VERSION_3_1)
    with objc.autorelease_pool():
        err = objc.error_slot()
        lib = objc.new(device, "newLibraryWithSource:options:error:", src, opts, err, error=err)
    fname = objc.ns_string(name)
    fn = objc.new(lib, "newFunctionWithName:", fname)
    with objc.autorelease_pool():
        err = objc.error_slot()
        pipe = objc.new(device, "newComputePipelineStateWithFunction:error:", fn, err, error=err)
    for r in (src, opts, fname, fn, lib):
        r.release()
    return pipe


def test_every_table_method_matches_a_fake_prototype() -> None:
    """The driver's table and the fakes were written separately from Apple's docs: they must agree."""
    from rawgrad.drivers.metal.mock import objc_fake
    fake_protos: dict[str, set[str]] = {}
    for cls in vars(objc_fake).values():
        if isinstance(cls, type) and issubclass(cls, FakeObject):
            for _, m in cls._methods.values():
                fake_protos.setdefault(m.selector, set()).add(m.prototype)
    rt = FakeObjCRuntime()
    for c in rt.classes.values():
        for _, m in c.methods.values():
            fake_protos.setdefault(m.selector, set()).add(m.prototype)
    for sel, m in METHODS.items():
        assert fake_protos.get(sel) == {m.prototype}, sel


def test_casts_are_made_once_per_prototype(objc: ObjC, fake: FakeObjCRuntime) -> None:
    dev = objc.system_default_device()
    bufs = [objc.new(dev, "newBufferWithLength:options:", 64 * (k + 1), MTL_RESOURCE_STORAGE_SHARED)
            for k in range(5)]
    lengths = [objc.send(b, "length") for b in bufs]
    assert lengths == [64, 128, 192, 256, 320]
    proto_len = METHODS["length"].prototype
    proto_new = METHODS["newBufferWithLength:options:"].prototype
    # one cast and one trampoline per prototype, however many calls went through them
    assert proto_len in objc.casts and proto_new in objc.casts
    assert fake.calls[proto_len] == 5 and fake.calls[proto_new] == 5
    assert len(fake.trampolines) == len(objc.casts)
    assert objc.sel("length") is objc.sel("length")
    for b in bufs:
        b.release()
    dev.release()


def test_buffer_contents_is_shared_memory_and_gpu_address_differs(objc: ObjC, fake: FakeObjCRuntime) -> None:
    dev = objc.system_default_device()
    buf = objc.new(dev, "newBufferWithLength:options:", 16, MTL_RESOURCE_STORAGE_SHARED)
    ptr = objc.send(buf, "contents")
    FFI.memmove(FFI.cast("char *", ptr), struct.pack("<4f", 1, 2, 3, 4), 16)
    fake_buf = fake.objects[buf.ptr]
    np.testing.assert_array_equal(fake_buf.data.view(np.float32), [1, 2, 3, 4])
    gpu = objc.send(buf, "gpuAddress")
    assert gpu and gpu != ptr
    buf.release()
    dev.release()


def test_struct_and_double_returns(objc: ObjC) -> None:
    dev = objc.system_default_device()
    assert objc.send(dev, "maxThreadsPerThreadgroup") == (1024, 1024, 1024)
    with objc.autorelease_pool():
        assert objc.py_string(objc.send(dev, "name")).startswith("rawgrad mock")
        q = objc.new(dev, "newCommandQueue")
        cb = objc.send(q, "commandBuffer")
        objc.send(cb, "commit")
        objc.send(cb, "waitUntilCompleted")
        start, end = objc.send(cb, "GPUStartTime"), objc.send(cb, "GPUEndTime")
        assert isinstance(start, float) and 0 < start <= end
    q.release()
    dev.release()


def test_dispatch_passes_structs_by_value_and_bytes(objc: ObjC, fake: FakeObjCRuntime) -> None:
    dev = objc.system_default_device()
    pipe = compile_pipeline(objc, dev)
    buf = objc.new(dev, "newBufferWithLength:options:", 256, MTL_RESOURCE_STORAGE_SHARED)
    q = objc.new(dev, "newCommandQueue")
    scalars = FFI.new("int64_t[2]", [7, -3])
    with objc.autorelease_pool():
        cb = objc.send(q, "commandBuffer")
        enc = objc.send(cb, "computeCommandEncoder")
        objc.send(enc, "setComputePipelineState:", pipe)
        objc.send(enc, "setBuffer:offset:atIndex:", buf, 64, 0)
        objc.send(enc, "setBytes:length:atIndex:", scalars, 16, 1)
        objc.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (3, 2, 1), (128, 1, 1))
        objc.send(enc, "endEncoding")
        objc.send(cb, "commit")
        objc.send(cb, "waitUntilCompleted")
    (d,) = fake.dispatches
    assert d.kernel == "add_one" and d.threadgroups == (3, 2, 1) and d.threads_per_threadgroup == (128, 1, 1)
    assert d.buffers[0][0] is fake.objects[buf.ptr] and d.buffers[0][1] == 64
    assert struct.unpack("<2q", d.bytes_args[1]) == (7, -3)
    for r in (q, buf, pipe, dev):
        r.release()


def test_owned_results_must_be_taken_with_new(objc: ObjC) -> None:
    dev = objc.system_default_device()
    with pytest.raises(ObjCError, match="owned.*ObjC.new"):
        objc.send(dev, "newCommandQueue")
    with pytest.raises(ObjCError, match="does not return an owned"):
        objc.new(dev, "maxThreadsPerThreadgroup")
    dev.release()


def test_double_release_through_ref_is_refused(objc: ObjC) -> None:
    dev = objc.system_default_device()
    dev.release()
    with pytest.raises(ObjCError, match="released twice"):
        dev.release()


def test_leak_is_caught_by_the_ledger(fake: FakeObjCRuntime) -> None:
    objc = ObjC(fake)
    dev = objc.system_default_device()
    objc.new(dev, "newSharedEvent")  # never released
    dev.release()
    with pytest.raises(MockObjCFault, match="1 object\\(s\\) leaked.*MTLSharedEvent"):
        fake.assert_balanced()


def test_over_release_is_caught(fake: FakeObjCRuntime) -> None:
    objc = ObjC(fake)
    dev = objc.system_default_device()
    ptr = dev.ptr
    dev.release()
    with pytest.raises(MockObjCFault, match="deallocated"):
        objc.send(ptr, "release")


def test_autorelease_without_pool_is_caught(fake: FakeObjCRuntime) -> None:
    objc = ObjC(fake)
    dev = objc.system_default_device()
    q = objc.new(dev, "newCommandQueue")
    with pytest.raises(MockObjCFault, match="no pool in place"):
        objc.send(q, "commandBuffer")
    q.release()
    dev.release()


def test_retain_keeps_an_autoreleased_object_past_its_pool(objc: ObjC, fake: FakeObjCRuntime) -> None:
    dev = objc.system_default_device()
    with objc.autorelease_pool():
        name = objc.retain(objc.send(dev, "name"))
    assert not fake.objects[name.ptr].freed
    assert objc.py_string(name) == "rawgrad mock Apple GPU"
    name.release()
    dev.release()


def test_nserror_becomes_a_clear_python_error(objc: ObjC) -> None:
    dev = objc.system_default_device()
    with objc.autorelease_pool(), pytest.raises(ObjCError, match="newLibraryWithSource.*Compilation "
                                                               "failed.*no kernel function.*code 3"):
        src = objc.ns_string("int x;")
        try:
            err = objc.error_slot()
            objc.new(dev, "newLibraryWithSource:options:error:", src, 0, err, error=err)
        finally:
            src.release()
    dev.release()


def test_missing_function_is_nil_and_named(objc: ObjC) -> None:
    dev = objc.system_default_device()
    src = objc.ns_string(KERNEL)
    with objc.autorelease_pool():
        err = objc.error_slot()
        lib = objc.new(dev, "newLibraryWithSource:options:error:", src, 0, err, error=err)
    name = objc.ns_string("nope")
    with pytest.raises(ObjCError, match="newFunctionWithName.*nil"):
        objc.new(lib, "newFunctionWithName:", name)
    for r in (name, lib, src, dev):
        r.release()


def test_wrong_prototype_is_caught(fake: FakeObjCRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table entry with the wrong return type (uint32_t for NSUInteger) arrives through another
    trampoline, which the fake rejects by prototype."""
    monkeypatch.setitem(api.METHODS, "length", Method("length", "uint32_t"))
    objc = ObjC(fake)
    dev = objc.system_default_device()
    buf = objc.new(dev, "newBufferWithLength:options:", 8, MTL_RESOURCE_STORAGE_SHARED)
    with pytest.raises(MockObjCFault, match=r"length\] called through prototype uint32_t\(\*\)"):
        objc.send(buf, "length")


def test_unknown_selector_and_nil_receiver(objc: ObjC, fake: FakeObjCRuntime) -> None:
    dev = objc.system_default_device()
    with pytest.raises(KeyError, match="not in the Metal method table"):
        objc.send(dev, "frobnicate")
    with pytest.raises(MockObjCFault, match=r"-\[MTLDevice contents\]: unrecognized selector"):
        objc.send(dev, "contents")
    fake.faults.clear()
    with pytest.raises(ObjCError, match="sent to nil"):
        objc.send(0, "length")
    with pytest.raises(ObjCError, match="class 'MTLNothing' does not exist"):
        objc.cls("MTLNothing")
    dev.release()


def test_buffer_index_out_of_range_is_caught(fake: FakeObjCRuntime) -> None:
    objc = ObjC(fake)
    dev = objc.system_default_device()
    buf = objc.new(dev, "newBufferWithLength:options:", 8, MTL_RESOURCE_STORAGE_SHARED)
    q = objc.new(dev, "newCommandQueue")
    with objc.autorelease_pool():
        enc = objc.send(objc.send(q, "commandBuffer"), "computeCommandEncoder")
        with pytest.raises(MockObjCFault, match="buffer index 31 is out of range"):
            objc.send(enc, "setBuffer:offset:atIndex:", buf, 0, 31)


def test_shared_event_orders_command_buffers(objc: ObjC, fake: FakeObjCRuntime) -> None:
    """A wait blocks its buffer and every later buffer of the queue until the host raises the event."""
    dev = objc.system_default_device()
    q = objc.new(dev, "newCommandQueue")
    ev = objc.new(dev, "newSharedEvent")
    with objc.autorelease_pool():
        first = objc.send(q, "commandBuffer")
        objc.send(first, "encodeWaitForEvent:value:", ev, 1)
        objc.send(first, "encodeSignalEvent:value:", ev, 2)
        objc.send(first, "commit")
        second = objc.send(q, "commandBuffer")
        objc.send(second, "encodeSignalEvent:value:", ev, 3)
        objc.send(second, "commit")
        assert objc.send(ev, "signaledValue") == 0 and objc.send(second, "status") != 4
        with pytest.raises(MockObjCFault, match="never return.*reach 1"):
            objc.send(second, "waitUntilCompleted")
        fake.faults.clear()
        objc.send(ev, "setSignaledValue:", 1)
        assert objc.send(ev, "signaledValue") == 3
        assert objc.send(first, "status") == objc.send(second, "status") == 4
    with pytest.raises(MockObjCFault, match="only increase"):
        objc.send(ev, "setSignaledValue:", 2)
    fake.faults.clear()
    for r in (ev, q, dev):
        r.release()


def test_commit_with_open_encoder_is_caught(fake: FakeObjCRuntime) -> None:
    objc = ObjC(fake)
    dev = objc.system_default_device()
    q = objc.new(dev, "newCommandQueue")
    with objc.autorelease_pool():
        cb = objc.send(q, "commandBuffer")
        objc.send(cb, "computeCommandEncoder")
        with pytest.raises(MockObjCFault, match="still encoding"):
            objc.send(cb, "commit")


def test_queue_keeps_resources_until_completion(objc: ObjC, fake: FakeObjCRuntime) -> None:
    """A buffer released by the driver while a blocked command buffer still uses it stays alive (the
    command buffer retains it), and is freed once the work completes."""
    dev = objc.system_default_device()
    pipe = compile_pipeline(objc, dev)
    q = objc.new(dev, "newCommandQueue")
    ev = objc.new(dev, "newSharedEvent")
    buf = objc.new(dev, "newBufferWithLength:options:", 64, MTL_RESOURCE_STORAGE_SHARED)
    fbuf = fake.objects[buf.ptr]
    with objc.autorelease_pool():
        cb = objc.send(q, "commandBuffer")
        objc.send(cb, "encodeWaitForEvent:value:", ev, 1)
        enc = objc.send(cb, "computeCommandEncoder")
        objc.send(enc, "setComputePipelineState:", pipe)
        objc.send(enc, "setBuffer:offset:atIndex:", buf, 0, 0)
        objc.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (1, 1, 1))
        objc.send(enc, "endEncoding")
        objc.send(cb, "commit")
    buf.release()
    assert not fbuf.freed and not fake.dispatches
    objc.send(ev, "setSignaledValue:", 1)
    assert fbuf.freed and len(fake.dispatches) == 1
    for r in (ev, q, pipe, dev):
        r.release()


def test_no_leak_after_many_submits(objc: ObjC, fake: FakeObjCRuntime) -> None:
    dev = objc.system_default_device()
    pipe = compile_pipeline(objc, dev)
    q = objc.new(dev, "newCommandQueue")
    ev = objc.new(dev, "newSharedEvent")
    buf = objc.new(dev, "newBufferWithLength:options:", 64, MTL_RESOURCE_STORAGE_SHARED)
    for v in range(1, 51):
        with objc.autorelease_pool():
            cb = objc.send(q, "commandBuffer")
            objc.send(cb, "encodeWaitForEvent:value:", ev, v - 1)
            enc = objc.send(cb, "computeCommandEncoder")
            objc.send(enc, "setComputePipelineState:", pipe)
            objc.send(enc, "setBuffer:offset:atIndex:", buf, 0, 0)
            objc.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (1, 1, 1), (32, 1, 1))
            objc.send(enc, "endEncoding")
            objc.send(cb, "encodeSignalEvent:value:", ev, v)
            objc.send(cb, "commit")
    assert objc.send(ev, "signaledValue") == 50 and len(fake.dispatches) == 50
    # only what the test still owns is alive: device, pipeline (holding its function, which holds the
    # library), queue, event, buffer; the 50 command buffers and encoders are gone
    assert sorted(o.cls_name for o in fake.leaks()) == sorted(
        ["MTLDevice", "MTLComputePipelineState", "MTLFunction", "MTLLibrary", "MTLCommandQueue",
         "MTLSharedEvent", "MTLBuffer"])
    for r in (buf, ev, q, pipe, dev):
        r.release()


def test_production_runtime_refuses_linux_and_intel_macs() -> None:
    with pytest.raises(MetalUnavailable, match="Metal needs macOS; this is Linux"):
        LibObjC(system="Linux", machine="x86_64")
    with pytest.raises(MetalUnavailable, match="x86_64 Macs is out of scope.*objc_msgSend_stret"):
        LibObjC(system="Darwin", machine="x86_64")


def test_method_table_rejects_arity_mismatch() -> None:
    with pytest.raises(ValueError, match="takes 2 arguments"):
        Method("setBuffer:atIndex:", "void", ("id",))
