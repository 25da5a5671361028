"""``maxjax.engine``: ``InferenceSession`` and ``Model`` (MAX's ``max.engine``), compiled with ``jax.jit``.

``session.load(graph, weights_registry=...)`` checks every weight the graph needs against the
registry (name, shape, dtype), places each array on its device once (with the weight's
``sharding`` when it has one) and returns a :class:`Model`. The weights are arguments of the
jitted function, never constants baked into the program, as in MAX. Each new combination of input
shapes (symbolic dims) compiles once and is cached by ``jax.jit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.driver import CPU, Buffer, Device
from maxjax.dtype import DType
from maxjax.graph.graph import Graph, did_you_mean
from maxjax.graph.scan import chain_shared_keys, evaluate, find_chains, stack_chain_weights
from maxjax.graph.type import Shape
from maxjax.graph.weight import to_jax_array

__all__ = ["InferenceSession", "Model", "Program", "TensorSpec", "enable_compilation_cache"]


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


class Program:
    """A graph as a pure function of prepared weights: ``apply(state, *inputs) -> list[array]``.

    The functional form of what ``InferenceSession.load`` runs: ``state = program.prepare(registry)``
    checks and places the weights once (stacking the weights of ``ops.call`` chains along a layer
    axis, see :mod:`maxjax.graph.scan`); ``program.apply`` is pure and works under ``jax.jit``,
    ``jax.grad`` and ``jax.vmap``. ``program.unstack(grads)`` maps a pytree shaped like ``state``
    back to registry names.

    Args:
        graph: a graph with its output set.
        scan: lower chains of calls of one subgraph to ``lax.scan`` (True by default).
        remat: wrap each scanned layer in ``jax.checkpoint`` (less memory when differentiating).
        quantized_layout: how GGUF-quantized weights sit in device memory. ``"packed"``: the
            file's blocks as they are (uint8, the file's size). ``"nibbles"``: Q4_0, Q4_1 and Q4_K
            weights kept at 4 bits per value with their block scales, re-laid so that XLA unpacks
            them with vector instructions (:class:`~maxjax.graph.quantization.NibbleWeight`; the
            file's size for Q4_0/Q4_1); other encodings, and 4-bit weights with an odd number of
            rows, as ``"unpacked"``. ``"unpacked"``: one byte per quantized
            value plus float32 scales and offsets per block
            (:class:`~maxjax.graph.quantization.RepackedWeight`, about 1.25 bytes per weight for
            Q4_1): on XLA:CPU its dequantization fuses into matrix-vector products at memory speed,
            where the packed form's does not (see ``quantization.quantized_matmul``).
            ``"dequantized"``: float32 (4 bytes per weight). Weights whose graph uses are not all
            ``gather``/``qmatmul``/``dequantize`` stay packed.
    """

    def __init__(self, graph: Graph, *, scan: bool = True, remat: bool = False, quantized_layout: str = "packed"):
        if not isinstance(graph, Graph):
            raise TypeError(f"expected a maxjax Graph, got {type(graph).__name__}")
        if graph._outputs is None:
            raise ValueError(f"Graph {graph.name!r} has no output: call graph.output(...) before loading it")
        if quantized_layout not in ("packed", "nibbles", "unpacked", "dequantized"):
            raise ValueError(
                f"quantized_layout must be 'packed', 'nibbles', 'unpacked' or 'dequantized', got {quantized_layout!r}"
            )
        self.graph = graph
        self.remat = remat
        self.quantized_layout = quantized_layout
        self.chains = find_chains(graph) if scan else []
        stacked_names = {p + k for c in self.chains for k, e in c.sub._weights.items() if e.placeholder for p in c.prefixes}
        in_chain = {n.id for c in self.chains for n in c.nodes}
        used = {n.extra.key for n in graph._nodes if n.kind == "weight"}
        for n in graph._nodes:
            if n.kind == "call" and n.id not in in_chain:
                used.update(graph._weight_key(name)[0] for name in n.extra.keys.values())
        for c in self.chains:
            used.update(graph._weight_key(k)[0] for k in chain_shared_keys(c))
        self._plain_keys = sorted(k for k in graph._weights if k in used or k not in stacked_names)

    def check(self, registry: Mapping[str, Any]) -> None:
        """Checks ``registry`` against every weight the graph needs (name, shape, dtype).

        Raises:
            ValueError: a weight is missing (with "did you mean") or has a different shape or dtype.
        """
        for key, entry in self.graph._weights.items():
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

    def prepare(
        self, registry: Mapping[str, Any], device: Any = None, progress: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """Checks the registry and returns the state for :meth:`apply`, placed on devices once.

        Each array goes to its weight's ``sharding`` (stacked weights get a leading unsharded
        layer axis), else its weight's device, else ``device``. ``progress(name)`` is called after
        each registry entry is placed (for a progress bar).
        """
        self.check(registry)
        tick = progress or (lambda name: None)
        weights = {}
        for k in self._plain_keys:
            w = self.graph._weights[k].weight
            weights[k] = self._place(w, registry[k], self._target(w, device), _only_quantized_uses(self.graph, k))
            tick(k)
        stacked = []
        for chain in self.chains:
            arrays = stack_chain_weights(chain, lambda name: _host(registry[name]))
            placed = {}
            for k, v in arrays.items():
                w = chain.sub._weights[k].weight
                placed[k] = self._place(w, v, self._target(w, device, stacked=True), _only_quantized_uses(chain.sub, k))
                for p in chain.prefixes:
                    tick(p + k)
            stacked.append(placed)
        state = {"weights": weights, "stacked": stacked}
        return jax.block_until_ready(state)  # loaded means loaded: no copy still running behind

    def _place(self, w: Any, value: Any, target: Any, quantized_uses_only: bool) -> Any:
        enc = w.quantization_encoding
        if self.quantized_layout != "packed" and enc is not None and enc.is_gguf and quantized_uses_only:
            from maxjax.graph.quantization import NIBBLE_ENCODINGS, dequantize, repack, repack_nibbles

            packed = np.asarray(_host(value))
            lead = packed.shape[:-1]
            flat = jnp.asarray(packed.reshape(-1, packed.shape[-1]))
            if self.quantized_layout == "dequantized":
                return jax.device_put(dequantize(enc, flat).reshape(*lead, -1), target)
            rows = lead[-1] if lead else 1  # a stacked weight's rows pair within each layer
            nibbles = self.quantized_layout == "nibbles" and enc in NIBBLE_ENCODINGS and rows % 2 == 0
            r = repack_nibbles(enc, flat) if nibbles else repack(enc, flat)
            layers = lead[:-1]  # a stacked weight: the leading layer axes come back
            return type(r)(
                *(None if a is None else jax.device_put(a.reshape(*layers, -1, a.shape[-1]), target) for a in r)
            )
        return to_jax_array(value, target)

    @staticmethod
    def _target(w: Any, device: Any, stacked: bool = False) -> Any:
        if w.sharding is not None:
            if stacked and isinstance(w.sharding, jax.sharding.NamedSharding):
                P = jax.sharding.PartitionSpec
                return jax.sharding.NamedSharding(w.sharding.mesh, P(None, *w.sharding.spec))
            return w.sharding if not stacked else None
        try:
            return w.device.jax_device()
        except ValueError:
            return device

    def apply(self, state: Mapping[str, Any], *args: Any) -> list[Any]:
        """Evaluates the graph on ``args`` with prepared ``state`` (pure; jit/grad/vmap it freely)."""
        return evaluate(self.graph, self.chains, state["weights"], state["stacked"], args, self.remat)

    def unstack(self, tree: Mapping[str, Any]) -> dict[str, Any]:
        """A pytree shaped like :meth:`prepare`'s result (e.g. gradients) by registry name."""
        out = dict(tree["weights"])
        for chain, stacked in zip(self.chains, tree["stacked"]):
            for k, v in stacked.items():
                for i, p in enumerate(chain.prefixes):
                    out[p + k] = v[i]
        return out


