"""``maxjax.engine``: ``InferenceSession`` and ``Model`` (MAX's ``max.engine``), compiled with ``jax.jit``.

``session.load(graph, weights_registry=...)`` checks every weight the graph needs against the
registry (name, shape, dtype), places each array on its device once (with the weight's
``sharding`` when it has one) and returns a :class:`Model`. The weights are arguments of the
jitted function, never constants baked into the program, as in MAX. Each new combination of input
shapes (symbolic dims) compiles once and is cached by ``jax.jit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np

from maxjax.driver import CPU, Buffer, Device
from maxjax.dtype import DType
from maxjax.graph.graph import Graph, did_you_mean
from maxjax.graph.type import Shape
from maxjax.graph.weight import to_jax_array

__all__ = ["InferenceSession", "Model", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """Shape (None for a symbolic dim), dtype and name of a model input or output."""

    shape: list[int | None]
    dtype: DType
    name: str

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype!r}, name={self.name})"


def _spec(shape: Shape, dtype: DType, name: str) -> TensorSpec:
    return TensorSpec([int(d) if hasattr(d, "__index__") else None for d in shape], dtype, name)


def _input_array(x: Any) -> Any:
    if isinstance(x, Buffer):
        return x.to_jax()
    if isinstance(x, jax.Array):
        return x
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack__"):
        return jax.dlpack.from_dlpack(x)
    return np.asarray(x)


class Model:
    """A loaded graph: ``execute(*inputs) -> list[Buffer]`` (MAX's ``Model``)."""

    def __init__(self, graph: Graph, weights: dict[str, jax.Array], devices: list[Device]):
        self._graph = graph
        self._weights = weights
        self.devices = devices
        self._traces = 0

        def run(w: Mapping[str, Any], *args: Any) -> list[Any]:
            self._traces += 1  # once per trace (new input shapes), not per call
            return graph._evaluate(w, args)

        self._run = jax.jit(run)
        self.input_metadata = [
            _spec(t.shape, t.dtype, f"input{i}") for i, t in enumerate(graph._input_types)
        ]
        self.output_metadata = [
            _spec(t.shape, t.dtype, f"output{i}") for i, t in enumerate(graph.output_types)
        ]

    @property
    def signature(self) -> str:
        ins = ", ".join(f"{s.name}: {s.dtype.name}{s.shape}" for s in self.input_metadata)
        outs = ", ".join(f"{s.dtype.name}{s.shape}" for s in self.output_metadata)
        return f"({ins}) -> ({outs})"

    @property
    def num_compiles(self) -> int:
        """How many times the graph was traced and compiled (once per distinct input signature)."""
        return self._traces

    def execute(self, *args: Any) -> list[Buffer]:
        """Runs the model on ``args`` (Buffers, NumPy or JAX arrays, DLPack arrays).

        Raises:
            ValueError: wrong number of inputs, or an input of the wrong rank, dtype or static size,
                or a symbolic dim bound to two sizes (the message names the input position).
        """
        arrays = [_input_array(a) for a in args]
        self._graph.bind_dims([a.shape for a in arrays], [a.dtype for a in arrays])
        return [Buffer(o) for o in self._run(self._weights, *arrays)]

    def __call__(self, *args: Any, **kwargs: Any) -> list[Buffer]:
        if kwargs:
            names = [s.name for s in self.input_metadata]
            extra = [k for k in kwargs if k not in names]
            if extra:
                raise ValueError(f"Unknown input names {extra}; inputs are {names}")
            args = (*args, *(kwargs[n] for n in names[len(args) :]))
        return self.execute(*args)

    def __repr__(self) -> str:
        return f"Model({self._graph.name!r}, {self.signature})"


class InferenceSession:
    """Compiles and loads graphs (MAX's ``InferenceSession``).

    Args:
        devices: the devices models run on (default: the first CPU device).
        num_threads: accepted for compatibility; XLA manages its own threads.
    """

    def __init__(self, devices: Iterable[Device] = (), num_threads: int | None = None, **kwargs: Any):
        self.devices = list(devices) or [CPU()]

    def load(
        self,
        model: Graph,
        *,
        custom_extensions: Any = None,
        weights_registry: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Model:
        """Checks ``weights_registry`` against the graph's weights and returns a loaded :class:`Model`.

        Raises:
            ValueError: a weight the graph needs is missing from the registry (with "did you mean"),
                or its value has a different shape or dtype (naming the weight, expected and actual);
                the graph has no output.
            TypeError: ``model`` is not a Graph (maxjax has no serialized-model format).
        """
        if not isinstance(model, Graph):
            raise TypeError(f"InferenceSession.load expects a maxjax Graph, got {type(model).__name__}")
        if model._outputs is None:
            raise ValueError(f"Graph {model.name!r} has no output: call graph.output(...) before loading it")
        registry = weights_registry or {}
        weights: dict[str, jax.Array] = {}
        for key, entry in model._weights.items():
            if key not in registry:
                raise ValueError(f"Weight {key!r} is not in the weights registry.{did_you_mean(key, registry)}")
            value = registry[key]
            w = entry.weight
            shape = tuple(getattr(value, "shape", np.shape(value)))
            try:
                dtype = DType.of(value.dtype)
            except (ValueError, AttributeError):
                dtype = DType.from_numpy(np.asarray(value).dtype)
            bad = []
            if Shape.is_static(w.shape) and Shape(shape) != w.shape:
                bad.append(f"shape (expected={tuple(int(d) for d in w.shape)}, actual={shape})")
            if dtype != w.dtype:
                bad.append(f"dtype (expected={w.dtype!r}, actual={dtype!r})")
            if bad:
                raise ValueError(f"Value for weight {key!r} in the weights registry had different " + " and ".join(bad))
            target = w.sharding
            if target is None:
                try:
                    target = w.device.jax_device()
                except ValueError:
                    target = self.devices[0].jax_device
            weights[key] = to_jax_array(value, target)
        return Model(model, weights, self.devices)

    def compile(self, model: Graph, **kwargs: Any) -> Graph:
        """MAX splits compile and init; here compilation happens on first execute (``jax.jit``)."""
        return model

    def init(self, compiled: Graph, *, weights_registry: Mapping[str, Any] | None = None) -> Model:
        return self.load(compiled, weights_registry=weights_registry)
