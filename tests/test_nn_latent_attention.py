"""maxjax.nn.LatentAttentionWithRope (MAX's DeepSeek MLA) against an independent NumPy reference
written from DeepSeek-V2 (arXiv:2405.04434, section 2.1): decompressed keys/values, full causal
softmax attention. MAX 26.7 cannot run MLA on CPU (its flare_mla_* kernels are GPU-only), so the
numbers are not MAX's; the weight names and shapes follow MAX's source."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.nn.kv_cache import KVCacheInputsPerDevice

H, HID, RANK, NOPE, ROPE, V = 4, 64, 16, 8, 4, 8
LENS = (3, 5)
PAGE = 4


def freqs(n_pos=16, d=ROPE, theta=10000.0):
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = np.arange(n_pos)[:, None] * inv[None]  # [pos, d/2]
    return np.stack([np.cos(ang), np.sin(ang)], -1).reshape(n_pos, d).astype(np.float32)


def rot(x, pos, f):  # interleaved pairs (2i, 2i+1); x [..., n, d], pos [n]
    c, s = f[pos, 0::2], f[pos, 1::2]
    if x.ndim == 3:
        c, s = c[:, None], s[:, None]
    a, b = x[..., 0::2], x[..., 1::2]
    return np.stack([a * c - b * s, a * s + b * c], -1).reshape(x.shape)


def rms(x, g):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * g


def weights(q_lora, seed=0):
    r = np.random.default_rng(seed)
    w = lambda *s: (r.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
    out = {
        "kv_a_layernorm.weight": (1 + 0.1 * r.standard_normal(RANK)).astype(np.float32),
        "kv_a_proj_with_mqa.weight": w(RANK + ROPE, HID),
        "kv_b_proj.weight": w(H * (NOPE + V), RANK),
        "o_proj.weight": w(HID, H * V),
    }
    if q_lora:
        out |= {"q_a_proj.weight": w(q_lora, HID), "q_a_layernorm.weight": (1 + 0.1 * r.standard_normal(q_lora)).astype(np.float32),
                "q_b_proj.weight": w(H * (NOPE + ROPE), q_lora)}
    else:
        out["q_proj.weight"] = w(H * (NOPE + ROPE), HID)
    return out


def reference(W, x_seq, f, heads=range(H)):
    """One sequence x_seq [n, hidden] attending causally from position 0; returns [n, hidden]."""
    n = x_seq.shape[0]
    pos = np.arange(n)
    if "q_proj.weight" in W:
        q = x_seq @ W["q_proj.weight"].T
    else:
        q = rms(x_seq @ W["q_a_proj.weight"].T, W["q_a_layernorm.weight"]) @ W["q_b_proj.weight"].T
    q = q.reshape(n, H, NOPE + ROPE)
    ckv = x_seq @ W["kv_a_proj_with_mqa.weight"].T
    c, k_rope = rms(ckv[:, :RANK], W["kv_a_layernorm.weight"]), rot(ckv[:, RANK:], pos, f)
    kvb = (c @ W["kv_b_proj.weight"].T).reshape(n, H, NOPE + V)
    k = np.concatenate([kvb[..., :NOPE], np.broadcast_to(k_rope[:, None], (n, H, ROPE))], -1)
    qq = np.concatenate([q[..., :NOPE], rot(q[..., NOPE:], pos, f)], -1)
    s = np.einsum("qhd,khd->hqk", qq, k) / np.sqrt(NOPE + ROPE)
    s = np.where(pos[None, :, None] >= pos[None, None, :], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    ctx = np.einsum("hqk,khv->qhv", p, kvb[..., NOPE:])
    hs = list(heads)
    wo = W["o_proj.weight"].reshape(HID, H, V)[:, hs].reshape(HID, -1)
    return ctx[:, hs].reshape(n, -1) @ wo.T


def make(q_lora, cls=nn.LatentAttentionWithRope, **kw):
    rope = nn.RotaryEmbedding(dim=H * ROPE, n_heads=H, theta=10000.0, max_seq_len=16, head_dim=ROPE, interleaved=True)
    return cls(rope=rope, num_attention_heads=H, num_key_value_heads=1, hidden_size=HID, kv_params=None,
               dtype=DType.float32, q_lora_rank=q_lora, kv_lora_rank=RANK, qk_nope_head_dim=NOPE,
               qk_rope_head_dim=ROPE, v_head_dim=V, **kw)


def cache(blocks, lengths):
    return KVCacheInputsPerDevice(
        kv_blocks=blocks, cache_lengths=jnp.asarray(lengths, jnp.uint32),
        lookup_table=jnp.asarray([[0, 1], [2, 3]], jnp.uint32), max_prompt_length=jnp.asarray(5, jnp.uint32),
        max_cache_length=jnp.asarray(8, jnp.uint32), page_stride=jnp.asarray(PAGE, jnp.uint32))


def data(seed=1):
    r = np.random.default_rng(seed)
    return [r.standard_normal((n + 1, HID)).astype(np.float32) for n in LENS]  # prompt + one decode token each


def run_steps(step):
    """prefill both prompts, then one decode token each; returns (prefill out, decode out)."""
    xs, f = data(), freqs()
    blocks = jnp.zeros((4, 2, 1, PAGE, 1, RANK + ROPE), jnp.float32)
    pre = np.concatenate([x[:-1] for x in xs])
    out1, blocks = step(pre, blocks, [0, 0], np.array([0, 3, 8], np.uint32), f)
    dec = np.stack([x[-1] for x in xs])
    out2, _ = step(dec, blocks, list(LENS), np.array([0, 1, 2], np.uint32), f)
    return np.asarray(out1), np.asarray(out2)


def expected(W):
    xs, f = data(), freqs()
    full = [reference(W, x, f) for x in xs]
    return np.concatenate([o[:-1] for o in full]), np.stack([o[-1] for o in full])


@pytest.mark.parametrize("q_lora", [32, None])
def test_eager_and_functional_match_numpy(q_lora):
    W = weights(q_lora)
    m = make(q_lora)
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == {k: v.shape for k, v in W.items()}
    m.load_state_dict(W)
    want = expected(W)

    def eager(x, blocks, lens, offs, f):
        c = cache(blocks, lens)
        y = m(jnp.asarray(0, jnp.uint32), jnp.asarray(x), c, jnp.asarray(f), jnp.asarray(offs))
        return y, c.kv_blocks

    for got, ref in zip(run_steps(eager), want):
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)

    @jax.jit
    def fn(state, x, blocks, lens, offs, f):
        c = cache(blocks, lens)
        y = nn.functional_call(m, state, jnp.asarray(0, jnp.uint32), x, c, f, offs)
        return y, c.kv_blocks

    state = nn.state(m)
    func = lambda x, b, l, o, f: fn(state, jnp.asarray(x), b, jnp.asarray(l, jnp.uint32), jnp.asarray(o), jnp.asarray(f))
    for got, ref in zip(run_steps(func), want):
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


def test_signatures_are_maxs():
    sig = inspect.signature(nn.LatentAttentionWithRope.__init__)
    assert list(sig.parameters)[1:] == [
        "rope", "num_attention_heads", "num_key_value_heads", "hidden_size", "kv_params", "dtype", "devices",
        "linear_cls", "o_proj_dtype", "o_proj_quant_config", "scale", "q_lora_rank", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "buffer_size", "graph_mode", "norm_dtype"]
    assert sig.parameters["kv_lora_rank"].default == 512 and sig.parameters["buffer_size"].default == 16384
    assert list(inspect.signature(nn.TensorParallelLatentAttentionWithRope.__init__).parameters)[1:] == ["skip_allreduce", "kwargs"]


def test_refusals():
    with pytest.raises(ValueError, match="graph_mode"):
        make(None, graph_mode="both")
    with pytest.raises(NotImplementedError, match="o_proj_quant_config"):
        make(None, o_proj_quant_config=object())


def test_graph_mode_matches_numpy():
    from maxjax.driver import Buffer
    from maxjax.engine import InferenceSession
    from maxjax.graph import BufferType, DeviceRef, Graph, TensorType, ops

    cpu = DeviceRef.CPU()
    W = weights(32)
    m = make(32)
    m.load_state_dict(W)

    def forward(x, blocks, lens, lookup, f, offs):
        c = KVCacheInputsPerDevice(blocks.buffer, lens.tensor, lookup.tensor, lens.tensor, lens.tensor, lens.tensor)
        return m(ops.constant(0, DType.uint32, cpu), x.tensor, c, f.tensor, offs.tensor)

    g = Graph("mla", forward, input_types=[
        TensorType(DType.float32, ["total", HID], cpu), BufferType(DType.float32, [4, 2, 1, PAGE, 1, RANK + ROPE], cpu),
        TensorType(DType.uint32, [2], cpu), TensorType(DType.uint32, [2, 2], cpu),
        TensorType(DType.float32, [16, ROPE], cpu), TensorType(DType.uint32, [3], cpu)])
    model = InferenceSession().load(g, weights_registry=m.state_dict())

    def step(x, blocks, lens, offs, f):
        buf = Buffer.from_numpy(np.asarray(blocks))
        (y,) = model.execute(x, buf, np.asarray(lens, np.uint32), np.array([[0, 1], [2, 3]], np.uint32), f, offs)
        return y.to_numpy(), buf.to_numpy()

    for got, ref in zip(run_steps(step), expected(W)):
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("skip", [False, True])
def test_tensor_parallel_heads_split_over_devices(skip):
    from maxjax.graph import DeviceRef

    n = 2
    devs = [DeviceRef.CPU(i) for i in range(n)]
    W = weights(None)
    m = make(None, cls=nn.TensorParallelLatentAttentionWithRope, devices=devs, skip_allreduce=skip)
    assert set(m.state_dict()) == set(W)
    m.load_state_dict(W)
    signals = nn.Signals(devs)
    xs, f = data(), freqs()
    pre = np.concatenate([x[:-1] for x in xs])
    put = lambda a, i: jax.device_put(jnp.asarray(a), devs[i].to_device().jax_device)
    caches = [cache(put(np.zeros((4, 2, 1, PAGE, 1, RANK + ROPE), np.float32), i), [0, 0]) for i in range(n)]
    for i, c in enumerate(caches):
        c.cache_lengths, c.lookup_table = put(c.cache_lengths, i), put(c.lookup_table, i)
    outs = m(jnp.asarray(0, jnp.uint32), [put(pre, i) for i in range(n)], signals.buffers(), caches,
             [put(f, i) for i in range(n)], [put(np.array([0, 3, 8], np.uint32), i) for i in range(n)])
    assert len(outs) == n
    assert [next(iter(o.devices())) for o in outs] == [d.to_device().jax_device for d in devs]
    per = H // n
    for i, out in enumerate(outs):
        heads = range(i * per, (i + 1) * per) if skip else range(H)
        want = np.concatenate([reference(W, x, f, heads)[:-1] for x in xs])
        np.testing.assert_allclose(np.asarray(out), want, rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="divisible"):
        make(None, cls=nn.TensorParallelLatentAttentionWithRope, devices=[DeviceRef.CPU(i) for i in range(3)])


@pytest.mark.parametrize("q_lora", [32, None])
def test_state_dict_keys_shapes_and_scale_are_maxs(q_lora):
    from max_reference import load

    ref = load("attention_latent")
    tag = str(q_lora).lower()
    m = make(q_lora)
    sd = m.state_dict()
    assert list(sd) == bytes(ref[f"keys/{tag}"]).decode().split("\n")  # MAX's keys in MAX's order
    for k, v in sd.items():
        assert tuple(v.shape) == tuple(ref[f"shape/{tag}/{k}"]), k
    assert m.scale == pytest.approx(float(ref[f"scale/{tag}"]), rel=1e-12)


def test_tensor_parallel_graph_mode():
    from maxjax.driver import Buffer
    from maxjax.engine import InferenceSession
    from maxjax.graph import BufferType, DeviceRef, Graph, TensorType, ops

    n = 2
    devs = [DeviceRef.CPU(i) for i in range(n)]
    W = weights(32)
    m = make(32, cls=nn.TensorParallelLatentAttentionWithRope, devices=devs)
    m.load_state_dict(W)
    signals = nn.Signals(devs)
    per_dev = lambda d: [
        TensorType(DType.float32, [8, HID], d), BufferType(DType.float32, [4, 2, 1, PAGE, 1, RANK + ROPE], d),
        TensorType(DType.uint32, [2], d), TensorType(DType.uint32, [2, 2], d), TensorType(DType.float32, [16, ROPE], d),
        TensorType(DType.uint32, [3], d)]
    with Graph("tp_mla", input_types=[*per_dev(devs[0]), *per_dev(devs[1]), *signals.input_types()]) as g:
        ins = g.inputs
        xs, cs, fs, offs = [], [], [], []
        for i in range(n):
            x, blocks, lens, lookup, f, off = ins[6 * i : 6 * i + 6]
            xs.append(x.tensor); fs.append(f.tensor); offs.append(off.tensor)
            cs.append(KVCacheInputsPerDevice(blocks.buffer, lens.tensor, lookup.tensor, lens.tensor, lens.tensor, lens.tensor))
        g.output(*m(ops.constant(0, DType.uint32, devs[0]), xs, ins[6 * n :], cs, fs, offs))
    model = InferenceSession(devices=[d.to_device() for d in devs]).load(g, weights_registry=m.state_dict())
    xs_np, f = data(), freqs()
    pre = np.concatenate([x[:-1] for x in xs_np])
    args = []
    for _ in range(n):
        args += [pre, Buffer.from_numpy(np.zeros((4, 2, 1, PAGE, 1, RANK + ROPE), np.float32)), np.zeros(2, np.uint32),
                 np.array([[0, 1], [2, 3]], np.uint32), f, np.array([0, 3, 8], np.uint32)]
    outs = model.execute(*args, *signals.buffers())
    want = np.concatenate([reference(W, x, f)[:-1] for x in xs_np])
    assert len(outs) == n
    for out in outs:
        np.testing.assert_allclose(out.to_numpy(), want, rtol=2e-5, atol=2e-5)
