"""maxjax's CPU kernel for whole-sequence causal attention (``maxjax.backend.kernels.attention``):
its outputs and gradients against XLA's formulation of the same op, what it refuses, and that a
CPU training program's layers use it (``BackendPolicy.attention_kernel``)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.backend import kernels, policy_for
from maxjax.backend.kernels.attention import causal_attention, takes
from maxjax.nn.attention.attention_with_rope import _self_causal_gqa

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"maxjax's CPU kernels cannot run here: {kernels.unavailable_reason()}")

XLA = dataclasses.replace(policy_for("cpu"), attention_kernel=False)


@pytest.mark.parametrize("b,s,h,kv,d", [(2, 9, 4, 2, 16), (1, 33, 6, 3, 32), (2, 128, 9, 3, 64), (1, 5, 2, 2, 16)])
def test_the_kernel_matches_xla_forward_and_backward(b, s, h, kv, d):
    rng = np.random.default_rng(s)
    q, k, v = (jnp.asarray(rng.standard_normal((b, s, n, d)), jnp.float32) for n in (h, kv, kv))
    ct = jnp.asarray(rng.standard_normal((b, s, h * d)), jnp.float32)
    scale = 1 / np.sqrt(d)

    def kernel(q, k, v):
        return causal_attention(q, k, v, scale).reshape(b, s, h * d)

    def xla(q, k, v):
        return _self_causal_gqa(q, k, v, None, scale=scale, policy=XLA)

    out, grads = jax.jit(lambda *a: (kernel(*a), jax.vjp(kernel, *a)[1](ct)))(q, k, v)
    ref, ref_grads = jax.jit(lambda *a: (xla(*a), jax.vjp(xla, *a)[1](ct)))(q, k, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-6)
    for g, r in zip(grads, ref_grads):  # dq, dk, dv (dk, dv summed over each KV head's query heads)
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=1e-5)


def test_the_kernel_refuses_what_it_does_not_take():
    q = jnp.zeros((1, 4, 2, 16), jnp.float32)
    assert takes(q, q, q)
    assert not takes(q.astype(jnp.bfloat16), q, q)  # float32 only
    assert not takes(jnp.zeros((1, 4, 2, 8)), jnp.zeros((1, 4, 2, 8)), jnp.zeros((1, 4, 2, 8)))  # head_dim 16, 32, ...
    assert not takes(jnp.zeros((1, 4, 3, 16)), q, q)  # 3 query heads over 2 KV heads
    with pytest.raises(ValueError, match="heads a multiple of kv_heads"):
        causal_attention(jnp.zeros((1, 4, 3, 16)), q, q, 0.25)


def test_a_cpu_training_program_attends_in_the_kernel_and_the_policy_can_turn_it_off():
    from maxjax.models.llama import LlamaConfig, build_llama
    from maxjax.nn import init

    cfg = LlamaConfig(
        vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    model = build_llama(cfg)
    init.initialize(model, jax.random.key(0))
    toks = np.random.default_rng(0).integers(0, 50, (2, 12)).astype(np.int32)
    from maxjax.engine import Program
    from maxjax.graph import Graph, TensorType
    from maxjax.dtype import DType

    graph = Graph("whole", forward=model, input_types=[TensorType(DType.int32, ["batch", "seq"])])
    outs = {}
    for name, policy in (("kernel", policy_for("cpu")), ("xla", XLA)):
        prog = Program(graph, policy=policy)
        state = prog.prepare(model.state_dict())
        text = jax.jit(prog.apply).lower(state, toks).as_text()
        assert ("maxjax_causal_attention" in text) == (name == "kernel")
        outs[name] = np.asarray(jax.jit(prog.apply)(state, toks)[0])
    np.testing.assert_allclose(outs["kernel"], outs["xla"], atol=2e-5)
