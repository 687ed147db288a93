"""Lane-wise VALU semantics of the RDNA3 interpreter that the current corpus does not reach (the renderer's
output changes; these keep working when it starts emitting them again), checked against numpy; and every
VALU mnemonic of the generated table has semantics."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from rawgrad.drivers.amd.mock.rdna3 import interp
from rawgrad.drivers.amd.mock.rdna3.decode import mnemonic_base
from rawgrad.drivers.amd.mock.rdna3.optable import OPTABLE
from rawgrad.drivers.amd.mock.rdna3.optable_ops import OPTABLE_OPS

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
    valu = sorted({mnemonic_base(m) for (fmt, _), m in OPTABLE.items()
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
