"""Saved graphs: save, load in a fresh process without compiling (no compiler of any device runs), replay
with fresh inputs and changing Variables against numpy, and refuse bad or untrusted files."""
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
from rawgrad.tensor.buffers import device_memory

ROOT = Path(__file__).resolve().parents[1]
W = np.linspace(-1, 1, 8, dtype=np.float32)
RTOL, ATOL = 1e-5, 1e-6  # float32 results against float64 numpy


def fn(x: Tensor, n: Any, scale: float = 2.0) -> tuple[Tensor, Tensor, Tensor]:
    w = _weights()
    y = (x * w + 1).relu()
    return y * scale, (y + w).shrink(((0, n),)) - 1, (y * w).shrink(((0, n),)).sum()


_W: list[Tensor] = []


def _weights() -> Tensor:
    if not _W:
        _W.append(Tensor(W))  # one external buffer, made before the capture
    return _W[0]


def make_jit() -> TinyJit[Any]:
    return TinyJit(fn)


def reference(x: np.ndarray, n: int, scale: float = 2.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `fn` computes, in numpy (float64) from the same float32 input: the oracle for every replay."""
    w = W.astype(np.float64)
    y = np.maximum(np.asarray(x, np.float64) * w + 1, 0)
    return y * scale, (y + w)[:n] - 1, np.array((y * w)[:n].sum())


def check(got: tuple[Any, ...], x: np.ndarray, n: int, scale: float = 2.0) -> None:
    """The three outputs of one call (Tensors or lists) against numpy, shapes included."""
    for k, (g, want) in enumerate(zip(got, reference(x, n, scale), strict=True)):
        g = g.numpy() if isinstance(g, Tensor) else np.asarray(g, np.float32)
        assert g.shape == want.shape, (k, g.shape, want.shape)
        np.testing.assert_allclose(g, want, rtol=RTOL, atol=ATOL, err_msg=f"output {k}, n={n}")


def fresh_input(kind: int, rng: np.random.Generator, realize: bool = False) -> tuple[Tensor, np.ndarray]:
    """A new (8,) input Tensor made by a different op per kind (so a new buffer each call, written by a
    different kernel or copy), and its values in numpy. Unrealized, the call itself realizes it;
    `realize=True` runs those kernels now (before a count of compiles starts)."""
    if kind == 0:  # straight from numpy
        x = rng.standard_normal(8).astype(np.float32)
        t, xn = Tensor(x), x
    elif kind == 1:  # a lazy expression
        a, c = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
        t, xn = Tensor(a) * 2 + Tensor(c), a * np.float32(2) + c
    elif kind == 2:  # a slice at an offset into a bigger buffer
        big = rng.standard_normal(20).astype(np.float32)
        t, xn = Tensor(big).realize()[5:13], big[5:13]
    else:  # a transposed view, flattened
        m = rng.standard_normal((4, 2)).astype(np.float32)
        t, xn = Tensor(m).T.reshape(8), m.T.reshape(8)
    return (t.contiguous().realize() if realize else t), xn


def address(t: Tensor) -> int:
    return int(device_memory(t.uop.base).address)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    f = make_jit()
    for n in (3, 4):
        f(Tensor(np.arange(8, dtype=np.float32)), Variable("n", 1, 8).bind(n), scale=2.0)
    path = tmp_path / "graph.rgjit"
    f.save(str(path))
    return path


# Counts every compiler in the child: rawgrad's own counters (rawgrad.compiler.total_compiles: kernels
# through the realize loop, LLVM, NV) and, not trusting those, a wrapper around each renderer and each
# compiler entry point (LLVM IR, AMDGPU and PTX lowering/rendering, LLVM compile and codegen (the AMDGPU
# compiler is an LLVMCompiler), NVCompiler.compile (ptxas, nvJitLink or a PTX-only image), ptxas itself).
# Devices are opened first: opening the CPU device builds its command processor, which is not the graph's
# doing.
WATCH = r"""
import collections, sys
from rawgrad import Device
from rawgrad.compiler import total_compiles
from rawgrad.compiler import toolchain
from rawgrad.compiler.renderer import amdgpu as amdgpu_renderer, llvm as llvm_renderer, ptx as ptx_renderer
from rawgrad.compiler.renderer import msl as msl_renderer
from rawgrad.drivers.nv import cubin
CALLS = collections.Counter()

def watch(cls, name, label):
    original = getattr(cls, name)
    def counted(*a, **k):
        CALLS[label] += 1
        return original(*a, **k)
    setattr(cls, name, counted)

for cls, label in [(llvm_renderer.LLVMRenderer, "llvm"), (ptx_renderer.PTXRenderer, "ptx"),
                   (amdgpu_renderer.AMDGPURenderer, "amdgpu"), (msl_renderer.MSLRenderer, "msl")]:
    watch(cls, "lower", label + " lower")
    watch(cls, "render", label + " render")
watch(toolchain.LLVMCompiler, "compile", "llvm compile")
watch(toolchain.LLVMCompiler, "_codegen", "llvm codegen")
watch(cubin.NVCompiler, "compile", "nv compile")  # ptxas, nvJitLink, or a PTX-only image
watch(cubin.PTXAssembler, "assemble", "ptxas")
Device["CPU"], Device[Device.DEFAULT]

def snapshot():
    return collections.Counter(CALLS), total_compiles()

def since(snap):
    calls, total = snap
    return {"calls": dict(CALLS - calls), "compiles": total_compiles() - total}
"""

CHILD = WATCH + r"""
import json
import numpy as np
from rawgrad import Tensor, Variable
from rawgrad.jit import TinyJit
sys.path.insert(0, sys.argv[2])
from test_jit_storage import address, fresh_input
rng = np.random.default_rng(7)
ns = (2, 8, 5, 1, 7, 3, 6, 4)  # every n different
inputs = [fresh_input(i % 4, rng, realize=True) for i in range(len(ns))]  # each kind, its own buffer
start = snapshot()
g = TinyJit.load(sys.argv[1])
out = []
for (t, x), n in zip(inputs, ns):
    a, b, c = g(t, Variable("n", 1, 8).bind(n), scale=2.0)
    out.append({"x": x.tolist(), "n": n, "address": address(t),
                "got": [a.numpy().tolist(), b.numpy().tolist(), c.numpy().tolist()]})
loaded = {**since(start), "replays": g.replays}
# the control: a new kernel on this device is seen by both counts (they are not blind to this device)
start = snapshot()
(Tensor(np.arange(5, dtype=np.float32)) * 1.75 - 0.5).numpy()
control = since(start)
print(json.dumps({"device": Device.DEFAULT, "loaded": loaded, "control": control, "out": out}))
"""


def run_child(code: str, *args: str, tmp_path: Path) -> dict[str, Any]:
    """Run `code` in a fresh Python on this process's device (DEV and NV_MOCK are inherited) with an
    empty compile cache; returns the JSON it prints last."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAWGRAD_CACHE_DIR": str(tmp_path / "empty-cache")}
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    got: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["device"] == Device.DEFAULT  # the child ran on the device under test
    return got


