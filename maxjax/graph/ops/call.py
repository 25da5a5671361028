"""``ops.call``: runs a subgraph (from ``Graph.add_subgraph`` or ``Module.build_subgraph``).

A subgraph is evaluated by one ``jax.jit``-compiled function, traced once per input signature
(and backend policy) however many times it is called. In eager mode (concrete arrays, outside
graphs and traces) a subgraph built by ``Module.build_subgraph`` instead runs the layer found at
the call's ``prefix`` in the module being run, so layer hooks see every layer's concrete output
(a notebook user looking inside layer 17); graph mode and traced functional mode are unchanged. Its placeholder weights are looked up under
the call's ``prefix``: in the weights registry (graph mode) or among the weights bound by the
module being run (eager and functional modes, :mod:`maxjax.graph.binding`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax

from maxjax.backend import BackendPolicy, policy_for
from maxjax.dtype import DType
from maxjax.graph.binding import current_binding
from maxjax.graph.graph import Graph, Node, current_graph, did_you_mean
from maxjax.graph.type import Dim, StaticDim
from maxjax.graph.value import TensorValue

__all__ = ["call"]


def _jitted(sub: Graph) -> Any:
    if sub._jitted is None:
        from maxjax.graph.scan import evaluate

        def traced(weights: Mapping[str, Any], args: Sequence[Any], policy: BackendPolicy) -> list[Any]:
            sub._trace_count += 1  # runs once per trace, not per call
            return evaluate(sub, (), weights, (), args, policy=policy)

        sub._jitted = jax.jit(traced, static_argnums=2)
    return sub._jitted


def _check_args(sub: Graph, args: Sequence[Any]) -> None:
    n = len(sub._input_types)
    if len(args) != n:
        raise ValueError(
            f"Expected {n} args to call to {sub.name}, got {len(args)}. "
            f"Subgraph input types: {[str(t.shape) for t in sub._input_types]}"
        )
    for i, (a, t) in enumerate(zip(args, sub._input_types)):
        if not hasattr(a, "dtype") or not hasattr(a, "shape"):
            raise ValueError(f"Argument {i} to call to {sub.name} must be a tensor, got {type(a).__name__}")
        dt = DType.of(a.dtype)
        # a graph value's declared dtype must be the input's (int64 is not int32 even where JAX
        # holds both in 32 bits); an array's is compared as JAX holds it
        if (dt != t.dtype) if isinstance(a, TensorValue) and a._graph is not None else dt.to_jax() != t.dtype.to_jax():
            raise ValueError(
                f"Argument {i} to call to {sub.name}: expected dtype {t.dtype!r}, got {dt!r} (wrong type)"
            )
        shape = list(a.shape)
        if len(shape) != t.rank:
            raise ValueError(
                f"Argument {i} to call to {sub.name}: expected rank {t.rank} ({t.shape}), got {len(shape)} "
                f"({shape})"
            )
        for axis, (d, got) in enumerate(zip(t.shape, shape)):
            if isinstance(d, StaticDim) and Dim(got) != d:
                raise ValueError(
                    f"Argument {i} to call to {sub.name}: dim {axis} must be {d.dim}, got {got} "
                    f"(expected shape {t.shape})"
                )


class CallSite:
    """One ``ops.call`` of ``sub`` under ``prefix``, made from graph ``caller`` (None: eager)."""

    __slots__ = ("sub", "prefix", "caller", "keys")

    def __init__(self, sub: Graph, prefix: str, caller: Graph | None):
        self.sub = sub
        self.prefix = prefix
        self.caller = caller
        # sub weight key -> the name the caller knows it by
        self.keys = {
            k: (prefix + k if e.placeholder else k) for k, e in sub._weights.items()
        }

    def run(self, weights: Mapping[str, Any], args: Sequence[Any], policy: BackendPolicy | None = None) -> list[Any]:
        """Runs the subgraph with the caller's ``weights`` (keyed as the caller keys them)."""
        key = self.caller._weight_key if self.caller is not None else (lambda n: (n, False))
        sub_weights = {k: weights[key(name)[0]] for k, name in self.keys.items()}
        return list(_jitted(self.sub)(sub_weights, list(args), policy_for(policy)))


