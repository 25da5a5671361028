"""``TransformerBlock`` and ``Transformer``: a pre-norm decoder (Llama) with a KV cache.

``Transformer`` runs its layers MAX's way: one subgraph built from layer 0
(``build_subgraph``), called once per layer with ``ops.call(..., prefix="layers.{i}.")``. In a
graph, that chain is lowered to one ``lax.scan`` (``maxjax.graph.scan``), so the model compiles
as one layer whatever its depth.
"""

from __future__ import annotations

from typing import Any

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.nn.attention import AttentionWithRope
from maxjax.nn.embedding import Embedding
from maxjax.nn.layer import LayerList, Module
from maxjax.nn.linear import MLP, Linear
from maxjax.nn.norm import RMSNorm

__all__ = ["TransformerBlock", "Transformer"]


class TransformerBlock(Module):
    """``h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h))``.

    ``__call__(x, k_cache, v_cache, layer_idx, positions) -> (out, k_cache, v_cache)`` (see
    :class:`~maxjax.nn.attention.AttentionWithRope` for shapes).
    """

    def __init__(self, attention: AttentionWithRope, mlp: MLP, input_layernorm: RMSNorm, post_attention_layernorm: RMSNorm):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = post_attention_layernorm

    def __call__(self, x: Any, k_cache: Any, v_cache: Any, layer_idx: Any, positions: Any) -> tuple[Any, Any, Any]:
        attn, k_cache, v_cache = self.self_attn(self.input_layernorm(x), k_cache, v_cache, layer_idx, positions)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k_cache, v_cache


class Transformer(Module):
    """Token embedding, decoder layers, final norm and output head.

    Weight names: ``embed_tokens.weight``, ``layers.N.*``, ``norm.weight``, ``lm_head.weight``
    (with ``tie_word_embeddings`` the head shares ``embed_tokens.weight`` via
    ``set_shared_weight`` and has no key of its own).

    ``__call__(tokens, positions, k_cache, v_cache, last_index)``:
        tokens, positions int32 ``[batch, seq]``; k_cache ``[n_layers, batch, n_kv, head_dim, max_seq]``,
        v_cache ``[n_layers, batch, n_kv, max_seq, head_dim]`` (see :mod:`maxjax.nn.attention`);
        last_index int32 ``[batch]``: which position's logits to return for each row.
        Returns ``(logits float32 [batch, vocab], k_cache, v_cache)``.
    """

    def __init__(
        self,
        embed_tokens: Embedding,
        layers: list[TransformerBlock],
        norm: RMSNorm,
        lm_head: Linear,
        tie_word_embeddings: bool = False,
        dtype: DType = DType.float32,
    ):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = LayerList(layers)
        self.norm = norm
        self.lm_head = lm_head
        self.dtype = dtype
        if tie_word_embeddings:
            lm_head.set_shared_weight("weight", embed_tokens.weight)

    def __call__(self, tokens: Any, positions: Any, k_cache: Any, v_cache: Any, last_index: Any) -> tuple[Any, Any, Any]:
        h = self.embed_tokens(tokens)
        if h.dtype != self.dtype:
            h = ops.cast(h, self.dtype)
        layer_idx = [ops.constant(i, DType.int32) for i in range(len(self.layers))]
        block = self.layers[0].build_subgraph(
            "decoder_layer",
            [h.type, k_cache.type, v_cache.type, layer_idx[0].type, positions.type],
            weight_prefix="layers.0.",
        )
        for i in range(len(self.layers)):
            h, k_cache, v_cache = (
                v.tensor for v in ops.call(block, h, k_cache, v_cache, layer_idx[i], positions, prefix=f"layers.{i}.")
            )
        h = self.norm(h)
        last = ops.gather_nd(h, ops.unsqueeze(ops.cast(last_index, DType.int32), -1), batch_dims=1)  # [batch, hidden]
        logits = ops.cast(self.lm_head(last), DType.float32)
        return logits, k_cache, v_cache
