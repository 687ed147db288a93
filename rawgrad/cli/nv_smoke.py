"""`python -m rawgrad smoke [--mock] [--json PATH]`: the NV bring-up smoke run with its Tensor step.

The driver-level steps live in rawgrad/drivers/nv/smoke.py. The step here runs rawgrad's own kernels
through Tensor and TinyJit on the device the earlier steps brought up; it sits in the cli layer because a
driver must not import the Tensor layer above it. See the driver module's docstring for what the run
records and where the JSON goes.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from typing import Any

import numpy as np

from rawgrad.drivers.nv.smoke import SmokeRun, Step, StepResult, render
from rawgrad.drivers.nv.smoke import run_smoke as run_driver_steps
from rawgrad.jit import TinyJit
from rawgrad.tensor.tensor import Tensor

__all__ = ["add_arguments", "main", "run_command", "run_smoke", "tensor_ops"]

# the largest difference from numpy the float32 results may show (fma, a 48-long row sum, a matmul)
MAX_ABS_ERROR = 1e-3
TENSOR_SHAPE = (64, 48)
JIT_CALLS = 4  # call 1 eager, call 2 captures, calls 3 and 4 replay


def tensor_ops(run: SmokeRun) -> dict[str, Any]:
    """Elementwise, reduce and matmul kernels through Tensor, then a TinyJit capture and replays, on the
    registry's NV device (the one `run.hcq` holds); each compared with numpy."""
    del run  # the step reaches the device by name: Device["NV"] is the instance the run brought up
    name = "NV"
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(TENSOR_SHAPE).astype(np.float32) for _ in range(3))
    ta, tb, tc = (Tensor(x, device=name) for x in (a, b, c))
    got = {"fma": (ta * tb + tc).numpy(), "sum": ta.sum(axis=1).numpy(), "matmul": (ta @ tb.T).numpy()}
    want = {"fma": a * b + c, "sum": a.sum(axis=1), "matmul": a @ b.T}
    errors = {k: float(np.max(np.abs(got[k] - want[k]))) for k in got}

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        return ((x * 2 + y).relu() @ y.T).realize()

    for _ in range(JIT_CALLS):
        out = step(ta, tb).numpy()
    errors["jit"] = float(np.max(np.abs(out - (np.maximum(a * 2 + b, 0) @ b.T))))
    if max(errors.values()) > MAX_ABS_ERROR:
        raise AssertionError(f"results differ from numpy: {errors}")
    return {"max_abs_error": errors, "replays": getattr(step, "replays", None)}


CLI_STEPS: tuple[Step, ...] = (("tensor_ops", tensor_ops, ("first_kernel",)),)


def run_smoke(mock: bool = False) -> list[StepResult]:
    """The whole smoke run: the driver's steps with the Tensor step before the fault step."""
    return run_driver_steps(mock, CLI_STEPS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rawgrad smoke",
                                     description="NV bring-up smoke run (NV-FACTS section 10), every outcome "
                                                 "recorded; see rawgrad/drivers/nv/smoke.py")
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options, shared by `python -m rawgrad smoke` and `main`."""
    parser.add_argument("--mock", action="store_true", help="run on the mock driver + GPU (not hardware)")
    parser.add_argument("--json", help="where to write the results (default $OUT/nv_smoke.json if OUT set)")


def run_command(args: argparse.Namespace) -> int:
    """Run, print the table, write the JSON; 0 when every step passed."""
    results = run_smoke(args.mock)
    print(render(results))
    path = args.json or (os.path.join(os.environ["OUT"], "nv_smoke.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"mock": args.mock, "steps": [asdict(r) for r in results]}, f, indent=1, default=str)
        print(f"wrote {path}")
    return 0 if all(r.status == "ok" for r in results) else 1
