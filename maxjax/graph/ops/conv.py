"""``ops.conv2d`` and ``ops.conv3d`` (MAX's ``max.graph.ops.conv``): channels-last convolutions,
one ``jax.lax.conv_general_dilated`` each.

Input ``NHWC`` (``NDHWC``); filter ``RSCF`` (``QRSCF``: spatial axes, input channels per group,
output channels) or PyTorch's ``FCRS`` (``FCQRS``); ``padding`` as (before, after) per spatial
axis in order; ``groups`` splits the channels; ``bias [F]`` added. Output spatial size per axis:
``(in + before + after - dilation * (k - 1) - 1) // stride + 1``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxjax.graph.ops._core import apply, check_same_device
from maxjax.graph.type import ConvInputLayout, Dim, FilterLayout, StaticDim
from maxjax.graph.value import TensorValue

__all__ = ["conv2d", "conv3d"]

_SPEC = {2: ("NHWC", {"RSCF": "HWIO", "FCRS": "OIHW"}), 3: ("NDHWC", {"QRSCF": "DHWIO", "FCQRS": "OIDHW"})}


def conv_dtype(op: str, x: Any, filter: Any) -> Any:  # noqa: A002 - MAX's name
    """MAX's dtype of a convolution: the common dtype of ``x`` and a tensor/Weight ``filter``
    (bfloat16 with float32 is float32); a NumPy filter in a graph is weak and takes ``x``'s.

    Raises:
        ValueError: the two dtypes do not promote (elementwise ``common_dtype``'s rule).
    """
    from maxjax.graph.ops._core import dtype_of
    from maxjax.graph.ops.elementwise import _is_strong, common_dtype
    from maxjax.graph.weight import Weight

    dx = dtype_of(x)
    if not (_is_strong(filter) or isinstance(filter, Weight)) or dtype_of(filter) is None:
        return dx
    return common_dtype(op, dx, dtype_of(filter))


def _conv(
    x: Any, w: Any, *b: Any, stride: tuple, dilation: tuple, padding: tuple, groups: int, lhs: str, rhs: str, dtype: Any
) -> Any:
    pads = [(padding[2 * i], padding[2 * i + 1]) for i in range(len(stride))]
    x = x.astype(dtype)  # [N, *spatial, C] in the promoted dtype
    y = jax.lax.conv_general_dilated(
        x, w.astype(dtype), window_strides=stride, padding=pads, rhs_dilation=dilation,
        dimension_numbers=(lhs, rhs, lhs), feature_group_count=groups, preferred_element_type=jnp.float32,
    )  # fmt: skip
    if b:
        y = y + b[0].astype(jnp.float32)
    return y.astype(x.dtype)


def _check(op: str, x: Any, w: Any, n: int, filter_layout: str, groups: int, stride: Any, dilation: Any, padding: Any) -> str:
    if len(x.shape) != n + 2:
        raise ValueError(f"{op}: input must have rank {n + 2} (N, spatial..., C), got shape {list(x.shape)}")
    if len(w.shape) != n + 2:
        raise ValueError(f"{op}: filter must have rank {n + 2}, got shape {list(w.shape)}")
    if len(stride) != n or len(dilation) != n or len(padding) != 2 * n:
        raise ValueError(f"{op}: stride and dilation need {n} values and padding {2 * n}, got {stride}, {dilation}, {padding}")
    rhs = _SPEC[n][1].get(FilterLayout(filter_layout).value)
    if rhs is None:
        raise ValueError(f"{op}: filter_layout {filter_layout!r} is not supported (supported: {sorted(_SPEC[n][1])})")
    in_per_group = w.shape[rhs.index("I")]
    c = x.shape[-1]
    if not isinstance(Dim(c), StaticDim) or not isinstance(Dim(in_per_group), StaticDim):
        return rhs  # a symbolic channel count: checked when the graph runs (see _run)
    if int(c) % groups or int(in_per_group) * groups != int(c):
        raise ValueError(
            f"{op}: input channels ({c}) must equal the filter's input channels per group ({in_per_group}) x groups ({groups})"
        )
    return rhs


def _run(op: str, n: int, x: Any, filter: Any, stride: Any, dilation: Any, padding: Any, groups: int, bias: Any, input_layout: Any, filter_layout: Any) -> Any:  # noqa: A002
    if ConvInputLayout(input_layout) != ConvInputLayout.NHWC:
        raise NotImplementedError(f"{op}: input_layout={input_layout!r}; maxjax takes channels-last inputs (NHWC)")
    check_same_device(op, x=x, filter=filter)
    dtype = conv_dtype(op, x, filter)  # before the shapes, as MAX 26.7 checks them
    rhs = _check(op, x, filter, n, filter_layout, groups, tuple(stride), tuple(dilation), tuple(padding))
    in_per_group = Dim(filter.shape[rhs.index("I")])
    if isinstance(x, TensorValue) and not isinstance(Dim(x.shape[-1]), StaticDim) and isinstance(in_per_group, StaticDim):
        # MAX builds a conv over a symbolic channel count; the filter fixes it, checked at run time
        x = x.rebind([*x.shape[:-1], int(in_per_group) * int(groups)], message=f"{op}: input channels must equal the filter's")
    tensors = (x, filter) if bias is None else (x, filter, bias)
    return apply(
        _conv, *tensors, _name=op, _dtypes=[dtype], dtype=dtype.to_jax(), stride=tuple(int(s) for s in stride), dilation=tuple(int(d) for d in dilation),
        padding=tuple(int(p) for p in padding), groups=int(groups), lhs=_SPEC[n][0], rhs=rhs,
    )  # fmt: skip


def conv2d(
    x: Any,
    filter: Any,  # noqa: A002 - MAX's name
    stride: tuple[int, int] = (1, 1),
    dilation: tuple[int, int] = (1, 1),
    padding: tuple[int, int, int, int] = (0, 0, 0, 0),
    groups: int = 1,
    bias: Any = None,
    input_layout: ConvInputLayout = ConvInputLayout.NHWC,
    filter_layout: FilterLayout = FilterLayout.RSCF,
) -> Any:
    """2-D convolution of ``x [N, H, W, C]`` (see the module docstring); padding ``(top, bottom,
    left, right)``.

    Raises:
        ValueError: wrong ranks, channel counts or argument lengths, an unsupported filter layout
            (at build time).
        NotImplementedError: an NCHW ``input_layout``.
    """
    return _run("conv2d", 2, x, filter, stride, dilation, padding, groups, bias, input_layout, filter_layout)


def conv3d(
    x: Any,
    filter: Any,  # noqa: A002 - MAX's name
    stride: tuple[int, int, int] = (1, 1, 1),
    dilation: tuple[int, int, int] = (1, 1, 1),
    padding: tuple[int, int, int, int, int, int] = (0, 0, 0, 0, 0, 0),
    groups: int = 1,
    bias: Any = None,
    input_layout: ConvInputLayout = ConvInputLayout.NHWC,
    filter_layout: FilterLayout = FilterLayout.QRSCF,
) -> Any:
    """3-D convolution of ``x [N, D, H, W, C]`` (see the module docstring); padding per spatial
    axis (before, after).

    Raises:
        ValueError, NotImplementedError: as :func:`conv2d`.
    """
    return _run("conv3d", 3, x, filter, stride, dilation, padding, groups, bias, input_layout, filter_layout)
