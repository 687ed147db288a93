"""`python -m rawgrad amd-smoke [--mock] [--json PATH]`: the bring-up checklist for the first real AMD GPU.

No AMD GPU has run rawgrad yet: everything under rawgrad/drivers/amd was verified on the mock KFD and command
processor only. This run is the first thing to try on real hardware. It goes step by step, from opening
`/dev/kfd` to a TinyJit replay, and each step depends on the ones before it. Each step prints ok or fail
(later steps that need a failed one are skipped), and a failure names what failed: the ioctl in flight and
its errno, or the packet field the GPU or the mock rejected.

Steps:
 1. `kfd`: `/dev/kfd` exists and opens read-write (permissions: the render group).
 2. `kfd_version`: AMDKFD_IOC_GET_VERSION; 1.11 or newer.
 3. `topology`: the sysfs GPU nodes; at least one has a gfx target rawgrad compiles for.
 4. `render_node`: that node's `/dev/dri/renderD*` opens.
 5. `bring_up`: AMDDevice. This covers ACQUIRE_VM, RUNTIME_ENABLE, ALLOC/MAP memory, CREATE_EVENT,
    CREATE_QUEUE (PM4 and SDMA) and the doorbell mmap. Every ioctl it issued is listed.
 6. `pm4_signal`: a RELEASE_MEM writes a signal value; the host wait sees it.
 7. `interrupt`: that wait slept in WAIT_EVENTS and woke on the RELEASE_MEM interrupt (else waits poll).
 8. `sdma_copy`: COPY_LINEAR of odd-sized bytes plus a FENCE; the bytes are compared.
 9. `timestamps`: two RELEASE_MEM clock writes are ordered, and the GPU clock rate is compared with the
    host's (10-ns ticks: about 1.0).
10. `first_kernel`: the copy kernel's DISPATCH_DIRECT. This is the first code the GPU runs; the result is
    compared.
11. `tensor_ops`: elementwise, reduce and matmul through Tensor on "AMD", compared with numpy.
12. `tinyjit`: a TinyJit capture, then replays: one INDIRECT_BUFFER and one doorbell each.
13. `fault` (mock, or `--fault`): a broken dispatch must be reported. On the mock it is a wrong RSRC2, and
    the DeviceFault must name the field. On hardware it is a read of an unmapped page, which KFD's MEMORY
    event reports.

`--mock` runs the same steps on the mock (AMD_MOCK=1 for the registry's device). Its results prove the code
paths, not the hardware, and the table says so.
"""
from __future__ import annotations

import argparse
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rawgrad.cli.smoke_checks import JIT_CALLS, MAX_ABS_ERROR, finish_run, jit_step_error, tensor_op_errors

__all__ = ["StepResult", "TracingKFD", "add_arguments", "main", "render", "run_command", "run_smoke"]

COPY_BYTES = 1000 + 3  # not a multiple of 4, 8 or 256: partial words and a partial last workgroup
TIMEOUT_S = 20.0  # each wait of the checklist: a hung first GPU costs seconds, not minutes
CLOCK_INTERVAL_S = 0.05  # host time between the two clock writes of the timestamp step
INTERRUPT_GATE_S = 0.02  # the interrupt step releases the GPU this long after the host started waiting
# the GPU counter is 100 MHz (AMD-METAL-FACTS 1.4): GPU ns per host ns should be ~1; this is the band
# accepted (timestamps are written at end of pipe, so the pair can land a little later than the host reads)
CLOCK_RATE_BAND = (0.5, 2.0)
UNMAPPED_VA = 0x1000  # the fault step's read address: page 1, which no allocation of rawgrad's ever maps
MOCK_NOTE = "MOCK (AMD_MOCK): these steps ran on rawgrad's mock KFD + command processor, not an AMD GPU"


@dataclass
class StepResult:
    """One step: `status` ok, fail or skip; `details` what it measured; on failure `error` and `where` (the
    ioctl in flight, or the packet field the GPU rejected)."""

    name: str
    status: str
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    where: str = ""


