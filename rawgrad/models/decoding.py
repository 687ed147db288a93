"""What the decoder-only language models (GPT-2, LLaMA) share: the KV cache, attention with grouped
key/value heads, row selection by position, sampling, the generation loop, and saved decode graphs.

How a generation runs:

- the prompt (prefill) runs eagerly with static shapes: the model sees T tokens at positions 0..T-1,
  writes their keys/values into the cache and returns the logits of the last position;
- every later token runs the *decode step* under TinyJit: B tokens at position `start_pos`, where
  `start_pos` is the bound Variable `Variable("start_pos", 0, max_context - 1)`. Everything that depends
  on the position is a symbolic length (attention reads cache[:, :start_pos + 1]) or a view with a
  symbolic offset (the position-table row table[start_pos], the cache row written), which the kernels
  take as an argument, so one capture serves every position: no recapture and no compile after the
  first two steps.

The cache is written by an `assign` into the view kv[:, :, start_pos:start_pos + T]: one kernel per
layer that stores only the new rows (the rest of the cache is not touched), scheduled ahead of the
attention that reads them, in the realize of the step's logits.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rawgrad import progress
from rawgrad.compiler.ir import UOp, Variable
from rawgrad.errors import ArgumentError
from rawgrad.jit import TinyJit
from rawgrad.tensor.tensor import Tensor

__all__ = ["KVCache", "DecoderLM", "SavedDecoder", "GenerationTiming", "attention",
           "select_rows", "sample_token", "normalize_prompts", "run_generation", "start_pos_variable",
           "checkpoint_files", "load_safetensors", "load_decoder", "checked_weights", "CheckpointNotFound"]

START_POS_NAME = "start_pos"
SAVED_FORMAT = 1
GRAPH_FILE = "decode.rgraph"
META_FILE = "decoder.json"

OnToken = Callable[[int, int], None]  # (row in the batch, token id)


# ---------------------------------------------------------------------------------------------- positions
def start_pos_variable(max_context: int) -> UOp:
    """The Variable every decode step is captured with (same name and range: the same hash-consed UOp,
    so a capture made in one process is served by the Variable made in another)."""
    return Variable(START_POS_NAME, 0, max_context - 1)


def checked_weights(arch: str, hf: dict[str, Any], shapes: dict[str, tuple[int, ...]], config: Any,
                    device: str | None) -> dict[str, Tensor]:
    """Hugging Face-layout weights (arrays or Tensors, any float dtype) as float32 Tensors on `device`,
    after checking the key set and every shape against what `config` needs."""
    unknown = sorted(k for k in hf if k not in shapes)
    missing = sorted(k for k in shapes if k not in hf)
    if unknown or missing:
        raise KeyError(f"{arch} weights: missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                       f"unexpected {unknown[:8]}{'...' if len(unknown) > 8 else ''}")
    out: dict[str, Tensor] = {}
    for name, value in hf.items():
        t = value if isinstance(value, Tensor) else Tensor(np.asarray(value), device=device)
        if device is not None:
            t = t.to(device)
        if tuple(t.shape) != shapes[name]:
            raise ValueError(f"{arch} weight {name} has shape {tuple(t.shape)}, config {config} needs "
                             f"{shapes[name]}")
        out[name] = t.float()
    return out


def select_rows(table: Tensor, start_pos: int | UOp, n: int) -> Tensor:
    """table[start_pos : start_pos + n] for a (rows, ...) table: a view, whose offset is symbolic for a
    Variable (n == 1), so the kernels load just that row whatever the position."""
    if not isinstance(start_pos, int) and n != 1:
        raise ValueError(f"a symbolic start position serves one token per step, got {n}")
    return table[start_pos:start_pos + n]


# ---------------------------------------------------------------------------------------------- KV cache
class KVCache:
    """Preallocated keys and values, zeroed: per layer one (2, batch, max_context, n_kv_heads, head_dim)
    buffer holding keys at [0] and values at [1], so one kernel writes both for a step."""

    def __init__(self, n_layers: int, batch: int, max_context: int, n_kv_heads: int, head_dim: int,
                 device: str | None = None):
        self.batch, self.max_context = batch, max_context
        shape = (2, batch, max_context, n_kv_heads, head_dim)
        self.kv = [Tensor.zeros(*shape, device=device).contiguous().realize() for _ in range(n_layers)]

    def update(self, layer: int, k: Tensor, v: Tensor, start_pos: int | UOp) -> tuple[Tensor, Tensor]:
        """Write k, v (batch, T, n_kv_heads, head_dim) at positions start_pos.. and return the cached
        keys and values of positions 0 .. start_pos + T - 1 (a symbolic length for a Variable).

        The write is an assign into the view kv[:, :, start_pos:start_pos + T]: one kernel storing just
        the new rows. It stays pending until a realize reads the cache (the step's logits, through the
        returned keys and values), which schedules it ahead of that graph: the work it shares with the
        graph (the q/k/v projection) is done once, and attention reads the cache after the write."""
        t = k.shape[1]
        kv = self.kv[layer]
        if k.shape[0] != self.batch or k.shape[2:] != kv.shape[3:] or v.shape != k.shape:
            raise ValueError(f"KV cache of shape {kv.shape} cannot take keys of shape {k.shape} and values "
                             f"of shape {v.shape}")
        if isinstance(start_pos, int):
            if start_pos + t > self.max_context:
                raise ValueError(f"positions {start_pos}..{start_pos + t - 1} exceed the context of "
                                 f"{self.max_context}")
        elif t != 1:
            raise ValueError(f"a symbolic start position serves one token per step, got {t}")
        end = start_pos + t
        kv[:, :, start_pos:end].assign(k.stack(v))
        return kv[0, :, :end], kv[1, :, :end]


def attention(q: Tensor, keys: Tensor, values: Tensor, start_pos: int | UOp) -> Tensor:
    """Causal attention of q (B, T, H, D) at positions start_pos.. over keys/values (B, L, Hkv, D) of
    positions 0..L-1; H is a multiple of Hkv (grouped-query attention: each group of H // Hkv query heads
    reads one key/value head, broadcast rather than copied). Returns (B, T, H * D)."""
    b, t, h, d = q.shape
    hkv = keys.shape[2]
    if h % hkv:
        raise ValueError(f"{h} query heads do not split into groups over {hkv} key/value heads")
    g = h // hkv
    qg = q.reshape(b, t, hkv, g, d).permute(0, 2, 3, 1, 4)  # (B, Hkv, G, T, D)
    k = keys.permute(0, 2, 1, 3).unsqueeze(2)  # (B, Hkv, 1, L, D)
    v = values.permute(0, 2, 1, 3).unsqueeze(2)
    scores = (qg @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))  # (B, Hkv, G, T, L)
    if t > 1:
        if not isinstance(start_pos, int):
            raise ValueError("several tokens per step need an int start position")
        length = keys.shape[1]
        # query i sits at position start_pos + i and sees keys 0..start_pos + i
        allowed = Tensor.arange(length, device=q.device).reshape(1, length) <= \
            (Tensor.arange(t, device=q.device) + start_pos).reshape(t, 1)
        scores = allowed.where(scores, -math.inf)
    out = scores.softmax(-1) @ v  # (B, Hkv, G, T, D)
    return out.permute(0, 3, 1, 2, 4).reshape(b, t, h * d)


# ---------------------------------------------------------------------------------------------- sampling
def sample_token(logits: np.ndarray, temperature: float, top_k: int | None, rng: np.random.Generator) -> int:
    """Greedy (argmax) when temperature == 0, else a draw from softmax(logits / temperature) restricted
    to the top_k largest logits (all of them when top_k is None)."""
    if temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k is not None and top_k < z.shape[0]:
        # everything below the k-th largest logit is out; ties at the threshold stay in
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z >= kth, z, -np.inf)
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    return int(rng.choice(z.shape[0], p=p))


def normalize_prompts(prompt_tokens: Sequence[int] | Sequence[Sequence[int]], vocab_size: int) \
        -> list[list[int]]:
    """One prompt (list of ints) or a batch (list of lists) as a batch; checks the token ids."""
    if isinstance(prompt_tokens, (str, bytes)) or not isinstance(prompt_tokens, Sequence):
        raise TypeError(f"prompt_tokens must be a list of token ids or a list of such lists, got "
                        f"{type(prompt_tokens).__name__}")
    if len(prompt_tokens) == 0:
        raise ValueError("prompt_tokens is empty")
    items: list[Any] = list(prompt_tokens)
    if all(isinstance(t, (int, np.integer)) for t in items):
        items = [items]
    batch: list[list[Any]] = []
    for i, p in enumerate(items):
        if isinstance(p, (str, bytes)) or not isinstance(p, Sequence):
            raise TypeError(f"prompt {i}: expected a list of token ids, got {type(p).__name__}")
        batch.append(list(p))
    for i, p in enumerate(batch):
        if not p:
            raise ValueError(f"prompt {i} is empty: a prompt needs at least one token")
        for t in p:
            if not isinstance(t, (int, np.integer)) or isinstance(t, bool):
                raise TypeError(f"prompt {i}: token ids must be ints, got {t!r}")
            if not 0 <= t < vocab_size:
                raise ValueError(f"prompt {i}: token id {t} is outside the vocabulary [0, {vocab_size})")
    return [[int(t) for t in p] for p in batch]


@dataclass
class GenerationTiming:
    """Where the time of one `generate` call went (seconds)."""

    batch: int
    prompt_tokens: int  # the longest prompt
    prefill_s: float  # the prompt pass, up to the logits it hands the first step
    per_token_s: list[float] = field(default_factory=list)  # every decode step (device + readback + sampling)

    @property
    def median_token_s(self) -> float:
        return float(np.median(self.per_token_s)) if self.per_token_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second over the decode steps, all rows of the batch counted."""
        total = sum(self.per_token_s)
        return self.batch * len(self.per_token_s) / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "median_token_s": self.median_token_s, "tokens_per_s": self.tokens_per_s}


