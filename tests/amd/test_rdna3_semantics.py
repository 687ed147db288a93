"""Lane-wise VALU semantics of the RDNA3 interpreter that the current corpus does not reach (the renderer's
output changes; these keep working when it starts emitting them again), checked against numpy; and every
VALU mnemonic of the generated table has semantics."""
from __future__ import annotations

import struct
from fractions import Fraction

import numpy as np
import pytest

from rawgrad.drivers.amd.mock.rdna3 import corpus, interp
from rawgrad.drivers.amd.mock.rdna3.decode import mnemonic_base
from rawgrad.drivers.amd.mock.rdna3.optable import OPTABLE
from rawgrad.drivers.amd.mock.rdna3.optable_ops import OPTABLE_OPS
from tests.amd.test_rdna3_interp import Buffers, _groups

RNG = np.random.default_rng(11)
F32 = (RNG.standard_normal(64) * 10).astype(np.float32)
G32 = (RNG.standard_normal(64) * 10).astype(np.float32)
U32 = RNG.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
V32 = RNG.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
W32 = RNG.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
I32, J32, K32 = U32.view(np.int32), V32.view(np.int32), W32.view(np.int32)
U16, V16 = U32.astype(np.uint16), V32.astype(np.uint16)
I16, J16 = U16.view(np.int16), V16.view(np.int16)
F64, G64 = F32.astype(np.float64) * 1.1, G32.astype(np.float64) * 0.9
H16, K16 = F32.astype(np.float16), G32.astype(np.float16)


def _s24(x: np.ndarray) -> np.ndarray:
    low = (x & 0xFFFFFF).astype(np.int64)
    return np.where(low >= 2**23, low - 2**24, low)


def _bfe_i32_ref(a: int, off: int, width: int) -> int:
    if width == 0:
        return 0
    field = (a >> off) & ((1 << width) - 1)
    value = field - (1 << width) if field >> (width - 1) else field
    return (value + 2**31) % 2**32 - 2**31  # as int32 (a field of 32 bits would not fit otherwise)


def _fn(name: str):  # type: ignore[no-untyped-def]
    return interp._VALU[name].fn


