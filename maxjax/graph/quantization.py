"""Quantization encodings and jittable dequantizers for GGUF block formats.

This is maxjax's counterpart of ``max.graph.quantization``: :class:`QuantizationEncoding` (with the
members of MAX 26.7 plus the other common GGUF block formats), :class:`BlockParameters` and
:class:`QuantizationConfig`, and the kernels that MAX keeps in its ``ops.dequantize`` /
``ops.qmatmul``: :func:`dequantize` and :func:`quantized_matmul`.

Packed weights stay packed (``uint8``) in device memory. Each GGUF encoding has one pure-``jnp``
dequantizer made only of slices, reshapes, shifts, masks, converts and multiply-adds, so that it
runs under ``jax.jit``/``vmap``/``eval_shape`` and XLA fuses it into one loop (and, for
:func:`quantized_matmul`, into the consumer of the weights).

The bit layouts are those of llama.cpp (``ggml/src/ggml-quants.c``, ``dequantize_row_*``) as
re-implemented in numpy by the ``gguf`` Python package (``gguf/quants.py``,
``<Type>.dequantize_blocks``); our results are bit-identical to ``gguf.quants.dequantize``: the
float operations are the same ones, done in the same order, in float32.

A packed tensor is ``[rows, bytes_per_row]`` ``uint8`` where each row is a whole number of blocks,
which is how ``gguf.GGUFReader`` returns quantized tensors (``ReaderTensor.data``). The result is
``float32 [rows, bytes_per_row // block_size * elements_per_block]``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

if TYPE_CHECKING:  # pragma: no cover
    import gguf

__all__ = [
    "BlockParameters",
    "QuantizationConfig",
    "QuantizationEncoding",
    "NIBBLE_ENCODINGS",
    "NibbleWeight",
    "RepackedWeight",
    "SWAPPED_MAX_ROWS",
    "dequantize",
    "matmul_transposed",
    "quantized_matmul",
    "repack",
    "repack_nibbles",
    "repacked_matmul",
]

QK_K = 256  # elements per super-block of the k-quants
_K_SCALE_SIZE = 12  # bytes of packed 6-bit scales and mins in Q4_K / Q5_K


class BlockParameters(NamedTuple):
    """Shape of one quantization block: how many elements it holds, and its size in bytes."""

    elements_per_block: int
    block_size: int


class QuantizationEncoding(enum.Enum):
    """How a weight is quantized (``max.graph.quantization.QuantizationEncoding``).

    MAX 26.7 has Q4_0, Q4_K, Q5_K, Q6_K and GPTQ; maxjax adds the other GGUF block formats that
    :func:`dequantize` supports (Q4_1, Q5_0, Q5_1, Q8_0). As in MAX, ``.name`` is lower case
    (``QuantizationEncoding.Q4_K.name == "q4_k"``) while the value is upper case.
    """

    Q4_0 = "Q4_0"
    Q4_1 = "Q4_1"
    Q5_0 = "Q5_0"
    Q5_1 = "Q5_1"
    Q8_0 = "Q8_0"
    Q4_K = "Q4_K"
    Q5_K = "Q5_K"
    Q6_K = "Q6_K"
    GPTQ = "GPTQ"

    @property
    def name(self) -> str:  # type: ignore[override]
        """The lower-case name, as MAX returns it (``"q4_k"``)."""
        return self._name_.lower()

    @property
    def block_parameters(self) -> BlockParameters:
        """``BlockParameters(elements_per_block, block_size)``; a ValueError for GPTQ."""
        try:
            return _BLOCK_PARAMETERS[self]
        except KeyError:
            raise ValueError(
                f"{self} has no fixed block parameters: it is not a GGUF block format "
                f"(GGUF encodings: {', '.join(e.value for e in _BLOCK_PARAMETERS)})"
            ) from None

    @property
    def elements_per_block(self) -> int:
        """Number of weight elements in one block (32, or 256 for the k-quants)."""
        return self.block_parameters.elements_per_block

    @property
    def block_size(self) -> int:
        """Size of one block in bytes."""
        return self.block_parameters.block_size

    @property
    def is_gguf(self) -> bool:
        """True for the GGUF block formats, i.e. for every member but GPTQ."""
        return self in _BLOCK_PARAMETERS

    @classmethod
    def from_gguf(cls, qtype: "gguf.GGMLQuantizationType | int") -> "QuantizationEncoding":
        """The encoding of a ``gguf.GGMLQuantizationType`` (ValueError for unsupported types)."""
        import gguf

        try:
            qtype = gguf.GGMLQuantizationType(qtype)
        except ValueError:
            raise ValueError(
                f"{qtype!r} is not a gguf.GGMLQuantizationType; supported quantization types: "
                f"{', '.join(e.value for e in _BLOCK_PARAMETERS)}"
            ) from None
        try:
            return cls(qtype.name)
        except ValueError:
            pass
        raise ValueError(
            f"GGUF quantization type {qtype.name} is not supported by maxjax; supported "
            f"quantization types: {', '.join(e.value for e in _BLOCK_PARAMETERS)}"
        )

    def to_gguf(self) -> "gguf.GGMLQuantizationType":
        """The matching ``gguf.GGMLQuantizationType`` (ValueError for GPTQ)."""
        import gguf

        if not self.is_gguf:
            raise ValueError(f"{self} is not a GGUF quantization type")
        return gguf.GGMLQuantizationType[self.value]


_E = QuantizationEncoding
_BLOCK_PARAMETERS: dict[QuantizationEncoding, BlockParameters] = {
    _E.Q4_0: BlockParameters(32, 18),  # d:f16, qs:u8[16]
    _E.Q4_1: BlockParameters(32, 20),  # d:f16, m:f16, qs:u8[16]
    _E.Q5_0: BlockParameters(32, 22),  # d:f16, qh:u8[4], qs:u8[16]
    _E.Q5_1: BlockParameters(32, 24),  # d:f16, m:f16, qh:u8[4], qs:u8[16]
    _E.Q8_0: BlockParameters(32, 34),  # d:f16, qs:i8[32]
    _E.Q4_K: BlockParameters(256, 144),  # d:f16, dmin:f16, scales:u8[12], qs:u8[128]
    _E.Q5_K: BlockParameters(256, 176),  # d:f16, dmin:f16, scales:u8[12], qh:u8[32], qs:u8[128]
    _E.Q6_K: BlockParameters(256, 210),  # ql:u8[128], qh:u8[64], scales:i8[16], d:f16
}


@dataclass
class QuantizationConfig:
    """Configuration of a non-GGUF quantization such as GPTQ (``max.graph.quantization``)."""

    quant_method: str
    bits: int
    group_size: int
    desc_act: bool = False
    sym: bool = False


# ----------------------------------------------------------------------------------------------
# Building blocks. Every helper works on arrays of blocks shaped [..., n] and uses only
# elementwise ops, static slices and reshapes, so that XLA fuses a whole dequantizer into one loop.


def _u8(v: int) -> jax.Array:
    return jnp.uint8(v)


def _f16(b: jax.Array) -> jax.Array:
    """float32 [...] from little-endian IEEE half floats stored as uint8 [..., 2].

    The byte pair is assembled into a uint16 explicitly (low byte first), so the result does not
    depend on the byte order of the machine, then bitcast to float16 and widened exactly.
    """
    u = b[..., 0].astype(jnp.uint16) | (b[..., 1].astype(jnp.uint16) << jnp.uint16(8))
    return lax.bitcast_convert_type(u, jnp.float16).astype(jnp.float32)


def _nibbles(qs: jax.Array) -> jax.Array:
    """[..., n] bytes -> [..., 2, n] nibbles: low nibbles first, then high nibbles (GGUF order)."""
    shifts = jnp.array([0, 4], dtype=jnp.uint8).reshape(2, 1)
    return (qs[..., None, :] >> shifts) & _u8(0x0F)


def _nibbles_stacked(qs: jax.Array) -> jax.Array:
    """Same values as :func:`_nibbles`, built with a stack instead of a broadcast shift."""
    return jnp.stack([qs & _u8(0x0F), qs >> _u8(4)], axis=-2)


def _bits(qh: jax.Array, shifts: list[int], mask: int) -> jax.Array:
    """[..., n] bytes -> [..., len(shifts), n]: field ``(byte >> s) & mask`` for each shift s."""
    s = jnp.array(shifts, dtype=jnp.uint8).reshape(len(shifts), 1)
    return (qh[..., None, :] >> s) & _u8(mask)


def _bits_stacked(qh: jax.Array, shifts: list[int], mask: int) -> jax.Array:
    """Same values as :func:`_bits`, built with a stack instead of a broadcast shift."""
    return jnp.stack([(qh >> _u8(s)) & _u8(mask) for s in shifts], axis=-2)


# The two spellings give the same values, but XLA:CPU vectorises some combinations of them much
# better than others (up to 15x apart on the k-quants, measured with jax 0.10 on AVX-512): each
# k-quant below uses the fastest combination found (see benchmarks/dequantize.py).


def _qh32(qh: jax.Array) -> jax.Array:
    """Q5_0/Q5_1: uint32 (4 bytes, little endian) of high bits -> bit j of element j, [..., 32]."""
    s = jnp.arange(8, dtype=jnp.uint8)
    return ((qh[..., :, None] >> s) & _u8(1)).reshape(*qh.shape[:-1], 32)


def _k_scale_min(scales: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Q4_K / Q5_K: 12 bytes of packed 6-bit scales and mins -> two uint8 [..., 8].

    Same unpacking as ``gguf.quants.Q4_K.get_scale_min`` (llama.cpp ``get_scale_min_k4``).
    """
    d = scales[..., 0:4]
    m = scales[..., 4:8]
    m_d = scales[..., 8:12]
    sc = jnp.concatenate([d & _u8(0x3F), (m_d & _u8(0x0F)) | ((d >> _u8(2)) & _u8(0x30))], axis=-1)
    mn = jnp.concatenate([m & _u8(0x3F), (m_d >> _u8(4)) | ((m >> _u8(2)) & _u8(0x30))], axis=-1)
    return sc, mn


