"""The AST-keyed kernel disk cache (rawgrad.compiler.cache_kernels): keys, hits with no compile, refusals."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rawgrad import Tensor, dtypes
from rawgrad.compiler.cache_kernels import KERNEL_SUFFIX, ast_key
from rawgrad.compiler.ir import Ops, UOp
from rawgrad.tensor import schedule_cache

ROOT = Path(__file__).resolve().parent.parent


def _asts(t: Tensor) -> list[UOp]:
    items = schedule_cache.schedule_noting_assigns([t.uop])[0]
    return [si.ast for si in items if si.ast is not None]


def _key(ast: UOp) -> str:
    return ast_key(ast, "E", "ctx")


def test_asts_that_differ_anywhere_never_share_a_key() -> None:
    x = Tensor(np.arange(16, dtype=np.float32)).realize()
    h = Tensor(np.arange(16, dtype=np.float16)).realize()
    y = Tensor(np.arange(32, dtype=np.float32)).realize()
    variants = {
        "add": (x + 1).exp(), "mul": (x * 1).exp(),  # op
        "f16": (h + 1).exp(),  # dtype
        "shape": (y + 1).exp(),  # shape
        "view": (x.reshape(4, 4).T + 1).exp(), "slice": (x.reshape(4, 4)[:, 1] + 1).exp(),  # views
        "sum": x.sum(), "max": x.max(),
    }
    keys: dict[str, str] = {}
    for name, t in variants.items():
        asts = _asts(t)
        assert asts, name
        keys[name] = _key(asts[-1])
    assert len(set(keys.values())) == len(keys), keys
    # the same structure built again gives the same key (what makes a hit in a fresh process possible)
    assert _key(_asts((x + 1).exp())[-1]) == keys["add"]
    # every single-node change of a real AST changes the key: each constant literal (bit for bit: 0.0 vs
    # -0.0 too), each dtype, each op
    base = _asts((x.reshape(4, 4)[:, 1] * 3 + 0.5).exp())[-1]
    base_key = _key(base)
    changed = 0
    for node in base.toposort():
        edits: list[UOp] = []
        if node.op is Ops.CONST and isinstance(node.arg, (int, float)) and not isinstance(node.arg, bool):
            edits.append(node.replace(arg=node.arg + 1))
            if node.arg == 0 and isinstance(node.arg, float):
                edits.append(node.replace(arg=-0.0))
        if node.dtype is dtypes.float32:
            edits.append(node.replace(dtype=dtypes.float16))
        if node.op is Ops.ADD:
            edits.append(node.replace(op=Ops.MUL))
        for new in edits:
            assert _key(base.substitute({node: new})) != base_key, (node.op, new)
            changed += 1
    assert changed >= 3
    # the context (target, versions) is part of the key
    assert ast_key(base, "E", "ctx2") != base_key and ast_key(base, "F", "ctx") != base_key


CHILD = r"""
import sys
import numpy as np
from rawgrad import Tensor
from rawgrad.compiler.counters import compile_counts
from rawgrad.compiler.toolchain import LLVMCompiler
from rawgrad.tensor.realize import GlobalCounters
n = int(sys.argv[1])
x = Tensor(np.arange(n, dtype=np.float32)).realize()
GlobalCounters.reset(); LLVMCompiler.stats.reset()
y = ((x + 1).reshape(1, n)[:, : n - 1] * 2).exp().numpy().ravel()
s = LLVMCompiler.stats
print(repr([float(v) for v in y]))
print(repr((GlobalCounters.kernels_compiled, GlobalCounters.kernel_disk_hits, s.compiles, s.disk_hits)))
"""


def _run(folder: Path, n: int) -> tuple[list[float], tuple[int, int, int, int], str]:
    """A fresh process on the CPU device with `folder` as its cache: its values, its counters (kernels
    built, of those from the kernel cache, LLVM compiles, compiler disk hits) and its stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DEV": "CPU", "RAWGRAD_CACHE_DIR": str(folder)}
    res = subprocess.run([sys.executable, "-c", CHILD, str(n)], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    return eval(lines[-2]), eval(lines[-1]), res.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder a fresh process filled with the 7-element kernel."""
    folder = tmp_path_factory.mktemp("built") / "cache"
    folder.mkdir(mode=0o700)
    y, counts, _ = _run(folder, 7)
    np.testing.assert_allclose(y, _want(7), rtol=1e-6)
    assert counts[0] >= 1 and counts[1] == 0 and counts[2] >= 1  # built and compiled
    return folder


def _copy(built: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    shutil.copytree(built, folder)
    os.chmod(folder, 0o700)
    return folder


def _want(n: int) -> list[float]:
    return [float(v) for v in np.exp((np.arange(n - 1, dtype=np.float32) + 1) * 2)]


def test_fresh_process_hits_without_lowering_or_compiling(built: Path, tmp_path: Path) -> None:
    folder = _copy(built, tmp_path)
    assert any(p.suffix == KERNEL_SUFFIX for p in folder.iterdir())
    y, counts, _ = _run(folder, 7)
    np.testing.assert_allclose(y, _want(7), rtol=1e-6)
    assert counts[1] == counts[0] >= 1  # every kernel from the kernel cache ...
    assert counts[2] == 0 and counts[3] == 0  # ... and neither LLVM nor the compiler's own cache asked
    y, counts, _ = _run(folder, 9)  # another shape: another AST, built
    np.testing.assert_allclose(y, _want(9), rtol=1e-6)
    assert counts[1] == 0 and counts[2] >= 1


@pytest.mark.parametrize("damage", ["flip_header", "hostile_pickle", "wrong_kernel", "symlink",
                                    "others_writable"])
def test_corrupt_or_hostile_entry_is_refused_and_rebuilt(built: Path, tmp_path: Path, damage: str) -> None:
    folder = _copy(built, tmp_path)
    (entry,) = [p for p in folder.iterdir() if p.suffix == KERNEL_SUFFIX]
    if damage == "flip_header":  # torn or bit-rotted: the stored sha256 no longer matches
        data = bytearray(entry.read_bytes())
        data[40] ^= 0xFF
        entry.write_bytes(bytes(data))
    elif damage in ("hostile_pickle", "wrong_kernel"):
        import hashlib
        import pickle
        import struct
        if damage == "hostile_pickle":  # a valid hash over a header that would run code if unpickled freely
            header = pickle.dumps((1, os.system, ("touch " + str(tmp_path / "pwned"),)))
            payload = struct.pack("<Q", len(header)) + header + b"\x7fELF"
        else:  # a valid entry whose object lacks the named symbol
            data = entry.read_bytes()[32:]
            (n,) = struct.unpack_from("<Q", data)
            header = pickle.loads(data[8:8 + n])
            header = (header[0], "not_the_symbol", *header[2:])
            new = pickle.dumps(header, protocol=5)
            payload = struct.pack("<Q", len(new)) + new + data[8 + n:]
        entry.write_bytes(hashlib.sha256(payload).digest() + payload)
    elif damage == "symlink":  # an entry that is a symlink to a file elsewhere is never followed
        elsewhere = tmp_path / "elsewhere"
        elsewhere.write_bytes(entry.read_bytes())
        entry.unlink()
        entry.symlink_to(elsewhere)
    else:
        entry.chmod(0o666)
    y, counts, out = _run(folder, 7)
    np.testing.assert_allclose(y, _want(7), rtol=1e-6)  # right values: the entry was not used
    assert counts[1] == 0  # no kernel came from the refused entry
    assert not (tmp_path / "pwned").exists()
    if damage in ("symlink", "others_writable"):
        assert entry.name in out


def test_key_covers_what_the_lowering_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOOPT changes the lowering, so it changes the kernel cache's key (the AST alone is the same)."""
    from rawgrad.hcq.device import Device
    from rawgrad.tensor import realize as R

    x = Tensor(np.arange(16, dtype=np.float32)).realize()
    ast = _asts((x + 1).exp())[-1]
    dev = Device["CPU"]
    if not getattr(dev.compiler, "cache_dir", None):
        pytest.fail("the CPU compiler has no disk cache folder here; the test needs one")
    monkeypatch.setenv("NOOPT", "0")
    plain = R._kernel_disk(dev, "E_16", ast)
    monkeypatch.setenv("NOOPT", "1")
    noopt = R._kernel_disk(dev, "E_16", ast)
    assert plain is not None and noopt is not None and plain[1] != noopt[1]
    assert R._kernel_disk(dev, "E_other", ast)[1] != noopt[1]  # type: ignore[index]


def test_unpicklable_ast_is_built_without_the_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """An AST the key cannot be computed for is built as before, just not cached on disk."""
    from rawgrad.hcq.device import Device
    from rawgrad.tensor import realize as R

    def refuse(*_: object) -> str:
        raise pickle.PicklingError("not picklable")

    monkeypatch.setattr(R, "ast_key", refuse)
    x = Tensor(np.arange(16, dtype=np.float32)).realize()
    ast = _asts((x * 3 - 2).exp())[-1]
    assert R._kernel_disk(Device["CPU"], "E_16", ast) is None
    np.testing.assert_allclose((x * 7 - 2).exp2().numpy(), np.exp2(np.arange(16, dtype=np.float32) * 7 - 2),
                               rtol=1e-6)
