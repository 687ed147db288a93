"""Models on the mock NV GPU (PTX interpreted) against the numpy reference forwards of
tests/models/numpy_ref.py (float64, no rawgrad code): prefill logits, then logits and greedy tokens of
decode steps that read the KV cache. The reference reads the weights back from the model on the GPU.
Tolerance: numpy_ref.LOGITS_ATOL / LOGITS_RTOL (1e-4 each, about 10x the float32 rounding of these tiny
models)."""
from __future__ import annotations

from typing import Any

import numpy as np

from rawgrad.models import gpt2, llama
from tests.models import numpy_ref


def close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, atol=numpy_ref.LOGITS_ATOL, rtol=numpy_ref.LOGITS_RTOL,
                               err_msg=what)


def check_prefill_and_decode(model: Any, reference: Any, seq: np.ndarray, prefill: int) -> None:
    """Logits of seq[:, :prefill] in one eager pass (which fills the cache), then one decode step per
    later position through the captured graph (eager, capture, replays), each against the reference over
    the whole sequence; every step's greedy token is the reference's."""
    want = reference(seq)
    close(model.logits(seq[:, :prefill]), want[:, :prefill], "prefill")
    for pos in range(prefill, seq.shape[1]):
        got = model.decode_step(seq[:, pos:pos + 1], pos)
        close(got, want[:, pos], f"decode step at position {pos}")
        np.testing.assert_array_equal(got.argmax(-1), want[:, pos].argmax(-1))
    assert len(model.decode_jit.captures) == 1  # every decode position replayed one captured graph on NV
    assert model.decode_jit.replays == seq.shape[1] - prefill - 2


def weights_of(model: Any, given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's weights read back from the GPU (what the reference computes with); they are the ones
    it was given."""
    w = numpy_ref.state_dict_numpy(model)
    assert sorted(w) == sorted(given)
    for k, v in given.items():
        np.testing.assert_array_equal(w[k], v, err_msg=k)
    return w


def test_gpt2_on_nv_matches_numpy_reference(nv: str) -> None:
    cfg = gpt2.GPT2Config.tiny()
    given = numpy_ref.gpt2_weights(cfg, seed=5)
    gpu = gpt2.GPT2.from_hf_state_dict(given, cfg, device=nv)
    w = weights_of(gpu, given)

    def reference(tokens: np.ndarray) -> np.ndarray:
        return numpy_ref.gpt2_logits(w, cfg, tokens)

    prompt = [3, 1, 4]
    tokens = numpy_ref.greedy(reference, prompt, 6)  # the reference's greedy continuation, fed step by step
    check_prefill_and_decode(gpu, reference, np.array([prompt + tokens]), len(prompt))


def test_llama_on_nv_matches_numpy_reference(nv: str) -> None:
    cfg = llama.LlamaConfig.tiny()
    given = numpy_ref.llama_weights(cfg, seed=2)
    gpu = llama.Llama.from_hf_state_dict(given, cfg, device=nv)
    w = weights_of(gpu, given)

    def reference(tokens: np.ndarray) -> np.ndarray:
        return numpy_ref.llama_logits(w, cfg, tokens)

    prompt = [5, 9, 2, 7]
    tokens = numpy_ref.greedy(reference, prompt, 4)
    check_prefill_and_decode(gpu, reference, np.array([prompt + tokens]), len(prompt))
