"""The UOp IR: one immutable, hash-consed node type for tensor graphs, kernels, loops and linear programs.

A UOp is (op, dtype, src, arg). Building the same node twice returns the same object, so structural
equality is identity and a graph shares every common subexpression for free.

Stages and the ops legal in each (checked by `verify` in tests):
- tensor graph: BUFFER, CONST, DEVICE, movement ops, ALU, CAST, BITCAST, REDUCE_AXIS, CONTIGUOUS, COPY,
  ASSIGN, DEFINE_VAR, BIND
- kernel (what the scheduler hands the lowerer): SINK of STOREs whose values read LOADs through VIEWs
- loops / linear program (what the lowerer hands a renderer): RANGE, ENDRANGE, DEFINE_ACC, INDEX, LOAD,
  STORE, ALU, CAST, BITCAST, CONST, DEFINE_GLOBAL, DEFINE_VAR, SPECIAL (and GROUP_COMBINE on the GPU)
"""
from __future__ import annotations

import math
import struct
import threading
import weakref
from collections.abc import Callable
from enum import Enum, auto
from typing import Any

from rawgrad.dtype import DType, dtypes, truncate_value


class Ops(Enum):
    # Members are singletons compared by identity: hash them by identity too, in C (Enum's own __hash__
    # is Python code hashing the name, and every UOp key hashes its op).
    __hash__ = object.__hash__

    # ---- graph roots / sources
    SINK = auto()
    DEVICE = auto()  # arg: device name
    BUFFER = auto()  # src: (DEVICE,), arg: a unique buffer handle; shape (size,)
    CONST = auto()  # arg: the Python value; tensor graph: src (DEVICE,), shape ()
    DEFINE_VAR = auto()  # arg: (name, min, max); a bounded symbolic integer
    BIND = auto()  # src: (DEFINE_VAR, CONST): a variable with its value for one call

    # ---- movement (tensor graph only; the scheduler folds them into VIEWs)
    RESHAPE = auto()  # arg: new shape
    PERMUTE = auto()  # arg: axis order
    EXPAND = auto()  # arg: new shape
    PAD = auto()  # arg: ((before, after), ...)
    SHRINK = auto()  # arg: ((start, end), ...)
    FLIP = auto()  # arg: tuple of bool per axis

    # ---- tensor-graph structure
    REDUCE_AXIS = auto()  # arg: (reduce op ADD/MUL/MAX, axes)
    CONTIGUOUS = auto()  # force the value into its own buffer
    COPY = auto()  # arg: destination device name
    ASSIGN = auto()  # src: (target, value): write value into target's buffer
    # rows of a 2-d table picked by integer indices (embedding lookup). Tensor graph: src (table (V, D),
    # indices S), shape S + (D,). Kernel graph: src (DEFINE_GLOBAL table, VIEW of the output space as a
    # contiguous (N, D), row index value), arg (V, D); an index outside [0, V) reads 0.
    GATHER = auto()

    # ---- unary ALU
    NEG = auto()
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    SQRT = auto()
    RECIP = auto()
    TRUNC = auto()
    NOT = auto()  # logical not for bools, bitwise not for ints
    # ---- binary ALU
    ADD = auto()
    SUB = auto()
    MUL = auto()
    FDIV = auto()
    IDIV = auto()  # integer division truncating toward zero (C semantics)
    MOD = auto()  # C remainder (sign of the dividend)
    MAX = auto()
    POW = auto()
    CMPLT = auto()
    CMPNE = auto()
    CMPEQ = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()
    # ---- ternary ALU
    WHERE = auto()
    MULACC = auto()

    # ---- conversions
    CAST = auto()
    BITCAST = auto()

    # ---- kernel graph
    DEFINE_GLOBAL = auto()  # arg: buffer slot number; dtype: element type
    VIEW = auto()  # arg: ShapeTracker; src: (DEFINE_GLOBAL,) or a value
    LOAD = auto()  # kernel: src (DEFINE_GLOBAL, VIEW); loops: src (INDEX,) or (INDEX, valid, alt)
    STORE = auto()  # kernel: src (DEFINE_GLOBAL, VIEW, value); loops: src (INDEX, value)

    # ---- loops
    RANGE = auto()  # src: (start, end), arg: (loop number, kind); counts start..end-1
    ENDRANGE = auto()  # src: (RANGE,)
    SPECIAL = auto()  # arg: (name, max value): a launch parameter such as the global range start
    INDEX = auto()  # src: (DEFINE_GLOBAL, index): the address of one element
    DEFINE_ACC = auto()  # src: (init value, *reduce RANGEs), arg: accumulator number
    ACC_UPDATE = auto()  # src: (DEFINE_ACC, new value): store into the accumulator inside its loops
    # src: (DEFINE_ACC,), arg: (reduce op, threads): GPU only; combine the accumulator of the threads that
    # share one output (a thread group, see lower.py); afterwards every one of them holds the result
    GROUP_COMBINE = auto()
    REDUCE = auto()  # src: (value, *ranges), arg: reduce op; removed before linearizing


