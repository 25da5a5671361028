"""Elementwise ops (MAX's ``max.graph.ops.elementwise``): each one jnp function through ``apply``.

Binary ops broadcast NumPy-style; Python scalars are weakly typed (``x * 2`` keeps ``x``'s dtype).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from maxjax.graph.ops._core import apply

__all__ = [
    "add", "sub", "mul", "div", "pow", "mod", "floor_div", "max_elementwise", "min_elementwise",
    "negate", "abs", "exp", "log", "log1p", "sqrt", "rsqrt", "tanh", "atanh", "sin", "cos", "acos", "erf",
    "floor", "ceil", "round", "trunc", "silu", "gelu", "relu", "sigmoid",
    "equal", "not_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor",
    "logical_not", "is_nan", "is_inf", "where",
]  # fmt: skip


def _binary(name: str, f: Any) -> Any:
    def op(lhs: Any, rhs: Any) -> Any:
        return apply(f, lhs, rhs, _name=name)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise ``{name}`` of two tensors (broadcasting; jnp: ``{f.__name__}``)."
    return op


def _unary(name: str, f: Any) -> Any:
    def op(x: Any) -> Any:
        return apply(f, x, _name=name)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"Elementwise ``{name}`` (jnp: ``{getattr(f, '__name__', name)}``)."
    return op


add = _binary("add", jnp.add)
sub = _binary("sub", jnp.subtract)
mul = _binary("mul", jnp.multiply)
div = _binary("div", jnp.true_divide)
pow = _binary("pow", jnp.power)
mod = _binary("mod", jnp.mod)
floor_div = _binary("floor_div", jnp.floor_divide)
max_elementwise = _binary("max", jnp.maximum)
min_elementwise = _binary("min", jnp.minimum)
equal = _binary("equal", jnp.equal)
not_equal = _binary("not_equal", jnp.not_equal)
greater = _binary("greater", jnp.greater)
greater_equal = _binary("greater_equal", jnp.greater_equal)
logical_and = _binary("logical_and", jnp.logical_and)
logical_or = _binary("logical_or", jnp.logical_or)
logical_xor = _binary("logical_xor", jnp.logical_xor)

negate = _unary("negate", jnp.negative)
abs = _unary("abs", jnp.abs)
exp = _unary("exp", jnp.exp)
log = _unary("log", jnp.log)
log1p = _unary("log1p", jnp.log1p)
sqrt = _unary("sqrt", jnp.sqrt)
rsqrt = _unary("rsqrt", jax.lax.rsqrt)
tanh = _unary("tanh", jnp.tanh)
atanh = _unary("atanh", jnp.arctanh)
sin = _unary("sin", jnp.sin)
cos = _unary("cos", jnp.cos)
acos = _unary("acos", jnp.arccos)
erf = _unary("erf", jax.scipy.special.erf)
floor = _unary("floor", jnp.floor)
ceil = _unary("ceil", jnp.ceil)
round = _unary("round", jnp.round)
trunc = _unary("trunc", jnp.trunc)
silu = _unary("silu", jax.nn.silu)
relu = _unary("relu", jax.nn.relu)
sigmoid = _unary("sigmoid", jax.nn.sigmoid)
logical_not = _unary("logical_not", jnp.logical_not)
is_nan = _unary("is_nan", jnp.isnan)
is_inf = _unary("is_inf", jnp.isinf)


def _gelu(x: Any, *, approximate: str) -> Any:
    return jax.nn.gelu(x, approximate=approximate in ("tanh", "quick", True))


def gelu(x: Any, approximate: str = "none") -> Any:
    """GELU: exact (``approximate="none"``, the erf form) or the tanh approximation (``"tanh"``).

    Raises:
        ValueError: an unknown ``approximate`` mode.
    """
    if approximate not in ("none", "tanh", "quick"):
        raise ValueError(f"gelu: approximate must be 'none', 'tanh' or 'quick', got {approximate!r}")
    if approximate == "quick":
        return apply(lambda v: v * jax.nn.sigmoid(1.702 * v), x, _name="gelu_quick")
    return apply(_gelu, x, _name="gelu", approximate=approximate)


def _where(c: Any, a: Any, b: Any) -> Any:
    return jnp.where(c, a, b)


def where(condition: Any, x: Any, y: Any) -> Any:
    """``x`` where ``condition`` is true, else ``y`` (broadcasting)."""
    return apply(_where, condition, x, y, _name="where")
