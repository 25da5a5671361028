"""Lowering chains of ``ops.call`` to ``jax.lax.scan``, so compile time does not grow with depth.

A nested ``jax.jit`` only saves tracing: XLA inlines every call (jax-ml/jax#22385). What keeps the
compiled program the size of one layer is ``lax.scan`` over weights stacked along a layer axis.

A *chain* is a run of call nodes of one subgraph ``c_1 .. c_L`` (``L >= 2``) in one graph where:

- some argument positions are *carried*: argument ``j`` of ``c_{i+1}`` is output ``m(j)`` of
  ``c_i`` (the same ``m`` for every link), with the same shape and dtype, and that output is used by
  nothing else;
- the other arguments (*xs*, e.g. a layer index) have the same shape and dtype in every call and do
  not depend on any call of the chain; they are stacked along a new leading axis;
- outputs that are not carried (*ys*) are only used after the last call of the chain;
- every call has a different prefix (a weight shared across layers breaks the chain).

Anything else is evaluated call by call and stays correct. Placeholder weights of the chain are
stacked once, when the weights are prepared (``Program.prepare`` / ``InferenceSession.load``);
weights the subgraph uses without a prefix are shared by all steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.graph.graph import Graph, Node
from maxjax.graph.layer_weights import LayerIndexed, LayerWeights, StackBits, StackIndexed, materialize
from maxjax.graph.value import TensorValue

__all__ = ["Chain", "find_chains", "evaluate"]


@dataclass
class Chain:
    """A run of calls of ``sub`` lowered to one ``lax.scan`` (see the module docstring)."""

    sub: Graph
    nodes: list[Node]
    carry: dict[int, int] = field(default_factory=dict)  # arg position -> output index of the previous call

    @property
    def prefixes(self) -> list[str]:
        return [n.extra.prefix for n in self.nodes]

    @property
    def invariant_positions(self) -> list[int]:
        """Non-carried arguments that are the same value in every call (passed once, not stacked)."""
        first = self.nodes[0].args
        return [
            j
            for j in range(len(first))
            if j not in self.carry
            and all(n.args[j]._node is first[j]._node and n.args[j]._index == first[j]._index for n in self.nodes)
        ]

    @property
    def xs_positions(self) -> list[int]:
        """Non-carried arguments that differ between calls (stacked along the layer axis)."""
        inv = set(self.invariant_positions)
        return [j for j in range(len(self.sub._input_types)) if j not in self.carry and j not in inv]

    @property
    def ys_positions(self) -> list[int]:
        carried = set(self.carry.values())
        return [k for k in range(len(self.nodes[0].out_avals)) if k not in carried]

    def __repr__(self) -> str:
        return f"Chain({self.sub.name!r}, {len(self.nodes)} calls, carry={self.carry})"


def _aval_key(aval: Any) -> tuple[str, str]:
    return (str(tuple(str(d) for d in aval.shape)), str(aval.dtype))


def find_chains(graph: Graph) -> list[Chain]:
    """The chains of ``graph``'s call nodes that can run as one scan each."""
    nodes = graph._nodes
    uses: dict[tuple[int, int], list[int]] = {}
    for n in nodes:
        for a in n.args:
            if isinstance(a, TensorValue) and a._node is not None:
                uses.setdefault((a._node.id, a._index), []).append(n.id)
    for o in graph._outputs or []:
        uses.setdefault((o._node.id, o._index), []).append(len(nodes))  # used by the graph output

    chains: list[Chain] = []
    open_chain: Chain | None = None

    def close() -> None:
        nonlocal open_chain
        if open_chain is not None and len(open_chain.nodes) >= 2:
            chains.append(open_chain)
        open_chain = None

    for n in nodes:
        if n.kind != "call":
            continue
        link = _link(open_chain, n, uses) if open_chain is not None else None
        if link is not None:
            if not open_chain.nodes[1:]:
                open_chain.carry = link
            open_chain.nodes.append(n)
            continue
        close()
        open_chain = Chain(n.extra.sub, [n])
    close()
    return [c for c in chains if _valid(c, nodes, uses)]


def _link(chain: Chain, n: Node, uses: dict[tuple[int, int], list[int]]) -> dict[int, int] | None:
    """The carry mapping if ``n`` continues ``chain``, else None."""
    prev = chain.nodes[-1]
    if n.extra.sub is not chain.sub or n.extra.caller is not prev.extra.caller:
        return None
    if n.extra.prefix in chain.prefixes:
        return None  # the same weights twice: a weight shared across layers
    carry: dict[int, int] = {}
    for j, a in enumerate(n.args):
        if isinstance(a, TensorValue) and a._node is prev:
            if uses.get((prev.id, a._index)) != [n.id]:
                return None  # the carried output is used elsewhere too
            if _aval_key(a._aval) != _aval_key(prev.args[j]._aval if isinstance(prev.args[j], TensorValue) else a._aval):
                return None
            carry[j] = a._index
    if not carry:
        return None
    if chain.nodes[1:] and carry != chain.carry:
        return None
    for j, a in enumerate(n.args):  # xs must look alike in every call
        if j not in carry and _aval_key(a._aval) != _aval_key(chain.nodes[0].args[j]._aval):
            return None
    return carry


