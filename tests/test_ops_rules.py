"""MAX 26.7's graph-build rules for maxjax's ops: what MAX refuses (and with which exception), what it
builds (and with which output type), its dtype promotion, and the 64-bit dtypes maxjax declares.

The rows are in ``tests/ops_rules_cases.py`` and ``tests/data/ops_rules_promotion.json``, both
observed with MAX 26.7 itself (``scripts/max_reference/_ops_rules_probe.py``).
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Dim, Graph, TensorType, TensorValue, ops
from ops_rules_cases import CASES, PROMOTION_DTYPES, PROMOTION_OPS, parse_input

M = types.SimpleNamespace(ops=ops, DType=DType, Dim=Dim, DeviceRef=DeviceRef)
ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError}
PROMOTION = json.loads((Path(__file__).parent / "data" / "ops_rules_promotion.json").read_text())


def _type(spec: str) -> TensorType:
    dtype, shape, device = parse_input(spec)
    return TensorType(getattr(DType, dtype), shape, DeviceRef.GPU() if device == "gpu" else DeviceRef.CPU())


def _expected_type(out: str) -> tuple[DType, list[Dim]]:
    dtype, dims = out[:-1].split("[")
    names = {}

    def dim(text: str) -> Dim:
        text = text.strip()
        if text.lstrip("-").isdigit():
            return Dim(int(text))
        for tok in text.replace("+", " ").replace("*", " ").split():
            if tok.isidentifier():
                names[tok] = Dim(tok)
        return Dim(eval(text, {}, names))  # "a + b" -> Dim("a") + Dim("b")

    return getattr(DType, dtype), [dim(d) for d in dims.split(",") if d]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_build_rule(case):
    """Each call raises MAX's exception type while the graph is built, or builds MAX's type."""
    with Graph(case.id, input_types=[_type(s) for s in case.inputs]) as g:
        if case.expected != "ok":
            with pytest.raises(ERRORS[case.expected]) as info:
                case.call(M, *g.inputs)
            assert str(info.value), "the error says what is wrong"
            return
        out = case.call(M, *g.inputs)
    out = out[0] if isinstance(out, (list, tuple)) else out
    dtype, shape = _expected_type(case.out)
    assert (out.dtype, list(out.shape)) == (dtype, shape), f"{case.id}: {out.type}"


def _promotion_call(op: str, lhs: str, rhs: str):
    """The graph inputs and call of one row of the promotion table (see the probe)."""
    scalar = {s: eval(s) for s in ("1", "-1", "1.5", "True", "300", "70000", "16777217")}
    pre = ["bool[2]"] if op == "where" else []
    f = {"where": lambda c, a, b: ops.where(c, a, b), "max": lambda a, b: ops.max(a, b)}.get(op) or getattr(ops, op)
    if lhs in scalar or rhs in scalar:
        t, v, first = (rhs, scalar[lhs], False) if lhs in scalar else (lhs, scalar[rhs], True)
        ins = [*pre, f"{t}[2]"]
        if op == "where":
            return ins, (lambda c, a: f(c, a, v)) if first else (lambda c, a: f(c, v, a))
        return ins, (lambda a: f(a, v)) if first else (lambda a: f(v, a))
    return [*pre, f"{lhs}[2]", f"{rhs}[2]"], f


@pytest.mark.parametrize("op", PROMOTION_OPS)
def test_promotion_table(op):
    """Every (lhs, rhs) pair of dtypes and weak scalars gives MAX 26.7's result dtype or its error."""
    rows = {k: v for k, v in PROMOTION.items() if k.endswith(f"|{op}")}
    assert len(rows) == len(PROMOTION_DTYPES) ** 2 + 2 * len(PROMOTION_DTYPES) * 7
    wrong = []
    for key, want in rows.items():
        lhs, rhs, _ = key.split("|")
        ins, call = _promotion_call(op, lhs, rhs)
        with Graph("p", input_types=[_type(s) for s in ins]) as g:
            try:
                got = call(*g.inputs).dtype.name
            except (ValueError, TypeError, IndexError) as e:
                got = type(e).__name__
        if got != want:
            wrong.append(f"{key}: MAX {want}, maxjax {got}")
    assert not wrong, "\n".join(wrong)


def _run(graph: Graph, *args):
    return [o.to_numpy() for o in InferenceSession().load(graph).execute(*args)]


