"""Name adapters on the real files: SmolLM2's GGUF and an HF-named llama checkpoint written from it
load into the same maxjax module with equal weights; the MiniLM BERT checkpoint loads as it is."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

from maxjax import nn
from maxjax._bundled import minilm_safetensors_path, smollm2_gguf_path
from maxjax.dtype import DType
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.weights import GGUFWeights, SafetensorWeights, WeightData
from maxjax.graph.weights.adapters import map_names, rename
from maxjax.models.bert import bert_from_hf
from maxjax.models.llama.weights import (
    LLAMA_GGUF_NAMES,
    llama_cpp_permute_rows_index,
    llama_from_gguf,
    llama_from_hf,
    unpermute_rows,
    unpermute_rows_index,
)

HIDDEN, FFN, N_HEAD, N_KV, VOCAB = 576, 1536, 9, 3, 49152
LAYERS = 2  # layers of SmolLM2 put in the HF-named test checkpoint


@pytest.fixture(scope="module")
def gguf_weights():
    return GGUFWeights(smollm2_gguf_path())


@pytest.fixture(scope="module")
def from_gguf(gguf_weights):
    return llama_from_gguf(gguf_weights)


def _hf_name(maxjax_name):
    return "model." + maxjax_name


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory, gguf_weights):
    """An HF-named llama safetensors with SmolLM2's first layers, written the way HF stores them:
    float32, Q/K rows in HF's order (the GGUF's rows with llama.cpp's permutation undone by the
    formula HF uses, applied here with NumPy on the dequantized matrices)."""
    tensors = {}
    head_dim = HIDDEN // N_HEAD
    for name, view in gguf_weights.items():
        if name.startswith("blk.") and int(name.split(".")[1]) >= LAYERS:
            continue
        target = rename(name, LLAMA_GGUF_NAMES)
        w = view.data().dequantize().to_numpy()
        if name.endswith("attn_q.weight"):
            w = w.reshape(N_HEAD, head_dim // 2, 2, HIDDEN).swapaxes(1, 2).reshape(HIDDEN, HIDDEN)
        if name.endswith("attn_k.weight"):
            w = w.reshape(N_KV, head_dim // 2, 2, HIDDEN).swapaxes(1, 2).reshape(N_KV * head_dim, HIDDEN)
        tensors[_hf_name(target)] = np.ascontiguousarray(w)
    path = tmp_path_factory.mktemp("hf") / "model.safetensors"
    save_file(tensors, str(path))
    return path


def test_gguf_names_map_to_maxjax_llama_names(from_gguf):
    expected = {"embed_tokens.weight", "norm.weight"}
    for i in range(30):
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm"):  # fmt: skip
            expected.add(f"layers.{i}.{part}.weight")
    assert set(from_gguf) == expected  # tied embeddings: no lm_head.weight
    for name, wd in from_gguf.items():
        assert wd.name == name
    q = from_gguf["layers.0.self_attn.q_proj.weight"]
    assert q.quantization_encoding is QuantizationEncoding.Q4_1 and q.shape == [576, 360]  # still packed


@pytest.mark.parametrize("layer", [0, 17, 29])
def test_row_permutation_on_packed_rows_equals_permuting_the_floats(gguf_weights, from_gguf, layer):
    head_dim = HIDDEN // N_HEAD
    for src, dst, heads in (("attn_q", "q_proj", N_HEAD), ("attn_k", "k_proj", N_KV)):
        raw = gguf_weights.blk[layer][src].weight.data().dequantize().to_numpy()
        rows = raw.shape[0]
        hf = raw.reshape(heads, head_dim // 2, 2, HIDDEN).swapaxes(1, 2).reshape(rows, HIDDEN)
        packed_then_dequantized = from_gguf[f"layers.{layer}.self_attn.{dst}.weight"].dequantize().to_numpy()
        np.testing.assert_array_equal(packed_then_dequantized, hf)
        assert not np.array_equal(hf, raw)  # the permutation is not the identity
    v = from_gguf[f"layers.{layer}.self_attn.v_proj.weight"].to_numpy()
    np.testing.assert_array_equal(v, gguf_weights.blk[layer].attn_v.weight.data().to_numpy())  # V untouched


def test_hf_and_gguf_checkpoints_give_equal_weights(hf_checkpoint, from_gguf):
    from_hf = llama_from_hf(SafetensorWeights([hf_checkpoint]))
    assert len(from_hf) == 2 + 9 * LAYERS
    for name, wd in from_hf.items():
        assert wd.dtype is DType.float32 and wd.quantization_encoding is None
        np.testing.assert_array_equal(wd.to_numpy(), from_gguf[name].dequantize().to_numpy(), err_msg=name)


class _Attention(nn.Module):
    def __init__(self, enc):
        super().__init__()
        head_dim = HIDDEN // N_HEAD
        self.q_proj = nn.Linear(HIDDEN, HIDDEN, DType.float32, quantization_encoding=enc)
        self.k_proj = nn.Linear(HIDDEN, N_KV * head_dim, DType.float32, quantization_encoding=enc)
        self.v_proj = nn.Linear(HIDDEN, N_KV * head_dim, DType.float32, quantization_encoding=enc)
        self.o_proj = nn.Linear(HIDDEN, HIDDEN, DType.float32, quantization_encoding=enc)


class _Block(nn.Module):
    def __init__(self, enc):
        super().__init__()
        self.self_attn = _Attention(enc)
        self.mlp = nn.MLP(DType.float32, enc, HIDDEN, FFN)
        self.input_layernorm = nn.RMSNorm(HIDDEN, DType.float32)
        self.post_attention_layernorm = nn.RMSNorm(HIDDEN, DType.float32)


class _Llama(nn.Module):
    """The weight layout of maxjax's llama (its forward pass is not needed here)."""

    def __init__(self, enc, embed_enc, layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN, DType.float32, quantization_encoding=embed_enc)
        self.layers = nn.LayerList([_Block(enc) for _ in range(layers)])
        self.norm = nn.RMSNorm(HIDDEN, DType.float32)