UNARY = {Ops.NEG, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC, Ops.NOT}
BINARY = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.POW, Ops.CMPLT, Ops.CMPNE,
          Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
TERNARY = {Ops.WHERE, Ops.MULACC}
ALU = UNARY | BINARY | TERNARY
COMPARISON = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}
COMMUTATIVE = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR}
MOVEMENT = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
REDUCE_OPS = {Ops.ADD, Ops.MUL, Ops.MAX}


# Markers no arg can contain, so a tagged key never equals the key of another arg.
_FLOAT_KEY, _BOOL_KEY, _TUPLE_KEY = object(), object(), object()


def _arg_key(arg: Any) -> Any:
    """A hashable key that keeps apart args Python calls equal (0.0 vs -0.0, 1 vs True vs 1.0). Ints,
    strings, None and tuples of only those (most args) are their own key: no key is built for them."""
    kind = type(arg)
    if kind is int or kind is str or arg is None:
        return arg
    if kind is tuple:
        for a in arg:
            k = type(a)
            if not (k is int or k is str or a is None):
                return (_TUPLE_KEY,) + tuple(_arg_key(a) for a in arg)
        return arg
    if kind is float:
        return (_FLOAT_KEY, struct.pack("<d", arg))
    if kind is bool:
        return (_BOOL_KEY, arg)
    return arg


