"""Quantization (MAX's ``max.graph.quantization``): encodings, GGUF bit layouts, quantized arrays.

- :mod:`~maxjax.graph.quantization.encoding`: :class:`QuantizationEncoding`,
  :class:`BlockParameters`, :class:`QuantizationConfig`.
- :mod:`~maxjax.graph.quantization.blocks`: each GGUF block format's bit layout, written once, and
  :func:`dequantize` (the kernel behind ``ops.dequantize``), bit-identical to the ``gguf`` package.
- :mod:`~maxjax.graph.quantization.arrays`: :class:`QuantizedArray`, a quantized weight as a typed
  JAX pytree (logical shape and dtype, encoding, layout; ``dequantize``/``matmul``/``take``), with
  one class per memory layout: :class:`PackedArray`, :class:`UnpackedArray`, :class:`NibbleArray`,
  :class:`DequantizedArray`, :class:`Int8Array` (requantized per channel for int8 dots).
- :mod:`~maxjax.graph.quantization.mapped`: :class:`MappedArray`, GGUF blocks read in place from
  the mapped file (the ``mapped`` layout).
- :mod:`~maxjax.graph.quantization.tiles`: :class:`TiledArray`, Q4_0 in tiles of 16 rows for
  integer dots with Q8_0 activations (the ``tiles`` layout).
"""

from maxjax.graph.quantization.arrays import (
    LAYOUTS,
    NIBBLE_ENCODINGS,
    DequantizedArray,
    Int8Array,
    NibbleArray,
    PackedArray,
    QuantizedArray,
    UnpackedArray,
    as_quantized,
    layout_for,
    register_encoding,
    stored_class,
    to_layout,
)
from maxjax.graph.quantization.blocks import dequantize
from maxjax.graph.quantization.mapped import MAPPED_ENCODINGS, MappedArray
from maxjax.graph.quantization.tiles import TiledArray
from maxjax.graph.quantization.gptq import dequantize_gptq, gptq_matmul, perm_idx_from_g_idx
from maxjax.graph.quantization.encoding import (
    GGUF_ENCODINGS,
    BlockParameters,
    QuantizationConfig,
    QuantizationEncoding,
    as_encoding,
)

__all__ = [
    "BlockParameters",
    "DequantizedArray",
    "GGUF_ENCODINGS",
    "Int8Array",
    "LAYOUTS",
    "MAPPED_ENCODINGS",
    "MappedArray",
    "NIBBLE_ENCODINGS",
    "NibbleArray",
    "TiledArray",
    "PackedArray",
    "QuantizationConfig",
    "QuantizationEncoding",
    "QuantizedArray",
    "UnpackedArray",
    "as_encoding",
    "as_quantized",
    "dequantize",
    "register_encoding",
    "stored_class",
    "layout_for",
    "to_layout",
    "dequantize_gptq",
    "gptq_matmul",
    "perm_idx_from_g_idx",
]
