"""First contact with a real Mac, step by step: `python -m rawgrad.drivers.metal.smoke` (add `--mock` to
rehearse on the Linux mock). Each step prints what it checked and stops at the first failure, so the
first Mac run says exactly which assumption of the mock-verified driver does not hold there (docs/metal.md
lists them).

Steps: open the device (libobjc + Metal.framework, MTLCreateSystemDefaultDevice); a shared buffer round trip
through `contents`; one shared event as a timeline (signal from a command buffer, read back); compile one MSL
kernel with Apple's compiler (fast math off, MSL 3.1) and run it eagerly; the same kernel as a one-command
indirect command buffer replay; command-buffer timestamps; close with nothing left in flight.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rawgrad.drivers.metal.device import MetalDevice

__all__ = ["main", "run_steps"]

N = 256


def _steps(dev: MetalDevice) -> list[tuple[str, Callable[[], str]]]:
    from rawgrad.compiler.ir import Variable
    from rawgrad.hcq.graph import HCQGraph, KernelCommand, address_var, build_template
    from rawgrad.hcq.signal import device_clock

    src = ("#include <metal_stdlib>\nusing namespace metal;\n"
           "kernel void smoke_axpy(device float* buf0 [[buffer(0)]], device float* buf1 [[buffer(1)]], "
           "constant long* vars [[buffer(2)]], uint3 tpig [[thread_position_in_grid]], "
           "uint3 tpg [[threads_per_grid]], uint lid [[thread_index_in_threadgroup]]) {\n"
           "  const long i = (long)tpig.x + (long)tpg.x * ((long)tpig.y + (long)tpg.y * (long)tpig.z);\n"
           "  if (i >= vars[0]) return;\n  buf0[i] = 2.0f * buf1[i] + 1.0f;\n}\n")
    x = np.arange(N, dtype=np.float32)
    state: dict[str, Any] = {}

    def buffers() -> str:
        a, b = dev.allocator.alloc(4 * N), dev.allocator.alloc(4 * N)
        dev.allocator.copyin(b, x.data)
        back = np.empty(N, np.float32)
        dev.allocator.copyout(back.data, b)
        assert np.array_equal(back, x), "shared buffer round trip changed the data"
        state.update(out=a, inp=b)
        return f"2 shared buffers, gpuAddress {b.va_addr:#x}"

    def timeline() -> str:
        v, _ = dev.timeline_submit()
        dev.synchronize(10.0)
        assert dev.timeline_signal.value >= v
        return f"timeline event reached {dev.timeline_signal.value}"

    def eager() -> str:
        prog = dev.program("smoke_axpy", src.encode())
        state["prog"] = prog
        dev.timeline_submit(lambda q: q.exec(prog, [state["out"], state["inp"], N], (N, 1, 1), (64, 1, 1)))
        got = np.empty(N, np.float32)
        dev.allocator.copyout(got.data, state["out"])
        assert np.array_equal(got, 2 * x + 1), f"kernel result differs: {got[:4]}"
        return "newLibraryWithSource compiled the kernel; dispatch result exact"

    def replay() -> str:
        n, dst = Variable("smoke.n", 1, N), address_var("smoke.dst")
        prog = state["prog"]
        template, programs = build_template(dev, [KernelCommand(prog, [dst, state["inp"], n], n)])
        graph = HCQGraph(dev, template, programs, {})
        for size in (N, 17):
            out = dev.allocator.alloc(4 * N)
            graph.submit({dst: out.va_addr, n: size})
            dev.synchronize(10.0)
            got = np.empty(N, np.float32)
            dev.allocator.copyout(got.data, out)
            assert np.array_equal(got[:size], 2 * x[:size] + 1), f"ICB replay (n={size}) differs"
        return "one-command ICB replayed twice with patched address and size"

    def timestamps() -> str:
        start, end = dev.new_signal(name="t0"), dev.new_signal(name="t1")
        dev.timeline_submit(lambda q: q.timestamp(start).exec(
            state["prog"], [state["out"], state["inp"], N], (N, 1, 1), (64, 1, 1)).timestamp(end))
        dev.synchronize(10.0)
        clock = device_clock(dev)
        ns = clock.ticks_to_ns(end.timestamp) - clock.ticks_to_ns(start.timestamp)
        assert start.timestamp > 0 and ns >= 0, (start.timestamp, end.timestamp)
        return f"GPUStartTime/GPUEndTime: {ns / 1e3:.1f} us"

    return [("buffers", buffers), ("timeline", timeline), ("eager kernel", eager), ("ICB replay", replay),
            ("timestamps", timestamps)]


def run_steps(dev: MetalDevice, out: Callable[[str], None] = print) -> bool:
    """Run every step on `dev`; False at the first failure (printed with its error)."""
    for name, step in _steps(dev):
        t0 = time.perf_counter()
        try:
            detail = step()
        except Exception as e:
            out(f"FAIL {name}: {type(e).__name__}: {e}")
            return False
        out(f"ok   {name} ({(time.perf_counter() - t0) * 1e3:.0f} ms): {detail}")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mock", action="store_true", help="run on the Linux mock runtime instead of a Mac")
    args = ap.parse_args(argv)
    try:
        if args.mock:
            from rawgrad.drivers.metal.device import open_mock
            dev = open_mock("METAL")
        else:
            dev = MetalDevice("METAL")
    except Exception as e:
        print(f"FAIL open: {type(e).__name__}: {e}")
        return 1
    print(f"ok   open: {dev!r}")
    try:
        ok = run_steps(dev)
    finally:
        dev.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
