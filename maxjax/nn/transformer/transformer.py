"""``TransformerBlock`` and ``Transformer`` (MAX's ``max/nn/transformer/transformer.py``): a
pre-norm decoder block and the decoder stack over a KV cache, with MAX's constructors and calls.

A block runs ``h = x + r * attn(attention_norm(x)); out = h + r * mlp(mlp_norm(h))`` (``r`` the
``residual_multiplier``). ``Transformer.__call__(tokens, kv_collection, return_n_logits,
input_row_offsets)`` takes MAX's ragged batch (``tokens [total_seq_len]``, ``input_row_offsets
[batch + 1]``) over a paged cache and returns the logits ``ReturnLogits`` asks for.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Sequence

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.ops.shape import literal_constant
from maxjax.graph.sharding import ShardingStrategy
from maxjax.nn.layer import LayerList, Module

__all__ = [
    "ReturnHiddenStates", "ReturnLogits", "Transformer", "TransformerBlock", "forward_sequential_layers",
    "logits_postprocess",
]  # fmt: skip


class TransformerBlock(Module):
    """MAX's decoder block (children ``self_attn``, ``mlp``, ``input_layernorm``,
    ``post_attention_layernorm``: MAX's weight names).

    ``__call__(layer_idx, x, kv_collection, freqs_cis=None, input_row_offsets=None)``: as the
    attention's call (see :class:`~maxjax.nn.attention.AttentionWithRope`); returns ``x``'s shape.
    """

    def __init__(self, attention: Module, mlp: Any, attention_norm: Any, mlp_norm: Any, residual_multiplier: float = 1.0) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = attention_norm
        self.post_attention_layernorm = mlp_norm
        self.residual_multiplier = residual_multiplier
        self._sharding_strategy: ShardingStrategy | None = None

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``tensor_parallel`` (attention and MLP tensor parallel, norms replicated) or ``replicate``.

        Raises:
            ValueError: (setting) another strategy.
        """
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not (strategy.is_tensor_parallel or strategy.is_replicate):
            raise ValueError(f"Unsupported sharding strategy for TransformerBlock: {strategy}")
        self.self_attn.sharding_strategy = strategy
        self.mlp.sharding_strategy = strategy
        for norm in (self.input_layernorm, self.post_attention_layernorm):
            norm.sharding_strategy = ShardingStrategy.replicate(strategy.num_devices)
        self._sharding_strategy = strategy

    def __call__(self, layer_idx: Any, x: Any, kv_collection: Any, freqs_cis: Any = None, input_row_offsets: Any = None) -> Any:
        return self._forward(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)

    def _forward(self, layer_idx: Any, x: Any, kv_collection: Any, freqs_cis: Any, input_row_offsets: Any) -> Any:
        """The block's computation (``__call__`` without the layer hooks, for subclasses that
        call it from a call of their own)."""
        attn = self.self_attn(
            layer_idx, self.input_layernorm(x), kv_collection, freqs_cis=freqs_cis, input_row_offsets=input_row_offsets
        )
        if self.residual_multiplier != 1.0:
            attn = attn * literal_constant(self.residual_multiplier, x.dtype)
        h = x + attn
        mlp = self.mlp(self.post_attention_layernorm(h))
        if self.residual_multiplier != 1.0:
            mlp = mlp * literal_constant(self.residual_multiplier, x.dtype)
        return h + mlp


class ReturnLogits(str, Enum):
    """Which logits a model returns per sequence (MAX's enum)."""

    LAST_TOKEN = "last_token"
    VARIABLE = "variable"
    ALL = "all"


class ReturnHiddenStates(str, Enum):
    """Which hidden states a model returns (MAX's enum)."""

    NONE = "none"
    LAST = "last"
    LAST_PER_DEVICE = "last_per_device"
    ALL_NORMALIZED = "all_normalized"
    ALL = "all"
    SELECTED_LAYERS = "selected_layers"


