"""``MultiheadAttention`` (MAX's ``max/nn/attention/multihead_attention.py``): bidirectional (or
causal) multi-head self-attention of a padded batch, without a KV cache, as encoders use it.

Reference: Vaswani et al., 2017. MAX runs it with its ``flash_attention_gpu`` kernel (GPU only);
maxjax computes ``softmax(q k^T * scale) v`` per head with float32 scores.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.type import DeviceRef
from maxjax.nn.attention.mask_config import MHAMaskVariant
from maxjax.nn.layer import Module
from maxjax.nn.linear import Linear
from maxjax.nn.stacked_linear import StackedLinear

__all__ = ["MultiheadAttention"]

_MASKED = float(jnp.finfo(jnp.float32).min)


def _mha(q: Any, k: Any, v: Any, *valid: Any, scale: float, causal: bool) -> Any:
    """q, k, v ``[batch, seq, heads, head_dim]``; ``valid`` (optional) bool ``[batch, seq]`` of
    the keys that exist. Returns ``[batch, seq, heads * head_dim]`` in q's dtype."""
    b, s, h, d = q.shape
    dtype = q.dtype
    # heads before positions: XLA:CPU runs the batched dots 1.3-2.2x faster so than with the heads
    # between (2-core AVX-512 Xeon, 12 heads of 32: [32, 48] 6.0 -> 4.5 ms, [8, 128] 11.6 -> 5.3 ms,
    # the transposes included)
    q, k, v = (jnp.transpose(t.astype(jnp.float32), (0, 2, 1, 3)) for t in (q, k, v))  # [b, h, s, d]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * scale  # [b, h, s, s]
    if causal:
        scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, _MASKED)
    if valid:
        scores = jnp.where(valid[0].astype(bool)[:, None, None, :], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.transpose(jnp.einsum("bhqk,bhkd->bhqd", probs, v), (0, 2, 1, 3))  # [b, s, h, d]
    return out.reshape(b, s, h * d).astype(dtype)


class MultiheadAttention(Module):
    """Multi-head self-attention (MAX's constructor; weight keys ``q_proj``, ``k_proj``,
    ``v_proj`` (or ``qkv_proj`` with ``stacked_qkv``) and ``o_proj``, ``.bias`` as asked).

    ``__call__(x, signal_buffers=None, *, mask_variant=MHAMaskVariant.NULL_MASK,
    attention_mask=None)``: x ``[batch, seq, hidden]`` -> ``[batch, seq, hidden]``.
    ``mask_variant`` is MAX's keyword (``NULL_MASK``: every position sees every position;
    ``CAUSAL_MASK``). ``attention_mask`` is a maxjax extension for padded batches: bool/int
    ``[batch, seq]``, true for the keys that exist (padding keys are ignored; None is MAX's exact
    behaviour).

    Raises:
        ValueError: ``hidden_size`` not divisible by the heads; an empty ``devices``.
        NotImplementedError: more than one device (MAX's per-device form: place the module on a
            mesh instead), or another mask variant.
    """

    def __init__(
        self,
        num_attention_heads: int,
        hidden_size: int,
        devices: Sequence[DeviceRef] | None = None,
        dtype: DType = DType.float32,
        scale: float | None = None,
        qkv_has_bias: bool = False,
        o_proj_has_bias: bool = False,
        stacked_qkv: bool = False,
    ) -> None:
        super().__init__()
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})")
        if devices is not None and len(devices) == 0:
            raise ValueError("Devices cannot be empty")
        if devices is not None and len(devices) > 1:
            raise NotImplementedError(
                f"MultiheadAttention(devices=[{len(devices)} devices]): maxjax runs one program over a mesh; build it on one "
                "device and place it with Module.to(mesh)"
            )
        self.num_heads = num_attention_heads
        self.head_dim = hidden_size // num_attention_heads
        self.embed_dim = hidden_size
        self.devices = list(devices) if devices is not None else [DeviceRef.CPU()]
        self.is_distributed = False
        self.scale = scale if scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.qkv_has_bias, self.o_proj_has_bias, self.stacked_qkv = qkv_has_bias, o_proj_has_bias, stacked_qkv
        e = hidden_size
        self.qkv_proj = StackedLinear(
            in_dim=e, out_dims=[e, e, e], names=["q_proj", "k_proj", "v_proj"], dtype=dtype, device=self.devices[0],
            stacked=stacked_qkv, has_bias=qkv_has_bias,
        )  # fmt: skip
        self.o_proj = Linear(in_dim=e, out_dim=e, dtype=dtype, device=self.devices[0], has_bias=o_proj_has_bias)

    def __call__(
        self,
        x: Any,
        signal_buffers: Any = None,
        *,
        mask_variant: MHAMaskVariant = MHAMaskVariant.NULL_MASK,
        attention_mask: Any = None,
    ) -> Any:
        mask_variant = MHAMaskVariant(mask_variant)
        if mask_variant not in (MHAMaskVariant.NULL_MASK, MHAMaskVariant.CAUSAL_MASK):
            raise NotImplementedError(f"MultiheadAttention: mask_variant={mask_variant!r} (supported: NULL_MASK, CAUSAL_MASK)")
        if signal_buffers is not None:
            raise ValueError("MultiheadAttention: signal_buffers are for MAX's multi-device form; this module has one device")
        b, s, e = x.shape[0], x.shape[1], self.embed_dim
        q, k, v = ops.split(self.qkv_proj(x), [e, e, e], axis=-1)  # [b, s, e] each
        heads = [b, s, self.num_heads, self.head_dim]
        q, k, v = (ops.reshape(t, heads) for t in (q, k, v))
        extra = () if attention_mask is None else (attention_mask,)
        ctx = ops.apply(
            _mha, q, k, v, *extra, _name="multihead_attention", scale=float(self.scale),
            causal=mask_variant == MHAMaskVariant.CAUSAL_MASK,
        )  # fmt: skip  [b, s, e]
        return self.o_proj(ctx)
