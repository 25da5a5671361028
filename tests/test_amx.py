"""The AMX float32 product (four bfloat16 passes, maxjax/backend/kernels/amx.cc) against float64 numpy, and its
place in the backend policy (``precision=HIGH`` on the CPU, the encoders' ``encoder_precision``).

The kernel's tests run only on a CPU with AMX-BF16 (Sapphire Rapids and later Xeons); the policy's
choices are checked on any machine from feature sets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from maxjax.backend import policy_for
from maxjax.backend.kernels import amx
from maxjax.backend.policy import cpu_policy

needs_amx = pytest.mark.skipif(not amx.available(), reason=f"AMX bf16x3 kernel unavailable: {amx.unavailable_reason()}")

# x is split exactly into three bfloat16 parts and w into two (w_hi + w_lo: 16 of float32's 24 bits),
# so each product's error relative to |x| |w| is at most about 2^-16
BOUND = 2.0**-15


def _rel_err(out: np.ndarray, x: np.ndarray, w: np.ndarray) -> float:
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = x64 @ w64.T
    scale = np.abs(x64) @ np.abs(w64).T
    return float((np.abs(out.astype(np.float64) - ref) / scale).max())


@needs_amx
@pytest.mark.parametrize("m,k,n", [(1, 32, 32), (5, 64, 96), (33, 384, 384), (100, 1536, 384), (257, 384, 1536), (64, 2048, 64)])
def test_matches_float64_within_the_bf16x3_bound(m, k, n):
    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * np.exp(rng.standard_normal((n, 1)))).astype(np.float32)  # rows of different scales
    out = np.asarray(jax.jit(amx.matmul_t)(x, w))
    assert out.shape == (m, n) and out.dtype == np.float32
    err = _rel_err(out, x, w)
    assert err < BOUND, err
    assert err > 0  # not the float32 product: the kernel really ran (XLA's float32 product is exact to 2^-24)


@needs_amx
def test_rows_are_independent_and_leading_axes_kept():
    """A row's result is the same bits alone, in a batch, and in a batch whose row count is not a
    multiple of the 32-row blocks (the padded block)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 35, 384)).astype(np.float32)
    w = rng.standard_normal((96, 384)).astype(np.float32)
    f = jax.jit(amx.matmul_t)
    batch = np.asarray(f(x, w))
    assert batch.shape == (2, 35, 96)
    for b, r in ((0, 0), (0, 34), (1, 17)):
        np.testing.assert_array_equal(np.asarray(f(x[b, r : r + 1], w))[0], batch[b, r])


@needs_amx
def test_gradients_are_the_float32_products():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((40, 64)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((32, 64)), jnp.float32)
    t = jnp.asarray(rng.standard_normal((40, 32)), jnp.float32)

    def loss(f):
        return lambda x, w: jnp.sum(f(x, w) * t)

    exact = lambda x, w: lax.dot_general(x, w, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST)  # noqa: E731
    gx, gw = jax.grad(loss(amx.matmul_t), argnums=(0, 1))(x, w)
    ex, ew = jax.grad(loss(exact), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(gx, ex, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, ew, rtol=1e-5, atol=1e-5)


def test_supports_only_float32_multiples_of_32():
    x = jnp.zeros((3, 64), jnp.float32)
    assert amx.supports(x, jnp.zeros((32, 64), jnp.float32))
    assert not amx.supports(x, jnp.zeros((48, 64), jnp.float32))  # N
    assert not amx.supports(jnp.zeros((3, 48)), jnp.zeros((32, 48), jnp.float32))  # K
    assert not amx.supports(x.astype(jnp.bfloat16), jnp.zeros((32, 64), jnp.bfloat16))
    assert not amx.supports(x, jnp.zeros((2, 32, 64), jnp.float32))  # a stack


def test_policy_precision_for_encoders_by_cpu():
    spr = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"})
    zen4 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"})
    assert cpu_policy(spr).encoder_precision == lax.Precision.HIGH
    assert cpu_policy(zen4).encoder_precision == lax.Precision.HIGHEST
    assert cpu_policy(spr).precision == lax.Precision.HIGHEST  # other programs stay exact


@needs_amx
def test_a_laid_out_weight_gives_the_bits_of_the_per_call_layout():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((3, 50, 384)), jnp.float32)
    w = rng.standard_normal((1536, 384)).astype(np.float32)
    laid = amx.lay_out(w)
    assert isinstance(laid, amx.AmxWeight) and laid.shape == (1536, 384) and laid.tiles.shape == (96, 384, 32)
    f = jax.jit(amx.matmul_t)
    np.testing.assert_array_equal(f(x, laid), f(x, jnp.asarray(w)))
    with pytest.raises(ValueError, match=r"float32\[48, 384\]"):
        amx.lay_out(np.zeros((48, 384), np.float32))
    with pytest.raises(ValueError, match="cannot multiply"):
        amx.matmul_t(jnp.zeros((2, 64), jnp.float32), laid)


