"""GPT-2 and LLaMA-style decoders against numpy references written here (independent of rawgrad): prefill
and KV-cached decode logits, grouped-query attention, greedy and seeded sampling, no recapture while
generating, Hugging Face safetensors round trips, and saved decode graphs replayed in a fresh process."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rawgrad import GlobalCounters, Tensor
from rawgrad.models.decoding import normalize_prompts, sample_token
from rawgrad.models.gpt2 import GPT2, GPT2Config
from rawgrad.models.llama import Llama, LlamaConfig

ROOT = Path(__file__).resolve().parents[2]
ATOL = 1e-4

GPT2_CFG = GPT2Config(vocab_size=64, max_context=24, dim=32, n_layers=2, n_heads=4)
LLAMA_CFG = LlamaConfig(vocab_size=64, max_context=24, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                        hidden_dim=48, rope_theta=500.0, norm_eps=1e-5)


# ---------------------------------------------------------------------------------------------- references
def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q (B, H, T, D), k/v (B, H, T, D) -> (B, T, H * D)."""
    t, d = q.shape[2], q.shape[3]
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    o = _softmax(s) @ v
    return o.transpose(0, 2, 1, 3).reshape(q.shape[0], t, -1)


def gpt2_reference(w: dict[str, np.ndarray], cfg: GPT2Config, tokens: np.ndarray) -> np.ndarray:
    """Logits (B, T, vocab) of HF-layout GPT-2 weights, in float64."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    b, t = tokens.shape
    h_, d = cfg.n_heads, cfg.dim // cfg.n_heads
    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    for i in range(cfg.n_layers):
        p = f"h.{i}."
        h = _layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], cfg.norm_eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (qkv[..., j * cfg.dim:(j + 1) * cfg.dim].reshape(b, t, h_, d).transpose(0, 2, 1, 3)
                   for j in range(3))
        x = x + _causal_attention(q, k, v) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = _layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], cfg.norm_eps)
        h = h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))  # HF gelu_new
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = _layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], cfg.norm_eps)
    return x @ w["wte.weight"].T


def llama_reference(w: dict[str, np.ndarray], cfg: LlamaConfig, tokens: np.ndarray) -> np.ndarray:
    """Logits (B, T, vocab) of HF-layout LLaMA weights, in float64 (rotate_half RoPE, repeat_kv GQA)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
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

    x = w["model.embed_tokens.weight"][tokens]
    rep = cfg.n_heads // cfg.n_kv_heads
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(b, t, cfg.n_heads, hd).transpose(0, 2, 1, 3)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(b, t, cfg.n_kv_heads, hd).transpose(0, 2, 1, 3)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(b, t, cfg.n_kv_heads, hd).transpose(0, 2, 1, 3)
        q, k = rot(q), rot(k)
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)  # query head j reads kv head j // rep
        x = x + _causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if cfg.tie_embeddings else w["lm_head.weight"]
    return rms(x, w["model.norm.weight"]) @ head.T


# ---------------------------------------------------------------------------------------------- weights
def gpt2_weights(cfg: GPT2Config, seed: int) -> dict[str, np.ndarray]:
    """Random HF-layout weights, large enough that the logits vary from token to token."""
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


def llama_weights(cfg: LlamaConfig, seed: int) -> dict[str, np.ndarray]:
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


ARCHS: dict[str, Any] = {
    "gpt2": (GPT2, GPT2_CFG, gpt2_weights, gpt2_reference),
    "llama": (Llama, LLAMA_CFG, llama_weights, llama_reference),
}
_MODELS: dict[str, tuple[Any, dict[str, np.ndarray]]] = {}


def model_and_weights(arch: str) -> tuple[Any, dict[str, np.ndarray]]:
    """One model per architecture for the module (compiles once; tests share its decode capture)."""
    if arch not in _MODELS:
        cls, cfg, make, _ = ARCHS[arch]
        w = make(cfg, seed=3)
        _MODELS[arch] = (cls.from_hf_state_dict(w, cfg), w)
    return _MODELS[arch]


def reference(arch: str, w: dict[str, np.ndarray], tokens: np.ndarray) -> np.ndarray:
    _, cfg, _, ref = ARCHS[arch]
    return ref(w, cfg, np.asarray(tokens))


def greedy_reference(arch: str, w: dict[str, np.ndarray], prompt: list[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(reference(arch, w, np.array([seq]))[0, -1])))
    return seq[len(prompt):]


# ---------------------------------------------------------------------------------------------- logits
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_prefill_and_cached_decode_logits_match_reference(arch: str) -> None:
    model, w = model_and_weights(arch)
    rng = np.random.default_rng(0)
    seq = rng.integers(0, model.config.vocab_size, (2, 9))
    want = reference(arch, w, seq)
    prefill = 5
    got = model.logits(seq[:, :prefill])  # all positions of the prompt, and fills the batch-2 cache
    np.testing.assert_allclose(got, want[:, :prefill], atol=ATOL, rtol=1e-4)
    for pos in range(prefill, seq.shape[1]):  # each step reads the cache the earlier ones wrote
        step = model.decode_step(seq[:, pos:pos + 1], pos)
        np.testing.assert_allclose(step, want[:, pos], atol=ATOL, rtol=1e-4)