def _eager_weights(site: CallSite) -> dict[str, Any]:
    binding = current_binding()
    index = binding.names if binding is not None else None
    out = {}
    for k, name in site.keys.items():
        w = index.get(name) if index is not None else None
        if w is None:
            entry = site.sub._weights[k]
            if not entry.placeholder:
                w = entry.weight
            else:
                where = "the module being run" if index is not None else "any module (call the module itself)"
                raise KeyError(
                    f"ops.call({site.sub.name!r}, prefix={site.prefix!r}): no weight {name!r} in {where}."
                    + did_you_mean(name, index or ())
                )
        out[name] = w._resolve(None)
    return out


def call(graph: Graph, *args: Any, prefix: str = "") -> list[Any]:
    """Calls subgraph ``graph`` on ``args``; returns its outputs as a list.

    Placeholder weights of the subgraph are looked up as ``prefix + name`` (for example
    ``prefix="layers.3."`` for ``"mlp.up.weight"``).

    Raises:
        ValueError: wrong number of arguments, an argument of the wrong dtype, rank or static
            size, or a subgraph called from a graph it does not belong to.
        KeyError: (outside graphs) no weight under the prefix, with "did you mean".
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"ops.call expects a Graph, got {type(graph).__name__}")
    if graph._outputs is None:
        raise ValueError(f"Subgraph {graph.name!r} has no output yet")
    _check_args(graph, args)
    caller = next((a._graph for a in args if isinstance(a, TensorValue) and a._graph is not None), None)
    if caller is None:
        caller = current_graph()
    if caller is None:  # eager / functional mode
        arrays = [a.to_jax() if isinstance(a, TensorValue) else a for a in args]
        runner = getattr(graph, "_eager_runner", None)
        if runner is not None and not any(isinstance(a, jax.core.Tracer) for a in arrays):
            # concrete values (eager mode): run the layer itself, so its hooks fire for every layer
            outs = runner(prefix, args)
            if outs is not None:
                return outs
        site = CallSite(graph, prefix, None)
        outs = site.run(_eager_weights(site), arrays)
        return [TensorValue._from_array(o) for o in outs]
    if graph._parent is not caller:
        owner = graph._parent.name if graph._parent is not None else "no graph (it was built outside one)"
        raise ValueError(f"Subgraph {graph.name!r} belongs to {owner!r}, not to graph {caller.name!r} that calls it")
    vals = []
    for a in args:
        if isinstance(a, TensorValue) and a._graph is caller:
            vals.append(a)
        else:
            from maxjax.graph.ops.shape import identity

            with caller:
                vals.append(identity(a))
    site = CallSite(graph, prefix, caller)
    for k, name in site.keys.items():
        caller._require_weight(name, graph._weights[k].weight)
        if k in graph._packed_only:  # the callee reads this quantized weight's raw bytes
            caller._packed_only.add(caller._weight_key(name)[0])
        caller._weight_uses.setdefault(caller._weight_key(name)[0], set()).update(graph._weight_uses.get(k, ()))
    arg_avals = [v._aval for v in vals]
    key = tuple((str(a.shape), str(a.dtype)) for a in arg_avals)
    out_avals = graph._call_shapes.get(key)  # one shape inference per argument signature
    if out_avals is None:
        weight_avals = {k: e.weight._aval for k, e in graph._weights.items()}
        try:
            from maxjax.graph.scan import evaluate

            out_avals = jax.eval_shape(lambda w, a: evaluate(graph, (), w, (), a), weight_avals, arg_avals)
        except Exception as e:
            raise ValueError(f"call to {graph.name}: {e}") from None
        graph._call_shapes[key] = out_avals
    node = caller._add_node(
        Node(
            "call", f"call[{graph.name}, prefix={prefix!r}]", out_avals, args=tuple(vals), extra=site,
            dtypes=[o.dtype for o in graph._outputs],  # the subgraph's declared output dtypes (int64 stays int64)
        )
    )
    return [TensorValue._from_node(caller, node, i) for i in range(len(out_avals))]
