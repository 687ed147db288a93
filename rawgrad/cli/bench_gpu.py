"""`python -m rawgrad bench gpu`: the NV acceptance numbers, rawgrad against CUDA in one process and one run.

Two acceptance checks, both as ratios measured side by side on the same GPU:

- dispatch: a replayed chain of N (1000) empty kernels. rawgrad: a hand-written PTX kernel, compiled by the
  device's own compiler, launched N times from one bound queue bracketed by two `timestamp` commands
  (`wait timeline -> timestamp -> N x exec -> timestamp -> signal timeline`), so a replay is one GP entry
  plus a doorbell. GPU time per kernel = (end - start) / N from the GPU's own PTIMER timestamps; host time
  per replay = wall time of the `submit` call alone, the device idle before it. CUDA: the same empty
  kernel captured N times into a CUDA graph (cupy; torch `x.add_(1)` nodes as a labelled fallback),
  GPU time per node from CUDA events around `graph.launch`, host time = wall time of `graph.launch`.
  Ratios rawgrad / CUDA Graph (lower is better; the acceptance is <= 1 for both).
- bandwidth: `a * b + c` on 2^28 float32 through TinyJit on NV (4 arrays moved) against torch's
  device-to-device `copy_` (2 arrays moved); the acceptance is rawgrad >= 80% of torch.

How GPU times avoid counting host latency: a GPU clock started by one submission and stopped by work that
the host is still submitting would include the host's submit time. So every bracketed measurement keeps
the GPU busy or blocked until all of it is queued: rawgrad's queue carries both timestamps itself; a
bracketed TinyJit replay is held behind a host-released gate signal; CUDA work is queued behind a spin
kernel (`clock64` busy loop), and whether that hold really covered the launch is recorded per replay.

On AMD (`DEV=AMD`, or `device="AMD"`) the same sections run: the empty kernel is LLVM IR for the gfx
target, GPU times come from RELEASE_MEM clock writes (10-ns ticks, converted through the device's clock), and
there is no CUDA to compare with (those sections record why). On a mock GPU (`NV_MOCK=1`, `AMD_MOCK=1`) sizes
are capped and every number is labelled "mock, not hardware": it proves the code paths, nothing about speed.

Every section is wrapped: a failure prints its traceback and the run continues with the next section. The
result is a dict (and JSON: `json_path`, else `$OUT/bench_gpu.json` when OUT is set) plus a printed table.
"""
from __future__ import annotations

import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["EMPTY_KERNEL", "cuda_graph_dispatch", "dispatch", "empty_kernel_ptx", "format_table", "main",
           "rawgrad_bandwidth", "rawgrad_graph_dispatch", "rawgrad_queue_dispatch", "run",
           "torch_copy_bandwidth"]

# ----------------------------------------------------------------------------------------------- sizes
DEFAULT_DEVICE = "NV"
DEFAULT_CHAIN = 1000  # the acceptance chain length
EXTRA_CHAINS = (1, 100)  # measured too: how the per-kernel cost scales
DEFAULT_ELEMENTS = 2**28  # the acceptance array size (1 GiB per float32 array)
DEFAULT_REPEATS = 50  # timed replays per chain length (medians are reported)
DEFAULT_WARMUP = 5  # untimed replays first: clocks ramp up, caches and TLBs fill, lazy uploads happen
BANDWIDTH_REPEATS = 20
BANDWIDTH_WARMUP = 3
QUICK_REPEATS, QUICK_WARMUP, QUICK_BANDWIDTH_REPEATS = 10, 2, 5
QUICK_ELEMENTS = 2**24
# The mock GPU interprets PTX in Python (about 0.5 ms per empty launch, far more per element): on it the
# sizes are capped so a run takes seconds. Its numbers only prove the code paths.
MOCK_MAX_CHAIN = 100
MOCK_MAX_ELEMENTS = 2**12
MOCK_MAX_REPEATS = 3

# ----------------------------------------------------------------------------------------------- kernels
EMPTY_KERNEL = "rawgrad_empty"
EMPTY_THREADS = 32  # one warp in one block: the smallest launch the hardware schedules
EMPTY_CUDA_SOURCE = 'extern "C" __global__ void empty() {}'
EMPTY_CUDA_NAME = "empty"
# A busy loop on the GPU clock that keeps a CUDA stream occupied while the host queues the measured work.
SPIN_CUDA_SOURCE = ('extern "C" __global__ void rawgrad_spin(long long cycles) {\n'
                    '  long long start = clock64();\n'
                    '  while (clock64() - start < cycles) { }\n'
                    '}\n')
SPIN_CUDA_NAME = "rawgrad_spin"
# The same loop in PTX, for when NVRTC is unavailable (appended to empty_kernel_ptx's module).
SPIN_PTX_ENTRY = (f"\n.visible .entry {SPIN_CUDA_NAME}(.param .u64 cycles)\n"
                  "{\n"
                  "  .reg .pred %p<2>;\n"
                  "  .reg .b64 %rd<5>;\n"
                  "  ld.param.u64 %rd1, [cycles];\n"
                  "  mov.u64 %rd2, %clock64;\n"
                  "SPIN_LOOP:\n"
                  "  mov.u64 %rd3, %clock64;\n"
                  "  sub.s64 %rd4, %rd3, %rd2;\n"
                  "  setp.lt.s64 %p1, %rd4, %rd1;\n"
                  "  @%p1 bra SPIN_LOOP;\n"
                  "  ret;\n"
                  "}\n")
# ~2 ms at H100 clocks (1.6-2 GHz): far longer than any host launch we time, short enough to cost nothing.
SPIN_CYCLES = 4_000_000

# ----------------------------------------------------------------------------------------------- units
F32_BYTES = 4
EW_ARRAYS = 4  # a * b + c reads three arrays and writes one
COPY_ARRAYS = 2  # a copy reads one array and writes one
NS_PER_US = 1e3
NS_PER_S = 1e9
MS_PER_S = 1e3
GB = 1e9
# GPU waits inside the benchmark: long enough for a 1000-kernel replay on the mock, short enough that a
# hung GPU costs seconds, not the default 30 s per wait, of a device session.
SYNC_TIMEOUT_S = 20.0
# Timestamp counters are 64-bit ns; timeline values stay far below this.
TIMELINE_MAX = 2**62

# ----------------------------------------------------------------------------------------------- checks
SAMPLE_INDICES = 1 << 16  # random indices of the bandwidth result compared with numpy
EDGE_INDICES = 1024  # plus this many at each end (grid edges are where index bugs show)
CHECK_RTOL = 1e-6  # a fused multiply-add differs from numpy's two roundings by at most an ulp
CHECK_ATOL = 1e-6
SEED = 0
# Acceptance thresholds (the NV issue): dispatch ratios at most 1, bandwidth at least 80% of torch's copy.
DISPATCH_MAX_RATIO = 1.0
BANDWIDTH_MIN_RATIO = 0.8
TRACEBACK_LINES = 12  # printed per failed section (the JSON keeps the whole traceback)
JSON_NAME = "bench_gpu.json"


# The same empty kernel for an AMD gfx target: LLVM IR the device's AMDGPU compiler turns into a code object.
EMPTY_AMDGPU_IR = (f"define amdgpu_kernel void @{EMPTY_KERNEL}() #0 {{\n"
                   "  ret void\n"
                   "}\n"
                   f'attributes #0 = {{ nounwind "amdgpu-flat-work-group-size"="1,{EMPTY_THREADS}" }}\n')
MOCK_LABEL = "mock, not hardware"  # how every number measured on a mock GPU is labelled


