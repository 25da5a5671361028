"""``AttentionWithRope``: grouped-query causal self-attention with rotary embedding and a KV cache.

The KV cache of a whole model is two arrays, KV-head-major: keys ``[n_layers, batch, n_kv_heads,
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
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear
from maxjax.nn.rotary_embedding import RotaryEmbedding

__all__ = ["AttentionWithRope"]


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
    """:func:`_causal_gqa` over the first ``window`` cache positions.

    Two layouts of the same arithmetic; the backend policy picks one
    (``policy.attention_grouped``): the query heads grouped per KV head, so the KV cache is read
    as it is, or the KV heads repeated per query head (Hugging Face's ``repeat_kv``), which gives
    the output's heads contiguously ``[h, d]``.
    """
    b, s, h, d = q.shape
    kv = k_cache.shape[2]
    g = h // kv
    layer = jnp.asarray(layer, jnp.int32)
    keys = jax.lax.dynamic_index_in_dim(k_cache, layer, 0, keepdims=False)[..., :window]  # [b, kv, d, window]
    keys = keys.astype(q.dtype)
    values = jax.lax.dynamic_index_in_dim(v_cache, layer, 0, keepdims=False)[:, :, :window].astype(q.dtype)
    visible = positions.astype(jnp.int32)[:, :, None] >= jnp.arange(window, dtype=jnp.int32)  # [b, s, window]
    if not policy.attention_grouped(b, s, g):
        if g > 1:
            keys, values = jnp.repeat(keys, g, axis=1), jnp.repeat(values, g, axis=1)
        qh = jnp.transpose(q, (0, 2, 1, 3))  # [b, h, s, d]
        scores = policy.matmul(qh, keys) * scale  # [b, h, s, window]
        scores = jnp.where(visible[:, None], scores.astype(jnp.float32), MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        ctx = jnp.transpose(policy.matmul(probs, values), (0, 2, 1, 3))  # [b, s, h, d]
    elif s == 1:
        # one query token per row: the query heads of a KV head form the rows of its dots,
        # [b, kv, g, d] x [b, kv, d, window] -> [b, kv, g, window] (both operands in their
        # stored layout; a [.., window, g] order made XLA:CPU copy the cache and run a slow dot)
        qg = q.reshape(b, kv, g, d)
        scores = policy.einsum("bngd,bndk->bngk", qg, keys) * scale
        scores = jnp.where(visible[:, :, None], scores.astype(jnp.float32), MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        ctx = policy.einsum("bngk,bnkd->bngd", probs, values)
    else:
        qg = q.reshape(b, s, kv, g, d)
        scores = policy.einsum("bsngd,bndk->bngsk", qg, keys) * scale  # [b, kv, g, s, window]
        scores = jnp.where(visible[:, None, None], scores.astype(jnp.float32), MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        ctx = policy.einsum("bngsk,bnkd->bsngd", probs, values)
    return ctx.reshape(b, s, h * d)


class AttentionWithRope(Module):
    """Causal grouped-query attention (weights ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``).

    Args:
        n_heads: query heads. n_kv_heads: key/value heads (divides ``n_heads``).
        hidden_size: model width. head_dim: channels per head (default ``hidden_size // n_heads``).
        rope: the :class:`RotaryEmbedding` shared by all layers.
        dtype: activation / weight dtype of unquantized projections.
        quantization_encoding: GGUF encoding of the projection weights (packed), or None.

    ``__call__(x, k_cache, v_cache, layer_idx, positions)``:
        x ``[batch, seq, hidden]``; k_cache ``[n_layers, batch, n_kv_heads, head_dim, max_seq]``,
        v_cache ``[n_layers, batch, n_kv_heads, max_seq, head_dim]``;
        layer_idx a scalar int32; positions int32 ``[batch, seq]``. Returns
        ``(out [batch, seq, hidden], k_cache, v_cache)`` with this layer's new entries written.
    """

    def __init__(
        self,
        n_heads: int,
        n_kv_heads: int,
        hidden_size: int,
        rope: RotaryEmbedding,
        dtype: DType = DType.float32,
        devices: Sequence[DeviceRef] = (),
        head_dim: int | None = None,
        quantization_encoding: Any = None,
        has_bias: bool = False,
    ) -> None:
        super().__init__()
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = head_dim or hidden_size // n_heads
        self.hidden_size = hidden_size
        self.rope = rope
        self.scale = 1.0 / math.sqrt(self.head_dim)
        device = list(devices)[0] if devices else DeviceRef.CPU()
        q_out, kv_out = n_heads * self.head_dim, n_kv_heads * self.head_dim
        enc = quantization_encoding
        self.q_proj = Linear(hidden_size, q_out, dtype, device, has_bias, enc)
        self.k_proj = Linear(hidden_size, kv_out, dtype, device, has_bias, enc)
        self.v_proj = Linear(hidden_size, kv_out, dtype, device, has_bias, enc)
        self.o_proj = Linear(q_out, hidden_size, dtype, device, False, enc)
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
            ValueError: (setting) another strategy.
        """
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
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
            sharded.n_heads, sharded.n_kv_heads, sharded.head_dim = kv_i * g, kv_i, self.head_dim
            sharded.hidden_size, sharded.rope, sharded.scale = self.hidden_size, self.rope, self.scale
            sharded.q_proj, sharded.k_proj, sharded.v_proj, sharded.o_proj = q[i], k[i], v[i], o[i]
            sharded._sharding_strategy = self._sharding_strategy
            shards.append(sharded)
        return shards

    def _heads(self, proj: Linear) -> Any:
        """Heads of a projection's output, from its weight's graph shape (the padded count when
        the weight is placed on a mesh with uneven groups)."""
        return proj.weight._aval.shape[0] // self.head_dim

    def __call__(self, x: Any, k_cache: Any, v_cache: Any, layer_idx: Any, positions: Any) -> tuple[Any, Any, Any]:
        batch, seq = x.shape[0], x.shape[1]
        h, kv, d = self._heads(self.q_proj), self._heads(self.k_proj), self.head_dim
        q = ops.reshape(self.q_proj(x), [batch, seq, h, d])
        k = ops.reshape(self.k_proj(x), [batch, seq, kv, d])
        v = ops.reshape(self.v_proj(x), [batch, seq, kv, d])
        q = self.rope(q, positions)
        k = self.rope(k, positions)

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

        ctx = ops.apply(
            _causal_gqa, q, k_cache, v_cache, layer_idx, positions, _name="causal_gqa", scale=self.scale
        )  # [batch, seq, h * d]
        out = self.o_proj(ctx)
        return out, k_cache, v_cache
