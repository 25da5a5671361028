"""The BERT encoder (Hugging Face's ``BertModel``, as in sentence-transformers' all-MiniLM-L6-v2)
assembled from ``maxjax.nn`` layers, with sentence pooling and L2 normalisation.

Layers: :class:`~maxjax.nn.Embedding` (word, position, token type), :class:`~maxjax.nn.LayerNorm`
(with bias), :class:`~maxjax.nn.MultiheadAttention` (bidirectional, its ``attention_mask=`` for the
padding), :class:`~maxjax.nn.FeedForward` (``hidden_act``: exact erf GELU for BERT). Each
:class:`BertLayer` is a :class:`~maxjax.nn.PostNormTransformerBlock` (Devlin et al., 2019; Vaswani
et al., 2017)::

    h   = attention_norm(x + attention(x, mask))
    out = mlp_norm(h + mlp.down_proj(act(mlp.up_proj(h))))

:class:`BertModel` runs its layers MAX's way: one subgraph built from layer 0 (``build_subgraph``),
called once per layer with ``ops.call(..., prefix="encoder.layer.{i}.")``; in a graph that chain
is one ``lax.scan`` (:mod:`maxjax.graph.scan`). Pooling and normalisation follow
sentence-transformers (``sentence_transformers/models/Pooling.py``: mean over the mask with the
count clamped at 1e-9; ``Normalize.py``: ``F.normalize``, i.e. ``x / max(||x||, 1e-12)``); MAX's
own BERT pipeline (``max/pipelines/architectures/bert/graph.py``) pools the same way.

Weight names (maxjax's; :data:`~maxjax.models.bert.weights.BERT_MODULE_NAMES` maps Hugging Face's):
``embeddings.{word,position,token_type}_embeddings.weight``, ``embeddings.layer_norm.{weight,bias}``,
``encoder.layer.N.attention.{q,k,v,o}_proj.{weight,bias}``, ``encoder.layer.N.attention_norm.*``,
``encoder.layer.N.mlp.{up,down}_proj.*``, ``encoder.layer.N.mlp_norm.*``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph import DeviceRef, ops
from maxjax.graph.ops.shape import literal_constant
from maxjax.models.bert.config import BertConfig, SentenceHead
from maxjax.nn import (
    Embedding, FeedForward, LayerList, LayerNorm, Module, MultiheadAttention, PostNormTransformerBlock,
)  # fmt: skip

__all__ = ["BertEmbeddings", "BertLayer", "BertModel", "build_bert"]


def _mean_pool(h: Any, mask: Any) -> Any:
    """h float ``[batch, seq, hidden]``, mask int/bool ``[batch, seq]`` -> ``[batch, hidden]``: the
    mean of the rows the mask keeps (sentence-transformers' count clamp at 1e-9)."""
    m = mask.astype(h.dtype)[..., None]  # [b, s, 1]
    return (h * m).sum(axis=1) / jnp.maximum(m.sum(axis=1), jnp.asarray(1e-9, h.dtype))


def _l2_normalize(x: Any) -> Any:
    """``x / max(||x||_2, 1e-12)`` over the last axis (torch's ``F.normalize``)."""
    norm = jnp.sqrt((x * x).sum(axis=-1, keepdims=True))
    return x / jnp.maximum(norm, jnp.asarray(1e-12, x.dtype))


class BertEmbeddings(Module):
    """``layer_norm(word_embeddings(ids) + position_embeddings(0..seq-1) + token_type_embeddings(0))``.

    ``__call__(input_ids)``: int32 ``[batch, seq]`` -> float ``[batch, seq, hidden]``.
    """

    def __init__(self, config: BertConfig, dtype: DType = DType.float32, device: DeviceRef | None = None):
        super().__init__()
        device = device or DeviceRef.CPU()
        c = config
        self.word_embeddings = Embedding(c.vocab_size, c.hidden_size, dtype, device)
        self.position_embeddings = Embedding(c.max_position_embeddings, c.hidden_size, dtype, device)
        self.token_type_embeddings = Embedding(c.type_vocab_size, c.hidden_size, dtype, device)
        self.layer_norm = LayerNorm(c.hidden_size, [device], dtype, eps=c.layer_norm_eps, use_bias=True)

    def __call__(self, input_ids: Any) -> Any:
        seq = input_ids.shape[1]
        positions = ops.unsqueeze(ops.range(0, seq, 1, dtype=DType.int32), 0)  # [1, seq]
        types = ops.broadcast_to(literal_constant(0, DType.int32), [1, 1])  # [1, 1]: every token is segment A
        h = self.word_embeddings(input_ids) + self.position_embeddings(positions)  # [b, seq, hidden]
        return self.layer_norm(h + self.token_type_embeddings(types))


class BertLayer(PostNormTransformerBlock):
    """One BERT encoder block: a :class:`~maxjax.nn.PostNormTransformerBlock` of
    :class:`~maxjax.nn.MultiheadAttention` (q/k/v/o with biases, bidirectional, padding mask),
    :class:`~maxjax.nn.FeedForward` (``hidden_act``, exact erf GELU for BERT) and two
    :class:`~maxjax.nn.LayerNorm` with biases.

    ``__call__(x, attention_mask)``: x float ``[batch, seq, hidden]``, attention_mask int32
    ``[batch, seq]`` (1: a token, 0: padding) -> ``[batch, seq, hidden]``.
    """

    def __init__(self, config: BertConfig, dtype: DType = DType.float32, device: DeviceRef | None = None):
        device = device or DeviceRef.CPU()
        c = config
        super().__init__(
            attention=MultiheadAttention(
                c.num_attention_heads, c.hidden_size, [device], dtype, qkv_has_bias=True, o_proj_has_bias=True
            ),
            mlp=FeedForward(dtype, device, c.hidden_size, c.intermediate_size, c.hidden_act, has_bias=True),
            attention_norm=LayerNorm(c.hidden_size, [device], dtype, eps=c.layer_norm_eps, use_bias=True),
            mlp_norm=LayerNorm(c.hidden_size, [device], dtype, eps=c.layer_norm_eps, use_bias=True),
        )


class BertModel(Module):
    """The BERT encoder with sentence-transformers' pooling head.

    ``__call__(input_ids, attention_mask)``: int32 ``[batch, seq]`` each (mask 1 for tokens, 0 for
    padding; rows right-padded) -> float32 ``[batch, hidden]`` sentence embeddings (pooled as
    ``head.pooling`` says, L2-normalised when ``head.normalize``). With
    ``return_hidden_states=True``, ``(embeddings, hidden [batch, seq, hidden])``.
    """

    def __init__(
        self, config: BertConfig, head: SentenceHead, dtype: DType = DType.float32, device: DeviceRef | None = None
    ):
        super().__init__()
        self.config, self.head, self.dtype = config, head, dtype
        self.embeddings = BertEmbeddings(config, dtype, device)
        self.encoder = Module()
        self.encoder.layer = LayerList([BertLayer(config, dtype, device) for _ in range(config.num_hidden_layers)])

    def __call__(self, input_ids: Any, attention_mask: Any, *, return_hidden_states: bool = False) -> Any:
        h = self.embeddings(input_ids)  # [b, s, hidden]
        layers = self.encoder.layer
        block = layers[0].build_subgraph("bert_layer", [h.type, attention_mask.type], weight_prefix="encoder.layer.0.")
        for i in range(len(layers)):
            h = ops.call(block, h, attention_mask, prefix=f"encoder.layer.{i}.")[0].tensor  # [b, s, hidden]
        if self.head.pooling == "cls":
            pooled = h[:, 0]  # [b, hidden]
        else:
            pooled = ops.apply(_mean_pool, h, attention_mask, _name="mean_pool")  # [b, hidden]
        pooled = ops.cast(pooled, DType.float32)
        if self.head.normalize:
            pooled = ops.apply(_l2_normalize, pooled, _name="l2_normalize")
        return (pooled, h) if return_hidden_states else pooled


def build_bert(
    config: BertConfig, head: SentenceHead, dtype: DType = DType.float32, device: DeviceRef | None = None
) -> BertModel:
    """A :class:`BertModel` for ``config`` and ``head`` with unloaded weights."""
    return BertModel(config, head, dtype, device)
