"""``maxjax.nn.kv_cache`` (MAX's ``max.nn.kv_cache``): KV cache parameters and inputs, and
maxjax's page allocator."""

from maxjax.nn.kv_cache.cache_params import (
    CacheLeafKind, KVCacheParamInterface, KVCacheParams, KVCacheQuantizationConfig, MHAKVCacheParams,
    NullKVConnectorConfig,
)
from maxjax.nn.kv_cache.input_types import (
    DenseKVCacheValues, KVCacheInputs, KVCacheInputsPerDevice, PagedCacheValues, read_cache, write_cache,
)
from maxjax.nn.kv_cache.manager import PagedKVCache
from maxjax.nn.kv_cache.metrics import KVCacheMetrics
from maxjax.nn.kv_cache.utils import build_max_lengths_tensors

__all__ = [
    "CacheLeafKind", "DenseKVCacheValues", "KVCacheInputs", "KVCacheInputsPerDevice", "KVCacheParamInterface",
    "KVCacheMetrics", "KVCacheParams", "KVCacheQuantizationConfig", "build_max_lengths_tensors", "MHAKVCacheParams", "NullKVConnectorConfig", "PagedCacheValues",
    "PagedKVCache",
]  # fmt: skip
