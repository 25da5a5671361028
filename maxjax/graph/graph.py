"""``Graph``: MAX's graph, recorded as a small DAG of op nodes and evaluated by one JAX function.

Each node holds one jnp function and its arguments. Shapes and dtypes of every node come from
``jax.eval_shape`` on symbolic shapes when the node is recorded. Running a graph is evaluating the
nodes in order inside ``jax.jit`` (see :mod:`maxjax.engine`); nothing is hand-lowered.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import enum
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from maxjax.dtype import DType
from maxjax.graph.buffer import BufferValue
from maxjax.graph.type import BufferType, DeviceRef, Dim, Shape, StaticDim, SymbolicDim, TensorType
from maxjax.graph.value import TensorValue

__all__ = [
    "Graph", "KernelLibrary", "Module", "Node", "as_tensor_type", "current_graph", "layer_scope", "register_kernel",
    "default_custom_extensions", "default_custom_extensions_scope",
]


# Names of the layers whose ``__call__`` is running, recorded on graph nodes (see layer_scope).
_LAYER_SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("maxjax_layer_scope", default="")


@contextlib.contextmanager
def layer_scope(name: str) -> Iterator[None]:
    """Nodes recorded in the block remember the layer path (``"Transformer/Linear"``): the compiled
    program names its ops after it (``jax.named_scope``). ``maxjax.nn`` enters one per layer call."""
    outer = _LAYER_SCOPE.get()
    token = _LAYER_SCOPE.set(f"{outer}/{name}" if outer else name)
    try:
        yield
    finally:
        _LAYER_SCOPE.reset(token)


class Node:
    """One recorded operation. ``kind`` is ``input``, ``weight``, ``const``, ``op`` or ``call``."""

    __slots__ = (
        "id", "kind", "op", "fn", "args", "static", "out_avals", "treedef", "device", "extra", "scope", "qsource",
        "dtypes",
    )  # fmt: skip

    def __init__(
        self,
        kind: str,
        op: str,
        out_avals: Sequence[Any],
        *,
        fn: Callable[..., Any] | None = None,
        args: tuple[Any, ...] = (),
        static: dict[str, Any] | None = None,
        treedef: Any = None,
        device: DeviceRef | None = None,
        extra: Any = None,
        dtypes: Sequence[DType] | None = None,
    ):
        self.id = -1
        self.kind = kind
        self.op = op
        self.fn = fn
        self.args = args
        self.static = static or {}
        self.out_avals = list(out_avals)
        self.treedef = treedef
        self.device = device or DeviceRef.CPU()
        self.extra = extra
        #: the layers being called when the node was recorded (e.g. "Transformer/Linear"); the
        #: graph's compiled program names its ops with it (``jax.named_scope``)
        self.scope = _LAYER_SCOPE.get()
        #: for an op whose output is a quantized tensor (rows taken from a quantized weight): the
        #: key of that weight, so an op that needs its raw bytes can pin it to the packed layout
        self.qsource: str | None = None
        #: MAX's declared dtype of each output (``int64`` where JAX holds ``int32`` without x64;
        #: see ``maxjax.graph.value.TensorValue.dtype``); None: the avals' own dtypes
        self.dtypes: list[DType] | None = None if dtypes is None else list(dtypes)

    def label(self, index: int = 0) -> str:
        if self.kind == "input":
            return f"input{self.extra}"
        if self.kind == "weight":
            return self.extra.key
        suffix = f"#{index}" if len(self.out_avals) > 1 else ""
        return f"%{self.id}{suffix}"


@dataclass
class _GraphWeight:
    """A weight a graph needs from the registry, under ``key``.

    ``placeholder`` marks a subgraph weight whose registry name is the call's prefix + ``key``.
    ``node`` is None for a weight needed only by a subgraph called from this graph.
    """

    key: str
    weight: Any
    placeholder: bool = False
    node: Node | None = None

    @property
    def dtype(self) -> DType:
        return self.weight.dtype

    @property
    def shape(self) -> Shape:
        return self.weight.shape


class _GraphStack(threading.local):
    def __init__(self) -> None:
        self.stack: list[Graph] = []


_STACK = _GraphStack()


class _CurrentGraph:
    """``Graph.current``: a class-level property raising LookupError when no graph is active."""

    def __get__(self, obj: Any, owner: Any) -> "Graph":
        if not _STACK.stack:
            raise LookupError("No graph found: use `with Graph(...) as g:` or Graph(name, forward=...)")
        return _STACK.stack[-1]


def current_graph() -> "Graph | None":
    """The innermost active graph, or None."""
    return _STACK.stack[-1] if _STACK.stack else None


@contextlib.contextmanager
def no_active_graph() -> Iterator[None]:
    """Within it, this thread has no active graph: ops run eagerly on arrays even inside a
    ``with Graph(...)`` block (how eager data such as an experimental ``Tensor`` computes while a
    graph is being built). Other threads' graphs are untouched; the stack comes back on exit."""
    saved, _STACK.stack = _STACK.stack, []
    try:
        yield
    finally:
        _STACK.stack = saved


