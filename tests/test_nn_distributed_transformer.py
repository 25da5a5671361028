"""MAX's per-device decoder (``TensorParallelAttentionWithRope``, ``DistributedTransformerBlock``,
``DistributedTransformer``) over 2 of the 8 host devices of tests/conftest.py.

MAX 26.7 runs none of them here: ``TensorParallelAttentionWithRope`` refuses CPU devices and its
``Allreduce`` needs a GPU (``scripts/max_reference/distributed_transformer.py``). Their weight
names, shapes and per-device shard shapes are MAX's own (the reference builds MAX's layers with
the accelerators stubbed); their numbers are those of the single-device ``Transformer`` of
``TransformerBlock(AttentionWithRope)`` with the same checkpoint (maxjax's single-device classes,
tested against NumPy in test_nn_decoder.py): a ragged batch of 2 sequences (5 and 3 tokens), then a
decode step through each device's paged KV cache, in graph, functional and eager mode.
"""

from __future__ import annotations

import inspect
import re

import jax
import numpy as np
import pytest
from max_reference import load

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType
from maxjax.nn.kv_cache import KVCacheInputsPerDevice, MHAKVCacheParams, PagedKVCache

REF = load("distributed_transformer")
F32 = DType.float32
H, NH, NKV, D, L, V, FF, EPS = 32, 4, 2, 8, 2, 64, 64, 1e-5
DEVS = [DeviceRef.CPU(0), DeviceRef.CPU(1)]
PAGE, PAGES = 4, 8


def _rope():
    return nn.RotaryEmbedding(H, NH, 10000.0, 64, head_dim=D)


def _norm():
    return nn.RMSNorm(H, F32, EPS, multiply_before_cast=False)


def _kv(devices, n_kv=NKV):
    return MHAKVCacheParams(F32, D, L, devices, page_size=PAGE, n_kv_heads=n_kv)


def _attn_kw(rope):
    return dict(rope=rope, num_attention_heads=NH, num_key_value_heads=NKV, hidden_size=H)


def _single(tied=False, **model_kwargs):
    rope, kv = _rope(), _kv(DEVS[:1])
    layers = [
        nn.TransformerBlock(
            attention=nn.AttentionWithRope(**_attn_kw(rope), kv_params=kv, devices=DEVS[:1]),
            mlp=nn.MLP(F32, None, H, FF, DEVS[:1]), attention_norm=_norm(), mlp_norm=_norm(),
        )
        for _ in range(L)
    ]  # fmt: skip
    emb, out = nn.Embedding(V, H, F32, DEVS[0]), nn.Linear(H, V, F32, DEVS[0])
    if tied:
        out.set_shared_weight("weight", emb.weight)
    return nn.Transformer(H, NH, layers, _norm(), out, emb, kv, rope, **model_kwargs)


def _distributed(devices=DEVS, tied=False, **model_kwargs):
    rope, kv = _rope(), _kv(devices)
    layers = [
        nn.DistributedTransformerBlock(
            attention=nn.TensorParallelAttentionWithRope(**_attn_kw(rope), kv_params=kv, devices=devices),
            mlp=nn.MLP(F32, None, H, FF, devices), attention_norm=_norm(), mlp_norm=_norm(), devices=devices,
        )
        for _ in range(L)
    ]  # fmt: skip
    emb = nn.VocabParallelEmbedding(V, H, F32, devices)
    out = nn.ColumnParallelLinear(H, V, F32, devices, tied_weight=emb.weight if tied else None)
    return nn.DistributedTransformer(H, NH, layers, _norm(), out, emb, kv, devices, rope, **model_kwargs)


@pytest.fixture(scope="module")
def models():
    single, dist = _single(), _distributed()
    rng = np.random.default_rng(0)
    sd = {k: (rng.standard_normal(v.shape) * 0.2).astype(np.float32) for k, v in single.state_dict().items()}
    single.load_state_dict(sd)
    dist.load_state_dict(sd)
    return single, dist, sd


SEQS = [np.random.default_rng(s).integers(0, V, n).astype(np.int64) for s, n in ((1, 6), (2, 4))]
PLAN = [[5, 3], [1, 1]]  # prefill 5 and 3 tokens, then one decode step each


