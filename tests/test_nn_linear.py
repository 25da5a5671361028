"""MAX 26.7's Linear family in maxjax (issue 21): ``nn.linear``, ``nn.stacked_linear``,
``nn.quant_config``, ``nn.clamp``, ``nn.activation``.

Numbers: MAX's own outputs (``scripts/max_reference/linear.py``) in graph, functional (jit) and
eager mode. GPTQ and float8 run only on GPUs in MAX 26.7 (their kernels assert ``is_gpu``; the CPU
graph fails to compile), so those are checked against NumPy written from the published layouts.
"""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from max_reference import load

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, ShardingStrategy, TensorType, ops
from maxjax.graph.quantization import QuantizationConfig, QuantizationEncoding, perm_idx_from_g_idx
from maxjax.nn import linear as nl
from maxjax.nn import quant_config as qc
from maxjax.nn import stacked_linear as sl
from maxjax.nn.activation import activation_function_from_name

REF = load("linear")
CPU = DeviceRef.CPU()
F32 = DType.float32
IN, HID, FF = 8, 8, 6
LAYERS = {  # the same configurations as scripts/max_reference/linear.py
    "lin": lambda: nn.Linear(IN, 5, F32, CPU),
    "lin_bias": lambda: nn.Linear(IN, 5, F32, CPU, has_bias=True),
    "lin_named": lambda: nn.Linear(IN, 4, F32, CPU, has_bias=True, name="proj"),
    "lin_clip": lambda: nn.Linear(IN, 5, F32, CPU, clip_weight=0.3),
    "mlp_silu": lambda: nn.MLP(F32, None, HID, FF, [CPU]),
    "mlp_gelu_bias": lambda: nn.MLP(F32, None, HID, FF, [CPU], has_bias=True, activation_function="gelu"),
    "mlp_gelu_tanh": lambda: nn.MLP(F32, None, HID, FF, [CPU], activation_function="gelu_tanh"),
    "mlp_relu_limit": lambda: nn.MLP(F32, None, HID, FF, [CPU], activation_function="relu", swiglu_limit=0.5),
    "mlp_sigmoid": lambda: nn.MLP(F32, None, HID, FF, [CPU], activation_function="sigmoid"),
    "mlp_tanh": lambda: nn.MLP(F32, None, HID, FF, [CPU], activation_function="tanh"),
    "fused_mlp": lambda: nn.FusedMLP(F32, HID, FF, [CPU], swiglu_limit=0.4),
    "qkv_unfused": lambda: nn.StackedLinear(IN, [4, 2, 2], ["q_proj", "k_proj", "v_proj"], F32, CPU, has_bias=True),
    "qkv_unfused_clip": lambda: nn.StackedLinear(IN, [3, 2], ["a_proj", "b_proj"], F32, CPU, clip_weight=0.2),
    "qkv_stacked": lambda: nn.StackedLinear(IN, [4, 2, 2], ["q", "k", "v"], F32, CPU, stacked=True, has_bias=True),
}


def _loaded(name):
    """The maxjax layer ``name`` with MAX's weights. In MAX's root module an unfused StackedLinear's
    weights sit at the root (``q_proj.weight``: its attribute name is omitted); the others under
    the layer's attribute name."""
    m = LAYERS[name]()
    keys = list(REF[f"keys.{name}"])
    m.load_state_dict({k: REF[f"w.{name}.{k}"] if f"w.{name}.{k}" in REF else REF[f"w.{k}"] for k in keys})
    return m


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_state_dict_keys_are_maxs(name):
    assert sorted(LAYERS[name]().raw_state_dict()) == list(REF[f"keys.{name}"])


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_three_modes_match_max(name):
    x, expected = REF["x"], REF[f"out.{name}"]
    m = _loaded(name)
    g = Graph(name, forward=m, input_types=[TensorType(F32, list(x.shape), CPU)])
    graph_out = InferenceSession().load(g, weights_registry=m.state_dict()).execute(x)[0].to_numpy()
    np.testing.assert_allclose(graph_out, expected, rtol=1e-5, atol=1e-6)
    m = _loaded(name)
    functional = jax.jit(lambda s, x: nn.functional_call(m, s, x))(nn.state(m), x)
    np.testing.assert_allclose(np.asarray(functional), expected, rtol=1e-5, atol=1e-6)
    eager = _loaded(name)(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(eager), expected, rtol=1e-5, atol=1e-6)


