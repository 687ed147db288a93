# mypy: disable-error-code="misc"
# (the methods annotate `self: Tensor`, the class they are mixed into; mypy files that under "misc")
"""Elementwise Tensor ops built directly on the ALU primitives: arithmetic (with torch's division and
modulo rules and the Python operators), comparisons, bitwise and logical ops, shifts, where, maximum/
minimum/clip, NaN/inf tests, and the unary math and activation functions (exp, log, sqrt, trig, rounding,
relu family, sigmoid, tanh, erf, gelu, softplus, ...).

Operands are promoted and broadcast by `Tensor._operands` (tensor.py), so each ALU node built here has
sources of one shape and dtype. Float functions of int inputs compute in the default float, and
float16/bfloat16 compute in float32 and round once (`Tensor._float_fn`). Where a formula picks a branch
with `where`, the unused branch gets a harmless input so its inf/NaN cannot reach the gradient.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, overload

from rawgrad.compiler.ir import Ops
from rawgrad.dtype import dtypes, least_upper_float, promote_types, result_type_with_scalar
from rawgrad.errors import ArgumentError, ArgumentTypeError
from rawgrad.tensor.common import _LN_2, _LOG2_E, _NO_ARG, Scalar, _broadcast_shapes, _is_scalar, _scalar

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor


class ElementwiseOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()

    # ------------------------------------------------------------------ arithmetic
    def add(self: Tensor, x: Any, alpha: Scalar = 1) -> Tensor:
        return self._binary(Ops.ADD, x if alpha == 1 else x * alpha)

    def sub(self: Tensor, x: Any, alpha: Scalar = 1) -> Tensor:
        return self._binary(Ops.SUB, x if alpha == 1 else x * alpha)

    def mul(self: Tensor, x: Any) -> Tensor:
        return self._binary(Ops.MUL, x)

    def div(self: Tensor, x: Any, rounding_mode: str | None = None, reverse: bool = False) -> Tensor:
        """True division (ints give float32); rounding_mode 'trunc' or 'floor' as torch."""
        a, b = self._operands(x, reverse)
        if rounding_mode == "floor":
            return a._floordiv(b)
        if rounding_mode == "trunc":
            return a._alu(Ops.IDIV, b) if a.dtype.is_int else (a / b).trunc()
        if rounding_mode is not None:
            raise ArgumentError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        if not a.dtype.is_float:
            dt = least_upper_float(a.dtype)
            a, b = a.cast(dt), b.cast(dt)
        return a._alu(Ops.FDIV, b)

    def _floordiv(self: Tensor, b: Tensor) -> Tensor:
        if self.dtype.is_float:
            return (self / b).floor()
        if self.dtype.is_bool:
            raise ArgumentTypeError("floor division is not defined for bool tensors")
        q, r = self._alu(Ops.IDIV, b), self._alu(Ops.MOD, b)
        # C truncates toward zero; floor differs by one when the remainder and divisor differ in sign
        fix = (r != 0) & ((r < 0) != (b < 0))
        return fix.where(q - 1, q)

    def floor_divide(self: Tensor, x: Any) -> Tensor:
        a, b = self._operands(x)
        return a._floordiv(b)

    def remainder(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        """Python/torch modulo: the result takes the divisor's sign."""
        a, b = self._operands(x, reverse)
        if a.dtype.is_float:
            return a - (a / b).floor() * b
        if a.dtype.is_bool:
            raise ArgumentTypeError("% is not defined for bool tensors")
        r = a._alu(Ops.MOD, b)
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def mod(self: Tensor, x: Any) -> Tensor:
        return self.remainder(x)

    def fmod(self: Tensor, x: Any) -> Tensor:
        """C remainder: the result takes the dividend's sign."""
        a, b = self._operands(x)
        if a.dtype.is_float:
            return a - (a / b).trunc() * b
        return a._alu(Ops.MOD, b)

    def pow(self: Tensor, x: Any, reverse: bool = False) -> Tensor:
        if not reverse and _is_scalar(x) and not isinstance(_scalar(x), bool):
            e = _scalar(x)
            if e == 2:
                return self * self
            if e == 1 and isinstance(e, int):
                return self
        if not reverse and _is_scalar(x) and isinstance(_scalar(x), int) and self.dtype.is_bool:
            return self.cast(dtypes.int32).pow(x)
        if not reverse and _is_scalar(x) and isinstance(_scalar(x), int) and _scalar(x) < 0 \
                and (self.dtype.is_int or self.dtype.is_bool):
            # numpy and torch refuse this too: the answer (1/a**n truncated) is 0 for almost every a
            raise ArgumentError(f"integers to negative integer powers are not allowed ({self.dtype} ** "
                             f"{_scalar(x)}); cast to a float dtype first")
        return self._binary(Ops.POW, x, reverse)

    def neg(self: Tensor) -> Tensor:
        if self.dtype.is_bool:
            raise ArgumentTypeError("negation is not defined for bool tensors; use ~ or logical_not")
        return self._alu(Ops.NEG)

    def __add__(self: Tensor, x: Any) -> Tensor:
        return self.add(x)

    def __radd__(self: Tensor, x: Any) -> Tensor:
        return self._binary(Ops.ADD, x, reverse=True)

    def __sub__(self: Tensor, x: Any) -> Tensor:
        return self.sub(x)

    def __rsub__(self: Tensor, x: Any) -> Tensor:
        return self._binary(Ops.SUB, x, reverse=True)

    def __mul__(self: Tensor, x: Any) -> Tensor:
        return self.mul(x)

    def __rmul__(self: Tensor, x: Any) -> Tensor:
        return self._binary(Ops.MUL, x, reverse=True)

    def __truediv__(self: Tensor, x: Any) -> Tensor:
        return self.div(x)

    def __rtruediv__(self: Tensor, x: Any) -> Tensor:
        return self.div(x, reverse=True)

    def __floordiv__(self: Tensor, x: Any) -> Tensor:
        return self.floor_divide(x)

    def __rfloordiv__(self: Tensor, x: Any) -> Tensor:
        a, b = self._operands(x, reverse=True)
        return a._floordiv(b)

    def __mod__(self: Tensor, x: Any) -> Tensor:
        return self.remainder(x)

    def __rmod__(self: Tensor, x: Any) -> Tensor:
        return self.remainder(x, reverse=True)

    def __pow__(self: Tensor, x: Any) -> Tensor:
        return self.pow(x)

    def __rpow__(self: Tensor, x: Any) -> Tensor:
        return self.pow(x, reverse=True)

    def __neg__(self: Tensor) -> Tensor:
        return self.neg()

    def __abs__(self: Tensor) -> Tensor:
        return self.abs()

    def __matmul__(self: Tensor, x: Tensor) -> Tensor:
        return self.matmul(x)

    def __rmatmul__(self: Tensor, x: Any) -> Tensor:
        return self._as_tensor(x).matmul(self)

    # ------------------------------------------------------------------ comparisons and logic
    def _compare(self: Tensor, op: Ops, x: Any, reverse: bool = False) -> Tensor:
        return self._binary(op, x, reverse, out=dtypes.bool)

    def __lt__(self: Tensor, x: Any) -> Tensor:
        return self._compare(Ops.CMPLT, x)

    def __gt__(self: Tensor, x: Any) -> Tensor:
        return self._compare(Ops.CMPLT, x, reverse=True)

    def __le__(self: Tensor, x: Any) -> Tensor:
        a, b = self._operands(x)
        # not (b < a) would be True for NaN, so floats need the explicit equality
        return a._alu(Ops.CMPLT, b, dtype=dtypes.bool) | a._alu(Ops.CMPEQ, b, dtype=dtypes.bool) \
            if a.dtype.is_float else b._alu(Ops.CMPLT, a, dtype=dtypes.bool).logical_not()

    def __ge__(self: Tensor, x: Any) -> Tensor:
        a, b = self._operands(x)
        return b.__le__(a)

    def __eq__(self: Tensor, x: Any) -> Tensor:  # type: ignore[override]
        return self._compare(Ops.CMPEQ, x)

    def __ne__(self: Tensor, x: Any) -> Tensor:  # type: ignore[override]
        return self._compare(Ops.CMPNE, x)

    def lt(self: Tensor, x: Any) -> Tensor:
        return self < x

    def gt(self: Tensor, x: Any) -> Tensor:
        return self > x

    def le(self: Tensor, x: Any) -> Tensor:
        return self <= x

    def ge(self: Tensor, x: Any) -> Tensor:
        return self >= x

    def eq(self: Tensor, x: Any) -> Tensor:
        return self == x

    def ne(self: Tensor, x: Any) -> Tensor:
        return self != x

    def _bitwise(self: Tensor, op: Ops, x: Any, name: str, reverse: bool = False) -> Tensor:
        a, b = self._operands(x, reverse)
        if a.dtype.is_float:
            raise ArgumentTypeError(f"{name} is not defined for dtype {a.dtype} (needs an int or bool "
                                    "tensor)")
        return a._alu(op, b)

    def bitwise_and(self: Tensor, x: Any) -> Tensor:
        return self._bitwise(Ops.AND, x, "bitwise_and")

    def bitwise_or(self: Tensor, x: Any) -> Tensor:
        return self._bitwise(Ops.OR, x, "bitwise_or")

    def bitwise_xor(self: Tensor, x: Any) -> Tensor:
        return self._bitwise(Ops.XOR, x, "bitwise_xor")

    def bitwise_not(self: Tensor) -> Tensor:
        if self.dtype.is_float:
            raise ArgumentTypeError(f"bitwise_not is not defined for dtype {self.dtype} "
                            "(needs an int or bool tensor)")
        return self._alu(Ops.NOT)

    def __and__(self: Tensor, x: Any) -> Tensor:
        return self.bitwise_and(x)

    def __rand__(self: Tensor, x: Any) -> Tensor:
        return self._bitwise(Ops.AND, x, "bitwise_and", reverse=True)

    def __or__(self: Tensor, x: Any) -> Tensor:
        return self.bitwise_or(x)

    def __ror__(self: Tensor, x: Any) -> Tensor:
        return self._bitwise(Ops.OR, x, "bitwise_or", reverse=True)

    def __xor__(self: Tensor, x: Any) -> Tensor:
        return self.bitwise_xor(x)

    def __rxor__(self: Tensor, x: Any) -> Tensor:
        return self._bitwise(Ops.XOR, x, "bitwise_xor", reverse=True)

    def __invert__(self: Tensor) -> Tensor:
        return self.bitwise_not()

    def _shift(self: Tensor, op: Ops, x: Any, name: str) -> Tensor:
        if not self.dtype.is_int:
            raise ArgumentTypeError(f"{name} is not defined for dtype {self.dtype} (needs an int tensor)")
        if _is_scalar(x):
            amount = self._const(int(_scalar(x)))
            return self._alu(op, amount)
        a, b = self._operands(x)
        if not a.dtype.is_int:
            raise ArgumentTypeError(f"{name} needs an int shift amount, got {self._as_tensor(x).dtype}")
        return a._alu(op, b)

    def lshift(self: Tensor, x: Any) -> Tensor:
        return self._shift(Ops.SHL, x, "<<")

    def rshift(self: Tensor, x: Any) -> Tensor:
        """Arithmetic for signed types, logical for unsigned ones (as torch)."""
        return self._shift(Ops.SHR, x, ">>")

    def __lshift__(self: Tensor, x: Any) -> Tensor:
        return self.lshift(x)

    def __rshift__(self: Tensor, x: Any) -> Tensor:
        return self.rshift(x)

    def logical_not(self: Tensor) -> Tensor:
        return self.bool()._alu(Ops.NOT)

    def logical_and(self: Tensor, x: Any) -> Tensor:
        return self.bool()._binary(Ops.AND, self._as_tensor(x).bool())

    def logical_or(self: Tensor, x: Any) -> Tensor:
        return self.bool()._binary(Ops.OR, self._as_tensor(x).bool())

    def logical_xor(self: Tensor, x: Any) -> Tensor:
        return self.bool()._binary(Ops.XOR, self._as_tensor(x).bool())

    @overload
    def where(self: Tensor, x: Any, y: Any) -> Tensor: ...

    @overload
    def where(self: Tensor) -> tuple[Tensor, ...]: ...

    def where(self: Tensor, x: Any = _NO_ARG, y: Any = _NO_ARG) -> Any:
        """`cond.where(x, y)` (also `Tensor.where(cond, x, y)`): x where cond is true, else y. With no x and
        y it is torch.where(cond): the coordinates of the true elements (nonzero(as_tuple=True))."""
        if x is _NO_ARG and y is _NO_ARG:
            return self.nonzero(as_tuple=True)
        if x is _NO_ARG or y is _NO_ARG:
            raise ArgumentError("where(cond, x, y) needs both x and y (or neither, for the coordinates)")
        cond = self.bool()
        if isinstance(x, type(self)) or isinstance(y, type(self)) or not _is_scalar(x) or not _is_scalar(y):
            if not isinstance(x, type(self)) and not _is_scalar(x):
                x = cond._as_tensor(x)
            if not isinstance(y, type(self)) and not _is_scalar(y):
                y = cond._as_tensor(y)
            if isinstance(x, type(self)) and isinstance(y, type(self)):
                dt = promote_types(x.dtype, y.dtype)
            else:
                t, s = (x, y) if isinstance(x, type(self)) else (y, x)
                dt = result_type_with_scalar(t.dtype, _scalar(s))
        else:
            dt = promote_types(dtypes.from_py(_scalar(x)), dtypes.from_py(_scalar(y)))
        shapes = [cond.shape] + [v.shape for v in (x, y) if isinstance(v, type(self))]
        shape = _broadcast_shapes(*shapes) if len(shapes) > 1 else cond.shape
        xs = [v.cast(dt)._broadcast_to(shape) if isinstance(v, type(self))
              else cond._const(_scalar(v), dt, shape) for v in (x, y)]
        return cond._broadcast_to(shape)._alu(Ops.WHERE, xs[0], xs[1], dtype=dt)

    def maximum(self: Tensor, x: Any) -> Tensor:
        a, b = self._operands(x)
        return a._alu(Ops.OR, b) if a.dtype.is_bool else a._alu(Ops.MAX, b)

    def minimum(self: Tensor, x: Any) -> Tensor:
        a, b = self._operands(x)
        if a.dtype.is_bool:
            return a._alu(Ops.AND, b)
        if a.dtype.is_int:  # ~ reverses the order of signed and unsigned ints alike, without overflow
            return ~((~a)._alu(Ops.MAX, ~b))
        return -((-a)._alu(Ops.MAX, -b))

    def clip(self: Tensor, min_: Any = None, max_: Any = None) -> Tensor:
        """Bounds selected with where, so the gradient is 1 on [min_, max_] including the bounds and 0
        outside (torch's clamp), NaN stays NaN, and min_ > max_ gives max_ everywhere (torch)."""
        if min_ is None and max_ is None:
            raise ArgumentError("clip needs at least one of min_ and max_")
        x = self
        if min_ is not None:
            lo, x = x._operands(min_, reverse=True)
            x = (x < lo).where(lo, x)
        if max_ is not None:
            hi, x = x._operands(max_, reverse=True)
            x = (x > hi).where(hi, x)
        return x

    def clamp(self: Tensor, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 (torch's names)
        return self.clip(min, max)

    def isnan(self: Tensor) -> Tensor:
        return self != self if self.dtype.is_float else self._const(False, dtypes.bool)

    def isinf(self: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        if not self.dtype.is_float or not (detect_positive or detect_negative):
            return self._const(False, dtypes.bool)
        if not detect_negative:
            return self == math.inf
        return (self == -math.inf) if not detect_positive else (self == math.inf) | (self == -math.inf)

    def isfinite(self: Tensor) -> Tensor:
        return (self.isinf() | self.isnan()).logical_not()

    # ------------------------------------------------------------------ unary math
    def exp(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: (x * _LOG2_E)._alu(Ops.EXP2))

    def exp2(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.EXP2))

    def log(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.LOG2) * _LN_2)

    def log2(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.LOG2))

    def sqrt(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.SQRT))

    def rsqrt(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.SQRT)._alu(Ops.RECIP))

    def reciprocal(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.RECIP))

    def sin(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x._alu(Ops.SIN))

    def cos(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: (math.pi / 2 - x)._alu(Ops.SIN))

    def tan(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x.sin() / x.cos())

    def square(self: Tensor) -> Tensor:
        return self * self

    def abs(self: Tensor) -> Tensor:
        """|x| with torch's gradient sign(x) (0 at 0: the x*x branch is 0 there with slope 0); -0.0 gives
        +0.0 and NaN stays NaN."""
        if self.dtype.is_bool or self.dtype.is_unsigned:
            return self
        return (self > 0).where(self, (self < 0).where(-self, self * self))

    def sign(self: Tensor) -> Tensor:
        if self.dtype.is_bool:
            return self
        s = (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype) if not self.dtype.is_unsigned \
            else (self > 0).cast(self.dtype)
        return s + self * 0 if self.dtype.is_float else s  # `x * 0` keeps NaN as NaN

    def trunc(self: Tensor) -> Tensor:
        return self._alu(Ops.TRUNC) if self.dtype.is_float else self

    def floor(self: Tensor) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self: Tensor) -> Tensor:
        if not self.dtype.is_float:
            return self
        t = self.trunc()
        return (self > t).where(t + 1, t)

    def round(self: Tensor) -> Tensor:
        """Round half to even, like torch and numpy."""
        if not self.dtype.is_float:
            return self
        f = self.floor()
        diff = self - f
        f_is_odd = (f - (f * 0.5).floor() * 2) != 0
        up = (diff > 0.5) | ((diff == 0.5) & f_is_odd)
        return up.where(f + 1, f)

    def relu(self: Tensor) -> Tensor:
        """max(x, 0) with torch's gradient: 0 at x == 0 (maximum() would split a tie), NaN stays NaN."""
        if self.dtype.is_bool:
            return self
        return (self > 0).where(self, (self == self).where(self._const(0), self))

    def relu6(self: Tensor) -> Tensor:
        return self.relu().minimum(6)

    def leaky_relu(self: Tensor, neg_slope: float = 0.01) -> Tensor:
        return (self < 0).where(self * neg_slope, self)

    def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
        # the exp branch gets min(x, 0): unused for x > 0, it would overflow there and make the gradient NaN
        return self._float_fn(lambda x: (x > 0).where(x, (x.minimum(0).exp() - 1) * alpha))

    def sigmoid(self: Tensor) -> Tensor:
        """1 / (1 + e^-x) computed from e^-|x| <= 1, so neither the value nor the gradient overflows for
        large |x| (the plain form's gradient is inf/inf = NaN at x = -300)."""
        def fn(x: Tensor) -> Tensor:
            nonneg = x >= 0
            z = nonneg.where(-x, x).exp()  # e^-|x|, with slope -1 / +1 on each side (correct at 0)
            p = (1 + z)._alu(Ops.RECIP)
            return nonneg.where(p, z * p)
        return self._float_fn(fn)

    def logsigmoid(self: Tensor) -> Tensor:
        return -(-self).softplus()

    def hardsigmoid(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: (x / 6 + 0.5).clip(0, 1))

    def hardswish(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x * (x + 3).clip(0, 6) / 6)

    def hardtanh(self: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
        return self.clip(min_val, max_val)

    def tanh(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: (x * 2).sigmoid() * 2 - 1)

    def erf(self: Tensor) -> Tensor:
        """Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 (plus float32 rounding, ~3e-7 in all)."""
        def fn(x: Tensor) -> Tensor:
            ax = x.abs()
            t = (1 + 0.3275911 * ax)._alu(Ops.RECIP)
            poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                                  + t * 1.061405429))))
            return x.sign() * (1 - poly * (-(ax * ax)).exp())
        return self._float_fn(fn)

    def gelu(self: Tensor, approximate: str = "none") -> Tensor:
        """torch's gelu: exact (erf) by default, approximate='tanh' for the tanh form."""
        if approximate == "tanh":
            return self._float_fn(
                lambda x: 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh()))
        if approximate != "none":
            raise ArgumentError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._float_fn(lambda x: 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf()))

    def quick_gelu(self: Tensor) -> Tensor:
        return self * (self * 1.702).sigmoid()

    def silu(self: Tensor) -> Tensor:
        return self._float_fn(lambda x: x * x.sigmoid())

    def swish(self: Tensor) -> Tensor:
        return self.silu()

    def softplus(self: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta x)) / beta, written as max(z, 0) + log(1 + exp(-|z|)) so it cannot overflow;
        above `threshold` it is the identity, as torch."""
        def fn(x: Tensor) -> Tensor:
            z = x * beta
            sp = (z.maximum(0) + (1 + (-z.abs()).exp()).log()) * (1 / beta)
            return (z > threshold).where(x, sp)
        return self._float_fn(fn)

    def mish(self: Tensor) -> Tensor:
        return self * self.softplus().tanh()
