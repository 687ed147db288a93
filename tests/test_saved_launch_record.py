"""Saved graphs and the 3-D launch contract (jit/storage.py format 4): a CPU launch record carries x, y and z,
a replay runs x*y*z indices, and a file whose launch record has a word where no field is is refused."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rawgrad import Tensor, TinyJit
from rawgrad.drivers.cpu.records import RECORD_WORDS, Op
from rawgrad.jit import storage
from rawgrad.jit.storage import GraphFileError


def _step(x: Tensor) -> Tensor:
    return (x * 3 + 1).relu()


def _save(tmp_path: Path) -> Path:
    f = TinyJit(_step)
    for _ in range(2):
        f(Tensor(np.arange(64, dtype=np.float32), device="CPU"))
    path = tmp_path / "g.rgjit"
    f.save(str(path))
    return path


def _read(path: Path) -> tuple[dict, bytes]:
    body = path.read_bytes()[storage._HEADER.size:]
    (mlen,) = storage._U64.unpack_from(body)
    return json.loads(body[8:8 + mlen]), body[8 + mlen:]


def _exec_records(manifest: dict, blob: bytes) -> tuple[int, np.ndarray, list[int]]:
    """(byte offset of the words blob, the words, word index of each EXEC record)."""
    offset, size = manifest["devices"][0]["words"]
    words = np.frombuffer(blob[offset:offset + size], dtype="<u8").copy()
    execs, r = [], 0
    while r * RECORD_WORDS < words.size:
        base = r * RECORD_WORDS
        if int(words[base]) == Op.EXEC:
            execs.append(base)
            r += 1 + int(words[base + 4])
        else:
            r += 1
    return offset, words, execs


def test_saved_cpu_launch_records_carry_3d_sizes_and_replay(tmp_path: Path) -> None:
    path = _save(tmp_path)
    manifest, blob = _read(path)
    _, words, execs = _exec_records(manifest, blob)
    assert execs, "the graph holds a kernel launch"
    for base in execs:  # x in word 2, y and z in words 5 and 6 (the lowerer launches (n, 1, 1))
        assert (int(words[base + 2]), int(words[base + 5]), int(words[base + 6])) == (64, 1, 1)
    loaded = TinyJit.load(str(path))
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    np.testing.assert_allclose(loaded(Tensor(x, device="CPU")).numpy(), np.maximum(x * 3 + 1, 0), rtol=1e-6)


def test_a_launch_record_with_a_word_in_its_unused_slot_is_refused(tmp_path: Path) -> None:
    path = _save(tmp_path)
    manifest, blob = _read(path)
    offset, words, execs = _exec_records(manifest, blob)
    words[execs[0] + storage.EXEC_UNUSED_WORD] = 5
    tampered = blob[:offset] + words.astype("<u8").tobytes() + blob[offset + words.nbytes:]
    path.write_bytes(storage.pack_graph(manifest, tampered))
    path.chmod(0o600)
    with pytest.raises(GraphFileError, match=f"word {storage.EXEC_UNUSED_WORD} is unused"):
        TinyJit.load(str(path))