@needs_amx
def test_encoder_at_high_precision_meets_the_reference_and_padding_invariance(monkeypatch):
    """all-MiniLM-L6-v2 with its Linear products in the kernel: cosine to sentence-transformers'
    embeddings at least 0.99999 (issue 25's bar), and a sentence alone and inside a padded batch
    equal to 1e-6."""
    import dataclasses

    import maxjax.models.bert.encoder as encoder_module
    from maxjax.models import load_encoder
    from pathlib import Path

    ref = np.load(Path(__file__).parent / "data" / "minilm_reference.npz")  # scripts/reference_minilm.py
    sentences = [str(t) for t in ref["sentences"]]

    high = dataclasses.replace(policy_for("cpu"), encoder_precision=lax.Precision.HIGH)
    monkeypatch.setattr(encoder_module, "policy_for", lambda: high)
    enc = load_encoder()
    layers = enc.state["stacked"][0]  # one scanned chain, one buffer per layer on the CPU
    for name in ("attention.o_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"):  # only multiplied as stored
        assert all(isinstance(a, amx.AmxWeight) for a in layers[name].layers), name
    for name in ("attention.q_proj.weight", "mlp.up_proj.bias"):  # q/k/v are concatenated first; a bias is added
        assert not any(isinstance(a, amx.AmxWeight) for a in jax.tree.leaves(layers[name], is_leaf=lambda a: isinstance(a, amx.AmxWeight))), name
    assert "maxjax_bf16x3_matmul" in enc.apply.lower(enc.state, *enc.pad([[101, 102]])).as_text()
    emb = enc.embed(sentences, batch_size=32)
    cos = (emb * ref["embeddings"]).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref["embeddings"], axis=1)
    assert cos.min() >= 0.99999, (cos.argmin(), cos.min())
    for i in (0, 1, 7):
        np.testing.assert_allclose(emb[i], enc.embed([sentences[i]], batch_size=1)[0], atol=1e-6, rtol=0)


def _uses_kernel(policy, x, w) -> bool:
    return "maxjax_bf16x3_matmul" in str(jax.jit(lambda x, w: policy.matmul_t(x, w, stored=True)).lower(x, w).as_text())


def test_policy_runs_the_kernel_only_at_high_precision_and_where_it_takes_the_shapes():
    import dataclasses

    base = policy_for("cpu")
    high = dataclasses.replace(base, precision=lax.Precision.HIGH)
    x, w = jnp.ones((4, 64), jnp.float32), jnp.ones((32, 64), jnp.float32)
    assert not _uses_kernel(base, x, w)
    assert _uses_kernel(high, x, w) == amx.available()
    assert not _uses_kernel(high, jnp.ones((4, 48)), jnp.ones((32, 48)))  # K not a multiple of 32: XLA, exact
    np.testing.assert_array_equal(high.matmul_t(jnp.ones((4, 48)), jnp.ones((32, 48)), stored=True), np.full((4, 32), 48.0))


