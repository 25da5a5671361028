"""``KVCacheParams`` and ``MHAKVCacheParams``: MAX 26.7's description of a paged KV cache.

MAX (``max/nn/kv_cache/cache_params.py``) keeps a model's keys and values in pages ("blocks") of
``page_size`` tokens: one buffer ``kv_blocks [num_pages, 2, num_layers, page_size, n_kv_heads,
head_dim]`` (index 0 of the second axis holds keys, 1 values), and per step a lookup table of the
pages each sequence owns. maxjax keeps the same buffer layout and the same graph inputs
(:meth:`KVCacheParams.get_symbolic_inputs`); the pages live in a JAX array that the graph
updates (see :mod:`maxjax.nn.kv_cache.manager` for the host-side page allocator and
:mod:`maxjax.nn.kernels` for the attention over pages).

What maxjax does not implement is refused when the params are made, by name: prefix caching,
data-parallel replicas, per-layer buffers, quantized KV caches, KV connectors, speculative
decoding and sliding-window groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Protocol, Sequence

import numpy as np

from maxjax.dtype import DType
from maxjax.graph.type import DeviceRef, TensorType

__all__ = [
    "CacheLeafKind", "KVCacheParamInterface", "KVCacheParams", "KVCacheQuantizationConfig", "MHAKVCacheParams",
    "NullKVConnectorConfig",
]  # fmt: skip


class CacheLeafKind(Enum):
    """What a cache leaf holds (MAX's ``CacheLeafKind``); maxjax implements ``ATTENTION``."""

    ATTENTION = "attention"
    RECURRENT = "recurrent"


@dataclass
class NullKVConnectorConfig:
    """No external KV tier (MAX's default connector): the only one maxjax accepts."""

    type: str = "null"
    host_offload_max_gb: float | None = None
    host_staging_alloc: str = "registered"
    host_staging_mlock: bool = False
    disk_offload_max_gb: float | None = None
    disk_offload_dir: str | None = None
    num_disk_workers: int = 32
    num_h2d_onload_lanes: int = 1
    use_disk_direct_io: bool = False
    block_store_endpoint: str | None = None


@dataclass
class KVCacheQuantizationConfig:
    """MAX's FP8 KV cache settings (a type only: maxjax refuses a quantized KV cache)."""

    scale_dtype: DType = DType.float32
    quantization_granularity: int = 128


class KVCacheParamInterface(Protocol):
    """What a model reads of its cache's params (MAX's ``KVCacheParamInterface``)."""

    dtype: DType
    num_layers: int
    devices: Sequence[DeviceRef]
    page_size: int

    def get_symbolic_inputs(self, namespace: str = "") -> tuple[Any, ...]: ...

    def unflatten_kv_inputs(self, it: Any) -> tuple[Any, ...]: ...


@dataclass
class KVCacheParams:
    """MAX's ``KVCacheParams`` (same fields, order and defaults). Use :class:`MHAKVCacheParams`
    (which adds ``n_kv_heads``) for a multi-head attention cache.

    Raises:
        NotImplementedError: a field set to a feature maxjax's cache does not have (the field and
            value are named).
    """

    dtype: DType
    head_dim: int
    num_layers: int
    devices: Sequence[DeviceRef]
    enable_prefix_caching: bool = False
    enable_dp_cross_replica_prefix_copy: bool = True
    per_layer_buffers: bool = False
    kv_hash_algo: str = "ahash64"
    kv_hash_seed: bytes | None = None
    kv_connector_config: Any = field(default_factory=NullKVConnectorConfig)
    page_size: int = 128
    slots_per_page: int | None = None
    data_parallel_degree: int = 1
    kvcache_quant_config: KVCacheQuantizationConfig | None = None
    speculative_method: Any = None
    num_draft_tokens: int = 0
    window_size: int | None = None

    leaf_kind: ClassVar[CacheLeafKind] = CacheLeafKind.ATTENTION

    def __post_init__(self) -> None:
        refused = {
            "enable_prefix_caching": (self.enable_prefix_caching, False),
            "per_layer_buffers": (self.per_layer_buffers, False),
            "data_parallel_degree": (self.data_parallel_degree, 1),
            "kvcache_quant_config": (self.kvcache_quant_config, None),
            "speculative_method": (self.speculative_method, None),
            "num_draft_tokens": (self.num_draft_tokens, 0),
            "window_size": (self.window_size, None),
        }
        for name, (value, supported) in refused.items():
            if value != supported:
                raise NotImplementedError(
                    f"KVCacheParams({name}={value!r}): maxjax's paged KV cache supports only {name}={supported!r}"
                )
        if getattr(self.kv_connector_config, "type", "null") not in ("null", None):
            raise NotImplementedError(
                f"KVCacheParams(kv_connector_config={self.kv_connector_config!r}): maxjax has no external KV tier "
                "(only the null connector)"
            )
        if self.slots_per_page is None:
            self.slots_per_page = self.page_size
        elif self.slots_per_page != self.page_size:
            raise NotImplementedError(
                f"KVCacheParams(slots_per_page={self.slots_per_page}): maxjax stores every token of a page "
                f"(slots_per_page == page_size == {self.page_size})"
            )
        self.devices = list(self.devices)

    # -- MAX's derived properties -------------------------------------------------------------------
    @property
    def n_devices(self) -> int:
        """Devices the cache spans."""
        return len(self.devices)

    @property
    def tensor_parallel_degree(self) -> int:
        """Devices per data-parallel replica (all of them: maxjax has one replica)."""
        return self.n_devices

    @property
    def kv_dim(self) -> int:
        """Key/value tensors per cache slot (MAX: 2 for multi-head attention)."""
        raise NotImplementedError(f"{type(self).__name__} has no kv_dim: use MHAKVCacheParams")

    @property
    def n_kv_heads_per_device(self) -> int:
        """KV heads on one device."""
        raise NotImplementedError(f"{type(self).__name__} has no KV heads: use MHAKVCacheParams")

    @property
    def storage_head_dim(self) -> int:
        """Channels stored per head (``head_dim``: maxjax has no packed FP4 cache)."""
        return self.head_dim

    @property
    def shape_per_block(self) -> list[int]:
        """One page: ``[kv_dim, num_layers, page_size, n_kv_heads_per_device, head_dim]``."""
        return [self.kv_dim, self.num_layers, self.page_size, self.n_kv_heads_per_device, self.storage_head_dim]

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one page (all layers, keys and values)."""
        return int(np.prod(self.shape_per_block)) * self.dtype.size_in_bytes

    def blocks_shape(self, num_pages: Any = "total_num_pages") -> list[Any]:
        """``kv_blocks``'s shape for ``num_pages`` pages (a symbolic name by default)."""
        return [num_pages, *self.shape_per_block]

    # -- graph inputs ---------------------------------------------------------------------------------
    def get_symbolic_inputs(self, namespace: str = "") -> tuple[Any, ...]:
        """The cache's graph input types, one :class:`KVCacheInputsPerDevice` per device (MAX's
        symbolic names: ``total_num_pages``, ``batch_size``, ``max_num_pages``).

        ``kv_blocks`` is a :class:`~maxjax.graph.BufferType` (updated in place by the graph);
        ``cache_lengths`` uint32 ``[batch_size]`` (tokens already cached per sequence),
        ``lookup_table`` uint32 ``[batch_size, max_num_pages]`` (page ids of each sequence, in
        order), ``max_prompt_length``/``max_cache_length`` uint32 ``[1]``, ``page_stride`` int64 ``[1]``.
        """
        from maxjax.graph.type import BufferType
        from maxjax.nn.kv_cache.input_types import KVCacheInputsPerDevice

        pages = f"{namespace}total_num_pages"
        out = []
        for device in self.devices:
            out.append(
                KVCacheInputsPerDevice(
                    kv_blocks=BufferType(self.dtype, self.blocks_shape(pages), device),
                    cache_lengths=TensorType(DType.uint32, ["batch_size"], device),
                    lookup_table=TensorType(DType.uint32, ["batch_size", f"{namespace}max_num_pages"], device),
                    max_prompt_length=TensorType(DType.uint32, [1], DeviceRef.CPU()),
                    max_cache_length=TensorType(DType.uint32, [1], DeviceRef.CPU()),
                    page_stride=TensorType(DType.int64, [1], DeviceRef.CPU()),
                )
            )
        return tuple(out)

    def flattened_kv_inputs(self) -> list[Any]:
        """:meth:`get_symbolic_inputs` as a flat list (MAX's graph-input order per device)."""
        return [t for inputs in self.get_symbolic_inputs() for t in inputs.flatten()]

    def unflatten_kv_inputs(self, it: Any) -> tuple[Any, ...]:
        """Rebuilds the per-device :class:`KVCacheInputsPerDevice` from an iterator of graph
        inputs in :meth:`flattened_kv_inputs` order (``.tensor``/buffers as given)."""
        from maxjax.nn.kv_cache.input_types import KVCacheInputsPerDevice

        it = iter(it)
        return tuple(KVCacheInputsPerDevice.unflatten(it) for _ in self.devices)


@dataclass
class MHAKVCacheParams(KVCacheParams):
    """:class:`KVCacheParams` of multi-head attention (MAX's ``MHAKVCacheParams``): adds the
    keyword-only ``n_kv_heads`` (and ``allow_kv_head_replication``).

    Raises:
        ValueError: ``n_kv_heads`` does not divide over the devices.
    """

    n_kv_heads: int = field(kw_only=True)
    allow_kv_head_replication: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_kv_heads <= 0:
            raise ValueError(f"MHAKVCacheParams: n_kv_heads must be a positive int, got {self.n_kv_heads!r}")
        tp = self.tensor_parallel_degree
        if self.n_kv_heads % tp and not (self.allow_kv_head_replication and tp % self.n_kv_heads == 0):
            raise ValueError(f"Number of KV heads ({self.n_kv_heads}) must be divisible by the number of devices ({tp})")

    @property
    def kv_dim(self) -> int:
        """2: keys and values."""
        return 2

    @property
    def n_kv_heads_per_device(self) -> int:
        """``n_kv_heads`` split over the devices (at least 1 with head replication)."""
        return max(self.n_kv_heads // self.tensor_parallel_degree, 1)
