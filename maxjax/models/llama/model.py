"""The Llama decoder (SmolLM2, Llama 2/3, ...) assembled from ``maxjax.nn`` layers.

:class:`LlamaForCausalLM` runs its layers MAX's way: one subgraph built from layer 0
(``build_subgraph``), called once per layer with ``ops.call(..., prefix="layers.{i}.")``. In a
graph, that chain is lowered to one ``lax.scan`` (``maxjax.graph.scan``), so the model compiles
as one layer whatever its depth. Weight names are Hugging Face's without the ``model.`` prefix
(``layers.N.self_attn.q_proj.weight``, ...).
"""

from __future__ import annotations

from typing import Any

from maxjax.dtype import DType
from maxjax.graph import DeviceRef, ShardingStrategy, ops
from maxjax.graph.ops.shape import literal_constant
from maxjax.models.llama.config import LlamaConfig
from maxjax.nn import MLP, AttentionWithRope, Embedding, LayerList, Linear, Module, RMSNorm, RotaryEmbedding, TransformerBlock
from maxjax.nn.kv_cache import DenseKVCacheValues, MHAKVCacheParams

__all__ = ["LlamaDecoderLayer", "LlamaForCausalLM", "build_llama"]


class LlamaDecoderLayer(TransformerBlock):
    """MAX's :class:`~maxjax.nn.TransformerBlock` (same constructor, children and weight names)
    over maxjax's dense KV cache, called in the functional form that a scanned chain of layers
    needs: the updated caches are outputs.

    ``__call__(x, k_cache, v_cache, layer_idx, positions) -> (out, k_cache, v_cache)``:
        x ``[batch, seq, hidden]``; caches as :class:`~maxjax.nn.kv_cache.DenseKVCacheValues`;
        layer_idx a scalar int32; positions int32 ``[batch, seq]``.
    ``__call__(x, freqs_cis) -> (out,)``: whole sequences at positions ``0 .. seq - 1`` over their
        own keys and values, no cache (training and scoring); freqs_cis float32 ``[seq,
        head_dim]``, MAX's rope table rows of those positions.

    Either way the first output is the block's hidden states (what a layer hook reads as ``out[0]``).
    """

    def __call__(self, x: Any, *args: Any) -> Any:
        if len(args) == 1:
            return (self._forward(None, x, DenseKVCacheValues(None, None, None), args[0], None),)
        k_cache, v_cache, layer_idx, positions = args
        cache = DenseKVCacheValues(k_cache, v_cache, positions)
        out = self._forward(layer_idx, x, cache, None, None)
        return out, cache.k_cache, cache.v_cache


