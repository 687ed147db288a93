"""The mock Apple GPU behind `DEV=METAL METAL_MOCK=1`: the fake Objective-C runtime (objc_fake.py) with its
compiler and shader cores wired to the MSL host harness (msl_host.py).

- `newLibraryWithSource:options:error:` builds every kernel of the source for the host through the Metal
  shim; a kernel that does not compile is the NSError a Mac would return (the build is cached by source
  hash, so the dispatch reuses it).
- Every dispatch (direct, or a command of an indirect command buffer) runs the kernel's MSL on the host with
  the bound buffers (their numpy-backed `contents`) and the scalar words, lanes as threads where the kernel
  synchronizes. A run that fails (a barrier mismatch, an unbound argument) fails its command buffer with
  status Error, as a GPU fault would.
"""
from __future__ import annotations

import re

import numpy as np

from rawgrad.drivers.metal.mock.msl_host import MSLHostError, host_kernels
from rawgrad.drivers.metal.mock.objc_fake import Dispatch, FakeObjCRuntime

__all__ = ["MockMetalGPU", "run_dispatch"]

_KERNELS = re.compile(r"kernel void (\w+)\(")


def compile_check(source: str) -> str | None:
    """The fake Metal compiler: None when every kernel of `source` builds for the host, else the message."""
    names = _KERNELS.findall(source)
    if not names:
        return "program has no kernel function"
    try:
        for name in names:
            host_kernels().build(source, name)
    except MSLHostError as e:
        return str(e)
    return None


def run_dispatch(d: Dispatch) -> None:
    """The fake shader cores: run the dispatched kernel's MSL with its argument table."""
    if d.pipeline is None:
        raise MSLHostError(f"{d.kernel}: dispatched without a pipeline")
    source = d.pipeline.function.library.source
    slots = {k: buf.contents() + off for k, (buf, off) in d.buffers.items()}
    keep = []
    for k, data in d.bytes_args.items():  # setBytes copies: the run reads the copy
        words = np.frombuffer(data, dtype=np.uint8).copy()
        keep.append(words)
        slots[k] = int(words.ctypes.data)
    host_kernels().run(source, d.kernel, slots, d.threadgroups, d.threads_per_threadgroup)


class MockMetalGPU:
    """One fake runtime per device instance (its ledger then covers exactly that device); the device opens
    on `rt` (drivers/metal/device.py `open_mock`)."""

    def __init__(self) -> None:
        self.rt = FakeObjCRuntime()
        self.rt.msl_compiler = compile_check
        self.rt.kernel_runner = run_dispatch
