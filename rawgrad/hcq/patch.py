"""Patch points: words of a queue that hold (bits of) a symbolic integer expression.

A queue records a `PatchPoint` wherever a command operand is a `UOp` over DEFINE_VARs (a timeline value,
a buffer address, a symbolic size). Before each submit the expressions are evaluated under the call's
variable values and only the words that changed are rewritten.

Two evaluators share one semantics (C division and modulo, two's-complement bits):
- `compile_expr` turns one expression into nested closures; used for a one-off evaluation (`sym_eval`)
  and the generic submit.
- `compile_word_writer` turns all patch points of a bound queue into one generated Python function. A
  graph replay is a few microseconds of host time in total, and walking closures per expression and per
  word was most of it; straight-line code with every index and shift a literal is several times faster.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rawgrad.compiler.ir import Ops, UOp

__all__ = ["PatchGroup", "PatchHook", "PatchPoint", "WordWriter", "compile_expr", "compile_word_writer",
           "sym_eval"]


def sym_eval(expr: UOp, var_vals: Mapping[UOp, int]) -> int:
    """Evaluate an integer expression over DEFINE_VARs with the values in `var_vals`."""
    return compile_expr(expr)(var_vals)


def compile_expr(expr: UOp) -> Callable[[Mapping[UOp, int]], int]:
    """`expr` as a Python closure over `var_vals`, so an expression evaluated over and over (a replay's
    patch points) does not re-dispatch on its node kinds each time. A missing variable is a KeyError naming
    it, a value outside the variable's range a ValueError."""
    op = expr.op
    if op in (Ops.CONST, Ops.BIND):
        const = int(expr.arg if op is Ops.CONST else expr.src[1].arg)
        return lambda var_vals: const
    if op is Ops.DEFINE_VAR:
        name, lo, hi = expr.arg

        def variable(var_vals: Mapping[UOp, int]) -> int:
            try:
                value = var_vals[expr]
            except KeyError:
                raise KeyError(f"no value for variable {name!r} (range [{lo}, {hi}]) in var_vals; "
                               f"got {sorted(v.arg[0] for v in var_vals)}") from None
            if not lo <= value <= hi:
                raise ValueError(f"variable {name!r} = {value} is outside its range [{lo}, {hi}]")
            return int(value)
        return variable
    fn = _EVAL.get(op)
    if fn is None:
        raise TypeError(f"cannot evaluate a {op} in a patch-point expression: {expr.render()}")
    args = [compile_expr(s) for s in expr.src]
    if len(args) == 1:
        (a,) = args
        return lambda var_vals: fn(a(var_vals))
    if len(args) == 2:
        a, b = args
        return lambda var_vals: fn(a(var_vals), b(var_vals))
    return lambda var_vals: fn(*(f(var_vals) for f in args))


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


_EVAL: dict[Ops, Any] = {
    Ops.ADD: lambda a, b: a + b, Ops.SUB: lambda a, b: a - b, Ops.MUL: lambda a, b: a * b,
    Ops.IDIV: _c_div, Ops.MOD: lambda a, b: a - _c_div(a, b) * b, Ops.MAX: max, Ops.NEG: lambda a: -a,
    Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b, Ops.AND: lambda a, b: a & b,
    Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b, Ops.CMPLT: lambda a, b: int(a < b),
    Ops.CMPNE: lambda a, b: int(a != b), Ops.CMPEQ: lambda a, b: int(a == b),
    Ops.WHERE: lambda c, a, b: a if c else b,
}


@dataclass(frozen=True)
class PatchPoint:
    """Word `index` holds bits [shift, shift + word bits) of the value of `expr`."""

    index: int
    expr: UOp
    shift: int = 0


