"""MAX's ``ops.parallel`` (one body run for each launch of a bundle of tensors, ``mo.parallel``) and
``ops.constant_external`` (a named external weight), after ``max/graph/ops/parallel.py`` and
``max/graph/ops/constant.py`` of MAX 26.7.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from maxjax.graph.graph import Graph, Node
from maxjax.graph.type import TensorType
from maxjax.graph.value import TensorValue

__all__ = ["constant_external", "parallel"]


def parallel(
    inputs: Sequence[Sequence[Any]],
    body_fn: Callable[..., Any],
    *,
    buffers: Iterable[Any] | None = None,
    chain: Any = None,
    result_types: Sequence[Sequence[TensorType]],
) -> list[list[Any]]:
    """Runs ``body_fn`` once per launch (MAX's ``ops.parallel``).

    ``inputs[b][l]`` is bundle ``b``'s tensor for launch ``l`` (typically one launch per device).
    For each launch ``l``, ``body_fn(inputs[0][l], inputs[1][l], ...)`` returns one tensor per
    output bundle; result ``[b][l]`` has type ``result_types[b][l]`` and is placed on its device.
    MAX compiles the body once and dispatches it to every launch; maxjax calls it once per launch
    (JAX places each launch's ops on that launch's device), so Python side effects of the body
    run once per launch.

    Returns:
        ``[[t0, t1, ...], ...]``: one list per output bundle, one tensor per launch.

    Raises:
        ValueError: MAX's checks: no bundle, an empty bundle, bundles (or ``result_types``) of
            different launch counts, a body yielding another number of tensors than
            ``len(result_types)``; and a result whose dtype or shape is not its result type.
        NotImplementedError: ``buffers`` or ``chain`` (MAX's device chains for bundled
            collectives; maxjax has no chain values).
    """
    if buffers is not None or chain is not None:
        raise NotImplementedError(
            f"parallel: buffers={buffers!r} / chain={chain!r} (MAX's device chains for bundled collectives) are not "
            "supported by maxjax; only chainless bodies are"
        )
    bundles = [list(b) for b in inputs]
    if not bundles:
        raise ValueError("parallel requires at least one input bundle")
    launches = len(bundles[0])
    if launches == 0:
        raise ValueError("each input bundle must have at least one launch")
    for i, b in enumerate(bundles[1:], start=1):
        if len(b) != launches:
            raise ValueError(f"input bundle {i} has {len(b)} launches; bundle 0 has {launches}")
    out_types = [list(ts) for ts in result_types]
    for i, ts in enumerate(out_types):
        if len(ts) != launches:
            raise ValueError(f"result_types[{i}] has {len(ts)} types; expected {launches} (one per launch)")
    from maxjax.graph.ops.shape import transfer_to

    results: list[list[Any]] = [[] for _ in out_types]
    for launch in range(launches):
        out = body_fn(*(b[launch] for b in bundles))
        outs = [out] if isinstance(out, TensorValue) or hasattr(out, "shape") else list(out)
        if len(outs) != len(out_types):
            raise ValueError(
                f"parallel body yielded {len(outs)} tensor(s), expected {len(out_types)} (one per output bundle)"
            )
        for b, (o, t) in enumerate(zip(outs, out_types)):
            want = t[launch]
            got = o.type if isinstance(o, TensorValue) else TensorType(o.dtype, list(o.shape))
            if got.dtype != want.dtype or got.shape != want.shape:
                raise ValueError(
                    f"parallel: launch {launch} of output bundle {b} is {got}, expected result type {want}"
                )
            if isinstance(o, TensorValue) and o._graph is not None and o.device != want.device:
                o = transfer_to(o, want.device)
            results[b].append(o)
    return results


def constant_external(
    name: str, type: TensorType, align: int | None = None, is_placeholder: bool = False  # noqa: A002 - MAX's name
) -> TensorValue:
    """An external constant (a weight) of the current graph, fed from the weights registry under
    ``name`` (MAX's ``ops.constant_external``; maxjax's :meth:`Graph.add_weight` of a
    :class:`~maxjax.graph.weight.Weight`).

    Two external constants with one name and type are one weight. ``is_placeholder=True`` (in a
    subgraph) makes the name relative: ``ops.call(subgraph, ..., prefix=p)`` reads ``p + name``.

    Raises:
        LookupError: no graph is being built (MAX's: there is no registry to feed it eagerly).
        ValueError: ``name`` is already an external constant of another type (MAX fails when it
            compiles), or ``is_placeholder`` outside a subgraph.
    """
    from maxjax.graph.graph import _GraphWeight
    from maxjax.graph.weight import Weight

    graph = Graph.current
    key = name
    entry = graph._weights.get(key)
    if entry is not None and entry.node is not None:
        have = TensorType(entry.dtype, entry.shape, entry.node.device)
        if have != type or entry.placeholder != bool(is_placeholder):
            raise ValueError(
                f"constant_external: {name!r} is already an external constant of type {have} "
                f"(placeholder={entry.placeholder}) in graph {graph.name!r}, not {type} "
                f"(placeholder={bool(is_placeholder)})"
            )
        return TensorValue._from_node(graph, entry.node)
    weight = Weight(name, type.dtype, type.shape, type.device, align=align)
    if not is_placeholder:
        return graph.add_weight(weight)
    if graph._parent is None:
        raise ValueError(
            f"constant_external({name!r}, is_placeholder=True): a placeholder is resolved by ops.call's prefix, so it "
            f"belongs in a subgraph; graph {graph.name!r} is not one"
        )
    entry = _GraphWeight(key, weight, placeholder=True)
    entry.node = graph._add_node(Node("weight", "weight", [weight._aval], device=weight.device, extra=entry))
    graph._weights[key] = entry
    return TensorValue._from_node(graph, entry.node)
