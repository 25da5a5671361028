"""``ops.fold`` (MAX's ``max.graph.ops.fold``): sums sliding local blocks back into an image, the
adjoint of im2col/``unfold`` (PyTorch's ``torch.nn.functional.fold``).

``input [N, C * kh * kw, L]`` with block channels ordered ``c * kh * kw + i * kw + j`` and the
``L = L_h * L_w`` blocks row-major, ``L_d = (out_d + 2 * pad_d - dilation_d * (k_d - 1) - 1)
// stride_d + 1``; result ``[N, C, out_h, out_w]``; overlapping blocks add up.

Padding as MAX 26.7 computes it (checked against its numbers): the blocks are summed into the
padded ``[out_h + 2 pad_h, out_w + 2 pad_w]`` canvas and the result is its top-left
``[out_h, out_w]`` corner, where PyTorch takes the centre ``[pad_h:pad_h + out_h, ...]``. Without
padding the two agree.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from maxjax.graph.ops._core import apply
from maxjax.graph.ops.pooling import _pair, _static

__all__ = ["fold"]


def _blocks(o: int, k: int, s: int, d: int, p: int) -> int:
    return (o + 2 * p - d * (k - 1) - 1) // s + 1


def _fold(x: Any, *, output_size: tuple, kernel_size: tuple, stride: tuple, dilation: tuple, padding: tuple) -> Any:
    (oh, ow), (kh, kw), (sh, sw), (dh, dw), (ph, pw) = output_size, kernel_size, stride, dilation, padding
    lh, lw = _blocks(oh, kh, sh, dh, ph), _blocks(ow, kw, sw, dw, pw)
    n = x.shape[0]
    blocks = x.reshape(n, -1, kh, kw, lh, lw)  # [N, C, kh, kw, L_h, L_w]
    acc = jnp.float32 if x.dtype != jnp.float64 else jnp.float64
    out = jnp.zeros((n, blocks.shape[1], oh + 2 * ph, ow + 2 * pw), acc)  # [N, C, out_h + 2 ph, out_w + 2 pw]
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (lh - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (lw - 1) + 1, sw)
            out = out.at[:, :, rows, cols].add(blocks[:, :, i, j].astype(acc))
    return out[:, :, :oh, :ow].astype(x.dtype)  # [N, C, out_h, out_w]: MAX's corner (see the module docstring)


def fold(
    input: Any,  # noqa: A002 - MAX's name
    output_size: tuple[Any, Any],
    kernel_size: tuple[Any, Any],
    stride: int | tuple[int, int] = 1,
    dilation: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
) -> Any:
    """Folds ``input [N, C * kh * kw, L]`` into ``[N, C, output_size[0], output_size[1]]`` (see
    the module docstring).

    Raises:
        ValueError: (at build time, MAX's messages) ``input``'s dim 1 not a multiple of
            ``kh * kw``, or its dim 2 not the number of blocks; ``input`` not rank 3; symbolic
            ``output_size``/``kernel_size`` (maxjax needs them static).
    """
    if len(input.shape) != 3:
        raise ValueError(f"fold: input must have rank 3 (N, C * kernel_h * kernel_w, L), got shape {list(input.shape)}")
    try:
        output_size, kernel_size = _pair(tuple(output_size)), _pair(tuple(kernel_size))
    except (TypeError, ValueError):
        raise ValueError(f"fold: output_size {output_size} and kernel_size {kernel_size} must be static ints in maxjax") from None
    stride, dilation, padding = _pair(stride), _pair(dilation), _pair(padding)
    kh, kw = kernel_size
    c = _static(input.shape[1])
    if c is not None and c % (kh * kw):
        raise ValueError(f"Dim 1 of the input tensor ({c}) must be a multiple of the product of the total kernel size ({kh} * {kw}).")
    n_blocks = 1
    for o, k, s, d, p in zip(output_size, kernel_size, stride, dilation, padding):
        n_blocks *= _blocks(o, k, s, d, p)
    got = _static(input.shape[2])
    if got is not None and got != n_blocks:
        raise ValueError(f"Last dimension of input tensor ({got}) must match the calculated number of blocks ({n_blocks}).")
    return apply(
        _fold, input, _name="fold", output_size=output_size, kernel_size=kernel_size, stride=stride,
        dilation=dilation, padding=padding,
    )  # fmt: skip
