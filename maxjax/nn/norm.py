"""``RMSNorm``, ``LayerNorm``, ``ConstantLayerNorm`` and ``GroupNorm`` (MAX's constructor
arguments and weight names)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.ops.shape import literal_constant
from maxjax.graph.sharding import ShardingStrategy
from maxjax.graph.type import DeviceRef
from maxjax.graph.weight import Weight
from maxjax.nn.layer import Module

__all__ = ["ConstantLayerNorm", "GroupNorm", "LayerNorm", "RMSNorm"]


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

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``replicate`` only, as in MAX."""
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not strategy.is_replicate:
            raise ValueError("RMSNorm only supports replicate strategy")
        self.weight.sharding_strategy = strategy

    def shard(self, devices: Sequence[DeviceRef]) -> list["RMSNorm"]:
        """One RMSNorm per device holding ``weight[i]`` (MAX's ``RMSNorm.shard``).

        Raises:
            ValueError: no sharding strategy was set.
        """
        shards = []
        for device, w in zip(devices, self.weight.shard(devices)):
            sharded = RMSNorm(self.dim, self.weight.dtype, self.eps, self.weight_offset, self.multiply_before_cast, device)
            sharded.weight = w
            shards.append(sharded)
        return shards

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

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``replicate`` only, as in MAX (weight and bias)."""
        return self.weight.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not strategy.is_replicate:
            raise ValueError("LayerNorm only supports replicate strategy")
        self.weight.sharding_strategy = strategy
        if self.bias is not None:
            self.bias.sharding_strategy = strategy

    def shard(self, devices: Sequence[DeviceRef]) -> list["LayerNorm"]:
        """One LayerNorm per device holding ``weight[i]`` and ``bias[i]`` (MAX's ``LayerNorm.shard``).

        Raises:
            ValueError: no sharding strategy was set.
        """
        devices = list(devices)
        weights = self.weight.shard(devices)
        biases = self.bias.shard(devices) if self.bias is not None else [None] * len(devices)
        shards = []
        for device, w, b in zip(devices, weights, biases):
            sharded = LayerNorm(self.dims, [device], self.weight.dtype, self.eps, self.use_bias)
            sharded.weight, sharded.bias = w, b
            shards.append(sharded)
        return shards

    def __call__(self, x: Any) -> Any:
        beta = self.bias if self.bias is not None else literal_constant(0.0, self.weight.dtype) * self.weight
        return ops.layer_norm(x, self.weight, beta, self.eps)


class ConstantLayerNorm(Module):
    """Layer normalization with constant ``gamma = 1``, ``beta = 0`` (MAX's ``ConstantLayerNorm``:
    no weights), computed in float32 and cast back to the input's dtype."""

    def __init__(self, dims: int | tuple[int, ...], device: DeviceRef, dtype: DType, eps: float = 1e-5) -> None:
        super().__init__()
        self.gamma = np.ones(dims, dtype=np.float32)
        self.beta = np.zeros(dims, dtype=np.float32)
        self.eps, self.device, self.dtype = eps, device, dtype

    def __call__(self, input: Any) -> Any:  # noqa: A002 - MAX's name
        gamma = literal_constant(self.gamma, DType.float32)
        beta = literal_constant(self.beta, DType.float32)
        return ops.cast(ops.layer_norm(ops.cast(input, DType.float32), gamma, beta, self.eps), input.dtype)


class GroupNorm(Module):
    """Group normalization of ``x [N, C, *]`` (MAX's ``GroupNorm``; ``ops.group_norm``) with
    float32 ``weight``/``bias`` ``[num_channels]`` when ``affine``.

    Raises:
        ValueError: ``num_channels`` not divisible by ``num_groups``; (called) an input of rank
            below 2 or with another channel count.
    """

    def __init__(
        self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device: DeviceRef = DeviceRef.GPU()
    ) -> None:  # noqa: B008 - MAX's default
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"num_channels({num_channels}) should be divisible by num_groups({num_groups})")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight: Weight | None = None
        self.bias: Weight | None = None
        if affine:
            self.weight = Weight("weight", DType.float32, (num_channels,), device)
            self.bias = Weight("bias", DType.float32, (num_channels,), device)

    def __call__(self, x: Any) -> Any:
        if len(x.shape) < 2:
            raise ValueError(f"Expected input tensor with >=2 dimensions, got shape {x.shape}")
        if x.shape[1] != self.num_channels:
            raise ValueError(f"Expected {self.num_channels} channels, got shape {x.shape}")
        if self.affine:
            gamma, beta = ops.cast(self.weight, x.dtype), ops.cast(self.bias, x.dtype)
        else:
            gamma = literal_constant(np.ones(self.num_channels, np.float32), x.dtype)
            beta = literal_constant(np.zeros(self.num_channels, np.float32), x.dtype)
        return ops.group_norm(x, gamma, beta, self.num_groups, self.eps)
