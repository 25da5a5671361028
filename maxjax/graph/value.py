"""``TensorValue``: the value layer code computes with, in every mode.

A TensorValue is backed by one of two things:

- a node of a :class:`~maxjax.graph.Graph` (graph mode, MAX's way): its shape may hold symbolic dims;
- a JAX array or tracer (functional and eager modes): its shape is concrete.

Its operators and methods (``T``, ``@``, ``+``, ``reshape``, ``cast``, ...) are MAX's and call
:mod:`maxjax.graph.ops`, so layer code reads the same in all modes. ``x.T`` swaps the last two
axes, as in MAX (not JAX's reversal of all axes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.type import DeviceRef, Dim, Shape, TensorType

if TYPE_CHECKING:  # pragma: no cover
    from maxjax.graph.graph import Graph, Node

__all__ = ["Value", "TensorValue", "TensorValueLike"]


def _ops() -> Any:
    from maxjax.graph import ops

    return ops


class Value:
    """Base of graph values (MAX's ``Value``). ``.tensor`` gives the :class:`TensorValue`."""

    __slots__ = ()

    @property
    def tensor(self) -> "TensorValue":
        if isinstance(self, TensorValue):
            return self
        raise TypeError(f"{type(self).__name__} is not a tensor value")


class TensorValue(Value):
    """A tensor in a graph (symbolic) or a concrete JAX array / tracer (see the module docstring).

    Construct one from a JAX or NumPy array (``TensorValue(jnp.ones(3))``) to use MAX's methods on
    concrete data; graph values are made by graph inputs and ops.
    """

    __slots__ = ("_graph", "_node", "_index", "_array", "__weakref__")

    def __init__(self, value: Any):
        if isinstance(value, TensorValue):
            self._graph, self._node, self._index, self._array = (
                value._graph,
                value._node,
                value._index,
                value._array,
            )
            return
        from maxjax.driver import Buffer

        if isinstance(value, Buffer):
            value = value.to_jax()
        if isinstance(value, (Dim, Shape, list, tuple)):
            raise TypeError("TensorValue from a Dim or Shape: use ops.shape_to_tensor or ops.constant")
        self._graph = None
        self._node = None
        self._index = 0
        from maxjax.graph.quantization import QuantizedArray

        self._array = value if isinstance(value, (jax.Array, QuantizedArray)) else jax.numpy.asarray(value)

    @classmethod
    def _from_node(cls, graph: "Graph", node: "Node", index: int = 0) -> "TensorValue":
        tv = object.__new__(TensorValue)
        tv._graph, tv._node, tv._index, tv._array = graph, node, index, None
        return tv

    @classmethod
    def _from_array(cls, array: Any) -> "TensorValue":
        tv = object.__new__(TensorValue)
        tv._graph, tv._node, tv._index, tv._array = None, None, 0, array
        return tv

    @property
    def buffer(self) -> "TensorValue":
        """MAX's ``Value.buffer``: a tensor is not a buffer (TypeError), except a graph input of a
        signal-buffer type (:class:`maxjax.nn.comm.SignalBufferType`), which stands for its buffer:
        the collectives only count signal buffers and read their devices.

        Raises:
            TypeError: any other tensor value.
        """
        node = self._node
        if node is not None and node.kind == "input":
            if getattr(self._graph._input_types[node.extra], "is_signal_buffer", False):
                return self
        raise TypeError(f"{self!r} is not a buffer value")

    # -- what backs this value ---------------------------------------------------------------
    @property
    def _aval(self) -> Any:
        if self._node is not None:
            return self._node.out_avals[self._index]
        return self._array

    def to_jax(self) -> jax.Array:
        """The JAX array (or tracer) behind a concrete value.

        Raises:
            ValueError: this is a symbolic graph value, which has no data until the graph runs.
        """
        if self._array is None:
            where = f"of graph {self._graph.name!r}" if self._graph is not None else "outside any graph"
            raise ValueError(
                f"{self!r} is a symbolic value {where}: it has data only when the graph runs (add it to "
                "graph.output(...) and execute the model; a module's loaded values: module.state_dict())"
            )
        return self._array

    def to_numpy(self) -> np.ndarray:
        return np.asarray(self.to_jax())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype)

    # -- metadata ----------------------------------------------------------------------------
    @property
    def shape(self) -> Shape:
        """The shape as a :class:`Shape` of Dims (symbolic dims in graph mode)."""
        return Shape(Dim.from_expr(d) for d in self._aval.shape)

    @property
    def dtype(self) -> DType:
        """The element type. A graph value has MAX's declared dtype: ``int64``/``float64`` ones are
        held by JAX as 32-bit arrays when x64 is off (see :mod:`maxjax.graph.graph`); a
        concrete value has its array's dtype."""
        node = self._node
        if node is not None and node.dtypes is not None:
            return node.dtypes[self._index]
        return DType.from_numpy(self._aval.dtype)

    @property
    def rank(self) -> int:
        return len(self._aval.shape)

    @property
    def device(self) -> DeviceRef:
        if self._node is not None:
            return self._node.device
        try:
            devs = self._array.devices()
            return DeviceRef.from_device(next(iter(devs)))
        except Exception:  # tracers have no device
            return DeviceRef.from_device(jax.devices()[0])

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, self.shape, self.device)

    @property
    def quantization_encoding(self) -> Any:
        """The encoding of a quantized tensor (a quantized weight, or rows taken from one), else
        None. A quantized tensor's ``shape`` and ``dtype`` are the logical float ones."""
        return getattr(self._aval, "encoding", None)

    @property
    def graph(self) -> "Graph | None":
        """The graph this value belongs to (None for a concrete value)."""
        return self._graph

    # -- methods (MAX's TensorValue) ---------------------------------------------------------
    @property
    def T(self) -> "TensorValue":
        """The transpose of the last two axes (MAX semantics)."""
        return _ops().transpose(self, -1, -2)

    def reshape(self, shape: Any) -> "TensorValue":
        return _ops().reshape(self, shape)

    def rebind(self, shape: Any, message: str = "") -> "TensorValue":
        """This value with its dims renamed to ``shape`` (MAX's ``TensorValue.rebind``; see
        :func:`maxjax.graph.ops.rebind`)."""
        return _ops().rebind(self, shape, message)

    def cast(self, dtype: DType) -> "TensorValue":
        return _ops().cast(self, dtype)

    def transpose(self, dim_1: int, dim_2: int) -> "TensorValue":
        """Swaps axes ``dim_1`` and ``dim_2``."""
        return _ops().transpose(self, dim_1, dim_2)

    def permute(self, dims: list[int]) -> "TensorValue":
        return _ops().permute(self, dims)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> "TensorValue":
        return _ops().flatten(self, start_dim, end_dim)

    def broadcast_to(self, shape: Any) -> "TensorValue":
        return _ops().broadcast_to(self, shape)

    def to(self, device: Any) -> "TensorValue":
        return _ops().transfer_to(self, device)

    def print(self, label: str = "debug_tensor") -> None:
        _ops().print(self, label)

    def max(self, axis: int = -1) -> "TensorValue":
        return _ops().max(self, axis=axis)

    def min(self, axis: int = -1) -> "TensorValue":
        return _ops().min(self, axis=axis)

    def mean(self, axis: int = -1) -> "TensorValue":
        return _ops().mean(self, axis=axis)

    def sum(self, axis: int = -1) -> "TensorValue":
        return _ops().sum(self, axis=axis)

    def argmax(self, axis: int = -1) -> "TensorValue":
        return _ops().argmax(self, axis=axis)

    def stdev(self, axis: int = -1) -> "TensorValue":
        return _ops().sqrt(self.var(axis))

    def var(self, axis: int = -1) -> "TensorValue":
        """Variance along ``axis`` (kept as size 1); a bool tensor raises TypeError (MAX)."""
        if self.dtype is DType.bool:
            raise TypeError("Variance undefined for boolean values.")
        o = _ops()
        centered = self - o.mean(self, axis=axis)
        return o.mean(centered * centered, axis=axis)

    def __getitem__(self, index: Any) -> "TensorValue":
        return _ops().slice_tensor(self, index)

    # -- operators ---------------------------------------------------------------------------
    def __add__(self, rhs: Any) -> "TensorValue":
        return _ops().add(self, rhs)

    def __radd__(self, lhs: Any) -> "TensorValue":
        return _ops().add(lhs, self)

    def __sub__(self, rhs: Any) -> "TensorValue":
        return _ops().sub(self, rhs)

    def __rsub__(self, lhs: Any) -> "TensorValue":
        return _ops().sub(lhs, self)

    def __mul__(self, rhs: Any) -> "TensorValue":
        return _ops().mul(self, rhs)

    def __rmul__(self, lhs: Any) -> "TensorValue":
        return _ops().mul(lhs, self)

    def __truediv__(self, rhs: Any) -> "TensorValue":
        return _ops().div(self, rhs)

    def __rtruediv__(self, lhs: Any) -> "TensorValue":
        return _ops().div(lhs, self)

    def __floordiv__(self, rhs: Any) -> "TensorValue":
        return _ops().floor_div(self, rhs)

    def __rfloordiv__(self, lhs: Any) -> "TensorValue":
        return _ops().floor_div(lhs, self)

    def __mod__(self, rhs: Any) -> "TensorValue":
        return _ops().mod(self, rhs)

    def __rmod__(self, lhs: Any) -> "TensorValue":
        return _ops().mod(lhs, self)

    def __pow__(self, rhs: Any) -> "TensorValue":
        return _ops().pow(self, rhs)

    def __rpow__(self, lhs: Any) -> "TensorValue":
        return _ops().pow(lhs, self)

    def __matmul__(self, rhs: Any) -> "TensorValue":
        return _ops().matmul(self, rhs)

    def __rmatmul__(self, lhs: Any) -> "TensorValue":
        return _ops().matmul(lhs, self)

    def __neg__(self) -> "TensorValue":
        return _ops().negate(self)

    def __abs__(self) -> "TensorValue":
        return _ops().abs(self)

    def __invert__(self) -> "TensorValue":
        return _ops().logical_not(self)

    def __and__(self, rhs: Any) -> "TensorValue":
        return _ops().logical_and(self, rhs)

    def __rand__(self, lhs: Any) -> "TensorValue":
        return _ops().logical_and(lhs, self)

    def __or__(self, rhs: Any) -> "TensorValue":
        return _ops().logical_or(self, rhs)

    def __ror__(self, lhs: Any) -> "TensorValue":
        return _ops().logical_or(lhs, self)

    def __xor__(self, rhs: Any) -> "TensorValue":
        return _ops().logical_xor(self, rhs)

    def __rxor__(self, lhs: Any) -> "TensorValue":
        return _ops().logical_xor(lhs, self)

    def __eq__(self, rhs: Any) -> "TensorValue":  # type: ignore[override]
        return _ops().equal(self, rhs)

    def __ne__(self, rhs: Any) -> "TensorValue":  # type: ignore[override]
        return _ops().not_equal(self, rhs)

    def __gt__(self, rhs: Any) -> "TensorValue":
        return _ops().greater(self, rhs)

    def __ge__(self, rhs: Any) -> "TensorValue":
        return _ops().greater_equal(self, rhs)

    def __lt__(self, rhs: Any) -> "TensorValue":
        return _ops().greater(rhs, self)

    def __le__(self, rhs: Any) -> "TensorValue":
        return _ops().greater_equal(rhs, self)

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        if self._array is None:
            raise TypeError(
                "The truth value of a symbolic TensorValue is not known while the graph is built; "
                "use ops.where or ops.cond"
            )
        return bool(self._array)

    def __len__(self) -> int:
        if not self.rank:
            raise TypeError("len() of a rank-0 TensorValue")
        first = self._aval.shape[0]
        if not isinstance(first, int):
            raise TypeError(f"len() of a TensorValue whose first dim is symbolic ({first})")
        return first

    def __contains__(self, item: Any) -> bool:
        # MAX 26.7 disallows ``in`` (it would loop forever over a symbolic value).
        raise TypeError(f"'{type(self).__name__}' object is not a container")

    def __iter__(self) -> Any:
        if self._array is None:
            raise TypeError("a symbolic TensorValue is not iterable; use ops.split or slicing")
        for i in range(self._array.shape[0]):
            yield self[i]

    def __float__(self) -> float:
        return float(self.to_jax())

    def __int__(self) -> int:
        return int(self.to_jax())

    def __repr__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        if self._array is None:
            name = self._node.label(self._index) if self._node is not None else "?"
            return f"TensorValue({name}: {self.dtype.name}[{dims}] on {self.device})"
        if isinstance(self._array, jax.core.Tracer):
            return f"TensorValue(traced {self.dtype.name}[{dims}])"
        return f"TensorValue({self.dtype.name}[{dims}], {np.array2string(np.asarray(self._array), threshold=20)})"


TensorValueLike = Any

#: MAX's ``Numeric``: the numbers a graph op turns into constants (MAX's type alias, for annotations).
Numeric = Any
#: MAX's ``Scalar``: a number or a Dim (MAX's type alias, for annotations).
Scalar = Any


def __getattr__(name: str) -> Any:  # ``maxjax.graph.value.BufferValue`` (MAX's module path)
    if name == "BufferValue":
        from maxjax.graph.buffer import BufferValue

        return BufferValue
    raise AttributeError(name)
