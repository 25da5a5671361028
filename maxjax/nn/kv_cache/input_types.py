"""The KV cache values a model step takes (MAX's ``max/nn/kv_cache/input_types.py``), and
maxjax's dense cache.

- :class:`KVCacheInputsPerDevice` (``PagedCacheValues`` when its fields are graph values): MAX's
  paged cache of one device: ``kv_blocks [num_pages, 2, num_layers, page_size, n_kv_heads,
  head_dim]``, ``cache_lengths`` uint32 ``[batch]``, ``lookup_table`` uint32 ``[batch,
  max_num_pages]``, ``max_prompt_length``/``max_cache_length`` uint32 ``[1]``, ``page_stride``
  int64 ``[1]``. Attention layers write their new keys and values into ``kv_blocks``: through
  ``ops.buffer_store`` when it is a :class:`~maxjax.graph.BufferValue` (a graph input that the
  graph updates in place, as in MAX), else by rebinding the field to the updated array (eager and
  functional mode: read ``collection.kv_blocks`` after the call).
- :class:`DenseKVCacheValues`: maxjax's contiguous cache for a padded batch ``[batch, seq]``
  (the layout the serving engine decodes with; see :mod:`maxjax.nn.attention.attention_with_rope`):
  keys ``[n_layers, batch, n_kv_heads, head_dim, max_seq]`` (transposed), values ``[n_layers,
  batch, n_kv_heads, max_seq, head_dim]`` and the positions ``[batch, seq]`` of the tokens being
  run. Updated the same way (fields rebound, or buffers stored).

Neither is a JAX pytree: a cache collection is one mutable object that every layer of a step
updates, so it must not be copied on the way (layer hooks map over pytree arguments). Pass its
arrays through ``jax.jit`` and build the collection inside.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Generic, Iterator, TypeAlias, TypeVar

from maxjax.graph.buffer import BufferValue



__all__ = ["DenseKVCacheValues", "KVCacheInputs", "KVCacheInputsPerDevice", "PagedCacheValues", "read_cache", "write_cache"]

_Tensor = TypeVar("_Tensor")
_Buffer = TypeVar("_Buffer")

#: fields in MAX's flat graph-input order (``flatten_without_attention_dispatch_metadata``)
_FLAT = ("kv_blocks", "page_stride", "cache_lengths", "lookup_table", "max_prompt_length", "max_cache_length")


@dataclass
class KVCacheInputsPerDevice(Generic[_Tensor, _Buffer]):
    """One device's paged KV cache inputs (MAX's fields; the FP8-scale, dispatch-metadata and
    per-layer fields exist and must stay None in maxjax).

    Raises:
        NotImplementedError: a scale, dispatch-metadata or per-layer field is set.
    """

    kv_blocks: Any
    cache_lengths: Any
    lookup_table: Any
    max_prompt_length: Any
    max_cache_length: Any
    page_stride: Any
    kv_scales: Any = None
    scales_page_stride: Any = None
    scales_lookup_table: Any = None
    attention_dispatch_metadata: Any = None
    draft_attention_dispatch_metadata: Any = None
    mla_num_partitions: Any = None
    draft_mla_num_partitions: Any = None
    kv_blocks_per_layer: Any = None
    kv_scales_per_layer: Any = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self)[6:]:
            if getattr(self, f.name) is not None:
                raise NotImplementedError(
                    f"KVCacheInputsPerDevice({f.name}=...): maxjax's paged cache has no {f.name} "
                    "(no FP8 KV scales, dispatch metadata or per-layer buffers)"
                )

    def flatten(self) -> list[Any]:
        """The fields in MAX's graph-input order: kv_blocks, page_stride, cache_lengths,
        lookup_table, max_prompt_length, max_cache_length."""
        return [getattr(self, name) for name in _FLAT]

    @classmethod
    def unflatten(cls, it: Iterator[Any]) -> "KVCacheInputsPerDevice":
        """The inverse of :meth:`flatten` over an iterator (graph inputs are read as tensors,
        a buffer input stays a buffer)."""
        values = {}
        for name in _FLAT:
            v = next(it)
            values[name] = v if name == "kv_blocks" else getattr(v, "tensor", v)
        return cls(**values)


PagedCacheValues = KVCacheInputsPerDevice
"""A paged cache's inputs as graph values (MAX's alias)."""

KVCacheInputs: TypeAlias = Any
"""A tree (tuple) of one :class:`KVCacheInputsPerDevice` per device (MAX's alias)."""


@dataclass
class DenseKVCacheValues:
    """maxjax's contiguous KV cache of a padded batch (see the module docstring for shapes).

    Attributes:
        k_cache: float ``[n_layers, batch, n_kv_heads, head_dim, max_seq]``.
        v_cache: float ``[n_layers, batch, n_kv_heads, max_seq, head_dim]``.
        positions: int32 ``[batch, seq]``, the position of each token run in this step.

    With ``k_cache`` and ``v_cache`` None, attention runs the step's whole sequences over their own
    keys and values (training, scoring: key ``j`` visible to query ``i`` of a row when its position
    is not later) and keeps nothing; there ``positions`` may be None, for ``0 .. seq - 1`` in
    every row.
    """

    k_cache: Any
    v_cache: Any
    positions: Any


def _is_buffer(v: Any) -> bool:
    return isinstance(v, BufferValue)


def read_cache(v: Any) -> Any:
    """The current value of a cache field: ``ops.buffer_load`` of a graph buffer, else ``v``."""
    if _is_buffer(v):
        from maxjax.graph import ops

        return ops.buffer_load(v)
    return v


def write_cache(collection: Any, field: str, value: Any) -> None:
    """Updates ``collection.<field>`` to ``value``: stored into the buffer when the field is a
    graph buffer (MAX's in-place update), else the field is rebound (eager/functional mode),
    keeping the kind of value the caller put there (a JAX array stays a JAX array)."""
    from maxjax.graph.value import TensorValue

    current = getattr(collection, field)
    if _is_buffer(current):
        from maxjax.graph import ops

        ops.buffer_store(current, value)
        return
    if isinstance(value, TensorValue) and value._graph is None and not isinstance(current, TensorValue):
        value = value.to_jax()
    setattr(collection, field, value)
