"""Tensor methods for math, comparison, cumulative, sorting and shape helpers, composed from the core
ops in tensor.py (which mixes this class into `Tensor`). Nothing here adds a new kernel op: every method
is a composition the scheduler fuses like hand-written code."""

from __future__ import annotations


class MathOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()
