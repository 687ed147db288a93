"""A fake Objective-C runtime with fake Metal classes, so the Metal bridge runs on Linux.

`FakeObjCRuntime` implements the bridge's `ObjCRuntime` seam (objc.py). Its `send_fn(prototype)` returns an
`ffi.callback` trampoline made for that prototype, so the bridge's real `ffi.cast` to the method prototype
and its real call go through libffi (x86-64 SysV here, not arm64: see docs/metal.md for what that leaves
unproven). The trampoline decodes (self, _cmd), finds the fake object and its method, and checks that the
prototype the call arrived with is the one the fake declares (each fake method states its prototype from
Apple's documentation, independently of drivers/metal/api.py). An unknown object, an unknown selector, a
prototype mismatch, a message to a deallocated object, or a broken Metal rule is recorded as a fault and
raised by `check()` as soon as the call returns (a callback cannot raise through C).

Ownership ledger: every object has a retain count. alloc/new*/MTLCreateSystemDefaultDevice return +1,
other makers return autoreleased objects (released when the innermost pool pops; autoreleasing with no
pool in place is a fault, as the real runtime's "autoreleased with no pool in place - just leaking").
Releasing a freed object is a fault (over-release). `leaks()` lists objects still alive; the test fixture
fails a test that leaves any.

Metal semantics the fakes follow (Apple's MTLCommandBuffer/MTLSharedEvent/MTLComputeCommandEncoder docs):
command buffers of one queue execute in commit order; `encodeWaitForEvent:value:` blocks that buffer and
every later one in its queue until the event reaches the value; shared events only increase; a committed
buffer is retained by its queue and retains the resources it uses until it completes; an encoder must end
before its buffer commits or makes another encoder; buffer argument indices are below 31; a queue holds at
most `maxCommandBufferCount` uncompleted buffers; blit copies stay inside their buffers and do not overlap;
indirect command buffers follow their descriptor (no inherited state where commands set it, bind and command
counts, the concurrent-dispatch type, ICB-capable pipelines) and their commands reach only buffers made
resident with `useResource:usage:`. Dispatches (direct or ICB commands) are recorded in execution order
(`dispatches`, the last few) and handed to `kernel_runner` when one is set (mock/gpu.py runs the MSL there);
a runner that raises fails its command buffer (status Error, an NSError), as a GPU fault would.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rawgrad.drivers.metal.api import (
    MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH,
    MTL_MAX_BUFFER_ARGUMENTS,
    Method,
)
from rawgrad.drivers.metal.objc import FFI

__all__ = ["Dispatch", "FakeObjCRuntime", "MockObjCFault"]

# Where fake object handles start, and their spacing (16 bytes, like malloc'd objects): any non-null,
# recognisably fake value works; bit patterns far from real heap addresses make a stray use obvious.
HANDLE_BASE = 0x7F00_0000_0000
HANDLE_STRIDE = 16
SELECTOR_BASE = 0x5E1_0000
# Fake GPU virtual addresses of buffers (Metal 3 `gpuAddress`): different from the CPU `contents` pointer,
# as on Apple silicon, so a driver that confuses them is caught.
GPU_VA_BASE = 0x1_0000_0000
GPU_VA_ALIGN = 1 << 16
# Apple, setBytes:length:atIndex:: "Use this method for single-use data smaller than 4 KB."
SET_BYTES_LIMIT = 4096
# MTLDevice.maxThreadsPerThreadgroup on Apple silicon (Metal feature set tables): 1024 in each dimension,
# 1024 in total.
MAX_THREADS_PER_THREADGROUP = 1024
# MTLCommandBufferStatus (MTLCommandBuffer.h)
STATUS_NOT_ENQUEUED, STATUS_ENQUEUED, STATUS_COMMITTED, STATUS_SCHEDULED, STATUS_COMPLETED = 0, 1, 2, 3, 4
STATUS_ERROR = 5
# Dispatches the runtime remembers for tests (`dispatches`); older ones are dropped.
DISPATCH_HISTORY = 256
# MTLCommandQueue's default maxCommandBufferCount (Apple, newCommandQueue: "64 uncompleted command buffers")
DEFAULT_MAX_COMMAND_BUFFERS = 64
# MTLCommandBufferError.MTLCommandBufferErrorInternal = 1 (MTLCommandBuffer.h): what the fake reports when a
# kernel fails on its shader cores (the host run raised)
COMMAND_BUFFER_ERROR_INTERNAL = 1
# MTLLanguageVersion1_0 would be 1 << 16; the default the fake assumes when options set none.
DEFAULT_LANGUAGE_VERSION = 2 << 16


class MockObjCFault(AssertionError):
    """The driver broke a rule of the Objective-C runtime or of Metal (see the module docstring)."""


def objc_method(selector: str, restype: str,
                *argtypes: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare a Python method of a fake class as the implementation of `selector` with this prototype."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__objc__ = Method(selector, restype, tuple(argtypes))  # type: ignore[attr-defined]
        return fn
    return wrap


class FakeObject:
    """Base of every fake object: NSObject's reference counting."""

    cls_name: ClassVar[str] = "NSObject"
    _methods: ClassVar[dict[str, tuple[str, Method]]] = {}

    def __init_subclass__(cls) -> None:
        table = dict(cls._methods)
        for name, fn in vars(cls).items():
            m = getattr(fn, "__objc__", None)
            if m is not None:
                table[m.selector] = (name, m)
        cls._methods = table

    def __init__(self, rt: FakeObjCRuntime) -> None:
        self.rt = rt
        self.refcount = 1
        self.freed = False
        self.handle = rt._register(self)

    @objc_method("retain", "id")
    def retain(self) -> FakeObject:
        self.refcount += 1
        return self

    @objc_method("release", "void")
    def release(self) -> None:
        self.refcount -= 1
        if self.refcount == 0:
            self.freed = True
            self.dealloc()

    @objc_method("retainCount", "NSUInteger")
    def retain_count(self) -> int:
        return self.refcount

    @objc_method("init", "id")
    def init(self) -> FakeObject:
        return self

    def dealloc(self) -> None:
        """Release what this object holds (its own retains of other objects)."""

    def __repr__(self) -> str:
        return f"<{self.cls_name} {self.handle:#x} rc={self.refcount}{' freed' if self.freed else ''}>"


