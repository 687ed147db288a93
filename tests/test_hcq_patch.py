"""The generated patch writer (bound-queue replay) against the closure evaluator, and its errors."""
from __future__ import annotations

import random
from typing import Any

import cffi
import numpy as np
import pytest

from rawgrad.compiler.ir import Ops, UOp, Variable
from rawgrad.hcq.patch import PatchHook, PatchPoint, compile_expr, compile_word_writer
from rawgrad.hcq.queue import HWQueue

WORD_BITS = 32
MASK = (1 << WORD_BITS) - 1

a = Variable("a", -50, 1000)
b = Variable("b", 1, 64)
addr = Variable("addr", 0, 2**64 - 1)


def _const(v: int) -> UOp:
    return UOp.const(a.dt, v)


def random_expr(rng: random.Random, depth: int) -> UOp:
    """An integer expression over a, b, addr with every operator the writer renders."""
    if depth == 0:
        return rng.choice([a, b, addr, _const(rng.randint(-9, 9)), _const(rng.randint(1, 2**40))])
    op = rng.choice([Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.XOR,
                     Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE, Ops.NEG, Ops.SUB])
    x = random_expr(rng, depth - 1)
    if op in (Ops.IDIV, Ops.MOD):
        return x.alu(op, b)  # never a zero divisor
    if op in (Ops.SHL, Ops.SHR):
        return x.alu(op, _const(rng.randint(0, 40)))
    if op is Ops.NEG:
        return UOp(Ops.NEG, x.dt, (x,))
    if op is Ops.WHERE:
        return UOp(Ops.WHERE, x.dt, (random_expr(rng, depth - 1).lt(7), x, random_expr(rng, depth - 1)))
    y = random_expr(rng, depth - 1)
    if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
        return UOp(op, x.dt, (x, y))  # an int result, as a patch expression uses it
    return UOp(op, x.dt, (x, y))


def expected_words(patches: list[PatchPoint], vals: dict[UOp, int]) -> dict[int, int]:
    return {p.index: (compile_expr(p.expr)(vals) >> p.shift) & MASK for p in patches}


def test_writer_matches_the_closure_evaluator_on_random_expressions() -> None:
    rng = random.Random(5)
    for trial in range(60):
        exprs = [random_expr(rng, rng.randint(0, 4)) for _ in range(4)]
        patches = [PatchPoint(2 * k + (i % 2), e, 32 * (i % 2)) for i, e in enumerate(exprs) for k in (i,)]
        writer = compile_word_writer(patches, WORD_BITS)
        words, last = [0] * 16, [None] * len(patches)
        block = np.zeros(16, dtype=np.uint32)
        for _ in range(5):
            vals = {a: rng.randint(-50, 1000), b: rng.randint(1, 64), addr: rng.randint(0, 2**64 - 1)}
            writer(vals, words, block, last)
            for index, word in expected_words(patches, vals).items():
                assert words[index] == block[index] == word, (trial, index, writer.__doc__)


def test_writer_writes_only_changed_words() -> None:
    patches = [PatchPoint(0, addr), PatchPoint(1, addr, 32), PatchPoint(2, a + 1)]

    class Recording(list):  # type: ignore[type-arg]
        def __setitem__(self, i: int, v: int) -> None:
            self.writes.append((i, v))
            super().__setitem__(i, v)

    block = Recording([0, 0, 0])
    block.writes = []  # type: ignore[attr-defined]
    writer = compile_word_writer(patches, WORD_BITS)
    words, last = [0, 0, 0], [None, None, None]
    writer({addr: 0x1_0000_0004, a: 3}, words, block, last)
    assert block.writes == [(0, 4), (1, 1), (2, 4)]  # type: ignore[attr-defined]
    block.writes.clear()  # type: ignore[attr-defined]
    writer({addr: 0x1_0000_0008, a: 3}, words, block, last)
    assert block.writes == [(0, 8)]  # type: ignore[attr-defined]  # the high word and a+1 did not change