def _run(call, n_devices):
    """Runs PLAN through ``call(tokens, offsets, return_n_logits, per_device_cache_inputs)`` with
    one paged cache per device (``NKV // n_devices`` heads each); returns each step's outputs."""
    caches = [PagedKVCache(_kv([d], NKV // n_devices), PAGES) for d in DEVS[:n_devices]]
    for cache in caches:
        for i in range(len(SEQS)):
            cache.claim(i)
    done, outs = [0, 0], []
    for lengths in PLAN:
        tokens = np.concatenate([s[d : d + n] for s, d, n in zip(SEQS, done, lengths)])
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
        outputs, blocks = call(tokens, offsets, np.ones(1, np.int64), [c.inputs([0, 1], lengths) for c in caches])
        for cache, b in zip(caches, blocks):
            if b is not None:
                cache.kv_blocks = b
            cache.commit([0, 1], lengths)
        outs.append([np.asarray(o) for o in outputs])
        done = [d + n for d, n in zip(done, lengths)]
    return outs


def _eager(model, n_devices):
    signals = nn.Signals(DEVS[:n_devices])

    def call(tokens, offsets, n, inputs):
        colls = [KVCacheInputsPerDevice.unflatten(iter(i)) for i in inputs]
        if isinstance(model, nn.DistributedTransformer):
            return model(tokens, signals.buffers(), colls, n, offsets), [c.kv_blocks for c in colls]
        return model(tokens, colls[0], n, offsets), [colls[0].kv_blocks]

    return _run(call, n_devices)


def _functional(model, n_devices):
    state = nn.state(model)
    buffers = nn.Signals(DEVS[:n_devices]).buffers()

    @jax.jit
    def step(state, tokens, offsets, n, inputs):  # the caches' pages in and out
        colls = [KVCacheInputsPerDevice.unflatten(iter(i)) for i in inputs]
        if isinstance(model, nn.DistributedTransformer):
            out = nn.functional_call(model, state, tokens, buffers, colls, n, offsets)
        else:
            out = nn.functional_call(model, state, tokens, colls[0], n, offsets)
        return out, [c.kv_blocks for c in colls]

    def call(tokens, offsets, n, inputs):
        host = [[np.asarray(a.to_numpy()) if hasattr(a, "to_numpy") else a for a in i] for i in inputs]
        return step(state, tokens, offsets, n, host)

    return _run(call, n_devices)


def _assert_equal_steps(got, want):
    assert len(got) == len(want)
    for g_step, w_step in zip(got, want):
        assert len(g_step) == len(w_step)
        for g, w in zip(g_step, w_step):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)


@pytest.fixture(scope="module")
def expected(models):
    single, _, _ = models
    return _functional(single, 1)  # the single-device classes' numbers (checked against NumPy in test_nn_decoder)


def test_eager_equals_the_single_device_transformer(models, expected):
    _, dist, _ = models
    got = _eager(dist, 2)
    assert [[g.shape for g in step] for step in got] == [[(2, V)], [(2, V)]]
    _assert_equal_steps(got, expected)


def test_functional_under_jit_equals_the_single_device_transformer(models, expected):
    _, dist, _ = models
    _assert_equal_steps(_functional(dist, 2), expected)


def test_tied_head_all_logits_and_scaling_equal_the_single_device_transformer():
    """``ColumnParallelLinear(tied_weight=embedding.weight)`` (no ``lm_head`` key), every token's
    logits (``ReturnLogits.ALL``: last logits, all logits, offsets) and ``logits_scaling``."""
    kwargs = dict(return_logits=nn.ReturnLogits.ALL, logits_scaling=2.0)
    single, dist = _single(tied=True, **kwargs), _distributed(tied=True, **kwargs)
    assert sorted(dist.raw_state_dict()) == sorted(single.raw_state_dict())
    assert "lm_head.weight" not in dist.raw_state_dict()
    rng = np.random.default_rng(4)
    sd = {k: (rng.standard_normal(v.shape) * 0.2).astype(np.float32) for k, v in single.state_dict().items()}
    single.load_state_dict(sd)
    dist.load_state_dict(sd)
    got, want = _functional(dist, 2), _functional(single, 1)
    assert [[g.shape for g in step] for step in got] == [[(2, V), (8, V), (3,)], [(2, V), (2, V), (3,)]]
    _assert_equal_steps(got, want)


def _graph(model, kv_params_per_device):
    signals = nn.Signals(DEVS)
    kv_types = [t for p in kv_params_per_device for t in p.flattened_kv_inputs()]
    input_types = [
        TensorType(DType.int64, ["total_seq_len"], DEVS[0]),
        TensorType(DType.uint32, ["input_row_offsets_len"], DEVS[0]),
        TensorType(DType.int64, [1], DeviceRef.CPU()),
        *signals.input_types(),
        *kv_types,
    ]

    def forward(tokens, offsets, n, *rest):
        buffers, kv_inputs = rest[: len(DEVS)], iter(rest[len(DEVS) :])
        colls = [p.unflatten_kv_inputs(kv_inputs)[0] for p in kv_params_per_device]
        return model(tokens.tensor, list(buffers), colls, n.tensor, offsets.tensor)

    return Graph("distributed_llama", forward, input_types=input_types), signals


def test_graph_mode_equals_the_single_device_transformer(models, expected):
    _, dist, _ = models
    per_device = [_kv([d], NKV // 2) for d in DEVS]
    graph, signals = _graph(dist, per_device)
    compiled = InferenceSession(devices=[d.to_device() for d in DEVS]).load(graph, weights_registry=dist.state_dict())

    def call(tokens, offsets, n, inputs):
        flat = [a for i in inputs for a in i]
        out = compiled.execute(tokens, offsets, n, *signals.buffers(), *flat)
        return [o.to_numpy() for o in out], [None] * len(inputs)  # kv_blocks are updated in place

    _assert_equal_steps(_run(call, 2), expected)


def _shape(w):
    return str([int(d) for d in w.shape])


@pytest.mark.parametrize("options", [{}, {"use_qk_norm": True, "has_bias": True}])
def test_the_attention_alone_equals_attention_with_rope_and_splits_heads_as_max(options):
    """One TP attention layer against the single-device layer holding the same weights, over a
    ragged step of per-device paged caches; its keys and shard shapes against MAX's."""
    rope = _rope()
    single = nn.AttentionWithRope(**_attn_kw(rope), kv_params=_kv(DEVS[:1]), **options)
    tp = nn.TensorParallelAttentionWithRope(**_attn_kw(rope), kv_params=_kv(DEVS), devices=DEVS, **options)
    assert sorted(tp.raw_state_dict()) == sorted(single.raw_state_dict())
    if options:  # q/k/v biases split with their rows, the q/k norms replicated
        assert {"q_proj.bias", "k_norm.weight"} <= set(tp.raw_state_dict())
        assert tp.list_of_attentions[1].q_norm.weight.shape == [D] and tp.list_of_attentions[1].k_proj.bias.shape == [D]
    else:
        assert sorted(tp.raw_state_dict()) == list(REF["tp_attn.keys"]) == list(REF["attn.keys"])
        shapes = {k: _shape(v) for k, v in tp.raw_state_dict().items()}
        assert [shapes[k] for k in REF["tp_attn.keys"]] == list(REF["tp_attn.shapes"])
    for i, shard in enumerate(tp.list_of_attentions):
        assert type(shard) is nn.AttentionWithRope and shard.devices == [DEVS[i]]
        if options:
            continue
        sd = shard.raw_state_dict()
        assert sorted(sd) == list(REF[f"tp_attn.shard{i}.keys"])
        assert [_shape(sd[k]) for k in sorted(sd)] == list(REF[f"tp_attn.shard{i}.shapes"])
        assert [shard.n_heads, shard.num_key_value_heads] == list(REF[f"tp_attn.shard{i}.heads"])
    rng = np.random.default_rng(5)
    sd = {k: (rng.standard_normal(v.shape) * 0.3).astype(np.float32) for k, v in single.state_dict().items()}
    single.load_state_dict(sd)
    tp.load_state_dict(sd)
    x = rng.standard_normal((7, H)).astype(np.float32)
    offsets = np.array([0, 4, 7], np.uint32)
    caches = [PagedKVCache(_kv([d], n), PAGES) for d, n in ((DEVS[0], NKV), (DEVS[0], 1), (DEVS[1], 1))]
    colls = []
    for c in caches:
        c.claim(0), c.claim(1)
        colls.append(KVCacheInputsPerDevice.unflatten(iter(c.inputs([0, 1], [4, 3]))))
    want = np.asarray(single(np.uint32(1), x, colls[0], input_row_offsets=offsets))
    got = tp(np.uint32(1), [x, x], nn.Signals(DEVS).buffers(), colls[1:], [rope.freqs_cis] * 2, [offsets, offsets])
    assert len(got) == 2
    for g in got:
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=2e-5)
    # each device cached its own KV head: device i's pages hold KV head i of the single layer's cache
    for i, coll in enumerate(colls[1:]):
        mine, whole = np.asarray(coll.kv_blocks), np.asarray(colls[0].kv_blocks)
        np.testing.assert_allclose(mine[..., 0, :], whole[..., i, :], atol=1e-6)


def test_weight_keys_are_the_single_device_ones_and_maxs(models):
    single, dist, sd = models
    assert sorted(dist.raw_state_dict()) == sorted(single.raw_state_dict()) == list(REF["dist.keys"])
    assert list(REF["dist.keys"]) == list(REF["single.keys"])
    shapes = {k: _shape(v) for k, v in dist.raw_state_dict().items()}
    assert [shapes[k] for k in REF["dist.keys"]] == list(REF["dist.shapes"])
    block = dist.layers[0]
    assert len(block.mlp_shards) == len(block.input_layernorm_shards) == len(dist.norm_shards) == 2
    assert block.mlp_shards[0].gate_proj.weight.shape[0] == FF // 2  # the hidden layer split over devices
    assert block.mlp_shards[1].down_proj.weight.shape[1] == FF // 2


def test_signatures_are_maxs():
    # MAX's signature strings: "(*, name: 'annotation' = default, ...)"
    pattern = r"(?:^\(|, )(?:\*, )?(\w+): '[^']*'(?: = (<[^>]*>|[^,)]+))?"
    same_default = {"float32": "DType.float32", "<class 'max.nn.linear.Linear'>": "<class 'maxjax.nn.linear.Linear'>"}
    for name in ("TensorParallelAttentionWithRope", "DistributedTransformerBlock", "DistributedTransformer"):
        ref = str(REF[f"sig.{name}"])
        want = [(p, same_default.get(d, d)) for p, d in re.findall(pattern, ref)]
        params = inspect.signature(getattr(nn, name)).parameters.values()
        assert [(p.name, "" if p.default is inspect.Parameter.empty else repr(p.default)) for p in params] == want
        kinds = {p.kind.name for p in params}
        assert kinds == ({"KEYWORD_ONLY"} if ref.startswith("(*,") else {"POSITIONAL_OR_KEYWORD"})
    from maxjax.nn.attention import TensorParallelAttentionWithRope
    from maxjax.nn.transformer import DistributedTransformer, DistributedTransformerBlock

    assert TensorParallelAttentionWithRope is nn.TensorParallelAttentionWithRope
    assert DistributedTransformer is nn.DistributedTransformer
    assert DistributedTransformerBlock is nn.DistributedTransformerBlock
    assert issubclass(TensorParallelAttentionWithRope, nn.DistributedAttentionImpl)


def test_refusals(models):
    _, dist, _ = models
    rope = _rope()
    with pytest.raises(ValueError, match=r"num_key_value_heads=2 is not divisible by the number of devices \(4\)"):
        four = [DeviceRef.CPU(i) for i in range(4)]
        nn.TensorParallelAttentionWithRope(**_attn_kw(rope), kv_params=_kv(DEVS), devices=four)
    with pytest.raises(ValueError, match=r"stacked_qkv=True"):
        nn.TensorParallelAttentionWithRope(**_attn_kw(rope), kv_params=_kv(DEVS), devices=DEVS, stacked_qkv=True)
    from maxjax.nn.attention import MHAMaskVariant

    with pytest.raises(NotImplementedError, match="mask_variant"):
        nn.TensorParallelAttentionWithRope(
            **_attn_kw(rope), kv_params=_kv(DEVS), devices=DEVS, mask_variant=MHAMaskVariant.NULL_MASK
        )
    tp = dist.layers[0].self_attn
    x = np.zeros((3, H), np.float32)
    one = [np.array([0, 3], np.uint32)]
    with pytest.raises(ValueError, match=r"expected 2 input_row_offsets \(one per device\), got 1"):
        tp(np.uint32(0), [x, x], nn.Signals(DEVS).buffers(), [None, None], [rope.freqs_cis] * 2, one)
    with pytest.raises(ValueError, match=r"expected 2 signal_buffers \(one per device\), got 1"):
        tp(np.uint32(0), [x, x], nn.Signals(DEVS[:1]).buffers(), [None, None], [rope.freqs_cis] * 2, one * 2)
    with pytest.raises(ValueError, match=r"expected 2 x \(one per device\), got 1"):
        tp(np.uint32(0), [x], nn.Signals(DEVS).buffers(), [None, None], [rope.freqs_cis] * 2, one * 2)
    with pytest.raises(NotImplementedError, match=r"use_subgraphs=True"):
        _distributed(use_subgraphs=True)
    tokens, offsets, n = np.zeros(3, np.int64), np.array([0, 3], np.uint32), np.ones(1, np.int64)
    with pytest.raises(ValueError, match=r"expected 2 kv_collections \(one per device\), got 1"):
        dist(tokens, nn.Signals(DEVS).buffers(), [None], n, offsets)
    with pytest.raises(ValueError, match=r"expected 2 signal_buffers \(one per device\), got 3"):
        dist(tokens, nn.Signals([DeviceRef.CPU(i) for i in range(3)]).buffers(), [None, None], n, offsets)
