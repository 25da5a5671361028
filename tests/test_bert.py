"""The BERT sentence encoder (all-MiniLM-L6-v2) against sentence-transformers on torch.

Reference: ``tests/data/minilm_reference.npz`` written by ``scripts/reference_minilm.py`` (token
ids of each sentence tokenized alone, and ``SentenceTransformer.encode`` embeddings).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax._bundled import minilm_dir, minilm_safetensors_path
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import Graph, TensorType
from maxjax.graph.weights import SafetensorWeights
from maxjax.models import load_encoder
from maxjax.models.bert import BertConfig, EncoderTokenizer, SentenceHead, bert_module_from_hf, build_bert, length_buckets

REF = np.load(Path(__file__).parent / "data" / "minilm_reference.npz")
SENTENCES = [str(s) for s in REF["sentences"]]


def _ref_ids(i: int) -> list[int]:
    return REF["input_ids"][i, : REF["lengths"][i]].tolist()


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


@pytest.fixture(scope="module")
def encoder():
    return load_encoder()


@pytest.fixture(scope="module")
def embedded(encoder):
    """Every reference sentence embedded in one padded batch ([32 rows, 256 tokens])."""
    return encoder.embed(SENTENCES, batch_size=32)


def test_config_and_head_come_from_the_model_files():
    cfg = BertConfig.from_hf_config(json.loads((minilm_dir() / "config.json").read_text()))
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size) == (6, 384, 12, 1536)
    head = SentenceHead.from_dir(minilm_dir(), cfg)
    assert head == SentenceHead("mean", True, 256) and int(REF["max_seq_length"]) == 256
    assert length_buckets(256) == (16, 24, 32, 40, 48, 56, 64, 96, 128, 192, 256)
    assert length_buckets(48) == (16, 24, 32, 40, 48) and length_buckets(512)[-4:] == (192, 256, 384, 512)
    assert length_buckets(32, 1, between=False) == (1, 2, 4, 8, 16, 32)


def test_token_ids_identical_to_sentence_transformers():
    tok = EncoderTokenizer(minilm_dir() / "tokenizer.json", 256)
    ids = tok.encode_batch(SENTENCES)
    for i, row in enumerate(ids):
        assert row == _ref_ids(i), SENTENCES[i][:40]
    assert max(len(r) for r in ids) == 256  # the long sentences are truncated at max_seq_length


def test_embeddings_match_sentence_transformers(embedded):
    emb = embedded
    assert emb.shape == (len(SENTENCES), 384) and emb.dtype == np.float32
    cos = _cosine(emb, REF["embeddings"])
    assert cos.min() >= 0.99999, (cos.argmin(), cos.min())
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)  # modules.json has Normalize


def test_padding_invariance(encoder, embedded):
    """A sentence alone (one row of 16 tokens) and inside the padded batch of every sentence (32
    rows of 256 tokens); sentences of other lengths in the same bucket do not compile again."""
    batch = embedded
    compiles = encoder.num_compiles
    for i in (0, 1, 7):  # 4, 12 and 3 tokens: one [1, 16] bucket
        alone = encoder.embed([SENTENCES[i]], batch_size=1)[0]
        np.testing.assert_allclose(batch[i], alone, atol=1e-6, rtol=0)
    assert encoder.num_compiles - compiles <= 1


def test_functional_and_eager_modes_match_the_reference(encoder):
    module = encoder.module
    rows = [0, 1, 4, 13]  # 4 to 16 tokens: [4, 16]
    ids, mask = encoder.pad([_ref_ids(i) for i in rows])
    ref = REF["embeddings"][rows]
    state = nn.state(module)
    functional = jax.jit(lambda s, i, m: nn.functional_call(module, s, i, m))(state, ids, mask)
    eager = module(ids, mask)
    for out in (functional, eager):
        assert _cosine(np.asarray(out), ref).min() >= 0.99999
    np.testing.assert_allclose(np.asarray(eager), np.asarray(functional), atol=1e-6)


def test_graph_mode_with_inference_session(encoder):
    module = encoder.module
    types = [TensorType(DType.int32, ["batch", "seq"]), TensorType(DType.int32, ["batch", "seq"])]
    g = Graph("bert", forward=module, input_types=types)
    model = InferenceSession().load(g, weights_registry=module.state_dict())
    ids, mask = encoder.pad([_ref_ids(2), _ref_ids(3)])
    out = model.execute(ids, mask)[0].to_numpy()
    assert _cosine(out, REF["embeddings"][[2, 3]]).min() >= 0.99999
    chains = encoder.program.chains  # the six layers: one subgraph called six times, lowered to one lax.scan
    assert [(c.sub.name, len(c.nodes)) for c in chains] == [("bert_layer", 6)]


def test_weights_load_by_hugging_face_names(encoder):
    from safetensors.numpy import load_file

    reference = load_file(str(minilm_safetensors_path()))
    state = bert_module_from_hf(SafetensorWeights([minilm_safetensors_path()]))
    assert set(state) == set(encoder.module.raw_state_dict()) and len(state) == 6 * 16 + 5
    np.testing.assert_array_equal(
        state["encoder.layer.3.attention.q_proj.weight"].to_numpy(), reference["encoder.layer.3.attention.self.query.weight"]
    )
    np.testing.assert_array_equal(
        state["encoder.layer.5.mlp_norm.bias"].to_numpy(), reference["encoder.layer.5.output.LayerNorm.bias"]
    )
    prefixed = bert_module_from_hf({"bert.embeddings.LayerNorm.weight": state["embeddings.layer_norm.weight"]})
    assert set(prefixed) == {"embeddings.layer_norm.weight"}  # BertForXxx's "bert." prefix
    with pytest.raises(ValueError, match="model.layers.0.mlp.up_proj.weight"):
        bert_module_from_hf({"model.layers.0.mlp.up_proj.weight": state["embeddings.layer_norm.weight"]})


def test_bad_weight_shape_names_the_weight(encoder):
    state = {k: v.to_numpy() for k, v in bert_module_from_hf(SafetensorWeights([minilm_safetensors_path()])).items()}
    state["encoder.layer.2.mlp.up_proj.weight"] = state["encoder.layer.2.mlp.up_proj.weight"][:, :100]
    fresh = build_bert(encoder.config, encoder.head)
    with pytest.raises(ValueError, match=r"encoder\.layer\.2\.mlp\.up_proj\.weight"):
        fresh.load_state_dict(state)


def test_bad_input_errors(encoder, tmp_path):
    with pytest.raises(ValueError, match="empty list"):
        encoder.embed([])
    with pytest.raises(ValueError, match=r"texts\[1\] is an empty string"):
        encoder.embed(["fine", ""])
    with pytest.raises(ValueError, match=r"texts\[0\] must be a string"):
        encoder.embed([3])
    with pytest.raises(ValueError, match="batch_size"):
        encoder.embed(["a"], batch_size=0)
    no_tok = tmp_path / "no_tokenizer"
    no_tok.mkdir()
    for f in ("config.json", "modules.json", "sentence_bert_config.json", "model.safetensors"):
        (no_tok / f).symlink_to(minilm_dir() / f)
    shutil.copytree(minilm_dir() / "1_Pooling", no_tok / "1_Pooling")
    with pytest.raises(ValueError, match=r"no_tokenizer/tokenizer\.json: no tokenizer\.json"):
        load_encoder(no_tok)
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    with pytest.raises(ValueError, match=r"llama/config\.json: \['LlamaForCausalLM'\] is not a sentence-encoder architecture"):
        load_encoder(other)
    with pytest.raises(ValueError, match="no config.json"):
        load_encoder(tmp_path)
