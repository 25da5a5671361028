"""MAX's scatter family (``max.graph.ops.scatter*``, ``masked_scatter``, ``nonzero``), each one
``jnp`` function over JAX's ``.at[...]`` updates.

Two kinds of index, as in MAX 26.7 (``max/graph/ops/scatter.py``):

- along an axis (``scatter``, ``scatter_add``/``max``/``min``/``mul``; PyTorch's ``scatter`` and
  ONNX's ``ScatterElements``): ``input``, ``updates`` and ``indices`` have one rank,
  ``updates.shape == indices.shape``, and element ``i`` of ``updates`` goes to ``input`` at ``i``
  with its ``axis`` coordinate replaced by ``indices[i]``;
- N-dimensional (``scatter_nd*``; TensorFlow's ``scatter_nd_update``, ONNX's ``ScatterND``): the
  last axis of ``indices`` (``[*Q, k]``) holds index vectors into the first ``k`` axes of
  ``input``, and ``updates`` has shape ``[*Q, *input.shape[k:]]``.

Negative indices count from the end of their axis (as MAX's kernels do: measured with MAX 26.7).
Indices still out of range after that are dropped (JAX's ``mode="drop"``; MAX leaves them
undefined). Where several updates hit one element, ``add``/``mul``/``max``/``min`` combine them all;
plain ``scatter`` keeps one of them (which one is unspecified, in MAX as in XLA).

Checks made when the op is recorded (MAX's exception types and messages): ``axis`` in range, the
dtypes of ``input`` and ``updates`` equal, ``indices`` int32 or int64, graph values on one device
(``ValueError``). MAX checks the shape rules later, when it compiles the graph; maxjax checks them
at once (``ValueError`` naming the shapes) so the error points at the op.

Under ``jax.jit`` with ``input`` donated (or carried through a loop) XLA updates it in place.
"""

from __future__ import annotations

import builtins
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply, check_same_device
from maxjax.graph.type import Dim, StaticDim
from maxjax.graph.value import TensorValue

__all__ = [
    "masked_scatter", "nonzero", "scatter", "scatter_add", "scatter_max", "scatter_min", "scatter_mul",
    "scatter_nd", "scatter_nd_add", "scatter_nd_max", "scatter_nd_min", "scatter_nd_mul",
]  # fmt: skip

_INDEX_DTYPES = (DType.int32, DType.int64)


# -- build-time checks ---------------------------------------------------------------------------
def _tensor(x: Any, op: str, name: str) -> Any:
    """``x`` if it is a tensor (TensorValue, Weight, JAX or NumPy array), else MAX's TypeError."""
    if isinstance(x, TensorValue) or (hasattr(x, "dtype") and hasattr(x, "shape")):
        return x
    raise TypeError(
        f"{op}: {name} must be a tensor, got {type(x).__name__} {x!r} (TensorValue() can not be created directly "
        "from it: use ops.constant to convert it with a specific dtype)"
    )


def _tensors(op: str, input: Any, updates: Any, indices: Any) -> tuple[Any, Any, Any]:
    return _tensor(input, op, "input"), _tensor(updates, op, "updates"), _tensor(indices, op, "indices")


def _dtype(x: Any) -> DType:
    return x.dtype if isinstance(x, TensorValue) else DType.of(x.dtype)


def _shape(x: Any) -> list[Dim]:
    return [Dim(d) if isinstance(d, (Dim, str)) else Dim.from_expr(d) for d in x.shape]