class _UOpMeta(type):
    _cache: weakref.WeakValueDictionary[Any, UOp] = weakref.WeakValueDictionary()
    _lock = threading.Lock()

    def __call__(cls, op: Ops, dtype: DType | None = None,
                 src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        key = (op, dtype, src, _arg_key(arg))
        hit = _UOpMeta._cache.get(key)
        if hit is not None:
            return hit
        # a miss is decided again under the lock: two threads building the same node must get one object
        # (graphs are compared and memoized by identity), and the fast path above stays lock-free
        with _UOpMeta._lock:
            hit = _UOpMeta._cache.get(key)
            if hit is not None:
                return hit
            node = super().__call__(op, dtype, src, arg)
            _UOpMeta._cache[key] = node
            return node


class UOp(metaclass=_UOpMeta):
    """One node of the IR. Never mutate; build new nodes with `replace` or the helpers."""

    __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "_cached")

    def __init__(self, op: Ops, dtype: DType | None = None, src: tuple[UOp, ...] = (), arg: Any = None):
        self.op = op
        self.dtype = dtype
        self.src = src
        self.arg = arg
        self._cached: dict[str, Any] = {}

    def __repr__(self) -> str:
        return pretty(self, max_depth=4)

    def __reduce__(self) -> tuple[Any, ...]:
        return (UOp, (self.op, self.dtype, self.src, self.arg))

    def replace(self, **kw: Any) -> UOp:
        return UOp(kw.get("op", self.op), kw.get("dtype", self.dtype), kw.get("src", self.src),
                   kw.get("arg", self.arg))

    # ------------------------------------------------------------------ traversal
    def toposort(self) -> list[UOp]:
        """Every node reachable from self, each after all of its sources."""
        order: list[UOp] = []
        seen: set[UOp] = set()
        stack: list[tuple[UOp, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            for s in reversed(node.src):
                if s not in seen:
                    stack.append((s, False))
        return order

    def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
        """Replace nodes by identity, rebuilding everything above them."""
        memo: dict[UOp, UOp] = {}
        for node in self.toposort():
            if node in mapping:
                memo[node] = mapping[node]
                continue
            new_src = tuple(memo[s] for s in node.src)
            memo[node] = node if new_src == node.src else node.replace(src=new_src)
        return memo[self]

    # ------------------------------------------------------------------ constructors
    @staticmethod
    def const(dtype: DType, value: Any, device: UOp | None = None) -> UOp:
        v = truncate_value(value, dtype) if not isinstance(value, UOp) else value
        return UOp(Ops.CONST, dtype, (device,) if device is not None else (), v)

    @staticmethod
    def variable(name: str, vmin: int, vmax: int) -> UOp:
        if not (isinstance(vmin, int) and isinstance(vmax, int)) or vmin > vmax:
            raise ValueError(f"Variable {name!r} needs integer bounds with min <= max, got [{vmin}, {vmax}]")
        return UOp(Ops.DEFINE_VAR, dtypes.index, (), (name, vmin, vmax))

    def bind(self, value: int) -> UOp:
        if self.op is not Ops.DEFINE_VAR:
            raise TypeError("only a Variable can be bound")
        name, lo, hi = self.arg
        if not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"Variable {name!r} bound to {value!r}, outside its range [{lo}, {hi}]")
        return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dt, value)))

    def unbind(self) -> tuple[UOp, int]:
        assert self.op is Ops.BIND
        return self.src[0], self.src[1].arg

    @property
    def expr(self) -> str:
        assert self.op is Ops.DEFINE_VAR
        return self.arg[0]

    def alu(self, op: Ops, *others: UOp) -> UOp:
        out_dtype = dtypes.bool if op in COMPARISON else self.dtype
        if op is Ops.WHERE:
            out_dtype = others[0].dtype
        srcs = (self,) + others
        folded = _fold(op, out_dtype, srcs)
        if folded is not None:
            return folded
        return UOp(op, out_dtype, srcs)

    def cast(self, dtype: DType) -> UOp:
        if self.dtype == dtype:
            return self
        if self.op is Ops.CONST and not self.src:
            return UOp.const(dtype, self.arg)
        return UOp(Ops.CAST, dtype, (self,))

    # ------------------------------------------------------------------ symbolic sugar (index math)
    @property
    def dt(self) -> DType:
        """The dtype of a value node (structural nodes such as SINK have none)."""
        if self.dtype is None:
            raise TypeError(f"{self.op} node has no dtype")
        return self.dtype

    def _c(self, x: UOp | int | float | bool) -> UOp:
        return x if isinstance(x, UOp) else UOp.const(self.dt, x)

    def __add__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.ADD, self._c(x))

    def __radd__(self, x: UOp | int) -> UOp:
        return self._c(x).alu(Ops.ADD, self)

    def __sub__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.ADD, self._c(x).alu(Ops.MUL, self._c(-1))) if self.dt.is_int \
            else self.alu(Ops.SUB, self._c(x))

    def __rsub__(self, x: UOp | int) -> UOp:
        return self._c(x) - self

    def __mul__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.MUL, self._c(x))

    def __rmul__(self, x: UOp | int) -> UOp:
        return self._c(x).alu(Ops.MUL, self)

    def __neg__(self) -> UOp:
        return self * -1 if self.dt.is_int else self.alu(Ops.NEG)

    def __floordiv__(self, x: UOp | int) -> UOp:
        """Index division; index math only divides non-negative values, so C truncation is floor."""
        return self.alu(Ops.IDIV, self._c(x))

    def __mod__(self, x: UOp | int) -> UOp:
        return self.alu(Ops.MOD, self._c(x))

    def __rfloordiv__(self, x: int) -> UOp:
        return self._c(x).alu(Ops.IDIV, self)

    def __rmod__(self, x: int) -> UOp:
        return self._c(x).alu(Ops.MOD, self)

    def lt(self, x: UOp | int) -> UOp:
        return self.alu(Ops.CMPLT, self._c(x))

    def ge(self, x: UOp | int) -> UOp:
        return self.lt(x).alu(Ops.NOT)

    def ne(self, x: UOp | int) -> UOp:
        return self.alu(Ops.CMPNE, self._c(x))

    def eq(self, x: UOp | int) -> UOp:
        return self.alu(Ops.CMPEQ, self._c(x))

    def maximum(self, x: UOp | int) -> UOp:
        return self.alu(Ops.MAX, self._c(x))

    def minimum(self, x: UOp | int) -> UOp:
        return -((-self).maximum(-self._c(x)))

    def logical_and(self, x: UOp | bool) -> UOp:
        return self.alu(Ops.AND, x if isinstance(x, UOp) else UOp.const(dtypes.bool, x))

    def where(self, a: UOp | int | float, b: UOp | int | float) -> UOp:
        dt = a.dt if isinstance(a, UOp) else b.dt if isinstance(b, UOp) else dtypes.from_py(a)
        ua = a if isinstance(a, UOp) else UOp.const(dt, a)
        ub = b if isinstance(b, UOp) else UOp.const(dt, b)
        return self.alu(Ops.WHERE, ua, ub)

    def __bool__(self) -> bool:
        raise TypeError(f"a symbolic value has no truth value: {self.render()}")

    def __int__(self) -> int:
        if self.op is Ops.CONST:
            return int(self.arg)
        raise TypeError(f"symbolic value {self.render()} is not a constant int")

    # ------------------------------------------------------------------ bounds (for symbolic sizes)
    @property
    def vmin(self) -> int | float:
        return self._bounds()[0]

    @property
    def vmax(self) -> int | float:
        return self._bounds()[1]

    def _bounds(self) -> tuple[Any, Any]:
        b = self._cached.get("bounds")
        if b is None:
            b = _compute_bounds(self)
            self._cached["bounds"] = b
        return b

    def is_const(self, value: Any = None) -> bool:
        return self.op is Ops.CONST and (value is None or self.arg == value)

    # ------------------------------------------------------------------ vars
    def variables(self) -> list[UOp]:
        """The DEFINE_VARs this expression depends on (through BINDs too), sorted by name."""
        found = {n.src[0] if n.op is Ops.BIND else n for n in self.toposort() if n.op in (Ops.DEFINE_VAR,
                                                                                          Ops.BIND)}
        return sorted(found, key=lambda v: v.arg)

    def render(self) -> str:
        """A C-like string of an index expression (used in errors and DEBUG output)."""
        return render_expr(self)

    # ------------------------------------------------------------------ tensor-graph properties
    @property
    def shape(self) -> tuple[Any, ...]:
        s = self._cached.get("shape")
        if s is None:
            s = _infer_shape(self)
            self._cached["shape"] = s
        return s

    @property
    def device(self) -> str:
        d = self._cached.get("device")
        if d is None:
            d = _infer_device(self)
            self._cached["device"] = d
        return d

    @property
    def base(self) -> UOp:
        """Skip movement ops: the node whose data this view looks at."""
        node = self
        while node.op in MOVEMENT:
            node = node.src[0]
        return node