def empty_kernel_ptx(arch: str) -> str:
    """The empty kernel as hand-written PTX for `arch` (e.g. sm_90)."""
    return (".version 7.8\n"
            f".target {arch}\n"
            ".address_size 64\n"
            "\n"
            f".visible .entry {EMPTY_KERNEL}()\n"
            "{\n"
            "  ret;\n"
            "}\n")


# ================================================================================== small helpers
def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return None
    return a / b


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _per_replay_summary(n: int, host_ns: Sequence[int], gpu_ns: Sequence[float],
                        warmup: int) -> dict[str, Any]:
    """Medians (and minima) of per-replay samples; GPU times divided by the chain length."""
    out: dict[str, Any] = {"n": n, "replays": len(host_ns) or len(gpu_ns), "warmup": warmup}
    if host_ns:
        out["host_us_per_replay"] = _median(host_ns) / NS_PER_US  # type: ignore[operator]
        out["host_us_per_replay_min"] = min(host_ns) / NS_PER_US
    if gpu_ns:
        med = _median(gpu_ns)
        assert med is not None
        out["gpu_us_per_replay"] = med / NS_PER_US
        out["gpu_us_per_kernel"] = med / n / NS_PER_US
        out["gpu_us_per_kernel_min"] = min(gpu_ns) / n / NS_PER_US
    out["host_ns"] = [int(x) for x in host_ns]
    out["gpu_ns"] = [float(x) for x in gpu_ns]
    return out


def _chain_lengths(chain: int, extra: Sequence[int]) -> list[int]:
    return sorted({int(n) for n in (*extra, chain) if int(n) > 0})


def _jsonable(x: Any) -> Any:
    """The result with non-finite floats as None (JSON has no NaN) and odd objects as strings."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(float(x)) else None
    if isinstance(x, np.integer):
        return int(x)
    return str(x)


class _Run:
    """The result dict being filled, and the section wrapper that keeps one failure from ending the run."""

    def __init__(self, json_path: str | None) -> None:
        self.json_path = json_path
        self.result: dict[str, Any] = {
            "meta": {"started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                     "python": sys.version.split()[0], "platform": platform.platform(),
                     "host_cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                     "argv": list(sys.argv), "numpy": np.__version__},
            "device": {}, "dispatch": {}, "bandwidth": {}, "ratios": {}, "acceptance": {}, "errors": {},
            "seconds": {},
        }

    def save(self, final: bool = False) -> None:
        """Write the result so far as JSON (also before every section: a run killed by a time limit still
        leaves what it measured)."""
        if self.json_path is None:
            return
        try:
            tmp = f"{self.json_path}.tmp"
            with open(tmp, "w") as f:
                json.dump(_jsonable(self.result), f, indent=1)
            os.replace(tmp, self.json_path)  # never a half-written file
        except OSError as e:
            print(f"!!! could not write {self.json_path}: {_error_text(e)}", flush=True)
            return
        if final:
            self.result["meta"]["json_path"] = self.json_path
            print(f"JSON written to {self.json_path}", flush=True)

    def section(self, key: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn`; on failure print a traceback summary, record it under errors[key], return None."""
        self.save()
        print(f"--- {key}", flush=True)
        t0 = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every failure is recorded and the run goes on
            dt = time.perf_counter() - t0
            tb = traceback.format_exc()
            lines = tb.rstrip().splitlines()
            print(f"!!! {key} failed after {dt:.1f} s: {_error_text(e)}", flush=True)
            print("\n".join(lines[-TRACEBACK_LINES:]), flush=True)
            self.result["errors"][key] = {"error": _error_text(e), "traceback": tb}
            self.result["seconds"][key] = dt
            return None
        self.result["seconds"][key] = time.perf_counter() - t0
        return value


# ================================================================================== rawgrad: device
def open_rawgrad_device(name: str = DEFAULT_DEVICE) -> tuple[Any, dict[str, Any]]:
    """The rawgrad device and what it says about the GPU (name, arch, driver, classes)."""
    from rawgrad.hcq import Device
    dev = Device[name]
    info: dict[str, Any] = {"rawgrad_device": dev.name, "type": type(dev).__name__}
    info["arch"] = getattr(dev, "arch", None)
    info["mock"] = bool(getattr(dev, "is_mock", False))
    if info["mock"]:
        info["numbers"] = MOCK_LABEL
    nv = getattr(dev, "nv", None)
    if nv is not None:
        info["driver_version"] = getattr(nv, "driver_version", None)
        pci = getattr(nv, "pci_device_id", None)
        info["pci_device_id"] = f"{pci:#06x}" if isinstance(pci, int) else None
        for cls in ("compute_class", "copy_class", "gpfifo_class"):
            v = getattr(nv, cls, None)
            info[cls] = f"{v:#06x}" if isinstance(v, int) else None
        gr = getattr(nv, "gr_info", None) or {}
        if all(k in gr for k in ("gpcs", "tpc_per_gpc", "sm_per_tpc")):
            info["sm_slots"] = gr["gpcs"] * gr["tpc_per_gpc"] * gr["sm_per_tpc"]  # GR info's maximum layout
        info["gr_info"] = dict(gr)
    if info["mock"]:
        mock = getattr(dev, "mock", None)
        info["mock_profile"] = getattr(getattr(mock, "profile", None), "name", None)
    return dev, info


def _is_amd(dev: Any) -> bool:
    return str(getattr(dev, "name", "")).partition(":")[0] == "AMD"


def empty_kernel_label(dev: Any) -> str:
    return f"{EMPTY_KERNEL} (LLVM IR, 'ret void')" if _is_amd(dev) else f"{EMPTY_KERNEL} (PTX, 'ret;')"


def load_empty_kernel(dev: Any) -> Any:
    """Compile the hand-written empty kernel with the device's own compiler and load it."""
    source = EMPTY_AMDGPU_IR if _is_amd(dev) else empty_kernel_ptx(dev.arch)
    return dev.program(EMPTY_KERNEL, dev.compiler.compile(source))


def _ticks_ns(dev: Any, ticks: int | float) -> int:
    """Device timestamp ticks (or a difference of them) in ns (AMD counts 10-ns ticks; NV counts ns)."""
    from rawgrad.hcq.signal import device_clock
    return device_clock(dev).ticks_to_ns(ticks)


def _sync(dev: Any) -> None:
    dev.synchronize(SYNC_TIMEOUT_S)


def _idle(dev: Any) -> None:
    """Wait until the device has nothing in flight: the timeline, then every channel's retirement release.
    The timeline alone is not enough: when it is released by the last kernel's QMD, the retirement release
    after the block follows a little later, and a bound queue's next submit waits for it (`_before_patch`),
    which would be counted as host time."""
    _sync(dev)
    nv = getattr(dev, "nv", None)
    if nv is not None:
        nv.synchronize(SYNC_TIMEOUT_S)  # every channel's retirement
    ring = getattr(dev, "pm4_ring", None)
    if ring is not None:  # AMD: the PM4 ring read past the last replay's trailing NOP (a rebind waits for it)
        ring.wait_retired(ring.write, queue="bench idle", timeout_s=SYNC_TIMEOUT_S)


CLOCK_CHECK_S = 0.05  # host interval over which PTIMER's rate is compared with the host clock