def test_stacked_keeps_its_attribute_name_when_nested():
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj = nn.StackedLinear(IN, [4, 2], ["q", "k"], F32, CPU, stacked=True)

        def __call__(self, x):
            return self.qkv_proj(x)

    assert sorted(Attn().raw_state_dict()) == ["qkv_proj.weight"]
    assert nn.StackedLinear(IN, [4], ["q"], F32, CPU)._omit_module_attr_name
    assert not nn.StackedLinear(IN, [4], ["q"], F32, CPU, stacked=True)._omit_module_attr_name


# -- signatures and types (MAX 26.7's, recorded by the reference script) ---------------------
SIGNATURES = {  # name in the reference -> the maxjax object
    "Linear": nl.Linear, "GPTQLinear": nl.GPTQLinear, "MLP": nl.MLP, "FusedMLP": nl.FusedMLP,
    "ColumnParallelLinear": nl.ColumnParallelLinear, "linear": nl.linear, "clamp": nl.clamp,
    "fp4_packed_k": nl.fp4_packed_k, "ceildiv": nl.ceildiv, "quantized_matmul": nl.quantized_matmul,
    "activation_function_from_name": activation_function_from_name, "StackedLinear": sl.StackedLinear,
    "QuantConfig": qc.QuantConfig, "InputScaleSpec": qc.InputScaleSpec, "WeightScaleSpec": qc.WeightScaleSpec,
    "QuantConfig.blockscaled_fp8": qc.QuantConfig.blockscaled_fp8, "QuantConfig.mxfp4": qc.QuantConfig.mxfp4,
    "QuantConfig.nvfp4": qc.QuantConfig.nvfp4,
}  # fmt: skip
#: maxjax's deliberate differences: Linear's ``device`` defaults to None and MLP's ``devices`` to
#: ``()`` (the CPU), because maxjax's own tests and examples build ``Linear(4, 3, dtype)`` and
#: ``MLP(dtype, enc, 8, 16)``; MAX requires them
EXTENSIONS = {("Linear", "device"): "None", ("MLP", "devices"): "()"}


def _params(sig: str) -> list[tuple[str, str | None]]:
    """``(name, default source)`` of each parameter of a signature string (``*`` and ``/``
    markers kept as parameters named ``*`` and ``/``)."""
    body = sig[sig.index("(") + 1 : sig.rindex(")", 0, sig.rindex("->") if "->" in sig else len(sig))]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    out = []
    for p in parts:
        if not p or p == "self":
            continue
        name = re.match(r"[*/\w]+", p).group(0)
        default = p.split(" = ", 1)[1] if " = " in p else None
        out.append((name, default))
    return out


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_is_maxs(name):
    expected = [(n, EXTENSIONS.get((name, n), d)) for n, d in _params(str(REF[f"sig.{name}"]))]
    actual, star_seen = [], False
    for p in inspect.signature(SIGNATURES[name]).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star_seen:
            actual.append(("*", None))
        star_seen = star_seen or p.kind in (p.KEYWORD_ONLY, p.VAR_POSITIONAL)
        star = "**" if p.kind is p.VAR_KEYWORD else "*" if p.kind is p.VAR_POSITIONAL else ""
        if p.default is inspect.Parameter.empty:
            default = None
        elif isinstance(p.default, type):
            default = f"<class '{p.default.__module__.replace('maxjax.', 'max.')}.{p.default.__qualname__}'>"
        elif isinstance(p.default, DType):
            default = p.default.name  # MAX's DType repr in a signature: ``float32``
        else:
            default = repr(p.default)
        actual.append((star + p.name, EXTENSIONS.get((name, p.name), default) if default is not None else None))
    assert actual == expected


