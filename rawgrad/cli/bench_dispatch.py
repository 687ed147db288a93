"""`python -m rawgrad bench dispatch`: what one tiny kernel costs eagerly and inside a TinyJit replay.

A chain of N dependent kernels (`x = x + 1` on 16 elements, each step realized so it is its own kernel)
is run eagerly and as a replay; every number is per kernel. numpy, torch and tinygrad's TinyJit run the
same chain in the same process where importable.

Every column is timed by the same function (`time_per_kernel`) under the same protocol, so no side gets a
sync or a readback the other does not:

- ``async``: C calls back to back (each submits one N-kernel chain), then one sync; the block's wall time
  divided by C * N. What a caller that does not look at the result in between pays.
- ``sync``: every call is followed by a sync and a readback of its 16-float result into a numpy array;
  the call's wall time divided by N. What a caller that needs each result pays.

numpy and torch (CPU) run synchronously: their sync hook has nothing to wait for, but it is called the
same number of times, and their readback copies the 16 floats like the others'. "host submit" is not a
protocol column: it is the host time of one replay call with the device idle before it (rawgrad only).

Then the per-call latency of a 1-kernel chain (`call_latency`): every column's call + sync timed one call at
a time, reported as p50 and p99 (a mean hides a bimodal wake-up path), once on a quiet machine and once
while a background process spins on one core (`busy_core`), the case where a device thread that sleeps or
spins at the wrong moment costs a scheduler time slice.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rawgrad.cli.bench import median_time

CHAIN_LENGTHS = (1, 10, 100, 1000)
ELEMENTS = 16
PROTOCOLS: dict[str, str] = {
    "async": "C calls back to back, then one sync; block time / (C*N)",
    "sync": "each call followed by a sync + readback of its 16 floats to numpy; call time / N",
}


def _repeats(n: int) -> int:
    return 3 if n >= 1000 else 5 if n >= 100 else 20


def _calls_per_block(n: int) -> int:
    """C of the async protocol: enough kernels per block that one sync is amortized."""
    return 3 if n >= 1000 else 5 if n >= 100 else 20


def _chain(x: Any, n: int) -> Any:
    for _ in range(n):
        x = (x + 1).realize()
    return x


@dataclass
class Side:
    """One timed column: `call` submits one N-kernel chain (it may return before the work is done),
    `sync` waits for everything submitted so far, `readback` turns a call's result into a numpy array."""

    name: str
    call: Callable[[], Any]
    sync: Callable[[], None]
    readback: Callable[[Any], np.ndarray]
    note: str = ""


def time_per_kernel(side: Side, n: int, protocol: str, repeats: int, calls: int) -> float:
    """Median seconds per kernel of `side` under `protocol` (see the module docstring). The same code
    times every column, so the protocols are the same on every side by construction."""
    if protocol == "async":
        def block() -> None:
            for _ in range(calls):
                side.call()
            side.sync()
        side.sync()  # nothing of an earlier measurement still running
        return median_time(block, repeats, warmup=0) / (calls * n)
    if protocol == "sync":
        def one() -> None:
            out = side.call()
            side.sync()
            side.readback(out)
        side.sync()
        return median_time(one, repeats, warmup=0) / n
    raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")


_UNAVAILABLE: dict[str, str] = {}


def _numpy_side(n: int) -> Side:
    x = np.zeros(ELEMENTS, np.float32)

    def call() -> np.ndarray:
        y = x
        for _ in range(n):
            y = y + 1
        return y
    return Side("numpy", call, lambda: None, lambda y: np.array(y, copy=True), "eager, synchronous")


def _torch_side(n: int) -> Side | None:
    try:
        import torch
    except ImportError:
        _UNAVAILABLE["torch"] = "not installed"
        return None
    x = torch.zeros(ELEMENTS)

    def call() -> Any:
        y = x
        for _ in range(n):
            y = y + 1
        return y
    return Side("torch", call, torch.cpu.synchronize, lambda y: y.numpy().copy(), "eager CPU, synchronous")


