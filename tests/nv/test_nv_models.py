"""Models on the mock NV GPU (PTX interpreted): the same tokens and logits as on the CPU."""
from __future__ import annotations

import numpy as np

from rawgrad.models import gpt2, llama


def test_gpt2_generation_on_nv_matches_cpu(nv: str) -> None:
    cfg = gpt2.GPT2Config.tiny()
    cpu = gpt2.GPT2(cfg, seed=5, device="CPU")
    gpu = gpt2.GPT2.from_hf_state_dict({k: v.numpy() for k, v in cpu.hf_state_dict().items()}, cfg, device=nv)
    prompt = [[3, 1, 4]]
    want = cpu.generate(prompt, 6)
    got = gpu.generate(prompt, 6)
    assert got == want
    assert len(gpu.decode_jit.captures) == 1  # every decode position replayed one captured graph on NV


def test_llama_logits_on_nv_match_cpu(nv: str) -> None:
    cfg = llama.LlamaConfig.tiny()
    cpu = llama.Llama(cfg, seed=2, device="CPU")
    weights = {k: v.numpy() for k, v in cpu.hf_state_dict().items()}
    gpu = llama.Llama.from_hf_state_dict(weights, cfg, device=nv)
    tokens = np.array([[5, 9, 2, 7]], np.int32)
    want = cpu.logits(tokens)
    got = gpu.logits(tokens)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
