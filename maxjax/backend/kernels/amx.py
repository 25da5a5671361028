"""float32 products of a stored weight on the CPU's AMX tiles, in four bfloat16 passes.

``amx.cc`` (built into the kernels' library, see :mod:`maxjax.backend.kernels`) computes
``x @ w.T`` for float32 ``x [M, K]`` and ``w [N, K]`` as
``x_hi w_hi + x_hi w_lo + x_mid w_hi + x_lo w_hi``: ``x`` split exactly into three bfloat16 parts,
``w`` into two (16 of its 24 bits), the products accumulated in float32 by AMX's ``TDPBF16PS``.
The error relative to ``|x| |w|`` is about 2^-16 (float32: 2^-24), the class of JAX's
``lax.Precision.HIGH`` ("bfloat16_3x" on TPUs; Henry, Tang and Heinecke, "Leveraging the bfloat16
Artificial Intelligence Datatype For Higher-Precision Computations", ARITH 2019); since ``x``'s
split is exact, the result moves with ``x`` as a fixed linear map (a row inside a padded batch
gives what it gives alone, to float32 rounding). Each row's result is independent of the others.

It runs where the CPU has AMX-BF16 (Sapphire Rapids and later Xeons), Linux grants the tile state
(``arch_prctl``), and the kernels' library builds; :func:`available` says whether it does here.
The backend policy decides when it is used (``precision=HIGH`` on the CPU, see
:mod:`maxjax.backend.policy`). Gradients are float32 XLA products (:func:`matmul_t`'s VJP).
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["AMX_FLAGS", "AmxWeight", "available", "unavailable_reason", "supports", "lays_out", "lay_out", "matmul_t"]

#: the ``/proc/cpuinfo`` flags the kernel needs
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16", "avx512_bf16", "avx512bw"})
_TARGET = "maxjax_bf16x3_matmul"
_TARGET_LAID_OUT = "maxjax_bf16x3_matmul_laid_out"


@functools.lru_cache(maxsize=None)
def unavailable_reason() -> str | None:
    """None where the kernel runs here (built, tile state granted, target registered), else why
    not. The first call may build the kernels' library (seconds, once per machine)."""
    from maxjax.backend import kernels
    from maxjax.backend.cpu import cpu_features

    missing = AMX_FLAGS - cpu_features()
    if missing:
        return f"this CPU lacks {', '.join(sorted(missing))}"
    lib = kernels.library()
    if lib is None:
        return kernels.unavailable_reason()
    if not lib.maxjax_amx_built():
        return "the compiler did not target AMX-BF16 (-march)"
    err = lib.maxjax_amx_enable()
    if err:
        return f"Linux refused the AMX tile state (arch_prctl errno {err})"
    for name in (_TARGET, _TARGET_LAID_OUT):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    fn = lib.maxjax_amx_lay_out
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return None


def available() -> bool:
    """Whether the AMX bf16x3 product runs here (see :func:`unavailable_reason`)."""
    return unavailable_reason() is None


def _weight_fits(shape: Any, dtype: Any) -> bool:
    """A float32 ``[N, K]`` weight with static N and K, positive multiples of 32."""
    return (
        dtype is not None and np.dtype(dtype) == np.float32 and len(shape) == 2
        and all(isinstance(d, (int, np.integer)) and d > 0 and d % 32 == 0 for d in shape)
    )  # fmt: skip


def supports(x: Any, w: Any) -> bool:
    """Whether the kernel takes ``x [..., K] @ w.T`` for ``w [N, K]``: both float32 with static
    shapes, K and N multiples of 32."""
    if getattr(x, "dtype", None) != jnp.float32 or not _weight_fits(getattr(w, "shape", ()), getattr(w, "dtype", None)):
        return False
    return all(isinstance(d, (int, np.integer)) for d in x.shape) and x.shape[-1] == w.shape[1]


def _forward(x: Any, w: Any) -> jax.Array:
    lead, k = x.shape[:-1], x.shape[-1]
    n = w.shape[0]
    m = math.prod(lead)
    out = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct((m, n), jnp.float32), vmap_method="sequential")(x.reshape(m, k), w)
    return out.reshape(*lead, n)


def matmul_t(x: Any, w: Any) -> jax.Array:
    """``x @ w.T`` at ``Precision.HIGH`` (four bfloat16 passes on AMX): ``x`` float32 ``[..., K]``,
    ``w`` float32 ``[N, K]`` or an :class:`AmxWeight` -> float32 ``[..., N]`` (each row's result
    independent of the other rows). Call only where :func:`supports` (or the weight was laid out)
    and :func:`available`. Gradients: float32 XLA products for an array ``w``; none through an
    :class:`AmxWeight`."""
    if isinstance(w, AmxWeight):
        return _laid_out_matmul_t(x, w)
    return _matmul_t(x, w)


