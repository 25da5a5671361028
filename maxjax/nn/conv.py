"""``Conv1D``, ``Conv2d``, ``Conv3D`` (MAX's ``max/nn/conv.py``): channels-last convolutions with
MAX's constructor arguments and weight names (``weight``, ``bias``; ``{name}.weight`` with
``name``), over :func:`maxjax.graph.ops.conv2d` / ``conv3d``.

Filters are stored in MAX's layout (``[k, C / groups, F]``, ``[kh, kw, C / groups, F]``,
``[kd, kh, kw, C / groups, F]``), or in PyTorch's (``[F, C / groups, k...]``) with
``permute=True``, which also takes and returns channels-first activations as PyTorch does.
"""

from __future__ import annotations

from typing import Any

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.sharding import ShardingStrategy
from maxjax.graph.type import ConvInputLayout, DeviceRef, FilterLayout
from maxjax.graph.weight import Weight
from maxjax.nn.layer import Module

__all__ = ["Conv1D", "Conv2d", "Conv3D", "FilterLayout"]


def _tuple(v: Any, n: int) -> tuple[int, ...]:
    return (v,) * n if isinstance(v, int) else tuple(v)


class _Conv(Module):
    """Shared weights, sharding (replicate only, as MAX) and bias of the convolutions."""

    def _weights(self, name: str | None, dtype: DType, shape: list[int], out_channels: int, device: Any, has_bias: bool) -> None:
        self.filter = Weight(f"{name}.weight" if name else "weight", dtype, shape, device or DeviceRef.CPU())
        self.bias: Weight | None = None
        if has_bias:
            self.bias = Weight(f"{name}.bias" if name else "bias", dtype, (out_channels,), device or DeviceRef.CPU())

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``replicate`` only (MAX's rule).

        Raises:
            ValueError: (setting) another strategy.
        """
        return self.filter.sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not strategy.is_replicate:
            raise ValueError(f"only replicate is supported for {type(self).__name__}, currently")
        self.filter.sharding_strategy = strategy
        if self.bias is not None:
            self.bias.sharding_strategy = strategy

    def shard(self, devices: Any) -> list[Any]:
        """One replica per device (MAX's ``shard``): copy ``i`` holds shard ``i`` of the weights
        and has ``device = devices[i]``."""
        devices = list(devices)
        shards = super().shard(devices)
        for copy, device in zip(shards, devices):
            object.__setattr__(copy, "device", device)
        return shards


class Conv1D(_Conv):
    """1-D convolution of ``x [batch, length, in_channels]`` (``[batch, in_channels, length]``
    with ``permute``). ``padding``: int or (left, right).

    Raises:
        ValueError: (called) wrong rank or channels (see ``ops.conv2d``).
    """

    def __init__(
        self,
        kernel_size: int,
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int = 1,
        num_groups: int = 1,
        device: DeviceRef | None = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size, self.in_channels, self.out_channels = kernel_size, in_channels, out_channels
        self.dtype, self.stride, self.dilation, self.num_groups = dtype, stride, dilation, num_groups
        self.device, self.has_bias, self.permute, self.name = device, has_bias, permute, name
        self.padding = _tuple(padding, 2)
        shape = [out_channels, in_channels // num_groups, kernel_size] if permute else [kernel_size, in_channels // num_groups, out_channels]
        self._weights(name, dtype, shape, out_channels, device, has_bias)

    def __call__(self, x: Any) -> Any:
        w = self.filter
        if self.permute:
            x = ops.permute(x, [0, 2, 1])  # [batch, length, C]
            w = ops.unsqueeze(w, 2)  # FCS -> FCRS
        else:
            w = ops.unsqueeze(w, 0)  # SCF -> RSCF
        x = ops.unsqueeze(x, 1)  # [batch, 1, length, C]
        out = ops.conv2d(
            x, w, (1, self.stride), (1, self.dilation), (0, 0, *self.padding), self.num_groups, self.bias,
            filter_layout=FilterLayout.FCRS if self.permute else FilterLayout.RSCF,
        )  # fmt: skip
        out = ops.squeeze(out, 1)  # [batch, new_length, F]
        return ops.permute(out, [0, 2, 1]) if self.permute else out


class Conv2d(_Conv):
    """2-D convolution of ``x [batch, height, width, in_channels]`` (``[batch, C, H, W]`` with
    ``permute``). ``padding``: int, (pad_h, pad_w) or (top, bottom, left, right)."""

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | tuple[int, int, int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        num_groups: int = 1,
        device: DeviceRef | None = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = _tuple(kernel_size, 2)
        self.in_channels, self.out_channels, self.dtype = in_channels, out_channels, dtype
        self.device, self.permute, self.num_groups, self.has_bias, self.name = device, permute, num_groups, has_bias, name
        kh, kw = self.kernel_size
        shape = [out_channels, in_channels // num_groups, kh, kw] if permute else [kh, kw, in_channels // num_groups, out_channels]
        self._weights(name, dtype, shape, out_channels, device, has_bias)
        self.stride = _tuple(stride, 2)
        if isinstance(padding, int):
            padding = (padding,) * 4
        elif len(padding) == 2:
            padding = (padding[0], padding[0], padding[1], padding[1])
        self.padding = tuple(padding)
        self.dilation = _tuple(dilation, 2)

    def __call__(self, x: Any) -> Any:
        if self.permute:
            x = ops.permute(x, [0, 2, 3, 1])  # NCHW -> NHWC
        out = ops.conv2d(
            x, self.filter, self.stride, self.dilation, self.padding, self.num_groups, self.bias,
            input_layout=ConvInputLayout.NHWC, filter_layout=FilterLayout.FCRS if self.permute else FilterLayout.RSCF,
        )  # fmt: skip
        return ops.permute(out, [0, 3, 1, 2]) if self.permute else out


class Conv3D(_Conv):
    """3-D convolution of ``x [batch, depth, height, width, in_channels]`` (channels-first with
    ``permute``). ``padding``: int, (d, h, w) or (front, back, top, bottom, left, right)."""

    def __init__(
        self,
        depth: int,
        height: int,
        width: int,
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int | tuple[int, int, int] = 1,
        padding: int | tuple[int, int, int] | tuple[int, int, int, int, int, int] = 0,
        dilation: int | tuple[int, int, int] = 1,
        num_groups: int = 1,
        device: DeviceRef | None = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = (depth, height, width)
        self.in_channels, self.out_channels, self.dtype = in_channels, out_channels, dtype
        self.device, self.permute, self.num_groups, self.has_bias, self.name = device, permute, num_groups, has_bias, name
        cg = in_channels // num_groups
        shape = [out_channels, cg, depth, height, width] if permute else [depth, height, width, cg, out_channels]
        self._weights(name, dtype, shape, out_channels, device, has_bias)
        self.stride = _tuple(stride, 3)
        if isinstance(padding, int):
            padding = (padding,) * 6
        elif len(padding) == 3:
            padding = (padding[0], padding[0], padding[1], padding[1], padding[2], padding[2])
        self.padding = tuple(padding)
        self.dilation = _tuple(dilation, 3)

    def __call__(self, x: Any) -> Any:
        w = self.filter
        if self.permute:
            w = ops.permute(w, [2, 3, 4, 1, 0])  # FCQRS -> QRSCF
            x = ops.permute(x, [0, 2, 3, 4, 1])  # NCDHW -> NDHWC
        out = ops.conv3d(x, w, self.stride, self.dilation, self.padding, self.num_groups, self.bias)
        return ops.permute(out, [0, 4, 1, 2, 3]) if self.permute else out
