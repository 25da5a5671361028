"""Neural-network ops: softmax, norms, matmul, dequantize (MAX's ``max.graph.ops`` names)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxjax.graph.ops._core import apply, check_same_device, dtype_of, op_traits
from maxjax.graph.type import Dim, StaticDim
from maxjax.graph.layer_weights import LayerIndexed, StackIndexed, materialize
from maxjax.graph.quantization import QuantizedArray, as_quantized

__all__ = ["matmul", "softmax", "logsoftmax", "layer_norm", "rms_norm", "dequantize", "qmatmul"]


@op_traits(uses_policy=True)
def _matmul(a: Any, b: Any, *, policy: Any, dtype: Any = None) -> Any:
    if dtype is not None:
        a, b = jax.lax.convert_element_type(a, dtype), jax.lax.convert_element_type(b, dtype)
    return policy.matmul(a, b)


def _check_matmul(lhs: Any, rhs: Any) -> None:
    from maxjax.graph.ops._core import _describe

    ls, rs = list(lhs.shape), list(rhs.shape)
    call = f"matmul({_describe(lhs)}, {_describe(rhs)})"
    if not ls or not rs:
        raise ValueError(f"{call}: operands must have rank >= 1")
    k_l = ls[-1]
    k_r = rs[0] if len(rs) == 1 else rs[-2]
    if Dim(k_l) != Dim(k_r):
        raise ValueError(f"{call}: contracted dims differ: lhs has {k_l}, rhs has {k_r}")
    bl, br = ls[:-2], rs[:-2]
    for a, b in zip(reversed(bl), reversed(br)):
        if Dim(a) != Dim(b) and Dim(a) != 1 and Dim(b) != 1:
            raise ValueError(f"{call}: batch dims do not broadcast ({a} vs {b})")


def matmul(lhs: Any, rhs: Any) -> Any:
    """Matrix product with batch broadcasting (``jnp.matmul``, at the backend policy's precision).
    The dtypes promote as a binary op's (``bfloat16 @ float32`` is float32; ``int32 @ float32``
    is refused), as MAX 26.7.

    Raises:
        ValueError: the contracted dims differ, batch dims that do not broadcast, dtypes MAX does
            not promote, or operands on two devices (names both shapes).
    """
    from maxjax.graph.ops.elementwise import common_dtype

    check_same_device("matmul", lhs, rhs)
    if hasattr(lhs, "shape") and hasattr(rhs, "shape"):
        _check_matmul(lhs, rhs)
    dl, dr = dtype_of(lhs), dtype_of(rhs)
    quantized = any(getattr(t, "quantization_encoding", None) is not None for t in (lhs, rhs))
    if dl is None or dr is None or dl == dr or quantized:
        return apply(_matmul, lhs, rhs, _name="matmul")
    dtype = common_dtype("matmul", dl, dr)
    return apply(_matmul, lhs, rhs, _name="matmul", _dtypes=[dtype], dtype=dtype.to_jax())


def _softmax(x: Any, *, axis: int) -> Any:
    return jax.nn.softmax(x, axis=axis)


@op_traits(uses_policy=True, accepts_layer_indexed=True, stored_rhs=True)
def _matmul_t(x: Any, w: Any, *, policy: Any, dtype: Any = None) -> Any:
    if isinstance(w, LayerIndexed):  # a per-layer weight in a scanned layer: each layer's buffer in place
        return w.apply(lambda layer: _matmul_t(x, layer, policy=policy, dtype=dtype))
    widened = policy.widens(x, w) and dtype == jnp.float32  # float32 x, bfloat16 w: widened in the product
    if dtype is not None and not policy.autocasts(x, w) and not widened:  # autocast: float32 x, bfloat16 w as they are
        x, w = jax.lax.convert_element_type(x, dtype), jax.lax.convert_element_type(w, dtype)
    return policy.matmul_t(x, w, stored=True)


@op_traits(uses_policy=True, accepts_layer_indexed=True)
def _matmul_t_cast(x: Any, w: Any, *, policy: Any, dtype: Any) -> Any:
    """:func:`_matmul_t` of operands cast to ``dtype`` first (not a product of ``w`` as stored)."""
    return _matmul_t(x, w, policy=policy, dtype=dtype)


def matmul_transposed(lhs: Any, rhs: Any) -> Any:
    """``lhs @ rhs.T`` for a weight ``rhs [out, in]``: ``lhs [..., in]`` -> ``[..., out]``, with
    :func:`matmul`'s checks and dtype promotion, formed by the backend policy's ``matmul_t`` (which
    contracts the weight in its stored layout; XLA:CPU materialises ``rhs.T`` for one-row products).
    What ``Linear`` and ``linear`` compute for float weights. Not one of MAX's op names.

    Raises:
        ValueError: as :func:`matmul` (shapes named).
    """
    from maxjax.graph.ops.elementwise import common_dtype

    from maxjax.graph.value import TensorValue
    from maxjax.graph.weight import Weight

    if isinstance(rhs, Weight) and isinstance(lhs, TensorValue) and lhs._graph is not None:
        rhs = rhs._resolve(lhs._graph)  # its value in the graph: the laid-out shape on a mesh
    check_same_device("matmul", lhs, rhs)
    if hasattr(lhs, "shape") and hasattr(rhs, "shape") and not isinstance(rhs, Weight):
        if len(rhs.shape) != 2:
            raise ValueError(f"matmul_transposed: the weight must have rank 2 [out, in], got shape {list(rhs.shape)}")
        _check_matmul(lhs, _Transposed(rhs.shape))
    dl, dr = dtype_of(lhs), dtype_of(rhs)
    if dl is None or dr is None or dl == dr:
        return apply(_matmul_t, lhs, rhs, _name="matmul")
    dtype = common_dtype("matmul", dl, dr)
    return apply(_matmul_t_cast, lhs, rhs, _name="matmul", _dtypes=[dtype], dtype=dtype.to_jax())


class _Transposed:
    """The shape of ``w.T`` for :func:`_check_matmul`'s messages, without building the transpose."""

    def __init__(self, shape: Any) -> None:
        self.shape = list(shape)[::-1]
        self.dtype = None

    def __repr__(self) -> str:
        return f"weight.T{self.shape}"


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

    Statistics are computed in float32; the result has ``input``'s dtype. ``gamma`` and ``beta``
    have the size of the last axis.

    Raises:
        ValueError: ``gamma`` or ``beta`` of another size than the (static) last dim of ``input``,
            or ``epsilon`` not positive (MAX 26.7's checks).
    """
    last = input.shape[-1]
    if hasattr(last, "__index__"):
        for name, t in (("Gamma", gamma), ("Beta", beta)):
            if hasattr(t, "shape") and len(t.shape) and t.shape[0] != last:
                raise ValueError(
                    f"layer_norm: {name} size {t.shape[0]} does not match dimension of reduction {last} "
                    f"(input {list(input.shape)}, {name.lower()} {list(t.shape)})"
                )
    if not epsilon > 0:
        raise ValueError(f"layer_norm: epsilon must be positive, got {epsilon}")
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
    casting back to ``input``'s dtype (Gemma style); otherwise after (Llama style, the default, as
    MAX 26.7's ``ops.rms_norm``; its ``nn.RMSNorm`` layer defaults to Gemma style).

    Raises:
        ValueError: ``weight`` is not ``[input.shape[-1]]``.
    """
    if hasattr(weight, "shape") and (len(weight.shape) != 1 or Dim(weight.shape[0]) != Dim(input.shape[-1])):
        raise ValueError(
            f"RMSNorm: Could not apply weight shape {list(weight.shape)} to input shape {list(input.shape)}, weight "
            "shape must match the final input dimension."
        )
    return apply(
        _rms_norm,
        input,
        weight,
        _name="rms_norm",
        epsilon=float(epsilon),
        weight_offset=float(weight_offset),
        multiply_before_cast=bool(multiply_before_cast),
    )


@op_traits(accepts_quantized=True)
def _dequantize(x: Any, *, encoding: Any) -> Any:
    return as_quantized(x, encoding).dequantize()


def dequantize(encoding: Any, quantized: Any) -> Any:
    """The float32 tensor of a quantized one: GGUF blocks uint8 ``[rows, bytes_per_row]`` (or a
    :class:`~maxjax.graph.quantization.QuantizedArray`, e.g. rows gathered from a quantized
    weight) in, float32 ``[rows, cols]`` out, bit-identical to the ``gguf`` package's dequantizer.

    Raises:
        TypeError: a symbolic last dimension (MAX 26.7's type).
        ValueError: a last dimension (bytes per row) that is not a whole number of blocks.
    """
    from maxjax.graph.value import TensorValue
    from maxjax.graph.weight import Weight

    raw_bytes = not (
        isinstance(quantized, (QuantizedArray, Weight))  # a quantized weight: its shape is the logical one
        or (isinstance(quantized, TensorValue) and isinstance(quantized._aval, QuantizedArray))
    )
    if raw_bytes and len(quantized.shape) > 0:
        last = Dim(quantized.shape[-1])
        if not isinstance(last, StaticDim):
            raise TypeError(f"dequantize only supported with static last dimension, got shape {list(quantized.shape)}")
        block = getattr(encoding, "block_size", None)
        if block and int(last) % block:
            raise ValueError(f"dequantize: last dimension ({int(last)}) not divisible by block size ({block})")
    return apply(_dequantize, quantized, _name=f"dequantize[{encoding.value}]", encoding=encoding)


@op_traits(accepts_quantized=True, uses_policy=True, accepts_layer_indexed=True)
def _qmatmul(x: Any, w: Any, *, encoding: Any, policy: Any) -> Any:
    if isinstance(w, StackIndexed):  # a scan step's layer of a stack, read in place by the policy's kernel
        return as_quantized(w.stack, encoding).layer_matmul(x, w.index, policy)
    return as_quantized(materialize(w), encoding).matmul(x, policy)


def qmatmul(encoding: Any, config: Any, lhs: Any, *rhs: Any) -> Any:
    """``lhs @ dequantize(encoding, rhs).T`` in float32 for a quantized weight ``rhs`` of logical
    shape ``[out, in]`` (GGUF blocks ``[out, bytes_per_row]``, or a ``QuantizedArray``).

    ``lhs`` is float32 ``[..., in]``; the result float32 ``[..., out]``. Under ``jax.jit`` the
    dequantization fuses into the product; how the product is formed is the backend policy's.

    Raises:
        ValueError: not one weight, or ``config`` given (GPTQ-style configs are not supported).
    """
    if len(rhs) != 1:
        raise ValueError(f"qmatmul expects one packed weight, got {len(rhs)}")
    if config is not None:
        raise NotImplementedError(f"qmatmul: quantization config {config!r} is not supported (GGUF encodings only)")
    return apply(_qmatmul, lhs, rhs[0], _name=f"qmatmul[{encoding.value}]", encoding=encoding)
