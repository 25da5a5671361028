"""``ops.resize``, ``ops.resize_linear``, ``ops.resize_nearest``, ``ops.resize_bicubic`` and
``InterpolationMode`` (MAX's ``max.graph.ops.resize``).

Every axis whose size changes is resized on its own (separable filters), batch and channel axes
included as in MAX. Each resized axis is one contraction with a ``[out, in]`` weight matrix built
once per (sizes, mode) in NumPy at trace time (a gather of input rows for nearest), so an op is one
jnp function. An output coordinate ``o`` maps to the input coordinate ``x`` by
``coordinate_transform_mode`` (ONNX ``Resize``'s): 0 half_pixel ``(o + 0.5) / scale - 0.5``,
1 align_corners ``o * (in - 1) / (out - 1)`` (0 when ``out == 1``), 2 asymmetric ``o / scale``,
3 half_pixel_1D (half_pixel, 0 when ``out == 1``); ``scale = out / in``.

- linear: the two neighbours of ``x`` clamped to ``[0, in - 1]``; with ``antialias`` and
  ``scale < 1`` a tent filter ``max(0, 1 - |x - i| * scale)`` normalised over the input.
- nearest: ``round_mode`` 0 ``ceil(x - 0.5)``, 1 ``floor(x + 0.5)``, 2 ``floor``, 3 ``ceil``;
  index clamped to the input.
- bicubic (NCHW, H and W only): Keys' cubic with ``a = -0.75`` (PyTorch's), half-pixel
  coordinates, border taps clamped.

Interpolation accumulates in float32 (float64 for float64 inputs), as MAX.
"""

from __future__ import annotations

import functools
import string
from enum import Enum
from typing import Any, Iterable

import jax.numpy as jnp
import numpy as np

from maxjax.graph.ops._core import apply
from maxjax.graph.type import Dim

__all__ = ["InterpolationMode", "resize", "resize_bicubic", "resize_linear", "resize_nearest"]


class InterpolationMode(Enum):
    """Interpolation modes for image resize operations (MAX's)."""

    NEAREST = "nearest"
    """Nearest neighbor interpolation."""
    BILINEAR = "bilinear"
    """Bilinear (linear) interpolation."""
    BICUBIC = "bicubic"
    """Bicubic interpolation."""

    def __str__(self) -> str:
        """The mode's value (``"bilinear"``, ...)."""
        return self.value


def _coords(n_in: int, n_out: int, mode: int) -> np.ndarray:
    """The input coordinate of each output index, float64 ``[n_out]``."""
    o = np.arange(n_out, dtype=np.float64)
    scale = n_out / n_in
    if mode == 1:
        return o * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    if mode == 2:
        return o / scale
    if mode == 3 and n_out == 1:
        return np.zeros(n_out)
    return (o + 0.5) / scale - 0.5


@functools.lru_cache(maxsize=256)
def _linear_matrix(n_in: int, n_out: int, mode: int, antialias: bool) -> np.ndarray:
    x = _coords(n_in, n_out, mode)  # [out]
    scale = n_out / n_in
    if antialias and scale < 1:
        w = np.maximum(0.0, 1.0 - np.abs(x[:, None] - np.arange(n_in)[None, :]) * scale)  # [out, in]
        return w / w.sum(1, keepdims=True)
    x = np.clip(x, 0, n_in - 1)
    lo = np.floor(x).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    t = x - lo
    w = np.zeros((n_out, n_in))
    np.add.at(w, (np.arange(n_out), lo), 1 - t)
    np.add.at(w, (np.arange(n_out), hi), t)
    return w


@functools.lru_cache(maxsize=256)
def _cubic_matrix(n_in: int, n_out: int) -> np.ndarray:
    a = -0.75
    x = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5  # [out]
    lo = np.floor(x)
    t = x - lo
    w = np.zeros((n_out, n_in))
    for tap in range(-1, 3):
        d = np.abs(t - tap)  # distance of the tap from x
        k = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1, np.where(d < 2, ((d - 5) * d + 8) * d * a - 4 * a, 0.0))
        idx = np.clip(lo + tap, 0, n_in - 1).astype(np.int64)
        np.add.at(w, (np.arange(n_out), idx), k)
    return w


@functools.lru_cache(maxsize=256)
def _nearest_index(n_in: int, n_out: int, mode: int, round_mode: int) -> np.ndarray:
    x = _coords(n_in, n_out, mode)
    r = [np.ceil(x - 0.5), np.floor(x + 0.5), np.floor(x), np.ceil(x)][round_mode]
    return np.clip(r, 0, n_in - 1).astype(np.int32)


def _resized_axes(x: Any, size: tuple) -> list[int]:
    """The axes whose size changes (equal symbolic sizes count as unchanged)."""
    return [i for i, (a, b) in enumerate(zip(x.shape, size)) if not _same(a, b)]


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _contract(x: Any, axis: int, w: np.ndarray) -> Any:
    # x: [..., in (axis), ...] -> [..., out (axis), ...]
    letters = string.ascii_letters[: x.ndim]
    out = letters[:axis] + "Z" + letters[axis + 1 :]
    return jnp.einsum(f"Z{letters[axis]},{letters}->{out}", jnp.asarray(w, x.dtype), x, precision="highest")


def _acc(x: Any) -> Any:
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def _resize_linear(x: Any, *, size: tuple, mode: int, antialias: bool) -> Any:
    y = x.astype(_acc(x))
    for axis in _resized_axes(x, size):
        y = _contract(y, axis, _linear_matrix(int(x.shape[axis]), int(size[axis]), mode, antialias))
    return y.astype(x.dtype)  # shape `size`


