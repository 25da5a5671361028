"""``ops.avg_pool2d``, ``ops.max_pool2d`` and ``ops.roi_align`` (MAX's
``max.graph.ops.pooling``), channels-last (``NHWC``).

Pooling is one ``jax.lax.reduce_window`` over the spatial axes. ``padding`` is ``int`` or
``(pad_h, pad_w)``, added on both sides. Output size per spatial axis, as MAX 26.7 computes it
(checked against its numbers): ``(in + 2 * pad - dilation * (k - 1) - 1) / stride + 1`` rounded
down, or up with ``ceil_mode``; unlike PyTorch, a last window lying wholly past the input is kept
(max gives ``-inf`` there, average 0). Max pooling ignores padded positions. Average pooling
divides by ``kh * kw`` whatever the window covers (``count_boundary=True``), or by the number of
input elements in the window (``count_boundary=False``, only without padding: MAX 26.7's CPU
kernel gives inconsistent divisors, and inf/NaN with ``ceil_mode``, for padded inputs there, so
maxjax refuses that combination).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.graph.ops._core import apply

__all__ = ["avg_pool2d", "max_pool2d", "roi_align"]


def _static(d: Any) -> int | None:
    """``d`` as an int when it is static (an int or a static Dim), else None."""
    try:
        return int(d)
    except (TypeError, ValueError):
        return None


def _out_size(n: int, k: int, s: int, d: int, p: int, ceil_mode: bool) -> int:
    span = n + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    return out


def _pool(x: Any, *, kind: str, kernel: tuple, stride: tuple, dilation: tuple, padding: tuple, ceil_mode: bool, count_boundary: bool) -> Any:
    # x: [N, H, W, C]
    extra = []
    for i in range(2):
        n = x.shape[1 + i]
        out = _out_size(n, kernel[i], stride[i], dilation[i], padding[i], ceil_mode)
        need = (out - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1  # padded length the windows read
        extra.append(max(need - (n + 2 * padding[i]), 0))  # ceil_mode overhang past the right padding
    pads = [(0, 0), (padding[0], padding[0] + extra[0]), (padding[1], padding[1] + extra[1]), (0, 0)]
    win, strides, dil = (1, *kernel, 1), (1, *stride, 1), (1, *dilation, 1)
    if kind == "max":
        init = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
        return jax.lax.reduce_window(x, jnp.asarray(init, x.dtype), jax.lax.max, win, strides, pads, window_dilation=dil)
    acc = jnp.float32 if x.dtype != jnp.float64 else jnp.float64
    total = jax.lax.reduce_window(x.astype(acc), jnp.asarray(0, acc), jax.lax.add, win, strides, pads, window_dilation=dil)
    if count_boundary:  # MAX's divisor: the window's taps, padding and overhang included
        return (total / (kernel[0] * kernel[1])).astype(x.dtype)
    # the input elements each window covers (no padding here: see _run)
    ones = jnp.ones((1, x.shape[1], x.shape[2], 1), acc)
    count = jax.lax.reduce_window(ones, jnp.asarray(0, acc), jax.lax.add, win, strides, pads, window_dilation=dil)
    return (total / count).astype(x.dtype)  # [N, H_out, W_out, C]


def _pair(v: Any) -> tuple[int, int]:
    """MAX's ``int | tuple[int, int]`` arguments as a pair."""
    return (int(v), int(v)) if not isinstance(v, tuple) else (int(v[0]), int(v[1]))


def _run(op: str, input: Any, kernel_size: Any, stride: Any, dilation: Any, padding: Any, ceil_mode: bool, count_boundary: bool) -> Any:  # noqa: A002
    if len(input.shape) != 4:
        raise ValueError(f"{op}: [pooling] requires (input_rank == 4) (NHWC), got shape {list(input.shape)}")
    kernel = tuple(int(k) for k in kernel_size)
    if len(kernel) != 2:
        raise ValueError(f"{op}: kernel_size must have 2 entries (kernel_h, kernel_w), got {kernel_size}")
    stride, dilation, padding = _pair(stride), _pair(dilation), _pair(padding)
    if not count_boundary and padding != (0, 0):
        raise NotImplementedError(
            f"{op}: count_boundary=False with padding={padding} is not supported (MAX 26.7's kernel gives "
            "inconsistent averages there); use padding=0 or count_boundary=True"
        )
    for i, axis in enumerate("HW"):
        n = _static(input.shape[1 + i])
        if n is not None and _out_size(n, kernel[i], stride[i], dilation[i], padding[i], ceil_mode) <= 0:
            raise ValueError(
                f"{op}: [pooling] output spatial dim must be positive: axis {axis} of size {n} with kernel {kernel[i]}, "
                f"dilation {dilation[i]}, padding {padding[i]}"
            )
    return apply(
        _pool, input, _name=op, kind=op[:3], kernel=kernel, stride=stride, dilation=dilation, padding=padding,
        ceil_mode=bool(ceil_mode), count_boundary=bool(count_boundary),
    )  # fmt: skip


