"""MAX's random ops (``max.graph.ops.random``) on ``jax.random``.

A graph's seed is set once with :func:`set_seed` (a Python int, or a ``uint64`` ``[]``/``[1]``
tensor such as a :func:`SeedType` graph input, so each execution may take its own seed); each
random op takes the current seed and rotates it (``seed + 1``, as MAX does), so two ops in one
graph draw different numbers. The numbers come from JAX's threefry generator keyed by the seed:
the same seed gives the same numbers on maxjax, but not MAX's numbers (MAX uses its own
generator); shapes, dtypes, errors and distributions are MAX's.

The seed is per graph (kept in a weak map keyed by the graph, as MAX does). maxjax holds
``uint64`` in 32 bits (README, "MAX's graph rules"): seeds equal modulo 2**32 give equal numbers.
"""

from __future__ import annotations

import weakref
from collections.abc import MutableMapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.graph import Graph, current_graph
from maxjax.graph.ops._core import apply
from maxjax.graph.ops.shape import _shape, cast, reshape
from maxjax.graph.type import DeviceRef, TensorType
from maxjax.graph.value import TensorValue

__all__ = ["SeedType", "assert_scalar", "gaussian", "normal", "set_seed", "uniform"]

SEEDS: MutableMapping[Graph, TensorValue] = weakref.WeakKeyDictionary()


def SeedType(device: DeviceRef) -> TensorType:  # noqa: N802 - MAX's name
    """Graph-input tensor type for an RNG seed: rank-1 ``[1]`` ``uint64`` on ``device``."""
    return TensorType(DType.uint64, [1], device=device)


def assert_scalar(value: Any) -> None:
    """Raises :class:`ValueError` if value is not a scalar (has non-empty ``shape``)."""
    if isinstance(value, (np.ndarray, TensorValue)) and tuple(value.shape):
        raise ValueError("Expected a scalar value")


def _peek_seed() -> TensorValue:
    graph = current_graph()
    if graph is None or graph not in SEEDS:
        raise RuntimeError("No seed set! Set with `ops.random.set_seed`.")
    return SEEDS[graph]


def _next_seed_for(device: DeviceRef) -> TensorValue:
    seed = _peek_seed()
    SEEDS[current_graph()] = seed + 1  # MAX's rotation: the next op draws from seed + 1
    if seed.device != device:
        seed = seed.to(device)
    return seed


def _normalize_seed(seed: Any) -> TensorValue:
    from maxjax.graph.dtype_promotion import _promote_to_strong

    if isinstance(seed, int):
        seed = _promote_to_strong(seed, DType.uint64, DeviceRef.CPU())
    seed_tv = seed if isinstance(seed, TensorValue) else TensorValue(seed)
    if seed_tv.dtype != DType.uint64:
        seed_tv = cast(seed_tv, DType.uint64)
    if seed_tv.rank == 0:
        seed_tv = reshape(seed_tv, [1])
    if list(seed_tv.shape) != [1]:
        raise ValueError(f"Seed must be a scalar or rank-1 tensor with shape [1], got shape {seed_tv.shape}.")
    return seed_tv


def set_seed(seed: Any = 0) -> None:
    """Sets the seed for random numbers generated in the current graph.

    Call this once per graph. Subsequent random ops rotate from this seed.
    For per-execution seeds, pass a :func:`SeedType` graph input.

    Args:
        seed: A Python int in ``[0, 2**64)``, a rank-0 ``uint64`` scalar TensorValue, or a
            rank-1 ``[1]`` ``uint64`` TensorValue (another dtype is cast to ``uint64``).

    Raises:
        ValueError: an int outside ``[0, 2**64)`` ("Unsafe cast"), or a tensor seed whose shape is
            neither ``[]`` nor ``[1]``.
        RuntimeError: no graph is being built.
    """
    graph = current_graph()
    if graph is None:
        raise RuntimeError("ops.random.set_seed: no graph is being built (MAX's random ops are graph ops)")
    SEEDS[graph] = _normalize_seed(seed)


