"""Data types: one immutable `DType` per scalar type, PyTorch-like promotion, numpy interop."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from rawgrad.errors import ArgumentTypeError


@dataclass(frozen=True, eq=True)
class DType:
    """A scalar element type. `priority` orders types for promotion inside one kind."""

    name: str
    itemsize: int
    kind: str  # 'b' bool, 'i' signed int, 'u' unsigned int, 'f' float
    priority: int
    np_name: str | None  # numpy's name for the type, None where numpy has no exact type (bfloat16)
    llvm: str  # the LLVM scalar type used by the CPU renderer

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    def __hash__(self) -> int:
        # Every UOp key hashes its dtype: the name alone (equal dtypes have equal names) instead of the
        # generated hash over all six fields.
        return hash(self.name)

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "u"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def np(self) -> np.dtype:
        """The numpy dtype used to hold this type's data on the host (bfloat16 is held as uint16 bits)."""
        return np.dtype(self.np_name if self.np_name is not None else "uint16")

    @property
    def min(self) -> int | float:
        """The smallest value (a property, as in torch.finfo/iinfo and tinygrad; -inf for floats)."""
        if self.is_bool:
            return False
        if self.is_int:
            return 0 if self.is_unsigned else -(2 ** (8 * self.itemsize - 1))
        return -math.inf

    @property
    def max(self) -> int | float:
        """The largest value (inf for floats)."""
        if self.is_bool:
            return True
        if self.is_int:
            return 2 ** (8 * self.itemsize) - 1 if self.is_unsigned else 2 ** (8 * self.itemsize - 1) - 1
        return math.inf


class dtypes:
    """Namespace of every DType (mirrors tinygrad's `dtypes` and torch's names)."""

    bool: Final = DType("bool", 1, "b", 0, "bool", "i1")
    int8: Final = DType("int8", 1, "i", 1, "int8", "i8")
    uint8: Final = DType("uint8", 1, "u", 2, "uint8", "i8")
    int16: Final = DType("int16", 2, "i", 3, "int16", "i16")
    uint16: Final = DType("uint16", 2, "u", 4, "uint16", "i16")
    int32: Final = DType("int32", 4, "i", 5, "int32", "i32")
    uint32: Final = DType("uint32", 4, "u", 6, "uint32", "i32")
    int64: Final = DType("int64", 8, "i", 7, "int64", "i64")
    uint64: Final = DType("uint64", 8, "u", 8, "uint64", "i64")
    float16: Final = DType("float16", 2, "f", 9, "float16", "half")
    bfloat16: Final = DType("bfloat16", 2, "f", 10, None, "bfloat")
    float32: Final = DType("float32", 4, "f", 11, "float32", "float")
    float64: Final = DType("float64", 8, "f", 12, "float64", "double")

    # aliases
    half = float16
    float = float32
    double = float64
    char = int8
    uchar = uint8
    short = int16
    int = int32
    long = int64

    # the index type of generated code
    index = int64
    default_float = float32
    default_int = int32

    @staticmethod
    def all() -> list[DType]:
        return list(_ALL)

    @staticmethod
    def from_np(dt: np.dtype | type) -> DType:
        npdt = np.dtype(dt)
        for d in _ALL:
            if d.np_name == npdt.name:
                return d
        raise TypeError(f"numpy dtype {npdt} has no rawgrad equivalent")

    @staticmethod
    def from_py(x: object) -> DType:
        if isinstance(x, bool):
            return dtypes.bool
        if isinstance(x, int):
            return dtypes.default_int
        if isinstance(x, float):
            return dtypes.default_float
        raise TypeError(f"cannot infer a dtype from {type(x).__name__}")

    @staticmethod
    def from_name(name: str) -> DType:
        d = getattr(dtypes, name, None)
        if not isinstance(d, DType):
            raise TypeError(f"unknown dtype name {name!r}")
        return d


_ALL: tuple[DType, ...] = (
    dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
    dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64,
)

DTypeLike = DType | str | np.dtype | type


def to_dtype(x: DTypeLike | None) -> DType:
    """Accept a DType, a name ('float32'), a numpy dtype or a Python type (float, int, bool)."""
    if x is None:
        return dtypes.default_float
    if isinstance(x, DType):
        return x
    if x is bool:
        return dtypes.bool
    if x is int:
        return dtypes.default_int
    if x is float:
        return dtypes.default_float
    try:
        if isinstance(x, str):
            return dtypes.from_name(x)
        return dtypes.from_np(x)  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError) as e:
        # the message names the argument and the choices, whichever lookup refused it
        raise ArgumentTypeError(f"dtype={x!r} is not a dtype ({e}); use a DType, a numpy dtype, "
                                f"float/int/bool or a name such as 'float32', 'int64', 'bfloat16'") from None


def _int_for(bits: int, signed: bool) -> DType:
    table = {8: (dtypes.int8, dtypes.uint8), 16: (dtypes.int16, dtypes.uint16),
             32: (dtypes.int32, dtypes.uint32), 64: (dtypes.int64, dtypes.uint64)}
    return table[bits][0 if signed else 1]


def promote_types(a: DType, b: DType) -> DType:
    """PyTorch's promotion for two tensor dtypes: bool < ints < floats; mixed signedness widens."""
    if a == b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float or b.is_float:
        if a.is_float and b.is_float:
            if {a, b} == {dtypes.float16, dtypes.bfloat16}:
                return dtypes.float32
            return a if a.priority > b.priority else b
        return a if a.is_float else b
    # both integers
    if a.is_unsigned == b.is_unsigned:
        return a if a.itemsize > b.itemsize else b
    signed, unsigned = (a, b) if not a.is_unsigned else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    if unsigned.itemsize == 8:
        # torch has no int128; uint64 mixed with a signed type goes to float like numpy does
        return dtypes.float64
    return _int_for(unsigned.itemsize * 16, True)


def result_type_with_scalar(t: DType, scalar: object) -> DType:
    """Promotion of a tensor with a Python scalar: the scalar only raises the *kind* (torch rules)."""
    if isinstance(scalar, bool):
        return t
    if isinstance(scalar, int):
        return dtypes.default_int if t.is_bool else t
    if isinstance(scalar, float):
        return t if t.is_float else dtypes.default_float
    raise TypeError(f"unsupported scalar {scalar!r} of type {type(scalar).__name__}")


def least_upper_float(t: DType) -> DType:
    """The dtype a float-only op (exp, sqrt, mean...) computes in: floats stay, others become float32."""
    return t if t.is_float else dtypes.default_float


def truncate_value(x: int | float | bool, dt: DType) -> int | float | bool:
    """Convert a Python scalar to what a `dt` element holds (wrap ints, round floats to precision)."""
    if dt.is_bool:
        return bool(x)
    if dt.is_int:
        bits = 8 * dt.itemsize
        v = int(x) & ((1 << bits) - 1)
        if not dt.is_unsigned and v >= 1 << (bits - 1):
            v -= 1 << bits
        return v
    if dt == dtypes.bfloat16:
        return float(bf16_bits_to_f32(f32_to_bf16_bits(np.array([x], np.float32)))[0])
    return float(np.array([x]).astype(dt.np)[0])


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16 bit patterns (uint16); NaN stays NaN."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), rounded)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
