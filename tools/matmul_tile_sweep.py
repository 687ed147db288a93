"""The matmul register-tile sweep of docs/benchmarks.md: float32 matmul GFLOP/s (2*n^3 / best of 3 calls,
after one untimed call that compiles) for several register tiles and two loop orders on the CPU device.

  python3 tools/matmul_tile_sweep.py            # the table's tiles at n = 1024 and 2048
  python3 tools/matmul_tile_sweep.py --quick    # three tiles at n = 256 and 512
  python3 tools/matmul_tile_sweep.py --tiles 8x32:panel 4x64:panel --sizes 1024

Each configuration runs in its own process (so nothing compiled for one tile is reused by another): it
replaces this CPU's entry of rawgrad.compiler.opt.TILES_BY_VECTOR_BITS with (rows, cols) and, for the
"rows" order, swaps the last two entries of the loop order choose_opts picks (tile rows outside the column
panel instead of the column panel outermost, which is what rawgrad ships). The result is checked against
numpy. The shipped choice is the configuration the sweep's best rows led to; the sweep does not change it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

DEFAULT_TILES = ("4x16:rows", "4x16:panel", "8x16:panel", "8x32:rows", "8x32:panel", "12x32:panel",
                 "4x64:panel")
QUICK_TILES = ("4x16:panel", "8x32:rows", "8x32:panel")


def run_config(rows: int, cols: int, order: str, sizes: list[int], repeats: int) -> dict[str, Any]:
    """In this process: set the tile and loop order, then time n x n float32 matmuls."""
    import time

    import numpy as np

    from rawgrad import Device, Tensor
    from rawgrad.compiler import lower, opt

    bits = opt.host_vector_bits()
    opt.TILES_BY_VECTOR_BITS[bits] = (rows, cols)
    if order == "rows":
        original = lower.choose_opts

        def rows_outer(*args: Any, **kwargs: Any) -> Any:
            opts = original(*args, **kwargs)
            lo = opts.loop_order
            if lo and len(lo) >= 2 and lo[-1] in opts.upcast and lo[-2] in opts.upcast:
                opts.loop_order = lo[:-2] + [lo[-1], lo[-2]]
            return opts
        lower.choose_opts = rows_outer  # type: ignore[assignment]
    elif order != "panel":
        raise ValueError(f"loop order must be 'rows' or 'panel', got {order!r}")
    dev = Device["CPU"]
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"tile": f"{rows}x{cols}", "order": order, "vector_bits": bits, "gflops": {}}
    for n in sizes:
        na, nb = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        a, b = Tensor(na, device="CPU").realize(), Tensor(nb, device="CPU").realize()
        np.testing.assert_allclose((a @ b).numpy(), na @ nb, rtol=1e-3, atol=1e-2)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            (a @ b).realize()
            dev.synchronize()
            best = min(best, time.perf_counter() - t0)
        out["gflops"][n] = 2 * n ** 3 / best / 1e9
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiles", nargs="+", help="ROWSxCOLS:ORDER with ORDER rows|panel")
    parser.add_argument("--sizes", type=int, nargs="+")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = args.sizes or ([256, 512] if args.quick else [1024, 2048])
    if args.child:
        tile, order = args.child.split(":")
        rows, cols = (int(v) for v in tile.split("x"))
        print(json.dumps(run_config(rows, cols, order, sizes, args.repeats)))
        return 0
    tiles = args.tiles or list(QUICK_TILES if args.quick else DEFAULT_TILES)
    print(f"matmul register-tile sweep, float32, 2*n^3 / best of {args.repeats} "
          f"(one process per configuration; shipped: column panel outer with TILES_BY_VECTOR_BITS)")
    print(f"{'tile (rows x cols), loop order':34s} " + " ".join(f"{str(n) + ' GFLOP/s':>13s}" for n in sizes))
    failed = 0
    for spec in tiles:
        proc = subprocess.run([sys.executable, __file__, "--child", spec, "--repeats", str(args.repeats),
                               "--sizes", *map(str, sizes)], capture_output=True, text=True, env=os.environ)
        tile, order = spec.split(":")
        label = f"{tile}, {'rows outer' if order == 'rows' else 'column panel outer'}"
        if proc.returncode != 0:
            failed += 1
            print(f"{label:34s} failed: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{label:34s} " + " ".join(f"{res['gflops'][str(n)]:13.1f}" for n in sizes), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
