"""One rendered kernel through the whole Metal call path on the mock: the bridge compiles the MSL with
newLibraryWithSource (the fake compiler type-checks it through the shim), makes a pipeline, binds buffers
and the scalar words, dispatches, commits inside an autorelease pool and waits; the fake GPU runs the MSL
(host build through the shim) and the result matches the CPU device; the ledger ends balanced."""
from __future__ import annotations

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.compiler.renderer.msl import MSLRenderer
from rawgrad.drivers.metal.api import MTL_LANGUAGE_VERSION_3_1, MTL_RESOURCE_STORAGE_SHARED
from rawgrad.drivers.metal.mock.msl_host import CXX, run_source, type_check_one
from rawgrad.drivers.metal.mock.objc_fake import Dispatch, FakeObjCRuntime
from rawgrad.drivers.metal.objc import FFI, ObjC, ObjCError
from rawgrad.tensor.buffers import buffer_numpy
from rawgrad.tensor.schedule import create_schedule

pytestmark = pytest.mark.skipif(CXX is None, reason="no g++ or clang++ to build MSL through the shim")


def run_dispatch(d: Dispatch) -> None:
    """The fake GPU: run the dispatched kernel's MSL on the host with the bound buffers and scalar words."""
    assert d.pipeline is not None
    source = d.pipeline.function.library.source
    n_buf = len(d.buffers)
    if sorted(d.buffers) != list(range(n_buf)):
        raise AssertionError(f"{d.kernel}: buffers bound at {sorted(d.buffers)}, not 0..{n_buf - 1}")
    pointers = [d.buffers[k][0].contents() + d.buffers[k][1] for k in range(n_buf)]
    words = d.bytes_args.get(n_buf)
    keep = np.frombuffer(words, dtype=np.int64).copy() if words is not None else None
    run_source(source, d.kernel, pointers, keep.ctypes.data if keep is not None else None, d.threadgroups[0],
               d.threads_per_threadgroup[0])


def compile_kernel(objc: ObjC, dev, source: str, name: str):  # type: ignore[no-untyped-def]
    with objc.ns_string(source) as src, objc.alloc_init("MTLCompileOptions", "init") as opts, \
            objc.ns_string(name) as fname:
        objc.send(opts, "setFastMathEnabled:", False)
        objc.send(opts, "setLanguageVersion:", MTL_LANGUAGE_VERSION_3_1)
        with objc.autorelease_pool():
            err = objc.error_slot()
            lib = objc.new(dev, "newLibraryWithSource:options:error:", src, opts, err, error=err)
        with lib, objc.new(lib, "newFunctionWithName:", fname) as fn, objc.autorelease_pool():
            err = objc.error_slot()
            return objc.new(dev, "newComputePipelineStateWithFunction:error:", fn, err, error=err)


def test_rendered_kernel_runs_through_the_bridge_on_the_mock(objc: ObjC, fake: FakeObjCRuntime) -> None:
    fake.msl_compiler = type_check_one
    fake.kernel_runner = run_dispatch
    rng = np.random.default_rng(3)
    a = Tensor(rng.standard_normal(64).astype(np.float32)).realize()
    b = Tensor(rng.standard_normal(64).astype(np.float32)).realize()
    t = (a * 2 + b * 0.5).relu()
    (si,) = [s for s in create_schedule([t.uop])[0] if s.ast is not None]
    r = MSLRenderer()
    prog = r.lower(si.ast, "axpy_relu")
    source = r.render(prog)

    dev = objc.system_default_device()
    pipe = compile_kernel(objc, dev, source, prog.name)
    lib = fake.objects[pipe.ptr].function.library
    assert (lib.fast_math, lib.language_version) == (False, MTL_LANGUAGE_VERSION_3_1)  # IEEE math, MSL 3.1
    hosts = [np.zeros(64, np.float32), buffer_numpy(si.bufs[1]), buffer_numpy(si.bufs[2])]
    bufs = []
    for h in hosts:
        buf = objc.new(dev, "newBufferWithLength:options:", h.nbytes, MTL_RESOURCE_STORAGE_SHARED)
        FFI.memmove(FFI.cast("char *", objc.send(buf, "contents")), h.tobytes(), h.nbytes)
        bufs.append(buf)
    words = FFI.new("int64_t[]", [int(si.var_vals[v]) for v in prog.variables] or [0])
    q = objc.new(dev, "newCommandQueue")
    local = prog.launch.local_size[0]
    groups = -(-prog.launch.global_for_scalars([int(si.var_vals[v]) for v in prog.variables])[0] // local)
    with objc.autorelease_pool():
        cb = objc.send(q, "commandBuffer")
        enc = objc.send(cb, "computeCommandEncoder")
        objc.send(enc, "setComputePipelineState:", pipe)
        for k, buf in enumerate(bufs):
            objc.send(enc, "setBuffer:offset:atIndex:", buf, 0, k)
        if prog.variables:
            objc.send(enc, "setBytes:length:atIndex:", words, 8 * len(prog.variables), len(bufs))
        objc.send(enc, "dispatchThreadgroups:threadsPerThreadgroup:", (groups, 1, 1), (local, 1, 1))
        objc.send(enc, "endEncoding")
        objc.send(cb, "commit")
        objc.send(cb, "waitUntilCompleted")
    out = np.frombuffer(FFI.buffer(FFI.cast("char *", objc.send(bufs[0], "contents")), 256), np.float32)
    np.testing.assert_array_equal(out, t.numpy())
    assert len(fake.dispatches) == 1
    for x in (*bufs, q, pipe, dev):
        x.release()


def test_msl_that_does_not_compile_is_an_nserror(objc: ObjC, fake: FakeObjCRuntime) -> None:
    fake.msl_compiler = type_check_one
    dev = objc.system_default_device()
    bad = "#include <metal_stdlib>\nkernel void k(device float* buf0 [[buffer(0)]]) { buf0[0] = nope; }\n"
    with pytest.raises(ObjCError, match="(?s)newLibraryWithSource.*Compilation failed.*nope.*NSError code 3"):
        compile_kernel(objc, dev, bad, "k")
    dev.release()
