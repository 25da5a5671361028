"""MAX's signal ops: ``hann_window``, ``irfft`` and ``as_interleaved_complex``
(``max/graph/ops/hann_window.py``, ``irfft.py``, ``complex.py`` in MAX 26.7).

MAX has no complex dtype: a complex tensor is a real one whose last axis (size 2) holds
``(real, imag)``; ``irfft`` takes such a tensor with ``input_is_complex=True``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply
from maxjax.graph.type import DeviceRef, Dim, StaticDim
from maxjax.graph.value import TensorValue

__all__ = ["Normalization", "as_interleaved_complex", "hann_window", "irfft"]


# -- hann_window ---------------------------------------------------------------------------------
def _hann(*, n: int, periodic: bool, dtype: Any) -> Any:
    m = n + 1 if periodic else n  # a periodic window: n + 1 symmetric points, the last dropped
    w = jnp.arange(m, dtype=dtype) * jnp.asarray(2.0 * np.pi / np.float64(m - 1), dtype)  # [m]
    w = jnp.cos(w) * jnp.asarray(-0.5, dtype) + jnp.asarray(0.5, dtype)
    return w[:n]  # [n]


def _filled(*, values: tuple[float, ...], dtype: Any) -> Any:
    return jnp.asarray(values, dtype=dtype)


def hann_window(window_length: int, device: DeviceRef, periodic: bool = True, dtype: DType = DType.float32) -> Any:
    """A Hann window of ``window_length`` points (MAX's ``ops.hann_window``; PyTorch's ``hann_window``).

    ``w[n] = 0.5 - 0.5 * cos(2 * pi * n / (N - 1))`` for a symmetric window of ``N`` points,
    computed in ``dtype`` as MAX computes it (``range * (2 pi / (N - 1))``, ``cos``, ``* -0.5 + 0.5``).
    A periodic window is the symmetric window of ``window_length + 1`` points without its last
    point. Lengths 0 and 1 give ``[]`` and ``[1]``.

    Args:
        window_length: the number of points (a Python int).
        device: where the window lives.
        periodic: periodic (for spectral analysis) rather than symmetric.
        dtype: a floating-point dtype.

    Returns:
        A 1-D tensor ``[window_length]`` of ``dtype``.

    Raises:
        TypeError: ``window_length`` is not a Python int.
        ValueError: ``window_length`` is negative, or ``dtype`` is not floating-point.
    """
    from maxjax.graph.ops.shape import transfer_to

    if not isinstance(window_length, int) or isinstance(window_length, bool):
        raise TypeError(f"window_length must be an integer, got {type(window_length).__name__}")
    if window_length < 0:
        raise ValueError("window_length must be non-negative")
    if not dtype.is_float():
        raise ValueError(f"Unsafe cast: Can't promote python float to dtype({dtype}).")
    if window_length <= 1:
        out = apply(
            _filled, _name="hann_window", _dtypes=[dtype], values=(1.0,) * window_length, dtype=dtype.to_jax()
        )
    else:  # declared dtype: MAX's float64 (held as float32 when JAX has no x64)
        out = apply(
            _hann, _name="hann_window", _dtypes=[dtype], n=window_length, periodic=bool(periodic), dtype=dtype.to_jax()
        )
    return transfer_to(out, device)


# -- irfft ---------------------------------------------------------------------------------------
class Normalization(Enum):
    """The scaling of :func:`irfft`'s output (MAX's ``max.graph.ops.irfft.Normalization``): by
    ``1/n`` (BACKWARD), ``1/sqrt(n)`` (ORTHO) or none (FORWARD), NumPy's ``norm`` names. Equal to
    its string value, as in MAX."""

    BACKWARD = "backward"
    ORTHO = "ortho"
    FORWARD = "forward"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.value == other
        if isinstance(other, Normalization):
            return self.value == other.value
        return False

    def __hash__(self) -> int:
        return hash(self.value)


def _irfft(x: Any, *, n: int, axis: int, norm: str, is_complex: bool) -> Any:
    if is_complex:
        x = _complex(x[..., 0], x[..., 1])  # [..., m] complex from [..., m, 2]
    return jnp.fft.irfft(x, n=n, axis=axis, norm=norm)  # the axis padded / cut to n // 2 + 1, then n points


def _complex(re: Any, im: Any) -> Any:
    """``re + i * im`` as a complex64 array (float32 parts)."""
    return jax.lax.complex(re, im)


def irfft(
    input_tensor: Any,
    n: int | None = None,
    axis: int = -1,
    normalization: Normalization | str = Normalization.BACKWARD,
    input_is_complex: bool = False,
    buffer_size_mb: int = 512,
) -> Any:
    """The inverse real FFT along ``axis`` (MAX's ``ops.irfft``; ``jnp.fft.irfft``).

    The input is a half spectrum: real values (imaginary parts zero) or, with
    ``input_is_complex=True``, ``(real, imag)`` pairs in a last axis of size 2 that ``axis`` does
    not count. Along ``axis`` it is padded with zeros or cut to ``n // 2 + 1`` points, then
    transformed to ``n`` real points.

    Args:
        input_tensor: float32, the ``axis`` dim static.
        n: output points along ``axis`` (None or 0: ``2 * (size - 1)``).
        axis: the axis to transform.
        normalization: ``"backward"`` divides by ``n``, ``"ortho"`` by ``sqrt(n)``, ``"forward"``
            not at all (NumPy's names and meanings).
        input_is_complex: the last axis holds ``(real, imag)``.
        buffer_size_mb: MAX's scratch buffer for its GPU kernel; XLA plans its own memory, so it
            has no effect here.

    Returns:
        float32, the input's shape with the ``axis`` dim replaced by ``n`` (and, for complex
        input, without the last axis).

    Raises:
        ValueError: not float32, a complex input whose last dim is not 2, a symbolic ``axis`` dim
            or an unknown ``normalization`` (MAX's messages). MAX runs irfft on GPUs only and raises
            ValueError on a CPU; maxjax computes it on every JAX backend.
    """
    x = input_tensor
    dtype = x.dtype if isinstance(x, TensorValue) else DType.of(x.dtype)
    shape = list(x.shape) if isinstance(x, TensorValue) else [Dim(int(d)) for d in x.shape]
    if dtype != DType.float32:
        raise ValueError(f"Input tensor must be of type float32, got {dtype}.")
    if input_is_complex and (not shape or shape[-1] != 2):
        raise ValueError(f"Input tensor is marked as complex, but last dimension is not 2. Got input shape {shape}.")
    if normalization not in (Normalization.BACKWARD, Normalization.ORTHO, Normalization.FORWARD):
        raise ValueError(f"Invalid normalization: {normalization}")
    rank = len(shape) - 1 if input_is_complex else len(shape)
    axis %= rank
    size = shape[axis]
    if not isinstance(size, StaticDim):
        raise ValueError(f"Axis dimension must be static, got {size}.")
    if not n:
        n = 2 * (int(size) - 1)
    norm = Normalization(normalization.value if isinstance(normalization, Normalization) else normalization).value
    return apply(_irfft, input_tensor, _name="irfft", n=int(n), axis=axis, norm=norm, is_complex=bool(input_is_complex))


# -- as_interleaved_complex ----------------------------------------------------------------------
def as_interleaved_complex(x: Any) -> Any:
    """``x`` [..., 2m] read as ``m`` complex numbers of alternating (real, imag): shape
    [..., m, 2] (MAX's ``ops.as_interleaved_complex``; a reshape).

    Raises:
        IndexError: ``x`` is a scalar (MAX's exception type).
        TypeError: the last dim is symbolic.
        ValueError: the last dim is odd.
    """
    from maxjax.graph.ops.shape import reshape

    shape = list(x.shape)
    if not shape:
        raise IndexError("as_interleaved_complex: a scalar has no last dimension to read as (real, imag) pairs")
    last = shape[-1] if isinstance(x, TensorValue) else StaticDim(int(shape[-1]))
    if not isinstance(last, StaticDim):
        raise TypeError("The last dimension must be static.")
    if last.dim % 2 != 0:
        raise ValueError("The last dimension must be divisible by 2.")
    return reshape(x, [*shape[:-1], last.dim // 2, 2])

