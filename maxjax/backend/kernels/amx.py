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
:mod:`maxjax.backend.policy`). Gradients: float32 XLA products for a weight passed as an array; for
an :class:`AmxWeight` laid out with its transpose (a Trainer's frozen weights), ``x``'s cotangent
``g @ w`` runs in the kernel too, as ``g @ (w.T).T``.

A bfloat16 weight laid out (a bfloat16 Trainer's frozen weights) multiplies bfloat16 ``x`` in one
pass (``maxjax_bf16_matmul_laid_out``): float32 sums rounded to bfloat16, the arithmetic of XLA's
bfloat16 dot with float32 accumulation, without packing the weight at every call.
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
_TARGET_BF16 = "maxjax_bf16_matmul_laid_out"


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
    for name in (_TARGET, _TARGET_LAID_OUT, _TARGET_BF16):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    for fn in (lib.maxjax_amx_lay_out, lib.maxjax_amx_lay_out_bf16):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        fn.restype = ctypes.c_int
    return None


def available() -> bool:
    """Whether the AMX bf16x3 product runs here (see :func:`unavailable_reason`)."""
    return unavailable_reason() is None


def _shape_fits(shape: Any) -> bool:
    """``[N, K]`` with static N and K, positive multiples of 32."""
    return len(shape) == 2 and all(isinstance(d, (int, np.integer)) and d > 0 and d % 32 == 0 for d in shape)


def supports(x: Any, w: Any) -> bool:
    """Whether the kernel takes ``x [..., K] @ w.T`` for ``w [N, K]``: both float32 with static
    shapes, K and N multiples of 32."""
    if getattr(x, "dtype", None) != jnp.float32 or getattr(w, "dtype", None) != jnp.float32 or not _shape_fits(getattr(w, "shape", ())):
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
    independent of the other rows); for a bfloat16 :class:`AmxWeight`, ``x`` bfloat16 -> bfloat16
    (one pass, float32 sums). Call only where :func:`supports` (or the weight was laid out)
    and :func:`available`. Gradients: float32 XLA products for an array ``w``; through an
    :class:`AmxWeight`, ``x``'s only, in the kernel, where it was laid out with its transpose
    (``lay_out(w, transposed=True)``), and none for the weight (a frozen weight).

    Raises:
        ValueError: differentiating through an :class:`AmxWeight` laid out without its transpose."""
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

    ``tiles_t`` (uint16 ``[K / 16, N, 32]``, or None): ``w.T`` laid out the same way, for the
    cotangent of ``x`` (``g @ w``) in a training step whose weight is frozen.

    A stack of layers (tiles ``[L, N / 16, K, 32]``, ``tiles_t`` ``[L, K / 16, N, 32]``) is not
    sliced by a layer scan: each step multiplies its layer in place (:meth:`at_layer`; slicing
    would copy every layer's tiles at every step).

    ``array`` (float32 ``[N, K]``, or None): the weight itself, kept for a weight that the program
    also uses otherwise (a tied embedding, gathered by ``Embedding`` and multiplied by the head):
    :meth:`value` gives it to those ops (``maxjax.graph.layer_weights.materialize``).

    A bfloat16 weight (a bfloat16 training step's frozen weight) is laid out whole, with no
    second part: tiles ``[N / 16, K / 2, 32]`` (``tiles_t`` ``[K / 16, N / 2, 32]``), multiplied in
    one bfloat16 pass with float32 accumulation (XLA's bfloat16 dot's arithmetic), and
    :meth:`weight` gives it back exactly.

    ``shape`` and ``dtype`` are one layer's weight's (``[N, K]``, float32 or bfloat16). Only
    :func:`matmul_t` multiplies it; the weight itself gets no gradient (an inference program's
    state, or a frozen weight).
    """

    #: ops that do not multiply it as stored get :meth:`value` (``materialize``)
    materializes = True
    ndim = 2

    def __init__(self, tiles: Any, shape: tuple[int, int], tiles_t: Any = None, layer: Any = None, array: Any = None,
                 dtype: Any = np.float32):  # fmt: skip
        self.tiles = tiles
        self.tiles_t = tiles_t
        self.shape = tuple(int(d) for d in shape)
        #: the layer of a stack a scan step multiplies (an int32 scalar, traced), else None
        self.layer = layer
        self.array = array
        self.dtype = np.dtype(dtype)

    @property
    def bfloat16(self) -> bool:
        """Whether it is a bfloat16 weight (one pass) rather than a float32 one (four)."""
        return self.dtype == jnp.bfloat16

    def value(self) -> Any:
        """The weight's array, for an op that does not multiply it as stored.

        Raises:
            ValueError: it was laid out without its array (a weight the program only multiplies).
        """
        if self.array is None:
            raise ValueError(f"{self!r} keeps no {self.dtype} array: only matmul_t can use it")
        return self.array

    def weight(self) -> jax.Array:
        """The weight ``[N, K]`` (a stack: ``[L, N, K]``) exactly: its kept array, or a bfloat16
        weight read back from its tiles.

        Raises:
            ValueError: a float32 weight laid out without its array (its tiles hold 16 of its 24
                bits).
        """
        if self.array is not None:
            return self.array
        if not self.bfloat16:
            raise ValueError(f"{self!r}: the tiles of a float32 weight hold 16 of its 24 bits; it keeps no array")
        lead, (n, k) = self.tiles.shape[:-3], self.shape
        t = self.tiles.reshape(*lead, n // 16, k // 2, 16, 2)  # [.., block, pair, column, 2]
        t = jnp.moveaxis(t, -2, -3).reshape(*lead, n, k)
        return lax.bitcast_convert_type(t, jnp.bfloat16)

    @property
    def layers(self) -> int | None:
        """The number of layers of a stack (tiles ``[L, ...]``), None for one weight."""
        return int(self.tiles.shape[0]) if len(self.tiles.shape) == 4 else None

    def at_layer(self, layer: Any) -> "AmxWeight":
        """Layer ``layer`` (an int32 scalar, traced in a scan) of a stack, read in place by
        :func:`matmul_t`.

        Raises:
            ValueError: not a stack.
        """
        if self.layers is None:
            raise ValueError(f"{self!r} is one weight, not a stack of layers")
        if self.array is not None:
            raise ValueError(f"{self!r}: a stack keeps no array")
        return AmxWeight(self.tiles, self.shape, self.tiles_t, layer, None, self.dtype)

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(t.shape)) * 2 for t in (self.tiles, self.tiles_t) if t is not None) + (
            0 if self.array is None else int(np.prod(self.array.shape)) * self.dtype.itemsize
        )

    def __repr__(self) -> str:
        stack = f", {self.layers} layers" if self.layers is not None else ""
        return f"AmxWeight({self.dtype}{list(self.shape)}{stack}{', with its transpose' if self.tiles_t is not None else ''})"

    def tree_flatten(self) -> tuple[tuple[Any, Any, Any, Any], tuple[tuple[int, int], str]]:
        return (self.tiles, self.tiles_t, self.layer, self.array), (self.shape, self.dtype.name)

    @classmethod
    def tree_unflatten(cls, aux: tuple[tuple[int, int], str], children: Any) -> "AmxWeight":
        return cls(children[0], aux[0], children[1], children[2], children[3], jnp.dtype(aux[1]))


