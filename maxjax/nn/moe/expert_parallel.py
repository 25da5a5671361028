"""``forward_moe_sharded_layers`` (MAX 26.7's ``max/nn/moe/expert_parallel.py``)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["forward_moe_sharded_layers"]


def forward_moe_sharded_layers(
    shards: Sequence[Callable[[Any], Any]],
    xs: list[Any],
    eplb_counter_buffers: list[Any] | None = None,
    layer_idx_per_device: list[Any] | None = None,
) -> list[Any]:
    """Runs per-device shards on their inputs (MAX's): ``[shard(x) for shard, x in zip(shards, xs)]``,
    MAX's ``forward_sharded_layers`` path for replicated or tensor-parallel MLPs and MoEs (each
    output is then a full or partial result, joined by the caller as in MAX).

    MAX's other path, expert parallelism (shards with an EP batch manager: dispatch, local
    experts, combine across GPUs, with EPLB counters), does not exist in maxjax: its ``MoE``
    refuses ``ep_size > 1`` and ``ep_batch_manager``, and so this refuses EPLB's arguments.

    Raises:
        AssertionError: not one input per shard (MAX's message).
        NotImplementedError: ``eplb_counter_buffers`` or ``layer_idx_per_device`` (EPLB, an
            expert-parallel feature).
    """
    for arg, value in (("eplb_counter_buffers", eplb_counter_buffers), ("layer_idx_per_device", layer_idx_per_device)):
        if value is not None:
            raise NotImplementedError(
                f"forward_moe_sharded_layers({arg}=...): EPLB belongs to MAX's expert-parallel path, which maxjax does not "
                "support; pass None"
            )
    assert len(xs) == len(shards), f"Number of layers ({len(shards)}) must match number of inputs ({len(xs)})"
    return [shard(x) for shard, x in zip(shards, xs, strict=True)]
