"""GGUF blocks to the ``nibbles`` and ``unpacked`` run-time layouts on the host, in one pass.

Loading a GGUF-quantized weight used to copy its blocks out of the mapped file into one host
buffer, then run an XLA program that rewrites them into the run-time layout: a second pass over
the bytes, and one XLA compile per weight shape. ``layouts.cc`` (built into the kernels' library,
see :mod:`maxjax.backend.kernels`) writes the run-time layout straight from the mapped blocks:
one read of the file, one write of the result, no compile, the rows of each layer split over the
host's cores (``ctypes`` calls release the GIL).

The layouts' definitions stay the ``jnp`` code of :mod:`maxjax.graph.quantization` (``NibbleArray``,
``UnpackedArray``, after llama.cpp's ``ggml-quants.c``); this is a host fast path for the block
formats of the common files (Q4_0, Q4_1 and Q4_K to ``nibbles``; those, Q8_0 and Q6_K to
``unpacked``: a Q4_K_M file is Q4_K and Q6_K), bit-identical to it
(``tests/test_host_layouts.py``). The backend policy decides
when it runs (``host_layout_conversion``).
"""

from __future__ import annotations

import ctypes
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["HOST_LAYOUTS", "converts", "layout_shapes", "convert_layers"]

#: the (layout, encoding name) pairs converted on the host
HOST_LAYOUTS = frozenset(
    {("nibbles", e) for e in ("Q4_0", "Q4_1", "Q4_K")} | {("unpacked", e) for e in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")} | {("tiles", e) for e in ("Q4_0", "Q4_1")}
)
#: rows a conversion task's row range is a multiple of (nibbles pair rows; tiles hold 16)
_ROW_UNIT = {"nibbles": 2, "unpacked": 1, "tiles": 16}
_KIND = {"Q4_0": 0, "Q4_1": 1, "Q8_0": 2, "Q4_K": 3, "Q6_K": 4}  # layouts.cc's Kind
_BLOCK = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}  # values, bytes
_GROUP = {"Q6_K": 16}  # values per scale (32 for the others)
_VALUES_DTYPE = {"Q4_0": np.int8, "Q4_1": np.uint8, "Q8_0": np.int8, "Q4_K": np.uint8, "Q6_K": np.int8}  # unpacked
_OFFSET = ("Q4_1", "Q4_K")
_CHUNK_BYTES = 1 << 20  # source bytes per task (whole rows, an even number of them)


def converts(layout: str, encoding: str) -> bool:
    """Whether ``encoding`` (a GGUF block format's name, e.g. ``"Q4_0"``) converts to ``layout``
    on the host here (the pair is one of :data:`HOST_LAYOUTS` and the kernels' library is built)."""
    from maxjax.backend.kernels import library

    return (layout, encoding) in HOST_LAYOUTS and library() is not None