def rawgrad_clock_check(dev: Any) -> dict[str, Any]:
    """Are GPU timestamps nanoseconds on PTIMER? PTIMER's rate against the host clock, and whether a
    `timestamp` command's value lies between two PTIMER reads taken before and after it."""
    nv = dev.nv
    h0, g0 = time.perf_counter_ns(), nv.read_timer_ns()
    time.sleep(CLOCK_CHECK_S)
    h1, g1 = time.perf_counter_ns(), nv.read_timer_ns()
    out: dict[str, Any] = {"ptimer_ns_per_host_ns": (g1 - g0) / (h1 - h0) if h1 > h0 else None}
    sig = dev.new_signal(name="bench clock check")
    _idle(dev)
    before = nv.read_timer_ns()
    value = dev.timeline_value
    q = dev.queue().wait(dev.timeline_signal, value - 1).timestamp(sig)
    q.signal(dev.timeline_signal, value).submit(dev)
    dev.timeline_value = value + 1
    _sync(dev)
    after = nv.read_timer_ns()
    out.update({"ptimer_before": before, "timestamp": sig.timestamp, "ptimer_after": after,
                "timestamp_between_ptimer_reads": before <= sig.timestamp <= after})
    print(f"    PTIMER/host rate {_f(out['ptimer_ns_per_host_ns'], '.4f')}; timestamp command wrote "
          f"{sig.timestamp} between PTIMER reads {before}..{after}: {out['timestamp_between_ptimer_reads']}",
          flush=True)
    return out


def _stamps_valid(stamps: Sequence[tuple[int, int]]) -> bool:
    """Every pair written (non-zero) with end > start: a zero or reversed pair would fake a tiny time."""
    return bool(stamps) and all(0 < s < e for s, e in stamps)


# ================================================================================== rawgrad: dispatch
def rawgrad_queue_dispatch(dev: Any, lengths: Sequence[int], repeats: int, warmup: int,
                           program: Any = None) -> dict[str, Any]:
    """Per chain length: a bound queue `wait -> timestamp -> n x exec(empty) -> timestamp -> signal` replayed
    `warmup + repeats` times; host ns of each submit call and GPU ns between its two timestamps."""
    from rawgrad.compiler.ir import Variable

    prog = program if program is not None else load_empty_kernel(dev)
    tl = dev.timeline_signal
    chains: dict[str, Any] = {}
    for n in lengths:
        wait_var = Variable("bench.timeline_wait", 0, TIMELINE_MAX)
        signal_var = Variable("bench.timeline_signal", 0, TIMELINE_MAX)
        start = dev.new_signal(name=f"bench chain {n} start")
        end = dev.new_signal(name=f"bench chain {n} end")
        t0 = time.perf_counter()
        q = dev.queue().wait(tl, wait_var).timestamp(start)
        for _ in range(n):
            q.exec(prog, [], (EMPTY_THREADS, 1, 1), (EMPTY_THREADS, 1, 1))
        q.timestamp(end).signal(tl, signal_var)
        built_s = time.perf_counter() - t0
        q.bind(dev)
        bound_s = time.perf_counter() - t0 - built_s
        host_ns: list[int] = []
        gpu_ns: list[float] = []
        wall_ns: list[int] = []
        stamps: list[tuple[int, int]] = []
        for i in range(warmup + repeats):
            _idle(dev)  # the device is idle before every timed submit
            value = dev.timeline_value
            vals = {wait_var: value - 1, signal_var: value}
            h0 = time.perf_counter_ns()
            q.submit(dev, vals)
            h1 = time.perf_counter_ns()
            dev.timeline_value = value + 1
            _sync(dev)
            h2 = time.perf_counter_ns()
            if i >= warmup:
                host_ns.append(h1 - h0)
                gpu_ns.append(_ticks_ns(dev, end.timestamp - start.timestamp))
                wall_ns.append(h2 - h0)
                stamps.append((start.timestamp, end.timestamp))
        # Ordered: each replay's end is not before its start, and each start is not before the previous end
        # (so every replay really wrote fresh timestamps). Strictly: every interval has positive length.
        ordered = all(s <= e for s, e in stamps) and all(stamps[k][0] >= stamps[k - 1][1]
                                                          for k in range(1, len(stamps)))
        row = _per_replay_summary(n, host_ns, gpu_ns, warmup)
        row.update({"timestamps_ordered": ordered, "timestamps_valid": _stamps_valid(stamps),
                    # a GPU interval longer than the host's submit-to-synchronized wall time means the
                    # timestamps are not nanoseconds (or not from one clock)
                    "gpu_within_wall": all(g <= w for g, w in zip(gpu_ns, wall_ns, strict=True)),
                    "wall_us_per_replay": (_median(wall_ns) or 0) / NS_PER_US,
                    "first_stamps": list(stamps[0]) if stamps else None,
                    "queue_words": len(q.words()), "patch_points": len(q.patch_points),
                    "build_s": built_s, "bind_s": bound_s})
        chains[str(n)] = row
        print(f"    rawgrad queue  n={n:5d}: GPU {_f(row.get('gpu_us_per_kernel')):>9s} us/kernel, "
              f"host {_f(row.get('host_us_per_replay'), '.2f'):>9s} us/replay "
              f"({len(q.words())} words, {len(q.patch_points)} patch points, ordered={ordered})", flush=True)
        del q
    return {"path": "bound HWQueue (timestamps inside the queue)", "kernel": empty_kernel_label(dev),
            "threads": EMPTY_THREADS, "chains": chains}


class _Gate:
    """A signal the GPU waits on before bracketed work, released by the host once all of it is queued: the
    bracket then measures the GPU running back to back, not the host submitting."""

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        self.signal = dev.new_signal(0, name="bench gate")
        self.start = dev.new_signal(name="bench bracket start")
        self.end = dev.new_signal(name="bench bracket end")
        self.count = 0
        self.stamps: list[tuple[int, int]] = []

    def _stamp(self, sig: Any, gate: int | None) -> None:
        dev, tl = self.dev, self.dev.timeline_signal
        value = dev.timeline_value
        q = dev.queue().wait(tl, value - 1)
        if gate is not None:
            q.wait(self.signal, gate)
        q.timestamp(sig).signal(tl, value).submit(dev)
        dev.timeline_value = value + 1

    def bracket(self, work: Callable[[], object]) -> tuple[int, int, int]:
        """Run `work` (which submits on the compute timeline) between two GPU timestamps; returns (GPU ns
        between them, host ns `work` took, host ns from the first submit to synchronized: the GPU interval
        must fit in it). `stamps` keeps every (start, end) pair."""
        self.count += 1
        w0 = time.perf_counter_ns()
        self._stamp(self.start, self.count)
        try:
            h0 = time.perf_counter_ns()
            work()
            host = time.perf_counter_ns() - h0
            self._stamp(self.end, None)
        finally:
            self.signal.value = self.count  # never leave the channel blocked, even when `work` failed
        _sync(self.dev)
        wall = time.perf_counter_ns() - w0
        self.stamps.append((self.start.timestamp, self.end.timestamp))
        return _ticks_ns(self.dev, self.end.timestamp - self.start.timestamp), host, wall


