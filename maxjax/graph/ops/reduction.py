"""Reductions and sorting (MAX semantics: a reduction keeps the reduced axis with size 1)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxjax.graph.ops._core import apply
from maxjax.graph.ops.elementwise import max_elementwise, min_elementwise

__all__ = ["sum", "mean", "prod", "max", "min", "argmax", "argmin", "top_k", "bottom_k", "argsort", "cumsum"]


def _reducer(name: str, f: Any) -> Any:
    def kernel(x: Any, *, axis: int) -> Any:
        return f(x, axis=axis, keepdims=True)

    kernel.__name__ = name

    def op(x: Any, axis: int = -1) -> Any:
        return apply(kernel, x, _name=name, axis=axis)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``{name}`` over ``axis``; the axis is kept with size 1 (MAX semantics)."
    return op


sum = _reducer("sum", jnp.sum)
mean = _reducer("mean", jnp.mean)
prod = _reducer("prod", jnp.prod)
_max = _reducer("max", jnp.max)
_min = _reducer("min", jnp.min)


def _argmax(x: Any, *, axis: int) -> Any:
    return jnp.argmax(x, axis=axis, keepdims=True)


def _argmin(x: Any, *, axis: int) -> Any:
    return jnp.argmin(x, axis=axis, keepdims=True)


def max(x: Any, y: Any = None, /, axis: int | None = None) -> Any:
    """With ``y``: elementwise maximum. Without: the maximum over ``axis`` (default -1), kept as size 1."""
    if y is not None:
        return max_elementwise(x, y)
    return _max(x, -1 if axis is None else axis)


def min(x: Any, y: Any = None, /, axis: int | None = None) -> Any:
    """With ``y``: elementwise minimum. Without: the minimum over ``axis`` (default -1), kept as size 1."""
    if y is not None:
        return min_elementwise(x, y)
    return _min(x, -1 if axis is None else axis)


def argmax(x: Any, axis: int = -1) -> Any:
    """Index of the maximum along ``axis`` (kept with size 1; first index on ties)."""
    return apply(_argmax, x, _name="argmax", axis=axis)


def argmin(x: Any, axis: int = -1) -> Any:
    """Index of the minimum along ``axis`` (kept with size 1; first index on ties)."""
    return apply(_argmin, x, _name="argmin", axis=axis)


def _top_k(x: Any, *, k: int, axis: int) -> Any:
    moved = jnp.moveaxis(x, axis, -1)
    v, i = jax.lax.top_k(moved, k)
    return jnp.moveaxis(v, -1, axis), jnp.moveaxis(i, -1, axis)


def top_k(input: Any, k: int, axis: int = -1) -> tuple[Any, Any]:
    """The ``k`` largest values along ``axis`` and their indices, largest first."""
    return apply(_top_k, input, _name="top_k", k=int(k), axis=axis)


def bottom_k(input: Any, k: int, axis: int = -1) -> tuple[Any, Any]:
    """The ``k`` smallest values along ``axis`` and their indices, smallest first."""
    from maxjax.graph.ops.elementwise import negate

    v, i = top_k(negate(input), k, axis)
    return negate(v), i


def _argsort(x: Any, *, ascending: bool) -> Any:
    return jnp.argsort(x if ascending else -x, axis=-1, stable=True)


def argsort(x: Any, ascending: bool = True) -> Any:
    """Indices that sort the last axis (stable)."""
    return apply(_argsort, x, _name="argsort", ascending=ascending)


def _cumsum(x: Any, *, axis: int, exclusive: bool, reverse: bool) -> Any:
    if reverse:
        x = jnp.flip(x, axis)
    out = jnp.cumsum(x, axis=axis)
    if exclusive:
        out = out - x
    return jnp.flip(out, axis) if reverse else out


def cumsum(x: Any, axis: int = -1, exclusive: bool = False, reverse: bool = False) -> Any:
    """Cumulative sum along ``axis`` (``exclusive`` leaves out the element itself)."""
    return apply(_cumsum, x, _name="cumsum", axis=axis, exclusive=exclusive, reverse=reverse)
