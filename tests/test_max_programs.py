"""Programs written against MAX 26.7's API (../shared/max-api-26.7.md), imports changed only.

Each compares with the NumPy computation MAX performs for that program.
"""

from __future__ import annotations

import numpy as np

from maxjax import engine
from maxjax.driver import CPU, Buffer
from maxjax.dtype import DType
from maxjax.graph import DeviceRef, Graph, TensorType, Weight, ops
from maxjax.nn import MLP, Embedding, LayerList, Linear, Module, RMSNorm


def test_program_graph_with_weights_and_execute():
    # A MAX-style script: build a graph by hand with Weights, load with a registry, execute.
    device = CPU()
    w1 = Weight("fc1.weight", DType.float32, [16, 8], DeviceRef.CPU())
    b1 = Weight("fc1.bias", DType.float32, [16], DeviceRef.CPU())
    w2 = Weight("fc2.weight", DType.float32, [4, 16], DeviceRef.CPU())
    input_type = TensorType(DType.float32, shape=["batch", 8], device=DeviceRef.CPU())
    with Graph("two_layer", input_types=(input_type,)) as graph:
        x = graph.inputs[0].tensor
        h = ops.relu(ops.matmul(x, w1.T) + b1)
        logits = h @ w2.T
        graph.output(ops.softmax(logits), ops.argmax(logits, axis=-1))
    rng = np.random.default_rng(0)
    registry = {
        "fc1.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "fc1.bias": rng.standard_normal(16).astype(np.float32),
        "fc2.weight": rng.standard_normal((4, 16)).astype(np.float32),
    }
    session = engine.InferenceSession(devices=[device])
    model = session.load(graph, weights_registry=registry)
    xs = rng.standard_normal((6, 8)).astype(np.float32)
    probs, best = model.execute(Buffer.from_numpy(xs).to(device))
    h = np.maximum(xs @ registry["fc1.weight"].T + registry["fc1.bias"], 0)
    logits = h @ registry["fc2.weight"].T
    ref = np.exp(logits - logits.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(probs.to_numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(best.to_numpy()[:, 0], logits.argmax(-1))
    assert best.shape == (6, 1)


def test_program_module_load_state_dict_and_compile():
    # A MAX-style model: Embedding -> stacked MLP blocks with RMSNorm -> tied-free head.
    class Block(Module):
        def __init__(self):
            super().__init__()
            self.norm = RMSNorm(8, DType.float32, eps=1e-5)
            self.mlp = MLP(DType.float32, None, 8, 24, [DeviceRef.CPU()])

        def __call__(self, x):
            return x + self.mlp(self.norm(x))

    class TinyLM(Module):
        def __init__(self):
            super().__init__()
            self.embed = Embedding(50, 8, DType.float32, DeviceRef.CPU())
            self.layers = LayerList([Block() for _ in range(2)])
            self.head = Linear(8, 50, DType.float32, DeviceRef.CPU(), has_bias=True)

        def __call__(self, ids):
            h = self.embed(ids)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)

    lm = TinyLM()
    rng = np.random.default_rng(1)
    weights = {k: (rng.standard_normal(v.shape) * 0.3).astype(np.float32) for k, v in lm.state_dict().items()}
    lm.load_state_dict(weights)
    session = engine.InferenceSession()
    model = lm.compile(TensorType(DType.int32, ["batch", "seq"], DeviceRef.CPU()), session=session)
    ids = rng.integers(0, 50, (2, 7)).astype(np.int32)
    out = model.execute(ids)[0].to_numpy()

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w

    def silu(v):
        return v / (1 + np.exp(-v))

    h = weights["embed.weight"][ids]
    for i in range(2):
        p = f"layers.{i}."
        n = rms(h, weights[p + "norm.weight"])
        g = n @ weights[p + "mlp.gate_proj.weight"].T
        u = n @ weights[p + "mlp.up_proj.weight"].T
        h = h + (silu(g) * u) @ weights[p + "mlp.down_proj.weight"].T
    ref = h @ weights["head.weight"].T + weights["head.bias"]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert model.output_metadata[0].shape == [None, None, 50]


def test_program_causal_mask_and_attention_scores():
    # MAX-style attention score computation with band_part causal masking and symbolic seq.
    t = TensorType(DType.float32, ["seq", 4], DeviceRef.CPU())
    with Graph("attn", input_types=[t, t, t]) as g:
        q, k, v = (x.tensor for x in g.inputs)
        scores = (q @ k.T) * (1.0 / np.sqrt(4.0))
        ones = ops.broadcast_to(ops.constant(1.0, DType.float32, DeviceRef.CPU()), [q.shape[0], q.shape[0]])
        mask = ops.band_part(ones, num_lower=None, num_upper=0)
        scores = ops.where(mask > 0, scores, ops.constant(-1e9, DType.float32, DeviceRef.CPU()))
        g.output(ops.softmax(scores) @ v)
    rng = np.random.default_rng(2)
    model = engine.InferenceSession().load(g)
    for n in (3, 5):
        q, k, v = (rng.standard_normal((n, 4)).astype(np.float32) for _ in range(3))
        s = q @ k.T / 2.0
        s = np.where(np.tril(np.ones((n, n))) > 0, s, -1e9)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        np.testing.assert_allclose(model.execute(q, k, v)[0].to_numpy(), p @ v, rtol=1e-5, atol=1e-6)
