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
