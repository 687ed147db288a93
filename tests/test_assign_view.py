"""assign into a view of a realized buffer (`cache[:, p:p+1].assign(row)`): one kernel that loops over the
view and stores through the view's ShapeTracker, so only the viewed elements are written; concrete and
Variable offsets, under TinyJit, and through the REFERENCE interpreter."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from rawgrad import GlobalCounters, Tensor, TinyJit, Variable
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.tensor.interpret import interpret_realize
from rawgrad.tensor.schedule import create_schedule

rng = np.random.default_rng(3)


@pytest.fixture(params=["compiled", "reference"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a test through the kernels and again through the numpy interpreter (REFERENCE=1)."""
    if request.param == "reference":
        monkeypatch.setenv("REFERENCE", "1")
    yield request.param


def _cache(shape: tuple[int, ...]) -> tuple[Tensor, np.ndarray]:
    data = rng.standard_normal(shape).astype(np.float32)
    return Tensor(data.copy()).realize(), data


def _store_views(outs: list[Tensor]) -> list[Any]:
    """The STORE ShapeTracker of every kernel the outs schedule into."""
    items, _ = create_schedule([o.uop for o in outs])
    return [it.ast.src[0].src[1].arg for it in items if it.ast is not None]


def test_concrete_slice_is_one_kernel_writing_only_the_view(mode: str) -> None:
    c, ref = _cache((2, 6, 3))
    row = rng.standard_normal((2, 2, 3)).astype(np.float32)
    view = c[:, 2:4].assign(Tensor(row))
    if mode == "compiled":
        # the loop space is the view (12 elements), not the cache (36)
        sts = _store_views([view])
        assert len(sts) == 1 and sts[0].shape == (2, 2, 3) and not sts[0].contiguous
    GlobalCounters.reset()
    out = view.realize()
    assert c.uop.base is out.uop.base  # the view still reads the cache's buffer, written in place
    ref[:, 2:4] = row
    if mode == "compiled":
        assert GlobalCounters.kernel_count == 1
    np.testing.assert_array_equal(c.numpy(), ref)  # the rest of the cache is untouched
    np.testing.assert_array_equal(out.numpy(), row)  # the view reads what was written


def test_permuted_flipped_and_reshaped_views(mode: str) -> None:
    c, ref = _cache((4, 5))
    c.T[1:3].assign(Tensor(np.full((2, 4), 7.0, np.float32)))  # columns 1..2 through a permute
    ref.T[1:3] = 7.0
    c.flip(0)[0].assign(Tensor(np.arange(5, dtype=np.float32)))  # the last row, through a flip
    ref[::-1][0] = np.arange(5)
    c.reshape(2, 10)[1, 2:6].assign(-1.0)  # a broadcast scalar into a reshaped view
    ref.reshape(2, 10)[1, 2:6] = -1.0
    np.testing.assert_array_equal(c.numpy(), ref)


def test_variable_offset_one_kernel_one_compile(mode: str) -> None:
    c, ref = _cache((2, 8, 3))
    p = Variable("p", 0, 7)
    GlobalCounters.reset()
    launches = 0
    for pos in (5, 0, 7, 3):
        val = rng.standard_normal((2, 1, 3)).astype(np.float32)
        bound = p.bind(pos)
        view = c.shrink(((0, 2), (bound, bound + 1), (0, 3)))
        assert view.shape == (2, 1, 3)  # (v, v + 1) is one row, not a symbolic size
        view.assign(Tensor(val)).realize()
        ref[:, pos:pos + 1] = val
        if mode == "compiled":
            assert GlobalCounters.kernel_count == launches + 1  # one launch per write
            launches += 1
        np.testing.assert_array_equal(c.numpy(), ref)
    # at most one compile serves every position (none if an earlier test built the same kernel): the
    # offset is a kernel argument
    assert GlobalCounters.kernels_compiled <= 1


def test_indexing_with_a_bound_variable(mode: str) -> None:
    c, ref = _cache((3, 5))
    p = Variable("p", 0, 4)
    for pos in (4, 1):
        b = p.bind(pos)
        c[:, b:b + 1].assign(Tensor(np.full((3, 1), pos * 10.0, np.float32)))
        ref[:, pos] = pos * 10.0
        np.testing.assert_array_equal(c[:, b].numpy(), ref[:, pos])  # x[..., v] drops the axis
        np.testing.assert_array_equal(c[:, :b].numpy(), ref[:, :pos])  # a symbolic length
    np.testing.assert_array_equal(c.numpy(), ref)
    with pytest.raises(IndexError, match="can reach"):
        c[p.bind(1)]  # rows 0..4 of 3


def test_lazy_view_assign_runs_before_the_buffer_is_read(mode: str) -> None:
    c, ref = _cache((3, 4))
    c[1].assign(Tensor(np.full(4, 9.0, np.float32)))  # not realized, and the view Tensor is dropped
    ref[1] = 9.0
    np.testing.assert_array_equal((c * 2).numpy(), ref * 2)  # a graph reading the buffer sees it
    c[2].assign(5.0)
    ref[2] = 5.0
    np.testing.assert_array_equal(c.numpy(), ref)  # so does a read of the realized tensor itself


