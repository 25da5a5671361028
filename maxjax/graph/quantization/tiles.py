"""Q4_0 and Q4_1 weights in tiles of 16 rows, multiplied by Q8_0 activations with integer dots (the
``tiles`` layout).

llama.cpp's own road to memory speed on x86 (its ``q4_0x8`` repacking, ``ggml-cpu/repack.cpp``):
the file's blocks are copied once at load into an order where one 512-bit register holds sixteen
rows' values, four consecutive values per 32-bit lane, so that ``vpdpbusd`` multiplies sixteen
rows by the same four activations and every sum stays in its row's lane. maxjax's kernel
(``matvec.cc``, ``maxjax_tiles_matmul``) streams the tiles once for one activation row, and with
more passes each tile over every group of up to 8 rows while it is in the core's caches, so the
same layout serves batch-1 decode (bound by memory), batched decode and a prompt's GEMM (bound by
the integer dots).

Layout of a ``[rows, cols]`` weight (``rows`` a multiple of 16, ``cols`` of 32), with ``nb =
cols / 32`` blocks per row:

- ``values`` uint8 ``[..., rows / 16, nb * 256]``: tile ``t``'s block ``b`` is 256 bytes, four
  chunks of 64; byte ``4 r + i`` of chunk ``c`` holds row ``16 t + r``'s value ``8 c + i`` of the
  block in its low nibble and value ``8 c + 4 + i`` in its high one (``i < 4``), as the file's
  ``q`` (0..15; the weight is ``d * (q - 8)`` for Q4_0, ``d * q + m`` for Q4_1);
- ``scale`` float16 ``[..., rows / 16, nb * 16]``: the file's ``d`` of row ``16 t + r``'s block
  ``b`` at ``b * 16 + r`` of tile ``t``;
- ``offset``: Q4_1's ``m``, as ``scale``; None for Q4_0.

The same bytes as the file (18 or 20 per 32 values), in anonymous memory rather than the file's
pages.
Its products round the activations to Q8_0 blocks (llama.cpp's ``quantize_row_q8_0``) always:
the layout exists for the integer dots (``load_model(arithmetic="q8_0")``).
"""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Sequence

import jax
import jax.numpy as jnp

from maxjax.backend import BackendPolicy, kernels, policy_for
from maxjax.graph.quantization.arrays import LAYOUTS, UnpackedArray, _check_rows, _GroupScaled
from maxjax.graph.quantization.blocks import combine, q4_blocks, q8_0_round
from maxjax.graph.quantization.encoding import QuantizationEncoding

__all__ = ["TILED_ENCODINGS", "TiledArray"]

#: rows per tile
TILE = 16


