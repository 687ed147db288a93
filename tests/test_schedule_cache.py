"""The eager schedule cache (rawgrad/tensor/schedule_cache.py, issue 21): a realize of a graph shaped like
one already scheduled is served from a template (no scheduling, no lowering, no compiling), and a template
never runs with the buffers or the constants of the graph it was made from."""
from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor, Variable, dtypes
from rawgrad.tensor import schedule_cache
from rawgrad.tensor.buffers import MEMORY_KEY
from rawgrad.tensor.realize import GlobalCounters


class _Counts:
    """Schedule-cache hits/misses and kernels compiled while the block runs."""

    def __enter__(self) -> _Counts:
        s = schedule_cache.stats()
        self._h, self._m, self._c = s.hits, s.misses, GlobalCounters.kernels_compiled
        return self

    def __exit__(self, *exc: Any) -> None:
        s = schedule_cache.stats()
        self.hits, self.misses = s.hits - self._h, s.misses - self._m
        self.compiled = GlobalCounters.kernels_compiled - self._c


def _run_twice(make: Callable[[np.random.Generator], tuple[Tensor, np.ndarray]], seed: int = 0) -> _Counts:
    """Realize `make`'s graph once (schedules it), then again with new data (must hit), checking both
    against numpy; returns the counts of the second realize."""
    rng = np.random.default_rng(seed)
    t, want = make(rng)
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-6)
    t, want = make(rng)  # new buffers, new constants, same structure
    with _Counts() as c:
        t.realize()
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-6)
    return c


def test_a_repeated_eager_op_is_served_from_the_cache() -> None:
    x = Tensor(np.zeros(16, np.float32)).realize()
    for _ in range(3):
        x = (x + 1).realize()  # first realize of this shape schedules it (or an earlier test did)
    with _Counts() as c:
        for _ in range(20):
            x = (x + 1).realize()
    assert (c.hits, c.misses, c.compiled) == (20, 0, 0)
    np.testing.assert_array_equal(x.numpy(), np.full(16, 23, np.float32))


def test_new_input_buffers_are_read_not_the_cached_ones() -> None:
    def make(rng: np.random.Generator) -> tuple[Tensor, np.ndarray]:
        a, b = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((3, 5)).astype(np.float32)
        return (Tensor(a) * Tensor(b)).sum(1), (a * b).sum(1)
    c = _run_twice(make)
    assert (c.hits, c.misses, c.compiled) == (1, 0, 0)


def test_new_constants_are_bound_not_the_cached_ones() -> None:
    def make(rng: np.random.Generator) -> tuple[Tensor, np.ndarray]:
        a = rng.standard_normal(7).astype(np.float32)
        k, m = float(rng.uniform(2, 3)), float(rng.uniform(-5, -4))
        return Tensor(a) * k + m, a * np.float32(k) + np.float32(m)
    c = _run_twice(make)
    assert (c.hits, c.misses, c.compiled) == (1, 0, 0)


def test_float64_and_float16_constants_are_bound_exactly() -> None:
    for dt, npdt in ((dtypes.float64, np.float64), (dtypes.float16, np.float16)):
        a = np.arange(4, dtype=npdt)
        outs = []
        for k in (0.1, 0.3, 65519.0 * 4):  # the last one is past float16's range: inf, as a literal would be
            with np.errstate(over="ignore", invalid="ignore"):  # 0 * inf
                want = a * npdt(k)
                outs.append(((Tensor(a, dtype=dt) * k).numpy(), want))
        for got, want in outs:
            np.testing.assert_array_equal(got, want)


def test_one_buffer_read_twice_is_not_two_buffers() -> None:
    a, b = np.arange(6, dtype=np.float32), np.arange(6, dtype=np.float32)[::-1].copy()
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    np.testing.assert_array_equal((ta + tb).numpy(), a + b)
    np.testing.assert_array_equal((ta + ta).numpy(), a + a)  # a different key: one BUFFER node, not two
    np.testing.assert_array_equal((tb + ta).numpy(), b + a)


def test_views_of_new_buffers() -> None:
    def make(rng: np.random.Generator) -> tuple[Tensor, np.ndarray]:
        a = rng.standard_normal((4, 6)).astype(np.float32)
        t = Tensor(a)
        out = t.permute(1, 0)[1:5].pad(((1, 0), (0, 2))).flip(0) + t[0:1, 0:1].expand(1, 6)
        want_v = np.pad(a.T[1:5], ((1, 0), (0, 2)))[::-1] + np.broadcast_to(a[0:1, 0:1], (1, 6))
        return out, want_v
    c = _run_twice(make)
    assert (c.hits, c.misses, c.compiled) == (1, 0, 0)


