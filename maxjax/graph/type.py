"""Graph types: ``Dim``, ``Shape``, ``DeviceRef``, ``TensorType`` (MAX's ``max.graph.type``).

Symbolic dimensions are JAX's own: every :class:`SymbolicDim` is a ``jax.export`` symbolic
dimension in one maxjax-wide ``jax.export.SymbolicScope``, so shapes of graph values are inferred by
``jax.eval_shape`` and algebra on dims (``Dim("a") * 2``) is JAX's dim algebra.
"""

from __future__ import annotations

import enum
import functools
import operator
import re
from typing import Any, Iterable, Union

import jax
from jax import export as jax_export

from maxjax.dtype import DType

__all__ = [
    "Type",
    "ConvInputLayout",
    "FilterLayout",
    "BufferType",
    "Dim",
    "StaticDim",
    "SymbolicDim",
    "AlgebraicDim",
    "Shape",
    "ShapeLike",
    "DimLike",
    "DeviceKind",
    "DeviceRef",
    "TensorType",
]

#: The one scope every maxjax symbolic dimension lives in (JAX requires a shared scope).
SCOPE = jax_export.SymbolicScope()


@functools.lru_cache(maxsize=None)
def _symbol(name: str) -> Any:
    (expr,) = jax_export.symbolic_shape(name, scope=SCOPE)
    return expr


def _is_dim_expr(x: Any) -> bool:
    return type(x).__name__ == "_DimExpr"


class Dim:
    """A tensor dimension: static (``Dim(3)``), symbolic (``Dim("batch")``) or algebraic.

    ``Dim(value)`` dispatches on the value: an int gives a :class:`StaticDim`, a string a
    :class:`SymbolicDim`, a JAX dim expression an :class:`AlgebraicDim` (or the simpler kinds).
    Dims compare equal to ints and to each other; arithmetic gives new Dims.
    """

    __slots__ = ()

    def __new__(cls, value: Any = None) -> "Dim":
        if cls is not Dim:
            return object.__new__(cls)
        if isinstance(value, Dim):
            return value
        if isinstance(value, bool):
            raise TypeError(f"a bool is not a dimension: {value!r}")
        if isinstance(value, int) or hasattr(value, "__index__") and not isinstance(value, str) and not _is_dim_expr(value):
            return StaticDim(int(value))
        if isinstance(value, str):
            return SymbolicDim(value)
        if _is_dim_expr(value):
            return Dim.from_expr(value)
        raise TypeError(f"Unsupported dimension type {type(value).__name__}: {value!r}")

    @staticmethod
    def from_expr(expr: Any) -> "Dim":
        """The Dim of an int or a JAX symbolic dimension expression."""
        if isinstance(expr, int):
            return StaticDim(expr)
        text = str(expr)
        if text.isidentifier():
            return SymbolicDim(text)
        return AlgebraicDim(expr)

    # The JAX form: an int or a symbolic expression in SCOPE.
    def to_expr(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def evaluate(self, env: dict[str, int]) -> int:
        """The concrete size of this dim, given sizes for the symbols it uses."""
        raise NotImplementedError  # pragma: no cover

    def _binop(self, other: Any, op: str) -> "Dim":
        a, b = self.to_expr(), Dim(other).to_expr()
        return Dim.from_expr(getattr(operator, op)(a, b))

    def __add__(self, other: Any) -> "Dim":
        return self._binop(other, "__add__")

    def __radd__(self, other: Any) -> "Dim":
        return Dim(other)._binop(self, "__add__")

    def __sub__(self, other: Any) -> "Dim":
        return self._binop(other, "__sub__")

    def __rsub__(self, other: Any) -> "Dim":
        return Dim(other)._binop(self, "__sub__")

    def __mul__(self, other: Any) -> "Dim":
        return self._binop(other, "__mul__")

    def __rmul__(self, other: Any) -> "Dim":
        return Dim(other)._binop(self, "__mul__")

    def __floordiv__(self, other: Any) -> "Dim":
        return self._binop(other, "__floordiv__")

    def __neg__(self) -> "Dim":
        return Dim(0) - self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Dim, int, str)) and not isinstance(other, bool):
            try:
                return _same(self.to_expr(), Dim(other).to_expr())
            except TypeError:
                return False
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash(str(self.to_expr()))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, int) or isinstance(b, int):
        return False
    return str(a) == str(b)


