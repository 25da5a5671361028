"""InferenceSession / Model: validation, symbolic dims, compile caching, weights as arguments."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.engine import InferenceSession, TensorSpec
from maxjax.graph import DeviceRef, Graph, TensorType, Weight, ops

RNG = np.random.default_rng(2)


def _affine_graph():
    w = Weight("w", DType.float32, (4, 3), DeviceRef.CPU())
    b = Weight("b", DType.float32, (4,), DeviceRef.CPU())
    with Graph("affine", input_types=[TensorType(DType.float32, ["batch", 3], DeviceRef.CPU())]) as g:
        g.output(g.inputs[0] @ w.T + b)
    return g


def test_execute_matches_numpy_and_returns_buffers():
    g = _affine_graph()
    w, b = RNG.standard_normal((4, 3)).astype(np.float32), RNG.standard_normal(4).astype(np.float32)
    model = InferenceSession().load(g, weights_registry={"w": w, "b": b})
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    (out,) = model.execute(x)
    assert isinstance(out, Buffer) and out.dtype == DType.float32 and out.shape == (5, 4)
    np.testing.assert_allclose(out.to_numpy(), x @ w.T + b, rtol=1e-5)
    np.testing.assert_allclose(model(Buffer.from_numpy(x))[0].to_numpy(), x @ w.T + b, rtol=1e-5)
    assert model.input_metadata == [TensorSpec([None, 3], DType.float32, "input0")]
    assert model.output_metadata[0].shape == [None, 4]


def test_new_shapes_compile_once_each():
    g = _affine_graph()
    model = InferenceSession().load(g, weights_registry={"w": np.ones((4, 3), np.float32), "b": np.zeros(4, np.float32)})
    for n in [1, 2, 1, 2, 3, 3, 1]:
        model.execute(np.ones((n, 3), np.float32))
    assert model.num_compiles == 3


def test_weights_are_arguments_not_constants():
    g = _affine_graph()
    w = np.full((4, 3), 7.25, np.float32)
    model = InferenceSession().load(g, weights_registry={"w": w, "b": np.zeros(4, np.float32)})
    hlo = model._run.lower(model._state, np.ones((2, 3), np.float32)).as_text()
    assert "7.25" not in hlo
    assert hlo.count("tensor<4x3xf32>") >= 1


def test_registry_is_checked_against_declared_weights():
    g = _affine_graph()
    good = {"w": np.ones((4, 3), np.float32), "b": np.zeros(4, np.float32)}
    with pytest.raises(ValueError, match=r"Weight 'b' is not in the weights registry. Did you mean 'bb'\?"):
        InferenceSession().load(g, weights_registry={"w": good["w"], "bb": good["b"]})
    with pytest.raises(ValueError, match=r"weight 'w'.*shape \(expected=\(4, 3\), actual=\(3, 4\)\)"):
        InferenceSession().load(g, weights_registry=dict(good, w=np.ones((3, 4), np.float32)))
    with pytest.raises(ValueError, match=r"weight 'w'.*dtype \(expected=DType.float32, actual=DType.float16\)"):
        InferenceSession().load(g, weights_registry=dict(good, w=good["w"].astype(np.float16)))
    # extra keys are ignored, as in MAX
    InferenceSession().load(g, weights_registry=dict(good, extra=np.zeros(1)))


def test_bad_inputs_at_execute():
    t = [TensorType(DType.float32, ["batch", 3], DeviceRef.CPU()), TensorType(DType.float32, ["batch", 2], DeviceRef.CPU())]
    with Graph("two", input_types=t) as g:
        g.output(ops.concat([g.inputs[0], g.inputs[1]], axis=1))
    model = InferenceSession().load(g)
    np.testing.assert_array_equal(model.execute(np.ones((2, 3), np.float32), np.zeros((2, 2), np.float32))[0].to_numpy()[:, 3:], 0)
    with pytest.raises(ValueError, match=r"Symbolic dim 'batch' is bound to two sizes: 2 \(input 0, dim 0\) and 3 \(input 1, dim 0\)"):
        model.execute(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="Input at position 0.*expected rank 2"):
        model.execute(np.ones((3,), np.float32), np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="Input at position 1.*dim 1 must be 2"):
        model.execute(np.ones((2, 3), np.float32), np.ones((2, 5), np.float32))
    with pytest.raises(ValueError, match=r"Input at position 0.*expected dtype DType.float32, got DType.int32"):
        model.execute(np.ones((2, 3), np.int32), np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="expects 2 inputs, got 1"):
        model.execute(np.ones((2, 3), np.float32))


def test_unknown_device_and_graph_without_output():
    with pytest.raises(ValueError, match="Unknown device gpu:0"):
        DeviceRef.GPU(0).to_device()
    with pytest.raises(ValueError, match="Unknown device kind 'npu'"):
        DeviceRef("npu")
    g = Graph("empty", input_types=[TensorType(DType.float32, [1], DeviceRef.CPU())])
    with pytest.raises(ValueError, match="has no output"):
        InferenceSession().load(g)


def test_weights_placed_once_with_their_sharding():
    mesh = jax.make_mesh((8,), ("x",), devices=jax.devices("cpu")[:8])
    w = Weight("w", DType.float32, (8, 4), DeviceRef.CPU())
    w.sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", None))
    with Graph("s", input_types=[TensorType(DType.float32, [2, 4], DeviceRef.CPU())]) as g:
        g.output(g.inputs[0] @ w.T)
    value = RNG.standard_normal((8, 4)).astype(np.float32)
    model = InferenceSession().load(g, weights_registry={"w": value})
    assert model._state["weights"]["w"].sharding == w.sharding
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(model.execute(x)[0].to_numpy(), x @ value.T, rtol=1e-5)


def test_max_arguments_are_honoured_or_refused_never_ignored():
    with pytest.raises(ValueError, match=r"num_threads=.*cannot be honoured on JAX"):
        InferenceSession(num_threads=2)
    for kwargs in ({"custom_extensions": ["kernels.mojopkg"]}, {"precompiled_mefs": ["m.mef"]}, {"export_mefs": "out"}):
        with pytest.raises(NotImplementedError, match=f"InferenceSession\\({next(iter(kwargs))}=...\\)"):
            InferenceSession(**kwargs)
    with pytest.raises(TypeError):
        InferenceSession(threads=2)  # an argument MAX does not have
    g = _affine_graph()
    with pytest.raises(NotImplementedError, match=r"load\(tile_based_fusion=...\)"):
        InferenceSession().load(g, weights_registry={}, tile_based_fusion=True)
    with pytest.raises(NotImplementedError, match=r"Graph\(custom_extensions=...\)"):
        Graph("g", input_types=[], custom_extensions=["k.mojopkg"])
    with pytest.raises(TypeError, match="are passed to forward, but there is none"):
        Graph("g", None, [], None, 3)
    # MAX forwards extra arguments to forward
    t = TensorType(DType.float32, [2], DeviceRef.CPU())
    g = Graph("scaled", lambda x, s: x * s, [t], None, 3.0, is_device_graph=True)
    assert g.is_device_graph
    np.testing.assert_allclose(InferenceSession().load(g).execute(np.ones(2, np.float32))[0].to_numpy(), [3.0, 3.0])
    from maxjax import nn

    with pytest.raises(NotImplementedError, match="Linear\\(quant_config=.*not supported"):
        nn.Linear(4, 4, DType.float32, quant_config=object())
    shard = nn.Linear(4, 4, DType.float32, has_bias=True, is_sharding=True)  # MAX: a shard gets its weights assigned
    assert shard.layer_weights == {} and shard.bias is None