def _valid(chain: Chain, nodes: list[Node], uses: dict[tuple[int, int], list[int]]) -> bool:
    """xs must not depend on the chain; ys must only be used after the chain."""
    members = {n.id for n in chain.nodes}
    first, last = chain.nodes[0].id, chain.nodes[-1].id
    dependent = set(members)
    for n in nodes[first : last + 1]:
        if n.id in members:
            continue
        if any(isinstance(a, TensorValue) and a._node is not None and a._node.id in dependent for a in n.args):
            dependent.add(n.id)
    for n in chain.nodes:
        for j in chain.xs_positions + chain.invariant_positions:
            a = n.args[j]
            if a._node.id in dependent:
                return False
    for n in chain.nodes[:-1]:
        for k in chain.ys_positions:
            if any(u <= last for u in uses.get((n.id, k), [])):
                return False
    return True


def chain_shared_keys(chain: Chain) -> list[str]:
    return [k for k, e in chain.sub._weights.items() if not e.placeholder]


def _float32_products(prim: Any, *_: Any, **params: Any) -> bool:
    """``jax.checkpoint`` policy of an autocast program's recomputed layers: keep the float32
    results of dots without batch dimensions (the stored-weight products, see
    ``BackendPolicy.autocast``), recompute everything else. XLA:CPU updates a float32 stack of
    saved values in place, where it widens a bfloat16 one to float32 whole at every layer; a scan
    without recomputation would also save each layer's bfloat16 weight slices (a SmolLM2 LoRA
    step, batch 4 x 128, 2-core Zen 5: 0.83 s, against 1.0 s recomputing whole layers and 2.2 s
    without recomputation)."""
    return (
        prim is jax.lax.dot_general_p
        and params.get("preferred_element_type") == jnp.float32
        and not params["dimension_numbers"][1][0]
    )