def Variable(name: str, vmin: int, vmax: int) -> UOp:
    """A bounded symbolic integer (sequence length, position...). Bind a value with `.bind(v)`."""
    return UOp.variable(name, vmin, vmax)


SInt = Any  # int | UOp; kept as Any so mypy accepts arithmetic on mixed sizes


# ---------------------------------------------------------------------- constant folding
def _c_idiv(x: Any, y: Any) -> Any:
    """C division (truncating toward zero); exact for ints of any size, where `int(x / y)` is not."""
    if y == 0:
        return 0
    if isinstance(x, int) and isinstance(y, int):
        q = abs(x) // abs(y)
        return q if (x < 0) == (y < 0) else -q
    return int(x / y)


def _c_mod(x: Any, y: Any) -> Any:
    """C remainder (sign of the dividend), exact for ints of any size."""
    if y == 0:
        return 0
    if isinstance(x, int) and isinstance(y, int):
        return x - y * _c_idiv(x, y)
    return int(math.fmod(x, y))


_PY_ALU: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: lambda x: -x, Ops.ADD: lambda x, y: x + y, Ops.SUB: lambda x, y: x - y,
    Ops.MUL: lambda x, y: x * y, Ops.MAX: lambda x, y: max(x, y),
    Ops.IDIV: lambda x, y: _c_idiv(x, y), Ops.MOD: lambda x, y: _c_mod(x, y),
    Ops.CMPLT: lambda x, y: x < y, Ops.CMPNE: lambda x, y: x != y, Ops.CMPEQ: lambda x, y: x == y,
    Ops.AND: lambda x, y: x & y if not isinstance(x, bool) else x and y,
    Ops.OR: lambda x, y: x | y if not isinstance(x, bool) else x or y,
    Ops.XOR: lambda x, y: x ^ y, Ops.WHERE: lambda c, a, b: a if c else b,
    Ops.NOT: lambda x: (not x) if isinstance(x, bool) else ~x,
    Ops.MULACC: lambda a, b, c: a * b + c,
}


def exec_python_alu(op: Ops, dtype: DType, args: tuple[Any, ...]) -> Any:
    return truncate_value(_PY_ALU[op](*args), dtype)


