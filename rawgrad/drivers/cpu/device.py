"""The CPU as an HCQ device: a command ring in host memory executed by a native command processor."""
from __future__ import annotations

import bisect
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rawgrad import config, mappings
from rawgrad.compiler import elf
from rawgrad.compiler.ir import UOp
from rawgrad.compiler.renderer import renderer_for
from rawgrad.compiler.target import LaunchSpec, host_cpu_target
from rawgrad.compiler.toolchain import host_compiler
from rawgrad.drivers.cpu.hostos import HostOS
from rawgrad.drivers.cpu.processor import DOORBELL_SYMBOL, HOST_WAIT_SYMBOL, THREAD_ENTRY_SYMBOL, processor_ir
from rawgrad.drivers.cpu.records import CTX, CTX_BYTES, MAX_THREADS, RECORD_BYTES, RECORD_WORDS, Op
from rawgrad.hcq.allocator import Allocator, HCQBuffer
from rawgrad.hcq.device import HCQDevice
from rawgrad.hcq.errors import DeviceFault
from rawgrad.hcq.memory import WORD_BYTES, ffi, u64_array, u64_pointer
from rawgrad.hcq.program import Program
from rawgrad.hcq.queue import HWQueue, Value
from rawgrad.hcq.ring import CounterRetire, Ring, RingUnit
from rawgrad.hcq.signal import DEFAULT_TIMEOUT_S, Signal

__all__ = ["CPUAllocator", "CPUDevice", "CPUProgram", "CPUQueue"]

# Environment variable overriding the number of worker threads (default: one per core).
THREADS_ENV = "CPU_THREADS"
# Ring capacity in records (64 KiB): deep enough that a host never waits on a busy but healthy device.
DEFAULT_RING_RECORDS = 1024
# close(): how long the QUIT record may take to drain the ring, then how long threads get to notice a
# forced stop (a thread stuck inside a kernel that never returns is abandoned after this, with a warning).
DRAIN_TIMEOUT_S = 2.0
FORCE_STOP_TIMEOUT_S = 5.0
# Words are 64-bit: scalar arguments (negative ones too) are stored as their two's complement.
WORD_MASK = (1 << 64) - 1
# push()'s command ends for a single one-record command (never mutated)
_ONE_COMMAND = [1]
# The command ring counts 64-byte records (records.py); the processor's read index counts them too.
RECORDS = RingUnit("record", RECORD_BYTES)


class _Processor:
    """The process-wide compiled and loaded command processor (compiled once, never unloaded)."""

    _lock = threading.Lock()
    _image: elf.LoadedImage | None = None

    @classmethod
    def image(cls) -> elf.LoadedImage:
        with cls._lock:
            if cls._image is None:
                cls._image = elf.load(host_compiler().compile(processor_ir()))
            return cls._image


