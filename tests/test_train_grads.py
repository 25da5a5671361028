"""Gradients of the training paths (functional mode, the scanned Program of the Trainer) against
finite differences and against a Flax NNX Llama holding the same weights (issue 15, Correctness)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from maxjax import nn, train
from maxjax.train.interop import from_maxjax, to_maxjax
from nnx_llama import Llama
from train_util import TINY, tiny_model, tokens


def _loss_of_logits(logits, toks):
    return optax.softmax_cross_entropy_with_integer_labels(logits, toks[:, 1:]).mean()


def _nnx_with(model_state, module, scan):
    ref = Llama(TINY, nnx.Rngs(1), scan=scan)
    params = nnx.state(ref, nnx.Param)
    nnx.replace_by_pure_dict(params, from_maxjax(model_state, module, stacked=("layers",) if scan else ()))
    nnx.update(ref, params)
    return ref


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(0)
    state = nn.state(model)
    toks = tokens(2, 13, seed=1)
    return model, state, toks


def test_every_position_logits_match_nnx_and_the_serving_path(setup):
    model, state, toks = setup
    forward = jax.jit(lambda s, t: nn.functional_call(model, s, t, return_hidden_states=True))
    logits, hidden = (np.asarray(a) for a in forward(state, toks))
    assert logits.shape == (2, 13, TINY.vocab_size) and logits.dtype == np.float32
    assert hidden.shape == (2, 13, TINY.hidden_size)  # after the final norm: what the head reads
    np.testing.assert_allclose(hidden @ np.asarray(state["lm_head.weight"]).T, logits, rtol=1e-4, atol=1e-4)
    for scan in (False, True):
        ref = _nnx_with(state, model, scan)
        np.testing.assert_allclose(logits, np.asarray(nnx.jit(lambda m, t: m(t))(ref, jnp.asarray(toks))), rtol=1e-5, atol=1e-5)
    # the serving call (KV cache, last_index) scores the same positions; last_index=None: all of them
    b, s = toks.shape
    keys = jnp.zeros((TINY.num_hidden_layers, b, TINY.num_key_value_heads, TINY.head_dim, 16))
    values = jnp.zeros((TINY.num_hidden_layers, b, TINY.num_key_value_heads, 16, TINY.head_dim))
    pos = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s))
    serve = jax.jit(lambda st, *a: nn.functional_call(model, st, *a))
    last, _, _ = serve(state, toks, pos, keys, values, np.full(b, s - 1, np.int32))
    np.testing.assert_allclose(np.asarray(last), logits[:, -1], rtol=1e-5, atol=1e-5)
    every, _, _ = serve(state, toks, pos, keys, values)
    np.testing.assert_allclose(np.asarray(every), logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="pass tokens alone"):
        model(toks, pos)


def test_gradients_equal_flax_nnx_and_the_scanned_program(setup):
    model, state, toks = setup
    loss = lambda s: _loss_of_logits(nn.functional_call(model, s, toks[:, :-1]), toks)  # noqa: E731
    grads = jax.jit(jax.grad(loss))(state)
    assert set(grads) == set(state)
    for scan in (False, True):
        ref = _nnx_with(state, model, scan)
        g = nnx.jit(nnx.grad(lambda m: _loss_of_logits(m(jnp.asarray(toks[:, :-1])), toks)))(ref)
        expected = to_maxjax(nnx.state(g, nnx.Param).to_pure_dict(), model, stacked=("layers",) if scan else ())
        for k in state:
            np.testing.assert_allclose(np.asarray(grads[k]), np.asarray(expected[k]), rtol=2e-4, atol=2e-6, err_msg=k)
    # the Trainer's program: layers scanned, weights stacked; its gradients by registry name
    trainer = train.Trainer(model, optax.sgd(1.0))
    st = trainer.init()
    program_grads = jax.jit(jax.grad(lambda p: trainer._loss_fn(p, trainer.frozen, jnp.asarray(toks), None)[0]))(st.params)
    by_name = trainer.program.unstack(trainer._program_state(program_grads, {}))
    for k in state:
        np.testing.assert_allclose(np.asarray(by_name[k]), np.asarray(grads[k]), rtol=2e-4, atol=2e-6, err_msg=k)


def test_gradients_equal_finite_differences(setup):
    model, state, toks = setup
    loss = jax.jit(lambda s: _loss_of_logits(nn.functional_call(model, s, toks[:, :-1]), toks))
    grads = jax.grad(loss)(state)
    rng = np.random.default_rng(7)
    for k in ["embed_tokens.weight", "layers.1.self_attn.k_proj.weight", "layers.2.mlp.down_proj.weight", "norm.weight"]:
        direction = rng.standard_normal(state[k].shape).astype(np.float32)
        direction /= np.linalg.norm(direction)
        eps = 1e-2
        plus = {**state, k: state[k] + eps * direction}
        minus = {**state, k: state[k] - eps * direction}
        numeric = (float(loss(plus)) - float(loss(minus))) / (2 * eps)
        analytic = float(jnp.vdot(grads[k], direction))
        assert abs(numeric - analytic) <= 2e-3 * max(1.0, abs(analytic)), (k, numeric, analytic)


def test_grad_of_quantized_weights_is_refused_with_the_fix():
    from maxjax.models import load_model

    lm = load_model(arithmetic="float32")  # the file's values times float32 activations, as the float copy's
    with pytest.raises(TypeError, match=r"is a Q4_1-quantized weight .*maxjax\.train\.dequantized\(module\)"):
        train.grad(lambda s: 0.0)(lm.state)
    # the float copy trains: every weight is float32, named as before, same logits
    model = train.dequantized(lm.module)
    st = nn.state(model)
    assert set(st) == set(lm.module.raw_state_dict()) and all(v.dtype == jnp.float32 for v in st.values())
    train.check_differentiable(st)
    toks = np.asarray([lm.encode_prompt("def fibonacci(n):")], np.int32)
    _, last, _, _ = lm.prefill(toks, [toks.shape[1]], *lm.new_cache(1, 64))
    np.testing.assert_allclose(np.asarray(model(toks))[:, -1], np.asarray(last), rtol=1e-4, atol=1e-4)
    half = train.dequantized(lm.module, "bfloat16")
    assert {v.dtype for v in nn.state(half).values()} == {jnp.dtype(jnp.bfloat16)} and half.dtype.name == "bfloat16"