# A prefill: (tokens (B, P) as int32 numpy) -> logits (B, vocab) of the last position, as numpy.
Prefill = Callable[[np.ndarray], np.ndarray]
# A decode step: (tokens (B, 1) as int32 numpy, position) -> logits (B, vocab), as numpy.
Step = Callable[[np.ndarray, int], np.ndarray]


def run_generation(prompts: list[list[int]], max_new_tokens: int, max_context: int, step: Step,
                   prefill: Prefill | None, temperature: float, top_k: int | None, seed: int | None,
                   on_token: OnToken | None, vocab_size: int) -> tuple[list[list[int]], GenerationTiming]:
    """The generation loop shared by models and loaded decoders.

    Prompts of different lengths share the batch: positions below the shortest prompt go through
    `prefill` (or, without one, through `step` one position at a time); after that each row is fed its
    own prompt token while it has one and its own generated token afterwards, so no padding or masks are
    needed and every row sees exactly what it would see alone."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and not (isinstance(top_k, int) and top_k >= 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    b = len(prompts)
    longest, shortest = max(map(len, prompts)), min(map(len, prompts))
    needed = longest + max_new_tokens - 1  # the last generated token is never fed back
    if needed > max_context:
        raise ArgumentError(f"a prompt of {longest} tokens plus {max_new_tokens} new tokens needs {needed} "
                            f"positions, but the context holds {max_context}: ask for at most "
                            f"{max_context - longest + 1} new tokens")
    timing = GenerationTiming(b, longest, 0.0)
    out: list[list[int]] = [[] for _ in range(b)]
    if max_new_tokens == 0:
        return out, timing
    rng = np.random.default_rng(seed)

    def consume(pos: int, logits: np.ndarray) -> None:
        """logits (B, vocab) computed at position pos predict position pos + 1."""
        if logits.shape != (b, vocab_size):
            raise RuntimeError(f"the model returned logits of shape {logits.shape}, expected "
                               f"{(b, vocab_size)}")
        for r in range(b):
            if pos >= len(prompts[r]) - 1 and len(out[r]) < max_new_tokens:
                tok = sample_token(logits[r], temperature, top_k, rng)
                out[r].append(tok)
                if on_token is not None:
                    on_token(r, tok)

    def token_at(r: int, pos: int) -> int:
        p = prompts[r]
        if pos < len(p):
            return p[pos]
        gen = out[r]
        return gen[pos - len(p)] if pos - len(p) < len(gen) else gen[-1]  # a finished row idles

    t0 = time.perf_counter()
    pos = 0
    if prefill is not None:
        logits = prefill(np.array([p[:shortest] for p in prompts], dtype=np.int32))
        pos = shortest
        consume(pos - 1, logits)
    timing.prefill_s = time.perf_counter() - t0
    while any(len(o) < max_new_tokens for o in out):
        t1 = time.perf_counter()
        tokens = np.array([[token_at(r, pos)] for r in range(b)], dtype=np.int32)
        logits = step(tokens, pos)
        consume(pos, logits)
        pos += 1
        dt = time.perf_counter() - t1
        # steps still inside a longer prompt are prefill work, not generated tokens
        if pos - 1 < longest - 1:
            timing.prefill_s += dt
        else:
            timing.per_token_s.append(dt)
    return out, timing


# ---------------------------------------------------------------------------------------------- models
class DecoderLM:
    """Base of the decoder models: subclasses build `self.config` (with vocab_size, max_context,
    n_layers, n_kv_heads, head_dim), their weights, and implement `forward`."""

    config: Any
    arch: str = "decoder"

    def _init_decoding(self) -> None:
        self._caches: dict[int, KVCache] = {}
        self._start_var = start_pos_variable(self.config.max_context)
        self._decode = TinyJit(self._decode_step, on_mismatch="recapture", reuse_outputs=True)
        self.last_timing: GenerationTiming | None = None

    # subclasses: logits (B, T, vocab) of tokens (B, T) at positions start_pos.., using `cache`
    def forward(self, tokens: Tensor, start_pos: int | UOp, cache: KVCache,
                last_only: bool = False) -> Tensor:
        raise NotImplementedError

    @property
    def device(self) -> str:
        raise NotImplementedError

    def cache(self, batch: int) -> KVCache:
        """The KV cache for a batch size (made on first use and kept; a decode capture uses it in place)."""
        c = self._caches.get(batch)
        if c is None:
            cfg = self.config
            c = self._caches[batch] = KVCache(cfg.n_layers, batch, cfg.max_context, cfg.n_kv_heads,
                                              cfg.head_dim, self.device)
        return c

    def _check_tokens(self, tokens: np.ndarray) -> np.ndarray:
        arr = np.asarray(tokens)
        if arr.ndim != 2 or arr.dtype.kind not in "iu":
            raise ValueError(f"tokens must be a 2-d integer array (batch, seq), got {arr.dtype} {arr.shape}")
        if arr.size and (arr.min() < 0 or arr.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        return arr.astype(np.int32)

    def logits(self, tokens: Sequence[Sequence[int]] | np.ndarray, start_pos: int = 0,
               last_only: bool = False) -> np.ndarray:
        """Eager forward pass of tokens (B, T) at positions start_pos..; writes the batch's KV cache.
        Returns (B, T, vocab) logits, or (B, vocab) of the last position."""
        arr = self._check_tokens(np.asarray(tokens))
        if start_pos < 0 or start_pos + arr.shape[1] > self.config.max_context:
            raise ValueError(f"positions {start_pos}..{start_pos + arr.shape[1] - 1} are outside the context "
                             f"of {self.config.max_context}")
        out = self.forward(Tensor(arr, device=self.device), start_pos, self.cache(arr.shape[0]), last_only)
        return out.numpy()

    def _decode_step(self, tokens: Tensor, start_pos: UOp) -> Tensor:
        """The jitted step: (B, 1) tokens at a bound start_pos -> (B, vocab) logits."""
        return self.forward(tokens, start_pos, self.cache(tokens.shape[0]), last_only=True)

    def decode_step(self, tokens: np.ndarray, pos: int) -> np.ndarray:
        """One token per row at position `pos` through the captured decode graph; (B, vocab) logits."""
        arr = self._check_tokens(tokens)
        if arr.shape[1] != 1:
            raise ValueError(f"decode_step takes one token per row, got shape {arr.shape}")
        if not 0 <= pos < self.config.max_context:
            raise ValueError(f"position {pos} is outside the context of {self.config.max_context}")
        out = self._decode(Tensor(arr, device=self.device), self._start_var.bind(pos))
        return out.numpy()

    @property
    def decode_jit(self) -> TinyJit[Any]:
        """The TinyJit of the decode step (its `captures` and `calls` show recaptures)."""
        return self._decode

    def generate(self, prompt_tokens: Sequence[int] | Sequence[Sequence[int]], max_new_tokens: int,
                 temperature: float = 0.0, top_k: int | None = None, seed: int | None = None,
                 on_token: OnToken | None = None, prefill: str = "batch") -> list[list[int]]:
        """Continue each prompt by max_new_tokens tokens; greedy when temperature == 0, else sampled
        (temperature, top_k) from a numpy generator seeded with `seed`. `on_token(row, token)` sees each
        token as it is chosen. prefill="batch" runs the shortest prompt length as one eager pass,
        "step" feeds it through the decode graph one position at a time (what a loaded decoder does).
        Timing lands in `self.last_timing`."""
        if prefill not in ("batch", "step"):
            raise ValueError(f"prefill must be 'batch' or 'step', got {prefill!r}")
        prompts = normalize_prompts(prompt_tokens, self.config.vocab_size)

        def batch_prefill(arr: np.ndarray) -> np.ndarray:
            return self.logits(arr, 0, last_only=True)

        out, self.last_timing = run_generation(
            prompts, max_new_tokens, self.config.max_context, self.decode_step,
            batch_prefill if prefill == "batch" else None, temperature, top_k, seed, on_token,
            self.config.vocab_size)
        return out

    # ------------------------------------------------------------------ saved decode graphs
    @classmethod
    def load_decoder(cls, path: str, *, allow_untrusted: bool = False) -> SavedDecoder:
        """A decode graph of this architecture saved by `save_decoder`, ready to generate in this
        (possibly fresh) process."""
        return SavedDecoder(path, allow_untrusted=allow_untrusted, expect_arch=cls.arch)

    def save_decoder(self, path: str, batch: int = 1) -> None:
        """Write the captured decode step for `batch` rows (kernels, weights, KV cache buffers) into the
        directory `path`; `load_decoder(path)` generates from it in a fresh process without compiling."""
        key_shape = (batch, 1)
        graph = os.path.join(path, GRAPH_FILE)
        # capturing compiles, and the graph file holds the weights (hundreds of MiB for GPT-2): show both
        with progress.Phase(f"saving the decode graph to {path}", unit="B", poll=lambda: _file_size(graph)):
            if not any(_captured_batch(k) == key_shape for k in self._decode.captures):
                # two steps: the first runs eagerly, the second captures (position 0: harmless, the next
                # generation overwrites it)
                for _ in range(2):
                    self.decode_step(np.zeros(key_shape, np.int32), 0)
            # make that capture the most recent one, which is what TinyJit.save writes
            self.decode_step(np.zeros(key_shape, np.int32), 0)
            os.makedirs(path, exist_ok=True)
            self._decode.save(graph)
        meta = {"format": SAVED_FORMAT, "arch": self.arch, "batch": batch,
                "config": asdict(self.config)}
        with open(os.path.join(path, META_FILE), "w") as f:
            json.dump(meta, f, indent=1)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _captured_batch(key: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The token shape a decode capture was made for (from its guard key)."""
    _, guards, _ = key
    return tuple(guards[0].shape) if guards else None


