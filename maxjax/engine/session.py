"""``InferenceSession`` and ``Model`` (MAX's ``max.engine``), compiled with ``jax.jit``.

``session.load(graph, weights_registry=...)`` checks every weight the graph needs against the
registry (name, shape, dtype), places each array on its device once (with the weight's
``sharding`` when it has one; see :class:`~maxjax.engine.program.Program`) and returns a
:class:`Model`. The weights are arguments of the jitted function, never constants baked into the
program, as in MAX. Each new combination of input shapes (symbolic dims) compiles once and is
cached by ``jax.jit``.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal, Mapping, NoReturn, Sequence

import jax
import numpy as np

from maxjax.driver import CPU, Buffer, Device, to_jax_array
from maxjax.dtype import DType
from maxjax.engine.program import Program
from maxjax.graph.graph import Graph, Module
from maxjax.graph.type import Shape

__all__ = [
    "ArtifactBodyMismatch", "CompilationStopped", "CompileOnlyExecutionError", "CompileOnlyModel", "CompiledModel",
    "CustomExtensionsType", "DebugConfig", "GPUProfilingMode", "InferenceSession", "LogLevel", "MefStore",
    "MissingArtifactError", "Model", "PrintStyle", "TensorSpec", "read",
]  # fmt: skip

CustomExtensionsType = Sequence[str | Path] | str | Path
"""MAX's custom-extension paths (``.mojoc`` / ``.mojo``): refused wherever given (no Mojo on JAX)."""

GPUProfilingMode = Literal["off", "on", "detailed"]
"""MAX's GPU profiling modes (only ``"off"`` exists in maxjax: profile with ``jax.profiler``)."""

_SCALARS = (int, float, bool, np.generic)


@dataclass(frozen=True)
class TensorSpec:
    """Shape (None for a symbolic dim), dtype and name of a model input or output (MAX's ``TensorSpec``).

    ``str(spec)`` is MAX's MLIR-style text (``"-1x3xfloat32"``).
    """

    shape: list[int | None] | None
    dtype: DType
    name: str

    def __repr__(self) -> str:
        return f"TensorSpec(shape={self.shape}, dtype={self.dtype!r}, name={self.name})"

    def __str__(self) -> str:
        if self.shape is None:
            return f"None x {self.dtype.name}"
        return "x".join([*("-1" if d is None else str(d) for d in self.shape), self.dtype.name])


def _spec(shape: Shape, dtype: DType, name: str) -> TensorSpec:
    return TensorSpec([int(d) if hasattr(d, "__index__") else None for d in shape], dtype, name)


def _type_device(t: Any, default: Device) -> Device:
    ref = getattr(t, "device", None)
    return ref.to_device() if ref is not None else default


class CompileOnlyExecutionError(RuntimeError):
    """A model compiled under virtual devices was asked to run (MAX's; maxjax has no virtual devices)."""


class CompilationStopped(RuntimeError):
    """MAX raises this when ``DebugConfig.pre_jit`` stops a compile (maxjax never does: no ``pre_jit``)."""


class MissingArtifactError(RuntimeError):
    """No compiled artifact for a graph (MAX's MEF stores; maxjax has none, so never raises it)."""


class ArtifactBodyMismatch(RuntimeError):
    """A recorded artifact holds another graph (MAX's MEF stores; maxjax never raises it)."""


class MefStore:
    """MAX's directory of compiled MEF artifacts. Not available: XLA programs are cached with
    :func:`~maxjax.engine.enable_compilation_cache`.

    Raises:
        NotImplementedError: always.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(_NO_MEF.format(what="MefStore"))

    @classmethod
    def for_import(cls, directories: Any) -> "MefStore":
        raise NotImplementedError(_NO_MEF.format(what="MefStore.for_import"))

    @classmethod
    def for_export(cls, directory: Any) -> "MefStore":
        raise NotImplementedError(_NO_MEF.format(what="MefStore.for_export"))


_NO_MEF = (
    "{what}: MAX's compiled artifacts (MEF files) have no counterpart on JAX; "
    "maxjax.engine.enable_compilation_cache() keeps compiled XLA programs on disk"
)


def read(source: Any) -> "CompiledModel":
    """Raises NotImplementedError: maxjax cannot read MAX's ``.mef`` artifacts."""
    raise NotImplementedError(_NO_MEF.format(what="max.engine.read"))


