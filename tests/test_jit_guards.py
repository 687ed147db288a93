"""TinyJit traps that used to be silent: writes the return value does not read, random numbers, the training
flag, globals and closure variables changed after capture, and JIT_VERIFY. Every replay is compared with
numpy or with eager calls from the same seed."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor
from rawgrad.jit import JitError, TinyJit

SCALE = 2.0  # read by `scaled` as a module global
WEIGHT = Tensor(np.arange(3, dtype=np.float32))  # read by `add_weight`; tests rebind it
STEP = 0  # bumped by `counts_calls`
HOST_DATA = [1.0, 2.0, 3.0]  # a list `from_host_list` builds a Tensor from (invisible to the guards)


@pytest.fixture(autouse=True)
def _restore_globals() -> Any:
    global SCALE, WEIGHT, STEP
    saved = (SCALE, WEIGHT, STEP, list(HOST_DATA), Tensor.training)
    yield
    SCALE, WEIGHT, STEP, HOST_DATA[:], Tensor.training = saved


def ones(n: int) -> Tensor:
    return Tensor(np.ones(n, np.float32))


# ---------------------------------------------------------------------------------------------- 1: assigns
def test_assign_the_return_does_not_read_lands_in_every_replay() -> None:
    state = Tensor(np.zeros(2, np.float32))

    @TinyJit
    def f(x: Tensor) -> Tensor:
        state.assign(state + x)
        return x * 2

    for _ in range(5):
        out = f(ones(2))
    np.testing.assert_array_equal(out.numpy(), [2, 2])
    assert f.replays == 3
    np.testing.assert_array_equal(state.numpy(), [5, 5])


def test_assign_pending_from_outside_runs_once_not_in_every_replay() -> None:
    state = Tensor(np.zeros(2, np.float32))
    f = TinyJit(lambda x: (state + x).contiguous())
    np.testing.assert_array_equal(f(ones(2)).numpy(), [1, 1])
    state.assign(state + 1)  # pending when the capture starts: it runs before, not inside the capture
    for _ in range(4):
        np.testing.assert_array_equal(f(ones(2)).numpy(), [2, 2])
    state.assign(state + 1)  # and one made before a replay is read by it
    np.testing.assert_array_equal(f(ones(2)).numpy(), [3, 3])
    np.testing.assert_array_equal(state.numpy(), [2, 2])


def test_hand_written_sgd_step_inside_the_jit_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((4, 3)).astype(np.float32)
    y_np = rng.standard_normal((4, 1)).astype(np.float32)
    w_np = rng.standard_normal((3, 1)).astype(np.float32)
    lr = 0.1
    w = Tensor(w_np.copy())

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        err = x @ w - y
        grad = x.T @ err * (2 / x.shape[0])  # gradient of mean((xw - y)^2) (y has one column)
        w.assign(w - grad * lr)
        return (err * err).mean()

    ref_w = w_np.astype(np.float64)
    for _ in range(6):
        loss = step(Tensor(x_np), Tensor(y_np))
        err = x_np.astype(np.float64) @ ref_w - y_np
        np.testing.assert_allclose(loss.numpy(), (err * err).mean(), rtol=1e-5, atol=1e-6)
        ref_w = ref_w - lr * (x_np.T @ err * (2 / x_np.shape[0]))
        # the weights after every step (a training loop that logs them reads them between calls)
        np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-5, atol=1e-6)
    assert step.replays == 4


# ---------------------------------------------------------------------------------------------- 2: random
def test_rand_inside_the_jit_gives_the_numbers_of_eager_calls() -> None:
    def f(x: Tensor) -> Tensor:
        return x + Tensor.rand(4)

    Tensor.manual_seed(3)
    eager = [f(ones(4)).numpy() for _ in range(6)]
    eager_after = Tensor.rand(4).numpy()
    Tensor.manual_seed(3)
    jitted = TinyJit(f)
    got = [jitted(ones(4)).numpy() for _ in range(6)]
    assert jitted.replays == 4
    for g, e in zip(got, eager, strict=True):
        np.testing.assert_array_equal(g, e)
    assert len({g.tobytes() for g in got}) == 6
    np.testing.assert_array_equal(Tensor.rand(4).numpy(), eager_after)  # the sequence continues


def test_manual_seed_between_replays_is_used_by_the_next_replay() -> None:
    def f(x: Tensor) -> Tensor:
        return x * Tensor.rand(3)

    jitted = TinyJit(f)
    for _ in range(3):
        jitted(ones(3))
    Tensor.manual_seed(11)
    got = jitted(ones(3)).numpy()
    Tensor.manual_seed(11)
    np.testing.assert_array_equal(got, f(ones(3)).numpy())


def test_dropout_mask_changes_across_replays() -> None:
    def f(x: Tensor) -> Tensor:
        return x.dropout(0.5)

    Tensor.manual_seed(5)
    with Tensor.train():
        eager = [f(ones(16)).numpy() for _ in range(5)]
        Tensor.manual_seed(5)
        jitted = TinyJit(f)
        got = [jitted(ones(16)).numpy() for _ in range(5)]
    assert jitted.replays == 3
    masks = {(g != 0).tobytes() for g in got}
    assert len(masks) == 5
    for g, e in zip(got, eager, strict=True):
        np.testing.assert_array_equal(g, e)


def test_manual_seed_inside_the_function_is_refused() -> None:
    def f(x: Tensor) -> Tensor:
        Tensor.manual_seed(1)
        return x + Tensor.rand(2)

    jitted = TinyJit(f)
    jitted(ones(2))
    with pytest.raises(JitError, match="manual_seed"):
        jitted(ones(2))


# ---------------------------------------------------------------------------------------------- 3: training
def test_training_flag_flipped_after_capture_uses_a_capture_in_that_mode() -> None:
    def f(x: Tensor) -> Tensor:
        return x.dropout(0.5) + 1 if Tensor.training else x * 3

    jitted = TinyJit(f)
    for _ in range(3):
        np.testing.assert_array_equal(jitted(ones(8)).numpy(), np.full(8, 3.0))
    Tensor.manual_seed(9)
    with Tensor.train():
        got = [jitted(ones(8)).numpy() for _ in range(3)]
    Tensor.manual_seed(9)
    with Tensor.train():
        want = [f(ones(8)).numpy() for _ in range(3)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(jitted(ones(8)).numpy(), np.full(8, 3.0))  # back in eval: old capture
    assert jitted.recaptures == 0  # mode switches do not count against max_recaptures


# ---------------------------------------------------------------------------------------------- 4: globals
def scaled(x: Tensor) -> Tensor:
    return x * SCALE


def add_weight(x: Tensor) -> Tensor:
    return x + WEIGHT


def counts_calls(x: Tensor) -> Tensor:
    global STEP
    STEP += 1
    return x + STEP


def test_module_global_scalar_changed_after_capture() -> None:
    global SCALE
    jitted = TinyJit(scaled)
    for _ in range(3):
        jitted(ones(3))
    SCALE = 5.0
    np.testing.assert_array_equal(jitted(ones(3)).numpy(), np.full(3, 5.0))
    np.testing.assert_array_equal(jitted(ones(3)).numpy(), np.full(3, 5.0))
    assert jitted.recaptures == 1
    SCALE = 2.0  # back to a value captured before: that capture is reused
    np.testing.assert_array_equal(jitted(ones(3)).numpy(), np.full(3, 2.0))
    assert jitted.recaptures == 1


def test_closure_variable_changed_after_capture() -> None:
    k = 3

    def f(x: Tensor) -> Tensor:
        return x + k

    jitted = TinyJit(f)
    for _ in range(3):
        jitted(ones(2))
    k = 10
    np.testing.assert_array_equal(jitted(ones(2)).numpy(), [11, 11])


def test_global_tensor_rebound_to_a_new_object() -> None:
    global WEIGHT
    jitted = TinyJit(add_weight)
    for _ in range(3):
        np.testing.assert_array_equal(jitted(ones(3)).numpy(), [1, 2, 3])
    WEIGHT = Tensor(np.array([10, 20, 30], np.float32))
    np.testing.assert_array_equal(jitted(ones(3)).numpy(), [11, 21, 31])


def test_a_global_that_keeps_changing_raises_naming_it() -> None:
    jitted = TinyJit(counts_calls, max_recaptures=2)
    with pytest.raises(JitError, match="global 'STEP'"):
        for _ in range(8):
            out = jitted(ones(2))
            np.testing.assert_array_equal(out.numpy(), np.full(2, STEP + 1.0))


# ---------------------------------------------------------------------------------------------- 5: verify
def from_host_list(x: Tensor) -> Tensor:
    return x + Tensor(np.array(HOST_DATA, np.float32))


def test_jit_verify_catches_what_the_guards_cannot_see(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JIT_VERIFY", "1")
    jitted = TinyJit(from_host_list)
    for _ in range(3):
        jitted(ones(3))
    HOST_DATA[1] = 7.0  # a list's contents: not a guarded value
    with pytest.raises(JitError, match="JIT_VERIFY.*returned tensor 0"):
        jitted(ones(3))


def test_jit_verify_passes_with_writes_and_random_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    state = Tensor(np.zeros(3, np.float32))

    def f(x: Tensor) -> Tensor:
        r = Tensor.rand(3)
        state.assign(state + x)
        return x + r

    Tensor.manual_seed(2)
    eager = [f(ones(3)).numpy() for _ in range(5)]
    eager_state = state.numpy()
    state.assign(Tensor(np.zeros(3, np.float32))).realize()
    monkeypatch.setenv("JIT_VERIFY", "2")
    Tensor.manual_seed(2)
    jitted = TinyJit(f)
    got = [jitted(ones(3)).numpy() for _ in range(5)]
    for g, e in zip(got, eager, strict=True):
        np.testing.assert_array_equal(g, e)
    np.testing.assert_array_equal(state.numpy(), eager_state)  # verified calls did not write twice


def test_saving_a_capture_that_draws_random_numbers_is_refused(tmp_path: Any) -> None:
    jitted: TinyJit[Tensor] = TinyJit(lambda x: x + Tensor.rand(2))
    for _ in range(2):
        jitted(ones(2))
    with pytest.raises(JitError, match="random"):
        jitted.save(str(tmp_path / "g.rgraph"))
