"""MAX 26.7's vision ops (conv2d_transpose, avg/max_pool2d, fold, resize*, roi_align,
non_maximum_suppression) against MAX's own numbers (tests/data/max_reference/ops_vision.npz) in
graph mode, eagerly and under jax.jit; against lax/NumPy definitions; and MAX's build-time errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, ops
from maxjax.graph.type import ConvInputLayout, FilterLayout
from max_reference import load

REF = load("ops_vision")
CPU = DeviceRef.CPU()
_spec = importlib.util.spec_from_file_location("ops_vision_cases", Path(__file__).parents[1] / "scripts" / "max_reference" / "ops_vision.py")
CASES = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(CASES)  # the case tables the reference was written from (no MAX import)
INPUTS = list(CASES.inputs())
TOL = dict(rtol=1e-5, atol=1e-5)


def _refused(cb: bool, p) -> bool:
    """avg_pool2d's count_boundary=False with padding, which maxjax refuses (MAX's numbers are inconsistent)."""
    return not cb and p not in (0, (0, 0))


def _all_ops(v: dict) -> dict:
    """Every op case of the reference on the values ``v`` (graph values, arrays or tracers)."""
    out = {}
    for n, (kind, x, kern, s, d, p, cm, cb) in CASES.POOLS.items():
        if _refused(cb, p):
            continue
        out[n] = ops.max_pool2d(v[x], kern, s, d, p, cm) if kind == "max" else ops.avg_pool2d(v[x], kern, s, d, p, cm, cb)
    for n, (x, w, s, d, p, op, b, il, fl) in CASES.CONVT.items():
        out[n] = ops.conv2d_transpose(v[x], v[w], s, d, p, op, None if b is None else v[b], ConvInputLayout(il), FilterLayout(fl))
    for n, (x, o, kern, s, d, p) in CASES.FOLDS.items():
        out[n] = ops.fold(v[x], o, kern, s, d, p)
    for n, (x, size, c, aa) in CASES.LINEAR.items():
        out[n] = ops.resize_linear(v[x], size, c, aa)
    for n, (x, size, c, r) in CASES.NEAREST.items():
        out[n] = ops.resize_nearest(v[x], size, c, r)
    for n, (x, size) in CASES.BICUBIC.items():
        out[n] = ops.resize_bicubic(v[x], size)
    for n, mode in CASES.RESIZE.items():
        out[n] = ops.resize(v["x_nchw"], (2, 3, 9, 4), ops.InterpolationMode[mode])
    for n, (oh, ow, sc, sr, al, mode) in CASES.ROI.items():
        out[n] = ops.roi_align(v["x_roi"], v["rois"], oh, ow, sc, sr, al, mode)
    return out


def _check(got: dict) -> None:
    for n, o in got.items():
        want = REF[n]
        assert tuple(o.shape) == want.shape, n
        np.testing.assert_allclose(np.asarray(o), want, **TOL, err_msg=n)


def test_ops_match_max_eagerly_and_under_jit():
    v = {k: REF[k] for k in INPUTS}
    eager = _all_ops(v)
    assert all(isinstance(o, jax.Array) for o in eager.values())
    _check(eager)
    _check(jax.jit(_all_ops)({k: jnp.asarray(a) for k, a in v.items()}))


def test_ops_match_max_in_a_graph():
    names = list(INPUTS)
    keys: list[str] = []

    def forward(*vals):
        out = _all_ops(dict(zip(names, vals)))
        keys.extend(out)
        return list(out.values())

    g = Graph("vision", forward=forward, input_types=[TensorType(DType.float32, REF[k].shape, CPU) for k in names])
    res = InferenceSession().load(g).execute(*(REF[k] for k in names))
    _check({k: r.to_numpy() for k, r in zip(keys, res)})


def test_conv2d_transpose_is_the_gradient_of_conv2d_and_takes_cfrs():
    x, w = REF["x_a"], REF["w_rscf"]  # x [2, 7, 6, 3], w [3, 2, 4, 3] = [kh, kw, C_out, C_in]
    s, d, p = (2, 3), (1, 2), (1, 0, 0, 2)
    y = ops.conv2d_transpose(x, w, s, d, p, (1, 2))  # [2, 15, 18, 4]
    # d/dz <conv2d(z, w), y> for z of the transposed conv's output size is the transposed conv of y
    z0 = jnp.zeros(y.shape, jnp.float32)
    _, vjp = jax.vjp(lambda z: ops.conv2d(z, w, s, d, p), z0)  # conv2d: [kh, kw, C_in=4, F=3]
    (grad,) = vjp(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(y), np.asarray(grad), **TOL)
    # CFRS [C_in, C_out, kh, kw] (PyTorch's ConvTranspose2d weight) is the same filter permuted
    cfrs = np.transpose(w, (3, 2, 0, 1))
    np.testing.assert_allclose(np.asarray(ops.conv2d_transpose(x, cfrs, s, d, p, (1, 2), filter_layout=FilterLayout.CFRS)), np.asarray(y), **TOL)
    xn = np.transpose(x, (0, 3, 1, 2))
    got = ops.conv2d_transpose(xn, cfrs, s, d, p, (1, 2), REF["b4"], ConvInputLayout.NCHW, FilterLayout.CFRS)  # [N, C, H, W]
    np.testing.assert_allclose(np.asarray(got), np.transpose(np.asarray(y), (0, 3, 1, 2)) + REF["b4"][:, None, None], **TOL)


def test_fold_is_the_adjoint_of_unfold_and_pools_match_numpy():
    x = REF["x_f2"]  # [1, 12, 6]: C=2, kernel 2x3, blocks 3x2
    unfold = lambda img: jax.lax.conv_general_dilated_patches(  # noqa: E731  [1, C*kh*kw, Lh, Lw]
        img, (2, 3), (2, 2), [(0, 0), (0, 0)], rhs_dilation=(1, 2)).reshape(1, 12, 6)  # fmt: skip
    (want,) = jax.linear_transpose(unfold, jnp.zeros((1, 2, 6, 7), jnp.float32))(jnp.asarray(x))  # no padding
    np.testing.assert_allclose(np.asarray(ops.fold(x, (6, 7), (2, 3), 2, (1, 2), 0)), np.asarray(want), **TOL)
    # with padding, MAX 26.7 keeps the padded canvas' top-left corner (PyTorch: its centre)
    np.testing.assert_allclose(np.asarray(ops.fold(x, (5, 6), (2, 3), 2, (1, 2), 1)), np.asarray(want)[:, :, :5, :6], **TOL)
    # max/avg pooling by brute force over windows (padding 1, no ceil)
    a = REF["x_a"]
    pad = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=np.nan)
    win = np.stack([pad[:, i : i + 7 : 2, j : j + 5 : 2] for i in range(3) for j in range(3)])  # [9, 2, 4, 3, 3]
    np.testing.assert_allclose(np.asarray(ops.max_pool2d(a, (3, 3), 2, 1, 1)), np.nanmax(win, 0), **TOL)
    np.testing.assert_allclose(np.asarray(ops.avg_pool2d(a, (3, 3), 2, 1, 1)), np.nansum(win, 0) / 9, **TOL)
    c = REF["x_c"]  # [1, 6, 6, 2]; ceil_mode: the last window hangs over; count_boundary=False counts what it covers
    cpad = np.pad(c, ((0, 0), (0, 1), (0, 1), (0, 0)), constant_values=np.nan)
    cwin = np.stack([cpad[:, i : i + 5 : 2, j : j + 5 : 2] for i in range(3) for j in range(3)])
    np.testing.assert_allclose(np.asarray(ops.avg_pool2d(c, (3, 3), 2, ceil_mode=True, count_boundary=False)), np.nanmean(cwin, 0), **TOL)


def test_avg_pool_count_boundary_false_with_padding_is_refused():
    # MAX 26.7's own numbers there are inconsistent (inf where a window holds input elements)
    assert np.isinf(REF["ap4"]).any()
    for n in ("ap2", "ap4", "ap8"):
        kind, x, kern, s, d, p, cm, cb = CASES.POOLS[n]
        assert _refused(cb, p)
        with pytest.raises(NotImplementedError, match=r"count_boundary=False with padding=\(\d, \d\) is not supported"):
            ops.avg_pool2d(REF[x], kern, s, d, p, cm, cb)


def test_resize_linear_matches_jax_image_and_keeps_untouched_axes():
    x = REF["x_nchw"]
    got = ops.resize_linear(x, (2, 3, 10, 12))  # pure upscaling: half-pixel linear = jax.image's
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.image.resize(x, (2, 3, 10, 12), "linear")), **TOL)
    same = ops.resize_nearest(x, x.shape)
    np.testing.assert_array_equal(np.asarray(same), x)
    # in a graph with a symbolic batch: only the static axes resize
    g = Graph("rs", forward=lambda t: ops.resize_bicubic(t, ["b", 3, 9, 4]), input_types=[TensorType(DType.float32, ["b", 3, 5, 6], CPU)])
    out = InferenceSession().load(g).execute(x)[0].to_numpy()
    np.testing.assert_allclose(out, REF["rb_up"], **TOL)
    # MAX's dispatch: a plain string is no InterpolationMode, so it selects bicubic
    np.testing.assert_allclose(np.asarray(ops.resize(x, (2, 3, 9, 4), "nearest")), REF["rb_up"], **TOL)


def test_non_maximum_suppression_eagerly_and_its_refusals():
    m, iou, st = CASES.NMS
    got = ops.non_maximum_suppression(REF["boxes"], REF["scores"], np.int64(m), np.float32(iou), np.float32(st))
    np.testing.assert_array_equal(np.asarray(got), REF["nms"])
    assert got.shape[1] == 3 and REF["nms"].shape[0] > 0
    with pytest.raises(NotImplementedError, match="num_selected.*depends on the data"):
        jax.jit(lambda b, s: ops.non_maximum_suppression(b, s, m, iou, st))(REF["boxes"], REF["scores"])
    with pytest.raises(NotImplementedError, match="not in a graph"):
        Graph("nms", forward=lambda b, s: ops.non_maximum_suppression(b, s, m, iou, st),
              input_types=[TensorType(DType.float32, REF[k].shape, CPU) for k in ("boxes", "scores")])  # fmt: skip
    with pytest.raises(ValueError, match=r"scores must have shape \[batch, num_classes, num_boxes\]"):
        ops.non_maximum_suppression(REF["boxes"], REF["scores"][:, :, :5], m, iou, st)


def _z(*s):
    return np.zeros(s, np.float32)


def test_build_time_errors_as_max():
    with pytest.raises(ValueError, match="input to a 2-D deconvolution must be rank 4"):
        ops.conv2d_transpose(_z(5, 6, 3), _z(3, 2, 4, 3))
    with pytest.raises(ValueError, match="filter for a 2-D deconvolution must be rank 4"):
        ops.conv2d_transpose(_z(2, 5, 6, 3), _z(2, 4, 3))
    with pytest.raises(ValueError, match="bias for a 2-D deconvolution must be rank 1"):
        ops.conv2d_transpose(_z(2, 5, 6, 3), _z(3, 2, 4, 3), bias=_z(4, 1))
    with pytest.raises(ValueError, match=r"output padding must be smaller .* output_padding = \(1, 1\)"):
        ops.conv2d_transpose(_z(2, 5, 6, 3), _z(3, 2, 4, 3), (2, 1), output_paddings=(1, 1))
    with pytest.raises(ValueError, match=r"input channels \(5.*must match the filter's input channels \(3"):
        ops.conv2d_transpose(_z(2, 5, 6, 5), _z(3, 2, 4, 3))
    with pytest.raises(ValueError, match="output spatial dim must be positive"):
        ops.conv2d_transpose(_z(2, 5, 6, 3), _z(3, 2, 4, 3), padding=(5, 5, 0, 0))
    with pytest.raises(ValueError, match="filter_layout 'FCRS' is not supported"):
        ops.conv2d_transpose(_z(2, 5, 6, 3), _z(4, 3, 3, 2), filter_layout=FilterLayout.FCRS)
    with pytest.raises(ValueError, match=r"2, 7, 4, 7"):  # MAX's NHWC bias rule: [2, 7, 4, 7] + [4] does not broadcast
        ops.conv2d_transpose(_z(2, 5, 6, 3), _z(3, 2, 4, 3), bias=_z(4))
    with pytest.raises(ValueError, match=r"requires \(input_rank == 4\)"):
        ops.avg_pool2d(_z(7, 6, 3), (3, 3))
    with pytest.raises(ValueError, match="output spatial dim must be positive"):
        ops.max_pool2d(_z(2, 7, 6, 3), (9, 3))
    with pytest.raises(ValueError, match=r"Last dimension of input tensor \(11\) must match the calculated number of blocks \(12\)"):
        ops.fold(_z(2, 12, 11), (4, 5), (2, 2))
    with pytest.raises(ValueError, match=r"Dim 1 of the input tensor \(13\) must be a multiple"):
        ops.fold(_z(2, 13, 12), (4, 5), (2, 2))
    with pytest.raises(ValueError, match=r"size must have the same rank as input \(4\), got 3"):
        ops.resize_linear(_z(2, 3, 5, 6), [3, 9, 4])
    with pytest.raises(ValueError, match="coordinate_transform_mode must be 0-3, got 4"):
        ops.resize_linear(_z(2, 3, 5, 6), [2, 3, 9, 4], coordinate_transform_mode=4)
    with pytest.raises(ValueError, match="round_mode must be 0-3, got 5"):
        ops.resize_nearest(_z(2, 3, 5, 6), [2, 3, 9, 4], round_mode=5)
    with pytest.raises(ValueError, match=r"resize_bicubic requires rank-4 \(NCHW\) input, got rank 3"):
        ops.resize_bicubic(_z(3, 5, 6), [3, 9, 4])
    with pytest.raises(ValueError, match="Input tensor must have rank 4"):
        ops.resize(_z(3, 5, 6), [3, 9, 4])
    with pytest.raises(ValueError, match="roi_align mode must be 'AVG' or 'MAX', got 'avg'"):
        ops.roi_align(_z(2, 7, 6, 3), _z(4, 5), 2, 3, mode="avg")
    with pytest.raises(ValueError, match="roi_align expects rank-2 rois"):
        ops.roi_align(_z(2, 7, 6, 3), _z(4, 5, 1), 2, 3)
    big = np.array([[0, 0, 0, 40, 40], [0, 0, 0, 3, 3]], np.float32)  # a ROI far larger than the 4x4 map, one inside
    with pytest.raises(ValueError, match="more adaptive samples"):
        ops.roi_align(_z(1, 4, 4, 1), big, 2, 2)
    jitted = np.asarray(jax.jit(lambda a, r: ops.roi_align(a, r, 2, 2))(_z(1, 4, 4, 1), big))  # no check under jit: NaN
    assert np.isnan(jitted[0]).all() and np.isfinite(jitted[1]).all()
    # errors come at graph-build time too
    with pytest.raises(ValueError, match="coordinate_transform_mode"):
        Graph("e", forward=lambda t: ops.resize_linear(t, [2, 3, 9, 4], 7), input_types=[TensorType(DType.float32, [2, 3, 5, 6], CPU)])
