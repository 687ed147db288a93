"""The errors rawgrad raises for bad arguments, shapes, dtypes and indices.

Each is catchable both as the Pythonic exception (ValueError, TypeError, IndexError) and as RuntimeError,
which is what PyTorch raises for the same mistakes, so code written for either habit catches them.
Device-level errors live in rawgrad.hcq.errors.
"""

from __future__ import annotations

__all__ = ["ArgumentError", "ArgumentTypeError", "RawgradError", "ShapeError", "TensorIndexError"]


class RawgradError(Exception):
    """Base class of rawgrad's tensor-level errors."""


class ArgumentError(RawgradError, ValueError, RuntimeError):
    """An argument has a value the operation cannot take (a negative size, an unknown mode, ...)."""


class ShapeError(ArgumentError):
    """Shapes that do not fit the operation (reshape, broadcast, matmul, cat, ...)."""


class ArgumentTypeError(RawgradError, TypeError, RuntimeError):
    """An argument of the wrong type or dtype (a float size, an int tensor where floats are needed, ...)."""


class TensorIndexError(RawgradError, IndexError, RuntimeError):
    """An index out of range, or an index the tensor cannot take."""
