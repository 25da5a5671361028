"""Every op, in all three modes (graph + InferenceSession, eager TensorValues, plain jnp arrays),
against NumPy references on random data."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special as sp_special

from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, TensorValue, ops

RNG = np.random.default_rng(0)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def run_graph(fn, *arrays, symbolic=False):
    types = []
    for i, a in enumerate(arrays):
        shape = list(a.shape)
        if symbolic and shape:
            shape[0] = "batch"
        types.append(TensorType(DType.from_numpy(a.dtype), shape, DeviceRef.CPU()))
    g = Graph("t", forward=fn, input_types=types)
    outs = InferenceSession().load(g, weights_registry={}).execute(*arrays)
    return [o.to_numpy() for o in outs]


def run_eager(fn, *arrays):
    out = fn(*[TensorValue(jnp.asarray(a)) for a in arrays])
    outs = out if isinstance(out, (list, tuple)) else [out]
    assert all(isinstance(o, TensorValue) for o in outs)
    return [o.to_numpy() for o in outs]


def run_jnp(fn, *arrays):
    out = fn(*[jnp.asarray(a) for a in arrays])
    outs = out if isinstance(out, (list, tuple)) else [out]
    assert all(isinstance(o, jax.Array) for o in outs), [type(o) for o in outs]
    return [np.asarray(o) for o in outs]


def check_all_modes(fn, ref, *arrays, atol=1e-5, symbolic=True, jnp_mode=True):
    expected = ref(*arrays)
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    runners = [("graph", run_graph), ("eager", run_eager)] + ([("jnp", run_jnp)] if jnp_mode else [])
    for name, runner in runners:
        got = runner(fn, *arrays)
        assert len(got) == len(expected), name
        for g, e in zip(got, expected):
            e = np.asarray(e)
            assert g.shape == e.shape, (name, g.shape, e.shape)
            assert g.dtype == e.dtype or (e.dtype == np.float64 and g.dtype == np.float32), (name, g.dtype, e.dtype)
            np.testing.assert_allclose(g, e, atol=atol, rtol=1e-5, err_msg=name)
    if symbolic:
        got = run_graph(fn, *arrays, symbolic=True)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, np.asarray(e), atol=atol, rtol=1e-5, err_msg="symbolic graph")


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


UNARY = [
    ("negate", ops.negate, np.negative),
    ("abs", ops.abs, np.abs),
    ("exp", ops.exp, np.exp),
    ("tanh", ops.tanh, np.tanh),
    ("sin", ops.sin, np.sin),
    ("cos", ops.cos, np.cos),
    ("erf", ops.erf, sp_special.erf),
    ("silu", ops.silu, lambda x: x * _sigmoid(x)),
    ("relu", ops.relu, lambda x: np.maximum(x, 0)),
    ("sigmoid", ops.sigmoid, _sigmoid),
    ("gelu", ops.gelu, lambda x: 0.5 * x * (1 + sp_special.erf(x / math.sqrt(2)))),
    (
        "gelu_tanh",
        lambda x: ops.gelu(x, approximate="tanh"),
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    ),
    ("floor", ops.floor, np.floor),
    ("softmax", ops.softmax, lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)),
    ("logsoftmax", ops.logsoftmax, lambda x: x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))),
    ("mean", lambda x: ops.mean(x, axis=-1), lambda x: x.mean(-1, keepdims=True)),
    ("sum", lambda x: ops.sum(x, axis=0), lambda x: x.sum(0, keepdims=True)),
    ("max", lambda x: ops.max(x, axis=1), lambda x: x.max(1, keepdims=True)),
    ("min", lambda x: ops.min(x), lambda x: x.min(-1, keepdims=True)),
    ("argmax", lambda x: ops.argmax(x, axis=-1), lambda x: x.argmax(-1)[..., None].astype(np.int32)),
    ("argmin", lambda x: ops.argmin(x, axis=1), lambda x: x.argmin(1)[:, None].astype(np.int32)),
    ("cumsum", lambda x: ops.cumsum(x, axis=-1), lambda x: np.cumsum(x, -1)),
    ("cumsum_excl_rev", lambda x: ops.cumsum(x, axis=-1, exclusive=True, reverse=True), lambda x: np.flip(np.cumsum(np.flip(x, -1), -1), -1) - x),
    ("transpose", lambda x: ops.transpose(x, 0, 2), lambda x: np.swapaxes(x, 0, 2)),
    ("T", lambda x: x.T, lambda x: np.swapaxes(x, -1, -2)),
    ("permute", lambda x: ops.permute(x, [2, 0, 1]), lambda x: np.transpose(x, (2, 0, 1))),
    ("reshape", lambda x: ops.reshape(x, [x.shape[0], -1]), lambda x: x.reshape(x.shape[0], -1)),
    ("flatten", lambda x: ops.flatten(x, 1), lambda x: x.reshape(x.shape[0], -1)),
    ("squeeze", lambda x: ops.squeeze(ops.unsqueeze(x, 1), 1), lambda x: x),
    ("unsqueeze", lambda x: ops.unsqueeze(x, -1), lambda x: x[..., None]),
    ("broadcast_to", lambda x: ops.broadcast_to(x[:, :1], [x.shape[0], 3, 5]), lambda x: np.broadcast_to(x[:, :1], (x.shape[0], 3, 5))),
    ("tile", lambda x: ops.tile(x, [1, 2, 1]), lambda x: np.tile(x, (1, 2, 1))),
    ("pad", lambda x: ops.pad(x, [0, 0, 1, 2, 0, 1], value=0.5), lambda x: np.pad(x, ((0, 0), (1, 2), (0, 1)), constant_values=0.5)),
    ("slice", lambda x: x[:, 1:, -1], lambda x: x[:, 1:, -1]),
    ("slice_ellipsis", lambda x: x[..., ::2, None], lambda x: x[..., ::2, None]),
    ("split", lambda x: ops.split(x, [2, 3], axis=2), lambda x: [x[:, :, :2], x[:, :, 2:]]),
    ("chunk", lambda x: ops.chunk(x, 5, axis=2), lambda x: [x[:, :, i : i + 1] for i in range(5)]),
    ("top_k", lambda x: ops.top_k(x, 2, axis=-1), lambda x: [np.sort(x, -1)[..., ::-1][..., :2], np.argsort(-x, -1)[..., :2].astype(np.int32)]),
    ("band_part", lambda x: ops.band_part(x, None, 0), lambda x: np.tril(x)),
    ("band_part_excl", lambda x: ops.band_part(x, 0, 1, exclude=True), lambda x: x - np.triu(np.tril(x, 1), 0)),
    ("cast", lambda x: ops.cast(x * 10, DType.int32), lambda x: (x * 10).astype(np.int32)),
    ("rsqrt", lambda x: ops.rsqrt(ops.abs(x) + 1), lambda x: 1 / np.sqrt(np.abs(x) + 1)),
    ("log_sqrt", lambda x: ops.log(ops.sqrt(ops.abs(x) + 1)), lambda x: np.log(np.sqrt(np.abs(x) + 1))),
    ("pow", lambda x: ops.pow(ops.abs(x), 2.5), lambda x: np.abs(x) ** 2.5),
    ("scalar_arith", lambda x: (2.0 * x - 1.0) / 4.0 + x ** 2, lambda x: (2 * x - 1) / 4 + x**2),
    ("compare_where", lambda x: ops.where(x > 0, x, 0.0), lambda x: np.where(x > 0, x, 0).astype(np.float32)),
    ("logical", lambda x: ops.logical_not(ops.logical_or(ops.logical_and(x > 0, x < 1), ops.equal(x, x))), lambda x: ~(((x > 0) & (x < 1)) | (x == x))),
    ("greater_equal", lambda x: ops.cast(ops.greater_equal(x, 0.0), DType.float32), lambda x: (x >= 0).astype(np.float32)),
]


@pytest.mark.parametrize("name,fn,ref", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ops_all_modes(name, fn, ref):
    # `x.T` on a plain jax array is JAX's own (all axes reversed); MAX's swaps the last two.
    check_all_modes(fn, ref, _f32(2, 4, 5), jnp_mode=name != "T")


BINARY = [
    ("add", ops.add, np.add),
    ("sub", ops.sub, np.subtract),
    ("mul", ops.mul, np.multiply),
    ("div", ops.div, np.divide),
    ("max2", ops.max, np.maximum),
    ("min2", ops.min, np.minimum),
    ("concat", lambda a, b: ops.concat([a, b], axis=1), lambda a, b: np.concatenate([a, b], 1)),
    ("stack", lambda a, b: ops.stack([a, b], axis=0), lambda a, b: np.stack([a, b], 0)),
    ("matmul", lambda a, b: a @ ops.transpose(b, -1, -2), lambda a, b: a @ np.swapaxes(b, -1, -2)),
    ("operators", lambda a, b: -a + abs(b) * a - b / (abs(a) + 1), lambda a, b: -a + np.abs(b) * a - b / (np.abs(a) + 1)),
]


@pytest.mark.parametrize("name,fn,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_ops_all_modes(name, fn, ref):
    check_all_modes(fn, ref, _f32(3, 4, 5), _f32(3, 4, 5), symbolic=name not in ("stack",))


def test_norms_all_modes():
    x, w, b = _f32(2, 3, 8), _f32(8), _f32(8)

    def rms_ref(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    def ln_ref(x, w, b):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b

    check_all_modes(lambda x, w: ops.rms_norm(x, w, 1e-6), rms_ref, x, w, symbolic=False)
    check_all_modes(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), ln_ref, x, w, b, symbolic=False)


def test_rms_norm_defaults_are_maxs_op_llama_style_layer_gemma_style():
    import inspect

    from maxjax import nn

    assert inspect.signature(ops.rms_norm).parameters["multiply_before_cast"].default is False  # MAX 26.7's op
    assert inspect.signature(nn.RMSNorm).parameters["multiply_before_cast"].default is True  # MAX 26.7's layer
    x = _f32(2, 8).astype(jnp.bfloat16)
    w = _f32(8)
    layer = nn.RMSNorm(8, DType.float32)
    layer.load_state_dict({"weight": w})
    normed = np.asarray(x, np.float32) / np.sqrt((np.asarray(x, np.float32) ** 2).mean(-1, keepdims=True) + 1e-6)
    # the layer casts the weight to the input's dtype first, then multiplies before the cast back
    expected = (normed * np.asarray(w.astype(jnp.bfloat16), np.float32)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(layer(x)), expected)
    with pytest.raises(ValueError, match=r"RMSNorm weight dimension \(8\) must match the input's last dimension \(4\)"):
        layer(_f32(2, 4))


def test_gather_outer_range_all_modes():
    table = _f32(10, 4)
    idx = np.array([[1, 9], [0, 3]], dtype=np.int32)
    check_all_modes(lambda t, i: ops.gather(t, i, axis=0), lambda t, i: t[i], table, idx, symbolic=False)
    check_all_modes(lambda a, b: ops.outer(a, b), np.outer, _f32(3), _f32(4), symbolic=False)
    check_all_modes(
        lambda x: x + ops.cast(ops.range(0, 4, 1, dtype=DType.int32), DType.float32),
        lambda x: x + np.arange(4, dtype=np.float32),
        _f32(3, 4),
        jnp_mode=False,  # creation ops (range, constant) give TensorValues even outside graphs
    )
    check_all_modes(lambda t, i: t[i, 1:], lambda t, i: t[i, 1:], table, np.array([2, 5], np.int32), symbolic=False)


def test_range_with_symbolic_bound_in_graph():
    t = TensorType(DType.float32, ["seq", 2], DeviceRef.CPU())
    with Graph("r", input_types=[t]) as g:
        x = g.inputs[0]
        r = ops.range(0, x.shape[0], 1, dtype=DType.int32)
        assert str(r.shape[0]) == "seq"
        g.output(r)
    out = InferenceSession().load(g).execute(np.zeros((5, 2), np.float32))[0].to_numpy()
    np.testing.assert_array_equal(out, np.arange(5))


def test_reshape_with_symbolic_dims_and_names():
    t = TensorType(DType.float32, ["batch", "seq", 6], DeviceRef.CPU())
    with Graph("r", input_types=[t]) as g:
        x = g.inputs[0]
        y = ops.reshape(x, ["batch", "seq", 2, 3])
        assert [str(d) for d in y.shape] == ["batch", "seq", "2", "3"]
        z = ops.reshape(y, [x.shape[0] * x.shape[1], -1])
        assert str(z.shape[0]) == "batch*seq"
        g.output(z)
    out = InferenceSession().load(g).execute(np.arange(2 * 3 * 6, dtype=np.float32).reshape(2, 3, 6))[0]
    np.testing.assert_array_equal(out.to_numpy(), np.arange(36, dtype=np.float32).reshape(6, 6))


def test_shape_inference_errors_name_the_op_and_types():
    t = TensorType(DType.float32, ["batch", 5], DeviceRef.CPU())
    with Graph("bad", input_types=[t, TensorType(DType.float32, [4, 3], DeviceRef.CPU())]) as g:
        with pytest.raises(ValueError, match=r"matmul\(float32\[batch, 5\], float32\[4, 3\]\)"):
            ops.matmul(g.inputs[0], g.inputs[1])
        with pytest.raises(ValueError, match="split: sizes"):
            ops.split(g.inputs[1], [1, 1], axis=0)
        with pytest.raises(ValueError, match="pad: expected 4 paddings"):
            ops.pad(g.inputs[1], [1, 1])
        with pytest.raises(ValueError, match="approximate"):
            ops.gelu(g.inputs[0], approximate="fast")


def test_values_of_two_graphs_cannot_mix():
    t = TensorType(DType.float32, [2], DeviceRef.CPU())
    g1 = Graph("a", input_types=[t])
    g2 = Graph("b", input_types=[t])
    with pytest.raises(ValueError, match="two graphs"):
        ops.add(g1.inputs[0], g2.inputs[0])
    with g2, pytest.raises(ValueError, match="outside the region"):
        ops.negate(g1.inputs[0])


def test_jnp_inputs_give_jnp_outputs_under_jit_and_grad():
    f = jax.jit(lambda x: ops.sum(ops.silu(x), axis=-1))
    x = jnp.linspace(-2, 2, 8, dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(f(x)), [np.sum(np.asarray(x) * (1 / (1 + np.exp(-np.asarray(x)))))], rtol=1e-5)
    g = jax.grad(lambda x: ops.sum(ops.tanh(x), axis=0)[0])(x)
    np.testing.assert_allclose(np.asarray(g), 1 - np.tanh(np.asarray(x)) ** 2, rtol=1e-5)