@pytest.mark.parametrize("enum", [qc.QuantFormat, qc.ScaleGranularity, qc.ScaleOrigin])
def test_quant_enums_are_maxs(enum):
    assert [f"{m.name}={m.value}" for m in enum] == list(REF[f"enum.{enum.__name__}"])


@pytest.mark.parametrize("cls", [qc.QuantConfig, qc.InputScaleSpec, qc.WeightScaleSpec])
def test_quant_dataclasses_are_maxs(cls):
    import dataclasses

    got = [f"{f.name}=" + ("<required>" if f.default is dataclasses.MISSING else repr(f.default)) for f in dataclasses.fields(cls)]
    assert got == list(REF[f"fields.{cls.__name__}"])


def test_quant_config_constructors_and_properties():
    c = qc.QuantConfig.blockscaled_fp8(mlp_quantized_layers=[1], attn_quantized_layers=[])
    assert c.format == qc.QuantFormat.BLOCKSCALED_FP8 and c.is_dynamic and c.weight_scale.block_size == (128, 128)
    assert c.scales_granularity_mnk == (1, 128, 128)
    n = qc.QuantConfig.nvfp4(mlp_quantized_layers=[0], attn_quantized_layers=[0])
    assert n.is_nvfp4 and n.is_fp4 and n.is_static and qc.fp4_packed_k(64, n) == 32
    assert qc.QuantConfig.mxfp4(mlp_quantized_layers=[0]).mx_element_dtype == DType.float4_e2m1fn
    with pytest.raises(ValueError, match="block_size must be specified for block-wise scaling"):
        qc.WeightScaleSpec(qc.ScaleGranularity.BLOCK, DType.float32)
    assert str(qc.ScaleGranularity.ROWWISE) == "rowwise" and qc.ScaleOrigin.STATIC.is_static


# -- float8 (static scales) --------------------------------------------------------------------
def _fp8_config(weight_granularity, origin=qc.ScaleOrigin.STATIC, fmt=qc.QuantFormat.COMPRESSED_TENSORS_FP8, **kw):
    return qc.QuantConfig(
        input_scale=qc.InputScaleSpec(qc.ScaleGranularity.TENSOR, origin, DType.float32),
        weight_scale=qc.WeightScaleSpec(weight_granularity, DType.float32),
        mlp_quantized_layers=set(), attn_quantized_layers=set(), format=fmt, **kw,
    )  # fmt: skip


def _np_static_fp8(x, w_fp8, s_in, s_w):
    """MAX's static FP8 matmul in NumPy (max/nn/kernels.py quantize_static_scaled_float8 with the
    Mojo kernel's ``clip(x * (1 / scale))`` and matmul_static_scaled_float8), bfloat16 result."""
    lim = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)
    xq = np.clip(x.astype(np.float32) * np.float32(1.0 / np.float32(s_in)), -lim, lim).astype(ml_dtypes.float8_e4m3fn)
    acc = xq.astype(np.float32) @ w_fp8.astype(np.float32).T
    return (acc * (np.float32(s_in) * np.asarray(s_w, np.float32).reshape(-1))).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("granularity", [qc.ScaleGranularity.TENSOR, qc.ScaleGranularity.ROWWISE])
