"""Quantized weights as typed JAX arrays: :class:`QuantizedArray` and one class per memory layout.

A quantized weight is a registered pytree with its *logical* shape and dtype (the float matrix it
stands for: ``shape`` ``[..., rows, cols]``, ``dtype`` float32), its :class:`QuantizationEncoding`
and its layout, and the methods ops need of it:

- :meth:`~QuantizedArray.dequantize`: the float matrix;
- :meth:`~QuantizedArray.matmul`: ``x @ W.T`` against activations (the backend policy decides how
  the product is formed, see :mod:`maxjax.backend.policy`);
- :meth:`~QuantizedArray.take`: rows by index (an embedding lookup), still quantized.

The same weight can sit in memory in several layouts, all bit-identical in their values:

=================  =====================================================================  =================
layout             leaves                                                                 bytes per value
=================  =====================================================================  =================
``packed``         the file's GGUF blocks, uint8 ``[..., rows, bytes_per_row]``           the file's (Q4_1: 0.625)
``unpacked``       one byte per value ``[..., rows, cols]`` + float32 scales/offsets      ~1.25 (Q4_1)
``nibbles``        4-bit values, rows paired in a byte ``[..., rows/2, cols]`` + scales   0.5625-0.75
``dequantized``    the float matrix ``[..., rows, cols]``                                 4 (float32)
``int8``           int8 per output channel ``[..., rows, cols]`` + float32 ``[..., rows]``  ~1 (requantized)
``mapped``         the file's GGUF blocks where they lie in the mapped file (no copy)     the file's
=================  =====================================================================  =================

``int8`` alone is not bit-identical: it requantizes the weight per output channel (see
:class:`Int8Array`), so that its products can also run as int8 x int8 -> int32 dots.

Leaves may carry leading axes (a stack of layers for ``lax.scan``, whose slices are again
quantized arrays), and may be ``jax.ShapeDtypeStruct``s: a QuantizedArray of abstract leaves is
the abstract value a graph records for a quantized weight. Every layout is built from the one
definition of each GGUF bit layout in :mod:`maxjax.graph.quantization.blocks`.

A new encoding (GPTQ, AWQ, FP8, int8 per channel) is one more subclass that implements
``_leaves``/``_from_leaves``, ``shape``, ``dequantize`` and ``take`` (``matmul`` then comes from
the base class), registered with :func:`jax.tree_util.register_pytree_node_class`.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from maxjax.backend import BackendPolicy, kernels, policy_for
from maxjax.graph.quantization.blocks import Q4_BLOCK_ENCODINGS, _dequantize_jit, check_packed, combine, q4_blocks, q8_0_round, unpack
from maxjax.graph.quantization.encoding import QuantizationEncoding, as_encoding

__all__ = [
    "QuantizedArray",
    "PackedArray",
    "UnpackedArray",
    "NibbleArray",
    "DequantizedArray",
    "Int8Array",
    "LAYOUTS",
    "NIBBLE_ENCODINGS",
    "as_quantized",
    "layout_for",
    "register_encoding",
    "stored_class",
    "to_layout",
]

_E = QuantizationEncoding


class QuantizedArray:
    """A quantized weight (see the module docstring). Subclasses are the memory layouts.

    Attributes:
        encoding: the :class:`QuantizationEncoding` of the values.
        layout: the layout's name (``"packed"``, ``"unpacked"``, ``"nibbles"``, ``"dequantized"``).
    """

    layout: ClassVar[str] = ""
    __slots__ = ("encoding",)

    # -- pytree ----------------------------------------------------------------------------------
    def _leaves(self) -> tuple[Any, ...]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _from_leaves(self, leaves: Sequence[Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def tree_flatten(self) -> tuple[tuple[Any, ...], QuantizationEncoding]:
        return self._leaves(), self.encoding

    @classmethod
    def tree_unflatten(cls, encoding: QuantizationEncoding, leaves: Sequence[Any]) -> "QuantizedArray":
        obj = object.__new__(cls)
        obj.encoding = encoding
        obj._from_leaves(leaves)  # no checks: JAX rebuilds pytrees with placeholder leaves
        return obj

    # -- the logical array -----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[Any, ...]:  # pragma: no cover - abstract
        """The logical (float) shape ``[..., rows, cols]``."""
        raise NotImplementedError

    @property
    def dtype(self) -> np.dtype:
        """The logical dtype: float32, what :meth:`dequantize` gives."""
        return np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes held in memory by the leaves (what the layout costs)."""
        return sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(self))

    @property
    def bytes_per_value(self) -> float:
        n = math.prod(self.shape)
        return self.nbytes / n if n else 0.0

    def abstract(self) -> "QuantizedArray":
        """The same structure with ``jax.ShapeDtypeStruct`` leaves (keeping their shardings)."""
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, "sharding", None)), self)

    # -- what ops need -----------------------------------------------------------------------------
    def dequantize(self) -> jax.Array:  # pragma: no cover - abstract
        """The float32 matrix ``[..., rows, cols]``, bit-identical to ``gguf``'s dequantizer."""
        raise NotImplementedError

    def take(self, indices: Any) -> "QuantizedArray":  # pragma: no cover - abstract
        """Rows ``indices`` (int, any shape; clamped to the valid range) of a 2-D weight: a
        QuantizedArray of logical shape ``[*indices.shape, cols]``."""
        raise NotImplementedError

    def matmul(self, x: Any, policy: BackendPolicy | None = None) -> jax.Array:
        """``x @ self.dequantize().T`` in float32: ``x [..., cols]`` -> ``[..., rows]``.

        The product is formed by ``policy`` (default: JAX's default backend's): its GEMM operand
        order, precision, whether a large weight is dequantized one block of rows at a time,
        whether a long row is dequantized and multiplied one block of columns at a time, and
        whether the activations are rounded to Q8_0 blocks first (``q8_activations``, for GGUF
        encodings; integer dots where maxjax's kernel runs the product).

        Raises:
            ValueError: this is not a 2-D weight, ``x`` is not float32, or its last axis is not
                ``cols`` (naming both shapes).
        """
        policy = policy_for(policy)
        if self.ndim != 2:
            raise ValueError(f"matmul: {self!r} is not a 2-D weight")
        lead = self._rows_of(x)
        rows, cols = self.shape
        if policy.native_matmul(self, lead):  # a few rows: maxjax's CPU kernel
            return self._kernel_product(x, None, policy)
        x = self._activations(x, policy)
        n = policy.row_chunks(rows, lead)
        if n > 1:  # dequantize and multiply one block of rows at a time
            return self._in_row_blocks(x, n, policy, lambda a, i, r: lax.dynamic_slice_in_dim(a, i * r, r))
        k = policy.col_chunks(cols, lead)
        if k > 1:  # a sum of products over column blocks, each its own fusion
            c, out = cols // k, None
            for j in range(k):
                part = lax.optimization_barrier(self._column_block(j, k))
                y = lax.optimization_barrier(policy.matmul_t(x[..., j * c : (j + 1) * c], part.dequantize()))
                out = y if out is None else out + y
            return out
        return policy.matmul_t(x, self.dequantize())

    def _rows_of(self, x: Any) -> Any:
        """The rows of ``x`` (the product of its leading axes) for a product with this weight.

        Raises:
            ValueError: ``x`` is not a float32 array, or its last axis is not ``cols`` (naming
                both shapes).
        """
        dtype = getattr(x, "dtype", None)
        shape = getattr(x, "shape", None)
        if dtype is None or shape is None:
            raise ValueError(f"matmul with {self!r}: x must be a float32 array, got {type(x).__name__}")
        if np.dtype(dtype) != np.float32:
            raise ValueError(f"matmul with {self!r}: x must be float32, got {np.dtype(dtype)}")
        cols = self.shape[-1]
        if not shape or not isinstance(shape[-1], (int, np.integer)) or shape[-1] != cols:
            raise ValueError(f"matmul: x has {shape[-1] if shape else None} features (shape {tuple(shape)}) but {self!r} has {cols} columns")
        return math.prod(shape[:-1])

    def layer_matmul(self, x: Any, layer: Any, policy: BackendPolicy | None = None) -> jax.Array:
        """:meth:`matmul` with layer ``layer`` (an int32 scalar, clamped into range) of a stack of
        weights (leaves ``[layers, ...]``, logical shape ``[layers, rows, cols]``): what a scan
        step computes. Where the policy runs the product in maxjax's CPU kernel, the kernel reads
        the layer in place; where it dequantizes the layer in blocks of rows (a prompt's product,
        see ``BackendPolicy.dequant_row_chunk``), each block is sliced out of the stack as it is
        dequantized (128-token prefill temporaries: Llama-3.1-8B-shaped Q4_0 180 -> 71 MB,
        against slicing the layer whole first); otherwise the layer is sliced (a copy) and
        multiplied by :meth:`matmul`.

        Raises:
            ValueError: as :meth:`matmul`, or this is not a stack of 2-D weights.
        """
        policy = policy_for(policy)
        if self.ndim != 3:
            raise ValueError(f"layer_matmul: {self!r} is not a stack of 2-D weights")
        shape = getattr(x, "shape", (0,))
        lead = math.prod(shape[:-1])
        float32 = getattr(x, "dtype", None) is not None and np.dtype(x.dtype) == np.float32
        if float32 and policy.native_matmul(self, lead):
            return self._kernel_product(x, layer, policy)
        rows, cols = self.shape[-2:]
        n = policy.row_chunks(rows, lead)
        if float32 and n > 1 and shape[-1] == cols:
            x = self._activations(x, policy)
            # each block of rows is sliced out of the stack as it is dequantized, never the whole
            # layer first (an 8B-shaped down_proj layer is 33 MB of Q4_0)
            def leaf(a: Any, i: Any, r: int) -> Any:
                return lax.dynamic_slice(a, (layer, i * r) + (0,) * (a.ndim - 2), (1, r, *a.shape[2:]))[0]

            return self._in_row_blocks(x, n, policy, leaf)
        return self.layer(layer).matmul(x, policy)

    def _rounds_activations(self, policy: BackendPolicy) -> bool:
        """Whether ``policy`` multiplies this weight by Q8_0-rounded activations (its
        ``q8_activations``: GGUF block encodings in any layout but ``int8``, which has its own)."""
        return policy.q8_activations and getattr(self.encoding, "is_gguf", False) and self.layout != "int8"

    def _activations(self, x: Any, policy: BackendPolicy) -> Any:
        """``x`` as a product of this weight outside maxjax's kernel takes it: rounded to Q8_0
        blocks where :meth:`_rounds_activations` (:func:`~maxjax.graph.quantization.blocks.q8_0_round`)."""
        return q8_0_round(x) if self._rounds_activations(policy) else x

    def _kernel_product(self, x: Any, layer: Any, policy: BackendPolicy) -> jax.Array:
        """``x @ W.T`` in maxjax's kernel (``policy.native_matmul`` said so): with Q8_0
        activations as integer dots where the policy rounds them and the kernel takes them so,
        else on the rounded (or given) float32 activations: the same values either way."""
        if self._rounds_activations(policy) and kernels.takes_q8_0_activations(self):
            return kernels.quantized_matmul(x, self, layer, activations="Q8_0")
        return kernels.quantized_matmul(self._activations(x, policy), self, layer)

    def _in_row_blocks(self, x: Any, n: int, policy: BackendPolicy, leaf: Any) -> jax.Array:
        """``x [..., cols]`` times the weight's ``n`` blocks of rows, one block dequantized at a
        time (``lax.map``): ``leaf(a, i, r)`` is block ``i`` of leaf ``a``, ``r`` of its rows."""
        rows, cols = self.shape[-2:]
        flat = x.reshape(-1, cols)

        def block(i: Any) -> jax.Array:
            w = jax.tree.map(lambda a: leaf(a, i, a.shape[self.ndim - 2] // n), self)  # rows: axis 0, or 1 in a stack
            return policy.matmul_t(flat, w.dequantize())

        out = lax.map(block, jnp.arange(n))
        return jnp.moveaxis(out, 0, 1).reshape(*x.shape[:-1], rows)

    def layer(self, layer: Any) -> "QuantizedArray":
        """Layer ``layer`` (an int, or a traced int32 scalar clamped into range) of a stack."""
        return jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, layer, keepdims=False), self)

    def _column_block(self, j: int, k: int) -> "QuantizedArray":
        """Block ``j`` of ``k`` equal blocks of columns (every leaf's last axis runs along the
        columns, in whole GGUF blocks)."""
        return jax.tree.map(lambda a: a[..., j * a.shape[-1] // k : (j + 1) * a.shape[-1] // k], self)

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def from_stored(cls, encoding: Any, stored: Any) -> "QuantizedArray":
        """The array of a weight's stored value (what a checkpoint and a weights registry hold for
        it: for GGUF encodings, uint8 blocks ``[..., rows, bytes_per_row]``); ``stored`` may be a
        ``jax.ShapeDtypeStruct`` (the abstract value a graph records)."""
        return cls.from_packed(encoding, stored)

    @classmethod
    def supports(cls, encoding: QuantizationEncoding, shape: Sequence[int]) -> bool:
        """Whether a weight of ``encoding`` and logical ``shape`` can take this layout."""
        return encoding.is_gguf

    @classmethod
    def from_packed(cls, encoding: Any, packed: Any) -> "QuantizedArray":  # pragma: no cover - abstract
        """This layout of GGUF blocks ``[..., rows, bytes_per_row]`` (leading axes kept)."""
        raise NotImplementedError

    def packed_bytes(self) -> Any:
        """The file's GGUF bytes ``[..., rows, bytes_per_row]``: what a MAX program sees as the
        weight's value. Only the ``packed`` layout has them.

        Raises:
            ValueError: another layout (the weight was re-laid for speed; ops that read raw bytes
                need ``quantized_layout="packed"``).
        """
        raise ValueError(
            f"{self!r} holds no GGUF bytes: an op that reads a quantized weight's raw bytes needs the weight in "
            "quantized_layout='packed'"
        )

    def __repr__(self) -> str:
        shape = ", ".join(str(d) for d in self.shape)
        return f"{type(self).__name__}({self.encoding.value}, [{shape}])"


def _check_rows(what: str, encoding: Any, packed: Any) -> QuantizationEncoding:
    if getattr(packed, "ndim", len(getattr(packed, "shape", ()))) < 2:
        raise ValueError(f"{what}: packed data must have rank >= 2 [..., rows, bytes_per_row], got shape {tuple(packed.shape)}")
    flat_shape = (math.prod(packed.shape[:-1]), packed.shape[-1])
    enc, _ = check_packed(encoding, jax.ShapeDtypeStruct(flat_shape, packed.dtype), what)
    return enc


@jax.tree_util.register_pytree_node_class
class PackedArray(QuantizedArray):
    """The file's GGUF blocks as they are: ``data`` uint8 ``[..., rows, bytes_per_row]``.

    The smallest layout (the file's size). XLA fuses the dequantizer into a matrix-vector product,
    but the block headers make the element addresses irregular, so on CPU it is slower than the
    other layouts.
    """

    layout: ClassVar[str] = "packed"
    __slots__ = ("data",)

    def __init__(self, encoding: Any, data: Any):
        self.encoding = _check_rows("PackedArray", encoding, data)
        self.data = data

    def _leaves(self) -> tuple[Any, ...]:
        return (self.data,)

    def _from_leaves(self, leaves: Sequence[Any]) -> None:
        (self.data,) = leaves

    @property
    def shape(self) -> tuple[Any, ...]:
        return self.encoding.logical_shape(self.data.shape)

    def dequantize(self) -> jax.Array:
        return _dequantize_jit(self.encoding, self.data)

    def take(self, indices: Any) -> "PackedArray":
        return PackedArray(self.encoding, jnp.take(self.data, indices, axis=0, mode="clip"))

    @classmethod
    def from_packed(cls, encoding: Any, packed: Any) -> "PackedArray":
        return cls(encoding, packed)

    @classmethod
    def from_stored(cls, encoding: Any, stored: Any) -> "PackedArray":
        return cls(encoding, stored)

    def packed_bytes(self) -> Any:
        return self.data


class _GroupScaled(QuantizedArray):
    """Quantized values with one scale (and offset) per group of a row: the leaves ``values``,
    ``scale`` and ``offset`` (None for the symmetric formats)."""

    __slots__ = ("values", "scale", "offset")

    def __init__(self, encoding: Any, values: Any, scale: Any, offset: Any = None):
        self.encoding = as_encoding(encoding)
        self.values, self.scale, self.offset = values, scale, offset

    def _leaves(self) -> tuple[Any, ...]:
        return (self.values, self.scale, self.offset)

    def _from_leaves(self, leaves: Sequence[Any]) -> None:
        self.values, self.scale, self.offset = leaves


@jax.tree_util.register_pytree_node_class
class UnpackedArray(_GroupScaled):
    """One byte per quantized value plus float32 scales: ``values [..., rows, cols]`` (uint8, or
    int8 for the symmetric formats), ``scale`` and ``offset`` ``[..., rows, cols // group]``
    (``offset`` None for Q4_0, Q5_0, Q8_0, Q6_K); the weight is ``scale * values + offset`` per
    group of ``group`` consecutive values of a row (32; 16 for Q6_K).

    XLA fuses its dequantization into a matrix-vector product as cheaply as an int8 convert, on
    any CPU: SmolLM2's Q4_1 weights at 1.25 bytes per value (2x the file).
    """

    layout: ClassVar[str] = "unpacked"
    __slots__ = ()

    @property
    def shape(self) -> tuple[Any, ...]:
        return tuple(self.values.shape)

    @property
    def group(self) -> int:
        return self.values.shape[-1] // self.scale.shape[-1]

    def dequantize(self) -> jax.Array:
        *lead, cols = self.values.shape
        groups = self.scale.shape[-1]
        q = self.values.reshape(*lead, groups, cols // groups)
        return combine(q, self.scale, self.offset).reshape(*lead, cols)

    def take(self, indices: Any) -> "UnpackedArray":
        return jax.tree.map(lambda a: jnp.take(a, indices, axis=0, mode="clip"), self)

    @classmethod
    def from_packed(cls, encoding: Any, packed: Any) -> "UnpackedArray":
        enc = _check_rows("UnpackedArray.from_packed", encoding, packed)
        return _unpacked_jit(enc, packed)


@partial(jax.jit, static_argnums=0)
def _unpacked_jit(enc: QuantizationEncoding, packed: jax.Array) -> UnpackedArray:
    return UnpackedArray(enc, *unpack(enc, packed))


#: the dtype that holds a 4-bit encoding's per-group scales exactly in the nibbles layout
_NIBBLE_SCALE_DTYPE = {_E.Q4_0: jnp.float16, _E.Q4_1: jnp.float16, _E.Q4_K: jnp.float32}
#: the encodings the nibbles layout takes (with an even number of rows)
NIBBLE_ENCODINGS = frozenset(_NIBBLE_SCALE_DTYPE)


@jax.tree_util.register_pytree_node_class
class NibbleArray(_GroupScaled):
    """A 4-bit weight (Q4_0, Q4_1, Q4_K) kept at 4 bits per value, laid out for SIMD.

    ``values`` is uint8 ``[..., rows // 2, cols]``: byte ``(i, j)`` holds the value of row ``2i``,
    column ``j`` in its low nibble and that of row ``2i + 1`` in its high nibble. Unpacking is
    then one shift per row (0 or 4) and a mask, which XLA fuses into its matrix-vector product as
    it fuses an int8 convert (the file interleaves the nibbles of a row's 32-value blocks
    instead, which XLA vectorizes only with gathers; splitting a row's two halves across the
    nibbles makes XLA write the unpacked bytes first). ``scale`` and ``offset`` are
    ``[..., rows, cols // 32]``: float16 for Q4_0 and Q4_1 (the file's own ``d`` and ``m``) and
    float32 for Q4_K (``d * sc``, ``-dmin * m``). The weight is ``scale * values + offset`` per
    group of 32 in float32, or ``scale * (values - 8)`` where ``offset`` is None (Q4_0). Bytes
    per value: Q4_0 0.5625 and Q4_1 0.625 (the file's own sizes); Q4_K 0.75.

    The idea is llama.cpp's CPU repacking of Q4_0 blocks at load time (``ggml-cpu/repack.cpp``).
    Taking rows gives an :class:`UnpackedArray` (a row's values no longer pair with another's).
    """

    layout: ClassVar[str] = "nibbles"
    __slots__ = ()

    @property
    def shape(self) -> tuple[Any, ...]:
        v = self.values.shape
        return (*v[:-2], 2 * v[-2], v[-1])

    def _unpaired(self) -> jax.Array:
        """The 4-bit values one per byte ``[..., rows, cols]`` (int8 ``q - 8`` for Q4_0)."""
        shifts = jnp.array([0, 4], jnp.uint8)[:, None]  # low nibble: row 2i, high: row 2i + 1
        v = (self.values[..., :, None, :] >> shifts) & jnp.uint8(15)  # [..., rows // 2, 2, cols]
        v = v.reshape(*v.shape[:-3], -1, v.shape[-1])
        if self.offset is None:  # Q4_0: d * (q - 8), as its unpacker computes it
            v = v.astype(jnp.int8) - jnp.int8(8)
        return v

    def dequantize(self) -> jax.Array:
        return UnpackedArray(self.encoding, self._unpaired(), self.scale, self.offset).dequantize()

    def take(self, indices: Any) -> UnpackedArray:
        rows = self.shape[-2]
        idx = jnp.clip(jnp.asarray(indices, jnp.int32), 0, rows - 1)
        q = (jnp.take(self.values, idx // 2, axis=0) >> (4 * (idx % 2)).astype(jnp.uint8)[..., None]) & jnp.uint8(15)
        if self.offset is None:  # Q4_0
            q = q.astype(jnp.int8) - jnp.int8(8)
        scale, offset = (None if a is None else jnp.take(a, idx, axis=0).astype(jnp.float32) for a in (self.scale, self.offset))
        return UnpackedArray(self.encoding, q, scale, offset)

    @classmethod
    def supports(cls, encoding: QuantizationEncoding, shape: Sequence[int]) -> bool:
        return encoding in NIBBLE_ENCODINGS and len(shape) >= 2 and shape[-2] % 2 == 0

    @classmethod
    def from_packed(cls, encoding: Any, packed: Any) -> "NibbleArray":
        """Raises ValueError for another encoding, or an odd number of rows."""
        enc = _check_rows("NibbleArray.from_packed", encoding, packed)
        if enc not in NIBBLE_ENCODINGS:
            raise ValueError(
                f"NibbleArray.from_packed: {enc.value} does not have 4-bit values (supported: "
                f"{', '.join(e.value for e in _NIBBLE_SCALE_DTYPE)})"
            )
        if packed.shape[-2] % 2:
            raise ValueError(
                f"NibbleArray.from_packed: {packed.shape[-2]} rows; rows are packed in pairs, so an even number is needed"
            )
        return _nibbles_jit(enc, packed)


@partial(jax.jit, static_argnums=0)
def _nibbles_jit(enc: QuantizationEncoding, packed: jax.Array) -> NibbleArray:
    if enc in Q4_BLOCK_ENCODINGS:
        # The file's nibbles move as they are, never widened to a byte each: a Llama-3.2-1B
        # [16, 8192, 2048] Q4_0 stack (151 MB) converts in 0.12 s, against 0.17-0.20 s through
        # unpack() (2-core AVX-512 Xeon; the same bytes come out).
        qs, scale, offset = q4_blocks(enc, packed)  # [..., rows, blocks, 16], [..., rows, blocks]
        a, b = qs[..., 0::2, :, :], qs[..., 1::2, :, :]  # rows 2i and 2i + 1: [..., rows // 2, blocks, 16]
        low = (a & jnp.uint8(15)) | (b << jnp.uint8(4))  # values 0..15 of each block: row 2i low, 2i + 1 high
        high = (a >> jnp.uint8(4)) | (b & jnp.uint8(0xF0))  # values 16..31
        pairs = jnp.concatenate([low, high], axis=-1)  # [..., rows // 2, blocks, 32]
        pairs = pairs.reshape(*pairs.shape[:-2], -1)  # [..., rows // 2, cols]
    else:
        values, scale, offset = unpack(enc, packed)
        pairs = values[..., 0::2, :] | (values[..., 1::2, :] << jnp.uint8(4))
    dtype = _NIBBLE_SCALE_DTYPE[enc]
    return NibbleArray(enc, pairs, scale.astype(dtype), None if offset is None else offset.astype(dtype))


@jax.tree_util.register_pytree_node_class
class DequantizedArray(QuantizedArray):
    """The dequantized float matrix ``values [..., rows, cols]`` (float32 by default), still
    typed as a quantized weight of its encoding. 4 bytes per value in float32."""

    layout: ClassVar[str] = "dequantized"
    __slots__ = ("values",)

    def __init__(self, encoding: Any, values: Any):
        self.encoding = as_encoding(encoding)
        self.values = values

    def _leaves(self) -> tuple[Any, ...]:
        return (self.values,)

    def _from_leaves(self, leaves: Sequence[Any]) -> None:
        (self.values,) = leaves

    @property
    def shape(self) -> tuple[Any, ...]:
        return tuple(self.values.shape)

    def dequantize(self) -> jax.Array:
        return self.values.astype(jnp.float32)

    def take(self, indices: Any) -> "DequantizedArray":
        return DequantizedArray(self.encoding, jnp.take(self.values, indices, axis=0, mode="clip"))

    @classmethod
    def from_packed(cls, encoding: Any, packed: Any) -> "DequantizedArray":
        enc = _check_rows("DequantizedArray.from_packed", encoding, packed)
        return cls(enc, _dequantize_jit(enc, packed))


@jax.tree_util.register_pytree_node_class
class Int8Array(QuantizedArray):
    """A weight requantized to int8 per output channel, its columns rotated in Hadamard blocks,
    so that batched products run as int8 x int8 -> int32 dots.

    Leaves: ``values`` int8 ``[..., rows, cols]`` and ``scale`` float32 ``[..., rows]``, with
    ``W H = scale * values`` (``values`` in [-127, 127]), where ``H`` is block-diagonal with
    orthonormal Sylvester-Hadamard blocks of ``rotation`` columns (64; none when ``cols`` is not a
    multiple of it). ``H`` is symmetric and its own inverse, so ``x W^T = (x H)(W H)^T``: the
    rotation spreads an activation's outlier channels over their block before it is quantized
    (the idea of QuaRot, Ashkboos et al. 2024, arXiv:2404.00456, with blocks instead of the whole
    row, as in llama.cpp's ``Q8`` activation blocks' locality).

    :meth:`matmul` of ``x [..., cols]``: with at least ``policy.int8_min_rows`` rows (a batch), each
    row of ``x H`` is quantized to int8 with its own scale (``max |row| / 127``) and the product is
    one int8 dot with int32 accumulation, scaled after; with fewer rows (batch-1 decode, where
    int8 dots are slow on CPUs) it is the float32 product ``((x H) @ values^T) * scale``, in
    maxjax's CPU kernel where the policy runs that many rows there (``native_matmul``: the
    values read in place, a stacked layer too, as an ``unpacked`` weight with one group per row;
    2-core Zen 5 EPYC, a Llama-3.2-1B-shaped Q4_0 file requantized: batch-1 decode 0.94 -> 26-29
    tokens/s, ``benchmarks/scale.py --also-arithmetic int8``), else in XLA (the layer sliced, and
    dequantized in blocks).

    Accuracy (``benchmarks/int8.py``, SmolLM2-135M Q4_1, held-out Python docs): the requantized
    weights alone add 0.4% to the perplexity; with int8 activations in 64-column Hadamard blocks,
    0.8% (5% unrotated). About 1 byte per value, like ``unpacked``.
    """

    layout: ClassVar[str] = "int8"
    rotation: ClassVar[int] = 64
    __slots__ = ("values", "scale", "rotated")

    def __init__(self, encoding: Any, values: Any, scale: Any, rotated: bool):
        self.encoding = as_encoding(encoding)
        self.values, self.scale, self.rotated = values, scale, bool(rotated)

    def tree_flatten(self) -> tuple[tuple[Any, ...], Any]:
        return (self.values, self.scale), (self.encoding, self.rotated)

    @classmethod
    def tree_unflatten(cls, aux: Any, leaves: Sequence[Any]) -> "Int8Array":
        obj = object.__new__(cls)
        obj.encoding, obj.rotated = aux
        obj.values, obj.scale = leaves
        return obj

    def _leaves(self) -> tuple[Any, ...]:
        return (self.values, self.scale)

    @property
    def shape(self) -> tuple[Any, ...]:
        return tuple(self.values.shape)

    def rotate(self, a: Any) -> Any:
        """``a [..., cols] @ H`` (H: see the class docstring); ``a`` itself when not rotated."""
        return hadamard_blocks(a, self.rotation) if self.rotated else a

    def dequantize(self) -> jax.Array:
        return self.rotate(self.values.astype(jnp.float32) * self.scale[..., None])  # (W H) H = W

    def take(self, indices: Any) -> "Int8Array":
        return jax.tree.map(lambda a: jnp.take(a, indices, axis=0, mode="clip"), self)

    def matmul(self, x: Any, policy: BackendPolicy | None = None) -> jax.Array:
        """``x @ W^T`` (see the class docstring): ``x`` float32 ``[..., cols]`` -> ``[..., rows]``.

        Raises:
            ValueError: this is not a 2-D weight, ``x`` is not float32, or its last axis is not
                ``cols``.
        """
        policy = policy_for(policy)
        if self.ndim != 2 or getattr(x, "dtype", None) is None or np.dtype(x.dtype) != np.float32 or x.shape[-1] != self.shape[1]:
            return super().matmul(x, policy)  # its checks raise the errors
        lead = math.prod(x.shape[:-1])
        xr = self.rotate(x)  # [..., cols]
        if policy.int8_dots(lead):
            flat = xr.reshape(lead, xr.shape[-1])
            sx = jnp.max(jnp.abs(flat), axis=-1, keepdims=True) / 127.0  # [lead, 1]
            sx = jnp.where(sx > 0, sx, 1.0)
            xq = jnp.round(flat / sx).astype(jnp.int8)  # [lead, cols]
            acc = lax.dot_general(xq, self.values, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)  # [lead, rows]
            y = acc.astype(jnp.float32) * sx * self.scale
            return y.reshape(*x.shape[:-1], self.shape[0])
        if policy.native_matmul(self, lead):  # a few rows: maxjax's CPU kernel, float32
            return kernels.quantized_matmul(x, self)
        # float32: the base class's product (its row and column blocks) of x H and W H
        return _ChannelScaled(self.encoding, self.values, self.scale).matmul(xr, policy)

    def layer_matmul(self, x: Any, layer: Any, policy: BackendPolicy | None = None) -> jax.Array:
        """:meth:`matmul` with layer ``layer`` of a stack (see the base class): at least
        ``policy.int8_min_rows`` rows slice the layer for :meth:`matmul`'s int8 dot; fewer that the
        policy runs in maxjax's CPU kernel read the layer in place there.

        Raises:
            ValueError: as :meth:`matmul`, or this is not a stack of 2-D weights.
        """
        policy = policy_for(policy)
        if self.ndim == 3 and policy.int8_dots(math.prod(getattr(x, "shape", (0,))[:-1])):
            return self.layer(layer).matmul(x, policy)
        return super().layer_matmul(x, layer, policy)

    def channel_view(self) -> "UnpackedArray":
        """``W H`` as an ``unpacked`` array with one group (scale) per row, its leaves this array's
        (the values are not copied): what maxjax's CPU kernel multiplies ``x H`` by in float32."""
        return UnpackedArray(self.encoding, self.values, self.scale[..., None])

    @classmethod
    def supports(cls, encoding: QuantizationEncoding, shape: Sequence[int]) -> bool:
        return encoding.is_gguf and len(shape) >= 2

    @classmethod
    def from_packed(cls, encoding: Any, packed: Any) -> "Int8Array":
        enc = _check_rows("Int8Array.from_packed", encoding, packed)
        return _int8_jit(enc, packed)


@jax.tree_util.register_pytree_node_class
class _ChannelScaled(QuantizedArray):
    """``values [..., rows, cols] * scale [..., rows, None]`` (an :class:`Int8Array`'s rotated
    weight ``W H``, unrotated: what its float32 products multiply ``x H`` by)."""

    __slots__ = ("values", "scale")

    def __init__(self, encoding: Any, values: Any, scale: Any):
        self.encoding, self.values, self.scale = encoding, values, scale

    def _leaves(self) -> tuple[Any, ...]:
        return (self.values, self.scale)

    def _from_leaves(self, leaves: Sequence[Any]) -> None:
        self.values, self.scale = leaves

    @property
    def shape(self) -> tuple[Any, ...]:
        return tuple(self.values.shape)

    def dequantize(self) -> jax.Array:
        return self.values.astype(jnp.float32) * self.scale[..., None]

    def _column_block(self, j: int, k: int) -> "_ChannelScaled":
        """Block ``j`` of ``k`` of the columns: the values' columns; the per-row scale is whole."""
        cols = self.values.shape[-1]
        return _ChannelScaled(self.encoding, self.values[..., j * cols // k : (j + 1) * cols // k], self.scale)


def hadamard_blocks(a: Any, block: int) -> Any:
    """``a [..., n]`` times the block-diagonal matrix of orthonormal Sylvester-Hadamard blocks of
    ``block`` columns (a power of two dividing ``n``): symmetric and its own inverse."""
    h = np.array([[1.0]], np.float32)
    while h.shape[0] < block:
        h = np.block([[h, h], [h, -h]])
    h = jnp.asarray(h / np.sqrt(block), a.dtype)
    *lead, n = a.shape
    return (a.reshape(*lead, n // block, block) @ h).reshape(*lead, n)


#: rows an int8 requantization converts at a time (their float32 values are its temporaries)
_INT8_BLOCK_ROWS = 4096


@partial(jax.jit, static_argnums=0)
def _int8_jit(enc: QuantizationEncoding, packed: jax.Array) -> Int8Array:
    *lead, row_bytes = packed.shape  # [..., rows, row_bytes]
    total = math.prod(lead)
    rotated = enc.logical_shape(packed.shape)[-1] % Int8Array.rotation == 0

    def rows(p: jax.Array) -> tuple[jax.Array, jax.Array]:  # [n, row_bytes] -> int8 [n, cols], float32 [n]
        w = _dequantize_jit(enc, p)  # [n, cols] float32
        if rotated:
            w = hadamard_blocks(w, Int8Array.rotation)
        scale = jnp.max(jnp.abs(w), axis=-1) / 127.0  # [n]
        scale = jnp.where(scale > 0, scale, 1.0)
        return jnp.clip(jnp.round(w / scale[..., None]), -127, 127).astype(jnp.int8), scale.astype(jnp.float32)

    # a block of rows at a time (lax.map), so that the float32 temporaries are one block's, not the
    # whole weight's (a Llama-3.2-1B-shaped Q4_0 file: peak RSS 3.9 -> 1.9 GB at load)
    block = math.gcd(total, _INT8_BLOCK_ROWS)
    flat = packed.reshape(total, row_bytes)
    if block >= 64 and total > block:
        values, scale = lax.map(rows, flat.reshape(total // block, block, row_bytes))
    else:
        values, scale = rows(flat)
    return Int8Array(enc, values.reshape(*lead, enc.logical_shape(packed.shape)[-1]), scale.reshape(lead), rotated)


#: the layouts by name
LAYOUTS: dict[str, type[QuantizedArray]] = {
    cls.layout: cls for cls in (PackedArray, UnpackedArray, NibbleArray, DequantizedArray, Int8Array)
}


def layout_for(layout: str, encoding: Any, shape: Sequence[int]) -> str:
    """The layout a weight of ``encoding`` and logical ``shape`` takes when ``layout`` is asked
    for: ``layout``, or ``"unpacked"`` where the weight cannot take it (nibbles of an encoding that
    is not 4-bit, or of an odd number of rows; mapped of one other than Q4_0 and Q8_0).

    Raises:
        ValueError: an unknown layout name.
    """
    cls = LAYOUTS.get(layout)
    if cls is None:
        raise ValueError(f"unknown quantized layout {layout!r} (layouts: {', '.join(LAYOUTS)})")
    return layout if cls.supports(as_encoding(encoding), shape) else UnpackedArray.layout


def to_layout(layout: str, encoding: Any, packed: Any) -> QuantizedArray:
    """GGUF blocks ``[..., rows, bytes_per_row]`` in ``layout`` (see :func:`layout_for`).

    Raises:
        ValueError: an unknown layout name, or data that is not whole GGUF blocks.
    """
    enc = as_encoding(encoding)
    return LAYOUTS[layout_for(layout, enc, enc.logical_shape(packed.shape))].from_packed(enc, packed)


#: encoding -> the class a weight's stored value is read as (GGUF encodings: PackedArray)
_STORED: dict[QuantizationEncoding, type[QuantizedArray]] = {}


def register_encoding(encoding: QuantizationEncoding, cls: type[QuantizedArray] | None) -> None:
    """Weights of ``encoding`` are read as ``cls`` (its :meth:`~QuantizedArray.from_stored` takes
    their stored value); None unregisters. This, and the class, is all a new encoding needs:
    ``Weight``, the ops and ``Program`` dispatch through it."""
    if cls is None:
        _STORED.pop(encoding, None)
    else:
        _STORED[encoding] = cls


def stored_class(encoding: Any) -> type[QuantizedArray] | None:
    """The class a weight of ``encoding`` is read as, or None (not a quantized encoding maxjax runs)."""
    return _STORED.get(encoding) if isinstance(encoding, QuantizationEncoding) else None


for _enc in QuantizationEncoding:
    if _enc.is_gguf:
        register_encoding(_enc, PackedArray)


def as_quantized(value: Any, encoding: Any) -> QuantizedArray:
    """``value`` as a :class:`QuantizedArray`: itself, or a stored value (for GGUF encodings raw
    bytes, uint8 ``[..., rows, bytes_per_row]``, as a MAX program passes them) read by the
    encoding's class.

    Raises:
        ValueError: ``value`` is neither, or no class reads ``encoding`` (names its type, dtype
            and shape).
    """
    if isinstance(value, QuantizedArray):
        return value
    enc = as_encoding(encoding)
    cls = stored_class(enc)
    dtype = getattr(value, "dtype", None)
    if cls is PackedArray and (dtype is None or np.dtype(dtype) != np.uint8):
        cls = None
    if cls is None:
        raise ValueError(
            f"expected a quantized weight ({enc.value}: a QuantizedArray or uint8 GGUF blocks), got "
            f"{type(value).__name__} {getattr(value, 'dtype', '')}{list(getattr(value, 'shape', ()))}"
        )
    return cls.from_stored(enc, value)
