"""Fuzzing saved graphs: every damaged file is a clear GraphFileError (or a correct replay), never a crash
or a hang.

Mutations of one saved graph (an external weight, two arena intermediates, a bound Variable, a constant
argument, two outputs):
- truncation at many points (every header boundary and seeded random points),
- single-byte flips at seeded random positions,
- every manifest field (every node of the JSON, containers included) edited to a negative, huge or
  wrongly typed value, with the manifest re-encoded and the sha256 recomputed so the edit passes the
  integrity check and reaches the validator,
- the device label rewritten, and the format version set to an older one.

All cases are loaded and (when the load succeeds) replayed in ONE child process, which prints a line
before and after each case: a child killed by a signal or timing out fails the test naming the case it
was in. A case passes if the load raises GraphFileError, a call raises JitError (a guard refused it), or
the replay matches numpy. RAWGRAD_FUZZ_CASES=N raises the number of field edits (default: each field once;
N above the number of fields adds more values per field, in a seeded order).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
W = np.linspace(-1, 1, 8, dtype=np.float32)
HEADER = struct.Struct("<8sII32sQ")  # magic, version, reserved, sha256 of the body, body length
SEED = 20240611
# negative, huge and wrongly typed values for a manifest field
EDIT_VALUES: list[Any] = [-1, -(2**63), 2**64, 10**30, "x", None, 1.5, True, [], {}, [-1, -1], "NV"]

BUILD = r"""
import sys, numpy as np
from rawgrad import Tensor, Variable
from rawgrad.jit import TinyJit
W = np.linspace(-1, 1, 8, dtype=np.float32)
_w = []
def fn(x, n, scale=2.0):
    if not _w:
        _w.append(Tensor(W))  # made before the capture: an external buffer
    w = _w[0]
    y = (x * w + 1).relu().realize()  # intermediates: placed in the arena
    z = (y * 3 - w).realize()
    return z * scale, (y + w).shrink(((0, n),)) - 1
f = TinyJit(fn)
for n in (3, 4):
    f(Tensor(np.arange(8, dtype=np.float32)), Variable("n", 1, 8).bind(n), scale=2.0)
f.save(sys.argv[1])
"""

CHILD = r"""
import json, sys, traceback
import numpy as np
from rawgrad import Tensor, Variable
from rawgrad.jit import JitError, TinyJit
from rawgrad.jit.storage import GraphFileError
from rawgrad.tensor.buffers import buffer_numpy
W = np.linspace(-1, 1, 8, dtype=np.float32)

def expected(x, n, scale):
    y = np.maximum(x * W + 1, 0)
    return (y * 3 - W) * scale, (y + W)[:n] - 1

def result(name, kind, detail=""):
    print("RESULT", json.dumps([name, kind, detail[:400]]), flush=True)

for name, path in json.load(open(sys.argv[1])):
    print("START", json.dumps(name), flush=True)
    try:
        g = TinyJit.load(path)
    except GraphFileError as e:
        result(name, "refused", str(e))
        continue
    except BaseException as e:
        result(name, "bad", "load: " + "".join(traceback.format_exception(e))[-1500:])
        continue
    try:
        ok = True
        for n, k in ((3, 1.0), (8, -2.5)):
            x = (np.arange(8, dtype=np.float32) - 3) * k
            a, b = g(Tensor(x), Variable("n", 1, 8).bind(n), scale=2.0)
            ea, eb = expected(x, n, 2.0)
            ok &= np.allclose(a.numpy(), ea, rtol=1e-6, atol=1e-6)
            ok &= np.allclose(buffer_numpy(b.uop.base)[:n], eb, rtol=1e-6, atol=1e-6)
        result(name, "ok" if ok else "wrong")
    except GraphFileError as e:
        result(name, "bad", "GraphFileError only after load: " + str(e))
    except JitError as e:
        result(name, "refused at call", str(e))
    except BaseException as e:
        result(name, "bad", "replay: " + "".join(traceback.format_exception(e))[-1500:])
