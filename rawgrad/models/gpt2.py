"""GPT-2: learned positions, pre-LayerNorm blocks, GELU (tanh form, Hugging Face `gelu_new`) MLP, and an
LM head tied to the token embedding. Random weights by default, or Hugging Face safetensors through
`GPT2.from_pretrained`. Generation, the KV cache and saved decode graphs are in `decoding.py`.

Weights are kept as (out_features, in_features) matrices (torch's Linear layout: a decode step is a
matrix-vector product that reads each row contiguously); Hugging Face's GPT-2 stores its Conv1D weights
as (in, out), so loading and `hf_state_dict` transpose them.
"""
from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from rawgrad.compiler.ir import UOp
from rawgrad.models.decoding import (
    DecoderLM,
    KVCache,
    attention,
    checked_weights,
    checkpoint_files,
    load_safetensors,
    select_rows,
)
from rawgrad.tensor.tensor import Tensor

__all__ = ["GPT2Config", "GPT2", "bench_decode"]


@dataclass(frozen=True)
class GPT2Config:
    """GPT-2 hyperparameters (Hugging Face names in comments)."""

    vocab_size: int = 50257  # vocab_size
    max_context: int = 1024  # n_positions
    dim: int = 768  # n_embd
    n_layers: int = 12  # n_layer
    n_heads: int = 12  # n_head
    norm_eps: float = 1e-5  # layer_norm_epsilon

    def __post_init__(self) -> None:
        for f in ("vocab_size", "max_context", "dim", "n_layers", "n_heads"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"GPT2Config.{f} must be a positive int, got {v!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"GPT2Config: dim {self.dim} does not split into {self.n_heads} heads")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def n_kv_heads(self) -> int:
        return self.n_heads

    @property
    def hidden_dim(self) -> int:
        return 4 * self.dim

    @staticmethod
    def gpt2_124m() -> GPT2Config:
        return GPT2Config()

    @staticmethod
    def tiny() -> GPT2Config:
        """For tests: small enough to compile and run in a second or two."""
        return GPT2Config(vocab_size=96, max_context=32, dim=32, n_layers=2, n_heads=4)

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> GPT2Config:
        """From a Hugging Face config.json dict."""
        try:
            return GPT2Config(vocab_size=int(cfg["vocab_size"]), max_context=int(cfg["n_positions"]),
                              dim=int(cfg["n_embd"]), n_layers=int(cfg["n_layer"]),
                              n_heads=int(cfg["n_head"]),
                              norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)))
        except KeyError as e:
            raise ValueError(f"GPT-2 config.json lacks {e.args[0]!r}") from None


# HF GPT-2 keys: name -> whether it is a Conv1D weight stored (in, out)
_LAYER_KEYS = {
    "ln_1.weight": False, "ln_1.bias": False, "attn.c_attn.weight": True, "attn.c_attn.bias": False,
    "attn.c_proj.weight": True, "attn.c_proj.bias": False, "ln_2.weight": False, "ln_2.bias": False,
    "mlp.c_fc.weight": True, "mlp.c_fc.bias": False, "mlp.c_proj.weight": True, "mlp.c_proj.bias": False,
}
_TOP_KEYS = ("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias")
# buffers some GPT-2 checkpoints carry that are not weights (the causal mask): skipped on load
_IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")


