"""Saved graphs: save, load in a fresh process without compiling, and refuse bad or untrusted files."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rawgrad import Device, Tensor, Variable
from rawgrad.jit import JitError, TinyJit
from rawgrad.jit.storage import FORMAT_VERSION, GraphFileError
from rawgrad.tensor.buffers import buffer_numpy

ROOT = Path(__file__).resolve().parents[1]
W = np.linspace(-1, 1, 8, dtype=np.float32)


def fn(x: Tensor, n: Any, scale: float = 2.0) -> tuple[Tensor, Tensor]:
    w = _weights()
    y = (x * w + 1).relu()
    return y * scale, (y + w).shrink(((0, n),)) - 1


_W: list[Tensor] = []


def _weights() -> Tensor:
    if not _W:
        _W.append(Tensor(W))  # one external buffer, made before the capture
    return _W[0]


def make_jit() -> TinyJit[Any]:
    return TinyJit(fn)


def expected(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """What the eager (unjitted) function computes: replays must match it bit for bit."""
    a, b = fn(Tensor(x), Variable("n", 1, 8).bind(n))
    b.realize()
    return a.numpy(), buffer_numpy(b.uop.base)[:n]


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    f = make_jit()
    for n in (3, 4):
        f(Tensor(np.arange(8, dtype=np.float32)), Variable("n", 1, 8).bind(n), scale=2.0)
    path = tmp_path / "graph.rgjit"
    f.save(str(path))
    return path


CHILD = r"""
import sys, numpy as np
from rawgrad import Device, Tensor, Variable
from rawgrad.compiler.toolchain import LLVMCompiler
from rawgrad.tensor.buffers import buffer_numpy
Device["CPU"]  # the command processor itself may compile; the graph must not
LLVMCompiler.stats.reset()
from rawgrad.jit import TinyJit
g = TinyJit.load(sys.argv[1])
out = []
for i, n in enumerate((2, 8, 5)):
    x = np.arange(8, dtype=np.float32) * (i + 1) - 3
    a, b = g(Tensor(x), Variable("n", 1, 8).bind(n), scale=2.0)
    out.append((x.tolist(), n, a.numpy().tolist(), buffer_numpy(b.uop.base)[:n].tolist()))
