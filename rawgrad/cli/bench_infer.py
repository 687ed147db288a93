"""`python -m rawgrad bench infer`: model inference against PyTorch on the CPU, measured in one run.

MiniLM (all-MiniLM-L6-v2) sentences/s at batch 1 and 32, and GPT-2 124M decode tokens/s at batch 1
with random weights. The PyTorch side runs the same architectures written here in plain torch ops, on
the same weights and token ids (no transformers package), so the comparison is of the two runtimes.
Both sides tokenize with the same tokenizer, inside the timed region.

Both sides are summarized by the same statistic, computed by the same function (`summarize`): the p50
(median) and p90 of the per-call (MiniLM) or per-step (GPT-2) wall times; throughput is units / p50 on
both sides. Correctness is checked in the same run: MiniLM embeddings and GPT-2 logits (same weights,
same token ids) against torch, failing loudly above a tolerance.
"""
from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rawgrad.cli.bench import timed_calls

TORCH_MISSING = "n/a (torch not installed)"
STATISTIC = "p50"  # throughput = units / p50 of the per-call times, on both sides
MINILM_TOLERANCE = 1e-4  # max |rawgrad - torch| of L2-normalized embeddings
GPT2_TOLERANCE = 1e-3  # max |rawgrad - torch| of logits
GPT2_CHECK_IDS = (464, 2068, 7586, 21831, 18045, 625)  # token ids fed to both sides for the logits check


class ParityError(AssertionError):
    """rawgrad and torch disagree beyond the tolerance on the same weights and inputs."""


def summarize(times: list[float]) -> dict[str, float]:
    """p50 and p90 (numpy's linear interpolation) of wall times in seconds; the one summary both sides get."""
    if not times:
        raise ValueError("no timings to summarize")
    arr = np.asarray(times, dtype=np.float64)
    return {"p50": float(np.percentile(arr, 50)), "p90": float(np.percentile(arr, 90)), "n": len(times)}


def make_row(case: str, unit: str, units_per_call: int, ours: list[float], theirs: list[float] | None) \
        -> dict[str, Any]:
    """A result row: both sides' timings summarized by `summarize`, throughput = units / p50 for both."""
    row: dict[str, Any] = {"case": case, "unit": unit, "statistic": STATISTIC,
                           "units_per_call": units_per_call, "rawgrad_stats": summarize(ours),
                           "torch_stats": None, "torch": None}
    row["rawgrad"] = units_per_call / row["rawgrad_stats"][STATISTIC]
    if theirs is not None:
        row["torch_stats"] = summarize(theirs)
        row["torch"] = units_per_call / row["torch_stats"][STATISTIC]
    return row


def check_parity(case: str, diff: float, tolerance: float) -> None:
    if not diff <= tolerance:  # also catches NaN
        raise ParityError(f"{case}: max |rawgrad - torch| = {diff:.3e} is above the tolerance "
                          f"{tolerance:.0e} (same weights, same inputs): the two runtimes do not compute "
                          f"the same model")


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
        ours_t = timed_calls(lambda s=sentences, b=batch: model.embed(s, batch_size=b),  # type: ignore[misc]
                             repeats, warmup=3)
        ours = model.embed(sentences, batch_size=batch)
        theirs_t = None
        case = f"MiniLM-L6 embed, batch {batch}"
        diff = None
        if torch_forward is not None:
            def run_torch(sentences: list[str] = sentences) -> Any:
                enc = model.tokenizer.encode_batch(sentences)
                ids = torch.tensor([e.ids for e in enc])
                mask = torch.tensor([e.attention_mask for e in enc])
                with torch.inference_mode():
                    return torch_forward(ids, mask)
            theirs_t = timed_calls(run_torch, repeats, warmup=2)
            diff = float(np.abs(run_torch().numpy() - ours).max())
        row = make_row(case, "sentences/s", batch, ours_t, theirs_t)
        row.update(kernels=model.stats.kernels_launched, captures=model.stats.captures)
        if diff is not None:
            row.update(max_abs_diff=diff, tolerance=MINILM_TOLERANCE, compared="embeddings")
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------- GPT-2
def _torch_gpt2(state: dict[str, np.ndarray], n_layers: int, n_heads: int, eps: float, max_context: int) \
        -> tuple[Callable[[int, int], list[float]], Callable[[list[int]], np.ndarray]]:
    """Greedy decode with a KV cache in torch ops (HF GPT-2 layout: Conv1D weights are (in, out)).
    Returns (decode(first, n) -> per-step wall times, logits(ids) -> (len(ids), vocab) logits of feeding
    the ids one step at a time, as the decode does)."""
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
        return x @ w["wte.weight"].T  # (1, vocab) logits

    def new_cache() -> list[tuple[Any, Any]]:
        return [(torch.zeros(1, n_heads, max_context, hd), torch.zeros(1, n_heads, max_context, hd))
                for _ in range(n_layers)]

    def decode(first: int, n_tokens: int) -> list[float]:
        cache = new_cache()
        tok, times = torch.tensor([first]), []
        with torch.inference_mode():
            for pos in range(n_tokens):
                t0 = time.perf_counter()
                tok = step(tok, pos, cache).argmax(-1)
                times.append(time.perf_counter() - t0)
        return times

    def logits(ids: list[int]) -> np.ndarray:
        cache = new_cache()
        with torch.inference_mode():
            return np.concatenate([step(torch.tensor([t]), pos, cache).numpy() for pos, t in enumerate(ids)])

    return decode, logits