def avg_pool2d(
    input: Any,  # noqa: A002 - MAX's name
    kernel_size: tuple[Any, Any],
    stride: int | tuple[int, int] = 1,
    dilation: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    ceil_mode: bool = False,
    count_boundary: bool = True,
) -> Any:
    """2-D average pooling of ``input [N, H, W, C]`` to ``[N, H_out, W_out, C]`` (see the module
    docstring); accumulates in float32.

    Raises:
        ValueError: ``input`` not rank 4, a non-positive output size (at build time, as MAX).
        NotImplementedError: ``count_boundary=False`` with nonzero ``padding``.
    """
    return _run("avg_pool2d", input, kernel_size, stride, dilation, padding, ceil_mode, count_boundary)


def max_pool2d(
    input: Any,  # noqa: A002 - MAX's name
    kernel_size: tuple[Any, Any],
    stride: int | tuple[int, int] = 1,
    dilation: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    ceil_mode: bool = False,
) -> Any:
    """2-D max pooling of ``input [N, H, W, C]`` to ``[N, H_out, W_out, C]`` (see the module
    docstring); padded positions never win.

    Raises:
        ValueError: ``input`` not rank 4, a non-positive output size (at build time, as MAX).
    """
    return _run("max_pool2d", input, kernel_size, stride, dilation, padding, ceil_mode, True)


def _bilinear(img: Any, y: Any, x: Any, terms: bool = False) -> Any:
    # img: [H, W, C]; y, x: [...] sample positions -> [..., C] (torchvision's rule: 0 outside
    # [-1, H] x [-1, W], positions clamped to the border inside it)
    h, w = img.shape[0], img.shape[1]
    out = (y < -1.0) | (y > h) | (x < -1.0) | (x > w)
    y, x = jnp.clip(y, 0, None), jnp.clip(x, 0, None)
    y0, x0 = jnp.floor(y).astype(jnp.int32), jnp.floor(x).astype(jnp.int32)
    y_edge, x_edge = y0 >= h - 1, x0 >= w - 1
    y0, x0 = jnp.where(y_edge, h - 1, y0), jnp.where(x_edge, w - 1, x0)
    y1, x1 = jnp.where(y_edge, h - 1, y0 + 1), jnp.where(x_edge, w - 1, x0 + 1)
    y, x = jnp.where(y_edge, y0.astype(y.dtype), y), jnp.where(x_edge, x0.astype(x.dtype), x)
    ly, lx = y - y0.astype(y.dtype), x - x0.astype(x.dtype)
    hy, hx = 1 - ly, 1 - lx
    parts = jnp.stack([
        (hy * hx)[..., None] * img[y0, x0], (hy * lx)[..., None] * img[y0, x1],
        (ly * hx)[..., None] * img[y1, x0], (ly * lx)[..., None] * img[y1, x1],
    ])  # fmt: skip  [4, ..., C]: the weighted corners
    v = jnp.max(parts, axis=0) if terms else jnp.sum(parts, axis=0)
    return jnp.where(out[..., None], 0.0, v)


def _roi_align(
    x: Any, rois: Any, *, output_height: int, output_width: int, spatial_scale: float, sampling_ratio: float,
    aligned: bool, mode: str, grid: tuple,
) -> Any:  # fmt: skip
    # x: [N, H, W, C], rois: [M, 5] -> [M, oh, ow, C]
    acc = jnp.float32
    offset = 0.5 if aligned else 0.0
    r = rois.astype(acc)
    x1, y1 = r[:, 1] * spatial_scale - offset, r[:, 2] * spatial_scale - offset  # [M]
    rw, rh = r[:, 3] * spatial_scale - offset - x1, r[:, 4] * spatial_scale - offset - y1
    if not aligned:
        rw, rh = jnp.maximum(rw, 1.0), jnp.maximum(rh, 1.0)
    bh, bw = rh / output_height, rw / output_width  # [M]
    if sampling_ratio > 0:
        gh = gw = jnp.full(rois.shape[:1], sampling_ratio, acc)
    else:
        gh, gw = jnp.ceil(bh), jnp.ceil(bw)  # adaptive: data-dependent, at most `grid`
    gh, gw = jnp.maximum(gh, 1.0), jnp.maximum(gw, 1.0)
    iy, ix = jnp.arange(grid[0], dtype=acc), jnp.arange(grid[1], dtype=acc)
    ph, pw = jnp.arange(output_height, dtype=acc), jnp.arange(output_width, dtype=acc)
    # sample positions [M, oh, gy] and [M, ow, gx]
    ys = y1[:, None, None] + ph[None, :, None] * bh[:, None, None] + (iy[None, None, :] + 0.5) * (bh / gh)[:, None, None]
    xs = x1[:, None, None] + pw[None, :, None] * bw[:, None, None] + (ix[None, None, :] + 0.5) * (bw / gw)[:, None, None]
    my, mx = iy[None, :] < gh[:, None], ix[None, :] < gw[:, None]  # [M, gy], [M, gx] samples in use
    yy = jnp.broadcast_to(ys[:, :, None, :, None], (ys.shape[0], output_height, output_width, grid[0], grid[1]))
    xx = jnp.broadcast_to(xs[:, None, :, None, :], yy.shape)
    img = x.astype(acc)[r[:, 0].astype(jnp.int32)]  # [M, H, W, C]
    vals = jax.vmap(lambda i, a, b: _bilinear(i, a, b, mode == "MAX"))(img, yy, xx)  # [M, oh, ow, gy, gx, C]
    use = (my[:, None, None, :, None] & mx[:, None, None, None, :])[..., None]  # [M, 1, 1, gy, gx, 1]
    if mode == "AVG":
        out = jnp.sum(jnp.where(use, vals, 0.0), axis=(3, 4)) / (gh * gw)[:, None, None, None]
    else:
        out = jnp.max(jnp.where(use, vals, -jnp.inf), axis=(3, 4))
    too_big = (gh > grid[0]) | (gw > grid[1])  # adaptive grid past the static bound: NaN, never a wrong number
    return jnp.where(too_big[:, None, None, None], jnp.nan, out).astype(x.dtype)  # [M, oh, ow, C]


