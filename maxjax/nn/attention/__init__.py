"""``maxjax.nn.attention`` (MAX's ``max.nn.attention``): attention layers and their kernels."""

from maxjax.nn.attention.attention_with_rope import MASKED, MIN_WINDOW, AttentionWithRope, _causal_gqa, _windows

__all__ = ["AttentionWithRope"]
