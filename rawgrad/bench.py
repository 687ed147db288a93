"""Benchmarks that print our time beside the alternative measured in the same run (numpy here)."""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median wall time of `repeats` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_cpu(quick: bool = False) -> int:
    """`python -m rawgrad bench cpu`: fused elementwise, reductions, softmax and matmul vs numpy."""
    from rawgrad import Device, Tensor

    dev = Device["CPU"]
    rng = np.random.default_rng(0)
    n_ew = 1 << (20 if quick else 24)
    side = 1024 if quick else 4096
    mm_sizes = (256, 512) if quick else (1024, 2048)
    repeats = 3 if quick else 7
    print(f"rawgrad bench cpu  ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"numpy {np.__version__})")
    print(f"{'case':34s} {'rawgrad ms':>11s} {'numpy ms':>10s} {'numpy/rawgrad':>14s}")
    rows = []

    def run(label: str, ours: Callable[[], object], theirs: Callable[[], object],
            check: Callable[[], None]) -> None:
        check()
        t_ours = median_time(ours, repeats)
        t_np = median_time(theirs, repeats)
        rows.append((label, t_ours, t_np))
        print(f"{label:34s} {t_ours * 1e3:11.3f} {t_np * 1e3:10.3f} {t_np / t_ours:14.2f}x", flush=True)

    def sync(t: Tensor) -> None:
        t.realize()
        dev.synchronize()

    na, nb, nc = (rng.standard_normal(n_ew).astype(np.float32) for _ in range(3))
    a, b, c = Tensor(na).realize(), Tensor(nb).realize(), Tensor(nc).realize()

    def check_ew() -> None:
        np.testing.assert_allclose((((a * b + c).relu()) * 0.5).numpy(), np.maximum(na * nb + nc, 0) * 0.5,
                                   rtol=1e-5, atol=1e-6)
    run(f"(a*b+c).relu()*0.5  n=2^{n_ew.bit_length() - 1}", lambda: sync(((a * b + c).relu()) * 0.5),
        lambda: np.maximum(na * nb + nc, 0) * 0.5, check_ew)

    nx = rng.standard_normal((side, side)).astype(np.float32)
    x = Tensor(nx).realize()

    def check_sum() -> None:
        np.testing.assert_allclose(x.sum(axis=1).numpy(), nx.sum(axis=1), rtol=1e-4, atol=1e-3)
    run(f"sum(axis=1) {side}x{side}", lambda: sync(x.sum(axis=1)), lambda: nx.sum(axis=1), check_sum)

    def np_softmax() -> np.ndarray:
        e = np.exp(nx - nx.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def check_softmax() -> None:
        np.testing.assert_allclose(x.softmax(-1).numpy(), np_softmax(), rtol=1e-4, atol=1e-6)
    run(f"softmax(-1) {side}x{side}", lambda: sync(x.softmax(-1)), np_softmax, check_softmax)

    for n in mm_sizes:
        nm1 = rng.standard_normal((n, n)).astype(np.float32)
        nm2 = rng.standard_normal((n, n)).astype(np.float32)
        m1, m2 = Tensor(nm1).realize(), Tensor(nm2).realize()

        def check_mm(m1: Tensor = m1, m2: Tensor = m2, nm1: np.ndarray = nm1, nm2: np.ndarray = nm2) -> None:
            np.testing.assert_allclose((m1 @ m2).numpy(), nm1 @ nm2, rtol=1e-3, atol=1e-2)
        flops = 2 * n ** 3
        run(f"matmul {n}x{n} float32", lambda m1=m1, m2=m2: sync(m1 @ m2),  # type: ignore[misc]
            lambda nm1=nm1, nm2=nm2: nm1 @ nm2, check_mm)  # type: ignore[misc]
        label, t_ours, t_np = rows[-1]
        print(f"{'':34s} {flops / t_ours / 1e9:8.1f} GFLOP/s (rawgrad)  "
              f"{flops / t_np / 1e9:8.1f} GFLOP/s (numpy)")
    return 0
