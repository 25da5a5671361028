"""``Linear`` and ``MLP`` with MAX's constructor arguments and weight names."""

from __future__ import annotations

from typing import Any, Sequence

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.type import DeviceRef
from maxjax.graph.weight import Weight
from maxjax.nn.layer import Module

__all__ = ["Linear", "MLP"]


class Linear(Module):
    """``y = x @ weight.T (+ bias)`` with ``weight`` of shape ``[out_dim, in_dim]`` (MAX's ``nn.Linear``).

    With a GGUF ``quantization_encoding`` the weight is declared as MAX declares it, uint8 blocks
    ``[out_dim, bytes_per_row]``; it runs as a quantized tensor (``ops.qmatmul``: float32
    arithmetic, the dequantization fused into the product).

    Weight keys: ``weight`` and ``bias`` (``{name}.weight`` when ``name`` is given).

    Args:
        in_dim, out_dim: features in and out.
        dtype: the weight's (and bias's) dtype when not quantized.
        device: where the weights live.
        has_bias: add a ``bias [out_dim]``.
        quantization_encoding: a GGUF encoding of the weight, or None.
        quant_config: MAX's config of FP8/FP4/int8 weight scales; not supported (must be None).
        name: a prefix for the weight keys.
        clip_weight: clamp the (unquantized) weight to ``[-clip, clip]`` before use.
        is_sharding: MAX's flag for building a shard: no Weights are created (the caller assigns
            the shard's ``weight`` and ``bias``).

    Raises:
        NotImplementedError: a ``quant_config``.
        ValueError: ``in_dim`` is not a whole number of blocks of ``quantization_encoding``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        dtype: DType,
        device: DeviceRef | None = None,
        has_bias: bool = False,
        quantization_encoding: Any = None,
        quant_config: Any = None,
        name: str | None = None,
        clip_weight: float | None = None,
        is_sharding: bool = False,
    ) -> None:
        super().__init__()
        if quant_config is not None:
            raise NotImplementedError(
                f"Linear(quant_config={quant_config!r}): MAX's FP8/FP4/int8 scale configs are not supported by maxjax; "
                "GGUF weights use quantization_encoding"
            )
        self.in_dim, self.out_dim = in_dim, out_dim
        self.dtype = dtype
        self.device = device or DeviceRef.CPU()
        self.has_bias = has_bias
        self.clip_weight = clip_weight
        self.quantization_encoding = quantization_encoding
        self.bias: Weight | None = None
        if is_sharding:
            return
        prefix = f"{name}." if name else ""
        if quantization_encoding is not None:
            shape = quantization_encoding.packed_shape((out_dim, in_dim))
            self.weight = Weight(f"{prefix}weight", DType.uint8, shape, self.device, quantization_encoding=quantization_encoding)
        else:
            self.weight = Weight(f"{prefix}weight", dtype, (out_dim, in_dim), self.device)
        if has_bias:
            self.bias = Weight(f"{prefix}bias", dtype, (out_dim,), self.device)

    def __call__(self, x: Any) -> Any:
        enc = self.weight.quantization_encoding
        if enc is not None:
            y = ops.qmatmul(enc, None, x.cast(DType.float32) if x.dtype != DType.float32 else x, self.weight)
            y = y.cast(x.dtype) if x.dtype != DType.float32 else y
        else:
            w = self.weight
            if self.clip_weight:
                w = ops.max(ops.min(w, self.clip_weight), -self.clip_weight)
            y = x @ w.T
        if self.bias is not None:
            y = y + self.bias
        return y


_ACTIVATIONS = {
    "silu": ops.silu,
    "gelu": ops.gelu,
    "gelu_tanh": lambda x: ops.gelu(x, approximate="tanh"),
    "relu": ops.relu,
    "tanh": ops.tanh,
    "sigmoid": ops.sigmoid,
}


class MLP(Module):
    """Gated feed-forward block (SwiGLU with ``silu``): ``down(act(gate(x)) * up(x))``.

    MAX's ``nn.MLP`` arguments; weight keys ``gate_proj.weight``, ``up_proj.weight``,
    ``down_proj.weight`` (and ``.bias`` with ``has_bias``).

    Raises:
        ValueError: an unknown ``activation_function`` (lists the supported ones).
    """

    def __init__(
        self,
        dtype: DType,
        quantization_encoding: Any,
        hidden_dim: int,
        feed_forward_length: int,
        devices: Sequence[DeviceRef] = (),
        linear_cls: type = Linear,
        has_bias: bool = False,
        activation_function: str = "silu",
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if activation_function not in _ACTIVATIONS:
            raise ValueError(
                f"MLP: unsupported activation_function {activation_function!r} (supported: {sorted(_ACTIVATIONS)})"
            )
        device = list(devices)[0] if devices else DeviceRef.CPU()
        self.devices = list(devices)
        self.activation_function = activation_function
        self.gate_proj = linear_cls(hidden_dim, feed_forward_length, dtype, device, has_bias, quantization_encoding)
        self.down_proj = linear_cls(feed_forward_length, hidden_dim, dtype, device, has_bias, quantization_encoding)
        self.up_proj = linear_cls(hidden_dim, feed_forward_length, dtype, device, has_bias, quantization_encoding)

    def __call__(self, x: Any) -> Any:
        act = _ACTIVATIONS[self.activation_function]
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))
