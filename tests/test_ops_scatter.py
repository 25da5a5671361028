"""MAX 26.7's scatter family, nonzero, masked_scatter, cond, while_loop, hann_window, irfft,
as_interleaved_complex, buffer_create(init_value), constant_external and parallel: against NumPy on
random inputs and against MAX's own numbers (tests/data/max_reference/ops_scatter.npz), in graph
mode, eagerly and under jax.jit; and MAX's errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import BufferType, BufferValue, DeviceRef, Graph, TensorType, TensorValue, ops
from max_reference import load

REF = load("ops_scatter")
CPU = DeviceRef.CPU()
_spec = importlib.util.spec_from_file_location(
    "ops_scatter_ref", Path(__file__).resolve().parents[1] / "scripts" / "max_reference" / "ops_scatter.py"
)
SPEC = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(SPEC)  # the reference's op lists and cases (MAX itself is not imported)
NAMES = [k for k in SPEC.inputs() if k != "ext"]
UFUNC = {"set": None, "add": np.add, "max": np.maximum, "min": np.minimum, "mul": np.multiply}


# -- NumPy references ----------------------------------------------------------------------------
def np_scatter_axis(x, u, idx, axis, reduce):
    out = np.array(x, copy=True)
    grid = list(np.indices(idx.shape))
    grid[axis % x.ndim] = np.where(idx < 0, idx + x.shape[axis], idx)
    where = tuple(grid)
    if reduce == "set":
        out[where] = u
    else:
        UFUNC[reduce].at(out, where, u)
    return out


def np_scatter_nd(x, u, idx, reduce):
    out = np.array(x, copy=True)
    k = idx.shape[-1]
    where = tuple(np.where(idx[..., i] < 0, idx[..., i] + x.shape[i], idx[..., i]) for i in range(k))
    if reduce == "set":
        out[where] = u
    else:
        UFUNC[reduce].at(out, where, u)
    return out


def np_masked_scatter(x, mask, u):
    out = np.array(x, copy=True).reshape(-1)
    keep = np.broadcast_to(mask != 0, x.shape).reshape(-1)
    out[keep] = u.reshape(-1)[: keep.sum()]
    return out.reshape(x.shape)


def reduce_of(op):
    return op.rsplit("_", 1)[-1] if op not in ("scatter", "scatter_nd") else "set"


# -- the program of the reference, with maxjax ------------------------------------------------
def forward(*vals):
    v = dict(zip(NAMES, vals))
    outs = []
    for op in SPEC.AXIS_OPS:
        f = getattr(ops, op)
        i0 = v["i0_unique"] if op == "scatter" else v["i0"]
        i1 = v["i1_unique"] if op == "scatter" else v["i1"]
        outs += [f(v["x"], v["u0"], i0, axis=0), f(v["x"], v["u1"], i1, axis=1), f(v["x3"], v["u3"], v["i3"], -1)]
    for op in SPEC.ND_OPS:
        f = getattr(ops, op)
        rows = (v["ndu_rows_unique"], v["ndi_rows_unique"]) if op == "scatter_nd" else (v["ndu_rows"], v["ndi_rows"])
        outs += [f(v["x"], *rows), f(v["x"], v["ndu_elems"], v["ndi_elems"])]
    outs += [
        ops.masked_scatter(v["x"], v["mask"], v["ms_updates"], "n"),
        ops.masked_scatter(v["x"], v["mask_row"], v["ms_updates"], "n2"),
        ops.nonzero(v["mask"], 3),
        ops.nonzero(v["mask"], 12),
    ]
    x = v["x"]
    pred = ops.squeeze(ops.greater(ops.sum(ops.reshape(x, [20]), 0), ops.constant(0.0, DType.float32, CPU)), 0)
    ty = TensorType(DType.float32, [4, 5], CPU)
    outs += ops.cond(pred, [ty, ty], lambda: [x * 2.0, ops.exp(x)], lambda: [x - 1.0, ops.sin(x)])
    outs += ops.cond(ops.logical_not(pred), [ty], lambda: x * 2.0, lambda: x - 1.0)
    n0 = ops.constant(0, DType.int32, CPU)
    outs += ops.while_loop([n0, x], lambda n, y: n < v["limit"], lambda n, y: [n + 1, y * 0.5 + ops.cos(x)])
    outs += [ops.hann_window(n, CPU, periodic=p) for n, p in SPEC.HANN]
    outs.append(ops.as_interleaved_complex(x[:, :4]))
    return outs


KEYS = [f"{op}.{case}" for op in SPEC.AXIS_OPS for case in ("axis0", "axis1", "3d")]
KEYS += [f"{op}.{case}" for op in SPEC.ND_OPS for case in ("rows", "elems")]
KEYS += ["masked_scatter", "masked_scatter.row", "nonzero.3", "nonzero.12", "cond.a", "cond.b", "cond.not"]
KEYS += ["while.n", "while.y"] + [f"hann.{n}.{int(p)}" for n, p in SPEC.HANN] + ["as_interleaved_complex"]


def _check_all(outs, mode):
    assert len(outs) == len(KEYS)
    for k, got in zip(KEYS, outs):
        got, want = np.asarray(got), REF[k]
        assert got.shape == want.shape, (mode, k, got.shape, want.shape)
        if k.startswith("nonzero"):  # MAX's int64 is int32 here unless JAX's x64 is on
            np.testing.assert_array_equal(got, want, err_msg=f"{mode} {k}")
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{mode} {k}")


def _arrays():
    return [REF[k] for k in NAMES]


def test_all_ops_match_max_in_graph_mode():
    g = Graph("ops_scatter", forward=forward, input_types=[TensorType(DType.of(a.dtype), a.shape, CPU) for a in _arrays()])
    outs = InferenceSession().load(g).execute(*_arrays())
    _check_all([o.to_numpy() for o in outs], "graph")
    assert sum(n.op in ("cond", "while_loop") for n in g._nodes) == 3  # each control-flow op is one node


def test_all_ops_match_max_eagerly_and_under_jit():
    eager = forward(*(TensorValue(jnp.asarray(a)) for a in _arrays()))
    assert all(isinstance(o, TensorValue) for o in eager)
    _check_all(eager, "eager")
    _check_all(jax.jit(lambda *a: [o.to_jax() if isinstance(o, TensorValue) else o for o in forward(*a)])(*_arrays()), "jit")


def test_max_numbers_agree_with_numpy():
    """The reference itself against NumPy: MAX's index semantics (negative indices wrap, duplicates
    combine) are the ones implemented."""
    r = REF
    for op in SPEC.AXIS_OPS:
        red = reduce_of(op)
        i0, i1 = (r["i0_unique"], r["i1_unique"]) if op == "scatter" else (r["i0"], r["i1"])
        np.testing.assert_allclose(r[f"{op}.axis0"], np_scatter_axis(r["x"], r["u0"], i0, 0, red), rtol=1e-6)
        np.testing.assert_allclose(r[f"{op}.axis1"], np_scatter_axis(r["x"], r["u1"], i1, 1, red), rtol=1e-6)
        if op != "scatter":  # plain scatter with duplicates keeps an unspecified one
            np.testing.assert_allclose(r[f"{op}.3d"], np_scatter_axis(r["x3"], r["u3"], r["i3"], -1, red), rtol=1e-6)
    for op in SPEC.ND_OPS:
        red = reduce_of(op)
        rows = (r["ndu_rows_unique"], r["ndi_rows_unique"]) if op == "scatter_nd" else (r["ndu_rows"], r["ndi_rows"])
        np.testing.assert_allclose(r[f"{op}.rows"], np_scatter_nd(r["x"], *rows, red), rtol=1e-6)
        np.testing.assert_allclose(r[f"{op}.elems"], np_scatter_nd(r["x"], r["ndu_elems"], r["ndi_elems"], red), rtol=1e-6)
    np.testing.assert_array_equal(r["masked_scatter"], np_masked_scatter(r["x"], r["mask"], r["ms_updates"]))
    np.testing.assert_array_equal(r["masked_scatter.row"], np_masked_scatter(r["x"], r["mask_row"], r["ms_updates"]))
    nz = np.argwhere(r["mask"])
    np.testing.assert_array_equal(r["nonzero.nz"], nz)
    np.testing.assert_array_equal(r["nonzero.3"], nz[:3])  # a static out_dim: the first rows, zeros after
    np.testing.assert_array_equal(r["nonzero.12"], np.concatenate([nz, np.zeros((12 - len(nz), 2), nz.dtype)]))


def test_random_inputs_against_numpy_in_three_modes():
    rng = np.random.default_rng(7)
    for trial in range(3):
        shape = tuple(int(s) for s in rng.integers(2, 6, 3))
        axis = int(rng.integers(-3, 3))
        ishape = tuple(int(rng.integers(1, s + 1)) if d != axis % 3 else int(rng.integers(1, 8)) for d, s in enumerate(shape))
        x = rng.standard_normal(shape).astype(np.float32)
        u = rng.standard_normal(ishape).astype(np.float32)
        idx = rng.integers(-shape[axis], shape[axis], ishape).astype(np.int32 if trial % 2 else np.int64)
        k = int(rng.integers(1, 4))
        q = int(rng.integers(1, 6))
        nd_idx = np.stack([rng.integers(-shape[d], shape[d], q) for d in range(k)], -1).astype(np.int64)
        nd_u = rng.standard_normal((q, *shape[k:])).astype(np.float32)
        ops_ = [(op, "axis") for op in SPEC.AXIS_OPS[1:]] + [(op, "nd") for op in SPEC.ND_OPS[1:]]

        def run(x, u, idx, nd_u, nd_idx):
            return [getattr(ops, op)(x, u, idx, axis) if kind == "axis" else getattr(ops, op)(x, nd_u, nd_idx) for op, kind in ops_]

        want = [
            np_scatter_axis(x, u, idx, axis, reduce_of(op)) if kind == "axis" else np_scatter_nd(x, nd_u, nd_idx, reduce_of(op))
            for op, kind in ops_
        ]
        args = (x, u, idx, nd_u, nd_idx)
        eager = run(*args)
        assert all(isinstance(o, jax.Array) for o in eager)  # plain arrays in, plain arrays out
        jitted = jax.jit(run)(*args)
        g = Graph(f"rand{trial}", forward=run, input_types=[TensorType(DType.of(a.dtype), a.shape, CPU) for a in args])
        graph = [o.to_numpy() for o in InferenceSession().load(g).execute(*args)]
        for mode, outs in (("eager", eager), ("jit", jitted), ("graph", graph)):
            for (op, _), got, w in zip(ops_, outs, want):
                np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-6, err_msg=f"{mode} {op} trial {trial}")


def test_nonzero_and_masked_scatter_modes():
    m = REF["mask"]
    np.testing.assert_array_equal(np.asarray(ops.nonzero(m, "nz")), REF["nonzero.nz"])  # eagerly a name is exact
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: ops.nonzero(a, 12))(m)), REF["nonzero.12"])
    with pytest.raises(NotImplementedError, match=r"out_dim='nz' is a data-dependent size"):
        jax.jit(lambda a: ops.nonzero(a, "nz"))(m)
    with Graph("nz", input_types=[TensorType(DType.float32, [4, 5], CPU)]) as g, pytest.raises(NotImplementedError, match="pass an int out_dim"):
        ops.nonzero(g.inputs[0], "nz")
    with pytest.raises(ValueError, match="Scalar inputs not supported"):
        ops.nonzero(np.float32(1), 1)
    # masked_scatter needs no data-dependent shape: a named out_dim works under jit and in graphs
    x, u = REF["x"], REF["ms_updates"]
    got = jax.jit(lambda a, b, c: ops.masked_scatter(a, b, c, "n"))(x, m, u)
    np.testing.assert_array_equal(np.asarray(got), REF["masked_scatter"])
    few = u.reshape(-1)[:2]  # fewer updates than true positions: the rest stay (MAX reads past the end)
    got = np.asarray(ops.masked_scatter(x, m, few, "n"))
    keep = np.argwhere(m.reshape(-1)).ravel()
    np.testing.assert_array_equal(got.reshape(-1)[keep[:2]], few)
    np.testing.assert_array_equal(got.reshape(-1)[keep[2:]], x.reshape(-1)[keep[2:]])
    limited = np.asarray(ops.masked_scatter(x, m, u, 2))  # an int out_dim writes the first out_dim
    np.testing.assert_array_equal(limited, got)


def test_cond_and_while_loop_in_graph_with_symbolic_dims():
    def fwd(a, p, n):
        t = TensorType(DType.float32, ["b", 3], CPU)

        def then():  # a weight first used inside a branch stays a graph input
            w = ops.constant_external("w", TensorType(DType.float32, [3], CPU))
            return [ops.reshape(a * 2.0 + w, ["b", 3]), ops.constant(1, DType.int32, CPU)]

        def other():
            return [ops.cond(p, [t], lambda: a, lambda: a + 10.0)[0] - 1.0, ops.constant(2, DType.int32, CPU)]

        r, which = ops.cond(p, [t, TensorType(DType.int32, [], CPU)], then, other)
        i, acc = ops.while_loop([ops.constant(0, DType.int32, CPU), r], lambda i, acc: i < n, lambda i, acc: [i + 1, acc + a])
        return r, which, i, acc

    g = Graph("cf", forward=fwd, input_types=[TensorType(DType.float32, ["b", 3], CPU), TensorType(DType.bool, [], CPU), TensorType(DType.int32, [], CPU)])
    assert g.weight_names == ["w"] and [n.kind for n in g._nodes].count("weight") == 1
    w = np.array([0.5, -1.0, 2.0], np.float32)
    model = InferenceSession().load(g, weights_registry={"w": w})
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    for p, n in ((True, 3), (False, 0), (False, 4)):
        aa = np.concatenate([a] * (n + 1))  # another batch size per run
        r, which, i, acc = (o.to_numpy() for o in model.execute(aa, np.array(p), np.array(n, np.int32)))
        want_r = aa * 2 + w if p else aa + 9
        np.testing.assert_array_equal(r, want_r)
        assert int(which) == (1 if p else 2) and int(i) == n
        np.testing.assert_array_equal(acc, want_r + n * aa)


def test_control_flow_eager_and_jit_return_types():
    x = np.arange(4, dtype=np.float32)
    t = [TensorType(DType.float32, [4], CPU)]
    out = ops.cond(jnp.array(False), t, lambda: jnp.asarray(x) * 2, lambda: jnp.asarray(x) + 1)
    assert isinstance(out, list) and isinstance(out[0], jax.Array)
    np.testing.assert_array_equal(np.asarray(out[0]), x + 1)
    tv = ops.cond(TensorValue(jnp.array(True)), t, lambda: TensorValue(jnp.asarray(x)) * 2, lambda: TensorValue(jnp.asarray(x)))
    assert isinstance(tv[0], TensorValue)
    np.testing.assert_array_equal(tv[0].to_numpy(), 2 * x)
    assert ops.cond(jnp.array(True), None, lambda: None, lambda: None) == []
    f = jax.jit(lambda p, v: ops.cond(p, t, lambda: v * 2, lambda: v - 1)[0])
    np.testing.assert_array_equal(np.asarray(f(True, x)), 2 * x)
    np.testing.assert_array_equal(np.asarray(f(False, x)), x - 1)
    w = jax.jit(lambda v: ops.while_loop([jnp.int32(0), v], lambda i, y: i < 3, lambda i, y: [i + 1, y * 2]))(x)
    assert int(w[0]) == 3
    np.testing.assert_array_equal(np.asarray(w[1]), 8 * x)
    (single,) = ops.while_loop(TensorValue(jnp.int32(1)), lambda i: i < 100, lambda i: i * 3)
    assert isinstance(single, TensorValue) and int(single.to_numpy()) == 243


def test_control_flow_errors():
    t = TensorType(DType.float32, [4], CPU)
    with Graph("e", input_types=[t, TensorType(DType.bool, [], CPU), TensorType(DType.int32, [], CPU)]) as g:
        x, p, n = g.inputs
        with pytest.raises(TypeError, match="can not be created directly from a 'bool'"):
            ops.cond(True, [t], lambda: x, lambda: x)
        with pytest.raises(ValueError, match=r"predicate for `ops.cond` must be a bool scalar tensor, got int32\[\]"):
            ops.cond(n, [t], lambda: x, lambda: x)
        with pytest.raises(ValueError, match=r"must be a bool scalar tensor, got bool\[4\]"):
            ops.cond(x > 0, [t], lambda: x, lambda: x)
        with pytest.raises(TypeError, match="Results don't match expected types"):
            ops.cond(p, [t], lambda: x, lambda: ops.cast(x, DType.float16))
        with pytest.raises(TypeError, match="Results don't match expected types"):
            ops.cond(p, None, lambda: x, lambda: x)
        with pytest.raises(TypeError, match="Results don't match expected types"):
            ops.cond(p, [t], lambda: x, lambda: [x, x])
        with pytest.raises(ValueError, match="While loops must have at least one iteration value"):
            ops.while_loop([], lambda: p, lambda: [])
        with pytest.raises(ValueError, match="predicate for `ops.while_loop` must be a bool scalar"):
            ops.while_loop([n], lambda i: i, lambda i: i + 1)
        with pytest.raises(TypeError, match="Results don't match expected types"):
            ops.while_loop([n, x], lambda i, y: i < 3, lambda i, y: [i + 1])
        with pytest.raises(NotImplementedError, match="Buffer operations are currently not supported in while loops"):
            ops.while_loop([BufferValue(np.zeros(3, np.float32))], lambda b: p, lambda b: b)
        buf = ops.buffer_create(BufferType(DType.float32, [4], CPU))
        with pytest.raises(NotImplementedError, match="writing a buffer inside ops.cond"):
            ops.cond(p, None, lambda: ops.buffer_store(buf, x), lambda: None)
        leaked = []
        ops.cond(p, [t], lambda: leaked.append(x * 3.0) or x, lambda: x)
        g.output(leaked[0] + 1.0)  # a branch's value used outside it: refused when the graph runs
        n_nodes = len(g._nodes)
    assert n_nodes == len({id(nd) for nd in g._nodes})  # failed branches left no nodes behind
    with pytest.raises(ValueError, match="computed inside the then branch of ops.cond is used outside it"):
        InferenceSession().load(g).execute(np.zeros(4, np.float32), np.array(True), np.array(1, np.int32))
    with pytest.raises(ValueError, match="predicate for `ops.while_loop` must be a bool scalar"):
        ops.while_loop(jnp.float32(1), lambda v: v, lambda v: v)
    with pytest.raises(TypeError, match="Results don't match expected types"):
        ops.while_loop(jnp.float32(1), lambda v: v < 3, lambda v: v.astype(jnp.int32))


# -- scatter errors ------------------------------------------------------------------------------
def test_scatter_errors():
    x = np.zeros((4, 5), np.float32)
    u = np.ones((2, 5), np.float32)
    i = np.zeros((2, 5), np.int64)
    with pytest.raises(ValueError, match=r"Invalid axis value 2. Axis must be in range \[-2, 1\]"):
        ops.scatter(x, u, i, 2)
    with pytest.raises(ValueError, match=r"Invalid axis value -3"):
        ops.scatter_add(x, u, i, -3)
    with pytest.raises(ValueError, match=r"The input dtype 'DType.float32' and updates dtype 'DType.float16' must match."):
        ops.scatter_max(x, u.astype(np.float16), i, 0)
    with pytest.raises(ValueError, match=r"Invalid indices dtype: 'DType.float32'. Indices must be of type int32 or int64."):
        ops.scatter_min(x, u, i.astype(np.float32), 0)
    with pytest.raises(ValueError, match=r"Invalid indices dtype: 'DType.int16'"):
        ops.scatter_mul(x, u, i.astype(np.int16), 0)
    with pytest.raises(ValueError, match=r"must have equal rank, got input \[4, 5\], updates \[2, 5, 1\]"):
        ops.scatter(x, u[..., None], i[..., None], 0)
    with pytest.raises(ValueError, match=r"updates shape \[2, 5\] must equal indices shape \[2, 3\]"):
        ops.scatter_add(x, u, i[:, :3], 0)
    with pytest.raises(ValueError, match=r"indices dimension 1 \(6\) exceeds the input's \(5\)"):
        ops.scatter_add(x, np.ones((2, 6), np.float32), np.zeros((2, 6), np.int64), 0)
    ops.scatter_add(x, np.ones((7, 5), np.float32), np.zeros((7, 5), np.int64), 0)  # along the axis: any length
    with pytest.raises(TypeError, match="updates must be a tensor"):
        ops.scatter(x, 1.0, i, 0)
    with pytest.raises(ValueError, match=r"The input dtype \(DType.float32\) and updates dtype \(DType.float16\) must match"):
        ops.scatter_nd_max(x, u.astype(np.float16), np.zeros((2, 1), np.int64))
    with pytest.raises(ValueError, match=r"Invalid indices dtype: 'DType.float32'"):
        ops.scatter_nd_min(x, u, np.zeros((2, 1), np.float32))
    with pytest.raises(ValueError, match=r"updates must have shape indices.shape\[:-1\] \+ input.shape\[1:\] = \[2, 5\], got \[3, 5\]"):
        ops.scatter_nd_add(x, np.ones((3, 5), np.float32), np.zeros((2, 1), np.int64))
    with pytest.raises(ValueError, match=r"static k <= input rank 2, got indices \[2, 3\]"):
        ops.scatter_nd(x, np.ones(2, np.float32), np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match=r"The input dtype \(DType.float32\) and updates dtype \(DType.int32\) must match"):
        ops.masked_scatter(x, x, np.ones(3, np.int32), "n")
    with pytest.raises(ValueError, match=r"mask of shape \[3\] does not broadcast to the input's shape \[4, 5\]"):
        ops.masked_scatter(x, np.ones(3, bool), np.ones(3, np.float32), "n")
    with pytest.raises(TypeError, match="mask must be a tensor"):
        ops.masked_scatter(x, [True] * 5, np.ones(3, np.float32), "n")
    gpu = DeviceRef.GPU()
    with Graph("dev", input_types=[TensorType(DType.float32, [4, 5], CPU), TensorType(DType.float32, [2, 5], gpu)]) as g:
        with pytest.raises(ValueError, match=r"Input values must be on the same device"):
            ops.scatter(g.inputs[0], g.inputs[1], i, 0)


def test_scatter_nd_in_place_under_jit():
    """scatter_nd (moved here from shape.py; the KV cache writes use it) still updates a donated input in place."""
    f = jax.jit(lambda c, u, i: ops.scatter_nd_add(c, u, i), donate_argnums=0)
    hlo = f.lower(np.zeros((8, 4), np.float32), np.ones((2, 4), np.float32), np.array([[1], [1]], np.int32)).compile().as_text()
    assert "input_output_alias" in hlo or "may-alias" in hlo or "must-alias" in hlo
    out = f(jnp.zeros((8, 4), jnp.float32), np.ones((2, 4), np.float32), np.array([[1], [-1]], np.int32))
    np.testing.assert_array_equal(np.asarray(out)[[1, 7]], np.ones((2, 4)))


# -- signal ops ----------------------------------------------------------------------------------
def test_hann_window_against_numpy_and_errors():
    for n, periodic in SPEC.HANN:
        np.testing.assert_allclose(np.asarray(ops.hann_window(n, CPU, periodic=periodic).to_numpy()), REF[f"hann.{n}.{int(periodic)}"], rtol=1e-6, atol=1e-7)
        m = n + 1 if periodic else n
        want = np.hanning(m)[:n] if n > 1 else np.ones(n)
        np.testing.assert_allclose(ops.hann_window(n, CPU, periodic=periodic).to_numpy(), want, atol=1e-6)
    h = ops.hann_window(6, CPU, dtype=DType.bfloat16)
    assert h.dtype == DType.bfloat16 and h.shape == [6]
    with pytest.raises(ValueError, match="window_length must be non-negative"):
        ops.hann_window(-1, CPU)
    with pytest.raises(TypeError, match="window_length must be an integer, got float"):
        ops.hann_window(3.0, CPU)
    with pytest.raises(TypeError, match="got int64"):
        ops.hann_window(np.int64(3), CPU)
    with pytest.raises(ValueError, match=r"Unsafe cast: Can't promote python float to dtype\(DType.int32\)"):
        ops.hann_window(5, CPU, dtype=DType.int32)


def test_irfft_against_numpy_in_three_modes():
    rng = np.random.default_rng(3)
    spec = rng.standard_normal((3, 6, 5)).astype(np.float32)
    cplx = rng.standard_normal((3, 6, 5, 2)).astype(np.float32)
    cases = [  # (input, n, axis, normalization, complex)
        (spec, None, -1, "backward", False), (spec, 12, 1, "ortho", False), (spec, 5, 0, "forward", False),
        (cplx, None, -1, "backward", True), (cplx, 7, 1, ops.irfft.__globals__["Normalization"].ORTHO, True),
        (cplx, 16, 0, "forward", True),
    ]  # fmt: skip

    def want(a, n, axis, norm, is_c):
        z = a[..., 0] + 1j * a[..., 1] if is_c else a.astype(np.complex128)
        return np.fft.irfft(z, n=n, axis=axis, norm=str(getattr(norm, "value", norm)))

    def run(spec, cplx):
        return [ops.irfft(spec if not c else cplx, n, axis, norm, c) for _, n, axis, norm, c in cases]

    eager, jitted = run(spec, cplx), jax.jit(run)(spec, cplx)
    g = Graph("irfft", forward=run, input_types=[TensorType(DType.float32, spec.shape, CPU), TensorType(DType.float32, cplx.shape, CPU)])
    graph = [o.to_numpy() for o in InferenceSession().load(g).execute(spec, cplx)]
    for mode, outs in (("eager", eager), ("jit", jitted), ("graph", graph)):
        for case, got in zip(cases, outs):
            w = want(*case)
            assert np.asarray(got).dtype == np.float32 and got.shape == w.shape
            np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-5, err_msg=f"{mode} {case[1:]}")
    with pytest.raises(ValueError, match="Input tensor must be of type float32, got DType.int64"):
        ops.irfft(np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="marked as complex, but last dimension is not 2"):
        ops.irfft(spec, input_is_complex=True)
    with pytest.raises(ValueError, match="Invalid normalization: sideways"):
        ops.irfft(spec, normalization="sideways")
    with Graph("sym", input_types=[TensorType(DType.float32, [2, "f"], CPU)]) as g2, pytest.raises(ValueError, match="Axis dimension must be static, got f"):
        ops.irfft(g2.inputs[0])


def test_as_interleaved_complex():
    x = REF["x"]
    np.testing.assert_array_equal(np.asarray(ops.as_interleaved_complex(x[:, :4])), REF["as_interleaved_complex"])
    with pytest.raises(ValueError, match="The last dimension must be divisible by 2"):
        ops.as_interleaved_complex(x)
    with pytest.raises(IndexError):
        ops.as_interleaved_complex(np.float32(1))
    with Graph("c", input_types=[TensorType(DType.float32, [2, "f"], CPU)]) as g, pytest.raises(TypeError, match="The last dimension must be static"):
        ops.as_interleaved_complex(g.inputs[0])


# -- buffers, external constants, parallel -------------------------------------------------------
def parallel_body(u, w):
    return [u * w + u, ops.exp(w)]


def test_buffer_create_init_value_constant_external_and_parallel_match_max():
    x = REF["x"]
    ty = TensorType(DType.float32, [4, 5], CPU)

    def fwd(a, b):
        buf = ops.buffer_create(BufferType(DType.float32, [3], CPU), 1.5)
        ext = ops.constant_external("ext", TensorType(DType.float32, [3, 2], CPU))
        assert ops.constant_external("ext", TensorType(DType.float32, [3, 2], CPU))._node is ext._node  # one weight
        par = ops.parallel([[a, b], [b, a]], parallel_body, result_types=[[ty, ty], [ty, ty]])
        with pytest.raises(NotImplementedError, match=r"init_value=1.5\), MAX's persistent state"):
            ops.buffer_store(buf, np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="already an external constant of type"):
            ops.constant_external("ext", TensorType(DType.float32, [2, 3], CPU))
        return [ops.buffer_load(buf), ext * 3.0, *par[0], *par[1]]

    g = Graph("misc", forward=fwd, input_types=[ty, ty])
    assert g.weight_names == ["ext"]
    outs = InferenceSession().load(g, weights_registry={"ext": REF["ext"]}).execute(x, x * 2)
    keys = ["buffer_create.init", "constant_external", "parallel.0.0", "parallel.0.1", "parallel.1.0", "parallel.1.1"]
    for k, o in zip(keys, outs):
        np.testing.assert_allclose(o.to_numpy(), REF[k], rtol=1e-6)
    np.testing.assert_allclose(REF["parallel.0.1"], 2 * x * x + 2 * x, rtol=1e-6)  # launch 1 of bundle 0: b * a + b
    # eagerly: parallel calls the body per launch; a buffer made eagerly holds its init value
    par = ops.parallel([[x, 2 * x], [2 * x, x]], parallel_body, result_types=[[ty, ty], [ty, ty]])
    for b in range(2):
        for launch in range(2):
            np.testing.assert_allclose(np.asarray(par[b][launch]), REF[f"parallel.{b}.{launch}"], rtol=1e-6)
    b = ops.buffer_create(BufferType(DType.int32, [2], CPU), 7)
    np.testing.assert_array_equal(ops.buffer_load(b).to_numpy(), [7, 7])
    ops.buffer_store(b, ops.buffer_load(b) + 1)  # eagerly it is an ordinary buffer: its writes stay
    np.testing.assert_array_equal(ops.buffer_load(b).to_numpy(), [8, 8])
    with pytest.raises(OverflowError):
        ops.buffer_create(BufferType(DType.uint8, [2], CPU), 300)
    z = ops.buffer_create(BufferType(DType.float32, [2], CPU))
    ops.buffer_store(z, np.ones(2, np.float32))  # a plain created buffer is writable
    with pytest.raises(LookupError):
        ops.constant_external("w", ty)
    with pytest.raises(ValueError, match="input bundle 1 has 1 launches; bundle 0 has 2"):
        ops.parallel([[x, x], [x]], lambda a, b: a, result_types=[[ty, ty]])
    with pytest.raises(ValueError, match=r"result_types\[0\] has 1 types; expected 2"):
        ops.parallel([[x, x]], lambda a: a, result_types=[[ty]])
    with pytest.raises(ValueError, match=r"parallel body yielded 2 tensor\(s\), expected 1"):
        ops.parallel([[x]], lambda a: [a, a], result_types=[[ty]])
    with pytest.raises(NotImplementedError, match="chain"):
        ops.parallel([[x]], lambda a: a, buffers=[Buffer.from_numpy(x)], chain=object(), result_types=[[ty]])


def test_placeholder_constant_external_resolved_by_call_prefix():
    t = TensorType(DType.float32, [3, 2], CPU)
    with Graph("main", input_types=[t]) as g:
        with g.add_subgraph("sub", input_types=[t]) as sub:
            sub.output(sub.inputs[0] + ops.constant_external("w", t, is_placeholder=True))
        g.output(*ops.call(sub, g.inputs[0], prefix="layer1."))
        with pytest.raises(ValueError, match="is_placeholder=True\\): a placeholder is resolved by ops.call's prefix"):
            ops.constant_external("v", t, is_placeholder=True)
    w = REF["ext"]
    out = InferenceSession().load(g, weights_registry={"layer1.w": w}).execute(np.ones((3, 2), np.float32))[0]
    np.testing.assert_allclose(out.to_numpy(), 1 + w)


def test_reexports_of_max_graph_ops():
    from maxjax import graph

    for name in ("DType", "DeviceRef", "Graph", "TensorType", "TensorValue"):
        assert getattr(ops, name) is getattr(graph, name) and name in ops.__all__
