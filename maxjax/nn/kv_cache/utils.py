"""Helpers of MAX's ``max/nn/kv_cache/utils.py``."""

from __future__ import annotations

import numpy as np

from maxjax.driver import Buffer

__all__ = ["build_max_lengths_tensors"]


def build_max_lengths_tensors(max_prompt_length: int, max_cache_length: int) -> tuple[Buffer, Buffer]:
    """The two uint32 ``[1]`` buffers of a step's maximum prompt (query) and cache lengths
    (the ``max_prompt_length``/``max_cache_length`` cache inputs)."""
    return (
        Buffer.from_numpy(np.array([max_prompt_length], np.uint32)),
        Buffer.from_numpy(np.array([max_cache_length], np.uint32)),
    )
