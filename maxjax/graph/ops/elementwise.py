"""Elementwise ops (MAX's ``max.graph.ops.elementwise``): each one jnp function through ``apply``.

Binary ops broadcast NumPy-style and promote dtypes by MAX 26.7's rules, in one place
(:func:`promote`, also used by ``where`` and ``matmul``):

- a "strong" operand is a tensor (a graph value, a Weight, a JAX array, a Buffer, a ``Dim``, which
  is an int64 scalar); a "weak" one is a Python ``bool``/``int``/``float``, a NumPy scalar, or a
  NumPy array while a graph is being built (outside a graph, in eager mode, a NumPy array is an
  array like a JAX one).
  At least one operand must be strong (``TypeError`` otherwise, as MAX).
- two strong dtypes give the one of higher category (``bool < unsigned < signed < float``), then of
  more bits; the other must be exactly representable in it, else ``ValueError`` (``int32 + float32``,
  ``uint8 + int8``, ``float16 + bfloat16`` are refused; ``int32 + int64`` is ``int64``,
  ``float16 + float32`` is ``float32``). Promotion never widens to a third dtype.
- a weak value takes the strong operand's dtype if it is exactly representable in it (``int8 + 300``,
  ``int32 + 1.5`` and ``float32 + 16777217`` are refused with ``ValueError``).
- ``div`` of two integer tensors is ``float64`` (MAX casts both to float64 first).

Unary ops refuse a weak operand (``TypeError``). Source: MAX 26.7 ``max/graph/dtype_promotion.py``
and the table in ``tests/data/ops_rules_promotion.json`` observed from MAX 26.7 itself.
"""

from __future__ import annotations

import builtins
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.dtype import DType
from maxjax.graph.ops._core import apply, check_same_device, dtype_of
from maxjax.graph.graph import current_graph
from maxjax.graph.type import Dim
from maxjax.graph.value import TensorValue

__all__ = [
    "add", "sub", "mul", "div", "pow", "mod", "floor_div", "max_elementwise", "min_elementwise",
    "negate", "abs", "exp", "log", "log1p", "sqrt", "rsqrt", "tanh", "atanh", "sin", "cos", "acos", "erf",
    "floor", "ceil", "round", "trunc", "silu", "gelu", "relu", "sigmoid",
    "equal", "not_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor",
    "logical_not", "is_nan", "is_inf", "where", "promote", "common_dtype",
]  # fmt: skip

#: For each DType, the values a Python/NumPy integer may have to be held exactly (MAX's table).
_FULL_PRECISION: dict[DType, tuple[float, float]] = {
    DType.bool: (0, 1),
    DType.int8: (-(2**7), 2**7 - 1),
    DType.int16: (-(2**15), 2**15 - 1),
    DType.int32: (-(2**31), 2**31 - 1),
    DType.int64: (-(2**63), 2**63 - 1),
    DType.uint8: (0, 2**8 - 1),
    DType.uint16: (0, 2**16 - 1),
    DType.uint32: (0, 2**32 - 1),
    DType.uint64: (0, 2**64 - 1),
    DType.float4_e2m1fn: (-(1.5 * 2**2), (1.5 * 2**2)),
    DType.float6_e2m3fn: (-(1.875 * 2**2), 1.875 * 2**2),
    DType.float6_e3m2fn: (-(1.75 * 2**4), 1.75 * 2**4),
    DType.float8_e8m0fnu: (2**-127, 2**127),
    DType.float8_e5m2: (-(1.10 * 2**16), 1.10 * 2**16),
    DType.float8_e5m2fnuz: (-(1.75 * 2**15), 1.75 * 2**15),
    DType.float8_e4m3fn: (-(1.75 * 2**8), 1.75 * 2**8),
    DType.float8_e4m3fnuz: (-240, 240),
    DType.bfloat16: (-(2**8), 2**8),
    DType.float16: (-(2**11), 2**11),
    DType.float32: (-(2**24), 2**24),
    DType.float64: (-(2**53), 2**53),
}

_WEAK_TYPES = (bool, int, float, np.generic, np.ndarray)


def _category(d: DType) -> int:
    if d is DType.bool:
        return 0
    if d.is_unsigned_integral():
        return 1
    if d.is_signed_integral():
        return 2
    return 3


def _represents(wide: DType, narrow: DType) -> bool:
    """True when every value of ``narrow`` is exactly a value of ``wide``."""
    if narrow is DType.bool:
        return True
    if narrow.is_integral():
        lo, hi = _FULL_PRECISION[narrow]
        wlo, whi = _FULL_PRECISION[wide]
        return wlo <= lo and hi <= whi
    if not wide.is_float():
        return False
    a, b = narrow.finfo(), wide.finfo()
    return a.nmant <= b.nmant and a.maxexp <= b.maxexp and a.minexp >= b.minexp


