"""A process that exits with kernels still queued must exit cleanly (no unmapped code under a worker)."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = """
from rawgrad import Tensor
a, b = Tensor.rand(512, 512), Tensor.rand(512, 512)
for _ in range(3):
    (a @ b + 1).realize()   # queued, never read back: still running when the interpreter exits
"""


def test_exit_with_work_in_flight_is_clean():
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"exit code {res.returncode}\n{res.stderr[-2000:]}"
