"""NV bring-up smoke run: NV-FACTS section 10, one mechanism per step, every outcome recorded.

    python -m rawgrad smoke [--mock] [--json PATH]

This module holds the driver-level steps (ioctls, channels, semaphores, copies, raw kernels, faults). The
step that runs Tensor and TinyJit code on the device, and the command line, live in rawgrad/cli/nv_smoke.py:
a driver sits below the Tensor layer and must not import it, so `run_smoke` takes such steps from above.

Meant for the first minutes on a new GPU, machine or driver: each step runs even when an earlier,
unrelated one failed (a step whose prerequisite failed is recorded as skipped, with the reason), and the
run ends with a table plus a JSON file (`--json`, or `$OUT/nv_smoke.json` when OUT is set) holding every
number and error text, so one run answers as many questions as it can. `--mock` runs the same steps on the
mock driver and GPU (that is how this file is tested; a mock run is never a hardware result).

If no kernel dispatches with the default PCAS action, the kernel step retries with the other candidates
(NV-FACTS 5.2) on a fresh device and records which one worked.
"""

from __future__ import annotations

import functools
import glob
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["SmokeRun", "Step", "StepResult", "render", "run_smoke"]

PROC_VERSION = "/proc/driver/nvidia/version"
SMI_FIELDS = "name,driver_version,memory.total,mig.mode.current,persistence_mode,clocks.sm,clocks.mem"
SUBPROCESS_TIMEOUT_S = 20.0
STEP_TIMEOUT_S = 10.0  # every GPU wait in a step; a dead channel fails fast through its notifier
SEMAPHORE_PAYLOAD = 0x1234_5678_9ABC  # NV-FACTS step 9's value: more than 32 bits, so 64-bit releases show
ACQUIRE_GATE = 5
ACQUIRE_OUT = 7
ACQUIRE_HOLD_S = 0.1  # how long the GPU must sit in an acquire before the CPU opens the gate
COPY_BYTES = (1 << 20) + 123  # not a multiple of 4 KiB on purpose
KERNEL_THREADS = 1024
KERNEL_BLOCK = 256
PCAS_CANDIDATES = (9, 3, 0xA)  # prefetch+schedule (tinygrad), NVK's, libcuda's
DMESG_LINES = 20

# out[i] = i from blockDim (read from bank 0's prefix), blockIdx and threadIdx: NV-FACTS step 14's kernel.
INDEX_KERNEL = """.version 7.8
.target {arch}
.address_size 64
.visible .entry smoke_index(.param .u64 out, .param .s64 n)
{{
  .reg .pred %p<1>; .reg .b32 %r<4>; .reg .b64 %rd<6>;
  mov.u32 %r0, %ctaid.x; mov.u32 %r1, %ntid.x; mov.u32 %r2, %tid.x;
  mad.lo.s32 %r3, %r0, %r1, %r2;
  cvt.s64.s32 %rd0, %r3;
  ld.param.s64 %rd1, [n];
  setp.ge.s64 %p0, %rd0, %rd1;
  @%p0 bra DONE;
  ld.param.u64 %rd2, [out];
  cvta.to.global.u64 %rd2, %rd2;
  shl.b64 %rd3, %rd0, 2;
  add.s64 %rd4, %rd2, %rd3;
  st.global.u32 [%rd4], %r3;
DONE:
  ret;
}}
.visible .entry smoke_double(.param .u64 out, .param .u64 inp, .param .s64 n)
{{
  .reg .pred %p<1>; .reg .b32 %r<6>; .reg .b64 %rd<8>;
  mov.u32 %r0, %ctaid.x; mov.u32 %r1, %ntid.x; mov.u32 %r2, %tid.x;
  mad.lo.s32 %r3, %r0, %r1, %r2;
  cvt.s64.s32 %rd0, %r3;
  ld.param.s64 %rd1, [n];
  setp.ge.s64 %p0, %rd0, %rd1;
  @%p0 bra DONE;
  ld.param.u64 %rd2, [out]; cvta.to.global.u64 %rd2, %rd2;
  ld.param.u64 %rd5, [inp]; cvta.to.global.u64 %rd5, %rd5;
  shl.b64 %rd3, %rd0, 2;
  add.s64 %rd6, %rd5, %rd3;
  ld.global.u32 %r4, [%rd6];
  shl.b32 %r5, %r4, 1;
  add.s64 %rd4, %rd2, %rd3;
  st.global.u32 [%rd4], %r5;
DONE:
  ret;
}}
"""