class SavedDecoder:
    """A decode step loaded from `DecoderLM.save_decoder`: generates without the model's Python code,
    without tracing and without compiling (the prompt goes through the decode graph one token at a
    time)."""

    def __init__(self, path: str, *, allow_untrusted: bool = False, expect_arch: str | None = None):
        meta_path = os.path.join(path, META_FILE)
        if not os.path.isfile(meta_path):
            raise FileNotFoundError(f"{path}: no {META_FILE}; not a directory written by save_decoder")
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("format") != SAVED_FORMAT:
            raise ValueError(f"{path}: saved decoder format {meta.get('format')!r}, this rawgrad reads "
                             f"{SAVED_FORMAT}")
        if expect_arch is not None and meta.get("arch") != expect_arch:
            raise ValueError(f"{path}: holds a {meta.get('arch')!r} decoder, not {expect_arch!r}")
        self.arch: str = meta["arch"]
        self.batch: int = int(meta["batch"])
        self.config: dict[str, Any] = meta["config"]
        self.vocab_size: int = int(self.config["vocab_size"])
        self.max_context: int = int(self.config["max_context"])
        self._start_var = start_pos_variable(self.max_context)
        graph = os.path.join(path, GRAPH_FILE)
        with progress.Phase(f"loading the decode graph from {path} ({_file_size(graph) / 2**20:.0f} MiB)"):
            self.jit: TinyJit[Any] = TinyJit.load(graph, allow_untrusted=allow_untrusted)
        self.last_timing: GenerationTiming | None = None

    def decode_step(self, tokens: np.ndarray, pos: int) -> np.ndarray:
        arr = np.asarray(tokens)
        if arr.shape != (self.batch, 1):
            raise ValueError(f"this decoder was saved for batch {self.batch}: tokens must have shape "
                             f"{(self.batch, 1)}, got {arr.shape}")
        if not 0 <= pos < self.max_context:
            raise ValueError(f"position {pos} is outside the context of {self.max_context}")
        return self.jit(Tensor(arr.astype(np.int32)), self._start_var.bind(pos)).numpy()  # type: ignore

    def generate(self, prompt_tokens: Sequence[int] | Sequence[Sequence[int]], max_new_tokens: int,
                 temperature: float = 0.0, top_k: int | None = None, seed: int | None = None,
                 on_token: OnToken | None = None) -> list[list[int]]:
        """As `DecoderLM.generate` (the batch must have the saved batch size)."""
        prompts = normalize_prompts(prompt_tokens, self.vocab_size)
        if len(prompts) != self.batch:
            raise ValueError(f"this decoder was saved for batch {self.batch}, got {len(prompts)} prompts")
        out, self.last_timing = run_generation(prompts, max_new_tokens, self.max_context, self.decode_step,
                                               None, temperature, top_k, seed, on_token, self.vocab_size)
        return out


