"""``AttentionWithRope``: grouped-query causal self-attention with rotary embedding and a KV cache.

The KV cache of a whole model is two arrays ``[n_layers, batch, n_kv_heads, max_seq_len,
head_dim]`` (keys, values; KV-head-major, so a layer's keys are read without a transpose). A layer
writes the keys and values of its new tokens at their positions (``ops.scatter_nd``, in place
under ``jax.jit`` with the cache donated) and attends over its whole cache rows with the mask
``key_position <= query_position``, so padded prompts of different lengths share one batch:
positions past a sequence's end hold values nothing attends to until they are overwritten.

References: Vaswani et al., 2017 (attention); Ainslie et al., 2023 (grouped-query attention,
query head ``h`` uses KV head ``h // (n_heads // n_kv_heads)``, as Hugging Face's
``repeat_kv``); Su et al., 2021 (rotary embedding).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.type import DeviceRef
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear
from maxjax.nn.rotary_embedding import RotaryEmbedding

__all__ = ["AttentionWithRope"]


def _causal_gqa(q: Any, keys: Any, values: Any, positions: Any, *, scale: float) -> Any:
    """Causal grouped-query attention over a cache row (one jnp function, an op of its own).

    q ``[batch, seq, h, d]``; keys, values ``[batch, kv, max_seq, d]``; positions int ``[batch, seq]``.
    Key ``j`` is visible to a query at position ``p`` when ``j <= p``. Returns ``[batch, seq, h * d]``.

    Batched decode (one new token for each of several rows): the query heads are grouped per KV
    head, so the KV cache is read as it is. Otherwise (batch-1 decode, prefill) the KV heads are
    repeated per query head (Hugging Face's ``repeat_kv``): the output's heads are then contiguous
    ``[h, d]``, which lets XLA fuse o_proj's weight dequantization into its matrix-vector product
    at full speed, and XLA's dots for prefill are faster in that layout (measured on SmolLM2).
    """
    import jax
    import jax.numpy as jnp

    b, s, h, d = q.shape
    kv, max_seq = keys.shape[1], keys.shape[2]
    g = h // kv
    keys, values = keys.astype(q.dtype), values.astype(q.dtype)
    visible = positions.astype(jnp.int32)[:, :, None] >= jnp.arange(max_seq, dtype=jnp.int32)  # [b, s, max_seq]
    hp = jax.lax.Precision.HIGHEST
    # (== on sizes: they may be symbolic while a graph infers shapes; both branches agree on shape)
    grouped = g > 1 and s == 1 and not b == 1
    if not grouped:
        if g > 1:
            keys, values = jnp.repeat(keys, g, axis=1), jnp.repeat(values, g, axis=1)
        qh = jnp.transpose(q, (0, 2, 1, 3))  # [b, h, s, d]
        scores = jnp.matmul(qh, jnp.swapaxes(keys, -1, -2), precision=hp) * scale  # [b, h, s, max_seq]
        scores = jnp.where(visible[:, None], scores.astype(jnp.float32), -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        ctx = jnp.transpose(jnp.matmul(probs, values, precision=hp), (0, 2, 1, 3))  # [b, s, h, d]
    else:
        # one query token per row: the query heads of a KV head form the rows of its dots,
        # [b, kv, g, d] x [b, kv, max_seq, d] -> [b, kv, g, max_seq] (both operands in their
        # stored layout; a [.., max_seq, g] order made XLA copy the cache and run a slow dot)
        qg = q.reshape(b, kv, g, d)
        scores = jnp.einsum("bngd,bnkd->bngk", qg, keys, precision=hp) * scale
        scores = jnp.where(visible[:, :, None], scores.astype(jnp.float32), -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        ctx = jnp.einsum("bngk,bnkd->bngd", probs, values, precision=hp)
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
        x ``[batch, seq, hidden]``; caches ``[n_layers, batch, n_kv_heads, max_seq, head_dim]``;
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

    def __call__(self, x: Any, k_cache: Any, v_cache: Any, layer_idx: Any, positions: Any) -> tuple[Any, Any, Any]:
        batch, seq = x.shape[0], x.shape[1]
        h, kv, d = self.n_heads, self.n_kv_heads, self.head_dim
        q = ops.reshape(self.q_proj(x), [batch, seq, h, d])
        k = ops.reshape(self.k_proj(x), [batch, seq, kv, d])
        v = ops.reshape(self.v_proj(x), [batch, seq, kv, d])
        q = self.rope(q, positions)
        k = self.rope(k, positions)

        # write this layer's new keys/values at (layer, b, kv head, position)
        b_idx = ops.broadcast_to(ops.reshape(ops.range(0, batch, 1, dtype=DType.int32), [batch, 1, 1]), [batch, seq, kv])
        l_idx = ops.broadcast_to(ops.cast(layer_idx, DType.int32), [batch, seq, kv])
        h_idx = ops.broadcast_to(ops.range(0, kv, 1, dtype=DType.int32), [batch, seq, kv])
        p_idx = ops.broadcast_to(ops.unsqueeze(ops.cast(positions, DType.int32), -1), [batch, seq, kv])
        idx = ops.stack([l_idx, b_idx, h_idx, p_idx], axis=-1)  # [batch, seq, kv, 4]
        k_cache = ops.scatter_nd(k_cache, k, idx)
        v_cache = ops.scatter_nd(v_cache, v, idx)

        keys = ops.gather(k_cache, layer_idx, axis=0)  # [batch, kv, max_seq, d]
        values = ops.gather(v_cache, layer_idx, axis=0)
        ctx = ops.apply(
            _causal_gqa, q, keys, values, positions, _name="causal_gqa", scale=self.scale
        )  # [batch, seq, h * d]
        out = self.o_proj(ctx)
        return out, k_cache, v_cache