def _fold(op: Ops, dtype: DType | None, srcs: tuple[UOp, ...]) -> UOp | None:
    """Folds that are always valid, done while building so index math stays small."""
    if dtype is None:
        return None
    consts = [s.op is Ops.CONST and not s.src for s in srcs]
    if all(consts) and op in _PY_ALU and (dtype.is_int or dtype.is_bool):
        return UOp.const(dtype, exec_python_alu(op, dtype, tuple(s.arg for s in srcs)))
    if op is Ops.WHERE and consts[0]:
        return srcs[1] if srcs[0].arg else srcs[2]
    if not (dtype.is_int or dtype.is_bool) or len(srcs) != 2:
        return None
    a, b = srcs
    if op is Ops.ADD:
        if b.is_const(0):
            return a
        if a.is_const(0):
            return b
    if op is Ops.MUL:
        if b.is_const(1):
            return a
        if a.is_const(1):
            return b
        if b.is_const(0) or a.is_const(0):
            return UOp.const(dtype, 0)
    if op is Ops.IDIV and b.is_const(1):
        return a
    if op is Ops.MOD and b.is_const(1):
        return UOp.const(dtype, 0)
    if op is Ops.AND and dtype.is_bool:
        if b.is_const(True):
            return a
        if a.is_const(True):
            return b
        if a.is_const(False) or b.is_const(False):
            return UOp.const(dtype, False)
    return None


# ---------------------------------------------------------------------- bounds
def _compute_bounds(u: UOp) -> tuple[Any, Any]:
    dt = u.dtype
    if u.op is Ops.CONST:
        return u.arg, u.arg
    if u.op is Ops.DEFINE_VAR:
        return u.arg[1], u.arg[2]
    if u.op is Ops.BIND:
        return u.src[0].vmin, u.src[0].vmax
    if u.op is Ops.RANGE:
        return u.src[0].vmin, u.src[1].vmax - 1
    if u.op is Ops.SPECIAL:
        return 0, u.arg[1]
    if dt is None:
        return -math.inf, math.inf
    if dt.is_bool and u.op in COMPARISON:
        a, b = u.src
        if u.op is Ops.CMPLT:
            if a.vmax < b.vmin:
                return True, True
            if a.vmin >= b.vmax:
                return False, False
        if u.op is Ops.CMPNE:
            if a.vmax < b.vmin or a.vmin > b.vmax:
                return True, True
            if a.vmin == a.vmax == b.vmin == b.vmax:
                return False, False
        return False, True
    if len(u.src) == 2 and (dt.is_int):
        (a0, a1), (b0, b1) = u.src[0]._bounds(), u.src[1]._bounds()
        if u.op is Ops.ADD:
            return a0 + b0, a1 + b1
        if u.op is Ops.MUL:
            vals = [a0 * b0, a0 * b1, a1 * b0, a1 * b1]
            vals = [v for v in vals if not (isinstance(v, float) and math.isnan(v))] or [-math.inf, math.inf]
            return min(vals), max(vals)
        if u.op is Ops.MAX:
            return max(a0, b0), max(a1, b1)
        if u.op is Ops.IDIV and b0 == b1 and isinstance(b0, int) and b0 > 0:
            lo = a0 // b0 if a0 >= 0 else -((-a0) // b0) if not isinstance(a0, float) else a0
            hi = a1 // b0 if a1 >= 0 else -((-a1) // b0) if not isinstance(a1, float) else a1
            return lo, hi
        if u.op is Ops.MOD and b0 == b1 and isinstance(b0, int) and b0 > 0:
            if a0 >= 0:
                return (a0, a1) if a1 < b0 else (0, b0 - 1)
            return -(b0 - 1), b0 - 1
    if u.op is Ops.WHERE and dt.is_int:
        return min(u.src[1].vmin, u.src[2].vmin), max(u.src[1].vmax, u.src[2].vmax)
    if u.op is Ops.CAST and dt.is_int and u.src[0].dtype is not None and u.src[0].dtype.is_int:
        return max(u.src[0].vmin, dt.min), min(u.src[0].vmax, dt.max)
    return dt.min, dt.max