def renders_of_this_device() -> str:
    """The WATCH label of the renderer the device under test uses (its language: llvm, ptx, amdgpu or
    msl)."""
    language = Device[Device.DEFAULT].renderer.language
    assert language in ("llvm", "ptx", "amdgpu", "msl"), f"WATCH does not count the {language} renderer"
    return f"{language} render"


def copy_kernels_the_mock_ran(dev: Any) -> list[str] | None:
    """Names of the same-device copy kernels the device's mock GPU executed, or None on a device without
    a mock (the NV mock's launch list, the AMD mock command processor's executed dispatches)."""
    mock = getattr(dev, "mock", None)
    if mock is None:
        return None
    if hasattr(mock, "cp"):  # AMD: the command processor's dispatch records
        from rawgrad.drivers.amd.device import COPY_KERNEL
        return [d.kernel for d in mock.cp.dispatches if d.executed and d.kernel == COPY_KERNEL]
    return [launch.entry for launch in mock.gpu.launches if launch.entry == "rawgrad_copy"]


def test_load_replays_in_a_fresh_process_without_compiling(saved: Path, tmp_path: Path) -> None:
    got = run_child(CHILD, str(saved), str(Path(__file__).parent), tmp_path=tmp_path)
    loaded, control = got["loaded"], got["control"]
    assert loaded["replays"] == len(got["out"])
    assert loaded["calls"] == {} and loaded["compiles"] == 0, loaded  # no compiler ran, of any device
    assert control["calls"].get(renders_of_this_device(), 0) >= 1 and control["compiles"] >= 1, control
    assert len({o["address"] for o in got["out"]}) == len(got["out"])  # a new input address every call
    for o in got["out"]:
        check(tuple(o["got"]), np.array(o["x"], np.float32), o["n"])


def test_load_in_process_replays_fresh_inputs_and_guards_survive(saved: Path) -> None:
    g = TinyJit.load(str(saved))
    rng = np.random.default_rng(3)
    keep, addresses = [], set()
    for i, n in enumerate((6, 1, 8, 4, 2)):
        t, x = fresh_input(i % 4, rng)
        check(g(t, Variable("n", 1, 8).bind(n), scale=2.0), x, n)
        keep.append(t)
        addresses.add(address(t))
    assert len(addresses) == 5 and g.replays == 5
    x = np.arange(8, dtype=np.float32)
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
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    check(g(Tensor(x), Variable("n", 1, 8).bind(1), scale=2.0), x, 1)


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
    return (y.clone() * 2).realize()  # a same-device copy inside the graph (NV, AMD: the copy kernel)


COPY_CHILD = WATCH + r"""
import json
import numpy as np
from rawgrad import Tensor
from rawgrad.jit import TinyJit
xs = [np.arange(37, dtype=np.float32) * k for k in (1, 3)]
inputs = [Tensor(xs[0]), Tensor(xs[1][::-1].copy()).flip(0).contiguous().realize()]  # the second by a kernel
start = snapshot()
g = TinyJit.load(sys.argv[1])
rows = [g(t).numpy().tolist() for t in inputs]
print(json.dumps({"device": Device.DEFAULT, **since(start), "rows": rows}))
"""


def test_graph_with_a_same_device_copy_replays_and_saves(tmp_path: Path) -> None:
    f = TinyJit(copy_fn)
    for k in range(4):
        x = np.arange(37, dtype=np.float32) * k
        np.testing.assert_array_equal(f(Tensor(x)).numpy(), (x + 1) * 2)
    assert f.replays >= 2
    dev: Any = Device[Device.DEFAULT]
    copies = copy_kernels_the_mock_ran(dev)
    if copies is not None:  # NV and AMD: the copy ran as the copy kernel inside the graph
        assert copies, "the graph's same-device copy did not run as the copy kernel on the mock GPU"
    path = tmp_path / "copy.rgjit"
    f.save(str(path))
    got = run_child(COPY_CHILD, str(path), tmp_path=tmp_path)
    assert got["calls"] == {} and got["compiles"] == 0, got  # the copy kernel came from the file too
    for k, row in zip((1, 3), got["rows"], strict=True):
        np.testing.assert_array_equal(row, (np.arange(37, dtype=np.float32) * k + 1) * 2)
