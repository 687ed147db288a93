"""The RDNA3 interpreter runs LLVM's gfx1100 machine code for the corpus kernels and matches numpy.

Each kernel is compiled by llvmlite (rawgrad/drivers/amd/mock/rdna3/corpus.py), laid out and relocated by a
loader, and its exact bytes are executed; sizes include ones that are not a multiple of the wave (32) or the
workgroup (64, or 16x16 for the matmul), so bounds checks, partial waves and partial tiles are exercised.
"""
from __future__ import annotations

import struct
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from rawgrad.drivers.amd.mock.rdna3 import corpus
from rawgrad.drivers.amd.mock.rdna3.interp import MemoryFault, MemoryMap, run

BASE = 0x1_0000_0000  # first buffer address; buffers are spaced so an overrun lands in unmapped memory
GAP = 0x1000_0000


class Buffers:
    """Maps numpy arrays at spaced addresses and reads results back."""

    def __init__(self) -> None:
        self.mem = MemoryMap()
        self.next = BASE
        self.views: dict[int, tuple[np.ndarray, Any]] = {}

    def put(self, arr: np.ndarray) -> int:
        va = self.next
        self.next += GAP
        self.views[va] = (self.mem.map(va, arr), arr.dtype)
        return va

    def out(self, n: int, dtype: Any, fill: int = 0xAB) -> int:
        return self.put(np.full(n * np.dtype(dtype).itemsize, fill, np.uint8))

    def get(self, va: int, dtype: Any) -> np.ndarray:
        return self.views[va][0].view(dtype)


