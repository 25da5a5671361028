"""Reductions and sorting (MAX semantics: a reduction keeps the reduced axis with size 1)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply, check_axis, dtype_of
from maxjax.graph.ops.elementwise import max_elementwise, min_elementwise

def _axis(op: str, x: Any, axis: int) -> int:
    """MAX's reduction axis check (``ValueError``, as MAX 26.7's ``Invalid axis``)."""
    return check_axis(op, axis, len(x.shape), error=ValueError)


__all__ = ["sum", "mean", "prod", "max", "min", "argmax", "argmin", "top_k", "bottom_k", "argsort", "cumsum"]


def _reducer(name: str, f: Any) -> Any:
    def kernel(x: Any, *, axis: int) -> Any:
        # MAX keeps the input's dtype (a bool or int8 sum is a bool or int8; JAX widens them)
        return f(x, axis=axis, keepdims=True).astype(x.dtype)

    kernel.__name__ = name

    def op(x: Any, axis: int = -1) -> Any:
        _axis(name, x, axis)
        return apply(kernel, x, _name=name, axis=axis)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"``{name}`` over ``axis``; the axis is kept with size 1 (MAX semantics).\n\nRaises:\n"
        "    ValueError: ``axis`` out of range (MAX's type for it)."
    )
    return op


sum = _reducer("sum", jnp.sum)
def _mean(x: Any, *, axis: int, keepdims: bool) -> Any:
    # MAX keeps the input dtype: an integer mean truncates toward zero (MAX: mean([1, 2, 2, 2]) is
    # 1, of the negated values -1); a bool mean is True where any value is
    if x.dtype == jnp.bool_:
        return jnp.any(x, axis=axis, keepdims=keepdims)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.mean(x, axis=axis, keepdims=keepdims, dtype=x.dtype)
    return jnp.mean(x, axis=axis, keepdims=keepdims)


_mean.__name__ = "mean"
mean = _reducer("mean", _mean)
prod = _reducer("prod", jnp.prod)
def _reduce_max(x: Any, axis: int, keepdims: bool) -> Any:
    # lax's reduction: an empty axis gives the identity (-inf, the dtype's minimum) instead of
    # jnp.max's error, so graphs with 0-size dims build (MAX builds them)
    return jnp.expand_dims(jax.lax.reduce_max(x, (axis % x.ndim,)), axis)


def _reduce_min(x: Any, axis: int, keepdims: bool) -> Any:
    return jnp.expand_dims(jax.lax.reduce_min(x, (axis % x.ndim,)), axis)


_reduce_max.__name__, _reduce_min.__name__ = "max", "min"
_max = _reducer("max", _reduce_max)
_min = _reducer("min", _reduce_min)


def _empty_axis(x: Any, axis: int) -> bool:
    n = x.shape[axis]
    return isinstance(n, int) and n == 0


def _arg_index(x: Any, axis: int) -> Any:
    # the index of an empty axis: 0 (MAX leaves it undefined; JAX refuses to trace it)
    shape = list(x.shape)
    shape[axis] = 1
    return jnp.zeros(shape, jax.dtypes.canonicalize_dtype(jnp.int_))


def _argmax(x: Any, *, axis: int) -> Any:
    if _empty_axis(x, axis):
        return _arg_index(x, axis)
    return jnp.argmax(x, axis=axis, keepdims=True)


def _argmin(x: Any, *, axis: int) -> Any:
    if _empty_axis(x, axis):
        return _arg_index(x, axis)
    return jnp.argmin(x, axis=axis, keepdims=True)


def max(x: Any, y: Any = None, /, axis: int | None = None) -> Any:
    """With ``y``: elementwise maximum (MAX's promotion). Without: the maximum over ``axis``
    (default -1), kept as size 1.

    Raises:
        ValueError: both ``y`` and ``axis`` given, or ``axis`` out of range.
    """
    if y is not None:
        if axis is not None:
            raise ValueError(f"max: axis not allowed for elementwise max (got y and axis={axis})")
        return max_elementwise(x, y)
    return _max(x, -1 if axis is None else axis)


def min(x: Any, y: Any = None, /, axis: int | None = None) -> Any:
    """With ``y``: elementwise minimum (MAX's promotion). Without: the minimum over ``axis``
    (default -1), kept as size 1.

    Raises:
        ValueError: both ``y`` and ``axis`` given, or ``axis`` out of range.
    """
    if y is not None:
        if axis is not None:
            raise ValueError(f"min: axis not allowed for elementwise min (got y and axis={axis})")
        return min_elementwise(x, y)
    return _min(x, -1 if axis is None else axis)


def argmax(x: Any, axis: int = -1) -> Any:
    """Index of the maximum along ``axis`` (kept with size 1; first index on ties); int64 as MAX
    (held as int32 without x64). Raises ValueError for ``axis`` out of range."""
    _axis("argmax", x, axis)
    return apply(_argmax, x, _name="argmax", _dtypes=[DType.int64], axis=axis)


def argmin(x: Any, axis: int = -1) -> Any:
    """Index of the minimum along ``axis`` (kept with size 1; first index on ties); int64 as MAX
    (held as int32 without x64). Raises ValueError for ``axis`` out of range."""
    _axis("argmin", x, axis)
    return apply(_argmin, x, _name="argmin", _dtypes=[DType.int64], axis=axis)


def _top_k(x: Any, *, k: int, axis: int) -> Any:
    moved = jnp.moveaxis(x, axis, -1)
    v, i = jax.lax.top_k(moved, k)
    return jnp.moveaxis(v, -1, axis), jnp.moveaxis(i, -1, axis)


def top_k(input: Any, k: int, axis: int = -1) -> tuple[Any, Any]:
    """The ``k`` largest values along ``axis`` and their (int64, as MAX) indices, largest first.

    Raises:
        ValueError: ``axis`` out of range, or ``k`` negative or more than the static size of the axis.
    """
    r = len(input.shape)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -r <= axis < r:
        raise ValueError(f"top_k: axis ({axis}) out of bounds for rank {r} (expected in [{-r}, {r}))")  # MAX's words
    a = int(axis) % r
    n = input.shape[a]
    if int(k) < 0:
        raise ValueError(f"top_k: k ({k}) must be non-negative")
    if hasattr(n, "__index__") and int(k) > int(n):
        raise ValueError(
            f"top_k: k ({k}) cannot be larger than dimension size along axis {a} ({int(n)}) of {list(input.shape)}"
        )
    dt = dtype_of(input)
    return apply(_top_k, input, _name="top_k", _dtypes=None if dt is None else [dt, DType.int64], k=int(k), axis=axis)


def bottom_k(input: Any, k: int, axis: int = -1) -> tuple[Any, Any]:
    """The ``k`` smallest values along ``axis`` and their indices, smallest first."""
    from maxjax.graph.ops.elementwise import negate

    v, i = top_k(negate(input), k, axis)
    return negate(v), i


def _argsort(x: Any, *, ascending: bool) -> Any:
    return jnp.argsort(x, axis=-1, stable=True, descending=not ascending)


def argsort(x: Any, ascending: bool = True) -> Any:
    """Indices (int64, as MAX) that sort a 1-D tensor (stable).

    Raises:
        ValueError: ``x`` is not 1-D (MAX 26.7 implements rank 1 only).
    """
    if len(x.shape) != 1:
        raise ValueError(f"argsort only implemented for input tensors of rank 1, got shape {list(x.shape)}")
    return apply(_argsort, x, _name="argsort", _dtypes=[DType.int64], ascending=ascending)


def _cumsum(x: Any, *, axis: int, exclusive: bool, reverse: bool) -> Any:
    dtype = x.dtype  # MAX keeps it (a bool cumsum is a bool: a running "any")
    if dtype == jnp.bool_:
        x = x.astype(jnp.int32)
    if reverse:
        x = jnp.flip(x, axis)
    out = jnp.cumsum(x, axis=axis, dtype=x.dtype)
    if exclusive:
        out = out - x
    return (jnp.flip(out, axis) if reverse else out).astype(dtype)


def cumsum(x: Any, axis: int = -1, exclusive: bool = False, reverse: bool = False) -> Any:
    """Cumulative sum along ``axis`` (``exclusive`` leaves out the element itself).

    Raises:
        ValueError: ``axis`` out of range.
    """
    _axis("cumsum", x, axis)
    return apply(_cumsum, x, _name="cumsum", axis=axis, exclusive=exclusive, reverse=reverse)