class StaticDim(Dim):
    """A dimension of known size. ``int(dim)`` and ``operator.index(dim)`` give the size."""

    __slots__ = ("dim",)

    def __init__(self, dim: int):
        if isinstance(dim, Dim):  # Dim(existing_dim) returns it as it is
            return
        dim = int(dim)
        if dim < -(2**63) or dim >= 2**63:
            raise ValueError(f"Dim value must be representable as int64, got {dim}")
        self.dim = dim

    def to_expr(self) -> int:
        return self.dim

    def evaluate(self, env: dict[str, int]) -> int:
        return self.dim

    def __int__(self) -> int:
        return self.dim

    def __index__(self) -> int:
        return self.dim

    def __lt__(self, other: Any) -> bool:
        return self.dim < int(other)

    def __le__(self, other: Any) -> bool:
        return self.dim <= int(other)

    def __gt__(self, other: Any) -> bool:
        return self.dim > int(other)

    def __ge__(self, other: Any) -> bool:
        return self.dim >= int(other)

    def __hash__(self) -> int:
        return hash(self.dim)

    def __repr__(self) -> str:
        return f"Dim({self.dim})"

    def __str__(self) -> str:
        return str(self.dim)


_DIM_NAME = re.compile(r"[a-zA-Z_]\w*")


