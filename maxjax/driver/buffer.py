"""``Buffer`` (MAX's ``max.driver.Buffer``) and the array conversions maxjax uses everywhere.

A :class:`Buffer` holds its elements in one of two ways:

- **host** (a NumPy array): a buffer made on the CPU (``Buffer(dtype, shape)``, ``Buffer.zeros``,
  ``Buffer.from_numpy``, ``Buffer.from_dlpack`` of host memory, ``Buffer.mmap``, ``.to(CPU())`` of a
  device buffer). As in MAX it is mutable memory: ``from_numpy`` and ``to_numpy`` share memory with
  the NumPy array (no copy when the array is C-contiguous and writable), ``b[i, j] = v`` writes in
  place, and slicing returns a view (``is_contiguous`` False for strided views).
- **device** (a ``jax.Array``): model outputs, buffers on an accelerator, ``Buffer(jax_array)``.
  JAX arrays are immutable, so ``b[i, j] = v``, ``inplace_copy_from`` and a model's in-place update
  of a buffer input *rebind* the buffer to a new array: the buffer sees the new value, but a slice
  or ``to_numpy()`` taken earlier is a copy and does not. ``to_numpy()`` returns a writable copy
  (what MAX returns for device memory).

Giving a host buffer to a model or an eager op copies it to the device each time (``to_jax()``); a
model's mutable buffer input is placed once and from then on is a device buffer (its update
rebinds it; the NumPy array it came from no longer follows it).

:func:`to_jax_array` / :func:`to_host_array`: the one conversion of any array-like maxjax accepts
(a ``jax.Array`` or tracer, a NumPy array, a Buffer, a ``WeightData`` or ``TensorValue``, a DLPack
producer) to a JAX array or a host NumPy array.

Source: MAX 26.7 ``max/driver/buffer.py`` and ``max/_core/driver.pyi`` (signatures, messages).
"""

from __future__ import annotations

import abc
import enum
import struct
from collections.abc import Sequence
from os import PathLike
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.driver.driver import CPU, Device, DeviceQueue, jax_device_of
from maxjax.dtype import DType

__all__ = [
    "Buffer", "DLPackArray", "Usage", "batch_inplace_copy", "copy_pinned_to_destinations", "load_max_buffer",
    "to_host_array", "to_jax_array",
]  # fmt: skip


class Usage(enum.Flag):
    """Allocation intent of a :class:`Buffer` (MAX's ``Usage``): flags compose with ``|``.

    ``DEFAULT``: device memory on an accelerator, host memory on the CPU. ``STAGING``: host memory
    for transfers (on the CPU: ordinary host memory; refused on an accelerator, where XLA stages
    transfers itself). ``UNTRACKED``: opt out of host hazard tracking (maxjax tracks none: accepted).
    """

    DEFAULT = 0
    STAGING = 1
    UNTRACKED = 2


class DLPackArray(abc.ABC):
    """Marker base for objects that implement ``__dlpack__`` (MAX's ``DLPackArray``).

    ``isinstance(x, DLPackArray)`` is True for anything with ``__dlpack__`` and ``__dlpack_device__``.
    """

    @classmethod
    def __subclasshook__(cls, other: type) -> Any:
        if cls is not DLPackArray:  # subclasses (WeightData) are checked as ordinary classes
            return NotImplemented
        return hasattr(other, "__dlpack__") and hasattr(other, "__dlpack_device__")


_DLPACK_CPU = 1  # DLDeviceType::kDLCPU