CASES = [
    ("v_ceil_f32", (F32,), np.ceil(F32)),
    ("v_rndne_f32", (F32,), np.rint(F32)),
    ("v_trunc_f32", (F32,), np.trunc(F32)),
    ("v_subrev_f32", (F32, G32), G32 - F32),
    ("v_ceil_f64", (F64,), np.ceil(F64)),
    ("v_max_f64", (F64, G64), np.maximum(F64, G64)),
    ("v_min_f64", (F64, G64), np.minimum(F64, G64)),
    ("v_sqrt_f64", (np.abs(F64),), np.sqrt(np.abs(F64))),
    ("v_cvt_i32_f64", (F64,), np.trunc(F64).astype(np.int32)),
    ("v_sub_f16", (H16, K16), H16 - K16),
    ("v_min_f16", (H16, K16), np.minimum(H16, K16)),
    ("v_min3_i32", (I32, J32, K32), np.minimum(np.minimum(I32, J32), K32)),
    ("v_max3_u32", (U32, V32, W32), np.maximum(np.maximum(U32, V32), W32)),
    ("v_min3_u32", (U32, V32, W32), np.minimum(np.minimum(U32, V32), W32)),
    ("v_min_u32", (U32, V32), np.minimum(U32, V32)),
    ("v_or3_b32", (U32, V32, W32), U32 | V32 | W32),
    ("v_xor3_b32", (U32, V32, W32), U32 ^ V32 ^ W32),
    ("v_xad_u32", (U32, V32, W32), (U32 ^ V32) + W32),
    ("v_not_b32", (U32,), ~U32),
    ("v_subrev_nc_u32", (U32, V32), V32 - U32),
    ("v_mul_u32_u24", (U32, V32), (U32 & 0xFFFFFF) * (V32 & 0xFFFFFF)),
    ("v_bfe_u32", (U32, V32, W32), (U32 >> (V32 & 31)) & ((np.uint32(1) << (W32 & 31)) - np.uint32(1))),
    ("v_mul_hi_i32_i24", (U32, V32), ((_s24(U32) * _s24(V32)) >> 32).astype(np.int32)),
    ("v_mul_hi_u32_u24", (U32, V32), (((U32 & 0xFFFFFF).astype(np.uint64) * (V32 & 0xFFFFFF)) >> 32)
     .astype(np.uint32)),
    ("v_mul_i32_i24", (U32, V32), (_s24(U32) * _s24(V32)).astype(np.int32)),
    ("v_bfe_i32", (U32, V32, W32), np.array([_bfe_i32_ref(int(a), int(b) & 31, int(c) & 31)
                                              for a, b, c in zip(U32, V32, W32)], np.int32)),
    ("v_xor_b16", (U16, V16), U16 ^ V16),
    ("v_lshlrev_b16", (U16, V16), V16 << (U16 & 15)),
    ("v_trunc_f16", (H16,), np.trunc(H16)),
    ("v_max_i16", (I16, J16), np.maximum(I16, J16)),
    ("v_min_u16", (U16, V16), np.minimum(U16, V16)),
    ("v_max3_i16", (I16, J16, I16 // 3), np.maximum(np.maximum(I16, J16), I16 // 3)),
    ("v_min3_u16", (U16, V16, U16 // 3), np.minimum(np.minimum(U16, V16), U16 // 3)),
    ("v_med3_u16", (U16, V16, U16 // 3), np.median(np.stack([U16, V16, U16 // 3]), axis=0).astype(np.uint16)),
    ("v_bcnt_u32_b32", (U32, V32), np.array([bin(int(x)).count("1") for x in U32], np.uint32) + V32),
    ("v_mad_i32_i24", (U32, V32, K32), (_s24(U32) * _s24(V32) + K32).astype(np.int32)),
    ("v_fmamk_f32", (F32, G32, F32), (F32.astype(np.float64) * G32 + F32).astype(np.float32)),
    ("v_fmaak_f32", (F32, G32, F32), (F32.astype(np.float64) * G32 + F32).astype(np.float32)),
]


@pytest.mark.parametrize("name,args,want", CASES, ids=[c[0] for c in CASES])
def test_valu_semantics(name: str, args: tuple, want: np.ndarray) -> None:
    with np.errstate(over="ignore"):
        got = np.asarray(_fn(name)(*args))
    np.testing.assert_array_equal(got, np.asarray(want).astype(got.dtype))


def test_fma_f16_rounds_once() -> None:
    a, b, c = H16, K16, (F32 / 7).astype(np.float16)
    want = np.array([float(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                     for x, y, z in zip(a, b, c)]).astype(np.float16)  # via float64: may round twice
    got = _fn("v_fma_f16")(a, b, c)
    assert (np.abs(got.astype(np.float64) - want.astype(np.float64)) <= np.spacing(np.abs(want))).all()
    assert (got == want).mean() > 0.95


def test_rsq_is_close() -> None:
    x = np.abs(F32) + np.float32(0.5)
    np.testing.assert_allclose(_fn("v_rsq_f32")(x), 1 / np.sqrt(x.astype(np.float64)), rtol=1e-7)


def test_tables_agree() -> None:
    """The corpus table and the exhaustive one (op test kernels) name every shared key alike."""
    shared = OPTABLE.keys() & OPTABLE_OPS.keys()
    assert shared and [k for k in shared if OPTABLE[k] != OPTABLE_OPS[k]] == []


def test_every_table_valu_mnemonic_has_semantics() -> None:
    valu = sorted({mnemonic_base(m) for (fmt, _), m in [*OPTABLE.items(), *OPTABLE_OPS.items()]
                   if fmt in ("VOP1", "VOP2", "VOPC", "VOP3", "VOP3P", "VOPDX", "VOPDY")})
    assert valu and [b for b in valu if not interp._semantics_known(b)] == []


def _exact_fma(a: float, b: float, c: float) -> float:
    """a*b + c rounded once (Fraction arithmetic; an exact zero takes IEEE's sign rule)."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c if a * b != 0 or c != 0 else (-0.0 if np.signbit(a * b) and np.signbit(c) else 0.0)
    try:
        return float(exact)
    except OverflowError:
        return np.inf if exact > 0 else -np.inf


def _nearest_f32(exact: Fraction) -> np.float32:
    """The float32 nearest to an exact (finite, in range) value, ties to even: no detour through float64."""
    guess = np.float32(float(exact))
    around = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    return min(around, key=lambda f: (abs(Fraction(float(f)) - exact), int(np.array(f).view(np.uint32)) & 1))


def test_fma32_round_to_odd_with_a_tiny_addend() -> None:
    # (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 is a float32 tie; + 2^-80 must round it up. The float64 sum rounds
    # the addend away (|err| < half an ulp), so only the error's sign can steer the round-to-odd step.
    a = np.array([1 + 2**-12, -(1 + 2**-12)], np.float32)
    c = np.array([2.0**-80, -(2.0**-80)], np.float32)
    got = interp._fma32(a, np.abs(a), c)
    want = np.array([_nearest_f32(Fraction(float(x)) * abs(Fraction(float(x))) + Fraction(float(z)))
                     for x, z in zip(a, c)], np.float32)
    np.testing.assert_array_equal(got, want)
    assert got[0] == np.float32(1 + 2**-11 + 2**-23)


def test_fma64_is_rounded_once() -> None:
    rng = np.random.default_rng(3)
    n = 3000

    def rnd(lo: int, hi: int) -> np.ndarray:
        return np.ldexp(rng.uniform(1, 2, n), rng.integers(lo, hi, n)) * rng.choice([-1, 1], n)
    cases = []
    for lo, hi in ((-1074, 1000), (-40, 40), (-1074, -900)):
        a, b, c = rnd(lo, hi), rnd(lo, hi), rnd(lo, hi)
        with np.errstate(all="ignore"):
            c[::3] = -(a[::3] * b[::3])  # cancellation: the result is the product's rounding error
            b[1::3] = np.round(b[1::3] * 2**20) / 2**20  # short mantissas: exact ties
        cases.append((a, b, c))
    # signed zeros, infinities, NaN, an exact product beyond the largest double, a product that underflows
    cases.append((np.array([0.0, 2.0, -0.0, np.inf, 1.0, 1e308, 1e308, 2.0**-600]),
                  np.array([-1.0, 3.0, 5.0, 0.0, np.inf, 10.0, 10.0, -(2.0**-600)]),
                  np.array([-0.0, -6.0, -0.0, 1.0, -np.inf, -np.inf, -1e308, 0.0])))
    for a, b, c in cases:
        ok = np.isfinite(a) & np.isfinite(b) & np.isfinite(c) if len(a) == n else np.ones(len(a), bool)
        a, b, c = a[ok], b[ok], c[ok]
        got = interp._fma64(a, b, c)
        with np.errstate(all="ignore"):
            want = np.array([_exact_fma(float(x), float(y), float(z)) if np.isfinite([x, y, z]).all()
                             else float(x) * float(y) + float(z) if not np.isfinite([x, y]).all()
                             else float(z) for x, y, z in zip(a, b, c)])
        same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
        bad = zip(a[~same], b[~same], c[~same], got[~same], want[~same])
        assert same.all(), [tuple(v.hex() for v in row) for row in bad][:3]


# ---------------------------------------------------------------- bit counts, byte permutes, packed f16, SALU
# Edge values: zero, all ones, the sign bit alone, the largest positive, single high bits, alternating bits.
EDGE32 = np.array([0, 0xFFFFFFFF, 1, 0x80000000, 0x7FFFFFFF, 0x40000000, 0xC0000000, 0xBFFFFFFF, 0x55555555,
                   0xAAAAAAAA, 0x00010000, 0xFFFF0000, 2, 0xFFFFFFFE], np.uint32)


def _clz_ref(x: int) -> int:
    return 32 - x.bit_length()


def _ctz_ref(x: int) -> int:
    return 32 if x == 0 else (x & -x).bit_length() - 1


def _cls_ref(x: int) -> int:
    """RDNA3 V_CLS_I32 pseudocode: D = -1; for i in 1..31: if S0[31 - i] != S0[31]: D = i; break."""
    sign = x >> 31
    for i in range(1, 32):
        if (x >> (31 - i)) & 1 != sign:
            return i
    return -1


def _perm_ref(s0: int, s1: int, sel: int) -> int:
    """RDNA3 V_PERM_B32 pseudocode (BYTE_PERMUTE over the bytes of {S0, S1}, S1 the low four)."""
    data = (s0 << 32) | s1
    out = 0
    for k in range(4):
        b = (sel >> (8 * k)) & 0xFF
        if b >= 13:
            byte = 0xFF
        elif b == 12:
            byte = 0
        elif b >= 8:
            byte = 0xFF * ((data >> (8 * (2 * (b - 8) + 1) + 7)) & 1)
        else:
            byte = (data >> (8 * b)) & 0xFF
        out |= byte << (8 * k)
    return out


def test_bit_count_helpers_match_the_isa_pseudocode() -> None:
    xs = np.concatenate([EDGE32, U32])
    as_i32 = lambda v: np.asarray(v).astype(np.uint32).view(np.int32)  # noqa: E731
    np.testing.assert_array_equal(as_i32(interp._clz_i32_u32(xs)),
                                  [-1 if x == 0 else _clz_ref(int(x)) for x in xs])
    np.testing.assert_array_equal(as_i32(interp._ctz_i32_b32(xs)),
                                  [-1 if x == 0 else _ctz_ref(int(x)) for x in xs])
    np.testing.assert_array_equal(as_i32(interp._cls_i32(xs)), [_cls_ref(int(x)) for x in xs])


def test_perm_b32_every_selector() -> None:
    sel = np.arange(256, dtype=np.uint32)
    sel = sel | (sel[::-1] << np.uint32(8)) | (((sel * 7) % 256) << np.uint32(16)) \
        | (((sel * 13) % 16) << np.uint32(24))
    s0 = np.resize(np.concatenate([EDGE32, U32]), sel.size)
    s1 = np.resize(np.concatenate([V32, EDGE32[::-1]]), sel.size)
    want = [_perm_ref(int(a), int(b), int(c)) for a, b, c in zip(s0, s1, sel)]
    np.testing.assert_array_equal(interp._perm_b32(s0, s1, sel), np.array(want, np.uint32))


def _nearest(exact: Fraction, dtype: type) -> float:
    """The `dtype` float nearest to an exact finite value, ties to even (no detour through float64)."""
    big = np.finfo(dtype).max
    if abs(exact) >= Fraction(float(big)) + Fraction(float(big - np.nextafter(big, dtype(0)))) / 2:
        return dtype(np.inf) if exact > 0 else dtype(-np.inf)  # past the largest finite by half an ulp
    guess = np.array(float(exact)).astype(dtype)
    around = [np.nextafter(guess, dtype(-np.inf)), guess, np.nextafter(guess, dtype(np.inf))]
    bits = {np.float16: np.uint16, np.float32: np.uint32}[dtype]
    finite = [f for f in around if np.isfinite(f)]
    return min(finite, key=lambda f: (abs(Fraction(float(f)) - exact), int(np.array(f).view(bits)) & 1))


def _maxnum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE maxNum for inputs without a (+0, -0) pair: a NaN operand gives the other one."""
    return np.where(np.isnan(b) | (a > b), a, b)


def _minnum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.isnan(b) | (a < b), a, b)


def _halves(rng: np.random.Generator, n: int) -> np.ndarray:
    h = (rng.standard_normal(2 * n) * 8).astype(np.float16)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 6.1e-5, -3e-7, 65504, 1.0], np.float16)
    h[: min(h.size, special.size)] = special[: h.size]
    return h


@pytest.mark.parametrize("n", [1, 37, 100])
def test_bits_and_packed_f16_kernel(n: int) -> None:
    """The corpus kernel bits_packed (LLVM's v_mad_u32_u24, v_clz/v_ctz/v_cls/v_perm and v_pk_*_f16 with
    op_sel and neg)
    against the ISA pseudocode and exactly rounded f16 math; lanes past n (EXEC off) write nothing."""
    rng = np.random.default_rng(40 + n)
    rand = rng.integers(0, 2**32, 2 * n, dtype=np.uint64).astype(np.uint32)
    a = np.resize(np.concatenate([EDGE32, rand[:n]]), n)
    b = np.resize(np.concatenate([EDGE32[::-1], rand[n:]]), n)
    c = rng.integers(0, 16, 4 * n).astype(np.uint8).view(np.uint32)  # selector bytes 0..15
    c[::3] = rng.integers(0, 2**32, c[::3].size, dtype=np.uint64).astype(np.uint32)
    ha, hb = _halves(rng, n), _halves(np.random.default_rng(90 + n), n)[::-1].copy()
    hb[(ha == 0) & (hb == 0)] = np.float16(2)  # no (+0, -0) pairs: maxnum may return either
    hb[np.isnan(ha) & np.isnan(hb)] = np.float16(3)
    m = Buffers()
    pad = 8  # extra slots: the launch covers 64 lanes, only n may store
    out, outh = m.out(6 * n + pad, np.uint32), m.out(2 * (5 * n + pad), np.float16)
    args = struct.pack("<7Qi", out, outh, m.put(a), m.put(b), m.put(c), m.put(ha), m.put(hb), n)
    interp.run(corpus.program("bits_packed"), m.mem, args, _groups(n), (64, 1, 1))
    got = m.get(out, np.uint32).reshape(-1)
    want = np.array([[((int(x) & 0xFFFFFF) * (int(y) >> 8) + int(z)) & 0xFFFFFFFF,
                      min(_clz_ref(int(x)), 32), _ctz_ref(int(y)), _cls_ref(int(x)) & 0xFFFFFFFF,
                      _perm_ref(int(x), int(y), int(z)), _cls_ref(int(y)) & 0xFFFFFFFF]
                     for x, y, z in zip(a, b, c)], np.uint32).reshape(-1)
    np.testing.assert_array_equal(got[: 6 * n], want)
    assert (got[6 * n:] == 0xABABABAB).all()  # lanes n.. of the last wave are off in EXEC: untouched
    x, y = ha.reshape(n, 2), hb.reshape(n, 2)
    ys = y[:, ::-1]
    with np.errstate(all="ignore"):
        fma = np.array([[_nearest(Fraction(float(p)) * Fraction(float(q)) + Fraction(float(r)), np.float16)
                         if np.isfinite([p, q, r]).all() and np.isfinite(float(p) * float(q) + float(r))
                         else np.float16(np.float32(p) * np.float32(q) + np.float32(r))
                         for p, q, r in zip(xx, qq, rr)] for xx, qq, rr in zip(x, ys, y)], np.float16)
        want_h = np.stack([_maxnum(x, ys), _minnum(x, y), x - y, x * y, fma], axis=1).reshape(-1)
    got_h = m.get(outh, np.float16)
    same = (got_h[: 10 * n] == want_h) | (np.isnan(got_h[: 10 * n]) & np.isnan(want_h))
    same &= (np.signbit(got_h[: 10 * n]) == np.signbit(want_h)) | np.isnan(want_h)
    assert same.all(), (np.nonzero(~same)[0][:5], got_h[: 10 * n][~same][:5], want_h[~same][:5])
    assert (got_h[10 * n:].view(np.uint16) == 0xABAB).all()


def _salu_ref(a: int, b: int, c: int, d: int) -> list[int]:
    """What scalar_ops stores for i32 arguments a, b (as unsigned 32-bit) and i64 c, d."""
    sa, sb = a - (1 << 32) * (a >> 31), b - (1 << 32) * (b >> 31)
    u = 0xFFFFFFFF
    x0 = (a + b) & u
    return [(a * b) >> 32, ((sa * sb) >> 32) & u, ((a << 1) + b) & u, ((b << 2) + a) & u,
            a & ~(1 << (b & 31)) & u, a | (1 << (b & 31)), (sa * 1000) & u,
            b if sa == 1000 else 77, a if b < 4000 else 99, b if sa > -300 else 55,
            _clz_ref(a), _ctz_ref(b), _cls_ref(a) & u, a if c == d else b, b if c != d else 3,
            _cls_ref(b) & u,
            (((x0 & ~(1 << 16)) | (1 << 20)) * 1000) & u, x0 & ~(1 << 16), ((a - b) & u) | (1 << 20)]


@pytest.mark.parametrize("a,b,c,d", [(1000, 5000, 7, 7), (0xFFFFFFF9, 3, -1, 1 << 40),
                                     (0x80000000, 0xFFFFFFFF, 0, 0), (0, 0, 2**63 - 1, -(2**63)),
                                     (0xFFFFFED4, 3999, 5, 4), (0x7FFFFFFF, 31, 9, 9),
                                     (1000, 4000, 1 << 33, (1 << 33) + 1)])
def test_scalar_ops_kernel(a: int, b: int, c: int, d: int) -> None:
    """The corpus kernel scalar_ops: LLVM's s_mul_hi_u32/i32, s_lshl1/2_add_u32, s_bitset0/1_b32,
    s_mulk_i32, s_cmpk_eq_i32/lt_u32/gt_i32, s_clz/ctz/cls, s_cmp_eq_u64 on uniform kernel arguments."""
    m = Buffers()
    out = m.out(20, np.uint32)
    args = struct.pack("<QIIqq", out, a, b, c, d)
    interp.run(corpus.program("scalar_ops"), m.mem, args, (1, 1, 1), (64, 1, 1))
    np.testing.assert_array_equal(m.get(out, np.uint32)[:19], np.array(_salu_ref(a, b, c, d), np.uint64))
    assert m.get(out, np.uint32)[19] == 0xABABABAB


@pytest.mark.parametrize("n", [1, 45, 100])
def test_minmax3_kernel(n: int) -> None:
    """The corpus kernel minmax3: LLVM's v_max3_f32 / v_min3_f32 (IEEE maxNum: a quiet NaN loses to a
    number), v_med3_i32 (a clamp to [-1e6, 1e6] of a's bits) and v_pk_mul_lo_u16 (two wrapping 16-bit
    products); lanes past n write nothing."""
    rng = np.random.default_rng(70 + n)
    a, b, c = ((rng.standard_normal(n) * 1e3).astype(np.float32) for _ in range(3))
    special = np.array([np.nan, -np.inf, np.inf, 1e-40, -0.0, 3.0], np.float32)  # no (+0, -0) pairs
    a[: min(n, 6)], b[: min(n, 6)] = special[: min(n, 6)], special[::-1][: min(n, 6)]
    # bit patterns near the clamp bounds (as floats: subnormals and NaNs' neighbours, compared by bits)
    edges = np.array([5000, -5000, 999_999, 1_000_001, -1_000_000, -1_000_001], np.int32)
    a.view(np.int32)[1::7] = np.resize(edges, a[1::7].size)
    m = Buffers()
    out = m.out(4 * n + 8, np.uint32)
    interp.run(corpus.program("minmax3"), m.mem, struct.pack("<4Qi", out, m.put(a), m.put(b), m.put(c), n),
               _groups(n), (64, 1, 1))
    got = m.get(out, np.uint32)
    with np.errstate(invalid="ignore"):
        mx = _maxnum(_maxnum(a, b), c).astype(np.float32)
        mn = _minnum(_minnum(a, b), c).astype(np.float32)
    ia = a.view(np.int32).astype(np.int64)
    med = np.clip(ia, -1_000_000, 1_000_000).astype(np.int32).view(np.uint32)
    hb = b.view(np.uint16).astype(np.uint32).reshape(n, 2)
    hc = c.view(np.uint16).astype(np.uint32).reshape(n, 2)
    prod = (hb * hc) & 0xFFFF
    pk = (prod[:, 0] | (prod[:, 1] << 16)).astype(np.uint32)
    want = np.stack([mx.view(np.uint32), mn.view(np.uint32), med, pk], axis=1).reshape(-1)
    got_f = got[: 4 * n].reshape(n, 4)[:, :2].view(np.float32)
    nan = np.isnan(np.stack([mx, mn], axis=1))
    assert (np.isnan(got_f) == nan).all()  # NaN only where every input was NaN
    got_cmp = got[: 4 * n].reshape(n, 4).copy()
    got_cmp[:, :2][nan] = want.reshape(n, 4)[:, :2][nan]  # NaN payloads are not compared
    np.testing.assert_array_equal(got_cmp.reshape(-1), want)
    assert (got[4 * n:] == 0xABABABAB).all()


def test_med3_u32_and_min3_f32() -> None:
    def median(*xs: np.ndarray) -> np.ndarray:
        return np.median(np.stack(xs).astype(np.float64), axis=0)  # exact: the middle of three integers
    np.testing.assert_array_equal(_fn("v_med3_u32")(U32, V32, W32), median(U32, V32, W32).astype(np.uint32))
    np.testing.assert_array_equal(_fn("v_med3_i32")(I32, J32, K32), median(I32, J32, K32).astype(np.int32))
    h = F32 * 2
    np.testing.assert_array_equal(_fn("v_min3_f32")(F32, G32, h), np.minimum(np.minimum(F32, G32), h))
