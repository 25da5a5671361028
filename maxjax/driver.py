"""``maxjax.driver``: devices and buffers (MAX's ``max.driver``), backed by JAX devices and arrays.

- :class:`Device` wraps one ``jax.Device``; :func:`CPU` and :func:`Accelerator` pick one.
- :class:`Buffer` wraps one ``jax.Array`` (MAX 26.7 renamed ``Tensor`` to ``Buffer``).
- :func:`to_jax_array` / :func:`to_host_array`: the one conversion of any array-like maxjax accepts
  (a ``jax.Array`` or tracer, a NumPy array, a Buffer, a ``WeightData`` or ``TensorValue``, a DLPack
  producer) to a JAX array or a host NumPy array.
"""

from __future__ import annotations

import abc
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType

__all__ = [
    "Device", "CPU", "Accelerator", "accelerator_count", "Buffer", "DLPackArray", "jax_device_of", "load_devices",
    "to_host_array",
    "to_jax_array",
]  # fmt: skip


class Device:
    """One device JAX can place arrays on (MAX's ``max.driver.Device``).

    Attributes:
        label: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (MAX says ``"cpu"``/``"gpu"``).
        id: the index of the device among JAX's devices of its platform.
        jax_device: the ``jax.Device``.
    """

    __slots__ = ("jax_device",)

    def __init__(self, jax_device: jax.Device):
        self.jax_device = jax_device

    @property
    def label(self) -> str:
        return _label(self.jax_device.platform)

    @property
    def id(self) -> int:
        return _platform_devices(self.jax_device.platform).index(self.jax_device)

    @property
    def is_host(self) -> bool:
        return self.label == "cpu"

    @property
    def api(self) -> str:
        return {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}.get(self.label, self.label)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.jax_device == self.jax_device

    def __hash__(self) -> int:
        return hash(self.jax_device)

    def __repr__(self) -> str:
        return f"Device(type={self.label},id={self.id})"


