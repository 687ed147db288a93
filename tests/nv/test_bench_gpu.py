"""rawgrad/bench_gpu.py on the mock NV GPU: the dispatch and bandwidth sections run end to end with tiny
sizes, report finite numbers from ordered GPU timestamps, and record (not raise) what is unavailable here."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from rawgrad.cli import bench_gpu
from rawgrad.hcq import Device

CHAIN = 3
ELEMENTS = 2**10


def _empty_launches(dev: Any) -> list[Any]:
    return [x for x in dev.owned_mock.gpu.launches if x.entry == bench_gpu.EMPTY_KERNEL]


def _positive(x: Any) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_empty_kernel_chain_runs_each_kernel_once_per_replay(nv: str) -> None:
    dev: Any = Device[nv]
    prog = bench_gpu.load_empty_kernel(dev)
    assert prog.info.params == ()  # the hand-written entry takes no parameters
    before = len(_empty_launches(dev))
    out = bench_gpu.rawgrad_queue_dispatch(dev, [CHAIN], repeats=1, warmup=0, program=prog)
    launches = _empty_launches(dev)[before:]
    # one replay of the bound queue: one SEND_PCAS, then the rest started by DEPENDENT_QMD0 chaining
    assert [x.chained for x in launches] == [False] + [True] * (CHAIN - 1)
    assert all(x.block == (bench_gpu.EMPTY_THREADS, 1, 1) and x.grid == (1, 1, 1) for x in launches)
    row = out["chains"][str(CHAIN)]
    start, end = row["first_stamps"]
    assert 0 < start < end and row["gpu_ns"] == [end - start]
    # bound: only the timeline wait/signal values and the block's own retirement value are patched per replay
    assert row["patch_points"] == 6


def test_run_on_mock_writes_every_section(nv: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUT", raising=False)
    dev: Any = Device[nv]
    before = len(_empty_launches(dev))
    path = tmp_path / "bench.json"
    t0 = time.perf_counter()
    res = bench_gpu.run(chain=CHAIN, elements=ELEMENTS, repeats=2, warmup=1, extra_chains=(),
                        bandwidth_repeats=2, bandwidth_warmup=1, json_path=str(path), device=nv)
    assert time.perf_counter() - t0 < 30
    assert set(res["errors"]) == set(), res["errors"]
    assert res["device"]["mock"] and res["device"]["arch"] == dev.arch

    # dispatch: positive finite per-kernel GPU times and host times, ordered timestamps
    for key in ("rawgrad_queue", "rawgrad_graph"):
        row = res["dispatch"][key]["chains"][str(CHAIN)]
        assert row["replays"] == 2 and len(row["gpu_ns"]) == 2 and len(row["host_ns"]) == 2
        for field in ("gpu_us_per_kernel", "gpu_us_per_replay", "host_us_per_replay"):
            assert _positive(row[field]), (key, field, row[field])
    queue_row = res["dispatch"]["rawgrad_queue"]["chains"][str(CHAIN)]
    assert queue_row["timestamps_ordered"] and queue_row["timestamps_valid"] and queue_row["gpu_within_wall"]
    graph_row = res["dispatch"]["rawgrad_graph"]["chains"][str(CHAIN)]
    assert graph_row["timestamps_valid"] and graph_row["gpu_within_wall"]
    assert graph_row["pipelined_replays"] == 2 and _positive(graph_row["pipelined_us_per_replay"])
    assert graph_row["bound_copies"] in (1, 2)  # 2 when the second replay was queued before the first ran
    clock = res["device"]["clock"]
    assert clock["timestamp_between_ptimer_reads"] and 0.5 < clock["ptimer_ns_per_host_ns"] < 2
    # the empty kernel really ran CHAIN times per replay: queue 1 + 2 replays, graph (1 + 2) host-timed
    # and (1 + 2) bracketed replays, then 2 pipelined ones
    assert len(_empty_launches(dev)) - before == CHAIN * (3 + 3 + 3 + 2)

    # no CUDA on this machine: recorded with the reason, not raised; no ratio without it
    cuda = res["dispatch"]["cuda_graph"]
    assert "chains" not in cuda and cuda["unavailable"]
    assert res["ratios"].get("rawgrad_queue_gpu_per_kernel_vs_cuda_graph") is None
    assert res["acceptance"]["dispatch_gpu"] is None and res["acceptance"]["bandwidth"] is None

    # bandwidth: the replayed result matched numpy on the sampled indices, times are positive
    bw = res["bandwidth"]["rawgrad"]
    assert bw["check"]["passed"] and bw["check"]["mismatches"] == 0 and bw["check"]["checked"] == ELEMENTS
    assert bw["kernels_per_call"] == 1 and bw["bytes_moved"] == 4 * 4 * ELEMENTS
    for field in ("tinyjit_replay_ms", "tinyjit_replay_gbs", "kernel_ms", "wall_replay_sync_ms"):
        assert _positive(bw[field]), (field, bw[field])
    assert bw["timestamps_valid"] and bw["gpu_within_wall"]
    assert res["bandwidth"]["torch"]["unavailable"]

    saved = json.loads(path.read_text())
    assert {"meta", "device", "dispatch", "bandwidth", "ratios", "acceptance", "errors"} <= set(saved)
    assert saved["dispatch"]["rawgrad_queue"]["chains"][str(CHAIN)]["gpu_us_per_kernel"] == \
        pytest.approx(queue_row["gpu_us_per_kernel"])
    table = bench_gpu.format_table(res)
    assert "rawgrad bound queue" in table and "MOCK GPU" in table and "acceptance" in table


def test_a_failing_section_is_recorded_and_the_run_goes_on(nv: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUT", raising=False)

    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(bench_gpu, "rawgrad_queue_dispatch", broken)
    res = bench_gpu.run(chain=2, elements=ELEMENTS, repeats=1, warmup=0, extra_chains=(),
                        sections=("dispatch",), device=nv, print_table=False)
    assert res["errors"]["rawgrad_queue"]["error"] == "RuntimeError: simulated failure"
    assert "simulated failure" in res["errors"]["rawgrad_queue"]["traceback"]
    assert res["dispatch"]["rawgrad_queue"] == {"error": "RuntimeError: simulated failure"}
    graph_row = res["dispatch"]["rawgrad_graph"]["chains"]["2"]
    assert _positive(graph_row["gpu_us_per_kernel"])  # the next section ran


class _FakeStream:
    """A stream on a simulated GPU: work starts when both the host has queued it and earlier work is done."""

    LAUNCH_HOST_NS = 5_000  # what one graph launch costs the host
    GRAPH_GPU_NS = 3_000  # what the graph then takes on the GPU
    SPIN_NS = 1_000_000

    def __init__(self) -> None:
        self.host_ns = 0
        self.gpu_free_ns = 0

    def _queue(self, duration: int) -> int:
        begin = max(self.host_ns, self.gpu_free_ns)
        self.gpu_free_ns = begin + duration
        return begin

    def launch(self) -> None:
        self.host_ns += self.LAUNCH_HOST_NS  # the GPU sees the graph only once the launch call returns
        self._queue(self.GRAPH_GPU_NS)

    def spin(self) -> None:
        self._queue(self.SPIN_NS)

    def record(self, ev: dict[str, int]) -> None:
        ev["t"] = self._queue(0)

    def done(self, ev: dict[str, int]) -> bool:
        return ev["t"] <= self.host_ns

    def synchronize(self) -> None:
        self.host_ns = max(self.host_ns, self.gpu_free_ns)


def test_cuda_graph_timing_holds_the_stream() -> None:
    """time_cuda_graph: events around an idle-stream launch include the host's launch time; with the stream
    held by a spin kernel they measure the graph alone, and the hold is seen to cover every launch."""
    s = _FakeStream()
    n = 10
    ops = bench_gpu.CudaOps(launch=s.launch, synchronize=s.synchronize, new_event=dict, record=s.record,
                            done=s.done, elapsed_ms=lambda a, b: (b["t"] - a["t"]) / 1e6, spin=s.spin)
    row = bench_gpu.time_cuda_graph(n, ops, repeats=4, warmup=1)
    assert row["replays"] == 4 and row["held_fraction"] == 1.0
    assert row["gpu_us_per_kernel"] == pytest.approx(s.GRAPH_GPU_NS / n / 1e3)
    assert row["gpu_us_per_kernel_unheld"] == pytest.approx((s.LAUNCH_HOST_NS + s.GRAPH_GPU_NS) / n / 1e3)
    assert "spin" in row["gpu_method"]
    no_spin = bench_gpu.time_cuda_graph(n, bench_gpu.CudaOps(**{**ops.__dict__, "spin": None}), 2, 0)
    assert "held_fraction" not in no_spin and no_spin["gpu_us_per_kernel"] == row["gpu_us_per_kernel_unheld"]


# ----------------------------------------------------------------------------------- fake CUDA libraries
# Stand-ins with the cupy / torch surface bench_gpu uses, over the simulated stream above: they run the
# CUDA code paths here (no GPU) so a typo or a wrong call shape fails in CI, not in a device session.
class _FakeCupyKernel:
    def __init__(self, lib: _FakeCupy, name: str) -> None:
        self.lib, self.name = lib, name

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...]) -> None:
        if self.lib.capturing is not None:
            self.lib.capturing.append(self.name)
        elif self.name.endswith("spin"):
            self.lib.sim.spin()
        else:
            self.lib.sim._queue(1)


class _FakeCupyGraph:
    def __init__(self, lib: _FakeCupy, nodes: list[str]) -> None:
        self.lib, self.nodes = lib, nodes

    def launch(self, stream: Any = None) -> None:
        assert stream is self.lib.stream and self.nodes
        self.lib.launched += 1
        self.lib.sim.launch()


class _FakeCupy:
    """cupy: runtime queries, a non-blocking stream with capture, events, RawKernel (NVRTC, failing when
    `nvrtc_fails`) and RawModule (driver PTX JIT)."""

    __version__ = "0.fake"

    def __init__(self, nvrtc_fails: bool = False) -> None:
        self.sim = _FakeStream()
        self.capturing: list[str] | None = None
        self.nvrtc_fails = nvrtc_fails
        self.launched = 0
        self.loaded_ptx: list[str] = []
        lib = self

        class Stream:
            def __init__(self, non_blocking: bool = False) -> None:
                lib.stream = self

            def __enter__(self) -> Stream:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def synchronize(self) -> None:
                lib.sim.synchronize()

            def begin_capture(self) -> None:
                lib.capturing = []

            def end_capture(self) -> _FakeCupyGraph:
                nodes, lib.capturing = lib.capturing or [], None
                return _FakeCupyGraph(lib, nodes)

        class Event:
            def record(self, stream: Any = None) -> None:
                self.t = lib.sim._queue(0)

            @property
            def done(self) -> bool:
                return self.t <= lib.sim.host_ns

        class Runtime:
            getDeviceCount = staticmethod(lambda: 1)  # noqa: N815 - cupy's names
            getDeviceProperties = staticmethod(lambda i: {"name": b"Fake GPU"})  # noqa: N815
            driverGetVersion = staticmethod(lambda: 13000)  # noqa: N815
            runtimeGetVersion = staticmethod(lambda: 13000)  # noqa: N815

        class Device:
            def __init__(self, i: int) -> None:
                self.compute_capability = "90"

        class Cuda:
            runtime = Runtime
            get_elapsed_time = staticmethod(lambda a, b: (b.t - a.t) / 1e6)

        Cuda.Stream, Cuda.Event, Cuda.Device = Stream, Event, Device  # type: ignore[attr-defined]
        self.cuda = Cuda

    def RawKernel(self, code: str, name: str) -> _FakeCupyKernel:  # noqa: N802 - cupy's name
        if self.nvrtc_fails:
            raise RuntimeError("nvrtc: libnvrtc.so not found")
        return _FakeCupyKernel(self, name)

    def RawModule(self, *, path: str) -> Any:  # noqa: N802
        self.loaded_ptx.append(Path(path).read_text())
        lib = self

        class Module:
            def get_function(self, name: str) -> _FakeCupyKernel:
                return _FakeCupyKernel(lib, name)
        return Module()


@pytest.mark.parametrize("nvrtc_fails", [False, True])
def test_cupy_graph_path_on_a_fake_cupy(monkeypatch: pytest.MonkeyPatch, nvrtc_fails: bool) -> None:
    import sys
    fake = _FakeCupy(nvrtc_fails)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    out = bench_gpu.cuda_graph_dispatch([1, 10], repeats=3, warmup=1)
    assert out["backend"] == "cupy 0.fake" and out["cuda_device"] == "Fake GPU" and "unavailable" not in out
    row = out["chains"]["10"]
    assert row["held_fraction"] == 1.0
    assert row["gpu_us_per_kernel"] == pytest.approx(_FakeStream.GRAPH_GPU_NS / 10 / 1e3)
    # per length: host pass, unheld and held event passes (warm-up + 3 each), then 3 pipelined launches
    assert fake.launched == 2 * (3 * (1 + 3) + 3)
    assert row["pipelined_replays"] == 3 and row["pipelined_us_per_replay"] > 0
    if nvrtc_fails:  # the driver JIT got rawgrad's own empty kernel and the PTX spin loop
        assert "nvrtc" in out["nvrtc_error"] and "PTX JIT" in out["compiled_by"]
        assert ".target sm_90" in fake.loaded_ptx[0] and bench_gpu.SPIN_CUDA_NAME in fake.loaded_ptx[0]
    else:
        assert out["compiled_by"].startswith("NVRTC")


class _FakeTensor:
    def __init__(self, data: Any) -> None:
        self.data = data

    def add_(self, v: float) -> _FakeTensor:
        _FakeTorch.current.record_op()
        return self

    def copy_(self, src: _FakeTensor) -> _FakeTensor:
        self.data[...] = src.data
        _FakeTorch.current.sim._queue(2_000)
        return self


class _FakeTorch:
    """torch: CUDA availability, streams, graphs, events, _sleep and the tensor calls bench_gpu makes."""

    current: _FakeTorch
    __version__ = "0.fake+cu"
    float32 = "float32"

    def __init__(self) -> None:
        import numpy as np
        _FakeTorch.current = self
        self.sim = _FakeStream()
        self.capturing: list[str] | None = None
        self.replays = 0
        lib = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing

            def record(self, stream: Any = None) -> None:
                self.t = lib.sim._queue(0)

            def query(self) -> bool:
                return self.t <= lib.sim.host_ns

            def synchronize(self) -> None:
                lib.sim.synchronize()

            def elapsed_time(self, end: Event) -> float:
                return (end.t - self.t) / 1e6

        class CUDAGraph:
            def replay(self) -> None:
                assert self.nodes
                lib.replays += 1
                lib.sim.launch()

        class GraphCapture:
            def __init__(self, g: CUDAGraph) -> None:
                self.g = g

            def __enter__(self) -> None:
                lib.capturing = []

            def __exit__(self, *exc: object) -> None:
                self.g.nodes, lib.capturing = lib.capturing, None

        class StreamCtx:
            def __init__(self, s: Any) -> None:
                pass

            def __enter__(self) -> None:
                return None

            def __exit__(self, *exc: object) -> None:
                return None

        class Stream:
            def synchronize(self) -> None:
                lib.sim.synchronize()

            def wait_stream(self, other: Any) -> None:
                return None

        class Cuda:
            is_available = staticmethod(lambda: True)
            get_device_name = staticmethod(lambda i=0: "Fake GPU")
            synchronize = staticmethod(lambda: lib.sim.synchronize())
            empty_cache = staticmethod(lambda: None)
            _sleep = staticmethod(lambda cycles: lib.sim.spin())

        Cuda.Event, Cuda.CUDAGraph, Cuda.graph, Cuda.stream, Cuda.Stream = (  # type: ignore[attr-defined]
            Event, CUDAGraph, GraphCapture, StreamCtx, Stream)
        self.cuda = Cuda
        self.version = type("Version", (), {"cuda": "13.0"})

        class Generator:
            def __init__(self, device: str) -> None:
                self.rng = np.random.default_rng(0)

            def manual_seed(self, seed: int) -> Generator:
                return self

        self.Generator = Generator
        self.np = np

    def record_op(self) -> None:
        if self.capturing is not None:
            self.capturing.append("add_")
        else:
            self.sim._queue(1)

    def zeros(self, n: int, device: str) -> _FakeTensor:
        return _FakeTensor(self.np.zeros(n, self.np.float32))

    def rand(self, n: int, dtype: str, device: str, generator: Any) -> _FakeTensor:
        return _FakeTensor(generator.rng.random(n, dtype=self.np.float32))

    def empty_like(self, t: _FakeTensor) -> _FakeTensor:
        return _FakeTensor(self.np.empty_like(t.data))

    def equal(self, a: _FakeTensor, b: _FakeTensor) -> bool:
        return bool(self.np.array_equal(a.data, b.data))

    def addcmul(self, c: _FakeTensor, a: _FakeTensor, b: _FakeTensor, out: _FakeTensor) -> _FakeTensor:
        out.data[...] = c.data + a.data * b.data
        self.sim._queue(4_000)
        return out


def test_torch_paths_on_a_fake_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    fake = _FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises: the torch fallback runs
    out = bench_gpu.cuda_graph_dispatch([4], repeats=2, warmup=1)
    assert "NOT empty" in out["kernel"] and "cupy not importable" in out["fallback_because"]
    assert out["chains"]["4"]["held_fraction"] == 1.0 and fake.replays == 3 * (1 + 2) + 2  # + 2 pipelined
    bw = bench_gpu.torch_copy_bandwidth(1000, repeats=2, warmup=1)
    assert bw["copy_check_passed"] and bw["held_by_spin"]
    assert bw["copy_ms"] == pytest.approx(2e-3) and bw["copy_gbs"] == pytest.approx(2 * 4 * 1000 / 2e-6 / 1e9)
    assert bw["addcmul_gbs"] == pytest.approx(4 * 4 * 1000 / 4e-6 / 1e9)