def _tinygrad_side(n: int) -> Side | None:
    try:
        from tinygrad import Device as TgDevice  # type: ignore[import-not-found]
        from tinygrad import Tensor as TgTensor
        from tinygrad import TinyJit as TgJit
    except ImportError:
        _UNAVAILABLE["tinygrad"] = "not installed"
        return None

    @TgJit
    def step(x: Any) -> Any:
        for _ in range(n):
            x = (x + 1).contiguous().realize()
        return x.realize()

    try:
        x = TgTensor.zeros(ELEMENTS).contiguous().realize()
        dev = TgDevice[str(x.device)]
        for _ in range(3):  # tinygrad's TinyJit: call 1 runs, call 2 captures, later calls replay
            out = step(x).numpy()
        if not np.array_equal(out, np.full(ELEMENTS, n, np.float32)):
            raise AssertionError(f"tinygrad's {n}-kernel chain computed {out[:4]}..., expected {n}")
    except Exception as e:  # installed but unusable here (e.g. no C compiler for its CPU device)
        _UNAVAILABLE["tinygrad"] = f"installed but failed to run: {type(e).__name__}: {e}"
        return None
    return Side("tinygrad jit", lambda: step(x), dev.synchronize, lambda y: y.numpy(), "TinyJit replay")


def make_sides(n: int, dev: Any, frameworks: tuple[str, ...] = ("rawgrad", "numpy", "torch", "tinygrad")) \
        -> list[Side]:
    """The columns for chains of `n` kernels: rawgrad eager and replay on `dev`'s default Tensors, then
    numpy, torch and tinygrad where importable (the unavailable ones are left out and noted)."""
    sides: list[Side] = []
    if "rawgrad" in frameworks:
        from rawgrad import Tensor
        from rawgrad.jit import TinyJit
        x = Tensor(np.zeros(ELEMENTS, np.float32)).realize()
        jitted: TinyJit[Any] = TinyJit(functools.partial(_chain, n=n))
        jitted(x), jitted(x)  # eager call, capture
        dev.synchronize()
        out = jitted(x).numpy()
        if not np.array_equal(out, np.full(ELEMENTS, n, np.float32)):
            raise AssertionError(f"replay of a {n}-kernel chain computed {out[:4]}..., expected {n}")
        sides.append(Side("rawgrad eager", lambda: _chain(x, n), dev.synchronize, lambda t: t.numpy(),
                          "schedule + lower + launch per kernel"))
        sides.append(Side("rawgrad replay", lambda: jitted(x), dev.synchronize, lambda t: t.numpy(),
                          "TinyJit replay"))
    if "numpy" in frameworks:
        sides.append(_numpy_side(n))
    for name, make in (("torch", _torch_side), ("tinygrad", _tinygrad_side)):
        if name in frameworks:
            side = make(n)
            if side is not None:
                sides.append(side)
    return sides


def host_submit_per_kernel(side: Side, n: int, repeats: int) -> float:
    """Host time of one call with the device idle before it (no protocol: the call only)."""
    times = []
    for _ in range(repeats):
        side.sync()
        t0 = time.perf_counter()
        side.call()
        times.append(time.perf_counter() - t0)
    side.sync()
    return statistics.median(times) / n


COLUMNS = ("rawgrad eager", "rawgrad replay", "numpy", "torch", "tinygrad jit")


# Calls timed one by one for the latency table (p99 of 2000 calls is the 20th slowest).
LATENCY_CALLS = 2000
# A spinner process needs a moment to be scheduled and to settle on a core before the timing starts.
SPINNER_SETTLE_S = 0.2
SPINNER_CODE = "while True: pass"
# What the last bench_dispatch measured in its latency table: {column: {"quiet": (p50_s, p99_s), "busy": ...}}
last_latency: dict[str, dict[str, tuple[float, float]]] = {}


def call_latency(side: Side, calls: int = LATENCY_CALLS) -> tuple[float, float]:
    """(p50, p99) seconds of one call + sync of `side` (no readback), each call timed on its own."""
    side.sync()
    for _ in range(min(20, calls)):  # warm the path (allocator caches, a device thread's first wake)
        side.call()
        side.sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        side.call()
        side.sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, (len(times) * 99) // 100)]


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """A background process that keeps one core busy (a pure-Python spin loop) for the duration."""
    proc = subprocess.Popen([sys.executable, "-c", SPINNER_CODE])
    try:
        time.sleep(SPINNER_SETTLE_S)
        yield
    finally:
        proc.kill()
        proc.wait(timeout=10)


