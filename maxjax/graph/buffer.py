"""``BufferValue``: a mutable buffer in a graph (MAX's ``max.graph.BufferValue``), on JAX's
immutable arrays.

A buffer is versioned while the graph is built: :func:`~maxjax.graph.ops.buffer_load` reads its
current version (a :class:`~maxjax.graph.TensorValue`) and
:func:`~maxjax.graph.ops.buffer_store` makes a new value its current version (build-time
bookkeeping only). When the graph's output is set, the final version of every buffer input becomes
a hidden extra output; ``Model.execute`` donates the buffer arguments to the compiled function and
puts each buffer's new array into the caller's :class:`~maxjax.driver.Buffer`, so the caller sees
the update as in MAX (no copy: the old array is donated). In functional mode
(``Program.apply``) the buffers' final values are returned after the declared outputs, in the
order of the buffer inputs. In eager mode a ``BufferValue(array)`` is updated in place.
"""

from __future__ import annotations

from typing import Any

from maxjax.graph.type import BufferType
from maxjax.graph.value import TensorValue, Value

__all__ = ["BufferValue"]


class BufferValue(Value):
    """A mutable buffer: a graph input of :class:`~maxjax.graph.type.BufferType`, or (eager
    mode) a wrapper of a concrete array.

    ``.buffer`` is itself; ``.tensor`` raises (MAX's rule: load it with ``ops.buffer_load``).
    ``shape``, ``dtype``, ``device``, ``rank`` and ``type`` are the buffer's.
    """

    __slots__ = ("_current", "_graph", "_input_index", "_type")

    def __init__(self, value: Any) -> None:
        current = value if isinstance(value, TensorValue) else TensorValue(value)
        self._current = current
        self._graph = current._graph
        self._input_index: int | None = None
        self._type = BufferType(current.dtype, current.shape, current.device)

    @classmethod
    def _input(cls, graph: Any, value: TensorValue, index: int, type_: BufferType) -> "BufferValue":
        b = cls(value)
        b._graph, b._input_index, b._type = graph, index, type_
        return b

    @property
    def buffer(self) -> "BufferValue":
        return self

    @property
    def tensor(self) -> TensorValue:  # type: ignore[override]
        raise TypeError("a BufferValue is not a tensor value: read it with ops.buffer_load(buffer)")

    @property
    def type(self) -> BufferType:
        return self._type

    @property
    def shape(self) -> Any:
        return self._type.shape

    @property
    def dtype(self) -> Any:
        return self._type.dtype

    @property
    def device(self) -> Any:
        return self._type.device

    @property
    def rank(self) -> int:
        return self._type.rank

    def __repr__(self) -> str:
        return f"BufferValue({self._type})"
