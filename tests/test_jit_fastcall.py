"""TinyJit's per-call shortcut (jit.py `_call_of`): a call with the same positional Tensor UOps as a recent
one skips `_Call.of`. These check that the shortcut keeps every guarantee of the full path: fresh outputs
per call, values of the inputs as they are now, guards on shapes and on globals, and no input kept alive."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.jit import JitError, TinyJit
from rawgrad.jit import jit as jit_module

SCALE = 2.0  # a guarded global (read by `scaled` below)


def scaled(x: Tensor) -> Tensor:
    return x * SCALE + 1


def test_repeated_input_gets_fresh_outputs_and_right_values() -> None:
    j = TinyJit(lambda x: x + 1)
    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    outs = [j(x) for _ in range(6)]
    assert j.replays == 4
    assert len(j._fast) == 1, "the repeated input was not served by the shortcut"
    bases = [o.uop.base for o in outs[2:]]
    assert len(set(bases)) == len(bases), "two replays returned the same output buffer"
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), np.arange(8, dtype=np.float32) + 1)


def test_input_written_in_place_between_calls_is_read_again() -> None:
    j = TinyJit(lambda x: x * 3)
    x = Tensor(np.ones(4, dtype=np.float32)).realize()
    for _ in range(3):
        j(x)
    x.assign(Tensor(np.full(4, 5, dtype=np.float32)))  # a pending write: x's node changes, then runs
    np.testing.assert_array_equal(j(x).numpy(), np.full(4, 15, dtype=np.float32))
    x.assign(x + 1).realize()
    np.testing.assert_array_equal(j(x).numpy(), np.full(4, 18, dtype=np.float32))


def test_shortcut_does_not_skip_guards() -> None:
    j = TinyJit(lambda x: x + 1)
    x = Tensor(np.zeros(4, dtype=np.float32)).realize()
    for _ in range(4):
        j(x)
    with pytest.raises(JitError, match="shape"):
        j(Tensor(np.zeros(5, dtype=np.float32)).realize())
    with pytest.raises(JitError, match="dtype"):
        j(Tensor(np.zeros(4, dtype=np.int32)).realize())
    np.testing.assert_array_equal(j(x).numpy(), np.ones(4, dtype=np.float32))


def test_global_change_seen_on_the_shortcut() -> None:
    global SCALE
    j = TinyJit(scaled, max_recaptures=1)
    x = Tensor(np.ones(4, dtype=np.float32)).realize()
    for _ in range(4):
        j(x)
    old = SCALE
    try:
        SCALE = 10.0
        np.testing.assert_array_equal(j(x).numpy(), np.full(4, 11, dtype=np.float32))
        SCALE = old + 0.0  # an equal value in another float object: the same capture, no recapture
        np.testing.assert_array_equal(j(x).numpy(), np.full(4, 3, dtype=np.float32))
        assert j.recaptures == 1
    finally:
        SCALE = old


def test_shortcut_keeps_no_input_alive() -> None:
    j = TinyJit(lambda x: x + 1)
    for _ in range(4):
        x = Tensor(np.zeros(1 << 16, dtype=np.float32)).realize()
        j(x)
        j(x)
    ref = weakref.ref(x.uop.base)
    assert any(e.refs[0]() is x.uop for e in j._fast.values())
    del x
    gc.collect()
    assert ref() is None, "the call shortcut kept an input buffer alive"


def test_shortcut_table_is_bounded() -> None:
    j = TinyJit(lambda x: x + 1)
    keep = []
    for i in range(jit_module.MAX_FAST_CALLS * 2 + 3):
        x = Tensor(np.full(4, i, dtype=np.float32)).realize()
        keep.append(x)
        np.testing.assert_array_equal(j(x).numpy(), np.full(4, i + 1, dtype=np.float32))
    assert 1 <= len(j._fast) <= jit_module.MAX_FAST_CALLS
    j.reset()
    assert not j._fast
