"""Tensor methods for neural-network layers beyond tensor.py's core (scatter, interpolation, transposed
convolution, unpooling, losses), composed from core ops. tensor.py mixes this class into `Tensor`."""

from __future__ import annotations


class NNOps:
    """Mixed into `rawgrad.tensor.tensor.Tensor`; `self` is always a Tensor."""

    __slots__ = ()
