"""``PagedKVCache``: maxjax's host-side page allocator for MAX's paged KV cache.

MAX's serving stack keeps a ``PagedKVCacheManager`` outside ``max.nn``; maxjax's is this small
class. It owns the pages ``kv_blocks [num_pages, 2, num_layers, page_size, n_kv_heads, head_dim]``
(a :class:`maxjax.driver.Buffer`, updated in place by each step's graph) and, for each sequence,
its list of pages and its cached length; ``metrics`` (MAX's :class:`KVCacheMetrics`) counts the
tokens it cached. :meth:`inputs` gives one step's runtime inputs for a
ragged batch (MAX's order, see :meth:`KVCacheParams.get_symbolic_inputs`); :meth:`commit` records
the tokens that step added.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from maxjax.driver import Buffer
from maxjax.nn.kv_cache.cache_params import KVCacheParams
from maxjax.nn.kv_cache.metrics import KVCacheMetrics

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Pages of one device's KV cache, handed to sequences as they grow.

    Args:
        params: the cache's :class:`~maxjax.nn.kv_cache.MHAKVCacheParams` (one device).
        num_pages: pages to allocate (each holds ``params.page_size`` tokens of every layer).

    Raises:
        ValueError: more than one device, or ``num_pages < 1``.
    """

    def __init__(self, params: KVCacheParams, num_pages: int) -> None:
        if params.n_devices != 1:
            raise ValueError(f"PagedKVCache: one device per cache, got {params.n_devices} (make one per device)")
        if num_pages < 1:
            raise ValueError(f"PagedKVCache: num_pages must be at least 1, got {num_pages}")
        self.params = params
        self.num_pages = num_pages
        # a device buffer from the start (a host Buffer would be copied to the device on each use)
        self.kv_blocks = Buffer(jnp.zeros(params.blocks_shape(num_pages), params.dtype.to_jax()))
        self._free = list(range(num_pages - 1, -1, -1))
        self._pages: dict[Any, list[int]] = {}
        self._lengths: dict[Any, int] = {}
        self.metrics = KVCacheMetrics()

    def claim(self, seq_id: Any) -> None:
        """Starts an empty sequence ``seq_id``.

        Raises:
            ValueError: the id is already in use.
        """
        if seq_id in self._pages:
            raise ValueError(f"PagedKVCache: sequence {seq_id!r} is already claimed")
        self._pages[seq_id], self._lengths[seq_id] = [], 0

    def release(self, seq_id: Any) -> None:
        """Frees the pages of ``seq_id``."""
        self._free.extend(reversed(self._pages.pop(seq_id)))
        del self._lengths[seq_id]

    def cache_length(self, seq_id: Any) -> int:
        """Tokens of ``seq_id`` in the cache."""
        return self._lengths[seq_id]

    def inputs(self, seq_ids: Sequence[Any], num_new_tokens: Sequence[int]) -> tuple[Any, ...]:
        """One step's cache inputs for a ragged batch where sequence ``seq_ids[i]`` runs
        ``num_new_tokens[i]`` new tokens: pages are reserved for them first.

        Returns:
            ``(kv_blocks, page_stride int64 [1], cache_lengths uint32 [batch], lookup_table
            uint32 [batch, max_num_pages], max_prompt_length uint32 [1], max_cache_length uint32
            [1])`` (MAX's flat order; unused lookup entries point at page 0).

        Raises:
            ValueError: an unknown sequence, or not enough free pages (says how many are needed).
        """
        page = self.params.page_size
        needed = []
        for sid, n in zip(seq_ids, num_new_tokens, strict=True):
            if sid not in self._pages:
                raise ValueError(f"PagedKVCache: unknown sequence {sid!r}; claim() it first")
            total = -(-(self._lengths[sid] + n) // page)
            needed.append(max(total - len(self._pages[sid]), 0))
        if sum(needed) > len(self._free):
            raise ValueError(f"PagedKVCache: {sum(needed)} more pages needed, {len(self._free)} free of {self.num_pages}")
        for sid, k in zip(seq_ids, needed):
            self._pages[sid].extend(self._free.pop() for _ in range(k))
        width = max(1, max(len(self._pages[s]) for s in seq_ids))
        table = np.zeros((len(seq_ids), width), np.uint32)
        for i, sid in enumerate(seq_ids):
            table[i, : len(self._pages[sid])] = self._pages[sid]
        lengths = np.asarray([self._lengths[s] for s in seq_ids], np.uint32)
        stride = int(np.prod(self.params.shape_per_block))
        return (
            self.kv_blocks,
            np.asarray([stride], np.int64),
            lengths,
            table,
            np.asarray([max(num_new_tokens)], np.uint32),
            np.asarray([int(lengths.max()) if len(lengths) else 0], np.uint32),
        )

    def commit(self, seq_ids: Sequence[Any], num_new_tokens: Sequence[int]) -> None:
        """Records that the step given to :meth:`inputs` cached its new tokens."""
        for sid, n in zip(seq_ids, num_new_tokens, strict=True):
            self._lengths[sid] += int(n)
            self.metrics.input_tokens += int(n)