@dataclass
class StepResult:
    """One step: `status` is ok, fail or skip; `details` holds what it measured; `error` the failure."""

    name: str
    status: str
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)
    error: str = ""


class SmokeRun:
    """Runs the steps in order, sharing the devices they bring up; see the module docstring."""

    def __init__(self, mock: bool) -> None:
        self.mock = mock
        self.results: list[StepResult] = []
        self.nv: Any = None  # NVDevice (ioctl layer only)
        self.hcq: Any = None  # NVHCQDevice (queues, kernels)

    # -- plumbing ----------------------------------------------------------------------------------------
    def _os(self) -> Any:
        if self.mock:
            from rawgrad.drivers.nv.mock import H100, MockNV
            return MockNV(H100, execute_kernels=True)
        from rawgrad.drivers.osapi import LibcOS
        return LibcOS()

    def step(self, name: str, fn: Callable[[], dict[str, Any]], needs: tuple[str, ...] = ()) -> bool:
        missing = [n for n in needs if not self.ok(n)]
        if missing:
            self.results.append(StepResult(name, "skip", 0.0, error=f"needs {', '.join(missing)}"))
            return False
        t0 = time.perf_counter()
        try:
            details = fn()
        except Exception as e:  # a failed step is a finding; the run goes on
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            self.results.append(StepResult(name, "fail", time.perf_counter() - t0,
                                           error=f"{type(e).__name__}: {e}", details={"traceback": tb[-6:]}))
            return False
        self.results.append(StepResult(name, "ok", time.perf_counter() - t0, details))
        return True

    def ok(self, name: str) -> bool:
        return any(r.name == name and r.status == "ok" for r in self.results)

    def close(self) -> None:
        from rawgrad.hcq import Device
        if self.nv is not None:
            try:
                self.nv.close()
            finally:
                if self.mock:
                    self.nv.os.shutdown()
        if self.hcq is not None:
            Device.close("NV")
        self.hcq = self.nv = None

    # -- steps -------------------------------------------------------------------------------------------
    def environment(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kernel": platform.release(), "python": platform.python_version(),
                             "device_nodes": sorted(glob.glob("/dev/nvidia*"))}
        if os.path.exists(PROC_VERSION):
            with open(PROC_VERSION) as f:
                d["proc_version"] = f.read().strip()
        d["nvidia_smi"] = _run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"])
        from rawgrad.drivers.nv.cubin import find_nvjitlink, find_ptxas
        d["ptxas"] = find_ptxas()
        d["nvjitlink"] = repr(find_nvjitlink())
        if not self.mock and not os.path.exists("/dev/nvidiactl"):
            raise RuntimeError("no /dev/nvidiactl: no NVIDIA kernel driver here")
        return d

    def bringup(self) -> dict[str, Any]:
        from rawgrad.drivers.nv.device import NVDevice
        self.nv = NVDevice(self._os(), gpfifo_entries=1024, timeout_s=STEP_TIMEOUT_S)
        nv = self.nv
        return {"driver_version": getattr(nv, "driver_version", None), "gr_info": dict(nv.gr_info),
                "compute_class": hex(nv.compute_class), "classes": {k: hex(v) if isinstance(v, int) else v
                                                                    for k, v in _class_choices(nv).items()}}

    def timer(self) -> dict[str, Any]:
        a = self.nv.read_timer_ns()
        time.sleep(0.01)
        b = self.nv.read_timer_ns()
        if not 0 < a < b:
            raise AssertionError(f"PTIMER did not advance: {a} then {b}")
        return {"ptimer_ns": [a, b], "advanced_ns": b - a}

    def host_semaphore(self) -> dict[str, Any]:
        from rawgrad.drivers.nv import pushbuf as pb
        from rawgrad.drivers.nv.gpfifo import read_u64
        nv = self.nv
        sig = nv.alloc_signal()
        before = nv.read_timer_ns()
        nv.compute.submit(pb.sem_release(pb.PushBuffer(), nv.host, sig, SEMAPHORE_PAYLOAD))
        nv.wait_signal(sig, SEMAPHORE_PAYLOAD)
        stamp = read_u64(sig + 8)
        if read_u64(sig) != SEMAPHORE_PAYLOAD:
            raise AssertionError(f"payload {read_u64(sig):#x}, expected {SEMAPHORE_PAYLOAD:#x}")
        return {"timestamp_ns": stamp, "timestamp_minus_ptimer_ns": stamp - before,
                "gp_get": nv.compute.gp_get()}

    def acquire(self) -> dict[str, Any]:
        from rawgrad.drivers.nv import pushbuf as pb
        from rawgrad.drivers.nv.gpfifo import read_u64, write_u64
        nv = self.nv
        gate, out = nv.alloc_signal(), nv.alloc_signal()
        q = pb.sem_acquire(pb.PushBuffer(), nv.host, gate, ACQUIRE_GATE)
        nv.copy.submit(pb.sem_release(q, nv.host, out, ACQUIRE_OUT))
        time.sleep(ACQUIRE_HOLD_S)
        early = read_u64(out)
        if early != 0:
            raise AssertionError(f"the release ran before the acquire was satisfied (out = {early})")
        write_u64(gate, ACQUIRE_GATE)
        nv.wait_signal(out, ACQUIRE_OUT)
        return {"held_s": ACQUIRE_HOLD_S}

    def copy_engine(self) -> dict[str, Any]:
        import cffi

        from rawgrad.drivers.nv import pushbuf as pb
        ffi = cffi.FFI()
        nv = self.nv
        src, vram, dst = nv.alloc_host(COPY_BYTES), nv.alloc_vram(COPY_BYTES), nv.alloc_host(COPY_BYTES)
        try:
            pattern = np.random.default_rng(0).integers(0, 256, COPY_BYTES, dtype=np.uint8)
            np.frombuffer(ffi.buffer(ffi.cast("char *", src.va), COPY_BYTES), np.uint8)[:] = pattern
            q = pb.ce_copy(pb.PushBuffer(), nv.copy_info, vram.va, src.va, COPY_BYTES)
            pb.ce_copy(q, nv.copy_info, dst.va, vram.va, COPY_BYTES)
            t0 = time.perf_counter()
            nv.copy.submit(nv.signal_next(q))
            nv.wait_signal(nv.timeline, nv.timeline_value)
            seconds = time.perf_counter() - t0
            got = np.frombuffer(ffi.buffer(ffi.cast("char *", dst.va), COPY_BYTES), np.uint8)
            bad = int(np.count_nonzero(got != pattern))
            if bad:
                raise AssertionError(f"{bad} of {COPY_BYTES} bytes differ after host -> VRAM -> host")
            return {"bytes": COPY_BYTES, "round_trip_s": seconds}
        finally:
            for b in (src, vram, dst):
                nv.free(b)

    def hcq_device(self) -> dict[str, Any]:
        if self.nv is not None:  # one device at a time: the HCQ device brings up its own channels
            nv, self.nv = self.nv, None
            nv.close()
            if self.mock:
                nv.os.shutdown()
        self.hcq = self._new_hcq()
        return {"device": repr(self.hcq), "arch": self.hcq.arch, "compiler": repr(self.hcq.compiler),
                "qmd": self.hcq.qmd_class.__name__}

    def _new_hcq(self) -> Any:
        """A fresh Device["NV"] (the registry's instance, so Tensor(device="NV") uses it too)."""
        from rawgrad.hcq import Device
        if self.mock:
            os.environ["NV_MOCK"], os.environ["NV_MOCK_PROFILE"] = "1", "h100"
        Device.close("NV")
        return Device["NV"]

    def first_kernel(self) -> dict[str, Any]:
        tried: dict[str, str] = {}
        for action in PCAS_CANDIDATES:
            if action != PCAS_CANDIDATES[0]:  # a failed launch leaves the channel dead: start afresh
                self.hcq = self._new_hcq()
            self.hcq.pcas_action = action
            try:
                seconds = self._index_kernel()
            except Exception as e:
                tried[hex(action)] = f"{type(e).__name__}: {e}"
                continue
            return {"pcas_action": hex(action), "kernel_s": seconds, "failed_actions": tried}
        raise RuntimeError(f"no PCAS action dispatched the kernel: {tried}")

    def _index_kernel(self) -> float:
        dev = self.hcq
        lib = dev.compiler.compile(INDEX_KERNEL.format(arch=dev.arch))
        prog = dev.program("smoke_index", lib)
        out = dev.allocator.alloc(KERNEL_THREADS * 4)
        try:
            seconds = prog(out, global_size=(KERNEL_THREADS, 1, 1),
                           local_size=(KERNEL_BLOCK, 1, 1), vals=(KERNEL_THREADS,), wait=True,
                           timeout_s=STEP_TIMEOUT_S)
            got = np.empty(KERNEL_THREADS, np.uint32)
            dev.allocator._copyout(got.data.cast("B"), out)
            if not np.array_equal(got, np.arange(KERNEL_THREADS, dtype=np.uint32)):
                wrong = np.flatnonzero(got != np.arange(KERNEL_THREADS))
                raise AssertionError(f"{wrong.size} wrong entries, first at {wrong[0]}: {got[wrong[0]]}")
            return float(seconds or 0.0)
        finally:
            dev.allocator.free(out)

    def chained_kernels(self) -> dict[str, Any]:
        """Two launches in one queue (chained through DEPENDENT_QMD0), the second reading the first's output,
        signalled by the second QMD's release, with timestamps around them."""
        dev = self.hcq
        lib = dev.compiler.compile(INDEX_KERNEL.format(arch=dev.arch))
        index, double = dev.program("smoke_index", lib), dev.program("smoke_double", lib)
        a, b = dev.allocator.alloc(KERNEL_THREADS * 4), dev.allocator.alloc(KERNEL_THREADS * 4)
        start, end = dev.timing_signals()
        try:
            grid, block = (KERNEL_THREADS, 1, 1), (KERNEL_BLOCK, 1, 1)  # global size counts threads
            value = dev.timeline_value
            q = dev.queue().wait(dev.timeline_signal, value - 1).timestamp(start)
            q.exec(index, (a, KERNEL_THREADS), grid, block).exec(double, (b, a, KERNEL_THREADS), grid, block)
            q.signal(dev.timeline_signal, value).timestamp(end).submit(dev)
            dev.timeline_value = value + 1
            dev.timeline_signal.wait(value, STEP_TIMEOUT_S, check=dev.check_fault)
            dev.synchronize(STEP_TIMEOUT_S)
            got = np.empty(KERNEL_THREADS, np.uint32)
            dev.allocator._copyout(got.data.cast("B"), b)
            if not np.array_equal(got, 2 * np.arange(KERNEL_THREADS, dtype=np.uint32)):
                raise AssertionError("the second kernel did not see the first one's output")
            if not 0 < start.timestamp <= end.timestamp:
                raise AssertionError(f"timestamps out of order: {start.timestamp} then {end.timestamp}")
            return {"two_kernels_ns": end.timestamp - start.timestamp}
        finally:
            dev.allocator.free(a)
            dev.allocator.free(b)

    def fault(self) -> dict[str, Any]:
        """A store to an unmapped VA must come back as DeviceFault (not a hang), and then either the device
        still works or says it does not."""
        from rawgrad.hcq import DeviceFault, DeviceTimeout, HCQBuffer
        dev = self.hcq
        lib = dev.compiler.compile(INDEX_KERNEL.format(arch=dev.arch))
        prog = dev.program("smoke_index", lib)
        bad = dev.nv.window_base + dev.nv.window_size - 0x10000  # inside our window, never mapped
        t0 = time.perf_counter()
        try:
            prog(HCQBuffer(bad, 64), global_size=(1, 1, 1), local_size=(32, 1, 1), vals=(32,), wait=True,
                 timeout_s=STEP_TIMEOUT_S)
        except (DeviceFault, DeviceTimeout) as e:
            kind, message = type(e).__name__, str(e)
        else:
            raise AssertionError("a store to an unmapped address completed without a fault")
        seconds = time.perf_counter() - t0
        try:
            self._index_kernel()
            after = "device still usable"
        except Exception as e:
            after = f"device unusable afterwards: {type(e).__name__}: {e}"
        return {"raised": kind, "message": message[:500], "seconds_to_report": seconds, "after": after,
                "dmesg_xid": [ln for ln in _run(["dmesg"]).splitlines() if "Xid" in ln][-DMESG_LINES:]}


