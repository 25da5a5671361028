"""``DistributedAttentionImpl`` (MAX's ``max/nn/attention/interfaces.py``): the interface of an
attention layer written in MAX's per-device style (one input, KV collection, rope table and row
offsets per device; one output per device).

maxjax runs multi-device attention as one program on a ``jax.sharding.Mesh`` (an
``AttentionWithRope`` with a tensor-parallel ``sharding_strategy``); this base class is for code
that subclasses MAX's interface and implements its ``__call__`` itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from maxjax.nn.layer import Module

__all__ = ["DistributedAttentionImpl"]


class DistributedAttentionImpl(Module, ABC):
    """A generalized distributed attention interface (MAX's): subclasses implement ``__call__``."""

    @abstractmethod
    def __call__(
        self,
        layer_idx: Any,
        x: list[Any],
        signal_buffers: list[Any],
        kv_collections: list[Any],
        freqs_cis: list[Any],
        input_row_offsets: list[Any],
    ) -> list[Any]:
        """Runs a distributed attention forward pass.

        Args:
            layer_idx: index of the layer (int32 scalar tensor).
            x: per-device inputs ``[total_seq_len, hidden]``, one per device.
            signal_buffers: per-device buffers for collective communication.
            kv_collections: per-device paged KV cache values (``PagedCacheValues``).
            freqs_cis: per-device rotary tables ``[max_positions, head_dim]``.
            input_row_offsets: per-device ragged row offsets uint32 ``[batch + 1]``.

        Returns:
            One output per device, ``[total_seq_len, hidden]``.
        """