def common_dtype(op: str, a: DType, b: DType) -> DType:
    """MAX's result dtype of two strong dtypes (see the module docstring).

    Raises:
        ValueError: neither dtype holds every value of the other (naming the op and both dtypes).
    """
    if a == b:
        return a
    ka, kb = (_category(a), a.size_in_bits), (_category(b), b.size_in_bits)
    wide, narrow = (a, b) if ka > kb else (b, a)
    if ka == kb or not _represents(wide, narrow):
        raise ValueError(
            f"{op}: Failed to resolve valid dtype: Unsafe cast from {_mlir_name(narrow)} to "
            f"{_mlir_name(_target(wide, narrow))}. Insert an explicit cast op if this conversion is wanted "
            f"(promoting {a!r} and {b!r}: {narrow!r} is not exactly representable in {wide!r})"
        )
    return wide


# MAX's (MLIR's) spelling of a dtype in its promotion errors ("si32", "ui8", "f16", "bf16").
_MLIR_FLOATS = {DType.float16: "f16", DType.bfloat16: "bf16", DType.float32: "f32", DType.float64: "f64"}


def _mlir_name(d: DType) -> str:
    if d is DType.bool:
        return "i1"
    if d.is_integral():
        return f"{'ui' if d.is_unsigned_integral() else 'si'}{d.size_in_bits}"
    return _MLIR_FLOATS.get(d, str(d))


def _target(wide: DType, narrow: DType) -> DType:
    """The dtype MAX 26.7 names as the failed promotion's target: ``wide``'s kind, at least
    ``narrow``'s width (int32 with float16 names f32; int64 with bfloat16 names f64)."""
    if wide.size_in_bits >= narrow.size_in_bits:
        return wide
    bits = narrow.size_in_bits
    if wide.is_float():
        return {32: DType.float32}.get(bits, DType.float64)
    return DType.of(np.dtype(f"{'u' if wide.is_unsigned_integral() else 'i'}{bits // 8}"))


def _is_strong(x: Any) -> bool:
    """A tensor operand: a graph value, an array, a Buffer, a Dim; a NumPy array too when no graph
    is being built (eager mode has arrays, not MAX's graph constants)."""
    from maxjax.driver import Buffer

    if isinstance(x, (TensorValue, jax.Array, Buffer, Dim)):
        return True
    return isinstance(x, np.ndarray) and current_graph() is None


def _strong(x: Any) -> Any:
    """A strong operand as a tensor (a Dim is MAX's int64 scalar of its size)."""
    if isinstance(x, Dim):
        from maxjax.graph.ops.shape import reshape, shape_to_tensor

        return reshape(shape_to_tensor([x]), [])
    return x


def _weak_to(op: str, value: Any, dtype: DType) -> np.ndarray:
    """A weak operand as a NumPy value of ``dtype`` (held as JAX holds it), if exact (MAX's rule).

    Raises:
        ValueError: the value does not fit ``dtype`` exactly, or a float value meets an integer or
            bool dtype (naming the op, the value and the dtype).
    """
    jdt = dtype.to_jax()
    if isinstance(value, (bool, int, np.integer)):
        lo, hi = _FULL_PRECISION[dtype]
        if not lo <= int(value) <= hi:
            raise ValueError(
                f"{op}: Unsafe cast: can't promote python int with value ({value}) to dtype({dtype!r}); "
                "it would lose precision"
            )
        return np.asarray(value).astype(jdt)
    if isinstance(value, (float, np.floating)):
        if not dtype.is_float():
            raise ValueError(f"{op}: Unsafe cast: can't promote python float ({value}) to dtype({dtype!r})")
        return np.asarray(value).astype(jdt)
    arr = np.asarray(value)
    if arr.dtype.kind == "f" and not dtype.is_float():
        raise ValueError(f"{op}: Unsafe cast: refusing to implicitly promote a float array to dtype({dtype!r})")
    if arr.dtype.kind in "iu" and arr.size:
        lo, hi = _FULL_PRECISION[dtype]
        if not (lo <= arr.min() and arr.max() <= hi):
            raise ValueError(
                f"{op}: Unsafe cast: refusing to implicitly promote an array with values in "
                f"[{arr.min()}, {arr.max()}] to dtype({dtype!r}) (precision loss)"
            )
    return arr.astype(jdt)