# __init_subclass__ does not run for the base itself: NSObject's own methods are collected here
FakeObject._methods = {m.__objc__.selector: (n, m.__objc__) for n, m in vars(FakeObject).items()
                       if hasattr(m, "__objc__")}


class FakeClass:
    """A class object: answers `alloc` (+1 instance) and the class's class methods; never freed."""

    def __init__(self, rt: FakeObjCRuntime, name: str, instance: type[FakeObject],
                 class_methods: dict[str, tuple[Callable[..., Any], Method]]) -> None:
        self.rt, self.name, self.instance = rt, name, instance
        self.methods: dict[str, tuple[Callable[..., Any], Method]] = {
            "alloc": (lambda: instance(rt), Method("alloc", "id")), **class_methods}
        self.freed = False
        self.handle = rt._register(self)


# ---------------------------------------------------------------------------------------------- Foundation
class FakeNSString(FakeObject):
    cls_name = "NSString"

    def __init__(self, rt: FakeObjCRuntime, text: bytes = b"") -> None:
        super().__init__(rt)
        self.set(text)

    def set(self, text: bytes) -> None:
        self.text = text
        self.cstr = FFI.new("char[]", text)  # UTF8String's result lives as long as the string

    @objc_method("initWithUTF8String:", "id", "const char *")
    def init_with_utf8(self, ptr: Any) -> FakeObject:
        self.set(FFI.string(ptr))
        return self

    @objc_method("UTF8String", "const char *")
    def utf8(self) -> Any:
        return self.cstr


class FakeNSError(FakeObject):
    cls_name = "NSError"

    def __init__(self, rt: FakeObjCRuntime, description: str = "", code: int = 0) -> None:
        super().__init__(rt)
        self.description, self.code_value = description, code

    @objc_method("localizedDescription", "id")
    def localized_description(self) -> FakeObject:
        return self.rt.autorelease(FakeNSString(self.rt, self.description.encode()))

    @objc_method("code", "NSInteger")
    def code(self) -> int:
        return self.code_value


# ---------------------------------------------------------------------------------------------- Metal
class FakeCompileOptions(FakeObject):
    cls_name = "MTLCompileOptions"

    def __init__(self, rt: FakeObjCRuntime) -> None:
        super().__init__(rt)
        self.fast_math = True  # Apple: fastMathEnabled defaults to YES
        self.language_version = DEFAULT_LANGUAGE_VERSION

    @objc_method("setFastMathEnabled:", "void", "BOOL")
    def set_fast_math(self, on: bool) -> None:
        self.fast_math = bool(on)

    @objc_method("setLanguageVersion:", "void", "NSUInteger")
    def set_language_version(self, v: int) -> None:
        self.language_version = v


class FakeBuffer(FakeObject):
    cls_name = "MTLBuffer"

    def __init__(self, rt: FakeObjCRuntime, length: int) -> None:
        super().__init__(rt)
        self.data = np.zeros(max(length, 1), dtype=np.uint8)  # numpy-backed shared storage
        self.length_bytes = length
        self.gpu_va = rt._gpu_va(length)

    @objc_method("contents", "void *")
    def contents(self) -> int:
        return int(self.data.ctypes.data)

    @objc_method("length", "NSUInteger")
    def length(self) -> int:
        return self.length_bytes

    @objc_method("gpuAddress", "uint64_t")
    def gpu_address(self) -> int:
        return self.gpu_va


class FakeFunction(FakeObject):
    cls_name = "MTLFunction"

    def __init__(self, rt: FakeObjCRuntime, library: FakeLibrary, name: str) -> None:
        super().__init__(rt)
        self.library, self.name = library, name
        library.retain()

    def dealloc(self) -> None:
        self.library.release()


class FakeLibrary(FakeObject):
    cls_name = "MTLLibrary"

    def __init__(self, rt: FakeObjCRuntime, source: str, fast_math: bool, language_version: int) -> None:
        super().__init__(rt)
        self.source, self.fast_math, self.language_version = source, fast_math, language_version

    @objc_method("newFunctionWithName:", "id", "id")
    def new_function(self, name: FakeObject) -> FakeObject | None:
        text = self.rt._string(name)
        # Apple: returns nil when the library has no function of that name
        return FakeFunction(self.rt, self, text) if f"kernel void {text}(" in self.source else None


class FakePipelineState(FakeObject):
    cls_name = "MTLComputePipelineState"

    def __init__(self, rt: FakeObjCRuntime, function: FakeFunction, support_icb: bool = False) -> None:
        super().__init__(rt)
        self.function = function.retain()
        self.name = function.name
        self.support_icb = support_icb  # MTLComputePipelineDescriptor.supportIndirectCommandBuffers

    @objc_method("maxTotalThreadsPerThreadgroup", "NSUInteger")
    def max_total_threads(self) -> int:
        return MAX_THREADS_PER_THREADGROUP

    def dealloc(self) -> None:
        self.function.release()


