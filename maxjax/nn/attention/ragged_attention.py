"""``RaggedAttention`` (MAX's ``max/nn/attention/ragged_attention.py``): grouped-query attention of
a ragged batch over a paged KV cache, without a rotary embedding."""

from __future__ import annotations

import math
from typing import Any, Callable

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.type import DeviceRef
from maxjax.nn.attention.mask_config import MHAMaskVariant
from maxjax.nn.kernels import attention_ragged_paged, store_kv_ragged
from maxjax.nn.kv_cache import KVCacheInputsPerDevice, KVCacheParams, read_cache, write_cache
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear

__all__ = ["RaggedAttention"]


class RaggedAttention(Module):
    """Attention of ``x [total_seq_len, hidden]`` (a ragged batch) over a paged cache.

    Weight keys (MAX's): ``q_proj``, ``k_proj``, ``v_proj`` (or ``qkv_proj`` with
    ``stacked_qkv``) and ``o_proj``; the KV width is ``hidden_size // num_attention_heads *
    num_key_value_heads`` and the heads are ``kv_params.head_dim`` wide, as in MAX.

    ``__call__(layer_idx, x, kv_collection, **kwargs)``: ``kwargs["input_row_offsets"]`` uint32
    ``[batch + 1]`` is required (MAX's call). Writes this layer's keys and values into
    ``kv_collection.kv_blocks`` and returns ``[total_seq_len, hidden]``.

    Raises:
        ValueError: ``has_bias=True`` (MAX's refusal); (called) no ``input_row_offsets``.
        NotImplementedError: a mask variant other than ``CAUSAL_MASK`` or ``NULL_MASK``.
        TypeError: (called) a kv_collection that is not a paged cache.
    """

    def __init__(
        self,
        *,
        mask_variant: MHAMaskVariant,
        num_attention_heads: int,
        num_key_value_heads: int,
        hidden_size: int,
        kv_params: KVCacheParams,
        devices: list[DeviceRef] | None = None,
        dtype: DType = DType.float32,
        linear_cls: Callable[..., Any] = Linear,
        stacked_qkv: bool = False,
        scale: float | None = None,
        has_bias: bool = False,
        clip_qkv: float | None = None,
    ) -> None:
        if has_bias:
            raise ValueError("RaggedAttention does not yet support `has_bias=True`.")
        mask_variant = MHAMaskVariant(mask_variant)
        if mask_variant not in (MHAMaskVariant.CAUSAL_MASK, MHAMaskVariant.NULL_MASK):
            raise NotImplementedError(
                f"RaggedAttention(mask_variant={mask_variant!r}): maxjax implements CAUSAL_MASK and NULL_MASK"
            )
        super().__init__()
        self.mask_variant = mask_variant
        self.n_heads, self.n_kv_heads = num_attention_heads, num_key_value_heads
        self.kv_params = kv_params
        self.has_bias = has_bias
        self.scale = scale if scale is not None else math.sqrt(1.0 / kv_params.head_dim)
        self.devices = devices or [DeviceRef.CPU()]
        self.stacked_qkv = stacked_qkv
        kv_dim = hidden_size // num_attention_heads * num_key_value_heads
        device = self.devices[0]

        def linear(in_dim: int, out_dim: int, clip: float | None) -> Any:
            kwargs = dict(in_dim=in_dim, out_dim=out_dim, dtype=dtype, device=device)
            if clip is not None:
                kwargs["clip_weight"] = clip
            return linear_cls(**kwargs)

        if stacked_qkv:
            self.qkv_proj = linear(hidden_size, hidden_size + 2 * kv_dim, clip_qkv)
        else:
            self.q_proj = linear(hidden_size, hidden_size, clip_qkv)
            self.k_proj = linear(hidden_size, kv_dim, clip_qkv)
            self.v_proj = linear(hidden_size, kv_dim, clip_qkv)
        self.o_proj = linear(hidden_size, hidden_size, None)
        self.q_dim, self.kv_dim = hidden_size, kv_dim

    def __call__(self, layer_idx: Any, x: Any, kv_collection: Any, **kwargs: Any) -> Any:
        if not isinstance(kv_collection, KVCacheInputsPerDevice):
            raise TypeError(f"RaggedAttention: kv_collection must be a KVCacheInputsPerDevice, got {type(kv_collection).__name__}")
        offsets = kwargs.get("input_row_offsets")
        if offsets is None:
            raise ValueError("RaggedAttention: pass input_row_offsets=... (uint32 [batch + 1]) with the ragged batch")
        total, d = x.shape[0], self.kv_params.head_dim
        if self.stacked_qkv:
            q, k, v = ops.split(self.qkv_proj(x), [self.q_dim, self.kv_dim, self.kv_dim], axis=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = ops.reshape(q, [total, self.n_heads, d])  # [total, h, d]
        k = ops.reshape(k, [total, self.n_kv_heads, d])  # [total, kv, d]
        v = ops.reshape(v, [total, self.n_kv_heads, d])
        c = kv_collection
        blocks = ops.apply(
            store_kv_ragged, read_cache(c.kv_blocks), k, v, layer_idx, offsets, c.cache_lengths, c.lookup_table,
            _name="store_kv_ragged",
        )  # fmt: skip
        write_cache(c, "kv_blocks", blocks)
        ctx = ops.apply(
            attention_ragged_paged, q, blocks, layer_idx, offsets, c.cache_lengths, c.lookup_table,
            _name="attention_ragged_paged", scale=float(self.scale),
            causal=self.mask_variant == MHAMaskVariant.CAUSAL_MASK,
        )  # fmt: skip  [total, h, d]
        return self.o_proj(ops.reshape(ctx, [total, self.n_heads * d]))
