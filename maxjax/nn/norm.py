"""``RMSNorm`` and ``LayerNorm`` (MAX's constructor arguments and weight names)."""

from __future__ import annotations

from typing import Any, Sequence

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.type import DeviceRef
from maxjax.graph.weight import Weight
from maxjax.nn.layer import Module

__all__ = ["RMSNorm", "LayerNorm"]


class RMSNorm(Module):
    """RMS normalization over the last axis with a learned ``weight [dim]`` (see ``ops.rms_norm``).

    As in MAX 26.7, the layer's ``multiply_before_cast`` defaults to True (Gemma style: the weight
    multiplies the float32 normalized input, then the result is cast to the input's dtype) while
    ``ops.rms_norm``'s defaults to False (Llama style); and the weight is cast to the input's dtype
    before the op, as MAX's layer does.

    Raises:
        ValueError: (when called) the input's last dimension is not ``dim``.
    """

    def __init__(
        self,
        dim: int,
        dtype: DType,
        eps: float = 1e-6,
        weight_offset: float = 0.0,
        multiply_before_cast: bool = True,
        device: DeviceRef | None = None,
    ) -> None:
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight_offset = weight_offset
        self.multiply_before_cast = multiply_before_cast
        self.weight = Weight("weight", dtype, (dim,), device or DeviceRef.CPU())

    def __call__(self, x: Any) -> Any:
        if x.shape[-1] != self.dim:
            raise ValueError(f"RMSNorm weight dimension ({self.dim}) must match the input's last dimension ({x.shape[-1]})")
        weight = self.weight if self.weight.dtype == x.dtype else ops.cast(self.weight, x.dtype)
        return ops.rms_norm(x, weight, self.eps, self.weight_offset, self.multiply_before_cast)


class LayerNorm(Module):
    """Layer normalization over the last axis with ``weight`` (and ``bias`` when ``use_bias``)."""

    def __init__(
        self,
        dims: int,
        devices: Sequence[DeviceRef] = (),
        dtype: DType = DType.float32,
        eps: float = 1e-5,
        use_bias: bool = True,
    ) -> None:
        super().__init__()
        device = list(devices)[0] if devices else DeviceRef.CPU()
        self.dims, self.eps, self.use_bias = dims, eps, use_bias
        self.weight = Weight("weight", dtype, (dims,), device)
        self.bias = Weight("bias", dtype, (dims,), device) if use_bias else None

    def __call__(self, x: Any) -> Any:
        beta = self.bias if self.bias is not None else ops.constant(0.0, self.weight.dtype) * self.weight
        return ops.layer_norm(x, self.weight, beta, self.eps)