class TracingKFD:
    """The OS seam with a record of every open and KFD ioctl (by name), so a failing step can say which
    call it was in. Everything else passes through."""

    def __init__(self, base: Any) -> None:
        self.base = base
        self.calls: list[str] = []

    def open(self, path: str, flags: int) -> int:
        self.calls.append(f"open({path})")
        return int(self.base.open(path, flags))

    def ioctl(self, fd: int, request: int, buf: Any) -> int:
        from rawgrad.drivers.amd import abi
        desc = abi.IOCTLS.get(abi.ioc_nr(request))
        self.calls.append(f"AMDKFD_IOC_{desc.name}" if desc is not None else f"ioctl {request:#x}")
        return int(self.base.ioctl(fd, request, buf))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


class _Run:
    def __init__(self, mock: bool, fault: bool) -> None:
        self.mock, self.fault = mock, fault
        self.results: list[StepResult] = []
        self.mock_gpu: Any = None  # MockAMD
        self.os: Any = None  # TracingKFD over libc or the mock KFD
        self.kfd_fd: int | None = None
        self.node: Any = None
        self.dev: Any = None  # the AMDDevice the steps share

    def ok(self, name: str) -> bool:
        return any(r.name == name and r.status == "ok" for r in self.results)

    def step(self, name: str, fn: Callable[[], dict[str, Any]], needs: tuple[str, ...] = ()) -> None:
        missing = [n for n in needs if not self.ok(n)]
        if missing:
            self.results.append(StepResult(name, "skip", 0.0, error=f"needs {', '.join(missing)}"))
            return
        t0 = time.perf_counter()
        before = len(self.os.calls) if self.os is not None else 0
        try:
            details = fn()
        except Exception as e:  # a failed step is a finding: the run goes on with what does not need it
            tb = traceback.format_exception(type(e), e, e.__traceback__)
            self.results.append(StepResult(name, "fail", time.perf_counter() - t0, {"traceback": tb[-6:]},
                                           f"{type(e).__name__}: {e}", self._where(e, before)))
            return
        self.results.append(StepResult(name, "ok", time.perf_counter() - t0, details))

    def _where(self, e: BaseException, before: int) -> str:
        """What the failure was in: the packet field the CP reported, else the ioctl or open in flight."""
        fault = getattr(getattr(self.mock_gpu, "fault", None), "field", None)
        if fault:
            return f"packet field {fault}"
        calls = self.os.calls[before:] if self.os is not None else []
        if calls and isinstance(e, OSError):
            return f"{calls[-1]} (errno {e.errno})" if e.errno else calls[-1]
        return calls[-1] if calls else ""

    def close(self) -> None:
        if self.dev is not None:
            self.dev.close()
            self.dev = None
        if self.kfd_fd is not None:
            self.os.close(self.kfd_fd)
            self.kfd_fd = None
        if self.mock_gpu is not None:
            self.mock_gpu.shutdown()


# ------------------------------------------------------------------------------------------------ steps
def _kfd(run: _Run) -> dict[str, Any]:
    from rawgrad.drivers import osapi
    from rawgrad.drivers.amd.topology import KFD_PATH
    if not run.os.exists(KFD_PATH):
        raise FileNotFoundError(f"{KFD_PATH} does not exist: no amdgpu kernel driver (KFD), or the device "
                                "node is not passed into this container")
    run.kfd_fd = run.os.open(KFD_PATH, osapi.O_RDWR | osapi.O_CLOEXEC)
    return {"path": KFD_PATH}


def _kfd_version(run: _Run) -> dict[str, Any]:
    from rawgrad.drivers.amd import abi
    from rawgrad.drivers.amd.device import MIN_KFD_VERSION
    call = abi.get_version()
    assert run.kfd_fd is not None
    run.os.ioctl(run.kfd_fd, call.request, call.args)
    version = abi.decode_version(call)
    if version < MIN_KFD_VERSION:
        raise RuntimeError(f"KFD {version[0]}.{version[1]} is older than {MIN_KFD_VERSION[0]}."
                           f"{MIN_KFD_VERSION[1]}, the oldest CREATE_QUEUE layout rawgrad sends")
    return {"kfd": f"{version[0]}.{version[1]}"}


def _topology(run: _Run) -> dict[str, Any]:
    from rawgrad.drivers.amd.topology import discover
    nodes = discover(run.os)  # raises naming what it found when no node is supported
    run.node = nodes[0]
    n = run.node
    return {"node": n.node_id, "target": n.target, "cus": n.cu_count, "wave": n.wave_size,
            "device_id": f"{n.device_id:#06x}", "gpu_id": f"{n.gpu_id:#06x}"}