def test_values_that_read_the_written_buffer(mode: str) -> None:
    c, ref = _cache((3, 6))
    # overlapping shift: every value is read before any element is overwritten (numpy semantics)
    c[:, 0:5].assign(c[:, 1:6]).realize()
    ref[:, 0:5] = ref[:, 1:6].copy()
    # a read of the very element written is safe in one kernel
    GlobalCounters.reset()
    c[:, 2:4].assign(c[:, 2:4] * 3).realize()
    assert GlobalCounters.kernel_count == (1 if mode == "compiled" else 0)
    ref[:, 2:4] *= 3
    # a reduce over the buffer broadcast into a view of it
    c[1:2].assign(c.sum(0, keepdim=True))
    ref[1:2] = ref.sum(0, keepdims=True)
    np.testing.assert_allclose(c.numpy(), ref, rtol=1e-6)


def test_fused_reduce_value_and_reads_of_the_assign_node(mode: str) -> None:
    c, ref = _cache((4, 3))
    x = rng.standard_normal((4, 5)).astype(np.float32)
    y = c[:, 1:2].assign(Tensor(x).sum(1, keepdim=True))
    z = y * 2 + 1  # reads the assigned view through the ASSIGN node, in the same realize
    ref[:, 1:2] = x.sum(1, keepdims=True)
    np.testing.assert_allclose(z.numpy(), ref[:, 1:2] * 2 + 1, rtol=1e-5)
    np.testing.assert_allclose(c.numpy(), ref, rtol=1e-5)


def test_under_tinyjit_one_capture_every_position() -> None:
    cache = Tensor(np.zeros((2, 8, 3), np.float32)).realize()
    p = Variable("pos", 0, 7)

    @TinyJit
    def step(row: Tensor, pos: UOp) -> Tensor:
        cache.shrink(((0, 2), (pos, pos + 1), (0, 3))).assign(row * 2).realize()
        return cache.sum(1) + 0  # reads the whole cache after the write

    ref = np.zeros((2, 8, 3), np.float32)
    for pos in (0, 1, 2, 5, 3, 7):
        row = rng.standard_normal((2, 1, 3)).astype(np.float32)
        out = step(Tensor(row), p.bind(pos))
        ref[:, pos:pos + 1] = row * 2
        np.testing.assert_allclose(out.numpy(), ref.sum(1), rtol=1e-6)
        np.testing.assert_array_equal(cache.numpy(), ref)
    assert len(step.captures) == 1


def test_interpreter_writes_through_the_view() -> None:
    c, ref = _cache((2, 4))
    p = Variable("p", 0, 3).bind(2)
    target = UOp(Ops.SHRINK, c.dtype, (c.uop,), ((0, 2), (p, p + 1)))
    value = Tensor(np.array([[1.0], [2.0]], np.float32)).uop
    (res,) = interpret_realize(UOp(Ops.ASSIGN, c.dtype, (target, value)))
    ref[:, 2:3] = [[1.0], [2.0]]
    assert res is target
    np.testing.assert_array_equal(c.numpy(), ref)


def test_errors_and_views_that_cannot_take_a_write() -> None:
    c, ref = _cache((2, 3))
    # a padded view is no view of the buffer alone: it is copied first, as before, and c is unchanged
    padded = c.pad(((0, 0), (1, 0)))
    padded.assign(Tensor.zeros(2, 4))
    np.testing.assert_array_equal(padded.numpy(), np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(c.numpy(), ref)
    lazy = Tensor.ones(2, 3) + 1  # never realized: no buffer to write through
    bad = UOp(Ops.ASSIGN, lazy.dtype, (lazy[:, 0:1].uop, Tensor.zeros(2, 1).uop))
    with pytest.raises(ValueError, match="assign target must be a realized tensor or a .* view"):
        create_schedule([bad])
    with pytest.raises(ValueError, match="ASSIGN target must be a realized buffer or a .* view"):
        interpret_realize(bad)
    with pytest.raises(ValueError, match=r"cannot assign a value of shape \(3,\) to shape \(2, 1\)"):
        c[:, 0:1].assign(Tensor.zeros(3))


def test_tinyjit_runs_a_view_write_the_function_does_not_read_back() -> None:
    state = Tensor(np.zeros((6, 2), np.float32)).contiguous().realize()

    @TinyJit
    def write(row: Tensor, pos: Any) -> Tensor:
        state[pos:pos + 1].assign(row)  # nothing returned reads `state`
        return row * 2

    for p in range(6):
        write(Tensor(np.full((1, 2), p + 1, np.float32)), Variable("pos", 0, 5).bind(p))
        got = state.numpy()
        np.testing.assert_array_equal(got[:p + 1, 0], np.arange(1, p + 2, dtype=np.float32))
    assert len(write.captures) == 1


def test_realizing_a_reader_together_with_the_write_runs_the_write_first() -> None:
    buf = Tensor(np.zeros(4, np.float32)).contiguous().realize()
    write = buf[1:2].assign(Tensor(np.ones(1, np.float32)))
    total = buf.sum()
    Tensor.realize(total, write)  # the reader is listed first; the write must still run before it
    assert total.item() == 1.0
