"""Reference evaluator: run a tensor graph with numpy, with exactly rawgrad's semantics.

This is the ground truth the compiled path is tested against, so it favours being obviously right over
being fast. Values are held in a *compute layout*: the numpy dtype of the element type, except bfloat16,
which is held as float32 values already rounded to bfloat16 precision (numpy has no bfloat16). Every ALU
result is rounded back to its dtype, so float16 computes in float16 and bfloat16 behaves like a type of
its own even though the arithmetic runs in float32.

Semantics fixed here (the compiled backends must match them):
- IDIV truncates toward zero and MOD takes the sign of the dividend (C); x // 0 and x % 0 give 0 for ints.
- Integer arithmetic wraps; an integer POW with a negative exponent is 1/b**n truncated (0 unless |b|==1).
- SHR is arithmetic for signed types and logical for unsigned ones (as C and torch); the shift amount is
  converted to the shifted value's type first.
- CAST float->int truncates toward zero; CAST ->bool is `x != 0`; BITCAST reinterprets the bits.
- REDUCE_AXIS of float16/bfloat16 accumulates in float32 and rounds once; MAX of an empty axis is the
  dtype's minimum; ADD/MAX of bools is "any", MUL of bools is "all".
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.compiler.symbolic import sym_infer
from rawgrad.dtype import DType, bf16_bits_to_f32, dtypes, f32_to_bf16_bits
from rawgrad.tensor.buffers import buffer_from_numpy, buffer_numpy, buffer_write, is_allocated, writable_view


def _compute_np(dt: DType) -> np.dtype:
    return np.dtype(np.float32) if dt == dtypes.bfloat16 else dt.np


def _round_to(val: Any, dt: DType) -> np.ndarray:
    """Bring an ALU result into dt's compute layout (wrapping ints, rounding floats)."""
    arr = np.asarray(val)
    if dt == dtypes.bfloat16:
        return bf16_bits_to_f32(f32_to_bf16_bits(arr.astype(np.float32))).reshape(arr.shape)
    return arr.astype(dt.np, copy=False)


def host_to_value(host: np.ndarray, dt: DType) -> np.ndarray:
    """Host layout (what a buffer stores) -> compute layout."""
    return bf16_bits_to_f32(host).reshape(host.shape) if dt == dtypes.bfloat16 else host


def value_to_host(val: np.ndarray, dt: DType) -> np.ndarray:
    """Compute layout -> host layout (bfloat16 becomes its uint16 bit patterns)."""
    if dt == dtypes.bfloat16:
        return f32_to_bf16_bits(val).reshape(np.shape(val))
    return np.asarray(val, dtype=dt.np)


def _concrete(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """Resolve a shape that may hold bound symbolic sizes to plain ints."""
    out = []
    for s in shape:
        if isinstance(s, UOp):
            try:  # a bound Variable carries its value; an expression of bound ones (v + 1) evaluates
                out.append(int(sym_infer(s, {})))
            except ValueError:
                raise ValueError(f"the interpreter needs bound sizes, got the symbolic size "
                                 f"{s.render()}") from None
        else:
            out.append(int(s))
    return tuple(out)


# ---------------------------------------------------------------------- ALU
def _idiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.fmod(a, b)  # C remainder; 0 where b == 0 (numpy's convention for ints)
    safe_b = np.where(b == 0, 1, b).astype(a.dtype)
    return np.where(b == 0, 0, (a - r) // safe_b)  # a - r is an exact multiple of b


def _int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "u":
        return np.power(a, b)
    neg = b < 0
    p = np.power(a, np.where(neg, 0, b).astype(b.dtype))
    # 1 / a**n truncated toward zero: only |a| == 1 survives
    inv = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)).astype(a.dtype)
    return np.where(neg, inv, p)


def _shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    amount = np.asarray(b).astype(a.dtype)
    return np.left_shift(a, amount) if left else np.right_shift(a, amount)


_UNARY: dict[Ops, Callable[[np.ndarray], Any]] = {
    Ops.NEG: np.negative, Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt,
    Ops.RECIP: lambda a: np.reciprocal(a) if a.dtype.kind == "f" else 1 // a,
    Ops.TRUNC: lambda a: np.trunc(a) if a.dtype.kind == "f" else a,
    Ops.NOT: lambda a: np.logical_not(a) if a.dtype == np.bool_ else np.invert(a),
}

