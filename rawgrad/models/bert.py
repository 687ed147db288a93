"""A BERT encoder (the architecture of all-MiniLM-L6-v2) on rawgrad Tensors.

Parameter names follow the Hugging Face `BertModel` layout, so a `model.safetensors` from the hub loads
with `load_state_dict` unchanged ("embeddings.word_embeddings.weight",
"encoder.layer.0.attention.self.query.weight", ...). Post-LN blocks, exact (erf) GELU, absolute learned
positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rawgrad import nn
from rawgrad.tensor.tensor import Tensor

__all__ = ["BertConfig", "BertModel", "mean_pool_normalize"]

# What HF adds to the attention scores of padding keys: a large negative value, so that softmax gives them
# zero weight without producing NaN when every key of a row is padding (as -inf would).
PADDING_SCORE = -1e9
# torch.nn.functional.normalize's default eps: a zero vector stays zero instead of dividing by zero.
NORMALIZE_EPS = 1e-12


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> BertConfig:
        """From a Hugging Face config.json dict (only absolute positions and exact GELU are supported)."""
        if cfg.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"BERT hidden_act {cfg['hidden_act']!r} is not supported (only 'gelu')")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"BERT position_embedding_type {cfg['position_embedding_type']!r} "
                             "is not supported")
        fields = BertConfig.__dataclass_fields__
        return BertConfig(**{k: cfg[k] for k in fields if k in cfg})

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class _Dense:
    """A Linear layer stored in Hugging Face's (out, in) layout for loading, computed from an (in, out)
    copy made by `prepare`: the matmul then reads the weight row-contiguous along the output axis,
    which the CPU code generator register-tiles (about 2x faster than reading (out, in) rows)."""

    def __init__(self, in_features: int, out_features: int, init: bool = True) -> None:
        if init:
            layer = nn.Linear(in_features, out_features)  # torch's default initialisation
            self.weight, self.bias = layer.weight, layer.bias
        else:  # to be replaced by loaded weights: no memory, no kernels
            self.weight, self.bias = Tensor.empty(out_features, in_features), Tensor.empty(out_features)
        self._weight_t: Tensor | None = None

    def prepare(self) -> None:
        self._weight_t = self.weight.T.contiguous().realize()

    def __call__(self, x: Tensor) -> Tensor:
        w = self._weight_t if self._weight_t is not None else self.weight.T
        return x.linear(w, self.bias)


def _embedding(num: int, dim: int, init: bool) -> nn.Embedding:
    if init:
        return nn.Embedding(num, dim)
    # nn.Embedding without its N(0, 1) draw (22M values for MiniLM's tables, about half its load time):
    # the attributes its __init__ sets, the table left unwritten for loaded weights to replace
    e = nn.Embedding.__new__(nn.Embedding)
    e.num_embeddings, e.embedding_dim = num, dim
    e.weight = Tensor.empty(num, dim)
    return e


class _Embeddings:
    def __init__(self, c: BertConfig, init: bool = True) -> None:
        self.word_embeddings = _embedding(c.vocab_size, c.hidden_size, init)
        self.position_embeddings = _embedding(c.max_position_embeddings, c.hidden_size, init)
        self.token_type_embeddings = _embedding(c.type_vocab_size, c.hidden_size, init)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        seq_len = input_ids.shape[1]
        # positions 0..T-1 are a prefix of the table: a shrink, not a gather
        positions = self.position_embeddings.weight.shrink(((0, seq_len), None))
        x = self.word_embeddings(input_ids) + positions + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x)


class _SelfAttention:
    def __init__(self, c: BertConfig, init: bool = True) -> None:
        self.query = _Dense(c.hidden_size, c.hidden_size, init)
        self.key = _Dense(c.hidden_size, c.hidden_size, init)
        self.value = _Dense(c.hidden_size, c.hidden_size, init)
        self.heads, self.head_dim = c.num_attention_heads, c.head_dim

    def __call__(self, x: Tensor, score_bias: Tensor) -> Tensor:
        b, t, _ = x.shape

        def split(y: Tensor) -> Tensor:  # (B, T, H*D) -> (B, H, T, D)
            return y.reshape(b, t, self.heads, self.head_dim).permute(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim)) + score_bias
        ctx = scores.softmax(-1) @ v
        # materialize the head-merge permute: the next matmul then reads its input row-contiguous
        return ctx.permute(0, 2, 1, 3).contiguous().reshape(b, t, self.heads * self.head_dim)


class _DenseNorm:
    """dense -> residual add -> LayerNorm (HF's BertSelfOutput and BertOutput)."""

    def __init__(self, c: BertConfig, in_features: int, init: bool = True) -> None:
        self.dense = _Dense(in_features, c.hidden_size, init)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, h: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class _Attention:
    def __init__(self, c: BertConfig, init: bool = True) -> None:
        self.self = _SelfAttention(c, init)
        self.output = _DenseNorm(c, c.hidden_size, init)


class _Intermediate:
    def __init__(self, c: BertConfig, init: bool = True) -> None:
        self.dense = _Dense(c.hidden_size, c.intermediate_size, init)


class _Layer:
    def __init__(self, c: BertConfig, init: bool = True) -> None:
        self.attention = _Attention(c, init)
        self.intermediate = _Intermediate(c, init)
        self.output = _DenseNorm(c, c.intermediate_size, init)

    def __call__(self, x: Tensor, score_bias: Tensor) -> Tensor:
        x = self.attention.output(self.attention.self(x, score_bias), x)
        return self.output(self.intermediate.dense(x).gelu(), x)


class _Encoder:
    def __init__(self, c: BertConfig, init: bool = True) -> None:
        self.layer = [_Layer(c, init) for _ in range(c.num_hidden_layers)]


class _Pooler:
    """HF's [CLS] pooler: present in the checkpoints, unused by sentence embeddings."""

    def __init__(self, c: BertConfig, init: bool = True) -> None:
        self.dense = _Dense(c.hidden_size, c.hidden_size, init)


class BertModel:
    """input_ids (B, T) int, attention_mask (B, T) 0/1 -> last hidden states (B, T, hidden)."""

    def __init__(self, config: BertConfig | None = None, init: bool = True) -> None:
        """init=False: every Linear and Embedding weight is an unwritten buffer (no random draw, no
        kernel, no memory until used), for a caller that replaces them all with loaded weights."""
        self.config = config or BertConfig()
        self.embeddings = _Embeddings(self.config, init)
        self.encoder = _Encoder(self.config, init)
        self.pooler = _Pooler(self.config, init)

    def prepare(self) -> None:
        """Make the inference copies of the weights (call again after changing them)."""
        for layer in self.encoder.layer:
            for dense in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value,
                          layer.attention.output.dense, layer.intermediate.dense, layer.output.dense):
                dense.prepare()

    def __call__(self, input_ids: Tensor, attention_mask: Tensor,
                 token_type_ids: Tensor | None = None) -> Tensor:
        if input_ids.ndim != 2 or tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"BERT: input_ids {input_ids.shape} and attention_mask {attention_mask.shape} "
                             "must both be (batch, seq_len)")
        if token_type_ids is None:
            token_type_ids = input_ids.zeros_like()
        x = self.embeddings(input_ids, token_type_ids)
        # (B, 1, 1, T): 0 for real keys, PADDING_SCORE for padding, broadcast over heads and queries
        b, t = input_ids.shape
        score_bias = ((1 - attention_mask.float()) * PADDING_SCORE).reshape(b, 1, 1, t)
        for layer in self.encoder.layer:
            x = layer(x, score_bias)
        return x


def mean_pool_normalize(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of the real tokens' hidden states, then L2-normalized (sentence-transformers' pooling)."""
    mask = attention_mask.float().unsqueeze(-1)
    summed = (hidden * mask).sum(1)
    counts = mask.sum(1).maximum(1e-9)  # sentence-transformers clamps the token count the same way
    pooled = summed / counts
    norm = (pooled * pooled).sum(-1, keepdim=True).sqrt().maximum(NORMALIZE_EPS)
    return pooled / norm