"""


def child_env(tmp: Path) -> dict[str, str]:
    # on the CPU whatever DEV the suite runs with: the CPU's command records are what a bad file could turn
    # into a crash, and the mock GPU would make hundreds of loads slow
    return {**os.environ, "PYTHONPATH": str(ROOT), "RAWGRAD_CACHE_DIR": str(tmp / "cache"),
            "PYTHONFAULTHANDLER": "1", "DEV": "CPU"}


def build_graph(tmp: Path) -> bytes:
    path = tmp / "fuzz.rgjit"
    res = subprocess.run([sys.executable, "-c", BUILD, str(path)], capture_output=True, text=True,
                         env=child_env(tmp), cwd=ROOT, timeout=180)
    assert res.returncode == 0, res.stderr
    return path.read_bytes()


def split(data: bytes) -> tuple[tuple[Any, ...], Any, bytes]:
    """(header fields, manifest, blob section) of a saved graph."""
    fields = HEADER.unpack_from(data)
    body = data[HEADER.size:]
    (mlen,) = struct.unpack_from("<Q", body)
    return fields, json.loads(body[8:8 + mlen]), body[8 + mlen:]


def pack(fields: tuple[Any, ...], manifest: Any, blobs: bytes, version: int | None = None) -> bytes:
    """Re-encode with a correct sha256 and length, so the file reaches the manifest validator."""
    text = json.dumps(manifest, separators=(",", ":")).encode()
    body = struct.pack("<Q", len(text)) + text + blobs
    magic, old_version = fields[0], fields[1]
    header = HEADER.pack(magic, old_version if version is None else version, 0,
                         hashlib.sha256(body).digest(), len(body))
    return header + body


def node_paths(x: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every node of a JSON value (containers and leaves), as key/index paths."""
    out = [path] if path else []
    if isinstance(x, dict):
        for k, v in x.items():
            out += node_paths(v, (*path, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out += node_paths(v, (*path, i))
    return out


def edited(manifest: Any, path: tuple[Any, ...], value: Any) -> Any:
    m = json.loads(json.dumps(manifest))
    node = m
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return m


def field_edits(manifest: Any, budget: int | None) -> list[tuple[str, Any]]:
    """(name, edited manifest): each field once (values taken in turn), then more values per field."""
    rng = random.Random(SEED)
    paths = node_paths(manifest)
    first = [(p, EDIT_VALUES[(i * 7) % len(EDIT_VALUES)]) for i, p in enumerate(paths)]
    rest = [(p, v) for p in paths for v in EDIT_VALUES if (p, v) not in first]
    rng.shuffle(rest)
    chosen = first if budget is None else (first + rest)[:budget]
    return [(f"edit {'/'.join(map(str, p))} = {v!r}", edited(manifest, p, v)) for p, v in chosen]


def mutations(data: bytes, budget: int | None) -> list[tuple[str, bytes]]:
    rng = random.Random(SEED)
    fields, manifest, blobs = split(data)
    cases: list[tuple[str, bytes]] = [("unchanged", data)]
    points = {0, 1, 7, 8, 12, 16, 47, 48, 55, 56, 57, 63, 64, len(data) - 1, len(data) - len(blobs),
              len(data) - len(blobs) - 1}
    points |= {rng.randrange(len(data)) for _ in range(40)}
    cases += [(f"truncate at {n}", data[:n]) for n in sorted(points)]
    for k in range(60):
        pos, bit = rng.randrange(len(data)), rng.randrange(8)
        flipped = bytearray(data)
        flipped[pos] ^= 1 << bit
        cases.append((f"flip {k}: bit {bit} of byte {pos}", bytes(flipped)))
    for label in ("CPU:1", "NV", "cpu", "GPU", ""):
        cases.append((f"device label -> {label!r}", pack(fields, edited(manifest, ("devices", 0, "device"),
                                                                          label), blobs)))
    cases.append(("older format version", pack(fields, manifest, blobs, version=2)))
    cases += [(name, pack(fields, m, blobs)) for name, m in field_edits(manifest, budget)]
    return cases


def run_cases(tmp: Path, cases: list[tuple[str, bytes]], timeout: float) -> dict[str, tuple[str, str]]:
    """Load (and replay) every case in one child; fails naming the case a crash or hang happened in."""
    listing = []
    for k, (name, blob) in enumerate(cases):
        p = tmp / f"case{k}.rgjit"
        p.write_bytes(blob)
        p.chmod(0o600)
        listing.append([name, str(p)])
    (tmp / "cases.json").write_text(json.dumps(listing))
    try:
        res = subprocess.run([sys.executable, "-c", CHILD, str(tmp / "cases.json")], capture_output=True,
                             text=True, env=child_env(tmp), cwd=ROOT, timeout=timeout)
        out, err, rc = res.stdout, res.stderr, res.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, rc = f"timed out after {timeout} s", None
    results: dict[str, tuple[str, str]] = {}
    current = None
    for line in out.splitlines():
        if line.startswith("START "):
            current = json.loads(line[6:])
        elif line.startswith("RESULT "):
            name, kind, detail = json.loads(line[7:])
            results[name] = (kind, detail)
            current = None
    if rc != 0 or current is not None:
        how = "timed out" if rc is None else f"died by signal {-rc}" if rc < 0 else f"exited with {rc}"
        pytest.fail(f"the loader child {how} in case {current!r} ({len(results)} of {len(cases)} cases "
                    f"done)\n{err[-3000:]}")
    return results


def test_fuzzed_graphs_are_refused_cleanly_or_replay_correctly(tmp_path: Path) -> None:
    env_cases = os.environ.get("RAWGRAD_FUZZ_CASES")
    budget = int(env_cases) if env_cases else None
    data = build_graph(tmp_path)
    cases = mutations(data, budget)
    results = run_cases(tmp_path, cases, timeout=120 + (budget or 0) * 0.2)
    assert results["unchanged"][0] == "ok", results["unchanged"]  # the harness itself replays correctly
    bad = {name: r for name, r in results.items() if r[0] not in ("refused", "refused at call", "ok")}
    assert not bad, "\n".join(f"{name}: {kind} {detail}" for name, (kind, detail) in list(bad.items())[:20])
    assert len(results) == len(cases)
    refused = [r for r in results.values() if r[0] == "refused"]
    assert len(refused) > len(cases) * 0.8  # almost every mutation is caught at load
    # the refusals say what is wrong
    assert results["older format version"][0] == "refused" and "re-save" in results["older format version"][1]
    for label in ("CPU:1", "NV", "cpu", "GPU", ""):
        assert results[f"device label -> {label!r}"][0] == "refused"
    body_flips = [n for n in results if n.startswith("flip") and int(n.split()[-1]) >= HEADER.size]
    assert body_flips and all("content hash mismatch" in results[n][1] for n in body_flips)
