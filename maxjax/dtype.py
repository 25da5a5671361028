"""``maxjax.dtype``: MAX's ``DType`` enum, mapped onto NumPy / JAX dtypes.

Mirrors ``max.dtype.DType`` (MAX 26.7): the same members with the same integer values. Every member
that JAX can hold maps to a NumPy dtype (the low-precision float kinds through ``ml_dtypes``), so
unlike MAX, ``DType.bfloat16.to_numpy()`` works.

64-bit kinds (``int64``, ``uint64``, ``float64``) are held by JAX only when ``jax_enable_x64`` is on;
otherwise JAX canonicalises them to their 32-bit kinds. maxjax never flips that global switch.
"""

from __future__ import annotations

import enum
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["DType"]


class DType(enum.Enum):
    """The element type of a tensor (MAX's ``DType``; the values are MAX 26.7's)."""

    bool = 1
    int8 = 135
    int16 = 137
    int32 = 139
    int64 = 141
    uint8 = 134
    uint16 = 136
    uint32 = 138
    uint64 = 140
    float16 = 79
    float32 = 81
    float64 = 82
    bfloat16 = 80
    float4_e2m1fn = 64
    float6_e2m3fn = 65
    float6_e3m2fn = 66
    float8_e8m0fnu = 73
    float8_e4m3fn = 75
    float8_e4m3fnuz = 76
    float8_e5m2 = 77
    float8_e5m2fnuz = 78

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    __str__ = __repr__

    # -- conversions -------------------------------------------------------------------------
    def to_numpy(self) -> np.dtype:
        """The NumPy dtype of this DType (``ml_dtypes`` kinds for bfloat16 and the small floats)."""
        return _TO_NUMPY[self]

    @classmethod
    def from_numpy(cls, dtype: Any) -> "DType":
        """The DType of a NumPy dtype (or anything ``np.dtype`` accepts, such as ``jnp.float32``).

        Raises:
            ValueError: the dtype has no DType (for example complex64 or a string dtype).
        """
        try:
            key = np.dtype(dtype)
        except TypeError as e:
            raise ValueError(f"unsupported NumPy dtype to convert to DType: {dtype!r}") from e
        try:
            return _FROM_NUMPY[key]
        except KeyError:
            raise ValueError(f"unsupported NumPy dtype to convert to DType: {key}") from None

    def to_jax(self) -> np.dtype:
        """The dtype JAX uses for this DType (64-bit kinds become 32-bit unless x64 is enabled)."""
        import jax

        return jax.dtypes.canonicalize_dtype(_TO_NUMPY[self])

    @classmethod
    def from_jax(cls, dtype: Any) -> "DType":
        """The DType of a JAX / jnp dtype (same as :meth:`from_numpy`)."""
        return cls.from_numpy(dtype)

    @classmethod
    def of(cls, value: Any) -> "DType":
        """The DType of a value: a DType, a NumPy/JAX dtype, or anything with a ``.dtype``."""
        if isinstance(value, DType):
            return value
        dt = getattr(value, "dtype", value)
        if isinstance(dt, DType):
            return dt
        return cls.from_numpy(dt)

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype, so that ``np.dtype(DType.float32)`` and ``jnp.zeros(3, DType.float32)`` work."""
        return _TO_NUMPY[self]

    # -- properties --------------------------------------------------------------------------
    @property
    def size_in_bits(self) -> int:
        """Bits of one element (4 for float4_e2m1fn, 6 for the float6 kinds, 8 for bool)."""
        return _BITS.get(self, np.dtype(_TO_NUMPY[self]).itemsize * 8)

    @property
    def size_in_bytes(self) -> int:
        """Bytes one element occupies in memory (the float4/float6 kinds are stored in a byte)."""
        return np.dtype(_TO_NUMPY[self]).itemsize

    @property
    def align(self) -> int:
        """The default alignment in bytes of an array of this dtype (its element size)."""
        return self.size_in_bytes

    def is_integral(self) -> bool:
        """True for the signed and unsigned integer kinds (not bool)."""
        return self in _SIGNED or self in _UNSIGNED

    def is_signed_integral(self) -> bool:
        return self in _SIGNED

    def is_unsigned_integral(self) -> bool:
        return self in _UNSIGNED

    def is_float(self) -> bool:
        """True for every floating-point kind, float8/6/4 included."""
        return self not in _SIGNED and self not in _UNSIGNED and self is not DType.bool

    def is_half(self) -> bool:
        """True for the 16-bit float kinds (float16, bfloat16)."""
        return self in (DType.float16, DType.bfloat16)

    def is_float8(self) -> bool:
        """True for the 8-bit float kinds."""
        return self in _FLOAT8

    def finfo(self) -> Any:
        """``ml_dtypes.finfo`` of a float kind.

        Raises:
            ValueError: the DType is not a float kind.
        """
        if not self.is_float():
            raise ValueError(f"finfo is only defined for float dtypes, got {self!r}")
        return ml_dtypes.finfo(_TO_NUMPY[self])


_TO_NUMPY: dict[DType, np.dtype] = {
    DType.bool: np.dtype(np.bool_),
    DType.int8: np.dtype(np.int8),
    DType.int16: np.dtype(np.int16),
    DType.int32: np.dtype(np.int32),
    DType.int64: np.dtype(np.int64),
    DType.uint8: np.dtype(np.uint8),
    DType.uint16: np.dtype(np.uint16),
    DType.uint32: np.dtype(np.uint32),
    DType.uint64: np.dtype(np.uint64),
    DType.float16: np.dtype(np.float16),
    DType.float32: np.dtype(np.float32),
    DType.float64: np.dtype(np.float64),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.float4_e2m1fn: np.dtype(ml_dtypes.float4_e2m1fn),
    DType.float6_e2m3fn: np.dtype(ml_dtypes.float6_e2m3fn),
    DType.float6_e3m2fn: np.dtype(ml_dtypes.float6_e3m2fn),
    DType.float8_e8m0fnu: np.dtype(ml_dtypes.float8_e8m0fnu),
    DType.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.float8_e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DType.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.float8_e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
}
_FROM_NUMPY: dict[np.dtype, DType] = {v: k for k, v in _TO_NUMPY.items()}
_BITS = {DType.float4_e2m1fn: 4, DType.float6_e2m3fn: 6, DType.float6_e3m2fn: 6}
_SIGNED = frozenset({DType.int8, DType.int16, DType.int32, DType.int64})
_UNSIGNED = frozenset({DType.uint8, DType.uint16, DType.uint32, DType.uint64})
_FLOAT8 = frozenset(
    {
        DType.float8_e8m0fnu,
        DType.float8_e4m3fn,
        DType.float8_e4m3fnuz,
        DType.float8_e5m2,
        DType.float8_e5m2fnuz,
    }
)
