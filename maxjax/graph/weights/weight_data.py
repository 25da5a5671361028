"""``WeightData``: one weight's data with its name, dtype, shape and quantization encoding.

Seed ``max-graph-weights-WeightData.txt``; MAX 26.7's behaviour (``../shared/max-api-26.7.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from maxjax.driver import Buffer, DLPackArray
from maxjax.dtype import DType
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.quantization import dequantize as _dequantize
from maxjax.graph.type import Shape
from maxjax.graph.weights._host import jax_holds_exactly

__all__ = ["WeightData", "is_lossy_cast"]


def is_lossy_cast(src: DType, dst: DType) -> bool:
    """True when casting ``src`` to ``dst`` can change values beyond rounding.

    Lossy: float to integer or bool, anything but bool to bool, integer to a narrower integer, and
    signed to unsigned integer. Not lossy: integer to float, float to a narrower float (float32 to
    bfloat16 rounds; that is what such a cast is for), bool to anything.
    """
    if src == dst or src is DType.bool:
        return False
    if dst is DType.bool:
        return True
    if src.is_float():
        return not dst.is_float()
    if dst.is_float():
        return False
    # integer -> integer
    if src.is_signed_integral() and dst.is_unsigned_integral():
        return True
    if src.is_unsigned_integral() and dst.is_signed_integral():
        return dst.size_in_bytes <= src.size_in_bytes
    return dst.size_in_bytes < src.size_in_bytes


def _wrap_loaded(data: Any) -> Any:
    """A Buffer around a loaded ``jax.Array``; NumPy arrays (64-bit kinds) stay as they are."""
    return Buffer(data) if isinstance(data, jax.Array) else data


def _wrap(host: np.ndarray) -> Any:
    """A Buffer for dtypes JAX holds exactly, else the NumPy array itself."""
    if jax_holds_exactly(host.dtype):
        return Buffer(jax.device_put(host))
    return host


@dataclass(eq=False)
class WeightData(DLPackArray):
    """A weight's data plus its metadata (MAX's ``max.graph.weights.WeightData``).

    ``data()`` of every ``Weights`` source returns one. For a quantized GGUF tensor ``dtype`` is
    ``DType.uint8`` and ``shape`` is the packed ``[rows, bytes_per_row]``; ``original_shape`` is the
    float tensor's shape and ``quantization_encoding`` the block format.

    Attributes:
        data: the values: a :class:`~maxjax.driver.Buffer` (a ``jax.Array``) for every dtype JAX
            holds exactly; a read-only NumPy array for 64-bit kinds when ``jax_enable_x64`` is off
            (so no value is narrowed); whatever was given to the constructor otherwise.
        name: hierarchical name (``"layers.0.mlp.up_proj.weight"``).
        dtype: element type (``DType.uint8`` for packed blocks).
        shape: shape as a :class:`~maxjax.graph.type.Shape` (a list of ``Dim``).
        quantization_encoding: block format of packed data, or None.
        original_shape: the logical float shape of packed data (None for plain tensors).
    """

    data: Any
    name: str
    dtype: DType
    shape: Shape
    quantization_encoding: QuantizationEncoding | None = None
    original_shape: Shape | None = None

    def __post_init__(self) -> None:
        self.dtype = DType.of(self.dtype)
        self.shape = Shape(self.shape)
        if self.original_shape is not None:
            self.original_shape = Shape(self.original_shape)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_numpy(cls, arr: np.ndarray, name: str) -> "WeightData":
        """WeightData of a NumPy array (kept as it is: no copy); dtype and shape from the array.

        Raises:
            ValueError: the array's dtype has no ``DType`` (complex, strings, objects).
        """
        arr = np.asarray(arr)
        return cls(arr, name, DType.from_numpy(arr.dtype), Shape(arr.shape))

    # -- views and conversions ---------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of the data (of the packed blocks for quantized data)."""
        n = 1
        for d in self.shape:
            n *= int(d)
        return n * self.dtype.size_in_bytes

    def to_numpy(self) -> np.ndarray:
        """The data as a NumPy array (a host copy for device data)."""
        data = self.data
        if isinstance(data, np.ndarray):
            return data
        if isinstance(data, Buffer):
            return data.to_numpy()
        if isinstance(data, jax.Array):
            return np.asarray(data)
        return np.from_dlpack(data) if hasattr(data, "__dlpack__") else np.asarray(data)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype)

    def to_jax(self) -> jax.Array:
        """The data as a ``jax.Array`` (no copy for Buffer-backed data).

        64-bit kinds become 32-bit unless ``jax_enable_x64`` is on (JAX's rule).
        """
        data = self.data
        if isinstance(data, Buffer):
            return data.to_jax()
        if isinstance(data, jax.Array):
            return data
        return jax.device_put(self.to_numpy())

    def to_buffer(self) -> Buffer:
        """Makes ``data`` a :class:`~maxjax.driver.Buffer` (in place, as MAX does) and returns it."""
        if not isinstance(self.data, Buffer):
            self.data = Buffer(self.to_jax())
        return self.data

    def dequantize(self) -> "WeightData":
        """The float32 tensor of quantized data (``original_shape``); ``self`` if not quantized.

        Uses :func:`maxjax.graph.quantization.dequantize` (bit-identical to ``gguf``'s numpy
        dequantizer).

        Raises:
            ValueError: the encoding has no dequantizer (GPTQ).
        """
        enc = self.quantization_encoding
        if enc is None:
            return self
        packed = self.to_jax()
        rows = packed.reshape(-1, packed.shape[-1]) if packed.ndim != 2 else packed
        out = _dequantize(enc, rows)
        shape = self.original_shape if self.original_shape is not None else Shape(out.shape)
        out = out.reshape(tuple(int(d) for d in shape))
        return WeightData(Buffer(out), self.name, DType.float32, shape)

    def astype(self, dtype: DType, *, allow_lossy: bool = False) -> "WeightData":
        """The data converted to ``dtype`` (on the host; bfloat16 and float8 without torch).

        Returns ``self`` when the dtype is already ``dtype``. Otherwise returns a new Buffer-backed
        WeightData that drops ``quantization_encoding`` (as MAX). Quantized data is dequantized
        first (MAX would convert the packed bytes), so ``astype(DType.float32)`` of a Q4_1 tensor
        is the float tensor.

        Args:
            dtype: target dtype.
            allow_lossy: allow casts that can change values beyond rounding (float to int, to
                bool, narrowing or sign-changing integer casts; see :func:`is_lossy_cast`).

        Raises:
            ValueError: a lossy cast without ``allow_lossy=True``, or quantized data to a
                non-float dtype.
        """
        dtype = DType.of(dtype)
        if dtype == self.dtype and self.quantization_encoding is None:
            return self
        if self.quantization_encoding is not None:
            if not dtype.is_float():
                raise ValueError(
                    f"Cannot convert quantized weight {self.name!r} ({self.quantization_encoding.value} blocks) to "
                    f"{dtype!r}: dequantize to a float dtype first"
                )
            return self.dequantize().astype(dtype)
        if is_lossy_cast(self.dtype, dtype) and not allow_lossy:
            raise ValueError(
                f"Refusing a lossy conversion of weight {self.name!r} from {self.dtype!r} to {dtype!r} "
                "(values can change); pass allow_lossy=True to convert anyway"
            )
        host = self.to_numpy().astype(dtype.to_numpy())
        return WeightData(_wrap(host), self.name, dtype, Shape(self.shape))

    # -- DLPack ------------------------------------------------------------------------------
    def _dlpack_source(self) -> Any:
        data = self.data
        if hasattr(data, "__dlpack__") and not isinstance(data, np.ndarray):
            return data
        if isinstance(data, np.ndarray) and data.dtype.kind in "biuf" and data.dtype.isbuiltin:
            return data
        return self.to_jax()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._dlpack_source().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._dlpack_source().__dlpack_device__()

    def __repr__(self) -> str:
        enc = f", {self.quantization_encoding.value}" if self.quantization_encoding is not None else ""
        return f"WeightData({self.dtype!r}, {self.shape!r}{enc})"
