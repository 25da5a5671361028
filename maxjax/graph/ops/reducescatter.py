"""``ops.reducescatter``: MAX's reduce-scatter collective over per-device values (``reducescatter.sum``).

As :mod:`maxjax.graph.ops.allreduce`: one value per device in, one per device out; the signal
buffers MAX's GPU kernels synchronise with are checked (one per input) and not read.
"""

from __future__ import annotations

import builtins
from typing import Any, Iterable

from jax import lax

from maxjax.graph.ops._core import apply
from maxjax.graph.ops.allreduce import _sum_of, as_values, check_devices, check_signals
from maxjax.graph.ops.shape import transfer_to

__all__ = ["sum"]


def _part(x: Any, *, axis: int, rank: int, group_size: int) -> Any:
    """Rank ``rank``'s part of ``x`` along ``axis`` in MAX's ragged binning: ``n = x.shape[axis]``
    rows cut in ``group_size`` consecutive parts of ``(n + group_size - r - 1) // group_size`` rows
    (the first ``n % group_size`` parts one row longer)."""
    n = x.shape[axis]
    start = builtins.sum(((n + group_size - q - 1) // group_size for q in builtins.range(rank)), 0)
    size = (n + group_size - rank - 1) // group_size
    return lax.slice_in_dim(x, start, start + size, axis=axis)  # [..., size, ...]


def sum(  # noqa: A001 - MAX's name
    inputs: Iterable[Any], signal_buffers: Iterable[Any], axis: int = 0, group_size: int | None = None
) -> list[Any]:
    """Reduce-scatter: the inputs of each group (``group_size`` consecutive inputs, all by default)
    are summed, and the sum is cut along ``axis`` into one consecutive part per device of the
    group, on that device (MAX's ``ops.reducescatter.sum``). A group member of local rank ``r``
    gets ``(d + group_size - r - 1) // group_size`` rows of the ``d`` along ``axis``: the first
    ``d % group_size`` ranks get ``ceil(d / group_size)``, the rest ``floor``.

    Args:
        inputs: one tensor per device, all of one dtype and rank; one shape within a group.
        signal_buffers: one per input (MAX's synchronisation buffers; not read).
        axis: the axis to scatter along (negative counts from the end).
        group_size: devices per independent group (divides the number of inputs).

    Returns:
        One tensor per input, on its device: the input's shape with ``axis`` cut as above.

    Raises:
        ValueError: MAX's checks, in MAX's order: one signal buffer per input, at least one
            input, the group size (at least 1, dividing the inputs), one dtype, one rank, one
            shape per group, unique devices, ``axis`` in range.
    """
    inputs = as_values(inputs)
    check_signals(inputs, signal_buffers)
    num_devices = len(inputs)
    if num_devices == 0:
        raise ValueError("reducescatter.sum operation requires at least one input")
    group_size = group_size or num_devices
    if group_size < 1:
        raise ValueError(
            f"reducescatter.sum operation requires group_size to be at least 1. Got: group_size={group_size}"
        )
    if num_devices % group_size != 0:
        raise ValueError(
            "reducescatter.sum operation requires group_size to evenly divide the number of input tensors. Got: "
            f"group_size={group_size} and num_devices={num_devices}"
        )
    if not all(x.dtype == inputs[0].dtype for x in inputs[1:]):
        raise ValueError(
            f"reducescatter.sum operation must have the same dtype across all input tensors. Got: inputs={inputs}"
        )
    rank = inputs[0].rank
    if not all(x.rank == rank for x in inputs[1:]):
        raise ValueError(
            f"reducescatter.sum operation must have the same rank across all input tensors. Got: inputs={inputs}"
        )
    for start in builtins.range(0, num_devices, group_size):
        group = inputs[start : start + group_size]
        if not all(x.shape == group[0].shape for x in group[1:]):
            raise ValueError(
                "reducescatter.sum operation must have the same shape across all input tensors in each group. Got: "
                f"inputs={inputs}"
            )
    check_devices("reducescatter.sum", inputs)
    if axis < 0:
        axis += rank
    if axis < 0 or axis >= rank:
        raise ValueError(f"axis {axis} is out of bounds for tensor with rank {rank}")
    out = []
    for start in builtins.range(0, num_devices, group_size):
        group = inputs[start : start + group_size]
        here = group[0].device  # eagerly the values meet on one device; in a program XLA places them
        total = apply(_sum_of, *(transfer_to(x, here) for x in group), _name="reducescatter.sum")
        for r, x in enumerate(group):
            part = apply(_part, total, _name="reducescatter.sum", axis=axis, rank=r, group_size=group_size)
            out.append(transfer_to(part, x.device))
    return out