def test_float8_static_linear_three_modes(granularity):
    rng = np.random.default_rng(5)
    cfg = _fp8_config(granularity)
    lin = nn.Linear(16, 6, DType.float8_e4m3fn, CPU, has_bias=True, quant_config=cfg)
    scale_shape = (6, 1) if granularity == qc.ScaleGranularity.ROWWISE else ()
    assert sorted(lin.raw_state_dict()) == ["bias", "input_scale", "weight", "weight_scale"]
    assert tuple(lin.weight_scale.shape) == scale_shape and tuple(lin.input_scale.shape) == ()
    w = (rng.standard_normal((6, 16)) * 2).astype(ml_dtypes.float8_e4m3fn)
    s_w = np.asarray(rng.random(scale_shape) * 0.1 + 0.01, np.float32)
    s_in = np.array(0.02, np.float32)
    bias = rng.standard_normal(6).astype(ml_dtypes.float8_e4m3fn)  # dtype=float8 gives a float8 bias, as MAX
    sd = {"weight": w, "weight_scale": s_w, "input_scale": s_in, "bias": bias}
    lin.load_state_dict(sd)
    x = rng.standard_normal((2, 3, 16)).astype(np.float32) * 3
    x[0, 0, 0] = 100.0  # beyond 448 * input_scale: clipped, as MAX's kernel clamps
    expected = (_np_static_fp8(x.reshape(-1, 16), w, s_in, s_w).astype(np.float32) + bias.astype(np.float32))
    expected = expected.astype(ml_dtypes.bfloat16).astype(np.float32).reshape(2, 3, 6)
    eager = lin(jnp.asarray(x))
    assert eager.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(eager, np.float32), expected, rtol=1e-2, atol=1e-2)
    functional = jax.jit(lambda s, x: nn.functional_call(lin, s, x))(nn.state(lin), x)
    np.testing.assert_array_equal(np.asarray(functional, np.float32), np.asarray(eager, np.float32))
    lin2 = nn.Linear(16, 6, DType.float8_e4m3fn, CPU, has_bias=True, quant_config=cfg)
    lin2.load_state_dict(sd)
    g = Graph("fp8", forward=lin2, input_types=[TensorType(F32, [2, 3, 16], CPU)])
    out = InferenceSession().load(g, weights_registry=lin2.state_dict()).execute(x)[0]
    np.testing.assert_array_equal(np.asarray(out.to_numpy(), np.float32), np.asarray(eager, np.float32))
    # the unrounded product agrees with the exact dequantized reference to bfloat16 precision
    exact = np.clip(x / s_in, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) @ w.astype(np.float32).T
    exact = exact * s_in * s_w.reshape(-1) + bias.astype(np.float32)
    np.testing.assert_allclose(np.asarray(eager, np.float32), exact, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("fused", [False, True])
def test_float8_mlp_follows_maxs_gate_up_fusion(fused):
    """MAX's MLP with a float8 config: separate projections, or (``can_use_fused_mlp``) one matmul
    of the concatenated gate/up weights under the larger of the two per-tensor scales."""
    rng = np.random.default_rng(9)
    cfg = _fp8_config(qc.ScaleGranularity.TENSOR, can_use_fused_mlp=fused)
    mlp = nn.MLP(DType.float8_e4m3fn, None, 16, 8, [CPU], quant_config=cfg)
    sd = {}
    for proj, shape in (("gate_proj", (8, 16)), ("up_proj", (8, 16)), ("down_proj", (16, 8))):
        sd[f"{proj}.weight"] = (rng.standard_normal(shape) * 2).astype(ml_dtypes.float8_e4m3fn)
        sd[f"{proj}.weight_scale"] = np.asarray(rng.random() * 0.1 + 0.01, np.float32)
        sd[f"{proj}.input_scale"] = np.asarray(rng.random() * 0.05 + 0.01, np.float32)
    mlp.load_state_dict(sd)
    x = rng.standard_normal((4, 16)).astype(np.float32) * 4
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    if fused:
        s_in = max(sd["gate_proj.input_scale"], sd["up_proj.input_scale"])
        s_w = max(sd["gate_proj.weight_scale"], sd["up_proj.weight_scale"])
        w = np.concatenate([sd["gate_proj.weight"], sd["up_proj.weight"]])
        gate, up = np.split(f32(_np_static_fp8(x, w, s_in, s_w)), 2, axis=-1)
    else:
        gate, up = (
            f32(_np_static_fp8(x, sd[f"{p}.weight"], sd[f"{p}.input_scale"], sd[f"{p}.weight_scale"]))
            for p in ("gate_proj", "up_proj")
        )
    silu = gate / (1 + np.exp(-gate))
    h = (silu.astype(ml_dtypes.bfloat16).astype(np.float32) * up).astype(ml_dtypes.bfloat16)
    expected = f32(_np_static_fp8(h, sd["down_proj.weight"], sd["down_proj.input_scale"], sd["down_proj.weight_scale"]))
    actual = f32(mlp(jnp.asarray(x)))
    # the hidden layer is re-quantized to float8 by down_proj: a one-ulp bfloat16 difference in an
    # element of h (silu's rounding) can move it to the next float8 step, so a few outputs differ
    # by about one step; the other path (fused vs separate scales) differs everywhere
    close = np.isclose(actual, expected, rtol=2e-2, atol=1e-3)
    assert close.mean() > 0.85, f"{close.mean():.2f} of the outputs agree"
    np.testing.assert_allclose(actual, expected, rtol=0, atol=2e-2)


@pytest.mark.parametrize("granularity", [qc.ScaleGranularity.TENSOR, qc.ScaleGranularity.ROWWISE])
def test_float8_linear_shards_its_scales_as_max(granularity):
    """MAX's rule: a ROWWISE weight scale follows a row split of the weight, a TENSOR scale (and the
    input scale) is shared by every shard."""
    rng = np.random.default_rng(4)
    lin = nn.Linear(16, 6, DType.float8_e4m3fn, CPU, quant_config=_fp8_config(granularity))
    scale_shape = (6, 1) if granularity == qc.ScaleGranularity.ROWWISE else ()
    lin.load_state_dict({
        "weight": (rng.standard_normal((6, 16)) * 2).astype(ml_dtypes.float8_e4m3fn),
        "weight_scale": np.asarray(rng.random(scale_shape) * 0.1 + 0.01, np.float32),
        "input_scale": np.asarray(0.03, np.float32),
    })  # fmt: skip
    lin.sharding_strategy = ShardingStrategy.rowwise(2)
    shards = lin.shard([DeviceRef.CPU(0), DeviceRef.CPU(1)])
    for s in shards:
        assert s.input_scale is lin.input_scale
        if granularity == qc.ScaleGranularity.TENSOR:
            assert s.weight_scale is lin.weight_scale
        else:
            assert tuple(s.weight_scale.shape) == (3, 1) and s.weight_scale is not lin.weight_scale
    x = jnp.asarray(rng.standard_normal((2, 16)).astype(np.float32))
    whole = np.asarray(lin(x), np.float32)
    parts = [s(ops.transfer_to(x, d)) for s, d in zip(shards, [DeviceRef.CPU(0), DeviceRef.CPU(1)])]
    assert DeviceRef.from_device(next(iter(parts[1].devices()))) == DeviceRef.CPU(1)
    parts = np.concatenate([np.asarray(p, np.float32) for p in parts], axis=-1)
    np.testing.assert_array_equal(parts, whole)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(origin=qc.ScaleOrigin.DYNAMIC), r"quant_config.input_scale.origin=ScaleOrigin.DYNAMIC"),
        (dict(fmt=qc.QuantFormat.NVFP4), r"quant_config.format=QuantFormat.NVFP4"),
        (dict(fmt=qc.QuantFormat.MXFP8), r"quant_config.format=QuantFormat.MXFP8"),
        (dict(fmt=qc.QuantFormat.INT8_W8A8), r"quant_config.format=QuantFormat.INT8_W8A8"),
    ],
)
def test_unsupported_quant_configs_are_refused_by_name(kwargs, match):
    cfg = _fp8_config(qc.ScaleGranularity.TENSOR, **kwargs)
    with pytest.raises(NotImplementedError, match=match) as e:
        nn.Linear(16, 6, DType.float8_e4m3fn, CPU, quant_config=cfg)
    assert "\n" not in str(e.value)


