"""``DistributedTransformerBlock`` and ``DistributedTransformer`` (MAX's
``max/nn/transformer/distributed_transformer.py``): MAX's tensor-parallel decoder, written per
device: every hidden state is a list with one ``[total_seq_len, hidden]`` value per device (all
equal), the attention (:class:`~maxjax.nn.attention.TensorParallelAttentionWithRope`) and the
MLP hold a slice of the heads / of the hidden layer on each device, and an allreduce after
``o_proj`` and after the MLP's ``down_proj`` adds the devices' partial sums.

The numbers are those of the single-device :class:`~maxjax.nn.transformer.Transformer` with the
same weights (same state-dict keys: ``embed_tokens``, ``layers.N.self_attn``, ``layers.N.mlp``,
``layers.N.input_layernorm``, ``layers.N.post_attention_layernorm``, ``norm``, ``lm_head``); the
per-device layers are views of those weights and are not registered.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.sharding import ShardingStrategy
from maxjax.graph.type import DeviceRef
from maxjax.nn.attention.attention_with_rope import _place_on_devices
from maxjax.nn.comm import Allreduce
from maxjax.nn.layer import LayerList, Module
from maxjax.nn.transformer.transformer import ReturnHiddenStates, ReturnLogits, forward_sequential_layers

__all__ = [
    "DistributedLogitsPostprocessMixin", "DistributedTransformer", "DistributedTransformerBlock",
    "distributed_logits_postprocess", "forward_sharded_layers",
]  # fmt: skip


def forward_sharded_layers(layers: Sequence[Callable[[Any], Any]], xs: Sequence[Any]) -> list[Any]:
    """``[layers[i](xs[i]) for each device i]`` (MAX's ``forward_sharded_layers``).

    Raises:
        ValueError: not one input per layer.
    """
    if len(xs) != len(layers):
        raise ValueError(f"Number of layers ({len(layers)}) must match number of inputs ({len(xs)})")
    return [layer(x) for layer, x in zip(layers, xs)]


def _shard_replicated(module: Any, devices: Sequence[DeviceRef]) -> list[Any]:
    """``module`` (a norm) replicated on each device: ``replicate`` strategy, then ``shard``."""
    module.sharding_strategy = ShardingStrategy.replicate(len(devices))
    return module.shard(devices)


def distributed_logits_postprocess(
    h: Sequence[Any],
    input_row_offsets: Sequence[Any],
    return_n_logits: Any,
    lm_head: Callable[[list[Any], Sequence[Any]], Sequence[Any]],
    signal_buffers: Sequence[Any],
    return_logits: ReturnLogits,
    device: DeviceRef,
    norm_shards: Sequence[Callable[[Any], Any]] | None = None,
    return_hidden_states: ReturnHiddenStates = ReturnHiddenStates.NONE,
    logits_scaling: float = 1.0,
    logit_softcapping: float | None = None,
    capture_hidden_states: list[list[Any]] | None = None,
) -> tuple[Any, ...]:
    """MAX's logits step of a per-device model: each device's last token of every sequence
    (``h[i]`` gathered at ``input_row_offsets[i][1:] - 1``) through its norm and ``lm_head``
    (which takes the per-device list and the signal buffers); device 0's result, float32
    ``[batch, vocab]``. ``ALL`` adds every token's logits ``[total_seq_len, vocab]`` and device 0's
    offsets. Then ``/ logits_scaling``, ``cap * tanh(logits / cap)`` with ``logit_softcapping``, and
    the hidden states ``return_hidden_states`` asks for (MAX's ``extract_hs``: ``LAST`` device 0's
    last-token states, ``LAST_PER_DEVICE`` / ``ALL`` / ``ALL_NORMALIZED`` one per device,
    ``SELECTED_LAYERS`` every capture, device-major).

    Raises:
        NotImplementedError: ``ReturnLogits.VARIABLE`` (a run-time output length; see
            :func:`~maxjax.nn.transformer.logits_postprocess`).
        ValueError: ``SELECTED_LAYERS`` with no captures.
    """
    return_logits, return_hidden_states = ReturnLogits(return_logits), ReturnHiddenStates(return_hidden_states)
    if return_logits == ReturnLogits.VARIABLE:
        raise NotImplementedError(
            "ReturnLogits.VARIABLE: the number of logits is a run-time input (return_n_logits) and JAX programs have "
            "static shapes; use LAST_TOKEN or ALL"
        )

    def maybe_norm(xs: Sequence[Any]) -> list[Any]:
        return forward_sharded_layers(norm_shards, xs) if norm_shards is not None else list(xs)

    last_h = [
        ops.gather(hi, ops.cast(offsets[1:], DType.int32) - 1, axis=0)  # [batch, hidden]
        for hi, offsets in zip(h, input_row_offsets, strict=True)
    ]
    last_logits = ops.cast(lm_head(maybe_norm(last_h), signal_buffers)[0], DType.float32)  # [batch, vocab]
    logits = offsets_out = None
    if return_logits == ReturnLogits.ALL and h:
        logits = ops.cast(lm_head(maybe_norm(h), signal_buffers)[0], DType.float32)  # [total, vocab]
        offsets_out = input_row_offsets[0]
    if logits_scaling != 1.0:
        last_logits = last_logits / logits_scaling
        logits = None if logits is None else logits / logits_scaling
    if logit_softcapping is not None:
        cap = float(logit_softcapping)
        last_logits = ops.tanh(last_logits / cap) * cap
        logits = None if logits is None else ops.tanh(logits / cap) * cap
    out: tuple[Any, ...] = (last_logits,) if logits is None else (last_logits, logits, offsets_out)
    if return_hidden_states == ReturnHiddenStates.LAST:
        return (*out, last_h[0])
    if return_hidden_states == ReturnHiddenStates.LAST_PER_DEVICE:
        return (*out, *last_h)
    if return_hidden_states == ReturnHiddenStates.ALL:
        return (*out, *h)
    if return_hidden_states == ReturnHiddenStates.ALL_NORMALIZED:
        return (*out, *maybe_norm(h))
    if return_hidden_states == ReturnHiddenStates.SELECTED_LAYERS:
        if not capture_hidden_states:
            raise ValueError("return_hidden_states=SELECTED_LAYERS: no captured hidden states (capture_hidden_states)")
        n = len(capture_hidden_states[0])
        return (*out, *(layer_hs[i] for i in range(n) for layer_hs in capture_hidden_states))
    return out


class DistributedLogitsPostprocessMixin:
    """MAX's mixin giving a per-device model ``_postprocess_logits`` (:func:`distributed_logits_postprocess`
    with the model's ``norm_shards``, ``lm_head``, ``return_logits``, ``devices[0]``,
    ``return_hidden_states``, ``logits_scaling`` and ``logit_softcapping``)."""

    norm_shards: Sequence[Callable[[Any], Any]]
    lm_head: Callable[[list[Any], Sequence[Any]], Sequence[Any]]
    return_logits: ReturnLogits
    devices: list[DeviceRef]
    return_hidden_states: ReturnHiddenStates = ReturnHiddenStates.NONE
    logits_scaling: float = 1.0
    logit_softcapping: float | None = None

    def _postprocess_logits(
        self,
        h: Sequence[Any],
        input_row_offsets: Sequence[Any],
        return_n_logits: Any,
        signal_buffers: Sequence[Any],
        capture_hidden_states: list[list[Any]] | None = None,
    ) -> tuple[Any, ...]:
        return distributed_logits_postprocess(
            h, input_row_offsets, return_n_logits, norm_shards=self.norm_shards, lm_head=self.lm_head,
            signal_buffers=signal_buffers, return_logits=self.return_logits, device=self.devices[0],
            return_hidden_states=self.return_hidden_states, logits_scaling=self.logits_scaling,
            logit_softcapping=self.logit_softcapping, capture_hidden_states=capture_hidden_states,
        )  # fmt: skip


class DistributedTransformerBlock(Module):
    """MAX's per-device pre-norm decoder block: ``h = x + attn(attention_norm(x)); out = h +
    allreduce(mlp(mlp_norm(h)))``, each a list with one ``[total_seq_len, hidden]`` per device.

    Children (MAX's weight names): ``self_attn`` (a per-device attention, e.g.
    :class:`~maxjax.nn.attention.TensorParallelAttentionWithRope`, which does its own allreduce),
    ``mlp`` (given ``ShardingStrategy.tensor_parallel(len(devices))``: gate/up by rows, down by
    columns, so each device's ``down_proj`` gives a partial sum), ``input_layernorm`` and
    ``post_attention_layernorm`` (replicated). The per-device shards (``mlp_shards``,
    ``input_layernorm_shards``, ``post_attention_layernorm_shards``) are views, not registered.

    ``__call__(layer_idx, xs, signal_buffers, kv_collections, freqs_cis, input_row_offsets)``:
        as :class:`~maxjax.nn.attention.TensorParallelAttentionWithRope`'s; returns one
        ``[total_seq_len, hidden]`` per device.

    Raises:
        ValueError: (call) not one hidden state per device; an MLP or norm without the strategy.
    """

    def __init__(
        self, attention: Module, mlp: Any, attention_norm: Any, mlp_norm: Any, devices: list[DeviceRef]
    ) -> None:
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.mlp.sharding_strategy = ShardingStrategy.tensor_parallel(len(devices))
        self.mlp_shards = mlp.shard(devices)
        self.input_layernorm = attention_norm
        self.input_layernorm_shards = _shard_replicated(attention_norm, devices)
        self.post_attention_layernorm = mlp_norm
        self.post_attention_layernorm_shards = _shard_replicated(mlp_norm, devices)
        self.devices = devices
        self.allreduce = Allreduce(num_accelerators=len(devices))
        _place_on_devices(self, devices)

    def __call__(
        self,
        layer_idx: Any,
        xs: list[Any],
        signal_buffers: list[Any],
        kv_collections: list[Any],
        freqs_cis: list[Any],
        input_row_offsets: list[Any],
    ) -> list[Any]:
        if len(xs) != len(self.devices):
            raise ValueError(
                f"DistributedTransformerBlock: expected {len(self.devices)} xs (one per device), got {len(xs)}"
            )
        norm_xs = forward_sharded_layers(self.input_layernorm_shards, xs)
        attn_outs = self.self_attn(
            layer_idx, norm_xs, signal_buffers, kv_collections, freqs_cis=freqs_cis, input_row_offsets=input_row_offsets
        )
        hs = [x + a for x, a in zip(xs, attn_outs, strict=True)]
        norm_outs = forward_sharded_layers(self.post_attention_layernorm_shards, hs)
        mlp_outs = forward_sharded_layers(self.mlp_shards, norm_outs)  # [total, hidden] partial sums
        mlp_outs = self.allreduce(mlp_outs, signal_buffers)  # partial sums of down_proj, added
        return [h + m for h, m in zip(hs, mlp_outs, strict=True)]


class DistributedTransformer(DistributedLogitsPostprocessMixin, Module):
    """MAX's per-device decoder stack (weight names ``embed_tokens``, ``layers.N``, ``norm``,
    ``lm_head``: the single-device :class:`~maxjax.nn.transformer.Transformer`'s).

    Args: MAX's: ``dim``, ``n_heads``, ``layers`` (:class:`DistributedTransformerBlock` s),
        ``norm`` (replicated on each device), ``output`` (a
        :class:`~maxjax.nn.linear.ColumnParallelLinear`), ``embedding`` (a
        :class:`~maxjax.nn.embedding.VocabParallelEmbedding`), ``kv_params``, ``devices``, ``rope``,
        ``return_logits``, ``use_subgraphs`` (False only), ``subgraph_layer_groups`` (default: all
        layers in one group; kept, unused without subgraphs), ``logits_scaling``. With more than one
        device every weight is placed at construction on a mesh of ``devices`` (axis ``"tp"``),
        split by its sharding strategy, so device ``i`` holds MAX's shard ``i``.

    ``__call__(tokens, signal_buffers, kv_collections, return_n_logits, input_row_offsets)``:
        tokens int ``[total_seq_len]``; one signal buffer and one paged
        :class:`~maxjax.nn.kv_cache.KVCacheInputsPerDevice` per device (its ``kv_blocks`` updated);
        return_n_logits int ``[1]``; input_row_offsets uint32 ``[batch + 1]`` (broadcast to every
        device). Returns ``(last_logits float32 [batch, vocab], ...)`` as
        :func:`distributed_logits_postprocess`.

    Raises:
        ValueError: (call) not one signal buffer / KV collection per device.
        NotImplementedError: ``use_subgraphs=True``; ``return_logits=VARIABLE`` (at the call).
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        layers: list[DistributedTransformerBlock],
        norm: Any,
        output: Any,
        embedding: Any,
        kv_params: Any,
        devices: list[DeviceRef],
        rope: Any,
        return_logits: ReturnLogits = ReturnLogits.LAST_TOKEN,
        use_subgraphs: bool = False,
        subgraph_layer_groups: list[list[int]] | None = None,
        logits_scaling: float = 1.0,
    ) -> None:
        if use_subgraphs:
            raise NotImplementedError(
                "DistributedTransformer(use_subgraphs=True): maxjax builds no subgraph of a per-device block (its "
                "per-device KV-cache collections are not subgraph input types); use use_subgraphs=False"
            )
        super().__init__()
        self.dim, self.n_heads = dim, n_heads
        self.layers = LayerList(layers)
        self.norm = norm
        self.norm_shards = _shard_replicated(norm, devices)
        self.lm_head = output
        self.embed_tokens = embedding
        self.kv_params = kv_params
        self.return_logits = ReturnLogits(return_logits)
        self.devices = devices
        self.rope = rope
        self.use_subgraphs = use_subgraphs
        if subgraph_layer_groups is None:
            subgraph_layer_groups = [list(range(len(layers)))]
        self.subgraph_layer_groups = subgraph_layer_groups
        self.logits_scaling = logits_scaling
        _place_on_devices(self, devices)

    def __call__(
        self,
        tokens: Any,
        signal_buffers: list[Any],
        kv_collections: list[Any],
        return_n_logits: Any,
        input_row_offsets: Any,
    ) -> tuple[Any, ...]:
        n = len(self.devices)
        for name, value in (("signal_buffers", signal_buffers), ("kv_collections", kv_collections)):
            if len(value) != n:
                raise ValueError(f"DistributedTransformer: expected {n} {name} (one per device), got {len(value)}")
        h = self.embed_tokens(tokens, signal_buffers)  # [total, dim] per device
        freqs_cis = [ops.transfer_to(self.rope.freqs_cis, d) for d in self.devices]
        offsets = [ops.transfer_to(input_row_offsets, d) for d in self.devices]  # MAX's distributed_broadcast

        def inputs_for_layer(idx: int, h: list[Any]) -> list[Any]:
            layer_idx = ops.constant(idx, DType.uint32, device=DeviceRef.CPU())
            return [layer_idx, h, signal_buffers, kv_collections, freqs_cis, offsets]

        h = forward_sequential_layers(
            list(self.layers),
            inputs_for_layer=inputs_for_layer,
            weight_prefix_for_layer=lambda i: f"layers.{i}.",
            subgraph_layer_groups=self.subgraph_layer_groups if self.use_subgraphs else None,
            name_for_subgraph=lambda g: f"dist_transformer_block_{g}",
            initial_hidden_states=h,
        )
        return self._postprocess_logits(h, offsets, return_n_logits, signal_buffers)
