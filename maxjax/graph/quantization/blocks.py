"""The bit layouts of the GGUF block formats, one definition per encoding, as pure ``jnp``.

Each format is written once, as an unpacker from uint8 blocks ``[..., block_size]`` to
``(values, scale, offset)`` with one scale (and offset) per group of 32 values (16 for Q6_K):

- ``values``: the quantized integers ``[..., groups_per_block, group]`` (uint8, or int8 already
  centred for the symmetric formats),
- ``scale``, ``offset``: float32 ``[..., groups_per_block]`` (``offset`` None for Q4_0, Q5_0,
  Q8_0, Q6_K),

and the weight is ``scale * values + offset`` (:func:`combine`). Every layout of
:mod:`maxjax.graph.quantization.arrays` and :func:`dequantize` are built from these, so a format's
bits are read in one place. The layouts are those of llama.cpp (``ggml/src/ggml-quants.c``,
``dequantize_row_*``) as re-implemented in numpy by the ``gguf`` Python package
(``gguf/quants.py``, ``<Type>.dequantize_blocks``); the results are bit-identical to
``gguf.quants.dequantize``: the float operations are the same ones, in the same order, in float32
(``a - b`` is computed as ``a + (-b)``, which IEEE arithmetic rounds identically).

Only elementwise ops, static slices and reshapes are used, so that XLA fuses an unpacker into its
consumer. XLA:CPU vectorises some spellings of the same values much better than others (the
``_stacked`` helpers against the broadcast-shift ones, up to 15x apart on the k-quants with
AVX-512): each format uses the fastest combination found (``benchmarks/dequantize.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from maxjax.graph.quantization.encoding import GGUF_ENCODINGS, QuantizationEncoding, as_encoding

__all__ = ["Q4_BLOCK_ENCODINGS", "UNPACKERS", "check_packed", "combine", "dequantize", "q4_blocks", "q8_0_round", "unpack"]

_E = QuantizationEncoding

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


#: where a block of the 32-value 4-bit formats keeps its 16 bytes of values (byte ``j``: value
#: ``j`` in its low nibble, value ``j + 16`` in its high nibble): llama.cpp's ``block_q4_0`` (``d``,
#: ``qs``) and ``block_q4_1`` (``d``, ``m``, ``qs``)
_Q4_QS = {_E.Q4_0: slice(2, 18), _E.Q4_1: slice(4, 20)}


def _q4_fields(enc: QuantizationEncoding, b: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """A Q4_0/Q4_1 block ``[..., bytes]`` as its value bytes ``qs [..., 16]`` (still packed) and
    its scale ``d`` and offset ``m`` (float32 ``[...]``; ``m`` None for Q4_0)."""
    return b[..., _Q4_QS[enc]], _f16(b[..., 0:2]), _f16(b[..., 2:4]) if enc == _E.Q4_1 else None


def _unpack_q4_0(b: jax.Array):
    qs, d, _ = _q4_fields(_E.Q4_0, b)
    q = _nibbles(qs).reshape(*b.shape[:-1], 1, 32)
    return q.astype(jnp.int8) - jnp.int8(8), d[..., None], None


def _unpack_q4_1(b: jax.Array):
    qs, d, m = _q4_fields(_E.Q4_1, b)
    q = _nibbles(qs).reshape(*b.shape[:-1], 1, 32)
    return q, d[..., None], m[..., None]


#: the encodings :func:`q4_blocks` reads
Q4_BLOCK_ENCODINGS = frozenset(_Q4_QS)


def q4_blocks(encoding: QuantizationEncoding, packed: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """Rows of Q4_0 or Q4_1 blocks ``[..., bytes_per_row]`` with their 4-bit values left packed:
    ``qs`` uint8 ``[..., blocks, 16]`` (byte ``j`` of a block holds its value ``j`` in the low
    nibble and value ``j + 16`` in the high nibble, the file's order; Q4_0's values are ``q``,
    0..15, before its ``- 8``), and ``scale``, ``offset`` float32 ``[..., blocks]`` (``offset``
    None for Q4_0), as the unpackers read them. For layouts that move nibbles without widening
    them to a byte each."""
    *lead, row_bytes = packed.shape
    bsize = encoding.block_parameters[1]
    return _q4_fields(encoding, packed.reshape(*lead, row_bytes // bsize, bsize))


def _unpack_q5_0(b: jax.Array):
    ql = _nibbles(b[..., 6:22]).reshape(*b.shape[:-1], 32)
    q = (ql | (_qh32(b[..., 2:6]) << _u8(4))).astype(jnp.int8) - jnp.int8(16)
    return q[..., None, :], _f16(b[..., 0:2])[..., None], None


def _unpack_q5_1(b: jax.Array):
    ql = _nibbles(b[..., 8:24]).reshape(*b.shape[:-1], 32)
    q = ql | (_qh32(b[..., 4:8]) << _u8(4))
    return q[..., None, :], _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]


def _unpack_q8_0(b: jax.Array):
    q = lax.bitcast_convert_type(b[..., 2:34], jnp.int8)
    return q[..., None, :], _f16(b[..., 0:2])[..., None], None


def _k_scales(b: jax.Array) -> tuple[jax.Array, jax.Array]:
    sc, mn = _k_scale_min(b[..., 4:16])
    # offset = -(dmin * m): adding it is bit-identical to subtracting dmin * m
    return _f16(b[..., 0:2])[..., None] * _f32(sc), -(_f16(b[..., 2:4])[..., None] * _f32(mn))


def _unpack_q4_k(b: jax.Array):
    lead = b.shape[:-1]
    q = _nibbles_stacked(b[..., 16:144].reshape(*lead, 4, 32)).reshape(*lead, 8, 32)
    return (q, *_k_scales(b))


def _unpack_q5_k(b: jax.Array):
    lead = b.shape[:-1]
    ql = _nibbles_stacked(b[..., 48:176].reshape(*lead, 4, 32)).reshape(*lead, 8, 32)
    q = ql | (_bits(b[..., 16:48], list(range(8)), 0x01) << _u8(4))
    return (q, *_k_scales(b))


def _unpack_q6_k(b: jax.Array):
    lead = b.shape[:-1]
    ql = _nibbles(b[..., 0:128].reshape(*lead, 2, 64)).reshape(*lead, 8, 32)
    qh = _bits_stacked(b[..., 128:192].reshape(*lead, 2, 32), [0, 2, 4, 6], 0x03).reshape(*lead, 8, 32)
    q = ((ql | (qh << _u8(4))).astype(jnp.int8) - jnp.int8(32)).reshape(*lead, 16, 16)
    scale = _f16(b[..., 208:210])[..., None] * _f32(lax.bitcast_convert_type(b[..., 192:208], jnp.int8))
    return q, scale, None


UNPACKERS: dict[QuantizationEncoding, Callable[[jax.Array], tuple[Any, Any, Any]]] = {
    _E.Q4_0: _unpack_q4_0,
    _E.Q4_1: _unpack_q4_1,
    _E.Q5_0: _unpack_q5_0,
    _E.Q5_1: _unpack_q5_1,
    _E.Q8_0: _unpack_q8_0,
    _E.Q4_K: _unpack_q4_k,
    _E.Q5_K: _unpack_q5_k,
    _E.Q6_K: _unpack_q6_k,
}


def check_packed(encoding: Any, packed: Any, what: str) -> tuple[QuantizationEncoding, int]:
    """Validate ``packed`` for ``encoding``; return the encoding and the number of blocks per row."""
    enc = as_encoding(encoding)
    if enc not in UNPACKERS:
        raise ValueError(
            f"{what}: {enc} is not a GGUF block encoding; supported encodings: "
            f"{', '.join(e.value for e in GGUF_ENCODINGS)}"
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


def combine(values: jax.Array, scale: jax.Array, offset: jax.Array | None) -> jax.Array:
    """``scale * values + offset`` in float32, per group: ``values [..., groups, group]``, ``scale``
    and ``offset`` ``[..., groups]`` (``offset`` None: no offset). Returns ``[..., groups, group]``."""
    w = scale.astype(jnp.float32)[..., None] * values.astype(jnp.float32)
    if offset is not None:
        w = w + offset.astype(jnp.float32)[..., None]
    return w


def unpack(encoding: QuantizationEncoding, packed: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """Rows of GGUF blocks ``[..., bytes_per_row]`` as ``(values [..., cols], scale [..., groups],
    offset [..., groups] | None)``: one byte per value and float32 scales (see the module docstring)."""
    *lead, row_bytes = packed.shape
    bpe, bsize = encoding.block_parameters
    nb = row_bytes // bsize
    q, scale, offset = UNPACKERS[encoding](packed.reshape(*lead, nb, bsize))
    groups = nb * scale.shape[-1]
    return (
        q.reshape(*lead, nb * bpe),
        scale.reshape(*lead, groups),
        None if offset is None else offset.reshape(*lead, groups),
    )


def dequantize(encoding: QuantizationEncoding, packed: jax.Array) -> jax.Array:
    """Dequantize GGUF blocks: uint8 ``[..., rows, bytes_per_row]`` -> float32 ``[..., rows, cols]``.

    ``cols = bytes_per_row // encoding.block_size * encoding.elements_per_block``. Each row must
    be a whole number of blocks (GGUF's layout, as ``gguf.GGUFReader`` returns the data of a
    quantized tensor). The result equals ``gguf.quants.dequantize(packed, encoding.to_gguf())``
    bit for bit (the numpy reference of llama.cpp's ``dequantize_row_*``).

    Pure ``jnp``: works under ``jax.jit``, ``vmap`` and ``eval_shape``; the number of rows may be
    symbolic, the row length must be static.

    Raises:
        ValueError: not a GGUF block encoding, not uint8, rank below 2, or rows that are not a
            whole number of blocks (the message names the sizes).
    """
    enc, _ = check_packed(encoding, packed, "dequantize")
    return _dequantize_jit(enc, packed)


@partial(jax.jit, static_argnums=0)
def _dequantize_jit(enc: QuantizationEncoding, packed: jax.Array) -> jax.Array:
    # jitted so that an eager call compiles once per shape instead of dispatching op by op;
    # inside an outer jit it is inlined.
    *lead, row_bytes = packed.shape
    bpe, bsize = enc.block_parameters
    nb = row_bytes // bsize
    q, scale, offset = UNPACKERS[enc](packed.reshape(*lead, nb, bsize))
    return combine(q, scale, offset).reshape(*lead, nb * bpe)


@jax.custom_vjp
def q8_0_round(x: jax.Array) -> jax.Array:
    """``x`` float32 ``[..., cols]`` (``cols`` a multiple of 32) as Q8_0 blocks hold it: per 32
    values, ``d = max |x| / 127`` and ``q = round-half-even(x * (1 / d))``, returned as ``q * d``
    (llama.cpp's ``quantize_row_q8_0`` with a float32 ``d``; the activations of the products that
    maxjax's CPU kernel runs as integer dots, ``maxjax.backend.kernels.quantized_matmul(...,
    activations="Q8_0")``, so that a product in XLA multiplies the same values). Its gradient is
    the identity (a straight-through estimator, as the kernel's cotangent is the float32 one)."""
    xb = x.reshape(*x.shape[:-1], -1, 32)
    d = jnp.max(jnp.abs(xb), axis=-1, keepdims=True) / jnp.float32(127)
    inv = jnp.where(d != 0, jnp.float32(1) / jnp.where(d != 0, d, 1), 0)
    return (jnp.round(xb * inv) * d).reshape(x.shape)


q8_0_round.defvjp(lambda x: (q8_0_round(x), None), lambda _, g: (g,))