def test_writer_stores_into_a_cffi_block() -> None:
    ffi = cffi.FFI()
    block = ffi.new("uint32_t[4]")
    writer = compile_word_writer([PatchPoint(3, addr - 1), PatchPoint(2, addr - 1, 32)], WORD_BITS)
    writer({addr: 0x2_0000_0000}, [0] * 4, block, [None, None])
    assert list(block) == [0, 0, 1, 0xFFFFFFFF]


def test_writer_errors_name_the_variable_and_write_nothing() -> None:
    patches = [PatchPoint(0, a * 2), PatchPoint(1, b)]
    writer = compile_word_writer(patches, WORD_BITS)
    words, block, last = [7, 7], [7, 7], [None, None]
    with pytest.raises(KeyError, match="no value for variable 'b' \\(range \\[1, 64\\]\\)"):
        writer({a: 1}, words, block, last)
    with pytest.raises(ValueError, match="variable 'b' = 65 is outside its range \\[1, 64\\]"):
        writer({a: 1, b: 65}, words, block, last)
    with pytest.raises(TypeError, match="variable 'a' must be an integer, got float"):
        writer({a: 1.5, b: 2}, words, block, last)
    assert words == block == [7, 7] and last == [None, None]
    writer({a: np.int64(-3), b: np.int32(2)}, words, block, last)  # numpy integers are integers
    assert words == block == [(-6) & MASK, 2]


def test_writer_without_patches_and_constant_only_expressions() -> None:
    compile_word_writer([], WORD_BITS)({}, [], [], [])
    words = [0]
    compile_word_writer([PatchPoint(0, a.bind(5) * 3)], WORD_BITS)({}, words, [0], [None])
    assert words == [15]


def test_writer_rejects_an_op_it_cannot_evaluate() -> None:
    with pytest.raises(TypeError, match="cannot evaluate"):
        compile_word_writer([PatchPoint(0, a.ge(3))], WORD_BITS)


class _HookQueue(HWQueue):
    """A queue whose device takes patched values through calls (as a Metal indirect command buffer's
    setters): bound, its `_bound_words` is a PatchHook that records each call."""

    WORD_BITS = 32

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int]] = []
        self.submits = 0

    def _bind(self, device: object) -> None:
        self._bound_words = PatchHook(lambda index, word: self.calls.append((index, word)))

    def _submit(self, device: object) -> None:
        self.submits += 1


def test_patch_hook_gets_each_changed_word_on_both_patch_paths() -> None:
    q = _HookQueue()
    q._emit(0xA, addr, 0xB)  # a 64-bit address over words 1 and 2 of a 32-bit queue
    q._add_patch(PatchPoint(2, addr, 32))
    q._emit(a * 2)
    device: Any = type("Dev", (), {"name": "API"})()
    q.bind(device)
    q.submit(device, {addr: 0x5_0000_0001, a: 4})  # the generic submit: every patch word is new
    assert q.calls == [(1, 1), (2, 5), (3, 8)] and q.submits == 1
    assert list(q.words()) == [0xA, 1, 5, 8]  # the host words stay in step (layout, debugging)
    q.calls.clear()
    q.submit(device, {addr: 0x5_0000_0001, a: 4})
    assert q.calls == []  # nothing changed: no call at all
    q._write_changed_words({addr: 0x5_0000_0002, a: 4})  # the generated writer (the replay path)
    assert q.calls == [(1, 2)] and q._words == [0xA, 2, 5, 8]
    q.calls.clear()
    q._write_changed_words({addr: 0x6_0000_0002, a: 5})
    assert q.calls == [(2, 6), (3, 10)]


def test_memory_words_stay_the_default_patch_target() -> None:
    """Without a hook the generated writer stores into the bound block directly (no call per word)."""
    writer = compile_word_writer([PatchPoint(0, a)], WORD_BITS)
    assert writer.__doc__ is not None and "block[0] = " in writer.__doc__
    block = np.zeros(1, dtype=np.uint32)
    writer({a: 9}, [0], block, [None])
    assert block[0] == 9
