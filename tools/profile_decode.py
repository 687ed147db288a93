"""Device time per GPT-2 decode step, per kernel, from PROFILE=1 timestamps (docs/benchmarks.md, "GPT-2
124M decode at batch 4"): runs `gpt2.bench_decode(tokens, batch)` with profiling on, then reads the
Chrome trace: every replayed decode step is one queue submission (one `batch` id in the trace); the
kernels' device times are averaged over the replayed steps.

  python3 tools/profile_decode.py --batch 4 --tokens 16
  python3 tools/profile_decode.py --size tiny --batch 2 --tokens 4      # seconds, for a smoke test

Kernel names carry their shapes (e.g. the LM head reduces over 768 into 50257 outputs per row).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["124m", "tiny"], default="124m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--top", type=int, default=12, help="kernels to list")
    args = parser.parse_args(argv)
    # the trace is read in this process; the copy PROFILE=1 writes at exit goes nowhere
    os.environ["PROFILE"], os.environ["PROFILE_OUT"] = "1", os.devnull
    from rawgrad.hcq.profile import PROFILER
    from rawgrad.models import gpt2
    cfg = gpt2.GPT2Config.gpt2_124m() if args.size == "124m" else gpt2.GPT2Config.tiny()
    res = gpt2.bench_decode(args.tokens, batch=args.batch, config=cfg)
    data = PROFILER.chrome_trace()
    events = data["traceEvents"] if isinstance(data, dict) else data
    steps: dict[int, list[tuple[str, float]]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "replay":
            steps[e["args"]["batch"]].append((e["name"], e["dur"] / 1e3))  # ms
    if not steps:
        print("no replayed kernels in the trace")
        return 1
    sizes = collections.Counter(len(v) for v in steps.values())
    kernels_per_step = sizes.most_common(1)[0][0]
    full = [v for v in steps.values() if len(v) == kernels_per_step]  # whole decode steps only
    totals = [sum(d for _, d in v) for v in full]
    per_kernel: dict[str, list[float]] = collections.defaultdict(list)
    for v in full:
        step_sum: dict[str, float] = collections.defaultdict(float)
        for name, d in v:
            step_sum[name] += d
        for name, d in step_sum.items():
            per_kernel[name].append(d)
    print(f"GPT-2 {args.size} decode, batch {args.batch}: median step {res['median_token_s'] * 1e3:.2f} ms "
          f"wall; {len(full)} replayed steps of {kernels_per_step} kernels")
    print(f"device time per step (median over steps): all kernels {statistics.median(totals):.2f} ms")
    ranked = sorted(per_kernel.items(), key=lambda kv: -statistics.median(kv[1]))
    print(f"{'kernel':40s} {'ms/step':>9s} {'launches/step':>14s}")
    counts = collections.Counter(name for name, _ in full[0])
    for name, ds in ranked[:args.top]:
        print(f"{name:40s} {statistics.median(ds):9.3f} {counts[name]:14d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