def _f32(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32)


# ----------------------------------------------------------------------------------------------
# One dequantizer per encoding: uint8 blocks [..., block_size] -> float32 [..., elements_per_block]
# (the k-quants return [..., sub_blocks, sub_block_elements]; the caller reshapes).
# Each one follows gguf/quants.py <Type>.dequantize_blocks, float op for float op.


def _deq_q4_0(b: jax.Array) -> jax.Array:
    """Q4_0 (llama.cpp ``dequantize_row_q4_0``): ``x = d * (q - 8)``, q the 4-bit values."""
    d = _f16(b[..., 0:2])
    q = _nibbles(b[..., 2:18]).reshape(*b.shape[:-1], 32)
    return d[..., None] * _f32(q.astype(jnp.int8) - jnp.int8(8))


def _deq_q4_1(b: jax.Array) -> jax.Array:
    """Q4_1 (llama.cpp ``dequantize_row_q4_1``): ``x = d * q + m``."""
    d = _f16(b[..., 0:2])
    m = _f16(b[..., 2:4])
    q = _nibbles(b[..., 4:20]).reshape(*b.shape[:-1], 32)
    return d[..., None] * _f32(q) + m[..., None]


def _deq_q5_0(b: jax.Array) -> jax.Array:
    """Q5_0 (llama.cpp ``dequantize_row_q5_0``): ``x = d * (q - 16)``, q = low nibble | bit << 4."""
    d = _f16(b[..., 0:2])
    qh = _qh32(b[..., 2:6])
    ql = _nibbles(b[..., 6:22]).reshape(*b.shape[:-1], 32)
    q = (ql | (qh << _u8(4))).astype(jnp.int8) - jnp.int8(16)
    return d[..., None] * _f32(q)