def rawgrad_graph_dispatch(dev: Any, lengths: Sequence[int], repeats: int, warmup: int,
                           program: Any = None) -> dict[str, Any]:
    """The same empty-kernel chains through HCQGraph, the engine TinyJit replays with: host ns of
    `graph.submit` (device idle before), GPU ns from a gated timestamp bracket around the replay."""
    from rawgrad.hcq.graph import HCQGraph, KernelCommand, build_template

    prog = program if program is not None else load_empty_kernel(dev)
    gate = _Gate(dev)
    chains: dict[str, Any] = {}
    for n in lengths:
        template, programs = build_template(dev, [KernelCommand(prog, [], EMPTY_THREADS) for _ in range(n)])
        graph = HCQGraph(dev, template, programs, {})
        host_ns: list[int] = []
        for i in range(warmup + repeats):
            _idle(dev)
            h0 = time.perf_counter_ns()
            graph.submit({})
            h1 = time.perf_counter_ns()
            _sync(dev)
            if i >= warmup:
                host_ns.append(h1 - h0)
        gpu_ns: list[float] = []
        bracket_wall: list[int] = []
        gate.stamps.clear()
        for i in range(warmup + repeats):
            gpu, _, wall = gate.bracket(lambda graph=graph: graph.submit({}))  # type: ignore[misc]
            if i >= warmup:
                gpu_ns.append(gpu)
                bracket_wall.append(wall)
        row = _per_replay_summary(n, host_ns, gpu_ns, warmup)
        row["timestamps_valid"] = _stamps_valid(gate.stamps)
        row["gpu_within_wall"] = all(g <= w for g, w in zip(gpu_ns, bracket_wall, strict=True))
        row["gpu_includes"] = "two extra GP entries (the bracket's timestamp submissions)"
        row.update(_pipelined(lambda graph=graph: graph.submit({}), lambda: _sync(dev), repeats))  # type: ignore[misc]
        row["bound_copies"] = len(graph.copies)  # 2 once a replay was queued behind a running one
        chains[str(n)] = row
        print(f"    rawgrad graph  n={n:5d}: GPU {_f(row.get('gpu_us_per_kernel')):>9s} us/kernel, "
              f"host {_f(row.get('host_us_per_replay'), '.2f'):>9s} us/replay, "
              f"pipelined {_f(row.get('pipelined_us_per_replay'), '.2f')} us/replay", flush=True)
        del graph
    return {"path": "HCQGraph.submit (TinyJit's replay engine)", "kernel": empty_kernel_label(dev),
            "threads": EMPTY_THREADS, "chains": chains}


# ================================================================================== CUDA: dispatch
@dataclass
class CudaOps:
    """What timing a captured CUDA graph needs, from cupy or torch: `launch` replays it on the stream,
    `spin` queues a busy kernel on that stream (None: no hold available), events are timing events."""

    launch: Callable[[], object]
    synchronize: Callable[[], object]
    new_event: Callable[[], Any]
    record: Callable[[Any], object]
    done: Callable[[Any], bool]
    elapsed_ms: Callable[[Any, Any], float]
    spin: Callable[[], object] | None


def _pipelined(replay: Callable[[], object], synchronize: Callable[[], object], count: int) -> dict[str, Any]:
    """`count` replays queued back to back, then one synchronize: wall time per replay, host submission
    and device execution overlapping (what a loop that does not read results each step sees)."""
    synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(count):
        replay()
    synchronize()
    wall = time.perf_counter_ns() - t0
    return {"pipelined_replays": count, "pipelined_us_per_replay": wall / count / NS_PER_US}


def time_cuda_graph(n: int, ops: CudaOps, repeats: int, warmup: int) -> dict[str, Any]:
    """Host ns of each launch (stream idle before); GPU ns between events recorded right before and after
    the launch, once with the stream held by a spin kernel (the GPU reaches the start event only after the
    whole launch is queued: the fair per-node time) and once without (includes launch latency)."""
    host_ns: list[int] = []
    for i in range(warmup + repeats):
        ops.synchronize()
        h0 = time.perf_counter_ns()
        ops.launch()
        h1 = time.perf_counter_ns()
        ops.synchronize()
        if i >= warmup:
            host_ns.append(h1 - h0)
    start, end = ops.new_event(), ops.new_event()

    def events_around(hold: bool) -> tuple[list[float], int]:
        times: list[float] = []
        held = 0
        for i in range(warmup + repeats):
            ops.synchronize()
            if hold:
                assert ops.spin is not None
                ops.spin()
            ops.record(start)
            ops.launch()
            ops.record(end)
            pending = not ops.done(start)  # the GPU is still before the start event: the hold covered it
            ops.synchronize()
            if i >= warmup:
                times.append(ops.elapsed_ms(start, end) * NS_PER_S / MS_PER_S)
                held += pending
        return times, held

    unheld, _ = events_around(hold=False)
    out = _per_replay_summary(n, host_ns, unheld, warmup)
    out.update(_pipelined(ops.launch, ops.synchronize, repeats))
    out["gpu_method"] = "events around launch, stream idle (includes launch latency)"
    out["gpu_us_per_kernel_unheld"] = out.get("gpu_us_per_kernel")
    if ops.spin is not None:
        held_ns, held = events_around(hold=True)
        med = _median(held_ns)
        if med is not None:
            out["gpu_ns"] = held_ns
            out["gpu_us_per_replay"] = med / NS_PER_US
            out["gpu_us_per_kernel"] = med / n / NS_PER_US
            out["gpu_us_per_kernel_min"] = min(held_ns) / n / NS_PER_US
            out["gpu_method"] = "events around launch, stream held by a spin kernel until it was queued"
        out["held_replays"] = held
        out["held_fraction"] = held / len(held_ns) if held_ns else None
    return out


def _cupy_kernels(cupy: Any, info: dict[str, Any]) -> tuple[Any, Any]:
    """(empty, spin) cupy kernels, each launched once on the current stream. CUDA C through NVRTC first;
    if NVRTC is missing or fails, the same hand-written PTX rawgrad runs (plus a PTX spin loop), JIT-compiled
    by the driver (RawModule from a .ptx file), so the comparison still uses empty kernels."""
    try:
        empty = cupy.RawKernel(EMPTY_CUDA_SOURCE, EMPTY_CUDA_NAME)
        empty((1,), (EMPTY_THREADS,), ())
        info["compiled_by"] = "NVRTC (CUDA C source)"
    except Exception as e:  # noqa: BLE001 - fall back to the driver's PTX JIT
        info["nvrtc_error"] = _error_text(e)
        cc = str(cupy.cuda.Device(0).compute_capability)  # e.g. "90"
        src = empty_kernel_ptx(f"sm_{cc}") + SPIN_PTX_ENTRY
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(src)
        try:
            module = cupy.RawModule(path=f.name)
            empty = module.get_function(EMPTY_KERNEL)
            empty((1,), (EMPTY_THREADS,), ())
            info["compiled_by"] = f"driver PTX JIT of rawgrad's hand-written PTX (sm_{cc})"
            info["kernel"] = f"{EMPTY_KERNEL} (PTX 'ret;', the kernel rawgrad runs; empty kernels)"
            try:
                spin = module.get_function(SPIN_CUDA_NAME)
                spin((1,), (1,), (np.int64(1),))
                return empty, spin
            except Exception as e2:  # noqa: BLE001 - the unheld measurement still stands
                info["spin_error"] = _error_text(e2)
                return empty, None
        finally:
            os.unlink(f.name)
    try:
        spin = cupy.RawKernel(SPIN_CUDA_SOURCE, SPIN_CUDA_NAME)
        spin((1,), (1,), (np.int64(1),))
    except Exception as e:  # noqa: BLE001 - the unheld measurement still stands
        info["spin_error"] = _error_text(e)
        return empty, None
    return empty, spin


