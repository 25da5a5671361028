"""maxjax's CPU kernels: products of a few activation rows with a quantized weight, read in place.

XLA:CPU's fused dequantize-and-dot of a 4-bit weight and one activation row unpacks about 11 G
values/s on two AVX-512 cores, well below memory speed (a Q4_0 ``[8192, 2048]`` weight: 2.2 ms,
4.3 GB/s, ``benchmarks/results/native_matmul_avx512.txt``), and it copies a stacked layer's slice
before reading it. ``matvec.cc`` does the same float32 arithmetic in a loop that unpacks 16 values
per instruction, prefetches the weight 8 KiB ahead, splits the rows over XLA's intra-op thread
pool and takes a stacked weight's layer index as an operand (0.94 ms for the same weight, 10.1
GB/s, before the prefetch; with it, in an interleaved A/B for commit c520cfd, a Q4_0 stack larger
than the cache read layer by layer at one row went from 10.7 to 13.0 GB/s and Llama-3.2-1B Q4_0's
batch-1 decode rose 24%; ``benchmarks/results/scale_avx512.txt`` has the decode against llama.cpp
before and after). It is an XLA FFI custom call (https://docs.jax.dev/en/latest/ffi.html):
compiled for the host on first use with the system's C++ compiler (``$CXX``, else ``c++``) and
``-march=native`` (``$MAXJAX_KERNEL_MARCH`` names another target, e.g. ``haswell`` to build the
AVX2 code on an AVX-512 machine), cached under ``$MAXJAX_CACHE_DIR/kernels`` (default
``~/.cache/maxjax``), and registered with :func:`jax.ffi.register_ffi_target`.

The backend policy decides when it runs (``native_matmul_max_rows``, see
:mod:`maxjax.backend.policy`); :func:`available` says whether it can (an x86-64 CPU with AVX-512
(F, BW) or AVX2 with FMA and F16C, and a compiler that builds the file). Where it cannot, the
policy's products run in XLA as before, after one warning that names the reason.

Layouts (those of :mod:`maxjax.graph.quantization`): ``nibbles`` (Q4_0, Q4_1, Q4_K),
``unpacked`` (one byte per value, groups of 16 or 32 values, float32 scales and offsets) and
``mapped`` (Q4_0 and Q8_0 blocks read in place from the mapped file, rows as stored). Besides
those, a bfloat16 or float16 weight times float32 activations (:func:`widened_matmul`): each
value widened exactly in a register, the products and sums float32.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxjax.backend.cpu import cpu_features, native_isa

__all__ = [
    "available", "unavailable_reason", "supports", "quantized_matmul", "mapped_rows", "takes_widened", "widened_matmul", "widened_rows", "library",
    "library_path", "SOURCE", "SOURCES",
]  # fmt: skip

#: the kernels' C++ source
SOURCE = Path(__file__).with_name("matvec.cc")
#: every C++ source built into the library: the matmul kernels, the host layout conversions
#: (:mod:`maxjax.backend.kernels.layouts`) and whole-sequence attention
#: (:mod:`maxjax.backend.kernels.attention`)
SOURCES = (SOURCE, Path(__file__).with_name("layouts.cc"), Path(__file__).with_name("amx.cc"), Path(__file__).with_name("attention.cc"))
#: headers the sources include (part of the cached library's key)
HEADERS = (Path(__file__).with_name("parallel.h"),)
_TARGETS = (
    "maxjax_nibbles_matmul", "maxjax_unpacked_matmul", "maxjax_mapped_matmul", "maxjax_mapped_dequantize", "maxjax_widened_matmul",
    "maxjax_widened_rows", "maxjax_causal_attention", "maxjax_causal_attention_backward", "maxjax_tiles_matmul",
)  # fmt: skip
_MAPPED_KIND = {"Q4_0": 0, "Q8_0": 2}  # matvec.cc's Kind
_LOCK = threading.Lock()  # one build and registration per process, whichever thread traces first


def _cache_dir() -> Path:
    root = os.environ.get("MAXJAX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "maxjax")
    return Path(root) / "kernels"


def library_path(compiler: str | None = None) -> Path:
    """Where the built library for this source, compiler, target (``-march``), CPU and jaxlib
    version is cached."""
    import jaxlib

    cxx = compiler or os.environ.get("CXX") or "c++"
    key = hashlib.sha256()
    parts = (*(src.read_bytes() for src in (*SOURCES, *HEADERS)), cxx.encode(), _march().encode(), jaxlib.__version__.encode(), " ".join(sorted(cpu_features())).encode())
    for part in parts:
        key.update(part)
        key.update(b"\0")
    return _cache_dir() / f"maxjax_cpu_{key.hexdigest()[:16]}.so"


def _march() -> str:
    return os.environ.get("MAXJAX_KERNEL_MARCH") or "native"


def _build(target: Path) -> None:
    """Compiles :data:`SOURCES` into ``target`` (atomically: a temporary file renamed into place).

    Raises:
        RuntimeError: no compiler, or the compiler's error output (its last lines).
    """
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx!r} is not on PATH; set CXX)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cxx, "-O3", f"-march={_march()}", "-std=c++17", "-shared", "-fPIC", "-w", f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise RuntimeError(f"{cxx} failed to build {', '.join(src.name for src in SOURCES)}:\n{tail}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load() -> str | None:
    """Builds (once per machine) and registers the kernels (once per process); None, or why they
    cannot run."""
    with _LOCK:
        return _load_once()[1]


def library() -> ctypes.CDLL | None:
    """The built library (its plain C functions are called through ``ctypes``), or None where the
    kernels cannot run (:func:`unavailable_reason` says why)."""
    with _LOCK:
        return _load_once()[0]


@functools.lru_cache(maxsize=None)
def _load_once() -> tuple[ctypes.CDLL | None, str | None]:
    handle, reason = None, _load_reason()
    if reason is None:
        try:
            handle = ctypes.cdll.LoadLibrary(str(library_path()))
            for name in _TARGETS:
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(handle, name)), platform="cpu")
        except (OSError, AttributeError) as e:
            handle, reason = None, str(e)
    return handle, reason


def _load_reason() -> str | None:
    """None once the library is built (or found built) for this host, else why it cannot be."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"the kernels are x86-64 Linux only (this is {platform.system()} {platform.machine()})"
    if native_isa(cpu_features()) is None:
        return "this CPU has neither AVX-512 (F, BW) nor AVX2 with FMA and F16C"
    lib = library_path()
    try:
        if not lib.exists():
            _build(lib)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        return str(e)
    return None


