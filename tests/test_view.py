"""Views and ShapeTrackers: movement ops checked element by element against numpy."""
from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import pytest

from rawgrad.compiler.ir import Ops, UOp, Variable
from rawgrad.compiler.symbolic import sym_infer
from rawgrad.compiler.view import ShapeTracker, View
from rawgrad.dtype import dtypes


# ---------------------------------------------------------------------- a vectorized evaluator of index UOps
def np_eval(u: UOp, env: dict[UOp, Any]) -> np.ndarray:
    memo: dict[UOp, Any] = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            memo[n] = np.asarray(n.arg)
        elif n.op is Ops.DEFINE_VAR:
            memo[n] = env[n]
        elif n.op is Ops.BIND:
            memo[n] = np.asarray(n.src[1].arg)
        else:
            a = [memo[s] for s in n.src]
            if n.op in (Ops.IDIV, Ops.MOD):
                # C semantics: truncate toward zero, remainder takes the dividend's sign
                q = (np.abs(a[0]) // np.abs(a[1])) * np.where((a[0] < 0) == (a[1] < 0), 1, -1)
                memo[n] = q if n.op is Ops.IDIV else a[0] - a[1] * q
            elif n.op is Ops.WHERE:
                memo[n] = np.where(a[0], a[1], a[2])
            else:
                memo[n] = {
                    Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.CMPLT: np.less,
                    Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal, Ops.AND: np.logical_and,
                    Ops.OR: np.logical_or, Ops.NOT: np.logical_not,
                }[n.op](*a)
    return memo[u]


def gather(st: ShapeTracker, buf: np.ndarray, var_vals: dict[UOp, int] | None = None) -> np.ndarray:
    """Read every element of `st` from `buf` through its index expression (masked elements read 0)."""
    var_vals = var_vals or {}
    shape = tuple(sym_infer(s, var_vals) if isinstance(s, UOp) else s for s in st.shape)
    idx, valid = st.to_indexed_uops()
    if 0 in shape:
        return np.zeros(shape, buf.dtype)
    coords = np.indices(shape, dtype=np.int64)
    env: dict[UOp, Any] = dict(var_vals)
    env.update({Variable(f"idx{i}", 0, max(0, int(s.vmax if isinstance(s, UOp) else s) - 1)): coords[i]
                for i, s in enumerate(st.shape)})
    i = np.broadcast_to(np_eval(idx, env), shape)
    v = np.broadcast_to(np_eval(valid, env), shape).astype(bool)
    assert np.all((i[v] >= 0) & (i[v] < buf.size)), "a valid element reads outside the buffer"
    return np.where(v, buf[np.where(v, i, 0)], 0)


# ---------------------------------------------------------------------- random movement sequences
def _factor_shape(rng: random.Random, size: int) -> tuple[int, ...]:
    """A random shape with `size` elements (sometimes with size-1 dims)."""
    if size == 0:
        return tuple(rng.choice([0, 1, 2, 3]) for _ in range(rng.randint(1, 3))) + (0,)
    factors, n, p = [], size, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    rng.shuffle(factors)
    dims: list[int] = []
    for f in factors:
        if dims and rng.random() < 0.4:
            dims[-1] *= f
        else:
            dims.append(f)
    for _ in range(rng.randint(0, 2)):
        dims.insert(rng.randint(0, len(dims)), 1)
    return tuple(dims) or (1,)


def _random_op(rng: random.Random, st: ShapeTracker, ref: np.ndarray) -> tuple[ShapeTracker, np.ndarray, str]:
    shape = ref.shape
    k = rng.random()
    if k < 0.28:
        if rng.random() < 0.5:
            ns = _factor_shape(rng, ref.size)
        else:  # split or merge neighbouring dims: the cases a single view can often keep
            dims = list(shape)
            if len(dims) > 1 and rng.random() < 0.5:
                j = rng.randrange(len(dims) - 1)
                dims[j:j + 2] = [dims[j] * dims[j + 1]]
            else:
                ns_one = _factor_shape(rng, dims[0]) if dims else (1,)
                dims[0:1] = list(ns_one)
            ns = tuple(dims)
        if ref.size == 0:
            ns = tuple(shape)
        return st.reshape(ns), ref.reshape(ns), f"reshape{ns}"
    if k < 0.43:
        order = list(range(len(shape)))
        rng.shuffle(order)
        return st.permute(tuple(order)), ref.transpose(order), f"permute{tuple(order)}"
    if k < 0.53:
        ones = [i for i, s in enumerate(shape) if s == 1]
        if not ones:
            ns = _factor_shape(rng, ref.size) + (1,)
            return st.reshape(ns), ref.reshape(ns), f"reshape{ns}"
        new = tuple(rng.randint(1, 3) if i in ones else s for i, s in enumerate(shape))
        return st.expand(new), np.broadcast_to(ref, new), f"expand{new}"
    if k < 0.66:
        arg = tuple((rng.randint(0, 2), rng.randint(0, 2)) for _ in shape)
        return st.pad(arg), np.pad(ref, arg), f"pad{arg}"
    if k < 0.81:
        box: list[tuple[int, int]] = []
        for s in shape:
            b = rng.randint(0, s)
            e = rng.randint(b, s) if rng.random() < 0.02 else rng.randint(min(b + 1, s), s)
            box.append((b, e))
        sl = tuple(slice(b, e) for b, e in box)
        return st.shrink(tuple(box)), ref[sl], f"shrink{tuple(box)}"
    if k < 0.91:
        flags = tuple(rng.random() < 0.5 for _ in shape)
        axes = tuple(i for i, f in enumerate(flags) if f)
        return st.flip(flags), np.flip(ref, axes) if axes else ref, f"flip{flags}"
    steps = tuple(rng.choice([1, 1, 2, 3, -1, -2]) for _ in shape)
    sl = tuple(slice(None, None, s) for s in steps)
    return st.stride(steps), ref[sl], f"stride{steps}"


@pytest.mark.parametrize("seed", range(8))
def test_random_movement_matches_numpy(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        base_shape = _factor_shape(rng, rng.choice([1, 2, 6, 8, 12, 24, 30, 36, 48, 60, 64]))
        buf = np.arange(1, int(np.prod(base_shape)) + 1, dtype=np.int64)  # 0 means "masked"
        st, ref = ShapeTracker.from_shape(base_shape), buf.reshape(base_shape)
        log = [f"from_shape{base_shape}"]
        for _ in range(rng.randint(1, 6)):
            st, ref, what = _random_op(rng, st, ref)
            log.append(what)
            assert st.shape == ref.shape, log
            got = gather(st, buf)
            if not np.array_equal(got, ref):
                pytest.fail(f"{' -> '.join(log)}\nviews={st.views}\ngot\n{got}\nwant\n{ref}")
        # merging views must never change what is read
        assert np.array_equal(gather(st.simplify(), buf), ref)
        assert st.contiguous == (len(st.views) == 1 and st.views[0].contiguous)


@pytest.mark.parametrize("seed", range(4))
def test_random_composition_matches_numpy(seed: int) -> None:
    """st_a + st_b (b's movement applied on top of a), merged by `simplify`, against numpy."""
    rng = random.Random(50 + seed)
    for _ in range(60):
        base_shape = _factor_shape(rng, rng.choice([6, 8, 12, 24, 30, 36]))
        buf = np.arange(1, int(np.prod(base_shape)) + 1, dtype=np.int64)
        st_a, ref = ShapeTracker.from_shape(base_shape), buf.reshape(base_shape)
        log = [f"from_shape{base_shape}"]
        for _ in range(rng.randint(1, 3)):
            st_a, ref, what = _random_op(rng, st_a, ref)
            log.append(what)
        st_b = ShapeTracker.from_shape(ref.shape)
        log.append("+")
        for _ in range(rng.randint(1, 3)):
            st_b, ref, what = _random_op(rng, st_b, ref)
            log.append(what)
        both = st_a + st_b
        stacked = ShapeTracker(st_a.views + st_b.views)
        for st in (both, stacked, stacked.simplify()):
            got = gather(st, buf)
            if not np.array_equal(got, ref):
                pytest.fail(f"{' -> '.join(log)}\nviews={st.views}\ngot\n{got}\nwant\n{ref}")
        assert len(both.views) <= len(stacked.views)


def test_masked_views_merge_into_one() -> None:
    buf = np.arange(1, 25)
    # a padded, permuted view read through a flip: the validity becomes the merged view's mask
    v1 = View.create((4, 6)).pad(((1, 1), (0, 0))).permute((1, 0))
    v2 = View.create((6, 6)).flip((True, False)).shrink(((1, 6), (0, 5)))
    st = ShapeTracker((v1, v2))
    merged = st.simplify()
    assert len(merged.views) == 1 and merged.views[0].mask is not None
    want = np.flip(np.pad(buf.reshape(4, 6), ((1, 1), (0, 0))).T, 0)[1:6, 0:5]
    assert np.array_equal(gather(merged, buf), want)
    assert np.array_equal(gather(st, buf), want)
    # padding on top of padding
    v3 = View.create((6, 6)).pad(((0, 0), (2, 1)))
    merged2 = ShapeTracker((v1, v3)).simplify()
    assert len(merged2.views) == 1
    assert np.array_equal(gather(merged2, buf),
                          np.pad(np.pad(buf.reshape(4, 6), ((1, 1), (0, 0))).T, ((0, 0), (2, 1))))


def _numpy_can_reshape(v: View, buf: np.ndarray, new_shape: tuple[int, ...]) -> bool:
    arr = np.lib.stride_tricks.as_strided(buf[v.offset:], v.shape, tuple(s * buf.itemsize for s in v.strides))
    try:
        np.reshape(arr, new_shape, copy=False)
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("seed", range(3))
def test_reshape_keeps_one_view_whenever_numpy_can(seed: int) -> None:
    """numpy's no-copy reshape is the oracle for when one strided view can express a reshape."""
    rng = random.Random(100 + seed)
    checked = 0
    for _ in range(150):
        base_shape = _factor_shape(rng, rng.choice([6, 8, 12, 24, 36, 48]))
        buf = np.arange(int(np.prod(base_shape)), dtype=np.int64)
        v = View.create(base_shape)
        for _ in range(rng.randint(1, 3)):
            order = list(range(len(v.shape)))
            rng.shuffle(order)
            v = v.permute(tuple(order))
            if rng.random() < 0.3:
                v = v.flip(tuple(rng.random() < 0.5 for _ in v.shape))
            if rng.random() < 0.5:
                r = v.reshape(_factor_shape(rng, int(np.prod(v.shape))))
                v = r if r is not None else v
        ns = _factor_shape(rng, int(np.prod(v.shape)))
        ok = _numpy_can_reshape(v, buf, ns)
        r = v.reshape(ns)
        if ok:
            checked += 1
            assert r is not None, f"{v} -> {ns}: numpy reshapes without a copy"
        if r is not None:
            got = gather(ShapeTracker((r,)), buf)
            want = gather(ShapeTracker((v,)), buf).reshape(ns)
            assert np.array_equal(got, want)
    assert checked > 30


# ---------------------------------------------------------------------- single-view merging and index form
def test_reshape_round_trip_has_no_div_mod() -> None:
    st = ShapeTracker.from_shape((4, 6)).reshape((24,)).reshape((4, 6))
    assert len(st.views) == 1 and st.contiguous
    idx, valid = st.to_indexed_uops()
    assert idx.render() == "((idx0*6)+idx1)"
    assert valid.is_const(True)


@pytest.mark.parametrize("ops,final_shape", [
    ([("permute", (1, 0)), ("reshape", (3, 2, 4))], (3, 2, 4)),
    ([("reshape", (2, 2, 6)), ("permute", (2, 0, 1)), ("reshape", (6, 4))], (6, 4)),
    ([("reshape", (2, 12)), ("permute", (1, 0)), ("reshape", (3, 4, 2)), ("permute", (2, 0, 1))], (2, 3, 4)),
    ([("reshape", (24,)), ("reshape", (2, 3, 4)), ("permute", (1, 2, 0)), ("reshape", (3, 4, 2, 1))],
     (3, 4, 2, 1)),
    ([("pad", ((1, 1), (0, 0))), ("reshape", (36,))], (36,)),
    ([("shrink", ((1, 3), (0, 6))), ("reshape", (12,)), ("reshape", (2, 2, 3))], (2, 2, 3)),
    ([("reshape", (4, 1, 6)), ("expand", (4, 5, 6)), ("permute", (1, 0, 2)), ("reshape", (5, 24))], (5, 24)),
])
def test_chains_stay_one_view(ops: list[tuple[str, Any]], final_shape: tuple[int, ...]) -> None:
    buf = np.arange(1, 25, dtype=np.int64)
    st, ref = ShapeTracker.from_shape((4, 6)), buf.reshape(4, 6)
    for name, arg in ops:
        st = getattr(st, name)(arg)
        ref = {"permute": lambda r, a: r.transpose(a), "reshape": lambda r, a: r.reshape(a),
               "pad": lambda r, a: np.pad(r, a), "shrink": lambda r, a: r[tuple(slice(b, e) for b, e in a)],
               "expand": lambda r, a: np.broadcast_to(r, a)}[name](ref, arg)
    assert st.shape == final_shape
    assert len(st.views) == 1, st.views
    assert np.array_equal(gather(st, buf), ref)


def test_unmergeable_reshape_pushes_a_view_and_merges_back() -> None:
    st = ShapeTracker.from_shape((4, 6)).permute((1, 0)).reshape((24,))
    assert len(st.views) == 2
    idx, _ = st.to_indexed_uops()
    assert idx.render() == "((idx0//4)+((idx0%4)*6))"
    back = st.reshape((6, 4))
    assert len(back.views) == 1 and back.views[0].strides == (1, 6)


def test_simplify_merges_by_composition() -> None:
    # two views whose composition is one strided view: a permuted buffer read through a flip
    v1 = View.create((4, 6)).permute((1, 0))
    v2 = View.create((6, 4)).flip((True, False))
    st = ShapeTracker((v1, v2)).simplify()
    assert len(st.views) == 1
    buf = np.arange(1, 25)
    assert np.array_equal(gather(st, buf), np.flip(buf.reshape(4, 6).T, 0))
    # a pad inside a reshape that one view cannot express stays two views but reads right
    st2 = ShapeTracker.from_shape((3, 4)).pad(((0, 0), (1, 1))).permute((1, 0)).reshape((18,))
    want2 = np.pad(buf[:12].reshape(3, 4), ((0, 0), (1, 1))).T.reshape(18)
    assert np.array_equal(gather(st2, buf[:12]), want2)


def test_real_strides() -> None:
    st = ShapeTracker.from_shape((4, 6)).permute((1, 0))
    assert st.real_strides() == (1, 6)
    two = st.reshape((24,)).reshape((6, 2, 2))
    rs = two.real_strides()
    assert rs[0] == 1 and rs[2] == 6 and len(rs) == 3
    assert ShapeTracker.from_shape((4, 6)).consecutive_axes == (1,)


def test_create_canonicalises() -> None:
    v = View.create((1, 4, 1), (5, 1, 7))
    assert v.strides == (0, 1, 0) and v.contiguous
    assert View.create((4,), mask=((0, 4),)).mask is None
    empty = View.create((3, 4), mask=((0, 3), (2, 2)))
    assert empty.mask == ((0, 0), (0, 0))
    one = View.create((3, 4), (4, 1), mask=((1, 2), (0, 4)))
    assert one.strides == (0, 1) and one.offset == 4  # a single valid row reads like a broadcast


def test_errors_name_the_shapes() -> None:
    st = ShapeTracker.from_shape((2, 3))
    with pytest.raises(ValueError, match=r"\(0, 0\).*\(2, 3\)"):
        st.permute((0, 0))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 3\)"):
        st.expand((4, 3))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(7,\)"):
        st.reshape((7,))
    with pytest.raises(ValueError, match=r"out of range.*\(2, 3\)"):
        st.shrink(((0, 3), (0, 3)))
    with pytest.raises(ValueError, match=r"negative padding"):
        st.pad(((0, -1), (0, 0)))
    with pytest.raises(ValueError, match="negative size"):
        st.reshape((-1, -6))


def test_hashable_and_picklable() -> None:
    seq = Variable("seq", 1, 16)
    st = ShapeTracker.from_shape((seq, 4)).permute((1, 0)).pad(((0, 0), (1, 0)))
    same = ShapeTracker.from_shape((seq, 4)).permute((1, 0)).pad(((0, 0), (1, 0)))
    assert st == same and hash(st) == hash(same)
    assert pickle.loads(pickle.dumps(st)) == st
    # usable as a UOp arg (hash-consed by value)
    assert UOp(Ops.VIEW, None, (), st) is UOp(Ops.VIEW, None, (), same)


def test_add_composes() -> None:
    a = ShapeTracker.from_shape((4, 6)).permute((1, 0))
    b = ShapeTracker.from_shape((6, 4)).reshape((24,)).shrink(((2, 10),))
    buf = np.arange(1, 25)
    assert np.array_equal(gather(a + b, buf), buf.reshape(4, 6).T.reshape(24)[2:10])
    with pytest.raises(ValueError):
        _ = ShapeTracker.from_shape((2, 2)) + ShapeTracker.from_shape((5,))


# ---------------------------------------------------------------------- symbolic shapes
def test_symbolic_contiguous_reshape_and_shrink() -> None:
    seq = Variable("seq", 1, 128)
    st = ShapeTracker.from_shape((seq, 4)).reshape((seq * 4,))
    assert st.contiguous and st.shape[0] is (seq * 4)
    back = st.reshape((seq, 2, 2))
    assert back.contiguous
    cache = ShapeTracker.from_shape((128, 64)).shrink(((0, seq), (0, 64)))
    assert cache.contiguous and cache.shape == (seq, 64)
    split = cache.reshape((seq, 4, 16))
    assert len(split.views) == 1 and split.views[0].strides == (64, 16, 1)


@pytest.mark.parametrize("n", [1, 3, 7])
def test_symbolic_movement_matches_numpy(n: int) -> None:
    seq = Variable("seq", 1, 8)
    vv = {seq: n}
    buf = np.arange(1, 8 * 6 + 1, dtype=np.int64)
    cases = [
        (ShapeTracker.from_shape((8, 6)).shrink(((0, seq), (0, 6))), buf.reshape(8, 6)[:n]),
        (ShapeTracker.from_shape((8, 6)).shrink(((0, seq), (0, 6))).permute((1, 0)), buf.reshape(8, 6)[:n].T),
        (ShapeTracker.from_shape((1, 6)).expand((seq, 6)), np.broadcast_to(buf[:6].reshape(1, 6), (n, 6))),
        (ShapeTracker.from_shape((seq, 6)).pad(((0, 8 - seq), (1, 0))), np.pad(buf[:n * 6].reshape(n, 6),
                                                                                 ((0, 8 - n), (1, 0)))),
        (ShapeTracker.from_shape((seq, 6)).reshape((seq * 6,)).reshape((seq, 3, 2)).permute((2, 1, 0)),
         buf[:n * 6].reshape(n, 3, 2).transpose(2, 1, 0)),
        (ShapeTracker.from_shape((seq, 6)).flip((True, False)), np.flip(buf[:n * 6].reshape(n, 6), 0)),
    ]
    for st, want in cases:
        assert np.array_equal(gather(st, buf, vv), want), st


def test_to_indexed_uops_takes_given_indices() -> None:
    r0, r1 = Variable("r0", 0, 3), Variable("r1", 0, 5)
    st = ShapeTracker.from_shape((6, 4)).permute((1, 0))
    idx, valid = st.to_indexed_uops([r0, r1])
    assert idx.render() == "(r0+(r1*4))" and valid.is_const(True)
    idx2, valid2 = ShapeTracker.from_shape((4,)).pad(((2, 0),)).to_indexed_uops([r1])
    assert idx2.render() == "(r1+-2)" and valid2.render() == "(1<r1)"


def test_head_split_permute_expand_with_symbolic_length_is_one_view() -> None:
    # attention: (B, T, 384) -> (B, T, 12, 32) -> (B, 12, T, 32) -> (B, 12, T, 1, 32) -> expand over keys.
    # Composing these must not leave a second view (a second view means div/mod by T per element).
    t = Variable("T", 1, 64)
    head_split = ShapeTracker.from_shape((2, t, 12, 32)).permute((0, 2, 1, 3))
    q = ShapeTracker.from_shape((2, t, 384)) + ShapeTracker.from_shape((2, t, 384)).reshape((2, t, 12, 32)) \
        .permute((0, 2, 1, 3))
    assert len(q.views) == 1
    both = head_split + ShapeTracker.from_shape((2, 12, t, 32)).reshape((2, 12, t, 1, 32)) \
        .expand((2, 12, t, t, 32))
    assert len(both.views) == 1
    strides = both.views[0].strides
    assert strides[1] == 32 and strides[3] == 0 and strides[4] == 1
    for tv in (1, 5, 17):
        idx, _ = both.to_indexed_uops([UOp.const(dtypes.index, v) for v in (1, 3, tv - 1, 0, 7)])
        # element (b=1, h=3, t=tv-1, d=7) of the (2, T, 12, 32) buffer
        assert sym_infer(idx, {t: tv}) == ((1 * tv + tv - 1) * 12 + 3) * 32 + 7
