"""The one dispatch every op goes through.

An op is one jnp function ``fn(*tensors, **static)``. :func:`apply` looks at what it is given:

- a symbolic :class:`TensorValue` among the tensors (or a Weight inside an active graph): graph mode.
  The op is recorded as a node of that graph; its output shape and dtype come from
  ``jax.eval_shape`` on the inputs' abstract values (symbolic dims included).
- otherwise: the jnp function runs at once on the arrays (or tracers). The result is wrapped in
  TensorValues when any input was one, and returned as plain JAX arrays when all inputs were plain
  arrays, so ``ops.silu(jnp_array)`` is an ordinary jnp call. Ops with no tensor inputs
  (``constant``, ``range``) give TensorValues.

``static`` holds non-tensor arguments (axes, shapes, dtypes). Dims in it become JAX symbolic
expressions for shape inference and concrete ints when the graph runs.

Two attributes of an op function change how it is called (set them with :func:`op_traits`):

- ``accepts_quantized``: the op takes :class:`~maxjax.graph.quantization.QuantizedArray` values
  (``qmatmul``, ``dequantize``, ``gather`` of rows) and calls their methods. Any other op that
  is given a quantized weight reads its raw GGUF bytes, as in MAX; in a graph that weight is then
  pinned to the packed layout (``Graph._packed_only``).
- ``accepts_layer_indexed``: inside a scanned layer whose weights are kept per layer, the op
  takes a :class:`~maxjax.graph.layer_weights.LayerIndexed` weight (the matmul of ``Linear``) and
  runs on the indexed layer in place; any other op gets the layer's array.
- ``uses_policy``: the op takes a ``policy=`` keyword, the
  :class:`~maxjax.backend.BackendPolicy` of the program being traced (the default backend's when
  it runs eagerly or infers shapes).
- ``stored_rhs``: the op's second tensor is a weight it multiplies as stored (``x @ w.T`` of
  ``Linear``). A graph records how each weight is used (``Graph._weight_uses``: ``"stored_rhs"``
  for this use, ``"other"`` for any other), so that a program may hold a weight used only so in a
  backend's own layout (the AMX kernel's tiles, :mod:`maxjax.backend.kernels.amx`).
"""

from __future__ import annotations

from typing import Any, Callable

import functools

import jax
import numpy as np

from maxjax.backend import policy_for
from maxjax.driver import Buffer
from maxjax.graph.graph import Graph, Node, current_graph
from maxjax.graph.quantization import QuantizedArray
from maxjax.graph.type import Dim, Shape
from maxjax.graph.value import TensorValue

__all__ = [
    "apply", "assert_valid_axis", "check_axis", "check_same_device", "concretize", "dtype_of", "is_quantized", "op_traits", "static_exprs",
    "static_ints",
]  # fmt: skip