# -- training: frozen weights laid out with their transposes (the policy's frozen_precision) --------
@needs_amx
def test_the_cotangent_through_a_laid_out_weight_runs_in_the_kernel():
    """``x``'s cotangent through ``lay_out(w, transposed=True)`` is the kernel's ``g @ (w.T).T``
    (bit for bit the per-call product of ``g`` and ``w.T``), within the bf16x3 bound of float64;
    the weight gets none, and a weight laid out without its transpose refuses to be differentiated."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((70, 96)), jnp.float32)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    g = rng.standard_normal((70, 64)).astype(np.float32)
    laid = amx.lay_out(w, transposed=True)
    assert laid.tiles_t.shape == (6, 64, 32) and laid.nbytes == 2 * w.nbytes
    dx = np.asarray(jax.jit(jax.grad(lambda x: (amx.matmul_t(x, laid) * g).sum()))(x))
    np.testing.assert_array_equal(dx, np.asarray(jax.jit(amx.matmul_t)(jnp.asarray(g), jnp.asarray(np.ascontiguousarray(w.T)))))
    err = _rel_err(dx, g, np.ascontiguousarray(w.T))
    assert 0 < err < BOUND, err
    with pytest.raises(ValueError, match="without its transpose"):
        jax.grad(lambda x: amx.matmul_t(x, amx.lay_out(w)).sum())(x)


@needs_amx
def test_a_laid_out_stack_multiplies_each_layer_in_place_in_a_scan():
    """A stack ``[L, N, K]`` laid out whole gives each scan step its layer (``at_layer``), read in
    place: the bits of that layer laid out alone, forward and cotangent; a stack multiplied without
    a layer, or asked to keep its array, is refused."""
    rng = np.random.default_rng(5)
    stack = rng.standard_normal((3, 64, 96)).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((2, 10, 96)), jnp.float32)
    laid = amx.lay_out(stack, transposed=True)
    assert laid.layers == 3 and laid.tiles.shape == (3, 4, 96, 32) and laid.tiles_t.shape == (3, 6, 64, 32)

    def f(x, laid):
        def body(h, layer):  # h [2, 10, 96]; each layer: [2, 10, 64] -> sum back to [2, 10, 96] via its transpose
            y = amx.matmul_t(h, laid.at_layer(layer))
            return h + 0.01 * jnp.tanh(y).sum(-1, keepdims=True), y
        return jax.lax.scan(body, x, jnp.arange(3, dtype=jnp.int32))

    (_, ys) = jax.jit(f)(x, laid)
    h = x
    for i in range(3):
        one = amx.lay_out(stack[i])
        y = amx.matmul_t(h, one)
        np.testing.assert_array_equal(np.asarray(ys[i]), np.asarray(y))
        h = h + 0.01 * jnp.tanh(y).sum(-1, keepdims=True)
    alone = [amx.lay_out(stack[i], transposed=True) for i in range(3)]

    def unrolled(x):
        h, total = x, 0.0
        for one in alone:
            y = amx.matmul_t(h, one)
            h, total = h + 0.01 * jnp.tanh(y).sum(-1, keepdims=True), total + y.sum()
        return total

    g_scan = np.asarray(jax.jit(jax.grad(lambda x: f(x, laid)[1].sum()))(x))
    np.testing.assert_allclose(g_scan, np.asarray(jax.jit(jax.grad(unrolled))(x)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="one layer at a time"):
        amx.matmul_t(x, laid)
    with pytest.raises(ValueError, match="not a stack"):
        amx.lay_out(stack[0]).at_layer(0)
    with pytest.raises(ValueError, match="keeps one weight's array"):
        amx.lay_out(stack, keep=True)


@needs_amx
def test_a_kept_array_serves_the_other_uses():
    from maxjax.graph.layer_weights import materialize

    w = np.random.default_rng(6).standard_normal((64, 32)).astype(np.float32)
    kept = amx.lay_out(w, keep=True)
    np.testing.assert_array_equal(np.asarray(materialize(kept)), w)
    with pytest.raises(ValueError, match="keeps no float32 array"):
        materialize(amx.lay_out(w))


def test_policy_frozen_precision_by_cpu():
    spr = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"})
    zen4 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"})
    assert cpu_policy(spr).frozen_precision == lax.Precision.HIGH
    assert cpu_policy(zen4).frozen_precision == lax.Precision.HIGHEST
    assert policy_for("gpu").frozen_precision is None and policy_for("tpu").frozen_precision is None


@needs_amx
@pytest.mark.parametrize("m", [5, 64, 70])
def test_a_bfloat16_weight_multiplies_in_one_pass_as_xla_does(m):
    """A bfloat16 weight laid out (tiles ``[N / 16, K / 2, 32]``) multiplies bfloat16 ``x`` in one
    pass with float32 sums, rounded to bfloat16: XLA's bfloat16 dot with float32 accumulation, to
    one bfloat16 rounding step (the order of the float32 sums differs); ``x``'s cotangent likewise;
    the tiles give the weight back bit for bit."""
    rng = np.random.default_rng(m)
    x = jnp.asarray(rng.standard_normal((m, 1536)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((96, 1536)), jnp.bfloat16)
    g = jnp.asarray(rng.standard_normal((m, 96)), jnp.bfloat16)
    laid = amx.lay_out(w, transposed=True)
    assert laid.bfloat16 and laid.tiles.shape == (6, 768, 32) and laid.tiles_t.shape == (96, 48, 32)
    np.testing.assert_array_equal(np.asarray(laid.weight()).view(np.uint16), np.asarray(w).view(np.uint16))
    y, vjp = jax.vjp(lambda x: amx.matmul_t(x, laid), x)
    (dx,) = vjp(g)
    assert y.dtype == dx.dtype == jnp.bfloat16 and y.shape == (m, 96) and dx.shape == (m, 1536)
    f32 = jnp.float32
    ref_y = lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=f32)
    ref_dx = lax.dot_general(g, w, (((1,), (0,)), ((), ())), preferred_element_type=f32)
    for got, ref in ((y, ref_y), (dx, ref_dx)):
        err = np.abs(np.asarray(got, np.float32) - np.asarray(ref))
        assert (err <= np.abs(np.asarray(ref)) * 2.0**-7 + 1e-6).all()  # within one rounding to bfloat16
        assert (np.asarray(got) == np.asarray(ref.astype(jnp.bfloat16))).mean() > 0.95
    stack = jnp.stack([w, -w])
    laid_stack = amx.lay_out(stack)
    np.testing.assert_array_equal(np.asarray(laid_stack.weight()).view(np.uint16), np.asarray(stack).view(np.uint16))
    with pytest.raises(ValueError, match="cannot multiply"):
        amx.matmul_t(x.astype(jnp.float32), laid)


def _lora_trainer(policy, compute_dtype="float32"):
    """A float32 tiny Llama with tied embeddings (every matrix a multiple of 32) and rank-4 LoRA on
    all its projections, in a Trainer: (module, trainer)."""
    import optax

    from maxjax import nn, train
    from maxjax.models.llama import LlamaConfig, build_llama

    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # fmt: skip
    model = build_llama(config)
    nn.init.initialize(model, jax.random.key(0))
    train.apply_lora(model, LORA_TARGETS, rank=4, alpha=8, key=jax.random.key(1))
    return model, train.Trainer(model, optax.adam(1e-2), trainable="*lora_*", policy=policy, compute_dtype=compute_dtype)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LAID_OUT = ["embed_tokens.weight"] + sorted(f"layers.*.{'self_attn' if t[0] in 'qkvo' else 'mlp'}.{t}.weight" for t in LORA_TARGETS)


@needs_amx
def test_a_lora_trainer_multiplies_its_frozen_weights_in_the_kernel():
    """A float32 LoRA Trainer on an AMX CPU lays out the frozen base layers (stacks, read in place
    by the scan) and the tied embedding (its array kept for the gather) with their transposes; its
    losses and adapters follow the exact-float32 Trainer's to the bf16x3 class of error, and its
    state_dict gives the frozen weights back exactly."""
    import dataclasses

    cpu = policy_for("cpu")
    model, fast = _lora_trainer(cpu)
    _, exact = _lora_trainer(dataclasses.replace(cpu, frozen_precision=lax.Precision.HIGHEST))
    assert exact.laid_out == []
    assert sorted(fast.laid_out) == LAID_OUT
    assert fast.frozen["embed_tokens.weight"].array is not None
    assert fast.frozen["layers.*.mlp.up_proj.weight"].layers == 2 and fast.frozen["layers.*.mlp.up_proj.weight"].array is None
    batch = np.random.default_rng(0).integers(0, 64, (4, 17)).astype(np.int32)
    s_fast, s_exact = fast.init(), exact.init()
    logits_fast = np.asarray(fast.logits(s_fast.params, fast.frozen, batch[:, :-1]))
    logits_exact = np.asarray(exact.logits(s_exact.params, exact.frozen, batch[:, :-1]))
    diff = np.abs(logits_fast - logits_exact).max() / np.abs(logits_exact).max()
    assert 0 < diff < 1e-4, diff  # the kernel ran, to its class of error
    losses = []
    for _ in range(3):
        s_fast, m_fast = fast.step(s_fast, batch)
        s_exact, m_exact = exact.step(s_exact, batch)
        losses.append((float(m_fast["loss"]), float(m_exact["loss"])))
    for a, b in losses:
        assert a == pytest.approx(b, rel=1e-4)
    assert losses[-1][0] < losses[0][0]
    for k in s_exact.params:
        np.testing.assert_allclose(np.asarray(s_fast.params[k]), np.asarray(s_exact.params[k]), rtol=1e-3, atol=1e-4)
    full, ref = fast.state_dict(s_fast), exact.state_dict(s_exact)
    held = model.state_dict()
    for n in ("embed_tokens.weight", "layers.1.mlp.down_proj.weight", "layers.0.self_attn.q_proj.weight"):
        np.testing.assert_array_equal(np.asarray(full[n]), np.asarray(ref[n]))
        np.testing.assert_array_equal(np.asarray(full[n]), np.asarray(held[n]))
    assert sorted(full) == sorted(ref)


@needs_amx
def test_a_bfloat16_lora_trainer_multiplies_its_frozen_weights_in_one_pass():
    """A bfloat16 LoRA Trainer on an AMX CPU lays out its frozen bfloat16 weights (in place of their
    bits) and follows the Trainer that multiplies them in XLA (same arithmetic, other order of the
    float32 sums); its state_dict gives them back bit for bit."""
    import dataclasses

    cpu = policy_for("cpu")
    assert cpu.bfloat16_frozen_kernel and not policy_for("gpu").bfloat16_frozen_kernel
    _, fast = _lora_trainer(cpu, "bfloat16")
    _, xla = _lora_trainer(dataclasses.replace(cpu, bfloat16_frozen_kernel=False), "bfloat16")
    assert sorted(fast.laid_out) == LAID_OUT and xla.laid_out == []
    assert all(fast.frozen[e].bfloat16 for e in LAID_OUT)
    batch = np.random.default_rng(1).integers(0, 64, (4, 17)).astype(np.int32)
    s_fast, s_xla = fast.init(), xla.init()
    for _ in range(3):
        s_fast, m_fast = fast.step(s_fast, batch)
        s_xla, m_xla = xla.step(s_xla, batch)
        assert float(m_fast["loss"]) == pytest.approx(float(m_xla["loss"]), rel=2e-3)
    for k in s_xla.params:
        np.testing.assert_allclose(np.asarray(s_fast.params[k]), np.asarray(s_xla.params[k]), rtol=0, atol=2e-3, err_msg=k)
    got, want = fast.state_dict(s_fast), xla.state_dict(s_xla)
    assert sorted(got) == sorted(want)
    for n in ("embed_tokens.weight", "layers.1.mlp.down_proj.weight", "layers.0.self_attn.k_proj.weight"):
        assert got[n].dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got[n]).view(np.uint16), np.asarray(want[n]).view(np.uint16))