class FakeSharedEvent(FakeObject):
    cls_name = "MTLSharedEvent"

    def __init__(self, rt: FakeObjCRuntime) -> None:
        super().__init__(rt)
        self.value = 0

    @objc_method("signaledValue", "uint64_t")
    def signaled_value(self) -> int:
        return self.value

    @objc_method("setSignaledValue:", "void", "uint64_t")
    def set_signaled_value(self, v: int) -> None:
        self.raise_to(v, "setSignaledValue:")
        self.rt._progress()

    def raise_to(self, v: int, what: str) -> None:
        if v < self.value:
            raise MockObjCFault(f"{what} lowers shared event {self.handle:#x} from {self.value} to {v}: "
                                f"shared event values only increase")
        self.value = v


class FakeComputePipelineDescriptor(FakeObject):
    cls_name = "MTLComputePipelineDescriptor"

    def __init__(self, rt: FakeObjCRuntime) -> None:
        super().__init__(rt)
        self.function: FakeFunction | None = None
        self.support_icb = False  # Apple: supportIndirectCommandBuffers defaults to NO

    @objc_method("setComputeFunction:", "void", "id")
    def set_function(self, fn: FakeObject | None) -> None:
        if fn is not None and not isinstance(fn, FakeFunction):
            raise MockObjCFault(f"setComputeFunction: got {fn!r}, not a function")
        if fn is not None:
            fn.retain()
        if self.function is not None:
            self.function.release()
        self.function = fn

    @objc_method("setSupportIndirectCommandBuffers:", "void", "BOOL")
    def set_support_icb(self, on: bool) -> None:
        self.support_icb = bool(on)

    def dealloc(self) -> None:
        if self.function is not None:
            self.function.release()


class FakeICBDescriptor(FakeObject):
    cls_name = "MTLIndirectCommandBufferDescriptor"

    def __init__(self, rt: FakeObjCRuntime) -> None:
        super().__init__(rt)
        self.command_types = 0
        # Apple: inheritBuffers and inheritPipelineState default to YES (the commands take the encoder's
        # state)
        self.inherit_buffers = True
        self.inherit_pipeline = True
        self.max_kernel_buffers = 0

    @objc_method("setCommandTypes:", "void", "NSUInteger")
    def set_types(self, t: int) -> None:
        self.command_types = t

    @objc_method("setInheritBuffers:", "void", "BOOL")
    def set_inherit_buffers(self, on: bool) -> None:
        self.inherit_buffers = bool(on)

    @objc_method("setInheritPipelineState:", "void", "BOOL")
    def set_inherit_pipeline(self, on: bool) -> None:
        self.inherit_pipeline = bool(on)

    @objc_method("setMaxKernelBufferBindCount:", "void", "NSUInteger")
    def set_max_buffers(self, n: int) -> None:
        self.max_kernel_buffers = n


class FakeIndirectComputeCommand(FakeObject):
    """One command of an ICB; it belongs to the ICB (indirectComputeCommandAtIndex: returns it unowned)."""

    cls_name = "MTLIndirectComputeCommand"

    def __init__(self, rt: FakeObjCRuntime, icb: FakeICB, index: int) -> None:
        super().__init__(rt)
        self.icb, self.index = icb, index
        self.pipeline: FakePipelineState | None = None
        self.buffers: dict[int, tuple[FakeBuffer, int]] = {}
        self.dispatch: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
        self.barrier = False

    def _where(self, what: str) -> str:
        return f"{what} on ICB command {self.index}"

    @objc_method("setComputePipelineState:", "void", "id")
    def set_pipeline(self, p: FakeObject) -> None:
        if self.icb.descriptor_inherit_pipeline:
            raise MockObjCFault(self._where("setComputePipelineState:") + ": the ICB inherits its pipeline "
                                "state (set inheritPipelineState = NO on the descriptor)")
        if not isinstance(p, FakePipelineState):
            raise MockObjCFault(self._where("setComputePipelineState:") + f": {p!r} is not a pipeline state")
        if not p.support_icb:
            raise MockObjCFault(self._where("setComputePipelineState:") + f": pipeline {p.name!r} was not "
                                "made with supportIndirectCommandBuffers = YES")
        self.pipeline = p

    @objc_method("setKernelBuffer:offset:atIndex:", "void", "id", "NSUInteger", "NSUInteger")
    def set_kernel_buffer(self, buf: FakeObject, offset: int, index: int) -> None:
        what = self._where("setKernelBuffer:offset:atIndex:")
        if self.icb.descriptor_inherit_buffers:
            raise MockObjCFault(f"{what}: the ICB inherits its buffers (set inheritBuffers = NO)")
        if index >= self.icb.max_kernel_buffers:
            raise MockObjCFault(f"{what}: index {index} is not below the descriptor's "
                                f"maxKernelBufferBindCount {self.icb.max_kernel_buffers}")
        if not isinstance(buf, FakeBuffer):
            raise MockObjCFault(f"{what}: {buf!r} is not a buffer")
        if offset > buf.length_bytes:
            raise MockObjCFault(f"{what}: offset {offset} past the end of a {buf.length_bytes}-byte buffer")
        self.buffers[index] = (buf, offset)

    @objc_method("concurrentDispatchThreadgroups:threadsPerThreadgroup:", "void", "MTLSize", "MTLSize")
    def concurrent_dispatch(self, groups: tuple[int, int, int], threads: tuple[int, int, int]) -> None:
        if not self.icb.command_types & MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH:
            raise MockObjCFault(self._where("concurrentDispatchThreadgroups:") + ": the ICB was not made for "
                                "MTLIndirectCommandTypeConcurrentDispatch")
        self.dispatch = (groups, threads)

    @objc_method("setBarrier", "void")
    def set_barrier(self) -> None:
        self.barrier = True

    @objc_method("clearBarrier", "void")
    def clear_barrier(self) -> None:
        self.barrier = False


