"""``Program``: a graph as a pure function of prepared weights, ``apply(state, *inputs)``.

The functional form of what ``InferenceSession.load`` runs, and what training and serving code
jits. ``Program.prepare(registry)`` checks the weights registry against the graph's weights and
places every array on its device once:

- the weights of ``ops.call`` chains are stacked along a layer axis (``lax.scan`` runs them, see
  :mod:`maxjax.graph.scan`);
- a GGUF-quantized weight becomes a :class:`~maxjax.graph.quantization.QuantizedArray` in the
  layout the backend policy picks for the platform (the program's ``quantized_layout`` when one is
  given), except that a weight some op reads as raw bytes stays ``packed``.

``Program.apply`` is pure (``jax.jit``, ``jax.grad``, ``jax.vmap`` it freely) and passes the
program's :class:`~maxjax.backend.BackendPolicy` to the ops that use one while it traces.
"""

from __future__ import annotations

import dataclasses

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from maxjax.backend import BackendPolicy, policy_for
from maxjax.backend.kernels import amx
from maxjax.backend.policy import LAYER_WEIGHTS
from maxjax.driver import jax_device_of, to_host_array, to_jax_array
from maxjax.dtype import DType
from maxjax.graph.graph import Graph, did_you_mean
from maxjax.graph.quantization import LAYOUTS
from maxjax.engine.placement import place_layers, place_sharded
from maxjax.graph.layer_weights import LayerWeights
from maxjax.graph.scan import chain_shared_keys, evaluate, find_chains
from maxjax.graph.type import Shape

__all__ = ["Program"]


