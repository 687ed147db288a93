"""`python -m rawgrad smoke [--mock] [--json PATH]`: the NV bring-up smoke run with its Tensor step.

The driver-level steps live in rawgrad/drivers/nv/smoke.py. The step here runs rawgrad's own kernels
through Tensor and TinyJit on the device the earlier steps brought up; it sits in the cli layer because a
driver must not import the Tensor layer above it. See the driver module's docstring for what the run
records and where the JSON goes.
"""
from __future__ import annotations

import argparse
from typing import Any

from rawgrad.cli.smoke_checks import MAX_ABS_ERROR, finish_run, jit_step_error, tensor_op_errors
from rawgrad.drivers.nv.smoke import SmokeRun, Step, StepResult, render
from rawgrad.drivers.nv.smoke import run_smoke as run_driver_steps

__all__ = ["add_arguments", "main", "run_command", "run_smoke", "tensor_ops"]



def tensor_ops(run: SmokeRun) -> dict[str, Any]:
    """Elementwise, reduce and matmul kernels through Tensor, then a TinyJit capture and replays, on the
    registry's NV device (the one `run.hcq` holds); each compared with numpy (cli/smoke_checks.py)."""
    del run  # the step reaches the device by name: Device["NV"] is the instance the run brought up
    errors = tensor_op_errors("NV")
    errors["jit"], replays = jit_step_error("NV")
    if max(errors.values()) > MAX_ABS_ERROR:
        raise AssertionError(f"results differ from numpy: {errors}")
    return {"max_abs_error": errors, "replays": replays}


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
    return finish_run(results, args.mock, args.json, "nv_smoke.json")