def lays_out(shape: Any, dtype: Any) -> bool:
    """Whether :func:`lay_out` takes a weight of ``shape`` and ``dtype`` here: float32 or bfloat16
    ``[N, K]`` with N and K multiples of 32, on a CPU where the kernel runs."""
    if dtype is None or jnp.dtype(dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        return False
    return _shape_fits(tuple(shape)) and available()


def _lay_out_into(host: np.ndarray, out: np.ndarray) -> None:
    """Writes the kernel's layout of a C-contiguous ``[N, K]`` into ``out``: float32 -> uint16
    ``[N / 16, K, 32]``, bfloat16 -> uint16 ``[N / 16, K / 2, 32]``."""
    from maxjax.backend.kernels import library

    n, k = host.shape
    fn = library().maxjax_amx_lay_out_bf16 if host.dtype == jnp.bfloat16 else library().maxjax_amx_lay_out
    if fn(host.ctypes.data, n, k, out.ctypes.data):
        raise ValueError(f"cannot lay out a {host.dtype}{[n, k]} weight for the AMX kernel")


def _laid_out_shape(n: int, k: int, dtype: Any) -> tuple[int, int, int]:
    return (n // 16, k // 2 if jnp.dtype(dtype) == jnp.bfloat16 else k, 32)


def lay_out(w: Any, device: Any = None, transposed: bool = False, keep: bool = False) -> AmxWeight:
    """``w`` (float32 or bfloat16 ``[N, K]``, or a stack of layers ``[L, N, K]``; host or device)
    laid out for the kernel, on ``device``; with ``transposed``, ``w.T`` too (``tiles_t``: what a
    training step needs to differentiate through a frozen weight; twice the memory); with ``keep``,
    ``w`` itself as well (``array``, on ``device``: for a weight also used otherwise; not for a
    stack). A stack is laid out into one preallocated buffer, layer by layer.

    Raises:
        ValueError: a weight :func:`lays_out` does not take (naming its shape and dtype, or why the
            kernel cannot run here).
    """
    host = np.asarray(w)
    if host.ndim not in (2, 3) or not lays_out(host.shape[-2:], host.dtype):
        why = unavailable_reason() or "float32 or bfloat16 [N, K] or [L, N, K] with N and K multiples of 32"
        raise ValueError(f"cannot lay out a {host.dtype}{list(host.shape)} weight for the AMX kernel ({why})")
    if keep and host.ndim != 2:
        raise ValueError(f"lay_out(keep=True) keeps one weight's array, not a stack's ({list(host.shape)})")
    layers = [host] if host.ndim == 2 else list(host)
    lead, (n, k) = host.shape[:-2], host.shape[-2:]
    tiles = np.empty((*lead, *_laid_out_shape(n, k, host.dtype)), np.uint16)
    tiles_t = np.empty((*lead, *_laid_out_shape(k, n, host.dtype)), np.uint16) if transposed else None
    for i, a in enumerate(layers):
        _lay_out_into(np.ascontiguousarray(a), tiles[i] if lead else tiles)
        if transposed:
            _lay_out_into(np.ascontiguousarray(a.T), tiles_t[i] if lead else tiles_t)
    put = functools.partial(jax.device_put, device=device)
    return AmxWeight(put(tiles), (n, k), None if tiles_t is None else put(tiles_t), None, put(w) if keep else None, host.dtype)


def _laid_out_product(x: Any, tiles: Any, n: int, layer: Any = None) -> jax.Array:
    """``x [..., K] @ w.T`` for ``w [n, K]`` laid out as ``tiles`` (or layer ``layer`` of a stack
    of them, read in place): float32 ``x``: float32 ``[..., n]`` (four passes); bfloat16 ``x`` (a
    bfloat16 weight's tiles): bfloat16 ``[..., n]``, the float32 sums rounded (one pass)."""
    lead, k = x.shape[:-1], x.shape[-1]
    m = math.prod(lead)
    out_type = jax.ShapeDtypeStruct((m, n), jnp.float32)
    index = jnp.asarray(0 if layer is None else layer, jnp.int32)  # ignored for one weight's tiles
    target = _TARGET_BF16 if x.dtype == jnp.bfloat16 else _TARGET_LAID_OUT
    out = jax.ffi.ffi_call(target, out_type, vmap_method="sequential")(x.reshape(m, k), tiles, index)
    return out.astype(x.dtype).reshape(*lead, n)


def _laid_out_matmul_t(x: Any, w: AmxWeight) -> jax.Array:
    if x.shape[-1] != w.shape[1] or x.dtype != w.dtype:
        raise ValueError(f"x {x.dtype}{list(x.shape)} cannot multiply {w!r} ({w.dtype} [..., {w.shape[1]}])")
    if (w.layers is None) != (w.layer is None):
        raise ValueError(f"{w!r}: a stack multiplies one layer at a time (AmxWeight.at_layer)")
    return _laid_out_vjp(x, w)


@jax.custom_vjp
def _laid_out_vjp(x: Any, w: AmxWeight) -> jax.Array:
    return _laid_out_product(x, w.tiles, w.shape[0], w.layer)


def _laid_out_fwd(x: Any, w: AmxWeight) -> tuple[jax.Array, AmxWeight]:
    return _laid_out_product(x, w.tiles, w.shape[0], w.layer), w


def _laid_out_bwd(w: AmxWeight, g: Any) -> tuple[jax.Array, None]:
    if w.tiles_t is None:
        raise ValueError(
            f"cannot differentiate through {w!r}: it was laid out without its transpose (an inference "
            "program's weight); lay it out with maxjax.backend.kernels.amx.lay_out(w, transposed=True)"
        )
    return _laid_out_product(g.astype(w.dtype), w.tiles_t, w.shape[1], w.layer), None  # g [..., N] @ w [N, K] = g @ (w.T).T


_laid_out_vjp.defvjp(_laid_out_fwd, _laid_out_bwd)
