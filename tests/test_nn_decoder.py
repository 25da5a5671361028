"""MAX's decoder stack (Transformer of TransformerBlock/AttentionWithRope over a paged cache,
ragged batches) against a NumPy Llama, in graph, functional and eager mode; and its refusals."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.graph import DeviceRef, Graph, TensorType
from maxjax.nn.kv_cache import KVCacheInputsPerDevice, MHAKVCacheParams, PagedKVCache

from test_transformer import CFG, reference_logits

DEV = DeviceRef.CPU()


def _build(interleaved: bool = False, page_size: int = 4, **attn_kwargs):
    c = CFG
    kv_params = MHAKVCacheParams(DType.float32, c.head_dim, c.num_hidden_layers, [DEV], page_size=page_size, n_kv_heads=c.num_key_value_heads)
    rope = nn.RotaryEmbedding(c.hidden_size, c.num_attention_heads, c.rope_theta, c.max_position_embeddings, head_dim=c.head_dim, interleaved=interleaved)

    def norm():
        return nn.RMSNorm(c.hidden_size, DType.float32, c.rms_norm_eps, multiply_before_cast=False)

    layers = [
        nn.TransformerBlock(
            attention=nn.AttentionWithRope(
                rope=rope, num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                hidden_size=c.hidden_size, kv_params=kv_params, devices=[DEV], **attn_kwargs,
            ),
            mlp=nn.MLP(DType.float32, None, c.hidden_size, c.intermediate_size, [DEV]),
            attention_norm=norm(),
            mlp_norm=norm(),
        )
        for _ in range(c.num_hidden_layers)
    ]  # fmt: skip
    emb = nn.Embedding(c.vocab_size, c.hidden_size, DType.float32, DEV)
    out = nn.Linear(c.hidden_size, c.vocab_size, DType.float32, DEV)
    out.set_shared_weight("weight", emb.weight)
    model = nn.Transformer(c.hidden_size, c.num_attention_heads, layers, norm(), out, emb, kv_params, rope)
    return model, kv_params


@pytest.fixture(scope="module")
def decoder():
    model, kv_params = _build()
    rng = np.random.default_rng(0)
    sd = {k: (rng.standard_normal(v.shape) * 0.2).astype(np.float32) for k, v in model.state_dict().items()}
    model.load_state_dict(sd)
    return model, kv_params, sd


def test_names_are_maxs(decoder):
    _, _, sd = decoder
    assert {"embed_tokens.weight", "norm.weight", "layers.1.self_attn.q_proj.weight", "layers.1.self_attn.o_proj.weight",
            "layers.1.mlp.gate_proj.weight", "layers.1.input_layernorm.weight", "layers.1.post_attention_layernorm.weight"} <= set(sd)  # fmt: skip
    assert "lm_head.weight" not in sd  # tied


def _steps():
    """Two sequences of different lengths (5 and 3 tokens), prefilled together, then two decode steps."""
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, CFG.vocab_size, 7).astype(np.int64), rng.integers(0, CFG.vocab_size, 5).astype(np.int64)]
    return seqs, [[5, 3], [1, 1], [1, 1]]


def _run(call, kv_params, seqs, plan):
    cache = PagedKVCache(kv_params, num_pages=8)
    for i in range(len(seqs)):
        cache.claim(i)
    done, outs = [0, 0], []
    for lengths in plan:
        tokens = np.concatenate([s[d : d + n] for s, d, n in zip(seqs, done, lengths)])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
        inputs = cache.inputs([0, 1], lengths)
        logits, blocks = call(tokens, offsets, np.ones(1, np.int64), inputs)
        cache.kv_blocks = blocks if blocks is not None else cache.kv_blocks
        cache.commit([0, 1], lengths)
        outs.append(np.asarray(logits))
        done = [d + n for d, n in zip(done, lengths)]
    return outs


def _expected(sd, seqs, plan):
    want, done = [], [0, 0]
    for lengths in plan:
        done = [d + n for d, n in zip(done, lengths)]
        want.append(np.stack([reference_logits(sd, s[None, :d])[0, -1] for s, d in zip(seqs, done)]))
    return want


def _collection(inputs):
    return KVCacheInputsPerDevice.unflatten(iter(inputs))


def test_ragged_paged_eager_and_functional_match_numpy(decoder):
    model, kv_params, sd = decoder
    seqs, plan = _steps()
    want = _expected(sd, seqs, plan)

    def eager(tokens, offsets, n, inputs):
        coll = _collection(inputs)
        (logits,) = model(tokens, coll, n, offsets)
        return logits, coll.kv_blocks

    for got, w in zip(_run(eager, kv_params, seqs, plan), want):
        np.testing.assert_allclose(got, w, atol=3e-5)

    state = nn.state(model)

    @jax.jit
    def step(state, tokens, offsets, n, *inputs):  # functional mode: the cache's pages in and out
        coll = _collection(inputs)
        (logits,) = nn.functional_call(model, state, tokens, coll, n, offsets)
        return logits, coll.kv_blocks

    def functional(tokens, offsets, n, inputs):
        return step(state, tokens, offsets, n, *[np.asarray(a.to_numpy()) if hasattr(a, "to_numpy") else a for a in inputs])

    for got, w in zip(_run(functional, kv_params, seqs, plan), want):
        np.testing.assert_allclose(got, w, atol=3e-5)


def test_refusals():
    c = CFG
    kv = MHAKVCacheParams(DType.float32, c.head_dim, 1, [DEV], n_kv_heads=2)
    rope = nn.RotaryEmbedding(c.hidden_size, c.num_attention_heads, c.rope_theta, 64, head_dim=c.head_dim)
    common = dict(rope=rope, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, kv_params=kv)
    from maxjax.nn.attention import MHAMaskVariant

    with pytest.raises(NotImplementedError, match="mask_variant"):
        nn.AttentionWithRope(**common, mask_variant=MHAMaskVariant.NULL_MASK)
    with pytest.raises(ValueError, match="stacked_qkv=True does not support has_bias"):
        nn.AttentionWithRope(**common, stacked_qkv=True, has_bias=True)
    with pytest.raises(NotImplementedError, match="enable_prefix_caching"):
        MHAKVCacheParams(DType.float32, 8, 1, [DEV], enable_prefix_caching=True, n_kv_heads=2)
    with pytest.raises(NotImplementedError, match="kv_scales"):
        KVCacheInputsPerDevice(None, None, None, None, None, None, kv_scales=np.zeros(1))
    with pytest.raises(TypeError, match="kv_collection must be"):
        nn.AttentionWithRope(**common)(0, np.zeros((3, 32), np.float32), object())
    with pytest.raises(NotImplementedError, match="VARIABLE"):
        nn.transformer.logits_postprocess(None, None, None, None, None, nn.ReturnLogits.VARIABLE)


@pytest.mark.parametrize("mask", ["CAUSAL_MASK", "NULL_MASK"])
def test_ragged_attention_over_pages_matches_numpy(mask):
    """MAX's RaggedAttention (no rope): two sequences with cached tokens, new tokens of 3 and 1."""
    from maxjax.nn.attention import MHAMaskVariant

    h, kv, d, hidden = 4, 2, 8, 32
    params = MHAKVCacheParams(DType.float32, d, 2, [DEV], page_size=4, n_kv_heads=kv)
    attn = nn.RaggedAttention(
        mask_variant=MHAMaskVariant[mask], num_attention_heads=h, num_key_value_heads=kv, hidden_size=hidden, kv_params=params
    )
    rng = np.random.default_rng(3)
    sd = {k: (rng.standard_normal(v.shape) * 0.3).astype(np.float32) for k, v in attn.state_dict().items()}
    attn.load_state_dict(sd)
    cache = PagedKVCache(params, num_pages=6)
    past = [rng.standard_normal((n, hidden)).astype(np.float32) for n in (5, 2)]  # cached by a first step
    new = [rng.standard_normal((n, hidden)).astype(np.float32) for n in (3, 1)]
    for i in (0, 1):
        cache.claim(i)
    outs = []
    for step in (past, new):
        lengths = [len(s) for s in step]
        coll = _collection(cache.inputs([0, 1], lengths))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
        outs.append(np.asarray(attn(np.int32(1), np.concatenate(step), coll, input_row_offsets=offsets)))
        cache.kv_blocks = coll.kv_blocks
        cache.commit([0, 1], lengths)
    got = outs[1]
    w = {k: v for k, v in sd.items()}
    rows = []
    for b in (0, 1):
        x = np.concatenate([past[b], new[b]]).astype(np.float64)
        q = (x @ w["q_proj.weight"].T).reshape(-1, h, d)
        k = np.repeat((x @ w["k_proj.weight"].T).reshape(-1, kv, d), h // kv, 1)
        v = np.repeat((x @ w["v_proj.weight"].T).reshape(-1, kv, d), h // kv, 1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
        n = len(x)
        if mask == "CAUSAL_MASK":
            s = np.where(np.tril(np.ones((n, n))) > 0, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", p, v).reshape(n, h * d) @ w["o_proj.weight"].T
        rows.append(o[len(past[b]) :])
    np.testing.assert_allclose(got, np.concatenate(rows), atol=2e-5)
    assert cache.metrics.input_tokens == 11 and cache.metrics.prompt_tokens == 11


@pytest.mark.parametrize("desc_act", [False, True])
def test_gptq_attention_equals_float_attention_on_the_dequantized_weights(desc_act):
    """MAX's GPTQAttentionWithRope (4-bit q/k/v/o, one shared perm_idx) against AttentionWithRope
    holding the same weights as floats (the GPTQ spec's dequantization, checked against NumPy in
    test_nn_linear), over one ragged step of a paged cache."""
    from maxjax.graph.quantization import QuantizationConfig
    from maxjax.graph.quantization.gptq import dequantize_gptq, perm_idx_from_g_idx

    from test_nn_linear import _gptq_case

    h, kv, hidden, group = 4, 2, 256, 128
    d = hidden // h
    params = MHAKVCacheParams(DType.float32, d, 1, [DEV], page_size=4, n_kv_heads=kv)
    rope = nn.RotaryEmbedding(hidden, h, 1e4, 64, head_dim=d)
    qc = QuantizationConfig("gptq", 4, group, desc_act=desc_act, sym=True)
    gptq = nn.GPTQAttentionWithRope(qc, rope, h, kv, hidden, params)
    flt = nn.AttentionWithRope(rope=rope, num_attention_heads=h, num_key_value_heads=kv, hidden_size=hidden, kv_params=params)
    qsd, fsd = {}, {}
    shared_g_idx = _gptq_case(True, k=hidden, n=hidden, seed=0)[2]  # q, k and v read one input
    for i, (name, out) in enumerate([("q_proj", hidden), ("k_proj", kv * d), ("v_proj", kv * d), ("o_proj", hidden)]):
        qweight, scales, g_idx, _ = _gptq_case(desc_act, k=hidden, n=out, seed=i)
        if desc_act and name != "o_proj":
            g_idx = shared_g_idx
        perm = perm_idx_from_g_idx(g_idx) if desc_act else None
        qsd[f"{name}.qweight"], qsd[f"{name}.scales"] = qweight, scales
        if desc_act and name in ("q_proj", "o_proj"):
            qsd[f"{name}.perm_idx"] = perm
        w = np.asarray(dequantize_gptq(qweight, scales, perm, group_size=group))  # [K, N], rows in perm order
        wk = np.empty_like(w)
        if desc_act:
            wk[perm] = w  # back to input order
        else:
            wk = w
        fsd[f"{name}.weight"] = np.ascontiguousarray(wk.T)
    gptq.load_state_dict(qsd)
    flt.load_state_dict(fsd)
    x = np.random.default_rng(9).standard_normal((5, hidden)).astype(np.float32)
    offsets = np.array([0, 3, 5], np.uint32)
    outs = []
    for layer in (gptq, flt):
        cache = PagedKVCache(params, num_pages=4)
        cache.claim(0), cache.claim(1)
        coll = _collection(cache.inputs([0, 1], [3, 2]))
        outs.append(np.asarray(layer(np.int32(0), x, coll, rope.freqs_cis, offsets)))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4)
