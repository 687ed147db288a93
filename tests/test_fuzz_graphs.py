"""Differential fuzzer: random small graphs of movement, elementwise, reduce and indexing ops, evaluated
compiled (the default device), through the numpy reference interpreter (REFERENCE=1) and with numpy, and
compared exactly (ints) or within float32 tolerance (floats).

Every graph comes from a seeded generator, so a failure names its seed; the test then shrinks the op list
(dropping steps while it still fails) and prints the shortest program as Python code to paste into a test.
Besides the whole result, every graph also reads single elements out of it (0-d outputs: the case where a
masked pad/stack/cat view once lost its mask and silently read the wrong element).

RAWGRAD_FUZZ_GRAPHS=N runs N graphs (default 150, a few seconds); RAWGRAD_FUZZ_SEED=S starts at seed S.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor

N_GRAPHS = int(os.environ.get("RAWGRAD_FUZZ_GRAPHS", "150"))
FIRST_SEED = int(os.environ.get("RAWGRAD_FUZZ_SEED", "0"))
GRAPHS_PER_CASE = 25
MAX_STEPS = 6
MAX_NUMEL = 256


@dataclass(frozen=True)
class Step:
    """One op, written three ways: for a rawgrad Tensor, for a numpy array, and as code for a repro."""

    code: str  # uses `x` (the running value) and `y` (a second operand of the same shape, if any)
    rg: Callable[[Any, Any], Any]
    np_: Callable[[Any, Any], Any]


def _axis(rng: np.random.Generator, shape: tuple[int, ...]) -> int:
    return int(rng.integers(0, len(shape)))


def _random_step(rng: np.random.Generator, shape: tuple[int, ...], is_int: bool) -> Step | None:
    """A step that applies to a value of `shape`, or None if the drawn kind does not fit."""
    kind = rng.choice(["pad", "shrink", "slice", "stack", "cat", "permute", "expand", "flip", "reshape",
                       "binary", "unary", "where", "reduce", "index_int", "index_list", "index_tensor",
                       "setitem"])
    nd = len(shape)
    if kind == "pad" and nd:
        pads = tuple((int(rng.integers(0, 3)), int(rng.integers(0, 3))) for _ in shape)
        value = float(rng.integers(-3, 4))
        npw = [(a, b) for a, b in pads]
        return Step(f"x = x.pad({pads}, value={value})", lambda x, y: x.pad(pads, value=value),
                    lambda x, y: np.pad(x, npw, constant_values=value))
    if kind in ("shrink", "slice") and nd and all(s > 0 for s in shape):
        sl = []
        for s in shape:
            a = int(rng.integers(0, s))
            b = int(rng.integers(a + 1, s + 1))
            step = int(rng.integers(1, 3)) if kind == "slice" else 1
            sl.append(slice(a, b, step))
        key = tuple(sl)
        return Step(f"x = x[{_fmt_key(key)}]", lambda x, y: x[key], lambda x, y: x[key])
    if kind == "stack":
        ax = int(rng.integers(0, nd + 1))
        return Step(f"x = Tensor.stack(x, y, x, dim={ax})", lambda x, y: Tensor.stack(x, y, x, dim=ax),
                    lambda x, y: np.stack([x, y, x], axis=ax))
    if kind == "cat" and nd:
        ax = _axis(rng, shape)
        return Step(f"x = x.cat(y, dim={ax})", lambda x, y: x.cat(y, dim=ax),
                    lambda x, y: np.concatenate([x, y], axis=ax))
    if kind == "permute" and nd > 1:
        order = tuple(int(i) for i in rng.permutation(nd))
        return Step(f"x = x.permute{order}", lambda x, y: x.permute(*order),
                    lambda x, y: np.transpose(x, order))
    if kind == "expand" and nd:
        ax = _axis(rng, shape)
        size = int(rng.integers(2, 4))
        new = tuple(size if i == ax else s for i, s in enumerate(shape))
        # expand needs a size-1 dim: take one element along `ax` first
        return Step(f"x = x[{_fmt_key(_one_along(ax, nd))}].expand{new}",
                    lambda x, y: x[_one_along(ax, nd)].expand(*new),
                    lambda x, y: np.broadcast_to(x[_one_along(ax, nd)], new))
    if kind == "flip" and nd:
        ax = _axis(rng, shape)
        return Step(f"x = x.flip({ax})", lambda x, y: x.flip(ax), lambda x, y: np.flip(x, ax))
    if kind == "reshape":
        n = int(np.prod(shape))
        divs = [d for d in range(1, n + 1) if n % d == 0]
        d = int(rng.choice(divs)) if divs else 1
        new = (d, n // d) if n else (0,)
        return Step(f"x = x.reshape{new}", lambda x, y: x.reshape(*new), lambda x, y: x.reshape(new))
    if kind == "binary":
        op = rng.choice(["+", "*", "-", "max"] if not is_int else ["+", "*", "-", "max", "&"])
        if op == "max":
            return Step("x = x.maximum(y)", lambda x, y: x.maximum(y), lambda x, y: np.maximum(x, y))
        return Step(f"x = x {op} y", lambda x, y: _binop(op, x, y), lambda x, y: _binop(op, x, y))
    if kind == "unary":
        op = rng.choice(["neg", "relu", "abs", "scale"])
        if op == "neg":
            return Step("x = -x", lambda x, y: -x, lambda x, y: -x)
        if op == "relu":
            return Step("x = x.relu()", lambda x, y: x.relu(), lambda x, y: np.maximum(x, 0))
        if op == "abs":
            return Step("x = x.abs()", lambda x, y: x.abs(), lambda x, y: np.abs(x))
        c = int(rng.integers(-3, 4))
        return Step(f"x = x * {c} + 1", lambda x, y: x * c + 1, lambda x, y: x * c + 1)
    if kind == "where":
        return Step("x = (x < y).where(x, y + 2)", lambda x, y: (x < y).where(x, y + 2),
                    lambda x, y: np.where(x < y, x, y + 2))
    if kind == "reduce" and nd:
        ax = _axis(rng, shape)
        keep = bool(rng.integers(0, 2))
        if shape[ax] == 0:
            return None
        op = rng.choice(["sum", "max"])
        if op == "max":  # torch's max(dim) gives (values, indices)
            return Step(f"x = x.max({ax}, keepdim={keep}).values",
                        lambda x, y: x.max(ax, keepdim=keep).values,
                        lambda x, y: np.max(x, axis=ax, keepdims=keep))
        return Step(f"x = x.sum({ax}, keepdim={keep})", lambda x, y: x.sum(ax, keepdim=keep),
                    lambda x, y: np.sum(x, axis=ax, keepdims=keep))
    if kind == "index_int" and nd and shape[0] > 0:
        i = int(rng.integers(-shape[0], shape[0]))
        return Step(f"x = x[{i}]", lambda x, y: x[i], lambda x, y: x[i])
    if kind in ("index_list", "index_tensor") and nd and shape[0] > 0:
        idx = [int(v) for v in rng.integers(-shape[0], shape[0], size=int(rng.integers(1, 4)))]
        if kind == "index_list":
            return Step(f"x = x[{idx}]", lambda x, y: x[idx], lambda x, y: x[idx])
        return Step(f"x = x[Tensor({idx})]", lambda x, y: x[Tensor(idx)], lambda x, y: x[np.array(idx)])
    if kind == "setitem" and nd and shape[0] > 0:
        i = int(rng.integers(0, shape[0]))
        v = int(rng.integers(-5, 6))

        def rg_set(x: Any, y: Any) -> Any:
            x = x.contiguous()
            x[i] = v
            return x

        def np_set(x: Any, y: Any) -> Any:
            x = x.copy()
            x[i] = v
            return x
        return Step(f"x = x.contiguous(); x[{i}] = {v}", rg_set, np_set)
    return None


def _one_along(ax: int, nd: int) -> tuple[slice, ...]:
    return tuple(slice(0, 1) if i == ax else slice(None) for i in range(nd))


def _binop(op: str, x: Any, y: Any) -> Any:
    return {"+": lambda: x + y, "*": lambda: x * y, "-": lambda: x - y, "&": lambda: x & y}[op]()


def _fmt_key(key: tuple[slice, ...]) -> str:
    def one(s: slice) -> str:
        a = "" if s.start is None else str(s.start)
        b = "" if s.stop is None else str(s.stop)
        return f"{a}:{b}" + (f":{s.step}" if s.step not in (None, 1) else "")
    return ", ".join(one(s) for s in key)


@dataclass
class Program:
    seed: int
    start: np.ndarray
    other: np.ndarray
    steps: list[Step]
    element_reads: list[tuple[int, ...]]

    def code(self) -> str:
        lines = [f"# fuzz seed {self.seed}",
                 f"x = Tensor(np.array({self.start.tolist()}, np.{self.start.dtype}))"]
        for s in self.steps:
            lines.append(f"y = Tensor(np.resize(np.array({self.other.ravel().tolist()}, "
                         f"np.{self.other.dtype}), x.shape))")
            lines.append(s.code)
        lines.append("print(x.numpy())")
        lines.extend(f"print(x[{idx}].numpy())" for idx in self.element_reads)
        return "\n".join(lines)


def make_program(seed: int) -> Program:
    rng = np.random.default_rng(seed)
    is_int = bool(rng.integers(0, 2))
    shape = tuple(int(s) for s in rng.integers(1, 5, size=int(rng.integers(1, 4))))
    dt = np.int32 if is_int else np.float32
    start = (rng.integers(-9, 10, size=shape) if is_int else rng.uniform(-3, 3, size=shape)).astype(dt)
    other = (rng.integers(-9, 10, size=64) if is_int else rng.uniform(-3, 3, size=64)).astype(dt)
    steps: list[Step] = []
    cur = start
    for _ in range(int(rng.integers(1, MAX_STEPS + 1))):
        step = _random_step(rng, cur.shape, is_int)
        if step is None:
            continue
        nxt = np.asarray(step.np_(cur, _other_like(other, cur)))
        if nxt.size > MAX_NUMEL or nxt.ndim > 5:
            continue
        steps.append(step)
        cur = nxt
    reads = [tuple(int(rng.integers(0, s)) for s in cur.shape) for _ in range(3)] if cur.size else []
    return Program(seed, start, other, steps, reads)


def _other_like(other: np.ndarray, x: np.ndarray) -> np.ndarray:
    return np.resize(other, x.shape).astype(other.dtype)


def run_numpy(p: Program, steps: list[Step] | None = None) -> np.ndarray:
    x = p.start
    for s in p.steps if steps is None else steps:
        x = np.asarray(s.np_(x, _other_like(p.other, x)))
    return x


def run_rawgrad(p: Program, steps: list[Step] | None = None) -> tuple[np.ndarray, list[Any]]:
    x = Tensor(p.start)
    for s in p.steps if steps is None else steps:
        x = s.rg(x, Tensor(_other_like(p.other, np.empty(x.shape))))
    elements = [x[idx].numpy() for idx in _reads_for(p, x.shape)]
    return x.numpy(), elements


def _reads_for(p: Program, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The element reads that fit `shape` (after shrinking drops steps, some no longer do)."""
    return [idx for idx in p.element_reads
            if len(idx) == len(shape) and all(i < s for i, s in zip(idx, shape))]


