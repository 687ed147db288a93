"""Static shape counts of the GPU kernels for GPT-2 (docs/benchmarks.md, "the kernels the PTX renderer
emits"): how many kernels the PTX lowering gives a warp or a 128-thread block per output (group
reductions) and how many get 16-byte vector loads/stores. Counts, not timings; no GPU needed.

  python3 tools/ptx_kernel_shapes.py                 # GPT-2 124M, random weights, prompt of 2 tokens + 3 new
  python3 tools/ptx_kernel_shapes.py --size tiny     # the test-sized config (seconds)

The model runs on the CPU device; every kernel the CPU renderer lowers is also lowered for the H100's
target (what the PTX renderer does: `lower(ast, name, NV_SM90)`), and the GPU lowering's group size and
vector groups are counted.
"""
from __future__ import annotations

import argparse
import collections
import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["124m", "tiny"], default="124m")
    parser.add_argument("--prompt", type=int, nargs="+", default=[464, 2068])
    parser.add_argument("--new-tokens", type=int, default=3)
    args = parser.parse_args(argv)

    from rawgrad.compiler import lower as lower_mod
    from rawgrad.compiler.renderer import llvm
    from rawgrad.compiler.target import NV_SM90
    from rawgrad.models import gpt2

    shapes: list[tuple[str, int, bool]] = []
    cpu_lower = llvm.lower

    def lower_both(ast: Any, name: str = "kernel", target: Any = None) -> Any:
        gpu = lower_mod.lower(ast, name, NV_SM90)
        shapes.append((name, gpu.group_size, bool(gpu.vector_groups)))
        return cpu_lower(ast, name, target)
    llvm.lower = lower_both  # type: ignore[assignment]

    cfg = gpt2.GPT2Config.gpt2_124m() if args.size == "124m" else gpt2.GPT2Config.tiny()
    model = gpt2.GPT2(cfg, seed=0)
    before = len(shapes)  # the weight initialization's kernels are not the model's
    prompt = [t % cfg.vocab_size for t in args.prompt]
    model.generate([prompt], args.new_tokens)
    model_shapes = shapes[before:]
    groups = collections.Counter(g for _, g, _ in model_shapes)
    vectorized = sum(v for _, _, v in model_shapes)
    grouped = sum(n for g, n in groups.items() if g > 1)
    print(f"GPT-2 {args.size}, prompt of {len(prompt)} tokens + {args.new_tokens} generated: "
          f"{len(model_shapes)} kernels lowered for the GPU target")
    warp, block = NV_SM90.simd_width, NV_SM90.block_threads
    print(f"  grouped reductions: {grouped} ({groups.get(warp, 0)} one warp per output, "
          f"{groups.get(block, 0)} one {block}-thread block per output; group sizes "
          f"{dict(sorted(groups.items()))})")
    print(f"  16-byte vector loads/stores: {vectorized}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