@jax.custom_vjp
def _matmul_t(x: Any, w: Any) -> jax.Array:
    return _forward(x, w)


def _fwd(x: Any, w: Any) -> tuple[jax.Array, tuple[Any, Any]]:
    return _forward(x, w), (x, w)


def _bwd(res: tuple[Any, Any], g: Any) -> tuple[Any, Any]:
    x, w = res
    hi = lax.Precision.HIGHEST
    dx = lax.dot_general(g, w, (((g.ndim - 1,), (0,)), ((), ())), precision=hi)  # [..., K]
    g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])  # [rows, N], [rows, K]
    dw = lax.dot_general(g2, x2, (((0,), (0,)), ((), ())), precision=hi)  # [N, K]
    return dx, dw


_matmul_t.defvjp(_fwd, _bwd)


@jax.tree_util.register_pytree_node_class
class AmxWeight:
    """A float32 weight ``[N, K]`` held in the kernel's layout, for a program that only multiplies
    it as stored (``Linear``): ``tiles`` uint16 ``[N / 16, K, 32]``, for each block of 16 output
    columns the bfloat16 pairs ``(k, k + 1)`` of every column side by side (AMX's VNNI layout),
    ``w_hi`` for the first ``K / 2`` pairs, then ``w_lo``. Laying the weight out once, when the
    state is prepared, saves doing it in every product (:func:`lay_out`).

    ``shape`` and ``dtype`` are the weight's (``[N, K]``, float32). Only :func:`matmul_t` reads
    it; it has no gradient (an inference program's state).
    """

    def __init__(self, tiles: Any, shape: tuple[int, int]):
        self.tiles = tiles
        self.shape = tuple(int(d) for d in shape)

    dtype = np.dtype(np.float32)
    ndim = 2

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.tiles.shape)) * 2

    def __repr__(self) -> str:
        return f"AmxWeight(float32{list(self.shape)})"

    def tree_flatten(self) -> tuple[tuple[Any], tuple[int, int]]:
        return (self.tiles,), self.shape

    @classmethod
    def tree_unflatten(cls, shape: tuple[int, int], children: Any) -> "AmxWeight":
        return cls(children[0], shape)


def lays_out(shape: Any, dtype: Any) -> bool:
    """Whether :func:`lay_out` takes a weight of ``shape`` and ``dtype`` here: float32 ``[N, K]``
    with N and K multiples of 32, on a CPU where the kernel runs."""
    return _weight_fits(tuple(shape), dtype) and available()


def lay_out(w: Any, device: Any = None) -> AmxWeight:
    """``w`` (float32 ``[N, K]``, host or device) laid out for the kernel, on ``device``.

    Raises:
        ValueError: a weight :func:`lays_out` does not take (naming its shape and dtype, or why the
            kernel cannot run here).
    """
    host = np.ascontiguousarray(np.asarray(w))
    if not lays_out(host.shape, host.dtype):
        why = unavailable_reason() or "float32 [N, K] with N and K multiples of 32"
        raise ValueError(f"cannot lay out a {host.dtype}{list(host.shape)} weight for the AMX kernel ({why})")
    n, k = host.shape
    from maxjax.backend.kernels import library

    tiles = np.empty((n // 16, k, 32), np.uint16)
    if library().maxjax_amx_lay_out(host.ctypes.data, n, k, tiles.ctypes.data):
        raise ValueError(f"cannot lay out a float32{[n, k]} weight for the AMX kernel")
    return AmxWeight(jax.device_put(tiles, device), (n, k))


def _laid_out_matmul_t(x: Any, w: AmxWeight) -> jax.Array:
    lead, k = x.shape[:-1], x.shape[-1]
    n = w.shape[0]
    if k != w.shape[1] or x.dtype != jnp.float32:
        raise ValueError(f"x {x.dtype}{list(x.shape)} cannot multiply {w!r} (float32 [..., {w.shape[1]}])")
    m = math.prod(lead)
    out = jax.ffi.ffi_call(_TARGET_LAID_OUT, jax.ShapeDtypeStruct((m, n), jnp.float32), vmap_method="sequential")(x.reshape(m, k), w.tiles)
    return out.reshape(*lead, n)
