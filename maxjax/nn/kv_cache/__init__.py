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

__all__ = [
    "CacheLeafKind", "DenseKVCacheValues", "KVCacheInputs", "KVCacheInputsPerDevice", "KVCacheParamInterface",
    "KVCacheParams", "KVCacheQuantizationConfig", "MHAKVCacheParams", "NullKVConnectorConfig", "PagedCacheValues",
    "PagedKVCache",
]  # fmt: skip