def _cupy_graph(lengths: Sequence[int], repeats: int, warmup: int) -> dict[str, Any]:
    import cupy  # type: ignore[import-not-found]

    rt = cupy.cuda.runtime
    count = rt.getDeviceCount()  # raises without a driver or GPU
    if count < 1:
        raise RuntimeError("cupy sees no CUDA device")
    info: dict[str, Any] = {"backend": f"cupy {cupy.__version__}", "threads": EMPTY_THREADS,
                            "kernel": f"{EMPTY_CUDA_SOURCE!r} (empty kernels)"}
    try:  # descriptive only: never let it stop the measurement
        name = rt.getDeviceProperties(0).get("name", b"?")
        info["cuda_device"] = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        info["cuda_driver_version"] = rt.driverGetVersion()
        info["cuda_runtime_version"] = rt.runtimeGetVersion()
    except Exception as e:  # noqa: BLE001
        info["device_info_error"] = _error_text(e)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        empty, spin = _cupy_kernels(cupy, info)  # compiled, loaded and run once before capturing
    spin_fn: Callable[[], object] | None = None
    if spin is not None:
        def spin_fn() -> None:
            with stream:
                spin((1,), (1,), (np.int64(SPIN_CYCLES),))
    stream.synchronize()
    chains: dict[str, Any] = {}
    for n in lengths:
        with stream:
            stream.begin_capture()
            try:
                for _ in range(n):
                    empty((1,), (EMPTY_THREADS,), ())
            finally:
                graph = stream.end_capture()  # always end the capture, or the stream stays unusable

        def launch(graph: Any = graph) -> None:
            graph.launch(stream)

        ops = CudaOps(launch=launch, synchronize=stream.synchronize, new_event=cupy.cuda.Event,
                      record=lambda ev: ev.record(stream), done=lambda ev: bool(ev.done),
                      elapsed_ms=lambda a, b: float(cupy.cuda.get_elapsed_time(a, b)), spin=spin_fn)
        row = time_cuda_graph(n, ops, repeats, warmup)
        chains[str(n)] = row
        _print_cuda_row("cupy", n, row)
        del graph
    info["chains"] = chains
    return info


def _torch_graph(lengths: Sequence[int], repeats: int, warmup: int) -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"torch {torch.__version__}: torch.cuda.is_available() is False")
    info: dict[str, Any] = {
        "backend": f"torch {torch.__version__}",
        "kernel": "x.add_(1) on a 1-element float32 tensor (NOT empty kernels)", "threads": None,
        "cuda_device": torch.cuda.get_device_name(0), "cuda_runtime_version": torch.version.cuda,
    }
    x = torch.zeros(1, device="cuda")
    stream = torch.cuda.Stream()
    sleep = getattr(torch.cuda, "_sleep", None)
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up on a side stream, as graph capture asks
            x.add_(1)
    torch.cuda.synchronize()
    chains: dict[str, Any] = {}
    for n in lengths:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(n):
                x.add_(1)
        torch.cuda.synchronize()

        def launch(graph: Any = graph) -> None:
            with torch.cuda.stream(stream):
                graph.replay()

        def spin() -> None:
            with torch.cuda.stream(stream):
                sleep(SPIN_CYCLES)  # type: ignore[misc]

        ops = CudaOps(launch=launch, synchronize=stream.synchronize,
                      new_event=lambda: torch.cuda.Event(enable_timing=True),
                      record=lambda ev: ev.record(stream), done=lambda ev: bool(ev.query()),
                      elapsed_ms=lambda a, b: float(a.elapsed_time(b)),
                      spin=spin if sleep is not None else None)
        row = time_cuda_graph(n, ops, repeats, warmup)
        chains[str(n)] = row
        _print_cuda_row("torch", n, row)
        del graph
    info["chains"] = chains
    return info


def _print_cuda_row(backend: str, n: int, row: dict[str, Any]) -> None:
    held = row.get("held_fraction")
    print(f"    CUDA graph ({backend}) n={n:5d}: GPU {_f(row.get('gpu_us_per_kernel')):>9s} us/node, "
          f"host {_f(row.get('host_us_per_replay'), '.2f'):>9s} us/launch, "
          f"pipelined {_f(row.get('pipelined_us_per_replay'), '.2f')} us/launch"
          f"{'' if held is None else f' (hold covered {held:.0%} of launches)'}", flush=True)


def cuda_graph_dispatch(lengths: Sequence[int], repeats: int, warmup: int) -> dict[str, Any]:
    """CUDA Graph timings from cupy (empty kernels), else torch (x.add_(1) nodes), else {"unavailable"}."""
    reasons: list[str] = []
    try:
        import cupy  # type: ignore[import-not-found]  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken CUDA install raising anything
        reasons.append(f"cupy not importable ({_error_text(e)})")
    else:
        try:
            return _cupy_graph(lengths, repeats, warmup)
        except Exception as e:  # noqa: BLE001 - fall back to torch, keeping the reason
            print(f"    cupy failed: {_error_text(e)}\n{traceback.format_exc(limit=-4)}", flush=True)
            reasons.append(f"cupy failed ({_error_text(e)})")
    try:
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001
        reasons.append(f"torch not importable ({_error_text(e)})")
        return {"unavailable": "; ".join(reasons)}
    try:
        out = _torch_graph(lengths, repeats, warmup)
    except Exception as e:  # noqa: BLE001
        reasons.append(f"torch: {_error_text(e)}")
        return {"unavailable": "; ".join(reasons)}
    if reasons:
        out["fallback_because"] = "; ".join(reasons)
    return out


# ================================================================================== bandwidth
def _check_sample(out: np.ndarray, expect: Callable[[np.ndarray], np.ndarray], n: int) -> dict[str, Any]:
    """Compare `out` with `expect(indices)` on random indices plus both ends."""
    rng = np.random.default_rng(SEED + 1)
    edge = min(EDGE_INDICES, n)
    idx = np.unique(np.concatenate([rng.integers(0, n, min(SAMPLE_INDICES, n)), np.arange(edge),
                                    np.arange(n - edge, n)]))
    got, want = out[idx], expect(idx)
    bad = ~np.isclose(got, want, rtol=CHECK_RTOL, atol=CHECK_ATOL)
    err = np.abs(got.astype(np.float64) - want)
    res: dict[str, Any] = {"checked": int(idx.size), "mismatches": int(bad.sum()),
                           "max_abs_err": float(err.max()) if idx.size else 0.0}
    if bad.any():
        k = int(idx[np.argmax(bad)])
        res["first_mismatch"] = {"index": k, "got": float(out[k]), "want": float(expect(np.array([k]))[0])}
    res["passed"] = not bad.any()
    return res