class FakeICB(FakeObject):
    cls_name = "MTLIndirectCommandBuffer"

    def __init__(self, rt: FakeObjCRuntime, desc: FakeICBDescriptor, count: int) -> None:
        super().__init__(rt)
        # the descriptor's settings are copied when the ICB is made (Apple: the descriptor can be reused)
        self.command_types = desc.command_types
        self.descriptor_inherit_buffers = desc.inherit_buffers
        self.descriptor_inherit_pipeline = desc.inherit_pipeline
        self.max_kernel_buffers = desc.max_kernel_buffers
        self.count = count
        self.commands: dict[int, FakeIndirectComputeCommand] = {}

    @objc_method("indirectComputeCommandAtIndex:", "id", "NSUInteger")
    def command_at(self, index: int) -> FakeObject:
        if index >= self.count:
            raise MockObjCFault(f"indirectComputeCommandAtIndex: {index} is past the ICB's maxCommandCount "
                                f"{self.count}")
        cmd = self.commands.get(index)
        if cmd is None:
            cmd = self.commands[index] = FakeIndirectComputeCommand(self.rt, self, index)
        return cmd

    def dealloc(self) -> None:
        for cmd in self.commands.values():
            cmd.release()


@dataclass
class Dispatch:
    """One dispatchThreadgroups as the GPU would run it: its pipeline and argument table."""

    kernel: str
    buffers: dict[int, tuple[FakeBuffer, int]]  # index -> (buffer, offset)
    bytes_args: dict[int, bytes]  # index -> setBytes data
    threadgroups: tuple[int, int, int]
    threads_per_threadgroup: tuple[int, int, int]
    pipeline: FakePipelineState | None = field(default=None, repr=False)


class FakeComputeEncoder(FakeObject):
    cls_name = "MTLComputeCommandEncoder"

    def __init__(self, rt: FakeObjCRuntime, cbuf: FakeCommandBuffer) -> None:
        super().__init__(rt)
        self.cbuf = cbuf
        self.ended = False
        self.pipeline: FakePipelineState | None = None
        self.buffers: dict[int, tuple[FakeBuffer, int]] = {}
        self.bytes_args: dict[int, bytes] = {}
        self.resident: list[FakeBuffer] = []

    def _live(self, what: str) -> None:
        if self.ended:
            raise MockObjCFault(f"{what} on an encoder after endEncoding")

    @staticmethod
    def _index(index: int, what: str) -> None:
        if index >= MTL_MAX_BUFFER_ARGUMENTS:
            raise MockObjCFault(f"{what}: buffer index {index} is out of range (Metal has "
                                f"{MTL_MAX_BUFFER_ARGUMENTS} buffer arguments, "
                                f"0..{MTL_MAX_BUFFER_ARGUMENTS - 1})")

    @objc_method("setComputePipelineState:", "void", "id")
    def set_pipeline(self, p: FakeObject) -> None:
        self._live("setComputePipelineState:")
        if not isinstance(p, FakePipelineState):
            raise MockObjCFault(f"setComputePipelineState: got {p!r}, not a pipeline state")
        self.pipeline = p

    @objc_method("setBuffer:offset:atIndex:", "void", "id", "NSUInteger", "NSUInteger")
    def set_buffer(self, buf: FakeObject, offset: int, index: int) -> None:
        self._live("setBuffer:offset:atIndex:")
        self._index(index, "setBuffer:offset:atIndex:")
        if not isinstance(buf, FakeBuffer):
            raise MockObjCFault(f"setBuffer:offset:atIndex: got {buf!r}, not a buffer")
        if offset > buf.length_bytes:
            raise MockObjCFault(f"setBuffer: offset {offset} past the end of a "
                                f"{buf.length_bytes}-byte buffer")
        self.buffers[index] = (buf, offset)
        self.bytes_args.pop(index, None)

    @objc_method("setBytes:length:atIndex:", "void", "const void *", "NSUInteger", "NSUInteger")
    def set_bytes(self, ptr: int, length: int, index: int) -> None:
        self._live("setBytes:length:atIndex:")
        self._index(index, "setBytes:length:atIndex:")
        if length > SET_BYTES_LIMIT:
            raise MockObjCFault(f"setBytes: {length} bytes; Apple allows it for data under {SET_BYTES_LIMIT}")
        # copied now, as Metal does
        self.bytes_args[index] = bytes(FFI.buffer(FFI.cast("char *", ptr), length))
        self.buffers.pop(index, None)

    @objc_method("dispatchThreadgroups:threadsPerThreadgroup:", "void", "MTLSize", "MTLSize")
    def dispatch(self, groups: tuple[int, int, int], threads: tuple[int, int, int]) -> None:
        self._live("dispatchThreadgroups:threadsPerThreadgroup:")
        if self.pipeline is None:
            raise MockObjCFault("dispatchThreadgroups with no compute pipeline state set")
        total = threads[0] * threads[1] * threads[2]
        if total > self.pipeline.max_total_threads() or total == 0:
            raise MockObjCFault(f"threadsPerThreadgroup {threads} ({total} threads): the pipeline allows "
                                f"1..{self.pipeline.max_total_threads()}")
        d = Dispatch(self.pipeline.name, dict(self.buffers), dict(self.bytes_args), groups, threads,
                     self.pipeline)
        self.cbuf._add(("dispatch", d), [self.pipeline] + [b for b, _ in self.buffers.values()])

    @objc_method("memoryBarrierWithScope:", "void", "NSUInteger")
    def memory_barrier(self, scope: int) -> None:
        self._live("memoryBarrierWithScope:")

    @objc_method("useResource:usage:", "void", "id", "NSUInteger")
    def use_resource(self, res: FakeObject, usage: int) -> None:
        self._live("useResource:usage:")
        if not isinstance(res, FakeBuffer):
            raise MockObjCFault(f"useResource:usage: got {res!r}, not a buffer")
        if res not in self.resident:
            self.resident.append(res)
            self.cbuf.held.append(res.retain())

    @objc_method("executeCommandsInBuffer:withRange:", "void", "id", "NSRange")
    def execute_icb(self, icb: FakeObject, rng: tuple[int, int]) -> None:
        self._live("executeCommandsInBuffer:withRange:")
        if not isinstance(icb, FakeICB):
            raise MockObjCFault(f"executeCommandsInBuffer: got {icb!r}, not an indirect command buffer")
        start, length = rng
        if start + length > icb.count:
            raise MockObjCFault(f"executeCommandsInBuffer: range {start}..{start + length} is past the ICB's "
                                f"{icb.count} commands")
        # Apple: an ICB's commands see only resources made resident in this encoder with useResource; the
        # commands are read when the GPU runs them, so the check and the run happen then
        # (FakeCommandBuffer.run)
        self.cbuf._add(("icb", (icb, start, length, frozenset(id(b) for b in self.resident))), [icb])

    @objc_method("endEncoding", "void")
    def end_encoding(self) -> None:
        self._live("endEncoding")
        self.ended = True
        self.cbuf.encoder = None