def _deq_q5_1(b: jax.Array) -> jax.Array:
    """Q5_1 (llama.cpp ``dequantize_row_q5_1``): ``x = d * q + m``, q = low nibble | bit << 4."""
    d = _f16(b[..., 0:2])
    m = _f16(b[..., 2:4])
    qh = _qh32(b[..., 4:8])
    ql = _nibbles(b[..., 8:24]).reshape(*b.shape[:-1], 32)
    q = ql | (qh << _u8(4))
    return d[..., None] * _f32(q) + m[..., None]


def _deq_q8_0(b: jax.Array) -> jax.Array:
    """Q8_0 (llama.cpp ``dequantize_row_q8_0``): ``x = q * d``, q signed 8-bit."""
    d = _f16(b[..., 0:2])
    q = lax.bitcast_convert_type(b[..., 2:34], jnp.int8)
    return _f32(q) * d[..., None]


def _deq_q4_k(b: jax.Array) -> jax.Array:
    """Q4_K (llama.cpp ``dequantize_row_q4_K``): 8 sub-blocks of 32, ``x = (d*sc) * q - dmin*m``."""
    lead = b.shape[:-1]
    d = _f16(b[..., 0:2])
    dmin = _f16(b[..., 2:4])
    sc, mn = _k_scale_min(b[..., 4:16])
    ds = (d[..., None] * _f32(sc))[..., None]  # [..., 8, 1]
    dm = (dmin[..., None] * _f32(mn))[..., None]
    # qs: 4 groups of 32 bytes; group g holds sub-block 2g (low nibbles) and 2g+1 (high nibbles).
    q = _nibbles_stacked(b[..., 16:144].reshape(*lead, 4, 32)).reshape(*lead, 8, 32)
    return ds * _f32(q) - dm