def _label(platform: str) -> str:
    return {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


def _platform_devices(platform: str) -> list[jax.Device]:
    try:
        return jax.devices(platform)
    except RuntimeError:
        return []


def CPU(id: int = 0) -> Device:
    """The host CPU device ``id`` (with ``--xla_force_host_platform_device_count`` there are several).

    Raises:
        ValueError: there is no CPU device with that id.
    """
    devs = _platform_devices("cpu")
    if not 0 <= id < len(devs):
        raise ValueError(f"failed to create device: no CPU device with id {id} ({len(devs)} CPU devices)")
    return Device(devs[id])


def _accelerators() -> list[jax.Device]:
    return [d for d in jax.devices() if d.platform != "cpu"]


def Accelerator(id: int = -1) -> Device:
    """An accelerator (GPU or TPU) device; ``id=-1`` (the default, as in MAX) picks the first one.

    Raises:
        ValueError: no accelerator is available, or none with that id.
    """
    devs = _accelerators()
    if not devs:
        raise ValueError(
            'failed to create device: No supported "gpu" device available '
            f"(JAX sees only {sorted({d.platform for d in jax.devices()})})"
        )
    index = 0 if id == -1 else id
    if not 0 <= index < len(devs):
        raise ValueError(f"failed to create device: no accelerator with id {id} ({len(devs)} accelerators)")
    return Device(devs[index])


def accelerator_count() -> int:
    """The number of GPU/TPU devices JAX can see (0 on a CPU-only machine)."""
    return len(_accelerators())


def load_devices(device_specs: Iterable[Any]) -> list[Device]:
    """Devices for a list of ``Device``s or ``DeviceRef``s (anything with ``to_device()``)."""
    return [d if isinstance(d, Device) else Device(jax_device_of(d)) for d in device_specs]


class DLPackArray(abc.ABC):
    """Marker base for objects that implement ``__dlpack__`` (MAX's ``DLPackArray``).

    ``isinstance(x, DLPackArray)`` is True for anything with ``__dlpack__`` and ``__dlpack_device__``.
    """

    @classmethod
    def __subclasshook__(cls, other: type) -> Any:
        if cls is not DLPackArray:  # subclasses (WeightData) are checked as ordinary classes
            return NotImplemented
        return hasattr(other, "__dlpack__") and hasattr(other, "__dlpack_device__")


class Buffer:
    """A device array (MAX's ``max.driver.Buffer``), wrapping one ``jax.Array``.

    Construct from a NumPy array (``Buffer.from_numpy``), any DLPack producer (``Buffer.from_dlpack``),
    a ``jax.Array`` (``Buffer(array)``), or as ``Buffer(dtype, shape, device=None)`` (zero-filled:
    JAX has no uninitialised memory).

    ``shape`` is a tuple of ints, ``dtype`` a :class:`~maxjax.dtype.DType`, ``device`` a :class:`Device`.
    """

    __slots__ = ("_array",)
    __array_priority__ = 100

    def __init__(self, dtype_or_array: Any, shape: Sequence[int] | None = None, device: Device | None = None, **_: Any):
        if isinstance(dtype_or_array, DType):
            if shape is None:
                raise ValueError("Buffer(dtype, shape, device): shape is required")
            arr = jnp.zeros(tuple(int(s) for s in shape), dtype_or_array.to_jax())
        elif isinstance(dtype_or_array, jax.Array):
            arr = dtype_or_array
        else:
            arr = jnp.asarray(np.asarray(dtype_or_array))
        if device is not None:
            arr = jax.device_put(arr, jax_device_of(device))
        self._array = arr

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def zeros(cls, shape: Sequence[int], dtype: DType, device: Device | None = None) -> "Buffer":
        return cls(dtype, shape, device)

    @classmethod
    def from_numpy(cls, arr: np.ndarray) -> "Buffer":
        """A Buffer holding a copy of ``arr`` on the default device (bfloat16 and float8 included)."""
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Buffer.from_numpy expects a numpy.ndarray, got {type(arr).__name__}")
        DType.from_numpy(arr.dtype)  # raises ValueError for dtypes MAX has no name for
        return cls(jnp.asarray(arr))

    @classmethod
    def from_dlpack(cls, arr: Any, *, copy: bool | None = None) -> "Buffer":
        """A Buffer from any object with ``__dlpack__`` (torch tensors, NumPy arrays, jax arrays)."""
        if isinstance(arr, Buffer):
            return cls(jnp.array(arr._array, copy=True)) if copy else arr
        if isinstance(arr, np.ndarray):
            return cls(jnp.asarray(arr))
        out = jax.dlpack.from_dlpack(arr, copy=copy)
        return cls(out)

    # -- conversion --------------------------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """The contents as a NumPy array (copied to the host)."""
        return np.asarray(self._array)

    def to_jax(self) -> jax.Array:
        """The wrapped ``jax.Array`` (no copy)."""
        return self._array

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = np.asarray(self._array)
        return out if dtype is None else out.astype(dtype)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._array.__dlpack_device__()

    def to(self, device: Any) -> "Buffer":
        """A copy on ``device`` (a :class:`Device` or ``DeviceRef``); ``self`` if already there."""
        if isinstance(device, (list, tuple)):
            return [self.to(d) for d in device]  # type: ignore[return-value]
        target = jax_device_of(device)
        if self._array.devices() == {target}:
            return self
        return Buffer(jax.device_put(self._array, target))

    def copy(self, device: Any = None) -> "Buffer":
        arr = jnp.array(self._array, copy=True)
        return Buffer(arr if device is None else jax.device_put(arr, jax_device_of(device)))

    def view(self, dtype: DType, shape: Sequence[int] | None = None) -> "Buffer":
        """Reinterpret the bytes as ``dtype`` (and reshape to ``shape`` if given)."""
        arr = self.to_numpy().view(dtype.to_numpy())
        if shape is not None:
            arr = arr.reshape(tuple(shape))
        return Buffer(jnp.asarray(arr))

    def item(self) -> Any:
        if self._array.size != 1:
            raise ValueError(f"item() needs a buffer of one element, this one has shape {self.shape}")
        return self._array.item()

    # -- metadata ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> DType:
        return DType.from_numpy(self._array.dtype)

    @property
    def device(self) -> Device:
        devs = self._array.devices()
        return Device(next(iter(devs)))

    @property
    def rank(self) -> int:
        return self._array.ndim

    @property
    def num_elements(self) -> int:
        return int(self._array.size)

    @property
    def element_size(self) -> int:
        return self._array.dtype.itemsize

    @property
    def is_host(self) -> bool:
        return self.device.is_host

    @property
    def is_contiguous(self) -> bool:
        return True

    def __getitem__(self, idx: Any) -> "Buffer":
        return Buffer(self._array[idx])

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Buffer(shape={list(self.shape)}, dtype={self.dtype!r}, device={self.device!r})"


def jax_device_of(device: Any) -> jax.Device:
    """The ``jax.Device`` of a :class:`Device`, a ``jax.Device`` or a ``DeviceRef``.

    Raises:
        TypeError: anything else.
    """
    if isinstance(device, Device):
        return device.jax_device
    if isinstance(device, jax.Device):
        return device
    to_device = getattr(device, "to_device", None)  # a DeviceRef
    if callable(to_device):
        return to_device().jax_device
    raise TypeError(f"expected a Device or DeviceRef, got {device!r}")


def to_jax_array(value: Any, device: Any = None) -> jax.Array:
    """A ``jax.Array`` (or the tracer itself) from any array-like maxjax accepts.

    Accepts ``jax.Array``s and tracers, NumPy arrays, :class:`Buffer`s, objects with a ``to_jax()``
    method (``WeightData``, ``TensorValue``), DLPack producers (torch tensors) and nested lists.
    ``device`` (a ``jax.Device``, ``Sharding``, :class:`Device` or ``DeviceRef``) places the result.
    64-bit kinds become 32-bit unless ``jax_enable_x64`` is on (JAX's rule).
    """
    if device is not None and not isinstance(device, (jax.Device, jax.sharding.Sharding)):
        device = jax_device_of(device)
    if isinstance(value, np.ndarray):
        return jax.device_put(value, device) if device is not None else jnp.asarray(value)
    if isinstance(value, jax.Array):
        arr = value
    elif callable(getattr(value, "to_jax", None)):
        arr = value.to_jax()
    elif hasattr(value, "__dlpack__"):
        arr = jnp.asarray(np.from_dlpack(value))
    else:
        arr = jnp.asarray(np.asarray(value))
    return arr if device is None else jax.device_put(arr, device)


def to_host_array(value: Any) -> Any:
    """A host NumPy array from the same kinds as :func:`to_jax_array` (no copy for NumPy arrays)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, jax.Array):
        return np.asarray(value)
    if callable(getattr(value, "to_numpy", None)):
        return value.to_numpy()
    if hasattr(value, "__dlpack__"):
        return np.from_dlpack(value)
    return np.asarray(value)