class _NativeState:
    """Everything native a CPU device owns: control block, ring, threads. No reference to the device,
    so a finalizer can shut it down at exit or when the device is collected."""

    def __init__(self, hostos: HostOS, ring_records: int, threads: int, name: str) -> None:
        self.os, self.ring_records, self.nthreads, self.name = hostos, ring_records, threads, name
        image = _Processor.image()
        self.entry = image.symbol(THREAD_ENTRY_SYMBOL)
        self.doorbell = ffi.cast("void (*)(uint64_t, uint64_t)", image.symbol(DOORBELL_SYMBOL))
        self._host_wait = ffi.cast("int64_t (*)(uint64_t, uint64_t, uint64_t, uint64_t)",
                                   image.symbol(HOST_WAIT_SYMBOL))
        # host threads inside _host_wait now: it touches the control block, so shutdown leaves the block
        # mapped while any is (a wait racing a close must not read unmapped memory)
        self._waits_lock = threading.Lock()
        self._waits = 0
        self.ctx_addr = hostos.mmap(CTX_BYTES)
        self.ring_addr = 0
        self.threads: list[int] = []
        try:
            self.ring_addr = hostos.mmap(ring_records * RECORD_BYTES)
            self.ctx = u64_pointer(self.ctx_addr)
            self.ring = u64_array(self.ring_addr, ring_records * RECORD_WORDS).reshape(-1, RECORD_WORDS)
            # the processor's front end publishes how many records it has retired (monotonic)
            read_index = CounterRetire(self.ctx, "command ring read index", CTX.READ_INDEX)
            # waits for ring space sleep on the read index's futex (the front end wakes counted waiters after
            # each retired record), as host waits for signals do, not in the ring's spin and sleep naps
            self.read_signal = Signal(None, address=self.ctx_addr + CTX.READ_INDEX * WORD_BYTES, owner=name,
                                      name="command ring read index", blocking_wait=self.wait_signal)
            self.cmd_ring = Ring("command ring", ring_records, RECORDS, read_index, device=name,
                                 pad=self._pad, flush=self.ring_doorbell, check=self.check_fault,
                                 block=self._wait_read_index)
            self.ctx[CTX.RING] = self.ring_addr
            self.ctx[CTX.RING_MASK] = ring_records - 1
            self.ctx[CTX.THREADS] = threads
            for tid in range(threads):
                self.ctx[CTX.WORKER_ARGS + 2 * tid] = self.ctx_addr
                self.ctx[CTX.WORKER_ARGS + 2 * tid + 1] = tid
            for tid in range(threads):
                arg = self.ctx_addr + (CTX.WORKER_ARGS + 2 * tid) * WORD_BYTES
                self.threads.append(hostos.thread_start(self.entry, arg))
        except BaseException:
            self.shutdown()
            raise

    @property
    def write_index(self) -> int:
        return self.cmd_ring.write

    def ring_doorbell(self) -> None:
        self.doorbell(self.ctx_addr, self.cmd_ring.write)

    def wait_signal(self, address: int, value: int, seconds: float) -> bool:
        """A signal's blocking wait (hcq.signal.BlockingWait): the processor's `rg_host_wait`, which spins
        briefly and then sleeps on the value's futex word until a SIGNAL record wakes it. Runs without the
        GIL. False after `seconds`, or at once for a shut-down device."""
        with self._waits_lock:
            if not self.ctx_addr:
                return False
            self._waits += 1
        try:
            return bool(self._host_wait(self.ctx_addr, address, value, max(0, int(seconds * 1e9))))
        finally:
            with self._waits_lock:
                self._waits -= 1

    def _wait_read_index(self, position: int, queue: str, timeout_s: float) -> None:
        """The command ring's blocking wait: until the front end has retired `position` records."""
        self.read_signal.wait(position, timeout_s, queue=queue, check=self.check_fault)

    def _pad(self, slot: int, n: int) -> None:
        self.ring[slot:slot + n] = 0  # NOP records (opcode 0): a command never wraps the ring's end

    def check_fault(self) -> None:
        """DeviceFault once the front end met a record it does not understand (it stops there)."""
        bad = int(self.ctx[CTX.FAULT])
        if bad:
            raise DeviceFault(f"{self.name}: the command processor met a record with unknown opcode {bad}")

    def _join(self, threads: list[int], timeout_s: float) -> list[int]:
        """Join `threads` within one shared deadline; returns those still running."""
        deadline = time.monotonic() + timeout_s
        return [t for t in threads if not self.os.thread_join(t, max(0.0, deadline - time.monotonic()))]

    def shutdown(self, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        if self.threads:
            ring = self.cmd_ring
            if ring.room() >= 1:
                slot = ring.slot()
                self.ring[slot] = 0
                self.ring[slot, 0] = Op.QUIT
                ring.commit(1)
            else:
                self.ctx[CTX.STOP] = 1
            self.ring_doorbell()
            stuck = self._join(self.threads, drain_timeout_s)
            if stuck:
                self.ctx[CTX.STOP] = 1  # abandon the queued work (e.g. a WAIT nobody will satisfy)
                self.ring_doorbell()
                stuck = self._join(stuck, FORCE_STOP_TIMEOUT_S)
            self.threads = []
            if stuck:
                # the stuck worker still runs a kernel image and touches buffers: keep every mapping
                mappings.pin_all(f"{self.name}: {len(stuck)} worker thread(s) did not stop within "
                                 f"{drain_timeout_s + FORCE_STOP_TIMEOUT_S:g} s (a kernel still running "
                                 f"after its wait timed out, or one that never returns)")
                return
        if self.ring_addr:
            self.os.munmap(self.ring_addr, self.ring_records * RECORD_BYTES)
            self.ring_addr = 0
        with self._waits_lock:
            ctx, self.ctx_addr = self.ctx_addr, 0
            waiting = self._waits
        if ctx and not waiting:  # (with a host wait inside the block, it stays mapped: 4 KiB left behind)
            self.os.munmap(ctx, CTX_BYTES)


class CPUAllocator(Allocator):
    """Page-aligned anonymous mappings; copies are plain memmoves after the device has drained."""

    def __init__(self, device: CPUDevice) -> None:
        super().__init__()
        self.device = device

    def _alloc(self, nbytes: int) -> HCQBuffer:
        return HCQBuffer(self.device.os.mmap(nbytes), nbytes)

    def _free(self, buf: HCQBuffer) -> None:
        # Queued kernels may still use the memory; unmapping it under them would crash the process.
        if self.device._finalizer.alive:  # closed or finalized: no worker runs any more
            self.device.synchronize()
        self.device.os.munmap(buf.va_addr, buf.size)

    def _copyin(self, buf: HCQBuffer, src: memoryview) -> None:
        self.device.synchronize()
        ffi.memmove(ffi.cast("void *", buf.va_addr), src, src.nbytes)

    def _copyout(self, dst: memoryview, buf: HCQBuffer) -> None:
        self.device.synchronize()
        ffi.memmove(dst, ffi.cast("void *", buf.va_addr), dst.nbytes)

    def as_buffer(self, buf: HCQBuffer) -> memoryview:
        """The buffer's memory itself (zero copy); valid while the buffer is allocated."""
        return memoryview(ffi.buffer(ffi.cast("char *", buf.va_addr), buf.size))


class CPUProgram(Program):
    """A kernel from an ELF relocatable object, loaded by our ELF loader.

    ABI: `void name(i64 *args, i64 start, i64 end)`; args holds the buffer addresses then the integer
    scalars, and the kernel handles indices [start, end) of the launch's linear grid (x fastest: the product
    of the 3-D global size).
    """

    def __init__(self, device: CPUDevice, name: str, lib: bytes, launch: LaunchSpec | None = None) -> None:
        super().__init__(device, name, lib, launch)
        self.image = elf.load(lib)
        self.fn_addr: int = self.image.symbol(name)
        # The eager launch fast path (see __call__) needs a launch contract whose blocks HWQueue.exec would
        # accept: three positive ints.
        local = launch.local_size if launch is not None else None
        self._fast_local = local if local is not None and len(local) == 3 and all(
            type(v) is int and v >= 1 for v in local) else None

    def __call__(self, *bufs: HCQBuffer, global_size: tuple[int, int, int] | None = None,
                 local_size: tuple[int, int, int] | None = None, vals: tuple[int, ...] = (),
                 wait: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> float | None:
        """Program.__call__, with a fast path for the eager launch (not timed, concrete sizes, the contract's
        blocks): the wait -> exec -> signal records are written straight into one array and pushed, instead
        of encoded command by command through a CPUQueue (~12 -> ~4 us of Python per eager kernel). Every
        other launch, and any launch the checks of HWQueue.exec would refuse, takes the general path (which
        raises the same errors as before)."""
        launch = self.launch
        if (wait or launch is None or self._fast_local is None or global_size is None or len(global_size) != 3
                or (local_size is not None and tuple(local_size) != self._fast_local)
                or len(bufs) + len(vals) != launch.args):
            return super().__call__(*bufs, global_size=global_size, local_size=local_size, vals=vals,
                                    wait=wait, timeout_s=timeout_s)
        words: list[int] = []
        for b in bufs:
            if not isinstance(b, HCQBuffer):
                break
            words.append(b.va_addr)
        else:
            for v in vals:
                if type(v) is not int:
                    break
                words.append(v & WORD_MASK)
            else:
                gx, gy, gz = global_size
                if type(gx) is int and type(gy) is int and type(gz) is int and min(gx, gy, gz) >= 0:
                    self._push_launch(words, gx, gy, gz, bufs)
                    return None
        return super().__call__(*bufs, global_size=global_size, local_size=local_size, vals=vals,
                                wait=wait, timeout_s=timeout_s)

    def _push_launch(self, args: list[int], gx: int, gy: int, gz: int, bufs: tuple[HCQBuffer, ...]) -> None:
        """wait(timeline, v - 1) -> EXEC -> signal(timeline, v) on the device timeline, as CPUQueue encodes
        them (records.py), under the submit lock like HCQDevice.timeline_submit."""
        dev = _as_cpu(self.device)
        nrec = -(-len(args) // RECORD_WORDS)
        pad = [0] * (nrec * RECORD_WORDS - len(args))
        tl = dev.timeline_signal.address
        with dev.submit_lock:
            v = dev.timeline_value
            recs = np.array([Op.WAIT, tl, (v - 1) & WORD_MASK, 0, 0, 0, 0, 0,
                             Op.EXEC, self.fn_addr, gx, len(args), nrec, gy, gz, 0, *args, *pad,
                             Op.SIGNAL, tl, v, 0, 0, 0, 0, 0], dtype=np.uint64).reshape(-1, RECORD_WORDS)
            # the buffers and this program stay referenced until the records retire (as a queue's refs do)
            dev.push(recs, [1, 2 + nrec, 3 + nrec], (self, bufs))
            dev.timeline_value = v + 1


class CPUQueue(HWQueue):
    """Encodes HCQ commands into 64-byte records (see records.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._cmd_ends: list[int] = []  # record index just past each command
        self._block: tuple[int, int] | None = None  # (address, bytes) of the bound block
        self._last_run_end = 0  # ring position just past this queue's last RUN_BLOCK record
        self._run_record: np.ndarray | None = None  # the RUN_BLOCK record of the bound block

    def _record(self, op: Op, *operands: Value, extra: Sequence[Value] = ()) -> None:
        if len(operands) >= RECORD_WORDS:
            raise ValueError(f"a record has {RECORD_WORDS - 1} operand words, got {len(operands)}")
        self._emit(int(op), *operands, *([0] * (RECORD_WORDS - 1 - len(operands))), *extra)
        self._cmd_ends.append(len(self._words) // RECORD_WORDS)

    def _wait(self, signal: Signal, value: Value) -> None:
        self._record(Op.WAIT, signal.address, value)

    def _signal(self, signal: Signal, value: Value) -> None:
        self._record(Op.SIGNAL, signal.address, value)

    def _timestamp(self, signal: Signal) -> None:
        self._record(Op.TIMESTAMP, signal.timestamp_address)

    def _exec(self, program: Program, args: list[Value], global_size: tuple[Value, ...],
              local_size: tuple[int, ...]) -> None:
        # The record carries the 3-D global size; the processor runs the product as one linear range split
        # across the workers, which is the x-fastest numbering every kernel indexes by. A CPU has no blocks:
        # the local size (checked by HWQueue.exec) does not change which indices run.
        fn = getattr(program, "fn_addr", None)
        if fn is None:
            raise TypeError(f"{program!r} is not a CPU program")
        narg_records = -(-len(args) // RECORD_WORDS)
        padded = list(args) + [0] * (narg_records * RECORD_WORDS - len(args))
        gx, gy, gz = global_size
        self._record(Op.EXEC, fn, gx, len(args), narg_records, gy, gz, extra=padded)

    def _copy(self, dst: Value, src: Value, nbytes: Value) -> None:
        self._record(Op.COPY, dst, src, nbytes)

    def _memory_barrier(self) -> None:
        self._record(Op.MEMORY_BARRIER)

    def _bind(self, device: Any) -> None:
        dev = _as_cpu(device)
        words = self.words()
        nbytes = max(words.nbytes, RECORD_BYTES)
        addr = dev.os.mmap(nbytes)
        block = u64_array(addr, words.size)
        block[:] = words
        self._bound_words = block
        self._block = (addr, nbytes)
        weakref.finalize(self, dev.os.munmap, addr, nbytes)

    def busy(self, device: HCQDevice) -> bool:
        return self._block is not None and self._last_run_end > _as_cpu(device)._read_signal.value

    def submit(self, device: HCQDevice, var_vals: Mapping[UOp, int] | None = None) -> HWQueue:
        # One step under the device's lock: a bound block is patched in place, so two threads submitting
        # it must not interleave their patches and pushes; and the ring is shared by every queue.
        dev = _as_cpu(device)
        with dev.submit_lock:
            if self._block is not None and self._patches and self.bound_device is dev and \
                    self._last_run_end <= dev._read_signal.value:
                # A graph replay's bound copy whose last run has retired (HCQGraph picks such a copy): no
                # wait is needed whatever changes, so the words go through the generated writer (every
                # variable checked before any word is written) instead of the per-expression closures.
                self._write_changed_words(var_vals if var_vals is not None else {})
                self._submit(dev)
                return self
            return super().submit(device, var_vals)

    def _before_patch(self, device: Any) -> None:
        if self._block is not None and self._last_run_end:
            # The block is patched in place: its previous run must have retired first.
            _as_cpu(device).wait_retired(self._last_run_end, queue=self.name)

    def _submit(self, device: Any) -> None:
        dev = _as_cpu(device)
        if self._block is not None:
            run = self._run_record
            if run is None:  # the same record every replay: the block's address and length are fixed
                run = np.zeros((1, RECORD_WORDS), dtype=np.uint64)
                run[0, :3] = (Op.RUN_BLOCK, self._block[0], len(self._words) // RECORD_WORDS)
                self._run_record = run
            self._last_run_end = dev.push(run, _ONE_COMMAND, self)
        else:
            dev.push(self.words().reshape(-1, RECORD_WORDS), self._cmd_ends, self)


def _as_cpu(device: Any) -> CPUDevice:
    if not isinstance(device, CPUDevice):
        raise TypeError(f"a CPU queue cannot run on {device!r}")
    return device


def _thread_count(threads: int | None) -> int:
    if threads is None:
        threads = config.getenv_int(THREADS_ENV, 0) or os.cpu_count() or 1
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"CPU thread count must be in [1, {MAX_THREADS}], got {threads}")
    return threads


class CPUDevice(HCQDevice):
    """The host CPU as an HCQ device (see the package docstring)."""

    def __init__(self, name: str = "CPU", threads: int | None = None,
                 ring_records: int = DEFAULT_RING_RECORDS, hostos: HostOS | None = None) -> None:
        if ring_records < 2 or ring_records & (ring_records - 1):
            raise ValueError(f"ring_records must be a power of two >= 2, got {ring_records}")
        self.os = hostos if hostos is not None else HostOS()
        self.threads = _thread_count(threads)
        self.ring_records = ring_records
        # before the base class's __init__: it makes the timeline signal, whose wait is the processor's
        self._native = _NativeState(self.os, ring_records, self.threads, name)
        try:
            super().__init__(name, CPUAllocator(self), host_compiler(), renderer_for(host_cpu_target()))
        except BaseException:
            self._native.shutdown()
            raise
        self._finalizer = weakref.finalize(self, self._native.shutdown)
        self._read_signal = Signal(None, address=self._native.ctx_addr + CTX.READ_INDEX * WORD_BYTES,
                                   owner=name, name="command ring read index",
                                   keepalive=self._native, blocking_wait=self._native.wait_signal)
        # (ring position after a submission, what must stay alive until it retires); guarded, like the ring
        # itself, by the device's submit_lock
        self._inflight: deque[tuple[int, object]] = deque()

    # ------------------------------------------------------------------ HCQDevice API
    def queue(self) -> CPUQueue:
        return CPUQueue()

    def program(self, name: str, lib: bytes, launch: LaunchSpec | None = None) -> CPUProgram:
        return CPUProgram(self, name, lib, launch)

    def new_signal(self, value: int = 0, name: str | None = None) -> Signal:
        """A host-memory signal whose host waits sleep on a futex the processor's SIGNAL record wakes (no
        Python spin, no fixed naps: the ~300 us replay calls of issue 21 were the host's naps)."""
        return Signal(value, owner=self.name, name=name, blocking_wait=self._native.wait_signal)

    def check_fault(self) -> None:
        if not self._finalizer.alive:
            raise DeviceFault(f"{self.name} is closed")
        if self._native.ctx[CTX.FAULT]:  # (read here rather than through _native.check_fault: every push)
            self._native.check_fault()

    def close(self, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Stop the workers (a QUIT record; queued work gets `drain_timeout_s` to finish before it is
        abandoned), join them and unmap the ring; cached buffers are released too."""
        if self._finalizer.alive:
            self.closed = True
            self._finalizer.detach()
            with self.submit_lock:  # no other thread may be writing the ring while the QUIT record goes in
                self._native.shutdown(drain_timeout_s)
                self._inflight.clear()
            self.allocator.free_cache()  # no thread runs any more, so nothing can still use them


    # ------------------------------------------------------------------ ring
    @property
    def ring_timeout_s(self) -> float:
        """How long a submit waits for ring space (and `wait_retired` for the processor) before
        DeviceTimeout."""
        return self._native.cmd_ring.timeout_s

    @ring_timeout_s.setter
    def ring_timeout_s(self, seconds: float) -> None:
        self._native.cmd_ring.timeout_s = seconds

    @property
    def read_index(self) -> int:
        """Records the command processor has retired."""
        return int(self._native.ctx[CTX.READ_INDEX])

    @property
    def write_index(self) -> int:
        """Records the host has published."""
        return self._native.cmd_ring.write

    def wait_retired(self, position: int, queue: str = "ring", timeout_s: float | None = None) -> None:
        """Wait until the processor has retired every record before ring position `position`: the native
        spin-then-futex wait on the read index (the front end wakes it), not the ring's Python spin and naps
        (a TinyJit replay called back to back waits here for its bound block's previous run)."""
        st = self._native
        if int(st.ctx[CTX.READ_INDEX]) >= position:
            return
        st.ring_doorbell()  # (as Ring.wait_retired flushes: the records must be published to retire)
        self._read_signal.wait(position, st.cmd_ring.timeout_s if timeout_s is None else timeout_s,
                               queue=queue, check=self.check_fault)

    def push(self, records: np.ndarray, cmd_ends: list[int], owner: object) -> int:
        """Copy whole commands into the ring (never over unretired records, never wrapping a command),
        ring the doorbell, keep `owner` alive until they retire; returns the ring position after them.
        The caller holds `submit_lock` (CPUQueue.submit takes it): the ring and its indices are shared."""
        self.check_fault()
        st = self._native
        ring = st.cmd_ring
        self._retire()
        i, ci, total = 0, 0, len(records)
        slot = ring.try_take(total)
        if slot >= 0:  # the usual case: the whole queue fits before the ring's end, one copy
            st.ring[slot:slot + total] = records
            i = total
        elif total > ring.room():
            # All or nothing: wait until the whole queue has room before writing any of it, so a timeout
            # leaves none of it in the ring (a queue longer than the ring must stream: its own first
            # commands have to run to make room for the rest).
            sizes = [end - start for start, end in zip([0, *cmd_ends[:-1]], cmd_ends, strict=True)]
            span = ring.span(sizes)
            if span <= ring.limit:
                ring.wait_free(span, getattr(owner, "name", "queue"))
        while i < total:
            # as many whole commands as fit contiguously now, in one copy
            j = bisect.bisect_right(cmd_ends, i + ring.room(), lo=ci) - 1
            if j < ci:  # not even the next one: pad to the end and/or wait for the processor
                ring.reserve(cmd_ends[ci] - i, queue=getattr(owner, "name", "queue"))
                j = ci
            n = cmd_ends[j] - i
            slot = ring.slot()
            st.ring[slot:slot + n] = records[i:i + n]
            ring.commit(n)
            i, ci = i + n, j + 1
        st.ring_doorbell()
        self._inflight.append((ring.write, owner))
        return ring.write

    def _retire(self) -> None:
        done = self.read_index
        while self._inflight and self._inflight[0][0] <= done:
            self._inflight.popleft()

    def synchronize(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().synchronize(timeout_s)
        if self._inflight:
            # Two threads retiring at once could both pop one entry: the second pop would drop the owner of
            # work still running (a bound block could be unmapped under it).
            with self.submit_lock:
                self._retire()

