"""``KVCacheMetrics`` (MAX's ``max/nn/kv_cache/metrics.py``): counters of a KV cache's use.

The same fields as MAX 26.7 (generated from its dataclass). maxjax's :class:`PagedKVCache` has no
host, disk or remote tiers, so only ``input_tokens``, ``cache_tokens`` and
``device_blocks_served`` can be non-zero in maxjax; the other counters exist so that code which
reads or sums MAX's metrics runs unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["KVCacheMetrics"]


@dataclass
class KVCacheMetrics:
    """Counters of a KV cache (MAX's fields, all additive)."""

    input_tokens: int = 0
    cache_tokens: int = 0
    device_blocks_served: int = 0
    h2d_bytes_copied: int = 0
    d2h_bytes_copied: int = 0
    cross_replica_blocks_copied: int = 0
    cross_replica_bytes_copied: int = 0
    disk_bytes_written: int = 0
    disk_bytes_read: int = 0
    inflight_disk_ops: int = 0
    connector_loads_refused: int = 0
    connector_load_failures: int = 0
    connector_offload_blocks_dropped: int = 0
    nixl_read_blocks: int = 0
    nixl_write_blocks: int = 0
    nixl_read_latency_total_ms: float = 0.0
    nixl_read_latency_count: int = 0
    nixl_read_latency_max_ms: float = 0.0
    nixl_write_latency_total_ms: float = 0.0
    nixl_write_latency_count: int = 0
    rpc_acquire_latency_total_ms: float = 0.0
    rpc_acquire_latency_count: int = 0
    rpc_read_latency_total_ms: float = 0.0
    rpc_read_latency_count: int = 0
    nixl_read_bytes: int = 0
    nixl_write_bytes: int = 0
    dkv_connected_clients: int = 0
    dkv_total_clients: int = 0
    dkv_reconnect_attempts: int = 0
    dkv_peer_attaches: int = 0
    dkv_peer_attach_failures: int = 0
    dkv_peers_dropped: int = 0
    dkv_peer_loads: int = 0
    dkv_peer_load_failures: int = 0
    dkv_peer_transfer_failures: int = 0
    dkv_peer_metadata_refreshes: int = 0
    dkv_peer_metadata_refresh_failures: int = 0
    dkv_hints_rejected: int = 0
    dkv_hints_rejected_by_reason: dict = field(default_factory=dict)
    dkv_rpc_calls: dict = field(default_factory=dict)
    dkv_rpc_time_ms: dict = field(default_factory=dict)
    dkv_rpc_socket_wait_ms: dict = field(default_factory=dict)
    dkv_lock_waits: dict = field(default_factory=dict)
    dkv_lock_wait_ms: dict = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompts: new input plus cache hits."""
        return self.input_tokens + self.cache_tokens

    @property
    def cache_hit_rate(self) -> float:
        """Share of prompt tokens served from the cache (0.0 with no prompt tokens)."""
        total = self.prompt_tokens
        return self.cache_tokens / total if total else 0.0