def _render_node(run: _Run) -> dict[str, Any]:
    from rawgrad.drivers import osapi
    fd = run.os.open(run.node.render_node, osapi.O_RDWR | osapi.O_CLOEXEC)
    run.os.close(fd)
    return {"render_node": run.node.render_node}


def _bring_up(run: _Run) -> dict[str, Any]:
    from rawgrad.drivers.amd.device import AMDDevice
    before = len(run.os.calls)
    run.dev = AMDDevice("AMD", run.os, mock=run.mock_gpu, timeout_s=TIMEOUT_S)
    issued = [c for c in run.os.calls[before:] if c.startswith("AMDKFD_IOC_")]
    return {"arch": run.dev.arch, "ioctls": len(issued), "kinds": sorted(set(issued)),
            "signal_event": run.dev.signal_event is not None}


def _pm4_signal(run: _Run) -> dict[str, Any]:
    dev = run.dev
    sig = dev.new_signal(0, name="smoke signal")
    dev.queue().signal(sig, 42).submit(dev)
    sig.wait(42, TIMEOUT_S, queue="PM4 RELEASE_MEM", check=dev.check_fault)
    return {"value": sig.value}


def _interrupt(run: _Run) -> dict[str, Any]:
    dev = run.dev
    if dev.signal_event is None:
        raise RuntimeError("no KFD SIGNAL event (CREATE_EVENT refused it): host waits poll")
    sig = dev.new_signal(0, name="smoke interrupt")
    waits = dev.event_waits
    gate = dev.new_signal(0, name="smoke gate")
    dev.queue().wait(gate, 1).signal(sig, 1).submit(dev)
    # the host releases the gate a while later, so the wait below has to sleep (past its spin) and be woken
    released: list[int] = []

    def release() -> None:
        released.append(time.perf_counter_ns())
        gate.value = 1

    timer = threading.Timer(INTERRUPT_GATE_S, release)
    timer.start()
    try:
        sig.wait(1, TIMEOUT_S, queue="RELEASE_MEM interrupt", check=dev.check_fault)
        woke = time.perf_counter_ns()
    finally:
        timer.cancel()
        gate.value = 1
    if dev.event_waits == waits:
        raise RuntimeError("the wait never slept in AMDKFD_IOC_WAIT_EVENTS")
    return {"event_id": dev.signal_event.event_id, "wait_events_calls": dev.event_waits - waits,
            "wake_us_after_release": round((woke - released[0]) / 1e3, 1) if released else None}


def _copy_round_trip(dev: Any, data: np.ndarray, copy: Callable[[Any, Any], None]) -> np.ndarray:
    """`data` uploaded to one buffer, `copy(src, dst)` run on the GPU into a zeroed second one, read back."""
    src, dst = dev.allocator.alloc(COPY_BYTES), dev.allocator.alloc(COPY_BYTES)
    try:
        dev.allocator.copyin(src, data.data)
        dev.allocator.copyin(dst, np.zeros(COPY_BYTES, np.uint8).data)
        copy(src, dst)
        out = np.empty(COPY_BYTES, np.uint8)
        dev.allocator.copyout(out.data, dst)
    finally:
        dev.allocator.free(src)
        dev.allocator.free(dst)
    return out


def _sdma_copy(run: _Run) -> dict[str, Any]:
    dev = run.dev
    data = np.random.default_rng(1).integers(0, 256, COPY_BYTES, dtype=np.uint8)

    def sdma(src: Any, dst: Any) -> None:
        done = dev.new_signal(0, name="smoke sdma")
        dev.copy_queue().copy(dst.va_addr, src.va_addr, COPY_BYTES).signal(done, 1).submit(dev)
        done.wait(1, TIMEOUT_S, queue="SDMA FENCE", check=dev.check_fault)

    out = _copy_round_trip(dev, data, sdma)
    if not np.array_equal(out, data):
        raise AssertionError(f"SDMA COPY_LINEAR: {int((out != data).sum())} of {COPY_BYTES} bytes differ")
    return {"bytes": COPY_BYTES}