def _resize_bicubic(x: Any, *, size: tuple) -> Any:
    y = x.astype(_acc(x))
    for axis in _resized_axes(x, size):
        y = _contract(y, axis, _cubic_matrix(int(x.shape[axis]), int(size[axis])))
    return y.astype(x.dtype)  # [N, C, H_out, W_out]


def _resize_nearest(x: Any, *, size: tuple, mode: int, round_mode: int) -> Any:
    for axis in _resized_axes(x, size):
        x = jnp.take(x, _nearest_index(int(x.shape[axis]), int(size[axis]), mode, round_mode), axis=axis)
    return x  # shape `size`


def _size(size: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(Dim(d) if isinstance(d, (str, Dim)) else int(d) for d in size)


def _check_static(op: str, input: Any, size: tuple) -> None:  # noqa: A002
    for i, (a, b) in enumerate(zip(input.shape, size)):
        if _same(a, b):
            continue
        try:
            int(a), int(b)
        except (TypeError, ValueError):
            raise ValueError(f"{op}: axis {i} changes from {a} to {b}; maxjax resizes only axes of static size") from None


def _check(op: str, input: Any, size: tuple, coordinate_transform_mode: int) -> None:  # noqa: A002
    if coordinate_transform_mode not in (0, 1, 2, 3):
        raise ValueError(f"coordinate_transform_mode must be 0-3, got {coordinate_transform_mode}")
    if len(size) != len(input.shape):
        raise ValueError(f"size must have the same rank as input ({len(input.shape)}), got {len(size)}")
    _check_static(op, input, size)


def resize_linear(input: Any, size: Iterable[Any], coordinate_transform_mode: int = 0, antialias: bool = False) -> Any:  # noqa: A002
    """Resizes ``input`` (any rank) to the shape ``size`` with (multi)linear interpolation (see the
    module docstring); dtype kept.

    Raises:
        ValueError: ``coordinate_transform_mode`` not 0-3, ``size`` of another rank (MAX's
            messages), or a resized axis of symbolic size.
    """
    if coordinate_transform_mode not in (0, 1, 2, 3):
        raise ValueError(f"coordinate_transform_mode must be 0-3, got {coordinate_transform_mode}")
    size = _size(size)
    _check("resize_linear", input, size, coordinate_transform_mode)
    return apply(_resize_linear, input, _name="resize_linear", size=size, mode=int(coordinate_transform_mode), antialias=bool(antialias))


def resize_nearest(input: Any, size: Iterable[Any], coordinate_transform_mode: int = 0, round_mode: int = 0) -> Any:  # noqa: A002
    """Resizes ``input`` (any rank) to the shape ``size`` by nearest-neighbour selection (see the
    module docstring); dtype kept.

    Raises:
        ValueError: ``coordinate_transform_mode`` or ``round_mode`` not 0-3, ``size`` of another
            rank (MAX's messages), or a resized axis of symbolic size.
    """
    if coordinate_transform_mode not in (0, 1, 2, 3):
        raise ValueError(f"coordinate_transform_mode must be 0-3, got {coordinate_transform_mode}")
    if round_mode not in (0, 1, 2, 3):
        raise ValueError(f"round_mode must be 0-3, got {round_mode}")
    size = _size(size)
    _check("resize_nearest", input, size, coordinate_transform_mode)
    return apply(_resize_nearest, input, _name="resize_nearest", size=size, mode=int(coordinate_transform_mode), round_mode=int(round_mode))


def resize_bicubic(input: Any, size: Iterable[Any]) -> Any:  # noqa: A002
    """Resizes ``input [N, C, H, W]`` to ``size`` with bicubic interpolation (see the module
    docstring); dtype kept.

    Raises:
        ValueError: ``input`` not rank 4 or ``size`` not of length 4 (MAX's messages), or a
            resized axis of symbolic size.
    """
    size = _size(size)
    if len(input.shape) != 4:
        raise ValueError(f"resize_bicubic requires rank-4 (NCHW) input, got rank {len(input.shape)}")
    if len(size) != 4:
        raise ValueError(f"size must have 4 elements for NCHW format, got {len(size)}")
    _check_static("resize_bicubic", input, size)
    return apply(_resize_bicubic, input, _name="resize_bicubic", size=size)


def resize(input: Any, shape: Iterable[Any], interpolation: InterpolationMode = InterpolationMode.BILINEAR) -> Any:  # noqa: A002
    """Resizes ``input [N, C, H, W]`` to ``shape`` with ``interpolation``: NEAREST is
    :func:`resize_nearest`, BILINEAR :func:`resize_linear` (both with their defaults), and any
    other value :func:`resize_bicubic` (MAX's dispatch: a plain string such as ``"nearest"`` is not
    an :class:`InterpolationMode` and so selects bicubic, as in MAX 26.7).

    Raises:
        ValueError: ``input`` not rank 4 or ``shape`` not of length 4 (MAX's messages).
    """
    shape = _size(shape)
    if len(input.shape) != 4:
        raise ValueError(f"Input tensor must have rank 4 (NCHW format) for resize operation, but got rank {len(input.shape)}")
    if len(shape) != 4:
        raise ValueError(f"shape must have 4 elements for NCHW format (batch, channels, height, width), but got {len(shape)} elements")
    if interpolation == InterpolationMode.NEAREST:
        return resize_nearest(input, shape)
    if interpolation == InterpolationMode.BILINEAR:
        return resize_linear(input, shape)
    return resize_bicubic(input, shape)
