"""The symbolic engine: targeted rewrites, and a randomized check that simplifying keeps every value."""
from __future__ import annotations

import itertools
import pickle
import random
from typing import Any

import numpy as np
import pytest

from rawgrad.compiler.ir import Ops, UOp, Variable
from rawgrad.compiler.symbolic import simplify, substitute_vars, sym_infer
from rawgrad.dtype import dtypes


# ---------------------------------------------------------------------- an independent reference evaluator
def _cdiv(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


_REF: dict[Ops, Any] = {
    Ops.ADD: lambda x, y: x + y, Ops.MUL: lambda x, y: x * y, Ops.SUB: lambda x, y: x - y,
    Ops.NEG: lambda x: -x,
    Ops.IDIV: _cdiv, Ops.MOD: lambda x, y: x - y * _cdiv(x, y), Ops.MAX: max, Ops.CMPLT: lambda x, y: x < y,
    Ops.CMPNE: lambda x, y: x != y, Ops.CMPEQ: lambda x, y: x == y, Ops.AND: lambda x, y: x and y,
    Ops.OR: lambda x, y: x or y, Ops.NOT: lambda x: not x, Ops.WHERE: lambda c, x, y: x if c else y,
}


def ref_eval(u: UOp, env: dict[UOp, int]) -> Any:
    """C semantics on Python ints, written apart from the library so a shared bug cannot hide."""
    memo: dict[UOp, Any] = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            memo[n] = n.arg
        elif n.op is Ops.DEFINE_VAR:
            memo[n] = env[n]
        elif n.op is Ops.BIND:
            memo[n] = n.src[1].arg
        else:
            memo[n] = _REF[n.op](*[memo[s] for s in n.src])
    return memo[u]


# ---------------------------------------------------------------------- targeted rewrites
a = Variable("a", 0, 3)
b = Variable("b", 0, 5)
x = Variable("x", 0, 100)
n = Variable("n", -7, 7)
seq = Variable("seq", 1, 128)


@pytest.mark.parametrize("expr,want", [
    (a + 0, "a"), (a * 1, "a"), (a * 0, "0"), (a // 1, "a"), (a % 1, "0"),
    (a + a, "(a*2)"), (a * 3 + a * 4, "(a*7)"), ((a + 2) + 3, "(a+5)"), (a + 3 + b, "((a+b)+3)"),
    (b + a, "(a+b)"), (a - a, "0"), ((a + 1) * 2 - a * 2, "2"), ((a * 2) * 3, "(a*6)"),
    ((a * 6 + b) // 6, "a"), ((a * 6 + b) % 6, "b"), ((a * 6 + b + 6) // 6, "(a+1)"),
    (a // 4, "0"), (a % 4, "a"), (b // 6, "0"), ((x // 4) // 3, "(x//12)"),
    ((x % 24) % 6, "(x%6)"), ((x % 24) // 6, "((x//6)%4)"), ((x * 6) // 4, "((x*3)//2)"),
    ((x * 8) // 4, "(x*2)"), ((x * 4) % 2, "0"), ((x // 6) * 6 + x % 6, "x"),
    ((x // 6) * 12 + (x % 6) * 2, "(x*2)"),
    (a.lt(4), "True"), (a.lt(0), "False"), (a.lt(3), "(a<3)"), (a.ne(7), "True"), (a.eq(7), "False"),
    ((a * 6 + b).lt(12), "(a<2)"), ((x * 4).lt(10), "(x<3)"), ((x + 3).lt(10), "(x<7)"),
    ((x * 2 + 1).eq(4), "False"), ((x * 2 + 2).ne(8), "(x!=3)"),
    (a.maximum(5), "5"), (a.maximum(0), "a"), (a.maximum(b), "max(a, b)"),
    (a.lt(4).logical_and(b.lt(3)), "(b<3)"), (a.lt(0).logical_and(b.lt(3)), "False"),
    ((seq * 4) // seq, "4"), ((seq * 4 + 3) // seq, "(((seq*4)+3)//seq)"), ((a * seq + 0) % seq, "0"),
    ((n * 4 + 1) // 4, "(((n*4)+1)//4)"),  # n may be negative: truncation does not split
    (n // -2, "((n//2)*-1)"), (n % -3, "(n%3)"),
])
def test_rewrites(expr: UOp, want: str) -> None:
    got = simplify(expr)
    assert got.render() == want
    assert simplify(got) is got  # idempotent


def test_equal_sums_meet() -> None:
    e1 = simplify((a + b) * 2 + x + 1)
    e2 = simplify(1 + x + b * 2 + a + a)
    assert e1 is e2


def test_where_and_not() -> None:
    assert simplify(a.lt(4).where(x, b)) is x
    assert simplify(a.lt(2).where(x, x)) is x
    nn = UOp(Ops.NOT, dtypes.bool, (UOp(Ops.NOT, dtypes.bool, (a.lt(2),), None),), None)
    assert simplify(nn).render() == "(a<2)"
    assert simplify(UOp(Ops.OR, dtypes.bool, (a.lt(2), UOp.const(dtypes.bool, True)), None)).is_const(True)


def test_sym_infer() -> None:
    e = (a * 6 + b) // 4 - x % 7
    assert sym_infer(e, {a: 3, b: 5, x: 50}) == (23 // 4) - 1
    assert sym_infer(7, {}) == 7
    assert sym_infer(seq.bind(9) * 2, {}) == 18
    assert sym_infer(n // 2 + n % 3, {n: -7}) == -3 + -1
    with pytest.raises(ValueError, match="seq"):
        sym_infer(seq + 1, {})


def test_substitute_vars() -> None:
    assert substitute_vars(a * 6 + b, {a: 2, b: 1}) == 13
    assert substitute_vars(a * 6 + b, {b: a}) is simplify(a * 7)


def test_big_constants_fold_exactly() -> None:
    # index math on int64 folds with exact integer division (no float rounding)
    big = UOp.const(dtypes.index, 2 ** 60 + 1)
    assert (big // 3).arg == (2 ** 60 + 1) // 3
    assert (big % 7).arg == (2 ** 60 + 1) % 7


def test_pickle_roundtrip() -> None:
    e = simplify((a * 6 + b) // 4)
    assert pickle.loads(pickle.dumps(e)) is e


# ---------------------------------------------------------------------- randomized equivalence
_VARS = [Variable("v0", 0, 5), Variable("v1", 0, 12), Variable("v2", -6, 6), Variable("v3", 2, 9),
         Variable("v4", -10, -1), Variable("v5", 0, 1)]


def _rand_int_expr(rng: random.Random, depth: int) -> UOp:
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.75:
            return rng.choice(_VARS)
        return UOp.const(dtypes.index, rng.randint(-8, 12))
    kind = rng.random()
    sub = lambda: _rand_int_expr(rng, depth - 1)
    c = lambda: rng.choice([1, 2, 3, 4, 5, 6, 8, 12, -2, -3])
    if kind < 0.25:
        return sub() + sub()
    if kind < 0.35:
        return sub() - sub()
    if kind < 0.5:
        return sub() * rng.choice([c(), 0, -1]) if rng.random() < 0.7 else sub() * sub()
    if kind < 0.65:
        return sub() // c()
    if kind < 0.8:
        return sub() % c()
    if kind < 0.88:
        return sub().maximum(sub())
    if kind < 0.94:
        return _rand_bool_expr(rng, depth - 1).where(sub(), sub())
    # a symbolic divisor that is always positive
    return sub() // _VARS[3] if rng.random() < 0.5 else sub() % _VARS[3]


def _rand_bool_expr(rng: random.Random, depth: int) -> UOp:
    l, r = _rand_int_expr(rng, depth), _rand_int_expr(rng, max(depth - 1, 0))
    k = rng.random()
    if k < 0.5:
        return l.lt(r)
    if k < 0.7:
        return l.ne(r)
    if k < 0.8:
        return l.eq(r)
    if k < 0.9:
        return l.lt(r).logical_and(_rand_int_expr(rng, 1).lt(rng.randint(-3, 8)))
    return UOp(Ops.OR, dtypes.bool, (l.lt(r), r.ne(rng.randint(-3, 8))), None)


def np_eval(u: UOp, env: dict[UOp, np.ndarray], npoints: int) -> np.ndarray:
    """The reference evaluator again, vectorized over many variable assignments at once."""
    memo: dict[UOp, Any] = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            memo[n] = np.asarray(n.arg)
            continue
        if n.op is Ops.DEFINE_VAR:
            memo[n] = env[n]
            continue
        a = [memo[s] for s in n.src]
        if n.op in (Ops.IDIV, Ops.MOD):
            q = (np.abs(a[0]) // np.abs(a[1])) * np.where((a[0] < 0) == (a[1] < 0), 1, -1)
            memo[n] = q if n.op is Ops.IDIV else a[0] - a[1] * q
        elif n.op is Ops.WHERE:
            memo[n] = np.where(a[0], a[1], a[2])
        else:
            memo[n] = {
                Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.SUB: np.subtract, Ops.MAX: np.maximum,
                Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal, Ops.AND: np.logical_and,
                Ops.OR: np.logical_or, Ops.NOT: np.logical_not, Ops.NEG: np.negative,
            }[n.op](*a)
    return np.broadcast_to(memo[u], (npoints,))


def _envs(vs: list[UOp], rng: random.Random, count: int) -> tuple[dict[UOp, np.ndarray], int]:
    """Every combination when there are few, else random points plus the corners of the bounds."""
    ranges = [range(v.arg[1], v.arg[2] + 1) for v in vs]
    total = 1
    for r in ranges:
        total *= len(r)
    if total <= count:
        points = list(itertools.product(*ranges))
    else:
        points = list(itertools.product(*[(r[0], r[-1]) for r in ranges]))
        points += [tuple(rng.choice(r) for r in ranges) for _ in range(count)]
    cols = np.array(points, dtype=np.int64).reshape(len(points), len(vs))
    return {v: cols[:, i] for i, v in enumerate(vs)}, len(points)


@pytest.mark.parametrize("seed", range(5))
def test_random_expressions_keep_their_value(seed: int) -> None:
    rng = random.Random(seed)
    for i in range(600):
        e = _rand_int_expr(rng, 4) if rng.random() < 0.7 else _rand_bool_expr(rng, 3)
        s = simplify(e)
        assert simplify(s) is s, f"not idempotent: {e.render()} -> {s.render()} -> {simplify(s).render()}"
        vs = e.variables()
        env, npoints = _envs(vs, rng, 300)
        want, got = np_eval(e, env, npoints), np_eval(s, env, npoints)
        bad = np.nonzero(want != got)[0]
        if len(bad):
            at = {v.arg[0]: int(env[v][bad[0]]) for v in vs}
            pytest.fail(f"{e.render()} -> {s.render()} at {at}: {got[bad[0]]} != {want[bad[0]]}")
        # the bounds of the original must contain every value it takes
        assert e.vmin <= want.min() and want.max() <= e.vmax, f"bounds of {e.render()} are too tight"
        if i % 50 == 0:  # the scalar evaluators agree with the vectorized one
            point = {v: int(env[v][0]) for v in vs}
            assert sym_infer(e, point) == ref_eval(e, point) == want[0]


@pytest.mark.parametrize("seed", range(3))
def test_random_linear_div_mod_lt(seed: int) -> None:
    """Index-shaped expressions: (sum of coef*var + const) against //, %, < by small constants."""
    rng = random.Random(1000 + seed)
    for _ in range(400):
        vs = [Variable(f"w{i}", lo, lo + rng.randint(0, 9)) for i, lo in
              enumerate(rng.choice([0, 0, 0, 1, -3]) for _ in range(rng.randint(1, 3)))]
        e: UOp = UOp.const(dtypes.index, rng.randint(-30, 30))
        for v in vs:
            e = e + v * rng.choice([1, 1, 2, 3, 4, 6, 8, 12, 24, -1, -4])
        c = rng.choice([2, 3, 4, 6, 8, 12, 24])
        op = rng.random()
        if op < 0.2:
            e = e.maximum(0)
        e = e // c if op < 0.45 else e % c if op < 0.7 else e.lt(c * rng.randint(-2, 4))
        if e.dtype is dtypes.index and rng.random() < 0.3:
            e = e * 5 + vs[0]  # the result used inside a bigger sum
        s = simplify(e)
        env, npoints = _envs(vs, rng, 200)
        want, got = np_eval(e, env, npoints), np_eval(s, env, npoints)
        bad = np.nonzero(want != got)[0]
        if len(bad):
            at = {v.arg[0]: int(env[v][bad[0]]) for v in vs}
            pytest.fail(f"{e.render()} -> {s.render()} at {at}: {got[bad[0]]} != {want[bad[0]]}")


def test_simplification_shrinks_index_expressions() -> None:
    # unravel a flat index then ravel it back: the round trip should vanish
    r0, r1, r2 = Variable("r0", 0, 3), Variable("r1", 0, 5), Variable("r2", 0, 6)
    flat = r0 * 42 + r1 * 7 + r2
    back = (flat // 42) * 42 + ((flat // 7) % 6) * 7 + flat % 7
    assert simplify(back) is simplify(flat)
    assert simplify((flat // 7) % 6) is r1
    assert simplify(flat % 7) is r2


def test_division_by_a_variable_recombines_with_its_remainder() -> None:
    # the global index of a (batch, seq_len) loop is split into i // T and i % T; their weighted sum
    # must fold back to i * stride, or every load pays a division per element
    t, i = Variable("T", 1, 64), Variable("i", 0, 1000)
    assert simplify((i // t) * t * 384 + (i % t) * 384 + 5).render() == "((i*384)+5)"
    assert simplify(t * (i // t) + i % t) is simplify(i)
    # a mismatched coefficient is not the identity and must stay
    assert "%" in simplify((i // t) * t * 2 + (i % t)).render()
    for iv in range(0, 200, 7):
        for tv in (1, 3, 37):
            e = (i // t) * t * 3 + (i % t) * 3
            assert sym_infer(simplify(e), {i: iv, t: tv}) == iv * 3