class SymbolicDim(Dim):
    """A named dimension whose size is bound when the graph runs (``Dim("batch")``)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        if isinstance(name, Dim):
            return
        # MAX 26.7's rule: an ASCII letter or "_" first, then word characters ("aº" is fine, "º" is not)
        if not isinstance(name, str) or not _DIM_NAME.fullmatch(name):
            raise ValueError(f"Invalid name for symbolic dimension: {name!r} (must be an identifier)")
        self.name = name

    def to_expr(self) -> Any:
        return _symbol(self.name)

    def evaluate(self, env: dict[str, int]) -> int:
        try:
            return env[self.name]
        except KeyError:
            raise ValueError(f"symbolic dimension {self.name!r} has no size here (known: {sorted(env)})") from None

    def __hash__(self) -> int:
        return hash(self.name)

    def __int__(self) -> int:
        raise TypeError(f"int({self!r}): Int conversions only supported for static dims")

    def __repr__(self) -> str:
        return f"Dim({self.name!r})"

    def __str__(self) -> str:
        return self.name


class AlgebraicDim(Dim):
    """A dimension computed from others (``Dim("a") * 2`` prints as ``2*a``)."""

    __slots__ = ("expr",)

    def __init__(self, expr: Any):
        if isinstance(expr, Dim):
            return
        self.expr = expr

    def to_expr(self) -> Any:
        return self.expr

    def evaluate(self, env: dict[str, int]) -> int:
        try:
            value = self.expr._evaluate(env)
        except KeyError as e:
            raise ValueError(f"dimension {self} uses {e} which has no size here (known: {sorted(env)})") from None
        return value if _is_dim_expr(value) else int(value)

    def __int__(self) -> int:
        raise TypeError(f"int({self!r}): Int conversions only supported for static dims")

    def __repr__(self) -> str:
        return f"Dim({str(self.expr)!r})"

    def __str__(self) -> str:
        return str(self.expr)


DimLike = Union[int, str, Dim]
ShapeLike = Iterable[DimLike]


class Shape(list):
    """A list of :class:`Dim` (MAX's ``Shape``; ``Shape([2, "batch"])``).

    As in MAX it is a list subclass: ``Shape([4, 3]) == [4, 3]``. Unlike MAX, it also equals the
    tuple ``(4, 3)``, the spelling JAX users write.
    """

    def __init__(self, dims: ShapeLike = ()):
        super().__init__(Dim(d) for d in dims)

    @property
    def rank(self) -> int:
        return len(self)

    @property
    def static_dims(self) -> list[int]:
        """The sizes of the static dims (symbolic ones left out), as MAX returns them."""
        return [d.dim for d in self if isinstance(d, StaticDim)]

    @staticmethod
    def is_static(shape: "Shape") -> bool:
        return all(isinstance(d, StaticDim) for d in shape)

    def to_exprs(self) -> tuple[Any, ...]:
        """The JAX form: a tuple of ints and symbolic expressions."""
        return tuple(d.to_expr() for d in self)

    def evaluate(self, env: dict[str, int]) -> tuple[int, ...]:
        return tuple(d.evaluate(env) for d in self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]

    def __getitem__(self, idx: Any) -> Any:
        out = super().__getitem__(idx)
        return Shape(out) if isinstance(idx, slice) else out

    def __repr__(self) -> str:
        return "[" + ", ".join(repr(d) for d in self) + "]"

    def __str__(self) -> str:
        return "[" + ", ".join(str(d) for d in self) + "]"


class DeviceKind(str, enum.Enum):
    """The kind of device a :class:`DeviceRef` names."""

    CPU = "cpu"
    GPU = "gpu"
    TPU = "tpu"

    def __str__(self) -> str:
        return self.value


class DeviceRef:
    """A reference to a device by kind and id (MAX's ``DeviceRef``): ``DeviceRef.CPU()``, ``DeviceRef.GPU(1)``.

    It maps to a JAX device with :meth:`to_device` (``jax.devices(kind)[id]``). ``str()`` gives ``"cpu:0"``.
    """

    __slots__ = ("device_type", "id")

    def __init__(self, device_type: DeviceKind | str, id: int = 0):
        try:
            self.device_type = DeviceKind(str(device_type).lower())
        except ValueError:
            raise ValueError(
                f"Unknown device kind {device_type!r}: expected one of {[k.value for k in DeviceKind]}"
            ) from None
        if not isinstance(id, int) or id < 0:
            raise ValueError(f"Device id must be a non-negative int, got {id!r}")
        self.id = id

    @staticmethod
    def CPU(id: int = 0) -> "DeviceRef":
        return DeviceRef(DeviceKind.CPU, id)

    @staticmethod
    def GPU(id: int = 0) -> "DeviceRef":
        return DeviceRef(DeviceKind.GPU, id)

    @staticmethod
    def TPU(id: int = 0) -> "DeviceRef":
        return DeviceRef(DeviceKind.TPU, id)

    def is_cpu(self) -> bool:
        return self.device_type is DeviceKind.CPU

    def is_gpu(self) -> bool:
        return self.device_type is DeviceKind.GPU

    def is_tpu(self) -> bool:
        return self.device_type is DeviceKind.TPU

    @staticmethod
    def from_device(device: Any) -> "DeviceRef":
        """The ref of a :class:`~maxjax.driver.Device`, a ``jax.Device`` or a DeviceRef."""
        from maxjax.driver import Device

        if isinstance(device, DeviceRef):
            return device
        if isinstance(device, Device):
            device = device.jax_device
        if isinstance(device, jax.Device):
            kind = "gpu" if device.platform in ("cuda", "rocm", "gpu") else device.platform
            platform_devs = [d for d in jax.devices(device.platform)]
            return DeviceRef(kind, platform_devs.index(device))
        raise TypeError(f"expected a Device, jax.Device or DeviceRef, got {device!r}")

    def to_device(self) -> Any:
        """The :class:`~maxjax.driver.Device` this ref names.

        Raises:
            ValueError: JAX has no such device (naming the kind, the id and what JAX has).
        """
        from maxjax.driver import Device

        return Device(self.jax_device())

    def jax_device(self) -> jax.Device:
        kind = self.device_type.value
        platforms = ("cuda", "rocm", "gpu") if kind == "gpu" else (kind,)
        devs: list[jax.Device] = []
        for p in platforms:
            try:
                devs = jax.devices(p)
                break
            except RuntimeError:
                continue
        if self.id >= len(devs):
            have = sorted({f"{d.platform}:{i}" for i, d in enumerate(jax.devices())})
            raise ValueError(f"Unknown device {self}: JAX has {len(devs)} {kind} device(s) (available: {have})")
        return devs[self.id]

    def to_mlir(self) -> str:
        return str(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceRef) and (self.device_type, self.id) == (other.device_type, other.id)

    def __hash__(self) -> int:
        return hash((self.device_type, self.id))

    def __repr__(self) -> str:
        return f"DeviceRef({self.device_type.value!r}, {self.id})"

    def __str__(self) -> str:
        return f"{self.device_type.value}:{self.id}"


class Type:
    """The base of graph value types (MAX's ``max.graph.Type``, there over an MLIR type):
    :class:`TensorType` and :class:`BufferType`."""

    __slots__ = ()

    def __class_getitem__(cls, item: Any) -> type:  # MAX's Type is generic: ``Type[Any]`` in annotations
        return cls


class TensorType(Type):
    """The type of a tensor value: dtype, shape (static and symbolic dims) and device.

    ``TensorType(DType.float32, ["batch", 4], DeviceRef.CPU())``.
    """

    __slots__ = ("dtype", "shape", "device", "_layout")

    def __init__(self, dtype: DType, shape: ShapeLike, device: Any = None, _layout: Any = None):
        if not isinstance(dtype, DType):
            dtype = DType.of(dtype)
        self.dtype = dtype
        self.shape = Shape(shape)
        if any(isinstance(d, StaticDim) and d.dim < 0 for d in self.shape):
            # MAX 26.7 raises TypeError here (so does a Graph given such an input type).
            raise TypeError(
                "Static tensor dimensions must be non-negative; got shape=["
                + ", ".join(str(d) for d in self.shape) + "]"
            )
        self._layout = _layout  # MAX's FilterLayout of a conv filter; None for other tensors
        self.device = DeviceRef.CPU() if device is None else DeviceRef.from_device(device)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def num_elements(self) -> int:
        if not Shape.is_static(self.shape):
            raise TypeError(f"num_elements of {self} is not static")
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    def cast(self, dtype: DType) -> "TensorType":
        return TensorType(dtype, self.shape, self.device)

    def as_buffer(self) -> "BufferType":
        """The same type as a mutable buffer (MAX's ``as_buffer``)."""
        return BufferType(self.dtype, self.shape, self.device)

    def to_shape_dtype_struct(self) -> jax.ShapeDtypeStruct:
        """The JAX abstract value (symbolic dims as ``jax.export`` expressions)."""
        return jax.ShapeDtypeStruct(self.shape.to_exprs(), self.dtype.to_jax())

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TensorType)
            and isinstance(other, BufferType) == isinstance(self, BufferType)
            and self.dtype == other.dtype
            and self.shape == other.shape
            and self.device == other.device
        )

    def __hash__(self) -> int:
        return hash((self.dtype, tuple(str(d) for d in self.shape), self.device))

    def __repr__(self) -> str:
        return f"TensorType(dtype={self.dtype.name}, shape={self.shape!r}, device={self.device})"


class BufferType(TensorType):
    """The type of a mutable buffer (MAX's ``BufferType(dtype, shape, device)``): a graph input
    whose value the graph may replace (``ops.buffer_store``); the caller's
    :class:`~maxjax.driver.Buffer` then holds the new value after ``Model.execute`` (see
    :class:`~maxjax.graph.buffer.BufferValue`)."""

    def as_tensor(self) -> TensorType:
        """The same type as an immutable tensor."""
        return TensorType(self.dtype, self.shape, self.device)

    def cast(self, dtype: DType) -> "BufferType":
        return BufferType(dtype, self.shape, self.device)

    def __hash__(self) -> int:
        return hash(("buffer", self.dtype, tuple(str(d) for d in self.shape), self.device))

    def __repr__(self) -> str:
        return f"BufferType(dtype={self.dtype.name}, shape={self.shape!r}, device={self.device})"


class FilterLayout(str, enum.Enum):
    """Axis order of a convolution filter (MAX's ``FilterLayout``): R, S (and Q) spatial, C input
    channels, F output channels."""

    RSCF = "RSCF"
    QRSCF = "QRSCF"
    FCRS = "FCRS"
    FCQRS = "FCQRS"
    CFRS = "CFRS"


class ConvInputLayout(str, enum.Enum):
    """Axis order of a convolution input (MAX's ``ConvInputLayout``)."""

    NHWC = "NHWC"
    NCHW = "NCHW"