def _deq_q5_k(b: jax.Array) -> jax.Array:
    """Q5_K (llama.cpp ``dequantize_row_q5_K``): as Q4_K with a 5th bit from ``qh``."""
    lead = b.shape[:-1]
    d = _f16(b[..., 0:2])
    dmin = _f16(b[..., 2:4])
    sc, mn = _k_scale_min(b[..., 4:16])
    ds = (d[..., None] * _f32(sc))[..., None]
    dm = (dmin[..., None] * _f32(mn))[..., None]
    ql = _nibbles_stacked(b[..., 48:176].reshape(*lead, 4, 32)).reshape(*lead, 8, 32)
    # qh: 32 bytes; bit k of byte i is the high bit of element i of sub-block k.
    qh = _bits(b[..., 16:48], list(range(8)), 0x01)  # [..., 8, 32]
    q = ql | (qh << _u8(4))
    return ds * _f32(q) - dm


def _deq_q6_k(b: jax.Array) -> jax.Array:
    """Q6_K (llama.cpp ``dequantize_row_q6_K``): 16 sub-blocks of 16, ``x = (d*sc) * (q - 32)``."""
    lead = b.shape[:-1]
    ql = _nibbles(b[..., 0:128].reshape(*lead, 2, 64)).reshape(*lead, 8, 32)
    qh = _bits_stacked(b[..., 128:192].reshape(*lead, 2, 32), [0, 2, 4, 6], 0x03).reshape(*lead, 8, 32)
    scales = _f32(lax.bitcast_convert_type(b[..., 192:208], jnp.int8))  # [..., 16]
    d = _f16(b[..., 208:210])
    ds = (d[..., None] * scales)[..., None]  # [..., 16, 1]
    q = (ql | (qh << _u8(4))).astype(jnp.int8) - jnp.int8(32)
    return ds * _f32(q.reshape(*lead, 16, 16))


_DEQUANTIZERS: dict[QuantizationEncoding, Callable[[jax.Array], jax.Array]] = {
    _E.Q4_0: _deq_q4_0,
    _E.Q4_1: _deq_q4_1,
    _E.Q5_0: _deq_q5_0,
    _E.Q5_1: _deq_q5_1,
    _E.Q8_0: _deq_q8_0,
    _E.Q4_K: _deq_q4_k,
    _E.Q5_K: _deq_q5_k,
    _E.Q6_K: _deq_q6_k,
}


# ----------------------------------------------------------------------------------------------
# The same formats split into (values, scale, offset) per group of 32 (16 for Q6_K), so that
# ``w = scale * values + offset`` (no offset for the symmetric formats) with the very float32
# operations of the dequantizers above: see :func:`repack`.


def _parts_q4_0(b: jax.Array):
    q = _nibbles(b[..., 2:18]).reshape(*b.shape[:-1], 1, 32)
    return q.astype(jnp.int8) - jnp.int8(8), _f16(b[..., 0:2])[..., None], None


def _parts_q4_1(b: jax.Array):
    q = _nibbles(b[..., 4:20]).reshape(*b.shape[:-1], 1, 32)
    return q, _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]


def _parts_q5_0(b: jax.Array):
    ql = _nibbles(b[..., 6:22]).reshape(*b.shape[:-1], 32)
    q = (ql | (_qh32(b[..., 2:6]) << _u8(4))).astype(jnp.int8) - jnp.int8(16)
    return q[..., None, :], _f16(b[..., 0:2])[..., None], None


def _parts_q5_1(b: jax.Array):
    ql = _nibbles(b[..., 8:24]).reshape(*b.shape[:-1], 32)
    q = ql | (_qh32(b[..., 4:8]) << _u8(4))
    return q[..., None, :], _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]


def _parts_q8_0(b: jax.Array):
    q = lax.bitcast_convert_type(b[..., 2:34], jnp.int8)
    return q[..., None, :], _f16(b[..., 0:2])[..., None], None


def _k_scales(b: jax.Array) -> tuple[jax.Array, jax.Array]:
    sc, mn = _k_scale_min(b[..., 4:16])
    # offset = -(dmin * m): adding it is bit-identical to subtracting dmin * m
    return _f16(b[..., 0:2])[..., None] * _f32(sc), -(_f16(b[..., 2:4])[..., None] * _f32(mn))


def _parts_q4_k(b: jax.Array):
    lead = b.shape[:-1]
    q = _nibbles_stacked(b[..., 16:144].reshape(*lead, 4, 32)).reshape(*lead, 8, 32)
    return (q, *_k_scales(b))


def _parts_q5_k(b: jax.Array):
    lead = b.shape[:-1]
    ql = _nibbles_stacked(b[..., 48:176].reshape(*lead, 4, 32)).reshape(*lead, 8, 32)
    q = ql | (_bits(b[..., 16:48], list(range(8)), 0x01) << _u8(4))
    return (q, *_k_scales(b))


