"""MAX 26.7's ``LatentAttentionWithRope`` (DeepSeek MLA): its state_dict keys and shapes and its
attention scale, for small shapes (hidden 64, 4 heads, kv_lora_rank 16, nope 8, rope 4, v 8; with
q_lora_rank 32 and without). MAX only executes MLA through its GPU kernels (``mo.mla.graph.*``,
which also need the cache's ``attention_dispatch_metadata``), so no outputs are recorded here:
tests/test_nn_latent_attention.py compares the numbers with a NumPy reference of DeepSeek-V2.

Keys: ``shape/<q_lora_rank|none>/<state_dict key>`` int64 shapes (in MAX's key order, recorded in
``keys/<..>`` as a newline-joined uint8 string) and ``scale/<..>`` float64.
"""

from __future__ import annotations

import numpy as np


def build() -> dict[str, np.ndarray]:
    from max.dtype import DType
    from max.nn import LatentAttentionWithRope, RotaryEmbedding

    out: dict[str, np.ndarray] = {}
    for q_lora in (32, None):
        rope = RotaryEmbedding(dim=16, n_heads=4, theta=10000.0, max_seq_len=16, head_dim=4, interleaved=True)
        m = LatentAttentionWithRope(
            rope=rope, num_attention_heads=4, num_key_value_heads=1, hidden_size=64, kv_params=None,
            dtype=DType.bfloat16, q_lora_rank=q_lora, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=8,
        )  # fmt: skip
        tag = str(q_lora).lower()
        sd = m.state_dict()
        for k, v in sd.items():
            out[f"shape/{tag}/{k}"] = np.asarray(v.shape, np.int64)
        out[f"keys/{tag}"] = np.frombuffer("\n".join(sd).encode(), np.uint8).copy()
        out[f"scale/{tag}"] = np.asarray(m.scale, np.float64)
    return out