def as_tensor_type(t: Any) -> TensorType:
    """A :class:`TensorType` from itself, a TensorValue (its type) or anything with ``shape`` and
    ``dtype`` (a ``jax.ShapeDtypeStruct``, an array).

    Raises:
        TypeError: anything else.
    """
    if isinstance(t, TensorType):
        return t
    if isinstance(t, TensorValue):
        return t.type
    if hasattr(t, "shape") and hasattr(t, "dtype"):  # jax.ShapeDtypeStruct, arrays
        return TensorType(DType.of(t.dtype), [int(d) if not isinstance(d, str) else d for d in t.shape])
    raise TypeError(f"Graph input types must be TensorType (or values with a .type), got {t!r}")


_GLOBAL_KERNELS: dict[str, Callable[..., Any]] = {}


def _add_kernel(table: dict[str, Callable[..., Any]], where: str, name: str, fn: Any) -> Callable[..., Any]:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: a kernel name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"{where}({name!r}): the kernel must be a callable (jnp arrays -> arrays), got {fn!r}")
    if name in table and table[name] is not fn:
        raise ValueError(f"{where}: a kernel named {name!r} is already registered ({table[name]!r})")
    table[name] = fn
    return fn


def register_kernel(name: str, fn: Callable[..., Any] | None = None) -> Any:
    """Registers ``fn`` as the JAX implementation of the custom kernel ``name``, for every graph
    (maxjax's counterpart of Mojo's ``@compiler.register(name)``; not a MAX name).

    Use it as a decorator (``@register_kernel("my_op")``) or call it (``register_kernel("my_op",
    fn)``). ``ops.custom(name, ...)`` / ``ops.inplace_custom(name, ...)`` then call
    ``fn(*arrays, **parameters)`` on the op's values (JAX arrays or tracers, buffers as their
    current value) with the op's ``parameters`` as keyword arguments (bool, int, float, str or
    :class:`~maxjax.dtype.DType`). ``fn`` returns one array or a tuple/list of arrays:

    - for ``ops.custom``: one output per ``out_types`` entry;
    - for ``ops.inplace_custom``: first the new value of each buffer among the values (in order),
      then one output per ``out_types`` entry.

    ``fn`` must be traceable by JAX (jnp/lax calls): graph mode infers its outputs with
    ``jax.eval_shape``. A kernel registered on one :class:`KernelLibrary` (:meth:`KernelLibrary.register`)
    is seen only by graphs built with that library.

    Returns:
        ``fn`` (or, without ``fn``, a decorator registering the function it decorates).

    Raises:
        ValueError: ``name`` is empty or not a str, or another function is already registered
            under ``name``.
        TypeError: ``fn`` is not callable.
    """
    if fn is None:
        return lambda f: _add_kernel(_GLOBAL_KERNELS, "register_kernel", name, f)
    return _add_kernel(_GLOBAL_KERNELS, "register_kernel", name, fn)


class DevicePlacementPolicy(enum.Enum):
    """What a graph does when an op would move a tensor to the CPU implicitly (MAX 26.7's
    ``max.graph.DevicePlacementPolicy``; ``Graph(..., strict_device_placement=...)``).

    In MAX some ops have only CPU kernels, and ``Ignore`` moves their operands silently, ``Warn``
    (the default) warns, ``Error`` raises ``ValueError`` at build time. Every maxjax op runs on the
    device its operands are on (XLA compiles each op for every backend), so no op moves a tensor
    and every policy is met.
    """

    Ignore = "ignore"
    Warn = "warn"
    Error = "error"