def _class_choices(nv: Any) -> dict[str, Any]:
    return {k: getattr(nv, k) for k in ("compute_class", "copy_class", "gpfifo_class", "usermode_class")
            if hasattr(nv, k)}


def _run(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({cmd[0]}: {e})"
    if p.returncode != 0:
        return f"({cmd[0]} exit {p.returncode}: {p.stderr.strip()[:300]})"
    return p.stdout.strip()


# A step added from a higher layer: (name, what it runs on the SmokeRun, the steps it needs). It runs after
# the driver-level steps and before the fault step, which may leave the device dead.
Step = tuple[str, Callable[[SmokeRun], dict[str, Any]], tuple[str, ...]]


def run_smoke(mock: bool = False, extra_steps: Sequence[Step] = ()) -> list[StepResult]:
    """Every driver-level step in order, then `extra_steps`, then the fault step; the devices are closed
    at the end whatever happened."""
    run = SmokeRun(mock)
    try:
        run.step("environment", run.environment)
        run.step("bringup", run.bringup, ("environment",))
        run.step("timer", run.timer, ("bringup",))
        run.step("host_semaphore", run.host_semaphore, ("bringup",))
        run.step("acquire", run.acquire, ("host_semaphore",))
        run.step("copy_engine", run.copy_engine, ("host_semaphore",))
        run.step("hcq_device", run.hcq_device, ("environment",))
        run.step("first_kernel", run.first_kernel, ("hcq_device",))
        run.step("chained_kernels", run.chained_kernels, ("first_kernel",))
        for name, fn, needs in extra_steps:
            run.step(name, functools.partial(fn, run), needs)
        run.step("fault", run.fault, ("first_kernel",))  # last: it may leave the device dead
    finally:
        run.close()
    return run.results


def render(results: list[StepResult]) -> str:
    lines = [f"{'step':<18} {'status':<6} {'seconds':>8}  detail"]
    for r in results:
        detail = r.error or ", ".join(f"{k}={v}" for k, v in r.details.items() if k != "traceback")
        lines.append(f"{r.name:<18} {r.status:<6} {r.seconds:>8.3f}  {detail[:200]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit("the smoke run's command moved: python -m rawgrad smoke [--mock] [--json PATH]")