class CheckpointNotFound(FileNotFoundError):
    """A weights path that holds no checkpoint; the message says what a checkpoint path looks like."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: {what} (expected a Hugging Face checkpoint: a .safetensors file, or a "
                         f"directory with model.safetensors or its shards, plus config.json)")
        self.path = path


def checkpoint_files(path: str) -> tuple[list[str], str | None]:
    """The safetensors file(s) of a checkpoint and its config.json (None if absent)."""
    if os.path.isdir(path):
        single = os.path.join(path, "model.safetensors")
        files = [single] if os.path.isfile(single) else \
            sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise CheckpointNotFound(path, "no .safetensors file in the directory")
        cfg = os.path.join(path, "config.json")
        return files, cfg if os.path.isfile(cfg) else None
    if not os.path.isfile(path):
        raise CheckpointNotFound(path, "no such checkpoint file or directory")
    cfg = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    return [path], cfg if os.path.isfile(cfg) else None


def load_safetensors(files: list[str], device: str | None,
                     progress: Callable[[int, int], None] | None = None) -> dict[str, Tensor]:
    """Every tensor of the checkpoint shards; `progress(done, total)` counts bytes over all shards."""
    from rawgrad.nn.state import SafetensorsFile, safe_load  # the reader lives with the state helpers
    sizes = []
    for f in files:
        with SafetensorsFile(f) as sf:
            sizes.append(sum(i.end - i.begin for i in sf.tensors.values()))
    total, before = sum(sizes), 0
    out: dict[str, Tensor] = {}
    for f, size in zip(files, sizes):
        report = None if progress is None else \
            (lambda done, _t, base=before: progress(base + done, total))  # type: ignore[misc]
        part = safe_load(f, device=device, progress=report)
        before += size
        dup = sorted(set(out) & set(part))
        if dup:
            raise ValueError(f"{f}: tensors {dup[:4]} also appear in another shard")
        out.update(part)
    return out


def load_decoder(path: str, *, allow_untrusted: bool = False) -> SavedDecoder:
    """A saved decode graph (any architecture) ready to generate."""
    return SavedDecoder(path, allow_untrusted=allow_untrusted)
