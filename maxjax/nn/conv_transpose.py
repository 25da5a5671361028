"""``ConvTranspose1d`` and ``WeightNormConvTranspose1d`` (MAX's ``max/nn/conv_transpose.py``):
1-D transposed convolutions over :func:`maxjax.graph.ops.conv2d_transpose` with a height-1 axis,
with MAX's constructor arguments, attributes and weight names.

Weights: ``weight [length, out_channels, in_channels]`` (MAX's layout), or
``[in_channels, out_channels, length]`` (PyTorch's ``ConvTranspose1d`` layout) with
``permute=True``, which also takes ``[batch, in_channels, length]`` and returns
``[batch, out_channels, new_length]`` as PyTorch does; ``bias [out_channels]``;
``new_length = (length_in - 1) * stride + dilation * (k - 1) + 1 - pad_left - pad_right + output_padding``.

MAX 26.7's rules kept: an int ``stride``/``dilation``/``output_padding`` applies to the length
axis (``(1, s)``), an int ``padding`` p is ``(0, 0, p, p)`` and a tuple must be the 4-tuple
``(top, bottom, left, right)``. Without ``permute`` MAX adds the bias with ops.conv2d_transpose's
NCHW rule (see :mod:`maxjax.graph.ops.conv_transpose`), which builds only for ``out_channels == 1``;
maxjax gives the same result and the same build-time error. (MAX 26.7's CPU kernel also refuses the
CFRS filter that ``permute=True`` uses; maxjax runs it, with PyTorch's semantics.)
"""

from __future__ import annotations

from typing import Any

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.type import ConvInputLayout, DeviceRef, FilterLayout
from maxjax.graph.weight import Weight
from maxjax.nn.layer import Module

__all__ = ["ConvTranspose1d", "WeightNormConvTranspose1d"]


class ConvTranspose1d(Module):
    """1-D transposed convolution of ``x [batch, length, in_channels]`` to
    ``[batch, new_length, out_channels]`` (channels-first with ``permute``; see the module
    docstring).

    Raises:
        ValueError: (called) wrong rank or channels, or MAX's bias rule (see the module docstring).
    """

    bias: Weight | None = None

    def __init__(
        self,
        length: int,
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int, int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        output_padding: int | tuple[int, int] = 0,
        device: DeviceRef | None = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.kernel_length = length
        self.device = device
        self.permute = permute
        shape = [in_channels, out_channels, length] if permute else [length, out_channels, in_channels]
        self.weight = Weight(f"{name}.weight" if name else "weight", dtype, shape, device or DeviceRef.CPU())
        if has_bias:
            self.bias = Weight(f"{name}.bias" if name else "bias", dtype, (out_channels,), device or DeviceRef.CPU())
        self.stride = (1, stride) if isinstance(stride, int) else stride
        self.output_padding = (0, output_padding) if isinstance(output_padding, int) else output_padding
        self.padding = (0, 0, padding, padding) if isinstance(padding, int) else padding
        self.dilation = (1, dilation) if isinstance(dilation, int) else dilation

    def _transpose_conv(self, x: Any, weight: Any, bias: Any) -> Any:
        if self.permute:
            x = ops.unsqueeze(x, 2)  # [batch, in_channels, 1, length]
            weight = ops.unsqueeze(weight, 2)  # [in_channels, out_channels, 1, k] (CFRS)
        else:
            x = ops.unsqueeze(x, 1)  # [batch, 1, length, in_channels]
            weight = ops.unsqueeze(weight, 0)  # [1, k, out_channels, in_channels] (RSCF)
        res = ops.conv2d_transpose(
            x, weight, stride=self.stride, dilation=self.dilation, padding=self.padding,
            output_paddings=self.output_padding, bias=bias,
            input_layout=ConvInputLayout.NCHW if self.permute else ConvInputLayout.NHWC,
            filter_layout=FilterLayout.CFRS if self.permute else FilterLayout.RSCF,
        )  # fmt: skip
        # [batch, out_channels, 1, new_length] (permute) or [batch, 1, new_length, out_channels]
        return ops.squeeze(res, 2 if self.permute else 1)

    def __call__(self, x: Any) -> Any:
        return self._transpose_conv(x, self.weight, self.bias)


class WeightNormConvTranspose1d(Module):
    """:class:`ConvTranspose1d` with weight normalisation (Salimans & Kingma 2016,
    https://arxiv.org/abs/1602.07868) computed as MAX 26.7 does: ``weight = weight_v /
    ||weight_v|| * weight_g``, the norm over each slice along ``weight_v``'s axis 0.

    Weights: ``weight_g [in_channels, 1, 1]``, ``weight_v`` (``ConvTranspose1d``'s weight shape),
    ``bias [out_channels]``; ``{name}.`` prefixes with ``name``. As in MAX 26.7 the state_dict also
    holds the inner layer's unused ``conv.{name}.weight`` (and ``conv.{name}.bias``) entries. With ``permute`` axis 0 is the
    input channel (PyTorch's ``weight_norm(dim=0)``); without it MAX normalises over the kernel
    axis and ``weight_g`` must broadcast against ``[length, out_channels, in_channels]``
    (``length == in_channels`` or 1), else the call fails at build time as in MAX.

    Unlike MAX, the normalised weight is recomputed on every call rather than cached on
    ``self.conv`` (no module is mutated while tracing); the numbers are the same.
    """

    def __init__(
        self,
        length: int,
        in_channels: int,
        out_channels: int,
        dtype: DType,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int, int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        output_padding: int | tuple[int, int] = 0,
        device: DeviceRef | None = None,
        has_bias: bool = False,
        permute: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.device = device
        self.conv = ConvTranspose1d(
            length, in_channels, out_channels, dtype, stride, padding, dilation, output_padding, device, has_bias, permute, name
        )
        self.weight_g = Weight(f"{name}.weight_g" if name else "weight_g", dtype, (in_channels, 1, 1), device or DeviceRef.CPU())
        v_shape = self.conv.weight.shape  # the inner layer's filter layout (permute or not)
        self.weight_v = Weight(f"{name}.weight_v" if name else "weight_v", dtype, v_shape, device or DeviceRef.CPU())
        self.bias = self.conv.bias
        # MAX 26.7 deletes conv.weight / conv.bias as attributes, but its Module keeps them
        # registered: they stay in the state_dict as ``conv.{name}.weight`` (and ``.bias``),
        # unused. Same here: the attributes go, the registrations stay.
        object.__delattr__(self.conv, "weight")
        if "bias" in vars(self.conv):
            object.__delattr__(self.conv, "bias")

    def __call__(self, x: Any) -> Any:
        v = self.weight_v
        n = int(v.shape[0])
        v_norm = ops.reshape(ops.sqrt(ops.sum(ops.reshape(ops.mul(v, v), [n, -1]), axis=1)), [n, 1, 1])  # [n, 1, 1]
        w = ops.mul(ops.div(v, v_norm), self.weight_g)
        return self.conv._transpose_conv(x, w, self.bias)
