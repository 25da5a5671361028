"""``Weight`` and ``ShardingStrategy`` (MAX's ``max.graph.Weight``, seed ``max-graph-Weight.txt``).

A :class:`Weight` is a named placeholder: name, dtype, shape, device, quantization encoding,
alignment and sharding. It becomes a value only when it is bound, looked up in this order:

1. in graph mode (a graph is being built), to a graph input fed from the weights registry
   (``Graph.add_weight``);
2. in functional mode, to an array of the state pytree passed to ``functional_call`` (see
   :mod:`maxjax.graph.binding`);
3. in eager mode, to the value ``Module.load_state_dict`` stored on it.

Using a weight in ops never changes it. As in MAX, ``Module.state_dict()``, ``raw_state_dict()``
and ``load_state_dict()`` give a module's Weights their fully-qualified names (``name`` is a plain
attribute).

A weight with a GGUF ``quantization_encoding`` is declared as MAX declares it (``DType.uint8``,
the packed ``[rows, bytes_per_row]`` shape: that is what its registry value holds), and its graph
value is a quantized tensor of the logical float shape (``original_dtype_and_shape``), carried as
a :class:`~maxjax.graph.quantization.QuantizedArray`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp

from maxjax.driver import to_jax_array
from maxjax.dtype import DType
from maxjax.graph.binding import current_binding
from maxjax.graph.type import DeviceRef, Shape, ShapeLike
from maxjax.graph.value import TensorValue

__all__ = ["Weight", "ShardingStrategy"]


class Weight(TensorValue):
    """A named weight whose value is supplied later (MAX's ``Weight``; a :class:`TensorValue`).

    Args:
        name: the weight's name. Inside a ``Module`` the weight is keyed by this name under the
            module's attribute path (``"layers.0." + name``).
        dtype: element type (for a quantized weight: ``DType.uint8`` blocks).
        shape: shape (for a quantized weight: ``[rows, bytes_per_row]``).
        device: where the value lives (``DeviceRef.CPU()`` by default).
        quantization_encoding: the GGUF block encoding of a packed weight, or None.
        align: byte alignment the value must have (None: the dtype's).
        sharding_strategy: how :meth:`shard` splits the weight across devices.

    Unlike other TensorValues, Weights compare and hash by identity.
    """

    __slots__ = (
        "name",
        "_dtype",
        "_shape",
        "_device",
        "quantization_encoding",
        "align",
        "_sharding_strategy",
        "shard_idx",
        "_shard_parent",
        "_data",
        "_array_cache",
        "sharding",
        "__dict__",
    )

    def __init__(
        self,
        name: str,
        dtype: DType,
        shape: ShapeLike,
        device: DeviceRef | None = None,
        quantization_encoding: Any = None,
        align: int | None = None,
        sharding_strategy: "ShardingStrategy | None" = None,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"Weight name must be a non-empty string, got {name!r}")
        self._graph = self._node = self._array = None
        self._index = 0
        self.name = name
        self._dtype = dtype if isinstance(dtype, DType) else DType.of(dtype)
        self._shape = Shape(shape)
        self._device = DeviceRef.CPU() if device is None else DeviceRef.from_device(device)
        self.quantization_encoding = quantization_encoding
        self.align = align
        self._sharding_strategy = sharding_strategy
        self.shard_idx: int | None = None
        self._shard_parent: Weight | None = None
        self._data: Any = None
        self._array_cache: Any = None
        #: A ``jax.sharding.Sharding`` (e.g. a ``NamedSharding`` over a mesh) for the value, or None.
        self.sharding: Any = None

    # -- metadata ----------------------------------------------------------------------------
    @property
    def dtype(self) -> DType:  # type: ignore[override]
        return self._dtype

    @property
    def shape(self) -> Shape:  # type: ignore[override]
        return self._shape

    @property
    def rank(self) -> int:  # type: ignore[override]
        return len(self._shape)

    @property
    def device(self) -> DeviceRef:  # type: ignore[override]
        return self._device

    @device.setter
    def device(self, value: Any) -> None:
        self._device = DeviceRef.from_device(value)
        self._array_cache = None

    @property
    def type(self) -> Any:  # type: ignore[override]
        from maxjax.graph.type import TensorType

        return TensorType(self._dtype, self._shape, self._device)

    @property
    def _aval(self) -> Any:
        """The abstract graph value: a ``ShapeDtypeStruct``, or for a GGUF-quantized weight an
        abstract :class:`~maxjax.graph.quantization.PackedArray` (logical shape, encoding).

        Raises:
            ValueError: a quantized weight whose declared shape is not whole GGUF blocks.
        """
        sds = jax.ShapeDtypeStruct(self._shape.to_exprs(), self._dtype.to_jax())
        cls = self._quantized_class()
        if cls is not None:
            try:
                return cls.from_stored(self.quantization_encoding, sds)
            except ValueError as e:
                raise ValueError(f"Weight {self.name!r}: {e}") from None
        return sds

    def _quantized_class(self) -> Any:
        """The :class:`~maxjax.graph.quantization.QuantizedArray` class this weight's stored value
        is read as, or None (not quantized, or an encoding no class reads)."""
        if self.quantization_encoding is None:
            return None
        from maxjax.graph.quantization import stored_class

        return stored_class(self.quantization_encoding)

    def _is_gguf_quantized(self) -> bool:
        enc = self.quantization_encoding
        return enc is not None and getattr(enc, "is_gguf", False) and self._quantized_class() is not None

    @property
    def original_dtype_and_shape(self) -> tuple[DType, Shape]:
        """The dtype and shape before quantization packing: for a GGUF-quantized weight the
        logical float32 tensor, otherwise the weight's own dtype and shape."""
        if self._quantized_class() is not None:
            return DType.float32, Shape(self._aval.shape)
        return self._dtype, self._shape

    @property
    def shape_dtype_struct(self) -> jax.ShapeDtypeStruct:
        """The JAX abstract value of this weight, with its ``sharding`` if one is set.

        ``jax.tree.map(lambda w: w.shape_dtype_struct, module.raw_state_dict())`` is the abstract
        state for ``jax.eval_shape``, Orbax restore targets and ``jax.jit`` shardings.
        """
        if not Shape.is_static(self._shape):
            raise ValueError(f"Weight {self.name!r} has a symbolic shape {self._shape}")
        return jax.ShapeDtypeStruct(tuple(int(d) for d in self._shape), self._dtype.to_jax(), sharding=self.sharding)

    # -- sharding ----------------------------------------------------------------------------
    @property
    def sharding_strategy(self) -> "ShardingStrategy | None":
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: "ShardingStrategy | None") -> None:
        # As in MAX 26.7, setting a strategy puts the host weight on the CPU.
        self._sharding_strategy = strategy
        self._device = DeviceRef.CPU()

    def shard(self, devices: Iterable[DeviceRef]) -> list["Weight"]:
        """Sharded views of this weight, one per device, named ``"{name}[i]"`` with ``shard_idx=i``.

        The registry key stays ``name``: each shard is computed from the host weight's value by the
        strategy (lower shard indices take the extra rows of an uneven split, as in MAX).

        Raises:
            ValueError: no sharding strategy was set, or this weight is already a shard.
        """
        if self.shard_idx is not None:
            raise ValueError(f"Weight {self.name!r} was already sharded. Use __getitem__ instead.")
        strategy = self._sharding_strategy
        if strategy is None:
            raise ValueError(f"Weight {self.name!r} cannot be sharded because no sharding strategy was provided.")
        devices = list(devices)
        if len(devices) != strategy.num_devices:
            raise ValueError(
                f"Weight {self.name!r}: sharding strategy is for {strategy.num_devices} devices, got {len(devices)}"
            )
        shards = []
        for i, dev in enumerate(devices):
            probe = jax.eval_shape(lambda x, i=i: strategy.shard_array(x, i), self._aval)
            w = Weight(f"{self.name}[{i}]", self._dtype, probe.shape, dev, self.quantization_encoding, self.align)
            w.shard_idx = i
            w._shard_parent = self
            shards.append(w)
        return shards

    # -- value -------------------------------------------------------------------------------
    def _resolve(self, graph: Any = None) -> Any:
        """This weight's value: a graph TensorValue (graph mode) or a JAX array.

        Raises:
            ValueError: used with no graph, no binding and no loaded value.
        """
        if self._shard_parent is not None:
            parent = self._shard_parent._resolve(graph)
            strategy = self._shard_parent._sharding_strategy
            from maxjax.graph.ops._core import apply

            return apply(strategy.shard_array, parent, _name=f"shard[{self.shard_idx}]", i=self.shard_idx)
        if graph is None:
            from maxjax.graph.graph import current_graph

            graph = current_graph()
        if graph is not None:
            return graph.add_weight(self)
        binding = current_binding()
        if binding is not None:
            v = binding.value_of(self)
            if v is not None:
                return self.as_value(v)
        arr = self.array()
        if arr is None:
            raise ValueError(
                f"Cannot operate on Weight {self.name!r} ({self._dtype.name}{list(self._shape)}): there is no "
                "parent graph and it has no value. Possible fixes:\n"
                "  1. Build a graph: use the weight inside `with Graph(...)`.\n"
                "  2. Load values first: module.load_state_dict(...) (eager mode).\n"
                "  3. Pass the values in: maxjax.nn.functional_call(module, state, *inputs)."
            )
        return arr

    def array(self) -> Any:
        """The loaded value on this weight's sharding or device (a ``jax.Array``; a
        :class:`~maxjax.graph.quantization.PackedArray` for a GGUF-quantized weight), or None when
        nothing is loaded. Placed once and cached until the value or device changes."""
        if self._array_cache is None and self._data is not None:
            target = self.sharding
            if target is None and self._device is not None:
                try:
                    target = self._device.jax_device()
                except ValueError:
                    target = None
            self._array_cache = self.as_value(self._data, target)
        return self._array_cache

    def as_value(self, value: Any, device: Any = None) -> Any:
        """``value`` (a state-dict value, array or tracer) as this weight's runtime value: a JAX
        array, or for a quantized weight a :class:`~maxjax.graph.quantization.QuantizedArray`
        (raw GGUF bytes are read as a ``PackedArray``)."""
        from maxjax.graph.quantization import QuantizedArray, as_quantized

        if isinstance(value, QuantizedArray):
            return value if device is None else jax.device_put(value, device)
        arr = value if isinstance(value, jax.Array) and device is None else to_jax_array(value, device)
        return as_quantized(arr, self.quantization_encoding) if self._quantized_class() is not None else arr

    def retype(self, quantization_encoding: Any, dtype: DType, shape: ShapeLike) -> None:
        """Takes another encoding, dtype and shape (``load_state_dict(...,
        override_quantization_encoding=True)`` takes a value's); drops the cached value."""
        self.quantization_encoding = quantization_encoding
        self._dtype = DType.of(dtype)
        self._shape = Shape(shape)
        self._array_cache = None

    def set_value(self, value: Any) -> None:
        """Stores ``value`` as this weight's eager value (no checks: ``Module.load_state_dict``
        validates values before it calls this)."""
        self._data = value
        self._array_cache = None

    @property
    def value(self) -> Any:
        """The loaded value (as given to ``load_state_dict``), or None."""
        return self._data

    # -- identity semantics ------------------------------------------------------------------
    def __eq__(self, other: Any) -> bool:  # type: ignore[override]
        return self is other

    def __ne__(self, other: Any) -> bool:  # type: ignore[override]
        return self is not other

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        dims = ", ".join(repr(d) for d in self._shape)
        enc = f", {self.quantization_encoding}" if self.quantization_encoding is not None else ""
        return f"Weight({self.name}, {self._dtype!r}, [{dims}], {self._device}{enc})"


def _shard_range(size: int, i: int, n: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``i`` of ``n`` (lower shards take the extra rows, as MAX)."""
    base, extra = divmod(size, n)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


def _take(x: Any, axis: int, start: int, stop: int) -> Any:
    return jax.lax.slice_in_dim(x, start, stop, axis=axis)


@dataclass(frozen=True)
class ShardingStrategy:
    """How a weight is split across ``num_devices`` devices (MAX's ``ShardingStrategy``).

    ``shard(array, i, num_devices)`` returns shard ``i`` of an array. :meth:`partition_spec` gives
    the equivalent ``jax.sharding.PartitionSpec`` over a mesh axis where one exists (rowwise,
    columnwise, axiswise, replicate), for ``NamedSharding`` placement.
    """

    num_devices: int
    shard: Callable[[Any, int, int], Any]
    kind: str = "custom"
    axis: int | None = None

    def __call__(self, weight: Any, i: int) -> Any:
        return self.shard(weight, i, self.num_devices)

    def shard_array(self, x: Any, i: int) -> Any:
        return self.shard(x, i, self.num_devices)

    # -- constructors (MAX's names) ----------------------------------------------------------
    @staticmethod
    def axiswise(axis: int, num_devices: int) -> "ShardingStrategy":
        def fn(x: Any, i: int, n: int) -> Any:
            ax = axis % x.ndim
            return _take(x, ax, *_shard_range(x.shape[ax], i, n))

        return ShardingStrategy(num_devices, fn, "axiswise", axis)

    @staticmethod
    def rowwise(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices, ShardingStrategy.axiswise(0, num_devices).shard, "rowwise", 0)

    @staticmethod
    def columnwise(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices, ShardingStrategy.axiswise(1, num_devices).shard, "columnwise", 1)

    @staticmethod
    def replicate(num_devices: int) -> "ShardingStrategy":
        return ShardingStrategy(num_devices, lambda x, i, n: x, "replicate")

    @staticmethod
    def gate_up(num_devices: int, axis: int = 2) -> "ShardingStrategy":
        """Each half (gate, up) of a fused gate/up weight split separately along ``axis`` (0 or 1)."""
        ax = 0 if axis == 2 else axis

        def fn(x: Any, i: int, n: int) -> Any:
            half = x.shape[ax] // 2
            parts = [_take(x, ax, 0, half), _take(x, ax, half, x.shape[ax])]
            return jnp.concatenate([_take(p, ax, *_shard_range(half, i, n)) for p in parts], axis=ax)

        return ShardingStrategy(num_devices, fn, "gate_up", ax)

    @staticmethod
    def stacked_qkv(num_devices: int, num_heads: int, head_dim: int) -> "ShardingStrategy":
        """Shard ``i`` of a stacked ``[3 * num_heads * head_dim, in]`` QKV weight: its heads of Q, K and V."""

        def fn(x: Any, i: int, n: int) -> Any:
            q, k, v = (_take(x, 0, j * num_heads * head_dim, (j + 1) * num_heads * head_dim) for j in range(3))
            start, stop = _shard_range(num_heads, i, n)
            return jnp.concatenate([_take(p, 0, start * head_dim, stop * head_dim) for p in (q, k, v)], axis=0)

        return ShardingStrategy(num_devices, fn, "stacked_qkv", 0)

    @staticmethod
    def tensor_parallel(num_devices: int) -> "ShardingStrategy":
        raise NotImplementedError("ShardingStrategy.tensor_parallel is a placeholder in MAX 26.7 too")

    @staticmethod
    def expert_parallel(num_devices: int) -> "ShardingStrategy":
        raise NotImplementedError("ShardingStrategy.expert_parallel is a placeholder in MAX 26.7 too")

    # -- predicates --------------------------------------------------------------------------
    @property
    def is_rowwise(self) -> bool:
        return self.kind == "rowwise"

    @property
    def is_colwise(self) -> bool:
        return self.kind == "columnwise"

    @property
    def is_replicate(self) -> bool:
        return self.kind == "replicate"

    @property
    def is_axiswise(self) -> bool:
        return self.kind == "axiswise"

    @property
    def is_gate_up(self) -> bool:
        return self.kind == "gate_up"

    @property
    def is_stacked_qkv(self) -> bool:
        return self.kind == "stacked_qkv"

    @property
    def sharded_axis(self) -> int | None:
        return self.axis

    def partition_spec(self, rank: int, mesh_axis: str) -> jax.sharding.PartitionSpec:
        """The ``PartitionSpec`` that splits a rank-``rank`` array the same way over ``mesh_axis``.

        Raises:
            ValueError: the strategy has no single-axis equivalent (gate_up, stacked_qkv, custom).
        """
        P = jax.sharding.PartitionSpec
        if self.kind == "replicate":
            return P()
        if self.kind in ("rowwise", "columnwise", "axiswise"):
            spec: list[str | None] = [None] * rank
            spec[self.axis % rank] = mesh_axis
            return P(*spec)
        raise ValueError(f"ShardingStrategy {self.kind!r} has no PartitionSpec equivalent")
