"""Numpy reference forwards of the decoder models (GPT-2, LLaMA-style), independent of rawgrad: they read
Hugging Face-layout weights as numpy arrays and compute the logits of a whole sequence in float64 with
plain numpy (no KV cache, no rawgrad code). A causal model's logits at position i depend only on tokens
0..i, so one full forward over prompt + continuation is the oracle for rawgrad's prefill and for each of
its KV-cached decode steps.

Tolerance for rawgrad's float32 logits against these float64 references: `LOGITS_ATOL` / `LOGITS_RTOL`
(1e-4 each). The test models have dim 32 and logits up to ~8 in magnitude; measured float32 error, prefill
and cached decode steps, CPU and mock NV: at most 5.1e-6 (GPT-2 tiny) and 2.1e-6 (LLaMA tiny), so 1e-4
leaves a ~20x margin, while a wrong weight, position or cache row moves logits by far more.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

LOGITS_ATOL = 1e-4
LOGITS_RTOL = 1e-4


def state_dict_numpy(model: Any) -> dict[str, np.ndarray]:
    """The model's weights under Hugging Face keys, read back from its device as numpy arrays."""
    return {k: v.numpy() for k, v in model.hf_state_dict().items()}


# ---------------------------------------------------------------------------------------------- pieces
def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q, k, v (B, H, T, D) -> (B, T, H * D); query i sees keys 0..i."""
    t, d = q.shape[2], q.shape[3]
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    o = softmax(s) @ v
    return o.transpose(0, 2, 1, 3).reshape(q.shape[0], t, -1)


# ---------------------------------------------------------------------------------------------- models
def gpt2_logits(w: dict[str, np.ndarray], cfg: Any, tokens: np.ndarray) -> np.ndarray:
    """Logits (B, T, vocab) of HF-layout GPT-2 weights (Conv1D weights stored (in, out)), in float64:
    learned positions, pre-LayerNorm blocks, gelu_new MLP, head tied to the token embedding."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    tokens = np.asarray(tokens)
    b, t = tokens.shape
    nh, d = cfg.n_heads, cfg.dim // cfg.n_heads
    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    for i in range(cfg.n_layers):
        p = f"h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], cfg.norm_eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[..., j * cfg.dim:(j + 1) * cfg.dim].reshape(b, t, nh, d).transpose(0, 2, 1, 3)
                   for j in range(3))
        x = x + causal_attention(q, k, v) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], cfg.norm_eps)
        h = h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))  # HF gelu_new
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], cfg.norm_eps)
    return x @ w["wte.weight"].T


def llama_logits(w: dict[str, np.ndarray], cfg: Any, tokens: np.ndarray) -> np.ndarray:
    """Logits (B, T, vocab) of HF-layout LLaMA weights, in float64: RMSNorm, rotate_half RoPE computed
    here in float64, grouped-query attention by repeating key/value heads, SwiGLU MLP."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    tokens = np.asarray(tokens)
    b, t = tokens.shape
    hd = cfg.dim // cfg.n_heads
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(t)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rot(x: np.ndarray) -> np.ndarray:  # (B, H, T, D)
        rotate_half = np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1)
        return x * cos + rotate_half * sin

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * g

    def heads(x: np.ndarray, n: int) -> np.ndarray:
        return x.reshape(b, t, n, hd).transpose(0, 2, 1, 3)

    x = w["model.embed_tokens.weight"][tokens]
    rep = cfg.n_heads // cfg.n_kv_heads
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rot(heads(h @ w[p + "self_attn.q_proj.weight"].T, cfg.n_heads))
        k = rot(heads(h @ w[p + "self_attn.k_proj.weight"].T, cfg.n_kv_heads))
        v = heads(h @ w[p + "self_attn.v_proj.weight"].T, cfg.n_kv_heads)
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # query head j reads kv head j // rep
        x = x + causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if cfg.tie_embeddings else w["lm_head.weight"]
    return rms(x, w["model.norm.weight"]) @ head.T


def greedy(logits_fn: Any, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens after `prompt`; logits_fn(tokens (1, T)) -> (1, T, vocab)."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(logits_fn(np.array([seq]))[0, -1])))
    return seq[len(prompt):]


# ---------------------------------------------------------------------------------------------- weights
def gpt2_weights(cfg: Any, seed: int) -> dict[str, np.ndarray]:
    """Random HF-layout GPT-2 weights, large enough that the logits vary from token to token (the models'
    own init, std 0.02, makes nearly uniform logits whose argmax is decided by rounding)."""
    rng = np.random.default_rng(seed)
    d, f = cfg.dim, 4 * cfg.dim
    w = {"wte.weight": rng.normal(0, 0.5, (cfg.vocab_size, d)),
         "wpe.weight": rng.normal(0, 0.5, (cfg.max_context, d)),
         "ln_f.weight": rng.normal(1, 0.1, d), "ln_f.bias": rng.normal(0, 0.1, d)}
    for i in range(cfg.n_layers):
        p = f"h.{i}."
        w.update({p + "ln_1.weight": rng.normal(1, 0.1, d), p + "ln_1.bias": rng.normal(0, 0.1, d),
                  p + "attn.c_attn.weight": rng.normal(0, 0.3, (d, 3 * d)),
                  p + "attn.c_attn.bias": rng.normal(0, 0.1, 3 * d),
                  p + "attn.c_proj.weight": rng.normal(0, 0.2, (d, d)),
                  p + "attn.c_proj.bias": rng.normal(0, 0.1, d),
                  p + "ln_2.weight": rng.normal(1, 0.1, d), p + "ln_2.bias": rng.normal(0, 0.1, d),
                  p + "mlp.c_fc.weight": rng.normal(0, 0.2, (d, f)),
                  p + "mlp.c_fc.bias": rng.normal(0, 0.1, f),
                  p + "mlp.c_proj.weight": rng.normal(0, 0.1, (f, d)),
                  p + "mlp.c_proj.bias": rng.normal(0, 0.1, d)})
    return {k: v.astype(np.float32) for k, v in w.items()}


def llama_weights(cfg: Any, seed: int) -> dict[str, np.ndarray]:
    """Random HF-layout LLaMA weights (see gpt2_weights)."""
    rng = np.random.default_rng(seed)
    d, hd, f = cfg.dim, cfg.dim // cfg.n_heads, cfg.hidden_dim
    w = {"model.embed_tokens.weight": rng.normal(0, 0.5, (cfg.vocab_size, d)),
         "model.norm.weight": rng.normal(1, 0.1, d)}
    if not cfg.tie_embeddings:
        w["lm_head.weight"] = rng.normal(0, 0.3, (cfg.vocab_size, d))
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        w.update({p + "self_attn.q_proj.weight": rng.normal(0, 0.3, (cfg.n_heads * hd, d)),
                  p + "self_attn.k_proj.weight": rng.normal(0, 0.3, (cfg.n_kv_heads * hd, d)),
                  p + "self_attn.v_proj.weight": rng.normal(0, 0.3, (cfg.n_kv_heads * hd, d)),
                  p + "self_attn.o_proj.weight": rng.normal(0, 0.2, (d, cfg.n_heads * hd)),
                  p + "mlp.gate_proj.weight": rng.normal(0, 0.2, (f, d)),
                  p + "mlp.up_proj.weight": rng.normal(0, 0.2, (f, d)),
                  p + "mlp.down_proj.weight": rng.normal(0, 0.2, (d, f)),
                  p + "input_layernorm.weight": rng.normal(1, 0.1, d),
                  p + "post_attention_layernorm.weight": rng.normal(1, 0.1, d)})
    return {k: v.astype(np.float32) for k, v in w.items()}
