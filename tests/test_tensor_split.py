"""The seams left by splitting tensor.py into themed mixin modules (issue #17): autograd imports nothing
above it, Tensor's process-wide switches are autograd's, GATHER's gradient arrives through the
registration, and every name other code imports from rawgrad.tensor.tensor still imports."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rawgrad.compiler.ir import Ops
from rawgrad.tensor import autograd
from rawgrad.tensor.tensor import Tensor


@pytest.fixture
def _restore_switches() -> Iterator[None]:
    saved = (autograd.modes.no_grad, autograd.modes.training)
    yield
    autograd.modes.no_grad, autograd.modes.training = saved


def test_autograd_imports_nothing_from_the_tensor_layer() -> None:
    """The tensor <-> autograd import cycle is gone: autograd.py imports no rawgrad.tensor module at all,
    not at module level, not under TYPE_CHECKING and not inside a function (read from its source, since
    the package root imports everything anyway)."""
    tree = ast.parse(Path(autograd.__file__).read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and not [m for m in imported if m.startswith("rawgrad.tensor")], imported


@pytest.mark.usefixtures("_restore_switches")
def test_tensor_switches_are_autograds_modes() -> None:
    Tensor.training = True
    assert autograd.modes.training is True
    with autograd.train(False):
        assert Tensor.training is False
    assert Tensor.training is True
    with autograd.no_grad():
        assert Tensor.no_grad is True and autograd.modes.no_grad is True
        with pytest.raises(RuntimeError, match="no_grad"):
            Tensor([1.0], requires_grad=True).sum().backward()
    assert Tensor.no_grad is False
    Tensor.training = False
    assert autograd.modes.training is False


def test_gather_gradient_comes_from_the_registered_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    table = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3), requires_grad=True)
    rows = Tensor(np.array([1, 3, 1], dtype=np.int32))
    table[rows].sum().backward()
    assert table.grad is not None
    np.testing.assert_array_equal(table.grad.numpy(), [[0, 0, 0], [2, 2, 2], [0, 0, 0], [1, 1, 1]])
    # without the tensor layer's registration the gradient is refused by name, never silently zero
    monkeypatch.delitem(autograd._composite_rules, Ops.GATHER)
    table.grad = None
    with pytest.raises(NotImplementedError, match="GATHER"):
        table[rows].sum().backward()


def test_names_others_import_from_tensor_module() -> None:
    from rawgrad.tensor import tensor as tensor_module
    for name in ("Tensor", "threefry2x32", "embedding", "pending_view_assigns", "check_pending_indices",
                 "_canon_device", "_pending_assigns",
                 "_pending_view_assigns", "DEFAULT_DEVICE"):
        assert getattr(tensor_module, name) is not None, name


def test_factories_called_on_the_class_or_an_instance() -> None:
    """The factories became classmethods of the creation mixin: both call forms give the same tensor."""
    t = Tensor([1.0, 2.0])
    assert t.zeros(2, 3).shape == Tensor.zeros(2, 3).shape == (2, 3)
    np.testing.assert_array_equal(t.arange(4).numpy(), Tensor.arange(4).numpy())
    Tensor.manual_seed(7)
    a = Tensor.rand(5).numpy()
    Tensor.manual_seed(7)
    np.testing.assert_array_equal(t.rand(5).numpy(), a)
    # a list as `self` still works for the torch-style Tensor.stack([a, b]) / Tensor.cat([a, b])
    assert Tensor.stack([t, t]).shape == (2, 2) and Tensor.cat([t, t]).shape == (4,)