def test_llama_groups_query_heads_over_fewer_kv_heads() -> None:
    assert LLAMA_CFG.n_kv_heads < LLAMA_CFG.n_heads
    # one key/value head for all four query heads, tied head, other theta: still the reference
    cfg = LlamaConfig(vocab_size=40, max_context=12, dim=16, n_layers=1, n_heads=4, n_kv_heads=1,
                      hidden_dim=24, rope_theta=10000.0, tie_embeddings=True)
    w = llama_weights(cfg, seed=5)
    model = Llama.from_hf_state_dict(w, cfg)
    seq = np.array([[3, 1, 4, 1, 5, 9, 2]])
    np.testing.assert_allclose(model.logits(seq), llama_reference(w, cfg, seq), atol=ATOL, rtol=1e-4)
    with pytest.raises(ValueError, match="do not group"):
        LlamaConfig(dim=32, n_heads=4, n_kv_heads=3)


# ---------------------------------------------------------------------------------------------- generation
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_greedy_generation_equals_reference_argmax_without_recapture(arch: str) -> None:
    model, w = model_and_weights(arch)
    prompt = [5, 17, 2, 40]
    n = 8
    want = greedy_reference(arch, w, prompt, n)
    assert model.generate(prompt, n) == [want]
    captures, calls = len(model.decode_jit.captures), model.decode_jit.calls
    GlobalCounters.reset()
    seen: list[tuple[int, int]] = []
    assert model.generate(prompt, n, on_token=lambda r, t: seen.append((r, t))) == [want]
    assert seen == [(0, t) for t in want]
    # the second generation only replays: no new capture, no compile, every step through the graph
    assert GlobalCounters.kernels_compiled == 0
    assert len(model.decode_jit.captures) == captures
    assert model.decode_jit.calls == calls + n - 1
    timing = model.last_timing
    assert timing is not None and len(timing.per_token_s) == n - 1 and timing.tokens_per_s > 0
    assert timing.as_dict()["median_token_s"] > 0


def test_batch_of_different_prompt_lengths_matches_each_prompt_alone() -> None:
    model, w = model_and_weights("gpt2")
    prompts = [[1, 2, 3], [9, 8, 7, 6, 5, 4]]
    out = model.generate(prompts, 5)
    assert out == [greedy_reference("gpt2", w, p, 5) for p in prompts]
    # the loaded-decoder path (prompt through the decode graph) gives the same tokens
    assert model.generate(prompts, 5, prefill="step") == out


def test_sampling_is_seeded_and_respects_top_k() -> None:
    model, w = model_and_weights("llama")
    prompt = [7, 3, 11]
    a = model.generate(prompt, 6, temperature=1.0, top_k=3, seed=123)
    b = model.generate(prompt, 6, temperature=1.0, top_k=3, seed=123)
    assert a == b
    draws = {tuple(model.generate(prompt, 6, temperature=2.0, seed=s)[0]) for s in range(4)}
    assert len(draws) > 1  # different seeds, different text
    # every sampled token is among the top 3 logits at its position (reference logits)
    seq = prompt + a[0]
    logits = reference("llama", w, np.array([seq]))[0]
    for i, tok in enumerate(a[0]):
        top3 = np.argsort(logits[len(prompt) - 1 + i])[-3:]
        assert tok in top3
    # top_k=1 is greedy at any temperature
    assert model.generate(prompt, 4, temperature=5.0, top_k=1, seed=9) == model.generate(prompt, 4)


def test_sample_token_unit() -> None:
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 5.0, 4.9, -3.0])
    assert sample_token(logits, 0.0, None, rng) == 1
    picks = {sample_token(logits, 1.0, 2, rng) for _ in range(200)}
    assert picks == {1, 2}