class PatchHook:
    """A bound queue's patch target that is not memory: `hook[index] = word` calls `fn(index, word)`.

    A driver binds one as the queue's `_bound_words` when the device takes changed values through an API
    (Metal: an indirect command buffer's argument and launch-size setters, or a write into an argument
    buffer object); both patch paths (the generated writer and the generic submit) store through item
    assignment, so they call it once per changed word, in patch-point order, before the queue's submit.
    `fn` must not fail: the word already counts as written (a driver that can fail marks its queue broken).
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[int, int], None]) -> None:
        self.fn = fn

    def __setitem__(self, index: int, word: int) -> None:
        self.fn(index, word)


# The patch points of one expression: (its compiled evaluator, [(patch position in the queue's patch
# list, word index, shift)]).
PatchGroup = tuple[Callable[[Mapping[UOp, int]], int], list[tuple[int, int, int]]]


# Writes every changed word of a bound queue: (var_vals, host words, bound block or PatchHook, last written
# words).
WordWriter = Callable[[Mapping[UOp, int], list[int], Any, list[Any]], None]

# Python source for each operator, over already-rendered operand names.
_SOURCE: dict[Ops, Callable[..., str]] = {
    Ops.ADD: lambda a, b: f"{a} + {b}", Ops.SUB: lambda a, b: f"{a} - {b}",
    Ops.MUL: lambda a, b: f"{a} * {b}",
    Ops.IDIV: lambda a, b: f"_c_div({a}, {b})", Ops.MOD: lambda a, b: f"_c_mod({a}, {b})",
    Ops.MAX: lambda a, b: f"{a} if {a} >= {b} else {b}", Ops.NEG: lambda a: f"-{a}",
    Ops.SHL: lambda a, b: f"{a} << {b}", Ops.SHR: lambda a, b: f"{a} >> {b}",
    Ops.AND: lambda a, b: f"{a} & {b}", Ops.OR: lambda a, b: f"{a} | {b}", Ops.XOR: lambda a, b: f"{a} ^ {b}",
    Ops.CMPLT: lambda a, b: f"1 if {a} < {b} else 0", Ops.CMPNE: lambda a, b: f"1 if {a} != {b} else 0",
    Ops.CMPEQ: lambda a, b: f"1 if {a} == {b} else 0", Ops.WHERE: lambda c, a, b: f"{a} if {c} else {b}",
}


def _c_mod(a: int, b: int) -> int:
    return a - _c_div(a, b) * b


def _missing_variable(var: UOp, var_vals: Mapping[UOp, int]) -> KeyError:
    name, lo, hi = var.arg
    return KeyError(f"no value for variable {name!r} (range [{lo}, {hi}]) in var_vals; "
                    f"got {sorted(v.arg[0] for v in var_vals)}")


def _checked_int(var: UOp, value: Any) -> int:
    """`value` as a Python int (numpy integers accepted) inside `var`'s range, else a named error."""
    name, lo, hi = var.arg
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"variable {name!r} must be an integer, got {type(value).__name__}") from None
    if not lo <= value <= hi:
        raise ValueError(f"variable {name!r} = {value} is outside its range [{lo}, {hi}]")
    return int(value)


