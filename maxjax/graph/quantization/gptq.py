"""GPTQ int4 weights (Frantar et al., 2022, arXiv:2210.17323), dequantized inside the jitted function.

Layout (AutoGPTQ's, which GPTQ safetensors checkpoints and MAX 26.7's ``GPTQLinear`` read):

- ``qweight`` int32 ``[in_dim // 8, out_dim]``: eight 4-bit codes per int32, packed along the
  input rows; code ``k`` of a column is bits ``4 * (k % 8) .. 4 * (k % 8) + 3`` of
  ``qweight[k // 8]`` (least significant nibble first).
- ``scales`` float16 ``[in_dim // group_size, out_dim]``: one scale per group of input rows and
  output column.
- symmetric quantization only (MAX asserts ``sym``; its kernels take ``has_zp_int=0`` and its
  weight adapter drops ``qzeros``): the zero point is ``2 ** (bits - 1) = 8``, so
  ``w[k, n] = (code[k, n] - 8) * scales[group(k), n]``.
- ``desc_act`` (activation order): MAX's adapter turns the checkpoint's ``g_idx`` (group of each
  input row) into ``perm_idx = argsort(g_idx)`` (int32 ``[in_dim]``, :func:`perm_idx_from_g_idx`);
  the matmul gathers the input's features by ``perm_idx`` and the weight's rows the same way, row
  ``j`` of the permuted weight then being in group ``j // group_size`` (MAX's
  ``GPTQ_gpu_repack_b4_g128_desc_act``).

Sources: AutoGPTQ ``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`` (``QuantLinear.pack``:
``qweight[row] |= intweight[j] << (bits * (j - i))`` for the ``32 // bits`` rows ``j`` of word
``row``; its ``qzeros`` hold ``zero - 1``, i.e. 7 for symmetric 4-bit, added back on unpacking);
MAX 26.7 ``max/nn/linear.py`` (``GPTQLinear``), ``max/graph/ops/quantized.py``,
``max/nn/kernels.py`` (``has_zp_int = 0`` for GPTQ) and
``max/pipelines/architectures/llama3/weight_adapters.py`` (``g_idx`` -> ``perm_idx``, ``qzeros``
dropped). MAX 26.7 runs GPTQ only on GPUs (``GPTQ_gpu_repack_b4_g128``), bfloat16 in and out, and
only ``bits=4, group_size=128``; maxjax takes any ``group_size`` dividing ``in_dim``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = ["dequantize_gptq", "gptq_matmul", "perm_idx_from_g_idx", "unpack_int4_rows"]

#: codes per int32 and the symmetric zero point of 4-bit GPTQ
_PER_WORD, _ZERO = 8, 8


def unpack_int4_rows(qweight: Any) -> Any:
    """int32 ``[K // 8, N]`` -> int32 codes ``[K, N]`` in ``0..15`` (least significant nibble is
    row ``8 * r``)."""
    shifts = jnp.arange(0, 32, 4, dtype=jnp.int32)  # [8]
    codes = (qweight[:, None, :] >> shifts[None, :, None]) & 0xF  # [K // 8, 8, N]
    return codes.reshape(qweight.shape[0] * _PER_WORD, qweight.shape[1])  # [K, N]


def dequantize_gptq(qweight: Any, scales: Any, perm_idx: Any = None, *, group_size: int) -> Any:
    """float32 ``[K, N]`` weight of symmetric 4-bit GPTQ (``(code - 8) * scale``).

    With ``perm_idx`` (int ``[K]``) the rows come out in permuted order: row ``j`` is input row
    ``perm_idx[j]``, scaled by group ``j // group_size`` (MAX's desc_act layout).
    """
    codes = unpack_int4_rows(qweight)  # [K, N]
    if perm_idx is not None:
        codes = jnp.take(codes, perm_idx, axis=0)  # [K, N], permuted rows
    k = codes.shape[0]
    groups = jnp.repeat(scales.astype(jnp.float32), group_size, axis=0, total_repeat_length=k)  # [K, N]
    return (codes - _ZERO).astype(jnp.float32) * groups  # [K, N] float32


def gptq_matmul(x: Any, qweight: Any, scales: Any, perm_idx: Any = None, *, group_size: int) -> Any:
    """``x @ W`` with ``W`` the dequantized GPTQ weight ``[K, N]``: ``x [..., K] -> [..., N]`` in
    ``x``'s dtype (the weight is cast to it; products accumulate in float32).

    The op behind ``GPTQLinear``: one jnp function, so under ``jax.jit`` the weight stays packed
    in device memory and is dequantized inside the compiled program.
    """
    w = dequantize_gptq(qweight, scales, perm_idx, group_size=group_size).astype(x.dtype)  # [K, N]
    if perm_idx is not None:
        x = jnp.take(x, perm_idx, axis=-1)  # [..., K], features in the weight's row order
    y = jnp.matmul(x, w, preferred_element_type=jnp.float32)  # [..., N] float32
    return y.astype(x.dtype)


def perm_idx_from_g_idx(g_idx: Any) -> np.ndarray:
    """MAX's ``perm_idx`` from a checkpoint's ``g_idx`` (group of each input row): the stable
    ``argsort`` as int32 ``[K]`` (MAX 26.7's Llama weight adapter renames ``g_idx`` to
    ``perm_idx`` and argsorts it)."""
    return np.argsort(np.asarray(g_idx), kind="stable").astype(np.int32)
