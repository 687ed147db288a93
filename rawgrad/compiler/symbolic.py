"""Integer algebra for index expressions: canonical sums, bounds-aware division, decided comparisons.

Every rule here must hold for *all* values inside the bounds (`vmin`/`vmax`) of its inputs, including
negative ones: IDIV truncates toward zero and MOD takes the sign of the dividend (C semantics), so a
rule borrowed from floor arithmetic is only applied where the signs make the two agree.

Canonical forms the rules keep (so equal expressions become the same hash-consed node):
- a sum is a left-nested chain of ADDs whose terms are sorted by `order_key`, like terms combined,
  and the constant last: `((a*3 + b) + c) + 5`;
- a product is a left-nested chain of its non-constant factors (sorted) times one constant last;
  a constant times a sum is distributed;
- commutative comparisons and MAX/AND/OR keep a constant on the right.
The algebra is applied to signed integer dtypes only (unsigned values wrap, floats round).
"""
from __future__ import annotations

import math
import weakref
from typing import Any

from rawgrad.compiler.ir import ALU, COMPARISON, Ops, UOp, exec_python_alu, set_size_folder
from rawgrad.compiler.rewrite import PatternMatcher, UPat, graph_rewrite
from rawgrad.dtype import DType, dtypes

_SIGNED = frozenset(d for d in dtypes.all() if d.is_int and not d.is_unsigned)
_FOLDABLE = frozenset(d for d in dtypes.all() if d.is_int or d.is_bool)

# ---------------------------------------------------------------------- helpers


def _is_c(u: UOp) -> bool:
    """An index-math constant (a tensor-graph CONST carries a DEVICE source and is left alone)."""
    return u.op is Ops.CONST and not u.src


def _node(op: Ops, dt: DType | None, src: tuple[UOp, ...]) -> UOp:
    return UOp(op, dt, src, None)


def _const(dt: DType, v: Any) -> UOp:
    return UOp.const(dt, v)


def _arg_order(a: Any) -> tuple[Any, ...]:
    # args of different Python types must still compare, so each kind gets its own rank
    if isinstance(a, bool):
        return (0, int(a))
    if isinstance(a, int):
        return (1, a)
    if isinstance(a, float):
        return (2, a)
    if isinstance(a, str):
        return (3, a)
    if isinstance(a, tuple):
        return (4, tuple(_arg_order(x) for x in a))
    if a is None:
        return (5,)
    return (6, repr(a))