class Program:
    """A graph as a pure function of prepared weights: ``apply(state, *inputs) -> list[array]``.

    ``state = program.prepare(registry)`` checks and places the weights once;
    ``program.apply(state, *inputs)`` evaluates the graph; ``program.unstack(tree)`` maps a pytree
    shaped like ``state`` (e.g. gradients) back to registry names.

    Args:
        graph: a graph with its output set.
        scan: lower chains of calls of one subgraph to ``lax.scan`` (True by default).
        remat: wrap each scanned layer in ``jax.checkpoint`` (less memory when differentiating).
        quantized_layout: how GGUF-quantized weights sit in memory (a layout of
            :mod:`maxjax.graph.quantization.arrays`: ``"packed"``, ``"unpacked"``, ``"nibbles"``,
            ``"dequantized"``); None: the backend policy's choice for the platform.
        policy: the :class:`~maxjax.backend.BackendPolicy` (default: the policy of ``devices[0]``,
            or of JAX's default backend).
        devices: the devices the program runs on (``maxjax.driver.Device``, ``jax.Device`` or
            ``DeviceRef``); the first is where unplaced weights go.
        layer_weights: how the float matrices of scanned layers are held: ``"stacked"`` (one
            ``[layers, ...]`` array, sliced by the scan) or ``"per_layer"`` (one buffer per layer,
            a :class:`~maxjax.graph.layer_weights.LayerWeights`: read in place by ``Linear``'s
            matmul; not for training, whose gradients would be one array per layer and branch);
            None: the backend policy's ``layer_weights``. Quantized and mesh-sharded weights are
            always stacked.

    Raises:
        TypeError: ``graph`` is not a maxjax Graph.
        ValueError: the graph has no output; an unknown ``quantized_layout`` or ``layer_weights``.
    """

    def __init__(
        self,
        graph: Graph,
        *,
        scan: bool = True,
        remat: bool = False,
        quantized_layout: str | None = None,
        policy: BackendPolicy | None = None,
        devices: Any = None,
        layer_weights: str | None = None,
    ):
        if not isinstance(graph, Graph):
            raise TypeError(f"expected a maxjax Graph, got {type(graph).__name__}")
        if graph._outputs is None:
            raise ValueError(f"Graph {graph.name!r} has no output: call graph.output(...) before loading it")
        if quantized_layout is not None and quantized_layout not in LAYOUTS:
            raise ValueError(f"quantized_layout must be one of {', '.join(map(repr, LAYOUTS))} or None, got {quantized_layout!r}")
        self.devices = list(devices or ())
        self.policy = policy_for(policy if policy is not None else (self.devices[0] if self.devices else None))
        # weights or a batch split over a mesh: the SPMD partitioner cannot split a kernel's custom call
        split_weights = any(_spans_devices(e.weight) for e in graph._weights.values())
        if self.policy.native_matmul_max_rows and split_weights:
            self.policy = dataclasses.replace(self.policy, native_matmul_max_rows=0)
        if self.policy.attention_kernel and (split_weights or len(self.devices) > 1):
            self.policy = dataclasses.replace(self.policy, attention_kernel=False)
        self.graph = graph
        self.remat = remat
        self.quantized_layout = quantized_layout or self.policy.quantized_layout
        self._layout_asked = quantized_layout is not None  # else the policy may map some encodings
        if layer_weights is not None and layer_weights not in LAYER_WEIGHTS:
            raise ValueError(f"layer_weights must be one of {LAYER_WEIGHTS} or None, got {layer_weights!r}")
        self.layer_weights = layer_weights or self.policy.layer_weights
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
        layer axis), else its weight's device, else ``device`` (default: the program's first
        device). ``progress(name)`` is called after each registry entry is placed.

        Returns:
            ``{"weights": {name: value}, "stacked": [{key: value} per chain]}``: values are
            ``jax.Array``s, and ``QuantizedArray``s for quantized weights.
        """
        self.check(registry)
        if device is None and self.devices:
            device = self.devices[0]
        if device is not None and not isinstance(device, (jax.Device, jax.sharding.Sharding)):
            device = jax_device_of(device)
        tick = progress or (lambda name: None)
        weights = {}
        for k in self._plain_keys:
            w = self.graph._weights[k].weight
            weights[k] = self._lay_out(self._place(w, [registry[k]], self._target(w, device), k in self.graph._packed_only, False), self.graph._weight_uses.get(k))
            tick(k)
        stacked = []
        for chain in self.chains:
            placed = {}
            for k, entry in chain.sub._weights.items():
                if not entry.placeholder:
                    continue
                values = [registry[p + k] for p in chain.prefixes]
                w = entry.weight  # layer 0's: every layer of a chain has its shape, layout and sharding
                target = self._target(w, device, stacked=True)
                if self._per_layer(w, target):  # one buffer per layer, no stacking copy
                    uses = chain.sub._weight_uses.get(k)
                    placed[k] = LayerWeights([self._lay_out(self._place(w, [v], self._target(w, device), False, False), uses) for v in values])
                else:
                    placed[k] = self._place(w, values, target, k in chain.sub._packed_only, True)
                for p in chain.prefixes:
                    tick(p + k)
            stacked.append(placed)
        state = {"weights": weights, "stacked": stacked}
        return jax.block_until_ready(state)  # loaded means loaded: no copy still running behind

    def _place(self, w: Any, values: list[Any], target: Any, packed_only: bool, stacked: bool) -> Any:
        """One weight's value (or its layers' values, stacked) on ``target``: in its device
        layout on a mesh, quantized weights in the runtime layout."""
        gguf = w._is_gguf_quantized()
        layout = None
        if gguf:  # GGUF blocks: in the layout the policy (or the program) picks
            layout = "packed" if packed_only else self.quantized_layout
            mesh = isinstance(target, jax.sharding.NamedSharding)
            if layout == "mapped" and mesh:
                raise ValueError(
                    f"weight {w.name!r}: quantized_layout='mapped' reads a weight in place from its file on one "
                    "device; a weight split over a mesh needs another layout ('nibbles' or 'unpacked')"
                )
            if not (packed_only or self._layout_asked or mesh) and self._tiles(w.quantization_encoding, w.stored_shape):
                layout = "tiles"  # integer dots with Q8_0 activations (the policy's tiled_encodings)
            elif not (packed_only or self._layout_asked or mesh) and self._maps(w.quantization_encoding):
                layout = "mapped"  # read in place from the mapped file (the policy's mapped_encodings)
            rows = w.stored_shape[-2] if len(w.stored_shape) >= 2 else 1
            if layout == "nibbles" and (rows // _row_parts(target, len(w.stored_shape) + stacked)) % 2:
                layout = "unpacked"  # nibbles pair rows: each device needs an even number of them
        if isinstance(target, jax.sharding.NamedSharding) and (gguf or w._quantized_class() is None):
            return place_sharded(
                values, w.stored_device_layout, w.stored_shape, target, stacked=stacked,
                encoding=w.quantization_encoding if gguf else None, quantized_layout=layout,
            )  # fmt: skip
        if gguf or w._quantized_class() is None:  # one copy of the stored bytes, stacks preallocated; a device array stays
            identity = w.stored_device_layout is None or w.stored_device_layout.is_identity
            return place_layers(
                values, target, stacked=stacked, transform=None if identity else w.to_device_layout,
                encoding=w.quantization_encoding if gguf else None, quantized_layout=layout,
                host_conversion=self.policy.host_layout_conversion, in_place=self.policy.mapped_float_tensors,
            )  # fmt: skip
        host = [w.to_device_layout(to_host_array(v)) for v in values]
        value = np.stack(host) if stacked else host[0]
        if w._quantized_class() is not None:  # another encoding: its class reads the stored value
            return jax.device_put(w.as_value(value), target)
        return to_jax_array(value, target)

    def _tiles(self, encoding: Any, stored_shape: Any) -> bool:
        """Whether the policy lays a weight of ``encoding`` and ``stored_shape`` out in tiles (its
        ``tiled_encodings``, where activations are rounded to Q8_0, the tiles kernel is built and
        the weight makes whole tiles; one that does not, e.g. a vocabulary of 32002 rows, is
        mapped or converted as the policy otherwise would)."""
        from maxjax.backend import kernels
        from maxjax.graph.quantization import layout_for

        if not (self.policy.q8_activations and getattr(encoding, "value", None) in self.policy.tiled_encodings and kernels.tiles_built()):
            return False
        return layout_for("tiles", encoding, encoding.logical_shape(tuple(stored_shape))) == "tiles"

    def _maps(self, encoding: Any) -> bool:
        """Whether the policy reads weights of ``encoding`` in place from their mapped file (its
        ``mapped_encodings``, where maxjax's CPU kernels run)."""
        from maxjax.backend import kernels

        return getattr(encoding, "value", None) in self.policy.mapped_encodings and kernels.unavailable_reason() is None

    def _lay_out(self, value: Any, uses: Any) -> Any:
        """``value`` in the AMX kernel's layout (:class:`~maxjax.backend.kernels.amx.AmxWeight`)
        where the program runs at ``precision=HIGH`` on the CPU, every op multiplies the weight as
        stored (``Linear``), and the kernel takes it; else ``value``."""
        if not (self.policy.platform == "cpu" and self.policy.precision == lax.Precision.HIGH and uses == {"stored_rhs"}):
            return value
        if not isinstance(value, jax.Array) or value.dtype != jnp.float32 or len(value.sharding.device_set) != 1 or not amx.lays_out(value.shape, value.dtype):
            return value
        return amx.lay_out(value, next(iter(value.sharding.device_set)))

    def _per_layer(self, w: Any, target: Any) -> bool:
        """Whether a chain's placeholder weight ``w`` is kept as one buffer per layer: a float
        matrix (not quantized, not split over a mesh) under ``layer_weights="per_layer"``."""
        return (
            self.layer_weights == "per_layer"
            and len(w.stored_shape) >= 2
            and not w._is_gguf_quantized()
            and w._quantized_class() is None
            and not isinstance(target, jax.sharding.NamedSharding)
        )

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

    def shardings(self, state: Mapping[str, Any]) -> Any:
        """The pytree of ``jax.sharding.Sharding`` objects of a prepared ``state`` (for ``jax.jit``'s
        ``in_shardings``/``out_shardings``)."""
        return jax.tree.map(lambda a: a.sharding, state)

    def apply(self, state: Mapping[str, Any], *args: Any) -> list[Any]:
        """Evaluates the graph on ``args`` with prepared ``state`` (pure; jit/grad/vmap it freely)."""
        return evaluate(self.graph, self.chains, state["weights"], state["stacked"], args, self.remat, self.policy)

    def unstack(self, tree: Mapping[str, Any]) -> dict[str, Any]:
        """A pytree shaped like :meth:`prepare`'s result (e.g. gradients) by registry name."""
        out = dict(tree["weights"])
        for chain, stacked in zip(self.chains, tree["stacked"]):
            for k, v in stacked.items():
                for i, p in enumerate(chain.prefixes):
                    out[p + k] = v.layers[i] if isinstance(v, LayerWeights) else jax.tree.map(lambda a, i=i: a[i], v)
        return out


def _row_parts(target: Any, ndim: int) -> int:
    """Into how many parts ``target`` splits the rows (second-to-last axis) of a weight: 1 when
    they are not split."""
    if not isinstance(target, jax.sharding.NamedSharding) or ndim < 2:
        return 1
    spec = tuple(target.spec) + (None,) * (ndim - len(tuple(target.spec)))
    axes = spec[ndim - 2]
    if axes is None:
        return 1
    names = axes if isinstance(axes, tuple) else (axes,)
    parts = 1
    for name in names:
        parts *= target.mesh.shape[name]
    return parts


def _spans_devices(w: Any) -> bool:
    """Whether weight ``w`` is placed over more than one device (a mesh sharding)."""
    devices = getattr(getattr(w, "sharding", None), "device_set", None)
    return devices is not None and len(devices) > 1
