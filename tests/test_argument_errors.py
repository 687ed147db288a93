"""Bad arguments fail where the user passes them, with an error that names the problem (issue 15 §6)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rawgrad import Tensor

CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("ones(3.5)", lambda: Tensor.ones(3.5), TypeError, "sizes must be integers, got 3.5"),
    ("reshape(2.0, 3)", lambda: Tensor.ones(6).reshape(2.0, 3), TypeError, "sizes must be integers"),
    ("sum(axis=1.5)", lambda: Tensor.ones(2, 3).sum(axis=1.5), TypeError, "axis must be an int"),
    ("conv2d(stride=0)", lambda: Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(1, 1, 2, 2), stride=0),
     ValueError, "stride must be >= 1"),
    ("conv2d(groups=0)", lambda: Tensor.ones(1, 1, 4, 4).conv2d(Tensor.ones(1, 1, 2, 2), groups=0),
     ValueError, "groups must be a positive int"),
    ("expand(3, -2)", lambda: Tensor.ones(3, 1).expand(3, -2), ValueError, "negative size -2"),
    ("eye(-3)", lambda: Tensor.eye(-3), ValueError, "eye\\(n\\): negative size -3"),
    ("repeat(-1)", lambda: Tensor.ones(2).repeat(-1), ValueError, "negative size -1"),
    ("zeros(2**64)", lambda: Tensor.zeros(2 ** 64), ValueError, "more than an int64 index addresses"),
    ("empty(2**61, 8)", lambda: Tensor.empty(2 ** 61, 8), ValueError, "more than an int64 index addresses"),
    ("full(True)", lambda: Tensor.full((True,), 1.0), TypeError, "sizes must be integers"),
]


@pytest.mark.parametrize("name, make, exc, message", CASES, ids=[c[0] for c in CASES])
def test_bad_argument_is_named(name: str, make: Callable[[], Any], exc: type[Exception],
                               message: str) -> None:
    with pytest.raises(exc, match=message):
        make()


def test_cat_takes_a_list_like_torch() -> None:
    a, b = np.ones(2, np.float32), np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(Tensor.cat([Tensor(a), Tensor(b)]).numpy(), np.concatenate([a, b]))


def test_a_chain_of_50000_ops_runs() -> None:
    x = Tensor.ones(4)
    for _ in range(50_000):
        x = x + 1
    np.testing.assert_array_equal(x.numpy(), np.full(4, 50_001, np.float32))


def test_errors_are_catchable_as_pytorch_and_python_users_catch_them() -> None:
    from rawgrad.errors import ArgumentTypeError, ShapeError, TensorIndexError
    cases: list[tuple[Callable[[], Any], type[Exception], type[Exception]]] = [
        (lambda: Tensor.ones(2, 3).reshape(4, 2), ShapeError, ValueError),
        (lambda: Tensor.ones(2) + Tensor.ones(3), ShapeError, ValueError),
        (lambda: Tensor([1, 2])[5], TensorIndexError, IndexError),
        (lambda: Tensor.ones(3).sum(dtype=""), ArgumentTypeError, TypeError),
    ]
    for make, specific, pythonic in cases:
        for kind in (specific, pythonic, RuntimeError):
            with pytest.raises(kind):
                make()


def test_a_bad_dtype_names_the_argument() -> None:
    with pytest.raises(TypeError, match=r"dtype='' is not a dtype"):
        Tensor.ones(3).sum(dtype="")
    with pytest.raises(TypeError, match=r"dtype='floot' is not a dtype .*'float32'"):
        Tensor.ones(3).cast("floot")


def test_import_probes_no_device_and_a_bad_dev_is_reported_at_first_use() -> None:
    import os
    import subprocess
    import sys
    code = ("import sys\nimport rawgrad\nfrom rawgrad import Tensor\n"
            "assert rawgrad.Device.opened() == [], 'a device was opened at import'\n"
            "try:\n    Tensor([1.0])\nexcept RuntimeError as e:\n    print('first use:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DEV": "FOO"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "first use: unknown device 'FOO'" in proc.stdout
