"""Files that must not be trusted: saved graphs, the compile cache, safetensors, and every writer's temp file.

Anything that could crash (SIGSEGV, SIGBUS) or hang the interpreter runs in a child process, and a child
that dies by a signal or times out fails the test naming what it was doing.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_graph_fuzz import build_graph, pack, run_cases, split

from rawgrad import Tensor
from rawgrad.compiler.cache import DiskCache
from rawgrad.jit import TinyJit
from rawgrad.nn.safetensors import SafetensorsError, SafetensorsFile
from rawgrad.nn.state import safe_load, safe_save

ROOT = Path(__file__).resolve().parents[1]


def run_child(code: str, *args: str, timeout: float = 60, env: dict[str, str] | None = None) -> str:
    """Run `code` in a fresh interpreter; its stdout. A signal, an error exit or a hang fails the test."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1", "DEV": "CPU", **(env or {})}
    try:
        res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                             env=full_env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"child hung (no result within {timeout} s); it printed:\n{out}")
    if res.returncode < 0:
        pytest.fail(f"child died by signal {-res.returncode}; it printed:\n{res.stdout}\n"
                    f"{res.stderr[-3000:]}")
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


# ---------------------------------------------------------------------------------------------- writers
def _jit_with_capture() -> TinyJit[Any]:
    f = TinyJit(lambda x: (x * 2 + 1).realize())
    for _ in range(2):
        f(Tensor(np.arange(4, dtype=np.float32)))
    return f


