"""MAX 26.7's ConvTranspose1d and WeightNormConvTranspose1d against MAX's own numbers
(tests/data/max_reference/ops_vision.npz) in graph, functional (jax.jit) and eager mode; MAX's
weight names and shapes; MAX's build-time rules."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType
from max_reference import load

REF = load("ops_vision")
CPU = DeviceRef.CPU()
TOL = dict(rtol=1e-5, atol=1e-5)
F32 = DType.float32


def _layers() -> dict:
    """The reference's permute=False layers (MAX 26.7 compiles those on CPU), loaded with its weights."""
    layers = {
        "ct": nn.ConvTranspose1d(3, 4, 5, F32, stride=2, padding=(0, 0, 1, 0), dilation=2, device=CPU, name="ct"),
        "ct1": nn.ConvTranspose1d(2, 3, 1, F32, has_bias=True, device=CPU, name="ct1"),
        "ct2": nn.ConvTranspose1d(3, 4, 5, F32, stride=2, padding=1, output_padding=1, device=CPU, name="ct2"),
        "wn2": nn.WeightNormConvTranspose1d(3, 3, 5, F32, stride=3, device=CPU, name="wn2"),
        "wn3": nn.ConvTranspose1d(4, 4, 6, F32, stride=2, padding=1, device=CPU, name="wn3"),
    }
    for name, layer in layers.items():
        assert sorted(layer.state_dict()) == list(REF[f"{name}.keys"])  # MAX's names
        layer.load_state_dict({k: REF[f"{name}/{k}"] for k in layer.state_dict()})  # and shapes
    return layers


def _permuted() -> tuple:
    """permute=True layers (PyTorch layouts) holding the weights of ct2 / wn3, with their expected
    outputs derived from MAX's permute=False numbers (MAX 26.7's CPU kernel refuses CFRS)."""
    w2, b = REF["ct2/ct2.weight"], np.arange(5, dtype=np.float32) - 2  # w2 [k=3, out=5, in=4]
    ctp = nn.ConvTranspose1d(3, 4, 5, F32, stride=2, padding=1, output_padding=1, has_bias=True, permute=True, device=CPU, name="ctp")
    # contiguous copies: state_dict() hands back what was loaded, and a registry refuses strided views (as MAX's)
    ctp.load_state_dict({"ctp.weight": np.ascontiguousarray(np.transpose(w2, (2, 1, 0))), "ctp.bias": b})  # [in, out, k]
    want_ctp = np.transpose(REF["ct2.out"], (0, 2, 1)) + b[:, None]  # [batch, out, new_length]
    bw = np.linspace(-1, 1, 6).astype(np.float32)
    v = np.ascontiguousarray(np.transpose(REF["wn3/wn3.weight"], (2, 1, 0)))  # [in=4, out=6, k=4]
    g = 2 * np.sqrt((v**2).sum((1, 2)))[:, None, None]  # [in, 1, 1]: weight = 2 v
    wn = nn.WeightNormConvTranspose1d(4, 4, 6, F32, stride=2, padding=1, has_bias=True, permute=True, device=CPU, name="wn")
    # MAX's extra keys: the inner layer's weight (unused: NaN proves it) and its bias (the same Weight as wn.bias)
    unused = {"conv.wn.weight": np.full((4, 6, 4), np.nan, np.float32), "conv.wn.bias": bw}
    wn.load_state_dict({"wn.weight_v": v, "wn.weight_g": g.astype(np.float32), "wn.bias": bw, **unused})
    want_wn = 2 * np.transpose(REF["wn3.out"], (0, 2, 1)) + bw[:, None]
    # [batch, in, length], contiguous: execute refuses a strided view, as MAX does
    xs = (np.ascontiguousarray(np.transpose(REF["ct2.x"], (0, 2, 1))), np.ascontiguousarray(np.transpose(REF["wn3.x"], (0, 2, 1))))
    return (ctp, wn), xs, (want_ctp, want_wn)