def test_bad_input_raises_clear_errors() -> None:
    model, _ = model_and_weights("gpt2")
    ctx = model.config.max_context
    with pytest.raises(ValueError, match="needs 27 positions, but the context holds 24"):
        model.generate(list(range(20)), 8)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model.generate([1, 64], 2)
    with pytest.raises(ValueError, match="empty"):
        model.generate([[1], []], 2)
    with pytest.raises(TypeError, match="ints"):
        normalize_prompts([[1.5]], 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_k"):
        model.generate([1], 2, temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        model.generate([1], 2, temperature=-1.0)
    with pytest.raises(ValueError, match="outside the context"):
        model.decode_step(np.zeros((1, 1), np.int32), ctx)
    with pytest.raises(ValueError, match="outside the context"):
        model.logits([[1] * (ctx + 1)])
    assert model.generate([1, 2], 0) == [[]]


# ---------------------------------------------------------------------------------------------- weights
def test_random_init_is_seeded_and_small() -> None:
    a, b, c = (GPT2(GPT2Config.tiny(), seed=s) for s in (1, 1, 2))
    wa, wb, wc = (m.hf_state_dict()["h.0.attn.c_attn.weight"].numpy() for m in (a, b, c))
    np.testing.assert_array_equal(wa, wb)
    assert not np.array_equal(wa, wc)
    assert abs(float(wa.std()) - 0.02) < 0.003
    full = GPT2Config.gpt2_124m()
    assert (full.vocab_size, full.max_context, full.dim, full.n_layers, full.n_heads) == \
        (50257, 1024, 768, 12, 12)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hf_state_dict_round_trip_and_key_errors(arch: str) -> None:
    model, w = model_and_weights(arch)
    exported = {k: v.numpy() for k, v in model.hf_state_dict().items()}
    assert sorted(exported) == sorted(w)
    for k in w:
        np.testing.assert_array_equal(exported[k], w[k])
    cls, cfg, _, _ = ARCHS[arch]
    bad = dict(w)
    bad["unknown.weight"] = np.zeros(3, np.float32)
    with pytest.raises(KeyError, match="unknown.weight"):
        cls.from_hf_state_dict(bad, cfg)
    first = sorted(w)[0]
    wrong = dict(w)
    wrong[first] = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match="has shape"):
        cls.from_hf_state_dict(wrong, cfg)
    if arch == "gpt2":  # a head equal to the embedding is accepted (tied), a different one is refused
        cls.from_hf_state_dict({**w, "lm_head.weight": w["wte.weight"]}, cfg)
        with pytest.raises(ValueError, match="ties"):
            cls.from_hf_state_dict({**w, "lm_head.weight": w["wte.weight"] + 1}, cfg)


def _has_safetensors() -> bool:
    from rawgrad.nn import state
    return hasattr(state, "safe_load") and hasattr(state, "safe_save")


@pytest.mark.skipif(not _has_safetensors(), reason="rawgrad.nn.state.safe_load not available yet")
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_from_pretrained_safetensors_gives_the_same_logits(arch: str, tmp_path: Path) -> None:
    from rawgrad.nn.state import safe_save
    model, w = model_and_weights(arch)
    cls, cfg, _, _ = ARCHS[arch]
    tensors = {k: Tensor(v) for k, v in w.items()}
    if arch == "gpt2":  # HF GPT2LMHeadModel keys: a transformer. prefix and the causal-mask buffer
        tensors = {f"transformer.{k}": v for k, v in tensors.items()}
        tensors["transformer.h.0.attn.bias"] = Tensor(np.ones((1, 1, 4, 4), np.float32))
        hf_cfg = {"vocab_size": cfg.vocab_size, "n_positions": cfg.max_context, "n_embd": cfg.dim,
                  "n_layer": cfg.n_layers, "n_head": cfg.n_heads, "layer_norm_epsilon": cfg.norm_eps}
    else:
        hf_cfg = {"vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_context,
                  "hidden_size": cfg.dim, "num_hidden_layers": cfg.n_layers,
                  "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
                  "intermediate_size": cfg.hidden_dim, "rope_theta": cfg.rope_theta,
                  "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": False}
    safe_save(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
    loaded = cls.from_pretrained(str(tmp_path))
    assert loaded.config == cfg
    seq = np.array([[4, 8, 15, 16, 23, 42]])
    np.testing.assert_allclose(loaded.logits(seq), model.logits(seq), atol=1e-6)


# ---------------------------------------------------------------------------------------------- saved graphs
CHILD = r"""
import json, sys
from rawgrad import Device, GlobalCounters
from rawgrad.compiler.toolchain import LLVMCompiler
Device["CPU"]  # the command processor itself may compile; the decoder must not
LLVMCompiler.stats.reset()
GlobalCounters.reset()
from rawgrad.models.{module} import {cls}
dec = {cls}.load_decoder(sys.argv[1])
out = dec.generate(json.loads(sys.argv[2]), int(sys.argv[3]))
assert LLVMCompiler.stats.compiles == 0, LLVMCompiler.stats
assert GlobalCounters.kernels_compiled == 0, GlobalCounters.kernels_compiled
print(json.dumps(out))
"""


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_saved_decoder_generates_the_same_tokens_in_a_fresh_process(arch: str, tmp_path: Path) -> None:
    model, _ = model_and_weights(arch)
    prompts = [[3, 14, 15], [9, 2, 6, 5]]
    n = 6
    want = model.generate(prompts, n, prefill="step")
    assert want == model.generate(prompts, n)  # batch prefill agrees with the step-by-step one
    path = tmp_path / "decoder"
    model.save_decoder(str(path), batch=2)
    module, cls = ("gpt2", "GPT2") if arch == "gpt2" else ("llama", "Llama")
    code = CHILD.replace("{module}", module).replace("{cls}", cls)
    res = subprocess.run([sys.executable, "-c", code, str(path), json.dumps(prompts), str(n)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1]) == want
    with pytest.raises(ValueError, match="not 'llama'" if arch == "gpt2" else "not 'gpt2'"):
        (Llama if arch == "gpt2" else GPT2).load_decoder(str(path))
