"""MAX's one-to-many distribution ops: ``ops.distributed_broadcast`` and ``ops.distributed_scatter``
(collectives over signal buffers) and ``ops.shard_and_stack`` (host weights cut per device).

As :mod:`maxjax.graph.ops.allreduce`: each output is placed on its device (eagerly it moves at
once; in a compiled program XLA places it), and the signal buffers MAX's GPU kernels synchronise
with give the participating devices and are not read.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from maxjax.graph.ops._core import apply
from maxjax.graph.ops.allreduce import as_values
from maxjax.graph.ops.shape import transfer_to
from maxjax.graph.type import DeviceRef, StaticDim

__all__ = ["distributed_broadcast", "distributed_scatter", "shard_and_stack"]


def _traced(x: Any) -> bool:
    return isinstance(x._array, jax.core.Tracer)


def _buffer_devices(signal_buffers: Iterable[Any]) -> list[DeviceRef]:
    """The devices of the signal buffers (graph buffers, driver Buffers or arrays)."""
    out = []
    for b in signal_buffers:
        d = getattr(b, "device", None)
        if callable(d):  # a jax.Array's .device is a method in some JAX versions
            d = d()
        out.append(DeviceRef.from_device(d))
    return out


def distributed_broadcast(input: Any, signal_buffers: Iterable[Any]) -> list[Any]:  # noqa: A002 - MAX's name
    """The input copied to every device of ``signal_buffers`` (MAX's ``ops.distributed_broadcast``):
    the root is the input's device, which must be one of them.

    Args:
        input: the tensor to broadcast.
        signal_buffers: one per participating device (MAX's synchronisation buffers; their devices
            are the outputs' devices, in order).

    Returns:
        One tensor per signal buffer, the input's shape and dtype, on that buffer's device.

    Raises:
        ValueError: MAX's checks, in MAX's order: no signal buffer, the input's device not among
            the buffers' devices, two buffers on one device.
    """
    (x,) = as_values([input])
    devices = _buffer_devices(signal_buffers)
    if not devices:
        raise ValueError("distributed_broadcast requires at least 1 signal buffer.")
    if not _traced(x) and x.device not in devices:  # traced by jax.jit: XLA places the value
        raise ValueError(f"input tensor device {x.device} not found in signal buffer devices: {devices}")
    if len(set(devices)) < len(devices):
        raise ValueError(f"distributed_broadcast requires unique devices across signal buffers. Got: devices={devices}")
    return [transfer_to(x, d) for d in devices]


def distributed_scatter(input_chunks: Iterable[Any], signal_buffers: Iterable[Any]) -> list[Any]:
    """One chunk per data-parallel replica, sent from the root device to the replica's devices
    (MAX's ``ops.distributed_scatter``): with ``dp`` chunks and ``n`` signal buffers,
    ``tp = ceil(n / dp)`` consecutive devices form a replica, and device ``i`` gets chunk
    ``min(i // tp, dp - 1)``.

    Args:
        input_chunks: ``dp`` tensors, all on the root device (shapes may differ).
        signal_buffers: one per participating device (the outputs' devices, in order).

    Returns:
        One tensor per signal buffer: its replica's chunk, on that buffer's device.

    Raises:
        ValueError: MAX's checks, in MAX's order: no chunk, chunks on different devices, two
            buffers on one device, the root device not among the buffers' devices.
    """
    chunks = as_values(input_chunks)
    devices = _buffer_devices(signal_buffers)
    dp, n = len(chunks), len(devices)
    if dp < 1:
        raise ValueError(f"distributed_scatter requires at least 1 input chunk. Got: {dp}")
    traced = any(_traced(c) for c in chunks)  # traced by jax.jit: XLA places the values
    root = None if traced else chunks[0].device
    if not traced:
        for i, c in enumerate(chunks):
            if c.device != root:
                raise ValueError(
                    f"All input chunks must be on the same device. Chunk 0 is on {root}, but chunk {i} is on {c.device}"
                )
    if len(set(devices)) < len(devices):
        raise ValueError(f"distributed_scatter requires unique devices across signal buffers. Got: devices={devices}")
    if root is not None and root not in devices:
        raise ValueError(f"input chunk device {root} not found in signal buffer devices: {devices}")
    tp = math.ceil(n / dp)
    return [transfer_to(chunks[min(i // tp, dp - 1)], d) for i, d in enumerate(devices)]


def _shard_and_stack(*xs: Any, axis: int, index: int, num_splits: int) -> Any:
    stacked = jnp.stack(xs)  # [len(xs), *shape]
    chunk = stacked.shape[axis + 1] // num_splits
    return lax.slice_in_dim(stacked, index * chunk, (index + 1) * chunk, axis=axis + 1)  # [len(xs), ..., chunk, ...]


def _types(values: list[Any]) -> str:
    return "\n".join(f"    {i}: {v.type}" for i, v in enumerate(values))


def shard_and_stack(inputs: Sequence[Any], devices: Sequence[Any], axis: int = 0) -> list[Any]:
    """Cuts each host tensor along ``axis`` into ``len(devices)`` equal parts and stacks part ``i``
    of every input on ``devices[i]`` (MAX's ``ops.shard_and_stack``): output ``i`` is
    ``stack([x[..., i*c:(i+1)*c, ...] for x in inputs])``, ``c = shape[axis] // len(devices)``.

    Args:
        inputs: tensors of one shape, dtype and device, on the host (CPU).
        devices: the output devices (``DeviceRef`` or devices); their number is the number of parts.
        axis: the axis to cut (negative counts from the end).

    Returns:
        ``len(devices)`` tensors of shape ``[len(inputs), D0, ..., D_axis // len(devices), ...]``.

    Raises:
        ValueError: MAX's checks, in MAX's order: no input, no device, inputs on different
            devices, of different dtypes or shapes, not on the host, a static ``D_axis`` that
            ``len(devices)`` does not divide.
        IndexError: ``axis`` out of range.
    """
    if not inputs:
        raise ValueError("Must provide at least one input tensor.")
    if not devices:
        raise ValueError("Must provide at least one device.")
    num_splits = len(devices)
    xs = as_values(inputs)
    if not any(_traced(x) for x in xs) and len({x.device for x in xs}) > 1:
        raise ValueError("Input values must be on the same device\n" + _types(xs))
    for i, x in enumerate(xs[1:], 1):
        if x.dtype != xs[0].dtype:
            raise ValueError(
                f"All input tensors must have the same dtype. Input 0 has dtype {xs[0].dtype}, but input {i} has "
                f"dtype {x.dtype}"
            )
    for i, x in enumerate(xs[1:], 1):
        if x.shape != xs[0].shape:
            raise ValueError(
                f"All input tensors must have the same shape. Input 0 has shape {xs[0].shape!r}, but input {i} has "
                f"shape {x.shape!r}"
            )
    rank = xs[0].rank
    if not -rank <= axis < rank:
        raise IndexError(f"Axis must be in range [-{rank}, {rank}), got {axis}")
    if not any(_traced(x) for x in xs) and not xs[0].device.is_cpu():
        raise ValueError("Input value must be on the host device\n" + _types(xs))
    axis %= rank
    dim = xs[0].shape[axis]
    if isinstance(dim, StaticDim) and int(dim) % num_splits != 0:
        raise ValueError(
            f"Dimension size along axis {axis} ({dim}) must be evenly divisible by number of devices ({num_splits})"
        )
    return [
        transfer_to(
            apply(_shard_and_stack, *xs, _name="shard_and_stack", axis=axis, index=i, num_splits=num_splits),
            DeviceRef.from_device(d),
        )
        for i, d in enumerate(devices)
    ]
