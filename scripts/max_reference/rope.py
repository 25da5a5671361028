"""MAX 26.7's rotary embeddings: freqs_cis tables and rotated activations (see scripts/reference_max.py)."""

from __future__ import annotations

import numpy as np


def build() -> dict[str, np.ndarray]:
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType
    from max.nn import (
        DynamicRotaryEmbedding, Llama3RopeScalingParams, Llama3RotaryEmbedding, LongRoPERotaryEmbedding, LongRoPEScalingParams, RotaryEmbedding,
        YarnRotaryEmbedding, YarnScalingParams,
    )

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 4, 16)).astype(np.float32)  # [batch, seq, heads, head_dim]
    cases = {
        "plain_inter": RotaryEmbedding(64, 4, 10000.0, 32, head_dim=16, interleaved=True),
        "plain_halves": RotaryEmbedding(64, 4, 500000.0, 32, head_dim=16, interleaved=False),
        "llama3": Llama3RotaryEmbedding(
            64, 4, 500000.0, 32, head_dim=16, interleaved=False,
            scaling_params=Llama3RopeScalingParams(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, orig_max_position=8192),
        ),
        "yarn": YarnRotaryEmbedding(
            64, 4, 10000.0, 32, head_dim=16, interleaved=True,
            scaling_params=YarnScalingParams(factor=4.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=16, truncate=True),
        ),
        "longrope": LongRoPERotaryEmbedding(
            64, 4, 10000.0, 32, head_dim=16, interleaved=False,
            scaling_params=LongRoPEScalingParams(
                short_factor=[1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.5], long_factor=[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0],
                original_max_position=4, max_position_embeddings=64,
            ),
        ),
    }  # fmt: skip

    def forward(xv):
        outs = []
        for rope in cases.values():
            outs += [rope.freqs_cis, rope(xv), rope(xv, start_pos=3)]
        return outs

    g = Graph("rope", forward=forward, input_types=[TensorType(DType.float32, x.shape, DeviceRef.CPU())])
    res = [r.to_numpy() for r in InferenceSession().load(g).execute(x)]
    out = {"x": x}
    for i, name in enumerate(cases):
        out[f"{name}.freqs_cis"], out[f"{name}.out"], out[f"{name}.out_start3"] = res[3 * i : 3 * i + 3]
    out["longrope.scale"] = np.asarray(cases["longrope"].compute_scale())
    # DynamicRotaryEmbedding: the table grows to the positions asked for (48 > max_seq_len 16)
    dyn = DynamicRotaryEmbedding(64, 4, 10000.0, 16, head_dim=16, interleaved=True)

    def dyn_forward(pos):
        dyn.maybe_update_freqs(pos)
        return dyn.freqs_cis

    g = Graph("dyn", forward=dyn_forward, input_types=[TensorType(DType.int64, [48], DeviceRef.CPU())])
    out["dynamic.freqs_cis"] = InferenceSession().load(g).execute(np.arange(48, dtype=np.int64))[0].to_numpy()
    return out
