"""The Apple GPU as an HCQ device through Metal.framework (objc.py), or the mock runtime on Linux
(METAL_MOCK=1).

- Bring-up: MTLCreateSystemDefaultDevice, one command queue made with a maximum of uncompleted command buffers
  (the device's "ring": a submit that finds the window full waits, with a timeout, for the oldest to
  complete; Metal's own commandBuffer would block without one).
- Memory: shared-storage MTLBuffers (CPU and GPU share the memory; the host copies through `contents` after
  the timeline drained). A buffer's HCQ address is its `gpuAddress` (Metal 3); queues carry addresses, and
  the device maps an address back to (buffer, offset) for `setBuffer` / `setKernelBuffer`.
- Programs: the "binary" is the MSL source; `newLibraryWithSource:options:error:` (fast math off, MSL 3.1)
  once per source (our own cache key: a hash of the source and the options), then a pipeline state made
  from a descriptor with `supportIndirectCommandBuffers = YES`, so every pipeline can go into an ICB.
  `fn_addr` is the pipeline object: the word a graph template relocates.
- Signals: `MetalSignal`, an `ObjectSignal` over an MTLSharedEvent; its `address` is the event object (a
  handle the queue encodes, never memory); host waits poll `signaledValue` with the core's timeout loop
  (no blocks: see AMD-METAL-FACTS §4).
- Time: `METAL_CLOCK` counts seconds (a command buffer's GPUStartTime / GPUEndTime); a timestamp command gets
  its command buffer's start when no work precedes it in the queue, else its end, and a bound replay has no
  per-kernel times (`kernel_timestamps_in_replay=False`).
- Faults: a command buffer that ends with status Error makes the device faulted (`check_fault` raises
  DeviceFault with its NSError's description), and every later submit is refused.
"""
from __future__ import annotations

import bisect
import hashlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rawgrad import config
from rawgrad.compiler.renderer import renderer_for
from rawgrad.compiler.target import APPLE_GPU, LaunchSpec
from rawgrad.drivers.metal.api import (
    MTL_BARRIER_SCOPE_BUFFERS,
    MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH,
    MTL_LANGUAGE_VERSION_3_1,
    MTL_MAX_BUFFER_ARGUMENTS,
    MTL_PIPELINE_OPTION_NONE,
    MTL_RESOURCE_STORAGE_SHARED,
    MTL_RESOURCE_USAGE_READ,
    MTL_RESOURCE_USAGE_WRITE,
    MTL_STATUS_COMPLETED,
    MTL_STATUS_ERROR,
)
from rawgrad.drivers.metal.objc import FFI, LibObjC, ObjC, ObjCRuntime, Ref
from rawgrad.drivers.metal.queues import (
    EXEC_HEADER,
    OP_BARRIER,
    OP_COPY,
    OP_EXEC,
    OP_SIGNAL,
    OP_TIMESTAMP,
    OP_WAIT,
    Command,
    MetalQueue,
    msl_arguments,
)
from rawgrad.hcq.allocator import Allocator, HCQBuffer
from rawgrad.hcq.device import HCQDevice
from rawgrad.hcq.errors import DeviceFault, DeviceTimeout
from rawgrad.hcq.program import Program
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, DeviceClock, ObjectSignal, Signal, wait_until

__all__ = ["METAL_CLOCK", "MetalBuffer", "MetalCompiler", "MetalDevice", "MetalProgram", "MetalSignal",
           "open_device", "open_mock"]

# GPUStartTime / GPUEndTime are seconds (CFTimeInterval doubles); no timestamps inside an ICB.
METAL_CLOCK = DeviceClock("s", 1e9, kernel_timestamps_in_replay=False)
# Uncompleted command buffers the queue allows (Apple's newCommandQueue default is 64).
DEFAULT_MAX_COMMAND_BUFFERS = 64
# The mock runs kernels as host C++ (each new kernel is compiled by g++ first): a wait for the default
# timeout lasts this many times longer there, as on the NV and AMD mocks. Real hardware never scales.
MOCK_TIMEOUT_SCALE = 20.0
# Bytes in one scalar word of the argument buffer (the renderer's `constant long* vars`).
WORD_BYTES = 8


