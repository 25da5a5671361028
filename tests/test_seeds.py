"""The examples of MAX's reference pages (../shared/seeds/), run with `max` replaced by `maxjax`.

Fixes are only where the page itself is wrong, each said where it is made.
"""

from __future__ import annotations

import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.graph import DeviceRef, Graph, TensorType, Weight, ops
from maxjax.engine import InferenceSession


def test_module_page_mlp_example():
    # Seed max-nn-Module.txt. Fixes: the page's Linear declares its weight as (in_dim, out_dim)
    # (with an undefined name `in_dim` for `in_dims`) and computes `x @ weight.T`, which cannot
    # trace (MAX fails at MatmulOp too); nn.Linear stores (out_dim, in_dim), as here. The page's
    # MLP also skips super().__init__(), which must (and does) still work.
    class Linear(nn.Module):
        def __init__(self, in_dims, out_dims):
            super().__init__()
            self.weight = Weight("weight", DType.float32, (out_dims, in_dims), DeviceRef.CPU())

        def __call__(self, x):
            return x @ self.weight.T

    class MLP(nn.Module):
        def __init__(self):
            self.up = Linear(5, 10)
            self.gate = Linear(5, 10)
            self.down = Linear(10, 5)

        def __call__(self, x):
            return self.down(ops.silu(self.gate(x)) + self.up(x))

    model = MLP()
    sd = model.state_dict()  # {"up.weight": Buffer([5, 10]), ...}
    assert {k: tuple(v.shape) for k, v in sd.items()} == {"up.weight": (10, 5), "gate.weight": (10, 5), "down.weight": (5, 10)}
    rng = np.random.default_rng(0)
    model.load_state_dict({k: rng.standard_normal(v.shape).astype(np.float32) for k, v in sd.items()})
    g = Graph("mlp", forward=model, input_types=[TensorType(DType.float32, ["batch", 5], DeviceRef.CPU())])
    x = rng.standard_normal((2, 5)).astype(np.float32)
    out = InferenceSession().load(g, weights_registry=model.state_dict()).execute(x)[0].to_numpy()
    w = model.state_dict()
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    ref = (silu(x @ w["gate.weight"].T) + x @ w["up.weight"].T) @ w["down.weight"].T
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_module_page_build_subgraph_example():
    # Seed max-nn-Module.txt, build_subgraph example, inside a transformer-like module.
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4, DType.float32, DeviceRef.CPU())

        def __call__(self, x):
            return x + ops.tanh(self.proj(x))

    class Model(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.layers = nn.LayerList([Block() for _ in range(n)])

        def __call__(self, x):
            h = [x]
            input_types = [hidden.type for hidden in h]
            subgraph = self.layers[0].build_subgraph("transformer_block", input_types=input_types, weight_prefix="layers.0.")
            for idx in range(len(self.layers)):
                outputs = ops.call(subgraph, *h, prefix=f"layers.{idx}.")
                h = [x.tensor for x in outputs]
            return h[0]

    m = Model(3)
    rng = np.random.default_rng(1)
    m.load_state_dict({k: rng.standard_normal(v.shape).astype(np.float32) for k, v in m.state_dict().items()})
    g = Graph("m", forward=m, input_types=[TensorType(DType.float32, ["b", 4], DeviceRef.CPU())])
    x = rng.standard_normal((2, 4)).astype(np.float32)
    out = InferenceSession().load(g, weights_registry=m.state_dict()).execute(x)[0].to_numpy()
    ref = x
    for i in range(3):
        ref = ref + np.tanh(ref @ m.state_dict()[f"layers.{i}.proj.weight"].T)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_weight_page_dtype_and_shape_examples():
    # Seed max-graph-Weight.txt. Fix: the page uses DeviceRef without importing it.
    matrix = np.array([[1, 2], [3, 4]], dtype=np.float32)
    with Graph("dtype_demo") as graph:
        tensor = ops.constant(matrix, dtype=DType.float32, device=DeviceRef.CPU())
        assert f"Data type: {tensor.dtype}" == "Data type: DType.float32"
    with Graph("shape_demo") as graph:  # noqa: F841
        tensor = ops.constant(matrix, dtype=DType.float32, device=DeviceRef.CPU())
        assert f"Shape: {tensor.shape}" == "Shape: [2, 2]"
        assert repr(tensor.shape) == "[Dim(2), Dim(2)]"


def test_weight_page_attributes_and_shard():
    from maxjax.graph import QuantizationEncoding, ShardingStrategy

    w = Weight("w", DType.float32, (6, 4), DeviceRef.CPU(), align=16)
    assert (w.name, w.dtype, w.shape, w.device, w.align) == ("w", DType.float32, [6, 4], DeviceRef.CPU(), 16)
    assert w.quantization_encoding is None and w.shard_idx is None and w.sharding_strategy is None
    assert w.original_dtype_and_shape == (DType.float32, [6, 4])
    with pytest.raises(ValueError, match="cannot be sharded because no sharding strategy was provided"):
        w.shard([DeviceRef.CPU()])
    w.sharding_strategy = ShardingStrategy.rowwise(2)
    s0, s1 = w.shard([DeviceRef.CPU(0), DeviceRef.CPU(1)])
    assert (s0.name, s0.shard_idx, s1.shard_idx) == ("w[0]", 0, 1)
    with pytest.raises(ValueError, match="already sharded"):
        s0.shard([DeviceRef.CPU()])
    value = np.arange(24, dtype=np.float32).reshape(6, 4)
    with Graph("shards", input_types=[]) as g:
        g.output(s0 * 1.0, s1 * 1.0)
    a, b = InferenceSession().load(g, weights_registry={"w": value}).execute()
    np.testing.assert_array_equal(a.to_numpy(), value[:3])
    np.testing.assert_array_equal(b.to_numpy(), value[3:])
    q = Weight("q", DType.uint8, (4, 18), DeviceRef.CPU(), QuantizationEncoding.Q4_0)
    assert q.original_dtype_and_shape == (DType.float32, [4, 32])
    assert repr(q) == "Weight(q, DType.uint8, [Dim(4), Dim(18)], cpu:0, QuantizationEncoding.Q4_0)"


def test_layer_page_hooks_example(capsys):
    # Seed max-pipelines-nn-layer.txt: add_layer_hook / clear_hooks from maxjax.nn.layer.
    from maxjax.nn.layer import add_layer_hook, clear_hooks

    def print_info(layer, args, kwargs, outputs):
        print("Layer:", type(layer).__name__)
        print("Input args:", args)
        print("Input kwargs:", kwargs)
        print("Outputs:", outputs)
        return outputs

    add_layer_hook(print_info)
    lin = nn.Linear(2, 2, DType.float32, DeviceRef.CPU())
    lin.load_state_dict({"weight": np.eye(2, dtype=np.float32)})
    with Graph("h", input_types=[TensorType(DType.float32, [1, 2], DeviceRef.CPU())]) as g:
        g.output(lin(g.inputs[0]))
    out = capsys.readouterr().out
    assert "Layer: Linear" in out and "Outputs: TensorValue(" in out
    clear_hooks()
    lin(np.ones((1, 2), np.float32))
    assert capsys.readouterr().out == ""


def test_layer_page_layerv2_and_recursive_named_layers():
    from maxjax.nn.layer import LayerList, LayerV2, recursive_named_layers

    class Net(LayerV2):
        def __init__(self):
            super().__init__()
            self.blocks = LayerList([nn.Linear(2, 2, DType.float32), nn.Linear(2, 2, DType.float32)])

        def __call__(self, x):
            return self.blocks(x)

    net = Net()
    assert [n for n, _ in recursive_named_layers(net)] == ["", "blocks", "blocks.0", "blocks.1"]
    assert list(net.blocks.sublayers) == ["0", "1"]
    assert net.raw_state_dict()["blocks.1.weight"] is net.blocks[1].weight


def test_weights_page_graph_weights_example():
    # Seed max-graph-weights-Weights.txt: graph.weights() (MAX 26.7 lacks it; maxjax has it).
    graph = Graph("my_model")
    weights = graph.weights()
    attn_weight = weights.transformer.layers[0].attention.weight.allocate(dtype=DType.float32, shape=(768, 768))
    assert attn_weight.name == "transformer.layers.0.attention.weight"
    assert weights.transformer.layers[0].name == "transformer.layers.0"
    if weights.transformer.layers[0].mlp.weight.exists():
        raise AssertionError("nothing was allocated under that name")
    with graph:
        t = graph.add_weight(attn_weight)
    assert t.shape == [768, 768]
    assert weights.transformer.layers[0].attention.weight.exists()