def promote(op: str, lhs: Any, rhs: Any, *, integers_to: DType | None = None) -> tuple[Any, Any, DType]:
    """``(lhs, rhs, dtype)``: the two operands of a binary op ready for it and MAX's common dtype
    (the one place maxjax promotes; see the module docstring). With ``integers_to``, two integer
    operands give that dtype instead (``div``'s float64, before any check of the pair, as MAX).

    Raises:
        TypeError: neither operand is a tensor.
        ValueError: the dtypes cannot be promoted, a weak value does not fit, or the tensors live
            on different devices.
    """
    ls, rs = _is_strong(lhs), _is_strong(rhs)
    if not ls and not rs:
        raise TypeError(
            f"{op}: binary ops require at least one tensor (a graph value or array) as input, got "
            f"{type(lhs).__name__} and {type(rhs).__name__}: convert one with ops.constant"
        )
    for x in (lhs, rhs):
        if not _is_strong(x) and not isinstance(x, _WEAK_TYPES):
            raise TypeError(f"{op}: unsupported operand type {type(x).__name__}: {x!r}")
    lhs, rhs = (_strong(lhs) if ls else lhs), (_strong(rhs) if rs else rhs)
    if ls and rs:
        check_same_device(op, lhs=lhs, rhs=rhs)
        dl, dr = dtype_of(lhs), dtype_of(rhs)
        if integers_to is not None and dl.is_integral() and dr.is_integral():
            return lhs, rhs, integers_to
        return lhs, rhs, common_dtype(op, dl, dr)
    dtype = dtype_of(lhs if ls else rhs)
    out = integers_to if integers_to is not None and dtype.is_integral() else dtype
    if ls:
        return lhs, _weak_to(op, rhs, dtype), out
    return _weak_to(op, lhs, dtype), rhs, out


def _unary_operand(op: str, x: Any) -> Any:
    if not _is_strong(x):
        raise TypeError(
            f"{op}: unary ops do not take a Python or NumPy value ({type(x).__name__}); convert it with "
            "ops.constant"
        )
    return _strong(x)


def _cast(x: Any, dtype: Any) -> Any:
    return jax.lax.convert_element_type(x, dtype)


def _binary(name: str, f: Any, *, kind: str = "arith") -> Any:
    """A binary op: promotion, then ``f`` on both operands cast to the common dtype.

    ``kind``: "arith" (result in the common dtype), "compare" (bool result), "logical" (bool
    operands required), "div" (integers divide as float64, MAX's true division).
    """

    def kernel(a: Any, b: Any, *, dtype: Any) -> Any:
        return f(_cast(a, dtype), _cast(b, dtype))

    kernel.__name__ = name

    def op(lhs: Any, rhs: Any) -> Any:
        lhs, rhs, dtype = promote(name, lhs, rhs, integers_to=DType.float64 if kind == "div" else None)
        out = dtype
        if kind == "compare":
            out = DType.bool
        elif kind == "logical" and dtype is not DType.bool:
            raise ValueError(f"{name}: expected bool operands, got {dtype_of(lhs)!r} and {dtype_of(rhs)!r}")
        k = kernel
        if kind == "div" and dtype.is_integral():  # a bool operand with an integer one: integer quotient
            k = _int_div
        elif kind == "div" and dtype is DType.bool:
            k = _bool_div
        return apply(k, lhs, rhs, _name=name, _dtypes=[out], dtype=dtype.to_jax())

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"Elementwise ``{name}`` of two tensors (broadcasting, MAX's dtype promotion: see the module "
        f"docstring; jnp: ``{f.__name__}``).\n\nRaises:\n    TypeError: no tensor operand.\n    "
        "ValueError: dtypes MAX does not promote, shapes that do not broadcast, or two devices."
    )
    return op


def _bool_div(a: Any, b: Any, *, dtype: Any) -> Any:
    # bool / bool stays bool in MAX: 1/1 is 1, 0/1 is 0 (x/0 is undefined)
    return jnp.logical_and(_cast(a, dtype), _cast(b, dtype))


def _int_div(a: Any, b: Any, *, dtype: Any) -> Any:
    # an integer quotient (a bool operand with an integer one, as MAX divides them), truncating
    return jax.lax.div(_cast(a, dtype), _cast(b, dtype))


def _unary(name: str, f: Any) -> Any:
    def op(x: Any) -> Any:
        return apply(f, _unary_operand(name, x), _name=name)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = (
        f"Elementwise ``{name}`` (jnp: ``{getattr(f, '__name__', name)}``).\n\nRaises:\n    TypeError: ``x`` "
        "is a Python or NumPy value, not a tensor (MAX's rule)."
    )
    return op


add = _binary("add", jnp.add)
def _subtract(a: Any, b: Any) -> Any:
    # bool - bool: integer arithmetic then "nonzero" (as bool + is "or" and bool * is "and"): xor.
    # MAX 26.7 builds a bool sub but fails to compile it.
    return jnp.not_equal(a, b) if a.dtype == jnp.bool_ else jnp.subtract(a, b)


