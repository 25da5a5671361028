"""``ops.conv2d_transpose`` (MAX's ``max.graph.ops.conv_transpose``): the 2-D transposed
convolution (the gradient of a convolution with respect to its input), one
``jax.lax.conv_general_dilated`` over the stride-dilated input with the flipped filter.

Layouts (MAX's): input ``NHWC`` ``[N, H, W, C_in]`` or ``NCHW``; filter ``RSCF`` =
``[kh, kw, C_out, C_in]`` or ``CFRS`` = ``[C_in, C_out, kh, kw]`` (PyTorch's ``ConvTranspose2d``
weight); the output has the input's layout. ``padding = (top, bottom, left, right)`` crops the
output; ``output_paddings`` adds rows/columns at the end. Output size per spatial axis:
``(in - 1) * stride + dilation * (k - 1) + 1 - before - after + output_padding``
(https://d2l.ai/chapter_computer-vision/transposed-conv.html).

MAX 26.7 adds ``bias`` by permuting the result with ``[0, 2, 3, 1]`` (NCHW -> NHWC), adding and
permuting back, for either layout (``max/graph/ops/conv_transpose.py``). With ``NCHW`` that is
the per-channel bias. With ``NHWC`` it adds ``bias`` along the *height* axis instead, so it
builds only when the height equals ``len(bias)`` (or broadcasts with it); maxjax composes the
same ops and so gives MAX's numbers and MAX's build-time errors there too.

Checked against MAX 26.7's numbers for NHWC/RSCF (strides, dilations, paddings, output paddings,
the bias rule). MAX's CPU kernel does not compile the CFRS filter layout ("Filter layout CFRS is
not supported"); maxjax runs it as the RSCF filter permuted, and NCHW as NHWC permuted (tests).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxjax.graph.ops._core import apply, check_same_device
from maxjax.graph.ops.conv import conv_dtype
from maxjax.graph.ops.pooling import _static
from maxjax.graph.type import ConvInputLayout, FilterLayout
from maxjax.graph.value import TensorValue

__all__ = ["conv2d_transpose"]

# filter layout -> (lax rhs spec, its spatial axes); O = the result's channels (C_out), I = C_in
_RHS = {"RSCF": ("HWOI", (0, 1)), "CFRS": ("IOHW", (2, 3))}


def _conv_transpose(
    x: Any, w: Any, *, stride: tuple, dilation: tuple, padding: tuple, output_paddings: tuple, lhs: str, rhs: str, flip: tuple,
    dtype: Any,
) -> Any:
    x = x.astype(dtype)  # in the promoted dtype (conv.conv_dtype)
    k = [w.shape[a] for a in flip]  # (kh, kw)
    pads = [
        (dilation[i] * (k[i] - 1) - padding[2 * i], dilation[i] * (k[i] - 1) - padding[2 * i + 1] + output_paddings[i])
        for i in range(2)
    ]  # negative entries crop
    y = jax.lax.conv_general_dilated(
        x, jnp.flip(w, flip).astype(dtype), window_strides=(1, 1), padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=(lhs, rhs, lhs), preferred_element_type=jnp.float32,
    )  # fmt: skip
    return y.astype(x.dtype)  # [N, H_out, W_out, C_out] (NHWC) or [N, C_out, H_out, W_out] (NCHW)


def conv2d_transpose(
    x: Any,
    filter: Any,  # noqa: A002 - MAX's name
    stride: tuple[int, int] = (1, 1),
    dilation: tuple[int, int] = (1, 1),
    padding: tuple[int, int, int, int] = (0, 0, 0, 0),
    output_paddings: tuple[int, int] = (0, 0),
    bias: Any = None,
    input_layout: ConvInputLayout = ConvInputLayout.NHWC,
    filter_layout: FilterLayout = FilterLayout.RSCF,
) -> Any:
    """2-D transposed convolution of ``x`` (see the module docstring for layouts, sizes and MAX's
    bias rule). The result has ``x``'s dtype (accumulated in float32).

    Raises:
        ValueError: (at build time, as MAX) ``x`` or ``filter`` not rank 4, ``bias`` not rank 1,
            an output padding not smaller than its stride, input channels not matching the
            filter's, a non-positive output size, a filter layout other than RSCF/CFRS, or a bias
            that does not broadcast (MAX's permute-add rule).
    """
    if bias is not None and len(bias.shape) != 1:
        raise ValueError("bias for a 2-D deconvolution must be rank 1 with shape (out_channels,)")
    if len(x.shape) != 4:
        raise ValueError("input to a 2-D deconvolution must be rank 4 with shape (batch_size, height, width, in_channels)")
    if len(filter.shape) != 4:
        raise ValueError("filter for a 2-D deconvolution must be rank 4 with shape (height, width, out_channels, in_channels)")
    if output_paddings[0] >= stride[0] or output_paddings[1] >= stride[1]:
        raise ValueError(f"output padding must be smaller than either stride or dilation, but got output_padding = {tuple(output_paddings)}")
    check_same_device("conv2d_transpose", x=x, filter=filter)  # where MAX checks it
    layout = FilterLayout(filter_layout).value
    if layout not in _RHS:
        raise ValueError(f"conv2d_transpose: filter_layout {layout!r} is not supported (supported: ['CFRS', 'RSCF'])")
    rhs, flip = _RHS[layout]
    lhs = ConvInputLayout(input_layout).value
    c_in, f_in = _static(x.shape[lhs.index("C")]), _static(filter.shape[rhs.index("I")])
    if c_in is not None and f_in is not None and c_in != f_in:
        raise ValueError(
            f"conv2d_transpose: input channels ({c_in}, axis {lhs.index('C')} of {lhs} input) must match the "
            f"filter's input channels ({f_in}, axis {rhs.index('I')} of {layout} filter)"
        )
    if c_in is None and f_in is not None and isinstance(x, TensorValue):
        # a symbolic channel count: the filter fixes it, checked when the graph runs (as conv2d)
        shape = list(x.shape)
        shape[lhs.index("C")] = f_in
        x = x.rebind(shape, message="conv2d_transpose: input channels must equal the filter's")
    for i, axis in enumerate("HW"):
        n, k = _static(x.shape[lhs.index(axis)]), _static(filter.shape[flip[i]])
        if n is not None and k is not None:
            size = (n - 1) * stride[i] + dilation[i] * (k - 1) + 1 - padding[2 * i] - padding[2 * i + 1] + output_paddings[i]
            if size <= 0:
                raise ValueError(f"conv2d_transpose: output spatial dim must be positive, got {size} for axis {axis} (input {n}, kernel {k})")
    dtype = conv_dtype("conv2d_transpose", x, filter)
    out = apply(
        _conv_transpose, x, filter, _name="conv2d_transpose", _dtypes=[dtype], dtype=dtype.to_jax(), stride=tuple(int(s) for s in stride),
        dilation=tuple(int(d) for d in dilation), padding=tuple(int(p) for p in padding),
        output_paddings=tuple(int(p) for p in output_paddings), lhs=lhs, rhs=rhs, flip=flip,
    )  # fmt: skip
    if bias is None:
        return out
    from maxjax.graph.ops.elementwise import add
    from maxjax.graph.ops.shape import permute

    out = permute(out, [0, 2, 3, 1])  # MAX's rule: treats the result as NCHW -> "NHWC"
    out = add(out, bias)
    return permute(out, [0, 3, 1, 2])
