"""MAX 26.7's scatter family, nonzero, masked_scatter, cond, while_loop, hann_window,
as_interleaved_complex, buffer_create(init_value), constant_external and parallel on fixed inputs
(see scripts/reference_max.py). irfft is absent: MAX 26.7 runs it on GPUs only."""

from __future__ import annotations

import numpy as np

AXIS_OPS = ["scatter", "scatter_add", "scatter_max", "scatter_min", "scatter_mul"]
ND_OPS = ["scatter_nd", "scatter_nd_add", "scatter_nd_max", "scatter_nd_min", "scatter_nd_mul"]
HANN = [(0, True), (1, False), (2, False), (5, True), (5, False), (8, True)]


def inputs() -> dict[str, np.ndarray]:
    """The fixed inputs (also read by the tests)."""
    rng = np.random.default_rng(22)
    out: dict[str, np.ndarray] = {}
    out["x"] = rng.standard_normal((4, 5)).astype(np.float32)
    # along axis 0: updates/indices [3, 5]; plain scatter needs distinct rows per column
    out["u0"] = rng.standard_normal((3, 5)).astype(np.float32)
    out["i0_unique"] = np.stack([rng.permutation(4)[:3] for _ in range(5)], axis=1).astype(np.int64) - 4 * (rng.random((3, 5)) < 0.3)
    out["i0"] = rng.integers(-4, 4, (3, 5)).astype(np.int64)  # duplicates and negative indices
    # along axis 1 of [4, 5]: updates/indices [2, 3] (smaller than the input off the axis)
    out["u1"] = rng.standard_normal((2, 3)).astype(np.float32)
    out["i1"] = rng.integers(-5, 5, (2, 3)).astype(np.int32)
    out["i1_unique"] = np.stack([rng.permutation(5)[:3] for _ in range(2)]).astype(np.int32)
    # 3-D, axis -1: x3 [2, 3, 4], updates/indices [2, 3, 6]
    out["x3"] = rng.standard_normal((2, 3, 4)).astype(np.float32)
    out["u3"] = rng.standard_normal((2, 3, 6)).astype(np.float32)
    out["i3"] = rng.integers(0, 4, (2, 3, 6)).astype(np.int64)
    # scatter_nd: rows of x [4, 5] (indices [6, 1], duplicates), elements (indices [3, 2], distinct)
    out["ndu_rows"] = rng.standard_normal((6, 5)).astype(np.float32)
    out["ndi_rows"] = rng.integers(-4, 4, (6, 1)).astype(np.int64)
    out["ndi_rows_unique"] = np.array([[2], [-1], [0]], np.int64)
    out["ndu_rows_unique"] = rng.standard_normal((3, 5)).astype(np.float32)
    out["ndu_elems"] = rng.standard_normal((3,)).astype(np.float32)
    out["ndi_elems"] = np.array([[0, 4], [3, -2], [1, 1]], np.int32)
    # masked_scatter / nonzero
    m = rng.standard_normal((4, 5)).astype(np.float32)
    m[rng.random((4, 5)) < 0.6] = 0
    out["mask"] = m
    out["mask_row"] = np.array([True, False, True, True, False])
    out["ms_updates"] = rng.standard_normal((4, 6)).astype(np.float32)
    # control flow
    out["limit"] = np.array(5, np.int32)
    out["ext"] = rng.standard_normal((3, 2)).astype(np.float32)
    return out