def _parts_q6_k(b: jax.Array):
    lead = b.shape[:-1]
    ql = _nibbles(b[..., 0:128].reshape(*lead, 2, 64)).reshape(*lead, 8, 32)
    qh = _bits_stacked(b[..., 128:192].reshape(*lead, 2, 32), [0, 2, 4, 6], 0x03).reshape(*lead, 8, 32)
    q = ((ql | (qh << _u8(4))).astype(jnp.int8) - jnp.int8(32)).reshape(*lead, 16, 16)
    scale = _f16(b[..., 208:210])[..., None] * _f32(lax.bitcast_convert_type(b[..., 192:208], jnp.int8))
    return q, scale, None


_PARTS = {
    _E.Q4_0: _parts_q4_0,
    _E.Q4_1: _parts_q4_1,
    _E.Q5_0: _parts_q5_0,
    _E.Q5_1: _parts_q5_1,
    _E.Q8_0: _parts_q8_0,
    _E.Q4_K: _parts_q4_k,
    _E.Q5_K: _parts_q5_k,
    _E.Q6_K: _parts_q6_k,
}


# ----------------------------------------------------------------------------------------------
# Public entry points.


def _as_encoding(encoding: Any) -> QuantizationEncoding:
    if isinstance(encoding, QuantizationEncoding):
        return encoding
    if isinstance(encoding, str):
        try:
            return QuantizationEncoding(encoding.upper())
        except ValueError:
            pass
    else:
        try:
            import gguf

            if isinstance(encoding, gguf.GGMLQuantizationType):
                return QuantizationEncoding.from_gguf(encoding)
        except ImportError:  # pragma: no cover
            pass
    raise ValueError(
        f"unknown quantization encoding {encoding!r}; expected a QuantizationEncoding "
        f"({', '.join(e.value for e in QuantizationEncoding)})"
    )


def _check_packed(encoding: Any, packed: Any, what: str) -> tuple[QuantizationEncoding, int]:
    """Validate ``packed`` for ``encoding``; return the encoding and the number of blocks per row."""
    enc = _as_encoding(encoding)
    if enc not in _DEQUANTIZERS:
        raise ValueError(
            f"{what}: {enc} is not a GGUF block encoding; supported encodings: "
            f"{', '.join(e.value for e in _DEQUANTIZERS)}"
        )
    dtype = getattr(packed, "dtype", None)
    shape = getattr(packed, "shape", None)
    if dtype is None or shape is None:
        raise ValueError(f"{what}: expected a uint8 array, got {type(packed).__name__}")
    if np.dtype(dtype) != np.uint8:
        raise ValueError(
            f"{what}: {enc.value} data must have dtype uint8 (packed blocks), got {np.dtype(dtype)}"
        )
    if len(shape) != 2:
        raise ValueError(
            f"{what}: {enc.value} data must have rank 2 [rows, bytes_per_row], "
            f"got rank {len(shape)} with shape {tuple(shape)}"
        )
    row = shape[-1]
    bpe, bsize = enc.block_parameters
    if not isinstance(row, (int, np.integer)):
        raise ValueError(f"{what}: the row length (bytes per row) must be static, got {row}")
    if row % bsize != 0 or row == 0:
        raise ValueError(
            f"{what}: the row length of {enc.value} data must be a positive multiple of the "
            f"{enc.value} block size ({bsize} bytes for {bpe} elements), got {row} bytes per row"
        )
    return enc, int(row) // bsize


def dequantize(encoding: QuantizationEncoding, packed: jax.Array) -> jax.Array:
    """Dequantize GGUF blocks: uint8 ``[rows, bytes_per_row]`` -> float32 ``[rows, cols]``.

    ``cols = bytes_per_row // encoding.block_size * encoding.elements_per_block``. Each row must
    be a whole number of blocks (GGUF's layout, as ``gguf.GGUFReader`` returns the data of a
    quantized tensor). The result equals ``gguf.quants.dequantize(packed, encoding.to_gguf())``
    bit for bit (the numpy reference of llama.cpp's ``dequantize_row_*``).

    Pure ``jnp``: works under ``jax.jit``, ``vmap`` and ``eval_shape``; the number of rows may be
    symbolic, the row length must be static.
    """
    enc, _ = _check_packed(encoding, packed, "dequantize")
    return _dequantize_jit(enc, packed)


@partial(jax.jit, static_argnums=0)
def _dequantize_jit(enc: QuantizationEncoding, packed: jax.Array) -> jax.Array:
    # jitted so that an eager call compiles once per shape instead of dispatching op by op;
    # inside an outer jit it is inlined.
    rows, row_bytes = packed.shape
    bpe, bsize = enc.block_parameters
    nb = row_bytes // bsize
    blocks = packed.reshape(rows, nb, bsize)
    return _DEQUANTIZERS[enc](blocks).reshape(rows, nb * bpe)


# --- quantized matmul ---------------------------------------------------------------------------