def test_block_scales_and_non_float8_weights_are_refused_by_name():
    cfg = qc.QuantConfig.blockscaled_fp8(mlp_quantized_layers=[], attn_quantized_layers=[])
    with pytest.raises(NotImplementedError, match=r"quant_config.format=QuantFormat.BLOCKSCALED_FP8"):
        nn.Linear(256, 256, DType.float8_e4m3fn, CPU, quant_config=cfg)
    cfg = _fp8_config(qc.ScaleGranularity.COLWISE)
    with pytest.raises(NotImplementedError, match=r"quant_config.weight_scale.granularity=colwise"):
        nn.Linear(16, 6, DType.float8_e4m3fn, CPU, quant_config=cfg)
    with pytest.raises(NotImplementedError, match=r"dtype=DType.bfloat16 with a float8 quant_config"):
        nn.Linear(16, 6, DType.bfloat16, CPU, quant_config=_fp8_config(qc.ScaleGranularity.TENSOR))
    with pytest.raises(NotImplementedError, match=r"StackedLinear\(quant_config="):
        nn.StackedLinear(16, [4], ["q"], DType.float8_e4m3fn, CPU, quant_config=_fp8_config(qc.ScaleGranularity.TENSOR))


# -- GPTQ ----------------------------------------------------------------------------------------
def _np_pack_gptq(codes):
    """AutoGPTQ's packing: codes uint ``[K, N]`` in 0..15 -> int32 ``[K // 8, N]``, eight per word
    along the input rows, row ``8r + i`` in bits ``4i..4i+3`` (auto_gptq/nn_modules/qlinear pack)."""
    k, n = codes.shape
    words = np.zeros((k // 8, n), np.uint32)
    for i in range(8):
        words |= codes[i::8].astype(np.uint32) << np.uint32(4 * i)
    return words.view(np.int32)


def _gptq_case(desc_act, k=256, n=12, group=128, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, size=(k, n))
    scales = (rng.random((k // group, n)) * 0.05 + 0.01).astype(np.float16)
    if desc_act:
        g_idx = rng.permutation(np.arange(k) // group).astype(np.int32)  # group of each input row
    else:
        g_idx = (np.arange(k) // group).astype(np.int32)
    # the float weight of the GPTQ spec: w[k, n] = (code - zero) * scale[g_idx[k], n], zero 8 (sym)
    w = (codes - 8).astype(np.float32) * scales.astype(np.float32)[g_idx]
    return _np_pack_gptq(codes), scales, g_idx, w


@pytest.mark.parametrize("desc_act", [False, True])
def test_gptq_three_modes_match_numpy_dequantization(desc_act):
    qweight, scales, g_idx, w = _gptq_case(desc_act)
    cfg = QuantizationConfig("gptq", 4, 128, desc_act=desc_act, sym=True)
    make = lambda: nn.GPTQLinear(256, 12, DType.bfloat16, CPU, quantization_encoding=QuantizationEncoding.GPTQ, quantization_config=cfg)  # noqa: E731
    keys = ["perm_idx", "qweight", "scales"] if desc_act else ["qweight", "scales"]
    assert sorted(make().raw_state_dict()) == keys  # MAX's names; no qzeros, no g_idx
    sd = {"qweight": qweight, "scales": scales}
    if desc_act:
        sd["perm_idx"] = perm_idx_from_g_idx(g_idx)  # what MAX's weight adapter loads for g_idx
    x = np.random.default_rng(1).standard_normal((2, 3, 256)).astype(np.float32)
    expected = x @ w
    lin = make()
    lin.load_state_dict(sd)
    eager = lin(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(eager), expected, rtol=1e-5, atol=1e-4)
    functional = jax.jit(lambda s, x: nn.functional_call(lin, s, x))(nn.state(lin), x)
    np.testing.assert_allclose(np.asarray(functional), expected, rtol=1e-5, atol=1e-4)
    lin2 = make()
    lin2.load_state_dict(sd)
    g = Graph("gptq", forward=lin2, input_types=[TensorType(F32, ["b", 3, 256], CPU)])
    out = InferenceSession().load(g, weights_registry=lin2.state_dict()).execute(x)[0].to_numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    # bfloat16 in, bfloat16 out (MAX's GPU kernel's dtypes)
    xb = jnp.asarray(x, jnp.bfloat16)
    yb = lin(xb)
    assert yb.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(yb, np.float32), np.asarray(xb, np.float32) @ w, rtol=3e-2, atol=3e-2)


def test_gptq_weight_stays_packed_inside_the_jit():
    qweight, scales, _, _ = _gptq_case(False)
    cfg = QuantizationConfig("gptq", 4, 128, sym=True)
    lin = nn.GPTQLinear(256, 12, DType.float32, CPU, quantization_config=cfg)
    lin.load_state_dict({"qweight": qweight, "scales": scales})
    state = nn.state(lin)
    assert state["qweight"].dtype == jnp.int32 and state["qweight"].shape == (32, 12)
    hlo = jax.jit(lambda s, x: nn.functional_call(lin, s, x)).lower(state, jnp.ones((1, 256))).as_text()
    main = next(line for line in hlo.splitlines() if "func.func public @main" in line)  # the jit's arguments
    assert "tensor<32x12xi32>" in main and "tensor<2x12xf16>" in main and "256x12" not in main


def test_gptq_refusals_are_one_line_and_named():
    cfg = QuantizationConfig("gptq", 4, 128, sym=True)
    cases = [
        (dict(quantization_config=QuantizationConfig("gptq", 8, 128, sym=True)), NotImplementedError, r"bits=8"),
        (dict(quantization_config=QuantizationConfig("gptq", 4, 128, sym=False)), ValueError, r"sym=False"),
        (dict(quantization_config=QuantizationConfig("awq", 4, 128, sym=True)), ValueError, r"quant_method='awq'"),
        (dict(quantization_config=None), ValueError, r"quantization_config=None"),
        (dict(quantization_config=cfg, has_bias=True), ValueError, r"has_bias=True is not supported in GPTQLinear"),
    ]
    for kwargs, exc, match in cases:
        with pytest.raises(exc, match=match) as e:
            nn.GPTQLinear(256, 12, DType.bfloat16, CPU, **kwargs)
        assert "\n" not in str(e.value)


def test_gptq_missing_perm_idx_is_named():
    qweight, scales, _, _ = _gptq_case(True)
    lin = nn.GPTQLinear(256, 12, DType.float32, CPU, quantization_config=QuantizationConfig("gptq", 4, 128, True, True))
    with pytest.raises(ValueError, match=r"Missing required weights: perm_idx") as e:
        lin.load_state_dict({"qweight": qweight, "scales": scales})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"'qweight' had different shape \(expected=\(32, 12\), actual=\(16, 12\)\)"):
        lin.load_state_dict({"qweight": qweight[:16], "scales": scales, "perm_idx": np.arange(256, dtype=np.int32)})


# -- ColumnParallelLinear, errors ----------------------------------------------------------------
def test_column_parallel_linear_gathers_every_devices_rows():
    devices = [DeviceRef.CPU(0), DeviceRef.CPU(1)]
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    cpl = nn.ColumnParallelLinear(8, 5, F32, devices, has_bias=True)
    assert sorted(cpl.raw_state_dict()) == ["bias", "weight"]
    assert [tuple(layer.weight.shape) for layer in cpl.distributed_linear_layers] == [(3, 8), (2, 8)]
    cpl.load_state_dict({"weight": w, "bias": b})
    x = rng.standard_normal((2, 8)).astype(np.float32)
    signals = nn.Signals(devices)
    with Graph("cpl", input_types=[TensorType(F32, [2, 8], d) for d in devices] + signals.input_types()) as g:
        xs, bufs = g.inputs[:2], g.inputs[2:]
        g.output(*cpl(list(xs), list(bufs)))
    model = InferenceSession(devices=[d.to_device() for d in devices]).load(g, weights_registry=cpl.state_dict())
    outs = model.execute(x, x, *signals.buffers())
    for o in outs:
        np.testing.assert_allclose(o.to_numpy(), x @ w.T + b, rtol=1e-5, atol=1e-6)
    eager = cpl([ops.transfer_to(jnp.asarray(x), d) for d in devices], signals.buffers())  # eager mode
    for o, d in zip(eager, devices):
        assert DeviceRef.from_device(next(iter(o.devices()))) == d
        np.testing.assert_allclose(np.asarray(o), x @ w.T + b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="ColumnParallelLinear requires a non-empty devices argument"):
        nn.ColumnParallelLinear(8, 5, F32, [])


@pytest.mark.parametrize("name", ["qkv_unfused", "qkv_stacked"])
def test_stacked_linear_shards_give_maxs_output_in_pieces(name):
    """Row-split StackedLinear (MAX's ``shard``): device i computes rows i of every projection
    (unfused) or of the stored weight (stacked); both reassemble MAX's output."""
    m = _loaded(name)
    m.sharding_strategy = ShardingStrategy.rowwise(2)
    devices = [DeviceRef.CPU(0), DeviceRef.CPU(1)]
    shards = m.shard(devices)
    assert [s._out_dims for s in shards] == [[2, 1, 1]] * 2
    x, expected = REF["x"], REF[f"out.{name}"]
    outs = [np.asarray(s(ops.transfer_to(jnp.asarray(x), d))) for s, d in zip(shards, devices)]
    if name == "qkv_stacked":  # the stored [8, 8] weight split in rows 0-3 and 4-7
        np.testing.assert_allclose(np.concatenate(outs, -1), expected, rtol=1e-5, atol=1e-6)
    else:  # each of q [4], k [2], v [2] split in halves
        pieces = [np.split(o, [2, 3], axis=-1) for o in outs]
        whole = np.concatenate([np.concatenate([p[j] for p in pieces], -1) for j in range(3)], -1)
        np.testing.assert_allclose(whole, expected, rtol=1e-5, atol=1e-6)


def test_errors_are_maxs():
    with pytest.raises(ValueError, match=r"Unrecognized activation function name \(swish\)"):
        nn.MLP(F32, None, 4, 8, [CPU], activation_function="swish")
    with pytest.raises(ValueError, match="FusedMLP requires exactly one device, got 2"):
        nn.FusedMLP(F32, 4, 8, [DeviceRef.CPU(0), DeviceRef.CPU(1)])
    with pytest.raises(ValueError, match="clip_weight is not yet supported with stacked=True."):
        nn.StackedLinear(4, [2], ["q"], F32, CPU, stacked=True, clip_weight=1.0)
    with pytest.raises(NotImplementedError, match=r"Linear\(clip_weight=0.5, quantization_encoding=QuantizationEncoding.Q4_0\)"):
        nn.Linear(32, 4, F32, CPU, quantization_encoding=QuantizationEncoding.Q4_0, clip_weight=0.5)
    with pytest.raises(NotImplementedError, match=r"linear\(bias=...\)"):
        nl.linear(jnp.ones((1, 4)), jnp.ones((2, 4)), bias=jnp.ones(2))


def test_clamp_and_ceildiv():
    x = jnp.asarray([-2.0, -0.5, 0.5, 2.0])
    np.testing.assert_array_equal(np.asarray(nn.clamp(x, -1.0, 1.0)), [-1.0, -0.5, 0.5, 1.0])
    np.testing.assert_array_equal(np.asarray(nn.clamp(x, max=0.0)), [-2.0, -0.5, 0.0, 0.0])
    assert nl.ceildiv(7, 2) == 4 and nl.ceildiv(8, 2) == 4