def _check_shape(shape: Any) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in shape)
    except TypeError:
        raise TypeError(f"Buffer shape must be a sequence of ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"Buffer shape must have non-negative dims, got {list(dims)}")
    return dims


def _index(idx: Any) -> Any:
    """MAX reads a list index as a tuple of per-axis indices; newaxis and array indices are refused."""
    key = tuple(idx) if isinstance(idx, list) else idx
    for k in key if isinstance(key, tuple) else (key,):
        if not (isinstance(k, (int, np.integer, slice)) or k is Ellipsis) or isinstance(k, bool):
            raise TypeError(f"Buffer index must be ints and slices, got {k!r} in {idx!r}")
    return key


class Buffer:
    """A multi-dimensional array on a device (MAX's ``max.driver.Buffer``); see the module docstring
    for host and device buffers.

    Construction (MAX's overloads, plus one maxjax extension):

    - ``Buffer(dtype, shape, device=None, usage=Usage.DEFAULT)``: zero-filled (MAX leaves the
      memory uninitialised; JAX has no uninitialised arrays), on ``device`` (default: the CPU).
    - ``Buffer(dtype, shape, stream, usage=Usage.DEFAULT)``: on the stream's device.
    - ``Buffer(ndarray, device)``: a copy of a NumPy array on ``device``.
    - ``Buffer(jax_array)`` (maxjax): wraps the ``jax.Array`` (no copy).

    Raises:
        TypeError: a dtype that is not a ``DType``, or a shape that is not a sequence of ints.
        ValueError: a negative dim.
        NotImplementedError: ``Usage.STAGING`` on an accelerator.
    """

    __slots__ = ("_host", "_jax", "_device", "_usage")
    __array_priority__ = 100

    def __init__(
        self,
        dtype: Any = None,
        shape: Any = None,
        device: Device | DeviceQueue | None = None,
        usage: Usage = Usage.DEFAULT,
        *,
        stream: DeviceQueue | None = None,
    ):
        if stream is not None:
            device = stream
        if isinstance(device, DeviceQueue):
            device = device.device
        if device is not None and not isinstance(device, Device):
            device = Device(jax_device_of(device))
        self._usage = Usage(usage)
        self._host: np.ndarray | None = None
        self._jax: jax.Array | None = None
        self._device: Device | None = None
        if dtype is None and isinstance(shape, np.ndarray):  # Buffer(shape=ndarray, device=...)
            dtype, shape = shape, None
        if isinstance(dtype, jax.Array):  # maxjax: wrap a jax.Array
            if shape is not None:
                raise TypeError("Buffer(jax_array) takes no shape")
            self._jax = dtype if device is None else jax.device_put(dtype, device.jax_device)
        elif isinstance(dtype, np.ndarray):  # Buffer(ndarray, device): a copy
            if shape is not None and device is None and isinstance(shape, (Device, DeviceQueue)):
                device = shape.device if isinstance(shape, DeviceQueue) else shape
            elif shape is not None:
                raise TypeError(f"Buffer(ndarray, device): the second argument must be a Device, got {shape!r}")
            DType.from_numpy(dtype.dtype)  # ValueError for dtypes MAX has no name for
            self._place(np.array(dtype, order="C", copy=True), device)
        elif isinstance(dtype, DType):
            if shape is None:
                raise TypeError("Buffer(dtype, shape, device): shape is required")
            self._place(np.zeros(_check_shape(shape), dtype.to_numpy()), device)
        else:
            raise TypeError(
                f"Buffer(dtype, shape, device=None, usage=Usage.DEFAULT): dtype must be a DType, got {dtype!r}"
            )

    def _place(self, host: np.ndarray, device: Device | None) -> None:
        """Holds ``host`` (no copy) on the CPU, or a device copy of it on an accelerator."""
        if device is None or device.is_host:
            self._host, self._device = host, device if device is not None else CPU()
            return
        if Usage.STAGING in self._usage:
            raise NotImplementedError(
                f"Buffer(usage={self._usage}) on {device}: pinned host staging memory is managed by XLA's "
                "transfers; allocate on the device or on CPU()"
            )
        self._jax = jax.device_put(host, device.jax_device)

    @classmethod
    def _of_host(cls, host: np.ndarray, device: Device | None = None, usage: Usage = Usage.DEFAULT) -> "Buffer":
        out = object.__new__(cls)
        out._host, out._jax, out._device, out._usage = host, None, device or CPU(), usage
        return out

    @classmethod
    def _of_jax(cls, array: jax.Array) -> "Buffer":
        out = object.__new__(cls)
        out._host, out._jax, out._device, out._usage = None, array, None, Usage.DEFAULT
        return out

    # -- the wrapped array -------------------------------------------------------------------
    @property
    def _array(self) -> jax.Array:
        """The device array. A host buffer is placed on its device now and becomes a device buffer
        (used by ``Model.execute`` for buffer inputs, which it donates and rebinds)."""
        if self._jax is None:
            self._jax = jax.device_put(np.array(self._host, copy=True), self._device.jax_device)
            self._host = None
        return self._jax

    @_array.setter
    def _array(self, value: jax.Array) -> None:
        self._jax, self._host = value, None

    def to_jax(self) -> jax.Array:
        """The contents as a ``jax.Array``: the wrapped one (no copy) for a device buffer, a copy of
        the host memory for a host buffer (the host memory stays the buffer's)."""
        if self._jax is not None:
            return self._jax
        return jax.device_put(np.array(self._host, copy=True), self._device.jax_device)

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def zeros(shape: Sequence[int], dtype: DType, device: Device | None = None, usage: Usage = Usage.DEFAULT) -> "Buffer":
        """A zero-filled buffer on ``device`` (default: the CPU)."""
        return Buffer(dtype, shape, device, usage)

    @staticmethod
    def scalar(value: Any, dtype: DType, device: Device | None = None) -> "Buffer":
        """A rank-0 buffer holding ``value`` as ``dtype`` on ``device`` (default: the CPU).

        Raises:
            TypeError: a float ``value`` for an integer or bool dtype (MAX's ``std::bad_cast``).
        """
        if isinstance(value, (float, np.floating)) and not dtype.is_float():
            raise TypeError(f"Buffer.scalar({value!r}, {dtype}): a float value cannot be held by an integer or bool dtype")
        out = Buffer(dtype, [], device)
        out[()] = value
        return out

    @staticmethod
    def from_numpy(arr: np.ndarray) -> "Buffer":
        """A host buffer sharing ``arr``'s memory (a copy when ``arr`` is not C-contiguous or is
        read-only, as in MAX). bfloat16 and the float8 kinds work (MAX's do not).

        Raises:
            TypeError: ``arr`` is not a NumPy array.
            ValueError: a dtype with no ``DType`` (complex, string, object).
        """
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Buffer.from_numpy expects a numpy.ndarray, got {type(arr).__name__}")
        return Buffer.from_dlpack(np.ascontiguousarray(arr) if arr.shape else arr)

    @staticmethod
    def from_dlpack(array: Any, *, copy: bool | None = None) -> "Buffer":
        """A buffer over any DLPack producer (NumPy, torch, JAX), sharing its memory where it can.

        NumPy arrays: host buffers (a copy when read-only or ``copy=True``); a Buffer: itself (a
        copy with ``copy=True``); a ``jax.Array``: wrapped; other producers: host memory is
        shared, device memory, and host memory of a dtype NumPy's DLPack lacks (bfloat16, float8),
        is imported by ``jax.dlpack``.

        Raises:
            ValueError: a non-contiguous NumPy array or tensor, or ``copy`` given for anything but
                a NumPy array or a Buffer (MAX's messages).
        """
        if isinstance(array, np.ndarray):
            if not array.flags.c_contiguous:
                raise ValueError(
                    "driver buffer's from_dlpack only accepts contiguous arrays. First call np.ascontiguousarray(array)"
                )
            DType.from_numpy(array.dtype)
            if copy or (copy is None and not array.flags.writeable):
                array = array.copy()
            return Buffer._of_host(array)
        if isinstance(array, Buffer):
            return array.copy() if copy else array
        is_contiguous = getattr(array, "is_contiguous", None)
        if callable(is_contiguous) and not is_contiguous():
            raise ValueError(
                "driver buffer's from_dlpack only accepts contiguous tensors. First call .contiguous() on the tensor"
            )
        if copy is not None:
            raise ValueError("`Buffer.from_dlpack` supports the `copy` flag only for numpy array and `Buffer` inputs")
        if isinstance(array, jax.Array):
            return Buffer._of_jax(array)
        if array.__dlpack_device__()[0] == _DLPACK_CPU:
            try:
                return Buffer._of_host(np.from_dlpack(array))
            except (BufferError, RuntimeError, TypeError):  # a dtype NumPy's DLPack lacks (bfloat16, float8)
                pass
        return Buffer._of_jax(jax.dlpack.from_dlpack(array))

    @staticmethod
    def mmap(
        filename: PathLike[str] | str,
        dtype: DType,
        shape: Sequence[int] | int,
        mode: str = "copyonwrite",
        offset: int = 0,
    ) -> "Buffer":
        """A host buffer over a binary file (``np.memmap``'s arguments). ``mode="r+"`` writes
        through to the file; ``mode="r"`` is copied into memory (as MAX's ``from_dlpack`` does with
        read-only arrays).

        Raises:
            FileNotFoundError: no such file.
        """
        arr = np.memmap(filename, dtype.to_numpy(), mode, offset, shape if isinstance(shape, int) else tuple(shape), order="C")
        return Buffer.from_dlpack(arr)

    # -- conversion --------------------------------------------------------------------------
    def to_numpy(self) -> np.ndarray:
        """The contents as a NumPy array: the buffer's own memory for a host buffer (writes show in
        the buffer), a writable copy for a device buffer."""
        if self._host is not None:
            return self._host
        return np.array(self._jax)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """maxjax extension (MAX's Buffer has no ``__array__``): ``np.asarray(buffer)``."""
        out = self._host if self._host is not None else np.asarray(self._jax)
        if dtype is not None:
            return out.astype(dtype)  # a copy
        return np.array(out, copy=True) if copy else out

    def __dlpack__(self, *, stream: int | None = None, **kwargs: Any) -> Any:
        if self._host is not None:
            return self._host.__dlpack__(stream=stream, **kwargs)
        return self._jax.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._host is not None:
            return (_DLPACK_CPU, 0)
        return self._jax.__dlpack_device__()

    def to(self, device: Any) -> Any:
        """This buffer if it is on ``device``, else a copy there (a list of buffers for a list of devices).

        A copy to the CPU is a host buffer; a copy to an accelerator is a device buffer."""
        if isinstance(device, (list, tuple)):
            return [self.to(d) for d in device]
        target = device if isinstance(device, Device) else Device(jax_device_of(device))
        if target == self.device:
            return self
        if target.is_host:
            return Buffer._of_host(np.array(self.to_numpy() if self._host is not None else self._jax), target)
        return Buffer._of_jax(jax.device_put(self._host if self._host is not None else self._jax, target.jax_device))

    def copy(self, device: Device | None = None) -> "Buffer":
        """A deep copy (C-contiguous) on ``device`` (default: this buffer's device)."""
        target = self.device if device is None else device
        if self._host is not None and target.is_host:
            return Buffer._of_host(np.array(self._host, order="C", copy=True), target, self._usage)
        if self._jax is not None and target == self.device:
            return Buffer._of_jax(jnp.array(self._jax, copy=True))
        out = self.to(target)
        return out if out is not self else self.copy()

    def contiguous(self) -> "Buffer":
        """A contiguous copy (always a copy, as in MAX)."""
        return self.copy()

    def view(self, dtype: DType, shape: Sequence[int] | None = None) -> "Buffer":
        """The same bytes read as ``dtype`` and ``shape`` (default: the last axis rescaled).

        A host buffer's view shares its memory; a device buffer's is a new array (JAX arrays are
        immutable, so sharing cannot be observed).

        Raises:
            ValueError: ``shape`` is None and the last axis' bytes are not a multiple of the new
                element size, or ``shape`` holds a different number of bytes (MAX's messages); a
                non-contiguous host buffer viewed with a different element size or shape.
        """
        new = dtype.to_numpy()
        if shape is None:
            last = self.element_size * (self.shape[-1] if self.shape else 1)
            if last % new.itemsize:
                raise ValueError(
                    "When changing to a larger dtype, its size must be a divisor of the total size in bytes of "
                    "the last axis of the array."
                )
            shape = (*self.shape[:-1], last // new.itemsize)
        shape = _check_shape(shape)
        if int(np.prod(shape, dtype=np.int64)) * new.itemsize != self.num_elements * self.element_size:
            raise ValueError("byte sizes don't match in view creation")
        if self._host is not None:
            host = self._host
            if not host.flags.c_contiguous:
                if new.itemsize != host.itemsize or tuple(shape) != host.shape:
                    raise ValueError(
                        f"Buffer.view({dtype}, {list(shape)}) of a non-contiguous buffer (strides {self.strides}) "
                        "must keep the element size and shape; call .contiguous() first"
                    )
                return Buffer._of_host(host.view(new), self._device, self._usage)
            return Buffer._of_host(host.reshape(-1).view(np.uint8).view(new).reshape(shape), self._device, self._usage)
        raw = jnp.ravel(self._jax)
        if raw.dtype == jnp.bool_:
            raw = raw.astype(jnp.uint8)
        raw = jax.lax.bitcast_convert_type(raw, jnp.uint8).reshape(-1)  # [n_bytes]
        if new == np.bool_:
            out = raw.astype(jnp.bool_)
        elif new.itemsize == 1:
            out = jax.lax.bitcast_convert_type(raw, new)
        else:
            out = jax.lax.bitcast_convert_type(raw.reshape(-1, new.itemsize), new)  # [n_bytes / size]
        return Buffer._of_jax(out.reshape(shape))

    def inplace_copy_from(self, src: "Buffer") -> None:
        """Copies ``src``'s elements into this buffer (any devices; shapes may differ, sizes may not).

        A host buffer is written in place; a device buffer is rebound to the new array.

        Raises:
            ValueError: either buffer is not contiguous, or they differ in size or dtype (MAX's
                messages).
        """
        if self is src:
            return
        if not self.is_contiguous:
            raise ValueError("Cannot copy to non-contiguous buffer")
        if not src.is_contiguous:
            raise ValueError("Cannot copy from non-contiguous buffer")
        if self.num_elements != src.num_elements:
            raise ValueError("Cannot copy buffers of different sizes")
        if self.dtype != src.dtype:
            raise ValueError("Cannot copy buffers of different dtypes")
        if self._host is not None:
            np.copyto(self._host, np.asarray(src).reshape(self.shape))
        else:
            value = src._jax if src._jax is not None else src._host
            self._jax = jax.device_put(jnp.reshape(value, self.shape), next(iter(self._jax.devices())))

    # -- elements ----------------------------------------------------------------------------
    def item(self) -> Any:
        """The one element as a Python ``bool``, ``int`` or ``float``.

        Raises:
            ValueError: the buffer does not hold exactly one element (MAX's message).
        """
        if self.num_elements != 1:
            raise ValueError(f"calling `item` on a tensor with {self.num_elements} items but expected only 1")
        value = np.asarray(self).reshape(()).item()
        return value if isinstance(value, (bool, int, float)) else float(value)

    def __getitem__(self, idx: Any) -> "Buffer":
        """The element or sub-array at ``idx`` (ints and slices per axis; integers only: a rank-0
        buffer). A host buffer's result is a view of its memory, a device buffer's a new array.

        MAX requires one index per axis; maxjax also takes fewer (NumPy's rule) and ``...``.

        Raises:
            IndexError: an index out of range.
            TypeError: an index that is not an int or a slice (``None``, arrays).
        """
        key = _index(idx)
        if self._host is not None:
            keys = key if isinstance(key, tuple) else (key,)
            view = self._host[keys if Ellipsis in keys else (*keys, Ellipsis)]  # a 0-d view, not a scalar
            return Buffer._of_host(view, self._device, self._usage)
        np.broadcast_to(np.False_, self.shape)[key]  # IndexError when out of range (JAX would clamp)
        return Buffer._of_jax(self._jax[key])

    def __setitem__(self, idx: Any, value: Any) -> None:
        """Sets the element(s) at ``idx`` to ``value`` (a Python/NumPy scalar, an array or Buffer of
        this dtype). A host buffer is written in place (views and ``to_numpy()`` arrays see it); a
        device buffer is rebound to a new array (``.at[idx].set``).

        Integer indices must be one per axis, as in MAX (a rank-0 buffer takes ``[0]`` or ``[()]``);
        maxjax also takes slices and ``...`` (NumPy's rule).

        Raises:
            IndexError: an index out of range.
            TypeError: a bad index; a float for an integer or bool buffer; an array of another dtype.
            ValueError: integer indices fewer or more than the rank (MAX's message).
        """
        key = _index(idx)
        keys = key if isinstance(key, tuple) else (key,)
        if not any(isinstance(k, slice) or k is Ellipsis for k in keys):
            if not self.shape and keys in ((), (0,)):
                key = ()
            elif len(keys) != len(self.shape):
                raise ValueError(
                    f"the provided number of indices ({len(keys)}) is not equal to the tensor rank ({len(self.shape)})"
                )
        dtype = self.dtype
        if isinstance(value, Buffer):
            value = value.to_numpy() if value._host is not None else value._jax
        if isinstance(value, (float, np.floating)) and not dtype.is_float():
            raise TypeError(f"Buffer[{idx!r}] = {value!r}: a float cannot be stored in a {dtype} buffer")
        if hasattr(value, "dtype") and np.ndim(value) > 0 and DType.of(value.dtype) != dtype:
            raise TypeError(f"Buffer[{idx!r}] = array: expected dtype {dtype}, got {DType.of(value.dtype)}")
        if self._host is not None:
            self._host[key] = np.asarray(value)
            return
        np.broadcast_to(np.False_, self.shape)[key]  # IndexError when out of range
        self._jax = self._jax.at[key].set(jnp.asarray(value, self._jax.dtype))

    def _iterate_indices(self) -> Any:
        return np.ndindex(*self.shape)

    # -- metadata ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple((self._host if self._host is not None else self._jax).shape)

    @property
    def dtype(self) -> DType:
        return DType.from_numpy((self._host if self._host is not None else self._jax).dtype)

    @property
    def device(self) -> Device:
        """The device the buffer is on (the first device of a sharded array)."""
        if self._host is not None:
            return self._device
        return Device(next(iter(self._jax.devices())))

    @property
    def stream(self) -> DeviceQueue:
        """The queue of the buffer's device."""
        return self.device.default_queue

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def num_elements(self) -> int:
        """The number of elements (1 for rank 0)."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def element_size(self) -> int:
        """Bytes per element."""
        return (self._host if self._host is not None else self._jax).dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Elements (not bytes) between consecutive indices of each axis (a view keeps its parent's)."""
        if self._host is not None:
            return tuple(s // self._host.itemsize for s in self._host.strides)
        dims, out, step = self.shape, [], 1
        for d in reversed(dims):
            out.append(step)
            step *= d
        return tuple(reversed(out))

    @property
    def is_contiguous(self) -> bool:
        """False for a strided (or reversed) view of a host buffer; device buffers are contiguous."""
        return bool(self._host.flags.c_contiguous) if self._host is not None else True

    @property
    def is_host(self) -> bool:
        return self.device.is_host

    @property
    def pinned(self) -> bool:
        """False: maxjax never allocates page-locked host memory."""
        return False

    @property
    def usage(self) -> Usage:
        """The ``usage`` the buffer was made with (a view reports its parent's)."""
        return self._usage

    def __len__(self) -> int:
        """maxjax extension (MAX's Buffer has no ``len``): the size of the first axis."""
        return self.shape[0]

    def __repr__(self) -> str:
        return f"maxjax.driver.Buffer({self.dtype}, {self.shape}, {self.stream})"

    def __str__(self) -> str:
        values = np.asarray(self)
        if self.dtype not in _NUMPY_FAITHFUL:
            values = values.astype(np.float32)
        data = np.array2string(values, prefix="Buffer(")
        return f"Buffer({data}, dtype={self.dtype}, shape={self.shape}, device={self.device})"


_NUMPY_FAITHFUL = frozenset({
    DType.bool, DType.int8, DType.int16, DType.int32, DType.int64, DType.uint8, DType.uint16, DType.uint32,
    DType.uint64, DType.float16, DType.float32, DType.float64,
})  # fmt: skip


def batch_inplace_copy(dsts: Sequence[Buffer], srcs: Sequence[Buffer]) -> None:
    """``dsts[i].inplace_copy_from(srcs[i])`` for every pair (identical pairs skipped).

    Raises:
        ValueError: the lists differ in length (MAX's message), or a pair cannot be copied.
    """
    if len(dsts) != len(srcs):
        raise ValueError(
            f"batch_inplace_copy: dsts and srcs must have the same length (got {len(dsts)} dsts, {len(srcs)} srcs)"
        )
    for dst, src in zip(dsts, srcs):
        dst.inplace_copy_from(src)


def copy_pinned_to_destinations(source: Buffer, destinations: Sequence[Buffer]) -> None:
    """Copies ``source`` into each destination (maxjax has no pinned memory to keep alive)."""
    for dst in destinations:
        dst.inplace_copy_from(source)


_MAX_CHECKPOINT_MAGIC = b"\x93\xf0\x9f\x94\xa5\x2b\x2b\x93"


def load_max_buffer(path: PathLike[str]) -> Buffer:
    """A buffer from a MAX ``.max`` checkpoint file (one tensor; MAX's format: magic, version,
    metadata size, key, dtype and rank bytes, uint32 dims, uint64 data offset).

    Raises:
        ValueError: not a MAX checkpoint, a version above 0, or several tensors in the file.
    """
    with open(path, "rb") as f:
        if f.read(8) != _MAX_CHECKPOINT_MAGIC:
            raise ValueError(
                f'{path} is not a max checkpoint. If this file was saved from the "BINARY" debug print option '
                '(and not "BINARY_MAX_CHECKPOINT"), please initialize `Buffer.mmap` directly.'
            )
        major, _minor = struct.unpack("2I", f.read(8))
        if major > 0:
            raise ValueError("Unable to read from version > 0.")
        (metadata_size,) = struct.unpack("Q", f.read(8))
        (key_size,) = struct.unpack("I", f.read(4))
        f.read(key_size)
        dtype_value, rank = struct.unpack("2B", f.read(2))
        shape = tuple(struct.unpack("I", f.read(4))[0] for _ in range(rank))
        (offset,) = struct.unpack("Q", f.read(8))
        if 4 + key_size + 2 + 4 * rank + 8 != metadata_size:
            raise ValueError("Multiple buffers found in .max file. This is currently not supported.")
    return Buffer.mmap(path, DType(dtype_value), shape, mode="r", offset=offset)


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
    """A host NumPy array from the same kinds as :func:`to_jax_array` (no copy for NumPy arrays and
    host Buffers)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, jax.Array):
        return np.asarray(value)
    if callable(getattr(value, "to_numpy", None)):
        return value.to_numpy()
    if hasattr(value, "__dlpack__"):
        return np.from_dlpack(value)
    return np.asarray(value)
