"""Pattern matching and graph rewriting over UOps.

A `UPat` describes a node shape (op, dtype, sources, arg) and names the parts it wants; a
`PatternMatcher` holds (pattern, function) rules indexed by op; `graph_rewrite` applies the rules
bottom-up until nothing changes. A rule function receives the named parts as keyword arguments
(and `ctx` if it asks for it) and returns a replacement UOp or None for "no change".
"""
from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import Any

from rawgrad.compiler.ir import Ops, UOp
from rawgrad.dtype import DType


class UPat:
    """A pattern for one node. `src=None` matches any sources; a tuple matches them in order (and in any
    order for commutative ops when `commutative=True`); `allow_any_len` lets extra sources follow."""

    __slots__ = ("ops", "dtypes", "src", "arg", "name", "allow_any_len", "commutative", "predicate")

    def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
                 src: tuple[UPat, ...] | UPat | None = None, arg: Any = None, name: str | None = None,
                 allow_any_len: bool = False, commutative: bool = False,
                 predicate: Callable[[UOp], bool] | None = None):
        self.ops = None if op is None else (frozenset([op]) if isinstance(op, Ops) else frozenset(op))
        self.dtypes = None if dtype is None else (frozenset([dtype]) if isinstance(dtype, DType)
                                                 else frozenset(dtype))
        self.src = (src,) if isinstance(src, UPat) else src
        self.arg = arg
        self.name = name
        self.allow_any_len = allow_any_len
        self.commutative = commutative
        self.predicate = predicate

    @staticmethod
    def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        """A constant with no sources (an index-math constant)."""
        return UPat(Ops.CONST, dtype=dtype, name=name, predicate=lambda u: not u.src)

    def match(self, u: UOp, bindings: dict[str, UOp]) -> list[dict[str, UOp]]:
        if self.ops is not None and u.op not in self.ops:
            return []
        if self.dtypes is not None and u.dtype not in self.dtypes:
            return []
        if self.arg is not None and u.arg != self.arg:
            return []
        if self.predicate is not None and not self.predicate(u):
            return []
        if self.name is not None:
            if self.name in bindings and bindings[self.name] is not u:
                return []
            bindings = {**bindings, self.name: u}
        if self.src is None:
            return [bindings]
        if len(u.src) < len(self.src) or (len(u.src) != len(self.src) and not self.allow_any_len):
            return []
        orders = itertools.permutations(self.src) if self.commutative else [self.src]
        results: list[dict[str, UOp]] = []
        for pats in orders:
            partial = [bindings]
            for pat, s in zip(pats, u.src):
                partial = [b2 for b in partial for b2 in pat.match(s, b)]
                if not partial:
                    break
            results.extend(partial)
            if results:
                break
        return results


class PatternMatcher:
    """An ordered list of rules; the first rule that matches and returns a UOp wins."""

    def __init__(self, rules: list[tuple[UPat, Callable[..., UOp | None]]]):
        self.rules = rules
        self.by_op: dict[Ops | None, list[tuple[UPat, Callable[..., UOp | None], bool]]] = {}
        for pat, fn in rules:
            wants_ctx = "ctx" in inspect.signature(fn).parameters
            for op in (pat.ops if pat.ops is not None else [None]):
                self.by_op.setdefault(op, []).append((pat, fn, wants_ctx))
        wildcard = self.by_op.get(None, [])
        if wildcard:
            for op in list(self.by_op):
                if op is not None:
                    self.by_op[op] = self.by_op[op] + wildcard

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        for pat, fn, wants_ctx in self.by_op.get(u.op, self.by_op.get(None, [])):
            for bindings in pat.match(u, {}):
                out = fn(ctx=ctx, **bindings) if wants_ctx else fn(**bindings)
                if out is not None and out is not u:
                    return out
        return None


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None, max_passes: int = 10_000) -> UOp:
    """Rewrite bottom-up: each node's sources are rewritten first, then the node until no rule fires."""
    memo: dict[UOp, UOp] = {}

    def visit(start: UOp) -> UOp:
        stack: list[tuple[UOp, int]] = [(start, 0)]
        while stack:
            node, stage = stack.pop()
            if node in memo:
                continue
            if stage == 0:
                stack.append((node, 1))
                for s in reversed(node.src):
                    if s not in memo:
                        stack.append((s, 0))
                continue
            new_src = tuple(memo[s] for s in node.src)
            cur = node if new_src == node.src else node.replace(src=new_src)
            for _ in range(max_passes):
                nxt = pm.rewrite(cur, ctx)
                if nxt is None:
                    break
                if any(s not in memo for s in nxt.src) and nxt not in memo:
                    # the replacement built new sources: rewrite them before settling this node
                    cur = visit(nxt)
                    break
                new_src = tuple(memo.get(s, s) for s in nxt.src)
                cur = nxt if new_src == nxt.src else nxt.replace(src=new_src)
            else:
                raise RuntimeError(f"graph_rewrite did not settle on {node.op}")
            memo[node] = cur
        return memo[start]

    return visit(root)