def op_traits(
    *, accepts_quantized: bool = False, uses_policy: bool = False, accepts_layer_indexed: bool = False, stored_rhs: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator marking an op function's traits (see the module docstring)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.stored_rhs = stored_rhs  # type: ignore[attr-defined]
        fn.accepts_quantized = accepts_quantized  # type: ignore[attr-defined]
        fn.uses_policy = uses_policy  # type: ignore[attr-defined]
        fn.accepts_layer_indexed = accepts_layer_indexed  # type: ignore[attr-defined]
        return fn

    return mark


def is_quantized(x: Any) -> bool:
    """True for a :class:`QuantizedArray` (a leaf of op outputs, never flattened)."""
    return isinstance(x, QuantizedArray)


def _raw_bytes(x: Any, op: str) -> Any:
    if isinstance(x, QuantizedArray):
        try:
            return x.packed_bytes()
        except ValueError as e:
            raise ValueError(f"{op}: {e}") from None
    return x


def _reading_bytes(fn: Callable[..., Any], op: str) -> Callable[..., Any]:
    """``fn`` with quantized arguments replaced by their raw GGUF bytes (ops not quantization-aware)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return fn(*(_raw_bytes(a, op) for a in args), **kwargs)

    return run


def _quantized_source(t: TensorValue) -> str | None:
    node = t._node
    if node is None:
        return None
    if node.kind == "weight":
        return node.extra.key
    return node.qsource


def _map_static(obj: Any, f: Callable[[Dim], Any]) -> Any:
    if isinstance(obj, Dim):
        return f(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_static(o, f) for o in obj) if not isinstance(obj, Shape) else tuple(f(d) for d in obj)
    if isinstance(obj, slice):
        return slice(_map_static(obj.start, f), _map_static(obj.stop, f), _map_static(obj.step, f))
    if isinstance(obj, dict):
        return {k: _map_static(v, f) for k, v in obj.items()}
    return obj


def static_exprs(obj: Any) -> Any:
    """Dims in ``obj`` as JAX ints / symbolic expressions (for shape inference)."""
    return _map_static(obj, lambda d: d.to_expr())


def _to_int(d: Dim) -> int:
    e = d.to_expr()
    if not isinstance(e, int):
        raise ValueError(f"symbolic dimension {d} has no size outside a graph")
    return e


def static_ints(obj: Any) -> Any:
    """Dims in ``obj`` as concrete ints (outside a graph only static dims are allowed)."""
    return _map_static(obj, _to_int)


def concretize(obj: Any, env: dict[str, int]) -> Any:
    """Dims in ``obj`` evaluated with the symbol sizes ``env`` (when a graph runs)."""
    return _map_static(obj, lambda d: d.evaluate(env))


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, Buffer))


def _describe(x: Any) -> str:
    if isinstance(x, TensorValue) or hasattr(x, "shape"):
        try:
            from maxjax.dtype import DType

            return f"{DType.of(x.dtype).name}[{', '.join(str(d) for d in x.shape)}]"
        except Exception:
            pass
    return repr(x)


try:
    from jax._src.core import InconclusiveDimensionOperation as _Inconclusive
except ImportError:  # pragma: no cover - older/newer JAX layouts
    _Inconclusive = ValueError


def const_value(graph: Graph, value: Any, dtype: Any = None) -> TensorValue:
    """A constant node of ``graph`` holding an array; its declared dtype is ``dtype`` or the array's
    own (an int64 NumPy array is an int64 constant, held as int32 when JAX has no x64)."""
    from maxjax.dtype import DType

    if isinstance(value, Buffer):
        value = value.to_jax()
    aval = jax.ShapeDtypeStruct(np.shape(value), jax.dtypes.canonicalize_dtype(value.dtype))
    if dtype is None:
        try:
            dtype = DType.from_numpy(value.dtype)
        except ValueError:
            dtype = None
    node = graph._add_node(Node("const", "constant", [aval], extra=value, dtypes=None if dtype is None else [dtype]))
    return TensorValue._from_node(graph, node)


def dtype_of(x: Any) -> Any:
    """MAX's dtype of a tensor argument: a TensorValue's declared dtype (``int64`` even where JAX
    holds 32 bits), an array's own dtype; None for anything else (Python scalars)."""
    from maxjax.dtype import DType

    if isinstance(x, TensorValue):
        return x.dtype
    dt = getattr(x, "dtype", None)
    if dt is None:
        return None
    try:
        return DType.of(dt)
    except ValueError:
        return None


def check_axis(op: str, axis: int, rank: int, *, error: type = IndexError, extra: int = 0, what: str = "axis") -> int:
    """``axis`` (negative counts from the end) as a non-negative index into ``rank + extra`` dims.

    Raises:
        error: (IndexError unless told) ``axis`` outside ``[-(rank+extra), rank+extra)``, naming
            the op, the axis and the range.
    """
    n = rank + extra
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: {what} must be an int, got {axis!r}")
    if not -n <= axis < n:
        name = "" if what == "axis" else f"{what} "  # MAX's wording (max/graph/ops/utils.py)
        raise error(
            f"{op}: Axis {name}out of range (expected to be in range of [{-n}, {n - 1}], but got {axis}) "
            f"for rank {rank}"
        )
    return int(axis) % n if n else 0


def assert_valid_axis(op: str, axis: int, rank: int) -> int:
    """MAX's ``assert_valid_axis`` (max/graph/ops/validation.py, used by split and chunk):
    ``axis`` as a non-negative index.

    Raises:
        IndexError: ``axis`` outside ``[-rank, rank)`` ("Axis must be in range [-r, r), got a").
    """
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -rank <= axis < rank:
        raise IndexError(f"{op}: Axis must be in range [-{rank}, {rank}), got {axis}")
    return int(axis) % rank


def check_same_device(op: str, *values: Any, **named_values: Any) -> None:
    """MAX's rule (``assert_same_device``, max/graph/ops/validation.py): the graph values given to
    one op live on one device. Arrays carry no DeviceRef and are not checked.

    Raises:
        ValueError: two graph values on different devices, listing each one's name (its position
            for ``values``) and type, in MAX's words.
    """
    named = {**{str(i): v for i, v in enumerate(values)}, **named_values}
    tvs = {k: v for k, v in named.items() if isinstance(v, TensorValue) and v._graph is not None}
    if len({v.device for v in tvs.values()}) > 1:
        lines = "\n".join(f"    {k}: {v.type}" for k, v in tvs.items())
        raise ValueError(f"{op}: Input values must be on the same device\n{lines}")


def _declared_dtypes(leaves: list[Any], ins: list[Any]) -> list[Any]:
    """MAX's dtypes of an op's outputs when the op does not declare them: the declared dtype of the
    first input that JAX holds in the output's dtype (so ``int64`` stays ``int64`` through ops that
    keep their input's dtype, and ``gather`` of an int32 table by int64 indices stays int32), else
    the output's own dtype."""
    from maxjax.dtype import DType

    out = []
    for leaf in leaves:
        try:
            own = DType.from_numpy(leaf.dtype)
        except (ValueError, AttributeError, TypeError):
            out.append(None)
            continue
        held = np.dtype(leaf.dtype)
        out.append(next((d for d in ins if d is not None and np.dtype(d.to_jax()) == held), own))
    return out


def apply(
    fn: Callable[..., Any], *tensors: Any, _name: str | None = None, _dtypes: Any = None, **static: Any
) -> Any:
    """Runs or records the op ``fn`` on ``tensors`` (see the module docstring).

    ``_dtypes`` (one DType per output) declares MAX's output dtypes where they are wider than what
    JAX holds (``int64`` indices, ``float64`` quotients); by default an output keeps the 64-bit
    dtype of an input JAX holds in its 32 bits.

    Raises:
        ValueError: values of two different graphs are mixed, a graph value is used inside another
            graph, or shape/dtype inference fails (the message names the op and its input types).
    """
    from maxjax.graph.weight import Weight

    name = _name or getattr(fn, "__name__", "op")
    graph: Graph | None = None
    has_tv = False
    for t in tensors:
        if isinstance(t, TensorValue):
            has_tv = True
            g = t._graph
            if g is not None and graph is not g:
                if graph is not None:
                    raise ValueError(f"{name}: inputs belong to two graphs ({graph.name!r} and {g.name!r})")
                graph = g
    if graph is not None:
        cur = current_graph()
        if cur is not None and cur is not graph:
            raise ValueError(
                f"{name}: a value of graph {graph.name!r} is used while building graph {cur.name!r} "
                "(a value defined outside the region); pass it to the subgraph as an input instead"
            )
    if graph is None and not has_tv:
        graph = current_graph()  # constants and creation ops inside `with Graph(...)`
    if has_tv:
        vals = []
        for t in tensors:
            if isinstance(t, Weight):
                t = t._resolve(graph)
                if graph is None and isinstance(t, TensorValue) and t._graph is not None:
                    graph = t._graph
            vals.append(t)
    else:
        vals = list(tensors)

    aware = getattr(fn, "accepts_quantized", False)
    kwargs = {"policy": policy_for(None)} if getattr(fn, "uses_policy", False) else {}
    if graph is None:
        arrays = [t.to_jax() if isinstance(t, (TensorValue, Buffer)) else t for t in vals]
        if not aware:
            arrays = [_raw_bytes(a, name) for a in arrays]
        out = fn(*arrays, **static_ints(static), **kwargs)
        if has_tv or not tensors:  # creation ops (no tensor inputs) give TensorValues too
            return jax.tree.map(TensorValue._from_array, out, is_leaf=is_quantized)
        return out

    # graph mode: record a node
    node_args: list[Any] = []
    avals: list[Any] = []
    sources: list[str] = []  # weights whose quantized values this op receives
    stored_rhs = getattr(fn, "stored_rhs", False)
    for i, t in enumerate(vals):
        if isinstance(t, TensorValue):
            if t._graph is None:  # a concrete value used in a graph: a constant
                t = const_value(graph, t.to_jax())
            if t._node is not None and t._node.kind == "weight":
                graph._weight_uses.setdefault(t._node.extra.key, set()).add("stored_rhs" if stored_rhs and i == 1 else "other")
            if isinstance(t._aval, QuantizedArray):
                src = _quantized_source(t)
                if src is not None:
                    sources.append(src)
            node_args.append(t)
            avals.append(t._aval)
        elif _is_array(t):
            c = const_value(graph, t)
            node_args.append(c)
            avals.append(c._aval)
        else:
            node_args.append(t)
    has_quantized = any(isinstance(a, QuantizedArray) for a in avals)
    if has_quantized and not aware:  # the op reads the raw GGUF bytes: keep those weights packed
        graph._packed_only.update(sources)
        fn = _reading_bytes(fn, name)
    exprs = static_exprs(static) if static else {}

    def shape_fn(*avs: Any) -> Any:
        it = iter(avs)
        full = [next(it) if isinstance(a, TensorValue) else a for a in node_args]
        return fn(*full, **exprs, **kwargs)

    try:
        out = jax.eval_shape(shape_fn, *avals)
    except (TypeError, ValueError, IndexError, _Inconclusive) as e:
        ins = ", ".join(_describe(a) for a in node_args)
        raise ValueError(f"{name}({ins}) failed: {e}") from None
    leaves, treedef = jax.tree.flatten(out, is_leaf=is_quantized)
    is_leaf = treedef.num_leaves == 1 and treedef.num_nodes == 1
    device = next((a.device for a in node_args if isinstance(a, TensorValue)), None)
    if _dtypes is None:
        declared = _declared_dtypes(leaves, [a.dtype for a in node_args if isinstance(a, TensorValue)])
        declared = None if any(d is None for d in declared) else declared
    else:
        declared = list(_dtypes)
    node = graph._add_node(
        Node(
            "op",
            name,
            leaves,
            fn=fn,
            args=tuple(node_args),
            static=static,
            treedef=None if is_leaf else treedef,
            device=device,
            dtypes=declared,
        )
    )
    if aware and sources and any(isinstance(leaf, QuantizedArray) for leaf in leaves):
        node.qsource = sources[0]  # rows taken from a quantized weight
    outs = [TensorValue._from_node(graph, node, i) for i in range(len(leaves))]
    return outs[0] if is_leaf else jax.tree.unflatten(treedef, outs)