def _groups(n: int, per: int = 64) -> tuple[int, int, int]:
    return (max(1, -(-n // per)), 1, 1)


SIZES = [1, 31, 64, 100, 257]


@pytest.mark.parametrize("n", SIZES)
def test_ew_f32(n: int) -> None:
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * 4).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    b[::5] = rng.uniform(1e-3, 1e3, b[::5].size).astype(np.float32)
    c = (rng.standard_normal(n) * 10).astype(np.float32)
    m = Buffers()
    o1, o2, o3 = m.out(n, np.float32), m.out(n, np.float32), m.out(n, np.float32)
    args = struct.pack("<6Qi", o1, o2, o3, m.put(a), m.put(b), m.put(c), n)
    run(corpus.program("ew_f32"), m.mem, args, _groups(n), (64, 1, 1))
    with np.errstate(all="ignore"):
        ref1 = np.maximum(a * b + c, np.float32(0))
        ref2 = a / b
        t1 = np.exp2(np.minimum(a, 8).astype(np.float64)) + np.sqrt(np.abs(b).astype(np.float64))
        ref3 = np.floor(c).astype(np.float64) * 0.5 + t1 - np.log2(t1)
    np.testing.assert_array_equal(m.get(o1, np.float32), ref1)  # IEEE ops: bit-exact
    np.testing.assert_array_equal(m.get(o2, np.float32), ref2)  # the v_div_scale/fmas/fixup expansion
    np.testing.assert_allclose(m.get(o3, np.float32), ref3, rtol=2e-6, atol=2e-6)  # exp2/log2/sqrt


@pytest.mark.parametrize("n", SIZES)
def test_ew_i32(n: int) -> None:
    rng = np.random.default_rng(100 + n)
    a = rng.integers(-(10**6), 10**6, n, dtype=np.int32)
    b = rng.integers(-(10**4), 10**4, n, dtype=np.int32)
    b[::7] = 0
    m = Buffers()
    o1, o2 = m.out(n, np.int32), m.out(n, np.int32)
    run(corpus.program("ew_i32"), m.mem, struct.pack("<4Qi", o1, o2, m.put(a), m.put(b), n), _groups(n),
        (64, 1, 1))
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    with np.errstate(over="ignore"):
        r = ((a * b) ^ (a >> 3)) + (b << 2) - np.minimum(a, b)
        r = r + np.where(ua < ub, a | 255, b & 65535).astype(np.int32)
    den = np.where(b == 0, 7, b).astype(np.int64)
    q = np.trunc(a.astype(np.float64) / den).astype(np.int64)  # sdiv truncates toward zero
    u = np.maximum(ua, 1).astype(np.uint64) % den.astype(np.uint32).astype(np.uint64)
    np.testing.assert_array_equal(m.get(o1, np.int32), r)
    want2 = (q + u.astype(np.int64)).astype(np.uint64).astype(np.uint32).view(np.int32)  # wraps like i32
    np.testing.assert_array_equal(m.get(o2, np.int32), want2)


@pytest.mark.parametrize("n", SIZES)
def test_cast(n: int) -> None:
    rng = np.random.default_rng(200 + n)
    a = (rng.standard_normal(n) * 1000).astype(np.float32)
    h = rng.uniform(0, 300, n).astype(np.float16)
    ia = rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32)
    u8 = rng.integers(0, 256, n, dtype=np.uint8)
    m = Buffers()
    oh, of, oi, ol = m.out(n, np.float16), m.out(n, np.float32), m.out(n, np.int32), m.out(n, np.uint64)
    args = struct.pack("<8Qi", oh, of, oi, ol, m.put(a), m.put(h), m.put(ia), m.put(u8), n)
    run(corpus.program("cast"), m.mem, args, _groups(n), (64, 1, 1))
    hf = (h * np.float16(2)).astype(np.float32)
    np.testing.assert_array_equal(m.get(oh, np.float16), a.astype(np.float16))
    np.testing.assert_array_equal(m.get(of, np.float32), (hf + ia.astype(np.float32)) + u8.astype(np.float32))
    np.testing.assert_array_equal(m.get(oi, np.int32), np.trunc(a).astype(np.int32) + hf.astype(np.int32))
    with np.errstate(over="ignore"):
        wide = (ia.astype(np.int64) * np.int64(3000000019)).view(np.uint64) >> np.uint64(7)
    np.testing.assert_array_equal(m.get(ol, np.uint64), wide)


def _reduce_ref(a: np.ndarray) -> np.ndarray:
    """Row sums in the kernel's order: lane t adds a[t], a[t+64], ...; then the LDS tree (32, 16, .., 1)."""
    rows, n = a.shape
    out = np.empty(rows, np.float32)
    for r in range(rows):
        part = np.zeros(64, np.float32)
        for j in range(0, n, 64):
            seg = a[r, j:j + 64]
            part[:seg.size] += seg
        half = 32
        while half:
            part[:half] = part[:half] + part[half:2 * half]
            half //= 2
        out[r] = part[0]
    return out


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 37), (2, 64), (4, 200)])
def test_reduce_sum_lds_barrier(rows: int, n: int) -> None:
    a = np.random.default_rng(n).standard_normal((rows, n)).astype(np.float32)
    m = Buffers()
    o = m.out(rows, np.float32)
    run(corpus.program("reduce_sum"), m.mem, struct.pack("<2Qi", o, m.put(a), n), (rows, 1, 1), (64, 1, 1))
    np.testing.assert_array_equal(m.get(o, np.float32), _reduce_ref(a))
    np.testing.assert_allclose(m.get(o, np.float32), a.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("M,N,K", [(16, 16, 16), (5, 7, 3), (33, 20, 40)])
def test_matmul_tiled(M: int, N: int, K: int) -> None:
    rng = np.random.default_rng(M * N * K)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    m = Buffers()
    c = m.out(M * N, np.float32)
    run(corpus.program("matmul_tiled"), m.mem, struct.pack("<3Q3i", c, m.put(a), m.put(b), M, N, K),
        (-(-N // 16), -(-M // 16), 1), (16, 16, 1))
    np.testing.assert_allclose(m.get(c, np.float32).reshape(M, N), a.astype(np.float64) @ b, rtol=1e-5,
                               atol=1e-5)


def _divergent_ref(a: np.ndarray) -> np.ndarray:
    out = np.empty_like(a)
    for i, v in enumerate(a):
        if v > 0:
            x = v
            for _ in range(i % 7):
                x = np.float32(np.float32(x * np.float32(0.5)) + np.float32(1))
            out[i] = x
        else:
            out[i] = v * np.float32(-2)
    return out


@pytest.mark.parametrize("n", SIZES)
def test_divergent(n: int) -> None:
    a = np.random.default_rng(300 + n).standard_normal(n).astype(np.float32)
    m = Buffers()
    o = m.out(n, np.float32)
    run(corpus.program("divergent"), m.mem, struct.pack("<2Qi", o, m.put(a), n), _groups(n), (64, 1, 1))
    np.testing.assert_array_equal(m.get(o, np.float32), _divergent_ref(a))


def test_partial_wave_launch() -> None:
    """A workgroup of 48 work-items: its second wave has 16 live lanes (EXEC), so items 48..63 of each block
    of 64 are never computed and keep the fill pattern."""
    n = 200
    a = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    m = Buffers()
    o = m.out(n, np.float32)
    run(corpus.program("divergent"), m.mem, struct.pack("<2Qi", o, m.put(a), n), _groups(n), (48, 1, 1))
    got = m.get(o, np.float32)
    live = (np.arange(n) % 64) < 48
    np.testing.assert_array_equal(got[live], _divergent_ref(a)[live])
    assert (got[~live].view(np.uint32) == 0xABABABAB).all()


def test_out_of_bounds_global_load_faults() -> None:
    """An input mapped shorter than the kernel reads: the load past its end faults, naming the address."""
    n = 100
    m = Buffers()
    o = m.out(n, np.float32)
    short = m.put(np.ones(60, np.float32))
    end = short + 60 * 4
    with pytest.raises(MemoryFault, match=rf"global_load_b32 .*at {end:#x}: not inside any mapping"):
        run(corpus.program("divergent"), m.mem, struct.pack("<2Qi", o, short, n), _groups(n), (64, 1, 1))


def test_null_kernarg_pointer_faults() -> None:
    m = Buffers()
    with pytest.raises(MemoryFault, match="at 0x0: not inside any mapping"):
        run(corpus.program("divergent"), m.mem, struct.pack("<2Qi", m.out(4, np.float32), 0, 4), (1, 1, 1),
            (64, 1, 1))


def test_short_kernarg_is_refused() -> None:
    with pytest.raises(ValueError, match="kernarg segment of 8 bytes, the kernel descriptor needs 20"):
        run(corpus.program("divergent"), MemoryMap(), b"\0" * 8, (1, 1, 1), (64, 1, 1))


def _fma_exact(a: float, b: float, c: float) -> float:
    """a * b + c rounded once to float64 (Fraction arithmetic is exact; float() of a Fraction rounds once)."""
    return float(Fraction(a) * Fraction(b) + Fraction(c))


@pytest.mark.parametrize("n", [1, 45, 130])
def test_ew_f64(n: int) -> None:
    rng = np.random.default_rng(400 + n)
    a = rng.standard_normal(n) * 50
    b = rng.standard_normal(n) * 3
    a[::9] = np.nan
    b[1::11] = 0.5
    m = Buffers()
    o, o2, oi = m.out(n, np.float64), m.out(n, np.float32), m.out(n, np.uint32)
    run(corpus.program("ew_f64"), m.mem, struct.pack("<5Qi", o, o2, oi, m.put(a), m.put(b), n), _groups(n),
        (64, 1, 1))
    with np.errstate(all="ignore"):
        s = a * b + a
        f = np.array([_fma_exact(x, y, z) if np.isfinite(x) else np.nan for x, y, z in zip(a, b, s)])
        d = f / b
        x2 = (np.floor(d) + np.trunc(a)) + np.rint(b)
        want = np.where(np.isnan(a) | np.isnan(b), 0.0, np.where(a > b, np.ldexp(x2, 3), d))
        sq = np.sqrt(np.abs(a))
        want2 = (sq.astype(np.float32).astype(np.float64) + (np.arange(n) + float(n))).astype(np.float32)
        want_i = np.clip(np.nan_to_num(np.trunc(np.abs(a)), nan=0.0), 0, 2**32 - 1).astype(np.uint32)
    np.testing.assert_array_equal(m.get(o, np.float64), want)  # the v_div_*_f64 expansion rounds correctly
    np.testing.assert_array_equal(m.get(o2, np.float32), want2)  # sqrt via v_rsq_f64 + Newton steps
    np.testing.assert_array_equal(m.get(oi, np.uint32), want_i)


@pytest.mark.parametrize("n", [3, 64, 77])
def test_ew_f16(n: int) -> None:
    rng = np.random.default_rng(500 + n)
    a = (rng.standard_normal(n) * 8).astype(np.float16)
    b = (rng.standard_normal(n) * 8).astype(np.float16)
    a[::10] = np.float16(np.nan)
    c = rng.standard_normal(n).astype(np.float32)
    m = Buffers()
    o, o2 = m.out(n, np.float16), m.out(n, np.float16)
    run(corpus.program("ew_f16"), m.mem, struct.pack("<5Qi", o, o2, m.put(a), m.put(b), m.put(c), n),
        _groups(n), (64, 1, 1))
    with np.errstate(all="ignore"):
        prod = a * b  # float16 multiply, correctly rounded
        mx = np.where(np.isnan(prod), b, np.where(np.isnan(b), prod, np.maximum(prod, b)))
        want = np.where(np.isnan(a) | np.isnan(mx), np.float16(1), mx).astype(np.float16)
        mix = np.array([_fma_exact(float(x), float(y), float(z)) if np.isfinite(x) else np.nan
                        for x, y, z in zip(a, b, c)]).astype(np.float32)
    np.testing.assert_array_equal(m.get(o, np.float16), want)
    np.testing.assert_allclose(m.get(o2, np.float16).astype(np.float32), mix.astype(np.float16), rtol=1e-3,
                               equal_nan=True)


@pytest.mark.parametrize("n", [1, 32, 50, 200])
def test_wave_sum_bpermute(n: int) -> None:
    a = np.random.default_rng(600 + n).standard_normal(n).astype(np.float32)
    groups = _groups(n)
    nwaves = groups[0] * 2
    m = Buffers()
    o = m.out(nwaves, np.float32)
    run(corpus.program("wave_sum"), m.mem, struct.pack("<2Qi", o, m.put(a), n), groups, (64, 1, 1))
    padded = np.zeros(nwaves * 32, np.float32)
    padded[:n] = a
    lanes = np.arange(32)
    want = []
    for wv in range(nwaves):
        v = padded[wv * 32:(wv + 1) * 32].copy()
        for mask in (16, 8, 4, 2, 1):  # the butterfly order of the kernel: v += v[lane ^ mask]
            v = v + v[lanes ^ mask]
        want.append(v[0])
    np.testing.assert_array_equal(m.get(o, np.float32), np.array(want, np.float32))


def _bitrev(x: np.ndarray) -> np.ndarray:
    return np.array([int(f"{int(v):032b}"[::-1], 2) for v in x.astype(np.uint32)], np.uint32)


@pytest.mark.parametrize("n", [2, 70])
def test_int64_and_bit_ops(n: int) -> None:
    rng = np.random.default_rng(700 + n)
    a = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
    b = rng.integers(-(2**62), 2**62, n, dtype=np.int64)
    a[::5] = rng.integers(0, 200, a[::5].size)
    b[::7] = a[::7]
    m = Buffers()
    o, o2 = m.out(n, np.int64), m.out(n, np.int32)
    run(corpus.program("int64"), m.mem, struct.pack("<4Qi", o, o2, m.put(a), m.put(b), n), _groups(n),
        (64, 1, 1))
    ua, ub = a.view(np.uint64), b.view(np.uint64)
    x = np.where(a < b, a >> (b & 63), (ub >> np.uint64(5)).view(np.int64))
    y = np.where(ua > 128, x, a)
    want = np.where(a == b, 7, y)
    lo, lb = a.astype(np.int32), b.astype(np.int32)  # truncation to the low 32 bits
    ulo, ulb = lo.view(np.uint32), lb.view(np.uint32)
    mh = ((lo.astype(np.int64) * lb.astype(np.int64)) >> 32).astype(np.int32)
    rev = _bitrev(ulo).view(np.int32)
    fs = (((ulo.astype(np.uint64) << np.uint64(32)) | ulb.astype(np.uint64)) >> (ulb & 31).astype(np.uint64))
    fs = fs.astype(np.uint32).view(np.int32)
    x1 = lo ^ lb
    with np.errstate(over="ignore"):
        r = (x1 ^ mh) + np.maximum(np.maximum(lo, lb), rev) + (x1 + rev) + fs
    np.testing.assert_array_equal(m.get(o, np.int64), want)
    np.testing.assert_array_equal(m.get(o2, np.int32), r)
