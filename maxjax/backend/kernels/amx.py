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

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["AMX_FLAGS", "available", "unavailable_reason", "supports", "matmul_t"]

#: the ``/proc/cpuinfo`` flags the kernel needs
AMX_FLAGS = frozenset({"amx_tile", "amx_bf16", "avx512_bf16", "avx512bw"})
_TARGET = "maxjax_bf16x3_matmul"


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
    jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(lib.maxjax_bf16x3_matmul), platform="cpu")
    return None


def available() -> bool:
    """Whether the AMX bf16x3 product runs here (see :func:`unavailable_reason`)."""
    return unavailable_reason() is None


def supports(x: Any, w: Any) -> bool:
    """Whether the kernel takes ``x [..., K] @ w.T`` for ``w [N, K]``: both float32 with static
    shapes, K and N multiples of 32."""
    if getattr(x, "dtype", None) != jnp.float32 or getattr(w, "dtype", None) != jnp.float32 or getattr(w, "ndim", 0) != 2:
        return False
    dims = (*x.shape, *w.shape)
    if not all(isinstance(d, (int, np.integer)) for d in dims):
        return False
    n, k = w.shape
    return x.shape[-1] == k and k % 32 == 0 and n % 32 == 0 and k > 0 and n > 0


def _forward(x: Any, w: Any) -> jax.Array:
    lead, k = x.shape[:-1], x.shape[-1]
    n = w.shape[0]
    m = math.prod(lead)
    out = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct((m, n), jnp.float32), vmap_method="sequential")(x.reshape(m, k), w)
    return out.reshape(*lead, n)


@jax.custom_vjp
def matmul_t(x: Any, w: Any) -> jax.Array:
    """``x @ w.T`` at ``Precision.HIGH`` (four bfloat16 passes on AMX): ``x`` float32 ``[..., K]``, ``w`` float32 ``[N, K]`` ->
    float32 ``[..., N]`` (each row's result independent of the other rows). Call only where
    :func:`supports` and :func:`available`; its gradients are float32 XLA products."""
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


matmul_t.defvjp(_fwd, _bwd)