class KernelLibrary:
    """The custom kernels a graph's ``ops.custom`` / ``ops.inplace_custom`` can call
    (``max.graph.KernelLibrary``).

    MAX's library holds Mojo kernels loaded from packages (``.mojopkg``/``.mojoc`` or a Mojo source
    directory, through ``custom_extensions=``) plus MAX's own built-in kernels. maxjax runs JAX, not
    Mojo: a library holds **JAX implementations registered by name** — the process-wide ones of
    :func:`register_kernel` and this library's own (:meth:`register`). MAX's built-in kernel names
    are not present (maxjax's ops are jnp functions called directly).

    ``Graph(kernel_library=lib)`` builds a graph with ``lib``; without one a graph gets a new
    library (the registered kernels only), and a subgraph shares its parent's.

    Raises:
        NotImplementedError: a path given to the constructor, :meth:`add_path` or
            :meth:`load_paths` (naming it): Mojo kernels cannot be loaded; and
            :meth:`verify_custom_op` (maxjax records no MLIR ops: ``ops.custom`` checks its kernel
            itself).
    """

    def __init__(self, paths: Iterable[Any] = ()) -> None:
        self._kernels: dict[str, Callable[..., Any]] = {}
        for path in paths:
            self.add_path(path)

    def register(self, name: str, fn: Callable[..., Any] | None = None) -> Any:
        """Registers ``fn`` as kernel ``name`` in this library only (a decorator without ``fn``);
        the contract is :func:`register_kernel`'s. A kernel of this library is found before a
        process-wide one of the same name.

        Raises:
            ValueError: ``name`` is empty or already registered in this library to another function.
            TypeError: ``fn`` is not callable.
        """
        if fn is None:
            return lambda f: _add_kernel(self._kernels, "KernelLibrary.register", name, f)
        return _add_kernel(self._kernels, "KernelLibrary.register", name, fn)

    def library_paths(self) -> list[Any]:
        """The Mojo kernel library paths: always empty (maxjax loads none)."""
        return []

    def add_path(self, path: Any) -> None:
        raise NotImplementedError(
            f"KernelLibrary: cannot load the Mojo kernel library {str(path)!r}: maxjax runs JAX, not Mojo kernels "
            "(register a JAX implementation with maxjax.graph.register_kernel(name))"
        )

    def load_paths(self, custom_extensions: Iterable[Any]) -> None:
        for path in custom_extensions:
            self.add_path(path)

    def verify_custom_op(self, custom_op: Any) -> None:
        raise NotImplementedError(
            "KernelLibrary.verify_custom_op: maxjax has no MLIR custom ops (ops.custom checks its kernel when called)"
        )

    def has_shape_function(self, kernel: str) -> bool:
        """Always True for a kernel present: a JAX kernel's output shapes are inferred by tracing it.

        Raises:
            KeyError: no kernel named ``kernel`` in the library.
        """
        if kernel not in self:
            raise KeyError(f"no kernel named {kernel!r} in the kernel library")
        return True

    def __getitem__(self, kernel: str) -> Callable[..., Any]:
        """The JAX function registered as ``kernel`` (this library's, else the process-wide one).

        Raises:
            KeyError: none is registered.
        """
        fn = self._kernels.get(kernel)
        if fn is None:
            fn = _GLOBAL_KERNELS.get(kernel)
        if fn is None:
            raise KeyError(kernel)
        return fn

    def __contains__(self, kernel: object) -> bool:
        return kernel in self._kernels or kernel in _GLOBAL_KERNELS

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(self._kernels) | set(_GLOBAL_KERNELS)))


def default_custom_extensions() -> tuple[Any, ...]:
    """MAX's process-wide Mojo kernel packages added to every graph (``max.graph``): always empty
    in maxjax, which loads no Mojo kernels (see :func:`register_kernel` for process-wide JAX kernels)."""
    return ()