def available() -> bool:
    """Whether the kernels run here (built and registered; the first call may compile them, a few
    seconds). Warns once, with the reason, when they cannot."""
    reason = _load()
    if reason is not None:
        _warn(reason)
    return reason is None


def unavailable_reason() -> str | None:
    """None where :func:`available`, else why not."""
    return _load()


@functools.lru_cache(maxsize=None)
def _warn(reason: str) -> None:
    warnings.warn(f"maxjax's CPU matmul kernels are not used ({reason}); quantized products run in XLA", RuntimeWarning, stacklevel=3)


def _empty() -> jax.Array:
    return jnp.zeros((0,), jnp.float32)


def _layer(layer: Any) -> jax.Array:
    return jnp.zeros((0,), jnp.int32) if layer is None else jnp.asarray(layer, jnp.int32).reshape(())


def _call(target: str, x: Any, rows: int, *operands: Any, layer: Any, **attrs: Any) -> jax.Array:
    """``x [..., cols]`` times a weight of ``rows`` rows in the kernel ``target``: its operands are
    ``x`` as rows ``[m, cols]``, ``operands``, then the layer (see :func:`_layer`); returns float32
    ``[..., rows]``."""
    lead, cols = x.shape[:-1], x.shape[-1]
    flat = x.reshape(math.prod(lead), cols)
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((flat.shape[0], rows), jnp.float32), vmap_method="sequential")
    return call(flat, *operands, _layer(layer), **attrs).reshape(*lead, rows)