def _key(seed: Any) -> Any:
    # seed: uint64[1] (held in 32 bits) -> a threefry key
    return jax.random.key(jnp.reshape(seed, ()).astype(jnp.uint32))


def _gaussian(seed: Any, mean: Any, std: Any, *, shape: Any, dtype: Any, integral: bool) -> Any:
    z = jax.random.normal(_key(seed), shape, jnp.float32) * std + mean  # [*shape] float32
    if integral:
        z = jnp.round(z)
    return z.astype(dtype)


def _uniform(seed: Any, lower: Any, upper: Any, *, shape: Any, dtype: Any, integral: bool) -> Any:
    if integral:
        return jax.random.randint(_key(seed), shape, lower, upper, dtype)
    u = jax.random.uniform(_key(seed), shape, jnp.float32)  # [*shape] in [0, 1)
    lo, hi = lower.astype(jnp.float32), upper.astype(jnp.float32)
    return (lo + (hi - lo) * u).astype(dtype)


def gaussian(like: TensorType, mean: Any = 0, std: Any = 1) -> TensorValue:
    """Samples from a Gaussian (normal) distribution with the given mean and standard deviation
    (Box-Muller/inverse-CDF draws of ``jax.random.normal`` in float32, then ``* std + mean``;
    integer dtypes round to the nearest integer, as MAX does).

    A seed must be set on the current graph with :func:`set_seed`.

    Args:
        like: the TensorType (shape, dtype, device) of the result.
        mean: the mean; a scalar (float32).
        std: the standard deviation; a scalar (float32).

    Returns:
        A TensorValue of ``like``'s type.

    Raises:
        RuntimeError: no seed has been set with :func:`set_seed`.
        ValueError: ``mean`` or ``std`` is not a scalar.
    """
    return _sample(_gaussian, "random.gaussian", like, mean, std, DType.float32)


normal = gaussian


def uniform(like: TensorType, range: tuple[Any, Any] = (0, 1)) -> TensorValue:  # noqa: A002 - MAX's name
    """Samples uniformly from the half-open interval ``[lower, upper)`` (``jax.random.uniform``
    in float32 scaled to the range, or ``jax.random.randint`` for integer dtypes).

    A seed must be set on the current graph with :func:`set_seed`.

    Args:
        like: the TensorType (shape, dtype, device) of the result.
        range: ``(lower, upper)``, scalars promoted to ``like.dtype``.

    Returns:
        A TensorValue of ``like``'s type.

    Raises:
        RuntimeError: no seed has been set with :func:`set_seed`.
        ValueError: a bound is not a scalar, or does not fit ``like.dtype`` ("Unsafe cast").
    """
    lower, upper = range
    return _sample(_uniform, "random.uniform", like, lower, upper, like.dtype)


def _sample(kernel: Any, name: str, like: TensorType, a: Any, b: Any, param_dtype: DType) -> TensorValue:
    """One random op: its two scalar parameters checked and promoted to ``param_dtype``, the
    graph's next seed, ``kernel(seed, a, b)`` of ``like``'s type, recorded on ``like``'s device."""
    from maxjax.graph.dtype_promotion import _promote_to_strong

    assert_scalar(a)
    assert_scalar(b)
    seed = _next_seed_for(like.device)
    a = _promote_to_strong(a, param_dtype, DeviceRef.CPU())
    b = _promote_to_strong(b, param_dtype, DeviceRef.CPU())
    out = apply(
        kernel, seed, a, b, _name=name, _dtypes=[like.dtype],
        shape=_shape(like.shape), dtype=like.dtype.to_jax(), integral=not like.dtype.is_float(),
    )  # fmt: skip
    if isinstance(out, TensorValue) and out._node is not None:
        out._node.device = like.device  # the value lives on ``like``'s device (as transfer_to records it)
    return out
