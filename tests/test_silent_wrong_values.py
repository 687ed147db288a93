"""Cases that once returned a wrong value without an error (issue 15 §1), each checked against numpy."""

from __future__ import annotations

import numpy as np

from rawgrad import Tensor
from rawgrad.compiler.view import ShapeTracker

X = np.array([0.25, 0.5, 0.75, 1.0], np.float32)


def test_one_element_of_a_lazy_stack_pad_or_cat() -> None:
    # a 0-d read through an all-masked view piece used to lose the mask (stack summed its pieces)
    x = Tensor(X)
    st = np.stack([X, X, X])
    for i in range(3):
        for j in range(4):
            assert Tensor.stack(x, x, x)[i, j].item() == st[i, j]
    padded = np.pad(X, (1, 0), constant_values=3.0)
    for i in range(5):
        assert x.pad(((1, 0),), value=3.0)[i].item() == padded[i]
    cat = np.concatenate([X, X])
    for i in range(8):
        assert x.cat(x)[i].item() == cat[i]


def test_a_0d_view_of_nothing_stays_invalid() -> None:
    empty_piece = ShapeTracker.from_shape((4,)).pad(((1, 0),)).shrink(((0, 1),))
    _, valid = empty_piece.reshape(()).to_indexed_uops()
    assert valid.is_const(False)
    # and element 1 of the same pad is a real read
    _, valid = ShapeTracker.from_shape((4,)).pad(((1, 0),)).shrink(((1, 2),)).reshape(()).to_indexed_uops()
    assert valid.is_const(True)