def rawgrad_bandwidth(dev: Any, elements: int, repeats: int, warmup: int) -> dict[str, Any]:
    """`a * b + c` on `elements` float32 through TinyJit: GPU time of a replay from a gated timestamp
    bracket, the kernel alone from the timestamps of a launch, wall time of replay + synchronize; the
    replayed result checked against numpy first."""
    from rawgrad import Tensor, TinyJit
    from rawgrad.tensor.buffers import device_memory
    from rawgrad.tensor.realize import capture_launches

    n = int(elements)
    rng = np.random.default_rng(SEED)
    t0 = time.perf_counter()
    na, nb, nc = (rng.random(n, dtype=np.float32) for _ in range(3))
    gen_s = time.perf_counter() - t0
    a, b, c = (Tensor(x, device=dev.name).realize() for x in (na, nb, nc))
    _sync(dev)
    upload_s = time.perf_counter() - t0 - gen_s
    res: dict[str, Any] = {"elements": n, "bytes_moved": EW_ARRAYS * F32_BYTES * n,
                           "host_generate_s": gen_s, "upload_s": upload_s}

    def ew(x: Tensor, y: Tensor, z: Tensor) -> Tensor:
        return x * y + z

    fn: TinyJit[Tensor] = TinyJit(ew, reuse_outputs=True)
    with capture_launches() as launched:
        eager = fn(a, b, c)  # call 1 runs eagerly: its launch is what the kernel-alone timing reruns
    kernels = [e for e in launched if e.kernel is not None]
    fn(a, b, c)  # call 2 captures
    out = fn(a, b, c)  # a replay
    _sync(dev)
    res["kernels_per_call"] = fn.last.kernel_count if fn.last is not None else None
    single = kernels[0].kernel if len(kernels) == 1 else None
    res["kernel_name"] = single.name if single is not None else None
    res["check"] = _check_sample(out.numpy().reshape(-1), lambda i: na[i] * nb[i] + nc[i], n)
    print(f"    result check: {res['check']}", flush=True)
    if not res["check"]["passed"]:
        raise AssertionError(f"rawgrad a*b+c differs from numpy: {res['check']}")

    gate = _Gate(dev)
    gpu_ns: list[float] = []
    wall_ns: list[int] = []
    bracket_wall: list[int] = []
    for i in range(warmup + repeats):
        gpu, _, bwall = gate.bracket(lambda: fn(a, b, c))
        _idle(dev)
        w0 = time.perf_counter_ns()
        fn(a, b, c)
        _sync(dev)
        wall = time.perf_counter_ns() - w0
        if i >= warmup:
            gpu_ns.append(gpu)
            wall_ns.append(wall)
            bracket_wall.append(bwall)
    replay_s = _median(gpu_ns)
    assert replay_s is not None
    replay_s /= NS_PER_S
    res["tinyjit_replay_ms"] = replay_s * MS_PER_S
    res["tinyjit_replay_gbs"] = res["bytes_moved"] / replay_s / GB if replay_s > 0 else None
    wall_s = (_median(wall_ns) or 0) / NS_PER_S
    res["wall_replay_sync_ms"] = wall_s * MS_PER_S
    res["wall_replay_sync_gbs"] = res["bytes_moved"] / wall_s / GB if wall_s > 0 else None
    res["gpu_ns"] = gpu_ns
    res["wall_ns"] = wall_ns
    res["timestamps_valid"] = _stamps_valid(gate.stamps)
    res["gpu_within_wall"] = all(g <= w for g, w in zip(gpu_ns, bracket_wall, strict=True))
    if single is not None:
        # The kernel alone: its eager launch rerun with timestamps right around the exec in one queue.
        item = kernels[0]
        bufs = [device_memory(x).hcq_buffer for x in item.bufs]
        times = []
        for i in range(warmup + repeats):
            s = single.launch(bufs, item.var_vals, wait=True)
            if i >= warmup and s is not None:
                times.append(s)
        k_s = _median(times)
        if k_s:
            res["kernel_ms"] = k_s * MS_PER_S
            res["kernel_gbs"] = res["bytes_moved"] / k_s / GB
    print(f"    rawgrad a*b+c n={n}: TinyJit replay {res['tinyjit_replay_ms']:.4f} ms = "
          f"{res['tinyjit_replay_gbs'] or float('nan'):.1f} GB/s; kernel alone "
          f"{res.get('kernel_ms', float('nan')):.4f} ms = {res.get('kernel_gbs', float('nan')):.1f} GB/s; "
          f"wall {res['wall_replay_sync_ms']:.4f} ms", flush=True)
    del eager  # kept alive until here: the kernel-alone launches write its buffer
    return res  # the caller frees the device memory once these locals are gone


def _free_rawgrad(dev: Any) -> None:
    """Give device memory back: drop Python references, let the GPU finish, empty the allocator cache."""
    gc.collect()
    try:
        _sync(dev)
        reap = getattr(dev, "reap", None)
        if reap is not None:
            reap()
        dev.allocator.free_cache()
        if reap is not None:
            _sync(dev)
            reap()
    except Exception as e:  # noqa: BLE001 - freeing must never hide the measurement
        print(f"    (freeing rawgrad memory failed: {_error_text(e)})", flush=True)