def _fmt(shape: list[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _check_indices_dtype(indices: Any) -> None:
    dt = _dtype(indices)
    if dt not in _INDEX_DTYPES:
        raise ValueError(f"Invalid indices dtype: '{dt}'. Indices must be of type int32 or int64.")


def _check_axis_op(op: str, input: Any, updates: Any, indices: Any, axis: int) -> None:
    """MAX's checks of ``scatter``/``scatter_add``/... then its (compile-time) shape rules."""
    input, updates, indices = _tensors(op, input, updates, indices)
    rank = len(input.shape)
    if not (-rank <= axis < rank):
        raise ValueError(f"Invalid axis value {axis}. Axis must be in range [-{rank}, {rank - 1}]")
    if _dtype(input) != _dtype(updates):
        raise ValueError(f"The input dtype '{_dtype(input)}' and updates dtype '{_dtype(updates)}' must match.")
    _check_indices_dtype(indices)
    check_same_device(op, input=input, updates=updates, indices=indices)
    s_in, s_up, s_ix = _shape(input), _shape(updates), _shape(indices)
    if not (len(s_in) == len(s_up) == len(s_ix)):
        raise ValueError(
            f"{op}: input, updates and indices must have equal rank, got input {_fmt(s_in)}, updates {_fmt(s_up)} "
            f"and indices {_fmt(s_ix)}"
        )
    if any(isinstance(a, StaticDim) and isinstance(b, StaticDim) and a != b for a, b in zip(s_up, s_ix)):
        raise ValueError(f"{op}: updates shape {_fmt(s_up)} must equal indices shape {_fmt(s_ix)}")
    for d, (a, b) in enumerate(zip(s_ix, s_in)):
        if d != axis % rank and isinstance(a, StaticDim) and isinstance(b, StaticDim) and int(a) > int(b):
            raise ValueError(
                f"{op}: indices dimension {d} ({a}) exceeds the input's ({b}); indices {_fmt(s_ix)}, input {_fmt(s_in)}"
            )


def _check_nd_op(op: str, input: Any, updates: Any, indices: Any) -> None:
    """MAX's checks of ``scatter_nd``/``scatter_nd_add``/... then its (compile-time) shape rules."""
    input, updates, indices = _tensors(op, input, updates, indices)
    if _dtype(input) != _dtype(updates):
        raise ValueError(f"The input dtype ({_dtype(input)}) and updates dtype ({_dtype(updates)}) must match")
    _check_indices_dtype(indices)
    check_same_device(op, input=input, updates=updates, indices=indices)
    s_in, s_up, s_ix = _shape(input), _shape(updates), _shape(indices)
    if not s_ix or not isinstance(s_ix[-1], StaticDim) or int(s_ix[-1]) > len(s_in):
        raise ValueError(
            f"{op}: indices must have shape [*Q, k] with a static k <= input rank {len(s_in)}, got indices {_fmt(s_ix)}"
        )
    k = int(s_ix[-1])
    want = s_ix[:-1] + s_in[k:]
    if len(want) != len(s_up) or any(
        isinstance(a, StaticDim) and isinstance(b, StaticDim) and a != b for a, b in zip(want, s_up)
    ):
        raise ValueError(
            f"{op}: updates must have shape indices.shape[:-1] + input.shape[{k}:] = {_fmt(want)}, got {_fmt(s_up)} "
            f"(input {_fmt(s_in)}, indices {_fmt(s_ix)})"
        )


# -- the jnp functions ---------------------------------------------------------------------------
def _scatter_axis(x: Any, updates: Any, idx: Any, *, axis: int, reduce: str) -> Any:
    """``x`` [*S] with ``updates`` [*I] written along ``axis`` at ``idx`` [*I] (``reduce``: an
    ``.at[]`` method: set, add, max, min, mul)."""
    x = jnp.asarray(x)
    grid = jnp.indices(idx.shape, sparse=True)  # one broadcastable arange per axis of I
    where = tuple(idx if d == axis % x.ndim else grid[d] for d in builtins.range(x.ndim))
    return getattr(x.at[where], reduce)(updates, mode="drop")


def _scatter_nd(x: Any, updates: Any, idx: Any, *, reduce: str = "set") -> Any:
    """``x`` [*S] with ``updates`` [*Q, *S[k:]] written at the index vectors ``idx`` [*Q, k]."""
    k = idx.shape[-1]
    x = jnp.asarray(x)
    return getattr(x.at[tuple(idx[..., i] for i in builtins.range(k))], reduce)(updates, mode="drop")


def _axis_op(name: str, reduce: str, combine: str) -> Any:
    def op(input: Any, updates: Any, indices: Any, axis: int = -1) -> Any:
        _check_axis_op(name, input, updates, indices, axis)
        return apply(_scatter_axis, input, updates, indices, _name=name, axis=axis, reduce=reduce)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"""``input`` with ``updates`` {combine} along ``axis`` at ``indices`` (MAX's ``ops.{name}``).

    For 2-D ``input`` and ``axis=0``:
    ``out[indices[i][j]][j] = {_FORMULA[reduce].format(a="out[indices[i][j]][j]", b="updates[i][j]")}``.

    Args:
        input: the tensor written into, any shape ``[*S]``.
        updates: the values, shape ``[*I]`` of the same rank, dtype of ``input``.
        indices: int32 or int64, shape ``[*I]`` (``I[d] <= S[d]`` for ``d != axis``); negative
            indices count from the end of ``axis``.
        axis: the axis ``indices`` index (``-rank <= axis < rank``).

    Returns:
        A tensor of ``input``'s shape and dtype.

    Raises:
        ValueError: ``axis`` out of range, dtypes of ``input`` and ``updates`` differ, ``indices``
            not int32/int64, graph values on different devices, ranks differ, or
            ``updates.shape != indices.shape``, or an ``indices`` dim exceeds ``input``'s.
        TypeError: an argument is not a tensor.
    """
    return op


def _nd_op(name: str, reduce: str, combine: str) -> Any:
    def op(input: Any, updates: Any, indices: Any) -> Any:
        _check_nd_op(name, input, updates, indices)
        return apply(_scatter_nd, input, updates, indices, _name=name, reduce=reduce)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"""``input`` with slices of ``updates`` {combine} at N-D ``indices`` (MAX's ``ops.{name}``).

    ``out[indices[q]] = {_FORMULA[reduce].format(a="out[indices[q]]", b="updates[q]")}`` for every
    batch position ``q``; the index vector ``indices[q]`` (length ``k``) selects an element or a
    slice of the trailing ``rank - k`` axes.

    Args:
        input: the tensor written into, shape ``[*S]``.
        updates: shape ``[*Q, *S[k:]]``, dtype of ``input``.
        indices: int32 or int64, shape ``[*Q, k]`` with ``k <= rank`` static; negative entries
            count from the end of their axis.

    Returns:
        A tensor of ``input``'s shape and dtype.

    Raises:
        ValueError: dtypes of ``input`` and ``updates`` differ, ``indices`` not int32/int64,
            graph values on different devices, or shapes that break the rule above.
        TypeError: an argument is not a tensor.
    """
    return op


_FORMULA = {
    "set": "{b}",
    "add": "{a} + {b}",
    "max": "max({a}, {b})",
    "min": "min({a}, {b})",
    "mul": "{a} * {b}",
}

scatter = _axis_op("scatter", "set", "written")
scatter_add = _axis_op("scatter_add", "add", "added (duplicates accumulate)")
scatter_max = _axis_op("scatter_max", "max", "combined by maximum")
scatter_min = _axis_op("scatter_min", "min", "combined by minimum")
scatter_mul = _axis_op("scatter_mul", "mul", "multiplied in (duplicates accumulate)")
scatter_nd = _nd_op("scatter_nd", "set", "written")
scatter_nd_add = _nd_op("scatter_nd_add", "add", "added (duplicates accumulate)")
scatter_nd_max = _nd_op("scatter_nd_max", "max", "combined by maximum")
scatter_nd_min = _nd_op("scatter_nd_min", "min", "combined by minimum")
scatter_nd_mul = _nd_op("scatter_nd_mul", "mul", "multiplied in (duplicates accumulate)")


# -- nonzero -------------------------------------------------------------------------------------
def _nonzero(x: Any, *, size: Any, dtype: Any) -> Any:
    rows = jnp.nonzero(x, size=size, fill_value=0)  # rank arrays of [size]
    return jnp.stack(rows, axis=-1).astype(dtype)  # [size, rank]


def nonzero(x: Any, out_dim: Any) -> Any:
    """The multi-indices of the nonzero elements of ``x``, in row-major order (MAX's ``ops.nonzero``).

    ``out_dim`` is the number of rows. MAX makes a name (``"nz"``) a new data-dependent dim; a
    compiled JAX program (a graph, ``jax.jit``) needs static shapes, so there it must be an int,
    and then, as in MAX 26.7 (measured), the result holds the first ``out_dim`` indices, with
    zero rows after the last nonzero element. Eagerly, on concrete arrays, a name gives exactly
    as many rows as there are nonzero elements.

    Args:
        x: any dtype, rank >= 1.
        out_dim: an int (static row count) or a dim name (eagerly only).

    Returns:
        int64 (int32 unless JAX's x64 is on) of shape ``[out_dim, rank]``.

    Raises:
        ValueError: ``x`` is a scalar (MAX's message).
        NotImplementedError: a named ``out_dim`` in a graph or under a JAX trace.
    """
    from maxjax.graph.graph import current_graph

    _tensor(x, "nonzero", "x")
    if len(x.shape) == 0:
        raise ValueError("Scalar inputs not supported")
    dtype = DType.int64.to_jax()
    if isinstance(out_dim, (int, np.integer, StaticDim)) and not isinstance(out_dim, bool):
        return apply(_nonzero, x, _name="nonzero", size=int(out_dim), dtype=dtype)
    graph = x._graph if isinstance(x, TensorValue) and x._graph is not None else current_graph()
    array = x.to_jax() if isinstance(x, TensorValue) and graph is None else x
    if graph is not None or isinstance(array, jax.core.Tracer):
        raise NotImplementedError(
            f"nonzero: out_dim={out_dim!r} is a data-dependent size; a compiled JAX program (a graph, jax.jit) needs "
            "static shapes: pass an int out_dim (the first out_dim nonzero indices, zero rows after the last one, "
            "as MAX gives for a static out_dim)"
        )
    return apply(_nonzero, x, _name="nonzero", size=None, dtype=dtype)


# -- masked_scatter ------------------------------------------------------------------------------
def _masked_scatter(x: Any, mask: Any, updates: Any, *, limit: Any) -> Any:
    x, mask, updates = jnp.asarray(x), jnp.asarray(mask), jnp.asarray(updates)
    keep = jnp.broadcast_to(mask != 0 if mask.dtype != jnp.bool_ else mask, x.shape).reshape(-1)  # [N]
    flat = updates.reshape(-1)  # [U]
    pos = jnp.cumsum(keep, dtype=jnp.int32) - 1  # [N]: which update a True position takes
    write = keep & (pos < flat.shape[0])
    if limit is not None:
        write = write & (pos < limit)
    vals = jnp.take(flat, pos, mode="clip")  # [N]
    return jnp.where(write, vals, x.reshape(-1)).reshape(x.shape)


def masked_scatter(input: Any, mask: Any, updates: Any, out_dim: Any) -> Any:
    """``input`` with the elements of ``updates`` written, in row-major order, where ``mask`` is
    true (MAX's ``ops.masked_scatter``; PyTorch's ``masked_scatter``).

    The ``k``-th true position (row-major) takes ``updates.flatten()[k]``. MAX computes
    ``nonzero(mask, out_dim)`` and ``scatter_nd``; maxjax computes the same positions with a
    cumulative sum, which needs no data-dependent shape, so a dim name for ``out_dim`` works in
    graphs and under ``jax.jit``. An int ``out_dim`` writes only the first ``out_dim`` true
    positions (as MAX does when there are at least that many).

    Args:
        input: the tensor written into.
        mask: any dtype (nonzero means true), broadcast to ``input``'s shape.
        updates: ``input``'s dtype, any shape; at least as many elements as true positions.
        out_dim: the number of true positions: a dim name, or an int.

    Returns:
        A tensor of ``input``'s shape and dtype.

    Raises:
        ValueError: the dtypes of ``input`` and ``updates`` differ, graph values on different
            devices, or ``mask`` does not broadcast to ``input``.
        TypeError: ``mask`` or another argument is not a tensor (MAX refuses Python lists).
    """
    for v, n in ((input, "input"), (mask, "mask"), (updates, "updates")):
        _tensor(v, "masked_scatter", n)
    if _dtype(input) != _dtype(updates):
        raise ValueError(f"The input dtype ({_dtype(input)}) and updates dtype ({_dtype(updates)}) must match")
    check_same_device("masked_scatter", input=input, updates=updates)
    s_in, s_m = _shape(input), _shape(mask)
    ok = len(s_m) <= len(s_in) and all(
        not (isinstance(a, StaticDim) and isinstance(b, StaticDim)) or a == b or int(a) == 1
        for a, b in zip(reversed(s_m), reversed(s_in))
    )
    if not ok:
        raise ValueError(
            f"masked_scatter: mask of shape {_fmt(s_m)} does not broadcast to the input's shape {_fmt(s_in)}"
        )
    static = isinstance(out_dim, (int, np.integer, StaticDim)) and not isinstance(out_dim, bool)
    limit = int(out_dim) if static else None
    return apply(_masked_scatter, input, mask, updates, _name="masked_scatter", limit=limit)
