"""Interop: a Flax NNX module's state to maxjax names and back with the same outputs, and a Hugging
Face PyTorch state_dict saved as safetensors loaded into maxjax modules by name (issue 15)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from maxjax import nn
from maxjax.dtype import DType
from maxjax.graph.weights import load_weights
from maxjax.models.llama import build_llama, llama_from_hf, llama_to_hf
from maxjax.train.interop import from_maxjax, to_maxjax
from nnx_llama import Llama
from train_util import TINY, tokens


@pytest.mark.parametrize("scan", [False, True], ids=["list", "nnx.scan"])
def test_an_nnx_state_to_maxjax_names_and_back(scan):
    ref = Llama(TINY, nnx.Rngs(3), scan=scan)
    stacked = ("layers",) if scan else ()
    pure = nnx.state(ref, nnx.Param).to_pure_dict()
    model = build_llama(TINY)
    state = to_maxjax(pure, model, stacked=stacked)
    assert set(state) == set(model.raw_state_dict())
    assert state["layers.2.self_attn.q_proj.weight"].shape == (TINY.num_attention_heads * TINY.head_dim, TINY.hidden_size)
    model.load_state_dict(state)
    toks = jnp.asarray(tokens(2, 11, seed=2))
    expected = nnx.jit(lambda m, t: m(t))(ref, toks)
    got = jax.jit(lambda s, t: nn.functional_call(model, s, t))(nn.state(model), toks)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)
    back = from_maxjax(state, model, stacked=stacked)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(pure)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree.structure(back) == jax.tree.structure(pure)
    with pytest.raises(ValueError, match=r"stacked list 'blocks' is not a LayerList of LlamaForCausalLM"):
        to_maxjax(pure, model, stacked=("blocks",))


def test_a_hugging_face_state_dict_in_safetensors_loads_by_name(tmp_path):
    # what torch's LlamaForCausalLM.state_dict() holds, written with safetensors (torch is not
    # needed for the format; scripts/reference_train.py checks the same with torch itself)
    rng = np.random.default_rng(0)
    model = build_llama(TINY)
    hf = {k: (rng.standard_normal(w.shape) * 0.1).astype(np.float32) for k, w in llama_to_hf(model.raw_state_dict(), TINY).items()}
    assert "model.layers.0.self_attn.q_proj.weight" in hf and "lm_head.weight" in hf
    save_file(hf, str(tmp_path / "model.safetensors"))
    weights = load_weights([tmp_path / "model.safetensors"])
    model.load_state_dict(llama_from_hf(weights), weight_alignment=1)
    assert np.array_equal(np.asarray(nn.state(model)["layers.2.mlp.up_proj.weight"]), hf["model.layers.2.mlp.up_proj.weight"])
    # one layer alone: a torch nn.Linear's state_dict keys are maxjax Linear's
    lin = nn.Linear(TINY.hidden_size, 8, DType.float32, has_bias=True)
    sd = {"weight": rng.standard_normal((8, TINY.hidden_size)).astype(np.float32), "bias": rng.standard_normal(8).astype(np.float32)}
    save_file(sd, str(tmp_path / "linear.safetensors"))
    lin.load_state_dict({k: v.data() for k, v in load_weights([tmp_path / "linear.safetensors"]).items()}, weight_alignment=1)
    x = rng.standard_normal((3, TINY.hidden_size)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(lin(x)), x @ sd["weight"].T + sd["bias"], rtol=1e-5, atol=1e-5)
