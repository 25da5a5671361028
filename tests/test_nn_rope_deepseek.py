"""``DeepseekYarnRotaryEmbedding`` and ``DeepseekYarnRopeScalingParams`` (MAX 26.7's
``max.nn.rotary_embedding``) against MAX's own table and outputs (``scripts/max_reference/moe.py``),
in graph, functional (jit) and eager mode."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import numpy as np
import pytest
from max_reference import load

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType
from maxjax.nn.rotary_embedding import DeepseekYarnRopeScalingParams, DeepseekYarnRotaryEmbedding

REF = load("moe")
PARAMS = DeepseekYarnRopeScalingParams(
    scaling_factor=40.0, original_max_position_embeddings=8, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.707
)  # the configuration of scripts/max_reference/moe.py


def _rope():
    return DeepseekYarnRotaryEmbedding(16, 4, 10000.0, 32, head_dim=16, interleaved=True, scaling_params=PARAMS)


def test_table_and_outputs_match_max_in_three_modes():
    rope, x = _rope(), REF["xr"]
    assert np.asarray(rope.freqs_cis).shape == (32, 16)  # max_seq_len positions, not twice
    np.testing.assert_allclose(np.asarray(rope.freqs_cis), REF["deepseek_yarn.freqs_cis"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(rope(x)), REF["deepseek_yarn.out"], rtol=1e-5, atol=1e-5)
    out = jax.jit(lambda v: nn.functional_call(rope, {}, v, start_pos=3))(x)
    np.testing.assert_allclose(np.asarray(out), REF["deepseek_yarn.out_start3"], rtol=1e-5, atol=1e-5)
    g = Graph("rope", forward=lambda v: rope(v, start_pos=3), input_types=[TensorType(DType.float32, x.shape, DeviceRef.CPU())])
    got = InferenceSession().load(g).execute(x)[0].to_numpy()
    np.testing.assert_allclose(got, REF["deepseek_yarn.out_start3"], rtol=1e-5, atol=1e-5)
    positions = np.array([np.arange(5), np.arange(3, 8)], np.int32)  # maxjax's rotate: the same angles
    got = np.asarray(rope.rotate(x, positions))
    np.testing.assert_allclose(got[1], REF["deepseek_yarn.out_start3"][1], rtol=1e-5, atol=1e-5)


def test_scale_signature_fields_and_errors_are_maxs():
    assert _rope().compute_scale() == pytest.approx(float(REF["deepseek_yarn.scale"]), rel=1e-12)
    sig = [p.name for p in inspect.signature(DeepseekYarnRotaryEmbedding).parameters.values()]
    assert sig == ["dim", "n_heads", "theta", "max_seq_len", "head_dim", "_freqs_cis", "interleaved", "scaling_params"]
    assert str(REF["sig.DeepseekYarnRopeScalingParams"]).startswith(
        "(scaling_factor: float, original_max_position_embeddings: int, beta_fast: int, beta_slow: int, mscale: float, mscale_all_dim: float)"
    )
    assert [f.name for f in dataclasses.fields(DeepseekYarnRopeScalingParams)] == [
        "scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
    ]  # fmt: skip
    bare = DeepseekYarnRotaryEmbedding(16, 4, 10000.0, 32, head_dim=16)
    with pytest.raises(ValueError, match="scaling_params must be provided"):
        bare.freqs_cis  # noqa: B018
    with pytest.raises(AssertionError):
        bare.compute_scale()
