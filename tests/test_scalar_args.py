"""Float constants are kernel arguments (issue 15 §7): kernels that differ only in a Python scalar share one
compiled kernel, and the value each launch reads is exactly the literal's value in the dtype."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rawgrad import Tensor, TinyJit, dtypes
from rawgrad.tensor import realize
from rawgrad.tensor.schedule import create_schedule, is_scalar_arg

X = np.array([0.25, -0.5, 0.75, 1.5, -3.0, 7.0], np.float32)


def _kernels_for(fn) -> int:  # type: ignore[no-untyped-def]
    """How many entries the kernel cache gains while `fn` runs (a new entry = a new compile)."""
    before = set(realize._kernel_cache)
    fn()
    return len(set(realize._kernel_cache) - before)


def test_new_constants_reuse_the_compiled_kernel() -> None:
    x = Tensor(X).realize()
    (x * 0.37 + 2.5).numpy()  # compiles the kernel once
    for c in (0.38, -11.25, 1e-7, 3e38):  # (the last overflows to inf in some lanes)
        with np.errstate(over="ignore"):
            want = X * np.float32(c) + np.float32(2.5)
        added = _kernels_for(lambda c=c, want=want: np.testing.assert_allclose((x * c + 2.5).numpy(), want,
                                                                               rtol=1e-6))
        assert added == 0, f"x * {c} + 2.5 compiled a new kernel"


def test_which_constants_share_an_argument_does_not_depend_on_their_values() -> None:
    x, y = Tensor(X).realize(), Tensor(X[::-1].copy()).realize()
    (x * 2.5 + y * 2.5).numpy()  # the same value twice
    assert _kernels_for(lambda: (x * 2.5 + y * 3.5).numpy()) == 0


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64],
                         ids=lambda d: d.name)
def test_argument_value_equals_the_literal_in_each_float_dtype(dtype) -> None:  # type: ignore[no-untyped-def]
    x = Tensor(X).cast(dtype)
    # compared in a dtype that holds every value of `dtype` exactly (float32 for the narrower ones, so
    # devices without float64, Metal, run them)
    wide = dtypes.float64 if dtype == dtypes.float64 else dtypes.float32
    for c in (0.1, -3.3, 65519.0, 1e39, float("inf"), float("-inf")):
        got = (x * 0 + c).cast(wide).numpy()  # x * 0 keeps a kernel; + c reads the argument
        want = Tensor([c] * len(X), dtype=dtype).cast(wide).numpy()  # the literal, uploaded
        np.testing.assert_array_equal(got, want, err_msg=f"{c} as {dtype}")
    assert np.isnan((x + float("nan")).cast(dtypes.float32).numpy()).all()


def test_padding_a_constant_reads_zero_outside() -> None:
    got = Tensor.full((3,), 2.75).pad(((2, 1),), value=0.0) + Tensor(np.arange(6, dtype=np.float32))
    np.testing.assert_array_equal(got.numpy(), [0, 1, 4.75, 5.75, 6.75, 5])
    got = Tensor(X).pad(((1, 1),), value=-4.5)
    np.testing.assert_array_equal(got.numpy(), np.pad(X, 1, constant_values=-4.5))


def test_constants_are_arguments_and_literals_stay_literals() -> None:
    x = Tensor(X)
    items, _ = create_schedule([(x * 0.37 + 1.0).uop])
    (item,) = [it for it in items if it.ast is not None]
    args = [v for v in item.var_vals if is_scalar_arg(v)]
    assert len(args) == 1, "0.37 is an argument, 1.0 a literal"
    assert item.var_vals[args[0]] == int(np.array([0.37], np.float32).view(np.int32)[0])
    items, _ = create_schedule([(Tensor(np.arange(4, dtype=np.int32)) * 7).uop])
    assert not any(is_scalar_arg(v) for it in items for v in it.var_vals), "int constants stay literals"


def test_captured_graph_keeps_each_kernels_constants(tmp_path: Path) -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        y = (x * 0.37 + 2.5).contiguous()  # two kernels, each with its own argument 0
        return (y * -1.75 + 0.125).contiguous()

    want = lambda a: (a * np.float32(0.37) + np.float32(2.5)) * np.float32(-1.75) + np.float32(0.125)
    for k in range(4):
        a = X + k
        np.testing.assert_allclose(f(Tensor(a)).numpy(), want(a), rtol=1e-6)
    bound = [q for g in f.last._graphs for q in g.copies]  # type: ignore[union-attr]
    live = {v for q in bound for p in q.patch_points for v in p.expr.variables()}
    assert bound and not any(is_scalar_arg(v) for v in live), "a constant left as a per-replay patch point"
    path = tmp_path / "scalars.rgjit"
    f.save(str(path))
    code = textwrap.dedent(f"""
        import numpy as np
        from rawgrad import Tensor, TinyJit
        g = TinyJit.load({str(path)!r})
        a = np.array({(X + 9).tolist()!r}, np.float32)
        print(repr(g(Tensor(a)).numpy().tolist()))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(eval(out.stdout), want(X + 9), rtol=1e-6)