class FakeBlitEncoder(FakeObject):
    cls_name = "MTLBlitCommandEncoder"

    def __init__(self, rt: FakeObjCRuntime, cbuf: FakeCommandBuffer) -> None:
        super().__init__(rt)
        self.cbuf = cbuf
        self.ended = False

    @objc_method("copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", "void", "id", "NSUInteger",
                 "id", "NSUInteger", "NSUInteger")
    def copy(self, src: FakeObject, src_off: int, dst: FakeObject, dst_off: int, size: int) -> None:
        what = "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:"
        if self.ended:
            raise MockObjCFault(f"{what} on an encoder after endEncoding")
        if not isinstance(src, FakeBuffer) or not isinstance(dst, FakeBuffer):
            raise MockObjCFault(f"{what}: {src!r} / {dst!r} are not buffers")
        if src_off + size > src.length_bytes or dst_off + size > dst.length_bytes:
            raise MockObjCFault(f"{what}: [{src_off}, +{size}) / [{dst_off}, +{size}) outside the "
                                f"{src.length_bytes}- / {dst.length_bytes}-byte buffers")
        if src is dst and src_off < dst_off + size and dst_off < src_off + size:
            raise MockObjCFault(f"{what}: overlapping ranges in one buffer (undefined in Metal)")
        self.cbuf._add(("copy", (src, src_off, dst, dst_off, size)), [src, dst])

    @objc_method("endEncoding", "void")
    def end_encoding(self) -> None:
        if self.ended:
            raise MockObjCFault("endEncoding on an encoder after endEncoding")
        self.ended = True
        self.cbuf.encoder = None