_KEYS: weakref.WeakKeyDictionary[UOp, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def order_key(u: UOp) -> tuple[Any, ...]:
    """A deterministic structural sort key; sums and products order their parts by it."""
    k = _KEYS.get(u)
    if k is None:
        k = (u.op.value, _arg_order(u.arg), tuple(order_key(s) for s in u.src))
        _KEYS[u] = k
    return k


def _term(u: UOp) -> tuple[UOp, int]:
    """Split a summand into (base, integer coefficient)."""
    coef = 1
    while u.op is Ops.MUL:
        if _is_c(u.src[1]):
            coef, u = coef * u.src[1].arg, u.src[0]
        elif _is_c(u.src[0]):
            coef, u = coef * u.src[0].arg, u.src[1]
        else:
            break
    return u, coef


def sum_parts(u: UOp) -> tuple[dict[UOp, int], int]:
    """Flatten a sum into {base: coefficient} and an integer constant (like terms combined)."""
    terms: dict[UOp, int] = {}
    const = 0
    stack: list[tuple[UOp, int]] = [(u, 1)]
    while stack:
        n, m = stack.pop()
        if n.op is Ops.ADD:
            stack.extend((s, m) for s in n.src)
            continue
        if _is_c(n):
            const += int(n.arg) * m
            continue
        base, k = _term(n)
        if _is_c(base):
            const += int(base.arg) * k * m
        elif base.op is Ops.ADD:
            stack.append((base, k * m))
        else:
            terms[base] = terms.get(base, 0) + k * m
    return terms, const


def build_sum(dt: DType, terms: dict[UOp, int], const: int = 0) -> UOp:
    """The canonical sum of `terms` plus `const` (zero coefficients dropped)."""
    items = sorted(((b, k) for b, k in terms.items() if k != 0), key=lambda t: order_key(t[0]))
    out: UOp | None = None
    for base, k in items:
        t = base if k == 1 else _node(Ops.MUL, dt, (base, _const(dt, k)))
        out = t if out is None else _node(Ops.ADD, dt, (out, t))
    if out is None:
        return _const(dt, const)
    return out if const == 0 else _node(Ops.ADD, dt, (out, _const(dt, const)))


def _gcd_all(*xs: int) -> int:
    g = 0
    for x in xs:
        g = math.gcd(g, x)
    return g


def _tdiv(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


def _same_sign_split(x: UOp, rest: UOp) -> bool:
    """x = c*q + rest: truncating division splits as q + rest//c only if x and rest share a sign."""
    return (x.vmin >= 0 and rest.vmin >= 0) or (x.vmax <= 0 and rest.vmax <= 0)


def _strip_factor(base: UOp, factor: UOp) -> UOp | None:
    """base / factor when `factor` is one of base's multiplied factors, else None."""
    if base is factor:
        return _const(base.dtype, 1)  # type: ignore[arg-type]
    if base.op is not Ops.MUL:
        return None
    a, b = base.src
    if b is factor:
        return a
    if a is factor:
        return b
    inner = _strip_factor(a, factor)
    return None if inner is None else _node(Ops.MUL, base.dtype, (inner, b))


# ---------------------------------------------------------------------- rules: folding


def _fold_consts(x: UOp) -> UOp | None:
    if x.op not in ALU or not x.src or not all(_is_c(s) for s in x.src):
        return None
    try:
        return _const(x.dtype, exec_python_alu(x.op, x.dtype, tuple(s.arg for s in x.src)))  # type: ignore
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def _fold_bounds(x: UOp) -> UOp | None:
    """An integer or comparison whose bounds pin one value is that value."""
    if x.op not in ALU or x.dtype is None:
        return None
    if not (x.dtype in _SIGNED or (x.dtype.is_bool and x.op in COMPARISON)):
        return None
    if x.dtype.is_bool and any(s.dtype is None or not (s.dtype.is_int or s.dtype.is_bool) for s in x.src):
        return None  # float bounds are not tracked tightly enough to decide anything
    lo, hi = x.vmin, x.vmax
    if lo == hi and isinstance(lo, int):
        return _const(x.dtype, lo)
    return None


def _const_right(x: UOp) -> UOp | None:
    a, b = x.src
    if _is_c(a) and not _is_c(b):
        return UOp(x.op, x.dtype, (b, a), x.arg)
    return None


# ---------------------------------------------------------------------- rules: sums and products


def _symbolic_div_times_divisor(base: UOp) -> UOp | None:
    """The IDIV node of `(y // d) * d` (either operand order) for a non-constant d; else None."""
    if base.op is not Ops.MUL or _is_c(base.src[0]) or _is_c(base.src[1]):
        return None
    for div, other in ((base.src[0], base.src[1]), (base.src[1], base.src[0])):
        if div.op is Ops.IDIV and div.src[1] is other:
            return div
    return None


def _add(x: UOp) -> UOp | None:
    dt = x.dtype
    assert dt is not None
    terms, const = sum_parts(x)
    # (y//c)*c*k + (y%c)*k -> y*k: C division and remainder always recombine to the dividend
    changed = True
    while changed:
        changed = False
        for base, m in list(terms.items()):
            if m == 0:
                continue
            div = _symbolic_div_times_divisor(base)
            if div is not None:
                # (y//d)*d*k + (y%d)*k with a symbolic d (a sequence length): same identity, and d > 0
                mod = _node(Ops.MOD, dt, div.src)
                if terms.get(mod, 0) == m:
                    del terms[base]
                    del terms[mod]
                    inner, ic = sum_parts(div.src[0])
                    for b2, k2 in inner.items():
                        terms[b2] = terms.get(b2, 0) + k2 * m
                    const += ic * m
                    changed = True
                    break
                continue
            if base.op is not Ops.IDIV or not _is_c(base.src[1]):
                continue
            c = base.src[1].arg
            mod = _node(Ops.MOD, dt, base.src)
            k = terms.get(mod, 0)
            if c != 0 and k != 0 and m == c * k:
                del terms[base]
                del terms[mod]
                inner, ic = sum_parts(base.src[0])
                for b2, k2 in inner.items():
                    terms[b2] = terms.get(b2, 0) + k2 * k
                const += ic * k
                changed = True
                break
    out = build_sum(dt, terms, const)
    return None if out is x else out


def _mul(x: UOp) -> UOp | None:
    dt = x.dtype
    assert dt is not None
    factors: list[UOp] = []
    const = 1
    stack = [x]
    while stack:
        n = stack.pop()
        if n.op is Ops.MUL:
            stack.extend(n.src)
        elif _is_c(n):
            const *= int(n.arg)
        else:
            factors.append(n)
    if const == 0 or not factors:
        return _const(dt, const)
    factors.sort(key=order_key)
    if len(factors) == 1 and factors[0].op is Ops.ADD and const != 1:
        terms, c0 = sum_parts(factors[0])
        return build_sum(dt, {b: k * const for b, k in terms.items()}, c0 * const)
    out = factors[0]
    for f in factors[1:]:
        out = _node(Ops.MUL, dt, (out, f))
    if const != 1:
        out = _node(Ops.MUL, dt, (out, _const(dt, const)))
    return None if out is x else out


def _sub(x: UOp, a: UOp, b: UOp) -> UOp:
    return _node(Ops.ADD, x.dtype, (a, _node(Ops.MUL, x.dtype, (b, _const(x.dtype, -1)))))  # type: ignore


def _neg(x: UOp, a: UOp) -> UOp:
    return _node(Ops.MUL, x.dtype, (a, _const(x.dtype, -1)))  # type: ignore


# ---------------------------------------------------------------------- rules: division and remainder


def _idiv(x: UOp, n: UOp, d: UOp) -> UOp | None:
    dt = x.dtype
    assert dt is not None
    if not _is_c(d):
        return _idiv_symbolic(n, d)
    c = int(d.arg)
    if c == 0:
        return None
    if c < 0:  # trunc(n / -c) == -trunc(n / c)
        return _node(Ops.MUL, dt, (_node(Ops.IDIV, dt, (n, _const(dt, -c))), _const(dt, -1)))
    if c == 1:
        return n
    if n.op is Ops.IDIV and _is_c(n.src[1]) and n.src[1].arg > 0:
        # truncation composes: trunc(trunc(y/a)/c) == trunc(y/(a*c)) for a, c > 0
        return _node(Ops.IDIV, dt, (n.src[0], _const(dt, n.src[1].arg * c)))
    if n.op is Ops.MOD and _is_c(n.src[1]) and n.src[1].arg > 0 and n.src[1].arg % c == 0:
        # (y % (c*b)) // c == (y // c) % b in C semantics too (both sides keep the sign of y)
        return _node(Ops.MOD, dt, (_node(Ops.IDIV, dt, (n.src[0], d)), _const(dt, n.src[1].arg // c)))
    terms, k0 = sum_parts(n)
    g = _gcd_all(c, k0, *terms.values())
    if g > 1:  # the same rational number, so the same truncation
        return _node(Ops.IDIV, dt, (build_sum(dt, {b: k // g for b, k in terms.items()}, k0 // g),
                                  _const(dt, c // g)))
    q_terms = {b: k // c for b, k in terms.items() if k % c == 0}
    r_terms = {b: k for b, k in terms.items() if k % c != 0}
    for qc, rc in ((k0 // c, k0 % c), (0, k0)):
        if not q_terms and qc == 0:
            continue
        rest = build_sum(dt, r_terms, rc)
        if _same_sign_split(n, rest):
            return _node(Ops.ADD, dt, (build_sum(dt, q_terms, qc), _node(Ops.IDIV, dt, (rest, d))))
    split = _small_remainder(n, terms, k0, c)
    if split is not None:
        s, _, g = split
        return _node(Ops.IDIV, dt, (s, _const(dt, c // g)))
    return None


def _small_remainder(n: UOp, terms: dict[UOp, int], k0: int, c: int) -> tuple[UOp, UOp, int] | None:
    """n = g*s + r with g dividing c, 0 <= r < g and n, s >= 0: (s, r, g). Then n // c == s // (c/g)
    and n % c == g*(s % (c/g)) + r, because r/g < 1 never carries into the next multiple of c/g."""
    dt = n.dtype
    assert dt is not None
    if n.vmin < 0:
        return None
    for g in range(c // 2, 1, -1):
        if c % g:
            continue
        s_terms = {b: k // g for b, k in terms.items() if k % g == 0}
        if not s_terms:
            continue
        rest = build_sum(dt, {b: k for b, k in terms.items() if k % g}, k0 % g)
        s = build_sum(dt, s_terms, k0 // g)
        if 0 <= rest.vmin and rest.vmax < g and s.vmin >= 0:
            return s, rest, g
    return None


def _split_by_symbolic(n: UOp, d: UOp) -> tuple[UOp, UOp] | None:
    """n = d*q + rest with rest in [0, d): (q, rest), for a positive symbolic divisor d."""
    dt = n.dtype
    assert dt is not None
    if d.vmin <= 0 or n.vmin < 0:
        return None
    terms, k0 = sum_parts(n)
    q_terms: dict[UOp, int] = {}
    r_terms: dict[UOp, int] = {}
    for b, k in terms.items():
        q = _strip_factor(b, d)
        if q is None:
            r_terms[b] = k
        else:
            q_terms[q] = q_terms.get(q, 0) + k
    if not q_terms:
        return None
    rest = build_sum(dt, r_terms, k0)
    if rest.vmin < 0 or rest.vmax >= d.vmin:
        return None
    return build_sum(dt, q_terms), rest


def _idiv_symbolic(n: UOp, d: UOp) -> UOp | None:
    split = _split_by_symbolic(n, d)
    return None if split is None else split[0]


def _mod(x: UOp, n: UOp, d: UOp) -> UOp | None:
    dt = x.dtype
    assert dt is not None
    if not _is_c(d):
        split = _split_by_symbolic(n, d)
        return None if split is None else split[1]
    c = int(d.arg)
    if c == 0:
        return None
    if c < 0:  # the C remainder ignores the divisor's sign
        return _node(Ops.MOD, dt, (n, _const(dt, -c)))
    if c == 1:
        return _const(dt, 0)
    q_lo, q_hi = _tdiv(int(n.vmin), c), _tdiv(int(n.vmax), c)
    if q_lo == q_hi:  # one quotient over the whole range: the remainder is n minus a constant
        return n if q_lo == 0 else _node(Ops.ADD, dt, (n, _const(dt, -q_lo * c)))
    if n.op is Ops.MOD and _is_c(n.src[1]) and n.src[1].arg > 0 and n.src[1].arg % c == 0:
        return _node(Ops.MOD, dt, (n.src[0], d))
    terms, k0 = sum_parts(n)
    g = _gcd_all(c, k0, *terms.values())
    if g > 1:  # (g*y) % (g*e) == g * (y % e)
        inner = _node(Ops.MOD, dt, (build_sum(dt, {b: k // g for b, k in terms.items()}, k0 // g),
                                  _const(dt, c // g)))
        return _node(Ops.MUL, dt, (inner, _const(dt, g)))
    reduced = ({b: k % c for b, k in terms.items() if k % c != 0}, k0 % c)
    dropped = ({b: k for b, k in terms.items() if k % c != 0}, k0)
    for r_terms, rc in (reduced, dropped):
        if r_terms == terms and rc == k0:
            continue
        rest = build_sum(dt, r_terms, rc)
        if _same_sign_split(n, rest):
            return _node(Ops.MOD, dt, (rest, d))
    small = _small_remainder(n, terms, k0, c)
    if small is not None:
        s, rest, g = small
        inner = _node(Ops.MUL, dt, (_node(Ops.MOD, dt, (s, _const(dt, c // g))), _const(dt, g)))
        return _node(Ops.ADD, dt, (inner, rest))
    return None


# ---------------------------------------------------------------------- rules: comparisons and logic


def _cmplt(x: UOp, a: UOp, b: UOp) -> UOp | None:
    if a is b:
        return _const(dtypes.bool, False)
    if a.dtype not in _SIGNED:
        return None
    if _is_c(b) and not _is_c(a):
        return _lt_const(a, int(b.arg))
    if _is_c(a) and not _is_c(b):
        return _gt_const(b, int(a.arg))
    return None


def _lt_const(a: UOp, c: int) -> UOp | None:
    """Normalise `sum < c`: constant moved right, common factor divided out, small remainders dropped."""
    return _cmp_sum_const(a, c, sum_below=True)


def _gt_const(a: UOp, c: int) -> UOp | None:
    """Normalise `c < sum` the same way as `_lt_const`."""
    return _cmp_sum_const(a, c, sum_below=False)


def _cmp_sum_const(a: UOp, c: int, sum_below: bool) -> UOp | None:
    """`sum < c` (sum_below) or `c < sum`, rewritten over the sum's terms divided by a common factor.

    With integers: k*q + r < c  <=>  q < floor((c-1-r)/k) + 1, and c < k*q + r  <=>  floor((c-r)/k) < q;
    i.e. the bound is floor((c - d - r)/k) + d with d = 1 for `<` and 0 for `>`. It is decided when the
    bound is one value for every r in its range (r = 0 when a common factor divides every term)."""
    dt = a.dtype
    assert dt is not None
    terms, k0 = sum_parts(a)
    if not terms:
        return None
    c -= k0
    d = 1 if sum_below else 0

    def compare(q: UOp, bound: int) -> UOp:
        b = _const(dt, bound)
        return _node(Ops.CMPLT, dtypes.bool, (q, b) if sum_below else (b, q))

    g = _gcd_all(*terms.values())
    if k0 != 0 or g > 1:
        return compare(build_sum(dt, {b: k // g for b, k in terms.items()}), (c - d) // g + d)
    for k in sorted({abs(v) for v in terms.values() if abs(v) > 1}, reverse=True):
        q_terms = {b: v // k for b, v in terms.items() if v % k == 0}
        r_terms = {b: v for b, v in terms.items() if v % k != 0}
        if not q_terms or not r_terms:
            continue
        rest = build_sum(dt, r_terms)
        lo, hi = (c - d - int(rest.vmax)) // k + d, (c - d - int(rest.vmin)) // k + d
        if lo == hi:
            return compare(build_sum(dt, q_terms), lo)
    return None


def _cmp_eq_ne(x: UOp, a: UOp, b: UOp) -> UOp | None:
    is_eq = x.op is Ops.CMPEQ
    if a.dtype is None or not (a.dtype.is_int or a.dtype.is_bool):
        return None  # a float NaN is not equal to itself
    if a is b:
        return _const(dtypes.bool, is_eq)
    if _is_c(a) and not _is_c(b):
        return _node(x.op, x.dtype, (b, a))
    if a.vmax < b.vmin or b.vmax < a.vmin:
        return _const(dtypes.bool, not is_eq)
    if a.vmin == a.vmax == b.vmin == b.vmax:
        return _const(dtypes.bool, is_eq)
    if a.dtype in _SIGNED and _is_c(b):
        terms, k0 = sum_parts(a)
        c = int(b.arg) - k0
        g = _gcd_all(*terms.values())
        if terms and (k0 != 0 or g > 1):
            if c % g != 0:
                return _const(dtypes.bool, not is_eq)
            s = build_sum(a.dtype, {t: k // g for t, k in terms.items()})
            return _node(x.op, dtypes.bool, (s, _const(a.dtype, c // g)))
    return None


def _and(x: UOp, a: UOp, b: UOp) -> UOp | None:
    if x.dtype is not dtypes.bool:
        return None
    if a is b:
        return a
    for p, q in ((a, b), (b, a)):
        if _is_c(q):
            return p if q.arg else _const(dtypes.bool, False)
    return None


def _or(x: UOp, a: UOp, b: UOp) -> UOp | None:
    if x.dtype is not dtypes.bool:
        return None
    if a is b:
        return a
    for p, q in ((a, b), (b, a)):
        if _is_c(q):
            return _const(dtypes.bool, True) if q.arg else p
    return None


def _not(x: UOp, a: UOp) -> UOp | None:
    if x.dtype is dtypes.bool and a.op is Ops.NOT:
        return a.src[0]
    return None


def _where(c: UOp, a: UOp, b: UOp) -> UOp | None:
    if _is_c(c):
        return a if c.arg else b
    if a is b:
        return a
    if c.dtype is dtypes.bool and a.dtype is dtypes.bool and a.is_const(True) and b.is_const(False):
        return c
    return None


def _max(x: UOp, a: UOp, b: UOp) -> UOp | None:
    if a is b:
        return a
    if a.dtype is None or not a.dtype.is_int:
        return None
    if a.vmin >= b.vmax:
        return a
    if b.vmin >= a.vmax:
        return b
    return _const_right(x)


# ---------------------------------------------------------------------- the matcher

_ANY = UPat.var
symbolic = PatternMatcher([
    # constants and bounds first: they end the most work
    (UPat(tuple(ALU), dtype=_FOLDABLE, name="x"), _fold_consts),
    (UPat(tuple(ALU), name="x"), _fold_bounds),
    (UPat(Ops.WHERE, src=(_ANY("c"), _ANY("a"), _ANY("b"))), _where),
    # integer algebra
    (UPat(Ops.SUB, dtype=_SIGNED, src=(_ANY("a"), _ANY("b")), name="x"), _sub),
    (UPat(Ops.NEG, dtype=_SIGNED, src=(_ANY("a"),), name="x"), _neg),
    (UPat(Ops.ADD, dtype=_SIGNED, name="x"), _add),
    (UPat(Ops.MUL, dtype=_SIGNED, name="x"), _mul),
    (UPat(Ops.IDIV, dtype=_SIGNED, src=(_ANY("n"), _ANY("d")), name="x"), _idiv),
    (UPat(Ops.MOD, dtype=_SIGNED, src=(_ANY("n"), _ANY("d")), name="x"), _mod),
    (UPat(Ops.MAX, dtype=_SIGNED, src=(_ANY("a"), _ANY("b")), name="x"), _max),
    # comparisons and logic
    (UPat(Ops.CMPLT, src=(_ANY("a"), _ANY("b")), name="x"), _cmplt),
    (UPat((Ops.CMPNE, Ops.CMPEQ), src=(_ANY("a"), _ANY("b")), name="x"), _cmp_eq_ne),
    (UPat(Ops.AND, src=(_ANY("a"), _ANY("b")), name="x"), _and),
    (UPat(Ops.OR, src=(_ANY("a"), _ANY("b")), name="x"), _or),
    (UPat(Ops.NOT, src=(_ANY("a"),), name="x"), _not),
])


# simplify() results by input node. UOps are hash-consed and immutable, so a result stays valid; shape
# arithmetic asks for the same few expressions thousands of times per schedule when sizes are symbolic.
_simplified: dict[UOp, UOp] = {}
SIMPLIFY_CACHE_LIMIT = 1 << 16  # entries; the cache starts over beyond this (bounded memory)


def simplify(u: UOp) -> UOp:
    """Rewrite an index expression with the `symbolic` rules until nothing changes."""
    out = _simplified.get(u)
    if out is None:
        out = graph_rewrite(u, symbolic)
        if len(_simplified) >= SIMPLIFY_CACHE_LIMIT:
            _simplified.clear()
        _simplified[u] = out
        _simplified[out] = out  # a simplified expression is its own fixed point
    return out


def ssimplify_int(x: Any) -> Any:
    """Simplify a size: ints stay ints, a symbolic size is simplified and a constant becomes its int."""
    if isinstance(x, UOp):
        x = simplify(x)
        if _is_c(x):
            return x.arg
    return x


set_size_folder(ssimplify_int)  # ir's SHRINK shapes fold their symbolic sizes with these rules


def sym_infer(u: UOp | int, var_vals: dict[UOp, int]) -> int:
    """Evaluate an integer expression; DEFINE_VAR/RANGE/SPECIAL nodes take their value from `var_vals`
    and a BIND carries its own value."""
    if not isinstance(u, UOp):
        return int(u)
    vals: dict[UOp, Any] = {}
    stack: list[tuple[UOp, bool]] = [(u, False)]
    while stack:
        n, ready = stack.pop()
        if n in vals:
            continue
        if n in var_vals:
            vals[n] = var_vals[n]
        elif n.op is Ops.CONST:
            vals[n] = n.arg
        elif n.op is Ops.BIND:
            vals[n] = n.src[1].arg
        elif n.op in (Ops.DEFINE_VAR, Ops.RANGE, Ops.SPECIAL):
            raise ValueError(f"sym_infer: no value given for {n.render()}")
        elif not ready:
            stack.append((n, True))
            stack.extend((s, False) for s in n.src if s not in vals)
        else:
            if n.op not in ALU or n.dtype is None:
                raise ValueError(f"sym_infer cannot evaluate {n.op.name}")
            vals[n] = exec_python_alu(n.op, n.dtype, tuple(vals[s] for s in n.src))
    return vals[u]


def substitute_vars(u: UOp | int, mapping: dict[UOp, UOp | int]) -> UOp | int:
    """Replace variables (or any nodes) by expressions or ints and simplify; a constant result is an int."""
    if not isinstance(u, UOp):
        return u
    conv = {k: (v if isinstance(v, UOp) else UOp.const(k.dtype or dtypes.index, v))
            for k, v in mapping.items()}
    out = simplify(u.substitute(conv))
    return out.arg if _is_c(out) else out
