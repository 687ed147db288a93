"""Small helpers every Tensor module shares, none of which needs the Tensor class: the default device,
argument checks (sizes, shapes, axes tuples), broadcasting of shapes, scalar handling and numpy-to-host
conversion. They sit below tensor.py and its mixin modules, so those import them at module level.
tensor.py re-exports the names that other packages import from it (`_canon_device`, `_to_tuple`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rawgrad.compiler.ir import UOp
from rawgrad.dtype import DType, dtypes, f32_to_bf16_bits
from rawgrad.errors import ArgumentError, ArgumentTypeError, ShapeError
from rawgrad.hcq.device import Device

_default_device: str | None = None


def default_device() -> str:
    """DEV from the environment, else the best device the registry detects; resolved on first use (not at
    import: importing rawgrad probes no driver, and a bad DEV is reported where a tensor is first made)."""
    global _default_device
    if _default_device is None:
        _default_device = Device.DEFAULT
    return _default_device


Scalar = int | float | bool
TensorLike = "Tensor | Scalar | list | tuple | np.ndarray"
Axis = int | Sequence[int] | None

_LOG2_E = 1.0 / math.log(2.0)
_LN_2 = math.log(2.0)
_HALF_TYPES = (dtypes.float16, dtypes.bfloat16)
_NO_ARG: Any = object()  # "argument not given", where None is a meaningful value


# ---------------------------------------------------------------------- small helpers
def _canon_device(device: str | None) -> str:
    return default_device() if device is None else Device.canonicalize(str(device))


def _prod(xs: Sequence[Any]) -> Any:
    out: Any = 1
    for x in xs:
        out = out * x
    return out


MAX_NUMEL = 2 ** 63 - 1  # element indices are int64 in every kernel


def _dim(s: Any, what: str, allow_minus_one: bool = False) -> Any:
    """One size the user passed: an int >= 0 (or -1 where it means "infer"/"keep") or a symbolic size.
    Checked where the user passes it, so a float or a negative size fails here with its name, not later
    inside the scheduler or the allocator."""
    if isinstance(s, UOp):
        return s
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
        raise ArgumentTypeError(f"{what}: sizes must be integers, got {s!r} ({type(s).__name__})")
    s = int(s)
    if s < 0 and not (allow_minus_one and s == -1):
        raise ArgumentError(f"{what}: negative size {s}")
    return s


def _check_numel(shape: tuple[Any, ...], what: str) -> None:
    n = 1
    for d in shape:
        if isinstance(d, int):
            n *= d
    if n > MAX_NUMEL:
        raise ShapeError(f"{what}: shape {shape} has {n} elements, more than an int64 index addresses")


def _shape_arg(shape: tuple[Any, ...], what: str = "shape") -> tuple[int, ...]:
    """Accept f(2, 3) and f((2, 3)) alike, as torch and tinygrad do."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    out = tuple(_dim(s, f"{what} {tuple(shape)}") for s in shape)
    _check_numel(out, what)
    return out


def _broadcast_shapes(*shapes: tuple[Any, ...]) -> tuple[Any, ...]:
    nd = max(len(s) for s in shapes)
    padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if not (isinstance(d, int) and d == 1)}
        if len(sizes) > 1:
            raise ShapeError(f"cannot broadcast {tuple(shapes[0])} with {tuple(shapes[1])}"
                             if len(shapes) == 2 else f"cannot broadcast shapes {[tuple(s) for s in shapes]}")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _to_tuple(x: int | Sequence[int], n: int, what: str, positive: bool = False) -> tuple[int, ...]:
    t = (x,) * n if isinstance(x, (int, np.integer)) else tuple(x)
    if len(t) != n:
        raise ArgumentError(f"{what} needs 1 or {n} values, got {t}")
    for v in t:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ArgumentTypeError(f"{what} must be integers, got {x!r}")
        if positive and v < 1:
            raise ArgumentError(f"{what} must be >= 1, got {x!r}")
    return tuple(int(v) for v in t)


def _np_to_host(arr: np.ndarray, dt: DType) -> np.ndarray:
    """Convert numpy data to dt's host layout (bfloat16 as bits; casts follow CAST's rules)."""
    if dt == dtypes.bfloat16:
        return f32_to_bf16_bits(np.asarray(arr, dtype=np.float32)).reshape(np.shape(arr))
    if dt.is_bool:
        return np.asarray(arr) != 0
    with np.errstate(all="ignore"):
        return np.asarray(arr).astype(dt.np)


def _scalar(x: Any) -> Any:
    """numpy scalars behave like Python scalars in promotion."""
    return x.item() if isinstance(x, np.generic) else x


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (int, float, bool, np.generic))


def _check_int_fits(v: Any, dt: DType) -> None:
    """A Python int that an integer dtype cannot hold is refused (as numpy 2 does), never truncated."""
    if isinstance(v, int) and not isinstance(v, bool) and dt.is_int and not dt.min <= v <= dt.max:
        raise OverflowError(f"Python integer {v} is out of range for {dt} ({dt.min}..{dt.max})")
