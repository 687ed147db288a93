"""pytest plugin for tools/ptxas_acceptance.py: every PTX module NVCompiler.compile receives is written to
$RAWGRAD_PTX_DUMP/<sha256>.ptx (one file per distinct module). Load with `-p ptx_dump_plugin` and tools/ on
PYTHONPATH; it changes nothing else about the run."""
from __future__ import annotations

import hashlib
import os
from typing import Any


def pytest_configure(config: Any) -> None:
    out_dir = os.environ.get("RAWGRAD_PTX_DUMP")
    if not out_dir:
        return
    from rawgrad.drivers.nv import cubin

    original = cubin.NVCompiler.compile

    def compile_and_dump(self: Any, src: str) -> bytes:
        path = os.path.join(out_dir, hashlib.sha256(src.encode()).hexdigest()[:32] + ".ptx")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(src)
        return original(self, src)

    cubin.NVCompiler.compile = compile_and_dump  # type: ignore[method-assign]
