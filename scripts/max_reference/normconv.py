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
    return {"x": x, "h": h, "gn.weight": sd["weight"], "gn.bias": sd["bias"], "gn_out": res[0], "gn_plain_out": res[1], "cln_out": res[2]}
