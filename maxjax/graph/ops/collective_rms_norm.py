"""MAX's collectives fused with an RMSNorm: ``ops.allgather_rms_norm`` and
``ops.reduce_scatter_rms_norm`` (bfloat16 in and out), and ``ops.bundled_allreduce.sum``'s
numbers (see :mod:`maxjax.graph.ops.bundled_allreduce`).

MAX fuses the collective and the norm into one GPU launch; maxjax composes the same two steps
(:func:`~maxjax.graph.ops.allgather` / :func:`~maxjax.graph.ops.reducescatter.sum`'s ragged parts,
and :func:`~maxjax.graph.ops.rms_norm`'s jnp function with ``multiply_before_cast=True``), which
is what MAX documents the fused kernels to compute. The reduce-scatter's sum stays in float32 up
to the norm, as MAX's kernel keeps it in float32 registers. Source: MAX 26.7
``max/graph/ops/allgather_rms_norm.py`` and ``reduce_scatter_rms_norm.py``.
"""

from __future__ import annotations

import builtins
from typing import Any, Iterable

import jax
import jax.numpy as jnp

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply
from maxjax.graph.ops.allreduce import as_values, check_devices
from maxjax.graph.ops.nn import _rms_norm, rms_norm
from maxjax.graph.ops.reducescatter import _part
from maxjax.graph.ops.shape import allgather, transfer_to

__all__ = ["allgather_rms_norm", "reduce_scatter_rms_norm"]


def _check(op: str, what: str, inputs: list[Any], signal_buffers: Iterable[Any], gammas: list[Any],
           group_size: int | None) -> int:
    """MAX's checks shared by both ops, in MAX's order; returns the group size."""
    n = len(inputs)
    if n < 2:
        raise ValueError(
            f"{op} requires at least two inputs (one per device); the {what} is a no-op otherwise. Got: {n}"
        )
    num_signals = len(list(signal_buffers))
    if num_signals != n:
        raise ValueError(f"expected number of inputs ({n}) and number of signal buffers ({num_signals}) to match")
    if len(gammas) != n:
        raise ValueError(f"expected number of inputs ({n}) and number of gammas ({len(gammas)}) to match")
    if inputs[0].dtype != DType.bfloat16:
        raise ValueError(f"{op} is bfloat16-only (the kernel and fuse threshold assume it). Got: {inputs[0].dtype}")
    if not all(t.dtype == inputs[0].dtype for t in inputs[1:]):
        raise ValueError(f"{op} requires the same dtype across all input tensors. Got: inputs={inputs}")
    if not all(t.rank == inputs[0].rank for t in inputs[1:]):
        raise ValueError(f"{op} requires the same rank across all input tensors. Got: inputs={inputs}")
    return group_size or n


def _check_group_size(op: str, what: str, n: int, group_size: int) -> None:
    if group_size < 2:
        raise ValueError(
            f"{op} requires group_size to be at least 2 (the {what} is a no-op otherwise). Got: group_size={group_size}"
        )
    if n % group_size != 0:
        raise ValueError(
            f"{op} requires group_size to evenly divide the number of input tensors. Got: group_size={group_size} and "
            f"num_devices={n}"
        )


def _traced(*values: Any) -> bool:
    """Traced by jax.jit (functional mode): values have no device until XLA places them."""
    return any(isinstance(v._array, jax.core.Tracer) for v in values)


def _check_unique(op: str, inputs: list[Any]) -> None:
    try:
        check_devices(op, inputs)
    except ValueError:
        devices = [x.device for x in inputs]
        raise ValueError(f"{op} requires unique devices across its input tensors. Got: devices={devices}") from None


def allgather_rms_norm(
    inputs: Iterable[Any],
    signal_buffers: Iterable[Any],
    gammas: Iterable[Any],
    epsilon: float,
    weight_offset: float = 0.0,
    group_size: int | None = None,
) -> tuple[list[Any], list[Any]]:
    """All-gather of row shards along axis 0, then an RMSNorm of every gathered row (MAX's
    ``ops.allgather_rms_norm``): ``rms_norm(gathered, gamma_i + weight_offset, epsilon)`` with the
    weight applied in float32 before the cast to bfloat16 (``multiply_before_cast=True``).

    Args:
        inputs: one bfloat16 ``[rows_i, cols]`` shard per device (rows may differ).
        signal_buffers: one per input (MAX's synchronisation buffers; not read).
        gammas: one ``[cols]`` RMSNorm weight per device.
        epsilon: the norm's epsilon.
        weight_offset: added to gamma in float32 (1.0 for Gemma-style norms).
        group_size: devices per independent group (all by default).

    Returns:
        ``(normed, residual)``: per device, the norm of its group's gathered ``[sum(rows_i), cols]``
        tensor, and that gathered tensor.

    Raises:
        ValueError: MAX's checks, in MAX's order: fewer than two inputs, signal buffers or gammas
            not one per input, not bfloat16, different dtypes or ranks, not rank 2, a group size
            under 2 or not dividing the inputs, shapes differing off axis 0, repeated devices.
    """
    op = "allgather_rms_norm"
    inputs, gammas = as_values(inputs), as_values(gammas)
    signal_buffers = list(signal_buffers)
    group_size = _check(op, "all-gather", inputs, signal_buffers, gammas, group_size)
    if inputs[0].rank != 2:
        raise ValueError(
            f"{op} is 2D-only ([rows, cols]); the fused kernel indexes rows and cols directly. "
            f"Got rank: {inputs[0].rank}"
        )
    _check_group_size(op, "all-gather", len(inputs), group_size)
    if any(t.shape[1] != inputs[0].shape[1] for t in inputs[1:]):
        raise ValueError(
            f"{op} requires the same shape in all dimensions except axis 0 (rows) across every input shard, including "
            f"across groups. Got: inputs={inputs}"
        )
    _check_unique(op, inputs)
    residual = allgather(inputs, signal_buffers, axis=0, group_size=group_size)  # [sum of the group's rows, cols]
    normed = [rms_norm(r, g, epsilon, weight_offset, multiply_before_cast=True) for r, g in zip(residual, gammas)]
    return normed, residual


