"""A known kernel for any device, built the way realize builds kernels: a tiny Tensor graph scheduled to a
kernel AST, lowered and rendered by the device's renderer, compiled by its compiler, loaded as a Program."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rawgrad import Tensor, dtypes
from rawgrad.compiler.ir import UOp, Variable
from rawgrad.hcq import HCQBuffer, HCQDevice, Program
from rawgrad.tensor.schedule import create_schedule

# The kernel's buffers hold this many int32 elements; `n` (its one scalar) says how many it computes.
MAX_N = 256


@dataclass
class ScaleAdd:
    """`out[i] = 3 * x[i] + 1` for i < n: program(out, x, vals=(n,)) over a global size of n."""

    program: Program
    n: UOp  # the kernel's Variable: its launch covers `global_size(n)` indices

    @staticmethod
    def expected(x: np.ndarray, n: int) -> np.ndarray:
        return (3 * x[:n] + 1).astype(np.int32)


def scale_add(dev: HCQDevice) -> ScaleAdd:
    n = Variable("conformance.n", 1, MAX_N)
    x = Tensor.empty(MAX_N, dtype=dtypes.int32, device="CPU")  # the AST does not depend on the device
    out = x.shrink(((0, n.bind(MAX_N)),)) * 3 + 1
    items, _ = create_schedule([out.uop])
    (item,) = [it for it in items if it.ast is not None]
    assert dev.renderer is not None, f"{dev.name} has no renderer"
    linear = dev.renderer.lower(item.ast, "conformance_scale_add")
    assert linear.variables == [n] and linear.global_size is n, "the kernel should launch one index per i"
    lib = dev.compiler.compile(dev.renderer.render(linear))
    return ScaleAdd(dev.program(linear.name, lib, linear.launch), n)


def upload(dev: HCQDevice, data: np.ndarray) -> HCQBuffer:
    buf = dev.allocator.alloc(data.nbytes)
    dev.allocator.copyin(buf, memoryview(np.ascontiguousarray(data)))
    return buf


def download(dev: HCQDevice, buf: HCQBuffer, dtype: type = np.int32, count: int | None = None) -> np.ndarray:
    n = buf.size // np.dtype(dtype).itemsize if count is None else count
    out = np.empty(n, dtype)
    dev.allocator.copyout(memoryview(out), buf)
    return out
