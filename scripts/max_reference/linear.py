"""MAX 26.7 reference for the Linear family (``max.nn.linear``, ``max.nn.stacked_linear``).

One MAX graph (one compile) holds every layer as an attribute of one root module, so their
weights have distinct names. Keys written:

- ``x``: the float32 input ``[3, 8]`` (rank 2: MAX's MLP splits its fused gate/up output on axis 1).
- ``w.<fqn>``: every weight of the root module (``lin_bias.weight``, ``q_proj.weight``, ...).
- ``out.<layer>``: MAX's output of each layer on ``x``.
- ``keys.<layer>``: the state_dict keys of the layer built alone (its own root), sorted.
- ``enum.<Enum>``: ``NAME=value`` of each member of the ``max.nn.quant_config`` enums.
- ``fields.<dataclass>``: ``name=default`` of each field of the quant_config dataclasses.
- ``sig.<name>``: ``str(inspect.signature(...))`` of MAX's public callables of these modules.

GPTQLinear and float8 ``quant_config`` Linear are not here: MAX 26.7 compiles them only for GPUs
(``GPTQ_gpu_repack_b4_g128`` and ``mo.quantize_static_scaled_float8`` assert ``is_gpu``), so on
this CPU the graph fails to compile; tests check those against NumPy from the published layouts.
"""

from __future__ import annotations

import numpy as np

IN, HID, FF = 8, 8, 6
CONFIGS = {
    # name: (constructor, callable taking x)
    "lin": "Linear(IN, 5, F32, CPU)",
    "lin_bias": "Linear(IN, 5, F32, CPU, has_bias=True)",
    "lin_named": "Linear(IN, 4, F32, CPU, has_bias=True, name='proj')",
    "lin_clip": "Linear(IN, 5, F32, CPU, clip_weight=0.3)",
    "mlp_silu": "MLP(F32, None, HID, FF, [CPU])",
    "mlp_gelu_bias": "MLP(F32, None, HID, FF, [CPU], has_bias=True, activation_function='gelu')",
    "mlp_gelu_tanh": "MLP(F32, None, HID, FF, [CPU], activation_function='gelu_tanh')",
    "mlp_relu_limit": "MLP(F32, None, HID, FF, [CPU], activation_function='relu', swiglu_limit=0.5)",
    "mlp_sigmoid": "MLP(F32, None, HID, FF, [CPU], activation_function='sigmoid')",
    "mlp_tanh": "MLP(F32, None, HID, FF, [CPU], activation_function='tanh')",
    "fused_mlp": "FusedMLP(F32, HID, FF, [CPU], swiglu_limit=0.4)",
    "qkv_unfused": "StackedLinear(IN, [4, 2, 2], ['q_proj', 'k_proj', 'v_proj'], F32, CPU, has_bias=True)",
    "qkv_unfused_clip": "StackedLinear(IN, [3, 2], ['a_proj', 'b_proj'], F32, CPU, clip_weight=0.2)",
    "qkv_stacked": "StackedLinear(IN, [4, 2, 2], ['q', 'k', 'v'], F32, CPU, stacked=True, has_bias=True)",
}


def build() -> dict[str, np.ndarray]:
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType
    from max.nn import MLP, FusedMLP, Linear, Module, StackedLinear

    env = {
        "Linear": Linear, "MLP": MLP, "FusedMLP": FusedMLP, "StackedLinear": StackedLinear,
        "F32": DType.float32, "CPU": DeviceRef.CPU(), "IN": IN, "HID": HID, "FF": FF,
    }  # fmt: skip
    import dataclasses

    from max.nn import quant_config as qc

    import inspect

    from max.nn import linear as ml
    from max.nn import stacked_linear as msl

    rng = np.random.default_rng(21)
    out: dict[str, np.ndarray] = {}
    public = {
        "Linear": ml.Linear, "GPTQLinear": ml.GPTQLinear, "MLP": ml.MLP, "FusedMLP": ml.FusedMLP,
        "ColumnParallelLinear": ml.ColumnParallelLinear, "linear": ml.linear, "clamp": ml.clamp,
        "fp4_packed_k": ml.fp4_packed_k, "ceildiv": ml.ceildiv, "quantized_matmul": ml.quantized_matmul,
        "activation_function_from_name": ml.activation_function_from_name, "StackedLinear": msl.StackedLinear,
        "QuantConfig": qc.QuantConfig, "InputScaleSpec": qc.InputScaleSpec, "WeightScaleSpec": qc.WeightScaleSpec,
        "QuantConfig.blockscaled_fp8": qc.QuantConfig.blockscaled_fp8, "QuantConfig.mxfp4": qc.QuantConfig.mxfp4,
        "QuantConfig.nvfp4": qc.QuantConfig.nvfp4,
    }  # fmt: skip
    for name, obj in public.items():
        out[f"sig.{name}"] = np.array(str(inspect.signature(obj)))
    for enum in (qc.QuantFormat, qc.ScaleGranularity, qc.ScaleOrigin):
        out[f"enum.{enum.__name__}"] = np.array([f"{m.name}={m.value}" for m in enum])
    for cls in (qc.QuantConfig, qc.InputScaleSpec, qc.WeightScaleSpec):
        out[f"fields.{cls.__name__}"] = np.array([f"{f.name}=" + ("<required>" if f.default is dataclasses.MISSING else repr(f.default)) for f in dataclasses.fields(cls)])
    for name, ctor in CONFIGS.items():
        out[f"keys.{name}"] = np.array(sorted(eval(ctor, env).raw_state_dict()))

    class Root(Module):
        def __init__(self) -> None:
            super().__init__()
            for name, ctor in CONFIGS.items():
                setattr(self, name, eval(ctor, env))

        def __call__(self, x):
            return tuple(getattr(self, name)(x) for name in CONFIGS)

    root = Root()
    weights = {
        k: (rng.standard_normal(tuple(int(d) for d in w.shape)) * 0.5).astype(np.float32)
        for k, w in root.raw_state_dict().items()
    }
    root.load_state_dict(weights)
    x = rng.standard_normal((3, IN)).astype(np.float32)
    graph = Graph("linear_ref", forward=root, input_types=[TensorType(DType.float32, [3, IN], DeviceRef.CPU())])
    model = InferenceSession().load(graph, weights_registry=root.state_dict())
    results = model.execute(x)
    out["x"] = x
    out.update({f"w.{k}": v for k, v in weights.items()})
    for name, r in zip(CONFIGS, results):
        out[f"out.{name}"] = r.to_numpy()
    return out