def run_chain(
    chain: Chain,
    stacked: Mapping[str, Any],
    shared: Mapping[str, Any],
    first_args: Sequence[Any],
    xs_args: Sequence[Sequence[Any]],
    remat: bool = False,
    policy: Any = None,
) -> tuple[list[Any], list[Any]]:
    """Runs the chain as one scan; returns (final outputs of the last call, ys stacked per output).

    ``first_args`` are the first call's arguments (carry and invariant values come from them);
    ``xs_args[i]`` the values of call ``i`` at :attr:`Chain.xs_positions`.
    """
    from maxjax.backend import policy_for
    from maxjax.graph.ops._core import is_quantized

    policy = policy_for(policy)
    sub = chain.sub
    carry_pos = sorted(chain.carry)
    xs_pos = chain.xs_positions
    inv = {j: first_args[j] for j in chain.invariant_positions}
    ys_pos = chain.ys_positions
    n_args = len(sub._input_types)

    per_layer = {k: v for k, v in stacked.items() if isinstance(v, LayerWeights)}
    # quantized stacks that the policy multiplies in a kernel reading the layer in place, and stacks
    # read in place from their file (``mapped``: leaves are the file and each layer's offset): not
    # sliced by the scan
    in_place = {k: v for k, v in stacked.items() if is_quantized(v) and (policy.native_matmul(v, 1) or v.layout == "mapped")}
    # stacks that give each step its layer to read in place themselves (``at_layer(index)``: an
    # AmxWeight stack laid out for the AMX kernel): not sliced by the scan either
    indexed = {k: v for k, v in stacked.items() if callable(getattr(v, "at_layer", None))}
    arrays = {k: v for k, v in stacked.items() if not isinstance(v, LayerWeights) and k not in in_place and k not in indexed}

    def body(carry: tuple[Any, ...], x: tuple[Any, Any, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        w_slice, xs_vals, layer = x
        w_slice = {k: v.value() if isinstance(v, StackBits) else v for k, v in w_slice.items()}
        if per_layer:
            w_slice = {**w_slice, **{k: LayerIndexed(v.layers, layer) for k, v in per_layer.items()}}
        if in_place:
            w_slice = {**w_slice, **{k: StackIndexed(v, layer) for k, v in in_place.items()}}
        if indexed:
            w_slice = {**w_slice, **{k: v.at_layer(layer) for k, v in indexed.items()}}
        args: list[Any] = [None] * n_args
        for j, v in inv.items():
            args[j] = v
        for j, v in zip(carry_pos, carry):
            args[j] = v
        for j, v in zip(xs_pos, xs_vals):
            args[j] = v
        sub._trace_count += 1
        outs = evaluate(sub, (), {**shared, **w_slice}, (), args, policy=policy)
        return tuple(outs[chain.carry[j]] for j in carry_pos), tuple(outs[k] for k in ys_pos)

    if remat:  # an autocast program keeps its float32 products (see _float32_products)
        body = jax.checkpoint(body, policy=_float32_products if policy.autocast else None)  # type: ignore[assignment]
    init = tuple(first_args[j] for j in carry_pos)
    xs = tuple(jnp.stack([a[i] for a in xs_args]) for i in range(len(xs_pos)))
    layers = jnp.arange(len(chain.nodes), dtype=jnp.int32)
    final, ys = jax.lax.scan(body, init, (arrays, xs, layers))
    n_out = len(chain.nodes[0].out_avals)
    last_out: list[Any] = [None] * n_out
    for j, v in zip(carry_pos, final):
        last_out[chain.carry[j]] = v
    for k, y in zip(ys_pos, ys):
        last_out[k] = y[-1]
    return last_out, list(ys)


def evaluate(
    graph: Graph,
    chains: Sequence[Chain],
    weights: Mapping[str, Any],
    stacked: Sequence[Mapping[str, Any]],
    args: Sequence[Any],
    remat: bool = False,
    policy: Any = None,
) -> list[Any]:
    """Evaluates ``graph`` on arrays or tracers, running each chain as one scan.

    ``weights`` holds the arrays of every registry name used outside the chains (and the shared
    weights of the chains); ``stacked[c]`` the stacked placeholder weights of chain ``c``.
    ``policy`` is the :class:`~maxjax.backend.BackendPolicy` given to ops that use one (default:
    JAX's default backend's).
    """
    from maxjax.backend import policy_for
    from maxjax.graph.ops._core import concretize, is_quantized

    policy = policy_for(policy)
    with_policy = {"policy": policy}
    if graph._outputs is None:
        raise ValueError(f"Graph {graph.name!r} has no output yet: call graph.output(...)")
    env = graph.bind_dims([a.shape for a in args])
    in_chain: dict[int, tuple[int, int]] = {}
    for c, chain in enumerate(chains):
        for i, n in enumerate(chain.nodes):
            in_chain[n.id] = (c, i)
    vals: list[Any] = [None] * len(graph._nodes)

    def arg(x: Any) -> Any:
        return vals[x._node.id][x._index] if isinstance(x, TensorValue) else x

    for node in graph._nodes:
        kind = node.kind
        if node.id in in_chain:
            c, i = in_chain[node.id]
            chain = chains[c]
            if i < len(chain.nodes) - 1:
                continue
            caller_key = chain.nodes[0].extra.caller._weight_key
            shared = {k: weights[caller_key(k)[0]] for k in chain_shared_keys(chain)}
            first_args = [arg(a) for a in chain.nodes[0].args]
            xs_args = [[arg(n.args[j]) for j in chain.xs_positions] for n in chain.nodes]
            last_out, ys = run_chain(chain, stacked[c], shared, first_args, xs_args, remat, policy)
            ys_pos = chain.ys_positions
            for i2, n in enumerate(chain.nodes[:-1]):
                out = [None] * len(n.out_avals)
                for k, y in zip(ys_pos, ys):
                    out[k] = y[i2]
                vals[n.id] = out
            vals[node.id] = last_out
            continue
        if kind == "op":
            a = [arg(x) for x in node.args]
            if not getattr(node.fn, "accepts_layer_indexed", False):
                a = [materialize(x) for x in a]
            kw = concretize(node.static, env) if node.static else {}
            if getattr(node.fn, "uses_policy", False):
                kw = {**kw, **with_policy}
            with jax.named_scope(node.scope or node.op):
                out = node.fn(*a, **kw)
            vals[node.id] = jax.tree.leaves(out, is_leaf=is_quantized) if node.treedef is not None else [out]
        elif kind == "input":
            vals[node.id] = [args[node.extra]]
        elif kind == "weight":
            vals[node.id] = [weights[node.extra.key]]
        elif kind == "const":
            vals[node.id] = [node.extra]
        elif kind == "call":
            plain = {k: materialize(v) for k, v in weights.items()}  # a call inside a scanned layer: arrays
            vals[node.id] = node.extra.run(plain, [materialize(arg(x)) for x in node.args], policy)
        else:  # pragma: no cover
            raise AssertionError(kind)
    return [materialize(arg(o)) for o in graph._outputs]
