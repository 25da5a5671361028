"""MAX's buffer ops (``max.graph.ops.buffer_create``/``buffer_load``/``buffer_store``/
``buffer_store_slice``) on :class:`~maxjax.graph.buffer.BufferValue` versions (see
:mod:`maxjax.graph.buffer`).

Writing a buffer inside an ``ops.cond`` branch or an ``ops.while_loop`` body is refused
(``NotImplementedError``): a buffer's versions are recorded while the graph is built, and a
branch's writes would only exist on one path. A buffer made by ``buffer_create(type, init_value)``
is MAX's persistent state (filled once when the model loads, its writes kept from one execution to
the next); maxjax fills it at every execution, which is the same as long as nothing writes it, so
writing it is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxjax.graph.buffer import BufferValue
from maxjax.graph.ops._core import apply, check_same_device
from maxjax.graph.value import TensorValue

__all__ = ["buffer_create", "buffer_load", "buffer_store", "buffer_store_slice"]


class _PersistentBuffer(BufferValue):
    """A buffer from ``buffer_create(type, init_value)`` (MAX's persistent state: see the module docstring)."""

    __slots__ = ("init_value",)


def _check_buffer(x: Any, op: str) -> BufferValue:
    if not isinstance(x, BufferValue):
        raise TypeError(f"{op}: expected a BufferValue, got {type(x).__name__}")
    return x


def _check_writable(dest: BufferValue, op: str) -> None:
    from maxjax.graph.ops.control_flow import inside_region

    region = inside_region()
    if region:
        raise NotImplementedError(
            f"{op}: writing a buffer inside ops.{region} is not supported by maxjax (a branch's writes exist on one "
            "path only); return the new value from the branch and store it after"
        )
    if isinstance(dest, _PersistentBuffer):
        raise NotImplementedError(
            f"{op}: the buffer was made by buffer_create(..., init_value={dest.init_value!r}), MAX's persistent state "
            "whose writes carry over to the next execution; maxjax re-creates it at every execution, so writing it "
            "is not supported"
        )


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
    _check_writable(dest, "buffer_store")
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
        ValueError: ``source`` on another device than the buffer (MAX's "same device" message).
    """
    dest = _check_buffer(destination, "buffer_store_slice")
    _check_writable(dest, "buffer_store_slice")
    check_same_device("buffer_store_slice", destination=dest._current, source=source)
    index = tuple(indices) if isinstance(indices, (list, tuple)) else (indices,)
    dest._current = apply(_store_slice, dest._current, source, _name="buffer_store_slice", index=index)


def buffer_create(type: Any, init_value: float | bool | None = None) -> BufferValue:  # noqa: A002 - MAX's name
    """A new buffer of ``type`` (a :class:`~maxjax.graph.type.BufferType`) made inside the graph.

    Without ``init_value`` MAX allocates it uninitialized at each execution; maxjax fills it with
    zeros. With ``init_value`` (a scalar representable in ``type.dtype``) it is filled with that
    value converted as MAX converts it (``np.array([init_value], dtype)``); MAX makes it persistent
    state, filled once at load time and kept across executions, which maxjax cannot hold, so in a
    graph such a buffer cannot be written (see the module docstring); eagerly (no graph) the buffer
    is an ordinary one, kept as long as the object.

    Raises:
        TypeError: ``init_value`` is not a Python/NumPy scalar.
        OverflowError: an integer ``init_value`` out of ``type.dtype``'s range (NumPy's, as in MAX).
        NotImplementedError: (later) ``buffer_store`` into a buffer made with ``init_value``.
    """
    from maxjax.graph import ops
    from maxjax.graph.ops.shape import literal_constant

    if init_value is None:
        fill = literal_constant(0, type.dtype)
    else:
        if not isinstance(init_value, (bool, int, float, np.generic)):
            raise TypeError(f"buffer_create: init_value must be a scalar (float, int or bool), got {init_value!r}")
        value = np.array([init_value], dtype=type.dtype.to_numpy())  # as MAX: OverflowError when out of range
        fill = literal_constant(value[0], type.dtype)
    filled = ops.broadcast_to(fill, list(type.shape))  # [*type.shape]
    if init_value is None or filled._graph is None:  # eagerly the buffer lives as long as the object
        return BufferValue(filled)
    buf = _PersistentBuffer(filled)
    buf.init_value = init_value
    return buf
