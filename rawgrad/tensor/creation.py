# mypy: disable-error-code="misc"
# (the methods annotate `self: Tensor` / `cls: type[Tensor]`, the class they are mixed into; mypy files
# that under "misc")
"""Tensor constructors: empty/full/zeros/ones and their *_like forms, arange, linspace, eye, the random
factories (rand, randn, uniform, normal, randint, the init schemes) with the counter-based generator
behind them, and dropout.

The factories are classmethods so that this mixin builds the class it is mixed into without importing
tensor.py (which imports this module); `Tensor.zeros(...)` reads and behaves as a staticmethod would.
The generator's state (`_seed`, `_rng_counter`, `_rng_recorders`, `_seedings`) stays declared on Tensor
itself, where TinyJit reads and writes it.

Random numbers are Threefry-2x32 (20 rounds) computed with tensor ops on the device, keyed by (seed, call
counter): the same seed replays the same sequence, and every call shares one kernel.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DTypeLike, dtypes, to_dtype
from rawgrad.errors import ArgumentError, ArgumentTypeError
from rawgrad.tensor import autograd as _autograd
from rawgrad.tensor.buffers import new_buffer
from rawgrad.tensor.common import Scalar, _canon_device, _check_int_fits, _dim, _prod, _scalar, _shape_arg

if TYPE_CHECKING:
    from rawgrad.tensor.tensor import Tensor

# Threefry-2x32 rotation constants and key-schedule parity (Salmon et al., "Parallel random numbers: as
# easy as 1, 2, 3", SC'11, the Random123 reference for threefry2x32 with 20 rounds).
_THREEFRY_ROT = (13, 15, 26, 6, 17, 29, 16, 24)
_THREEFRY_PARITY = 0x1BD11BDA


def _with_grad(t: Tensor, requires_grad: bool | None) -> Tensor:
    """A factory's result: requires_grad as asked, or an implicit leaf (tinygrad's None) by default."""
    if requires_grad is not None:
        t.requires_grad = requires_grad
    else:
        _autograd.register_implicit_leaf(t)
    return t


def _random_leaf(t: Tensor, requires_grad: bool | None) -> Tensor:
    """A random factory's result. Asked to require gradients it is realized now, so it is a leaf holding
    fixed values (as in torch) and not a generator graph that later uses would differentiate through."""
    if requires_grad:
        t = t.realize()
    return _with_grad(t, requires_grad)


class CreationOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor (`cls` the Tensor class)."""

    __slots__ = ()

    # Every factory takes dtype, device and requires_grad (torch's keywords); requires_grad=None is
    # tinygrad's "tracked if a loss depends on it".
    @classmethod
    def empty(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        shp, dt = _shape_arg(shape), to_dtype(dtype)
        buf = new_buffer(_canon_device(device), int(_prod(shp)), dt)
        return _with_grad(cls(UOp(Ops.RESHAPE, dt, (buf,), shp)), requires_grad)

    @classmethod
    def full(cls: type[Tensor], shape: Any, fill_value: Scalar, dtype: DTypeLike | None = None,
             device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        shp = _shape_arg(shape if isinstance(shape, tuple) else (shape,))
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(_scalar(fill_value))
        _check_int_fits(_scalar(fill_value), dt)
        return _with_grad(cls._full(shp, _scalar(fill_value), dt, _canon_device(device)), requires_grad)

    @classmethod
    def zeros(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        return cls.full(_shape_arg(shape), 0, to_dtype(dtype), device, requires_grad)

    @classmethod
    def ones(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        return cls.full(_shape_arg(shape), 1, to_dtype(dtype), device, requires_grad)

    def full_like(self: Tensor, fill_value: Scalar, dtype: DTypeLike | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return type(self).full(self.shape, fill_value, dtype or self.dtype, device or self.device,
                               requires_grad)

    def zeros_like(self: Tensor, dtype: DTypeLike | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        return self.full_like(0, dtype, device, requires_grad)

    def ones_like(self: Tensor, dtype: DTypeLike | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return self.full_like(1, dtype, device, requires_grad)

    def empty_like(self: Tensor, dtype: DTypeLike | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        return type(self).empty(self.shape, dtype=dtype or self.dtype, device=device or self.device,
                            requires_grad=requires_grad)

    @classmethod
    def arange(cls: type[Tensor], start: Scalar, stop: Scalar | None = None, step: Scalar = 1,
               dtype: DTypeLike | None = None, device: str | None = None,
               requires_grad: bool | None = None) -> Tensor:
        """Values start, start+step, ... below stop. The values are uploaded (an arange has no kernel of
        its own), so ops that compare against positions read them like any input."""
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ArgumentError("arange step must not be zero")
        all_int = all(isinstance(_scalar(v), int) for v in (start, stop, step))
        dt = to_dtype(dtype) if dtype is not None else dtypes.default_int if all_int else dtypes.default_float
        n = max(0, math.ceil((stop - start) / step))
        vals = np.add(start, np.multiply(np.arange(n, dtype=np.int64 if all_int else np.float64), step))
        return cls(vals, device=device, dtype=dt, requires_grad=requires_grad)

    @classmethod
    def linspace(cls: type[Tensor], start: float, end: float, steps: int, dtype: DTypeLike | None = None,
                 device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        if steps < 0:
            raise ArgumentError(f"linspace needs steps >= 0, got {steps}")
        return cls(np.linspace(start, end, steps), device=device, dtype=dtype or dtypes.default_float,
                      requires_grad=requires_grad)

    @classmethod
    def eye(cls: type[Tensor], n: int, m: int | None = None, dtype: DTypeLike | None = None,
            device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        n = _dim(n, "eye(n)")
        m = n if m is None else _dim(m, "eye(m)")
        rows = cls.arange(n, device=device).reshape(n, 1)
        eye = (rows == cls.arange(m, device=device).reshape(1, m)).cast(to_dtype(dtype))
        return _with_grad(eye, requires_grad)

    # ------------------------------------------------------------------ random numbers
    @classmethod
    def manual_seed(cls: type[Tensor], seed: int = 0) -> None:
        """Reset the generator: the same seed replays the same sequence of random tensors."""
        cls._seed = int(seed)
        cls._rng_counter = 0
        cls._seedings += 1

    @classmethod
    def _rng_key(cls: type[Tensor], counter: int) -> np.ndarray:
        """The Threefry key for one _random_bits call: (folded seed, call counter) as two uint32 words."""
        seed = cls._seed
        return np.array([(seed ^ (seed >> 32)) & 0xFFFFFFFF, counter & 0xFFFFFFFF], np.uint32)

    @classmethod
    def _random_bits(cls: type[Tensor], n: int, device: str) -> Tensor:
        """n uniformly random uint32 words: Threefry-2x32 (20 rounds) run with tensor ops on the device.

        Key = (seed, call counter), counter block = (position, 0). The key is uploaded as data rather
        than baked into the graph as constants, so every call shares one kernel (and a TinyJit replay
        can write the next key into the same buffer)."""
        u32 = dtypes.uint32
        counter = cls._rng_counter
        key = cls._rng_key(counter)
        cls._rng_counter += 1
        if n == 0:
            return cls.zeros(0, dtype=u32, device=device)
        half = (n + 1) // 2
        kt = cls(key, device=device)
        for rec in cls._rng_recorders:
            rec.append((kt.uop.base, counter))
        x0, x1 = threefry2x32(cls.arange(half, dtype=u32, device=device),
                              cls.zeros(half, dtype=u32, device=device),
                              kt[0:1].expand(half), kt[1:2].expand(half))
        bits = x0.cat(x1)
        return bits[:n] if 2 * half != n else bits

    @classmethod
    def rand(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        """Uniform in [0, 1)."""
        shp, dt, dev = _shape_arg(shape), to_dtype(dtype), _canon_device(device)
        if not dt.is_float:
            raise ArgumentTypeError(f"rand needs a float dtype, got {dt}")
        # keep only as many random bits as dt's mantissa holds, so rounding can never reach 1.0
        mant = {dtypes.float16: 10, dtypes.bfloat16: 7}.get(dt, 23)
        bits = cls._random_bits(int(_prod(shp)), dev)
        one_to_two = ((bits >> (32 - mant)) << (23 - mant)) | 0x3F800000  # float32 in [1, 2)
        return _random_leaf((one_to_two.bitcast(dtypes.float32) - 1.0).cast(dt).reshape(shp), requires_grad)

    @classmethod
    def randn(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        """Standard normal (Box-Muller on two uniforms)."""
        shp, dt = _shape_arg(shape), to_dtype(dtype)
        u = cls.rand(2, *shp, device=device)
        r = (1.0 - u[0]).log().mul(-2.0).sqrt()  # 1 - u is in (0, 1], so the log is finite
        return _random_leaf((r * (u[1] * (2 * math.pi)).cos()).cast(dt), requires_grad)

    @classmethod
    def uniform(cls: type[Tensor], *shape: Any, low: float = 0.0, high: float = 1.0,
                dtype: DTypeLike | None = None,
                device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        dt = to_dtype(dtype)
        return _random_leaf((cls.rand(*shape, device=device) * (high - low) + low).cast(dt),
                            requires_grad)

    @classmethod
    def normal(cls: type[Tensor], *shape: Any, mean: float = 0.0, std: float = 1.0,
               dtype: DTypeLike | None = None,
               device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        return _random_leaf((cls.randn(*shape, device=device) * std + mean).cast(to_dtype(dtype)),
                            requires_grad)

    @classmethod
    def randint(cls: type[Tensor], *shape: Any, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32,
                device: str | None = None) -> Tensor:
        """Integers uniform in [low, high)."""
        if high <= low:
            raise ArgumentError(f"randint needs low < high, got [{low}, {high})")
        # float32 keeps every backend able to run it (no float64 on some GPUs); its 23 random bits are
        # plenty for the ranges randint is used with
        u = cls.rand(*shape, device=device)
        return (u * (high - low)).floor().cast(dtypes.int64).add(low).cast(to_dtype(dtype))

    def rand_like(self: Tensor, dtype: DTypeLike | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return type(self).rand(self.shape, dtype=dtype or self.dtype, device=device or self.device,
                           requires_grad=requires_grad)

    def randn_like(self: Tensor, dtype: DTypeLike | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        return type(self).randn(self.shape, dtype=dtype or self.dtype, device=device or self.device,
                            requires_grad=requires_grad)

    @classmethod
    def scaled_uniform(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None,
                       device: str | None = None) -> Tensor:
        shp = _shape_arg(shape)
        return cls.uniform(*shp, low=-1.0, high=1.0, dtype=dtype, device=device) * \
            (_prod(shp) ** -0.5)

    @classmethod
    def glorot_uniform(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None,
                       device: str | None = None) -> Tensor:
        shp = _shape_arg(shape)
        bound = (6 / (shp[0] + _prod(shp[1:]))) ** 0.5
        return cls.uniform(*shp, low=-bound, high=bound, dtype=dtype, device=device)

    @classmethod
    def kaiming_uniform(cls: type[Tensor], *shape: Any, a: float = 0.01, dtype: DTypeLike | None = None,
                        device: str | None = None) -> Tensor:
        shp = _shape_arg(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(_prod(shp[1:]))
        return cls.uniform(*shp, low=-bound, high=bound, dtype=dtype, device=device)

    @classmethod
    def kaiming_normal(cls: type[Tensor], *shape: Any, a: float = 0.01, dtype: DTypeLike | None = None,
                       device: str | None = None) -> Tensor:
        shp = _shape_arg(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(_prod(shp[1:]))
        return cls.normal(*shp, mean=0.0, std=std, dtype=dtype, device=device)

    def dropout(self: Tensor, p: float = 0.5) -> Tensor:
        """Zero elements with probability p and scale the rest by 1/(1-p); identity unless training."""
        if not type(self).training or p == 0:
            return self
        if not 0 <= p <= 1:
            raise ArgumentError(f"dropout probability must be in [0, 1], got {p}")
        keep = type(self).rand(self.shape, device=self.device) >= p
        return keep.where(self * (1.0 / (1.0 - p)) if p < 1 else self * 0, 0)


def threefry2x32(x0: Tensor, x1: Tensor, k0: Tensor, k1: Tensor) -> tuple[Tensor, Tensor]:
    """Threefry-2x32 with 20 rounds on uint32 tensors: counter (x0, x1), key (k0, k1) -> two words."""
    ks = (k0, k1, k0 ^ k1 ^ _THREEFRY_PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for r in range(20):
        rot = _THREEFRY_ROT[r % 8]
        x0 = x0 + x1
        x1 = ((x1 << rot) | (x1 >> (32 - rot))) ^ x0
        if r % 4 == 3:  # key injection after every 4 rounds
            s = r // 4 + 1
            x0 = x0 + ks[s % 3]
            x1 = x1 + ks[(s + 1) % 3] + s
    return x0, x1