class FakeCommandBuffer(FakeObject):
    cls_name = "MTLCommandBuffer"

    def __init__(self, rt: FakeObjCRuntime, queue: FakeCommandQueue) -> None:
        super().__init__(rt)
        self.queue = queue
        self.commands: list[tuple[str, Any]] = []
        self.held: list[FakeObject] = []  # resources retained until completion (retainedReferences)
        self.encoder: FakeComputeEncoder | FakeBlitEncoder | None = None
        self.state = STATUS_NOT_ENQUEUED
        self.error_text: str | None = None
        self.start_time = self.end_time = 0.0
        self.pc = 0  # the next command to execute (a wait may stop it part way)

    def _add(self, command: tuple[str, Any], uses: list[Any]) -> None:
        if self.state != STATUS_NOT_ENQUEUED:
            raise MockObjCFault(f"encoding into a command buffer that was already committed: {command[0]}")
        self.commands.append(command)
        self.held.extend(o.retain() for o in uses)

    def _no_open_encoder(self, what: str) -> None:
        if self.encoder is not None:
            raise MockObjCFault(f"{what} while an encoder is still encoding (call endEncoding first)")

    @objc_method("computeCommandEncoder", "id")
    def compute_encoder(self) -> FakeObject:
        self._no_open_encoder("computeCommandEncoder")
        self.encoder = FakeComputeEncoder(self.rt, self)
        return self.rt.autorelease(self.encoder)

    @objc_method("blitCommandEncoder", "id")
    def blit_encoder(self) -> FakeObject:
        self._no_open_encoder("blitCommandEncoder")
        self.encoder = FakeBlitEncoder(self.rt, self)
        return self.rt.autorelease(self.encoder)

    @objc_method("encodeSignalEvent:value:", "void", "id", "uint64_t")
    def encode_signal(self, event: FakeObject, value: int) -> None:
        self._no_open_encoder("encodeSignalEvent:value:")
        self._add(("signal", (event, value)), [event])

    @objc_method("encodeWaitForEvent:value:", "void", "id", "uint64_t")
    def encode_wait(self, event: FakeObject, value: int) -> None:
        self._no_open_encoder("encodeWaitForEvent:value:")
        self._add(("wait", (event, value)), [event])

    @objc_method("commit", "void")
    def commit(self) -> None:
        self._no_open_encoder("commit")
        if self.state != STATUS_NOT_ENQUEUED:
            raise MockObjCFault("commit of a command buffer committed before")
        self.state = STATUS_COMMITTED
        self.queue.pending.append(self.retain())  # the queue keeps it until it completes
        self.rt._progress()

    @objc_method("waitUntilCompleted", "void")
    def wait_until_completed(self) -> None:
        if self.state == STATUS_NOT_ENQUEUED:
            raise MockObjCFault("waitUntilCompleted on a command buffer that was never committed")
        if self.state not in (STATUS_COMPLETED, STATUS_ERROR):
            blocked = self.queue.pending[0].blocked_on() if self.queue.pending else None
            raise MockObjCFault(f"waitUntilCompleted would never return: the queue waits for {blocked}")

    @objc_method("status", "NSUInteger")
    def status(self) -> int:
        return self.state

    @objc_method("error", "id")
    def error(self) -> FakeObject | None:
        if self.error_text is None:
            return None
        return self.rt.autorelease(FakeNSError(self.rt, self.error_text, COMMAND_BUFFER_ERROR_INTERNAL))

    @objc_method("GPUStartTime", "double")
    def gpu_start(self) -> float:
        return self.start_time

    @objc_method("GPUEndTime", "double")
    def gpu_end(self) -> float:
        return self.end_time

    def blocked_on(self) -> str | None:
        for kind, arg in self.commands[self.pc:]:
            if kind == "wait" and arg[0].value < arg[1]:
                return f"shared event {arg[0].handle:#x} to reach {arg[1]} (it is {arg[0].value})"
        return None

    def run(self) -> bool:
        """Execute from where it stopped; False when a wait blocks it."""
        if self.pc == 0:
            self.start_time = time.perf_counter()
        while self.pc < len(self.commands):
            kind, arg = self.commands[self.pc]
            if kind == "wait":
                if arg[0].value < arg[1]:
                    return False
            elif kind == "signal":
                # a GPU-side signal to a lower value leaves the event as it is (AMD-METAL-FACTS §4: the value
                # only rises); the host's setSignaledValue to a lower value is a fault (a driver bug)
                arg[0].value = max(arg[0].value, arg[1])
            else:
                try:
                    self._execute(kind, arg)
                except MockObjCFault:
                    raise
                except Exception as e:  # the GPU failed this command buffer (a kernel that broke a rule)
                    self.error_text = f"{type(e).__name__}: {e}"
                    self._finish(STATUS_ERROR)
                    return True
            self.pc += 1
        self._finish(STATUS_COMPLETED)
        return True

    def _finish(self, state: int) -> None:
        self.end_time = time.perf_counter()
        self.state = state
        for o in self.held:
            o.release()
        self.held = []

    def _execute(self, kind: str, arg: Any) -> None:
        if kind == "dispatch":
            self._run_dispatch(arg)
        elif kind == "copy":
            src, src_off, dst, dst_off, size = arg
            dst.data[dst_off:dst_off + size] = src.data[src_off:src_off + size]
        elif kind == "icb":
            icb, start, length, resident = arg
            self.rt.icb_runs += 1
            for k in range(start, start + length):
                cmd = icb.commands.get(k)
                if cmd is None or cmd.dispatch is None:
                    continue  # a command never encoded does nothing
                if cmd.pipeline is None:
                    raise MockObjCFault(f"ICB command {k} dispatches with no pipeline state set")
                for index, (buf, _) in cmd.buffers.items():
                    if id(buf) not in resident:
                        raise MockObjCFault(f"ICB command {k} ({cmd.pipeline.name}) uses buffer {buf!r} at "
                                            f"index {index}, which was not made resident with useResource in "
                                            f"the encoder that executes the ICB")
                self._run_dispatch(Dispatch(cmd.pipeline.name, dict(cmd.buffers), {}, cmd.dispatch[0],
                                            cmd.dispatch[1], cmd.pipeline))
        else:
            raise MockObjCFault(f"unknown command kind {kind!r}")

    def _run_dispatch(self, d: Dispatch) -> None:
        self.rt.dispatches.append(d)
        if self.rt.kernel_runner is not None:
            self.rt.kernel_runner(d)


class FakeCommandQueue(FakeObject):
    cls_name = "MTLCommandQueue"

    def __init__(self, rt: FakeObjCRuntime, device: FakeDevice,
                 max_buffers: int = DEFAULT_MAX_COMMAND_BUFFERS) -> None:
        super().__init__(rt)
        self.device = device
        self.max_buffers = max_buffers
        self.pending: list[FakeCommandBuffer] = []
        self.made: list[FakeCommandBuffer] = []  # buffers of this queue not completed yet
        rt.queues.append(self)

    @objc_method("commandBuffer", "id")
    def command_buffer(self) -> FakeObject:
        self.made = [b for b in self.made if b.state not in (STATUS_COMPLETED, STATUS_ERROR)]
        if len(self.made) >= self.max_buffers:
            # Apple: commandBuffer blocks until one of the queue's maxCommandBufferCount buffers completes;
            # the fake runs on the caller's thread, where that block would never end
            raise MockObjCFault(f"commandBuffer with {len(self.made)} uncompleted command buffers (the "
                                f"queue's maxCommandBufferCount is {self.max_buffers}): it would block until "
                                f"one completes; wait for completion before asking for more")
        cb = FakeCommandBuffer(self.rt, self)
        self.made.append(cb)
        return self.rt.autorelease(cb)

    def progress(self) -> bool:
        moved = False
        while self.pending and self.pending[0].run():
            self.pending.pop(0).release()
            moved = True
        return moved

    def dealloc(self) -> None:
        self.rt.queues.remove(self)


