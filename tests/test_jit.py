"""TinyJit: capture, replays checked against numpy with fresh inputs and changing Variables (and equal to
eager, bit for bit), and every guard."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rawgrad import Device, Tensor, Variable
from rawgrad.jit import JitError, TinyJit
from rawgrad.tensor import realize as realize_module
from rawgrad.tensor.buffers import device_memory
from rawgrad.tensor.realize import GlobalCounters

RTOL, ATOL = 1e-5, 1e-6  # float32 results against float64 numpy


def arr(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def model(x: Tensor, w: Tensor) -> Tensor:
    h = (x @ w).relu()
    return (h - h.max(axis=1, keepdim=True)).exp().sum(axis=1) * 0.5


def model_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`model` in numpy (float64) from the same float32 data: the oracle."""
    h = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)
    return np.exp(h - h.max(axis=1, keepdims=True)).sum(axis=1) * 0.5


def fresh_input(kind: int, rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[Tensor, np.ndarray]:
    """A new input Tensor of `shape` made by a different op per kind (each call its own buffer, written by a
    different kernel or copy, at a different address), and its values in numpy."""
    if kind == 0:  # straight from numpy
        x = arr(rng, *shape)
        return Tensor(x), x
    if kind == 1:  # a lazy expression the call realizes
        a, c = arr(rng, *shape), arr(rng, *shape)
        return Tensor(a) * 2 + Tensor(c), a * np.float32(2) + c
    if kind == 2:  # a transposed view (copied to a contiguous buffer by the call)
        m = arr(rng, *shape[::-1])
        return Tensor(m).T, np.ascontiguousarray(m.T)
    big = arr(rng, shape[0] + 3, *shape[1:])  # rows at an offset into a bigger buffer
    return Tensor(big).realize()[2:2 + shape[0]], big[2:2 + shape[0]]


def address(t: Tensor) -> int:
    return int(device_memory(t.uop.base).address)


def test_replay_matches_numpy_with_fresh_inputs_and_launches_no_kernels(rng: np.random.Generator) -> None:
    w_np = arr(rng, 8, 5)
    w = Tensor(w_np)
    jitted = TinyJit(model)
    keep, addresses = [], []
    for i in range(8):
        x, x_np = fresh_input(i % 4, rng, (4, 8))
        x.realize()  # its kernel is not the replay's
        before = GlobalCounters.kernel_count
        got = jitted(x, w).numpy()
        if i >= 2:  # replays do not go through the realize loop
            assert GlobalCounters.kernel_count == before
        keep.append(x)  # alive, so every call's input has its own address
        addresses.append(address(x))
        np.testing.assert_allclose(got, model_reference(x_np, w_np), rtol=RTOL, atol=ATOL)
        np.testing.assert_array_equal(got, model(Tensor(x_np), w).numpy())  # and equal to eager, bit for bit
    assert len(set(addresses)) == len(addresses)
    assert jitted.replays == 6 and jitted.last is not None and jitted.last.kernel_count >= 2


def _submissions(dev: Any) -> int:
    """Work items handed to the device: CPU ring records, NV compute-channel submissions, AMD PM4 doorbells,
    or Metal command buffers."""
    nv = getattr(dev, "nv", None)
    if nv is not None:
        return int(nv.compute.submissions)
    amd_doorbells = getattr(dev, "pm4_submissions", None)
    return int(amd_doorbells) if amd_doorbells is not None else int(dev.write_index)


def test_replay_is_one_ring_record(rng: np.random.Generator) -> None:
    dev: Any = Device[Device.DEFAULT]

    @TinyJit
    def f(x: Tensor) -> Tensor:
        for _ in range(20):
            x = (x + 1).realize()
        return x

    x = Tensor(np.zeros(16, np.float32))
    f(x), f(x)
    start = _submissions(dev)
    out = f(x)
    assert _submissions(dev) - start == 1  # one RUN_BLOCK record (one GPFIFO submission) for 20 kernels
    np.testing.assert_array_equal(out.numpy(), np.full(16, 20, np.float32))
    assert f.last is not None and f.last.devices[0].arena_bytes <= 2 * 256  # the chain reuses two slots


def test_kwargs_and_containers(rng: np.random.Generator) -> None:
    def fn(xs: list[Tensor], d: dict[str, Tensor], *, scale: Tensor) -> dict[str, Any]:
        return {"sum": (xs[0] + xs[1]) * scale, "prod": d["a"] * d["b"], "tag": "ok"}

    jitted = TinyJit(fn)
    for _ in range(4):
        a, b, c, e, s = (arr(rng, 3) for _ in range(5))
        out = jitted([Tensor(a), Tensor(b)], {"a": Tensor(c), "b": Tensor(e)}, scale=Tensor(s))
        np.testing.assert_array_equal(out["sum"].numpy(), (a + b) * s)
        np.testing.assert_array_equal(out["prod"].numpy(), c * e)
        assert out["tag"] == "ok"


class Layer:
    def __init__(self, bias: float) -> None:
        self.b = Tensor(np.full(3, bias, np.float32))

    @TinyJit
    def __call__(self, x: Tensor) -> Tensor:
        return x * 2 + self.b


def test_method_has_one_cache_per_instance() -> None:
    one, two = Layer(1.0), Layer(10.0)
    x = np.arange(3, dtype=np.float32)
    for _ in range(4):
        np.testing.assert_array_equal(one(Tensor(x)).numpy(), x * 2 + 1)
        np.testing.assert_array_equal(two(Tensor(x)).numpy(), x * 2 + 10)
    assert one.__call__ is one.__call__ and one.__call__ is not two.__call__
    assert one.__call__.last is not two.__call__.last


def test_bound_variable_serves_every_value_in_range(rng: np.random.Generator) -> None:
    w_np = np.arange(8, dtype=np.float32)
    w = Tensor(w_np)

    @TinyJit
    def f(x: Tensor, n: Any) -> tuple[Tensor, Tensor]:
        y = (x + w).shrink(((0, n),))
        return y * 3, y.sum()  # the kernels' loop bound and the reduce length are both n

    keep = []
    for i, n in enumerate((2, 5, 7, 1, 8, 3)):
        x, x_np = fresh_input(i % 4, rng, (8,))
        out, total = f(x, Variable("n", 1, 8).bind(n))
        if i >= 1:  # the capture and the replays realized the input
            keep.append(x)
        assert out.shape[0].unbind()[1] == n  # the returned shape carries this call's value
        want = (x_np.astype(np.float64) + w_np)[:n]
        np.testing.assert_allclose(out.numpy(), want * 3, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(total.numpy(), want.sum(), rtol=RTOL, atol=ATOL)
    assert len(f.captures) == 1 and f.replays == 4
    assert len({address(x) for x in keep}) == len(keep)
    with pytest.raises(ValueError, match="outside its range"):
        Variable("n", 1, 8).bind(9)
    with pytest.raises(JitError, match="must be bound"):
        f(Tensor(np.zeros(8, np.float32)), Variable("n", 1, 8))


def test_replay_with_fresh_inputs_and_changing_variables(rng: np.random.Generator) -> None:
    """Two inputs made differently every call, a Variable that changes every call and bounds the reduces
    (sums, a max): each value against numpy."""

    @TinyJit
    def f(x: Tensor, y: Tensor, n: Any) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        xs = x.shrink(((0, n), None))  # (n, 4)
        return (xs * y).sum(axis=0), xs.max(axis=0), (xs + 1).sum(), (xs.exp() * 0.5).sum(axis=0) - y

    keep, ns = [], (3, 6, 1, 5, 2, 4, 6, 1, 3)
    for i, n in enumerate(ns):
        x, x_np = fresh_input(i % 4, rng, (6, 4))
        y, y_np = fresh_input((i + 1) % 4, rng, (4,))
        got = f(x, y, Variable("n", 1, 6).bind(n))
        if i >= 1:  # the capture and the replays realized both inputs (the eager call fuses them)
            keep.append((x, y))
        xs, y64 = x_np[:n].astype(np.float64), y_np.astype(np.float64)
        want = ((xs * y64).sum(0), xs.max(0), np.array((xs + 1).sum()), (np.exp(xs) * 0.5).sum(0) - y64)
        for k, (g, e) in enumerate(zip(got, want, strict=True)):
            assert g.shape == e.shape, (k, g.shape)
            np.testing.assert_allclose(g.numpy(), e, rtol=RTOL, atol=ATOL, err_msg=f"output {k}, n={n}")
    assert len(f.captures) == 1 and f.replays == len(ns) - 2
    assert len({address(t) for pair in keep for t in pair}) == 2 * (len(ns) - 1)  # all alive, all apart


def test_mean_over_a_variable_length(rng: np.random.Generator) -> None:
    f = TinyJit(lambda x, n: x.shrink(((0, n), None)).mean(axis=0))
    for n in (3, 5, 2, 6):
        x_np = arr(rng, 6, 4)
        got = f(Tensor(x_np), Variable("n", 1, 6).bind(n)).numpy()
        np.testing.assert_allclose(got, x_np[:n].astype(np.float64).mean(0), rtol=RTOL, atol=ATOL)
    assert len(f.captures) == 1


def test_input_with_a_symbolic_shape(rng: np.random.Generator) -> None:
    f = TinyJit(lambda x: (x * 2).sum(axis=0))
    for n in (3, 5, 2, 7):
        x_np = arr(rng, 8, 3)
        x = Tensor(x_np).shrink(((0, Variable("m", 1, 8).bind(n)), None))
        np.testing.assert_allclose(f(x).numpy(), (x_np[:n].astype(np.float64) * 2).sum(0), rtol=RTOL,
                                   atol=ATOL)
    assert len(f.captures) == 1


def capture(fn: Any, *args: Any, **kwargs: Any) -> Any:
    fn(*args, **kwargs)
    return fn(*args, **kwargs)


def test_shape_mismatch_errors_by_default_naming_the_argument() -> None:
    f = TinyJit(lambda x, y: x + y)
    capture(f, Tensor(np.ones(4, np.float32)), Tensor(np.ones(4, np.float32)))
    with pytest.raises(JitError, match=r"argument 1 \('y'\) has shape \(5,\) \(captured with \(4,\)\)"):
        f(Tensor(np.ones(4, np.float32)), Tensor(np.ones(5, np.float32)))
    with pytest.raises(JitError, match=r"argument 0 \('x'\) has dtype dtypes.int32"):
        f(Tensor(np.ones(4, np.int32)), Tensor(np.ones(4, np.float32)))


def test_device_mismatch_errors() -> None:
    f = TinyJit(lambda x: x * 2)
    capture(f, Tensor(np.ones(4, np.float32)))
    other = Tensor(np.ones(4, np.float32), device="CPU:1")
    with pytest.raises(JitError, match=f"device CPU:1 \\(captured with {Device.DEFAULT}\\)"):
        f(other)
    Device.close("CPU:1")


def test_recapture_policy_keeps_one_capture_per_signature() -> None:
    f = TinyJit(lambda x: x * 2 + 1, on_mismatch="recapture")
    for n in (4, 4, 6, 4, 6, 6):
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(f(Tensor(x)).numpy(), x * 2 + 1)
    assert len(f.captures) == 2


def test_strided_input_is_made_contiguous() -> None:
    f = TinyJit(lambda x: x * 2)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(6, dtype=np.float32).reshape(3, 2) + 100
    capture(f, Tensor(a))
    np.testing.assert_array_equal(f(Tensor(b).T).numpy(), b.T * 2)
    np.testing.assert_array_equal(f(Tensor(a)).numpy(), a * 2)


def test_scalar_argument_change_is_an_error() -> None:
    f = TinyJit(lambda x, scale: x * scale)
    capture(f, Tensor(np.ones(3, np.float32)), 2.0)
    np.testing.assert_array_equal(f(Tensor(np.ones(3, np.float32)), 2.0).numpy(), [2, 2, 2])
    with pytest.raises(JitError, match=r"argument 1 \('scale'\) is 3.0 but the capture was made with 2.0"):
        f(Tensor(np.ones(3, np.float32)), 3.0)


def test_outputs_are_not_overwritten_by_the_next_call() -> None:
    f = TinyJit(lambda x: x + 1)
    outs = [f(Tensor(np.full(3, i, np.float32))) for i in range(5)]
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o.numpy(), np.full(3, i + 1))


def test_reuse_outputs_opts_in_to_overwriting() -> None:
    f = TinyJit(lambda x: x + 1, reuse_outputs=True)
    outs = [f(Tensor(np.full(3, i, np.float32))) for i in range(5)]
    np.testing.assert_array_equal(outs[3].numpy(), np.full(3, 5))  # the last call's value
    assert outs[3].uop.base is outs[4].uop.base


def test_same_tensor_twice_and_alias_guard() -> None:
    f = TinyJit(lambda a, b: a * 10 + b)
    x = np.arange(3, dtype=np.float32)
    capture(f, Tensor(x), Tensor(x))  # captured with two different buffers
    t = Tensor(x + 1)
    with pytest.raises(JitError, match="share buffers differently"):
        f(t, t)
    g = TinyJit(lambda a, b: a * 10 + b)
    for i in range(4):
        t = Tensor(x + i)
        np.testing.assert_array_equal(g(t, t).numpy(), (x + i) * 11)


def test_input_written_by_the_function() -> None:
    def step(x: Tensor, d: Tensor) -> Tensor:
        x.assign(x + d)
        return x * 2

    f = TinyJit(step)
    state = Tensor(np.zeros(4, np.float32))
    for i in range(1, 6):
        out = f(state, Tensor(np.ones(4, np.float32)))
        np.testing.assert_array_equal(state.numpy(), np.full(4, i))
        np.testing.assert_array_equal(out.numpy(), np.full(4, 2 * i))


def test_state_assigned_inside_the_function_persists() -> None:
    class Counter:
        def __init__(self) -> None:
            self.n = Tensor(np.zeros(2, np.float32))

        @TinyJit
        def tick(self, x: Tensor) -> Tensor:
            self.n.assign(self.n + x)
            return self.n + 0

    c = Counter()
    for i in range(1, 6):
        np.testing.assert_array_equal(c.tick(Tensor(np.ones(2, np.float32))).numpy(), np.full(2, i))


def test_nested_jit() -> None:
    inner = TinyJit(lambda x: x * 3)
    outer = TinyJit(lambda x: inner(x + 1) - 1)
    for i in range(5):
        x = np.full(4, i, np.float32)
        np.testing.assert_array_equal(outer(Tensor(x)).numpy(), (x + 1) * 3 - 1)
        np.testing.assert_array_equal(inner(Tensor(x)).numpy(), x * 3)


def test_returns_input_constant_and_none() -> None:
    f = TinyJit(lambda x, y: (x, y * 2, None, 7))
    for i in range(4):
        x = Tensor(np.full(2, i, np.float32))
        a, b, c, d = f(x, Tensor(np.ones(2, np.float32)))
        np.testing.assert_array_equal(a.numpy(), np.full(2, i))
        np.testing.assert_array_equal(b.numpy(), [2, 2])
        assert c is None and d == 7


def test_read_back_inside_capture_is_an_error() -> None:
    def f(x: Tensor) -> Tensor:
        realize_module.check_readback("Tensor.numpy()")
        return x + 1

    jitted = TinyJit(f)
    jitted(Tensor(np.ones(2, np.float32)))  # the eager call may read
    with pytest.raises(RuntimeError, match="inside a TinyJit-captured function"):
        jitted(Tensor(np.ones(2, np.float32)))


def test_numpy_inside_capture_is_an_error() -> None:
    jitted = TinyJit(lambda x: x + float(x.sum().item()))
    jitted(Tensor(np.ones(2, np.float32)))
    with pytest.raises(RuntimeError, match="inside a TinyJit-captured function"):
        jitted(Tensor(np.ones(2, np.float32)))


def test_a_replay_queued_behind_a_running_one_uses_a_second_bound_copy() -> None:
    from rawgrad.hcq.graph import MAX_BOUND_COPIES

    dev = Device[Device.DEFAULT]
    f = TinyJit(lambda x: (x * 2 + 1).realize())
    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    for _ in range(3):  # eager, capture, first replay
        f(x)
    dev.synchronize()
    assert f.last is not None
    graph = f.last._graphs[0]
    assert len(graph.copies) == 1  # replays on an idle device never need a second copy
    # Hold the device's timeline behind a gate the host opens later: the next replays cannot run yet.
    gate, timeline = dev.new_signal(0, name="test gate"), dev.timeline_signal
    value = dev.timeline_value
    dev.queue().wait(timeline, value - 1).wait(gate, 1).signal(timeline, value).submit(dev)
    dev.timeline_value = value + 1
    try:
        f(x)  # the bound copy is idle: queued behind the gate
        out = f(x)  # that copy is now queued, not retired: a second copy instead of a wait
        assert len(graph.copies) == MAX_BOUND_COPIES == 2
    finally:
        gate.value = 1
    np.testing.assert_array_equal(out.numpy(), np.arange(8, dtype=np.float32) * 2 + 1)
    first, second = graph.copies
    for _ in range(4):  # from now on the copies take turns
        f(x)
    assert len(graph.copies) == 2 and graph.copies[0] is first and graph.copies[1] is second
    np.testing.assert_array_equal(f(x).numpy(), np.arange(8, dtype=np.float32) * 2 + 1)
