"""The Tensor-level checks every bring-up checklist runs on the device it brought up (`smoke` for NV,
`amd-smoke` for AMD): rawgrad's own kernels through Tensor and TinyJit, compared with numpy. One place, so
the first NV GPU and the first AMD GPU are held to the same numbers."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from rawgrad.jit import TinyJit
from rawgrad.tensor.tensor import Tensor

__all__ = ["JIT_CALLS", "MAX_ABS_ERROR", "TENSOR_SHAPE", "finish_run", "jit_step_error", "tensor_op_errors"]

# the largest difference from numpy the float32 results may show (fma, a 48-long row sum, a matmul)
MAX_ABS_ERROR = 1e-3
TENSOR_SHAPE = (64, 48)
JIT_CALLS = 4  # call 1 eager, call 2 captures, calls 3 and 4 replay


def tensor_op_errors(device: str, seed: int = 0) -> dict[str, float]:
    """Max |error| against numpy of an fma, a row sum and a matmul run on `device`."""
    rng = np.random.default_rng(seed)
    a, b, c = (rng.standard_normal(TENSOR_SHAPE).astype(np.float32) for _ in range(3))
    ta, tb, tc = (Tensor(x, device=device) for x in (a, b, c))
    got = {"fma": (ta * tb + tc).numpy(), "sum": ta.sum(axis=1).numpy(), "matmul": (ta @ tb.T).numpy()}
    want = {"fma": a * b + c, "sum": a.sum(axis=1), "matmul": a @ b.T}
    return {k: float(np.max(np.abs(got[k] - want[k]))) for k in got}


def jit_step_error(device: str, seed: int = 2) -> tuple[float, int]:
    """(max |error| against numpy, replays) of a TinyJit step called JIT_CALLS times on `device`."""
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(TENSOR_SHAPE).astype(np.float32) for _ in range(2))

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        return ((x * 2 + y).relu() @ y.T).realize()

    for _ in range(JIT_CALLS):
        out = step(Tensor(a, device=device), Tensor(b, device=device)).numpy()
    return float(np.max(np.abs(out - (np.maximum(a * 2 + b, 0) @ b.T)))), step.replays


def finish_run(results: Sequence[Any], mock: bool, json_path: str | None, default_name: str) -> int:
    """Write a checklist's results as JSON (to `json_path`, else $OUT/`default_name` when OUT is set) and
    return its exit status: 0 when every step passed. `results` are dataclasses with a `status` field."""
    path = json_path or (os.path.join(os.environ["OUT"], default_name) if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"mock": mock, "steps": [asdict(r) for r in results]}, f, indent=1, default=str)
        print(f"wrote {path}")
    return 0 if all(r.status == "ok" for r in results) else 1