def layout_shapes(layout: str, encoding: str, rows: int, cols: int) -> dict[str, tuple[tuple[int, ...], Any] | None]:
    """The leaves of one ``[rows, cols]`` weight in ``layout``: ``{"values", "scale", "offset"}``
    to ``(shape, dtype)`` (``offset`` None for Q4_0, Q8_0 and Q6_K).

    Raises:
        ValueError: a pair not in :data:`HOST_LAYOUTS`, ``cols`` not a whole number of the
            format's blocks (32 values; 256 for Q4_K and Q6_K), or an odd number of rows for
            ``nibbles``.
    """
    if (layout, encoding) not in HOST_LAYOUTS:
        raise ValueError(f"no host conversion of {encoding} to the {layout!r} layout (host conversions: {sorted(HOST_LAYOUTS)})")
    per_block = _BLOCK[encoding][0]
    if cols % per_block or rows % _ROW_UNIT[layout]:
        raise ValueError(f"{encoding} [{rows}, {cols}] cannot take the {layout!r} layout ({per_block}-value blocks; nibbles pair rows, tiles hold 16)")
    groups = cols // _GROUP.get(encoding, 32)
    if layout == "tiles":  # 16 rows a tile: 256 bytes and 16 float16 d (and m) per block (maxjax.graph.quantization.tiles)
        scale = ((rows // 16, cols // 2), np.float16)
        return {"values": ((rows // 16, cols * 8), np.uint8), "scale": scale, "offset": scale if encoding == "Q4_1" else None}
    if layout == "nibbles":  # two rows per byte; Q4_0/Q4_1: the file's float16 d and m
        values, scale = ((rows // 2, cols), np.uint8), ((rows, groups), np.float16 if encoding != "Q4_K" else np.float32)
    else:  # one byte per value; float32 scales
        values, scale = ((rows, cols), _VALUES_DTYPE[encoding]), ((rows, groups), np.float32)
    return {"values": values, "scale": scale, "offset": scale if encoding in _OFFSET else None}


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def _function(layout: str) -> Any:
    from maxjax.backend.kernels import library

    lib = library()
    if lib is None:
        from maxjax.backend.kernels import unavailable_reason

        raise RuntimeError(f"maxjax's CPU kernels cannot run here: {unavailable_reason()}")
    fn = getattr(lib, f"maxjax_{layout}_from_blocks")
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, i64, p, i64, i64, i64, ctypes.c_int32, p, p, p]
    fn.restype = ctypes.c_int
    return fn


def convert_layers(
    layout: str,
    encoding: str,
    layers: Sequence[tuple[np.ndarray, np.ndarray | None]],
    values: np.ndarray,
    scale: np.ndarray,
    offset: np.ndarray | None,
    *,
    threads: int | None = None,
    on_layer_done: Callable[[int], None] | None = None,
) -> None:
    """Writes ``len(layers)`` weights of GGUF blocks into the stacked leaves of ``layout``.

    Args:
        layout, encoding: a pair of :data:`HOST_LAYOUTS` (the encoding by name, e.g. ``"Q4_1"``).
        layers: per layer, its blocks, uint8 ``[stored_rows, row_bytes]`` with C-contiguous rows
            (e.g. a view of a mapped file: only the rows converted are read), and the source row
            of each output row (int64 ``[rows]``), or None for the stored order.
        values, scale, offset: writable C-contiguous outputs ``[len(layers), *shape]`` with the
            shapes and dtypes of :func:`layout_shapes` (``offset`` None where it gives None).
        threads: tasks run at once (default: the CPUs this process may use).
        on_layer_done: called with each layer's index, in order, once its rows are written (e.g.
            to drop the file's pages from the resident set).

    Raises:
        ValueError: shapes, dtypes or row indices that do not fit (naming the layer).
        RuntimeError: the kernels' library cannot be built here.
    """
    rows, cols = {"nibbles": (values.shape[-2] * 2, values.shape[-1]), "tiles": (values.shape[-2] * 16, values.shape[-1] // 8)}.get(layout, values.shape[-2:])
    want = layout_shapes(layout, encoding, rows, cols)
    n = len(layers)
    for name, arr in (("values", values), ("scale", scale), ("offset", offset)):
        spec = want[name]
        if (spec is None) != (arr is None):
            raise ValueError(f"convert_layers: {name} must be {'None' if spec is None else 'an array'} for {encoding} {layout}")
        if arr is not None and (arr.shape != (n, *spec[0]) or arr.dtype != np.dtype(spec[1]) or not arr.flags.c_contiguous or not arr.flags.writeable):
            raise ValueError(f"convert_layers: {name} is {arr.dtype}{list(arr.shape)}, expected a writable C-contiguous {np.dtype(spec[1])}{[n, *spec[0]]}")
    per_block, bsize = _BLOCK[encoding]
    blocks = cols // per_block
    sources = []
    for i, (src, index) in enumerate(layers):
        if src.dtype != np.uint8 or src.ndim != 2 or src.shape[1] != blocks * bsize or src.strides != (src.shape[1], 1):
            raise ValueError(f"convert_layers: layer {i} blocks are {src.dtype}{list(src.shape)}, expected C-contiguous uint8 [rows, {blocks * bsize}]")
        if index is None:
            if src.shape[0] != rows:
                raise ValueError(f"convert_layers: layer {i} has {src.shape[0]} rows, expected {rows}")
        else:
            index = np.ascontiguousarray(index, np.int64)
            if index.shape != (rows,) or (rows and (index.min() < 0 or index.max() >= src.shape[0])):
                raise ValueError(f"convert_layers: layer {i}: row indices must be {rows} rows of [0, {src.shape[0]})")
        sources.append((src, index))
    fn, kind = _function(layout), _KIND[encoding]
    unit = _ROW_UNIT[layout]
    step = max(unit, _CHUNK_BYTES // max(1, blocks * bsize) // unit * unit)

    def run(i: int, first: int, count: int) -> None:
        src, index = sources[i]
        outs = [0 if a is None else a[i].ctypes.data for a in (values, scale, offset)]
        rc = fn(src.ctypes.data, blocks * bsize, None if index is None else index.ctypes.data, first, count, blocks, kind, *outs)
        if rc:
            raise RuntimeError(f"convert_layers: layouts.cc returned {rc} for layer {i}, rows {first}..{first + count}")

    with ThreadPoolExecutor(max_workers=max(1, threads or _cpus())) as pool:
        pending = [[pool.submit(run, i, r, min(step, rows - r)) for r in range(0, rows, step)] for i in range(n)]
        for i, futures in enumerate(pending):
            for f in futures:
                f.result()
            if on_layer_done is not None:
                on_layer_done(i)