def test_weight_names_shapes_and_attributes_are_max():
    for cls in ("ConvTranspose1d", "WeightNormConvTranspose1d"):
        layer = getattr(nn, cls)(3, 4, 5, F32, device=CPU, name="p", has_bias=True, permute=True)
        raw = sorted(layer.raw_state_dict().items())
        assert [k for k, _ in raw] == list(REF[f"{cls}.permute.keys"])
        shapes = [[int(d) for d in w.shape] + [0] * (3 - len(w.shape)) for _, w in raw]
        np.testing.assert_array_equal(shapes, REF[f"{cls}.permute.shapes"])
    c = nn.ConvTranspose1d(3, 4, 5, F32, stride=2, padding=1, dilation=3, output_padding=1)
    assert (c.stride, c.padding, c.dilation, c.output_padding, c.kernel_length) == ((1, 2), (0, 0, 1, 1), (1, 3), (0, 1), 3)
    assert c.bias is None and sorted(c.state_dict()) == ["weight"]
    w = nn.WeightNormConvTranspose1d(3, 4, 5, F32)
    # MAX keeps the inner layer's deleted (unused) weight registered
    assert sorted(w.state_dict()) == ["conv.weight", "weight_g", "weight_v"] and not hasattr(w.conv, "weight")


def test_layers_match_max_in_three_modes():
    layers = _layers()
    (ctp, wn), (xp, xw), (want_ctp, want_wn) = _permuted()
    every = {**layers, "ctp": ctp, "wn": wn}
    xs = {**{n: REF[f"{n}.x"] for n in layers}, "ctp": xp, "wn": xw}
    want = {**{n: REF[f"{n}.out"] for n in layers}, "ctp": want_ctp, "wn": want_wn}
    for n, layer in every.items():
        np.testing.assert_allclose(np.asarray(layer(xs[n])), want[n], **TOL, err_msg=n)
        f = jax.jit(lambda s, v, layer=layer: nn.functional_call(layer, s, v))
        np.testing.assert_allclose(np.asarray(f(nn.state(layer), xs[n])), want[n], **TOL, err_msg=n)
    g = Graph("ctl", forward=lambda *v: [layer(t) for layer, t in zip(every.values(), v)],
              input_types=[TensorType(F32, xs[n].shape, CPU) for n in every])  # fmt: skip
    registry = {k: v for layer in every.values() for k, v in layer.state_dict().items()}
    outs = InferenceSession().load(g, weights_registry=registry).execute(*xs.values())
    for n, o in zip(every, outs):
        np.testing.assert_allclose(o.to_numpy(), want[n], **TOL, err_msg=n)


def test_max_build_time_rules():
    # MAX adds the bias of the NHWC (permute=False) path along the wrong axis: only 1 channel builds
    c = nn.ConvTranspose1d(3, 4, 5, F32, has_bias=True, device=CPU)
    c.load_state_dict({"weight": np.ones((3, 5, 4), np.float32), "bias": np.ones(5, np.float32)})
    # [N, L, F, 1] + [F] broadcasts to [N, L, F, F]; permuted back, the height-1 axis is gone
    with pytest.raises(ValueError, match=r"Squeeze dim must be 1, got axis=1, shape=\[Dim\(2\), Dim\(5\), Dim\(9\), Dim\(5\)\]"):
        Graph("b", forward=c, input_types=[TensorType(F32, [2, 7, 4], CPU)])
    # MAX's weight norm without permute normalises over the kernel axis: weight_g [in, 1, 1] must
    # broadcast against [length, out, in]
    w = nn.WeightNormConvTranspose1d(3, 4, 5, F32, device=CPU)
    with pytest.raises(ValueError, match="mul"):
        Graph("w", forward=w, input_types=[TensorType(F32, [2, 7, 4], CPU)])
    with pytest.raises(ValueError, match=r"input channels \(3, axis 3 of NHWC input\) must match the filter's input channels \(4"):
        Graph("c", forward=nn.ConvTranspose1d(3, 4, 5, F32, device=CPU), input_types=[TensorType(F32, [2, 7, 3], CPU)])
