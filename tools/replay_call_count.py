"""Python function calls per bound-queue replay on the NV driver code (docs/benchmarks.md, third session:
"255 Python calls per submit before, 63 after"). Deterministic, so it needs no quiet machine and no GPU:
the mock NV device is used with its GPU detached exactly as in tools/replay_host_cost.py, and cProfile
counts the calls made inside `HCQGraph.submit` only (the faked retirement between replays is not counted).

  python3 tools/replay_call_count.py [--kernels 1000] [--replays 50]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

os.environ.setdefault("NV_MOCK", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--replays", type=int, default=50)
    args = parser.parse_args(argv)

    from replay_host_cost import DetachedGPU  # type: ignore[import-not-found]

    from rawgrad import Device
    from rawgrad.cli.bench_gpu import EMPTY_THREADS, load_empty_kernel
    from rawgrad.hcq.graph import HCQGraph, KernelCommand, build_template

    dev = Device["NV"]
    if not getattr(dev, "is_mock", False):
        raise SystemExit("this tool detaches the mock GPU; run it with NV_MOCK=1")
    prog = load_empty_kernel(dev)
    graphs = {}
    for n in args.kernels:
        template, programs = build_template(dev, [KernelCommand(prog, [], EMPTY_THREADS) for _ in range(n)])
        graphs[n] = HCQGraph(dev, template, programs, {})
        graphs[n].submit({})
    gpu = DetachedGPU(dev)
    for n, graph in graphs.items():
        for _ in range(10):  # warm-up: first-call paths (caches, generated functions) are not counted
            graph.submit({})
            gpu.retire()
        prof = cProfile.Profile()
        for _ in range(args.replays):
            prof.enable()
            graph.submit({})
            prof.disable()
            gpu.retire()
        stats = pstats.Stats(prof)
        calls = stats.total_calls  # type: ignore[attr-defined]
        print(f"HCQGraph.submit, {n} empty kernels: {calls / args.replays:.1f} Python-visible calls per "
              f"replay (cProfile, {args.replays} replays; native calls counted once each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