def test_promoted_values_graph_and_eager():
    """Promotion gives MAX's dtypes and the right numbers when the graph runs, and in eager mode."""
    a = np.array([7, -7, 9], np.int32)
    b = np.array([2, 2, 4], np.int32)
    t = TensorType(DType.int32, [3], DeviceRef.CPU())
    with Graph("div", input_types=[t, t, TensorType(DType.int8, [3], DeviceRef.CPU())]) as g:
        x, y, z = g.inputs
        q = x / y
        assert q.dtype == DType.float64  # MAX: integer true division in float64
        s = ops.where(x > 0, z, y)  # int8 and int32 -> int32
        assert s.dtype == DType.int32
        h = z + 1  # the weak scalar takes int8
        assert h.dtype == DType.int8
        g.output(q, s, h, x // y, x % y)
    q, s, h, fd, md = _run(g, a, b, np.array([1, 2, 3], np.int8))
    np.testing.assert_allclose(q, a / b, rtol=1e-6)
    np.testing.assert_array_equal(s, np.where(a > 0, [1, 2, 3], b))
    np.testing.assert_array_equal(h, [2, 3, 4])
    np.testing.assert_array_equal(fd, a // b)
    np.testing.assert_array_equal(md, a % b)
    # eager: the same rules on concrete values (JAX holds float64 as float32 without x64)
    e = TensorValue(jnp.asarray(a)) / TensorValue(jnp.asarray(b))
    np.testing.assert_allclose(e.to_numpy(), a / b, rtol=1e-6)
    bf = TensorValue(jnp.ones(3, jnp.bfloat16)) * 2
    assert bf.dtype == DType.bfloat16
    with pytest.raises(ValueError, match="300"):
        TensorValue(jnp.ones(3, jnp.int8)) + 300
    with pytest.raises(ValueError):
        TensorValue(jnp.ones(3, jnp.float32)) + TensorValue(jnp.ones(3, jnp.int32))
    with pytest.raises(TypeError):
        ops.exp(1.0)


def test_range_length_and_values():
    """``ops.range``'s length is MAX's ``(stop - start) // step``; values as NumPy's arange."""
    with Graph("range", input_types=[TensorType(DType.float32, ["n"], DeviceRef.CPU())]) as g:
        r1 = ops.range(0, 10, 2, dtype=DType.int32, device=DeviceRef.CPU())
        r2 = ops.range(5, 0, -1, dtype=DType.int32, device=DeviceRef.CPU())
        r3 = ops.range(0.0, 1.0, 0.25, dtype=DType.float32, device=DeviceRef.CPU())
        r4 = ops.range(0, g.inputs[0].shape[0], 1, dtype=DType.int64, device=DeviceRef.CPU())
        r5 = ops.range(0, 10, 3, dtype=DType.int32, device=DeviceRef.CPU())
        assert [list(r.shape) for r in (r1, r2, r3, r5)] == [[5], [5], [4], [3]]
        assert r4.dtype == DType.int64 and list(r4.shape) == [Dim("n")]
        g.output(r1, r2, r3, r4)
    o1, o2, o3, o4 = _run(g, np.zeros(6, np.float32))
    np.testing.assert_array_equal(o1, np.arange(0, 10, 2))
    np.testing.assert_array_equal(o2, np.arange(5, 0, -1))
    np.testing.assert_allclose(o3, np.arange(0, 1, 0.25))
    np.testing.assert_array_equal(o4, np.arange(6))
    # eager
    np.testing.assert_array_equal(ops.range(2, 8, 3, dtype=DType.int32).to_numpy(), [2, 5])


def test_outer_layer_norm_min_max_numbers():
    """``outer``, ``layer_norm`` and both ``min``/``max`` overloads against NumPy, graph and eager."""
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal(3).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    gam, bet = rng.standard_normal(4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    want_ln = (x - mean) / np.sqrt(var + 1e-5) * gam + bet
    f32 = lambda *s: TensorType(DType.float32, list(s), DeviceRef.CPU())  # noqa: E731
    with Graph("nums", input_types=[f32(3), f32(4), f32(2, 4), f32(4), f32(4)]) as g:
        a, b, xx, gg, bb = g.inputs
        g.output(ops.outer(a, b), ops.layer_norm(xx, gg, bb, 1e-5), ops.max(xx, bb), ops.min(xx, axis=0), ops.max(xx))
    o, ln, mx, mn, mr = _run(g, u, v, x, gam, bet)
    np.testing.assert_allclose(o, np.outer(u, v), rtol=1e-6)
    np.testing.assert_allclose(ln, want_ln, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mx, np.maximum(x, bet))
    np.testing.assert_array_equal(mn, x.min(0, keepdims=True))
    np.testing.assert_array_equal(mr, x.max(-1, keepdims=True))
    np.testing.assert_allclose(ops.outer(TensorValue(u), TensorValue(v)).to_numpy(), np.outer(u, v), rtol=1e-6)
    np.testing.assert_allclose(
        ops.layer_norm(TensorValue(x), TensorValue(gam), TensorValue(bet), 1e-5).to_numpy(), want_ln, rtol=1e-5, atol=1e-6
    )


def test_zero_size_dims_build_and_run():
    """MAX builds graphs with 0-size dims; so does maxjax, and they run."""
    f32 = lambda *s: TensorType(DType.float32, list(s), DeviceRef.CPU())  # noqa: E731
    with Graph("zero", input_types=[f32(0, 3), f32(3, 0), TensorType(DType.int64, [2], DeviceRef.CPU())]) as g:
        a, b, i = g.inputs
        outs = [
            ops.matmul(a, b), ops.sum(a, 0), ops.max(a, axis=0), ops.argmax(a, 0), ops.reshape(a, [-1]),
            ops.softmax(b), a[0:0], ops.concat([a, ops.constant(np.ones((1, 3), np.float32))]), ops.gather(a, i, 0),
            ops.top_k(b, 0)[0],
        ]  # fmt: skip
        g.output(*outs)
    assert [list(o.shape) for o in g.output_types] == [
        [0, 0], [1, 3], [1, 3], [1, 3], [0], [3, 0], [0, 3], [1, 3], [2, 3], [3, 0],
    ]  # fmt: skip
    got = _run(g, np.zeros((0, 3), np.float32), np.zeros((3, 0), np.float32), np.array([0, 0], np.int64))
    assert [r.shape for r in got] == [(0, 0), (1, 3), (1, 3), (1, 3), (0,), (3, 0), (0, 3), (1, 3), (2, 3), (3, 0)]
    np.testing.assert_array_equal(got[1], np.zeros((1, 3)))
    np.testing.assert_array_equal(got[7], np.ones((1, 3)))


def test_graph_passes_extra_arguments_to_forward():
    """``Graph(name, forward, input_types, path, *args, **kwargs)`` calls ``forward(*inputs, *args, **kwargs)``."""

    def forward(x, scale, *, shift):
        return x * scale + shift

    g = Graph("extra", forward, [TensorType(DType.float32, [2], DeviceRef.CPU())], None, 3.0, shift=1.0)
    (out,) = _run(g, np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(out, [4.0, 7.0])
    with pytest.raises(TypeError, match="extra arguments"):
        Graph("none", None, [], None, 3.0)


def test_rebind_renames_dims_and_runs():
    """``rebind`` gives the value new dim names (MAX checks the sizes when the graph runs)."""
    t = TensorType(DType.float32, ["a", 3], DeviceRef.CPU())
    with Graph("rebind", input_types=[t, TensorType(DType.float32, ["b", 3], DeviceRef.CPU())]) as g:
        x, y = g.inputs
        r = x.rebind(["b", 3], message="same rows")
        assert list(r.shape) == [Dim("b"), 3]
        g.output(r + y)  # only possible once the dims agree
    (out,) = _run(g, np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(out, np.full((2, 3), 2.0))


def test_int64_tokens_declared_and_checked():
    """64-bit decision (a): a graph declares MAX's int64 while JAX holds int32; host values are
    checked at the boundary, and token ids run through an embedding as MAX's LLM graphs do."""
    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    t = TensorType(DType.int64, ["batch", "seq"], DeviceRef.CPU())
    with Graph("tokens", input_types=[t]) as g:
        (tok,) = g.inputs
        assert tok.dtype == DType.int64
        nxt = tok + 1
        assert nxt.dtype == DType.int64  # int64 stays int64 through ops that keep their dtype
        assert ops.cast(tok, DType.int32).dtype == DType.int32
        assert ops.argmax(ops.cast(tok, DType.float32)).dtype == DType.int64
        g.output(ops.gather(ops.constant(emb), tok, axis=0), nxt)
    assert g.input_types[0].dtype == DType.int64
    assert [o.dtype for o in g.output_types] == [DType.float32, DType.int64]
    model = InferenceSession().load(g)
    assert [s.dtype for s in model.input_metadata] == [DType.int64]
    assert [s.dtype for s in model.output_metadata] == [DType.float32, DType.int64]
    tokens = np.array([[1, 2, 3], [9, 0, 4]], np.int64)
    g.check_values([tokens])  # token ids fit
    rows, ids = (o.to_numpy() for o in model.execute(tokens))
    np.testing.assert_array_equal(rows, emb[tokens])
    np.testing.assert_array_equal(ids, tokens + 1)
    with pytest.raises(ValueError, match=r"input0.*1099511627776.*int64"):
        g.check_values([np.array([[1, 2**40]], np.int64)])