def _timestamps(run: _Run) -> dict[str, Any]:
    dev = run.dev
    a, b = dev.new_signal(0, name="smoke t0"), dev.new_signal(0, name="smoke t1")
    h0 = time.perf_counter_ns()
    dev.timeline_submit(lambda q: q.timestamp(a))
    dev.synchronize(TIMEOUT_S)
    time.sleep(CLOCK_INTERVAL_S)
    dev.timeline_submit(lambda q: q.timestamp(b))
    dev.synchronize(TIMEOUT_S)
    h1 = time.perf_counter_ns()
    if not 0 < a.timestamp < b.timestamp:
        raise AssertionError(f"RELEASE_MEM clock writes not ordered: {a.timestamp}, {b.timestamp}")
    gpu_ns = dev.clock.ticks_to_ns(b.timestamp - a.timestamp)
    rate = gpu_ns / (h1 - h0)
    if not CLOCK_RATE_BAND[0] <= rate <= CLOCK_RATE_BAND[1]:
        raise AssertionError(f"GPU clock ran {rate:.3f} ns per host ns over {CLOCK_INTERVAL_S} s: the "
                             f"{dev.clock.unit} conversion is wrong for this GPU")
    return {"ticks": b.timestamp - a.timestamp, "gpu_ns_per_host_ns": round(rate, 3)}


def _first_kernel(run: _Run) -> dict[str, Any]:
    dev = run.dev
    data = np.arange(COPY_BYTES, dtype=np.uint8)
    out = _copy_round_trip(dev, data, lambda src, dst: dev.timeline_submit(
        lambda q: q.copy(dst.va_addr, src.va_addr, COPY_BYTES)))
    if not np.array_equal(out, data):
        raise AssertionError(f"the copy kernel: {int((out != data).sum())} of {COPY_BYTES} bytes differ")
    return {"kernel": "rawgrad_amd_copy", "bytes": COPY_BYTES}


@contextmanager
def _registry_device(run: _Run) -> Iterator[str]:
    """The run's device as the registry's "AMD" while the Tensor steps use it: one KFD process context and
    one event page per process (a second AMDDevice would pass the event page again), and the Tensor steps'
    ioctls are traced like the others. Refused if the process already has an "AMD" device open."""
    from rawgrad.hcq.device import Device
    name = "AMD"
    if name in Device.opened():
        raise RuntimeError(f"this process already opened {name}; run the checklist in a fresh process")
    Device._instances[name] = run.dev  # the registry has no public way to adopt a device
    try:
        yield name
    finally:
        Device._instances.pop(name, None)


def _tensor_ops(run: _Run) -> dict[str, Any]:
    with _registry_device(run) as name:
        errors = tensor_op_errors(name)
    if max(errors.values()) > MAX_ABS_ERROR:
        raise AssertionError(f"results differ from numpy: {errors}")
    return {"max_abs_error": errors}


def _tinyjit(run: _Run) -> dict[str, Any]:
    with _registry_device(run) as name:
        err, replays = jit_step_error(name)
    if err > MAX_ABS_ERROR or replays != JIT_CALLS - 2:
        raise AssertionError(f"TinyJit: max |error| {err}, {replays} replays (want {JIT_CALLS - 2})")
    return {"replays": replays, "max_abs_error": err}


def _fault(run: _Run) -> dict[str, Any]:
    """A broken dispatch must come back as a report, never as a silent result. On the mock: a wrong RSRC2,
    which the dispatch validator names (COMPUTE_PGM_RSRC2). On hardware, which does not validate RSRC2: the
    copy kernel reading an unmapped page, which KFD reports as a MEMORY event (a DeviceFault naming the VA);
    a queue that hangs instead ends in a DeviceTimeout naming the ring positions. A clean completion fails."""
    from rawgrad.drivers.amd import pm4
    from rawgrad.hcq.errors import DeviceFault, DeviceTimeout
    dev = run.dev
    b = dev.allocator.alloc(256)
    if run.mock:
        a = dev.allocator.alloc(256)
        q = dev.queue().copy(b.va_addr, a.va_addr, 256)  # the copy kernel, with its RSRC2 broken below
        packets = pm4.encode_dispatch(dev.copy_program().co, 0, 0, (1, 1, 1), (1, 1, 1), fam=dev.fam)
        rsrc2 = packets.patch["rsrc2"]
        q._words[rsrc2] ^= 1 << 7  # ENABLE_SGPR_WORKGROUP_ID_X flipped: RSRC2 no longer the descriptor's
    else:
        q = dev.queue().copy(b.va_addr, UNMAPPED_VA, 256)  # below the VA reservation: nothing maps it
    try:
        dev.timeline_submit(queue=q)
        dev.synchronize(TIMEOUT_S)
    except (DeviceFault, DeviceTimeout) as e:
        run.dev = None  # faulted: nothing more runs on it (close() below tears it down)
        dev.close()
        return {"reported": f"{type(e).__name__}: {str(e)[:400]}"}
    raise AssertionError("a dispatch with a wrong RSRC2 completed without any report")