_QUANTIZED_CONSUMERS = ("gather", "qmatmul[", "dequantize[")


def _only_quantized_uses(graph: Graph, key: str) -> bool:
    """True when every use of weight ``key`` of ``graph`` (in it and in subgraphs it calls) is an
    op that accepts the unpacked quantized layout (``gather`` of rows, ``qmatmul``, ``dequantize``)."""
    for node in graph._nodes:
        if node.kind == "weight" and node.extra.key == key:
            for user in graph._nodes:
                for i, a in enumerate(user.args):
                    if getattr(a, "_node", None) is node:
                        if user.kind == "call" or not user.op.startswith(_QUANTIZED_CONSUMERS):
                            return False
                        if user.op == "gather" and (
                            i != 0 or user.static.get("axis") not in (0, -2) or not _only_dequantized(graph, user)
                        ):
                            return False
            if any(o._node is node for o in graph._outputs or ()):
                return False
        if node.kind == "call":
            for sub_key, name in node.extra.keys.items():
                if graph._weight_key(name)[0] == key and not _only_quantized_uses(node.extra.sub, sub_key):
                    return False
    return True


def _only_dequantized(graph: Graph, gather: Any) -> bool:
    """Every use of the rows a gather took from a quantized weight is a ``dequantize``."""
    uses = [u for u in graph._nodes for a in u.args if getattr(a, "_node", None) is gather]
    outputs = any(o._node is gather for o in graph._outputs or ())
    return not outputs and all(u.kind == "op" and u.op.startswith("dequantize[") for u in uses)


