"""``InferenceSession`` and ``Model`` (MAX's ``max.engine``), compiled with ``jax.jit``.

``session.load(graph, weights_registry=...)`` checks every weight the graph needs against the
registry (name, shape, dtype), places each array on its device once (with the weight's
``sharding`` when it has one; see :class:`~maxjax.engine.program.Program`) and returns a
:class:`Model`. The weights are arguments of the jitted function, never constants baked into the
program, as in MAX. Each new combination of input shapes (symbolic dims) compiles once and is
cached by ``jax.jit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import jax

from maxjax.driver import CPU, Buffer, Device, to_jax_array
from maxjax.dtype import DType
from maxjax.engine.program import Program
from maxjax.graph.graph import Graph
from maxjax.graph.type import Shape

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


class Model:
    """A loaded graph: ``execute(*inputs) -> list[Buffer]`` (MAX's ``Model``)."""

    def __init__(self, program: Program, state: dict[str, Any], devices: list[Device]):
        graph = program.graph
        self._graph = graph
        self._program = program
        self._state = state
        self.devices = devices
        self._traces = 0

        def run(state: Mapping[str, Any], *args: Any) -> list[Any]:
            self._traces += 1  # once per trace (new input shapes), not per call
            return program.apply(state, *args)

        # buffer inputs are donated: their new values replace them in the caller's Buffers
        self._buffer_inputs = graph.buffer_input_indices
        self._run = jax.jit(run, donate_argnums=tuple(1 + i for i in self._buffer_inputs))
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

        A buffer input (:class:`~maxjax.graph.BufferType`) given as a :class:`Buffer` holds the
        graph's new value for it afterwards (its old array is donated to the computation).

        Raises:
            ValueError: wrong number of inputs, or an input of the wrong rank, dtype or static size,
                or a symbolic dim bound to two sizes, or an int64/float64 value outside the 32 bits
                JAX holds (the message names the input position).
        """
        self._graph.check_values(args)
        arrays = [to_jax_array(a) for a in args]
        self._graph.bind_dims([a.shape for a in arrays], [a.dtype for a in arrays])
        outs = self._run(self._state, *arrays)
        declared = len(outs) - len(self._buffer_inputs)
        for i, new in zip(self._buffer_inputs, outs[declared:]):
            if isinstance(args[i], Buffer):  # MAX's in-place update of the caller's buffer
                args[i]._array = new
        return [Buffer(o) for o in outs[:declared]]

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
        devices: the devices models run on (``maxjax.driver.Device``s; default: the first CPU
            device). The first one's platform picks the backend policy.

    Raises:
        ValueError: ``num_threads`` is given (XLA sizes its own thread pool per process: set
            ``XLA_FLAGS`` before JAX starts instead).
        NotImplementedError: ``custom_extensions``, ``precompiled_mefs`` or ``export_mefs``
            (Mojo kernels and MAX's compiled artifacts do not exist on JAX; see
            :func:`enable_compilation_cache` for compiled programs on disk).
    """

    def __init__(
        self,
        devices: Iterable[Device] = (),
        num_threads: int | None = None,
        *,
        custom_extensions: Any = None,
        precompiled_mefs: Any = None,
        export_mefs: Any = None,
    ):
        if num_threads is not None:
            raise ValueError(
                "InferenceSession(num_threads=...) cannot be honoured on JAX: XLA sizes one thread pool per "
                "process. Set XLA_FLAGS (e.g. --xla_cpu_multi_thread_eigen=false) before JAX starts instead."
            )
        _refuse_max_artifacts("InferenceSession", custom_extensions=custom_extensions, precompiled_mefs=precompiled_mefs,
                              export_mefs=export_mefs)  # fmt: skip
        self.devices = list(devices) or [CPU()]

    def load(
        self,
        model: Graph,
        *,
        custom_extensions: Any = None,
        weights_registry: Mapping[str, Any] | None = None,
        tile_based_fusion: bool = False,
        scan: bool = True,
        remat: bool = False,
    ) -> Model:
        """Checks ``weights_registry`` against the graph's weights and returns a loaded :class:`Model`.

        Chains of ``ops.call`` of one subgraph run as one ``lax.scan`` over weights stacked here,
        once (``scan=False`` turns that off; ``remat=True`` checkpoints each scanned layer).

        Raises:
            ValueError: a weight the graph needs is missing from the registry (with "did you mean"),
                or its value has a different shape or dtype (naming the weight, expected and actual);
                the graph has no output.
            TypeError: ``model`` is not a Graph (maxjax has no serialized-model format).
            NotImplementedError: ``custom_extensions`` or ``tile_based_fusion=True`` (MAX compiler
                features with no JAX counterpart).
        """
        if not isinstance(model, Graph):
            raise TypeError(f"InferenceSession.load expects a maxjax Graph, got {type(model).__name__}")
        _refuse_max_artifacts("InferenceSession.load", custom_extensions=custom_extensions,
                              tile_based_fusion=tile_based_fusion)  # fmt: skip
        program = Program(model, scan=scan, remat=remat, devices=self.devices)
        state = program.prepare(weights_registry or {})
        return Model(program, state, self.devices)

    def compile(self, model: Graph, *, custom_extensions: Any = None, tile_based_fusion: bool = False) -> Graph:
        """MAX splits compile and init; here compilation happens on first execute (``jax.jit``)."""
        _refuse_max_artifacts("InferenceSession.compile", custom_extensions=custom_extensions,
                              tile_based_fusion=tile_based_fusion)  # fmt: skip
        return model

    def init(self, compiled: Graph, *, weights_registry: Mapping[str, Any] | None = None) -> Model:
        return self.load(compiled, weights_registry=weights_registry)


def _refuse_max_artifacts(where: str, **kwargs: Any) -> None:
    for name, value in kwargs.items():
        if value:
            raise NotImplementedError(
                f"{where}({name}=...): MAX's Mojo kernels and compiled artifacts have no counterpart on JAX "
                "(maxjax.engine.enable_compilation_cache() keeps compiled programs on disk)"
            )
