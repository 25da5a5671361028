"""MAX's MultiheadAttention against NumPy attention (MAX 26.7 runs it only with its GPU flash
attention kernel, so MAX's numbers cannot be had on CPU), in three modes; padding invariance of
maxjax's attention_mask extension; MAX's names and refusals."""

from __future__ import annotations

import inspect

import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType
from maxjax.nn.attention import MHAMaskVariant

CPU = DeviceRef.CPU()


def _numpy_mha(x, sd, heads, causal=False, valid=None):
    b, s, e = x.shape
    d = e // heads
    proj = lambda n: (x @ sd[f"{n}.weight"].T + sd.get(f"{n}.bias", 0)).reshape(b, s, heads, d)  # noqa: E731
    q, k, v = proj("q_proj"), proj("k_proj"), proj("v_proj")
    sc = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
    if causal:
        sc = np.where(np.tril(np.ones((s, s))) > 0, sc, -np.inf)
    if valid is not None:
        sc = np.where(valid[:, None, None, :], sc, -np.inf)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, e)
    return out @ sd["o_proj.weight"].T + sd.get("o_proj.bias", 0)


@pytest.fixture()
def mha():
    m = nn.MultiheadAttention(4, 32, devices=[CPU], qkv_has_bias=True, o_proj_has_bias=True)
    rng = np.random.default_rng(0)
    sd = {k: (rng.standard_normal(v.shape) * 0.3).astype(np.float32) for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    return m, sd


def test_names_and_signature_are_maxs(mha):
    m, sd = mha
    assert sorted(sd) == sorted(f"{p}.{w}" for p in ("q_proj", "k_proj", "v_proj", "o_proj") for w in ("weight", "bias"))
    assert list(inspect.signature(nn.MultiheadAttention).parameters) == [
        "num_attention_heads", "hidden_size", "devices", "dtype", "scale", "qkv_has_bias", "o_proj_has_bias", "stacked_qkv"
    ]  # fmt: skip
    stacked = nn.MultiheadAttention(4, 32, stacked_qkv=True)
    assert sorted(stacked.state_dict()) == ["o_proj.weight", "qkv_proj.weight"]


@pytest.mark.parametrize("causal", [False, True])
def test_matches_numpy_in_three_modes(mha, causal):
    m, sd = mha
    x = np.random.default_rng(1).standard_normal((2, 5, 32)).astype(np.float32)
    variant = MHAMaskVariant.CAUSAL_MASK if causal else MHAMaskVariant.NULL_MASK
    want = _numpy_mha(x.astype(np.float64), sd, 4, causal)
    np.testing.assert_allclose(np.asarray(m(x, mask_variant=variant)), want, atol=2e-5)
    f = jax.jit(lambda s, v: nn.functional_call(m, s, v, mask_variant=variant))
    np.testing.assert_allclose(np.asarray(f(nn.state(m), x)), want, atol=2e-5)
    g = Graph("mha", forward=lambda v: m(v, mask_variant=variant), input_types=[TensorType(DType.float32, ["b", 5, 32], CPU)])
    got = InferenceSession().load(g, weights_registry=m.state_dict()).execute(x)[0].to_numpy()
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_attention_mask_makes_padding_invisible(mha):
    m, sd = mha
    rng = np.random.default_rng(2)
    alone = rng.standard_normal((1, 3, 32)).astype(np.float32)
    batch = np.concatenate([np.pad(alone, ((0, 0), (0, 2), (0, 0))), rng.standard_normal((1, 5, 32)).astype(np.float32)])
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    out = np.asarray(m(batch, attention_mask=valid))
    np.testing.assert_allclose(out[0, :3], np.asarray(m(alone))[0], atol=1e-6)
    np.testing.assert_allclose(out, _numpy_mha(batch.astype(np.float64), sd, 4, valid=valid), atol=2e-5)


def test_refusals():
    with pytest.raises(ValueError, match=r"hidden_size \(30\) must be divisible by num_attention_heads \(4\)"):
        nn.MultiheadAttention(4, 30)
    with pytest.raises(NotImplementedError, match="place it with Module.to"):
        nn.MultiheadAttention(4, 32, devices=[CPU, DeviceRef.CPU(1)])
    with pytest.raises(NotImplementedError, match="mask_variant"):
        nn.MultiheadAttention(4, 32)(np.zeros((1, 2, 32), np.float32), mask_variant=MHAMaskVariant.CHUNKED_CAUSAL_MASK)
