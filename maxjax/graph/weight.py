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
import numpy as np

from maxjax.driver import to_jax_array
from maxjax.dtype import DType
from maxjax.graph.binding import current_binding
from maxjax.graph.sharding import DeviceLayout, Segment, ShardingStrategy, device_layout
from maxjax.graph.sharding import (  # MAX 26.7 defines these in max/graph/weight.py
    axiswise_sharding_strategy, col_sharding_strategy, expert_parallel_sharding_strategy, gate_up_sharding_strategy,
    head_aware_col_sharding_strategy, replicate_sharding_strategy, row_sharding_strategy, segmented_sharding_strategy,
    stacked_qkv_sharding_strategy, tensor_parallel_sharding_strategy,
)
from maxjax.graph.type import DeviceRef, Shape, ShapeLike
from maxjax.graph.value import TensorValue

__all__ = [
    "Weight", "ShardingStrategy", "Segment", "axiswise_sharding_strategy", "col_sharding_strategy",
    "expert_parallel_sharding_strategy", "gate_up_sharding_strategy", "head_aware_col_sharding_strategy",
    "replicate_sharding_strategy", "row_sharding_strategy", "segmented_sharding_strategy",
    "stacked_qkv_sharding_strategy", "tensor_parallel_sharding_strategy",
]  # fmt: skip


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
        "_sharding",
        "_mesh",
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
        if not isinstance(name, str):  # MAX accepts any str, the empty one included
            raise TypeError(f"Weight name must be a str, got {type(name).__name__} {name!r}")
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
        self._sharding: Any = None  # an explicit jax Sharding of the value
        self._mesh: tuple[Any, str] | None = None  # (Mesh, axis name) of place()

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
        """The abstract graph value: a ``ShapeDtypeStruct``, or for a quantized weight an abstract
        :class:`~maxjax.graph.quantization.QuantizedArray` (logical shape, encoding). A weight
        placed on a mesh axis (:meth:`place`) has the shape of its :attr:`device_layout`.

        Raises:
            ValueError: a quantized weight whose declared shape is not whole GGUF blocks.
        """
        layout = self.device_layout
        shape = self._shape.to_exprs()
        cls = self._quantized_class()
        if layout is not None:
            logical = layout.shape(self._logical_shape())
            shape = self.quantization_encoding.packed_shape(logical) if cls is not None else logical
        sds = jax.ShapeDtypeStruct(shape, self._dtype.to_jax())
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
        cls = self._quantized_class()
        if cls is not None:
            sds = jax.ShapeDtypeStruct(self._shape.to_exprs(), self._dtype.to_jax())
            try:
                return DType.float32, Shape(cls.from_stored(self.quantization_encoding, sds).shape)
            except ValueError as e:
                raise ValueError(f"Weight {self.name!r}: {e}") from None
        return self._dtype, self._shape

    def _logical_shape(self) -> tuple[int, ...]:
        """The static shape a sharding strategy splits: the logical one of a quantized weight."""
        return tuple(int(d) for d in self.original_dtype_and_shape[1])

    @property
    def shape_dtype_struct(self) -> jax.ShapeDtypeStruct:
        """The JAX abstract value of this weight's stored value (declared dtype and shape), with
        its storage sharding (:attr:`storage_sharding`).

        ``jax.tree.map(lambda w: w.shape_dtype_struct, module.raw_state_dict())`` is the abstract
        state dict for ``jax.eval_shape`` and Orbax restore targets.

        Raises:
            ValueError: the shape is symbolic.
        """
        if not Shape.is_static(self._shape):
            raise ValueError(f"Weight {self.name!r} has a symbolic shape {self._shape}")
        shape = tuple(int(d) for d in self._shape)
        return jax.ShapeDtypeStruct(shape, self._dtype.to_jax(), sharding=self.storage_sharding)

    # -- sharding ----------------------------------------------------------------------------
    @property
    def sharding_strategy(self) -> "ShardingStrategy | None":
        """How :meth:`shard` (and :meth:`place`) split this weight (MAX's property)."""
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: "ShardingStrategy | None") -> None:
        # As in MAX 26.7, setting a strategy puts the host weight on the CPU.
        self._sharding_strategy = strategy
        self._device = DeviceRef.CPU()
        self._array_cache = None

    @property
    def sharding(self) -> Any:
        """The ``jax.sharding.Sharding`` of this weight's runtime value: one set by assignment,
        else that of :meth:`place` (the strategy's axis over the mesh axis, replicated without a
        strategy), else None (the weight's device)."""
        if self._sharding is not None:
            return self._sharding
        if self._mesh is None:
            return None
        mesh, axis = self._mesh
        layout = self.device_layout
        return _named(mesh, axis, layout.axis if layout is not None else None, len(self._logical_shape()))

    @sharding.setter
    def sharding(self, value: Any) -> None:
        self._sharding = value
        self._array_cache = None

    @property
    def storage_sharding(self) -> Any:
        """The sharding of the stored value (declared layout, what checkpoints hold): one set by
        assignment; for a weight placed on a mesh, its strategy's axis over the mesh axis where
        the declared size divides evenly, else replicated; else None."""
        if self._sharding is not None or self._mesh is None:
            return self._sharding
        mesh, axis = self._mesh
        layout = self.device_layout
        if layout is None or int(self._shape[layout.axis]) % mesh.shape[axis]:
            return _named(mesh, axis, None, self._shape.rank)
        return _named(mesh, axis, layout.axis, self._shape.rank)

    @property
    def mesh(self) -> tuple[Any, str] | None:
        """``(mesh, axis name)`` given to :meth:`place`, or None."""
        return self._mesh

    def place(self, mesh: Any, axis: str = "tp") -> None:
        """Puts this weight on ``mesh`` (the SPMD path): split over mesh axis ``axis`` by its
        sharding strategy, or replicated when it has none (or ``replicate``).

        The runtime value is then the strategy's :class:`~maxjax.graph.sharding.DeviceLayout`:
        every device's shard (MAX's shard ``i``) padded with zeros to the largest and laid out
        contiguously, so a ``NamedSharding`` gives each device exactly its shard whatever the
        split (uneven heads, ``gate_up`` halves, stacked QKV). Graphs built after this see that
        shape; ``state_dict()``, ``load_state_dict`` and checkpoints keep the declared layout.

        Raises:
            ValueError: ``axis`` is not an axis of ``mesh``, the strategy is for another number of
                devices than the axis has, or it cannot split this weight (names weight, axis,
                sizes and device counts).
        """
        mesh = auto_mesh(mesh)
        names = tuple(mesh.axis_names)
        if axis not in names:
            raise ValueError(f"Weight {self.name!r}: mesh axis {axis!r} does not exist (the mesh has axes {names})")
        strategy = self._sharding_strategy
        n = mesh.shape[axis]
        if strategy is not None and not strategy.is_replicate and strategy.num_devices != n:
            raise ValueError(
                f"Weight {self.name!r}: its sharding strategy splits it over {strategy.num_devices} devices, but mesh "
                f"axis {axis!r} has {n}"
            )
        old = self._mesh
        self._mesh = (mesh, axis)
        try:
            self.stored_device_layout  # noqa: B018 - validates the strategy against the weight now
        except (ValueError, NotImplementedError) as e:
            self._mesh = old
            raise ValueError(f"Weight {self.name!r} of shape {[int(d) for d in self._shape]}: cannot place on mesh axis {axis!r} ({n} devices): {e}") from None
        self._array_cache = None

    @property
    def device_layout(self) -> DeviceLayout | None:
        """How the runtime value lays this weight's shards out on its mesh axis (see
        :meth:`place`); None when not placed, or replicated."""
        strategy = self._sharding_strategy
        if self._mesh is None or strategy is None or strategy.is_replicate:
            return None
        return device_layout(strategy, self._logical_shape())

    @property
    def stored_device_layout(self) -> DeviceLayout | None:
        """:attr:`device_layout` on the stored value (on the GGUF bytes of a quantized weight).

        Raises:
            ValueError: a quantized weight split between columns that are not whole blocks.
        """
        layout = self.device_layout
        if layout is None or self._quantized_class() is None:
            return layout
        return layout.for_packed(self.quantization_encoding, len(self._logical_shape()), self.name)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape of the stored value in :attr:`stored_device_layout` (the declared one when
        the weight has no layout)."""
        layout = self.stored_device_layout
        shape = tuple(int(d) for d in self._shape)
        return shape if layout is None else layout.shape(shape)

    def storage_array(self, value: Any) -> jax.Array:
        """A stored value (declared layout) as a ``jax.Array`` with :attr:`storage_sharding`: on a
        mesh each process reads and places only its devices' blocks (what checkpoints save)."""
        sharding = self.storage_sharding
        if isinstance(sharding, jax.sharding.NamedSharding):
            from maxjax.graph.weights.lazy import host_indexable

            host = host_indexable(value)
            shape = tuple(int(d) for d in self._shape)
            return jax.make_array_from_callback(shape, sharding, lambda index: np.asarray(host[index]))
        return to_jax_array(value, sharding)

    def to_device_layout(self, value: Any) -> Any:
        """A stored value (declared layout; GGUF bytes for a quantized weight) in this weight's
        :attr:`device_layout` (unchanged when it has none).

        Raises:
            ValueError: a quantized weight split between columns that are not whole blocks.
        """
        layout = self.stored_device_layout
        if layout is None or layout.is_identity:
            return value
        return layout.apply(value)

    def shard(self, devices: Iterable[DeviceRef]) -> list["Weight"]:
        """Sharded views of this weight, one per device (MAX's ``Weight.shard``): named
        ``"{name}[i]"`` after the name at this moment, with ``shard_idx=i``, the host's strategy and
        the shard's shape; each is computed from the host weight's value by the strategy (the lower
        indices take the extra rows of an uneven split). The registry key stays the host's name.

        Raises:
            ValueError: no sharding strategy was set, this weight is already a shard (MAX's
                messages), or ``devices`` are not as many as the strategy's (MAX does not check).
            NotImplementedError: a quantized weight (place it on a mesh instead, see :meth:`place`).
        """
        strategy = self._sharding_strategy
        if strategy is None:
            raise ValueError(f"Weight {self.name} cannot be sharded because no sharding strategy was provided.")
        if self.shard_idx is not None:
            raise ValueError(f"Weight {self.name} was already sharded. Use __getitem__ instead.")
        devices = list(devices)
        if len(devices) != strategy.num_devices:
            raise ValueError(
                f"Weight {self.name}: its sharding strategy is for {strategy.num_devices} devices, got {len(devices)}"
            )
        if self._quantized_class() is not None:
            raise NotImplementedError(
                f"Weight {self.name}: per-device shards of a quantized weight are not supported (MAX does not pass a "
                "quantization encoding to shards either); place it on a mesh with Weight.place or Module.to(mesh)"
            )
        aval = jax.ShapeDtypeStruct(self._shape.to_exprs(), self._dtype.to_jax())
        shards = []
        for i, dev in enumerate(devices):
            shape = jax.eval_shape(lambda x, i=i: strategy.shard(x, i, strategy.num_devices), aval).shape
            w = Weight(f"{self.name}[{i}]", self._dtype, shape, dev, None, self.align)
            w._sharding_strategy = strategy
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
            host = self._shard_parent
            value = host._resolve(graph)
            from maxjax.graph.ops._core import apply

            from maxjax.graph.ops.shape import transfer_to

            layout = host.device_layout
            if layout is not None:  # the host's value is all its shards laid out: take this one's block
                shard = apply(layout.shard, value, _name=f"shard[{self.shard_idx}]", i=self.shard_idx)
            else:
                strategy = host._sharding_strategy
                shard = apply(strategy.shard, value, _name=f"shard[{self.shard_idx}]", i=self.shard_idx, num_devices=strategy.num_devices)
            return transfer_to(shard, self._device)  # as MAX: strategy(host, i).to(device)
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
            value = self._data
            if self.device_layout is not None:
                from maxjax.driver import to_host_array

                value = self.to_device_layout(to_host_array(value))
            self._array_cache = self.as_value(value, target)
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


def auto_mesh(mesh: Any) -> Any:
    """``mesh`` with every axis of type ``Auto``: maxjax leaves the partitioning of its programs to
    XLA's SPMD partitioner (an ``Explicit`` axis would ask every op for its output sharding)."""
    from jax.sharding import AxisType, Mesh

    if all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def _named(mesh: Any, axis: str, split_axis: int | None, rank: int) -> Any:
    spec = [None] * rank
    if split_axis is not None:
        spec[split_axis] = axis
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
