"""``maxjax.nn.attention`` (MAX's ``max.nn.attention``): attention layers and their kernels."""

from maxjax.nn.attention.attention_with_rope import (
    MASKED, MIN_WINDOW, AttentionWithRope, GGUFQAttentionWithRope, GPTQAttentionWithRope, _causal_gqa, _windows,
    num_heads_for_device,
)
from maxjax.nn.attention.attention_with_rope import TensorParallelAttentionWithRope
from maxjax.nn.attention.interfaces import DistributedAttentionImpl
from maxjax.nn.attention.mask_config import AttentionMaskVariant, MHAMaskVariant
from maxjax.nn.attention.multihead_attention import MultiheadAttention
from maxjax.nn.attention.multi_latent_attention import LatentAttentionWithRope, TensorParallelLatentAttentionWithRope
from maxjax.nn.attention.ragged_attention import RaggedAttention

__all__ = [
    "AttentionMaskVariant", "AttentionWithRope", "DistributedAttentionImpl", "GGUFQAttentionWithRope", "GPTQAttentionWithRope", "MHAMaskVariant", "MultiheadAttention", "RaggedAttention",
    "num_heads_for_device",
    "TensorParallelAttentionWithRope", "LatentAttentionWithRope", "TensorParallelLatentAttentionWithRope",
]