@jax.tree_util.register_pytree_node_class
class TiledArray(_GroupScaled):
    """A Q4_0 or Q4_1 weight in the ``tiles`` layout (see the module docstring): ``values`` uint8
    ``[..., rows / 16, cols * 8]``, ``scale`` float16 ``[..., rows / 16, cols / 2]``, ``offset``
    (Q4_1's ``m``) like ``scale``, or None for Q4_0.

    :meth:`matmul` and :meth:`layer_matmul` round ``x`` to Q8_0 blocks and multiply in maxjax's CPU
    kernel where the policy runs kernels (any number of rows: decode, batches and prompts; a
    stacked layer read in place), else (no kernel: another platform, an AVX2-only CPU) the
    dequantized weight by the rounded activations in float32: the same values, summed in another
    order.
    """

    layout: ClassVar[str] = "tiles"
    __slots__ = ()

    @property
    def shape(self) -> tuple[Any, ...]:
        *lead, tiles, width = self.values.shape
        return (*lead, tiles * TILE, width // 8)

    def _nibbles(self) -> jax.Array:
        """The values ``q`` (0..15) uint8 ``[..., rows, cols]`` in row-major order."""
        *lead, tiles, width = self.values.shape
        nb = width // 256
        v = self.values.reshape(*lead, tiles, nb, 4, TILE, 4)  # [.., t, b, c, r, i]
        q = jnp.stack([v & 15, v >> 4], axis=-2)  # [.., t, b, c, r, h, i]: value 8c + 4h + i
        q = jnp.moveaxis(q, -3, -5)  # [.., t, r, b, c, h, i]
        return q.reshape(*lead, tiles * TILE, nb * 32)

    def _row_major(self, per_tile: jax.Array) -> jax.Array:
        """A tile-ordered ``scale``/``offset`` leaf as float32 ``[..., rows, nb]``, rows in order."""
        *lead, tiles, width = per_tile.shape
        d = per_tile.reshape(*lead, tiles, width // TILE, TILE)  # [.., t, b, r]
        return jnp.swapaxes(d, -1, -2).reshape(*lead, tiles * TILE, width // TILE).astype(jnp.float32)

    def _unpacked(self, q: jax.Array, d: jax.Array, m: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array | None]:
        """Values ``q`` (0..15) as the ``unpacked`` layout holds them: int8 ``q - 8`` for Q4_0, uint8
        ``q`` with the offset for Q4_1."""
        return (q, d, m) if self.offset is not None else (q.astype(jnp.int8) - jnp.int8(8), d, None)

    def dequantize(self) -> jax.Array:
        *lead, rows, cols = self.shape
        q, d, m = self._unpacked(self._nibbles(), self._row_major(self.scale), None if self.offset is None else self._row_major(self.offset))
        return combine(q.reshape(*lead, rows, cols // 32, 32), d, m).reshape(*lead, rows, cols)

    def take(self, indices: Any) -> UnpackedArray:
        """Rows ``indices`` (clipped into range) of a 2-D weight, as an ``unpacked`` array (one byte
        per value: a tile's rows do not make a tile)."""
        rows = self.shape[-2]
        idx = jnp.clip(jnp.asarray(indices), 0, rows - 1)
        t, r = idx // TILE, idx % TILE
        nb = self.values.shape[-1] // 256
        v = self.values[t].reshape(*idx.shape, nb, 4, TILE, 4)  # [..., b, c, r, i]
        v = jnp.take_along_axis(v, r.reshape(*idx.shape, 1, 1, 1, 1), axis=-2)[..., 0, :]  # [..., b, c, i]
        q = jnp.stack([v & 15, v >> 4], axis=-2).reshape(*idx.shape, nb * 32)  # [..., b, c, h, i]

        def lane(leaf: jax.Array) -> jax.Array:  # row r's [nb] of a tile-ordered leaf
            d = leaf[t].reshape(*idx.shape, nb, TILE)
            return jnp.take_along_axis(d, r.reshape(*idx.shape, 1, 1), axis=-1)[..., 0].astype(jnp.float32)

        return UnpackedArray(self.encoding, *self._unpacked(q, lane(self.scale), None if self.offset is None else lane(self.offset)))

    def matmul(self, x: Any, policy: BackendPolicy | None = None) -> jax.Array:
        """``x [..., cols]`` float32 ``@ W.T`` with ``x`` rounded to Q8_0 blocks -> ``[..., rows]``.

        Raises:
            ValueError: this is not a 2-D weight, ``x`` is not float32, or its last axis is not
                ``cols``.
        """
        self._check(x, 2)
        return self._product(x, None, policy_for(policy))

    def layer_matmul(self, x: Any, layer: Any, policy: BackendPolicy | None = None) -> jax.Array:
        """:meth:`matmul` with layer ``layer`` (an int32 scalar, clamped into range) of a stack,
        read in place by the kernel.

        Raises:
            ValueError: as :meth:`matmul`, or this is not a stack of 2-D weights.
        """
        self._check(x, 3)
        return self._product(x, layer, policy_for(policy))

    def _check(self, x: Any, ndim: int) -> None:
        if self.ndim != ndim:
            raise ValueError(f"{'matmul' if ndim == 2 else 'layer_matmul'}: {self!r} is not {'a 2-D weight' if ndim == 2 else 'a stack of 2-D weights'}")
        self._rows_of(x)  # float32, cols features

    def _product(self, x: Any, layer: Any, policy: BackendPolicy) -> jax.Array:
        if policy.native_matmul(self, 1):  # the kernel takes any number of rows
            return kernels.quantized_matmul(x, self, layer, activations="Q8_0")
        w = self if layer is None else self.layer(layer)
        return policy.matmul_t(q8_0_round(x), w.dequantize())

    @classmethod
    def supports(cls, encoding: QuantizationEncoding, shape: Sequence[int]) -> bool:
        return encoding in TILED_ENCODINGS and len(shape) >= 2 and shape[-2] % TILE == 0 and shape[-1] % 32 == 0

    @classmethod
    def from_packed(cls, encoding: Any, packed: Any) -> "TiledArray":
        enc = _check_rows("TiledArray.from_packed", encoding, packed)
        if not cls.supports(enc, enc.logical_shape(packed.shape)):
            raise ValueError(
                f"TiledArray.from_packed: the tiles layout takes Q4_0 and Q4_1 with rows a multiple of {TILE}, "
                f"got {enc.value} {list(enc.logical_shape(packed.shape))}"
            )
        return _tiles_jit(enc, packed)


#: the encodings the tiles layout takes
TILED_ENCODINGS = frozenset({QuantizationEncoding.Q4_0, QuantizationEncoding.Q4_1})


@partial(jax.jit, static_argnums=0)
def _tiles_jit(enc: QuantizationEncoding, packed: jax.Array) -> TiledArray:
    qs, d, m = q4_blocks(enc, packed)  # [..., rows, nb, 16] uint8, [..., rows, nb] float32 (m: Q4_1)
    *lead, rows, nb, _ = qs.shape
    q = jnp.concatenate([qs & 15, qs >> 4], axis=-1)  # [..., rows, nb, 32]: the block's values in order
    q = q.reshape(*lead, rows // TILE, TILE, nb, 4, 2, 4)  # [.., t, r, b, c, h, i]
    q = jnp.moveaxis(q, -5, -3)  # [.., t, b, c, r, h, i]
    values = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(*lead, rows // TILE, nb * 256)

    def tiled(a: jax.Array) -> jax.Array:  # [..., rows, nb] -> float16 [..., rows / 16, nb * 16]
        return jnp.swapaxes(a.reshape(*lead, rows // TILE, TILE, nb), -1, -2).reshape(*lead, rows // TILE, nb * TILE).astype(jnp.float16)

    return TiledArray(enc, values.astype(jnp.uint8), tiled(d), None if m is None else tiled(m))


LAYOUTS[TiledArray.layout] = TiledArray
