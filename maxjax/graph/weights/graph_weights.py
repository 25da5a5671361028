"""``Graph.weights()``: a Weights view for declaring a graph's weights by hierarchical name.

Seed ``max-graph-weights-Weights.txt``::

    weights = graph.weights()
    w = weights.transformer.layers[0].attention.weight.allocate(dtype=DType.float32, shape=(768, 768))
    # w.name == "transformer.layers.0.attention.weight"
    with graph:
        value = graph.add_weight(w)

A graph holds no data, so ``allocate`` needs ``dtype`` and ``shape``; the values come from the
weights registry when the graph is loaded. ``exists()`` is True for names already allocated here
or added to the graph.
"""

from __future__ import annotations

from typing import Any, Iterable

from maxjax.driver import Buffer, to_jax_array
from maxjax.dtype import DType
from maxjax.graph.type import DeviceRef, Shape
from maxjax.graph.weight import Weight
from maxjax.graph.weights.protocol import HierarchicalWeights, WeightsStore
from maxjax.graph.weights.weight_data import WeightData

__all__ = ["GraphWeights"]


class GraphWeightsStore(WeightsStore):
    """The weights a graph knows: allocated through its view, or added with ``add_weight``."""

    kind = "graph"

    def __init__(self, graph: Any):
        super().__init__()
        self.graph = graph
        self.declared: dict[str, Weight] = {}

    def _graph_weights(self) -> dict[str, Weight]:
        return {k: e.weight for k, e in getattr(self.graph, "_weights", {}).items()}

    def weights(self) -> dict[str, Weight]:
        return {**self._graph_weights(), **self.declared}

    def names(self) -> list[str]:
        return list(self.weights())

    # names change as the graph grows: never cache them
    def sorted_names(self) -> list[str]:
        self.invalidate()
        return super().sorted_names()

    def __contains__(self, name: str) -> bool:
        return name in self.declared or name in getattr(self.graph, "_weights", {})

    def describe(self) -> str:
        return f"graph {self.graph.name!r}"

    def load(self, name: str) -> WeightData:
        w = self.weights()[name]
        value = w.value
        if value is None:
            raise ValueError(
                f"Weight {name!r} of graph {self.graph.name!r} has no data: a graph's weights get their "
                "values from the weights registry when the graph is loaded"
            )
        if isinstance(value, WeightData):
            return value
        arr = to_jax_array(value)
        return WeightData(Buffer(arr), name, DType.of(arr.dtype), Shape(arr.shape), w.quantization_encoding)


class GraphWeights(HierarchicalWeights):
    """The :class:`~maxjax.graph.weights.Weights` view of a graph (``graph.weights()``)."""

    __slots__ = ()

    def __init__(self, graph: Any, prefix: str = ""):
        super().__init__(GraphWeightsStore(graph), prefix)

    def allocate(
        self,
        dtype: DType | None = None,
        shape: Iterable[Any] | None = None,
        quantization_encoding: Any = None,
        device: DeviceRef = DeviceRef.CPU(),
    ) -> Weight:
        """A :class:`~maxjax.graph.Weight` named this view's name (add it with ``graph.add_weight``).

        Allocating a name again with the same dtype, shape and encoding returns the same Weight
        (as does a name already added to the graph).

        Raises:
            ValueError: ``dtype`` or ``shape`` missing (a graph has no data to take them from), no
                name (the root view), or the name already has a Weight of another dtype, shape or
                encoding (nothing is recorded then).
        """
        name = self._prefix
        if not name:
            raise ValueError("allocate needs a weight name: index the graph's weights first (weights.layer.weight)")
        if dtype is None or shape is None:
            raise ValueError(
                f"allocate({name!r}) on a graph's weights needs dtype and shape: the graph has no data to take them from"
            )
        dtype = DType.of(dtype)
        shape = Shape(shape)
        store: GraphWeightsStore = self._store  # type: ignore[assignment]
        existing = store.weights().get(name)
        if existing is not None:
            if existing.dtype != dtype or existing.shape != shape or existing.quantization_encoding != quantization_encoding:
                raise ValueError(
                    f"Weight {name!r} already exists in {store.describe()} as {existing.dtype!r} {existing.shape} "
                    f"(encoding {existing.quantization_encoding}); cannot allocate it as {dtype!r} {shape} "
                    f"(encoding {quantization_encoding})"
                )
            store.declared.setdefault(name, existing)
            return existing
        weight = Weight(name, dtype, shape, device, quantization_encoding)
        store.declared[name] = weight
        return weight