@pytest.mark.parametrize("writer", ["TinyJit.save", "safe_save"])
def test_writers_do_not_follow_a_symlink_planted_at_the_temp_name(tmp_path: Path, writer: str) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    dest = tmp_path / "out.bin"
    # the name the writers used to open with O_TRUNC, following symlinks
    planted = Path(f"{dest}.tmp{os.getpid()}")
    planted.symlink_to(victim)
    if writer == "TinyJit.save":
        _jit_with_capture().save(str(dest))
    else:
        safe_save({"a": Tensor(np.arange(6, dtype=np.float32))}, dest)
    assert victim.read_bytes() == b"precious"
    assert dest.is_file() and not dest.is_symlink()
    assert planted.is_symlink()  # left alone: never opened, never renamed
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("victim.txt", "out.bin", planted.name)]
    assert leftovers == []  # no temporary file left behind
    if writer == "TinyJit.save":
        assert stat.S_IMODE(dest.stat().st_mode) == 0o600
        g = TinyJit.load(str(dest))
        np.testing.assert_array_equal(g(Tensor(np.ones(4, np.float32))).numpy(), np.full(4, 3, np.float32))
    else:
        np.testing.assert_array_equal(safe_load(dest)["a"].numpy(), np.arange(6, dtype=np.float32))
        link = tmp_path / "link"  # a symlink at the destination is replaced, its target untouched
        link.symlink_to(victim)
        safe_save({"a": Tensor(np.zeros(3, np.float32))}, link)
        assert victim.read_bytes() == b"precious" and link.is_file() and not link.is_symlink()

    from rawgrad.fileio import atomic_write  # the one writer all of them use

    def failing(f: Any) -> None:
        f.write(b"half")
        raise RuntimeError("disk full")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(tmp_path / "other", failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # the temporary file is gone


# ---------------------------------------------------------------------------------------------- graphs
def test_bad_manifests_with_a_valid_hash_are_refused_not_run(tmp_path: Path) -> None:
    """Negative patch index and negative arena size (both used to crash the loader or the replay), and
    other out-of-range fields, each with the hash recomputed so only the validator can catch them."""
    data = build_graph(tmp_path)
    fields, manifest, blobs = split(data)

    def edit(fn: Any) -> bytes:
        m = json.loads(json.dumps(manifest))
        fn(m)
        return pack(fields, m, blobs)

    def set_patch_index(m: Any, value: int) -> None:
        m["devices"][0]["patches"][3][0] = value
    cases = {
        "negative patch index": edit(lambda m: set_patch_index(m, -1)),
        "patch index past the words": edit(lambda m: set_patch_index(m, 10**6)),
        "negative arena size": edit(lambda m: m["devices"][0].__setitem__("arena_bytes", -64)),
        "arena smaller than its offsets": edit(lambda m: m["devices"][0].__setitem__("arena_bytes", 1)),
        "kernel reference past the table": edit(lambda m: m["devices"][0]["programs"].pop()),
        "external size negative": edit(lambda m: m["externals"][0].__setitem__("size", -8)),
        "dtype not allowed": edit(lambda m: m["externals"][0].__setitem__("dtype", "__class__")),
        "blob outside the file": edit(lambda m: m["devices"][0].__setitem__("words", [0, 1 << 40])),
        "a patch removed": edit(lambda m: m["devices"][0]["patches"].pop(0)),
    }
    results = run_cases(tmp_path, list(cases.items()), timeout=120)
    for name in cases:
        kind, detail = results[name]
        assert kind == "refused", (name, kind, detail)
        assert "manifest field" in detail or "outside" in detail, (name, detail)
    assert "patches[3][0]" in results["negative patch index"][1]
    assert "arena_bytes" in results["negative arena size"][1]


def test_rewritten_device_label_fails_the_hash_or_the_device_check(tmp_path: Path) -> None:
    data = build_graph(tmp_path)
    fields, manifest, blobs = split(data)
    relabelled = json.loads(json.dumps(manifest))
    relabelled["devices"][0]["device"] = "CPU:1"
    resaved = pack(fields, relabelled, blobs)  # the hash recomputed
    assert b'"device":"CPU",' in data
    in_place = data.replace(b'"device":"CPU",', b'"device":"CPV",', 1)  # same length, hash not updated
    other = json.loads(json.dumps(manifest))
    other["devices"][0]["arch"] = "sm_90"  # the identity of another device behind the same label
    other["devices"][0]["device_kind"] = "NVHCQDevice"
    results = run_cases(tmp_path, [("relabelled", resaved), ("in place", in_place),
                                   ("other identity", pack(fields, other, blobs))], timeout=120)
    assert results["relabelled"][0] == "refused", results["relabelled"]
    assert "'CPU'" in results["relabelled"][1] and "CPU:1" in results["relabelled"][1]  # which disagree
    assert results["in place"] == ("refused", results["in place"][1])
    assert "content hash mismatch" in results["in place"][1]
    assert results["other identity"][0] == "refused" and "here has" in results["other identity"][1]


NON_REGULAR = r"""
import json, os, sys, warnings
warnings.simplefilter("always")
from rawgrad.jit import TinyJit
from rawgrad.jit.storage import GraphFileError
from rawgrad.nn.safetensors import SafetensorsError, safe_load
from rawgrad.compiler.cache import DiskCache
folder = sys.argv[1]
for what, path in json.loads(sys.argv[2]):
    print("START", what, flush=True)
    try:
        if what.startswith("graph"):
            TinyJit.load(path)
            print("RESULT", what, "loaded", flush=True)
        elif what.startswith("safetensors"):
            safe_load(path)
            print("RESULT", what, "loaded", flush=True)
        else:
            with warnings.catch_warnings(record=True) as seen:
                got = DiskCache(folder, ".o").get(os.path.basename(path)[:-2])
            print("RESULT", what, "hit" if got is not None else "miss",
                  "|".join(str(w.message) for w in seen), flush=True)
    except (GraphFileError, SafetensorsError) as e:
        print("RESULT", what, "refused", e, flush=True)
"""


def test_fifos_symlinks_and_directories_are_refused_without_blocking(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    folder.mkdir(mode=0o700)
    graph = folder / "real.rgjit"
    graph.write_bytes(build_graph(tmp_path))
    graph.chmod(0o600)
    os.mkfifo(folder / "graph.fifo")
    os.mkfifo(folder / "weights.fifo")
    os.mkfifo(folder / ("a" * 64 + ".o"))  # a cache entry that is a FIFO
    (folder / "graph.link").symlink_to(graph)
    (folder / "graph.dir").mkdir()
    cases = [("graph fifo", str(folder / "graph.fifo")), ("graph symlink", str(folder / "graph.link")),
             ("graph directory", str(folder / "graph.dir")),
             ("safetensors fifo", str(folder / "weights.fifo")),
             ("cache fifo", str(folder / ("a" * 64 + ".o")))]
    out = run_child(NON_REGULAR, str(folder), json.dumps(cases), timeout=60)
    results = {" ".join(line.split()[1:3]): line for line in out.splitlines() if line.startswith("RESULT")}
    assert "is a FIFO" in results["graph fifo"] and "refused" in results["graph fifo"]
    assert "symbolic link" in results["graph symlink"] and "refused" in results["graph symlink"]
    assert "is a directory" in results["graph directory"]
    assert "refused" in results["safetensors fifo"] and "FIFO" in results["safetensors fifo"]
    assert "miss" in results["cache fifo"] and "FIFO" in results["cache fifo"]


# ---------------------------------------------------------------------------------------------- cache
def _trusted_folder(path: Path) -> Path:
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)
    return path


def test_cache_entry_writable_by_others_is_warned_and_not_used(tmp_path: Path) -> None:
    folder = _trusted_folder(tmp_path / "cache")
    cache = DiskCache(str(folder), ".o")
    cache.put("k1", b"compiled")
    assert cache.get("k1") == b"compiled"
    entry = folder / "k1.o"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    entry.chmod(0o666)
    with pytest.warns(UserWarning, match=r"k1\.o.*writable by group or others"):
        assert cache.get("k1") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per path and reason, not one per lookup
        assert cache.get("k1") is None


def test_cache_entry_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    folder = _trusted_folder(tmp_path / "cache")
    cache = DiskCache(str(folder), ".o")
    cache.put("real", b"compiled")
    (folder / "planted.o").symlink_to(folder / "real.o")
    with pytest.warns(UserWarning, match="symbolic link"):
        assert cache.get("planted") is None


def test_group_writable_cache_folder_is_warned_and_not_used(tmp_path: Path) -> None:
    folder = _trusted_folder(tmp_path / "cache")
    cache = DiskCache(str(folder), ".o")
    cache.put("k1", b"compiled")
    folder.chmod(0o770)
    with pytest.warns(UserWarning, match=r"cache.*writable by group or others \(mode 0770\)"):
        assert cache.get("k1") is None
    cache.put("k2", b"other")  # nothing is written into an untrusted folder either
    assert not (folder / "k2.o").exists()


def test_new_cache_folder_is_private(tmp_path: Path) -> None:
    folder = tmp_path / "fresh" / "llvm"
    DiskCache(str(folder), ".o").put("k", b"x")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert DiskCache(str(folder), ".o").get("k") == b"x"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user (chown) needs root")
def test_cache_entry_or_folder_owned_by_another_user_is_not_used(tmp_path: Path) -> None:
    folder = _trusted_folder(tmp_path / "cache")
    cache = DiskCache(str(folder), ".o")
    cache.put("k1", b"compiled")
    os.chown(folder / "k1.o", 65534, 65534)
    with pytest.warns(UserWarning, match=r"k1\.o.*owned by uid 65534"):
        assert cache.get("k1") is None
    cache.put("k2", b"compiled")
    os.chown(folder, 65534, 65534)
    with pytest.warns(UserWarning, match=r"cache folder is owned by uid 65534"):
        assert cache.get("k2") is None


OP_CHILD = r"""
import sys, warnings
import numpy as np
warnings.simplefilter("always")
from rawgrad import Tensor
x = Tensor(np.arange(4, dtype=np.float32))
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    y = (x + 1 if sys.argv[1] == "add" else x * 5).numpy()
print(repr(y.tolist()))
print(repr([str(w.message) for w in seen]))
"""


def test_planted_cache_entry_cannot_change_what_a_fresh_process_computes(tmp_path: Path) -> None:
    """The reported attack: a valid-hash entry for `x * 5` planted (mode 0666) under the key of `x + 1`."""
    mul_dir, add_dir = _trusted_folder(tmp_path / "mul"), _trusted_folder(tmp_path / "add")
    run_child(OP_CHILD, "mul", env={"RAWGRAD_CACHE_DIR": str(mul_dir)})
    run_child(OP_CHILD, "add", env={"RAWGRAD_CACHE_DIR": str(add_dir)})
    # one entry per cache each kernel fills: the compiler's (by generated code) and the kernel cache's (by
    # AST); the wrong kernel's valid entry is planted in both
    targets = []
    for suffix in (".o", ".kernel"):
        mul_names = {p.name for p in mul_dir.iterdir() if p.suffix == suffix}
        add_names = {p.name for p in add_dir.iterdir() if p.suffix == suffix}
        mul_only, add_only = mul_names - add_names, add_names - mul_names
        assert len(mul_only) == 1 and len(add_only) == 1  # the one kernel each computed
        target = add_dir / add_only.pop()
        target.write_bytes((mul_dir / mul_only.pop()).read_bytes())  # a valid entry, of the wrong kernel
        target.chmod(0o666)  # as another user's process could leave it
        targets.append(target)
    out = run_child(OP_CHILD, "add", env={"RAWGRAD_CACHE_DIR": str(add_dir)}).splitlines()
    assert eval(out[-2]) == [1.0, 2.0, 3.0, 4.0]
    # the kernel cache's entry is asked first; refused, the kernel is built, and the compiler refuses its own
    for target in targets:
        assert any(target.name in w and "writable by group or others" in w for w in eval(out[-1]))


# ---------------------------------------------------------------------------------------------- safetensors
TRUNCATE_CHILD = r"""
import os, sys
import numpy as np
from rawgrad import Tensor
from rawgrad.nn.safetensors import SafetensorsError, SafetensorsFile
from rawgrad.nn.state import safe_load, safe_save
path = sys.argv[1]
N = 1 << 16
want = {"a": np.arange(N, dtype=np.float32), "b": -np.arange(N, dtype=np.float32)}

def fresh():
    safe_save({k: Tensor(v) for k, v in want.items()}, path)

def shrink():
    os.truncate(path, 256)  # header kept, data gone

# 1. truncated while a SafetensorsFile is open
fresh()
with SafetensorsFile(path) as f:
    shrink()
    try:
        print("open:", float(np.asarray(f.raw("b")).sum()), flush=True)
    except SafetensorsError as e:
        print("open: error", e, flush=True)

# 2. truncated in the middle of safe_load (between two tensors)
fresh()
try:
    safe_load(path, progress=lambda done, total: shrink())
    print("during: loaded", flush=True)
except SafetensorsError as e:
    print("during: error", e, flush=True)

# 3. truncated after safe_load returned: the tensors are ours
fresh()
ts = safe_load(path)
shrink()
ok = all(np.array_equal(ts[k].numpy(), v) for k, v in want.items())
print("after:", "correct" if ok else "WRONG", flush=True)
"""


def test_safetensors_truncated_under_us_is_an_error_not_sigbus(tmp_path: Path) -> None:
    out = run_child(TRUNCATE_CHILD, str(tmp_path / "w.safetensors"))
    lines = {line.split(":")[0]: line for line in out.splitlines()}
    assert "error" in lines["open"] and "truncated while open" in lines["open"], out
    assert "error" in lines["during"] and "truncated while open" in lines["during"], out
    assert lines["after"] == "after: correct", out


def test_safetensors_header_lies_are_refused_at_open(tmp_path: Path) -> None:
    def write(header: dict[str, Any], data: bytes = b"") -> Path:
        text = json.dumps(header).encode()
        p = tmp_path / "bad.safetensors"
        p.write_bytes(len(text).to_bytes(8, "little") + text + data)
        return p
    # a shape whose element count wraps around in int64 arithmetic to match 0 bytes
    p = write({"t": {"dtype": "F32", "shape": [1 << 62, 4], "data_offsets": [0, 0]}})
    with pytest.raises(SafetensorsError, match="bytes of data for shape"):
        SafetensorsFile(p)
    p = write({"t": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}}, bytes(8))
    with pytest.raises(SafetensorsError, match="shape must be a list"):
        SafetensorsFile(p)
    p = write({"t": {"dtype": "F32", "shape": [1] * 65, "data_offsets": [0, 4]}}, bytes(4))
    with pytest.raises(SafetensorsError, match="at most 64"):
        SafetensorsFile(p)