class FakeDevice(FakeObject):
    cls_name = "MTLDevice"

    @objc_method("name", "id")
    def name(self) -> FakeObject:
        return self.rt.autorelease(FakeNSString(self.rt, b"rawgrad mock Apple GPU"))

    @objc_method("newBufferWithLength:options:", "id", "NSUInteger", "NSUInteger")
    def new_buffer(self, length: int, options: int) -> FakeObject:
        return FakeBuffer(self.rt, length)

    @objc_method("newCommandQueue", "id")
    def new_queue(self) -> FakeObject:
        return FakeCommandQueue(self.rt, self)

    @objc_method("newCommandQueueWithMaxCommandBufferCount:", "id", "NSUInteger")
    def new_queue_max(self, count: int) -> FakeObject:
        if count < 1:
            raise MockObjCFault(f"newCommandQueueWithMaxCommandBufferCount: {count}")
        return FakeCommandQueue(self.rt, self, count)

    @objc_method("newComputePipelineStateWithDescriptor:options:reflection:error:", "id", "id", "NSUInteger",
                 "id *", "id *")
    def new_pipeline_desc(self, desc: FakeObject, options: int, reflection: int,
                          error: int) -> FakeObject | None:
        if not isinstance(desc, FakeComputePipelineDescriptor) or desc.function is None:
            self.rt._store_error(error, f"{desc!r} is not a pipeline descriptor with a compute function", 1)
            return None
        return FakePipelineState(self.rt, desc.function, desc.support_icb)

    @objc_method("newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", "id", "id", "NSUInteger",
                 "NSUInteger")
    def new_icb(self, desc: FakeObject, count: int, options: int) -> FakeObject:
        if not isinstance(desc, FakeICBDescriptor):
            raise MockObjCFault(f"newIndirectCommandBufferWithDescriptor: got {desc!r}")
        if count < 1:
            raise MockObjCFault(f"newIndirectCommandBufferWithDescriptor: maxCommandCount {count}")
        return FakeICB(self.rt, desc, count)

    @objc_method("newSharedEvent", "id")
    def new_event(self) -> FakeObject:
        return FakeSharedEvent(self.rt)

    @objc_method("maxThreadsPerThreadgroup", "MTLSize")
    def max_threads(self) -> tuple[int, int, int]:
        return (MAX_THREADS_PER_THREADGROUP,) * 3

    @objc_method("newLibraryWithSource:options:error:", "id", "id", "id", "id *")
    def new_library(self, source: FakeObject, options: FakeObject | None, error: int) -> FakeObject | None:
        text = self.rt._string(source)
        fast = True if options is None else options.fast_math  # type: ignore[attr-defined]
        version = DEFAULT_LANGUAGE_VERSION if options is None else options.language_version  # type: ignore
        problem = self.rt.msl_compiler(text) if self.rt.msl_compiler is not None else None
        if problem is None and "kernel void " not in text:
            problem = "program has no kernel function"
        if problem is not None:
            self.rt._store_error(error, f"Compilation failed: {problem}", 3)  # MTLLibraryErrorCompileFailure
            return None
        return FakeLibrary(self.rt, text, fast, version)

    @objc_method("newComputePipelineStateWithFunction:error:", "id", "id", "id *")
    def new_pipeline(self, function: FakeObject, error: int) -> FakeObject | None:
        if not isinstance(function, FakeFunction):
            self.rt._store_error(error, f"{function!r} is not a function", 1)
            return None
        return FakePipelineState(self.rt, function)