class _Renderer:
    """Straight-line Python for a set of expressions: each shared node is computed once, into a local.

    It also tracks which bits a value may have set (for values known to be non-negative), so a mask
    that cannot change anything (a `& 0xFFFFFFFF` of a value already below 2**32, as address splitting
    produces) is not computed again."""

    def __init__(self, variables: Sequence[UOp]) -> None:
        self.names: dict[UOp, str] = {v: f"v{k}" for k, v in enumerate(variables)}
        # name -> mask of the bits it may have set (absent: unknown, or possibly negative)
        self.bits: dict[str, int] = {f"v{k}": (1 << v.arg[2].bit_length()) - 1
                                     for k, v in enumerate(variables) if v.arg[1] >= 0}
        self.lines: list[str] = []

    def name(self, node: UOp) -> str:
        known = self.names.get(node)
        if known is not None:
            return known
        if node.op in (Ops.CONST, Ops.BIND):
            value = int(node.arg if node.op is Ops.CONST else node.src[1].arg)
            return f"({value})"  # parenthesised: a negative literal stays one operand
        source = _SOURCE.get(node.op)
        if source is None:
            raise TypeError(f"cannot evaluate a {node.op} in a patch-point expression: {node.render()}")
        operands = [self.name(s) for s in node.src]
        bits = self._bits(node.op, operands)
        if node.op is Ops.AND and bits is not None and bits == self.bits.get(operands[0]):
            self.names[node] = operands[0]  # the mask keeps every bit the value can have
            return operands[0]
        local = f"t{len(self.lines)}"
        self.lines.append(f"{local} = {source(*operands)}")
        self.names[node] = local
        if bits is not None:
            self.bits[local] = bits
        return local

    def _bits(self, op: Ops, operands: list[str]) -> int | None:
        """The bits a (non-negative) result may have, for the ops whose bound is plain to see."""
        const = _literal(operands[1]) if len(operands) == 2 else None
        if const is None or const < 0:
            return None
        if op is Ops.AND:
            return const & self.bits.get(operands[0], const)
        if op is Ops.SHR and operands[0] in self.bits:
            return self.bits[operands[0]] >> const
        return None

    def word(self, root: str, shift: int, mask: int) -> str:
        """The source of bits [shift, shift + word) of `root`."""
        value = f"{root} >> {shift}" if shift else root
        bits = self.bits.get(root)
        if bits is not None and (bits >> shift) & ~mask == 0:
            return value
        return f"({value}) & {mask:#x}"


def free_variables(expr: UOp) -> set[UOp]:
    """The DEFINE_VARs `expr` reads from var_vals (a BIND carries its own value)."""
    found: set[UOp] = set()
    seen: set[UOp] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if node in seen or node.op is Ops.BIND:
            continue
        seen.add(node)
        if node.op is Ops.DEFINE_VAR:
            found.add(node)
        stack.extend(node.src)
    return found


def _literal(name: str) -> int | None:
    """The value of a rendered constant `(123)`, None for a local."""
    return int(name[1:-1]) if name.startswith("(") else None


def compile_word_writer(patches: Sequence[PatchPoint], word_bits: int) -> WordWriter:
    """One function `write(var_vals, words, block, last)` for these patch points: it reads and checks
    every variable first (so a missing or out-of-range one raises before any word is written), evaluates
    each distinct expression once, and for patch point `pos` whose word differs from `last[pos]` stores
    it into `last[pos]`, `words[index]` and `block[index]` (`block` may be a PatchHook)."""
    variables = sorted({v for p in patches for v in free_variables(p.expr)}, key=lambda v: v.arg)
    env: dict[str, Any] = {"_c_div": _c_div, "_c_mod": _c_mod, "_missing_variable": _missing_variable,
                           "_checked_int": _checked_int, "int": int}
    body: list[str] = []
    if variables:
        body.append("try:")
        body += [f"    v{k} = var_vals[V{k}]" for k in range(len(variables))]
        body += ["except KeyError as e:", "    raise _missing_variable(e.args[0], var_vals) from None"]
    for k, var in enumerate(variables):
        env[f"V{k}"] = var
        _, lo, hi = var.arg
        # the common case (a Python int in range) costs one type test and one chained compare
        body.append(f"if type(v{k}) is not int or not {lo} <= v{k} <= {hi}: v{k} = _checked_int(V{k}, v{k})")
    renderer = _Renderer(variables)
    roots = [renderer.name(p.expr) for p in patches]
    body += renderer.lines
    mask = (1 << word_bits) - 1
    for pos, (p, root) in enumerate(zip(patches, roots, strict=True)):
        word = renderer.word(root, p.shift, mask)
        if not word.isidentifier():  # an expression: computed once into `w`
            body.append(f"w = {word}")
            word = "w"
        body += [f"if last[{pos}] != {word}:",
                 f"    last[{pos}] = words[{p.index}] = block[{p.index}] = {word}"]
    source = "def write_changed_words(var_vals, words, block, last):\n" + \
        "".join(f"    {line}\n" for line in body or ["pass"])
    exec(compile(source, f"<patch writer: {len(patches)} words>", "exec"), env)  # noqa: S102
    writer: WordWriter = env["write_changed_words"]
    writer.__doc__ = source  # what runs, for debugging
    return writer
