"""`python -m rawgrad bench dispatch`: what one tiny kernel costs eagerly and inside a TinyJit replay.

A chain of N dependent kernels (`x = x + 1` on 16 elements, each step realized so it is its own kernel)
is run eagerly and as a replay; every number is per kernel. "host submit" is the time the replay call
takes on the host (the device idle before it), "replay" includes waiting for the device to finish.
numpy, torch and tinygrad are measured in the same run where importable.
"""
from __future__ import annotations

import functools
import os
import platform
import statistics
import time
from typing import Any

import numpy as np

from rawgrad.bench import median_time

CHAIN_LENGTHS = (1, 10, 100, 1000)
ELEMENTS = 16


def _repeats(n: int) -> int:
    return 3 if n >= 1000 else 5 if n >= 100 else 20


def _chain(x: Any, n: int) -> Any:
    for _ in range(n):
        x = (x + 1).realize()
    return x


def _numpy_per_op(n: int) -> float:
    x = np.zeros(ELEMENTS, np.float32)

    def run() -> None:
        y = x
        for _ in range(n):
            y = y + 1
    return median_time(run, _repeats(n), warmup=0) / n


def _torch_per_op(n: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    x = torch.zeros(ELEMENTS)

    def run() -> None:
        y = x
        for _ in range(n):
            y = y + 1
    return median_time(run, _repeats(n), warmup=0) / n


_UNAVAILABLE: dict[str, str] = {}


def _tinygrad_per_kernel(n: int) -> float | None:
    try:
        from tinygrad import Tensor as TgTensor  # type: ignore[import-not-found]
        from tinygrad import TinyJit as TgJit
    except ImportError:
        return None

    @TgJit
    def step(x: Any) -> Any:
        for _ in range(n):
            x = (x + 1).contiguous().realize()
        return x.realize()

    try:
        x = TgTensor.zeros(ELEMENTS).contiguous().realize()
        for _ in range(3):
            step(x).numpy()
        return median_time(lambda: step(x).numpy(), _repeats(n), warmup=0) / n
    except Exception as e:  # installed but unusable here (e.g. no C compiler for its CPU device)
        _UNAVAILABLE["tinygrad"] = f"installed but failed to run: {type(e).__name__}: {e}"
        return None


def bench_dispatch(lengths: tuple[int, ...] = CHAIN_LENGTHS) -> list[dict[str, Any]]:
    """Print (and return) per-kernel eager, replay and host-submit times for each chain length."""
    from rawgrad import Device, Tensor
    from rawgrad.jit import TinyJit

    dev = Device[Device.DEFAULT]  # where the Tensors below live (DEV=NV puts them on the GPU): sync that one
    print(f"rawgrad bench dispatch on {dev.name}  ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, "
          f"{getattr(dev, 'threads', '?')} worker threads, {ELEMENTS}-element x = x + 1 chains)")
    print(f"{'N':>5s} {'eager us/k':>11s} {'replay us/k':>12s} {'submit us/k':>12s} {'eager/replay':>13s} "
          f"{'numpy us/op':>12s} {'torch us/op':>12s} {'tinygrad jit us/k':>18s}")
    rows = []
    for n in lengths:
        x = Tensor(np.zeros(ELEMENTS, np.float32)).realize()
        reps = _repeats(n)

        def eager(n: int = n, x: Any = x) -> None:
            _chain(x, n)
            dev.synchronize()

        eager_s = median_time(eager, reps, warmup=0) / n
        jitted: TinyJit[Any] = TinyJit(functools.partial(_chain, n=n))
        jitted(x), jitted(x)  # eager call, capture
        dev.synchronize()

        def replay(jitted: TinyJit[Any] = jitted, x: Any = x) -> None:
            jitted(x)
            dev.synchronize()

        replay_s = median_time(replay, reps, warmup=0) / n
        submits = []
        for _ in range(reps):
            dev.synchronize()
            t0 = time.perf_counter()
            jitted(x)
            submits.append(time.perf_counter() - t0)
        dev.synchronize()
        submit_s = statistics.median(submits) / n
        out = jitted(x).numpy()
        if not np.array_equal(out, np.full(ELEMENTS, n, np.float32)):
            raise AssertionError(f"replay of a {n}-kernel chain computed {out[:4]}..., expected {n}")
        torch_s, tg_s = _torch_per_op(n), _tinygrad_per_kernel(n)
        row = {"n": n, "eager_s": eager_s, "replay_s": replay_s, "submit_s": submit_s,
               "numpy_s": _numpy_per_op(n), "torch_s": torch_s, "tinygrad_s": tg_s}
        rows.append(row)
        us = lambda v: f"{v * 1e6:.3f}" if v is not None else "n/a"  # noqa: E731
        print(f"{n:5d} {us(eager_s):>11s} {us(replay_s):>12s} {us(submit_s):>12s} "
              f"{eager_s / replay_s:12.1f}x {us(row['numpy_s']):>12s} {us(torch_s):>12s} {us(tg_s):>18s}")
    if rows and rows[0]["torch_s"] is None:
        print("torch: not installed, skipped")
    if rows and rows[0]["tinygrad_s"] is None:
        print(f"tinygrad: {_UNAVAILABLE.get('tinygrad', 'not installed')}, skipped")
    return rows


if __name__ == "__main__":
    bench_dispatch()
