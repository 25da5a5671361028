"""``ops.allreduce``: MAX's allreduce collectives over per-device values (``allreduce.sum``).

MAX runs a program written per device (one value per device, one op per device) and joins the
values with collectives. maxjax records those programs as they are: a collective is one op whose
results are the group's reduction, one per input (each on its input's device), so the per-device
program gives MAX's numbers. The signal buffers MAX's GPU kernels synchronise with have no role
on JAX: they are checked (one per input, as MAX requires) and not read.
"""

from __future__ import annotations

import builtins
from typing import Any, Iterable

import jax

from maxjax.graph.ops._core import apply
from maxjax.graph.ops.shape import transfer_to
from maxjax.graph.value import TensorValue

__all__ = ["sum", "as_values", "check_devices", "check_group", "check_signals"]


def as_values(inputs: Iterable[Any]) -> list[Any]:
    """The inputs as TensorValues (concrete arrays wrapped: their devices are where they live)."""
    return [x if isinstance(x, TensorValue) else TensorValue(x) for x in inputs]


def check_signals(inputs: list[Any], signal_buffers: Iterable[Any]) -> None:
    """MAX's first check: one signal buffer per input.

    Raises:
        ValueError: the counts differ.
    """
    n = len(list(signal_buffers))
    if len(inputs) != n:
        raise ValueError(f"expected number of inputs ({len(inputs)}) and number of signal buffers ({n}) to match")


def check_group(op: str, inputs: list[Any], group_size: int | None) -> int:
    """MAX's checks of a collective's group size; returns it (all inputs by default).

    Raises:
        ValueError: a group size that is not at least 1 or does not divide the number of inputs.
    """
    num_devices = len(inputs)
    group_size = group_size or num_devices
    if group_size < 1:
        raise ValueError(f"{op} operation requires group_size to be at least 1. Got: group_size={group_size}")
    if num_devices % group_size != 0:
        raise ValueError(
            f"{op} operation requires group_size to evenly divide the number of input tensors. Got: "
            f"group_size={group_size} and num_devices={num_devices}"
        )
    return group_size


def check_devices(op: str, inputs: list[Any]) -> None:
    """MAX's check that every input is on a device of its own.

    Raises:
        ValueError: two inputs on one device.
    """
    if any(isinstance(x._array, jax.core.Tracer) for x in inputs):
        return  # traced by jax.jit (functional mode): values have no device until XLA places them
    devices = [x.device for x in inputs]
    if len(set(devices)) < len(devices):
        raise ValueError(f"{op} operation must have unique devices across its input tensors. Got: devices={devices}")


def _sum_of(*xs: Any) -> Any:
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def sum(inputs: Iterable[Any], signal_buffers: Iterable[Any], group_size: int | None = None) -> list[Any]:  # noqa: A001 - MAX's name
    """Each input replaced by the sum of its group's inputs, on its own device (MAX's
    ``ops.allreduce.sum``; groups are ``group_size`` consecutive inputs, all of them by default).

    Raises:
        ValueError: MAX's checks, in MAX's order: one signal buffer per input, the group size,
            the same shape within each group, unique devices.
    """
    inputs = as_values(inputs)
    check_signals(inputs, signal_buffers)
    group_size = check_group("allreduce.sum", inputs, group_size)
    for start in builtins.range(0, len(inputs), group_size):
        group = inputs[start : start + group_size]
        if not all(x.shape == group[0].shape for x in group[1:]):
            raise ValueError(
                f"allreduce.sum operation must have the same shape across all input tensors in each group. Got: inputs={inputs}"
            )
    check_devices("allreduce.sum", inputs)
    out = []
    for start in builtins.range(0, len(inputs), group_size):
        group = inputs[start : start + group_size]
        here = group[0].device  # eagerly the values meet on one device; in a program XLA places them
        total = apply(_sum_of, *(transfer_to(x, here) for x in group), _name="allreduce.sum")
        out.extend(transfer_to(total, x.device) for x in group)
    return out
