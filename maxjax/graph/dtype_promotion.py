"""MAX's dtype promotion helpers (``max.graph.dtype_promotion``) over maxjax's one implementation.

The rules (MAX 26.7, ``max/graph/dtype_promotion.py``) live in :mod:`maxjax.graph.ops.elementwise`
(``promote``, ``common_dtype``, ``_weak_to``, ``_FULL_PRECISION``); this module gives them MAX's
names. A weak value (a Python int/float, a NumPy array, a :class:`~maxjax.driver.Buffer`) takes
the strong dtype only when every value is exactly representable in it ("Unsafe cast" ValueError
otherwise); a float value never becomes an integer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxjax.dtype import DType
from maxjax.graph.ops.elementwise import _FULL_PRECISION, _is_strong, _strong, _weak_to, _unary_operand
from maxjax.graph.type import DeviceRef, StaticDim
from maxjax.graph.value import TensorValue

__all__: list[str] = []

#: For each DType, the integers it holds exactly (MAX's table; maxjax's one copy).
_DTYPE_MIN_AND_MAX_FULL_PRECISION = _FULL_PRECISION


def _as_tensor(x: Any) -> Any:
    x = _strong(x)
    return x if isinstance(x, TensorValue) else TensorValue(x)


def _is_strong_tensor_value_like(value: Any) -> bool:
    """MAX's test: a graph value or Dim (a Buffer or NumPy array is a weak, external array)."""
    from maxjax.driver import Buffer

    return _is_strong(value) and not isinstance(value, (Buffer, np.ndarray))


def _restrict_to_strong_dtypes(value: Any) -> TensorValue:
    """``value`` as a TensorValue; a Python/NumPy value raises TypeError (MAX's unary-op rule)."""
    return _as_tensor(_unary_operand("unary op", value))


def _promote_to_strong(value: Any, strong_dtype: DType, device: DeviceRef) -> TensorValue:
    """A weak ``value`` as a constant of ``strong_dtype`` on ``device``; a strong one unchanged.

    Raises:
        ValueError: "Unsafe cast": an int outside ``strong_dtype``'s exact range, or a float (or
            float array) meeting an integer/bool dtype.
        TypeError: ``value`` is not tensor-like.
    """
    from maxjax.driver import Buffer
    from maxjax.graph.ops.shape import literal_constant as constant

    if isinstance(value, StaticDim):
        value = int(value)
    if _is_strong_tensor_value_like(value):
        return _as_tensor(value)
    if isinstance(value, Buffer):
        value = value.to_numpy()
    if not isinstance(value, (bool, int, float, np.generic, np.ndarray)):
        raise TypeError(f"_promote_weak_dtypes() argument must be a TensorValueLike, not '{type(value).__name__}'")
    return constant(_weak_to("_promote_to_strong", value, strong_dtype), strong_dtype, device)


def _promote_weak_dtypes(x: Any, y: Any) -> tuple[TensorValue, TensorValue]:
    """Both operands as TensorValues: a weak one takes the other's dtype and device (MAX's rule;
    two strong operands are returned as they are: their promotion is the op's).

    Raises:
        TypeError: neither operand is a graph value.
        ValueError: the weak operand does not fit the strong dtype ("Unsafe cast").
    """
    xs, ys = _is_strong_tensor_value_like(x), _is_strong_tensor_value_like(y)
    if xs and ys:
        return _as_tensor(x), _as_tensor(y)
    if not xs and not ys:
        raise TypeError(
            "Binary ops require at least one max object as input. Non-max objects tend to overpromote the "
            "dtype, leading to significant loss of performance. Please explicitly convert at least one input "
            "to a graph.Value. This can be done with ops.constant."
        )
    strong = _as_tensor(x if xs else y)
    device = strong.device or DeviceRef.CPU()
    if xs:
        return strong, _promote_to_strong(y, strong.dtype, device)
    return _promote_to_strong(x, strong.dtype, device), strong
