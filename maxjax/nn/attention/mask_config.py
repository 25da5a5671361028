"""Attention mask variants (MAX's ``max/nn/attention/mask_config.py``; members and values as MAX 26.7)."""

from __future__ import annotations

from enum import Enum

__all__ = ["AttentionMaskVariant", "MHAMaskVariant"]


class MHAMaskVariant(str, Enum):
    """Mask codes of MAX's multi-head attention kernels."""

    CAUSAL_MASK = "0"
    NULL_MASK = "2"
    CHUNKED_CAUSAL_MASK = "3"
    SLIDING_WINDOW_CAUSAL_MASK = "4"
    SLIDING_WINDOW_NONCAUSAL_MASK = "5"


class AttentionMaskVariant(str, Enum):
    """MAX's attention mask kinds."""

    NULL_MASK = "null"
    CAUSAL_MASK = "causal"
    TENSOR_MASK = "tensor_mask"
    CHUNKED_CAUSAL_MASK = "chunked_causal"
    SLIDING_WINDOW_CAUSAL_MASK = "sliding_window_causal"
    SLIDING_WINDOW_NONCAUSAL_MASK = "sliding_window_noncausal"
