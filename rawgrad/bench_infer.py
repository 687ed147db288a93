"""`python -m rawgrad bench infer`: model inference against PyTorch on the CPU, measured in one run.

MiniLM (all-MiniLM-L6-v2) sentences/s at batch 1 and 32, and GPT-2 124M decode tokens/s at batch 1
with random weights. The PyTorch side runs the same architectures written here in plain torch ops, on
the same weights and token ids (no transformers package), so the comparison is of the two runtimes.
Both sides tokenize with the same tokenizer, inside the timed region.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rawgrad.bench import median_time

TORCH_MISSING = "n/a (torch not installed)"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


# ------------------------------------------------------------------------------------------- MiniLM
def _torch_minilm(weights: dict[str, np.ndarray], heads: int, eps: float) -> Callable[[Any, Any], Any]:
    """A BERT encoder + mean pooling + L2 normalization in torch ops (HF BertModel semantics)."""
    torch = _torch()
    f = torch.nn.functional
    w = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
    layers = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("encoder.layer."))
    hidden = w["embeddings.word_embeddings.weight"].shape[1]
    head_dim = hidden // heads

    def ln(x: Any, name: str) -> Any:
        return f.layer_norm(x, (hidden,), w[f"{name}.weight"], w[f"{name}.bias"], eps)

    def dense(x: Any, name: str) -> Any:
        return f.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

    def forward(ids: Any, mask: Any) -> Any:
        b, t = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = ln(x, "embeddings.LayerNorm")
        bias = ((1 - mask.float()) * -1e9)[:, None, None, :]
        for i in range(layers):
            p = f"encoder.layer.{i}."

            def split(y: Any) -> Any:
                return y.view(b, t, heads, head_dim).transpose(1, 2)

            q, k, v = (split(dense(x, p + f"attention.self.{n}")) for n in ("query", "key", "value"))
            ctx = ((q @ k.transpose(-1, -2)) / math.sqrt(head_dim) + bias).softmax(-1) @ v
            ctx = ctx.transpose(1, 2).reshape(b, t, hidden)
            x = ln(dense(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            h = f.gelu(dense(x, p + "intermediate.dense"))
            x = ln(dense(h, p + "output.dense") + x, p + "output.LayerNorm")
        m = mask.float()[..., None]
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return f.normalize(pooled, dim=-1)

    return forward


def _sentences(n: int) -> list[str]:
    base = ["The quick brown fox jumps over the lazy dog.", "GPUs execute thousands of threads in parallel.",
            "The command queue is submitted by writing a doorbell register.",
            "Tensors are evaluated lazily and fused into kernels.", "Paris is the capital of France.",
            "I would like a cup of coffee, please.", "A fast auburn fox leaps above a sleepy hound.",
            "Numbers like 3.14159 and 2718 appear in text too!"]
    return [base[i % len(base)] for i in range(n)]


def bench_minilm(batches: tuple[int, ...], repeats: int) -> list[dict[str, Any]]:
    from rawgrad.models import minilm
    from rawgrad.nn.state import SafetensorsFile

    model = minilm.load()
    torch = _torch()
    torch_forward = None
    if torch is not None:
        with SafetensorsFile(model.path / "model.safetensors") as f:
            weights = {k: np.array(f.raw(k)) for k in f.keys() if k not in minilm.UNUSED_KEYS}
        cfg = model.model.config
        torch_forward = _torch_minilm(weights, cfg.num_attention_heads, cfg.layer_norm_eps)
    rows = []
    for batch in batches:
        sentences = _sentences(batch)
        ours_s = median_time(lambda s=sentences, b=batch: model.embed(s, batch_size=b),  # type: ignore[misc]
                             repeats, warmup=3)
        ours = model.embed(sentences, batch_size=batch)
        row: dict[str, Any] = {"case": f"MiniLM-L6 embed, batch {batch}", "unit": "sentences/s",
                               "rawgrad": batch / ours_s, "torch": None,
                               "kernels": model.stats.kernels_launched, "captures": model.stats.captures}
        if torch_forward is not None:
            def run_torch(sentences: list[str] = sentences) -> Any:
                enc = model.tokenizer.encode_batch(sentences)
                ids = torch.tensor([e.ids for e in enc])
                mask = torch.tensor([e.attention_mask for e in enc])
                with torch.inference_mode():
                    return torch_forward(ids, mask)
            theirs_s = median_time(run_torch, repeats, warmup=2)
            row["torch"] = batch / theirs_s
            row["max_abs_diff"] = float(np.abs(run_torch().numpy() - ours).max())
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------- GPT-2
def _torch_gpt2_decode(state: dict[str, np.ndarray], n_layers: int, n_heads: int, eps: float,
                       max_context: int) -> Callable[[int, int], list[float]]:
    """Greedy decode with a KV cache in torch ops (HF GPT-2 layout: Conv1D weights are (in, out))."""
    torch = _torch()
    f = torch.nn.functional
    w = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}
    dim = w["wte.weight"].shape[1]
    hd = dim // n_heads

    def step(tok: Any, pos: int, cache: list[tuple[Any, Any]]) -> Any:
        x = w["wte.weight"][tok] + w["wpe.weight"][pos]
        for i in range(n_layers):
            p = f"h.{i}."
            h = f.layer_norm(x, (dim,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
            qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = (t.view(1, n_heads, 1, hd) for t in qkv.split(dim, -1))
            kc, vc = cache[i]
            kc[:, :, pos:pos + 1], vc[:, :, pos:pos + 1] = k, v
            a = f.scaled_dot_product_attention(q, kc[:, :, :pos + 1], vc[:, :, :pos + 1])
            x = x + a.reshape(1, dim) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
            h = f.layer_norm(x, (dim,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
            h = f.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = f.layer_norm(x, (dim,), w["ln_f.weight"], w["ln_f.bias"], eps)
        return (x @ w["wte.weight"].T).argmax(-1)

    def decode(first: int, n_tokens: int) -> list[float]:
        cache = [(torch.zeros(1, n_heads, max_context, hd), torch.zeros(1, n_heads, max_context, hd))
                 for _ in range(n_layers)]
        tok, times = torch.tensor([first]), []
        with torch.inference_mode():
            for pos in range(n_tokens):
                t0 = time.perf_counter()
                tok = step(tok, pos, cache)
                times.append(time.perf_counter() - t0)
        return times

    return decode


def bench_gpt2(n_tokens: int) -> dict[str, Any]:
    from rawgrad.models import gpt2

    cfg = gpt2.GPT2Config.gpt2_124m()
    ours = gpt2.bench_decode(n_tokens, batch=1, config=cfg)
    row: dict[str, Any] = {"case": "GPT-2 124M decode, batch 1", "unit": "tokens/s",
                           "rawgrad": ours["tokens_per_s"], "torch": None, "captures": ours["captures"]}
    torch = _torch()
    if torch is not None:
        model = gpt2.GPT2(cfg, seed=0)
        state = {k: v.numpy() for k, v in model.hf_state_dict().items()}
        decode = _torch_gpt2_decode(state, cfg.n_layers, cfg.n_heads, cfg.norm_eps, cfg.max_context)
        decode(1, 4)  # warm-up
        per = decode(1, n_tokens)
        row["torch"] = 1.0 / statistics.median(per)
    return row


def bench_infer(quick: bool = False) -> int:
    torch = _torch()
    torch_info = f"torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else "no torch"
    print(f"rawgrad bench infer  ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{torch_info})")
    repeats = 3 if quick else 7
    rows = bench_minilm((1, 32), repeats)
    rows.append(bench_gpt2(8 if quick else 32))
    print(f"{'case':30s} {'unit':12s} {'rawgrad':>9s} {'torch':>9s} {'rawgrad/torch':>14s}")
    for r in rows:
        theirs = f"{r['torch']:9.1f}" if r["torch"] is not None else f"{'n/a':>9s}"
        ratio = f"{r['rawgrad'] / r['torch']:13.2f}x" if r["torch"] else f"{'n/a':>14s}"
        print(f"{r['case']:30s} {r['unit']:12s} {r['rawgrad']:9.1f} {theirs} {ratio}")
    for r in rows:
        if "max_abs_diff" in r:
            print(f"  {r['case']}: max |rawgrad - torch| = {r['max_abs_diff']:.2e}; "
                  f"{r['kernels']} kernels per call, {r['captures']} captured graph(s)")
    if torch is None:
        print(f"torch column: {TORCH_MISSING}; `pip install torch` to compare")
    return 0