def logits_postprocess(
    h: Any,
    input_row_offsets: Any,
    return_n_logits: Any,
    norm: Callable[[Any], Any],
    lm_head: Callable[[Any], Any],
    return_logits: ReturnLogits,
    return_hidden_states: ReturnHiddenStates = ReturnHiddenStates.NONE,
    logits_scaling: float = 1.0,
    capture_hidden_states: list[list[Any]] | None = None,
) -> tuple[Any, ...]:
    """MAX's single-device logits step: the last token of each sequence through ``norm`` and
    ``lm_head`` (float32 ``[batch, vocab]``), with ``ALL`` also every token's logits
    ``[total_seq_len, vocab]`` and the offsets; hidden states appended as asked.

    Raises:
        NotImplementedError: ``ReturnLogits.VARIABLE`` (its output length is a run-time value,
            which a JAX program cannot have), or hidden-state modes other than NONE, LAST, ALL,
            ALL_NORMALIZED and SELECTED_LAYERS.
    """
    return_logits, return_hidden_states = ReturnLogits(return_logits), ReturnHiddenStates(return_hidden_states)
    if return_logits == ReturnLogits.VARIABLE:
        raise NotImplementedError(
            "ReturnLogits.VARIABLE: the number of logits is a run-time input (return_n_logits) and JAX programs have "
            "static shapes; use LAST_TOKEN or ALL"
        )
    last_index = ops.cast(input_row_offsets[1:], DType.int32) - 1  # [batch]
    last_h = ops.gather(h, last_index, axis=0)  # [batch, hidden]
    last_logits = ops.cast(lm_head(norm(last_h)), DType.float32)  # [batch, vocab]
    out: tuple[Any, ...] = (last_logits,)
    if return_logits == ReturnLogits.ALL:
        logits = ops.cast(lm_head(norm(h)), DType.float32)  # [total, vocab]
        out = (last_logits, logits, input_row_offsets)
    if logits_scaling != 1.0:
        out = tuple(v / logits_scaling if i < 2 else v for i, v in enumerate(out))
    if return_hidden_states == ReturnHiddenStates.NONE:
        return out
    if return_hidden_states == ReturnHiddenStates.LAST:
        return (*out, last_h)
    if return_hidden_states == ReturnHiddenStates.ALL:
        return (*out, h)
    if return_hidden_states == ReturnHiddenStates.ALL_NORMALIZED:
        return (*out, norm(h))
    if return_hidden_states == ReturnHiddenStates.SELECTED_LAYERS:
        captured = [c[0] for c in capture_hidden_states or []]
        return (*out, captured[0] if len(captured) == 1 else ops.concat(captured, -1))
    raise NotImplementedError(f"return_hidden_states={return_hidden_states!r}: not supported by maxjax (one device)")


def forward_sequential_layers(
    layers: Sequence[Module],
    *,
    inputs_for_layer: Callable[[int, list[Any]], Sequence[Any]],
    initial_hidden_states: list[Any],
    on_layer_output: Callable[[int, list[Any]], None] | None = None,
    subgraph_layer_groups: list[list[int]] | None = None,
    name_for_subgraph: Callable[[int], str] = lambda i: f"transformer_block_{i}",
    weight_prefix_for_layer: Callable[[int], str] | None = None,
    layer_ids: Sequence[int] | None = None,
) -> list[Any]:
    """MAX's layer loop: each layer called on ``inputs_for_layer(i, h)``, or, for the layers of a
    group in ``subgraph_layer_groups``, through one subgraph per group built from its first layer
    (``build_subgraph``) and ``ops.call(..., prefix=weight_prefix_for_layer(i))`` (in a graph, a
    chain of such calls runs as one ``lax.scan``).

    Returns:
        the last layer's outputs, as a list.

    Raises:
        ValueError: subgraph groups without ``weight_prefix_for_layer``, or a group index not among
            the layer ids.
    """
    ids = list(range(len(layers))) if layer_ids is None else list(layer_ids)
    group_of: dict[int, int] = {}
    for g, group in enumerate(subgraph_layer_groups or []):
        if weight_prefix_for_layer is None:
            raise ValueError("forward_sequential_layers: weight_prefix_for_layer is required when using subgraphs")
        for i in group:
            if i not in ids:
                raise ValueError(f"forward_sequential_layers: layer index {i} is not among the layer ids {ids}")
            group_of[i] = g
    subgraphs: dict[int, Any] = {}
    h = list(initial_hidden_states)
    for i, layer in zip(ids, layers, strict=True):
        values = inputs_for_layer(i, h)
        if i in group_of:
            g = group_of[i]
            if g not in subgraphs:
                subgraphs[g] = layer.build_subgraph(name_for_subgraph(g), inputs=list(values), weight_prefix=weight_prefix_for_layer(i))
            import jax

            flat = jax.tree.leaves(list(values))
            h = [v.tensor for v in ops.call(subgraphs[g], *flat, prefix=weight_prefix_for_layer(i))]
        else:
            out = layer(*values)
            h = list(out) if isinstance(out, (list, tuple)) else [out]
        if on_layer_output is not None:
            on_layer_output(i, h)
    return h


