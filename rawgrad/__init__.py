"""rawgrad: a lazy Tensor on hardware command queues.

The package root is the top of the import order (dtype/config <- compiler <- hcq <- drivers <- tensor <- jit
<- nn <- models <- cli; tests/test_layering.py checks it). It imports the public names directly, and it
imports rawgrad.drivers so that every driver registers itself in the device registry before any lookup:
hcq holds the registry but sits below the drivers, so it cannot import them itself. Importing a driver
only registers a factory; no device is opened and nothing is probed until a tensor first needs a device.
"""
from __future__ import annotations

from rawgrad import drivers as _drivers  # noqa: F401  (each driver registers itself on import)
from rawgrad import nn
from rawgrad.compiler.ir import Variable
from rawgrad.dtype import DType, dtypes
from rawgrad.hcq.device import Device
from rawgrad.jit import TinyJit
from rawgrad.tensor.autograd import no_grad
from rawgrad.tensor.realize import GlobalCounters
from rawgrad.tensor.tensor import Tensor

__all__ = ["Tensor", "Device", "dtypes", "DType", "Variable", "GlobalCounters", "TinyJit", "nn", "no_grad"]
