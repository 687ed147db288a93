"""Benchmarks that print our time beside the alternative measured in the same run (numpy here), the
saved-graph load benchmark, and the BLAS environment the benchmarks run numpy under."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# Variables some machines set that pin OpenBLAS to an older kernel (Haswell) and a smaller L2 blocking:
# on the AVX-512 EPYC they halve numpy's matmul. The benchmark commands re-run themselves in a child
# process without them (`run_without_blas_overrides`); tests and CI never do.
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
CHILD_MARK = "RAWGRAD_BENCH_CHILD"


def run_without_blas_overrides(argv: Sequence[str]) -> int | None:
    """If a BLAS override is set, run `python -m rawgrad <argv>` in a child process with the overrides
    unset and return its exit code; None when nothing is set (or in that child): run in this process.
    The BLAS kernel is chosen when numpy loads OpenBLAS, so it cannot be undone in a running process."""
    present = [k for k in BLAS_OVERRIDES if k in os.environ]
    if not present or os.environ.get(CHILD_MARK) or os.environ.get("PYTEST_CURRENT_TEST"):
        return None  # nothing to undo, already the child, or inside a test (tests keep the environment)
    shown = ", ".join(f"{k}={os.environ[k]}" for k in present)
    print(f"benchmark: re-running in a child process with {shown} "
          f"unset (they pin OpenBLAS to a slower kernel)", flush=True)
    env = {k: v for k, v in os.environ.items() if k not in BLAS_OVERRIDES}
    env[CHILD_MARK] = "1"
    return subprocess.call([sys.executable, "-m", "rawgrad", *argv], env=env)


def blas_description() -> str:
    """Which BLAS numpy loaded (library, version, kernel architecture, threads) via threadpoolctl, and the
    override variables as this process sees them."""
    overrides = ", ".join(f"{k}={os.environ[k]}" for k in BLAS_OVERRIDES if k in os.environ) or "none"
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return (f"numpy {np.__version__}, BLAS kernel unknown (pip install threadpoolctl); "
                f"overrides: {overrides}")
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return f"numpy {np.__version__}, no BLAS library loaded; overrides: {overrides}"
    parts = [f"{i.get('internal_api')} {i.get('version')} kernel={i.get('architecture', '?')} "
             f"threads={i.get('num_threads')}" for i in blas]
    return f"numpy {np.__version__} BLAS: {'; '.join(parts)}; overrides: {overrides}"


def timed_calls(fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
    """Wall times of `repeats` calls of `fn` after `warmup` untimed calls (what every side of every benchmark
    is timed by)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median wall time of `repeats` calls of `fn`, after `warmup` untimed calls."""
    return statistics.median(timed_calls(fn, repeats, warmup))


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
    print(blas_description())
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


# ------------------------------------------------------------------------------- saved graph, fresh process
_LOAD_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from rawgrad import Device, Tensor
from rawgrad.jit import TinyJit
from rawgrad.tensor.realize import GlobalCounters
t1 = time.perf_counter()
x = Tensor(np.zeros(int(sys.argv[2]), np.float32)).realize()
Device[Device.DEFAULT].synchronize()
t2 = time.perf_counter()
compiled_before = GlobalCounters.kernels_compiled
t3 = time.perf_counter()
jit = TinyJit.load(sys.argv[1])
out = jit(x).numpy()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "input_s": t2 - t1, "load_replay_read_s": t4 - t3,
                  "compiled_before_load": compiled_before,
                  "compiled_by_load": GlobalCounters.kernels_compiled - compiled_before,
                  "value": float(out[0]), "all_equal": bool((out == out[0]).all())}))
"""


def _saved_chain(x: Any, n: int) -> Any:
    for _ in range(n):
        x = (x * 1.0001 + 1).contiguous().realize()
    return x


def bench_saved_graph(kernels: int = 100, elements: int = 256, runs: int = 3) -> list[dict[str, Any]]:
    """`python -m rawgrad bench saved-graph`: capture a chain of `kernels` kernels
    (x = (x * 1.0001 + 1).contiguous() on `elements` float32), save it with TinyJit.save, then in `runs`
    fresh processes with the disk compile cache disabled (RAWGRAD_CACHE_DIR=) time TinyJit.load + the first
    replay + reading the result back. Each child also reports its import and input-creation times and how
    many kernels it compiled during the load (expected: none). Returns one dict per run."""
    from rawgrad import Tensor
    from rawgrad.jit import TinyJit

    print(f"rawgrad bench saved-graph  ({platform.processor() or platform.machine()}, {os.cpu_count()} "
          f"cores): "
          f"{kernels}-kernel chain x = (x * 1.0001 + 1).contiguous() on {elements} float32, {runs} fresh "
          f"process(es), RAWGRAD_CACHE_DIR= (no disk cache)")
    jitted: TinyJit[Any] = TinyJit(lambda x: _saved_chain(x, kernels))
    x = Tensor(np.zeros(elements, np.float32)).realize()
    for _ in range(3):  # eager, capture, replay
        out = jitted(x).numpy()
    expect = np.float32(0)
    for _ in range(kernels):
        expect = np.float32(expect * np.float32(1.0001) + np.float32(1))
    assert jitted.last is not None
    captured = jitted.last.kernel_count
    if captured != kernels:
        raise AssertionError(f"the capture holds {captured} kernels, expected {kernels}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rawgrad-saved-graph-") as folder:
        path = os.path.join(folder, "chain.rgraph")
        jitted.save(path)
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(folder) for f in fs)
        print(f"saved {captured} kernels to {size / 1024:.1f} KiB; replay in this process gives {out[0]:.6g}")
        env = {**os.environ, "RAWGRAD_CACHE_DIR": ""}
        print(f"{'run':>4s} {'import ms':>10s} {'input ms':>9s} {'load+replay+read ms':>20s} "
              f"{'compiled in load':>17s}")
        for k in range(runs):
            proc = subprocess.run([sys.executable, "-c", _LOAD_CHILD, path, str(elements)], env=env,
                                  capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"the fresh process failed (exit {proc.returncode}):\n"
                                   f"{proc.stderr[-2000:]}")
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            if not row["all_equal"] or not np.isclose(row["value"], expect, rtol=1e-4):
                raise AssertionError(f"the loaded graph computed {row['value']}, expected {float(expect)}")
            rows.append(row)
            print(f"{k + 1:4d} {row['import_s'] * 1e3:10.1f} {row['input_s'] * 1e3:9.1f} "
                  f"{row['load_replay_read_s'] * 1e3:20.2f} {row['compiled_by_load']:17d}", flush=True)
    times = [r["load_replay_read_s"] * 1e3 for r in rows]
    print(f"load + first replay + readback: median {statistics.median(times):.2f} ms over {runs} fresh "
          f"process(es); kernels compiled during the load: {max(r['compiled_by_load'] for r in rows)}")
    return rows