sub = _binary("sub", _subtract)
mul = _binary("mul", jnp.multiply)
div = _binary("div", jnp.true_divide, kind="div")
pow = _binary("pow", jnp.power)
mod = _binary("mod", jnp.mod)
floor_div = _binary("floor_div", jnp.floor_divide)
max_elementwise = _binary("max", jnp.maximum)
min_elementwise = _binary("min", jnp.minimum)
equal = _binary("equal", jnp.equal, kind="compare")
not_equal = _binary("not_equal", jnp.not_equal, kind="compare")
greater = _binary("greater", jnp.greater, kind="compare")
greater_equal = _binary("greater_equal", jnp.greater_equal, kind="compare")
logical_and = _binary("logical_and", jnp.logical_and, kind="logical")
logical_or = _binary("logical_or", jnp.logical_or, kind="logical")
logical_xor = _binary("logical_xor", jnp.logical_xor, kind="logical")

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
_logical_not = _unary("logical_not", jnp.logical_not)


def logical_not(x: Any) -> Any:
    """Elementwise logical NOT of a bool tensor (jnp: ``logical_not``).

    Raises:
        TypeError: ``x`` is a Python or NumPy value, not a tensor.
        ValueError: ``x`` is not bool (MAX 26.7 refuses other dtypes).
    """
    dt = dtype_of(x)
    if dt is not None and dt is not DType.bool:
        raise ValueError(f"logical_not: expected a bool tensor, got dtype {dt!r}")
    return _logical_not(x)
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
    x = _unary_operand("gelu", x)
    if approximate == "quick":
        return apply(lambda v: v * jax.nn.sigmoid(1.702 * v), x, _name="gelu_quick")
    return apply(_gelu, x, _name="gelu", approximate=approximate)


def _where(c: Any, a: Any, b: Any, *, dtype: Any) -> Any:
    return jnp.where(c, _cast(a, dtype), _cast(b, dtype))


def _check_broadcastable(op: str, **named: Any) -> None:
    """MAX's broadcast rule for the named operands (trailing axes aligned; a dim broadcasts when
    it equals the other or is 1).

    Raises:
        ValueError: two dims neither equal nor 1, in MAX 26.7's words ("... are neither
            equivalent nor broadcastable").
    """
    shapes = {k: [Dim(d) for d in getattr(v, "shape", ())] for k, v in named.items()}
    rank = builtins.max((len(sh) for sh in shapes.values()), default=0)
    for axis in range(rank):
        seen: tuple[str, Dim, int] | None = None
        for k, sh in shapes.items():
            i = axis - (rank - len(sh))
            if i < 0 or sh[i] == Dim(1):
                continue
            if seen is None:
                seen = (k, sh[i], i)
            elif seen[1] != sh[i]:
                k0, d0, i0 = seen
                raise ValueError(
                    f"{op}: Input {k0} (shape {_fmt(shapes[k0])}) dimension at axis {i0} (value {d0}) and input "
                    f"{k} (shape {_fmt(sh)}) dimension at axis {i} (value {sh[i]}) are neither equivalent nor "
                    "broadcastable"
                )


def _fmt(shape: list[Dim]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def where(condition: Any, x: Any, y: Any) -> Any:
    """``x`` where ``condition`` is true, else ``y`` (broadcasting all three); ``x`` and ``y`` are
    promoted as a binary op's operands (:func:`promote`).

    Raises:
        TypeError: neither ``x`` nor ``y`` is a tensor.
        ValueError: ``condition`` is not bool, ``x``/``y`` dtypes MAX does not promote, shapes that
            do not broadcast, or values on two devices.
    """
    if isinstance(condition, (bool, np.bool_, np.ndarray)):
        cond = np.asarray(condition)
        cdt = DType.from_numpy(cond.dtype) if cond.dtype.kind in "biuf" else None
    else:
        cond = _unary_operand("where", condition)
        cdt = dtype_of(cond)
    if cdt is not DType.bool:
        raise ValueError(f"where: Expected condition to be a boolean tensor, but got a tensor with dtype {cdt}")
    check_same_device("where", condition=cond, x=x, y=y)  # before promote, as MAX
    x, y, dtype = promote("where", x, y)
    _check_broadcastable("where", condition=cond, x=x, y=y)
    return apply(_where, cond, x, y, _name="where", _dtypes=[dtype], dtype=dtype.to_jax())


# MAX's names in max.graph.ops.elementwise (``ops.elementwise.max``/``min``); the package exports
# them as ``ops.max_elementwise``/``ops.min_elementwise`` (``ops.max``/``ops.min`` are reductions).
# No function of this module calls the builtins max/min.
max = max_elementwise  # noqa: A001
min = min_elementwise  # noqa: A001
