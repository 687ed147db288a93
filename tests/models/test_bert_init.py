"""BertModel(init=False): the module tree MiniLM loads into, with the same parameter names, shapes and dtypes
as the randomly initialised one, and no kernel run to make it (its weights are unwritten buffers)."""
from __future__ import annotations

from rawgrad.models.bert import BertConfig, BertModel
from rawgrad.nn.state import get_state_dict
from rawgrad.tensor.buffers import is_allocated
from rawgrad.tensor.realize import GlobalCounters

SMALL = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=32, max_position_embeddings=12)


def test_uninitialised_tree_matches_the_initialised_one_without_kernels() -> None:
    kernels = GlobalCounters.kernel_count
    empty = get_state_dict(BertModel(SMALL, init=False))
    assert GlobalCounters.kernel_count == kernels, "init=False ran kernels"
    full = get_state_dict(BertModel(SMALL))
    assert GlobalCounters.kernel_count > kernels  # (the random initialisation does run kernels)
    assert list(empty) == list(full)
    for name, t in empty.items():
        assert (tuple(t.shape), t.dtype) == (tuple(full[name].shape), full[name].dtype), name
        if not name.endswith(("LayerNorm.weight", "LayerNorm.bias")):
            assert not is_allocated(t.uop.base), f"{name} was given memory before any weights arrived"