def supports(w: Any, rows: int | None = None) -> bool:
    """Whether the kernels take the quantized weight ``w`` (a 2-D one, or a stack ``[layers, ...]``
    indexed by a layer): the ``nibbles`` layout, ``unpacked`` with groups of a multiple of 16
    values, ``mapped`` Q4_0 and Q8_0, ``int8`` (its float32 product), or ``tiles`` (Q8_0
    activations only; a kernel built for AVX-512); float32 activations with ``cols`` a multiple of
    32 (16 for unpacked groups of 16 and int8)."""
    layout = getattr(w, "layout", None)
    if layout not in ("nibbles", "unpacked", "mapped", "int8", "tiles") or getattr(w, "ndim", 0) not in (2, 3):
        return False
    cols = w.shape[-1]
    if not isinstance(cols, (int, np.integer)) or cols % 16 or any(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(w)):
        return False
    if layout == "mapped":
        return cols % 32 == 0 and w.encoding.value in _MAPPED_KIND
    if layout == "int8":  # as its channel_view: unpacked int8 values, one group per row
        return cols % 16 == 0 and np.dtype(w.values.dtype) == np.int8
    if layout == "tiles":  # Q4_0/Q4_1 in tiles of 16 rows: the kernel is built with AVX-512 only
        return cols % 32 == 0 and w.shape[-2] % 16 == 0 and tiles_built()
    if layout == "nibbles":
        return cols % 32 == 0 and np.dtype(w.scale.dtype) in (np.float16, np.float32)
    groups = w.scale.shape[-1]
    return cols % groups == 0 and (cols // groups) % 16 == 0 and np.dtype(w.values.dtype) in (np.int8, np.uint8)


def quantized_matmul(x: Any, w: Any, layer: Any = None, activations: str = "float32") -> jax.Array:
    """``x @ W.T`` for a quantized weight ``w`` that :func:`supports` takes.

    Args:
        x: float32 ``[..., cols]``.
        w: a :class:`~maxjax.graph.quantization.arrays.NibbleArray`,
            :class:`~maxjax.graph.quantization.arrays.UnpackedArray`, ``MappedArray``,
            :class:`~maxjax.graph.quantization.arrays.Int8Array` (its rotated activations times its
            ``channel_view`` in float32) or :class:`~maxjax.graph.quantization.TiledArray` (Q8_0
            activations only) of logical shape ``[rows, cols]``, or a stack of them ``[layers,
            rows, cols]`` (leaves with a leading layer axis).
        layer: int32 scalar, the layer of a stacked ``w`` (clamped into range); None for a 2-D one.
        activations: ``"float32"``, or ``"Q8_0"`` for a weight :func:`takes_q8_0_activations`:
            each row of ``x`` is quantized per 32-value block to Q8_0 and each block's product is
            an integer dot scaled by both blocks' scales, plus the weight block's offset times the
            activations' sum (llama.cpp's ``ggml_vec_dot_q4_0_q8_0`` and ``_q4_1_q8_1``
            arithmetic; see ``matvec.cc``). Its cotangent is the float32 one.

    Returns:
        float32 ``[..., rows]``: the float32 product of the weight's values (the sum's order is the
        kernel's), or with ``"Q8_0"`` activations, of the quantized activations. Differentiable in
        ``x``; the weight is a constant.

    Raises:
        ValueError: a weight the kernels do not take; ``x`` not float32 or its features not
            ``cols``; a layer index for a 2-D weight or none for a stack; ``"Q8_0"`` activations
            for a weight that does not take them, float32 activations for a ``tiles`` one, or unknown
            ``activations``.
        RuntimeError: the kernels cannot run here (:func:`unavailable_reason` says why).
    """
    reason = _load()
    if reason is not None:
        raise RuntimeError(f"maxjax's CPU matmul kernels cannot run here: {reason}")
    if not supports(w):
        raise ValueError(f"quantized_matmul: maxjax's CPU kernels do not take {w!r} (layout {getattr(w, 'layout', None)!r})")
    if np.dtype(x.dtype) != np.float32:
        raise ValueError(f"quantized_matmul: x must be float32, got {np.dtype(x.dtype)}")
    if x.shape[-1] != w.shape[-1]:
        raise ValueError(f"quantized_matmul: x has {x.shape[-1]} features (shape {tuple(x.shape)}) but {w!r} has {w.shape[-1]} columns")
    if (w.ndim == 3) != (layer is not None):
        raise ValueError(f"quantized_matmul: {w!r} needs {'a layer index' if w.ndim == 3 else 'no layer index'}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"quantized_matmul: activations must be one of {ACTIVATIONS}, got {activations!r}")
    if w.layout == "int8":  # x W^T = (x H)(W H)^T: its rotated activations times its channel view
        return quantized_matmul(w.rotate(x), w.channel_view(), layer, activations)
    if w.layout == "tiles" and activations != "Q8_0":
        raise ValueError(f"quantized_matmul: the tiles layout multiplies Q8_0 activations only (activations='Q8_0'), got {activations!r}")
    if activations == "Q8_0" and not takes_q8_0_activations(w):
        raise ValueError(
            f"quantized_matmul: Q8_0 activations multiply nibbles and mapped weights and unpacked ones in groups of 32, "
            f"not {w!r} (layout {w.layout!r})"
        )
    return _product(activations, x, w, layer)


#: what :func:`quantized_matmul`'s ``activations`` may be: as given, or quantized to Q8_0 blocks
ACTIVATIONS = ("float32", "Q8_0")


def takes_q8_0_activations(w: Any) -> bool:
    """Whether the kernel multiplies ``w`` with Q8_0 activations (:func:`quantized_matmul`): a
    ``nibbles`` weight (4-bit values with scales, and offsets or not), an ``unpacked`` one with
    one scale per 32 values (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K; not Q6_K's 16), a ``mapped`` one
    (Q4_0, Q8_0), or a ``tiles`` one (which takes only them)."""
    layout = getattr(w, "layout", None)
    if layout == "unpacked":  # one scale per 32 values, as the activations' blocks
        return w.shape[-1] == 32 * w.scale.shape[-1]
    return layout in ("nibbles", "mapped", "tiles")


def tiles_built() -> bool:
    """Whether the kernels' library here has the ``tiles`` layout's product (built for AVX-512)."""
    lib = library()
    return lib is not None and bool(_tiles_flag(lib))


@functools.lru_cache(maxsize=None)
def _tiles_flag(lib: Any) -> int:
    fn = lib.maxjax_tiles_built
    fn.restype = ctypes.c_int
    return fn()


def _forward(activations: str, x: Any, w: Any, layer: Any) -> jax.Array:
    rows, index = w.shape[-2], np.int64(ACTIVATIONS.index(activations))
    if w.layout == "mapped":  # the file's blocks, in place
        kind = np.int64(_MAPPED_KIND[w.encoding.value])
        return _call("maxjax_mapped_matmul", x, rows, w.file, w.offsets.reshape(-1), layer=layer, kind=kind, activations=index)
    offset = _empty() if w.offset is None else w.offset
    if w.layout == "tiles":  # Q4_0/Q4_1 in tiles of 16 rows, Q8_0 activations
        return _call("maxjax_tiles_matmul", x, rows, w.values, w.scale, offset, layer=layer)
    target = "maxjax_nibbles_matmul" if w.layout == "nibbles" else "maxjax_unpacked_matmul"
    return _call(target, x, rows, w.values, w.scale, offset, layer=layer, activations=index)


def mapped_rows(w: Any, start: Any, count: int, layer: Any = None) -> jax.Array:
    """Stored rows ``[start, start + count)`` (``start`` an int32 scalar) of a ``mapped`` weight
    :func:`supports` takes (layer ``layer`` of a stack), dequantized: float32 ``[count, cols]``,
    the values its products use (rows as stored, no ``order``). For a prompt's product, which
    dequantizes a block of rows at a time for XLA's GEMM.

    Raises:
        ValueError: not such a weight, or a layer index for a 2-D weight or none for a stack.
        RuntimeError: the kernels cannot run here.
    """
    reason = _load()
    if reason is not None:
        raise RuntimeError(f"maxjax's CPU matmul kernels cannot run here: {reason}")
    if getattr(w, "layout", None) != "mapped" or not supports(w):
        raise ValueError(f"mapped_rows: maxjax's CPU kernels do not read {w!r} in place")
    if (w.ndim == 3) != (layer is not None):
        raise ValueError(f"mapped_rows: {w!r} needs {'a layer index' if w.ndim == 3 else 'no layer index'}")
    call = jax.ffi.ffi_call("maxjax_mapped_dequantize", jax.ShapeDtypeStruct((count, w.shape[-1]), jnp.float32))
    return call(w.file, w.offsets.reshape(-1), _layer(layer), jnp.asarray(start, jnp.int32).reshape(()), kind=np.int64(_MAPPED_KIND[w.encoding.value]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _product(activations: str, x: Any, w: Any, layer: Any) -> jax.Array:
    return _forward(activations, x, w, layer)


def _product_fwd(activations: str, x: Any, w: Any, layer: Any) -> tuple[jax.Array, Any]:
    return _forward(activations, x, w, layer), (w, layer)


def _product_bwd(activations: str, res: Any, g: Any) -> tuple[Any, None, None]:
    w, layer = res  # the cotangent of x: g @ W, W [rows, cols] dequantized by its layout's class
    if layer is not None:
        w = w.layer(layer)
    if w.layout == "mapped":  # the kernel's rows are the stored ones (the caller reorders its output)
        return g @ w.packed().dequantize(), None, None
    return g @ w.dequantize(), None, None


_product.defvjp(_product_fwd, _product_bwd)


#: 16-bit float weights the kernel widens exactly (every value of either is a float32 value)
WIDENED_DTYPES = (jnp.bfloat16, jnp.float16)


def takes_widened(w: Any) -> bool:
    """Whether :func:`widened_matmul` takes ``w``: a concrete-shaped bfloat16 or float16 ``[rows,
    cols]`` (or a stack ``[layers, rows, cols]``) with ``cols`` a multiple of 64."""
    shape = getattr(w, "shape", ())
    if len(shape) not in (2, 3) or getattr(w, "dtype", None) not in WIDENED_DTYPES:
        return False
    return all(isinstance(d, (int, np.integer)) and d > 0 for d in shape) and shape[-1] % 64 == 0


def _check_widened(what: str, w: Any, layer: Any) -> None:
    reason = _load()
    if reason is not None:
        raise RuntimeError(f"maxjax's CPU matmul kernels cannot run here: {reason}")
    if not takes_widened(w):
        raise ValueError(f"{what}: the weight must be bfloat16 or float16 [rows, cols] or [layers, rows, cols] with cols a multiple of 64, "
                         f"got {getattr(w, 'dtype', None)}{list(getattr(w, 'shape', ()))}")  # fmt: skip
    if (w.ndim == 3) != (layer is not None):
        raise ValueError(f"{what}: a weight of shape {list(w.shape)} needs {'a layer index' if w.ndim == 3 else 'no layer index'}")


def widened_matmul(x: Any, w: Any, layer: Any = None, *, widen_rows: int = 0) -> jax.Array:
    """``x @ W.T`` for a bfloat16 or float16 weight, in float32 arithmetic: each weight value is
    widened exactly (a bfloat16 is a float32's high half; every float16 is a float32 value) and
    multiplied with ``x`` as it is, float32 sums; the same values as ``x @ w.astype(float32).T``
    up to the order of the sums.

    Args:
        x: float32 ``[..., cols]``.
        w: bfloat16 or float16 ``[rows, cols]``, or a stack ``[layers, rows, cols]`` (see
            :func:`takes_widened`).
        layer: int32 scalar, the layer of a stacked ``w`` (clamped into range); None for a 2-D one.
        widen_rows: 0: the kernel's product, which reads the weight once, in place, widening it
            in registers (a few rows of ``x``: decode; half the bytes of a float32 weight's
            product). ``c`` > 0: XLA's GEMM against the weight widened ``c`` rows at a time by
            :func:`widened_rows` (the last block takes the rest; many rows: a prompt).

    Returns:
        float32 ``[..., rows]``. Differentiable in ``x`` and ``w`` (float32 cotangent products;
        ``w``'s cotangent is rounded to its dtype).

    Raises:
        ValueError: a weight :func:`takes_widened` refuses, ``x`` not float32 or its features not
            ``cols``, a layer index for a 2-D weight or none for a stack, a negative
            ``widen_rows``.
        RuntimeError: the kernels cannot run here (:func:`unavailable_reason` says why).
    """
    _check_widened("widened_matmul", w, layer)
    if np.dtype(x.dtype) != np.float32:
        raise ValueError(f"widened_matmul: x must be float32, got {np.dtype(x.dtype)}")
    if x.shape[-1] != w.shape[-1]:
        raise ValueError(f"widened_matmul: x has {x.shape[-1]} features (shape {tuple(x.shape)}) but the weight has {w.shape[-1]} columns")
    if widen_rows < 0:
        raise ValueError(f"widened_matmul: widen_rows must be 0 or positive, got {widen_rows}")
    return _widened_product(int(widen_rows), x, w, None if layer is None else _layer(layer))


def widened_rows(w: Any, start: Any, count: int, layer: Any = None) -> jax.Array:
    """Rows ``[start, start + count)`` (``start`` an int32 scalar) of a bfloat16 or float16 weight
    (layer ``layer`` of a stack) widened to float32 ``[count, cols]``, exactly: for a prompt's
    product, which widens the weight for XLA's GEMM (XLA:CPU's own ``convert`` of a whole
    bfloat16 weight ran at about 1 G values/s, mostly in fresh pages).

    Raises:
        ValueError: a weight :func:`takes_widened` refuses, or a layer index for a 2-D weight or
            none for a stack.
        RuntimeError: the kernels cannot run here.
    """
    _check_widened("widened_rows", w, layer)
    call = jax.ffi.ffi_call("maxjax_widened_rows", jax.ShapeDtypeStruct((count, w.shape[-1]), jnp.float32), vmap_method="sequential")
    return call(w, _layer(layer), jnp.asarray(start, jnp.int32).reshape(()))


def _widened_forward(widen_rows: int, x: Any, w: Any, layer: Any) -> jax.Array:
    lead, cols, rows = x.shape[:-1], x.shape[-1], w.shape[-2]
    if not widen_rows:
        return _call("maxjax_widened_matmul", x, rows, w, layer=layer)  # [..., rows]
    flat = x.reshape(math.prod(lead), cols)  # [m, cols]
    c, hi = min(widen_rows, rows), jax.lax.Precision.HIGHEST

    def block(start: Any, count: int) -> jax.Array:  # [m, count]
        return jnp.matmul(flat, widened_rows(w, start, count, layer).T, precision=hi)

    n, rest = divmod(rows, c)
    parts = []
    if n == 1:
        parts.append(block(jnp.int32(0), c))
    elif n > 1:
        out = jax.lax.map(lambda i: block(i * c, c), jnp.arange(n, dtype=jnp.int32))  # [n, m, c]
        parts.append(jnp.moveaxis(out, 0, 1).reshape(flat.shape[0], n * c))
    if rest:
        parts.append(block(jnp.int32(n * c), rest))  # the last, smaller block
    y = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
    return y.reshape(*lead, rows)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _widened_product(widen_rows: int, x: Any, w: Any, layer: Any) -> jax.Array:
    return _widened_forward(widen_rows, x, w, layer)


def _widened_product_fwd(widen_rows: int, x: Any, w: Any, layer: Any) -> tuple[jax.Array, Any]:
    return _widened_forward(widen_rows, x, w, layer), (x, w, layer)


def _widened_product_bwd(widen_rows: int, res: Any, g: Any) -> tuple[Any, Any, Any]:
    from maxjax.backend.policy import _float32_cotangents

    x, w, layer = res  # g [..., rows]
    at = None if layer is None else jnp.clip(layer, 0, w.shape[0] - 1)
    wl = w if at is None else jax.lax.dynamic_index_in_dim(w, at, keepdims=False)  # [rows, cols]
    dx, dwl = _float32_cotangents(g, x, wl.astype(jnp.float32))  # [..., cols], [rows, cols]: w widened exactly
    dwl = dwl.astype(w.dtype)
    dw = dwl if at is None else jax.lax.dynamic_update_index_in_dim(jnp.zeros_like(w), dwl, at, 0)
    return dx, dw, None


_widened_product.defvjp(_widened_product_fwd, _widened_product_bwd)
