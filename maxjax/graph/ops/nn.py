"""Neural-network ops: softmax, norms, matmul, dequantize (MAX's ``max.graph.ops`` names)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxjax.graph.ops._core import apply

__all__ = ["matmul", "softmax", "logsoftmax", "layer_norm", "rms_norm", "dequantize", "qmatmul"]


def _matmul(a: Any, b: Any) -> Any:
    return jnp.matmul(a, b)


def matmul(lhs: Any, rhs: Any) -> Any:
    """Matrix product with batch broadcasting (``jnp.matmul``).

    Raises:
        ValueError: the contracted dims differ (names both shapes).
    """
    return apply(_matmul, lhs, rhs, _name="matmul")


def _softmax(x: Any, *, axis: int) -> Any:
    return jax.nn.softmax(x, axis=axis)


def softmax(value: Any, axis: int = -1) -> Any:
    """Softmax along ``axis`` (max-subtracted, as ``jax.nn.softmax``)."""
    return apply(_softmax, value, _name="softmax", axis=axis)


def _logsoftmax(x: Any, *, axis: int) -> Any:
    return jax.nn.log_softmax(x, axis=axis)


def logsoftmax(value: Any, axis: int = -1) -> Any:
    """Log-softmax along ``axis``."""
    return apply(_logsoftmax, value, _name="logsoftmax", axis=axis)


def _layer_norm(x: Any, gamma: Any, beta: Any, *, epsilon: float) -> Any:
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
    out = (xf - mean) * jax.lax.rsqrt(var + epsilon)
    return (out * gamma.astype(jnp.float32) + beta.astype(jnp.float32)).astype(x.dtype)


def layer_norm(input: Any, gamma: Any, beta: Any, epsilon: float) -> Any:
    """Layer normalization over the last axis (Ba et al., 2016): ``(x - mean) / sqrt(var + eps) * gamma + beta``.

    Statistics are computed in float32; the result has ``input``'s dtype.
    """
    return apply(_layer_norm, input, gamma, beta, _name="layer_norm", epsilon=float(epsilon))


def _rms_norm(x: Any, w: Any, *, epsilon: float, weight_offset: float, multiply_before_cast: bool) -> Any:
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + epsilon)
    scale = w.astype(jnp.float32) + weight_offset if weight_offset else w.astype(jnp.float32)
    if multiply_before_cast:
        return (normed * scale).astype(x.dtype)
    return normed.astype(x.dtype) * scale.astype(x.dtype)


def rms_norm(
    input: Any, weight: Any, epsilon: float, weight_offset: float = 0.0, multiply_before_cast: bool = False
) -> Any:
    """RMS normalization over the last axis (Zhang & Sennrich, 2019): ``x / sqrt(mean(x^2) + eps) * (weight + offset)``.

    Statistics are computed in float32. ``multiply_before_cast`` multiplies by the weight before
    casting back to ``input``'s dtype (Gemma style); otherwise after (Llama style).
    """
    return apply(
        _rms_norm,
        input,
        weight,
        _name="rms_norm",
        epsilon=float(epsilon),
        weight_offset=float(weight_offset),
        multiply_before_cast=bool(multiply_before_cast),
    )


def _dequantize(x: Any, *, encoding: Any) -> Any:
    from maxjax.graph import quantization

    if isinstance(x, quantization.REPACKED_TYPES):  # the unpacked/nibbles layouts of Program.prepare
        return x.dequantize()
    if x.dtype == jnp.float32:  # the dequantized layout Program.prepare may choose
        return x
    return quantization.dequantize(encoding, x)


def dequantize(encoding: Any, quantized: Any) -> Any:
    """Unpacks GGUF blocks: uint8 ``[rows, bytes_per_row]`` in, float32 ``[rows, cols]`` out.

    One jittable jnp dequantizer per encoding (:mod:`maxjax.graph.quantization`; the bit layouts
    are llama.cpp's, as the ``gguf`` package documents them).
    """
    return apply(_dequantize, quantized, _name=f"dequantize[{encoding.value}]", encoding=encoding)


def _qmatmul(x: Any, w: Any, *, encoding: Any) -> Any:
    from maxjax.graph import quantization

    if isinstance(w, quantization.REPACKED_TYPES):  # the unpacked/nibbles layouts of Program.prepare
        return quantization.repacked_matmul(x, w)
    if w.dtype == jnp.float32:  # the dequantized layout Program.prepare may choose
        return quantization.matmul_transposed(x, w)
    return quantization.quantized_matmul(x, w, encoding)


def qmatmul(encoding: Any, config: Any, lhs: Any, *rhs: Any) -> Any:
    """``lhs @ dequantize(encoding, rhs).T`` for a packed weight ``rhs`` of shape ``[out, bytes]``.

    Computed in float32 (the dequantization fuses into the matmul under ``jax.jit``).
    """
    if len(rhs) != 1:
        raise ValueError(f"qmatmul expects one packed weight, got {len(rhs)}")
    return apply(_qmatmul, lhs, rhs[0], _name=f"qmatmul[{encoding.value}]", encoding=encoding)