def quantized_matmul(x: jax.Array, packed: jax.Array, encoding: QuantizationEncoding) -> jax.Array:
    """``x @ dequantize(encoding, packed).T`` in float32 (the kernel behind ``ops.qmatmul``).

    ``x`` is float32 ``[..., in_features]``; ``packed`` is uint8 ``[out_features, in_bytes]``
    (one GGUF row per output feature, as a Linear layer's weight is stored in GGUF). Returns
    float32 ``[..., out_features]``. The matmul runs at ``Precision.HIGHEST``, so accelerators do
    not drop to bfloat16/tf32 passes.

    How it runs on XLA:CPU (jax 0.10; numbers from ``benchmarks/dequantize.py`` on a shared
    2-core AVX-512 VM): when ``x`` has one row, XLA fuses the whole dequantizer into the
    matrix-vector product (one ``copy_dot_fusion`` loop reads the packed bytes and no float32
    weight is written). That loop is compute-bound, though: ~0.3 ns per weight element against
    ~0.05 for an int8 weight converted in the same loop, because the block headers make the
    element addresses non-affine (LLVM vectorises them with gathers). A SmolLM2-sized batch-1
    pass takes ~60-80 ms with Q4_1 bytes against ~18-28 ms with float32 weights. With more rows
    XLA writes the float32 weights once and calls its GEMM.

    Reformulations inside the jit were measured and none is faster, so none is used: scaling after
    a blocked einsum (``sum_b d_b * (x_b . q_b) + m_b * sum(x_b)``: XLA materialises batched
    dots), a contraction over the raw block bytes with a zero-padded ``x`` (the per-block scale
    then has a period of 20-34 bytes: gathers again), elementwise-multiply-and-reduce (slow
    reductions), and two-stage repacks (XLA fuses the repack back into the dot, or it costs more
    than it saves). What is fast is unpacking once at load time: see :func:`repack`.
    """
    enc, nb = _check_packed(encoding, packed, "quantized_matmul")
    bpe = enc.elements_per_block
    dtype = getattr(x, "dtype", None)
    shape = getattr(x, "shape", None)
    if dtype is None or shape is None:
        raise ValueError(f"quantized_matmul: x must be a float32 array, got {type(x).__name__}")
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"quantized_matmul: x must be float32, got {np.dtype(dtype)}")
    features = shape[-1] if len(shape) else None
    if not isinstance(features, (int, np.integer)) or features != nb * bpe:
        raise ValueError(
            f"quantized_matmul: x has {features} features (shape {tuple(shape)}) but the "
            f"{enc.value} weight has {nb * bpe} columns"
        )
    return _quantized_matmul_jit(enc, x, packed)


@partial(jax.jit, static_argnums=0)
def _quantized_matmul_jit(enc: QuantizationEncoding, x: jax.Array, packed: jax.Array) -> jax.Array:
    return matmul_transposed(x, _dequantize_jit(enc, packed))