def _hf_shapes(cfg: GPT2Config) -> dict[str, tuple[int, ...]]:
    d, f = cfg.dim, cfg.hidden_dim
    layer = {"ln_1.weight": (d,), "ln_1.bias": (d,), "attn.c_attn.weight": (d, 3 * d),
             "attn.c_attn.bias": (3 * d,), "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
             "ln_2.weight": (d,), "ln_2.bias": (d,), "mlp.c_fc.weight": (d, f), "mlp.c_fc.bias": (f,),
             "mlp.c_proj.weight": (f, d), "mlp.c_proj.bias": (d,)}
    out: dict[str, tuple[int, ...]] = {"wte.weight": (cfg.vocab_size, d), "wpe.weight": (cfg.max_context, d),
                                       "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(cfg.n_layers):
        out.update({f"h.{i}.{k}": s for k, s in layer.items()})
    return out


class _Block:
    """One pre-LN transformer block; tensors are set by GPT2 (internal (out, in) layout)."""

    def __init__(self, w: dict[str, Tensor]):
        self.ln_1_w, self.ln_1_b = w["ln_1.weight"], w["ln_1.bias"]
        self.c_attn_w, self.c_attn_b = w["attn.c_attn.weight"], w["attn.c_attn.bias"]
        self.attn_proj_w, self.attn_proj_b = w["attn.c_proj.weight"], w["attn.c_proj.bias"]
        self.ln_2_w, self.ln_2_b = w["ln_2.weight"], w["ln_2.bias"]
        self.c_fc_w, self.c_fc_b = w["mlp.c_fc.weight"], w["mlp.c_fc.bias"]
        self.mlp_proj_w, self.mlp_proj_b = w["mlp.c_proj.weight"], w["mlp.c_proj.bias"]

    def __call__(self, x: Tensor, layer: int, cfg: GPT2Config, cache: KVCache,
                 start_pos: int | UOp) -> Tensor:
        b, t, d = x.shape
        h = x.layer_norm(d, self.ln_1_w, self.ln_1_b, cfg.norm_eps)
        qkv = h.linear(self.c_attn_w.T, self.c_attn_b)
        q, k, v = (qkv.shrink((None, None, (i * d, (i + 1) * d))).reshape(b, t, cfg.n_heads, cfg.head_dim)
                   for i in range(3))
        keys, values = cache.update(layer, k, v, start_pos)
        x = x + attention(q, keys, values, start_pos).linear(self.attn_proj_w.T, self.attn_proj_b)
        h = x.layer_norm(d, self.ln_2_w, self.ln_2_b, cfg.norm_eps)
        h = h.linear(self.c_fc_w.T, self.c_fc_b).gelu(approximate="tanh")
        return x + h.linear(self.mlp_proj_w.T, self.mlp_proj_b)


class GPT2(DecoderLM):
    """GPT-2 language model. `GPT2(config, seed=0)` draws random weights (normal, std 0.02; LayerNorm
    scales 1, biases 0); `GPT2.from_pretrained(path)` loads Hugging Face safetensors."""

    arch = "gpt2"

    def __init__(self, config: GPT2Config | None = None, seed: int = 0, device: str | None = None):
        cfg = config if config is not None else GPT2Config.gpt2_124m()
        if not isinstance(cfg, GPT2Config):
            raise TypeError(f"GPT2 takes a GPT2Config, got {type(cfg).__name__}")
        rng = np.random.default_rng(seed)
        hf: dict[str, np.ndarray] = {}
        for name, shape in _hf_shapes(cfg).items():
            if name.endswith("bias"):
                hf[name] = np.zeros(shape, np.float32)
            elif ".ln_" in name or name.startswith("ln_"):
                hf[name] = np.ones(shape, np.float32)
            else:
                hf[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        self._setup(cfg, device, hf)

    def _setup(self, cfg: GPT2Config, device: str | None, hf: dict[str, Any]) -> None:
        """Take HF-layout weights (numpy arrays or Tensors, any float dtype) as this model's tensors."""
        self.config = cfg
        conv = {f"h.{i}.{k}" for i in range(cfg.n_layers) for k, c in _LAYER_KEYS.items() if c}
        loaded = checked_weights("GPT-2", hf, _hf_shapes(cfg), cfg, device)
        tensors = {name: (t.T if name in conv else t).contiguous() for name, t in loaded.items()}
        Tensor.realize(*tensors.values())
        self.wte, self.wpe = tensors["wte.weight"], tensors["wpe.weight"]
        self.ln_f_w, self.ln_f_b = tensors["ln_f.weight"], tensors["ln_f.bias"]
        self.h = [_Block({k: tensors[f"h.{i}.{k}"] for k in _LAYER_KEYS}) for i in range(cfg.n_layers)]
        self._init_decoding()

    @property
    def device(self) -> str:
        return self.wte.device

    def forward(self, tokens: Tensor, start_pos: int | UOp, cache: KVCache,
                last_only: bool = False) -> Tensor:
        cfg = self.config
        _, t = tokens.shape
        x = self.wte[tokens] + select_rows(self.wpe, start_pos, t).reshape(1, t, cfg.dim)
        for i, block in enumerate(self.h):
            x = block(x, i, cfg, cache, start_pos)
        if last_only:
            x = x[:, -1]
        x = x.layer_norm(cfg.dim, self.ln_f_w, self.ln_f_b, cfg.norm_eps)
        return x.linear(self.wte.T)  # tied head

    # ------------------------------------------------------------------ weights in Hugging Face layout
    def hf_state_dict(self) -> dict[str, Tensor]:
        """The weights under Hugging Face GPT2Model keys and layouts (Conv1D weights as (in, out))."""
        out: dict[str, Tensor] = {"wte.weight": self.wte, "wpe.weight": self.wpe,
                                  "ln_f.weight": self.ln_f_w, "ln_f.bias": self.ln_f_b}
        for i, blk in enumerate(self.h):
            mine = {"ln_1.weight": blk.ln_1_w, "ln_1.bias": blk.ln_1_b, "attn.c_attn.weight": blk.c_attn_w,
                    "attn.c_attn.bias": blk.c_attn_b, "attn.c_proj.weight": blk.attn_proj_w,
                    "attn.c_proj.bias": blk.attn_proj_b, "ln_2.weight": blk.ln_2_w, "ln_2.bias": blk.ln_2_b,
                    "mlp.c_fc.weight": blk.c_fc_w, "mlp.c_fc.bias": blk.c_fc_b,
                    "mlp.c_proj.weight": blk.mlp_proj_w, "mlp.c_proj.bias": blk.mlp_proj_b}
            for k, t in mine.items():
                out[f"h.{i}.{k}"] = t.T.contiguous() if _LAYER_KEYS[k] else t
        return out

    @classmethod
    def from_hf_state_dict(cls, state: dict[str, Any], config: GPT2Config | None = None,
                           device: str | None = None) -> GPT2:
        """A model from Hugging Face GPT-2 weights (Tensors or arrays; keys optionally prefixed
        `transformer.`; `lm_head.weight`, if present, must be the tied embedding and is dropped).
        Without a config, sizes come from the weights and heads of 64 dims are assumed."""
        hf: dict[str, Any] = {}
        for k, v in state.items():
            key = k[len("transformer."):] if k.startswith("transformer.") else k
            if _IGNORED.match(key):
                continue
            hf[key] = v
        head = hf.pop("lm_head.weight", None)
        if head is not None:
            # GPT-2's head is the embedding; a checkpoint that carries a different one is not GPT-2
            wte = hf.get("wte.weight")
            same = wte is not None and tuple(head.shape) == tuple(wte.shape) and \
                np.array_equal(_as_numpy(head), _as_numpy(wte))
            if not same:
                raise ValueError("GPT-2 weights: lm_head.weight differs from wte.weight, but GPT-2 ties "
                                 "its LM head to the token embedding")
        if config is None:
            config = _infer_config(hf)
        model = cls.__new__(cls)
        model._setup(config, device, hf)
        return model

    @classmethod
    def from_pretrained(cls, path: str, config: GPT2Config | None = None, device: str | None = None,
                        progress: Callable[[int, int], None] | None = None) -> GPT2:
        """Load a Hugging Face GPT-2 checkpoint: a .safetensors file, or a directory holding
        model.safetensors (or shards *.safetensors) and, unless `config` is given, config.json."""
        files, cfg_file = checkpoint_files(path)
        if config is None and cfg_file is not None:
            with open(cfg_file) as f:
                config = GPT2Config.from_hf(json.load(f))
        return cls.from_hf_state_dict(load_safetensors(files, device, progress), config, device)


def _as_numpy(x: Any) -> np.ndarray:
    return x.numpy() if isinstance(x, Tensor) else np.asarray(x)


def _infer_config(hf: dict[str, Any]) -> GPT2Config:
    try:
        vocab, dim = hf["wte.weight"].shape
        ctx = hf["wpe.weight"].shape[0]
    except KeyError as e:
        raise KeyError(f"GPT-2 weights lack {e.args[0]!r}") from None
    layers = 1 + max((int(m.group(1)) for k in hf if (m := re.match(r"h\.(\d+)\.", k))), default=-1)
    if dim % 64:
        raise ValueError(f"cannot infer the number of heads for dim {dim}: pass a GPT2Config")
    return GPT2Config(vocab_size=int(vocab), max_context=int(ctx), dim=int(dim), n_layers=layers,
                      n_heads=int(dim) // 64)


def bench_decode(n_tokens: int, batch: int = 1, config: GPT2Config | None = None) -> dict[str, Any]:
    """Decode speed with random weights: tokens/s and the median per-token latency of `n_tokens` steps
    replayed from the captured decode graph, after a warm-up that compiles and captures it.
    `config` defaults to GPT2Config.gpt2_124m()."""
    if n_tokens < 1 or batch < 1:
        raise ValueError(f"bench_decode needs n_tokens >= 1 and batch >= 1, got {n_tokens}, {batch}")
    cfg = config if config is not None else GPT2Config.gpt2_124m()
    if n_tokens + 2 > cfg.max_context:
        raise ValueError(f"{n_tokens} tokens do not fit the context of {cfg.max_context}")
    model = GPT2(cfg, seed=0)
    prompts = [[(7 * r + 1) % cfg.vocab_size] for r in range(batch)]
    model.generate(prompts, 4)  # warm-up: eager step, capture, replays
    # the first new token comes from the prompt pass, each further one from one decode step
    model.generate(prompts, n_tokens + 1)
    timing = model.last_timing
    assert timing is not None
    per = timing.per_token_s
    return {"model": "gpt2", "config": {f.name: getattr(cfg, f.name) for f in fields(cfg)},
            "batch": batch, "n_tokens": len(per), "tokens_per_s": timing.tokens_per_s,
            "median_token_s": statistics.median(per), "min_token_s": min(per), "prefill_s": timing.prefill_s,
            "captures": len(model.decode_jit.captures)}