class MetalSignal(ObjectSignal):
    """A timeline or sync signal: an MTLSharedEvent. `address` is the event object's handle (what the queue
    encodes and hands back to encodeWaitForEvent / encodeSignalEvent), not memory."""

    def __init__(self, device: MetalDevice, event: Ref, *, name: str | None = None) -> None:
        super().__init__(owner=device.name, name=name)
        self.device, self.event = device, event
        self.handle = event.ptr

    @property
    def address(self) -> int:
        return self.handle

    @property
    def timestamp(self) -> int | float:
        self.device.reap()  # the times of command buffers that completed since are recorded now
        return self._timestamp

    def _read(self) -> int:
        self.device.check_open()
        return int(self.device.objc.send(self.handle, "signaledValue"))

    def _write(self, value: int) -> None:
        self.device.check_open()
        self.device.objc.send(self.handle, "setSignaledValue:", value)

    def wait(self, value: int, timeout_s: float = DEFAULT_TIMEOUT_S, *, queue: str = "host",
             check: Callable[[], None] | None = None) -> None:
        if timeout_s == DEFAULT_TIMEOUT_S:
            timeout_s = self.device.default_timeout_s
        super().wait(value, timeout_s, queue=queue, check=check)


@dataclass
class MetalBuffer:
    """One shared-storage MTLBuffer: its object, CPU pointer (`contents`), GPU address and length."""

    ref: Ref
    contents: int
    gpu: int
    size: int


@dataclass
class InFlight:
    """A committed command buffer and what its completion records."""

    cb: Ref
    queue: str
    stamps: list[tuple[int, bool]] = field(default_factory=list)  # (event handle, end time?)
    done: bool = False


class MetalCompiler:
    """The compile step of realize: MSL text is the binary (Metal compiles it when the program loads, under
    the device's own cache key)."""

    target_key = f"msl-{MTL_LANGUAGE_VERSION_3_1:#x}-nofastmath"

    def compile(self, src: str) -> bytes:
        if "kernel void " not in src:
            raise ValueError("MSL source without a kernel function")
        return src.encode()

    def __repr__(self) -> str:
        return f"MetalCompiler({self.target_key})"


class MetalAllocator(Allocator):
    """Shared-storage buffers; a freed one is released once the timeline passed the work queued before it."""

    def __init__(self, device: MetalDevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, nbytes: int) -> HCQBuffer:
        buf = self.device.alloc_buffer(nbytes)
        return HCQBuffer(buf.gpu, nbytes, buf)

    def _free(self, buf: HCQBuffer) -> None:
        self.device.release_buffer(buf.meta)

    def _copyin(self, buf: HCQBuffer, src: memoryview) -> None:
        dev = self.device
        dev.synchronize()  # queued work may still read or write the buffer
        dev.check_open()
        FFI.memmove(FFI.cast("char *", buf.meta.contents + (buf.va_addr - buf.meta.gpu)), src, src.nbytes)

    def _copyout(self, dst: memoryview, buf: HCQBuffer) -> None:
        dev = self.device
        dev.synchronize()
        dev.check_open()
        src = FFI.cast("char *", buf.meta.contents + (buf.va_addr - buf.meta.gpu))
        FFI.memmove(FFI.from_buffer(dst), src, dst.nbytes)


class MetalProgram(Program):
    """A kernel of MSL source `lib`: its pipeline state (made once per source and name by the device)."""

    def __init__(self, device: MetalDevice, name: str, lib: bytes, launch: LaunchSpec | None = None) -> None:
        super().__init__(device, name, lib, launch)
        self.buffers, self.has_vars = msl_arguments(lib, name)
        self.pipeline = device.pipeline(bytes(lib), name)
        self.fn_addr: int = self.pipeline.ptr  # what a graph template relocates
        self.max_threads = int(device.objc.send(self.pipeline, "maxTotalThreadsPerThreadgroup"))