assert LLVMCompiler.stats.compiles == 0, LLVMCompiler.stats
assert LLVMCompiler.stats.cache_hits == 0, LLVMCompiler.stats
print(repr(out))
"""


def test_load_replays_in_a_fresh_process_without_compiling(saved: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAWGRAD_CACHE_DIR": str(tmp_path / "empty-cache")}
    res = subprocess.run([sys.executable, "-c", CHILD, str(saved)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    for x, n, a, b in eval(res.stdout.strip().splitlines()[-1]):
        ea, eb = expected(np.array(x, np.float32), n)
        np.testing.assert_array_equal(np.array(a, np.float32), ea)
        np.testing.assert_array_equal(np.array(b, np.float32), eb)


def test_load_in_process_and_guards_survive(saved: Path) -> None:
    g = TinyJit.load(str(saved))
    x = np.arange(8, dtype=np.float32)
    a, b = g(Tensor(x), Variable("n", 1, 8).bind(6), scale=2.0)
    ea, eb = expected(x, 6)
    np.testing.assert_array_equal(a.numpy(), ea)
    np.testing.assert_array_equal(buffer_numpy(b.uop.base)[:6], eb)
    with pytest.raises(JitError, match=r"has shape \(9,\) \(captured with \(8,\)\).*cannot capture again"):
        g(Tensor(np.zeros(9, np.float32)), Variable("n", 1, 8).bind(2), scale=2.0)
    with pytest.raises(JitError, match="is 3.0 but the capture was made with 2.0"):
        g(Tensor(x), Variable("n", 1, 8).bind(2), scale=3.0)


def rewrite(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def test_truncated_corrupted_and_wrong_version(saved: Path) -> None:
    data = saved.read_bytes()
    rewrite(saved, data[:20])
    with pytest.raises(GraphFileError, match="truncated"):
        TinyJit.load(str(saved))
    rewrite(saved, data[:-10])
    with pytest.raises(GraphFileError, match="truncated"):
        TinyJit.load(str(saved))
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    rewrite(saved, bytes(flipped))
    with pytest.raises(GraphFileError, match="content hash mismatch"):
        TinyJit.load(str(saved))
    rewrite(saved, data[:8] + struct.pack("<I", FORMAT_VERSION + 1) + data[12:])
    with pytest.raises(GraphFileError, match="format version"):
        TinyJit.load(str(saved))
    rewrite(saved, b"NOTAGRPH" + data[8:])
    with pytest.raises(GraphFileError, match="not a rawgrad graph file"):
        TinyJit.load(str(saved))


def test_wrong_target_is_refused(saved: Path) -> None:
    import hashlib

    from rawgrad.jit import storage
    data = saved.read_bytes()
    magic, version, _, _, _ = storage._HEADER.unpack_from(data)
    body = data[storage._HEADER.size:]
    (mlen,) = storage._U64.unpack_from(body)
    manifest = json.loads(body[8:8 + mlen])
    manifest["devices"][0]["target_key"] = "riscv64-unknown-linux|generic"
    text = json.dumps(manifest).encode()
    new_body = storage._U64.pack(len(text)) + text + body[8 + mlen:]
    header = storage._HEADER.pack(magic, version, 0, hashlib.sha256(new_body).digest(), len(new_body))
    rewrite(saved, header + new_body)
    with pytest.raises(GraphFileError, match="compiled for target 'riscv64"):
        TinyJit.load(str(saved))


def test_untrusted_file_is_refused_unless_allowed(saved: Path) -> None:
    saved.chmod(0o666)
    with pytest.raises(GraphFileError, match="writable by group or others"):
        TinyJit.load(str(saved))
    g = TinyJit.load(str(saved), allow_untrusted=True)
    x = np.ones(8, np.float32)
    got = g(Tensor(x), Variable("n", 1, 8).bind(1), scale=2.0)[0].numpy()
    np.testing.assert_array_equal(got, expected(x, 1)[0])


def test_save_before_capture_and_unsavable_constant(tmp_path: Path) -> None:
    f = TinyJit(lambda x, obj: x + 1)
    with pytest.raises(JitError, match="nothing captured yet"):
        f.save(str(tmp_path / "g"))
    for _ in range(2):
        f(Tensor(np.ones(2, np.float32)), object())
    with pytest.raises(GraphFileError, match="cannot save a value of type object"):
        f.save(str(tmp_path / "g"))


def copy_fn(x: Tensor) -> Tensor:
    y = (x + 1).realize()
    return (y.clone() * 2).realize()  # a same-device copy inside the graph (NV: the copy kernel)


COPY_CHILD = r"""
import sys, numpy as np
from rawgrad import Tensor
from rawgrad.jit import TinyJit
g = TinyJit.load(sys.argv[1])
print(repr([g(Tensor(np.arange(37, dtype=np.float32) * k)).numpy().tolist() for k in (1, 3)]))
"""


def test_graph_with_a_same_device_copy_replays_and_saves(tmp_path: Path) -> None:
    f = TinyJit(copy_fn)
    for k in range(4):
        x = np.arange(37, dtype=np.float32) * k
        np.testing.assert_array_equal(f(Tensor(x)).numpy(), (x + 1) * 2)
    assert f.replays >= 2
    dev: Any = Device[Device.DEFAULT]
    if getattr(dev, "mock", None) is not None:  # NV: the copy ran as the copy kernel inside the graph
        assert any(launch.entry == "rawgrad_copy" for launch in dev.mock.gpu.launches)
    path = tmp_path / "copy.rgjit"
    f.save(str(path))
    res = subprocess.run([sys.executable, "-c", COPY_CHILD, str(path)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    got = eval(res.stdout.strip().splitlines()[-1])
    for k, row in zip((1, 3), got, strict=True):
        np.testing.assert_array_equal(row, (np.arange(37, dtype=np.float32) * k + 1) * 2)
