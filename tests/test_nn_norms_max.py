"""MAX 26.7's ConstantLayerNorm, GroupNorm and ops.group_norm against MAX's own numbers
(tests/data/max_reference/normconv.npz), in graph, functional and eager mode."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, ops
from max_reference import load

REF = load("normconv")
CPU = DeviceRef.CPU()


def _layers():
    gn = nn.GroupNorm(3, 6, eps=1e-5, affine=True, device=CPU)
    gn.load_state_dict({"weight": REF["gn.weight"], "bias": REF["gn.bias"]})
    return gn, nn.GroupNorm(2, 6, affine=False, device=CPU), nn.ConstantLayerNorm(8, CPU, DType.float32, eps=1e-5)


def test_norms_match_max_in_three_modes():
    gn, gn_plain, cln = _layers()
    x, h = REF["x"], REF["h"]
    want = [REF["gn_out"], REF["gn_plain_out"], REF["cln_out"]]
    eager = [gn(x), gn_plain(x), cln(h)]
    jitted = [
        jax.jit(lambda s, v: nn.functional_call(gn, s, v))(nn.state(gn), x),
        jax.jit(lambda v: nn.functional_call(gn_plain, {}, v))(x),
        jax.jit(lambda v: nn.functional_call(cln, {}, v))(h),
    ]
    g = Graph("norms", forward=lambda a, b: (gn(a), gn_plain(a), cln(b)),
              input_types=[TensorType(DType.float32, x.shape, CPU), TensorType(DType.float32, h.shape, CPU)])  # fmt: skip
    graph = [o.to_numpy() for o in InferenceSession().load(g, weights_registry=gn.state_dict()).execute(x, h)]
    for mode in (eager, jitted, graph):
        for got, w in zip(mode, want):
            np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-5)
    assert sorted(gn.state_dict()) == ["bias", "weight"] and gn_plain.state_dict() == {} and cln.state_dict() == {}


def test_group_norm_refusals():
    with pytest.raises(ValueError, match=r"num_channels\(6\) should be divisible by num_groups\(4\)"):
        nn.GroupNorm(4, 6, device=CPU)
    gn, _, _ = _layers()
    with pytest.raises(ValueError, match="Expected 6 channels"):
        gn(np.zeros((2, 5, 3), np.float32))
    with pytest.raises(ValueError, match="must be divisible by num_groups"):
        ops.group_norm(np.zeros((2, 6, 3), np.float32), np.ones(6, np.float32), np.zeros(6, np.float32), 4, 1e-5)
    with pytest.raises(ValueError, match=r"gamma must have shape \[6\]"):
        ops.group_norm(np.zeros((2, 6, 3), np.float32), np.ones(5, np.float32), np.zeros(6, np.float32), 3, 1e-5)


def _convs():
    from maxjax.dtype import DType as D

    return {
        "c1": nn.Conv1D(3, 4, 6, D.float32, stride=2, padding=(1, 2), has_bias=True, device=CPU, name="c1"),
        "c1p": nn.Conv1D(3, 4, 6, D.float32, padding=1, num_groups=2, permute=True, device=CPU, name="c1p"),
        "c2": nn.Conv2d((3, 2), 4, 6, D.float32, stride=(2, 1), padding=(1, 0, 1, 1), dilation=(1, 2), has_bias=True, device=CPU, name="c2"),
        "c2p": nn.Conv2d(3, 4, 6, D.float32, padding=1, num_groups=2, permute=True, has_bias=True, device=CPU, name="c2p"),
        "c3": nn.Conv3D(2, 3, 2, 4, 5, D.float32, stride=(1, 2, 1), padding=1, has_bias=True, device=CPU, name="c3"),
        "c3p": nn.Conv3D(2, 2, 2, 4, 5, D.float32, permute=True, device=CPU, name="c3p"),
    }  # fmt: skip


XS = ["x1", "x1p", "x2", "x2p", "x3", "x3p"]


def test_convolutions_match_max_in_three_modes():
    layers = _convs()
    for name, layer in layers.items():
        keys = [k for k in REF if k.startswith(f"{name}.") and k != f"{name}.out"]
        assert sorted(layer.state_dict()) == sorted(keys)  # MAX's names (and shapes, below)
        layer.load_state_dict({k: REF[k] for k in keys})
    for (name, layer), xk in zip(layers.items(), XS):
        x, want = REF[xk], REF[f"{name}.out"]
        np.testing.assert_allclose(np.asarray(layer(x)), want, rtol=1e-5, atol=1e-5)
        f = jax.jit(lambda s, v, layer=layer: nn.functional_call(layer, s, v))
        np.testing.assert_allclose(np.asarray(f(nn.state(layer), x)), want, rtol=1e-5, atol=1e-5)
    g = Graph("convs", forward=lambda *v: [layer(t) for layer, t in zip(layers.values(), v)],
              input_types=[TensorType(DType.float32, REF[x].shape, CPU) for x in XS])  # fmt: skip
    registry = {k: v for layer in layers.values() for k, v in layer.state_dict().items()}
    outs = InferenceSession().load(g, weights_registry=registry).execute(*(REF[x] for x in XS))
    for name, o in zip(layers, outs):
        np.testing.assert_allclose(o.to_numpy(), REF[f"{name}.out"], rtol=1e-5, atol=1e-5)


def test_conv_refusals_at_build_time():
    with pytest.raises(ValueError, match=r"input channels \(5\) must equal"):
        ops.conv2d(np.zeros((1, 4, 4, 5), np.float32), np.zeros((3, 3, 4, 2), np.float32))
    with pytest.raises(ValueError, match="input must have rank 4"):
        ops.conv2d(np.zeros((4, 4, 4), np.float32), np.zeros((3, 3, 4, 2), np.float32))
    with pytest.raises(NotImplementedError, match="channels-last"):
        ops.conv2d(np.zeros((1, 4, 4, 4), np.float32), np.zeros((3, 3, 4, 2), np.float32), input_layout="NCHW")
    with pytest.raises(ValueError, match="only replicate"):
        _convs()["c2"].sharding_strategy = __import__("maxjax").graph.ShardingStrategy.rowwise(2)