def run_smoke(mock: bool = False, fault: bool | None = None,
              wrap: Callable[[Any], Any] | None = None) -> list[StepResult]:
    """Every step in order (see the module docstring); the devices are closed at the end. `wrap`: applied to
    the OS seam before tracing (tests use it to make one call fail)."""
    from rawgrad.drivers import osapi
    run = _Run(mock, mock if fault is None else fault)
    try:
        if mock:
            from rawgrad.drivers.amd.device import MockAMD
            run.mock_gpu = MockAMD()
            base: Any = run.mock_gpu.kfd
        else:
            base = osapi.LibcOS()
        run.os = TracingKFD(wrap(base) if wrap is not None else base)
        run.step("kfd", lambda: _kfd(run))
        run.step("kfd_version", lambda: _kfd_version(run), ("kfd",))
        run.step("topology", lambda: _topology(run), ("kfd_version",))
        run.step("render_node", lambda: _render_node(run), ("topology",))
        run.step("bring_up", lambda: _bring_up(run), ("render_node",))
        run.step("pm4_signal", lambda: _pm4_signal(run), ("bring_up",))
        run.step("interrupt", lambda: _interrupt(run), ("pm4_signal",))
        run.step("sdma_copy", lambda: _sdma_copy(run), ("bring_up",))
        run.step("timestamps", lambda: _timestamps(run), ("pm4_signal",))
        run.step("first_kernel", lambda: _first_kernel(run), ("pm4_signal",))
        run.step("tensor_ops", lambda: _tensor_ops(run), ("first_kernel",))
        run.step("tinyjit", lambda: _tinyjit(run), ("tensor_ops",))
        if run.fault:  # last: it leaves the device faulted
            run.step("fault", lambda: _fault(run), ("first_kernel",))
    finally:
        run.close()
    return run.results


def render(results: list[StepResult], mock: bool = False) -> str:
    title = MOCK_NOTE if mock else "AMD bring-up checklist (no real AMD GPU has run rawgrad before)"
    lines = [title, ""]
    lines.append(f"{'step':<13} {'status':<6} {'seconds':>8}  detail")
    for r in results:
        if r.status == "fail":
            detail = r.error + (f"  [in {r.where}]" if r.where else "")
        else:
            detail = r.error or ", ".join(f"{k}={v}" for k, v in r.details.items() if k != "traceback")
        lines.append(f"{r.name:<13} {r.status:<6} {r.seconds:>8.3f}  {detail[:240]}")
    n = {s: sum(r.status == s for r in results) for s in ("ok", "fail", "skip")}
    lines.append(f"{n['ok']} ok, {n['fail']} fail, {n['skip']} skipped")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mock", action="store_true", help="run on the mock KFD + command processor (not "
                                                            "hardware)")
    parser.add_argument("--fault", action="store_true", help="also check that a broken dispatch is reported "
                                                             "(always on with --mock)")
    parser.add_argument("--json", help="where to write the results (default $OUT/amd_smoke.json if OUT set)")


def run_command(args: argparse.Namespace) -> int:
    """Run, print the table, write the JSON; 0 when every step passed."""
    results = run_smoke(args.mock, True if args.fault or args.mock else False)
    print(render(results, args.mock))
    return finish_run(results, args.mock, args.json, "amd_smoke.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rawgrad amd-smoke",
                                     description="AMD bring-up checklist, one mechanism per step")
    add_arguments(parser)
    return run_command(parser.parse_args(argv))