def build() -> dict[str, np.ndarray]:
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import BufferType, DeviceRef, Graph, TensorType, ops

    cpu = DeviceRef.CPU()
    data = inputs()
    names = [k for k in data if k != "ext"]

    def t(a: np.ndarray) -> TensorType:
        return TensorType(DType.from_numpy(a.dtype), a.shape, cpu)

    def forward(*vals):
        v = dict(zip(names, vals))
        outs = []
        for op in AXIS_OPS:
            f = getattr(ops, op)
            i0 = v["i0_unique"] if op == "scatter" else v["i0"]
            i1 = v["i1_unique"] if op == "scatter" else v["i1"]
            outs += [f(v["x"], v["u0"], i0, axis=0), f(v["x"], v["u1"], i1, axis=1), f(v["x3"], v["u3"], v["i3"], -1)]
        for op in ND_OPS:
            f = getattr(ops, op)
            rows = (v["ndu_rows_unique"], v["ndi_rows_unique"]) if op == "scatter_nd" else (v["ndu_rows"], v["ndi_rows"])
            outs += [f(v["x"], *rows), f(v["x"], v["ndu_elems"], v["ndi_elems"])]
        outs += [
            ops.masked_scatter(v["x"], v["mask"], v["ms_updates"], "n"),
            ops.masked_scatter(v["x"], v["mask_row"], v["ms_updates"], "n2"),
            ops.nonzero(v["mask"], 3),
            ops.nonzero(v["mask"], 12),
            ops.nonzero(v["mask"], "nz"),
        ]
        x = v["x"]
        pred = ops.greater(ops.sum(ops.reshape(x, [20]), 0), ops.constant(0.0, DType.float32, cpu))
        pred = ops.squeeze(pred, 0) if pred.rank else pred
        ty = TensorType(DType.float32, [4, 5], cpu)
        outs += ops.cond(pred, [ty, ty], lambda: [x * 2.0, ops.exp(x)], lambda: [x - 1.0, ops.sin(x)])
        outs += ops.cond(ops.logical_not(pred), [ty], lambda: x * 2.0, lambda: x - 1.0)
        n0 = ops.constant(0, DType.int32, cpu)
        outs += ops.while_loop([n0, x], lambda n, y: n < v["limit"], lambda n, y: [n + 1, y * 0.5 + ops.cos(x)])
        outs += [ops.hann_window(n, cpu, periodic=p) for n, p in HANN]
        outs.append(ops.as_interleaved_complex(x[:, :4]))
        return outs

    g = Graph("ops_scatter", forward=forward, input_types=[t(data[k]) for k in names])
    res = [r.to_numpy() for r in InferenceSession().load(g).execute(*(data[k] for k in names))]
    keys = [f"{op}.{case}" for op in AXIS_OPS for case in ("axis0", "axis1", "3d")]
    keys += [f"{op}.{case}" for op in ND_OPS for case in ("rows", "elems")]
    keys += ["masked_scatter", "masked_scatter.row", "nonzero.3", "nonzero.12", "nonzero.nz", "cond.a", "cond.b", "cond.not"]
    keys += ["while.n", "while.y"] + [f"hann.{n}.{int(p)}" for n, p in HANN] + ["as_interleaved_complex"]
    assert len(keys) == len(res), (len(keys), len(res))
    out = {**data, **dict(zip(keys, res))}

    # persistent buffer, external constant and parallel launches (one more graph). MAX's parallel
    # body takes kernels only (no constants: "mo.constant op is not allowed inside mo.parallel").
    ty = t(data["x"])

    def forward2(a, b):
        buf = ops.buffer_create(BufferType(DType.float32, [3], cpu), 1.5)
        ext = ops.constant_external("ext", TensorType(DType.float32, [3, 2], cpu))
        par = ops.parallel([[a, b], [b, a]], parallel_body, result_types=[[ty, ty], [ty, ty]])
        return [ops.buffer_load(buf), ext * 3.0, *par[0], *par[1]]

    g2 = Graph("ops_misc", forward=forward2, input_types=[ty, ty])
    res2 = InferenceSession().load(g2, weights_registry={"ext": data["ext"]}).execute(data["x"], data["x"] * 2)
    for k, r in zip(["buffer_create.init", "constant_external", "parallel.0.0", "parallel.0.1", "parallel.1.0", "parallel.1.1"], res2):
        out[k] = r.to_numpy()
    return out


def parallel_body(u, w):
    """The body of the parallel launches (the tests write the same with maxjax's ops)."""
    from max.graph import ops

    return [u * w + u, ops.exp(w)]
