"""Command line: `python -m rawgrad [demo|info|bench cpu|bench dispatch]`."""
from __future__ import annotations

import argparse
import sys
import time


def demo() -> int:
    """Build a few lazy graphs, show how they fuse, run them on the default device, check with numpy."""
    import numpy as np

    from rawgrad import Device, Tensor
    from rawgrad.tensor.realize import GlobalCounters, capture_launches

    dev = Device.DEFAULT
    print(f"rawgrad demo on device {dev}")
    rng = np.random.default_rng(0)
    na, nb, nc = (rng.standard_normal((512, 512)).astype(np.float32) for _ in range(3))
    a, b, c = Tensor(na), Tensor(nb), Tensor(nc)
    cases = [
        ("((a*b + c).relu()).sum()", lambda: ((a * b + c).relu()).sum(),
         lambda: np.maximum(na * nb + nc, 0).sum()),
        ("softmax(a, -1)", lambda: a.softmax(-1),
         lambda: np.exp(na - na.max(-1, keepdims=True)) / np.exp(na - na.max(-1, keepdims=True)).sum(-1,
                                                                                                  keepdims=True)),
        ("a @ b", lambda: a @ b, lambda: na @ nb),
        ("(a.T + 1).exp().mean(0)", lambda: (a.T + 1).exp().mean(0), lambda: np.exp(na.T + 1).mean(0)),
    ]
    ok = True
    for label, build, ref in cases:
        GlobalCounters.reset()
        t0 = time.perf_counter()
        with capture_launches() as launched:
            out = build().numpy()
        dt = time.perf_counter() - t0
        expect = ref()
        good = np.allclose(out, expect, rtol=1e-4, atol=1e-3)
        ok &= bool(good)
        print(f"  {label:28s} kernels={GlobalCounters.kernel_count}"
              f"  compiled={GlobalCounters.kernels_compiled}"
              f"  {dt * 1e3:8.2f} ms  matches numpy: {good}")
        names = [e.kernel.name for e in launched if e.kernel is not None]
        print(f"    ran: {', '.join(names)}")
    print("all results match numpy" if ok else "MISMATCH against numpy")
    return 0 if ok else 1


def info() -> int:
    from rawgrad import Device
    print(f"default device: {Device.DEFAULT}")
    print(f"known devices: {', '.join(Device.known)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rawgrad")
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("demo", help="run the demo (default)")
    sub.add_parser("info", help="show devices")
    bench = sub.add_parser("bench", help="benchmarks against numpy (and others when installed)")
    bench.add_argument("what", choices=["cpu", "dispatch"])
    bench.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    args = parser.parse_args(argv)
    if args.cmd in (None, "demo"):
        return demo()
    if args.cmd == "info":
        return info()
    if args.cmd == "bench" and args.what == "dispatch":
        from rawgrad.jit.bench_dispatch import bench_dispatch
        bench_dispatch()
        return 0
    if args.cmd == "bench":
        from rawgrad.bench import bench_cpu
        return bench_cpu(quick=args.quick)
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
