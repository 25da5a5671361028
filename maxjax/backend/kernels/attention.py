"""Causal grouped-query attention of whole sequences over their own keys and values, float32, in
maxjax's CPU kernel (``attention.cc``), forward and backward: what a training or scoring step's
layers run where the backend policy says (``BackendPolicy.attention_kernel``).

Query ``i`` of a row sees keys ``0 .. i`` of the same row; query head ``h`` reads KV head ``h //
(heads // kv_heads)`` (Ainslie et al., 2023). The arithmetic is float32's with the softmax's
log-sum-exp saved for the backward pass (Dao et al., 2022, FlashAttention: the backward recomputes
the probabilities from it instead of keeping them).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["causal_attention", "takes"]


def takes(q: Any, k: Any, v: Any) -> bool:
    """Whether the kernel takes ``q [b, s, h, d]``, ``k``/``v [b, s, kv, d]``: float32, 4-D, the
    same batch, length and head size, query heads a multiple of KV heads, nothing empty, a head
    size of 16, 32, ..., 256."""
    if any(getattr(a, "dtype", None) != jnp.float32 or getattr(a, "ndim", 0) != 4 for a in (q, k, v)):
        return False
    b, s, h, d = q.shape
    kv = k.shape[2]
    return (
        all(isinstance(n, int) and n > 0 for n in (b, s, h, d, kv))
        and k.shape == v.shape == (b, s, kv, d)
        and h % kv == 0
        and d % 16 == 0
        and d <= 256
    )


def causal_attention(q: Any, k: Any, v: Any, scale: float) -> jax.Array:
    """``softmax(scale * q k^T, causal) v`` of float32 ``q [b, s, h, d]`` over ``k``, ``v [b, s,
    kv, d]``: returns ``[b, s, h, d]``. Differentiable (:func:`jax.custom_vjp`; the backward pass
    is the kernel's too). Call :func:`maxjax.backend.kernels.available` first.

    Raises:
        ValueError: operands :func:`takes` refuses.
    """
    if not takes(q, k, v):
        raise ValueError(
            "causal_attention: q must be float32 [batch, seq, heads, head_dim] and k, v float32 [batch, seq, kv_heads, "
            f"head_dim] with heads a multiple of kv_heads; got {getattr(q, 'shape', None)}, {getattr(k, 'shape', None)}, "
            f"{getattr(v, 'shape', None)}"
        )
    return _attention(float(scale), q, k, v)


def _forward_call(scale: float, q: Any, k: Any, v: Any) -> tuple[jax.Array, jax.Array]:
    b, s, h, _ = q.shape
    out = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct((b, h, s), jnp.float32))  # o, lse
    return jax.ffi.ffi_call("maxjax_causal_attention", out, vmap_method="sequential")(q, k, v, scale=np.float32(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(scale: float, q: Any, k: Any, v: Any) -> jax.Array:
    return _forward_call(scale, q, k, v)[0]


def _attention_fwd(scale: float, q: Any, k: Any, v: Any) -> tuple[jax.Array, Any]:
    o, lse = _forward_call(scale, q, k, v)
    return o, (q, k, v, o, lse)


def _attention_bwd(scale: float, res: Any, g: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
    q, k, v, o, lse = res
    out = tuple(jax.ShapeDtypeStruct(a.shape, jnp.float32) for a in (q, k, v))
    call = jax.ffi.ffi_call("maxjax_causal_attention_backward", out, vmap_method="sequential")
    return call(q, k, v, o, lse, g.astype(jnp.float32), scale=np.float32(scale))


_attention.defvjp(_attention_fwd, _attention_bwd)
