"""``Signals`` and ``Allreduce``: MAX's communication helpers for per-device programs
(``max.nn.comm.allreduce``).

MAX's GPU collective kernels synchronise through signal buffers, one per device, passed to the
graph as buffer inputs (read in a graph as ``graph.inputs[i].buffer``). JAX needs none: maxjax's
``Signals`` gives the same graph inputs and buffers (a few bytes each, never read or written) so a
MAX program runs unchanged, and the collectives check their count and devices as MAX does. Unlike
MAX's, it accepts CPU devices (a per-device program then runs on host devices).

MAX's signal inputs are ``BufferType``s. maxjax's are :class:`SignalBufferType`, a ``TensorType``
whose graph input also answers ``.buffer`` (with itself): a maxjax ``BufferType`` input is
returned by the program as a hidden output, which would make every program read the per-device
signal buffers (committed to different devices, which one jitted program refuses); a tensor input
that nothing reads is dropped by ``jax.jit``.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.type import DeviceRef, TensorType
from maxjax.nn.layer import Module

__all__ = ["Allreduce", "SignalBufferType", "Signals"]


class SignalBufferType(TensorType):
    """The graph input type of one signal buffer (see the module docstring): a ``TensorType``
    whose graph input's ``.buffer`` is the input itself."""

    __slots__ = ()

    #: read by :attr:`maxjax.graph.value.TensorValue.buffer`
    is_signal_buffer = True


class Signals:
    """Signal buffers of a per-device program (MAX's ``max.nn.Signals``).

    Args:
        devices: the devices the program runs on (``DeviceRef`` objects or devices).
    """

    #: bytes of one signal buffer (MAX's hold its allreduce scratch space; maxjax's hold nothing)
    NUM_BYTES = 16

    def __init__(self, devices: Iterable[Any]) -> None:
        self.devices: list[DeviceRef] = [DeviceRef.from_device(d) for d in devices]

    def input_types(self) -> list[SignalBufferType]:
        """One uint8 ``[NUM_BYTES]`` graph input per device (:class:`SignalBufferType`; MAX's are
        ``BufferType``s: see the module docstring)."""
        return [SignalBufferType(DType.uint8, [self.NUM_BYTES], d) for d in self.devices]

    def buffers(self) -> list[Buffer]:
        """The buffers to pass for :meth:`input_types`, zero-filled, one on each device."""
        return [Buffer(DType.uint8, [self.NUM_BYTES], d.to_device()) for d in self.devices]


class Allreduce(Module):
    """Sums per-device values across devices (MAX's ``max.nn.Allreduce``): ``__call__(inputs,
    signal_buffers)`` is :func:`maxjax.graph.ops.allreduce.sum`."""

    def __init__(self, num_accelerators: int) -> None:
        super().__init__()
        self.num_accelerators = num_accelerators

    def __call__(self, inputs: Sequence[Any], signal_buffers: Sequence[Any]) -> list[Any]:
        return ops.allreduce.sum(inputs, signal_buffers)
