"""LoRA adapters and parameter filters: PEFT's names and initialization, frozen weights bit-identical
after training, merged weights equal to the adapted model, and the refusals (issue 15)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from maxjax import nn, train
from train_util import TINY, tiny_model, tokens

TARGETS = ["q_proj", "v_proj", "layers.*.mlp.down_proj"]


def _forward(model):
    return jax.jit(lambda s, t: nn.functional_call(model, s, t))


def test_lora_names_init_and_a_step_that_moves_only_the_adapters():
    model = tiny_model(0)
    toks = tokens(2, 17, seed=3)
    before = np.asarray(_forward(model)(nn.state(model), toks))
    base = {k: np.asarray(v) for k, v in nn.state(model).items()}
    paths = train.apply_lora(model, TARGETS, rank=4, alpha=8, key=jax.random.key(1))
    assert paths == [f"layers.{i}.{p}" for i in range(3) for p in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")]
    names = set(model.raw_state_dict())
    assert {"layers.0.self_attn.q_proj.weight", "layers.0.self_attn.q_proj.lora_A.weight", "layers.0.self_attn.q_proj.lora_B.weight"} <= names
    st = nn.state(model)
    assert st["layers.1.mlp.down_proj.lora_A.weight"].shape == (4, TINY.intermediate_size)
    assert st["layers.1.mlp.down_proj.lora_B.weight"].shape == (TINY.hidden_size, 4)
    assert float(jnp.abs(st["layers.0.self_attn.v_proj.lora_A.weight"]).max()) <= 1 / np.sqrt(TINY.hidden_size)
    assert not np.any(np.asarray(st["layers.0.self_attn.v_proj.lora_B.weight"]))  # B = 0: starts as the base
    np.testing.assert_array_equal(np.asarray(_forward(model)(st, toks)), before)
    assert train.lora_rank(model) == 4

    trainer = train.Trainer(model, optax.adamw(1e-2, weight_decay=0.1), trainable="*lora_*")
    assert all("lora_" in n for n in trainer.trainable_names) and len(trainer.trainable_names) == 18
    state = trainer.init()
    for i in range(3):
        state, metrics = trainer.step(state, tokens(2, 17, seed=10 + i))
    after = trainer.state_dict(state)
    for k, v in base.items():  # every frozen weight bit-identical
        np.testing.assert_array_equal(np.asarray(after[k]), v, err_msg=k)
    assert float(jnp.abs(after["layers.2.self_attn.q_proj.lora_B.weight"]).max()) > 0

    merged = train.merge_lora(model, after)
    assert set(merged) == set(base)
    plain = tiny_model(0)
    lora_logits = _forward(model)(after, toks)
    np.testing.assert_allclose(np.asarray(_forward(plain)(merged, toks)), np.asarray(lora_logits), rtol=1e-5, atol=1e-5)
    scale = 8 / 4
    a, b = after["layers.0.mlp.down_proj.lora_A.weight"], after["layers.0.mlp.down_proj.lora_B.weight"]
    np.testing.assert_allclose(np.asarray(merged["layers.0.mlp.down_proj.weight"]), base["layers.0.mlp.down_proj.weight"] + scale * np.asarray(b @ a), rtol=1e-6, atol=1e-6)


def test_filters_train_some_layers_of_a_stack_and_keep_the_rest_bit_identical():
    model = tiny_model(2)
    base = {k: np.asarray(v) for k, v in nn.state(model).items()}
    trainer = train.Trainer(model, optax.adam(1e-2), trainable=["layers.1.*", "norm.weight"])
    assert set(trainer.trainable_names) == {k for k in base if k.startswith("layers.1.")} | {"norm.weight"}
    state = trainer.init()
    state, _ = trainer.step(state, tokens(2, 9, seed=4))
    after = trainer.state_dict(state)
    for k, v in base.items():
        changed = not np.array_equal(np.asarray(after[k]), v)
        assert changed == (k.startswith("layers.1.") or k == "norm.weight"), k


def test_bad_targets_and_filters_are_one_line_errors_that_change_nothing():
    model = tiny_model(0)
    names = set(model.raw_state_dict())
    with pytest.raises(ValueError, match=r"^LoRA target 'layers\.0\.mlp' is a MLP, not a Linear$"):
        train.apply_lora(model, ["q_proj", "layers.0.mlp"], rank=2, alpha=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"^LoRA target 'qq_proj' matches no layer of LlamaForCausalLM$"):
        train.apply_lora(model, ["qq_proj"], rank=2, alpha=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"LoRA targets differ between the layers of 'layers': 'layers.0.self_attn.q_proj' is adapted, 'layers.1.self_attn.q_proj' is not"):
        train.apply_lora(model, ["layers.0.self_attn.q_proj"], rank=2, alpha=2, key=jax.random.key(0))
    with pytest.raises(ValueError, match="LoRA rank must be a positive integer"):
        train.apply_lora(model, ["q_proj"], rank=0, alpha=2, key=jax.random.key(0))
    assert set(model.raw_state_dict()) == names  # nothing was adapted
    with pytest.raises(ValueError, match=r"^trainable pattern '\*lora_\*' matches no weight of the \d+\. \(weights look like"):
        train.Trainer(model, optax.sgd(0.1), trainable="*lora_*")
    with pytest.raises(ValueError, match=r"^trainable pattern 'layers\.0\.self_atn\.q_proj\.weight' matches no weight .*Did you mean 'layers\.0\.self_attn\.q_proj\.weight'\?$"):
        train.split(nn.state(model), "layers.0.self_atn.q_proj.weight")


def _quantize_mlp_inputs(model):
    """gate_proj/up_proj of every layer as GGUF Q8_0 blocks (gguf's own quantizer), loaded packed."""
    import gguf

    from maxjax.dtype import DType
    from maxjax.graph.quantization import QuantizationEncoding
    from maxjax.graph.weights import WeightData

    values = {}
    for k, v in nn.state(model).items():
        if k.endswith(("gate_proj.weight", "up_proj.weight")):
            packed = gguf.quants.quantize(np.asarray(v), gguf.GGMLQuantizationType.Q8_0)
            values[k] = WeightData(packed, k, DType.uint8, packed.shape, QuantizationEncoding.Q8_0, v.shape)
    model.load_state_dict(values, strict=False, override_quantization_encoding=True)
    return values


def test_qlora_on_a_quantized_base_trains_the_adapters_and_refuses_the_packed_weights():
    model = tiny_model(5)
    packed = _quantize_mlp_inputs(model)
    with pytest.raises(ValueError, match=r"^trainable weight 'layers\.0\.mlp\.gate_proj\.weight' is Q8_0-quantized: it cannot be trained; make a float copy with maxjax\.train\.dequantized\(module\)"):
        train.Trainer(model, optax.sgd(0.1))
    train.apply_lora(model, ["gate_proj", "up_proj"], rank=2, alpha=4, key=jax.random.key(0))
    trainer = train.Trainer(model, optax.adam(3e-2), trainable="*lora_*", quantized_layout="unpacked")
    state = trainer.init()
    batch = tokens(4, 17, seed=6)
    losses = []
    for _ in range(4):
        state, m = trainer.step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < losses[0]
    merged = train.merge_lora(model, {**nn.state(model), **trainer.trained_weights(state)})
    w = merged["layers.0.mlp.gate_proj.weight"]
    assert w.dtype == jnp.float32 and w.shape == (TINY.intermediate_size, TINY.hidden_size)
    assert packed["layers.0.mlp.gate_proj.weight"].quantization_encoding.value == "Q8_0"


def test_the_fused_lora_op_has_the_gradients_of_the_two_linears():
    from maxjax.train.lora import LoRALinear

    model = tiny_model(1)
    train.apply_lora(model, ["up_proj", "o_proj"], rank=3, alpha=5, key=jax.random.key(2))
    st = nn.state(model)
    st = {k: (v + 0.01 if "lora_B" in k else v) for k, v in st.items()}
    toks = tokens(2, 9, seed=8)

    def grads():
        loss = lambda s: train.next_token_loss(nn.functional_call(model, s, toks[:, :-1]), toks)[0]  # noqa: E731
        return jax.jit(jax.grad(loss))(st)

    fused = grads()
    try:
        LoRALinear.fused = False
        plain = grads()
    finally:
        LoRALinear.fused = True
    for k in st:
        np.testing.assert_allclose(np.asarray(fused[k]), np.asarray(plain[k]), rtol=1e-4, atol=1e-6, err_msg=k)


def test_nn_init_of_an_adapted_model_keeps_the_adapters_at_zero():
    model = tiny_model(0)
    train.apply_lora(model, ["q_proj"], rank=2, alpha=2, key=jax.random.key(0))
    state = nn.init.initialize(model, jax.random.key(9))
    assert not np.any(np.asarray(state["layers.0.self_attn.q_proj.lora_B.weight"]))
    bound = 1 / np.sqrt(TINY.hidden_size)
    for k in ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.q_proj.lora_A.weight"):
        w = np.asarray(state[k])
        assert np.abs(w).max() <= bound and w.std() > bound / 3, k
