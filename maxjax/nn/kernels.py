"""Attention over MAX's ragged batches and paged KV cache, as jnp functions (MAX keeps its
kernels' Python entry points in ``max/nn/kernels.py``; these are maxjax's, traced into the graph
as ops through :func:`maxjax.graph.ops.apply`).

A ragged batch concatenates the new tokens of every sequence, ``x [total_seq_len, ...]``, with
``input_row_offsets`` uint32 ``[batch + 1]`` (sequence ``b`` owns rows ``offsets[b] : offsets[b +
1]``). Prefill and decode rows mix freely: sequence ``b`` already has ``cache_lengths[b]`` tokens in
the cache, so its ``i``-th new token sits at position ``cache_lengths[b] + i``. The cache is MAX's
``kv_blocks [num_pages, 2, num_layers, page_size, n_kv_heads, head_dim]``: token position ``p`` of
sequence ``b`` lives in page ``lookup_table[b, p // page_size]`` at slot ``p % page_size``.

References: MAX's ``flash_attention_ragged`` / ``rope_split_store_ragged`` (``max/nn/kernels.py``)
for the inputs' meaning; Kwon et al., 2023 (PagedAttention, arXiv:2309.06180) for the layout.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["ragged_token_positions", "rope_ragged", "store_kv_ragged", "attention_ragged_paged"]

#: the score of a masked key (finite, so an all-masked row gives zeros rather than NaN)
_MASKED = float(jnp.finfo(jnp.float32).min)


def ragged_token_positions(input_row_offsets: Any, cache_lengths: Any, total: int) -> tuple[Any, Any]:
    """Sequence index and cache position of each of ``total`` ragged tokens.

    Returns:
        ``(seq int32 [total], pos int32 [total])``.
    """
    offsets = input_row_offsets.astype(jnp.int32)
    rows = jnp.arange(total, dtype=jnp.int32)
    # the number of sequence ends at or before each row (searchsorted needs static shapes)
    seq = jnp.sum(offsets[None, 1:] <= rows[:, None], axis=1, dtype=jnp.int32)  # [total]
    pos = cache_lengths.astype(jnp.int32)[seq] + rows - offsets[seq]
    return seq, pos


def rope_ragged(x: Any, freqs_cis: Any, input_row_offsets: Any, cache_lengths: Any, *, interleaved: bool) -> Any:
    """Rotary embedding of ragged heads from MAX's ``freqs_cis`` table.

    x ``[total, n_heads, head_dim]``; freqs_cis ``[max_positions, head_dim]`` holding ``cos_i,
    sin_i`` pairs (MAX's layout); pairs are channels ``(2i, 2i + 1)`` when ``interleaved``, else
    ``(i, i + head_dim / 2)``. Computed in float32; returns x's dtype.
    """
    _, pos = ragged_token_positions(input_row_offsets, cache_lengths, x.shape[0])
    rows = jnp.asarray(freqs_cis, jnp.float32)[pos]  # [total, head_dim]
    cos, sin = rows[:, None, 0::2], rows[:, None, 1::2]  # [total, 1, head_dim / 2]
    xf = x.astype(jnp.float32)
    if interleaved:
        a, b = xf[..., 0::2], xf[..., 1::2]
        out = jnp.stack([a * cos - b * sin, a * sin + b * cos], axis=-1).reshape(x.shape)
    else:
        half = x.shape[-1] // 2
        a, b = xf[..., :half], xf[..., half:]
        out = jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    return out.astype(x.dtype)


def store_kv_ragged(
    kv_blocks: Any, k: Any, v: Any, layer_idx: Any, input_row_offsets: Any, cache_lengths: Any, lookup_table: Any
) -> Any:
    """``kv_blocks`` with the new keys ``k`` and values ``v`` (``[total, n_kv_heads, head_dim]``)
    of layer ``layer_idx`` written at their tokens' pages and slots.

    Returns:
        the updated ``kv_blocks`` (same shape and dtype; in place under ``jax.jit`` when donated).
    """
    seq, pos = ragged_token_positions(input_row_offsets, cache_lengths, k.shape[0])
    page_size = kv_blocks.shape[3]
    page = lookup_table.astype(jnp.int32)[seq, pos // page_size]  # [total]
    rows = _rows(kv_blocks, page, layer_idx) + pos % page_size  # keys' rows [total]; values' are rows + 1 slab
    slab = kv_blocks.shape[2] * page_size  # rows from a page's keys of a layer to its values
    flat = kv_blocks.reshape(-1, *kv_blocks.shape[4:])  # [pages * 2 * layers * page_size, kv, d]
    kv = jnp.concatenate([k, v]).astype(kv_blocks.dtype)  # [2 * total, kv, d]
    flat = flat.at[jnp.concatenate([rows, rows + slab])].set(kv, mode="drop", unique_indices=True)
    return flat.reshape(kv_blocks.shape)


def _rows(kv_blocks: Any, page: Any, layer_idx: Any) -> Any:
    """Row of slot 0 of the keys of ``layer_idx`` in pages ``page`` (any shape, int32), in
    ``kv_blocks`` viewed as ``[pages * 2 * layers * page_size, kv, d]`` rows (a bitcast of MAX's
    layout: one scatter or gather of whole rows, which XLA runs in place, where indexing the
    six-dimensional array scatters element by element)."""
    _, two, layers, page_size, _, _ = kv_blocks.shape
    return (page * two * layers + jnp.asarray(layer_idx, jnp.int32)) * page_size


def attention_ragged_paged(
    q: Any,
    kv_blocks: Any,
    layer_idx: Any,
    input_row_offsets: Any,
    cache_lengths: Any,
    lookup_table: Any,
    *,
    scale: float,
    window: int | None = None,
    causal: bool = True,
) -> Any:
    """Causal grouped-query attention of ragged queries over their sequences' cached pages.

    q ``[total, n_heads, head_dim]`` (already rotated; this step's keys already stored). Token
    ``t`` of sequence ``b`` at position ``p`` attends to the keys at positions ``0..p`` of
    ``b``'s pages (query head ``h`` uses KV head ``h // (n_heads // n_kv_heads)``). Scores and
    softmax in float32. With ``window``, only the keys at positions ``p - window + 1 .. p``
    (a sliding window, as MAX's ``local_window_size``). With ``causal=False`` (MAX's
    ``NULL_MASK``) every token of its sequence, cached or new, is visible. Each token reads its sequence's pages ``[max_num_pages * page_size]``:
    the gather is per token, which suits decode rows and short prompts (maxjax's dense cache
    serves long prompts faster).

    Returns:
        ``[total, n_heads, head_dim]`` in q's dtype.
    """
    total, h, d = q.shape
    _, _, _, page_size, kv, _ = kv_blocks.shape
    g = h // kv
    seq, pos = ragged_token_positions(input_row_offsets, cache_lengths, total)
    pages = lookup_table.astype(jnp.int32)[seq]  # [total, max_pages]
    n_keys = pages.shape[1] * page_size
    rows = (_rows(kv_blocks, pages, layer_idx)[:, :, None] + jnp.arange(page_size, dtype=jnp.int32)).reshape(total, n_keys)
    flat = kv_blocks.reshape(-1, kv, d)  # [pages * 2 * layers * page_size, kv, d]
    keys = flat[rows].astype(jnp.float32)  # [total, n_keys, kv, d]
    values = flat[rows + kv_blocks.shape[2] * page_size].astype(jnp.float32)  # [total, n_keys, kv, d]
    qg = q.astype(jnp.float32).reshape(total, kv, g, d)
    scores = jnp.einsum("tngd,tknd->tngk", qg, keys) * scale  # [total, kv, g, n_keys]
    key_pos = jnp.arange(n_keys, dtype=jnp.int32)[None, :]
    if causal:
        visible = key_pos <= pos[:, None]  # [total, n_keys]
    else:
        offsets = input_row_offsets.astype(jnp.int32)
        seq_len = cache_lengths.astype(jnp.int32) + offsets[1:] - offsets[:-1]  # [batch]
        visible = key_pos < seq_len[seq][:, None]
    if window is not None:
        visible &= key_pos > pos[:, None] - window
    scores = jnp.where(visible[:, None, None, :], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("tngk,tknd->tngd", probs, values)  # [total, kv, g, d]
    return out.reshape(total, h, d).astype(q.dtype)
