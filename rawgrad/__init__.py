"""rawgrad: a lazy Tensor on hardware command queues. Public names load on first use (no import cycles)."""
from __future__ import annotations

import importlib
from typing import Any

from rawgrad.dtype import DType, dtypes

__all__ = ["Tensor", "Device", "dtypes", "DType", "Variable", "GlobalCounters", "TinyJit", "nn", "no_grad"]

# public name -> (module, attribute in it; None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "Tensor": ("rawgrad.tensor.tensor", "Tensor"),
    "Device": ("rawgrad.hcq.device", "Device"),
    "Variable": ("rawgrad.compiler.ir", "Variable"),
    "TinyJit": ("rawgrad.jit", "TinyJit"),
    "nn": ("rawgrad.nn", None),
    "no_grad": ("rawgrad.tensor.autograd", "no_grad"),
    "GlobalCounters": ("rawgrad.tensor.realize", "GlobalCounters"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'rawgrad' has no attribute {name!r}")
    module, attr = _LAZY[name]
    mod = importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)