def roi_align(
    input: Any,  # noqa: A002 - MAX's name
    rois: Any,
    output_height: int,
    output_width: int,
    spatial_scale: float = 1.0,
    sampling_ratio: float = 0.0,
    aligned: bool = False,
    mode: str = "AVG",
) -> Any:
    """ROI-align pooling (He et al., Mask R-CNN, https://arxiv.org/abs/1703.06870; torchvision's
    ``roi_align`` sampling and bilinear rules) of ``input [N, H, W, C]`` over
    ``rois [M, 5]`` rows ``(batch_index, x1, y1, x2, y2)``, to ``[M, output_height, output_width, C]``.

    Each bin averages (``"AVG"``) ``sampling_ratio ** 2`` bilinear samples or, with ``"MAX"``,
    takes the largest weighted corner term ``w_k * v_k`` of those samples (ONNX ``RoiAlign``'s max
    mode, which MAX 26.7 follows; checked against its numbers); with ``sampling_ratio = 0`` a bin takes
    ``ceil(bin_h) * ceil(bin_w)`` samples. That adaptive count depends on the ROI sizes; maxjax
    samples on a static grid of ``ceil(H / output_height) + 1`` by ``ceil(W / output_width) + 1`` points per bin (ROIs inside the feature map fit), and gives
    NaN for a ROI that needs more (eagerly on concrete ROIs it raises instead).

    Raises:
        ValueError: ``input`` not rank 4, ``rois`` not rank 2 (MAX's messages), ``rois`` without
            5 columns, ``mode`` not ``"AVG"``/``"MAX"``; eagerly, an adaptive sample grid
            larger than the static bound.
    """
    if len(input.shape) != 4:
        raise ValueError(f"roi_align expects rank-4 NHWC input, got rank {len(input.shape)}")
    if len(rois.shape) != 2:
        raise ValueError(f"roi_align expects rank-2 rois [M, 5], got rank {len(rois.shape)}")
    if _static(rois.shape[1]) not in (None, 5):
        raise ValueError(f"roi_align expects rois [M, 5] rows (batch_index, x1, y1, x2, y2), got shape {list(rois.shape)}")
    if mode not in ("AVG", "MAX"):
        raise ValueError(f"roi_align mode must be 'AVG' or 'MAX', got '{mode}'")
    oh, ow = int(output_height), int(output_width)
    if sampling_ratio > 0:
        grid = (int(math.ceil(sampling_ratio)),) * 2
    else:
        h, w = _static(input.shape[1]), _static(input.shape[2])
        if h is None or w is None:
            raise ValueError(
                f"roi_align: sampling_ratio=0 (adaptive) needs a static height and width in maxjax, got {list(input.shape)}"
            )
        grid = (-(-h // oh) + 1, -(-w // ow) + 1)
    out = apply(
        _roi_align, input, rois, _name="roi_align", output_height=oh, output_width=ow, spatial_scale=float(spatial_scale),
        sampling_ratio=float(sampling_ratio), aligned=bool(aligned), mode=mode, grid=grid,
    )  # fmt: skip
    concrete = isinstance(out, jax.Array) and not isinstance(out, jax.core.Tracer)
    if concrete and sampling_ratio <= 0 and bool(jnp.isnan(out).any()) and not bool(jnp.isnan(jnp.asarray(input)).any()):
        raise ValueError(f"roi_align: an ROI needs more adaptive samples per bin than maxjax's static grid {grid} (see the docstring)")
    return out
