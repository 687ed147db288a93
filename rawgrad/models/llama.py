"""A LLaMA-style decoder: RMSNorm, rotary position embeddings (Hugging Face "rotate_half" convention:
the first and second halves of each head are the two coordinates of each rotated pair), a SwiGLU MLP,
grouped-query attention (n_kv_heads divides n_heads), and an untied or tied LM head. Random weights by
default, or Hugging Face `LlamaForCausalLM` safetensors through `Llama.from_pretrained`.

Internally q/k/v are one (q + 2 kv, dim) matrix and gate/up one (2 hidden, dim) matrix, so a decode step
runs one matrix-vector kernel for each instead of three and two.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
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

__all__ = ["LlamaConfig", "Llama"]


@dataclass(frozen=True)
class LlamaConfig:
    """LLaMA hyperparameters (Hugging Face names in comments)."""

    vocab_size: int = 32000  # vocab_size
    max_context: int = 2048  # max_position_embeddings
    dim: int = 2048  # hidden_size
    n_layers: int = 22  # num_hidden_layers
    n_heads: int = 32  # num_attention_heads
    n_kv_heads: int = 4  # num_key_value_heads
    hidden_dim: int = 5632  # intermediate_size
    rope_theta: float = 10000.0  # rope_theta
    norm_eps: float = 1e-5  # rms_norm_eps
    tie_embeddings: bool = False  # tie_word_embeddings

    def __post_init__(self) -> None:
        for f in ("vocab_size", "max_context", "dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"LlamaConfig.{f} must be a positive int, got {v!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"LlamaConfig: dim {self.dim} does not split into {self.n_heads} heads")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LlamaConfig: {self.n_heads} heads do not group over {self.n_kv_heads} "
                             f"key/value heads")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: rotary embeddings need an even head dim, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @staticmethod
    def tinyllama_1b() -> LlamaConfig:
        """TinyLlama-1.1B's shapes (22 layers, 32 heads over 4 key/value heads)."""
        return LlamaConfig()

    @staticmethod
    def tiny() -> LlamaConfig:
        """For tests: grouped-query attention (4 heads over 2 key/value heads), untied head."""
        return LlamaConfig(vocab_size=96, max_context=32, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                           hidden_dim=64, rope_theta=10000.0, norm_eps=1e-6)

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> LlamaConfig:
        """From a Hugging Face config.json dict."""
        try:
            heads = int(cfg["num_attention_heads"])
            return LlamaConfig(
                vocab_size=int(cfg["vocab_size"]), max_context=int(cfg["max_position_embeddings"]),
                dim=int(cfg["hidden_size"]), n_layers=int(cfg["num_hidden_layers"]), n_heads=heads,
                n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                hidden_dim=int(cfg["intermediate_size"]), rope_theta=float(cfg.get("rope_theta", 10000.0)),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)))
        except KeyError as e:
            raise ValueError(f"LLaMA config.json lacks {e.args[0]!r}") from None


_LAYER_KEYS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
               "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")
# buffers older checkpoints carry that are recomputed here
_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


def _hf_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    d, hd, f = cfg.dim, cfg.head_dim, cfg.hidden_dim
    layer = {"self_attn.q_proj.weight": (cfg.n_heads * hd, d),
             "self_attn.k_proj.weight": (cfg.n_kv_heads * hd, d),
             "self_attn.v_proj.weight": (cfg.n_kv_heads * hd, d),
             "self_attn.o_proj.weight": (d, cfg.n_heads * hd),
             "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f),
             "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,)}
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, d),
                                       "model.norm.weight": (d,)}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, d)
    for i in range(cfg.n_layers):
        out.update({f"model.layers.{i}.{k}": s for k, s in layer.items()})
    return out


