"""``TransformerBlock``: a pre-norm decoder block (attention with a KV cache, then an MLP)."""

from __future__ import annotations

from typing import Any

from maxjax.graph.sharding import ShardingStrategy
from maxjax.nn.attention import AttentionWithRope
from maxjax.nn.layer import Module
from maxjax.nn.linear import MLP
from maxjax.nn.norm import RMSNorm

__all__ = ["TransformerBlock"]


class TransformerBlock(Module):
    """``h = x + attn(input_layernorm(x)); out = h + mlp(post_attention_layernorm(h))``.

    ``__call__(x, k_cache, v_cache, layer_idx, positions) -> (out, k_cache, v_cache)`` (see
    :class:`~maxjax.nn.attention.AttentionWithRope` for shapes).
    """

    def __init__(self, attention: AttentionWithRope, mlp: MLP, input_layernorm: RMSNorm, post_attention_layernorm: RMSNorm):
        super().__init__()
        self.self_attn = attention
        self.mlp = mlp
        self.input_layernorm = input_layernorm
        self.post_attention_layernorm = post_attention_layernorm
        self._sharding_strategy: ShardingStrategy | None = None

    @property
    def sharding_strategy(self) -> ShardingStrategy | None:
        """``tensor_parallel`` (attention and MLP tensor parallel, norms replicated) or ``replicate``.

        Raises:
            ValueError: (setting) another strategy.
        """
        return self._sharding_strategy

    @sharding_strategy.setter
    def sharding_strategy(self, strategy: ShardingStrategy) -> None:
        if not (strategy.is_tensor_parallel or strategy.is_replicate):
            raise ValueError(f"Unsupported sharding strategy for TransformerBlock: {strategy}")
        self.self_attn.sharding_strategy = strategy
        self.mlp.sharding_strategy = strategy
        for norm in (self.input_layernorm, self.post_attention_layernorm):
            norm.sharding_strategy = ShardingStrategy.replicate(strategy.num_devices)
        self._sharding_strategy = strategy

    def __call__(self, x: Any, k_cache: Any, v_cache: Any, layer_idx: Any, positions: Any) -> tuple[Any, Any, Any]:
        attn, k_cache, v_cache = self.self_attn(self.input_layernorm(x), k_cache, v_cache, layer_idx, positions)
        h = x + attn
        return h + self.mlp(self.post_attention_layernorm(h)), k_cache, v_cache
