"""rawgrad: a lazy Tensor on hardware command queues. Public names load on first use (no import cycles)."""
from __future__ import annotations

from typing import Any

from rawgrad.dtype import DType, dtypes

__all__ = ["Tensor", "Device", "dtypes", "DType", "Variable", "GlobalCounters", "TinyJit", "nn", "no_grad"]


def __getattr__(name: str) -> Any:
    if name == "Tensor":
        from rawgrad.tensor.tensor import Tensor
        return Tensor
    if name == "Device":
        from rawgrad.hcq.device import Device
        return Device
    if name == "Variable":
        from rawgrad.compiler.ir import Variable
        return Variable
    if name == "TinyJit":
        from rawgrad.jit import TinyJit
        return TinyJit
    if name == "nn":
        import rawgrad.nn as nn
        return nn
    if name == "no_grad":
        from rawgrad.tensor.autograd import no_grad
        return no_grad
    if name == "GlobalCounters":
        from rawgrad.tensor.realize import GlobalCounters
        return GlobalCounters
    raise AttributeError(f"module 'rawgrad' has no attribute {name!r}")