def test_both_checkpoints_load_into_the_same_module_layout(hf_checkpoint, from_gguf):
    keep = {k: v for k, v in from_gguf.items() if not k.startswith("layers.") or int(k.split(".")[1]) < LAYERS}
    quantized = _Llama(QuantizationEncoding.Q4_1, QuantizationEncoding.Q8_0, LAYERS)
    quantized.load_state_dict(keep)
    dense = _Llama(None, None, LAYERS)
    dense.load_state_dict(llama_from_hf(SafetensorWeights([hf_checkpoint])))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, HIDDEN)).astype(np.float32))
    for path in ("layers.1.self_attn.q_proj", "layers.0.mlp.down_proj"):
        q_mod, d_mod = quantized, dense
        for part in path.split("."):
            q_mod, d_mod = (q_mod[int(part)], d_mod[int(part)]) if part.isdigit() else (getattr(q_mod, part), getattr(d_mod, part))
        xin = x if path.endswith("q_proj") else jnp.asarray(np.random.default_rng(1).standard_normal((3, FFN)).astype(np.float32))
        np.testing.assert_allclose(np.asarray(q_mod(xin)), np.asarray(d_mod(xin)), rtol=2e-5, atol=2e-5)
    ids = jnp.asarray([[1, 2, 49151]], dtype=jnp.int32)
    np.testing.assert_allclose(np.asarray(quantized.embed_tokens(ids)), np.asarray(dense.embed_tokens(ids)), rtol=0, atol=0)


def test_unknown_names_are_an_error_not_a_half_load(gguf_weights):
    with pytest.raises(ValueError, match=r"1 tensor name\(s\) match no row .*'mystery.weight'"):
        map_names(["token_embd.weight", "mystery.weight"], LLAMA_GGUF_NAMES)
    assert rename("rope_freqs.weight", LLAMA_GGUF_NAMES) is None
    assert rename("blk.12.ffn_up.weight", LLAMA_GGUF_NAMES) == "layers.12.mlp.up_proj.weight"
    with pytest.raises(ValueError, match="cannot un-permute"):
        llama_from_gguf({"blk.0.attn_q.weight": gguf_weights.blk[0].attn_q.weight}, n_head=7, n_kv_head=3)


@settings(max_examples=30, deadline=None)
@given(n_head=st.integers(1, 8), half=st.integers(1, 8))
def test_unpermute_inverts_llama_cpp_permutation(n_head, half):
    rows = n_head * half * 2
    to_gguf = llama_cpp_permute_rows_index(rows, n_head)
    back = unpermute_rows_index(rows, n_head)
    assert np.array_equal(to_gguf[back], np.arange(rows))
    w = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    hf_formula = w.reshape(n_head, half, 2, 3).swapaxes(1, 2).reshape(rows, 3)
    np.testing.assert_array_equal(w[back], hf_formula)


def test_unpermute_rows_keeps_packed_metadata():
    w = np.arange(24 * 3, dtype=np.uint8).reshape(24, 3)
    wd = WeightData(w, "q", DType.uint8, (24, 3), QuantizationEncoding.Q8_0, (24, 96))
    out = unpermute_rows(wd, 3, "layers.0.self_attn.q_proj.weight")
    assert out.name == "layers.0.self_attn.q_proj.weight"
    assert out.quantization_encoding is QuantizationEncoding.Q8_0 and out.original_shape == [24, 96]
    np.testing.assert_array_equal(out.to_numpy(), w.reshape(3, 4, 2, 3).swapaxes(1, 2).reshape(24, 3))


def test_bert_adapter_is_the_identity_on_minilm():
    weights = SafetensorWeights([minilm_safetensors_path()])
    state = bert_from_hf(weights)
    reference = load_file(str(minilm_safetensors_path()))
    assert set(state) == set(reference) and len(state) == 104
    assert "embeddings.word_embeddings.weight" in state and "encoder.layer.5.output.dense.weight" in state
    for name, wd in state.items():
        assert tuple(int(d) for d in wd.shape) == reference[name].shape, name
        assert wd.dtype == DType.from_numpy(reference[name].dtype)
    np.testing.assert_array_equal(
        state["encoder.layer.3.attention.self.query.weight"].to_numpy(),
        reference["encoder.layer.3.attention.self.query.weight"],
    )
    assert set(bert_from_hf({"bert.pooler.dense.bias": state["pooler.dense.bias"]})) == {"pooler.dense.bias"}
