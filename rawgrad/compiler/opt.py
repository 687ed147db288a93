"""Kernel optimization choices: which axes to upcast (register tiles) and how many axes are global.

Heuristics, each with the reason it pays on a CPU:
- matmul-like reduces (an output axis that some input broadcasts while another input walks it
  contiguously) get a register tile sized to the SIMD width (`TILES_BY_VECTOR_BITS`): the contiguous
  axis is upcast by the tile's columns and a broadcast axis by its rows, so every loaded element feeds
  several multiply-adds instead of one, and the column panel is looped outermost so it stays in cache;
- the global range covers leading output axes until there is enough parallel work for the workers,
  but keeps the last output axis as an inner loop so the vectorizer sees unit-stride accesses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rawgrad import config
from rawgrad.compiler.target import Target, host_vector_bits

__all__ = ["KernelOpts", "choose_opts", "host_vector_bits"]  # host_vector_bits: tools/matmul_tile_sweep.py

# Register tile (rows x columns of accumulators) per SIMD width. Measured on a 2-core AVX-512 EPYC with
# float32 matmul (docs/benchmarks.md): 8x32 (16 zmm accumulators) reached 160 GFLOP/s at 2048, where
# 4x16 reached 29 and 8x16 76; with 16 AVX2 registers 4x16 (8 ymm accumulators) leaves room for loads.
TILES_BY_VECTOR_BITS = {512: (8, 32), 256: (4, 16), 128: (4, 8)}
MIN_GLOBAL_WORK = 64  # global indices to aim for so every worker thread gets a share


@dataclass
class KernelOpts:
    upcast: dict[int, int] = field(default_factory=dict)  # axis -> unroll factor
    # output axes in loop-nesting order (outermost first); None keeps the natural order
    loop_order: list[int] | None = None
    global_axes: int = 1  # how many of the (non-1, output) loop axes form the global range
    # the reduce loop stays vectorizable although axes are upcast (the upcast shares loads across rows
    # instead of forming a SIMD tile; see _share_row_loads)
    vectorize_reduce: bool = False


def _largest_divisor(dim: Any, choices: tuple[int, ...]) -> int | None:
    if not isinstance(dim, int):
        return None
    for c in choices:
        if dim % c == 0 and dim >= c:
            return c
    return None


# A matrix-vector style kernel (a few rows, e.g. a decode batch, times a weight read along the reduce axis)
# computes up to this many rows per weight load.
MAX_SHARED_ROWS = 8


def _share_row_loads(opts: KernelOpts, full_shape: tuple[Any, ...], out_axes: list[int],
                     strides: list[Any]) -> None:
    """x (B, K) @ W.T with W stored (N, K): no input is contiguous along an output axis, so there is
    no register tile; every output is a dot product over K and W is streamed once per row of x. When
    the rows are few (a decode batch), unroll that axis so each W element loaded serves every row
    (B-fold less memory traffic in a kernel bound by it); the K loop stays SIMD-vectorized."""
    for ax in out_axes:
        size = full_shape[ax]
        if not (isinstance(size, int) and 1 < size <= MAX_SHARED_ROWS):
            continue
        # some input must be reused across this axis (stride 0: the weight) and read along the reduce
        if any(st is not None and st[ax] == 0 and 1 in st for st in strides):
            opts.upcast[ax] = size
            opts.vectorize_reduce = True
            return


def choose_opts(full_shape: tuple[Any, ...], out_axes: list[int], reduce_axes: tuple[int, ...],
                load_sts: list[Any], out_st: Any, target: Target) -> KernelOpts:
    """Pick upcasts and the global axes for `target`. A GPU target: no register tiles, and every output
    axis is global, because a GPU runs one thread per output element and finds its parallelism there. A CPU
    target: register tiles sized by its SIMD width (`target.vector_bits`)."""
    if target.is_gpu:
        return KernelOpts(global_axes=sum(1 for ax in out_axes
                                          if not (isinstance(full_shape[ax], int) and full_shape[ax] == 1)))
    tiles = TILES_BY_VECTOR_BITS.get(target.vector_bits)
    if tiles is None:
        raise ValueError(f"target {target.name}: no register tile for {target.vector_bits}-bit vectors "
                         f"(known: {sorted(TILES_BY_VECTOR_BITS)})")
    opts = KernelOpts()
    if config.NOOPT():
        return opts
    if reduce_axes and len(load_sts) >= 2:
        # per-axis buffer stride of every input read over the full loop space (None: not linear)
        strides = [st.real_strides() for st in load_sts if tuple(st.shape) == tuple(full_shape)]
        contig_axis = tile_axis = None
        for k, mine in enumerate(strides):
            others = strides[:k] + strides[k + 1:]
            for ax in reversed(out_axes):
                if mine[ax] == 1 and any(o[ax] == 0 for o in others):
                    contig_axis = ax
                    # the tile's other axis: an output axis this input broadcasts (stride 0); the
                    # innermost such axis, unless only an outer one has a size the tile divides (a
                    # symbolic sequence length does not, the batch axis may)
                    broadcast = [ax2 for ax2 in out_axes if ax2 != ax and mine[ax2] == 0]
                    rows = tiles[0]
                    divisible = [ax2 for ax2 in broadcast
                                 if _largest_divisor(full_shape[ax2], (rows, 4, 2)) is not None]
                    if divisible or broadcast:
                        tile_axis = (divisible or broadcast)[-1]
                    break
            if contig_axis is not None:
                break
        if contig_axis is not None:
            tile_rows, tile_cols = tiles
            f = _largest_divisor(full_shape[contig_axis], (tile_cols, tile_cols // 2, 8, 4))
            if f is not None:
                opts.upcast[contig_axis] = f
            if tile_axis is not None:
                f2 = _largest_divisor(full_shape[tile_axis], (tile_rows, 4, 2))
                if f2 is not None:
                    opts.upcast[tile_axis] = f2
                # walk the contiguous input's column panel outermost: it stays in cache while
                # every row block of the other input streams past it
                rest = [a for a in out_axes if a not in (contig_axis, tile_axis)]
                opts.loop_order = rest + [contig_axis, tile_axis]
        else:
            _share_row_loads(opts, full_shape, out_axes, strides)
    # global axes: leading non-1 output axes until enough work, keeping the last one inner
    extents = []
    for ax in (opts.loop_order or out_axes):
        d = full_shape[ax]
        if ax in opts.upcast:
            d = d // opts.upcast[ax]
        if not (isinstance(d, int) and d == 1):
            extents.append(d)
    count = 0
    work_known: int | None = 1
    for i, d in enumerate(extents):
        if count > 0 and (work_known is None or work_known >= MIN_GLOBAL_WORK):
            break
        if count > 0 and i == len(extents) - 1 and isinstance(d, int) and d >= 16:
            break
        count += 1
        work_known = work_known * d if isinstance(d, int) and work_known is not None else None
    opts.global_axes = max(count, 1) if extents else 0
    return opts
