"""MAX 26.7's ConstantLayerNorm and GroupNorm on fixed inputs (see scripts/reference_max.py)."""

from __future__ import annotations

import numpy as np


def build() -> dict[str, np.ndarray]:
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType
    from max.nn import ConstantLayerNorm, GroupNorm

    cpu = DeviceRef.CPU()
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 6, 3, 5)) * 2 + 1).astype(np.float32)  # [N, C, H, W]
    h = rng.standard_normal((3, 8)).astype(np.float32)
    gn = GroupNorm(3, 6, eps=1e-5, affine=True, device=cpu)
    sd = {"weight": rng.standard_normal(6).astype(np.float32), "bias": rng.standard_normal(6).astype(np.float32)}
    gn.load_state_dict(sd)
    gn_plain = GroupNorm(2, 6, affine=False, device=cpu)
    cln = ConstantLayerNorm(8, cpu, DType.float32, eps=1e-5)

    def forward(xv, hv):
        return gn(xv), gn_plain(xv), cln(hv)

    g = Graph("norms", forward=forward, input_types=[TensorType(DType.float32, x.shape, cpu), TensorType(DType.float32, h.shape, cpu)])
    registry = {**gn.state_dict()}
    res = [r.to_numpy() for r in InferenceSession().load(g, weights_registry=registry).execute(x, h)]
    out = {"x": x, "h": h, "gn.weight": sd["weight"], "gn.bias": sd["bias"], "gn_out": res[0], "gn_plain_out": res[1], "cln_out": res[2]}
    return {**out, **build_conv()}


def build_conv() -> dict[str, np.ndarray]:
    """MAX's Conv1D, Conv2d and Conv3D (MAX layout and PyTorch layout with permute) in one graph."""
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType
    from max.nn import Conv1D, Conv2d, Conv3D

    cpu = DeviceRef.CPU()
    rng = np.random.default_rng(1)
    layers = {
        "c1": Conv1D(3, 4, 6, DType.float32, stride=2, padding=(1, 2), has_bias=True, device=cpu, name="c1"),
        "c1p": Conv1D(3, 4, 6, DType.float32, padding=1, num_groups=2, permute=True, device=cpu, name="c1p"),
        "c2": Conv2d((3, 2), 4, 6, DType.float32, stride=(2, 1), padding=(1, 0, 1, 1), dilation=(1, 2), has_bias=True, device=cpu, name="c2"),
        "c2p": Conv2d(3, 4, 6, DType.float32, padding=1, num_groups=2, permute=True, has_bias=True, device=cpu, name="c2p"),
        "c3": Conv3D(2, 3, 2, 4, 5, DType.float32, stride=(1, 2, 1), padding=1, has_bias=True, device=cpu, name="c3"),
        "c3p": Conv3D(2, 2, 2, 4, 5, DType.float32, permute=True, device=cpu, name="c3p"),
    }
    out: dict[str, np.ndarray] = {}
    for name, layer in layers.items():
        sd = {k: rng.standard_normal(tuple(int(d) for d in v.shape)).astype(np.float32) for k, v in layer.raw_state_dict().items()}
        layer.load_state_dict(sd)
        out.update(sd)
    xs = {
        "x1": rng.standard_normal((2, 9, 4)).astype(np.float32), "x1p": rng.standard_normal((2, 4, 9)).astype(np.float32),
        "x2": rng.standard_normal((2, 7, 6, 4)).astype(np.float32), "x2p": rng.standard_normal((2, 4, 7, 6)).astype(np.float32),
        "x3": rng.standard_normal((1, 4, 6, 5, 4)).astype(np.float32), "x3p": rng.standard_normal((1, 4, 4, 6, 5)).astype(np.float32),
    }  # fmt: skip
    out.update(xs)

    def forward(*v):
        return [layers[n](t) for n, t in zip(layers, v)]

    g = Graph("convs", forward=forward, input_types=[TensorType(DType.float32, x.shape, cpu) for x in xs.values()])
    registry = {}
    for layer in layers.values():
        registry.update(layer.state_dict())
    res = InferenceSession().load(g, weights_registry=registry).execute(*xs.values())
    for n, r in zip(layers, res):
        out[f"{n}.out"] = r.to_numpy()
    return out
