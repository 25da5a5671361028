"""maxjax.nn's encoder pieces used alone (PostNormTransformerBlock, FeedForward) against a NumPy
BERT layer (Devlin et al., 2019) on all-MiniLM-L6-v2's layer-3 weights, in eager, functional
(jax.jit) and graph mode, with a padded row."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from scipy.special import erf

from maxjax import nn
from maxjax._bundled import minilm_safetensors_path
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType
from maxjax.graph.weights import SafetensorWeights

CPU = DeviceRef.CPU()
F32 = DType.float32
HIDDEN, HEADS, FFL, EPS = 384, 12, 1536, 1e-12
P = "encoder.layer.3."


@pytest.fixture(scope="module")
def hf() -> dict[str, np.ndarray]:
    w = SafetensorWeights([minilm_safetensors_path()])
    return {k[len(P) :]: np.asarray(v.data().to_numpy(), np.float32) for k, v in w.items() if k.startswith(P)}


def _block() -> nn.PostNormTransformerBlock:
    return nn.PostNormTransformerBlock(
        attention=nn.MultiheadAttention(HEADS, HIDDEN, [CPU], F32, qkv_has_bias=True, o_proj_has_bias=True),
        mlp=nn.FeedForward(F32, CPU, HIDDEN, FFL, "gelu"),
        attention_norm=nn.LayerNorm(HIDDEN, [CPU], F32, eps=EPS, use_bias=True),
        mlp_norm=nn.LayerNorm(HIDDEN, [CPU], F32, eps=EPS, use_bias=True),
    )


def _state(hf: dict) -> dict[str, np.ndarray]:
    names = {
        "attention.self.query": "attention.q_proj", "attention.self.key": "attention.k_proj",
        "attention.self.value": "attention.v_proj", "attention.output.dense": "attention.o_proj",
        "attention.output.LayerNorm": "attention_norm", "intermediate.dense": "mlp.up_proj",
        "output.dense": "mlp.down_proj", "output.LayerNorm": "mlp_norm",
    }  # fmt: skip
    return {f"{names[k.rsplit('.', 1)[0]]}.{k.rsplit('.', 1)[1]}": v for k, v in hf.items()}


def _numpy_bert_layer(hf: dict, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Hugging Face's BertLayer in NumPy (float64): x [b, s, 384], mask [b, s] -> [b, s, 384]."""
    x = x.astype(np.float64)
    lin = lambda v, n: v @ hf[f"{n}.weight"].T.astype(np.float64) + hf[f"{n}.bias"]  # noqa: E731

    def ln(v, n):
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + EPS) * hf[f"{n}.weight"] + hf[f"{n}.bias"]

    b, s, _ = x.shape
    heads = lambda v: v.reshape(b, s, HEADS, -1).transpose(0, 2, 1, 3)  # noqa: E731  [b, h, s, d]
    q, k, v = (heads(lin(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HIDDEN // HEADS) + np.where(mask[:, None, None, :] > 0, 0.0, -1e30)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)  # [b, h, s, s]
    attn = (p @ v).transpose(0, 2, 1, 3).reshape(b, s, HIDDEN)
    h = ln(x + lin(attn, "attention.output.dense"), "attention.output.LayerNorm")
    up = lin(h, "intermediate.dense")
    ffn = lin(0.5 * up * (1 + erf(up / np.sqrt(2))), "output.dense")  # exact (erf) GELU
    return ln(h + ffn, "output.LayerNorm")


def test_post_norm_block_is_a_bert_layer_in_three_modes(hf):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, HIDDEN)).astype(np.float32)
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)  # row 1: 3 padding tokens
    want = _numpy_bert_layer(hf, x, mask)
    block = _block()
    assert sorted(block.state_dict()) == sorted(_state(hf))  # every weight named, nothing left over
    block.load_state_dict(_state(hf))
    keep = mask[..., None] > 0  # padded positions' outputs are not defined by BERT
    tol = dict(rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(np.where(keep, np.asarray(block(x, mask)), 0), np.where(keep, want, 0), **tol)
    f = jax.jit(lambda s, v, m: nn.functional_call(block, s, v, m))
    np.testing.assert_allclose(np.where(keep, np.asarray(f(nn.state(block), x, mask)), 0), np.where(keep, want, 0), **tol)
    g = Graph("post_norm", forward=block, input_types=[TensorType(F32, x.shape, CPU), TensorType(DType.int32, mask.shape, CPU)])
    out = InferenceSession().load(g, weights_registry=block.state_dict()).execute(x, mask)[0].to_numpy()
    np.testing.assert_allclose(np.where(keep, out, 0), np.where(keep, want, 0), **tol)
    # the padded row's real tokens do not see its padding: the same as the row cut to 4 tokens
    alone = np.asarray(block(x[1:, :4], mask[1:, :4]))
    np.testing.assert_allclose(alone[0], np.asarray(block(x, mask))[1, :4], rtol=1e-5, atol=1e-5)


def test_feed_forward_alone_and_its_errors(hf):
    ff = nn.FeedForward(F32, CPU, HIDDEN, FFL, "gelu_tanh", has_bias=False)
    assert sorted(ff.state_dict()) == ["down_proj.weight", "up_proj.weight"]
    ff.load_state_dict({"up_proj.weight": hf["intermediate.dense.weight"], "down_proj.weight": hf["output.dense.weight"]})
    x = np.random.default_rng(1).standard_normal((3, HIDDEN)).astype(np.float32)
    up = x.astype(np.float64) @ hf["intermediate.dense.weight"].T
    gelu_tanh = 0.5 * up * (1 + np.tanh(np.sqrt(2 / np.pi) * (up + 0.044715 * up**3)))
    np.testing.assert_allclose(np.asarray(ff(x)), gelu_tanh @ hf["output.dense.weight"].T, rtol=2e-4, atol=2e-4)
    with pytest.raises(ValueError, match=r"Unrecognized activation function name \(swish\)"):
        nn.FeedForward(F32, CPU, HIDDEN, FFL, "swish")
