"""Initializers: a module's weights from a key, per layer as PyTorch and Flax do (issue 15)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.graph import Weight
from train_util import TINY, tiny_model


def test_pytorch_and_flax_styles_give_each_layer_its_framework_default():
    model = tiny_model(0)
    st = {k: np.asarray(v) for k, v in nn.state(model).items()}
    fan_in = TINY.hidden_size
    up = st["layers.0.mlp.up_proj.weight"]  # torch: U(-1/sqrt(in), 1/sqrt(in)), std bound/sqrt(3)
    assert np.abs(up).max() <= 1 / np.sqrt(fan_in) and up.std() == pytest.approx(1 / np.sqrt(3 * fan_in), rel=0.1)
    assert st["embed_tokens.weight"].std() == pytest.approx(1.0, rel=0.1)  # torch.nn.Embedding: N(0, 1)
    assert np.all(st["norm.weight"] == 1) and np.all(st["layers.2.input_layernorm.weight"] == 1)
    flax = nn.init.init_state(model, jax.random.key(0), style="flax")
    k = np.asarray(flax["layers.0.mlp.up_proj.weight"])  # lecun_normal on the [in, out] kernel: std 1/sqrt(in)
    assert k.shape == (TINY.intermediate_size, TINY.hidden_size)
    assert k.std() == pytest.approx(1 / np.sqrt(fan_in), rel=0.15) and np.abs(k).max() <= 2 / np.sqrt(fan_in) / 0.87962566
    e = np.asarray(flax["embed_tokens.weight"])  # nnx.Embed's variance_scaling(1, fan_in, normal, out_axis=0)
    ref = jax.nn.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)(jax.random.key(1), e.shape)
    assert e.std() == pytest.approx(float(np.asarray(ref).std()), rel=0.1)


def test_values_depend_on_the_key_and_the_name_only():
    a = nn.init.init_state(tiny_model(0), jax.random.key(3))
    b = nn.init.init_state(tiny_model(1), jax.random.key(3))
    c = nn.init.init_state(tiny_model(0), jax.random.key(4))
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
    assert not np.array_equal(np.asarray(a["lm_head.weight"]), np.asarray(c["lm_head.weight"]))
    assert not np.array_equal(np.asarray(a["layers.0.mlp.up_proj.weight"]), np.asarray(a["layers.1.mlp.up_proj.weight"]))


def test_layers_without_an_initializer_and_quantized_weights_are_refused():
    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = Weight("scale", DType.float32, (4,))

        def __call__(self, x):
            return x * self.scale

    with pytest.raises(ValueError, match=r"^no initializer for Custom \(weights 'scale'\): add one with maxjax\.nn\.init\.register_initializer\(Custom, fn\)$"):
        nn.init.initialize(Custom(), jax.random.key(0))
    with pytest.raises(ValueError, match="init style must be one of 'pytorch', 'flax'"):
        nn.init.init_state(Custom(), jax.random.key(0), style="keras")
    nn.init.register_initializer(Custom, lambda m, key, style: {m.scale: jax.random.uniform(key, (4,))})
    assert nn.init.initialize(Custom(), jax.random.key(0))["scale"].shape == (4,)