class Transformer(Module):
    """MAX's decoder stack (weight names ``embed_tokens``, ``layers.N``, ``norm``, ``lm_head``).

    Args: as MAX's (``dim``, ``n_heads``, ``layers``, ``norm``, ``output`` (the head),
        ``embedding``, ``kv_params``, ``rope``, ``return_logits``, ``return_hidden_states``,
        ``embedding_multiplier``, ``logits_scaling``, ``target_layer_ids``).

    ``__call__(tokens, kv_collection, return_n_logits, input_row_offsets, hidden_states=None)``:
        tokens int ``[total_seq_len]``; kv_collection a paged
        :class:`~maxjax.nn.kv_cache.KVCacheInputsPerDevice` (its ``kv_blocks`` updated);
        return_n_logits int ``[1]``; input_row_offsets uint32 ``[batch + 1]``. Returns
        ``(last_logits float32 [batch, vocab], ...)`` as :func:`logits_postprocess`.

    Raises:
        ValueError: a ``target_layer_ids`` entry out of range.
        NotImplementedError: ``hidden_states`` given (draft-model input).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        layers: list[Any],
        norm: Any,
        output: Any,
        embedding: Any,
        kv_params: Any,
        rope: Any,
        return_logits: ReturnLogits = ReturnLogits.LAST_TOKEN,
        return_hidden_states: ReturnHiddenStates = ReturnHiddenStates.NONE,
        embedding_multiplier: float = 1.0,
        logits_scaling: float = 1.0,
        target_layer_ids: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.dim, self.n_heads = dim, n_heads
        self.layers = LayerList(layers)
        self.norm = norm
        self.lm_head = output
        self.embed_tokens = embedding
        self.kv_params = kv_params
        self.rope = rope
        self.return_logits = ReturnLogits(return_logits)
        self.return_hidden_states = ReturnHiddenStates(return_hidden_states)
        self.embedding_multiplier = embedding_multiplier
        self.logits_scaling = logits_scaling
        self.target_layer_ids = list(target_layer_ids) if target_layer_ids else None
        for pos, layer_id in enumerate(self.target_layer_ids or []):
            if not 0 <= layer_id < len(layers):
                raise ValueError(
                    f"target_layer_ids[{pos}]={layer_id} is out of range [0, {len(layers)}) for a transformer with "
                    f"{len(layers)} layers."
                )

    def __call__(
        self, tokens: Any, kv_collection: Any, return_n_logits: Any, input_row_offsets: Any, hidden_states: Any = None
    ) -> tuple[Any, ...]:
        if hidden_states is not None:
            raise NotImplementedError("Transformer(hidden_states=...): draft-model hidden-state inputs are not supported")
        h = self.embed_tokens(tokens)  # [total, dim]
        if self.embedding_multiplier != 1.0:
            h = h * literal_constant(float(self.embedding_multiplier), h.dtype)
        freqs_cis = self.rope.freqs_cis
        capture = set(self.target_layer_ids or []) if self.return_hidden_states == ReturnHiddenStates.SELECTED_LAYERS else set()
        captured: list[list[Any]] = []
        for idx, layer in enumerate(self.layers):
            h = layer(literal_constant(idx, DType.uint32), h, kv_collection, freqs_cis=freqs_cis, input_row_offsets=input_row_offsets)
            if idx in capture:
                captured.append([h])
        return logits_postprocess(
            h, input_row_offsets, return_n_logits, self.norm, self.lm_head, self.return_logits,
            self.return_hidden_states, self.logits_scaling, captured or None,
        )  # fmt: skip