@contextlib.contextmanager
def default_custom_extensions_scope(*paths: Any) -> Iterator[None]:
    """MAX's block adding Mojo kernel packages to :func:`default_custom_extensions`.

    Raises:
        NotImplementedError: any path (naming them): maxjax cannot load Mojo kernels.
    """
    if paths:
        raise NotImplementedError(
            f"default_custom_extensions_scope({', '.join(repr(str(p)) for p in paths)}): maxjax cannot load Mojo "
            "kernels; register a JAX implementation with maxjax.graph.register_kernel(name)"
        )
    yield


class Module:
    """A container for one or more :class:`Graph` instances compiled together (MAX's
    ``max.graph.Module``; in MAX an MLIR module, here an ordered set of graphs by name).

    ``Graph(name, ..., module=m)`` adds the graph to ``m``; ``InferenceSession.compile(m)`` /
    ``load_all(m)`` then give one model per graph (``{graph.name: Model}``), and ``load`` /
    ``compile`` of any one of its graphs compile the whole module, as MAX does (``load`` and
    ``init`` refuse an artifact of several graphs: use ``load_all`` / ``init_all``).

    Args:
        mlir_module: MAX wraps an existing MLIR module; maxjax has none, so only None is accepted.

    Raises:
        NotImplementedError: ``mlir_module`` is given.
    """

    def __init__(self, mlir_module: Any = None) -> None:
        if mlir_module is not None:
            raise NotImplementedError("Module(mlir_module=...): maxjax graphs are built in Python, not from MLIR modules")
        self._graphs: dict[str, Graph] = {}

    def top_level_graph_names(self) -> list[str]:
        """The names of the graphs in this module, in the order they were built."""
        return list(self._graphs)

    def _add(self, graph: "Graph") -> None:
        if graph.name in self._graphs:
            raise ValueError(
                f"Graph {graph.name!r} is already in this Module (graphs of one module need distinct names; "
                f"it has {self.top_level_graph_names()})"
            )
        self._graphs[graph.name] = graph

    def _remove(self, graph: "Graph") -> None:
        """Takes ``graph`` out again (its forward failed: a graph that was not built stays out)."""
        if self._graphs.get(graph.name) is graph:
            del self._graphs[graph.name]

    def __repr__(self) -> str:
        return f"Module(graphs={self.top_level_graph_names()})"