def latency_table(sides: list[Side], calls: int = LATENCY_CALLS) -> dict[str, dict[str, tuple[float, float]]]:
    """Print and return p50/p99 per call of each side, quiet and with a busy core."""
    out: dict[str, dict[str, tuple[float, float]]] = {s.name: {} for s in sides}
    for mode in ("quiet", "busy"):
        with busy_core() if mode == "busy" else contextlib.nullcontext():
            for side in sides:
                out[side.name][mode] = call_latency(side, calls)
    print(f"\nper-call latency of a 1-kernel chain: call + sync, each of {calls} calls timed alone (us); "
          f"busy = another process spins on one core")
    print(f"{'column':>16s} {'quiet p50':>10s} {'quiet p99':>10s} {'busy p50':>10s} {'busy p99':>10s}")
    for side in sides:
        q, b = out[side.name]["quiet"], out[side.name]["busy"]
        print(f"{side.name:>16s} {q[0] * 1e6:10.2f} {q[1] * 1e6:10.2f} {b[0] * 1e6:10.2f} {b[1] * 1e6:10.2f}",
              flush=True)
    return out


def bench_dispatch(lengths: tuple[int, ...] = CHAIN_LENGTHS, protocols: tuple[str, ...] = ("async", "sync"),
                   frameworks: tuple[str, ...] = ("rawgrad", "numpy", "torch", "tinygrad"),
                   latency_calls: int = LATENCY_CALLS) -> list[dict[str, Any]]:
    """Print (and return) per-kernel times of every column under each protocol, for each chain length.
    One row per (protocol, N): {"protocol", "n", "<column>_s" for each column timed, "submit_s"}. Then the
    per-call latency table (`latency_table`, kept in `last_latency`; `latency_calls=0` leaves it out)."""
    from rawgrad import Device

    for p in protocols:
        if p not in PROTOCOLS:
            raise ValueError(f"unknown protocol {p!r}; choose from {', '.join(PROTOCOLS)}")
    dev = Device[Device.DEFAULT]  # where the Tensors below live (DEV=NV puts them on the GPU): sync that one
    print(f"rawgrad bench dispatch on {dev.name}  ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, "
          f"{getattr(dev, 'threads', '?')} worker threads, {ELEMENTS}-element x = x + 1 chains)")
    sides_by_n = {n: make_sides(n, dev, frameworks) for n in lengths}
    names = [c for c in COLUMNS if any(s.name == c for sides in sides_by_n.values() for s in sides)]
    rows: list[dict[str, Any]] = []
    us = lambda v: f"{v * 1e6:.3f}" if v is not None else "n/a"  # noqa: E731
    for protocol in protocols:
        print(f"\nprotocol: {protocol} (every column) -- {PROTOCOLS[protocol]}")
        print("  " + "; ".join(f"{s.name}: {protocol}" for s in sides_by_n[lengths[0]]) if lengths else "")
        head = " ".join(f"{c + ' us/k':>19s}" for c in names)
        print(f"{'N':>5s} {head} {'eager/replay':>13s} {'submit us/k':>12s}")
        for n in lengths:
            row: dict[str, Any] = {"protocol": protocol, "n": n}
            for side in sides_by_n[n]:
                row[f"{side.name}_s"] = time_per_kernel(side, n, protocol, _repeats(n), _calls_per_block(n))
            replay = next((s for s in sides_by_n[n] if s.name == "rawgrad replay"), None)
            row["submit_s"] = host_submit_per_kernel(replay, n, _repeats(n)) if replay else None
            rows.append(row)
            cells = " ".join(f"{us(row.get(c + '_s')):>19s}" for c in names)
            ratio = (f"{row['rawgrad eager_s'] / row['rawgrad replay_s']:12.1f}x"
                     if "rawgrad replay_s" in row else f"{'n/a':>13s}")
            print(f"{n:5d} {cells} {ratio} {us(row['submit_s']):>12s}", flush=True)
    print("submit us/k: host time of one replay call, device idle before it (no sync, no readback; "
          "not a protocol column)")
    if latency_calls > 0:
        one = sides_by_n[1] if 1 in sides_by_n else make_sides(1, dev, frameworks)
        last_latency.clear()
        last_latency.update(latency_table(one, latency_calls))
    for name in ("torch", "tinygrad"):
        if name in frameworks and name in _UNAVAILABLE:
            print(f"{name}: {_UNAVAILABLE[name]}, skipped")
    return rows


if __name__ == "__main__":
    bench_dispatch()
