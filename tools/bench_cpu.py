"""Same as `python -m rawgrad bench cpu [--quick]` (kept as a script for people who look in tools/): when
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set it re-runs itself in a child process without them and prints
the BLAS kernel numpy loaded (see rawgrad.cli.bench.run_without_blas_overrides)."""
import sys

from rawgrad.cli.bench import bench_cpu, run_without_blas_overrides

if __name__ == "__main__":
    quick = "--quick" in sys.argv
    code = run_without_blas_overrides(["bench", "cpu", *(["--quick"] if quick else [])])
    sys.exit(code if code is not None else bench_cpu(quick=quick))
