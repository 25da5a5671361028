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

__all__ = ["Allreduce", "MulticastPool", "SignalBufferType", "Signals"]


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


class MulticastPool:
    """The symmetric multicast pool of MAX's NVSwitch (NVLS) allreduce (MAX's ``MulticastPool``).

    MAX sizes it with :meth:`capacity_bytes` and allocates it with :meth:`allocate`, which returns
    ``None`` wherever multicast is unavailable, and its allreduce then runs peer to peer. maxjax
    has no multicast memory (XLA moves the values), so :meth:`allocate` always takes MAX's
    fallback and returns ``None``; the sizing is MAX's.
    """

    #: MAX: no allreduce kernel reads the pool yet
    ENABLED = False
    #: NVSwitch multicast pays from four ranks
    MIN_DEVICES = 4
    #: above this the pool costs more memory than the collective saves
    MAX_BYTES = 512 * 1024 * 1024
    #: allreduce operands are bfloat16 activations
    _ACTIVATION_BYTES = 2

    @staticmethod
    def capacity_bytes(num_devices: int, num_tokens: int, hidden_size: int) -> int:
        """Usable per-device pool bytes, ``num_tokens * hidden_size * 2`` (a bfloat16
        ``[num_tokens, hidden_size]`` allreduce operand), or 0: fewer than :attr:`MIN_DEVICES`
        devices, no tokens or hidden size, or more than :attr:`MAX_BYTES`."""
        if num_devices < MulticastPool.MIN_DEVICES or num_tokens <= 0 or hidden_size <= 0:
            return 0
        payload = num_tokens * hidden_size * MulticastPool._ACTIVATION_BYTES
        return 0 if payload > MulticastPool.MAX_BYTES else payload

    @staticmethod
    def allocate(devices: Sequence[Any], byte_size: int) -> None:
        """MAX's fallback result ``None`` (no multicast memory on maxjax; see the class docstring)."""
        return None
