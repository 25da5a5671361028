"""``MappedArray``: a GGUF weight read where it lies in the memory-mapped file (the ``mapped`` layout).

Every other layout copies a weight's blocks out of the file at load time (and most rewrite them).
A ``mapped`` weight keeps none of its own: its leaves are the whole file, adopted by JAX as one
read-only uint8 array ``[units, 32]`` without a copy (JAX's CPU client adopts 64-byte aligned
host memory, and a map starts on a page), plus where the weight starts in it. Loading a model is
then mapping its file, as llama.cpp does: nothing is read until a product touches it, and the
pages are the OS's page cache, shared between processes.

Leaves:

- ``file``: uint8 ``[units, 32]``, the file in 32-byte units (GGUF aligns tensors to 32 bytes;
  counting in units keeps an offset in int32 up to 64 GiB, JAX's index type without x64);
- ``offsets``: int32, each layer's first byte / 32: ``[]`` for one weight, ``[layers]`` for a stack
  of them (the scan's layers need not be evenly spaced in the file);
- ``order``: int32 ``[rows]`` or None: the row order of the logical weight over the stored rows
  (``W[i] = stored[order[i]]``, e.g. llama.cpp's Q/K permutation undone), applied to a product's
  output (``y[..., i] = y_stored[..., order[i]]``) so that the file's rows are read as stored.

Products: maxjax's CPU kernel reads Q4_0 and Q8_0 blocks in place (``maxjax_mapped_matmul`` in
``maxjax/backend/kernels/matvec.cc``; bit-identical to the ``nibbles`` and ``unpacked`` kernels),
and dequantizes a prompt's weight a block of rows at a time for XLA's GEMM
(``maxjax_mapped_dequantize``); where the kernels do not run, the weight's bytes are sliced out of
the file and dequantized as :class:`~maxjax.graph.quantization.arrays.PackedArray` does. Bytes per value: the file's own
(Q4_0 0.5625, Q8_0 1.0625).

The file must not be modified or truncated while such arrays live: the OS then kills the process
with SIGBUS (as for ``GGUFWeights(zero_copy=True)``).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from maxjax.graph.quantization.arrays import LAYOUTS, PackedArray, QuantizedArray, _check_rows
from maxjax.graph.quantization.encoding import QuantizationEncoding, as_encoding

__all__ = ["MappedArray", "MAPPED_ENCODINGS", "UNIT"]

#: bytes per unit of ``file`` (GGUF's default tensor alignment)
UNIT = 32
#: the encodings maxjax's CPU kernel multiplies in place (others dequantize through XLA)
MAPPED_ENCODINGS = frozenset({QuantizationEncoding.Q4_0, QuantizationEncoding.Q8_0})


@jax.tree_util.register_pytree_node_class
class MappedArray(QuantizedArray):
    """A GGUF-quantized weight (or a stack of them) read in place from the mapped file (see the
    module docstring).

    Args:
        encoding: the GGUF block encoding.
        file: uint8 ``[units, 32]``, the file.
        offsets: int32 ``[]`` or ``[layers]``: each layer's first byte / 32.
        rows, cols: the logical shape of one layer.
        order: int32 ``[rows]`` (the logical row order over the stored rows) or None.

    Raises:
        ValueError: not a GGUF encoding, ``cols`` not whole blocks, ``file`` not uint8
            ``[units, 32]``, or ``order`` not ``[rows]``.
    """

    layout: ClassVar[str] = "mapped"
    __slots__ = ("file", "offsets", "order", "rows", "cols")

    def __init__(self, encoding: Any, file: Any, offsets: Any, rows: int, cols: int, order: Any = None):
        enc = as_encoding(encoding)
        if not enc.is_gguf:
            raise ValueError(f"MappedArray: {enc} is not a GGUF block encoding")
        enc.packed_shape((int(cols),))  # raises: cols not a whole number of blocks
        if np.dtype(file.dtype) != np.uint8 or tuple(file.shape[1:]) != (UNIT,) or len(file.shape) != 2:
            raise ValueError(f"MappedArray: file must be uint8 [units, {UNIT}], got {np.dtype(file.dtype)}{list(file.shape)}")
        if order is not None and tuple(order.shape) != (int(rows),):
            raise ValueError(f"MappedArray: order must be [{rows}], got {list(order.shape)}")
        self.encoding, self.file, self.offsets, self.order = enc, file, offsets, order
        self.rows, self.cols = int(rows), int(cols)

    # -- pytree: the logical shape is static --------------------------------------------------------
    def tree_flatten(self) -> tuple[tuple[Any, ...], Any]:
        return (self.file, self.offsets, self.order), (self.encoding, self.rows, self.cols)

    @classmethod
    def tree_unflatten(cls, aux: Any, leaves: Sequence[Any]) -> "MappedArray":
        obj = object.__new__(cls)
        obj.encoding, obj.rows, obj.cols = aux
        obj.file, obj.offsets, obj.order = leaves
        return obj

    def _leaves(self) -> tuple[Any, ...]:
        return (self.file, self.offsets, self.order)

    def _from_leaves(self, leaves: Sequence[Any]) -> None:
        self.file, self.offsets, self.order = leaves

    @property
    def shape(self) -> tuple[Any, ...]:
        return (*self.offsets.shape, self.rows, self.cols)

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored row (whole GGUF blocks)."""
        return self.encoding.packed_shape((self.cols,))[0]

    @property
    def nbytes(self) -> int:
        """The weight's own bytes in the file (the file is shared by every weight mapped from it)."""
        order = 0 if self.order is None else self.rows * 4
        return math.prod(self.offsets.shape) * self.rows * self.row_bytes + order

    # -- the stored bytes ----------------------------------------------------------------------------
    def _stored_rows(self, offset: Any) -> jax.Array:
        """The stored rows of the layer at ``offset`` (units): uint8 ``[rows, row_bytes]``."""
        nbytes = self.rows * self.row_bytes
        block = lax.dynamic_slice(self.file, (offset, 0), (-(-nbytes // UNIT), UNIT))
        return block.reshape(-1)[:nbytes].reshape(self.rows, self.row_bytes)

    def packed(self) -> PackedArray:
        """The weight's stored blocks as a :class:`PackedArray` (a copy out of the file), rows as
        stored (``order`` not applied): ``[..., rows, row_bytes]``."""
        if not self.offsets.ndim:
            return PackedArray(self.encoding, self._stored_rows(self.offsets))
        data = jax.vmap(self._stored_rows)(self.offsets.reshape(-1))
        return PackedArray(self.encoding, data.reshape(*self.offsets.shape, self.rows, self.row_bytes))

    def _in_order(self, y: Any, axis: int) -> Any:
        return y if self.order is None else jnp.take(y, self.order, axis=axis)

    # -- what ops need -------------------------------------------------------------------------------
    def dequantize(self) -> jax.Array:
        return self._in_order(self.packed().dequantize(), -2)

    def take(self, indices: Any) -> PackedArray:
        """Rows ``indices`` (clamped) of a 2-D weight, as a :class:`PackedArray` ``[*indices.shape,
        row_bytes]`` (only those rows' bytes are read)."""
        if self.offsets.ndim:
            raise ValueError(f"take: {self!r} is a stack; take rows of one layer")
        idx = jnp.clip(jnp.asarray(indices, jnp.int32), 0, self.rows - 1)
        if self.order is not None:
            idx = self.order[idx]
        nbytes = self.row_bytes
        units = -(-nbytes // UNIT) + 1  # a row may start anywhere in a unit

        def row(i: Any) -> jax.Array:
            first, rest = jnp.divmod(i * nbytes, UNIT)  # int32: fine below 2 GiB per weight
            block = lax.dynamic_slice(self.file, (self.offsets + first, 0), (units, UNIT)).reshape(-1)
            return lax.dynamic_slice(block, (rest,), (nbytes,))

        flat = jax.vmap(row)(idx.reshape(-1))
        return PackedArray(self.encoding, flat.reshape(*idx.shape, nbytes))

    def layer(self, layer: Any) -> "MappedArray":
        """Layer ``layer`` (clamped) of a stack: the same file, that layer's offset."""
        if not self.offsets.ndim:
            raise ValueError(f"layer: {self!r} is not a stack")
        offset = lax.dynamic_index_in_dim(self.offsets, layer, keepdims=False)
        return MappedArray.tree_unflatten((self.encoding, self.rows, self.cols), (self.file, offset, self.order))

    def matmul(self, x: Any, policy: Any = None) -> jax.Array:
        """``x @ W.T`` (see :meth:`QuantizedArray.matmul`). Where maxjax's CPU kernel reads this
        weight (the policy's ``native_matmul``): a few rows multiply in it, reading the blocks in
        place, and more rows (a prompt) multiply in XLA's GEMM against the weight dequantized by
        the kernel, a block of rows at a time (``BackendPolicy.row_chunks``). Elsewhere, as the
        stored blocks' :class:`PackedArray` (a copy of the weight's bytes, dequantized by XLA).
        Where the policy's ``q8_activations`` says so, every path takes the activations rounded
        to Q8_0 blocks (integer dots in the kernel)."""
        if self.offsets.ndim:
            raise ValueError(f"matmul: {self!r} is not a 2-D weight")
        return self._product(x, None, policy)

    def layer_matmul(self, x: Any, layer: Any, policy: Any = None) -> jax.Array:
        """:meth:`matmul` with layer ``layer`` of a stack, read in place."""
        if not self.offsets.ndim:
            raise ValueError(f"layer_matmul: {self!r} is not a stack of 2-D weights")
        return self._product(x, layer, policy)

    def _product(self, x: Any, layer: Any, policy: Any) -> jax.Array:
        from maxjax.backend import kernels, policy_for

        policy = policy_for(policy)
        shape = getattr(x, "shape", (0,))
        lead = math.prod(shape[:-1])
        float32 = np.dtype(getattr(x, "dtype", np.float64)) == np.float32 and shape[-1:] == (self.cols,)
        if float32 and policy.native_matmul(self, lead):  # a few rows: the kernel reads the blocks in place
            return self._in_order(self._kernel_product(x, layer, policy), -1)
        if float32 and policy.native_matmul(self, 1):  # a prompt: blocks of rows dequantized by the kernel for XLA's GEMM
            flat = self._activations(x, policy).reshape(-1, self.cols)
            n = policy.row_chunks(self.rows, lead)
            r = self.rows // n
            if n > 1:
                out = lax.map(lambda i: policy.matmul_t(flat, kernels.mapped_rows(self, i * r, r, layer)), jnp.arange(n, dtype=jnp.int32))
                y = jnp.moveaxis(out, 0, 1).reshape(flat.shape[0], self.rows)
            else:
                y = policy.matmul_t(flat, kernels.mapped_rows(self, 0, self.rows, layer))
            return self._in_order(y.reshape(*shape[:-1], self.rows), -1)
        w = self if layer is None else self.layer(layer)
        return w._in_order(w.packed().matmul(x, policy), -1)

    # -- construction --------------------------------------------------------------------------------
    @classmethod
    def supports(cls, encoding: QuantizationEncoding, shape: Sequence[int]) -> bool:
        """Q4_0 and Q8_0 matrices (what the kernel reads in place; others take ``unpacked``)."""
        return encoding in MAPPED_ENCODINGS and len(shape) >= 2 and shape[-1] % 32 == 0

    @classmethod
    def from_packed(cls, encoding: Any, packed: Any) -> "MappedArray":
        """GGUF blocks ``[..., rows, bytes_per_row]`` that are not in a mapped file (an in-memory
        registry, a test): copied into one buffer laid out as a file would be, each layer
        starting on a unit (:func:`maxjax.engine.placement.host_layout` maps a file's weights
        without a copy instead)."""
        enc = _check_rows("MappedArray.from_packed", encoding, packed)
        *lead, rows, row_bytes = packed.shape
        layers = math.prod(lead)
        per_layer = -(-(rows * row_bytes) // UNIT)
        flat = jnp.asarray(packed).reshape(layers, rows * row_bytes)
        flat = jnp.pad(flat, ((0, 0), (0, per_layer * UNIT - rows * row_bytes)))
        file = flat.reshape(layers * per_layer, UNIT)
        offsets = (jnp.arange(layers, dtype=jnp.int32) * per_layer).reshape(lead)
        cols = enc.logical_shape((row_bytes,))[0]
        return cls(enc, file, offsets, rows, cols)

    def __repr__(self) -> str:
        shape = ", ".join(str(d) for d in self.shape)
        return f"MappedArray({self.encoding.value}, [{shape}])"


LAYOUTS[MappedArray.layout] = MappedArray
