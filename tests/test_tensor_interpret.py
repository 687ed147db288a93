"""The reference interpreter's semantics, on raw UOp graphs (what compiled backends must reproduce)."""
import numpy as np
import pytest

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import bf16_bits_to_f32, dtypes, f32_to_bf16_bits
from rawgrad.tensor.buffers import buffer_from_numpy, buffer_numpy, new_buffer
from rawgrad.tensor.interpret import interpret_realize

DEV = UOp(Ops.DEVICE, arg="CPU")


def _buf(a, dt=None):
    dt = dt or dtypes.from_np(a.dtype)
    return UOp(Ops.RESHAPE, dt, (buffer_from_numpy(a, dt, "CPU"),), a.shape)


def _full(dt, value, n):
    c = UOp(Ops.RESHAPE, dt, (UOp.const(dt, value, DEV),), (1,))
    return UOp(Ops.EXPAND, dt, (c,), (n,))


def _run(*uops):
    out = interpret_realize(*uops)
    for u, r in zip(uops, out):
        assert r.op is Ops.RESHAPE and r.src[0].op is Ops.BUFFER and r.shape == u.shape
    return [buffer_numpy(r.src[0]).reshape(r.shape) for r in out]


def test_int_division_truncates_and_wraps():
    a = _buf(np.array([7, -7, 7, -7, 5, -128], np.int8))
    b = _buf(np.array([2, 2, -2, -2, 0, -1], np.int8))
    idiv, mod = UOp(Ops.IDIV, dtypes.int8, (a, b)), UOp(Ops.MOD, dtypes.int8, (a, b))
    add = UOp(Ops.ADD, dtypes.int8, (a, a))
    q, r, s = _run(idiv, mod, add)
    np.testing.assert_array_equal(q, [3, -3, -3, 3, 0, -128])  # C truncation; x/0 is 0; MIN/-1 wraps
    np.testing.assert_array_equal(r, [1, -1, 1, -1, 0, 0])
    np.testing.assert_array_equal(s, [14, -14, 14, -14, 10, 0])


def test_shifts_pow_and_not():
    a = _buf(np.array([-16, 16, 3], np.int32))
    u = _buf(np.array([0xF0000000, 16, 3], np.uint32))
    e = _buf(np.array([-1, 2, -2], np.int32))
    base = _buf(np.array([-1, 3, 1], np.int32))
    outs = _run(UOp(Ops.SHR, dtypes.int32, (a, _full(dtypes.int32, 2, 3))),
                UOp(Ops.SHR, dtypes.uint32, (u, _full(dtypes.uint32, 2, 3))),
                UOp(Ops.POW, dtypes.int32, (base, e)), UOp(Ops.NOT, dtypes.int32, (a,)))
    np.testing.assert_array_equal(outs[0], [-4, 4, 0])  # arithmetic for signed
    np.testing.assert_array_equal(outs[1], [0x3C000000, 4, 0])  # logical for unsigned
    np.testing.assert_array_equal(outs[2], [-1, 9, 1])  # 1/b**n truncated: only |b| == 1 survives
    np.testing.assert_array_equal(outs[3], [15, -17, -4])


def test_casts_bitcast_and_bfloat16_rounding():
    f = _buf(np.array([-2.7, 0.0, 2.9, np.nan], np.float32))
    to_int = UOp(Ops.CAST, dtypes.int32, (f,))
    to_bool = UOp(Ops.CAST, dtypes.bool, (f,))
    bits = UOp(Ops.BITCAST, dtypes.uint32, (f,))
    x = np.array([1.0 + 2 ** -9, 3.0, 100.0, -0.1], np.float32)
    bx = _buf(f32_to_bf16_bits(x), dtypes.bfloat16)
    bsum = UOp(Ops.ADD, dtypes.bfloat16, (bx, bx))
    factor = UOp(Ops.CAST, dtypes.bfloat16, (_full(dtypes.float32, 1.01, 4),))
    bmul = UOp(Ops.MUL, dtypes.bfloat16, (bx, factor))
    i, b, u, s, m = _run(to_int, to_bool, bits, bsum, bmul)
    np.testing.assert_array_equal(i[:3], [-2, 0, 2])
    np.testing.assert_array_equal(b, [True, False, True, True])
    np.testing.assert_array_equal(u[:3], np.array([-2.7, 0.0, 2.9], np.float32).view(np.uint32))
    assert s.dtype == np.uint16  # buffers hold bfloat16 as bits
    xb = bf16_bits_to_f32(f32_to_bf16_bits(x))
    np.testing.assert_array_equal(bf16_bits_to_f32(s), xb * 2)
    mult = bf16_bits_to_f32(f32_to_bf16_bits(np.float32(1.01)))
    np.testing.assert_array_equal(m, f32_to_bf16_bits(xb * mult))  # every ALU result rounds to bf16
    with pytest.raises(TypeError, match="equal item sizes"):
        interpret_realize(UOp(Ops.BITCAST, dtypes.int16, (f,)))


def test_reduce_assign_and_empty_buffers():
    h = _buf(np.full(4096, 1.0, np.float16))
    total = UOp(Ops.REDUCE_AXIS, dtypes.float16, (h,), (Ops.ADD, (0,)))
    empty = UOp(Ops.REDUCE_AXIS, dtypes.float32, (_buf(np.zeros((0, 2), np.float32)),), (Ops.MAX, (0,)))
    flags = _buf(np.array([[True, False], [False, False]]))
    bools = UOp(Ops.REDUCE_AXIS, dtypes.bool, (flags,), (Ops.ADD, (1,)))
    s, e, b = _run(total, empty, bools)
    assert s[0] == 4096  # float16 alone would stall at 2048; accumulation is float32
    np.testing.assert_array_equal(e, [[-np.inf, -np.inf]])
    np.testing.assert_array_equal(b, [[True], [False]])
    target = _buf(np.zeros(3, np.int32))
    (res,) = interpret_realize(UOp(Ops.ASSIGN, dtypes.int32, (target, _buf(np.array([4, 5, 6], np.int32)))))
    assert res is target and buffer_numpy(target.src[0]).tolist() == [4, 5, 6]
    fresh = UOp(Ops.RESHAPE, dtypes.int16, (new_buffer("CPU", 2, dtypes.int16),), (2,))
    (z,) = _run(UOp(Ops.ADD, dtypes.int16, (fresh, fresh)))
    assert z.tolist() == [0, 0]
