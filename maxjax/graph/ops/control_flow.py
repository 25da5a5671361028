"""MAX's control flow (``max.graph.ops.cond``, ``max.graph.ops.while_loop``) over ``jax.lax.cond`` and
``jax.lax.while_loop``.

Graph mode: the branch (or predicate and body) functions are called once, while the graph is
built, on symbolic values, as in MAX (``max/graph/ops/conditional.py``, ``while_loop.py``). The ops
they record are taken out of the graph into a *region*, and the graph gets ONE node whose jnp
function runs ``lax.cond`` / ``lax.while_loop`` with each region evaluated on arrays inside it.
Values of the graph a branch uses (its *captures*) become arguments of that node; weights and
constants first used inside a branch stay in the graph (they are inputs, not computation). A value
computed inside a branch belongs to it: using it outside (say, kept in a Python variable) raises
when the graph runs, naming the branch.

Eager and functional modes (arrays, TensorValues holding arrays, tracers under ``jax.jit``): the
functions run inside ``lax.cond`` / ``lax.while_loop`` directly; both branches are traced (as MAX
compiles both), only the selected one runs.

Refused, with the reason: writing a buffer inside a branch or loop body (``ops.buffer_store`` /
``buffer_store_slice``; MAX threads buffer chains through its blocks, maxjax's buffers are
versioned values recorded at build time), buffers as loop values (MAX refuses them too), and
``ops.call`` of a subgraph inside a branch.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph.buffer import BufferValue
from maxjax.graph.graph import Graph, Node, current_graph
from maxjax.graph.ops._core import apply, concretize, is_quantized, op_traits
from maxjax.graph.type import SymbolicDim, TensorType
from maxjax.graph.value import TensorValue, Value

__all__ = ["cond", "while_loop"]

#: the control-flow region being built or traced ("ops.cond", "ops.while_loop"), or ""
_REGION: contextvars.ContextVar[str] = contextvars.ContextVar("maxjax_control_flow_region", default="")


def inside_region() -> str:
    """The control-flow op whose branch or body is being built or traced ("" outside any)."""
    return _REGION.get()


@contextlib.contextmanager
def _region_scope(op: str) -> Iterator[None]:
    token = _REGION.set(op)
    try:
        yield
    finally:
        _REGION.reset(token)


class _RegionId:
    """The id of a node recorded inside a branch: it is not a position in the graph, and reading
    it as one (the graph uses a branch's value outside the branch) raises."""

    __slots__ = ("where",)

    def __init__(self, where: str):
        self.where = where

    def __index__(self) -> int:
        raise ValueError(
            f"a value computed inside {self.where} is used outside it; return it from the branch (out_types) "
            "or the loop body instead"
        )

    def __repr__(self) -> str:
        return self.where

    __str__ = __repr__


class _Region:
    """Ops recorded by one branch / predicate / body function, run on arrays by :meth:`run`.

    ``nodes``: the ops in order; ``params``: placeholder nodes of the function's arguments (loop
    values); ``captures``: values of the enclosing graph (or region) the ops use; ``results``: what
    the function returned.
    """

    __slots__ = ("where", "nodes", "params", "captures", "results")

    def __init__(self, where: str, nodes: list[Node], params: list[Node], results: list[TensorValue]):
        self.where = where
        self.nodes = nodes
        self.params = params
        self.results = results
        inside = {id(n) for n in nodes} | {id(p) for p in params}
        seen: dict[tuple[int, int], TensorValue] = {}
        for v in [a for n in nodes for a in n.args] + results:
            if isinstance(v, TensorValue) and id(v._node) not in inside:
                seen.setdefault((id(v._node), v._index), v)
        self.captures = list(seen.values())

    def run(
        self, captured: dict[tuple[int, int], Any], params: Sequence[Any], dims: dict[str, Any], policy: Any
    ) -> list[Any]:
        """The results on arrays: ``captured`` maps (node, index) keys to arrays, ``params`` are the
        argument arrays, ``dims`` the sizes (ints, or JAX symbolic expressions while shapes are
        inferred) of the graph's symbolic dims."""
        env = dict(captured)
        for node, a in zip(self.params, params):
            env[(id(node), 0)] = a

        def arg(x: Any) -> Any:
            return env[(id(x._node), x._index)] if isinstance(x, TensorValue) else x

        for node in self.nodes:
            kw = concretize(node.static, dims) if node.static else {}
            if getattr(node.fn, "uses_policy", False):
                kw["policy"] = policy
            with jax.named_scope(node.scope or node.op):
                out = node.fn(*(arg(a) for a in node.args), **kw)
            outs = jax.tree.leaves(out, is_leaf=is_quantized) if node.treedef is not None else [out]
            for i, o in enumerate(outs):
                env[(id(node), i)] = o
        return [arg(r) for r in self.results]


def _as_list(x: Any) -> list[Any]:
    """MAX's ``as_iterable``: None, one value, or an iterable of values, as a list."""
    if x is None:
        return []
    return list(x) if isinstance(x, Iterable) and not hasattr(x, "shape") else [x]


def _check_value(x: Any, op: str) -> None:
    if isinstance(x, Value) or hasattr(x, "dtype"):
        return
    raise TypeError(
        f"{op}: TensorValue() can not be created directly from a {type(x).__name__!r} ({x!r}). Use ops.constant to "
        "convert to a TensorValue with a specific dtype."
    )


def _type_of(x: Any) -> TensorType:
    return x.type if isinstance(x, TensorValue) else TensorType(DType.of(x.dtype), list(x.shape))


def _check_types(results: list[Any], expected: list[TensorType], op: str, with_device: bool) -> None:
    """MAX's ``as_values`` check: the results' types equal ``expected`` (TypeError, both listed).

    Eagerly the devices are JAX's placement, so only dtypes and shapes are compared there."""
    for r in results:
        _check_value(r, op)
    got = [_type_of(r) for r in results]
    if with_device:
        same = got == expected
    else:
        pairs = zip(got, expected)
        same = len(got) == len(expected) and all(g.dtype == e.dtype and g.shape == e.shape for g, e in pairs)
    if not same:
        raise TypeError(f"Results don't match expected types: \nresult_types={got}, \nexpected_types={expected}")


def _check_predicate(p: Any, op: str) -> None:
    _check_value(p, op)
    if isinstance(p, BufferValue):
        raise TypeError(f"The predicate for `ops.{op}` must be a tensor, got a buffer")
    t = _type_of(p)
    if t.dtype != DType.bool or t.rank != 0:
        shape = ", ".join(str(d) for d in t.shape)
        raise ValueError(f"The predicate for `ops.{op}` must be a bool scalar tensor, got {t.dtype.name}[{shape}]")
    if isinstance(p, TensorValue) and p._graph is not None and not p.device.is_cpu():
        raise ValueError(
            f"The predicate for `ops.{op}` must reside on CPU, but got a tensor on {p.device}. Transfer it "
            "explicitly with `ops.transfer_to(pred, CPU())`."
        )


def _graph_of(values: Sequence[Any]) -> Graph | None:
    for v in values:
        if isinstance(v, TensorValue) and v._graph is not None:
            return v._graph
    return current_graph()


def _record(graph: Graph, where: str, op: str, fn: Callable[..., Any], args: Sequence[TensorValue]) -> _Region:
    """Calls ``fn`` on placeholder values like ``args`` (their types), recording its ops into a region."""
    start = len(graph._nodes)
    params = [graph._add_node(Node("region_arg", "arg", [a._aval], device=a.device)) for a in args]
    region_id = _RegionId(f"the {where} of ops.{op}")
    try:
        with _region_scope(op):
            results = _as_list(fn(*(TensorValue._from_node(graph, p) for p in params)))
    finally:
        new = graph._nodes[start + len(params) :]
        del graph._nodes[start:]
        nodes = []
        for node in new:
            if node.kind in ("weight", "const"):  # graph inputs and data: they stay in the graph
                node.id = len(graph._nodes)
                graph._nodes.append(node)
            else:
                node.id = region_id
                nodes.append(node)
    if any(node.kind == "call" for node in nodes):
        raise NotImplementedError(f"ops.{op}: ops.call of a subgraph inside the {where} is not supported by maxjax")
    for r in results:
        _check_value(r, op)
        if isinstance(r, BufferValue):
            raise TypeError(f"ops.{op}: the {where} returned a buffer; maxjax's branches return tensors")
    results = [r if isinstance(r, TensorValue) else TensorValue(r) for r in results]
    for p in params:
        p.id = region_id
    consts = [i for i, r in enumerate(results) if r._graph is None]  # concrete results: graph constants
    for i in consts:
        from maxjax.graph.ops._core import const_value

        results[i] = const_value(graph, results[i].to_jax())
    return _Region(where, nodes, params, results)


def _dims(graph: Graph) -> dict[str, SymbolicDim]:
    """The graph's symbolic dims (bound by its inputs): the regions' ops may use them."""
    return {d.name: d for t in graph._input_types for d in t.shape if isinstance(d, SymbolicDim)}


def _captured(region: _Region, keys: list[tuple[int, int]], arrays: Sequence[Any]) -> dict[tuple[int, int], Any]:
    where = {k: a for k, a in zip(keys, arrays)}
    return {(id(v._node), v._index): where[(id(v._node), v._index)] for v in region.captures}


def _unique_captures(*regions: _Region) -> list[TensorValue]:
    out: dict[tuple[int, int], TensorValue] = {}
    for r in regions:
        for v in r.captures:
            out.setdefault((id(v._node), v._index), v)
    return list(out.values())


# -- ops.cond ------------------------------------------------------------------------------------
def cond(
    pred: Any, out_types: Iterable[Any] | None, then_fn: Callable[[], Any], else_fn: Callable[[], Any]
) -> list[Any]:
    """Runs ``then_fn()`` when ``pred`` is true, else ``else_fn()`` (MAX's ``ops.cond``; ``lax.cond``).

    Both functions take no arguments (they use the values around them) and return ``None``, a
    tensor or a list of tensors whose types equal ``out_types``. Both are built (traced); only the
    selected one runs.

    Args:
        pred: a bool scalar tensor (on the CPU, in a graph).
        out_types: the :class:`TensorType` of each result, or None for none.
        then_fn: the branch for a true ``pred``.
        else_fn: the branch for a false ``pred``.

    Returns:
        The selected branch's results, a list (empty when ``out_types`` is None): TensorValues in a
        graph or when any input is one, else JAX arrays.

    Raises:
        TypeError: ``pred`` is not a tensor (a Python bool), or a branch's results do not match
            ``out_types`` (MAX's message; eagerly only dtypes and shapes are compared).
        ValueError: ``pred`` is not a bool scalar, or is a graph value off the CPU.
        NotImplementedError: a branch writes a buffer or calls a subgraph (see the module docstring).
    """
    _check_predicate(pred, "cond")
    expected = [t if isinstance(t, TensorType) else t.type for t in out_types] if out_types is not None else []
    graph = _graph_of([pred])
    if graph is None:
        return _cond_eager(pred, expected, then_fn, else_fn)
    if not isinstance(pred, TensorValue) or pred._graph is None:
        with graph:
            from maxjax.graph.ops.shape import literal_constant

            pred = literal_constant(pred.to_jax() if isinstance(pred, TensorValue) else pred)
    with graph:
        regions = []
        for where, fn in (("then branch", then_fn), ("else branch", else_fn)):
            region = _record(graph, where, "cond", fn, ())
            _check_types(region.results, expected, "cond", with_device=True)
            regions.append(region)
    then_r, else_r = regions
    captures = _unique_captures(then_r, else_r)
    keys = [(id(v._node), v._index) for v in captures]

    @op_traits(accepts_quantized=True, uses_policy=True)
    def _cond(p: Any, *arrays: Any, dims: dict[str, Any], policy: Any) -> tuple[Any, ...]:
        cap_t, cap_e = _captured(then_r, keys, arrays), _captured(else_r, keys, arrays)
        return jax.lax.cond(
            p,
            lambda: tuple(then_r.run(cap_t, (), dims, policy)),
            lambda: tuple(else_r.run(cap_e, (), dims, policy)),
        )

    out = apply(_cond, pred, *captures, _name="cond", dims=_dims(graph))
    return list(out)


def _cond_eager(
    pred: Any, expected: list[TensorType], then_fn: Callable[[], Any], else_fn: Callable[[], Any]
) -> list[Any]:
    wrap = [isinstance(pred, TensorValue)] * len(expected)  # result k is a TensorValue if any input was one

    def branch(fn: Callable[[], Any]) -> Callable[[], tuple[Any, ...]]:
        def run() -> tuple[Any, ...]:
            with _region_scope("cond"):
                results = _as_list(fn())
            _check_types(results, expected, "cond", with_device=False)
            for k, r in enumerate(results):
                wrap[k] = wrap[k] or isinstance(r, TensorValue)
            return tuple(r.to_jax() if isinstance(r, TensorValue) else jnp.asarray(r) for r in results)

        return run

    p = pred.to_jax() if isinstance(pred, TensorValue) else pred
    outs = jax.lax.cond(p, branch(then_fn), branch(else_fn))
    return [TensorValue._from_array(o) if w else o for o, w in zip(outs, wrap)]


# -- ops.while_loop ------------------------------------------------------------------------------
def while_loop(initial_values: Any, predicate: Callable[..., Any], body: Callable[..., Any]) -> list[Any]:
    """Runs ``values = body(*values)`` while ``predicate(*values)`` holds (MAX's ``ops.while_loop``;
    ``lax.while_loop``).

    Args:
        initial_values: one tensor or a non-empty list of tensors (the loop values).
        predicate: called with the loop values; returns a bool scalar tensor (on the CPU in a graph).
        body: called with the loop values; returns new values of the same types.

    Returns:
        The loop values after the last iteration, a list: TensorValues in a graph or for
        TensorValue inputs, else JAX arrays.

    Raises:
        ValueError: no initial values, or a predicate that is not a bool scalar (on the CPU).
        NotImplementedError: a buffer among the initial values (as in MAX), a buffer written or a
            subgraph called inside the predicate or body.
        TypeError: the body's results do not match the loop values' types (MAX's message; eagerly
            only dtypes and shapes are compared).
    """
    one = not isinstance(initial_values, Iterable) or hasattr(initial_values, "shape")
    values = [initial_values] if one else list(initial_values)
    if not values:
        raise ValueError("While loops must have at least one iteration value.")
    if any(isinstance(v, BufferValue) for v in values):
        raise NotImplementedError("Buffer operations are currently not supported in while loops")
    for v in values:
        _check_value(v, "while_loop")
    graph = _graph_of(values)
    if graph is None:
        return _while_eager(values, predicate, body)
    with graph:
        from maxjax.graph.ops.shape import identity

        values = [v if isinstance(v, TensorValue) and v._graph is graph else identity(v) for v in values]
        types = [v.type for v in values]
        pred_r = _record(graph, "predicate", "while_loop", predicate, values)
        if len(pred_r.results) != 1:
            raise ValueError(
                f"The predicate for `ops.while_loop` must return one bool scalar tensor, got {len(pred_r.results)} values"
            )
        _check_predicate(pred_r.results[0], "while_loop")
        body_r = _record(graph, "body", "while_loop", body, values)
        _check_types(body_r.results, types, "while_loop", with_device=True)
    captures = _unique_captures(pred_r, body_r)
    keys = [(id(v._node), v._index) for v in captures]
    n = len(values)

    @op_traits(accepts_quantized=True, uses_policy=True)
    def _while_loop(*arrays: Any, dims: dict[str, Any], policy: Any) -> tuple[Any, ...]:
        init, cap = arrays[:n], arrays[n:]
        cap_p, cap_b = _captured(pred_r, keys, cap), _captured(body_r, keys, cap)
        return jax.lax.while_loop(
            lambda c: pred_r.run(cap_p, c, dims, policy)[0],
            lambda c: tuple(body_r.run(cap_b, c, dims, policy)),
            tuple(init),
        )

    out = apply(_while_loop, *values, *captures, _name="while_loop", dims=_dims(graph))
    return list(out)


def _while_eager(values: list[Any], predicate: Callable[..., Any], body: Callable[..., Any]) -> list[Any]:
    wrap = [isinstance(v, TensorValue) for v in values]
    init = tuple(v.to_jax() if isinstance(v, TensorValue) else jnp.asarray(v) for v in values)
    types = [TensorType(DType.of(a.dtype), list(a.shape)) for a in init]

    def args(c: Sequence[Any]) -> list[Any]:
        return [TensorValue._from_array(a) if w else a for a, w in zip(c, wrap)]

    def cond_fun(c: tuple[Any, ...]) -> Any:
        with _region_scope("while_loop"):
            p = predicate(*args(c))
        _check_predicate(p, "while_loop")
        return p.to_jax() if isinstance(p, TensorValue) else p

    def body_fun(c: tuple[Any, ...]) -> tuple[Any, ...]:
        with _region_scope("while_loop"):
            results = _as_list(body(*args(c)))
        _check_types(results, types, "while_loop", with_device=False)
        return tuple(r.to_jax() if isinstance(r, TensorValue) else r for r in results)

    out = jax.lax.while_loop(cond_fun, body_fun, init)
    return [TensorValue._from_array(o) if w else o for o, w in zip(out, wrap)]
