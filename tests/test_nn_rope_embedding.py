"""MAX 26.7's rotary embeddings against MAX's own numbers (tests/data/max_reference/rope.npz), in
graph, functional and eager mode; maxjax's ``rotate`` against MAX's table rows."""

from __future__ import annotations

import inspect

import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType
from max_reference import load

REF = load("rope")


def _cases():
    return {
        "plain_inter": nn.RotaryEmbedding(64, 4, 10000.0, 32, head_dim=16, interleaved=True),
        "plain_halves": nn.RotaryEmbedding(64, 4, 500000.0, 32, head_dim=16, interleaved=False),
        "llama3": nn.Llama3RotaryEmbedding(
            64, 4, 500000.0, 32, head_dim=16, interleaved=False,
            scaling_params=nn.Llama3RopeScalingParams(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, orig_max_position=8192),
        ),
        "yarn": nn.YarnRotaryEmbedding(
            64, 4, 10000.0, 32, head_dim=16, interleaved=True,
            scaling_params=nn.YarnScalingParams(factor=4.0, beta_fast=32.0, beta_slow=1.0, original_max_position_embeddings=16, truncate=True),
        ),
        "longrope": nn.LongRoPERotaryEmbedding(
            64, 4, 10000.0, 32, head_dim=16, interleaved=False,
            scaling_params=nn.LongRoPEScalingParams(
                short_factor=[1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.5], long_factor=[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0],
                original_max_position=4, max_position_embeddings=64,
            ),
        ),
    }  # fmt: skip


NAMES = ["plain_inter", "plain_halves", "llama3", "yarn", "longrope"]


@pytest.mark.parametrize("name", NAMES)
def test_freqs_cis_and_outputs_match_max_in_three_modes(name):
    rope = _cases()[name]
    x = REF["x"]
    np.testing.assert_allclose(np.asarray(rope.freqs_cis), REF[f"{name}.freqs_cis"], rtol=1e-6, atol=1e-6)
    # eager
    np.testing.assert_allclose(np.asarray(rope(x)), REF[f"{name}.out"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(rope(x, start_pos=3)), REF[f"{name}.out_start3"], rtol=1e-5, atol=1e-5)
    # functional
    out = jax.jit(lambda v: nn.functional_call(rope, {}, v))(x)
    np.testing.assert_allclose(np.asarray(out), REF[f"{name}.out"], rtol=1e-5, atol=1e-5)
    # graph
    g = Graph("rope", forward=lambda v: rope(v, start_pos=3), input_types=[TensorType(DType.float32, x.shape, DeviceRef.CPU())])
    got = InferenceSession().load(g).execute(x)[0].to_numpy()
    np.testing.assert_allclose(got, REF[f"{name}.out_start3"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_rotate_at_positions_equals_maxs_table_rows(name):
    """maxjax's rotate (angles on the fly, any positions) against MAX's __call__ at those
    positions: a padded batch whose rows start at different positions."""
    rope = _cases()[name]
    x = REF["x"]  # [2, 5, 4, 16]
    positions = np.array([np.arange(5), np.arange(3, 8)], np.int32)
    got = np.asarray(rope.rotate(x, positions))
    np.testing.assert_allclose(got[0], REF[f"{name}.out"][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], REF[f"{name}.out_start3"][1], rtol=1e-5, atol=1e-5)


def test_signatures_and_types_are_maxs():
    assert list(inspect.signature(nn.RotaryEmbedding).parameters) == [
        "dim", "n_heads", "theta", "max_seq_len", "head_dim", "_freqs_cis", "interleaved"
    ]  # fmt: skip
    assert inspect.signature(nn.RotaryEmbedding).parameters["interleaved"].default is True
    assert list(inspect.signature(nn.Llama3RotaryEmbedding).parameters)[-1] == "scaling_params"
    assert [f for f in nn.Llama3RopeScalingParams.__dataclass_fields__] == [
        "factor", "low_freq_factor", "high_freq_factor", "orig_max_position"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="head_dim must be even"):
        nn.RotaryEmbedding(63, 7, 1e4, 16)


def test_longrope_attention_scale_is_maxs():
    np.testing.assert_allclose(_cases()["longrope"].compute_scale(), float(REF["longrope.scale"]), rtol=1e-7)


def test_dynamic_rope_grows_its_table_as_max_does():
    dyn = nn.DynamicRotaryEmbedding(64, 4, 10000.0, 16, head_dim=16, interleaved=True)
    assert np.asarray(dyn.freqs_cis).shape == (32, 16)
    dyn.maybe_update_freqs(np.arange(48))
    np.testing.assert_allclose(np.asarray(dyn.freqs_cis), REF["dynamic.freqs_cis"], rtol=1e-6, atol=1e-6)
    dyn.maybe_update_freqs(np.arange(8))  # shorter than the original length: back to it
    assert dyn.max_seq_len_cached == 16 and np.asarray(dyn.freqs_cis).shape == (32, 16)
