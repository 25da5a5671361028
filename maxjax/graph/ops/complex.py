"""MAX's ``max.graph.ops.complex``: complex numbers held as a last dim of 2 (real, imaginary).

``as_interleaved_complex`` is defined in :mod:`maxjax.graph.ops.signal` (re-exported here, MAX's
module path); :func:`mul` is one jnp function over the broadcast operands.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from maxjax.graph.ops._core import apply
from maxjax.graph.ops.elementwise import promote
from maxjax.graph.ops.signal import as_interleaved_complex

__all__ = ["as_interleaved_complex", "mul"]


def _complex_mul(a: Any, b: Any, *, dtype: Any) -> Any:
    # a: [..., 2], b: [..., 2] (broadcasting) -> [..., 2]: (ar*br - ai*bi, ar*bi + ai*br)
    calc = jnp.int32 if dtype == jnp.bool_ else dtype  # bool: integer arithmetic, then nonzero
    a, b = a.astype(calc), b.astype(calc)
    ar, ai, br, bi = a[..., 0], a[..., 1], b[..., 0], b[..., 1]
    return jnp.stack([ar * br - ai * bi, ar * bi + ai * br], axis=-1).astype(dtype)


def mul(lhs: Any, rhs: Any) -> Any:
    """The complex product of two tensors whose last dim (2) holds (real, imaginary); the other
    dims broadcast, and the dtypes promote as ``ops.mul`` (MAX's ``ops.complex.mul``).

    Raises:
        ValueError: either operand is a scalar or its last dim is not 2; dims that do not
            broadcast; dtypes that do not promote.
    """
    lhs, rhs, dtype = promote("complex.mul", lhs, rhs)
    ls, rs = tuple(getattr(lhs, "shape", ())), tuple(getattr(rhs, "shape", ()))
    if not (ls and rs and ls[-1] == rs[-1] == 2):
        raise ValueError(
            f"Complex-valued tensors must be 2-dimensional vectors in their last dimension. Got lhs shape "
            f"{list(ls)}, rhs shape {list(rs)}."
        )
    return apply(_complex_mul, lhs, rhs, _name="complex.mul", _dtypes=[dtype], dtype=dtype.to_jax())