# ---------------------------------------------------------------------- shape / device inference
def _infer_shape(u: UOp) -> tuple[Any, ...]:
    op = u.op
    if op is Ops.BUFFER:
        return (u.arg[1],) if isinstance(u.arg, tuple) else (u.arg.size,)
    if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.DEVICE):
        return ()
    if op in (Ops.RESHAPE, Ops.EXPAND):
        return tuple(u.arg)
    if op is Ops.PERMUTE:
        s = u.src[0].shape
        return tuple(s[i] for i in u.arg)
    if op is Ops.PAD:
        return tuple(d + b + a for d, (b, a) in zip(u.src[0].shape, u.arg))
    if op is Ops.SHRINK:
        return tuple(shrink_size(b, e) for b, e in u.arg)
    if op is Ops.FLIP:
        return u.src[0].shape
    if op is Ops.REDUCE_AXIS:
        axes = u.arg[1]
        return tuple(1 if i in axes else d for i, d in enumerate(u.src[0].shape))
    if op is Ops.ASSIGN:
        return u.src[0].shape
    if op is Ops.GATHER:
        return (*u.src[1].shape, u.src[0].shape[1])
    if op is Ops.VIEW:
        return u.arg.shape
    if op in ALU:
        # all sources have the same shape in the tensor graph (broadcasting happens in Tensor)
        return u.src[-1].shape if op is Ops.WHERE else u.src[0].shape
    if u.src:
        return u.src[0].shape
    return ()


# How a symbolic size is folded (to an int when it is constant). The rules are compiler/symbolic.py's, and
# symbolic is built on this module, so this module cannot import them without a cycle: symbolic installs
# its folder here when it is imported (`set_size_folder`). The package root imports it (through the Tensor
# layer) before any graph can exist, so a SHRINK's shape is never computed without it.
_size_folder: Callable[[UOp], Any] | None = None


def set_size_folder(fold: Callable[[UOp], Any]) -> None:
    """Install the function that simplifies a symbolic size (compiler/symbolic.py calls this)."""
    global _size_folder
    _size_folder = fold


def shrink_size(begin: Any, end: Any) -> Any:
    """end - begin; a window that slides with a Variable, (v, v + n), has the constant size n, so
    `x.shrink(((v, v + 1),))` is one row and can take a one-row assign or meet a one-row operand."""
    size = end - begin
    if isinstance(begin, UOp) and isinstance(end, UOp):
        if _size_folder is None:
            raise RuntimeError("symbolic shrink bounds need rawgrad.compiler.symbolic, which is not imported")
        folded = _size_folder(size)
        if isinstance(folded, int):
            return folded
    return size


def _infer_device(u: UOp) -> str:
    if u.op is Ops.DEVICE:
        return u.arg
    if u.op is Ops.COPY:
        return u.arg
    for s in u.src:
        if s.op not in (Ops.DEFINE_VAR, Ops.BIND) and not (s.op is Ops.CONST and not s.src):
            return s.device
    return "?"


# ---------------------------------------------------------------------- printing
_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.CMPLT: "<",
          Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.FDIV: "/",
          Ops.SHL: "<<", Ops.SHR: ">>"}


def render_expr(u: UOp) -> str:
    if u.op is Ops.CONST:
        return repr(u.arg)
    if u.op is Ops.DEFINE_VAR:
        return u.arg[0]
    if u.op is Ops.BIND:
        return f"{u.src[0].arg[0]}={u.src[1].arg}"
    if u.op is Ops.RANGE:
        return f"r{u.arg[0]}"
    if u.op is Ops.SPECIAL:
        return str(u.arg[0] if isinstance(u.arg, tuple) else u.arg)
    if u.op in _INFIX:
        return f"({render_expr(u.src[0])}{_INFIX[u.op]}{render_expr(u.src[1])})"
    if u.op is Ops.MAX:
        return f"max({render_expr(u.src[0])}, {render_expr(u.src[1])})"
    if u.op is Ops.WHERE:
        return f"({render_expr(u.src[0])} ? {render_expr(u.src[1])} : {render_expr(u.src[2])})"
    if u.op is Ops.NOT:
        return f"!{render_expr(u.src[0])}"
    return f"{u.op.name}({', '.join(render_expr(s) for s in u.src)})"


def pretty(u: UOp, max_depth: int = 8) -> str:
    def go(n: UOp, depth: int) -> str:
        head = f"UOp({n.op.name}, {n.dtype}, arg={n.arg!r}"
        if not n.src:
            return head + ")"
        if depth >= max_depth:
            return head + ", src=(...))"
        inner = ",\n".join("  " * (depth + 1) + go(s, depth + 1) for s in n.src)
        return head + ", src=(\n" + inner + "))"
    return go(u, 0)


def sint_to_uop(x: Any) -> UOp:
    return x if isinstance(x, UOp) else UOp.const(dtypes.index, x)


def prod(xs: Any) -> Any:
    out: Any = 1
    for x in xs:
        out = out * x if isinstance(out, UOp) or not isinstance(x, UOp) else x * out
    return out
