"""Same as `python -m rawgrad bench cpu` (kept as a script for people who look in tools/)."""
import sys

from rawgrad.bench import bench_cpu

if __name__ == "__main__":
    sys.exit(bench_cpu(quick="--quick" in sys.argv))
