"""Export: trained weights as a Hugging Face directory (safetensors, config.json, tokenizer files)
that maxjax loads back (``load_model``, ``maxjax generate --model DIR``) with the same logits (issue 15)."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from maxjax import nn, train
from maxjax.dtype import DType
from maxjax.models import load_model
from maxjax.train.export import save_pretrained
from train_util import TINY, tiny_model


def test_a_trained_lora_model_exports_with_hugging_face_names_and_loads_back(tmp_path):
    lm = load_model()
    model = train.dequantized(lm.module)
    train.apply_lora(model, ["q_proj", "v_proj"], rank=2, alpha=4, key=jax.random.key(0))
    st = nn.state(model)
    st["layers.3.self_attn.v_proj.lora_B.weight"] = st["layers.3.self_attn.v_proj.lora_B.weight"] + 0.05  # "trained"
    merged = train.merge_lora(model, st)
    out = tmp_path / "smollm2-docs"
    with pytest.raises(ValueError, match=r"'layers\.0\.self_attn\.q_proj\.lora_A\.weight' is not a weight of a Hugging Face LlamaForCausalLM \(merge LoRA adapters first\)"):
        save_pretrained(out, model, st, lm.config, lm.tokenizer)
    assert not out.exists()
    save_pretrained(out, model, merged, lm.config, lm.tokenizer)
    files = set(os.listdir(out))
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= files
    tensors = load_file(str(out / "model.safetensors"))
    assert "model.layers.29.mlp.down_proj.weight" in tensors and "lm_head.weight" not in tensors  # tied, as HF
    assert len(tensors) == len(merged) and not any("lora" in k for k in tensors)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    back = load_model(out)
    ids = lm.encode_prompt("The os module provides")
    toks = np.asarray([ids], np.int32)
    _, logits, _, _ = back.prefill(toks, [len(ids)], *back.new_cache(1, 64))
    expected = jax.jit(lambda s, t: nn.functional_call(model, s, t))(st, toks)[:, -1]
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), rtol=2e-4, atol=2e-4)
    assert back.encode_prompt("hi", chat=True) == lm.encode_prompt("hi", chat=True)
    assert back.tokenizer.eos_token_ids == lm.tokenizer.eos_token_ids
    save_pretrained(out, model, merged, lm.config, lm.tokenizer)  # an earlier export is replaced


def test_export_refuses_a_folder_that_is_not_an_export(tmp_path):
    model = tiny_model(0)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"exists and is not an earlier maxjax export: not overwriting it$"):
        save_pretrained(tmp_path, model, nn.state(model), TINY)
    assert os.listdir(tmp_path) == ["notes.txt"]
    out = save_pretrained(tmp_path / "tiny", model, nn.state(model), TINY, dtype=DType.bfloat16)
    t = load_file(os.path.join(out, "model.safetensors"))
    assert "lm_head.weight" in t and str(t["lm_head.weight"].dtype) == "bfloat16"