_BINARY: dict[Ops, Callable[[np.ndarray, np.ndarray], Any]] = {
    Ops.ADD: lambda a, b: np.logical_or(a, b) if a.dtype == np.bool_ else a + b,
    Ops.SUB: lambda a, b: a - b,
    Ops.MUL: lambda a, b: np.logical_and(a, b) if a.dtype == np.bool_ else a * b,
    Ops.FDIV: lambda a, b: a / b,
    Ops.IDIV: lambda a, b: _idiv(a, b) if a.dtype.kind in "iu" else np.trunc(a / b),
    Ops.MOD: np.fmod,
    Ops.MAX: np.maximum,
    Ops.POW: lambda a, b: _int_pow(a, b) if a.dtype.kind in "iu" else np.power(a, b),
    Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
    Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
    Ops.SHL: lambda a, b: _shift(a, b, True), Ops.SHR: lambda a, b: _shift(a, b, False),
}


def _alu(u: UOp, args: list[np.ndarray]) -> np.ndarray:
    assert u.dtype is not None
    with np.errstate(all="ignore"):
        if u.op in _UNARY:
            val = _UNARY[u.op](args[0])
        elif u.op in _BINARY:
            val = _BINARY[u.op](args[0], args[1])
        elif u.op is Ops.WHERE:
            val = np.where(args[0], args[1], args[2])
        elif u.op is Ops.MULACC:
            val = args[0] * args[1] + args[2]
        else:
            raise NotImplementedError(f"interpreter: no ALU rule for {u.op}")
        return _round_to(val, u.dtype)