class LlamaForCausalLM(Module):
    """A Llama decoder with a KV cache: token embedding, decoder layers, final norm and output head
    (Hugging Face's ``LlamaForCausalLM``).

    Weight names: ``embed_tokens.weight``, ``layers.N.*``, ``norm.weight``, ``lm_head.weight``
    (with ``tie_word_embeddings`` the head shares ``embed_tokens.weight`` via
    ``set_shared_weight`` and has no key of its own).

    ``__call__(tokens, positions, k_cache, v_cache, last_index)`` (serving, what ``CausalLM`` runs):
        tokens, positions int32 ``[batch, seq]``; k_cache ``[n_layers, batch, n_kv, head_dim, max_seq]``,
        v_cache ``[n_layers, batch, n_kv, max_seq, head_dim]`` (see :mod:`maxjax.nn.attention`);
        last_index int32 ``[batch]``: which position's logits to return for each row.
        Returns ``(logits float32 [batch, vocab], k_cache, v_cache)``; with ``last_index=None``
        the logits of every position, ``[batch, seq, vocab]``.

    ``__call__(tokens)`` (training and scoring, Hugging Face's ``model(input_ids).logits``):
        whole sequences from position 0, no cache kept: returns ``logits float32 [batch, seq,
        vocab]``, where position ``t`` scores token ``t + 1``; so a next-token loss is
        ``cross_entropy(logits[:, :-1], tokens[:, 1:])``. The layers still run as one scanned
        subgraph, each attending over the sequence's own keys and values (no cache is built).

    ``return_hidden_states=True`` (either form) also returns the final hidden states, float
    ``[batch, seq, hidden]`` after the final norm (what the head reads; Hugging Face's
    ``hidden_states[-1]``), as the last element. Per-layer outputs are what layer hooks see
    (in eager mode every layer's; see :func:`maxjax.nn.layer.add_layer_hook`).

    Raises:
        ValueError: caches or positions given without the others.
    """

    def __init__(
        self,
        embed_tokens: Embedding,
        layers: list[LlamaDecoderLayer],
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

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``tensor_parallel(n)``: every decoder layer tensor parallel (attention heads in whole KV
        groups, MLP gate/up by rows and down by columns), the token embedding and the output head
        split over the vocabulary, the final norm replicated; ``replicate(n)``: every weight
        replicated. Then ``module.to(mesh, axis=...)`` places the weights.

        Raises:
            ValueError: (setting) another strategy.
        """
        return getattr(self, "_sharding_strategy", None)

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        n = strategy.num_devices
        if strategy.is_tensor_parallel:
            for layer in self.layers:
                layer.sharding_strategy = strategy
            self.embed_tokens.sharding_strategy = ShardingStrategy.rowwise(n)
            self.lm_head.weight.sharding_strategy = ShardingStrategy.rowwise(n)  # the embedding itself when tied
        elif strategy.is_replicate:
            for layer in self.layers:
                layer.sharding_strategy = strategy
            self.embed_tokens.sharding_strategy = strategy
            self.lm_head.weight.sharding_strategy = strategy
        else:
            raise ValueError(f"Unsupported sharding strategy for LlamaForCausalLM: {strategy}")
        self.norm.sharding_strategy = ShardingStrategy.replicate(n)
        self._sharding_strategy = strategy

    @property
    def kv_cache_heads(self) -> int:
        """KV heads of the cache: the model's, or on a mesh with KV groups that do not divide
        evenly, the padded count its attention runs over."""
        attn = self.layers[0].self_attn
        return int(attn._heads(attn.k_proj))

    def __call__(
        self,
        tokens: Any,
        positions: Any = None,
        k_cache: Any = None,
        v_cache: Any = None,
        last_index: Any = None,
        *,
        return_hidden_states: bool = False,
    ) -> Any:
        given = [x is not None for x in (positions, k_cache, v_cache)]
        if any(given) and not all(given):
            raise ValueError(
                "LlamaForCausalLM: pass tokens alone (whole sequences, every position's logits) or tokens, positions, "
                "k_cache and v_cache together"
            )
        whole = not any(given)
        h = self.embed_tokens(tokens)
        if h.dtype != self.dtype:
            h = ops.cast(h, self.dtype)
        if whole:  # positions 0..seq-1; each layer attends over the sequence's own keys and values
            freqs = self.layers[0].self_attn.rope.table_rows(tokens.shape[1])  # [seq, head_dim]: one table for every layer
            block = self.layers[0].build_subgraph("decoder_layer_whole", [h.type, freqs.type], weight_prefix="layers.0.")
            for i in range(len(self.layers)):
                h = ops.call(block, h, freqs, prefix=f"layers.{i}.")[0].tensor
        else:
            block = self.layers[0].build_subgraph(
                "decoder_layer",
                [h.type, k_cache.type, v_cache.type, literal_constant(0, DType.int32).type, positions.type],
                weight_prefix="layers.0.",
            )
            for i in range(len(self.layers)):
                layer_idx = literal_constant(i, DType.int32)
                h, k_cache, v_cache = (
                    v.tensor for v in ops.call(block, h, k_cache, v_cache, layer_idx, positions, prefix=f"layers.{i}.")
                )
        h = self.norm(h)
        if last_index is not None:
            last = ops.gather_nd(h, ops.unsqueeze(ops.cast(last_index, DType.int32), -1), batch_dims=1)  # [batch, hidden]
            logits = ops.cast(self.lm_head(last), DType.float32)
        else:
            logits = ops.cast(self.lm_head(h), DType.float32)
        out = (logits,) if whole else (logits, k_cache, v_cache)
        if return_hidden_states:
            out = (*out, h)
        return out[0] if len(out) == 1 else out

def build_llama(
    config: LlamaConfig, dtype: DType = DType.float32, device: DeviceRef | None = None, weights_dtype: DType = DType.float32
) -> LlamaForCausalLM:
    """A :class:`LlamaForCausalLM` for ``config`` with unloaded weights.

    ``dtype`` is the activations' and KV cache's DType, ``weights_dtype`` the float weights' (a
    Hugging Face checkpoint loads its weights in ``dtype``: bfloat16 ones then stay bfloat16, as
    MAX's Llama runs them; a GGUF's float tensors are float32). Quantized checkpoints load with
    ``load_state_dict(..., override_quantization_encoding=True)``: each weight takes the packed
    dtype, shape and encoding of its value.
    """
    w = weights_dtype
    device = device or DeviceRef.CPU()
    c = config
    rope = RotaryEmbedding(
        c.hidden_size, c.num_attention_heads, c.rope_theta, c.max_position_embeddings, head_dim=c.head_dim, interleaved=False
    )
    kv_params = MHAKVCacheParams(
        dtype, c.head_dim, c.num_hidden_layers, [device], n_kv_heads=c.num_key_value_heads
    )
    layers = []
    for _ in range(c.num_hidden_layers):
        attn = AttentionWithRope(
            rope=rope,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads,
            hidden_size=c.hidden_size,
            kv_params=kv_params,
            devices=[device],
            dtype=w,
        )
        mlp = MLP(w, None, c.hidden_size, c.intermediate_size, [device])
        layers.append(
            LlamaDecoderLayer(
                attention=attn,
                mlp=mlp,
                attention_norm=RMSNorm(c.hidden_size, w, c.rms_norm_eps, multiply_before_cast=False, device=device),
                mlp_norm=RMSNorm(c.hidden_size, w, c.rms_norm_eps, multiply_before_cast=False, device=device),
            )
        )
    return LlamaForCausalLM(
        Embedding(c.vocab_size, c.hidden_size, w, device),
        layers,
        RMSNorm(c.hidden_size, w, c.rms_norm_eps, multiply_before_cast=False, device=device),
        Linear(c.hidden_size, c.vocab_size, w, device),
        tie_word_embeddings=c.tie_word_embeddings,
        dtype=dtype,
    )
