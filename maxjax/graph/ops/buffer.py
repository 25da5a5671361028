"""MAX's buffer ops (``max.graph.ops.buffer_load``/``buffer_store``/``buffer_store_slice``) on
:class:`~maxjax.graph.buffer.BufferValue` versions (see :mod:`maxjax.graph.buffer`)."""

from __future__ import annotations

from typing import Any

from maxjax.graph.buffer import BufferValue
from maxjax.graph.ops._core import apply
from maxjax.graph.value import TensorValue

__all__ = ["buffer_create", "buffer_load", "buffer_store", "buffer_store_slice"]


def _check_buffer(x: Any, op: str) -> BufferValue:
    if not isinstance(x, BufferValue):
        raise TypeError(f"{op}: expected a BufferValue, got {type(x).__name__}")
    return x


def buffer_load(x: BufferValue) -> TensorValue:
    """The buffer's current value as a tensor.

    Raises:
        TypeError: ``x`` is not a buffer.
    """
    return _check_buffer(x, "buffer_load")._current


def buffer_store(destination: BufferValue, source: Any) -> None:
    """Makes ``source`` the buffer's value (same shape and dtype).

    Raises:
        TypeError: ``destination`` is not a buffer.
        ValueError: ``source`` has another shape or dtype than the buffer (both named).
    """
    dest = _check_buffer(destination, "buffer_store")
    src = source if isinstance(source, TensorValue) else TensorValue(source)
    if src.dtype != dest.dtype or list(src.shape) != list(dest.shape):
        raise ValueError(
            f"buffer_store: source {src.dtype!r}{list(src.shape)} does not match the buffer {dest.dtype!r}{list(dest.shape)}"
        )
    dest._current = src


def _store_slice(dest: Any, src: Any, *, index: Any) -> Any:
    return dest.at[index].set(src.astype(dest.dtype))


def buffer_store_slice(destination: BufferValue, source: Any, indices: Any) -> None:
    """Writes ``source`` into ``destination[indices]`` (static slices and integers).

    Raises:
        TypeError: ``destination`` is not a buffer.
    """
    dest = _check_buffer(destination, "buffer_store_slice")
    index = tuple(indices) if isinstance(indices, (list, tuple)) else (indices,)
    dest._current = apply(_store_slice, dest._current, source, _name="buffer_store_slice", index=index)


def buffer_create(type: Any) -> BufferValue:  # noqa: A002 - MAX's name
    """A new zero-filled buffer of ``type`` inside the graph (MAX allocates one uninitialized)."""
    from maxjax.graph import ops

    zero = ops.broadcast_to(ops.constant(0, type.dtype), list(type.shape))
    return BufferValue(zero)