def matmul_transposed(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w.T`` in float32 at ``Precision.HIGHEST``: ``x [..., in]``, ``w [out, in]`` -> ``[..., out]``.

    The one place the weight-side matmuls of the quantized paths are written. With a few rows in
    ``x`` (2 to :data:`SWAPPED_MAX_ROWS`: batched decode) it computes ``(w @ x.T).T``, the weight
    as the GEMM's left operand, and keeps XLA from folding the transposes back (an
    ``optimization_barrier`` on the ``[out, rows]`` product): XLA:CPU's GEMM (YNNPACK) re-lays a
    ``[out, in]`` right operand on every call, which at 16 rows costs more than the arithmetic,
    while it streams a left operand as it lies. A SmolLM2-sized MLP (30 layers, 4-bit weights)
    at 16 rows: 18-21 ms -> 13-15 ms; 1 row keeps the matrix-vector product XLA fuses with the
    dequantization, and from 32 rows up the two orders are even. Results are equal up to the
    order of the float32 sums.
    """
    rows = math.prod(x.shape[:-1])  # symbolic while a Graph is built with symbolic dimensions
    if w.ndim == 2 and isinstance(rows, (int, np.integer)) and 1 < rows <= SWAPPED_MAX_ROWS:
        flat = x.reshape(rows, x.shape[-1])
        y = lax.dot_general(w, flat, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST)
        return lax.optimization_barrier(y).T.reshape(*x.shape[:-1], w.shape[0])
    return jnp.matmul(x, w.T, precision=lax.Precision.HIGHEST)


#: the most rows of ``x`` for which :func:`matmul_transposed` puts the weight on the left
SWAPPED_MAX_ROWS = 16


# --- repacked weights -----------------------------------------------------------------------------


class RepackedWeight(NamedTuple):
    """A GGUF weight unpacked to one byte per element plus float32 scales (a JAX pytree).

    ``values`` is ``[rows, cols]`` uint8 or int8 (the quantized integers), ``scale`` and ``offset``
    are float32 ``[rows, cols // group]`` (``offset`` is None for the symmetric formats Q4_0,
    Q5_0, Q8_0 and Q6_K); the weight is ``scale * values + offset`` per group of ``group``
    consecutive elements of a row (32; 16 for Q6_K), bit for bit the result of :func:`dequantize`.
    """

    values: jax.Array
    scale: jax.Array
    offset: jax.Array | None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def group(self) -> int:
        return self.values.shape[-1] // self.scale.shape[-1]

    def dequantize(self) -> jax.Array:
        """The float32 weight ``[rows, cols]`` (equal to ``dequantize(encoding, packed)``)."""
        return _combine(self)


class NibbleWeight(NamedTuple):
    """A 4-bit GGUF weight (Q4_0, Q4_1, Q4_K) kept at 4 bits per value, laid out for SIMD (a pytree).

    ``values`` is uint8 ``[rows // 2, cols]``: byte ``(i, j)`` holds the value of row ``2i``,
    column ``j`` in its low nibble and that of row ``2i + 1`` in its high nibble. Unpacking is
    then one shift per row (0 or 4) and a mask, which XLA fuses into its matrix-vector product as
    it fuses an int8 convert (the file interleaves the nibbles of a row's 32-value blocks
    instead, which XLA vectorizes only with gathers; splitting a row's two halves across the
    nibbles makes XLA write the unpacked bytes first, about 1.5x slower). ``scale`` and ``offset`` are
    ``[rows, cols // 32]``: float16 for Q4_0 and Q4_1 (the file's own ``d`` and ``m``) and float32
    for Q4_K (``d * sc``, ``-dmin * m``). The weight is ``scale * values + offset`` per group of 32
    in float32, or ``scale * (values - 8)`` where ``offset`` is None (Q4_0), bit for bit the result
    of :func:`dequantize`. Bytes per weight: Q4_0 0.5625 and Q4_1 0.625, the file's own sizes;
    Q4_K 0.75 (the file's 0.5625 plus float32 scales).
    The idea is llama.cpp's CPU repacking of Q4_0 blocks at load time (``ggml-cpu/repack.cpp``).
    """

    values: jax.Array
    scale: jax.Array
    offset: jax.Array | None

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.values.shape[:-2], 2 * self.values.shape[-2], self.values.shape[-1])

    @property
    def group(self) -> int:
        return self.values.shape[-1] // self.scale.shape[-1]

    def dequantize(self) -> jax.Array:
        """The float32 weight ``[rows, cols]`` (equal to ``dequantize(encoding, packed)``)."""
        return _combine(self)


#: the in-memory forms of a quantized weight that ``repacked_matmul`` and the ops take
REPACKED_TYPES = (RepackedWeight, NibbleWeight)


def _combine(r: RepackedWeight | NibbleWeight) -> jax.Array:
    values = r.values
    if isinstance(r, NibbleWeight):
        shifts = jnp.array([0, 4], jnp.uint8)[:, None]  # low nibble: row 2i, high: row 2i + 1
        values = (values[..., :, None, :] >> shifts) & jnp.uint8(15)  # [.., rows // 2, 2, cols]
        values = values.reshape(*values.shape[:-3], -1, values.shape[-1])
        if r.offset is None:  # Q4_0: d * (q - 8), as its dequantizer computes it
            values = values.astype(jnp.int8) - jnp.int8(8)
    *lead, cols = values.shape
    groups = r.scale.shape[-1]
    q = values.reshape(*lead, groups, cols // groups).astype(jnp.float32)
    w = r.scale.astype(jnp.float32)[..., None] * q
    if r.offset is not None:
        w = w + r.offset.astype(jnp.float32)[..., None]
    return w.reshape(*lead, cols)


def repack(encoding: QuantizationEncoding, packed: jax.Array) -> RepackedWeight:
    """Unpack GGUF blocks ``[rows, bytes_per_row]`` into a :class:`RepackedWeight`, once, at load time.

    The decode-time alternative to keeping the bytes packed. On XLA:CPU the dequantizer fused
    into a matrix-vector product costs more than reading float32 weights from memory (see
    :func:`quantized_matmul`), while one byte per element with per-group scales fuses as cheaply
    as an int8 weight: for SmolLM2 Q4_1 at batch 1 it is about 3x faster than the packed form and
    2x faster than float32 weights, for 1.25 bytes per element (packed Q4_1: 0.625; float32: 4).
    :func:`repacked_matmul` is bit-identical in its weights to :func:`dequantize`. Jittable;
    ``jax.vmap`` it over stacked layers.
    """
    enc, nb = _check_packed(encoding, packed, "repack")
    return _repack_jit(enc, packed)


@partial(jax.jit, static_argnums=0)
def _repack_jit(enc: QuantizationEncoding, packed: jax.Array) -> RepackedWeight:
    rows, row_bytes = packed.shape
    bpe, bsize = enc.block_parameters
    nb = row_bytes // bsize
    q, scale, offset = _PARTS[enc](packed.reshape(rows, nb, bsize))
    groups = nb * scale.shape[-1]
    return RepackedWeight(
        q.reshape(rows, nb * bpe),
        scale.reshape(rows, groups),
        None if offset is None else offset.reshape(rows, groups),
    )


def repack_nibbles(encoding: QuantizationEncoding, packed: jax.Array) -> NibbleWeight:
    """Re-lay 4-bit GGUF blocks ``[rows, bytes_per_row]`` as a :class:`NibbleWeight`, at load time.

    For Q4_0, Q4_1 and Q4_K with an even number of rows. Jittable.

    Raises:
        ValueError: another encoding, or an odd number of rows.
    """
    enc, _ = _check_packed(encoding, packed, "repack_nibbles")
    if enc not in _NIBBLE_SCALE_DTYPE:
        raise ValueError(
            f"repack_nibbles: {enc.value} does not have 4-bit values (supported: "
            f"{', '.join(e.value for e in _NIBBLE_SCALE_DTYPE)})"
        )
    if packed.shape[0] % 2:
        raise ValueError(f"repack_nibbles: {packed.shape[0]} rows; rows are packed in pairs, so an even number is needed")
    return _repack_nibbles_jit(enc, packed)


@partial(jax.jit, static_argnums=0)
def _repack_nibbles_jit(enc: QuantizationEncoding, packed: jax.Array) -> NibbleWeight:
    r = _repack_jit(enc, packed)
    values = r.values
    if enc == _E.Q4_0:  # unpacked as q - 8: store q (0..15); NibbleWeight subtracts the 8 again
        values = (values + jnp.int8(8)).astype(jnp.uint8)
    nibbles = values[0::2] | (values[1::2] << jnp.uint8(4))
    dtype = _NIBBLE_SCALE_DTYPE[enc]
    return NibbleWeight(nibbles, r.scale.astype(dtype), None if r.offset is None else r.offset.astype(dtype))


#: the 4-bit encodings ``repack_nibbles`` takes, with the dtype that holds their scales exactly
_NIBBLE_SCALE_DTYPE = {_E.Q4_0: jnp.float16, _E.Q4_1: jnp.float16, _E.Q4_K: jnp.float32}
#: the encodings :func:`repack_nibbles` takes (it also needs an even number of rows)
NIBBLE_ENCODINGS = frozenset(_NIBBLE_SCALE_DTYPE)


def repacked_matmul(x: jax.Array, weight: RepackedWeight | NibbleWeight) -> jax.Array:
    """``x @ weight.dequantize().T`` in float32 for a :class:`RepackedWeight` or
    :class:`NibbleWeight` ``[out, in]``."""
    if not isinstance(weight, REPACKED_TYPES):
        raise ValueError(f"repacked_matmul: expected a RepackedWeight or NibbleWeight, got {type(weight).__name__}")
    dtype = getattr(x, "dtype", None)
    if dtype is None or np.dtype(dtype) != np.float32:
        raise ValueError(f"repacked_matmul: x must be float32, got {dtype}")
    cols = weight.shape[-1]
    if x.ndim < 1 or x.shape[-1] != cols:
        raise ValueError(
            f"repacked_matmul: x has {x.shape[-1] if x.ndim else None} features (shape "
            f"{tuple(x.shape)}) but the weight has {cols} columns"
        )
    rows = weight.shape[0]
    lead = math.prod(x.shape[:-1])
    if weight.values.ndim == 2 and lead > 1 and rows >= 2 * _ROW_CHUNK and rows % _ROW_CHUNK == 0:
        # Several input rows: XLA dequantizes the whole weight into a float32 temporary before its
        # GEMM. For a large weight (an LM head: 49152 x 576) that temporary costs more than the
        # matmul (fresh pages); dequantize and multiply one block of rows at a time instead.
        n = rows // _ROW_CHUNK
        chunks = jax.tree.map(lambda a: a.reshape(n, a.shape[0] // n, *a.shape[1:]), weight)
        flat = x.reshape(lead, cols)
        out = lax.map(lambda w: matmul_transposed(flat, _combine(w)), chunks)
        return jnp.moveaxis(out, 0, 1).reshape(*x.shape[:-1], rows)
    return matmul_transposed(x, _combine(weight))


#: rows of a large repacked weight dequantized at a time by :func:`repacked_matmul` (batch > 1)
_ROW_CHUNK = 4096