def torch_copy_bandwidth(elements: int, repeats: int, warmup: int) -> dict[str, Any]:
    """torch `dst.copy_(src)` on `elements` float32 on cuda, timed with CUDA events (stream held by
    torch.cuda._sleep when it exists); also torch.addcmul (a fused a*b+c) for reference. Memory is given
    back to the driver afterwards."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return {"unavailable": f"torch not importable ({_error_text(e)})"}
    if not torch.cuda.is_available():
        return {"unavailable": f"torch {torch.__version__}: torch.cuda.is_available() is False"}
    try:
        return _torch_bandwidth(torch, int(elements), repeats, warmup)
    finally:  # the tensors died with _torch_bandwidth's frame: return their memory to the driver
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _torch_bandwidth(torch: Any, n: int, repeats: int, warmup: int) -> dict[str, Any]:
    sleep = getattr(torch.cuda, "_sleep", None)
    res: dict[str, Any] = {"backend": f"torch {torch.__version__}", "elements": n,
                           "cuda_device": torch.cuda.get_device_name(0),
                           "cuda_runtime_version": torch.version.cuda, "held_by_spin": sleep is not None}

    def time_op(op: Callable[[], object]) -> list[float]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for i in range(warmup + repeats):
            torch.cuda.synchronize()
            if sleep is not None:
                sleep(SPIN_CYCLES)  # the copy is queued before the GPU reaches the start event
            start.record()
            op()
            end.record()
            end.synchronize()
            if i >= warmup:
                out.append(start.elapsed_time(end) / MS_PER_S)
        return out

    gen = torch.Generator(device="cuda").manual_seed(SEED)
    src = torch.rand(n, dtype=torch.float32, device="cuda", generator=gen)
    dst = torch.empty_like(src)
    times = time_op(lambda: dst.copy_(src))
    torch.cuda.synchronize()
    res["copy_check_passed"] = bool(torch.equal(dst, src))
    t = _median(times)
    assert t is not None
    res["copy_ms"] = t * MS_PER_S
    res["copy_bytes_moved"] = COPY_ARRAYS * F32_BYTES * n
    res["copy_gbs"] = res["copy_bytes_moved"] / t / GB
    res["copy_s"] = times
    print(f"    torch copy_ n={n}: {res['copy_ms']:.4f} ms = {res['copy_gbs']:.1f} GB/s "
          f"(check {res['copy_check_passed']})", flush=True)
    try:  # reference only: torch's own fused a*b+c on the same sizes
        b = torch.rand(n, dtype=torch.float32, device="cuda", generator=gen)
        c = torch.rand(n, dtype=torch.float32, device="cuda", generator=gen)
        t_fma = _median(time_op(lambda: torch.addcmul(c, src, b, out=dst)))
        if t_fma:
            res["addcmul_ms"] = t_fma * MS_PER_S
            res["addcmul_gbs"] = EW_ARRAYS * F32_BYTES * n / t_fma / GB
            print(f"    torch addcmul n={n}: {res['addcmul_ms']:.4f} ms = {res['addcmul_gbs']:.1f} GB/s",
                  flush=True)
    except Exception as e:  # noqa: BLE001
        res["addcmul_error"] = _error_text(e)
    return res


# ================================================================================== the run
def _rawgrad_row(result: dict[str, Any], path: str, chain: int) -> dict[str, Any] | None:
    sec = result["dispatch"].get(path)
    if not isinstance(sec, dict):
        return None
    row = sec.get("chains", {}).get(str(chain))
    return row if isinstance(row, dict) else None


def _fill_ratios(result: dict[str, Any], chain: int) -> None:
    cuda = _rawgrad_row(result, "cuda_graph", chain)
    ratios = result["ratios"]
    acc = result["acceptance"]
    notes: list[str] = []
    for path in ("rawgrad_queue", "rawgrad_graph"):
        ours = _rawgrad_row(result, path, chain)
        if ours is None or cuda is None:
            continue
        # A zero, reversed or too-long GPU interval would fake a winning ratio: no GPU ratio from it.
        gpu_ok = ours.get("timestamps_valid", True) and ours.get("gpu_within_wall", True)
        if not gpu_ok:
            notes.append(f"{path}: GPU timestamps invalid (zero, reversed or longer than wall time): "
                         f"no GPU ratio")
        gpu_ratio = _ratio(ours.get("gpu_us_per_kernel"), cuda.get("gpu_us_per_kernel"))
        ratios[f"{path}_gpu_per_kernel_vs_cuda_graph"] = gpu_ratio if gpu_ok else None
        ratios[f"{path}_host_per_replay_vs_cuda_graph"] = _ratio(ours.get("host_us_per_replay"),
                                                                 cuda.get("host_us_per_replay"))
        if "pipelined_us_per_replay" in ours:
            ratios[f"{path}_pipelined_per_replay_vs_cuda_graph"] = _ratio(ours.get("pipelined_us_per_replay"),
                                                                          cuda.get("pipelined_us_per_replay"))
    bw = result["bandwidth"]
    ours_bw = (bw.get("rawgrad") or {}).get("tinyjit_replay_gbs")
    if not (bw.get("rawgrad") or {}).get("timestamps_valid", True):
        notes.append("bandwidth: GPU timestamps invalid, no ratio")
        ours_bw = None
    torch_bw = (bw.get("torch") or {}).get("copy_gbs")
    ratios["bandwidth_tinyjit_vs_torch_copy"] = _ratio(ours_bw, torch_bw)
    ratios["bandwidth_kernel_vs_torch_copy"] = _ratio((bw.get("rawgrad") or {}).get("kernel_gbs"), torch_bw)
    gpu_r = ratios.get("rawgrad_queue_gpu_per_kernel_vs_cuda_graph")
    host_r = ratios.get("rawgrad_queue_host_per_replay_vs_cuda_graph")
    bw_r = ratios.get("bandwidth_tinyjit_vs_torch_copy")
    acc["dispatch_gpu"] = None if gpu_r is None else gpu_r <= DISPATCH_MAX_RATIO
    acc["dispatch_host"] = None if host_r is None else host_r <= DISPATCH_MAX_RATIO
    acc["bandwidth"] = None if bw_r is None else bw_r >= BANDWIDTH_MIN_RATIO
    cuda_kernel = str((result["dispatch"].get("cuda_graph") or {}).get("kernel", ""))
    if cuda is not None and "NOT empty" in cuda_kernel:
        notes.append("CUDA side is torch x.add_(1) nodes, not empty kernels")
    if notes:
        acc["note"] = "; ".join(notes)


def _failed(res: dict[str, Any], key: str) -> dict[str, Any]:
    return {"error": res["errors"][key]["error"]}


def run(chain: int = DEFAULT_CHAIN, elements: int = DEFAULT_ELEMENTS, repeats: int = DEFAULT_REPEATS,
        json_path: str | None = None, *, warmup: int = DEFAULT_WARMUP,
        extra_chains: Sequence[int] = EXTRA_CHAINS,
        bandwidth_repeats: int = BANDWIDTH_REPEATS, bandwidth_warmup: int = BANDWIDTH_WARMUP,
        device: str = DEFAULT_DEVICE, sections: Sequence[str] = ("dispatch", "bandwidth"),
        quick: bool = False, print_table: bool = True) -> dict[str, Any]:
    """Measure, print a table and write JSON; returns the result dict (see the module docstring)."""
    if quick:
        repeats, warmup = min(repeats, QUICK_REPEATS), min(warmup, QUICK_WARMUP)
        bandwidth_repeats = min(bandwidth_repeats, QUICK_BANDWIDTH_REPEATS)
        elements = min(elements, QUICK_ELEMENTS)
    if json_path is None and os.environ.get("OUT"):
        json_path = os.path.join(os.environ["OUT"], JSON_NAME)
    r = _Run(json_path)
    res = r.result
    opened = r.section("device", open_rawgrad_device, device)
    dev = None
    if opened is not None:
        dev, res["device"] = opened
        if res["device"].get("mock"):
            caps = {"chain": min(chain, MOCK_MAX_CHAIN), "elements": min(elements, MOCK_MAX_ELEMENTS),
                    "repeats": min(repeats, MOCK_MAX_REPEATS)}
            if caps != {"chain": chain, "elements": elements, "repeats": repeats}:
                print(f"    mock GPU ({MOCK_LABEL}): sizes capped to {caps}", flush=True)
                res["meta"]["mock_caps"] = caps
            chain, elements, repeats = caps["chain"], caps["elements"], caps["repeats"]
            extra_chains = [min(n, MOCK_MAX_CHAIN) for n in extra_chains]
            bandwidth_repeats = min(bandwidth_repeats, MOCK_MAX_REPEATS)
            warmup, bandwidth_warmup = min(warmup, 1), min(bandwidth_warmup, 1)
        print(f"    {res['device']}", flush=True)
    else:
        res["device"] = {"error": res["errors"]["device"]["error"]}
    if dev is not None and getattr(dev, "nv", None) is not None:
        res["device"]["clock"] = r.section("rawgrad_clock", rawgrad_clock_check, dev)
    lengths = _chain_lengths(chain, extra_chains)
    res["meta"].update({"chain": chain, "chains": lengths, "elements": elements, "repeats": repeats,
                        "warmup": warmup, "bandwidth_repeats": bandwidth_repeats})
    skipped = {"skipped": f"no rawgrad device ({res['device'].get('error')})"}
    # the CUDA references measure an NVIDIA GPU: next to an AMD device they would compare different hardware
    no_cuda = ({"unavailable": "the CUDA references need an NVIDIA GPU (the device under test is AMD)"}
               if dev is not None and _is_amd(dev) else None)

    if "dispatch" in sections:
        program = r.section("rawgrad_empty_kernel", load_empty_kernel, dev) if dev is not None else None
        for key, fn in (("rawgrad_queue", rawgrad_queue_dispatch), ("rawgrad_graph", rawgrad_graph_dispatch)):
            if dev is None or program is None:
                why = skipped if dev is None else {"skipped": "the empty kernel did not load"}
                res["dispatch"][key] = why
                continue
            out = r.section(key, fn, dev, lengths, repeats, warmup, program)
            res["dispatch"][key] = out if out is not None else _failed(res, key)
        del program
        # CUDA after rawgrad's device exists; never both at once (every measurement above has finished).
        if no_cuda is not None:
            res["dispatch"]["cuda_graph"] = no_cuda
        else:
            out = r.section("cuda_graph", cuda_graph_dispatch, lengths, repeats, warmup)
            res["dispatch"]["cuda_graph"] = out if out is not None else _failed(res, "cuda_graph")

    if "bandwidth" in sections:
        if dev is None:
            res["bandwidth"]["rawgrad"] = skipped
        else:
            out = r.section("rawgrad_bandwidth", rawgrad_bandwidth, dev, elements, bandwidth_repeats,
                            bandwidth_warmup)
            _free_rawgrad(dev)  # its arrays went with the section's frame (or its traceback, below)
            res["bandwidth"]["rawgrad"] = out if out is not None else _failed(res, "rawgrad_bandwidth")
        if no_cuda is not None:
            res["bandwidth"]["torch"] = no_cuda
        else:
            out = r.section("torch_bandwidth", torch_copy_bandwidth, elements, bandwidth_repeats,
                            bandwidth_warmup)
            res["bandwidth"]["torch"] = out if out is not None else _failed(res, "torch_bandwidth")

    _fill_ratios(res, chain)
    res["meta"]["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if print_table:
        print(format_table(res), flush=True)
    r.save(final=True)
    return res


def dispatch(chain: int = DEFAULT_CHAIN, repeats: int = DEFAULT_REPEATS, *, quick: bool = False,
             json_path: str | None = None) -> dict[str, Any]:
    """Only the dispatch part (rawgrad queue and graph vs CUDA Graph), printed as a table."""
    if json_path is None and os.environ.get("OUT"):
        json_path = os.path.join(os.environ["OUT"], "bench_gpu_dispatch.json")
    return run(chain, repeats=repeats, json_path=json_path, sections=("dispatch",), quick=quick)


def default_device_kind() -> str | None:
    """The kind of the default device (DEV, else auto-detected): "NV", "AMD", ...; None when none works."""
    try:
        from rawgrad.hcq import Device
        return Device.DEFAULT.partition(":")[0]
    except Exception:  # noqa: BLE001 - no usable device at all
        return None


def default_is_nv() -> bool:
    """Whether the default device (DEV, else auto-detected) is an NV GPU."""
    try:
        from rawgrad.hcq import Device
        return Device.DEFAULT.partition(":")[0] == "NV"
    except Exception:  # noqa: BLE001 - no usable device at all: not NV
        return False


# ================================================================================== the table
def _f(v: Any, spec: str = ".3f") -> str:
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"


def format_table(res: dict[str, Any]) -> str:
    """The human-readable summary of a result dict."""
    dev = res.get("device", {})
    meta = res["meta"]
    lines = ["", "=" * 100, f"rawgrad bench gpu  {meta.get('started')}  host {meta.get('host_cpu')}"]
    if "error" in dev:
        lines.append(f"rawgrad device: unavailable ({dev['error']})")
    else:
        lines.append(f"rawgrad device: {dev.get('rawgrad_device')} {dev.get('arch')} "
                     f"pci {dev.get('pci_device_id')} driver {dev.get('driver_version')} "
                     f"compute class {dev.get('compute_class')}"
                     f"{f' (MOCK GPU: {MOCK_LABEL})' if dev.get('mock') else ''}")
    cuda = res["dispatch"].get("cuda_graph") or {}
    torch_bw = res["bandwidth"].get("torch") or {}
    cuda_dev = cuda.get("cuda_device") or torch_bw.get("cuda_device")
    if cuda_dev:
        lines.append(f"CUDA: {cuda_dev}, {cuda.get('backend') or torch_bw.get('backend')}, driver "
                     f"{cuda.get('cuda_driver_version', '?')}, runtime "
                     f"{cuda.get('cuda_runtime_version', torch_bw.get('cuda_runtime_version'))}")
    if res["dispatch"]:
        lines.append(f"dispatch: medians of {meta.get('repeats')} replays after {meta.get('warmup')} "
                     f"warm-ups; {EMPTY_THREADS}-thread empty kernels")
        lines.append(f"  {'path':44s} {'N':>5s} {'GPU us/kernel':>14s} {'host us/replay':>15s} {'note':s}")
        labels = {"rawgrad_queue": "rawgrad bound queue (timestamps in queue)",
                  "rawgrad_graph": "rawgrad HCQGraph (TinyJit replay engine)",
                  "cuda_graph": f"CUDA Graph ({cuda['backend']})" if "backend" in cuda else "CUDA Graph"}
        for key, label in labels.items():
            sec = res["dispatch"].get(key)
            if not isinstance(sec, dict):
                continue
            if "chains" not in sec:
                why = sec.get("unavailable") or sec.get("error") or sec.get("skipped")
                lines.append(f"  {label:44s} {'-':>5s} {'-':>14s} {'-':>15s} {why}")
                continue
            for n, row in sorted(sec["chains"].items(), key=lambda kv: int(kv[0])):
                note = ""
                if key == "rawgrad_queue":
                    note = f"ordered={row.get('timestamps_ordered')}"
                elif key == "cuda_graph":
                    held = row.get("held_fraction")
                    note = (f"unheld {_f(row.get('gpu_us_per_kernel_unheld'))} us/node"
                            + ("" if held is None else f", hold {held:.0%}"))
                    if "NOT empty" in str(sec.get("kernel", "")):
                        note += ", x.add_(1) nodes (NOT empty kernels)"
                lines.append(f"  {label:44s} {int(n):5d} {_f(row.get('gpu_us_per_kernel')):>14s} "
                             f"{_f(row.get('host_us_per_replay'), '.2f'):>15s} {note}")
    bw = res["bandwidth"]
    if bw:
        ours = bw.get("rawgrad") or {}
        lines.append(f"bandwidth: a*b+c on {meta.get('elements')} float32 (4 arrays) vs torch copy_ "
                     f"(2 arrays), medians of {meta.get('bandwidth_repeats')}")

        def bw_line(label: str, sec: dict[str, Any], ms: str, gbs: str, extra: str = "") -> str:
            return f"  {label:50s} {_f(sec.get(ms), '.4f'):>10s} ms {_f(sec.get(gbs), '.1f'):>8s} GB/s{extra}"

        if "tinyjit_replay_gbs" in ours:
            check = f"   check: {(ours.get('check') or {}).get('passed')}"
            lines.append(bw_line("rawgrad TinyJit replay (gated GPU timestamps)", ours, "tinyjit_replay_ms",
                                 "tinyjit_replay_gbs", check))
            lines.append(bw_line("rawgrad kernel alone (timestamps around exec)", ours, "kernel_ms",
                                 "kernel_gbs"))
            lines.append(bw_line("rawgrad wall (replay + synchronize)", ours, "wall_replay_sync_ms",
                                 "wall_replay_sync_gbs"))
        else:
            lines.append(f"  rawgrad: {ours.get('error') or ours.get('skipped') or ours}")
        if "copy_gbs" in torch_bw:
            lines.append(bw_line("torch copy_ (CUDA events)", torch_bw, "copy_ms", "copy_gbs"))
            if "addcmul_gbs" in torch_bw:
                lines.append(bw_line("torch addcmul (fused a*b+c, reference)", torch_bw, "addcmul_ms",
                                     "addcmul_gbs"))
        else:
            lines.append(f"  torch: {torch_bw.get('unavailable') or torch_bw.get('error') or torch_bw}")
    ratios, acc = res["ratios"], res["acceptance"]
    lines.append(f"ratios at N={meta.get('chain')} (rawgrad / CUDA Graph, lower is better, acceptance <= "
                 f"{DISPATCH_MAX_RATIO:g}):")
    for path in ("rawgrad_queue", "rawgrad_graph"):
        gpu_r = ratios.get(f"{path}_gpu_per_kernel_vs_cuda_graph")
        host_r = ratios.get(f"{path}_host_per_replay_vs_cuda_graph")
        line = f"  {path:14s} GPU per kernel {_f(gpu_r)}   host per replay {_f(host_r)}"
        pipelined = ratios.get(f"{path}_pipelined_per_replay_vs_cuda_graph")
        lines.append(line + (f"   pipelined per replay {_f(pipelined)}" if pipelined is not None else ""))
    bw_jit = ratios.get("bandwidth_tinyjit_vs_torch_copy")
    bw_kernel = ratios.get("bandwidth_kernel_vs_torch_copy")
    lines.append(f"  bandwidth rawgrad / torch copy: TinyJit {_f(bw_jit)}, kernel alone {_f(bw_kernel)} "
                 f"(acceptance >= {BANDWIDTH_MIN_RATIO:g})")
    note = f"; {acc['note']}" if acc.get("note") else ""
    lines.append(f"acceptance: dispatch GPU {acc.get('dispatch_gpu')}, dispatch host "
                 f"{acc.get('dispatch_host')}, bandwidth {acc.get('bandwidth')}{note}")
    if res["errors"]:
        lines.append("errors:")
        for key, err in res["errors"].items():
            lines.append(f"  {key}: {err['error']}")
    lines.append("=" * 100)
    return "\n".join(lines)


def main(quick: bool = False, json_path: str | None = None, device: str = DEFAULT_DEVICE) -> int:
    """`python -m rawgrad bench gpu`: 0 when every section ran, 1 when one failed (see the table)."""
    res = run(json_path=json_path, quick=quick, device=device)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv))