class MetalDevice(HCQDevice):
    """One Apple GPU through Metal (see the module docstring). `runtime`: LibObjC on a Mac, the fake runtime
    on Linux; `mock` (the fake runtime's GPU hooks) is set up by `open_device`."""

    clock = METAL_CLOCK

    def __init__(self, name: str = "METAL", runtime: ObjCRuntime | None = None, *,
                 max_command_buffers: int = DEFAULT_MAX_COMMAND_BUFFERS, timeout_s: float = DEFAULT_TIMEOUT_S,
                 on_close: Callable[[], None] | None = None) -> None:
        self.closed = False
        self.name = name
        self.timeout_s = timeout_s
        self.default_timeout_s = timeout_s
        self._on_close = on_close
        self.objc = ObjC(runtime if runtime is not None else LibObjC())
        self._refs: list[Ref] = []
        self._buffers: dict[int, MetalBuffer] = {}  # gpu address -> buffer
        self._starts: list[int] = []  # sorted gpu addresses
        self._events: dict[int, Ref] = {}
        self._signals: weakref.WeakValueDictionary[int, MetalSignal] = weakref.WeakValueDictionary()
        self._pipelines: dict[tuple[str, str], Ref] = {}
        self._libraries: dict[str, Ref] = {}
        self._icbs: dict[int, Ref] = {}
        self._inflight: deque[InFlight] = deque()
        self._deferred: deque[tuple[int, MetalBuffer]] = deque()  # (timeline value, buffer to release)
        self._fault: str | None = None
        self._reap_lock = threading.RLock()
        self._reaping = False
        # command buffers committed so far (the device's submissions, as the CPU's ring records)
        self.write_index = 0
        self.max_command_buffers = max_command_buffers
        self.arch = APPLE_GPU.isa
        try:
            self.dev = self.objc.system_default_device()
            self._refs.append(self.dev)
            self.queue_ref = self.objc.new(self.dev, "newCommandQueueWithMaxCommandBufferCount:",
                                           max_command_buffers)
            self._refs.append(self.queue_ref)
            with self.objc.autorelease_pool():
                self.gpu_name = self.objc.py_string(self.objc.send(self.dev, "name"))
            self.max_threads_per_threadgroup = self.objc.send(self.dev, "maxThreadsPerThreadgroup")[0]
            super().__init__(name, MetalAllocator(self), MetalCompiler(), renderer_for(APPLE_GPU))
        except BaseException:
            self._teardown()
            raise

    def __repr__(self) -> str:
        return f"<MetalDevice {self.name} {getattr(self, 'gpu_name', '?')}>"

    # -- memory ---------------------------------------------------------------------------------------------
    def alloc_buffer(self, nbytes: int) -> MetalBuffer:
        self.check_open()
        self.reap()
        ref = self.objc.new(self.dev, "newBufferWithLength:options:", max(nbytes, 1),
                            MTL_RESOURCE_STORAGE_SHARED)
        buf = MetalBuffer(ref, int(self.objc.send(ref, "contents")), int(self.objc.send(ref, "gpuAddress")),
                          nbytes)
        self._buffers[buf.gpu] = buf
        bisect.insort(self._starts, buf.gpu)
        return buf

    def release_buffer(self, buf: MetalBuffer) -> None:
        """Release once the work queued so far has finished (a command buffer retains what it uses, but the
        address map must not hand the range to a new buffer while queued words still name it)."""
        if self.closed:
            return
        self._deferred.append((self.timeline_value - 1, buf))
        self.reap()

    def _release_now(self, buf: MetalBuffer) -> None:
        if self._buffers.pop(buf.gpu, None) is not None:
            del self._starts[bisect.bisect_left(self._starts, buf.gpu)]
            buf.ref.release()

    def resolve(self, address: int) -> tuple[MetalBuffer, int]:
        """(buffer, offset) of a GPU address inside one of this device's buffers."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i >= 0:
            buf = self._buffers[self._starts[i]]
            if address <= buf.gpu + buf.size:
                return buf, address - buf.gpu
        raise ValueError(f"{self.name}: address {address:#x} is not inside any Metal buffer of this device")

    def write_word(self, buf: MetalBuffer, offset: int, word: int) -> None:
        FFI.cast("uint64_t *", buf.contents + offset)[0] = word & (2**64 - 1)

    # -- programs -------------------------------------------------------------------------------------------
    def pipeline(self, source: bytes, name: str) -> Ref:
        """The pipeline state of kernel `name` (compiled once per source: our cache key is a hash of the
        source and the compile options)."""
        self.check_open()
        key = hashlib.sha256(source + MetalCompiler.target_key.encode()).hexdigest()
        hit = self._pipelines.get((key, name))
        if hit is not None:
            return hit
        objc = self.objc
        lib = self._libraries.get(key)
        if lib is None:
            with objc.ns_string(source.decode()) as src, objc.alloc_init("MTLCompileOptions", "init") as opts:
                objc.send(opts, "setFastMathEnabled:", False)  # IEEE float semantics (renderer/msl.py)
                objc.send(opts, "setLanguageVersion:", MTL_LANGUAGE_VERSION_3_1)  # bfloat (macOS 14)
                with objc.autorelease_pool():
                    err = objc.error_slot()
                    lib = objc.new(self.dev, "newLibraryWithSource:options:error:", src, opts, err, error=err)
            self._libraries[key] = lib
        with objc.ns_string(name) as fname, objc.new(lib, "newFunctionWithName:", fname) as fn, \
                objc.alloc_init("MTLComputePipelineDescriptor", "init") as desc:
            objc.send(desc, "setComputeFunction:", fn)
            objc.send(desc, "setSupportIndirectCommandBuffers:", True)  # usable in a graph's ICB
            with objc.autorelease_pool():
                err = objc.error_slot()
                pipe = objc.new(self.dev, "newComputePipelineStateWithDescriptor:options:reflection:error:",
                                desc, MTL_PIPELINE_OPTION_NONE, FFI.NULL, err, error=err)
        self._pipelines[(key, name)] = pipe
        return pipe

    def program(self, name: str, lib: bytes, launch: LaunchSpec | None = None) -> MetalProgram:
        return MetalProgram(self, name, lib, launch)

    # -- signals --------------------------------------------------------------------------------------------
    def new_signal(self, value: int = 0, name: str | None = None) -> Signal:
        self.check_open()
        event = self.objc.new(self.dev, "newSharedEvent")
        self._events[event.ptr] = event
        sig = MetalSignal(self, event, name=name)
        if value:
            sig.value = value
        self._signals[event.ptr] = sig
        weakref.finalize(sig, self._drop_event, event.ptr)
        return sig  # type: ignore[return-value]  # an ObjectSignal stands where the core types a Signal

    def _drop_event(self, handle: int) -> None:
        event = self._events.pop(handle, None)
        if event is not None and not self.closed:
            event.release()  # a command buffer that encoded it retains it until it completes

    # -- queues ---------------------------------------------------------------------------------------------
    def queue(self) -> MetalQueue:
        return MetalQueue(self)

    def new_icb(self, commands: int, max_buffers: int) -> Ref:
        if max_buffers > MTL_MAX_BUFFER_ARGUMENTS:
            raise ValueError(f"{self.name}: a kernel with {max_buffers} buffer arguments; Metal binds at "
                             f"most {MTL_MAX_BUFFER_ARGUMENTS}")
        objc = self.objc
        with objc.alloc_init("MTLIndirectCommandBufferDescriptor", "init") as desc:
            objc.send(desc, "setCommandTypes:", MTL_INDIRECT_COMMAND_TYPE_CONCURRENT_DISPATCH)
            objc.send(desc, "setInheritBuffers:", False)
            objc.send(desc, "setInheritPipelineState:", False)
            objc.send(desc, "setMaxKernelBufferBindCount:", max_buffers)
            icb = objc.new(self.dev, "newIndirectCommandBufferWithDescriptor:maxCommandCount:options:", desc,
                           commands, MTL_RESOURCE_STORAGE_SHARED)
        self._icbs[icb.ptr] = icb
        return icb

    def release_bound(self, icb: Ref, argbuf: MetalBuffer | None) -> None:
        """A bound queue was dropped: release its ICB and argument buffer (at close the device releases
        whatever is left)."""
        if self.closed:
            return
        if self._icbs.pop(icb.ptr, None) is not None and icb.alive:
            icb.release()
        if argbuf is not None:
            self.release_buffer(argbuf)

    def encode_icb_command(self, q: MetalQueue, k: int, *, first: bool, only: str | None = None,
                           slot: int | None = None, skip: set[tuple[str, int, int]] | None = None) -> None:
        """(Re-)encode ICB command `k` of bound queue `q` from its words; `only` limits it to one part (and
        `slot` to one buffer), `skip` leaves parts out ((part, k, slot) roles of patch points that have no
        value yet)."""
        objc, words, ic = self.objc, q._words, q._icb_cmds[k]
        cmd = objc.send(q._icb, "indirectComputeCommandAtIndex:", k)
        base = ic.at
        skip = skip or set()
        if only in (None, "pipeline") and ("pipeline", k, 0) not in skip:
            objc.send(cmd, "setComputePipelineState:", words[base + 1])
        if only in (None, "buf"):
            for j in range(ic.buffers) if slot is None else (slot,):
                if ("buf", k, j) in skip:
                    continue
                buf, off = self.resolve(words[base + EXEC_HEADER + j])
                objc.send(cmd, "setKernelBuffer:offset:atIndex:", buf.ref, off, j)
                ic.bound[j] = buf
        if only is None and ic.scalars:
            assert q._argbuf is not None
            objc.send(cmd, "setKernelBuffer:offset:atIndex:", q._argbuf.ref, ic.arg_offset, ic.buffers)
        if only in (None, "dims") and ("dims", k, 0) not in skip:
            groups, local = _grid(words, base)
            objc.send(cmd, "concurrentDispatchThreadgroups:threadsPerThreadgroup:", groups, local)
        if only is None and not first:
            objc.send(cmd, "setBarrier")  # a graph's kernels depend in order

    def _window(self, queue: str) -> None:
        """Wait (with the device timeout) until the queue has room for another command buffer."""
        self.reap()
        if len(self._inflight) < self.max_command_buffers:
            return
        oldest = self._inflight[0]
        wait_until(lambda: self.reap() or len(self._inflight) < self.max_command_buffers, self.timeout_s,
                   lambda: DeviceTimeout(self.name, f"{queue} (command buffer window full)",
                                         "command buffers",
                                         self.max_command_buffers - 1, len(self._inflight), self.timeout_s,
                                         f"oldest uncompleted: {oldest.queue}"), self.check_fault)

    def commit(self, words: list[int], cmds: list[Command], queue: str, bound: MetalQueue | None = None
               ) -> InFlight:
        """Encode `cmds` into one command buffer and commit it (see queues.py)."""
        self.check_open()
        self.check_fault()
        plan = self._plan(words, cmds, bound)  # every address resolved before any object is made
        objc = self.objc
        with self.submit_lock:
            self._window(queue)
            with objc.autorelease_pool():
                cb = objc.retain(objc.send(self.queue_ref, "commandBuffer"))
                run = InFlight(cb, queue)
                enc: int = 0
                enc_kind = ""
                work = False

                def end() -> None:
                    nonlocal enc, enc_kind
                    if enc:
                        objc.send(enc, "endEncoding")
                    enc, enc_kind = 0, ""

                def encoder(kind: str) -> int:
                    nonlocal enc, enc_kind
                    if enc_kind != kind:
                        end()
                        maker = "computeCommandEncoder" if kind == "compute" else "blitCommandEncoder"
                        enc = objc.send(cb, maker)
                        enc_kind = kind
                    return enc

                try:
                    for step in plan:
                        op = step[0]
                        if op == OP_WAIT:
                            end()
                            objc.send(cb, "encodeWaitForEvent:value:", step[1], step[2])
                        elif op == OP_SIGNAL:
                            end()
                            objc.send(cb, "encodeSignalEvent:value:", step[1], step[2])
                        elif op == OP_TIMESTAMP:
                            run.stamps.append((step[1], work))
                        elif op == OP_BARRIER:
                            if enc_kind == "compute":
                                objc.send(enc, "memoryBarrierWithScope:", MTL_BARRIER_SCOPE_BUFFERS)
                        elif op == OP_COPY:
                            _, src, src_off, dst, dst_off, n = step
                            objc.send(encoder("blit"),
                                      "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:",
                                      src.ref, src_off, dst.ref, dst_off, n)
                            work = True
                        elif op == OP_EXEC:
                            _, pipe, bufs, scalars, groups, local = step
                            e = encoder("compute")
                            objc.send(e, "setComputePipelineState:", pipe)
                            for j, (buf, off) in enumerate(bufs):
                                objc.send(e, "setBuffer:offset:atIndex:", buf.ref, off, j)
                            if scalars:
                                data = FFI.new("uint64_t[]", [w & (2**64 - 1) for w in scalars])
                                objc.send(e, "setBytes:length:atIndex:", data, WORD_BYTES * len(scalars),
                                          len(bufs))
                            objc.send(e, "dispatchThreadgroups:threadsPerThreadgroup:", groups, local)
                            work = True
                        else:  # ("icb", start, count, resident buffers)
                            _, start, count, resident = step
                            assert bound is not None  # (ICB steps are planned for bound queues only)
                            e = encoder("compute")
                            for buf in resident:
                                objc.send(e, "useResource:usage:", buf.ref,
                                          MTL_RESOURCE_USAGE_READ | MTL_RESOURCE_USAGE_WRITE)
                            objc.send(e, "executeCommandsInBuffer:withRange:", bound._icb, (start, count))
                            end()  # the next run of ICB commands gets its own encoder (its own residency)
                            work = True
                    end()
                    if bound is not None:  # a replay: its first timestamp is the start, the last the end
                        run.stamps = [(h, i > 0 and i == len(run.stamps) - 1) for i, (h, _) in
                                      enumerate(run.stamps) if i in (0, len(run.stamps) - 1)]
                    objc.send(cb, "commit")
                    self.write_index += 1
                except BaseException:
                    cb.release()
                    raise
            self._inflight.append(run)
        return run

    def _plan(self, words: list[int], cmds: list[Command], bound: MetalQueue | None) -> list[tuple[Any, ...]]:
        plan: list[tuple[Any, ...]] = []
        k = 0  # the bound queue's next ICB command
        for c in cmds:
            w = c.at
            if c.op in (OP_WAIT, OP_SIGNAL):
                plan.append((c.op, words[w + 1], words[w + 2]))
            elif c.op == OP_TIMESTAMP:
                plan.append((c.op, words[w + 1]))
            elif c.op == OP_BARRIER:
                plan.append((c.op,))
            elif c.op == OP_COPY:
                dst, src, n = words[w + 1], words[w + 2], words[w + 3]
                if n == 0:
                    continue
                sbuf, soff = self.resolve(src)
                dbuf, doff = self.resolve(dst)
                for b, off, what in ((sbuf, soff, "source"), (dbuf, doff, "destination")):
                    if off + n > b.size:
                        raise ValueError(f"{self.name}: copy {what} [{off}, {off + n}) runs past its "
                                         f"{b.size}-byte buffer")
                if sbuf is dbuf and soff < doff + n and doff < soff + n:
                    raise ValueError(f"{self.name}: an overlapping copy inside one buffer ({n} bytes from "
                                     f"offset {soff} to {doff}); Metal's blit copy leaves that undefined")
                plan.append((OP_COPY, sbuf, soff, dbuf, doff, n))
            elif bound is not None:  # an exec of a bound queue: its ICB command, batched with its neighbours
                ic = bound._icb_cmds[k]
                resident = [b for b in ic.bound if b is not None]
                if ic.scalars and bound._argbuf is not None:
                    resident.append(bound._argbuf)
                if plan and plan[-1][0] == "icb" and plan[-1][1] + plan[-1][2] == k:
                    _, start, count, res = plan[-1]
                    plan[-1] = ("icb", start, count + 1, res + [b for b in resident if b not in res])
                else:
                    plan.append(("icb", k, 1, resident))
                k += 1
            else:
                nbuf, nscal = words[w + 2], words[w + 3]
                groups, local = _grid(words, w)
                if 0 in groups:
                    continue  # an empty grid runs nothing
                bufs = [self.resolve(words[w + EXEC_HEADER + j]) for j in range(nbuf)]
                scalars = words[w + EXEC_HEADER + nbuf:w + EXEC_HEADER + nbuf + nscal]
                plan.append((OP_EXEC, words[w + 1], bufs, scalars, groups, local))
        return plan

    # -- completion -----------------------------------------------------------------------------------------
    def reap(self) -> bool:
        """Retire command buffers that completed, in order: record their timestamps, note a failed one as
        the device's fault, release deferred buffers the timeline passed. Returns False (a wait predicate)."""
        if self.closed:
            return False
        # one reaper at a time (a host wait, a submit and a finalizer's free may each reap), and not
        # re-entered (a garbage-collector finalizer can free a buffer in the middle of a retire on this
        # thread)
        with self._reap_lock:
            if self._reaping:
                return False
            self._reaping = True
            try:
                self._reap()
            finally:
                self._reaping = False
        return False

    def _reap(self) -> None:
        objc = self.objc
        while self._inflight:
            run = self._inflight[0]
            status = int(objc.send(run.cb, "status"))
            if status not in (MTL_STATUS_COMPLETED, MTL_STATUS_ERROR):
                break
            self._inflight.popleft()
            self._retire(run, status)
        if self._deferred:
            reached = int(objc.send(self.timeline_signal.address, "signaledValue")) if hasattr(
                self, "timeline_signal") else 0
            while self._deferred and (self._deferred[0][0] <= reached or not self._inflight):
                self._release_now(self._deferred.popleft()[1])

    def _retire(self, run: InFlight, status: int) -> None:
        objc = self.objc
        if status == MTL_STATUS_ERROR and self._fault is None:
            with objc.autorelease_pool():
                err = objc.send(run.cb, "error")
                why = objc.py_string(objc.send(err, "localizedDescription")) if err else "no NSError"
            self._fault = f"command buffer of {run.queue} failed: {why}"
        if run.stamps:
            start, end = objc.send(run.cb, "GPUStartTime"), objc.send(run.cb, "GPUEndTime")
            for handle, is_end in run.stamps:
                sig = self._signals.get(handle)
                if sig is not None:
                    sig.record_timestamp(end if is_end else start)
        run.done = True
        run.cb.release()

    def finished(self, run: InFlight) -> bool:
        if not run.done:
            self.reap()
        return run.done

    def wait_run(self, run: InFlight, queue: str) -> None:
        wait_until(lambda: self.finished(run), self.default_timeout_s,
                   lambda: DeviceTimeout(self.name, queue, "its last command buffer", 1, 0,
                                         self.default_timeout_s), self.check_fault)

    def check_fault(self) -> None:
        if self.closed:
            raise DeviceFault(f"{self.name} is closed")
        self.reap()
        if self._fault is not None:
            raise DeviceFault(f"{self.name}: {self._fault}")

    def synchronize(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if timeout_s == DEFAULT_TIMEOUT_S:
            timeout_s = self.default_timeout_s
        super().synchronize(timeout_s)
        self.reap()

    # -- teardown -------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._fault is None:
                try:
                    super().synchronize(min(self.timeout_s, 2.0))
                except Exception:  # noqa: S110 - a hung or faulted device is still torn down
                    pass
            deadline = time.perf_counter() + 2.0
            while self._inflight and time.perf_counter() < deadline:
                self.reap()
                if self._inflight:
                    time.sleep(0.001)
        finally:
            self._teardown()

    def _teardown(self) -> None:
        self.closed = True
        for run in self._inflight:
            if run.cb.alive:
                run.cb.release()
        self._inflight.clear()
        groups: list[Any] = [list(self._icbs.values()), [b.ref for b in self._buffers.values()],
                             [b.ref for _, b in self._deferred], list(self._events.values()),
                             list(self._pipelines.values()), list(self._libraries.values()),
                             list(reversed(self._refs))]
        for refs in groups:
            for r in refs:
                if r.alive:
                    r.release()
        for d in (self._icbs, self._buffers, self._events, self._pipelines, self._libraries):
            d.clear()
        self._deferred.clear()
        self._starts.clear()
        self._refs.clear()
        if self._on_close is not None:
            self._on_close()


def _grid(words: list[int], at: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Threadgroups and threads per threadgroup of the exec at word `at`: the global size in threads rounded
    up to whole threadgroups (compiler/target.py index convention)."""
    g = words[at + 4:at + 7]
    lo = words[at + 7:at + 10]
    groups = (-(-g[0] // lo[0]), -(-g[1] // lo[1]), -(-g[2] // lo[2]))
    return groups, (lo[0], lo[1], lo[2])


def mock_requested() -> bool:
    return config.getenv_int("METAL_MOCK") != 0


def open_mock(name: str = "METAL", *, timeout_s: float = DEFAULT_TIMEOUT_S * MOCK_TIMEOUT_SCALE,
              max_command_buffers: int = DEFAULT_MAX_COMMAND_BUFFERS) -> MetalDevice:
    """A device on a fresh mock GPU (its own fake runtime: `device.objc.rt`, whose ledger covers only it)."""
    from rawgrad.drivers.metal.mock.gpu import MockMetalGPU
    return MetalDevice(name, MockMetalGPU().rt, timeout_s=timeout_s, max_command_buffers=max_command_buffers)


def open_device(name: str, mock: bool = False) -> MetalDevice:
    """Registry factory: Metal.framework on an arm64 Mac, or the mock runtime when METAL_MOCK=1 asks."""
    return open_mock(name) if mock else MetalDevice(name)