class Graph:
    """A computation graph (MAX's ``max.graph.Graph``).

    Two ways to build one, as in MAX::

        with Graph("mlp", input_types=[TensorType(DType.float32, ["batch", 5], DeviceRef.CPU())]) as g:
            g.output(model(g.inputs[0]))

        g = Graph("mlp", forward=model, input_types=[...])

    Args:
        name: the graph's name.
        forward: if given, called at once as ``forward(*graph.inputs, *args, **kwargs)``; its
            return value is the output.
        input_types: one :class:`TensorType` per input (symbolic dims allowed).
        strict_device_placement: a :class:`DevicePlacementPolicy`, MAX's policy for ops that move a
            tensor to the CPU implicitly; maxjax has no such ops, so every policy is met (a value
            of another type raises ``TypeError``).
        is_device_graph: MAX marks graphs that run on a device only; accepted and recorded.

    ``Graph.current`` is the innermost graph being built (``LookupError`` when there is none).

    Raises:
        NotImplementedError: ``path`` (MLIR files) or ``custom_extensions`` (Mojo kernel packages):
            Mojo kernels and MLIR files cannot run on JAX. ``module`` is a :class:`Module` the graph
            joins (TypeError otherwise; ValueError when it has a graph of that name). ``kernel_library`` is a
            :class:`KernelLibrary` of JAX kernels for ``ops.custom`` (a new one when None; a
            subgraph shares its parent's).
    """

    current = _CurrentGraph()

    def __init__(
        self,
        name: str,
        forward: Callable[..., Any] | None = None,
        input_types: Iterable[Any] = (),
        path: Any = None,
        *args: Any,
        custom_extensions: Iterable[Any] = (),
        kernel_library: Any = None,
        module: Any = None,
        strict_device_placement: DevicePlacementPolicy = DevicePlacementPolicy.Warn,
        is_device_graph: bool = False,
        _parent: "Graph | None" = None,
        _weight_prefix: str | None = None,
        **kwargs: Any,
    ):
        if path is not None:
            raise NotImplementedError("Graph(path=...) loads MLIR in MAX; maxjax graphs are built in Python")
        if kernel_library is not None and not isinstance(kernel_library, KernelLibrary):
            raise TypeError(f"Graph(kernel_library=...) takes a KernelLibrary, got {type(kernel_library).__name__}")
        extensions = list(custom_extensions or ())
        if extensions:
            raise NotImplementedError(
                f"Graph(custom_extensions=...): maxjax cannot load Mojo kernels ({[str(p) for p in extensions]}); "
                "register a JAX implementation of each kernel with maxjax.graph.register_kernel(name) and call it "
                "with ops.custom"
            )
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"Graph(module=...) takes a maxjax.graph.Module, got {type(module).__name__}")
        if not isinstance(strict_device_placement, DevicePlacementPolicy):
            raise TypeError(
                f"Graph(strict_device_placement=...) takes a DevicePlacementPolicy "
                f"({', '.join(p.name for p in DevicePlacementPolicy)}), got {strict_device_placement!r}"
            )
        self.strict_device_placement = strict_device_placement
        #: the kernels ``ops.custom`` / ``ops.inplace_custom`` call (see :class:`KernelLibrary`)
        if kernel_library is None:
            kernel_library = _parent._kernel_library if _parent is not None else KernelLibrary()
        self._kernel_library: KernelLibrary = kernel_library
        self.name = name
        self.is_device_graph = bool(is_device_graph)
        self._input_types = [as_tensor_type(t) for t in input_types]
        self._nodes: list[Node] = []
        self._weights: dict[str, _GraphWeight] = {}
        self._weight_objects: dict[int, TensorValue] = {}
        self._outputs: list[TensorValue] | None = None
        self._parent: Graph | None = _parent
        self._weight_prefix: str | None = _weight_prefix
        self._subgraphs: dict[str, Graph] = {}
        #: keys of quantized weights an op reads as raw GGUF bytes (they stay in the packed layout)
        self._packed_only: set[str] = set()
        #: how ops use each weight (by key): ``"stored_rhs"`` (``Linear``'s product), ``"other"``
        self._weight_uses: dict[str, set[str]] = {}
        self._weights_view: Any = None
        self._jitted: Any = None
        self._trace_count = 0
        #: set by ``Module.build_subgraph``: ``(prefix, args) -> outputs | None``, how eager
        #: ``ops.call`` runs the layer the subgraph was built from (see ``maxjax.nn.layer``)
        self._eager_runner: Callable[..., Any] | None = None
        self._call_shapes: dict[Any, Any] = {}  # ops.call: argument signature -> output avals
        inputs: list[Any] = []
        #: the graph's buffer inputs (:class:`~maxjax.graph.buffer.BufferValue`), whose final
        #: versions are hidden outputs after the declared ones
        self._buffers: list[Any] = []
        for i, t in enumerate(self._input_types):
            value = TensorValue._from_node(
                self, self._add_node(Node("input", "input", [t.to_shape_dtype_struct()], device=t.device, extra=i, dtypes=[t.dtype]))
            )
            if isinstance(t, BufferType):
                if _parent is not None:
                    raise NotImplementedError(
                        f"subgraph {name!r}: buffer inputs of subgraphs are not supported by maxjax (pass the tensor and "
                        "return its new value)"
                    )
                value = BufferValue._input(self, value, i, t)
                self._buffers.append(value)
            inputs.append(value)
        self.inputs = tuple(inputs)
        self._n_hidden = 0
        if forward is None and (args or kwargs):
            raise TypeError(f"Graph {name!r}: extra arguments {args or ''}{kwargs or ''} are passed to forward, but there is none")
        self._module: Module | None = module  # the Module this graph joined (None: one of its own)
        if module is not None:
            module._add(self)
        if forward is not None:
            try:
                with self:
                    result = forward(*self.inputs, *args, **kwargs)
                if result is None:
                    self.output()
                elif isinstance(result, (list, tuple)):
                    self.output(*result)
                else:
                    self.output(result)
            except BaseException:
                if module is not None:
                    module._remove(self)
                raise

    # -- context -----------------------------------------------------------------------------
    def __enter__(self) -> "Graph":
        _STACK.stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        popped = _STACK.stack.pop()
        assert popped is self, "graph contexts exited out of order"

    # -- building ----------------------------------------------------------------------------
    def _add_node(self, node: Node) -> Node:
        if self._outputs is not None and node.kind != "input":
            raise ValueError(f"Graph {self.name!r} already has its output; no more ops can be added")
        node.id = len(self._nodes)
        self._nodes.append(node)
        return node

    @property
    def input_types(self) -> list[TensorType]:
        return list(self._input_types)

    def _weight_key(self, name: str) -> tuple[str, bool]:
        prefix = self._weight_prefix
        if prefix is not None and name.startswith(prefix):
            return name[len(prefix) :], True
        return name, False

    def add_weight(self, weight: Any, force_initial_weight_on_host: bool = True) -> TensorValue:
        """Adds ``weight`` as a graph input fed from the weights registry; returns its value.

        Adding the same Weight object again returns the same value. In a subgraph made by
        ``Module.build_subgraph``, a weight under the subgraph's ``weight_prefix`` becomes a
        placeholder keyed by its name without the prefix (the Weight itself is not renamed).

        Raises:
            ValueError: a different Weight with the same name is already in this graph.
        """
        from maxjax.graph.weight import Weight

        if not isinstance(weight, Weight):
            raise TypeError(f"add_weight expects a Weight, got {type(weight).__name__}")
        existing = self._weight_objects.get(id(weight))
        if existing is not None:
            return existing
        key, placeholder = self._weight_key(weight.name)
        entry = self._weights.get(key)
        if entry is not None and entry.node is not None:
            raise ValueError(
                f"Weight {weight.name!r} already exists in Graph {self.name!r}: two different Weight objects "
                f"have that name. Possible fixes:\n"
                f"  1. Call model.state_dict() or model.load_state_dict(...) before building the graph, so "
                f"every weight gets its full dotted name (e.g. 'layers.0.{weight.name}').\n"
                f"  2. Give the weights distinct names when you create them."
            )
        aval = weight._aval
        entry = _GraphWeight(key, weight, placeholder)
        node = self._add_node(Node("weight", "weight", [aval], device=weight.device, extra=entry, dtypes=[weight.dtype]))
        entry.node = node
        self._weights[key] = entry
        value = TensorValue._from_node(self, node)
        self._weight_objects[id(weight)] = value
        return value

    def _require_weight(self, name: str, weight: Any) -> None:
        """Records that a subgraph called from this graph needs registry entry ``name``."""
        key, placeholder = self._weight_key(name)
        if key not in self._weights:
            self._weights[key] = _GraphWeight(key, weight, placeholder)

    def add_subgraph(
        self,
        name: str,
        forward: Callable[..., Any] | None = None,
        input_types: Iterable[Any] = (),
        path: Any = None,
        custom_extensions: Iterable[Any] = (),
        devices: Iterable[DeviceRef] = (),
        is_device_graph: bool = False,
        *,
        _weight_prefix: str | None = None,
    ) -> "Graph":
        """A child graph, callable from this one with ``ops.call`` (use it as a context manager).

        ``devices`` (MAX's device chains) has no counterpart in JAX: values carry their devices.

        Raises:
            ValueError: a subgraph with this name already exists in this graph.
        """
        if name in self._subgraphs:
            raise ValueError(f"Subgraph {name!r} already exists in Graph {self.name!r}")
        sub = Graph(
            name, forward=forward, input_types=input_types, path=path, custom_extensions=custom_extensions,
            is_device_graph=is_device_graph, _parent=self, _weight_prefix=_weight_prefix,
        )  # fmt: skip
        self._subgraphs[name] = sub
        return sub

    def output(self, *outputs: Any) -> None:
        """Sets the graph's outputs (values of this graph, or constants)."""
        from maxjax.graph import ops

        if self._outputs is not None:
            raise ValueError(f"Graph {self.name!r} already has its output")
        vals = []
        with self:
            for i, o in enumerate(outputs):
                if isinstance(o, TensorValue) and o._graph is self and o.quantization_encoding is not None:
                    vals.append(ops.identity(o))  # an output is an array: a quantized weight's GGUF bytes, as in MAX
                elif isinstance(o, TensorValue) and o._graph is self:
                    vals.append(o)
                elif isinstance(o, TensorValue) and o._graph is not None:
                    raise ValueError(
                        f"output {i} of graph {self.name!r} belongs to graph {o._graph.name!r}"
                    )
                else:
                    vals.append(ops.shape.literal_constant(o) if not isinstance(o, TensorValue) else ops.identity(o))
            # the buffers' final versions, after the declared outputs (see maxjax.graph.buffer)
            for b in self._buffers:
                cur = b._current
                vals.append(cur if isinstance(cur, TensorValue) and cur._graph is self else ops.identity(cur))
        self._n_hidden = len(self._buffers)
        self._outputs = vals

    @property
    def output_types(self) -> list[TensorType]:
        if self._outputs is None:
            return []
        return [o.type for o in self._outputs[: len(self._outputs) - self._n_hidden]]

    @property
    def kernel_libraries_paths(self) -> list[Any]:
        """MAX's Mojo kernel library paths of the graph: always empty (see :class:`KernelLibrary`)."""
        return self._kernel_library.library_paths()

    @property
    def buffer_input_indices(self) -> list[int]:
        """Positions of the buffer inputs (their new values follow the declared outputs)."""
        return [b._input_index for b in self._buffers]

    def weights(self) -> Any:
        """A :class:`~maxjax.graph.weights.Weights` view for allocating this graph's weights by
        hierarchical name (seed ``max-graph-weights-Weights.txt``; MAX 26.7 lacks it)."""
        from maxjax.graph.weights.graph_weights import GraphWeights

        if self._weights_view is None:
            self._weights_view = GraphWeights(self)
        return self._weights_view

    @property
    def weight_names(self) -> list[str]:
        """The registry names this graph needs (placeholders of a subgraph are relative)."""
        return list(self._weights)

    def copy(self) -> "Graph":
        raise NotImplementedError("Graph.copy is not supported by maxjax")

    # -- running -----------------------------------------------------------------------------
    def bind_dims(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any] | None = None) -> dict[str, int]:
        """Sizes of the symbolic dims, from concrete input shapes.

        Raises:
            ValueError: wrong number of inputs, wrong rank or dtype, a static dim that does not
                match, or a symbolic dim bound to two different sizes.
        """
        types = self._input_types
        if len(shapes) != len(types):
            raise ValueError(f"Graph {self.name!r} expects {len(types)} inputs, got {len(shapes)}")
        env: dict[str, int] = {}
        where: dict[str, str] = {}
        for i, (t, shape) in enumerate(zip(types, shapes)):
            if dtypes is not None and DType.of(dtypes[i]).to_jax() != t.dtype.to_jax():
                raise ValueError(
                    f"Input at position {i} of graph {self.name!r}: expected dtype {t.dtype!r}, got "
                    f"{DType.of(dtypes[i])!r}"
                )
            if len(shape) != t.rank:
                raise ValueError(
                    f"Input at position {i} of graph {self.name!r}: expected rank {t.rank} "
                    f"(shape {t.shape}), got shape {tuple(shape)} of rank {len(shape)}"
                )
            for axis, (d, n) in enumerate(zip(t.shape, shape)):
                if isinstance(d, StaticDim):
                    if _differ(d.dim, n):
                        raise ValueError(
                            f"Input at position {i} of graph {self.name!r}: dim {axis} must be {d.dim}, "
                            f"got shape {tuple(shape)} (expected {t.shape})"
                        )
                elif isinstance(d, SymbolicDim):
                    seen = env.setdefault(d.name, n)
                    if _differ(seen, n):
                        raise ValueError(
                            f"Symbolic dim {d.name!r} is bound to two sizes: {seen} ({where[d.name]}) and "
                            f"{n} (input {i}, dim {axis}) in graph {self.name!r}"
                        )
                    where.setdefault(d.name, f"input {i}, dim {axis}")
        for i, (t, shape) in enumerate(zip(types, shapes)):  # algebraic dims, once symbols are known
            for axis, (d, n) in enumerate(zip(t.shape, shape)):
                if not isinstance(d, (StaticDim, SymbolicDim)) and _differ(d.evaluate(env), n):
                    raise ValueError(
                        f"Input at position {i} of graph {self.name!r}: dim {axis} must be {d} = "
                        f"{d.evaluate(env)}, got {n}"
                    )
        return env

    def check_values(self, values: Sequence[Any]) -> None:
        """Refuses input values that do not fit what JAX holds for the input's declared dtype.

        maxjax reports MAX's declared dtypes (an ``int64`` input is ``int64`` in ``input_types``,
        ``TensorValue.dtype`` and a Model's metadata) while JAX, without x64, holds ``int64`` /
        ``uint64`` / ``float64`` in 32 bits. A host value (NumPy array, list, scalar) given for such
        an input is checked here, at the graph's boundary, before it is narrowed: token ids and
        positions fit; a value outside the 32-bit range would wrap, so it is refused. JAX arrays
        are already 32-bit and pass.

        Raises:
            ValueError: a value outside the held range (naming the input, the value, the declared
                and the held dtype).
        """
        for i, (t, v) in enumerate(zip(self._input_types, values)):
            held = np.dtype(t.dtype.to_jax())
            if held == np.dtype(t.dtype.to_numpy()) or _is_jax_array(v):
                continue
            arr = v.to_numpy() if hasattr(v, "to_numpy") else np.asarray(v)
            if not arr.size:
                continue
            if arr.dtype.kind in "iu" and held.kind in "iu":
                info = np.iinfo(held)
                bad = arr[(arr < info.min) | (arr > info.max)]
            elif arr.dtype.kind == "f" and held.kind == "f":
                bad = arr[np.isfinite(arr) & (np.abs(arr) > np.finfo(held).max)]
            else:
                continue
            if bad.size:
                raise ValueError(
                    f"Input at position {i} (input{i}) of graph {self.name!r}: value {bad.flat[0]!r} does not fit "
                    f"{t.dtype!r} as maxjax holds it ({held.name}: JAX runs without x64); values must lie in "
                    f"[{np.iinfo(held).min if held.kind in 'iu' else -np.finfo(held).max}, "
                    f"{np.iinfo(held).max if held.kind in 'iu' else np.finfo(held).max}]"
                )

    # -- printing ----------------------------------------------------------------------------
    def __str__(self) -> str:
        def ty(aval: Any) -> str:
            return f"{DType.from_numpy(aval.dtype).name}[{', '.join(str(d) for d in aval.shape)}]"

        def arg(a: Any) -> str:
            return a._node.label(a._index) if isinstance(a, TensorValue) else _show(a)

        ins = ", ".join(f"input{i}: {ty(n.out_avals[0])}" for i, n in enumerate(self._nodes) if n.kind == "input")
        lines = [f"graph {self.name}({ins}) {{"]
        for n in self._nodes:
            if n.kind == "weight":
                tag = " (placeholder)" if n.extra.placeholder else ""
                lines.append(f"  {n.extra.key}: {ty(n.out_avals[0])} = weight{tag}")
            elif n.kind in ("op", "call", "const"):
                outs = ", ".join(ty(a) for a in n.out_avals)
                args = ", ".join(arg(a) for a in n.args)
                static = ", ".join(f"{k}={_show(v)}" for k, v in n.static.items() if v is not None)
                sep = ", " if args and static else ""
                lines.append(f"  {n.label()} = {n.op}({args}{sep}{static}) : {outs}")
        if self._outputs is not None:
            lines.append(f"  output({', '.join(arg(o) for o in self._outputs)})")
        lines.append("}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        ins = ", ".join(str(t.shape) for t in self._input_types)
        return f"Graph({self.name!r}, inputs=[{ins}], {len(self._nodes)} nodes, {len(self._weights)} weights)"


def _show(v: Any) -> str:
    """A compact form of an op's static argument for the printed graph."""
    if isinstance(v, Dim):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    if isinstance(v, slice):
        parts = ["" if x is None else _show(x) for x in (v.start, v.stop)]
        return ":".join(parts) + ("" if v.step is None else f":{_show(v.step)}")
    if v is Ellipsis:
        return "..."
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return np.dtype(v).name
    return repr(v)


def _is_jax_array(x: Any) -> bool:
    import jax

    return isinstance(x, jax.Array)


def _differ(a: Any, b: Any) -> bool:
    """``a != b`` for sizes that may be JAX symbolic expressions (undecidable counts as different)."""
    try:
        return bool(a != b)
    except Exception:
        return str(a) != str(b)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest candidate (difflib), or an empty string."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""