class FakeObjCRuntime:
    """The mock runtime behind the bridge's seam (see the module docstring)."""

    def __init__(self) -> None:
        self.objects: dict[int, Any] = {}
        self._handles = itertools.count(HANDLE_BASE, HANDLE_STRIDE)
        self._sel_ids: dict[str, int] = {}
        self.selectors: dict[int, str] = {}
        self.trampolines: dict[str, Any] = {}
        self.calls: dict[str, int] = {}  # prototype -> calls that arrived through its trampoline
        self._pools: dict[int, list[list[FakeObject]]] = {}  # autorelease pools are per thread, as in ObjC
        # one message at a time: the fake GPU runs on whichever thread made it progress (a commit, or a host
        # setSignaledValue from another thread)
        self.lock = threading.RLock()
        self.queues: list[FakeCommandQueue] = []
        # the last dispatches run, in order (bounded: each holds its buffers)
        self.dispatches: deque[Dispatch] = deque(maxlen=DISPATCH_HISTORY)
        self.icb_runs = 0  # executeCommandsInBuffer commands the fake GPU ran
        self.kernel_runner: Callable[[Dispatch], None] | None = None
        self.msl_compiler: Callable[[str], str | None] | None = None  # source -> error text or None
        self.faults: list[str] = []
        self._pending: BaseException | None = None
        self._next_va = GPU_VA_BASE
        str_cls = FakeClass(self, "NSString", FakeNSString, {
            "stringWithUTF8String:": (lambda p: self.autorelease(FakeNSString(self, FFI.string(p))),
                                      Method("stringWithUTF8String:", "id", ("const char *",)))})
        self.classes: dict[str, FakeClass] = {c.name: c for c in (
            str_cls, FakeClass(self, "NSError", FakeNSError, {}),
            FakeClass(self, "MTLCompileOptions", FakeCompileOptions, {}),
            FakeClass(self, "MTLComputePipelineDescriptor", FakeComputePipelineDescriptor, {}),
            FakeClass(self, "MTLIndirectCommandBufferDescriptor", FakeICBDescriptor, {}))}

    # ------------------------------------------------------------------ the seam
    def get_class(self, name: bytes) -> int:
        c = self.classes.get(name.decode())
        return c.handle if c is not None else 0

    def register_selector(self, name: bytes) -> int:
        key = name.decode()
        if key not in self._sel_ids:
            sid = SELECTOR_BASE + HANDLE_STRIDE * len(self._sel_ids)
            self._sel_ids[key], self.selectors[sid] = sid, key
        return self._sel_ids[key]

    def send_fn(self, prototype: str) -> Any:
        cb = self.trampolines.get(prototype)
        if cb is None:
            cb = FFI.callback(prototype, self._trampoline(prototype))
            self.trampolines[prototype] = cb
        return cb

    @property
    def pools(self) -> list[list[FakeObject]]:
        """The calling thread's pool stack."""
        return self._pools.setdefault(threading.get_ident(), [])

    def pool_push(self) -> int:
        self.pools.append([])
        return len(self.pools)

    def pool_pop(self, token: int) -> None:
        if token != len(self.pools):
            self._fault(f"autorelease pool {token} popped out of order (innermost is {len(self.pools)})")
            return
        for obj in self.pools.pop():
            self._guarded(obj.release)

    def create_system_default_device(self) -> int:
        return FakeDevice(self).handle  # a Create function: +1 to the caller

    def check(self) -> None:
        if self._pending is not None:
            exc, self._pending = self._pending, None
            raise exc

    # ------------------------------------------------------------------ ledger
    def leaks(self) -> list[FakeObject]:
        """Objects still retained (classes are not objects here and never leak)."""
        return [o for o in self.objects.values() if isinstance(o, FakeObject) and not o.freed]

    def assert_balanced(self) -> None:
        """Fail on any fault seen, any leaked object, or an open autorelease pool."""
        problems = list(self.faults)
        open_pools = sum(len(p) for p in self._pools.values())
        if open_pools:
            problems.append(f"{open_pools} autorelease pool(s) still open")
        leaked = self.leaks()
        if leaked:
            problems.append(f"{len(leaked)} object(s) leaked: " + ", ".join(map(repr, leaked[:8])))
        if problems:
            raise MockObjCFault("Objective-C ledger: " + "; ".join(problems))

    def autorelease(self, obj: FakeObject) -> FakeObject:
        if not self.pools:
            raise MockObjCFault(f"{obj!r} autoreleased with no pool in place - just leaking (wrap the "
                                f"work in ObjC.autorelease_pool)")
        self.pools[-1].append(obj)
        return obj

    # ------------------------------------------------------------------ internals
    def _register(self, obj: Any) -> int:
        h = next(self._handles)
        self.objects[h] = obj
        return h

    def _gpu_va(self, length: int) -> int:
        va = self._next_va
        self._next_va += -(-max(length, 1) // GPU_VA_ALIGN) * GPU_VA_ALIGN
        return va

    def _string(self, obj: Any) -> str:
        if not isinstance(obj, FakeNSString):
            raise MockObjCFault(f"expected an NSString, got {obj!r}")
        return obj.text.decode()

    def _store_error(self, slot: int, description: str, code: int) -> None:
        err = self.autorelease(FakeNSError(self, description, code))
        if slot:
            FFI.cast("id *", slot)[0] = FFI.cast("id", err.handle)

    def _progress(self) -> None:
        while any(q.progress() for q in list(self.queues)):
            pass

    def _fault(self, text: str) -> None:
        self.faults.append(text)
        if self._pending is None:
            self._pending = MockObjCFault(text)

    def _guarded(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except MockObjCFault as e:
            self._fault(str(e))
        return None

    def _trampoline(self, prototype: str) -> Callable[..., Any]:
        m_arrived = FFI.typeof(prototype)
        restype = m_arrived.result

        def zero() -> Any:
            if restype.kind == "struct":
                return FFI.new(FFI.getctype(restype, "*"))[0]
            if restype.kind == "void":
                return None
            return FFI.NULL if restype.kind == "pointer" else 0

        def call(self_ptr: Any, sel: Any, *args: Any) -> Any:
            try:
                with self.lock:
                    self.calls[prototype] = self.calls.get(prototype, 0) + 1
                    return self._dispatch(prototype, int(FFI.cast("uintptr_t", self_ptr)),
                                          int(FFI.cast("uintptr_t", sel)), args, restype)
            except MockObjCFault as e:
                self._fault(str(e))
            except Exception as e:  # a bug in a fake: surface it, never let the callback swallow it
                self._fault(f"{type(e).__name__} in the mock: {e}")
            return zero()
        return call

    def _dispatch(self, prototype: str, handle: int, sel: int, args: tuple[Any, ...], restype: Any) -> Any:
        name = self.selectors.get(sel)
        if name is None:
            raise MockObjCFault(f"unregistered selector {sel:#x} (not from sel_registerName)")
        obj = self.objects.get(handle)
        if obj is None:
            raise MockObjCFault(f"-{name} sent to {handle:#x}, which is not an object")
        if obj.freed:
            raise MockObjCFault(f"-{name} sent to deallocated {obj!r} (over-release or use after release)")
        if isinstance(obj, FakeClass):
            entry = obj.methods.get(name)
            if entry is None:
                raise MockObjCFault(f"+[{obj.name} {name}]: unrecognized selector sent to class")
            fn, m = entry
        else:
            found = obj._methods.get(name)
            if found is None:
                raise MockObjCFault(f"-[{obj.cls_name} {name}]: unrecognized selector sent to instance")
            fn, m = getattr(obj, found[0]), found[1]
        if FFI.typeof(m.prototype) is not FFI.typeof(prototype):
            raise MockObjCFault(f"-[{getattr(obj, 'cls_name', getattr(obj, 'name', '?'))} {name}] called "
                                f"through prototype {prototype}; the method is {m.prototype}")
        py_args = [self._in(t, a) for t, a in zip(m.argtypes, args)]
        return self._out(m.restype, fn(*py_args))

    def _in(self, ctype: str, a: Any) -> Any:
        if ctype == "id":
            h = int(FFI.cast("uintptr_t", a))
            if not h:
                return None
            obj = self.objects.get(h)
            if obj is None or obj.freed:
                raise MockObjCFault(f"argument {h:#x} is not a live object")
            return obj
        if ctype in ("id *", "void *", "const void *"):
            return int(FFI.cast("uintptr_t", a))
        if ctype == "MTLSize":
            return (int(a.width), int(a.height), int(a.depth))
        if ctype == "NSRange":
            return (int(a.location), int(a.length))
        return a

    def _out(self, ctype: str, v: Any) -> Any:
        if ctype == "void":
            return None
        if ctype == "id":
            return FFI.cast("id", 0 if v is None else v.handle)
        if ctype in ("void *", "const void *"):
            return FFI.cast(ctype, v)
        if ctype == "MTLSize":
            return FFI.new("MTLSize *", v)[0]
        return v