# ---------------------------------------------------------------------- conversions and reductions
def _cast(val: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    if dst.is_bool:
        return val != 0
    with np.errstate(all="ignore"):
        if dst.is_int and src.is_float:
            # astype truncates toward zero; NaN/out-of-range are undefined in C, numpy picks a value
            return np.trunc(val).astype(dst.np)
        return _round_to(val.astype(_compute_np(dst)) if dst != dtypes.bfloat16 else val, dst)


def _bitcast(val: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    if src.itemsize != dst.itemsize:
        raise TypeError(f"bitcast needs equal item sizes: {src} is {src.itemsize} bytes, {dst} is "
                        f"{dst.itemsize}")
    host = np.ascontiguousarray(value_to_host(val, src))
    return host_to_value(host.view(dst.np).reshape(np.shape(val)), dst)


def _reduce(val: np.ndarray, dt: DType, rop: Ops, axes: tuple[int, ...]) -> np.ndarray:
    ax = tuple(axes)
    if dt.is_bool:
        fn = np.all if rop is Ops.MUL else np.any
        return fn(val, axis=ax, keepdims=True)
    acc = np.float32 if dt in (dtypes.float16, dtypes.bfloat16) else _compute_np(dt)
    with np.errstate(all="ignore"):
        if rop is Ops.ADD:
            out = np.add.reduce(val.astype(acc), axis=ax, keepdims=True, dtype=acc)
        elif rop is Ops.MUL:
            out = np.multiply.reduce(val.astype(acc), axis=ax, keepdims=True, dtype=acc)
        elif rop is Ops.MAX:
            out = np.maximum.reduce(val.astype(acc), axis=ax, keepdims=True, initial=dt.min)
        else:
            raise NotImplementedError(f"interpreter: no reduce rule for {rop}")
    return _round_to(out, dt)


# ---------------------------------------------------------------------- graph evaluation
def _movement(u: UOp, x: np.ndarray) -> np.ndarray:
    if u.op is Ops.RESHAPE:
        return x.reshape(_concrete(u.arg))
    if u.op is Ops.PERMUTE:
        return np.transpose(x, u.arg)
    if u.op is Ops.EXPAND:
        return np.broadcast_to(x, _concrete(u.arg))
    if u.op is Ops.PAD:
        return np.pad(x, _concrete_pairs(u.arg))
    if u.op is Ops.SHRINK:
        return x[tuple(slice(b, e) for b, e in _concrete_pairs(u.arg))]
    assert u.op is Ops.FLIP
    return x[tuple(slice(None, None, -1) if f else slice(None) for f in u.arg)]


def _concrete_pairs(pairs: tuple[tuple[Any, Any], ...]) -> list[tuple[int, int]]:
    return [_concrete(p) for p in pairs]  # type: ignore[misc]


def _assign_target(target: UOp) -> tuple[UOp, np.ndarray | None]:
    """The BUFFER an ASSIGN writes and, for a view target, the flat buffer position of each element of
    the view (the view's movement ops applied to the positions 0..size-1); None for the whole buffer."""
    if target.op is Ops.BUFFER:
        return target, None
    if target.op is Ops.RESHAPE and target.src[0].op is Ops.BUFFER:
        return target.src[0], None
    view = writable_view(target)
    if view is None:
        raise ValueError(f"ASSIGN target must be a realized buffer or a shrink/reshape/permute/flip view of "
                         f"one, got {target.op.name}")
    buf, chain = view
    positions = np.arange(buf.arg[1], dtype=np.int64)
    for m in chain:
        positions = _movement(m, positions)
    return buf, positions


class _Evaluator:
    def __init__(self) -> None:
        self.memo: dict[UOp, np.ndarray] = {}

    def value(self, root: UOp) -> np.ndarray:
        for node in root.toposort():
            if node not in self.memo:
                self.memo[node] = self._eval(node)
        return self.memo[root]

    def _eval(self, u: UOp) -> np.ndarray:
        src = [self.memo[s] for s in u.src]
        op, dt = u.op, u.dtype
        if op is Ops.DEVICE or op is Ops.DEFINE_VAR:
            return np.zeros(())  # never read as data
        if op is Ops.BUFFER:
            assert dt is not None
            if not is_allocated(u):  # an `empty` buffer: any content is valid, zeros are the simplest
                return np.zeros(u.arg[1], dtype=_compute_np(dt))
            return host_to_value(buffer_numpy(u), dt)
        if op is Ops.CONST:
            assert dt is not None
            return _round_to(np.array(u.arg, dtype=_compute_np(dt)), dt)
        if op is Ops.BIND:
            return np.array(u.src[1].arg, dtype=np.int64)
        if op in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP):
            return _movement(u, src[0])
        assert dt is not None
        if op is Ops.CAST:
            assert u.src[0].dtype is not None
            return _cast(src[0], u.src[0].dtype, dt)
        if op is Ops.BITCAST:
            assert u.src[0].dtype is not None
            return _bitcast(src[0], u.src[0].dtype, dt)
        if op is Ops.REDUCE_AXIS:
            return _reduce(src[0], dt, u.arg[0], u.arg[1])
        if op in (Ops.CONTIGUOUS, Ops.COPY):
            return src[0]
        if op is Ops.GATHER:
            table, rows = src[0], src[1].astype(np.int64)
            inside = (rows >= 0) & (rows < table.shape[0])
            picked = table[np.where(inside, rows, 0)]
            return np.where(inside[..., None], picked, np.zeros((), picked.dtype))
        if op is Ops.ASSIGN:
            buf, positions = _assign_target(u.src[0])
            new = np.broadcast_to(src[1], _concrete(u.shape))
            if positions is not None:
                # read-modify-write: the elements outside the view keep what the buffer holds now
                full = host_to_value(buffer_numpy(buf), dt).copy()
                full[positions] = new
                new_host = value_to_host(full, dt)
            else:
                new_host = value_to_host(np.ascontiguousarray(new), dt).reshape(-1)
            buffer_write(buf, new_host)
            return new
        return _alu(u, src)


def is_realized(u: UOp) -> bool:
    """True when u already reads a contiguous buffer holding data (BUFFER or RESHAPE(BUFFER))."""
    base = u.src[0] if u.op is Ops.RESHAPE else u
    return base.op is Ops.BUFFER and is_allocated(base)


def interpret_realize(*uops: UOp) -> tuple[UOp, ...]:
    """Evaluate every uop with numpy (sharing work between them) and return nodes reading buffers."""
    ev = _Evaluator()
    out: list[UOp] = []
    for u in uops:
        if is_realized(u):
            out.append(u)
            continue
        val = ev.value(u)
        if u.op is Ops.ASSIGN:
            out.append(u.src[0])  # the target now holds the value; keep reading its buffer
            if _assign_target(u.src[0])[1] is not None:
                # later uops read that buffer (not this ASSIGN) and must see the write, as kernels
                # scheduled after it do: forget every value computed from the old contents
                ev = _Evaluator()
            continue
        assert u.dtype is not None
        buf = buffer_from_numpy(value_to_host(np.ascontiguousarray(val), u.dtype), u.dtype, u.device)
        out.append(UOp(Ops.RESHAPE, u.dtype, (buf,), _concrete(u.shape)))
    return tuple(out)