class PrintStyle(enum.Enum):
    """How ``TensorValue.print`` prints (MAX's ``PrintStyle``; maxjax prints with ``jax.debug.print``,
    which is ``COMPACT``)."""

    COMPACT = 0
    FULL = 1
    BINARY = 2
    BINARY_MAX_CHECKPOINT = 4
    NONE = 3


class LogLevel(str, enum.Enum):
    """Verbosity of Mojo logging (MAX's ``LogLevel``; maxjax runs no Mojo: only ``NOTSET``)."""

    NOTSET = "notset"
    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


class AssertLevel(str, enum.Enum):
    """Which Mojo asserts are compiled in (MAX's ``AssertLevel``; maxjax runs no Mojo: only ``NONE``)."""

    NONE = "none"
    WARN = "warn"
    SAFE = "safe"
    ALL = "all"


class SplitKReductionPrecision(enum.IntEnum):
    """MAX's split-K accumulation precision (internal to MAX)."""

    ACCUM = 1
    OUTPUT = 2


class DebugConfig:
    """MAX's process-wide debug switches (``InferenceSession.debug``). Every switch reads as off;
    setting one to its off value is accepted, turning one on raises NotImplementedError with the
    JAX tool to use instead.
    """

    _OFF: ClassVar[dict[str, Any]] = {
        "nan_check": False, "uninitialized_read_check": False, "uninitialized_read_mode": "",
        "device_sync_mode": False, "stack_trace_on_error": False, "stack_trace_on_crash": False,
        "source_tracebacks": False, "pre_jit": False, "op_log_level": "", "assert_level": "",
        "print_style": PrintStyle.COMPACT, "ir_output_dir": "", "sensible_mode": False,
    }  # fmt: skip
    _INSTEAD: ClassVar[dict[str, str]] = {
        "nan_check": "jax.config.update('jax_debug_nans', True)",
        "device_sync_mode": "jax.block_until_ready on the outputs",
        "ir_output_dir": "jax.jit(f).lower(...).as_text() or XLA_FLAGS=--xla_dump_to=DIR",
        "pre_jit": "jax.jit(f).lower(...).as_text()",
    }

    def __getattr__(self, name: str) -> Any:
        if name in DebugConfig._OFF:
            return DebugConfig._OFF[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in DebugConfig._OFF:
            raise AttributeError(f"DebugConfig has no option {name!r}")
        if value != DebugConfig._OFF[name]:
            instead = DebugConfig._INSTEAD.get(name)
            raise NotImplementedError(
                f"InferenceSession.debug.{name} = {value!r}: MAX's runtime debug switches have no maxjax counterpart"
                + (f" (use {instead})" if instead else "")
            )

    def reset(self) -> None:
        """Sets every option back to off (they always are)."""


def _refuse_non_contiguous(x: Any) -> None:
    """MAX's refusal of a non-contiguous NumPy array, Buffer or torch tensor given to ``execute`` or
    in a ``weights_registry`` (``max.engine.api._raise_if_not_contiguous``, its message)."""
    if (
        (isinstance(x, np.ndarray) and not x.flags.c_contiguous)
        or (isinstance(x, Buffer) and not x.is_contiguous)
        or (type(x).__module__.startswith("torch") and callable(getattr(x, "is_contiguous", None)) and not x.is_contiguous())
    ):
        raise ValueError(
            "Max does not currently support executing non-contiguous tensors. Before passing these tensors "
            "to Max, please make a contiguous copy of them using `.contiguous()` before feeding them into "
            "the `execute` or `load` APIs."
        )


def _checked_registry(weights_registry: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``weights_registry`` (``{}`` for None) after MAX's check of every value, used or not
    (:func:`_refuse_non_contiguous`)."""
    registry = weights_registry or {}
    for value in registry.values():
        _refuse_non_contiguous(value)
    return registry


class CompiledModel:
    """A graph, or the graphs of a :class:`~maxjax.graph.Module`, ready for
    :meth:`InferenceSession.init` / :meth:`~InferenceSession.init_all` (MAX's ``CompiledModel``).

    XLA compiles a program for the input shapes it is first called with, so "compiled" here means
    checked and lowered to a :class:`~maxjax.engine.program.Program` per graph; the XLA compile
    happens on the first ``execute`` (and is cached on disk by
    :func:`~maxjax.engine.enable_compilation_cache`).
    """

    def __init__(self, compiled: Any, expected_weights: dict[str, Any] | None = None):
        # compiled: one Program, or {graph name: Program} for a Module (in build order)
        self._programs: dict[str, Any] = compiled if isinstance(compiled, dict) else {"": compiled}
        self._expected_weights = expected_weights

    def _single(self, instead: str = "init_all() to initialize") -> Any:
        """The one Program (ValueError when the artifact holds several, in MAX's words, naming the
        call to use ``instead``)."""
        if len(self._programs) != 1:
            raise ValueError(
                f"Expected exactly one model in the compiled artifact, but got {len(self._programs)}. "
                f"Use {instead} multi-model artifacts."
            )
        return next(iter(self._programs.values()))

    def __repr__(self) -> str:
        return "CompiledModel()"

    def export_mef(self, path: str | Path) -> None:
        """Raises NotImplementedError: there is no MEF format in maxjax."""
        raise NotImplementedError(_NO_MEF.format(what="CompiledModel.export_mef"))


class CompileOnlyModel:
    """MAX's stand-in for a model compiled under virtual devices: everything it is asked raises
    :class:`CompileOnlyExecutionError` (maxjax never returns one: it has no virtual devices)."""

    def __init__(self, name: str, compiled: CompiledModel) -> None:
        self.name = name
        self.compiled = compiled

    def __repr__(self) -> str:
        return f"CompileOnlyModel({self.name!r})"

    def _refuse(self, what: str) -> NoReturn:
        raise CompileOnlyExecutionError(
            f"{what} needs the device that graph {self.name!r} was compiled for, and it was compiled under a "
            "virtual device. Initialize the compiled artifact on a real device to execute it."
        )

    def execute(self, *args: object, **kwargs: object) -> NoReturn:
        self._refuse("execute")

    __call__ = execute

    def __getattr__(self, name: str) -> NoReturn:
        if hasattr(Model, name):
            self._refuse(name)
        raise AttributeError(name)


def _graph_keys(graph_keys: int | Sequence[int]) -> list[int]:
    """MAX's validation of capture keys (uint64 ints)."""
    keys = [graph_keys] if isinstance(graph_keys, int) and not isinstance(graph_keys, bool) else graph_keys
    if isinstance(keys, bool):
        raise TypeError("graph_keys must be an int or sequence of ints.")
    if isinstance(keys, (str, bytes)):
        raise TypeError("graph_keys must be a sequence of ints.")
    out = []
    for k in keys:
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError("graph_key must be an int.")
        if not 0 <= k <= 2**64 - 1:
            raise ValueError("graph_key must be in range [0, 2^64 - 1].")
        out.append(k)
    if not out:
        raise ValueError("graph_keys must not be empty.")
    return out


_NO_CAPTURE = (
    "Model.{what}: MAX's device-graph capture (CUDA graphs) has no counterpart; jax.jit already replays "
    "one compiled executable per input signature"
)


class Model:
    """A loaded graph: ``execute(*inputs) -> list[Buffer]`` (MAX's ``Model``)."""

    def __init__(self, program: Program, state: dict[str, Any], devices: list[Device]):
        graph = program.graph
        self._graph = graph
        self._program = program
        self._state = state
        self._devices = devices
        self._traces = 0

        def run(state: Mapping[str, Any], *args: Any) -> list[Any]:
            self._traces += 1  # once per trace (new input shapes), not per call
            return program.apply(state, *args)

        # buffer inputs are donated: their new values replace them in the caller's Buffers
        self._buffer_inputs = graph.buffer_input_indices
        self._run = jax.jit(run, donate_argnums=tuple(1 + i for i in self._buffer_inputs))
        first = program.devices[0] if program.devices else devices[0]
        first = first if isinstance(first, Device) else Device(first)
        self._input_metadata = [_spec(t.shape, t.dtype, f"input{i}") for i, t in enumerate(graph._input_types)]
        self._output_metadata = [_spec(t.shape, t.dtype, f"output{i}") for i, t in enumerate(graph.output_types)]
        self._input_devices = [_type_device(t, first) for t in graph._input_types]
        self._output_devices = [_type_device(t, first) for t in graph.output_types]

    @property
    def devices(self) -> list[Device]:
        """The session's devices."""
        return list(self._devices)

    @property
    def input_metadata(self) -> list[TensorSpec]:
        """Name (``input0``, ...), shape (None for a symbolic dim) and dtype of each input."""
        return list(self._input_metadata)

    @property
    def output_metadata(self) -> list[TensorSpec]:
        """Name (``output0``, ...), shape and dtype of each output."""
        return list(self._output_metadata)

    @property
    def input_devices(self) -> list[Device]:
        """The device of each input (its ``TensorType``'s device)."""
        return list(self._input_devices)

    @property
    def output_devices(self) -> list[Device]:
        """The device of each output."""
        return list(self._output_devices)

    @property
    def name(self) -> str:
        """The graph's name."""
        return self._graph.name

    @property
    def signature(self) -> inspect.Signature:
        """The inputs as positional-or-keyword parameters named ``input0``, ``input1``, ..."""
        P = inspect.Parameter
        return inspect.Signature([P(s.name, P.POSITIONAL_OR_KEYWORD) for s in self.input_metadata])

    @property
    def num_compiles(self) -> int:
        """How many times the graph was traced and compiled (once per distinct input signature)."""
        return self._traces

    @property
    def kernel_summaries(self) -> list[str]:
        """Raises NotImplementedError: XLA's fusions are not Mojo kernels (read them in
        ``jax.jit(...).lower(...).compile().as_text()``)."""
        raise NotImplementedError(
            "Model.kernel_summaries: XLA fuses its own kernels; read them with jax.jit(...).lower(...).compile().as_text()"
        )

    def execute(self, *args: Any) -> list[Buffer]:
        """Runs the model on ``args`` (Buffers, NumPy or JAX arrays, DLPack arrays, Python/NumPy scalars).

        A scalar becomes a rank-0 value of the input's dtype (``Buffer.scalar``: a float for an
        integer input raises TypeError, as MAX's cast does). A buffer input
        (:class:`~maxjax.graph.BufferType`) given as a :class:`Buffer` holds the graph's new value
        for it afterwards (its array is donated to the computation and the Buffer rebound).

        Raises:
            ValueError: a non-contiguous array or Buffer (MAX's message); wrong number of inputs, or
                an input of the wrong rank, dtype or static size, or a symbolic dim bound to two
                sizes, or an int64/float64 value outside the 32 bits JAX holds (the message names
                the input position).
        """
        self._graph.check_values(args)
        arrays = []
        for i, a in enumerate(args):
            _refuse_non_contiguous(a)
            if isinstance(a, _SCALARS) and i < len(self._input_metadata):
                a = Buffer.scalar(a, self._input_metadata[i].dtype).to_numpy()  # TypeError: a float for an int
            arrays.append(to_jax_array(a))
        self._graph.bind_dims([a.shape for a in arrays], [a.dtype for a in arrays])
        outs = self._run(self._state, *arrays)
        declared = len(outs) - len(self._buffer_inputs)
        for i, new in zip(self._buffer_inputs, outs[declared:]):
            if isinstance(args[i], Buffer):  # MAX's in-place update of the caller's buffer
                args[i]._array = new
        return [Buffer(o) for o in outs[:declared]]

    def __call__(self, *args: Any, **kwargs: Any) -> list[Buffer]:
        """``execute`` with inputs also by name (``input0=...``).

        Raises:
            TypeError: an unknown name, a name given twice, or a missing input (``Signature.bind``'s).
        """
        bound = self.signature.bind(*args, **kwargs)
        return self.execute(*bound.arguments.values())

    def reload(self, weights_registry: Mapping[str, Any]) -> None:
        """Replaces the weights (checked and placed as in :meth:`InferenceSession.load`)."""
        self._state = self._program.prepare(weights_registry)

    def release_weights(self) -> None:
        """Nothing to release: the model keeps only its device copies of the weights, never the
        registry's host arrays."""

    def capture(self, graph_keys: int | Sequence[int], *inputs: Buffer) -> list[Buffer]:
        """Raises NotImplementedError (no device-graph capture; see ``jax.jit``)."""
        raise NotImplementedError(_NO_CAPTURE.format(what="capture"))

    def replay(self, graph_keys: int | Sequence[int], *inputs: Buffer) -> None:
        """Raises NotImplementedError (no device-graph capture)."""
        raise NotImplementedError(_NO_CAPTURE.format(what="replay"))

    def debug_verify_replay(self, graph_keys: int | Sequence[int], *inputs: Buffer) -> None:
        """Raises NotImplementedError (no device-graph capture)."""
        raise NotImplementedError(_NO_CAPTURE.format(what="debug_verify_replay"))

    def release_captured_graph(self, graph_keys: int | Sequence[int]) -> None:
        """Nothing is ever captured, and releasing a key never captured is a no-op in MAX.

        Raises:
            TypeError, ValueError: keys that are not uint64 ints (MAX's checks).
        """
        _graph_keys(graph_keys)

    def __repr__(self) -> str:
        return f"Model(inputs={self.input_metadata})"


def _disabled(mode: str) -> bool:
    return mode.lower() in ("false", "off", "no", "0")


class InferenceSession:
    """Compiles and loads graphs (MAX's ``InferenceSession``).

    Args:
        devices: the devices models run on (``maxjax.driver.Device``s); the host CPU is appended
            when absent, as in MAX. The first one's platform picks the backend policy.

    Raises:
        ValueError: ``num_threads`` is given (XLA sizes its own thread pool per process: set
            ``XLA_FLAGS`` before JAX starts instead).
        NotImplementedError: ``custom_extensions``, ``precompiled_mefs`` or ``export_mefs``
            (Mojo kernels and MAX's compiled artifacts do not exist on JAX; see
            :func:`enable_compilation_cache` for compiled programs on disk).
    """

    debug: ClassVar[DebugConfig] = DebugConfig()
    default_mef_store: ClassVar[MefStore | None] = None

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
        self.num_threads = num_threads
        final: list[Device] = []
        for d in devices:
            if d not in final:
                final.append(d)
        if CPU() not in final:
            final.append(CPU())
        self._devices = final

    @property
    def devices(self) -> list[Device]:
        """The session's devices, the host CPU included."""
        return list(self._devices)

    def __repr__(self) -> str:
        return "<maxjax engine InferenceSession>"

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
            TypeError: ``model`` is not a Graph or Module (maxjax has no serialized-model format).
            ValueError: a Module (or a graph of one) holding several graphs: use :meth:`load_all`.
            NotImplementedError: ``custom_extensions`` or ``tile_based_fusion=True`` (MAX compiler
                features with no JAX counterpart).
        """
        compiled = self._compile(model, "InferenceSession.load", custom_extensions, tile_based_fusion, scan, remat)
        compiled._single("load_all() to load")
        return self.init(compiled, weights_registry=weights_registry)

    def load_all(
        self,
        model: Graph | Module,
        *,
        custom_extensions: Any = None,
        weights_registry: Mapping[str, Any] | None = None,
        tile_based_fusion: bool = False,
    ) -> dict[str, Model]:
        """``{graph name: Model}`` for a Graph (one entry) or each graph of a
        :class:`~maxjax.graph.Module` (a graph built into a Module loads its whole module)."""
        compiled = self._compile(model, "InferenceSession.load_all", custom_extensions, tile_based_fusion)
        return self.init_all(compiled, weights_registry=weights_registry)

    def _compile(
        self, model: Any, where: str, custom_extensions: Any, tile_based_fusion: bool, scan: bool = True,
        remat: bool = False,
    ) -> CompiledModel:  # fmt: skip
        if isinstance(model, Graph) and model._module is not None:
            model = model._module  # MAX compiles the module a graph was built into, whole
        if not isinstance(model, (Graph, Module)):
            raise TypeError(f"{where} expects a maxjax Graph or Module, got {type(model).__name__}")
        _refuse_max_artifacts(where, custom_extensions=custom_extensions, tile_based_fusion=tile_based_fusion)
        if isinstance(model, Module):
            programs = {g.name: Program(g, scan=scan, remat=remat, devices=self._devices) for g in model._graphs.values()}
            return CompiledModel(programs)
        program = Program(model, scan=scan, remat=remat, devices=self._devices)
        return CompiledModel(program, {k: e.weight.device for k, e in model._weights.items()})

    def compile(self, model: Graph | Module, *, custom_extensions: Any = None, tile_based_fusion: bool = False) -> CompiledModel:
        """Checks and lowers ``model`` to a :class:`CompiledModel` (the XLA compile happens on the
        first execute, per input signature).

        Raises:
            TypeError: ``model`` is not a Graph. ValueError: it has no output.
            NotImplementedError: ``custom_extensions`` or ``tile_based_fusion=True``.
        """
        return self._compile(model, "InferenceSession.compile", custom_extensions, tile_based_fusion)

    def compile_async(
        self, model: Graph, *, custom_extensions: Any = None, tile_based_fusion: bool = False
    ) -> CompiledModel:
        """As :meth:`compile` (nothing slow happens before the first execute, so nothing to wait for)."""
        return self._compile(model, "InferenceSession.compile_async", custom_extensions, tile_based_fusion)

    def compile_reusing_mefs(
        self, model: Graph, *, custom_extensions: Any = None, tile_based_fusion: bool = False
    ) -> CompiledModel:
        """As :meth:`compile` (a maxjax session has no MEF store, and MAX compiles when there is none)."""
        return self._compile(model, "InferenceSession.compile_reusing_mefs", custom_extensions, tile_based_fusion)

    def init(self, compiled: CompiledModel | Graph, *, weights_registry: Mapping[str, Any] | None = None) -> Model:
        """Checks ``weights_registry`` against the compiled graph's weights, places them once and
        returns the :class:`Model` (a Graph is compiled first).

        Raises:
            ValueError: as :meth:`load`; a non-contiguous array in ``weights_registry`` (MAX's message).
        """
        if isinstance(compiled, Graph):
            compiled = self.compile(compiled)
        if not isinstance(compiled, CompiledModel):
            raise TypeError(f"InferenceSession.init expects a CompiledModel, got {type(compiled).__name__}")
        program = compiled._single()
        return Model(program, program.prepare(_checked_registry(weights_registry)), self._devices)

    def init_all(
        self, compiled: CompiledModel, *, weights_registry: Mapping[str, Any] | None = None
    ) -> dict[str, Model]:
        """``{graph name: Model}``, one per graph of the compiled artifact (of a Module: each of its
        graphs, each given the weights it names from ``weights_registry``).

        Raises:
            TypeError: ``compiled`` is not a CompiledModel. ValueError: as :meth:`load`.
        """
        if not isinstance(compiled, CompiledModel):
            raise TypeError(f"InferenceSession.init_all expects a CompiledModel, got {type(compiled).__name__}")
        registry = _checked_registry(weights_registry)
        models = {}
        for program in compiled._programs.values():
            model = Model(program, program.prepare(registry), self._devices)
            models[model.name] = model
        return models

    # -- MAX's runtime options -----------------------------------------------------------------
    def set_debug_print_options(
        self, style: str | PrintStyle = PrintStyle.COMPACT, precision: int = 6, output_directory: str | Path | None = None
    ) -> None:
        """Validates the options as MAX does; maxjax prints with ``jax.debug.print`` (``COMPACT``).

        Raises:
            TypeError: an unknown ``style`` (MAX's message).
            ValueError: ``BINARY`` styles without ``output_directory`` (MAX's message).
            NotImplementedError: any style but ``COMPACT`` (with ``precision=6``).
        """
        if isinstance(style, str):
            style = getattr(PrintStyle, style, style)
        if not isinstance(style, PrintStyle):
            raise TypeError(
                "Invalid debug print style. Please use one of 'COMPACT', 'FULL', 'BINARY', 'BINARY_MAX_CHECKPOINT', "
                "or 'NONE'."
            )
        if style in (PrintStyle.BINARY, PrintStyle.BINARY_MAX_CHECKPOINT) and not output_directory:
            raise ValueError("Debug print output directory cannot be empty.")
        if style is not PrintStyle.COMPACT or precision != 6:
            raise NotImplementedError(
                f"set_debug_print_options(style={style.name}, precision={precision}): maxjax prints graph values "
                "with jax.debug.print (COMPACT, default precision) only"
            )

    def set_split_k_reduction_precision(self, precision: str | SplitKReductionPrecision) -> None:
        """Raises NotImplementedError after MAX's validation: XLA picks its own split-K scheme.

        Raises:
            TypeError: an unknown precision name (MAX's message).
        """
        if not isinstance(precision, SplitKReductionPrecision):
            try:
                precision = SplitKReductionPrecision[precision]
            except Exception:
                raise TypeError(
                    f"Invalid precision ({precision}). Please use one of: {[x.name for x in SplitKReductionPrecision]}"
                ) from None
        raise NotImplementedError(
            f"set_split_k_reduction_precision({precision.name}): XLA picks its own split-K reduction; a matmul "
            "accumulates in its preferred_element_type"
        )

    def set_mojo_log_level(self, level: str | LogLevel) -> None:
        """``NOTSET`` is accepted (no Mojo runs, so nothing logs); other levels raise NotImplementedError.

        Raises:
            TypeError: an unknown level name (MAX's message).
        """
        if not isinstance(level, LogLevel):
            try:
                level = LogLevel[level]
            except Exception:
                raise TypeError(f"Invalid log level ({level}). Please use one of: {[x.name for x in LogLevel]}") from None
        if level is not LogLevel.NOTSET:
            raise NotImplementedError(f"set_mojo_log_level({level.name}): maxjax runs no Mojo kernels to log from")

    def set_mojo_assert_level(self, level: AssertLevel) -> None:
        """``AssertLevel.NONE`` is accepted; other levels raise NotImplementedError (no Mojo asserts;
        see ``jax.experimental.checkify``)."""
        if AssertLevel(level) is not AssertLevel.NONE:
            raise NotImplementedError(
                f"set_mojo_assert_level({AssertLevel(level).name}): maxjax runs no Mojo kernels; "
                "check values with jax.experimental.checkify"
            )

    def gpu_profiling(self, mode: GPUProfilingMode) -> None:
        """``"off"`` is accepted (MAX's default); other modes raise NotImplementedError (profile with
        ``jax.profiler``, whose traces Nsight and TensorBoard read)."""
        if mode != "off":
            raise NotImplementedError(
                f"gpu_profiling({mode!r}): MAX's NVTX instrumentation has no counterpart; use jax.profiler.trace"
            )

    def use_fi_topk_kernel(self, mode: str) -> None:
        """A disabling ``mode`` ("false", "off", "no", "0") is accepted; enabling raises NotImplementedError."""
        if not _disabled(mode):
            raise NotImplementedError(f"use_fi_topk_kernel({mode!r}): MAX's fused top-k kernel is a Mojo kernel")

    def enable_per_tensor_fp8_quantize(self, mode: str) -> None:
        """A disabling ``mode`` is accepted; enabling raises NotImplementedError."""
        if not _disabled(mode):
            raise NotImplementedError(
                f"enable_per_tensor_fp8_quantize({mode!r}): MAX's per-tensor FP8 quantize is a Mojo kernel switch"
            )

    def _set_mojo_define(self, key: str, value: bool | int | str) -> None:
        raise NotImplementedError(f"_set_mojo_define({key!r}, {value!r}): maxjax compiles no Mojo")


def _refuse_max_artifacts(where: str, **kwargs: Any) -> None:
    for name, value in kwargs.items():
        if value:
            raise NotImplementedError(
                f"{where}({name}=...): MAX's Mojo kernels and compiled artifacts have no counterpart on JAX "
                "(custom kernels: register a JAX implementation with maxjax.graph.register_kernel(name); "
                "maxjax.engine.enable_compilation_cache() keeps compiled programs on disk)"
            )
