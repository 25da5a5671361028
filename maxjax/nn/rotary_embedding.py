"""``RotaryEmbedding``: rotary position embedding (RoPE; Su et al., 2021, arXiv:2104.09864).

Llama's layout as Hugging Face implements it (``rotate_half``: the first and second halves of
each head are the two coordinates of each rotated pair). Checkpoints in llama.cpp's interleaved
layout are converted when loaded (``maxjax.graph.weights.adapters``), or use ``interleaved=True``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from maxjax.dtype import DType
from maxjax.graph import ops
from maxjax.nn.layer import Module

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(Module):
    """Rotates pairs of channels of ``x [..., seq, n_heads, head_dim]`` by position-dependent angles.

    Args:
        dim: model hidden size (MAX's argument; ``head_dim`` defaults to ``dim // n_heads``).
        n_heads: number of query heads.
        theta: the rope base (Llama's ``rope_theta``).
        max_seq_len: longest position (informational; positions are computed, not tabulated).
        head_dim: channels per head.
        interleaved: pairs are (0, 1), (2, 3), ... (GGUF/Meta layout) instead of (i, i + d/2).

    ``__call__(x, positions)``: ``positions`` is an integer tensor broadcastable to ``x.shape[:-2]``
    (e.g. ``[batch, seq]``); angles are computed in float32, the result has ``x``'s dtype.
    """

    def __init__(
        self,
        dim: int,
        n_heads: int,
        theta: float,
        max_seq_len: int = 8192,
        device: Any = None,
        head_dim: int | None = None,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        self.dim, self.n_heads, self.theta, self.max_seq_len = dim, n_heads, float(theta), max_seq_len
        self.head_dim = head_dim or dim // n_heads
        self.interleaved = interleaved
        half = self.head_dim // 2
        # Hugging Face: 1 / theta ** (arange(0, d, 2) / d), computed in float32.
        exponent = np.arange(0, self.head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(self.head_dim)
        self.inv_freq = (1.0 / (np.float32(self.theta) ** exponent)).astype(np.float32)
        assert self.inv_freq.shape == (half,)

    def freqs(self, positions: Any) -> tuple[Any, Any]:
        """cos and sin ``[*positions.shape, head_dim // 2]`` (float32)."""
        inv = ops.constant(self.inv_freq, DType.float32)
        angles = ops.unsqueeze(ops.cast(positions, DType.float32), -1) * inv
        return ops.cos(angles), ops.sin(angles)

    def __call__(self, x: Any, positions: Any) -> Any:
        half = self.head_dim // 2
        cos, sin = self.freqs(positions)
        cos, sin = ops.unsqueeze(cos, -2), ops.unsqueeze(sin, -2)  # broadcast over heads
        xf = ops.cast(x, DType.float32)
        if self.interleaved:
            pairs = ops.reshape(xf, [*x.shape[:-1], half, 2])
            a, b = pairs[..., 0], pairs[..., 1]
            out = ops.stack([a * cos - b * sin, a * sin + b * cos], axis=-1)
            out = ops.reshape(out, x.shape)
        else:
            a, b = xf[..., :half], xf[..., half:]
            out = ops.concat([a * cos - b * sin, b * cos + a * sin], axis=-1)
        return ops.cast(out, x.dtype)