def _host(value: Any) -> Any:
    if isinstance(value, Buffer):
        return value.to_numpy()
    if type(value).__name__ == "WeightData":
        return _host(value.data)
    return value


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
        return [Buffer(o) for o in self._run(self._state, *arrays)]

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
        scan: bool = True,
        remat: bool = False,
        **kwargs: Any,
    ) -> Model:
        """Checks ``weights_registry`` against the graph's weights and returns a loaded :class:`Model`.

        Chains of ``ops.call`` of one subgraph run as one ``lax.scan`` over weights stacked here,
        once (``scan=False`` turns that off; ``remat=True`` checkpoints each scanned layer).

        Raises:
            ValueError: a weight the graph needs is missing from the registry (with "did you mean"),
                or its value has a different shape or dtype (naming the weight, expected and actual);
                the graph has no output.
            TypeError: ``model`` is not a Graph (maxjax has no serialized-model format).
        """
        if not isinstance(model, Graph):
            raise TypeError(f"InferenceSession.load expects a maxjax Graph, got {type(model).__name__}")
        program = Program(model, scan=scan, remat=remat)
        state = program.prepare(weights_registry or {}, self.devices[0].jax_device)
        return Model(program, state, self.devices)

    def compile(self, model: Graph, **kwargs: Any) -> Graph:
        """MAX splits compile and init; here compilation happens on first execute (``jax.jit``)."""
        return model

    def init(self, compiled: Graph, *, weights_registry: Mapping[str, Any] | None = None) -> Model:
        return self.load(compiled, weights_registry=weights_registry)


def enable_compilation_cache(path: str | None = None) -> str:
    """Turns on JAX's persistent on-disk compilation cache for every program compiled after this.

    A later process compiling the same program (same graph, shapes, devices and JAX version)
    loads it from disk instead of compiling (MAX users ask for this: modular/max#166).

    Args:
        path: the cache folder (default: ``$MAXJAX_CACHE_DIR`` or ``~/.cache/maxjax/jax``).

    Returns:
        The folder used.
    """
    import os

    folder = path or os.environ.get("MAXJAX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "maxjax", "jax")
    os.makedirs(folder, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