def rope_tables(cfg: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position * inv_freq, (max_context, head_dim / 2), computed in float32 as Hugging
    Face does (inv_freq = 1 / theta^(2i / head_dim))."""
    hd = cfg.head_dim
    exponents = np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)
    inv_freq = (np.float32(1.0) / np.float32(cfg.rope_theta) ** exponents).astype(np.float32)
    angles = np.arange(cfg.max_context, dtype=np.float32)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * (x.square().mean(-1, keepdim=True) + eps).rsqrt() * weight


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, T, H, D) rotated by cos/sin (1, T, 1, D/2): the pair (x[i], x[i + D/2]) turns by each angle."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return (x1 * cos - x2 * sin).cat(x2 * cos + x1 * sin, dim=-1)


class _Layer:
    def __init__(self, w: dict[str, Tensor]):
        self.attn_norm, self.ffn_norm = w["input_layernorm.weight"], w["post_attention_layernorm.weight"]
        self.wqkv, self.wo = w["qkv"], w["self_attn.o_proj.weight"]
        self.w_gate_up, self.w_down = w["gate_up"], w["mlp.down_proj.weight"]

    def __call__(self, x: Tensor, layer: int, cfg: LlamaConfig, cache: KVCache, start_pos: int | UOp,
                 cos: Tensor, sin: Tensor) -> Tensor:
        b, t, _ = x.shape
        hd, nq, nkv = cfg.head_dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
        qkv = _rms_norm(x, self.attn_norm, cfg.norm_eps).linear(self.wqkv.T)
        q = qkv.shrink((None, None, (0, nq))).reshape(b, t, cfg.n_heads, hd)
        k = qkv.shrink((None, None, (nq, nq + nkv))).reshape(b, t, cfg.n_kv_heads, hd)
        v = qkv.shrink((None, None, (nq + nkv, nq + 2 * nkv))).reshape(b, t, cfg.n_kv_heads, hd)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        keys, values = cache.update(layer, k, v, start_pos)
        x = x + attention(q, keys, values, start_pos).linear(self.wo.T)
        gu = _rms_norm(x, self.ffn_norm, cfg.norm_eps).linear(self.w_gate_up.T)
        f = cfg.hidden_dim
        gate, up = gu.shrink((None, None, (0, f))), gu.shrink((None, None, (f, 2 * f)))
        return x + (gate.silu() * up).linear(self.w_down.T)


class Llama(DecoderLM):
    """LLaMA-style language model. `Llama(config, seed=0)` draws random weights (normal, std 0.02; norm
    scales 1); without a config it is `LlamaConfig.tiny()` (random weights at TinyLlama's 1.1B size take
    4.4 GB: ask for `LlamaConfig.tinyllama_1b()` explicitly). `Llama.from_pretrained(path)` loads Hugging
    Face safetensors."""

    arch = "llama"

    def __init__(self, config: LlamaConfig | None = None, seed: int = 0, device: str | None = None):
        cfg = config if config is not None else LlamaConfig.tiny()
        if not isinstance(cfg, LlamaConfig):
            raise TypeError(f"Llama takes a LlamaConfig, got {type(cfg).__name__}")
        rng = np.random.default_rng(seed)
        hf: dict[str, np.ndarray] = {}
        for name, shape in _hf_shapes(cfg).items():
            hf[name] = np.ones(shape, np.float32) if name.endswith("norm.weight") else \
                rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        self._setup(cfg, device, hf)

    def _setup(self, cfg: LlamaConfig, device: str | None, hf: dict[str, Any]) -> None:
        self.config = cfg
        loaded = checked_weights("LLaMA", hf, _hf_shapes(cfg), cfg, device)
        tensors: dict[str, Tensor] = {}
        for i in range(cfg.n_layers):
            p = f"model.layers.{i}."
            w = {k: loaded[p + k].contiguous() for k in _LAYER_KEYS}
            w["qkv"] = loaded[p + "self_attn.q_proj.weight"].cat(loaded[p + "self_attn.k_proj.weight"],
                                                                 loaded[p + "self_attn.v_proj.weight"])
            w["gate_up"] = loaded[p + "mlp.gate_proj.weight"].cat(loaded[p + "mlp.up_proj.weight"])
            for k in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                      "mlp.gate_proj.weight", "mlp.up_proj.weight"):
                del w[k]
            tensors.update({f"{i}.{k}": v for k, v in w.items()})
        tensors["embed"] = loaded["model.embed_tokens.weight"].contiguous()
        tensors["norm"] = loaded["model.norm.weight"].contiguous()
        if not cfg.tie_embeddings:
            tensors["head"] = loaded["lm_head.weight"].contiguous()
        cos, sin = rope_tables(cfg)
        tensors["cos"], tensors["sin"] = Tensor(cos, device=device), Tensor(sin, device=device)
        Tensor.realize(*tensors.values())
        self.embed, self.norm = tensors["embed"], tensors["norm"]
        self.head = tensors.get("head", self.embed)
        self.rope_cos, self.rope_sin = tensors["cos"], tensors["sin"]
        keys = ("input_layernorm.weight", "post_attention_layernorm.weight", "qkv", "self_attn.o_proj.weight",
                "gate_up", "mlp.down_proj.weight")
        self.layers = [_Layer({k: tensors[f"{i}.{k}"] for k in keys}) for i in range(cfg.n_layers)]
        self._init_decoding()

    @property
    def device(self) -> str:
        return self.embed.device

    def forward(self, tokens: Tensor, start_pos: int | UOp, cache: KVCache,
                last_only: bool = False) -> Tensor:
        cfg = self.config
        _, t = tokens.shape
        half = cfg.head_dim // 2
        cos = select_rows(self.rope_cos, start_pos, t).reshape(1, t, 1, half)
        sin = select_rows(self.rope_sin, start_pos, t).reshape(1, t, 1, half)
        x = self.embed[tokens]
        for i, layer in enumerate(self.layers):
            x = layer(x, i, cfg, cache, start_pos, cos, sin)
        if last_only:
            x = x[:, -1]
        return _rms_norm(x, self.norm, cfg.norm_eps).linear(self.head.T)

    # ------------------------------------------------------------------ weights in Hugging Face layout
    def hf_state_dict(self) -> dict[str, Tensor]:
        """The weights under Hugging Face LlamaForCausalLM keys (q/k/v and gate/up split again)."""
        cfg = self.config
        nq, nkv, f = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.hidden_dim
        out: dict[str, Tensor] = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm}
        if not cfg.tie_embeddings:
            out["lm_head.weight"] = self.head
        for i, ly in enumerate(self.layers):
            p = f"model.layers.{i}."
            out.update({p + "self_attn.q_proj.weight": ly.wqkv[:nq].contiguous(),
                        p + "self_attn.k_proj.weight": ly.wqkv[nq:nq + nkv].contiguous(),
                        p + "self_attn.v_proj.weight": ly.wqkv[nq + nkv:].contiguous(),
                        p + "self_attn.o_proj.weight": ly.wo,
                        p + "mlp.gate_proj.weight": ly.w_gate_up[:f].contiguous(),
                        p + "mlp.up_proj.weight": ly.w_gate_up[f:].contiguous(),
                        p + "mlp.down_proj.weight": ly.w_down,
                        p + "input_layernorm.weight": ly.attn_norm,
                        p + "post_attention_layernorm.weight": ly.ffn_norm})
        return out

    @classmethod
    def from_hf_state_dict(cls, state: dict[str, Any], config: LlamaConfig,
                           device: str | None = None) -> Llama:
        """A model from Hugging Face LLaMA weights (Tensors or arrays). With a tied config a present
        `lm_head.weight` is ignored (it is the embedding)."""
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"a LlamaConfig is needed to load LLaMA weights, got {type(config).__name__}")
        hf = {k: v for k, v in state.items() if not _IGNORED.match(k) and
              not (config.tie_embeddings and k == "lm_head.weight")}
        model = cls.__new__(cls)
        model._setup(config, device, hf)
        return model

    @classmethod
    def from_pretrained(cls, path: str, config: LlamaConfig | None = None, device: str | None = None,
                        progress: Callable[[int, int], None] | None = None) -> Llama:
        """Load a Hugging Face LLaMA checkpoint: a .safetensors file or a directory (model.safetensors or
        shards), with config.json beside it unless `config` is given."""
        files, cfg_file = checkpoint_files(path)
        if config is None:
            if cfg_file is None:
                raise ValueError(f"{path}: no config.json beside the weights; pass a LlamaConfig")
            with open(cfg_file) as f:
                raw = json.load(f)
            if raw.get("rope_scaling"):
                raise ValueError(f"{cfg_file}: rope_scaling {raw['rope_scaling']!r} is not supported")
            config = LlamaConfig.from_hf(raw)
        return cls.from_hf_state_dict(load_safetensors(files, device, progress), config, device)