def bench_gpt2(n_tokens: int, config: Any = None) -> dict[str, Any]:
    """GPT-2 decode at batch 1: per-step wall times of the captured decode graph (rawgrad: step, logits
    readback and greedy pick; torch: step and argmax), summarized by `summarize` on both sides, then the
    logits of GPT2_CHECK_IDS fed one step at a time through both (same weights) compared."""
    from rawgrad.models import gpt2

    cfg = config if config is not None else gpt2.GPT2Config.gpt2_124m()
    model = gpt2.GPT2(cfg, seed=0)
    prompt = [[1]]
    model.generate(prompt, 4)  # warm-up: eager step, capture, replays
    model.generate(prompt, n_tokens + 1)  # the first new token comes from the prompt pass
    assert model.last_timing is not None
    ours_t = list(model.last_timing.per_token_s)
    ids = [t % cfg.vocab_size for t in GPT2_CHECK_IDS]
    ours_logits = np.concatenate([model.decode_step(np.array([[t]], np.int32), pos)
                                  for pos, t in enumerate(ids)])
    torch = _torch()
    theirs_t, diff = None, None
    if torch is not None:
        state = {k: v.numpy() for k, v in model.hf_state_dict().items()}
        decode, torch_logits = _torch_gpt2(state, cfg.n_layers, cfg.n_heads, cfg.norm_eps, cfg.max_context)
        decode(1, 4)  # warm-up
        theirs_t = decode(1, n_tokens)
        diff = float(np.abs(torch_logits(ids) - ours_logits).max())
    size = "124M" if cfg == gpt2.GPT2Config.gpt2_124m() else f"{cfg.n_layers}-layer {cfg.dim}-dim"
    row = make_row(f"GPT-2 {size} decode, batch 1", "tokens/s", 1, ours_t, theirs_t)
    row.update(captures=len(model.decode_jit.captures), logits_abs_max=float(np.abs(ours_logits).max()))
    if diff is not None:
        row.update(max_abs_diff=diff, tolerance=GPT2_TOLERANCE, compared=f"logits of {len(ids)} decode steps")
    return row


def print_rows(rows: list[dict[str, Any]]) -> None:
    """The table: throughput from p50 on both sides, then p50 and p90 per call for both sides."""
    print(f"statistic: {STATISTIC} of per-call wall times on both sides (throughput = units / p50); "
          f"p50 and p90 in ms per call (MiniLM) or per decode step (GPT-2)")
    print(f"{'case':32s} {'unit':12s} {'rawgrad':>9s} {'torch':>9s} {'rawgrad/torch':>14s} "
          f"{'rawgrad p50':>12s} {'p90':>8s} {'torch p50':>10s} {'p90':>8s} {'calls':>6s}")
    for r in rows:
        theirs = f"{r['torch']:9.1f}" if r["torch"] is not None else f"{'n/a':>9s}"
        ratio = f"{r['rawgrad'] / r['torch']:13.2f}x" if r["torch"] else f"{'n/a':>14s}"
        ours_s, theirs_s = r["rawgrad_stats"], r["torch_stats"]
        t50 = f"{theirs_s['p50'] * 1e3:10.2f}" if theirs_s else f"{'n/a':>10s}"
        t90 = f"{theirs_s['p90'] * 1e3:8.2f}" if theirs_s else f"{'n/a':>8s}"
        print(f"{r['case']:32s} {r['unit']:12s} {r['rawgrad']:9.1f} {theirs} {ratio} "
              f"{ours_s['p50'] * 1e3:12.2f} {ours_s['p90'] * 1e3:8.2f} {t50} {t90} {ours_s['n']:6d}")


def report_parity(rows: list[dict[str, Any]]) -> None:
    """Print every max |diff| and raise ParityError (after printing all of them) if one is too large."""
    bad = []
    for r in rows:
        if "max_abs_diff" in r:
            extra = (f"{r['kernels']} kernels per call, " if "kernels" in r else "") + \
                f"{r['captures']} captured graph(s)"
            print(f"  {r['case']}: max |rawgrad - torch| of {r['compared']} = {r['max_abs_diff']:.2e} "
                  f"(tolerance {r['tolerance']:.0e}); {extra}")
            if not r["max_abs_diff"] <= r["tolerance"]:
                bad.append(r)
    for r in bad:
        check_parity(r["case"], r["max_abs_diff"], r["tolerance"])


def bench_infer(quick: bool = False) -> int:
    torch = _torch()
    torch_info = f"torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else "no torch"
    print(f"rawgrad bench infer  ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{torch_info})")
    repeats = 3 if quick else 7
    rows = bench_minilm((1, 32), repeats)
    rows.append(bench_gpt2(8 if quick else 32))
    print_rows(rows)
    report_parity(rows)
    if torch is None:
        print(f"torch column: {TORCH_MISSING}; `pip install torch` to compare (no parity check ran)")
    return 0
