"""Host time of a replay on the NV driver code, without a GPU: the mock GPU is detached after warm-up.

What it measures is only the Python (and native publish) path a replay runs on the host: patching the
bound block, the GP entry, GPPut and the doorbell write. The mock GPU thread is stopped first (it would
compete for the GIL), the doorbell goes to a dummy word, and the host fakes retirement after each replay.
It is for comparing changes to the replay path on a machine without a GPU; it is not a hardware result
(`python -m rawgrad bench gpu` is, on a GPU).

    python3 tools/replay_host_cost.py [--replays 3000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("NV_MOCK", "1")

import cffi  # noqa: E402
import numpy as np  # noqa: E402

from rawgrad import Device, Tensor, TinyJit  # noqa: E402
from rawgrad.cli.bench_gpu import EMPTY_THREADS, load_empty_kernel  # noqa: E402
from rawgrad.drivers.mmio import native_mmio  # noqa: E402
from rawgrad.drivers.nv import pushbuf as pbuf  # noqa: E402
from rawgrad.hcq.graph import HCQGraph, KernelCommand, build_template  # noqa: E402

GRAPH_LENGTHS = (1, 100, 1000)
JIT_CHAIN = 10  # kernels in the TinyJit function timed
WARMUP_FRACTION = 10  # the first 1/10 of the replays are not counted

_ffi = cffi.FFI()


def _summary(samples: list[int]) -> str:
    """Median and 10th percentile in µs (a shared machine's noise inflates the median more)."""
    kept = sorted(samples[len(samples) // WARMUP_FRACTION:])
    return f"median {statistics.median(kept) / 1e3:6.2f} us, p10 {kept[len(kept) // 10] / 1e3:6.2f} us"


class DetachedGPU:
    """Stops the mock GPU and makes the compute channel publish into a dummy doorbell; `retire()` then
    plays the GPU's part (retirement counter and timeline) after each replay."""

    def __init__(self, dev: object) -> None:
        self.dev: object = dev
        ch = dev.nv.compute  # type: ignore[attr-defined]
        dev.synchronize()  # type: ignore[attr-defined]
        dev.mock.gpu.shutdown()  # type: ignore[attr-defined]
        self._doorbell = _ffi.new("uint32_t[1]")
        ch._publish_entry = native_mmio().gpfifo_publisher(
            ch.gpfifo_addr, ch.entries, ch.userd_addr + pbuf.USERD_GP_PUT,
            int(_ffi.cast("uintptr_t", self._doorbell)), ch.token)
        self.channel = ch

    def retire(self) -> None:
        self.channel._gp_get[0] = self.channel.put  # the front end fetched every entry published
        self.channel._retired[0] = self.channel.retire_value
        self.dev.timeline_signal.value = self.dev.timeline_value - 1  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=3000)
    args = parser.parse_args()
    dev = Device["NV"]
    if not getattr(dev, "is_mock", False):
        raise SystemExit("this tool detaches the mock GPU; on a GPU run `python -m rawgrad bench gpu`")
    prog = load_empty_kernel(dev)
    graphs = {}
    for n in GRAPH_LENGTHS:
        template, programs = build_template(dev, [KernelCommand(prog, [], EMPTY_THREADS) for _ in range(n)])
        graphs[n] = HCQGraph(dev, template, programs, {})
        graphs[n].submit({})

    @TinyJit
    def chain(x: Tensor) -> Tensor:
        for _ in range(JIT_CHAIN):
            x = (x + 1).realize()
        return x

    x = Tensor(np.zeros(16, np.float32), device="NV").realize()
    for _ in range(3):  # eager, capture, first replay
        chain(x)
    gpu = DetachedGPU(dev)
    print(f"host time per replay, mock GPU detached (not a hardware result), {args.replays} replays:")
    for n, graph in graphs.items():
        samples = []
        for _ in range(args.replays):
            t0 = time.perf_counter_ns()
            graph.submit({})
            samples.append(time.perf_counter_ns() - t0)
            gpu.retire()
        print(f"  HCQGraph.submit, {n:4d} empty kernels:            {_summary(samples)}")
    samples = []
    for _ in range(args.replays):
        t0 = time.perf_counter_ns()
        chain(x)
        samples.append(time.perf_counter_ns() - t0)
        gpu.retire()
    print(f"  TinyJit call, {JIT_CHAIN} kernels, one input, one output: {_summary(samples)}")
    os._exit(0)  # the detached mock cannot be closed cleanly


if __name__ == "__main__":
    main()
