"""``AttentionWithRope`` (MAX's constructor and call) and ``GGUFQAttentionWithRope``: grouped-query
causal self-attention with rotary embedding over a KV cache of either kind:

- MAX's ragged batch over a paged cache (``kv_collection`` a
  :class:`~maxjax.nn.kv_cache.KVCacheInputsPerDevice`): ``x [total_seq_len, hidden]`` with
  ``input_row_offsets``; see :mod:`maxjax.nn.kernels`.
- maxjax's dense cache of a padded batch (``kv_collection`` a
  :class:`~maxjax.nn.kv_cache.DenseKVCacheValues`): ``x [batch, seq, hidden]``. This is what
  maxjax's engine decodes with on CPU (below).

The dense KV cache of a whole model is two arrays, KV-head-major: keys ``[n_layers, batch, n_kv_heads,
head_dim, max_seq_len]`` and values ``[n_layers, batch, n_kv_heads, max_seq_len, head_dim]``. Keys
are stored transposed so that both attention products read the cache as plain ``[.., k, n]``
right operands (XLA:CPU's matmul library re-lays a transposed right operand on every call). A
layer writes the keys and values of its new tokens at
their positions (``ops.scatter_nd``, in place under ``jax.jit`` with the cache donated) and
attends over the start of the cache rows that holds every position of the batch (a window of 64,
128, ... positions chosen at run time) with the mask ``key_position <= query_position``, so
padded prompts of different lengths share one batch: positions past a sequence's end hold values
nothing attends to until they are overwritten.

References: Vaswani et al., 2017 (attention); Ainslie et al., 2023 (grouped-query attention,
query head ``h`` uses KV head ``h // (n_heads // n_kv_heads)``, as Hugging Face's
``repeat_kv``); Su et al., 2021 (rotary embedding).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.ops import op_traits
from maxjax.graph.sharding import Segment, ShardingStrategy, compute_shard_range
from maxjax.graph.type import DeviceRef
from maxjax.nn.attention.interfaces import DistributedAttentionImpl
from maxjax.nn.attention.mask_config import MHAMaskVariant
from maxjax.nn.comm import Allreduce
from maxjax.nn.kernels import attention_ragged_paged, rope_ragged, store_kv_ragged
from maxjax.nn.kv_cache import DenseKVCacheValues, KVCacheInputsPerDevice, KVCacheParams, read_cache, write_cache
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear
from maxjax.nn.norm import RMSNorm
from maxjax.nn.rotary_embedding import RotaryEmbedding

__all__ = [
    "AttentionWithRope", "GGUFQAttentionWithRope", "GPTQAttentionWithRope", "TensorParallelAttentionWithRope",
    "num_heads_for_device",
]  # fmt: skip


#: the smallest window of keys :func:`_causal_gqa` reads; windows double up to the cache length
MIN_WINDOW = 64


def _windows(max_seq: Any) -> tuple[int, ...]:
    """Key windows for a cache of ``max_seq`` positions: 64, 128, ... and ``max_seq`` itself."""
    if not isinstance(max_seq, int):  # symbolic while a graph infers shapes: one window
        return (max_seq,)
    out, w = [], MIN_WINDOW
    while w < max_seq:
        out.append(w)
        w *= 2
    return (*out, max_seq)


#: the score of a masked key: a large finite negative (as gemma and Equinox use), so a row whose
#: keys are all masked (an empty batch slot, left padding) gives finite values instead of NaN
MASKED = float(np.finfo(np.float32).min)


@op_traits(uses_policy=True)
def _causal_gqa(q: Any, k_cache: Any, v_cache: Any, layer: Any, positions: Any, *, scale: float, policy: Any) -> Any:
    """Causal grouped-query attention of one layer over its cache rows (one op of its own).

    q ``[batch, seq, h, d]``; k_cache ``[n_layers, batch, kv, d, max_seq]``; v_cache ``[n_layers,
    batch, kv, max_seq, d]``; layer a scalar int; positions int ``[batch, seq]``. Key ``j`` is
    visible to a query at position ``p`` when ``j <= p``. Returns ``[batch, seq, h * d]``.

    Only the first ``W`` cache positions are read, for the smallest window ``W`` in 64, 128, 256,
    ..., ``max_seq`` that holds every position of the batch (``lax.switch`` over the windows, so
    one compiled program serves every length): keys past ``W`` are masked for every query, so the
    result is the same as attending over the whole row, and a short sequence in a long cache does
    not pay for the whole cache. Each window is one more copy of the attention to compile.
    """
    windows = _windows(v_cache.shape[3])
    branches = [lambda *a, w=w: _attend(*a, window=w, scale=scale, policy=policy) for w in windows]
    if len(branches) == 1:
        return branches[0](q, k_cache, v_cache, layer, positions)
    needed = jnp.max(positions).astype(jnp.int32) + 1
    index = jnp.sum(jnp.asarray(windows[:-1], jnp.int32) < needed)
    return jax.lax.switch(index, branches, q, k_cache, v_cache, layer, positions)


def _attend(q: Any, k_cache: Any, v_cache: Any, layer: Any, positions: Any, *, window: Any, scale: float, policy: Any) -> Any:
    """:func:`_causal_gqa` over the first ``window`` cache positions."""
    layer = jnp.asarray(layer, jnp.int32)
    keys = jax.lax.dynamic_index_in_dim(k_cache, layer, 0, keepdims=False)[..., :window]  # [b, kv, d, window]
    values = jax.lax.dynamic_index_in_dim(v_cache, layer, 0, keepdims=False)[:, :, :window]  # [b, kv, window, d]
    visible = positions.astype(jnp.int32)[:, :, None] >= jnp.arange(window, dtype=jnp.int32)  # [b, s, window]
    return _gqa(q, keys.astype(q.dtype), values.astype(q.dtype), visible, scale=scale, policy=policy)


@op_traits(uses_policy=True)
def _self_causal_gqa(q: Any, k: Any, v: Any, positions: Any, *, scale: float, policy: Any) -> Any:
    """Causal grouped-query attention of whole sequences over their own keys and values, no cache
    (training and scoring; one op of its own).

    q ``[batch, seq, h, d]``; k, v ``[batch, seq, kv, d]``; positions int ``[batch, seq]``, or None
    for ``0 .. seq - 1`` in every row. Key ``j`` is visible to query ``i`` of the same row when
    ``positions[j] <= positions[i]``. Returns ``[batch, seq, h * d]``: where each row's positions
    are ``0 .. seq - 1`` in any order, the same as writing k and v into an empty cache at
    ``positions`` and calling :func:`_causal_gqa`, without the cache's writes and reads (a cache
    also shows a query its empty slots at earlier positions; here only the row's own keys).
    """
    if positions is None and policy.attends_in_kernel(q, k, v):  # see BackendPolicy.attention_kernel
        from maxjax.backend.kernels.attention import causal_attention

        return causal_attention(q, k, v, scale).reshape(q.shape[0], q.shape[1], -1)  # [b, seq, h * d]
    keys = jnp.transpose(k, (0, 2, 3, 1))  # [b, kv, d, seq]: the cache's key layout
    values = jnp.transpose(v, (0, 2, 1, 3))  # [b, kv, seq, d]
    if positions is None:
        i = jnp.arange(q.shape[1], dtype=jnp.int32)
        visible = jnp.broadcast_to(i[:, None] >= i[None, :], (q.shape[0], q.shape[1], q.shape[1]))
    else:
        p = positions.astype(jnp.int32)
        visible = p[:, :, None] >= p[:, None, :]  # [b, seq (queries), seq (keys)]
    return _gqa(q, keys, values, visible, scale=scale, policy=policy)


def _gqa(q: Any, keys: Any, values: Any, visible: Any, *, scale: float, policy: Any) -> Any:
    """Grouped-query attention of q ``[b, s, h, d]`` over keys ``[b, kv, d, t]`` and values ``[b,
    kv, t, d]`` where ``visible [b, s, t]``; returns ``[b, s, h * d]``.

    Two layouts of the same arithmetic; the backend policy picks one
    (``policy.attention_grouped``): the query heads grouped per KV head, so the KV cache is read
    as it is, or the KV heads repeated per query head (Hugging Face's ``repeat_kv``), which gives
    the output's heads contiguously ``[h, d]``.
    """
    b, s, h, d = q.shape
    kv = keys.shape[1]
    g = h // kv
    if not policy.attention_grouped(b, s, g):
        if g > 1:
            keys, values = jnp.repeat(keys, g, axis=1), jnp.repeat(values, g, axis=1)
        qh = jnp.transpose(q, (0, 2, 1, 3))  # [b, h, s, d]
        scores = policy.matmul(qh, keys) * scale  # [b, h, s, t]
        scores = jnp.where(visible[:, None], scores.astype(jnp.float32), MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        ctx = jnp.transpose(policy.matmul(probs, values), (0, 2, 1, 3))  # [b, s, h, d]
    elif s == 1:
        # one query token per row: the query heads of a KV head form the rows of its dots,
        # [b, kv, g, d] x [b, kv, d, t] -> [b, kv, g, t] (both operands in their stored layout; a
        # [.., t, g] order made XLA:CPU copy the cache and run a slow dot)
        qg = q.reshape(b, kv, g, d)
        scores = policy.einsum("bngd,bndk->bngk", qg, keys) * scale
        scores = jnp.where(visible[:, :, None], scores.astype(jnp.float32), MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        ctx = policy.einsum("bngk,bnkd->bngd", probs, values)
    else:
        qg = q.reshape(b, s, kv, g, d)
        scores = policy.einsum("bsngd,bndk->bngsk", qg, keys) * scale  # [b, kv, g, s, t]
        scores = jnp.where(visible[:, None, None], scores.astype(jnp.float32), MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        ctx = policy.einsum("bngsk,bnkd->bsngd", probs, values)
    return ctx.reshape(b, s, h * d)


def num_heads_for_device(*, num_heads: int, device_idx: int, num_devices: int) -> int:
    """Heads of device ``device_idx`` when ``num_heads`` are split over ``num_devices`` (MAX's
    rule: the first ``num_heads % num_devices`` devices get one more)."""
    base, remainder = divmod(num_heads, num_devices)
    return base + 1 if device_idx < remainder else base


class AttentionWithRope(Module):
    """Causal grouped-query attention with rotary embedding (MAX's ``AttentionWithRope``).

    Weight keys (MAX's): ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (``.weight``, ``.bias``
    on q/k/v with ``has_bias``); with ``stacked_qkv`` one ``qkv_proj.weight [(h + 2 kv) * d,
    hidden]``; with ``use_qk_norm`` also ``q_norm.weight``/``k_norm.weight`` ``[head_dim]``.

    Args (keyword-only, MAX's): rope (the model's rotary embedding); sharding_strategy;
        num_attention_heads; num_key_value_heads (divides num_attention_heads); hidden_size;
        kv_params (``head_dim`` comes from it); devices (the first holds the weights); dtype of
        the projections; linear_cls (called as MAX calls it, with ``in_dim``, ``out_dim``,
        ``dtype``, ``device``, ...); stacked_qkv; scale (default ``1 / sqrt(head_dim)``); has_bias
        (not with stacked_qkv); quant_config (passed to ``linear_cls``); clip_qkv (q/k/v weights
        clamped to ``[-clip_qkv, clip_qkv]``); use_qk_norm, rms_norm_eps (RMSNorm of each head of
        q and k before the rotation); mask_variant (``CAUSAL_MASK`` only); sliding_window (keys
        within the last ``sliding_window`` positions; ragged batches only); _fuse_rope_and_store
        (MAX's kernel-fusion switch: no effect on the numbers, accepted).

    ``__call__(layer_idx, x, kv_collection, freqs_cis=None, input_row_offsets=None)``:
        paged: ``x [total_seq_len, hidden]``, ``input_row_offsets`` uint32 ``[batch + 1]``,
        ``freqs_cis [max_positions, head_dim]`` (default: ``rope.freqs_cis``); returns
        ``[total_seq_len, hidden]`` and writes this layer's keys and values into
        ``kv_collection.kv_blocks``.
        dense: ``x [batch, seq, hidden]``; returns ``[batch, seq, hidden]`` and rebinds
        ``kv_collection.k_cache``/``v_cache`` (``freqs_cis``, ``input_row_offsets`` must be None).
        A dense collection without caches (``k_cache`` and ``v_cache`` None) runs whole sequences
        over their own keys and values (training, scoring): nothing is written; there
        ``freqs_cis`` (MAX's table, rows read at the positions) may be given, so that a chain of
        layers shares one table instead of each computing its angles, and ``positions`` may be
        None: ``0 .. seq - 1`` in every row, the table's first rows.

    Raises:
        ValueError: heads that do not group, ``stacked_qkv`` with ``has_bias``.
        NotImplementedError: a mask variant other than ``CAUSAL_MASK``; ``sliding_window`` on the
            dense cache.
        TypeError: (called) an unknown ``kv_collection``.
    """

    def __init__(
        self,
        *,
        rope: RotaryEmbedding,
        sharding_strategy: ShardingStrategy | None = None,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        devices: Sequence[DeviceRef] | None = None,
        dtype: DType = DType.float32,
        linear_cls: Any = Linear,
        stacked_qkv: bool = False,
        scale: float | None = None,
        has_bias: bool = False,
        quant_config: Any = None,
        clip_qkv: float | None = None,
        use_qk_norm: bool = False,
        rms_norm_eps: float = 1e-6,
        mask_variant: MHAMaskVariant = MHAMaskVariant.CAUSAL_MASK,
        sliding_window: int | None = None,
        _fuse_rope_and_store: bool = True,
    ) -> None:
        self._build(
            rope=rope, num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
            hidden_size=hidden_size, kv_params=kv_params, devices=devices, dtype=dtype, linear_cls=linear_cls,
            stacked_qkv=stacked_qkv, scale=scale, has_bias=has_bias, clip_qkv=clip_qkv, use_qk_norm=use_qk_norm,
            rms_norm_eps=rms_norm_eps, mask_variant=mask_variant, sliding_window=sliding_window,
            linear_kwargs={"quant_config": quant_config} if quant_config is not None else {},
        )  # fmt: skip
        self.quant_config = quant_config
        if sharding_strategy is not None:
            self.sharding_strategy = sharding_strategy

    def _build(
        self, *, rope: Any, num_attention_heads: int, num_key_value_heads: int, hidden_size: int, kv_params: Any,
        devices: Any, dtype: DType, linear_cls: Any, stacked_qkv: bool, scale: float | None, has_bias: bool,
        clip_qkv: float | None, use_qk_norm: bool, rms_norm_eps: float, mask_variant: Any, sliding_window: Any,
        linear_kwargs: dict[str, Any],
    ) -> None:  # fmt: skip
        super().__init__()
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({num_key_value_heads})"
            )
        if stacked_qkv and has_bias:
            raise ValueError("AttentionWithRope: stacked_qkv=True does not support has_bias=True (MAX's rule)")
        if MHAMaskVariant(mask_variant) != MHAMaskVariant.CAUSAL_MASK:
            raise NotImplementedError(
                f"AttentionWithRope(mask_variant={mask_variant!r}): maxjax implements MHAMaskVariant.CAUSAL_MASK only"
            )
        self.rope = rope
        self.n_heads = num_attention_heads
        self.num_key_value_heads = self.n_kv_heads = num_key_value_heads
        self.kv_params = kv_params
        self.head_dim = kv_params.head_dim
        self.hidden_size = hidden_size
        self.has_bias = has_bias
        self.scale = scale if scale is not None else math.sqrt(1.0 / self.head_dim)
        self.clip_qkv = clip_qkv
        self.devices = list(devices) if devices else [DeviceRef.CPU()]
        self.stacked_qkv = stacked_qkv
        self.use_qk_norm = use_qk_norm
        self.rms_norm_eps = rms_norm_eps
        self.mask_variant = MHAMaskVariant(mask_variant)
        self.sliding_window = sliding_window
        device = self.devices[0]
        q_out, kv_out = num_attention_heads * self.head_dim, num_key_value_heads * self.head_dim
        self.q_weight_dim = q_out
        if use_qk_norm:
            self.q_norm = RMSNorm(self.head_dim, dtype, eps=rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, dtype, eps=rms_norm_eps)

        def linear(in_dim: int, out_dim: int, bias: bool, clip: float | None) -> Any:
            kwargs = dict(in_dim=in_dim, out_dim=out_dim, dtype=dtype, device=device, **linear_kwargs)
            if bias:
                kwargs["has_bias"] = True
            if clip is not None:
                kwargs["clip_weight"] = clip
            return linear_cls(**kwargs)

        if stacked_qkv:
            self.qkv_proj = linear(hidden_size, q_out + 2 * kv_out, False, clip_qkv)
        else:
            self.q_proj = linear(hidden_size, q_out, has_bias, clip_qkv)
            self.k_proj = linear(hidden_size, kv_out, has_bias, clip_qkv)
            self.v_proj = linear(hidden_size, kv_out, has_bias, clip_qkv)
        self.o_proj = linear(q_out, hidden_size, False, None)
        self._sharding_strategy: ShardingStrategy | None = None

    # -- sharding -------------------------------------------------------------------------------
    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``replicate`` or ``tensor_parallel`` (MAX's attention strategies).

        Tensor parallel splits the heads in whole KV groups: device ``i`` gets KV heads
        ``compute_shard_range(n_kv_heads, i, n)`` and the query heads that use them (Q, K, V by
        rows, ``o_proj`` by the same columns), so grouped-query attention stays on each device
        whatever the counts (MAX splits Q and KV heads independently, which pairs them wrongly
        when they do not divide evenly). Placed on a mesh, devices with fewer KV groups hold
        zero heads (see ``Weight.place``); the attention then runs over the padded head count.

        Raises:
            ValueError: (setting) another strategy, or a strategy on ``stacked_qkv`` weights.
        """
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if self.stacked_qkv:
            raise ValueError("AttentionWithRope: sharding stacked_qkv weights is not supported by maxjax")
        n = strategy.num_devices
        if strategy.is_replicate:
            for proj in (self.q_proj, self.k_proj, self.v_proj, self.o_proj):
                proj.sharding_strategy = strategy
        elif strategy.is_tensor_parallel:
            kv, d, g = self.n_kv_heads, self.head_dim, self.n_heads // self.n_kv_heads
            group = Segment.head_aware(kv, g * d)  # the query heads of each KV head, as one unit
            self.q_proj.sharding_strategy = ShardingStrategy.segmented(n, 0, [group])
            self.k_proj.sharding_strategy = ShardingStrategy.segmented(n, 0, [Segment.head_aware(kv, d)])
            self.v_proj.sharding_strategy = ShardingStrategy.segmented(n, 0, [Segment.head_aware(kv, d)])
            self.o_proj.sharding_strategy = ShardingStrategy.segmented(n, 1, [group])
        else:
            raise ValueError(f"Unsupported sharding strategy for attention: {strategy}")
        self._sharding_strategy = strategy

    def shard(self, devices: Sequence[DeviceRef]) -> list["AttentionWithRope"]:
        """One attention module per device with its heads' projections (MAX's
        ``AttentionWithRope.shard``); each reads its own KV cache ``[..., its kv heads, ...]`` and
        its ``o_proj`` outputs partial sums to add up with ``ops.allreduce.sum``.

        Raises:
            ValueError: no sharding strategy was set.
        """
        if self._sharding_strategy is None:
            raise ValueError("AttentionWithRope cannot be sharded because no sharding strategy was provided.")
        devices = list(devices)
        n = len(devices)
        q, k, v, o = (p.shard(devices) for p in (self.q_proj, self.k_proj, self.v_proj, self.o_proj))
        if self.use_qk_norm:  # per-head-dim norms: the same weights on every device
            for norm in (self.q_norm, self.k_norm):
                norm.sharding_strategy = ShardingStrategy.replicate(n)
            q_norms, k_norms = self.q_norm.shard(devices), self.k_norm.shard(devices)
        g = self.n_heads // self.n_kv_heads
        shards = []
        for i, device in enumerate(devices):
            if self._sharding_strategy.is_replicate:
                kv_i = self.n_kv_heads
            else:
                start, end = compute_shard_range(self.n_kv_heads, i, n)
                kv_i = end - start
            sharded = object.__new__(type(self))
            Module.__init__(sharded)
            for name in ("rope", "kv_params", "head_dim", "hidden_size", "scale", "has_bias", "clip_qkv", "stacked_qkv",
                         "use_qk_norm", "rms_norm_eps", "mask_variant", "sliding_window"):  # fmt: skip
                setattr(sharded, name, getattr(self, name))
            sharded.n_heads, sharded.n_kv_heads, sharded.num_key_value_heads = kv_i * g, kv_i, kv_i
            sharded.q_weight_dim, sharded.devices = kv_i * g * self.head_dim, [device]
            sharded.q_proj, sharded.k_proj, sharded.v_proj, sharded.o_proj = q[i], k[i], v[i], o[i]
            if self.use_qk_norm:
                sharded.q_norm, sharded.k_norm = q_norms[i], k_norms[i]
            sharded._sharding_strategy = self._sharding_strategy
            shards.append(sharded)
        return shards

    def _heads(self, proj: Linear) -> Any:
        """Heads of a projection's output, from its weight's graph shape (the padded count when
        the weight is placed on a mesh with uneven groups)."""
        return proj.weight._aval.shape[0] // self.head_dim

    def _qkv(self, x: Any, lead: list[Any]) -> tuple[Any, Any, Any]:
        """q ``[*lead, h, d]``, k and v ``[*lead, kv, d]`` of ``x [*lead, hidden]`` (q/k normed)."""
        d = self.head_dim
        if self.stacked_qkv:
            qkv = self.qkv_proj(x)
            h, kv = self.n_heads, self.n_kv_heads
            q, k, v = ops.split(qkv, [h * d, kv * d, kv * d], axis=-1)
        else:
            h, kv = self._heads(self.q_proj), self._heads(self.k_proj)
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = ops.reshape(q, [*lead, h, d])
        k = ops.reshape(k, [*lead, kv, d])
        v = ops.reshape(v, [*lead, kv, d])
        if self.use_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def __call__(
        self, layer_idx: Any, x: Any, kv_collection: Any, freqs_cis: Any = None, input_row_offsets: Any = None
    ) -> Any:
        if isinstance(kv_collection, KVCacheInputsPerDevice):
            if input_row_offsets is None:
                raise ValueError("AttentionWithRope: a paged kv_collection needs input_row_offsets (a ragged batch)")
            return self._ragged(layer_idx, x, kv_collection, freqs_cis, input_row_offsets)
        if isinstance(kv_collection, DenseKVCacheValues):
            cached = kv_collection.k_cache is not None
            if (cached and freqs_cis is not None) or input_row_offsets is not None:
                raise ValueError(
                    "AttentionWithRope: the dense cache takes a padded batch x [batch, seq, hidden] and the rope's own "
                    "frequencies; pass freqs_cis=None and input_row_offsets=None"
                )
            if self.sliding_window is not None:
                raise NotImplementedError("AttentionWithRope(sliding_window=...): supported on the paged cache only")
            return self._dense(layer_idx, x, kv_collection, freqs_cis)
        raise TypeError(
            f"AttentionWithRope: kv_collection must be a KVCacheInputsPerDevice (paged, MAX's) or a DenseKVCacheValues, "
            f"got {type(kv_collection).__name__}"
        )

    def _ragged(self, layer_idx: Any, x: Any, cache: Any, freqs_cis: Any, offsets: Any) -> Any:
        total = x.shape[0]
        q, k, v = self._qkv(x, [total])  # [total, h | kv, d]
        if freqs_cis is None:
            freqs_cis = self.rope.freqs_cis
        interleaved = bool(self.rope.interleaved)
        q = ops.apply(rope_ragged, q, freqs_cis, offsets, cache.cache_lengths, _name="rope_ragged", interleaved=interleaved)
        k = ops.apply(rope_ragged, k, freqs_cis, offsets, cache.cache_lengths, _name="rope_ragged", interleaved=interleaved)
        blocks = ops.apply(
            store_kv_ragged, read_cache(cache.kv_blocks), k, v, layer_idx, offsets, cache.cache_lengths,
            cache.lookup_table, _name="store_kv_ragged",
        )  # fmt: skip
        write_cache(cache, "kv_blocks", blocks)
        ctx = ops.apply(
            attention_ragged_paged, q, blocks, layer_idx, offsets, cache.cache_lengths, cache.lookup_table,
            _name="attention_ragged_paged", scale=float(self.scale), window=self.sliding_window,
        )  # fmt: skip  [total, h, d]
        return self.o_proj(ops.reshape(ctx, [total, q.shape[1] * self.head_dim]))

    def _dense(self, layer_idx: Any, x: Any, cache: DenseKVCacheValues, freqs_cis: Any = None) -> Any:
        batch, seq = x.shape[0], x.shape[1]
        q, k, v = self._qkv(x, [batch, seq])  # [batch, seq, h | kv, d]
        kv, d = k.shape[2], self.head_dim
        positions = cache.positions
        q = self.rope.rotate(q, positions, freqs_cis)
        k = self.rope.rotate(k, positions, freqs_cis)
        if cache.k_cache is None:  # whole sequences attending to themselves: no cache to write
            ctx = ops.apply(
                _self_causal_gqa, q, k, v, positions, _name="self_causal_gqa", scale=float(self.scale)
            )  # [batch, seq, h * d]
            return self.o_proj(ctx)  # [batch, seq, hidden]
        k_cache, v_cache = read_cache(cache.k_cache), read_cache(cache.v_cache)

        # write this layer's new values at (layer, b, kv head, position) and its keys, one channel
        # at a time, at (layer, b, kv head, channel, position)
        b_idx = ops.broadcast_to(ops.reshape(ops.range(0, batch, 1, dtype=DType.int32), [batch, 1, 1]), [batch, seq, kv])
        l_idx = ops.broadcast_to(ops.cast(layer_idx, DType.int32), [batch, seq, kv])
        h_idx = ops.broadcast_to(ops.range(0, kv, 1, dtype=DType.int32), [batch, seq, kv])
        p_idx = ops.broadcast_to(ops.unsqueeze(ops.cast(positions, DType.int32), -1), [batch, seq, kv])
        idx = ops.stack([l_idx, b_idx, h_idx, p_idx], axis=-1)  # [batch, seq, kv, 4]
        per_channel = [
            ops.broadcast_to(ops.unsqueeze(i, -1), [batch, seq, kv, d]) for i in (l_idx, b_idx, h_idx, p_idx)
        ]
        c_idx = ops.broadcast_to(ops.range(0, d, 1, dtype=DType.int32), [batch, seq, kv, d])
        k_idx = ops.stack([*per_channel[:3], c_idx, per_channel[3]], axis=-1)  # [batch, seq, kv, d, 5]
        k_cache = ops.scatter_nd(k_cache, k, k_idx)
        v_cache = ops.scatter_nd(v_cache, v, idx)
        write_cache(cache, "k_cache", k_cache)
        write_cache(cache, "v_cache", v_cache)

        ctx = ops.apply(
            _causal_gqa, q, k_cache, v_cache, layer_idx, positions, _name="causal_gqa", scale=float(self.scale)
        )  # [batch, seq, h * d]
        return self.o_proj(ctx)


class GGUFQAttentionWithRope(AttentionWithRope):
    """:class:`AttentionWithRope` whose projections hold GGUF-quantized weights (MAX's
    ``GGUFQAttentionWithRope``: same weight keys, uint8 blocks of ``quantization_encoding``; the
    dequantization runs inside the matmul, see ``ops.qmatmul``).

    Raises:
        ValueError: as :class:`AttentionWithRope`.
    """

    def __init__(
        self,
        *,
        rope: RotaryEmbedding,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        dtype: DType,
        quantization_encoding: Any,
        devices: list[DeviceRef] | None = None,
        linear_cls: Any = Linear,
        scale: float | None = None,
        has_bias: bool = False,
        clip_qkv: float | None = None,
        mask_variant: MHAMaskVariant = MHAMaskVariant.CAUSAL_MASK,
    ) -> None:
        self._build(
            rope=rope, num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
            hidden_size=hidden_size, kv_params=kv_params, devices=devices, dtype=dtype, linear_cls=linear_cls,
            stacked_qkv=False, scale=scale, has_bias=has_bias, clip_qkv=clip_qkv, use_qk_norm=False,
            rms_norm_eps=1e-6, mask_variant=mask_variant, sliding_window=None,
            linear_kwargs={"quantization_encoding": quantization_encoding},
        )  # fmt: skip
        self.quantization_encoding = quantization_encoding
        self.quant_config = None


class GPTQAttentionWithRope(AttentionWithRope):
    """:class:`AttentionWithRope` with symmetric 4-bit GPTQ projections (MAX's
    ``GPTQAttentionWithRope``): each of ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` is a
    :class:`~maxjax.nn.linear.GPTQLinear` (keys ``{proj}.qweight`` int32, ``{proj}.scales``
    float16); with ``desc_act`` one ``q_proj.perm_idx`` int32 ``[hidden_size]`` serves q, k and v
    (they read the same input), as in MAX. The KV width is ``hidden_size // num_attention_heads *
    num_key_value_heads`` (MAX's). ``linear_cls`` is MAX's argument for the output projection;
    maxjax's output projection is a ``GPTQLinear`` whatever it is (MAX passes a GPTQ partial).

    Raises:
        ValueError, NotImplementedError: as :class:`~maxjax.nn.linear.GPTQLinear` for the config.
    """

    def __init__(
        self,
        quantization_config: Any,
        rope: RotaryEmbedding,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        devices: list[DeviceRef] | None = None,
        dtype: DType = DType.float32,
        scale: float | None = None,
        linear_cls: Any = Linear,
        mask_variant: MHAMaskVariant = MHAMaskVariant.CAUSAL_MASK,
    ) -> None:
        from maxjax.nn.linear import GPTQLinear

        def gptq(**kwargs: Any) -> Any:
            return GPTQLinear(quantization_config=quantization_config, **kwargs)

        self._build(
            rope=rope, num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
            hidden_size=hidden_size, kv_params=kv_params, devices=devices, dtype=dtype, linear_cls=gptq,
            stacked_qkv=False, scale=scale, has_bias=False, clip_qkv=None, use_qk_norm=False, rms_norm_eps=1e-6,
            mask_variant=mask_variant, sliding_window=None, linear_kwargs={},
        )  # fmt: skip
        self.quantization_config = quantization_config
        self.quant_config = None
        if self.q_proj.perm_idx is not None:  # one permutation of the shared input
            self.k_proj.set_shared_weight("perm_idx", self.q_proj.perm_idx)
            self.v_proj.set_shared_weight("perm_idx", self.q_proj.perm_idx)

    def _heads(self, proj: Any) -> Any:
        return proj.out_dim // self.head_dim


def _place_on_devices(module: Module, devices: Sequence[DeviceRef]) -> None:
    """Places ``module``'s weights on a mesh of ``devices`` (axis ``"tp"``), each split by its
    sharding strategy (replicated without one), so device ``i`` holds MAX's shard ``i``
    (``Module.to(mesh)``; as :class:`~maxjax.nn.VocabParallelEmbedding` places its table). One
    device: nothing to do. Every weight of a per-device program then lives on the same devices,
    which one compiled program (graph or functional mode) needs."""
    if len(devices) < 2:
        return
    from jax.sharding import AxisType, Mesh

    grid = np.asarray([DeviceRef.from_device(d).to_device().jax_device for d in devices], dtype=object)
    module.to(Mesh(grid, ("tp",), axis_types=(AxisType.Auto,)), axis="tp")


class TensorParallelAttentionWithRope(AttentionWithRope, DistributedAttentionImpl):
    """MAX's ``TensorParallelAttentionWithRope``: an :class:`AttentionWithRope` whose heads are
    split over ``devices`` and which is called in MAX's per-device style (one input, KV collection,
    rope table and row-offsets tensor per device, one output per device).

    Construction sets ``sharding_strategy = ShardingStrategy.tensor_parallel(len(devices))`` and
    keeps ``list_of_attentions = self.shard(devices)``: device ``i`` holds the KV heads
    ``compute_shard_range(num_key_value_heads, i, n)`` and the query heads that use them (the rows
    of ``q_proj``/``k_proj``/``v_proj`` and the columns of ``o_proj``), so its KV cache holds
    ``num_key_value_heads // n`` heads. Each device's ``o_proj`` gives a partial sum
    ``[total_seq_len, hidden]``; ``allreduce`` (:class:`~maxjax.nn.comm.Allreduce`) adds them,
    giving every device the output of the unsplit layer (MAX's source:
    ``max/nn/attention/attention_with_rope.py``).

    Weight keys: the unsplit layer's, exactly :class:`AttentionWithRope`'s (``q_proj.weight``,
    ``k_proj.weight``, ``v_proj.weight``, ``o_proj.weight``, ...): the per-device layers are views
    of them (not registered), so a single-device checkpoint loads as it is.

    With more than one device the weights are placed at construction on a mesh of ``devices``
    (axis ``"tp"``), each split by its sharding strategy, so device ``i`` holds its own heads'
    rows and columns, as MAX's shards do; ``state_dict()`` keeps the unsplit arrays. Unlike MAX's
    (which refuses CPU devices), CPU devices are accepted: the per-device program then runs on host
    devices. With ``use_qk_norm`` the Q/K norm weights are replicated on every device.

    Args: MAX's, keyword-only (as :class:`AttentionWithRope` without ``sharding_strategy``);
        ``devices`` default ``[DeviceRef.CPU()]``.

    ``__call__(layer_idx, x, signal_buffers, kv_collections, freqs_cis, input_row_offsets)``: each
        argument but ``layer_idx`` a sequence with one entry per device: ``x[i] [total_seq_len,
        hidden]``, ``signal_buffers[i]`` (:class:`~maxjax.nn.Signals`), ``kv_collections[i]`` a
        paged :class:`~maxjax.nn.kv_cache.KVCacheInputsPerDevice` of ``num_key_value_heads // n``
        heads (its ``kv_blocks`` updated), ``freqs_cis[i] [max_positions, head_dim]``,
        ``input_row_offsets[i]`` uint32 ``[batch + 1]``. Returns ``[total_seq_len, hidden]`` per device.

    Raises:
        ValueError: ``devices`` empty; ``num_key_value_heads`` not divisible by ``len(devices)``;
            ``stacked_qkv=True`` with more than one device; as :class:`AttentionWithRope`;
            (called) not one entry per device in a per-device argument.
        NotImplementedError: as :class:`AttentionWithRope` (``mask_variant``).
    """

    def __init__(
        self,
        *,
        rope: RotaryEmbedding,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        devices: Sequence[DeviceRef] | None = None,
        dtype: DType = DType.float32,
        linear_cls: Any = Linear,
        stacked_qkv: bool = False,
        scale: float | None = None,
        has_bias: bool = False,
        quant_config: Any = None,
        clip_qkv: float | None = None,
        use_qk_norm: bool = False,
        rms_norm_eps: float = 1e-6,
        mask_variant: MHAMaskVariant = MHAMaskVariant.CAUSAL_MASK,
        sliding_window: int | None = None,
    ) -> None:
        if devices is not None and len(devices) == 0:
            raise ValueError("TensorParallelAttentionWithRope: devices=[]; devices cannot be None or empty")
        n = len(devices) if devices else 1
        if num_key_value_heads % n:
            raise ValueError(
                f"TensorParallelAttentionWithRope: num_key_value_heads={num_key_value_heads} is not divisible by the "
                f"number of devices ({n}); each device holds whole KV heads"
            )
        if stacked_qkv and n > 1:
            raise ValueError(
                "TensorParallelAttentionWithRope(stacked_qkv=True): splitting a stacked QKV weight over devices is not "
                "supported by maxjax; use stacked_qkv=False"
            )
        super().__init__(
            rope=rope, num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
            hidden_size=hidden_size, kv_params=kv_params, devices=devices, dtype=dtype, linear_cls=linear_cls,
            stacked_qkv=stacked_qkv, scale=scale, has_bias=has_bias, quant_config=quant_config, clip_qkv=clip_qkv,
            use_qk_norm=use_qk_norm, rms_norm_eps=rms_norm_eps, mask_variant=mask_variant,
            sliding_window=sliding_window,
        )  # fmt: skip
        self.allreduce = Allreduce(len(self.devices))
        self.sharding_strategy = ShardingStrategy.tensor_parallel(len(self.devices))
        self.list_of_attentions = self.shard(self.devices)
        _place_on_devices(self, self.devices)

    def shard(self, devices: Sequence[DeviceRef]) -> list[AttentionWithRope]:
        """:meth:`AttentionWithRope.shard`, giving plain single-device :class:`AttentionWithRope`
        layers (as MAX's)."""
        shards = super().shard(devices)
        for s in shards:
            s.__class__ = AttentionWithRope  # built by the base's shard as type(self): a per-device layer
        return shards

    def __call__(  # type: ignore[override]
        self,
        layer_idx: Any,
        x: Sequence[Any],
        signal_buffers: Sequence[Any],
        kv_collections: Sequence[Any],
        freqs_cis: Sequence[Any],
        input_row_offsets: Sequence[Any],
    ) -> list[Any]:
        n = len(self.devices)
        for name, value in (("x", x), ("signal_buffers", signal_buffers), ("kv_collections", kv_collections),
                            ("freqs_cis", freqs_cis), ("input_row_offsets", input_row_offsets)):  # fmt: skip
            if len(value) != n:
                raise ValueError(
                    f"TensorParallelAttentionWithRope: expected {n} {name} (one per device), got {len(value)}"
                )
        outs = [
            attn(layer_idx, x[i], kv_collections[i], freqs_cis[i], input_row_offsets[i])
            for i, attn in enumerate(self.list_of_attentions)
        ]  # [total_seq_len, hidden] partial sums, one per device
        return self.allreduce(inputs=outs, signal_buffers=signal_buffers)