def _sum_f32(*xs: Any) -> Any:
    out = xs[0].astype(jnp.float32)
    for x in xs[1:]:
        out = out + x.astype(jnp.float32)
    return out


def _shard_norm(total: Any, gamma: Any, *residual: Any, rank: int, group_size: int, epsilon: float,
                weight_offset: float) -> Any:
    """One device's ``(normed, residual)`` of the float32 group sum ``total`` [rows, cols]."""
    s = _part(total, axis=0, rank=rank, group_size=group_size)  # [shard rows, cols] float32
    if residual:
        s = s + _part(residual[0], axis=0, rank=rank, group_size=group_size).astype(jnp.float32)
    normed = _rms_norm(s, gamma, epsilon=epsilon, weight_offset=weight_offset, multiply_before_cast=True)
    return normed.astype(jnp.bfloat16), s.astype(jnp.bfloat16)


def reduce_scatter_rms_norm(
    inputs: Iterable[Any],
    signal_buffers: Iterable[Any],
    gammas: Iterable[Any],
    epsilon: float,
    residuals: Iterable[Any] | None = None,
    weight_offset: float = 0.0,
    group_size: int | None = None,
) -> tuple[list[Any], list[Any]]:
    """Reduce-scatter along axis 0 (the ragged parts of :func:`~maxjax.graph.ops.reducescatter.sum`),
    plus each device's rows of ``residuals`` when given, then an RMSNorm of each device's rows
    (MAX's ``ops.reduce_scatter_rms_norm``; the sum stays float32 until the bfloat16 outputs).

    Args:
        inputs: one bfloat16 ``[rows, cols]`` tensor per device (one shape per group).
        signal_buffers: one per input (MAX's synchronisation buffers; not read).
        gammas: one ``[cols]`` RMSNorm weight per device.
        epsilon: the norm's epsilon.
        residuals: optional, one per device, the inputs' shape, dtype and devices; replicated
            (device ``i`` adds its own rows of ``residuals[i]``).
        weight_offset: added to gamma in float32 (1.0 for Gemma-style norms).
        group_size: devices per independent group (all by default).

    Returns:
        ``(normed, residual)``: per device, the norm of its rows and its rows of the sum (plus
        the residual), bfloat16 ``[(rows + group_size - r - 1) // group_size, cols]`` for local rank ``r``.

    Raises:
        ValueError: MAX's checks, in MAX's order: fewer than two inputs, signal buffers, gammas or
            residuals not one per input, not bfloat16, different dtypes or ranks, a group size
            under 2 or not dividing the inputs, shapes differing within a group or off axis 0, a
            residual of another shape, dtype or device than its input, repeated devices.
    """
    op = "reduce_scatter_rms_norm"
    inputs, gammas = as_values(inputs), as_values(gammas)
    signal_buffers = list(signal_buffers)
    res = None if residuals is None else as_values(residuals)
    n = len(inputs)
    if n >= 2 and len(signal_buffers) == n and len(gammas) == n and res is not None and len(res) != n:
        raise ValueError(f"expected number of inputs ({n}) and number of residuals ({len(res)}) to match")
    group_size = _check(op, "reduce-scatter", inputs, signal_buffers, gammas, group_size)
    _check_group_size(op, "reduce-scatter", n, group_size)
    for start in builtins.range(0, n, group_size):
        group = inputs[start : start + group_size]
        if not all(t.shape == group[0].shape for t in group[1:]):
            raise ValueError(
                f"{op} requires the same shape across all input tensors in each group. Got: inputs={inputs}"
            )
    if any(list(t.shape)[1:] != list(inputs[0].shape)[1:] for t in inputs[1:]):
        raise ValueError(
            f"{op} requires the same shape in all dimensions except axis 0 (rows) across every input tensor, including "
            f"across groups. Got: inputs={inputs}"
        )
    for i, (x, r) in enumerate(zip(inputs, res or [])):
        if r.shape != x.shape or r.dtype != x.dtype:
            raise ValueError(
                f"{op} requires each residual to match its input's shape and dtype on device {i}. Got residual "
                f"{r.shape}/{r.dtype} vs input {x.shape}/{x.dtype}"
            )
        if not _traced(r, x) and r.device != x.device:
            raise ValueError(
                f"{op} requires each residual to live on its input's device. Got {r.device} vs {x.device}"
            )
    _check_unique(op, inputs)
    normed, residual = [], []
    for start in builtins.range(0, n, group_size):
        group = inputs[start : start + group_size]
        here = group[0].device  # eagerly the values meet on one device; in a program XLA places them
        total = apply(_sum_f32, *(transfer_to(x, here) for x in group), _name=op)  # [rows, cols] float32
        for r, i in enumerate(builtins.range(start, start + group_size)):
            extra = () if res is None else (res[i],)
            nd, rs = apply(
                _shard_norm, transfer_to(total, inputs[i].device), gammas[i], *extra, _name=op, rank=r,
                group_size=group_size, epsilon=float(epsilon), weight_offset=float(weight_offset),
            )
            normed.append(nd)
            residual.append(rs)
    return normed, residual
