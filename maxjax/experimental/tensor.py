"""MAX 26.7's eager ``max.experimental.tensor.Tensor``, for one device, on a ``jax.Array``.

A :class:`Tensor` holds one ``jax.Array`` and MAX's declared :class:`~maxjax.dtype.DType`. Every
operation runs at once (JAX is eager): MAX's lazy *realization* (unrealized tensors backed by graph
values, ``RealizationState``, ``await tensor``) has no counterpart, so a tensor is always ``real``.
Each method and operator calls the maxjax op of the same name (``maxjax.graph.ops``) on the held
array, so shapes, axes, dtype promotion and error types are MAX's, as in a graph.

Dtypes. A Python scalar or nested list takes the default dtype (:func:`default_dtype`, else
``float32`` on the CPU and ``bfloat16`` on an accelerator, as MAX: ``Tensor([1, 2])`` is float32);
an array (NumPy, JAX, a :class:`~maxjax.driver.Buffer`, any DLPack producer) keeps its own dtype.
64-bit dtypes follow maxjax's rule (see the README, "64-bit dtypes"): the tensor reports MAX's
dtype (``int64`` for a NumPy int64 array, ``Tensor.argmax`` and ``Tensor.from_dim``, ``float64``
for integer ``/`` integer) while JAX, without x64, holds 32 bits; a value outside the held range
is refused when the tensor is made. ``to_numpy()`` returns the declared dtype.

Single device. ``DeviceMesh``, ``DeviceMapping`` and placements (MAX's distributed tensors) are
not built: such an argument raises ``NotImplementedError``; shard with
``jax.sharding.NamedSharding`` through maxjax's sharding strategies. ``is_distributed`` is False,
``num_shards`` 1 and ``local_shards`` ``(self,)``, as MAX for a single device.

Interop (maxjax extensions): a Tensor is a JAX pytree (``jax.jit`` takes and returns Tensors);
``tensor.to_jax()`` is the held array; ``np.asarray(tensor)`` and ``ops.constant(tensor)`` take
its values; ``InferenceSession`` models take Tensors as inputs (through DLPack).

Source: MAX 26.7 ``max/experimental/tensor.py`` and ``max/experimental/_tensor_repr.py``
(signatures, defaults, messages, the printed form).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Generator, Sequence
from contextvars import ContextVar
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.driver import CPU, Accelerator, Buffer, Device, DLPackArray, accelerator_count
from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.graph.graph import current_graph, no_active_graph
from maxjax.graph.ops._core import apply
from maxjax.graph.ops.buffer import _store_slice
from maxjax.graph.ops.elementwise import common_dtype
from maxjax.graph.type import DeviceRef, Dim, Shape, ShapeLike, StaticDim, TensorType

__all__ = ["Tensor", "TensorType", "default_device", "default_dtype", "defaults", "defaults_like"]

Number = int | float | bool | np.number

_DEFAULT_DTYPE: ContextVar[DType | None] = ContextVar("maxjax_experimental_default_dtype", default=None)
_DEFAULT_DEVICE: ContextVar[Device | None] = ContextVar("maxjax_experimental_default_device", default=None)


# -- devices and defaults ------------------------------------------------------------------------
def _not_distributed(argument: str, value: Any) -> None:
    raise NotImplementedError(
        f"{argument}={type(value).__name__}: maxjax's eager Tensor lives on one device (MAX's distributed "
        "DeviceMesh/DeviceMapping tensors are not built); shard with jax.sharding.NamedSharding via maxjax's "
        "sharding strategies (maxjax.graph.ShardingStrategy)"
    )


def _as_device(device: Any, argument: str = "device") -> Device:
    """``device`` as a :class:`Device` (a DeviceRef is resolved; a mesh or mapping is refused)."""
    if isinstance(device, Device):
        return device
    if isinstance(device, DeviceRef):
        return device.to_device()
    if hasattr(device, "devices") or hasattr(device, "mesh") or hasattr(device, "placements"):
        _not_distributed(argument, device)
    raise TypeError(f"{argument} must be a maxjax.driver.Device, got {device!r}")


def _default_dtype(device: Device) -> DType:
    if (dtype := _DEFAULT_DTYPE.get()) is not None:
        return dtype
    return DType.float32 if isinstance(device, CPU) else DType.bfloat16


def _default_device() -> Device:
    if (device := _DEFAULT_DEVICE.get()) is not None:
        return device
    return Accelerator() if accelerator_count() else CPU()


def defaults(dtype: DType | None = None, device: Device | None = None) -> tuple[DType, Device]:
    """The dtype and device a tensor is created with: ``dtype`` / ``device`` if given, else the
    :func:`default_dtype` / :func:`default_device` in effect, else ``float32`` on the CPU and
    ``bfloat16`` on an accelerator / an accelerator if there is one, else the CPU (MAX's rule).

    MAX returns the device as a one-device ``DeviceMesh``; maxjax returns the :class:`Device`.

    Raises:
        NotImplementedError: ``device`` is a DeviceMesh.
    """
    device = _default_device() if device is None else _as_device(device)
    return (dtype or _default_dtype(device)), device


@contextlib.contextmanager
def _contextvar(var: ContextVar[Any], value: Any) -> Generator[Any]:
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def default_device(device: Device | DeviceRef) -> contextlib.AbstractContextManager[Device]:
    """Context manager: tensors created inside without ``device=`` go to ``device`` (yielded).

    A ``DeviceRef`` is resolved to its device. Scoped by a ``ContextVar`` (threads and asyncio
    tasks each see their own).

    Raises:
        NotImplementedError: ``device`` is a DeviceMesh (MAX replicates over it).
    """
    return _contextvar(_DEFAULT_DEVICE, _as_device(device))


def default_dtype(dtype: DType) -> contextlib.AbstractContextManager[DType]:
    """Context manager: tensors created inside from Python values without ``dtype=`` get
    ``dtype`` (yielded). Arrays keep their own dtype, as in MAX.

    Raises:
        TypeError: ``dtype`` is not a DType.
    """
    if not isinstance(dtype, DType):
        raise TypeError(f"default_dtype: dtype must be a DType, got {dtype!r}")
    return _contextvar(_DEFAULT_DTYPE, dtype)


@contextlib.contextmanager
def defaults_like(like: Tensor) -> Generator[None]:
    """Context manager: the default dtype and device are ``like``'s."""
    with default_dtype(like.dtype), default_device(like.device):
        yield


# -- conversions ---------------------------------------------------------------------------------
def _check_held(arr: np.ndarray, dtype: DType) -> None:
    """Refuses values of a 64-bit ``dtype`` that JAX (without x64) cannot hold in its 32 bits
    (maxjax's rule at every boundary, as ``Graph.check_values``)."""
    held = np.dtype(dtype.to_jax())
    if held == arr.dtype or not arr.size:
        return
    if arr.dtype.kind in "iu" and held.kind in "iu":
        info = np.iinfo(held)
        bad = arr[(arr < info.min) | (arr > info.max)]
    elif arr.dtype.kind == "f" and held.kind == "f":
        bad = arr[np.isfinite(arr) & (np.abs(arr) > np.finfo(held).max)]
    else:
        return
    if bad.size:
        raise ValueError(
            f"Tensor: value {bad.flat[0]!r} does not fit {dtype!r} as maxjax holds it ({held.name}: JAX runs "
            "without x64)"
        )


def _literal(value: Any, dtype: DType) -> np.ndarray:
    """A Python scalar or nested list as a NumPy array of ``dtype``, with MAX's checks.

    Raises:
        ValueError: a ragged list, or an integer out of ``dtype``'s range (MAX's messages).
        RuntimeError: a float for an integer or bool dtype (MAX raises ``std::bad_cast``).
    """
    try:
        raw = np.asarray(value)
    except ValueError:
        raw = np.empty(0, object)
    if raw.dtype == object:
        raise ValueError(f"Array literals must be rectangular, got literal={value!r}")
    if raw.dtype.kind == "f" and not dtype.is_float():
        raise RuntimeError(f"std::bad_cast: a float value cannot be held by {dtype!r} (literal={value!r})")
    if raw.dtype.kind in "iu" and dtype.is_integral() and raw.size:
        info = np.iinfo(dtype.to_numpy())
        bad = raw[(raw < info.min) | (raw > info.max)]
        if bad.size:
            raise ValueError(
                "Unsafe cast: Refusing to implicitly promote external array with value "
                f"{bad.flat[0]} out of range for DType {dtype!r}."
            )
    arr = raw.astype(dtype.to_numpy())
    _check_held(arr, dtype)
    return arr


def _run(op: Any, *args: Any, **kwargs: Any) -> Any:
    """``op`` (a maxjax op) run eagerly on arrays, also while a ``Graph`` is being built (where
    maxjax's ops would record graph nodes: a Tensor is eager data, as a NumPy array is)."""
    if current_graph() is None:
        return op(*args, **kwargs)
    with no_active_graph():  # this thread's graphs only
        return op(*args, **kwargs)


def _put(arr: Any, device: Device) -> jax.Array:
    return jax.device_put(arr, device.jax_device)


def _array_of(data: Any) -> tuple[Any, DType]:
    """An array operand (NumPy, JAX, Buffer, DLPack) as ``(array, declared dtype)``: a jax.Array
    is kept as is, host data stays NumPy until placed."""
    if isinstance(data, Tensor):
        return data._array, data._dtype
    if isinstance(data, Buffer):
        return data.to_jax(), data.dtype
    if isinstance(data, jax.Array):
        return data, DType.from_numpy(data.dtype)
    if isinstance(data, (np.ndarray, np.generic)):
        arr = np.asarray(data)
    elif data.__dlpack_device__()[0] == 1:  # host memory (kDLCPU): through NumPy, no copy
        arr = np.from_dlpack(data)
    else:
        out = jnp.from_dlpack(data)
        return out, DType.from_numpy(out.dtype)
    dtype = DType.from_numpy(arr.dtype)
    _check_held(arr, dtype)
    return arr, dtype


def _is_dlpack(x: Any) -> bool:
    return isinstance(x, (Buffer, jax.Array, np.ndarray, np.generic, DLPackArray))


# -- the tensor ----------------------------------------------------------------------------------
class Tensor(DLPackArray):
    """A multi-dimensional array on the CPU or an accelerator (MAX's eager ``Tensor``; one device).

    ``Tensor(data, dtype=None, device=None)``: ``data`` a Python scalar, a nested list, a NumPy
    array, a ``jax.Array``, a :class:`~maxjax.driver.Buffer` or any DLPack producer. A scalar or
    list takes ``dtype`` or the default dtype (see :func:`defaults`); an array keeps its own dtype
    (a ``jax.Array`` is held without a copy). ``Tensor(storage=buffer)`` wraps a Buffer.

    Raises:
        TypeError: both ``data`` and ``storage``, neither, or ``dtype``/``device`` without data.
        ValueError: ``dtype`` conflicting with an array's own dtype, a ragged list, an integer out
            of ``dtype``'s range (MAX's messages), a value beyond what JAX holds for a 64-bit dtype.
        RuntimeError: a float value for an integer dtype (MAX's ``std::bad_cast``).
        NotImplementedError: ``state`` (MAX's lazy realization has no counterpart: JAX is eager),
            or a DeviceMesh ``device``.
    """

    __slots__ = ("_array", "_dtype")

    def __init__(
        self,
        data: Any = None,
        *,
        dtype: DType | None = None,
        device: Device | None = None,
        storage: Buffer | None = None,
        state: Any = None,
    ):
        if state is not None:
            raise NotImplementedError(
                f"Tensor(state={type(state).__name__}): MAX's lazy realization states have no counterpart "
                "(maxjax's Tensor is always realized: JAX is eager); pass data= or storage="
            )
        if data is None:
            if dtype is not None or device is not None:
                raise TypeError("'dtype' and 'device' are only valid when 'data' is provided.")
            if storage is None:
                raise TypeError("Must supply exactly one of 'storage' and 'state'.")
            if not isinstance(storage, Buffer):
                raise TypeError(f"Tensor(storage=...) takes a maxjax.driver.Buffer, got {type(storage).__name__}")
            self._array, self._dtype = storage.to_jax(), storage.dtype
            return
        if storage is not None:
            raise TypeError("Cannot supply both 'data' and internal 'storage'/'state'.")
        if dtype is not None and not isinstance(dtype, DType):
            raise TypeError(f"Tensor: dtype must be a DType, got {dtype!r}")
        target = None if device is None else _as_device(device)
        if _is_dlpack(data):
            arr, own = _array_of(data)
            if dtype is not None and dtype != own:
                raise ValueError(f"DType must match input dtype: dtype={dtype.name} != value.dtype={own.name}")
            dev = target or _default_device()
            if isinstance(arr, jax.Array) and _device_of(arr) == dev:
                self._array = arr
            else:
                self._array = _put(arr, dev)
            self._dtype = own
            return
        dtype, dev = defaults(dtype, target)
        self._array, self._dtype = _put(_literal(data, dtype), dev), dtype

    @classmethod
    def _wrap(cls, array: Any, dtype: DType) -> Tensor:
        out = object.__new__(cls)
        out._array, out._dtype = array, dtype
        return out

    # -- constructors ----------------------------------------------------------------------------
    @classmethod
    def from_dlpack(cls, array: DLPackArray) -> Tensor:
        """A tensor over any DLPack producer (NumPy, torch, JAX, a Buffer) with its own dtype; a
        Tensor is returned as is."""
        if isinstance(array, Tensor):
            return array
        return cls(array)

    @classmethod
    def from_graph_value(cls, value: Any) -> Tensor:
        """Not available: maxjax's Tensor is eager and never wraps a graph value.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError(
            f"Tensor.from_graph_value({type(value).__name__}): maxjax's Tensor is eager (no unrealized "
            "tensors); run the graph with InferenceSession and wrap its outputs with Tensor(...)"
        )

    @classmethod
    def from_shard_values(cls, shard_values: Sequence[Any], mapping: Any = None) -> Tensor:
        """Not available: distributed tensors are not built.

        Raises:
            NotImplementedError: always.
        """
        _not_distributed("shard_values", shard_values)
        raise AssertionError  # unreachable

    @classmethod
    def from_dim(cls, dim: Any) -> Tensor:
        """A rank-0 ``int64`` tensor on the CPU holding the size of a static ``dim``.

        Raises:
            ValueError: ``dim`` is symbolic or algebraic (it has no value in eager mode; in a graph
                use ``ops.shape_to_tensor([dim])``).
        """
        d = Dim(dim)
        if not isinstance(d, StaticDim):
            raise ValueError(
                f"Tensor.from_dim({d}): a symbolic dimension has no value in eager mode. Use a static "
                "dimension, or ops.shape_to_tensor([dim]) while building a graph."
            )
        return cls._wrap(_put(_literal(int(d), DType.int64), CPU()), DType.int64)

    @classmethod
    def constant(cls, value: Any, *, dtype: DType | None = None, device: Device | None = None) -> Tensor:
        """Deprecated in MAX 26.2 (warns ``DeprecationWarning``): ``Tensor(value, dtype=, device=)``."""
        warnings.warn(
            "Tensor.constant() is deprecated. Use Tensor(value, dtype=dtype, device=device) instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return cls(value, dtype=dtype, device=device)

    @classmethod
    def full(cls, shape: ShapeLike, value: Number, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        """A tensor of ``shape`` filled with ``value`` (``dtype``/``device`` default as in
        :func:`defaults`). Raises as ``Tensor(value, dtype=...)`` for a value ``dtype`` cannot hold,
        and NotImplementedError for a DeviceMesh/DeviceMapping ``device``."""
        dtype, dev = defaults(dtype, None if device is None else _as_device(device))
        fill = _put(_literal(value, dtype), dev)
        return cls._wrap(_run(ops.broadcast_to, fill, shape), dtype)  # [] -> shape

    @classmethod
    def full_like(cls, input: Tensor, value: Number) -> Tensor:
        """``full`` with ``input``'s shape, dtype and device."""
        return cls.full(input.shape, value, dtype=input.dtype, device=input.device)

    @classmethod
    def zeros(cls, shape: ShapeLike, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        """A tensor of zeros (see :meth:`full`)."""
        return cls.full(shape, value=0, dtype=dtype, device=device)

    @classmethod
    def zeros_like(cls, input: Tensor) -> Tensor:
        """Zeros with ``input``'s shape, dtype and device."""
        return cls.zeros(input.shape, dtype=input.dtype, device=input.device)

    @classmethod
    def ones(cls, shape: ShapeLike, *, dtype: DType | None = None, device: Any = None) -> Tensor:
        """A tensor of ones (see :meth:`full`)."""
        return cls.full(shape, value=1, dtype=dtype, device=device)

    @classmethod
    def ones_like(cls, input: Tensor) -> Tensor:
        """Ones with ``input``'s shape, dtype and device."""
        return cls.ones(input.shape, dtype=input.dtype, device=input.device)

    @classmethod
    def arange(
        cls,
        start: Any = 0,
        stop: Any = None,
        step: Any = 1,
        out_dim: Any = None,
        *,
        dtype: DType | None = None,
        device: Any = None,
    ) -> Tensor:
        """``start, start + step, ...`` up to ``stop`` (exclusive), 1-D (``arange(n)`` is
        ``0..n-1``); ``dtype`` defaults as in :func:`defaults` (float32 on the CPU, as MAX).
        Scalar Tensor bounds need ``out_dim`` (the length). ``ops.range``.

        Raises:
            ValueError: tensor bounds that are not scalars, or without ``out_dim``.
            RuntimeError: integer bounds whose interval ``step`` does not divide (MAX's compiled
                range fails on them; float bounds give the floor length, as MAX).
        """
        if stop is None:
            start, stop = 0, start
        dtype, dev = defaults(dtype, None if device is None else _as_device(device))
        ints = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
        if ints and out_dim is None and step != 0 and (stop - start) * step > 0 and (stop - start) % step:
            # MAX 26.7 fails to compile this range (a RemoteCompileError, a RuntimeError); float
            # bounds are not refused: MAX gives the floor length ((0, 0.3, 0.1) is [0, 0.1])
            raise RuntimeError(
                f"arange({start}, {stop}, {step}): the interval is not a multiple of step, so the inferred "
                f"length {(stop - start) // step} disagrees with the number of values"
            )
        args = [v._array if isinstance(v, Tensor) else v for v in (start, stop, step)]
        out = _run(ops.range, *args, out_dim, dtype=dtype)
        out = out.to_jax() if hasattr(out, "to_jax") else out
        return cls._wrap(_put(out, dev), dtype)

    @classmethod
    def range_like(cls, input: Tensor) -> Tensor:
        """``0..n-1`` along the last axis (``n = input.shape[-1]``) broadcast to ``input``'s shape,
        with its dtype and device."""
        dim = input.shape[-1]
        r = cls.arange(0, dim, out_dim=dim, dtype=input.dtype, device=input.device)
        return r.broadcast_to(input.shape)

    # -- properties ------------------------------------------------------------------------------
    @property
    def dtype(self) -> DType:
        """MAX's dtype (``int64``/``float64`` ones are held by JAX in 32 bits: module docstring)."""
        return self._dtype

    @property
    def shape(self) -> Shape:
        """The shape as a :class:`~maxjax.graph.Shape` of static Dims."""
        return Shape(self._array.shape)

    @property
    def rank(self) -> int:
        return self._array.ndim

    @property
    def device(self) -> Device:
        """The device the tensor is on."""
        return _device_of(self._array)

    @property
    def type(self) -> TensorType:
        """``TensorType(dtype, shape, DeviceRef of device)``."""
        return TensorType(self._dtype, self.shape, DeviceRef.from_device(self.device))

    def num_elements(self) -> int:
        """The number of elements (the product of the shape)."""
        return int(np.prod(self._array.shape, dtype=np.int64))

    @property
    def real(self) -> bool:
        """True: maxjax's tensors are always realized (JAX is eager)."""
        return True

    @property
    def state(self) -> None:
        """None: there are no realization states (JAX is eager)."""
        return None

    @property
    def driver_tensor(self) -> Buffer:
        """The held array as a :class:`~maxjax.driver.Buffer` (no copy; a 64-bit dtype shows as
        the 32 bits JAX holds)."""
        return Buffer(self._array)

    @property
    def storage(self) -> Buffer:
        """Same as :attr:`driver_tensor`."""
        return self.driver_tensor

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        """``(driver_tensor,)``: one buffer, one device."""
        return (self.driver_tensor,)

    @property
    def is_distributed(self) -> bool:
        """False: one device."""
        return False

    @property
    def num_shards(self) -> int:
        """1: one device."""
        return 1

    @property
    def local_shards(self) -> tuple[Tensor, ...]:
        """``(self,)``: one device."""
        return (self,)

    @property
    def mesh(self) -> Any:
        """Not available (raises NotImplementedError): DeviceMesh is not built."""
        _not_distributed("mesh", self)

    @property
    def placements(self) -> Any:
        """Not available (raises NotImplementedError): placements are not built."""
        _not_distributed("placements", self)

    @property
    def mapping(self) -> Any:
        """Not available (raises NotImplementedError): DeviceMapping is not built."""
        _not_distributed("mapping", self)

    @property
    def external_name(self) -> None:
        """None: a plain tensor is not a weight."""
        return None

    @property
    def layout(self) -> Any:
        """Not available (raises NotImplementedError): TensorLayout carries a DeviceMapping."""
        _not_distributed("layout", self)

    def rebind_mapping(self, mapping: Any) -> Tensor:
        """Not available (raises NotImplementedError): DeviceMapping is not built."""
        _not_distributed("mapping", mapping)
        raise AssertionError  # unreachable

    def materialize(self) -> Tensor:
        """``self`` (a single-device tensor is already local)."""
        return self

    def __await__(self) -> Generator[Any, None, Tensor]:
        """``await tensor`` is ``tensor``: it is realized already (JAX is eager)."""
        return self
        yield  # a generator, as MAX's

    @property
    async def realize(self) -> Tensor:
        """``await tensor.realize`` is ``tensor`` (always realized)."""
        return self

    # -- host access -----------------------------------------------------------------------------
    def to_jax(self) -> jax.Array:
        """maxjax extension: the held ``jax.Array`` (no copy; 32-bit for a 64-bit dtype)."""
        return self._array

    def to_numpy(self) -> np.ndarray:
        """The values as a NumPy array of :attr:`dtype` on the host (a copy)."""
        out = np.array(self._array)
        want = self._dtype.to_numpy()
        return out if out.dtype == want else out.astype(want)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """maxjax extension (MAX's Tensor has none): ``np.asarray(tensor)``, ``ops.constant(tensor)``."""
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype)

    def item(self) -> Any:
        """The value of a one-element tensor as a Python scalar.

        Raises:
            TypeError: the tensor does not have exactly one element (MAX's type).
        """
        if self.num_elements() != 1:
            n, shape = self.num_elements(), list(self._array.shape)
            raise TypeError(f"item(): the tensor has {n} elements (shape {shape}), not 1")
        return self.to_numpy().item()

    def __bool__(self) -> bool:
        return bool(self.item())

    def __hash__(self) -> int:
        return id(self)

    def __deepcopy__(self, memo: object) -> Tensor:
        return self

    def __dlpack__(self, stream: int | None = None):  # noqa: ANN201 - MAX's signature
        return self._array.__dlpack__(stream=stream)

    def __dlpack_device__(self):  # noqa: ANN201
        return self._array.__dlpack_device__()

    def __repr__(self) -> str:
        return _render(self)

    # -- transfers and casts ---------------------------------------------------------------------
    def to(self, target: Device) -> Tensor:
        """The tensor on ``target`` (``self`` when it is there already).

        Raises:
            NotImplementedError: ``target`` is a DeviceMesh or DeviceMapping.
            TypeError: anything else that is not a Device.
        """
        if not isinstance(target, Device):
            if hasattr(target, "devices") or hasattr(target, "mesh") or hasattr(target, "placements"):
                _not_distributed("target", target)
            raise TypeError(f"to() expects Device, DeviceMesh, or DeviceMapping, got {type(target).__name__}")
        if target == self.device:
            return self
        return Tensor._wrap(_run(ops.transfer_to, self._array, DeviceRef.from_device(target)), self._dtype)

    def cast(self, dtype: DType) -> Tensor:
        """The values as ``dtype`` (``self`` when it has that dtype already). ``ops.cast``."""
        if self._dtype == dtype:
            return self
        return Tensor._wrap(_run(ops.cast, self._array, dtype), dtype)

    # -- shape ops -------------------------------------------------------------------------------
    def _same(self, array: Any) -> Tensor:
        return Tensor._wrap(array, self._dtype)

    def reshape(self, shape: ShapeLike) -> Tensor:
        """``ops.reshape`` (one ``-1`` allowed). Raises ValueError for a different element count."""
        return self._same(_run(ops.reshape, self._array, shape))

    def broadcast_to(self, shape: ShapeLike) -> Tensor:
        """``ops.broadcast_to`` (NumPy's rule)."""
        return self._same(_run(ops.broadcast_to, self._array, shape))

    def permute(self, dims: list[int]) -> Tensor:
        """``ops.permute``."""
        return self._same(_run(ops.permute, self._array, dims))

    def transpose(self, dim1: int, dim2: int) -> Tensor:
        """``ops.transpose`` of two axes."""
        return self._same(_run(ops.transpose, self._array, dim1, dim2))

    @property
    def T(self) -> Tensor:  # noqa: N802 - MAX's name
        """``transpose(-1, -2)``."""
        return self.transpose(-1, -2)

    def squeeze(self, axis: int) -> Tensor:
        """``ops.squeeze`` of a size-1 ``axis``."""
        return self._same(_run(ops.squeeze, self._array, axis))

    def unsqueeze(self, axis: int) -> Tensor:
        """``ops.unsqueeze``: a size-1 axis inserted at ``axis``."""
        return self._same(_run(ops.unsqueeze, self._array, axis))

    def split(self, split_size_or_sections: int | list[int], axis: int = 0) -> list[Tensor]:
        """Pieces along ``axis``: of size ``split_size_or_sections`` (an int; the last may be
        smaller, as PyTorch and MAX) or of the listed sizes (which must add up to the dim).
        ``ops.split``."""
        sizes = split_size_or_sections
        if isinstance(sizes, (int, np.integer)) and not isinstance(sizes, bool):
            n = self._array.shape[_split_axis(axis, self.rank)]
            if sizes <= 0:
                raise ValueError(f"split: split size must be positive, got {sizes}")
            sizes = [int(sizes)] * (n // sizes) + ([n % sizes] if n % sizes else [])
        return [self._same(p) for p in _run(ops.split, self._array, sizes, axis)]

    def __getitem__(self, idx: Any) -> Tensor:
        """``ops.slice_tensor`` (ints, slices, ``None``, ``...``, integer index Tensors)."""
        return self._same(_run(ops.slice_tensor, self._array, _index(idx)))

    def __setitem__(self, idx: Any, val: Any) -> None:
        """Writes ``val`` (a Tensor) into ``self[idx]``: a functional update of the held array (JAX
        arrays are immutable), so views taken earlier keep the old values. MAX's
        ``buffer_store_slice``.

        Raises:
            TypeError: ``val`` is not a Tensor (MAX's rule).
        """
        if not isinstance(val, Tensor):
            raise TypeError("__setitem__ requires a Tensor value; use Buffer indexing for scalar writes.")
        index = _index(idx if isinstance(idx, tuple) else (idx,))
        self._array = _run(apply, _store_slice, self._array, val._array, _name="buffer_store_slice", index=index)

    # -- reductions ------------------------------------------------------------------------------
    def _reduce(self, op: Any, axis: int | None, dtype: DType | None = None) -> Tensor:
        x = self._array if axis is not None else _run(ops.reshape, self._array, [-1])  # [n]
        return Tensor._wrap(_run(op, x, axis=-1 if axis is None else axis), dtype or self._dtype)

    def sum(self, axis: int | None = -1) -> Tensor:
        """Sum over ``axis``, kept with size 1 (``None``: over all, shape ``[1]``). MAX's dtype."""
        return self._reduce(ops.sum, axis)

    def mean(self, axis: int | None = -1) -> Tensor:
        """Mean over ``axis``, kept with size 1 (``None``: shape ``[1]``); an integer mean truncates."""
        return self._reduce(ops.mean, axis)

    def prod(self, axis: int | None = -1) -> Tensor:
        """Product over ``axis``, kept with size 1 (``None``: shape ``[1]``)."""
        return self._reduce(ops.prod, axis)

    def max(self, axis: int | None = -1) -> Tensor:
        """Maximum over ``axis``, kept with size 1 (``None``: shape ``[1]``)."""
        return self._reduce(ops.max, axis)

    def min(self, axis: int | None = -1) -> Tensor:
        """Minimum over ``axis``, kept with size 1 (``None``: shape ``[1]``)."""
        return self._reduce(ops.min, axis)

    def argmax(self, axis: int | None = -1) -> Tensor:
        """Index of the maximum over ``axis`` (first on ties), kept with size 1 (``None``: of the
        flattened tensor, shape ``[1]``); ``int64``."""
        return self._reduce(ops.argmax, axis, DType.int64)

    def clip(self, *, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 - MAX's names
        """Values below ``min`` raised to it, above ``max`` lowered to it (elementwise
        ``ops.max``/``ops.min`` with MAX's promotion)."""
        x: Tensor = self
        if min is not None:
            x = _binary(ops.max, "max", x, min)
        if max is not None:
            x = _binary(ops.min, "min", x, max)
        return x

    # -- operators -------------------------------------------------------------------------------
    def __abs__(self) -> Tensor:
        return self._same(_run(ops.abs, self._array))

    def __neg__(self) -> Tensor:
        return self._same(_run(ops.negate, self._array))

    def __invert__(self) -> Tensor:
        return Tensor._wrap(_run(ops.logical_not, self._array), DType.bool)

    def __eq__(self, rhs: object) -> Tensor:  # type: ignore[override]
        return _binary(ops.equal, "equal", self, rhs, "compare")

    def __ne__(self, rhs: object) -> Tensor:  # type: ignore[override]
        return _binary(ops.not_equal, "not_equal", self, rhs, "compare")

    def __ge__(self, rhs: Any) -> Tensor:
        return _binary(ops.greater_equal, "greater_equal", self, rhs, "compare")

    def __gt__(self, rhs: Any) -> Tensor:
        return _binary(ops.greater, "greater", self, rhs, "compare")

    def __lt__(self, rhs: Any) -> Tensor:
        return ~(self >= rhs)  # MAX's definition (NaN < x is True)

    def __le__(self, rhs: Any) -> Tensor:
        return ~(self > rhs)

    def __add__(self, rhs: Any) -> Tensor:
        return _binary(ops.add, "add", self, rhs)

    def __radd__(self, lhs: Any) -> Tensor:
        return _binary(ops.add, "add", lhs, self)

    def __sub__(self, rhs: Any) -> Tensor:
        return _binary(ops.sub, "sub", self, rhs)

    def __rsub__(self, lhs: Any) -> Tensor:
        return _binary(ops.sub, "sub", lhs, self)

    def __mul__(self, rhs: Any) -> Tensor:
        return _binary(ops.mul, "mul", self, rhs)

    def __rmul__(self, lhs: Any) -> Tensor:
        return _binary(ops.mul, "mul", lhs, self)

    def __truediv__(self, rhs: Any) -> Tensor:
        return _binary(ops.div, "div", self, rhs, "div")

    def __rtruediv__(self, lhs: Any) -> Tensor:
        return _binary(ops.div, "div", lhs, self, "div")

    def __floordiv__(self, rhs: Any) -> Tensor:
        return _binary(ops.floor_div, "floor_div", self, rhs)

    def __rfloordiv__(self, lhs: Any) -> Tensor:
        return _binary(ops.floor_div, "floor_div", lhs, self)

    def __mod__(self, rhs: Any) -> Tensor:
        return _binary(ops.mod, "mod", self, rhs)

    def __rmod__(self, lhs: Any) -> Tensor:
        return _binary(ops.mod, "mod", lhs, self)

    def __divmod__(self, rhs: Any) -> tuple[Tensor, Tensor]:
        return (self // rhs, self % rhs)

    def __rdivmod__(self, lhs: Any) -> tuple[Tensor, Tensor]:
        return (self.__rfloordiv__(lhs), self.__rmod__(lhs))

    def __matmul__(self, rhs: Any) -> Tensor:
        return _binary(ops.matmul, "matmul", self, rhs)

    def __rmatmul__(self, lhs: Any) -> Tensor:
        return _binary(ops.matmul, "matmul", lhs, self)

    def __pow__(self, rhs: Any) -> Tensor:
        return _binary(ops.pow, "pow", self, rhs)

    def __rpow__(self, lhs: Any) -> Tensor:
        return _binary(ops.pow, "pow", lhs, self)

    def __and__(self, rhs: Any) -> Tensor:
        return _binary(ops.logical_and, "logical_and", self, rhs, "compare")

    def __rand__(self, lhs: Any) -> Tensor:
        return _binary(ops.logical_and, "logical_and", lhs, self, "compare")

    def __or__(self, rhs: Any) -> Tensor:
        return _binary(ops.logical_or, "logical_or", self, rhs, "compare")

    def __ror__(self, lhs: Any) -> Tensor:
        return _binary(ops.logical_or, "logical_or", lhs, self, "compare")

    def __xor__(self, rhs: Any) -> Tensor:
        return _binary(ops.logical_xor, "logical_xor", self, rhs, "compare")

    def __rxor__(self, lhs: Any) -> Tensor:
        return _binary(ops.logical_xor, "logical_xor", lhs, self, "compare")


jax.tree_util.register_pytree_node(
    Tensor, lambda t: ((t._array,), t._dtype), lambda dtype, children: Tensor._wrap(children[0], dtype)
)


# -- helpers of the methods ----------------------------------------------------------------------
def _split_axis(axis: int, rank: int) -> int:
    """``axis`` (negative from the end) as an index into ``rank`` dims (IndexError outside, as
    MAX's ``split``)."""
    from maxjax.graph.ops._core import assert_valid_axis

    return assert_valid_axis("split", axis, rank)


def _device_of(array: Any) -> Device:
    try:
        return Device(next(iter(array.devices())))
    except (AttributeError, jax.errors.ConcretizationTypeError):  # a tracer under jax.jit
        return Device(jax.devices()[0])


def _index(idx: Any) -> Any:
    """Tensors inside an index as their arrays."""
    if isinstance(idx, Tensor):
        return idx._array
    if isinstance(idx, tuple):
        return tuple(_index(i) for i in idx)
    return idx


def _operand(x: Any) -> tuple[Any, DType | None]:
    """An operator's operand as the maxjax op takes it, and its declared dtype (None: weak)."""
    if isinstance(x, Tensor):
        return x._array, x._dtype
    if isinstance(x, (Buffer, jax.Array, np.ndarray)) or hasattr(x, "__dlpack__"):
        return _array_of(x)
    return x, None


def _narrowed(dtype: DType) -> bool:
    """True for a dtype JAX holds in fewer bits (64-bit kinds without x64)."""
    return np.dtype(dtype.to_jax()) != np.dtype(dtype.to_numpy())


def _binary(op: Any, name: str, lhs: Any, rhs: Any, kind: str = "arith") -> Tensor:
    """``op`` (a maxjax binary op: MAX's promotion and checks) on the operands' arrays; the result
    has MAX's declared dtype: bool for comparisons and logical ops, float64 for integer ``/``
    integer, else the common dtype of the tensor operands (``int64`` stays ``int64``)."""
    (a, da), (b, db) = _operand(lhs), _operand(rhs)
    if da is not None and db is not None and da != db and (_narrowed(da) or _narrowed(db)):
        # a 64-bit operand held in 32 bits: MAX's rule on the declared dtypes (int32 + float64 is
        # float64; int64 + float32 raises), then both held as the result's dtype for the op
        both_int = da.is_integral() and db.is_integral()
        target = DType.float64 if kind == "div" and both_int else common_dtype(name, da, db)
        a, b = _run(ops.cast, a, target), _run(ops.cast, b, target)
    out = _run(op, a, b)
    strong = [d for d in (da, db) if d is not None]
    if kind == "compare":
        dtype = DType.bool
    elif kind == "div" and all(d.is_integral() for d in strong):
        dtype = DType.float64
    else:
        dtype = strong[0] if len(strong) == 1 else common_dtype(name, *strong)
    if np.dtype(dtype.to_jax()) != out.dtype:  # the op's own result type (bool / int quotients)
        dtype = DType.from_numpy(out.dtype)
    return Tensor._wrap(out, dtype)


# -- printing (MAX's matrix-of-matrices format, max/experimental/_tensor_repr.py) -----------------
_THRESHOLD, _EDGEITEMS, _PRECISION = 1000, 3, 4


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # noqa: PLR0124 - NaN
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return f"{v:.{_PRECISION}g}"
    return str(v)


def _render(t: Tensor) -> str:
    arr = t.to_numpy()
    if arr.dtype.kind == "f" or t.dtype.is_float():
        arr = arr.astype(np.float64)  # Python floats, as MAX's item()
    flat = arr.reshape(-1)
    sample = flat[: min(_THRESHOLD, _EDGEITEMS * 10)] if arr.size > _THRESHOLD else flat
    width = max((len(_fmt(v)) for v in sample.tolist()), default=1)
    body = _render_data(arr, width)
    if arr.ndim >= 2:
        lines = body.split("\n")
        body = "\n".join([f"[{lines[0]}"] + [" " + ln for ln in lines[1:]]) + "]"
    elif arr.ndim == 1:
        body = f"[{body}]"
    return f"Tensor({body}, dtype={t.dtype}, device={t.device})"


def _rows(n: int, summarize: bool) -> list[int | None]:
    if summarize and n > 2 * _EDGEITEMS:
        return [*range(_EDGEITEMS), None, *range(n - _EDGEITEMS, n)]
    return list(range(n))


def _render_data(arr: np.ndarray, width: int) -> str:
    summarize = arr.size > _THRESHOLD  # of this block, as MAX's recursion on tensor[i]
    if arr.ndim == 0:
        return _fmt(arr.item()).rjust(width)
    if arr.ndim == 1:
        return " ".join("..." if i is None else _fmt(arr[i].item()).rjust(width) for i in _rows(len(arr), summarize))
    subs = ["..." if i is None else _render_data(arr[i], width) for i in _rows(len(arr), summarize)]
    if arr.ndim == 2:
        return "\n".join(subs)
    if (arr.ndim - 2) % 2 == 1:  # 3D, 5D, ...: side by side
        sep = ":" * ((arr.ndim - 3) // 2) if arr.ndim >= 5 else "|"
        blocks = [s.split("\n") for s in subs]
        height = max(len(b) for b in blocks)
        widths = [max((len(ln) for ln in b), default=0) for b in blocks]
        padded = [[b[i].ljust(w) if i < len(b) else " " * w for i in range(height)] for b, w in zip(blocks, widths)]
        joiner = f" {sep} " if sep else " "
        return "\n".join(joiner.join(p[i] for p in padded) for i in range(height))
    sep_lines = (arr.ndim - 4) // 2 if arr.ndim >= 6 else 0  # 4D, 6D, ...: stacked
    if sep_lines == 0:
        return "\n\n".join(subs)
    wmax = max((len(ln) for s in subs for ln in s.split("\n")), default=0)
    return ("\n" + "\n".join("-" * wmax for _ in range(sep_lines)) + "\n").join(subs)