def _mismatch(p: Program, steps: list[Step], reference: bool, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Why rawgrad disagrees with numpy on these steps (None if it agrees)."""
    want = run_numpy(p, steps)
    with monkeypatch.context() as m:
        if reference:
            m.setenv("REFERENCE", "1")
        try:
            got, elements = run_rawgrad(p, steps)
        except Exception as e:  # an error where numpy has an answer is a bug too
            return f"raised {type(e).__name__}: {e}"
    if got.shape != want.shape:
        return f"shape {got.shape} != numpy {want.shape}"
    if not _same(got, want):
        return f"values differ:\n rawgrad {got.ravel()[:16]}\n numpy   {want.ravel()[:16]}"
    for idx, e in zip(_reads_for(p, want.shape), elements):
        if not _same(np.asarray(e), np.asarray(want[idx])):
            return f"element {idx}: rawgrad {e} numpy {want[idx]}"
    return None


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if np.issubdtype(b.dtype, np.integer):
        return bool(np.array_equal(a, b))
    return bool(np.allclose(a, b, rtol=1e-5, atol=1e-5))


def _shrink(p: Program, reference: bool, monkeypatch: pytest.MonkeyPatch) -> list[Step]:
    """Drop steps one at a time while the mismatch remains (a step that no longer fits the shape after
    an earlier drop makes that candidate invalid, and it is skipped)."""
    steps = list(p.steps)
    changed = True
    while changed:
        changed = False
        for i in range(len(steps)):
            cand = steps[:i] + steps[i + 1:]
            try:
                run_numpy(p, cand)
            except Exception:
                continue
            if _mismatch(p, cand, reference, monkeypatch) is not None:
                steps, changed = cand, True
                break
    return steps


@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "reference"])
@pytest.mark.parametrize("case", range(max(1, (N_GRAPHS + GRAPHS_PER_CASE - 1) // GRAPHS_PER_CASE)))
def test_random_graphs_match_numpy(case: int, reference: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    first = FIRST_SEED + case * GRAPHS_PER_CASE
    for seed in range(first, min(first + GRAPHS_PER_CASE, FIRST_SEED + N_GRAPHS)):
        p = make_program(seed)
        why = _mismatch(p, p.steps, reference, monkeypatch)
        if why is not None:
            p.steps = _shrink(p, reference, monkeypatch)
            raise AssertionError(f"seed {seed} ({'reference' if reference else 'compiled'}): {why}\n"
                                 f"minimal program:\n{p.code()}")


def test_the_generator_covers_every_op_kind() -> None:
    seen = set()
    for seed in range(N_GRAPHS):
        for s in make_program(seed).steps:
            seen.add(s.code.split("(")[0].split("[")[0].split(" = ")[-1].split(".")[-1])
    assert len(seen) >= 12, seen