def test_dtypes_and_shapes_are_part_of_the_key() -> None:
    x32 = Tensor(np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal((x32 * 3).numpy(), np.arange(8, dtype=np.float32) * 3)
    xi = Tensor(np.arange(8, dtype=np.int32))
    with _Counts() as c:
        got = (xi * 3).numpy()
    assert c.hits == 0 and c.misses == 1
    np.testing.assert_array_equal(got, np.arange(8, dtype=np.int32) * 3)
    x9 = Tensor(np.arange(9, dtype=np.float32))
    with _Counts() as c:
        got9 = (x9 * 3).numpy()
    assert c.hits == 0 and c.misses == 1
    np.testing.assert_array_equal(got9, np.arange(9, dtype=np.float32) * 3)


def test_assigns_write_the_new_target() -> None:
    for i in range(3):
        a = np.arange(6, dtype=np.float32) + i
        t = Tensor(a).realize()
        k = 1.5 + i
        t.assign(t * k + 1).realize()
        np.testing.assert_array_equal(t.numpy(), a * np.float32(k) + 1)
        m = Tensor(np.zeros((2, 3), np.float32)).realize()
        m[:, 1:2].assign(Tensor(np.full((2, 1), 2.5 + i, np.float32)))
        want = np.zeros((2, 3), np.float32)
        want[:, 1] = 2.5 + i
        np.testing.assert_array_equal(m.numpy(), want)


def test_bound_variables_take_their_new_values() -> None:
    v = Variable("n", 1, 8)
    base = np.arange(8, dtype=np.float32)
    for n in (3, 5, 3):
        t = Tensor(base)[:v.bind(n)] * 2.5
        assert t.shape[0] is not None
        got = t.numpy()
        np.testing.assert_array_equal(got, base[:n] * np.float32(2.5))


def test_a_template_keeps_no_buffer_alive() -> None:
    x = Tensor(np.arange(5, dtype=np.float32)).realize()
    y = (x * 1.75 + 0.5).realize()
    (x * 2.75 + 0.25).realize()  # the same structure: this one is served from the template
    mems = [weakref.ref(t.uop.base._cached[MEMORY_KEY]) for t in (x, y)]
    del x, y
    gc.collect()
    assert all(m() is None for m in mems), "the schedule cache kept a buffer's device memory alive"


_UNARY: list[tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = [
    (lambda t: t.relu(), lambda a: np.maximum(a, 0)),
    (lambda t: -t, lambda a: -a),
    (lambda t: t.exp2() * 0.25, lambda a: np.exp2(a) * np.float32(0.25)),
]
_BINARY: list[tuple[Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = [
    (lambda t, u: t + u, lambda a, b: a + b),
    (lambda t, u: t * u, lambda a, b: a * b),
    (lambda t, u: t.maximum(u), lambda a, b: np.maximum(a, b)),
]


def _random_program(rng: np.random.Generator, depth: int) -> list[tuple[str, int, int]]:
    """A random graph shape: a list of steps over a (4, 5) float32 value stack (the shape, not the data)."""
    steps = [("in", 0, 0), ("in", 0, 0)]
    for _ in range(depth):
        kind = rng.choice(["un", "bin", "const", "sum", "perm"])
        steps.append((str(kind), int(rng.integers(0, 3)), int(rng.integers(0, 2))))
    return steps


def _build(steps: list[tuple[str, int, int]], rng: np.random.Generator) -> tuple[Tensor, np.ndarray]:
    """The program on fresh random inputs and constants: (rawgrad tensor, numpy value)."""
    vals: list[tuple[Tensor, np.ndarray]] = []
    for kind, a, b in steps:
        if kind == "in":
            arr = rng.uniform(-2, 2, (4, 5)).astype(np.float32)
            vals.append((Tensor(arr), arr))
            continue
        t, x = vals[-1]
        if kind == "un":
            f, g = _UNARY[a]
            vals.append((f(t), g(x)))
        elif kind == "bin":
            u, y = vals[max(-len(vals), -2 - b)]
            f2, g2 = _BINARY[a]
            vals.append((f2(t, u), g2(x, y)))
        elif kind == "const":
            k = float(rng.uniform(0.5, 1.5)) + 0.001  # never one of the literal constants (0, 1, -1)
            vals.append((t * k + (k - 3), x * np.float32(k) + np.float32(k - 3)))
        elif kind == "sum":
            vals.append((t.sum(1, keepdim=True).expand(4, 5),
                         np.broadcast_to(x.sum(1, keepdims=True), (4, 5))))
        elif kind == "perm":
            vals.append((t.reshape(5, 4).permute(1, 0) + 0.125 if b else t.flip(0),
                         x.reshape(5, 4).T + np.float32(0.125) if b else x[::-1]))
    return vals[-1]


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_match_numpy_when_served_from_the_cache(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    steps = _random_program(rng, depth=int(rng.integers(2, 7)))
    t, want = _build(steps, rng)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-5)
        for _ in range(2):
            t, want = _build(steps, rng)  # same structure, new inputs and new constants
            with _Counts() as c:
                t.realize()
            assert c.misses == 0 and c.compiled == 0, f"program {steps} was scheduled again"
            assert c.hits >= 1
            np.testing.assert_allclose(t.numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cached", [False, True])
def test_an_assign_run_by_the_walk_free_realize_is_marked_as_run(monkeypatch: pytest.MonkeyPatch,
                                                                  cached: bool) -> None:
    """Tensor.realize with no executed or pending assigns skips its own graph walk: the ASSIGN nodes it
    marks as run come from the schedule cache (a template's, when `cached`). A second graph over the same
    ASSIGN must then read the written buffer, not run the write again."""
    from rawgrad.tensor import tensor as tensor_module

    def make(start: float) -> tuple[Tensor, Tensor, Tensor]:
        p = Tensor(np.array([start, start + 1], np.float32)).realize()
        alias = Tensor(p.uop)  # the same buffer, through a Tensor that is not the assign's target
        p.assign(p + 1)
        return p * 2, p * 3, alias

    if cached:
        q, r, _ = make(10.0)
        q.realize()  # this structure's template now exists
        r.realize()
    monkeypatch.setattr(tensor_module, "_executed_assigns", weakref.WeakKeyDictionary())
    q, r, alias = make(1.0)
    gc.collect()  # the assign's own Tensor is gone: nothing is pending, only its ASSIGN node in q and r
    assert not tensor_module._pending_assigns and not tensor_module._executed_assigns
    with _Counts() as c:
        q.realize()
    assert c.hits == (1 if cached else 0)
    assert len(tensor_module._executed_assigns) == 1
    np.testing.assert_array_equal(q.numpy(), [4, 6])
    np.testing.assert_array_equal(r.numpy(), [6, 9])  # (1 + 1) * 3: the write ran once
    np.testing.assert_array_equal(alias.numpy(), [2, 3])
