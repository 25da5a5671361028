"""Decoder layers (rope, GQA attention with KV cache, Transformer) against a NumPy Llama, in all modes."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import Program
from maxjax.graph import DeviceRef, Graph, TensorType, TensorValue
from maxjax.models.llama import LlamaConfig, build_llama

CFG = LlamaConfig(
    vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
    tie_word_embeddings=True,
)  # fmt: skip
CACHE = 16


def _rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + CFG.rms_norm_eps) * w


def _rope(x, pos):
    d = CFG.head_dim
    inv = 1.0 / (CFG.rope_theta ** (np.arange(0, d, 2) / d))
    ang = pos[..., None] * inv
    c, s = np.cos(ang)[..., None, :], np.sin(ang)[..., None, :]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)


def reference_logits(sd, toks):
    """Full-sequence Llama forward in NumPy (float64), no cache: logits of every position."""
    b, t = toks.shape
    h, kv, d = CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim
    x = sd["embed_tokens.weight"][toks].astype(np.float64)
    pos = np.broadcast_to(np.arange(t), (b, t))
    for i in range(CFG.num_hidden_layers):
        p = f"layers.{i}."
        y = _rms(x, sd[p + "input_layernorm.weight"])
        q = _rope((y @ sd[p + "self_attn.q_proj.weight"].T).reshape(b, t, h, d), pos)
        k = _rope((y @ sd[p + "self_attn.k_proj.weight"].T).reshape(b, t, kv, d), pos)
        v = (y @ sd[p + "self_attn.v_proj.weight"].T).reshape(b, t, kv, d)
        k, v = np.repeat(k, h // kv, axis=2), np.repeat(v, h // kv, axis=2)
        s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        s = np.where(np.tril(np.ones((t, t))) > 0, s, -np.inf)
        pr = np.exp(s - s.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        x = x + np.einsum("bhqk,bkhd->bqhd", pr, v).reshape(b, t, h * d) @ sd[p + "self_attn.o_proj.weight"].T
        y = _rms(x, sd[p + "post_attention_layernorm.weight"])
        g, u = y @ sd[p + "mlp.gate_proj.weight"].T, y @ sd[p + "mlp.up_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ sd[p + "mlp.down_proj.weight"].T
    return _rms(x, sd["norm.weight"]) @ sd["embed_tokens.weight"].T


@pytest.fixture(scope="module")
def model():
    m = build_llama(CFG)
    rng = np.random.default_rng(0)
    sd = {k: (rng.standard_normal(v.shape) * 0.2).astype(np.float32) for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    return m, sd


def _types(batch="batch", cache_len=CACHE):
    keys = [CFG.num_hidden_layers, batch, CFG.num_key_value_heads, CFG.head_dim, cache_len]
    values = [CFG.num_hidden_layers, batch, CFG.num_key_value_heads, cache_len, CFG.head_dim]
    return [
        TensorType(DType.int32, [batch, "seq"]),
        TensorType(DType.int32, [batch, "seq"]),
        TensorType(DType.float32, keys),
        TensorType(DType.float32, values),
        TensorType(DType.int32, [batch]),
    ]


def _caches(b, cache_len=CACHE):
    """Zero keys ``[layers, b, kv, head_dim, cache_len]`` and values ``[layers, b, kv, cache_len, head_dim]``."""
    n, kv, d = CFG.num_hidden_layers, CFG.num_key_value_heads, CFG.head_dim
    return np.zeros((n, b, kv, d, cache_len), np.float32), np.zeros((n, b, kv, cache_len, d), np.float32)


def test_tied_weights_and_names(model):
    m, sd = model
    assert "lm_head.weight" not in sd and "embed_tokens.weight" in sd
    assert "layers.2.self_attn.k_proj.weight" in sd and sd["layers.2.self_attn.k_proj.weight"].shape == (16, 32)
    assert m.lm_head.weight is m.embed_tokens.weight


def test_prefill_then_decode_matches_full_forward_in_graph_eager_and_jit(model):
    m, sd = model
    rng = np.random.default_rng(1)
    toks = rng.integers(0, CFG.vocab_size, (2, 7)).astype(np.int32)
    ref = reference_logits(sd, toks)
    prompt, last = toks[:, :6], np.array([5, 5], np.int32)
    pos = np.broadcast_to(np.arange(6, dtype=np.int32), (2, 6))
    prog = Program(Graph("llama", forward=m, input_types=_types()))
    assert len(prog.chains) == 1 and len(prog.chains[0].nodes) == 3
    state = prog.prepare(m.state_dict())
    run = jax.jit(prog.apply)
    logits, kc, vc = run(state, prompt, pos, *_caches(2), last)
    np.testing.assert_allclose(np.asarray(logits), ref[:, 5], atol=2e-5)
    logits2, _, _ = run(state, toks[:, 6:], np.full((2, 1), 6, np.int32), kc, vc, np.zeros(2, np.int32))
    np.testing.assert_allclose(np.asarray(logits2), ref[:, 6], atol=2e-5)
    eager, _, _ = m(prompt, pos, *_caches(2), last)
    np.testing.assert_allclose(np.asarray(eager), ref[:, 5], atol=2e-5)
    functional, _, _ = jax.jit(lambda s, *a: nn.functional_call(m, s, *a))(nn.state(m), prompt, pos, *_caches(2), last)
    np.testing.assert_allclose(np.asarray(functional), ref[:, 5], atol=2e-5)


def test_right_padded_rows_of_different_lengths(model):
    m, sd = model
    rng = np.random.default_rng(2)
    a = rng.integers(0, CFG.vocab_size, (1, 6)).astype(np.int32)
    b = rng.integers(0, CFG.vocab_size, (1, 3)).astype(np.int32)
    padded = np.concatenate([a, np.concatenate([b, np.zeros((1, 3), np.int32)], 1)])
    pos = np.broadcast_to(np.arange(6, dtype=np.int32), (2, 6))
    prog = Program(Graph("llama", forward=m, input_types=_types()))
    state = prog.prepare(m.state_dict())
    logits, kc, vc = jax.jit(prog.apply)(state, padded, pos, *_caches(2), np.array([5, 2], np.int32))
    np.testing.assert_allclose(np.asarray(logits)[0], reference_logits(sd, a)[0, -1], atol=2e-5)
    np.testing.assert_allclose(np.asarray(logits)[1], reference_logits(sd, b)[0, -1], atol=2e-5)
    # decode a token for each row at its own position: row 1 overwrites its padding
    nxt = np.array([[7], [9]], np.int32)
    l2, _, _ = jax.jit(prog.apply)(state, nxt, np.array([[6], [3]], np.int32), kc, vc, np.zeros(2, np.int32))
    np.testing.assert_allclose(np.asarray(l2)[0], reference_logits(sd, np.concatenate([a, nxt[:1]], 1))[0, -1], atol=2e-5)
    np.testing.assert_allclose(np.asarray(l2)[1], reference_logits(sd, np.concatenate([b, nxt[1:]], 1))[0, -1], atol=2e-5)


@pytest.mark.parametrize("prompt_len", [5, 70, 130])
def test_prefill_and_batched_decode_in_a_long_cache(model, prompt_len):
    """In a 200-position cache (key windows 64, 128 and 200) filled to a depth in each window,
    prefill and a batched decode step (grouped query heads) give the logits of a full forward pass."""
    from maxjax.nn.attention import _windows

    assert _windows(200) == (64, 128, 200) and _windows(64) == (64,) and _windows(16) == (16,)
    m, sd = model
    toks = np.random.default_rng(3).integers(0, CFG.vocab_size, (2, prompt_len + 1)).astype(np.int32)
    ref = reference_logits(sd, toks)
    prog = Program(Graph("llama", forward=m, input_types=_types(cache_len=200)))
    state = prog.prepare(m.state_dict())
    run = jax.jit(prog.apply)
    pos = np.broadcast_to(np.arange(prompt_len, dtype=np.int32), (2, prompt_len))
    last = np.full(2, prompt_len - 1, np.int32)
    logits, kc, vc = run(state, toks[:, :prompt_len], pos, *_caches(2, 200), last)
    np.testing.assert_allclose(np.asarray(logits), ref[:, prompt_len - 1], atol=3e-5)
    step = np.full((2, 1), prompt_len, np.int32)
    logits, _, _ = run(state, toks[:, prompt_len:], step, kc, vc, np.zeros(2, np.int32))
    np.testing.assert_allclose(np.asarray(logits), ref[:, prompt_len], atol=3e-5)


def test_rotary_embedding_interleaved_equals_permuted_halves():
    rope = nn.RotaryEmbedding(32, 4, 10000.0, 64, head_dim=8, interleaved=False)
    inter = nn.RotaryEmbedding(32, 4, 10000.0, 64, head_dim=8, interleaved=True)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 5, 4, 8)).astype(np.float32)
    pos = np.arange(5, dtype=np.int32)[None]
    perm = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])  # interleaved -> halves
    out_h = np.asarray(rope.rotate(TensorValue(x[..., perm]), TensorValue(pos)).to_numpy())
    out_i = np.asarray(inter.rotate(TensorValue(x), TensorValue(pos)).to_numpy())
    np.testing.assert_allclose(out_i[..., perm], out_h, atol=1e-6)
    np.testing.assert_allclose(out_h, _rope(x[..., perm], pos), atol=1e-5)


def test_attention_rejects_bad_head_counts():
    from maxjax.nn.kv_cache import MHAKVCacheParams

    kv_params = MHAKVCacheParams(DType.float32, 64, 1, [DeviceRef.CPU()], n_kv_heads=2)
    with pytest.raises(ValueError, match=r"num_attention_heads \(9\) must be a multiple of num_key_value_heads \(2\)"):
        nn.AttentionWithRope(
            rope=nn.RotaryEmbedding(576, 9, 1e4, 64), num_attention_heads=9, num_key_value_heads=2, hidden_size=576,
            kv_params=kv_params, devices=[DeviceRef.CPU()],
        )  # fmt: skip


def test_config_from_gguf_metadata_rejects_other_architectures():
    with pytest.raises(ValueError, match=r"unsupported architecture 'gpt2' \(supported: llama\)"):
        LlamaConfig.from_gguf_metadata({"general.architecture": "gpt2"}, False, "x.gguf")
    with pytest.raises(ValueError, match="x.gguf: GGUF metadata has no 'llama.embedding_length'"):
        LlamaConfig.from_gguf_metadata({"general.architecture": "llama"}, False, "x.gguf")


def test_config_refuses_rope_scaling_it_does_not_implement():
    meta = {"general.architecture": "llama", "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    with pytest.raises(ValueError, match="rope scaling 'linear' is not supported"):
        LlamaConfig.from_gguf_metadata(meta, False, "x.gguf")
    with pytest.raises(ValueError, match="rope_scaling .* is not supported"):
        LlamaConfig.from_hf_config({"architectures": ["LlamaForCausalLM"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})


@pytest.mark.parametrize("platform", ["cpu", "gpu"])  # both attention layouts (repeat_kv and grouped)
def test_a_fully_masked_row_gives_finite_values(platform):
    """A query that sees no key (position -1: an empty slot of a continuous batch) must not give NaN,
    and must leave the other rows as they were."""
    import jax

    from maxjax.backend import policy_for
    from maxjax.nn.attention import _causal_gqa

    rng = np.random.default_rng(4)
    b, s, h, kv, d, n = 3, 1, 6, 2, 8, 64
    q = rng.standard_normal((b, s, h, d)).astype(np.float32)
    k = rng.standard_normal((1, b, kv, d, n)).astype(np.float32)
    v = rng.standard_normal((1, b, kv, n, d)).astype(np.float32)
    positions = np.array([[5], [-1], [9]], np.int32)
    f = jax.jit(lambda *a: _causal_gqa(*a, scale=0.3, policy=policy_for(platform)))
    out = np.asarray(f(q, k, v, np.int32(0), positions))
    assert np.isfinite(out).all()
    alone = np.asarray(f(q[[0, 2]], k[:, [0, 2]], v[:, [0, 2]], np.int32(0), positions[[0, 2]]))
    np.testing.assert_allclose(out[[0, 2]], alone, rtol=1e-6, atol=1e-6)
    for i in (0, 2):  # the visible rows against a NumPy softmax attention
        p = positions[i, 0]
        qh = q[i, 0].reshape(kv, h // kv, d)
        scores = np.einsum("ngd,ndk->ngk", qh, k[0, i][:, :, : p + 1]) * 0.3
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        ref = np.einsum("ngk,nkd->ngd", probs, v[0, i][:, : p + 1]).reshape(h * d)
        np.testing.assert_allclose(out[i, 0], ref, rtol=1e-5, atol=1e-5)


def _primitives(jaxpr, inside=False, found=None):
    """``{(primitive name, inside a scan)}`` of a jaxpr and every jaxpr nested in it."""
    found = set() if found is None else found
    for eqn in jaxpr.eqns:
        found.add((eqn.primitive.name, inside))
        for sub in jax.core.jaxprs_in_params(eqn.params):
            _primitives(sub, inside or eqn.primitive.name == "scan", found)
    return found


def test_whole_sequences_attend_over_their_own_keys_without_a_cache(model):
    """``model(tokens)`` (training, scoring) runs every layer over the sequence's own keys and
    values: the logits of every position match the float64 reference and a cached prefill of
    the same tokens; the program writes no cache (no scatter) and its scanned layer computes no
    sine or cosine (one rope table for every layer, computed before the scan)."""
    m, sd = model
    toks = np.random.default_rng(2).integers(0, CFG.vocab_size, (2, 9)).astype(np.int32)
    ref = reference_logits(sd, toks)
    prog = Program(Graph("whole", forward=m, input_types=[TensorType(DType.int32, ["batch", "seq"])]))
    assert len(prog.chains) == 1 and len(prog.chains[0].nodes) == 3
    state = prog.prepare(m.state_dict())
    whole = np.asarray(jax.jit(prog.apply)(state, toks)[0])
    np.testing.assert_allclose(whole, ref, atol=2e-5)
    np.testing.assert_allclose(np.asarray(m(toks)), ref, atol=2e-5)  # eager
    pos = np.broadcast_to(np.arange(9, dtype=np.int32), (2, 9))
    cached, _, _ = m(toks, pos, *_caches(2))
    np.testing.assert_allclose(whole, np.asarray(cached), atol=1e-5)
    prims = _primitives(jax.make_jaxpr(prog.apply)(state, toks).jaxpr)
    assert not any(name.startswith("scatter") for name, _ in prims)
    assert ("sin", False) in prims and ("sin", True) not in prims and ("cos", True) not in prims


def test_rotating_with_the_table_equals_computing_the_angles():
    """``rotate(x, positions, freqs_cis)`` reads MAX's table at any positions (``positions=None``:
    its first rows) and gives what computing the angles gives."""
    rope = nn.RotaryEmbedding(32, 4, 10000.0, 64, head_dim=8, interleaved=False)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 4, 8)).astype(np.float32)
    pos = np.array([[7, 8, 9, 10, 11], [0, 30, 2, 99, 4]], np.int32)
    computed = np.asarray(rope.rotate(x, pos))
    np.testing.assert_allclose(np.asarray(rope.rotate(x, pos, rope.freqs_cis)), computed, atol=2e-6)
    start = np.asarray(rope.rotate(x, np.broadcast_to(np.arange(5, dtype=np.int32), (2, 5))))
    np.testing.assert_allclose(np.asarray(rope.rotate(x, None, rope.table_rows(5))), start, atol=2e-6)
    np.testing.assert_allclose(np.asarray(rope.table_rows(5)), np.asarray(rope.freqs_cis)[:5], atol=2e-6)


def test_self_attention_at_positions_equals_attending_over_a_cache_written_there():
    """The cacheless op at given positions (a key visible to the queries of its row at the same or
    later positions; here a row in shuffled order) is the cached op after writing the keys and
    values at those positions."""
    from maxjax.backend import policy_for
    from maxjax.nn.attention.attention_with_rope import _causal_gqa, _self_causal_gqa

    rng = np.random.default_rng(4)
    b, s, h, kv, d, cache = 2, 6, 4, 2, 8, 16
    q, k, v = (rng.standard_normal((b, s, n, d)).astype(np.float32) for n in (h, kv, kv))
    pos = np.array([[2, 0, 1, 5, 3, 4], [0, 1, 2, 3, 4, 5]], np.int32)
    kc, vc = np.zeros((1, b, kv, d, cache), np.float32), np.zeros((1, b, kv, cache, d), np.float32)
    for i in range(b):
        kc[0, i, :, :, pos[i]] = k[i]  # [s, kv, d] at (kv, d, position)
        vc[0, i, :, pos[i]] = v[i]  # [s, kv, d] at (kv, position, d)
    policy = policy_for("cpu")
    cached = np.asarray(_causal_gqa(q, kc, vc, 0, pos, scale=0.3, policy=policy))
    np.testing.assert_allclose(np.asarray(_self_causal_gqa(q, k, v, pos, scale=0.3, policy=policy)), cached, atol=1e-6)
    start = np.broadcast_to(np.arange(s, dtype=np.int32), (b, s))
    np.testing.assert_allclose(
        np.asarray(_self_causal_gqa(q, k, v, None, scale=0.3, policy=policy)),
        np.asarray(_self_causal_gqa(q, k, v, start, scale=0.3, policy=policy)), atol=0,
    )  # fmt: skip
