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


ABANDONED_KERNEL = """
import warnings
from rawgrad import Tensor, Device
from rawgrad.drivers.cpu import device as cpu_device
from rawgrad.hcq import DeviceTimeout
cpu_device.FORCE_STOP_TIMEOUT_S = 0.3
b = Tensor.rand(2 ** 12, device="CPU").realize()
slow = b.reshape(1, 2 ** 12).expand(2 ** 26, 2 ** 12).sin().sum()  # one output: one chunk, minutes of work
slow.realize()
try:
    Device["CPU"].synchronize(timeout_s=0.2)
    raise SystemExit("the kernel finished: make it slower")
except DeviceTimeout:
    pass
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    Device["CPU"].close(drain_timeout_s=0.2)
pinned = any("no kernel image or buffer is unmapped" in str(w.message) for w in caught)
print("pinned" if pinned else "not pinned")
"""


def test_exit_with_a_kernel_still_running_is_clean() -> None:
    # the worker is abandoned inside its kernel; unmapping the image or buffers under it crashed the
    # process at exit (SIGSEGV) before mappings were pinned
    proc = subprocess.run([sys.executable, "-c", ABANDONED_KERNEL], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.strip() == "pinned", proc.stdout
