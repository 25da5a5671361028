"""build_subgraph + ops.call: traced once, chains lowered to lax.scan, fallbacks, errors (issue 4)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession, Program, enable_compilation_cache
from maxjax.graph import DeviceRef, Graph, TensorType, ops
from maxjax.graph.layer_weights import LayerWeights
from maxjax.graph.scan import find_chains

RNG = np.random.default_rng(4)
D = 8


class Block(nn.Module):
    def __init__(self, dim=D, hidden=16):
        super().__init__()
        self.norm = nn.RMSNorm(dim, DType.float32, eps=1e-6)
        self.up = nn.Linear(dim, hidden, DType.float32, DeviceRef.CPU())
        self.down = nn.Linear(hidden, dim, DType.float32, DeviceRef.CPU())

    def __call__(self, x):
        return x + self.down(ops.silu(self.up(self.norm(x))))


class Stack(nn.Module):
    """MAX's loop: one subgraph from layer 0, called once per layer with its prefix."""

    def __init__(self, n, mode="chain"):
        super().__init__()
        self.layers = nn.LayerList([Block() for _ in range(n)])
        self.mode = mode

    def __call__(self, x):
        if self.mode == "unrolled":
            for layer in self.layers:
                x = layer(x)
            return x
        sub = self.layers[0].build_subgraph("block", [x.type], weight_prefix="layers.0.")
        h, taps = x, []
        for i in range(len(self.layers)):
            prefix = "layers.0." if self.mode == "same_prefix" else f"layers.{i}."
            h = ops.call(sub, h, prefix=prefix)[0].tensor
            if self.mode == "tap" and i == 1:
                taps.append(h)
        return h + taps[0] if taps else h


def _load(m, sd=None):
    sd = sd or {k: (RNG.standard_normal(v.shape) * 0.3).astype(np.float32) for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    return sd


def _types():
    return [TensorType(DType.float32, ["batch", "seq", D], DeviceRef.CPU())]


def _reference(sd, x, n, prefixes=None):
    ref = Stack(n, "unrolled")
    ref.load_state_dict(sd)
    return np.asarray(ref(x))


def test_chain_becomes_one_scan_and_matches_unrolled():
    m = Stack(6)
    sd = _load(m)
    g = Graph("stack", forward=m, input_types=_types())
    chains = find_chains(g)
    assert len(chains) == 1 and len(chains[0].nodes) == 6 and chains[0].carry == {0: 0}
    model = InferenceSession().load(g, weights_registry=m.state_dict())
    x = RNG.standard_normal((2, 3, D)).astype(np.float32)
    out = model.execute(x)[0].to_numpy()
    assert np.abs(out - _reference(sd, x, 6)).max() < 1e-5
    sub = g._subgraphs["block"]
    assert sub._trace_count == 1  # the scan body: traced once for six layers
    hlo = model._run.lower(model._state, x).compile().as_text()
    assert "while" in hlo
    # placed once at load: one [6, ...] value per placeholder weight (the CPU policy keeps the float
    # matrices as one buffer per layer, the norm's vector stacked)
    state = model._state["stacked"][0]
    assert {k: v.shape for k, v in state.items()} == {
        "up.weight": (6, 16, D), "up.bias": (6, 16), "down.weight": (6, D, 16), "down.bias": (6, D), "norm.weight": (6, D),
    } if "up.bias" in state else {"up.weight": (6, 16, D), "down.weight": (6, D, 16), "norm.weight": (6, D)}
    assert isinstance(state["up.weight"], LayerWeights) and isinstance(state["norm.weight"], jax.Array)
    assert model._state["weights"] == {}


def test_compiled_program_does_not_grow_with_depth():
    """Stacked layer weights: the compiled program is one layer's, whatever the depth."""
    sizes = []
    x = RNG.standard_normal((1, 2, D)).astype(np.float32)
    for n in (2, 16):
        m = Stack(n)
        _load(m)
        program = Program(Graph("s", forward=m, input_types=_types()), layer_weights="stacked")
        state = program.prepare(m.state_dict())
        sizes.append(len(jax.jit(program.apply).lower(state, x).compile().as_text()))
    assert sizes[1] < 1.1 * sizes[0]


def test_per_layer_weights_match_stacked_and_grow_by_one_matmul_per_layer():
    """Per-layer float matrices (the CPU policy's): the same numbers as stacked; the program gains
    one switch branch (a matmul) per layer and matmul, not a copy of the layer, and no copy of a
    weight slice: XLA:CPU's dynamic-slice of the stack is gone."""
    x = RNG.standard_normal((1, 2, D)).astype(np.float32)
    texts = {}
    for n in (2, 16):
        m = Stack(n)
        sd = _load(m)
        g = Graph("s", forward=m, input_types=_types())
        outs = {}
        for mode in ("stacked", "per_layer"):
            program = Program(g, layer_weights=mode)
            state = program.prepare(m.state_dict())
            compiled = jax.jit(program.apply).lower(state, x).compile()
            texts[(n, mode)] = compiled.as_text()
            outs[mode] = np.asarray(compiled(state, x)[0])
            if mode == "per_layer":
                assert isinstance(state["stacked"][0]["up.weight"], LayerWeights)
                assert len(state["stacked"][0]["up.weight"].layers) == n
                # unstack maps the state (or its gradients) back to registry names
                key = f"layers.{n - 1}.up.weight"
                assert np.array_equal(np.asarray(program.unstack(state)[key]), sd[key])
        np.testing.assert_allclose(outs["per_layer"], outs["stacked"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(outs["per_layer"], _reference(sd, x, n), rtol=1e-5, atol=1e-5)
    def weight_slices(text):  # dynamic slices with a weight matrix's shape ([16, 8] up, [8, 16] down)
        return re.findall(r"f32\[(?:16,8|8,16)\]\{[0-9,]*\} (?:dynamic-slice|fusion)\([^)]*\).*dynamic.slice", text)

    assert weight_slices(texts[(16, "stacked")])
    assert not weight_slices(texts[(16, "per_layer")])
    assert texts[(16, "per_layer")].count("conditional(") >= 2
    grown = len(texts[(16, "per_layer")]) - len(texts[(2, "per_layer")])
    assert grown < 14 * 2 * 0.25 * len(texts[(2, "stacked")])  # 14 more layers x 2 matmuls, each far less than a layer


def test_per_layer_refused_name():
    m = Stack(2)
    _load(m)
    with pytest.raises(ValueError, match="layer_weights must be one of"):
        Program(Graph("s", forward=m, input_types=_types()), layer_weights="unrolled")


def test_scan_switch_off_and_fallbacks_stay_correct():
    x = RNG.standard_normal((2, 3, D)).astype(np.float32)
    m = Stack(4)
    sd = _load(m)
    g = Graph("s", forward=m, input_types=_types())
    off = InferenceSession().load(g, weights_registry=m.state_dict(), scan=False)
    assert off._program.chains == []
    np.testing.assert_allclose(off.execute(x)[0].to_numpy(), _reference(sd, x, 4), atol=1e-5)

    # an intermediate output used elsewhere: not a clean chain
    tap = Stack(4, "tap")
    tap.load_state_dict(sd)
    g = Graph("tap", forward=tap, input_types=_types())
    chains = find_chains(g)
    assert all(len(c.nodes) < 4 for c in chains)
    ref = Stack(2, "unrolled")
    ref.load_state_dict({k: v for k, v in sd.items() if k.split(".")[1] in "01"})
    h1 = np.asarray(ref(x))
    out = InferenceSession().load(g, weights_registry=tap.state_dict()).execute(x)[0].to_numpy()
    np.testing.assert_allclose(out, _reference(sd, x, 4) + h1, atol=1e-5)

    # the same weights for every layer (a weight shared across layers): plain calls
    same = Stack(3, "same_prefix")
    same.load_state_dict({k: sd.get(k, np.zeros_like(v)) for k, v in same.state_dict().items()})
    g = Graph("same", forward=same, input_types=_types())
    assert find_chains(g) == []
    tied = {k: sd[k.replace(k.split(".")[1], "0", 1)] for k in Stack(3).state_dict()}
    out = InferenceSession().load(g, weights_registry=same.state_dict()).execute(x)[0].to_numpy()
    np.testing.assert_allclose(out, _reference(tied, x, 3), atol=1e-5)


def test_layers_with_different_shapes_fall_back():
    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.LayerList([nn.Linear(4, 4, DType.float32), nn.Linear(4, 4, DType.float32), nn.Linear(4, 6, DType.float32)])

        def __call__(self, x):
            sub = self.a[0].build_subgraph("lin", [x.type], weight_prefix="a.0.")
            h = ops.call(sub, x, prefix="a.0.")[0]
            h = ops.call(sub, h, prefix="a.1.")[0]
            sub2 = self.a[2].build_subgraph("lin6", [h.type], weight_prefix="a.2.")
            return ops.call(sub2, h, prefix="a.2.")[0]

    w = Wide()
    sd = _load(w)
    g = Graph("w", forward=w, input_types=[TensorType(DType.float32, [2, 4], DeviceRef.CPU())])
    chains = find_chains(g)
    assert len(chains) == 1 and len(chains[0].nodes) == 2
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    out = InferenceSession().load(g, weights_registry=w.state_dict()).execute(x)[0].to_numpy()
    np.testing.assert_allclose(out, x @ sd["a.0.weight"].T @ sd["a.1.weight"].T @ sd["a.2.weight"].T, rtol=1e-4, atol=1e-5)


def test_program_grad_reaches_every_layer_and_remat_agrees():
    m = Stack(5)
    sd = _load(m)
    g = Graph("s", forward=m, input_types=_types())
    x = RNG.standard_normal((2, 3, D)).astype(np.float32)
    grads = {}
    for remat in (False, True):
        prog = Program(g, remat=remat)
        state = prog.prepare(m.state_dict())
        gr = jax.jit(jax.grad(lambda s: jnp.sum(prog.apply(s, x)[0] ** 2)))(state)
        grads[remat] = prog.unstack(gr)
    ref = Stack(5, "unrolled")
    ref.load_state_dict(sd)
    expected = jax.grad(lambda s: jnp.sum(nn.functional_call(ref, s, x) ** 2))(nn.state(ref))
    assert set(grads[False]) == set(expected)
    for k in expected:
        np.testing.assert_allclose(np.asarray(grads[False][k]), np.asarray(expected[k]), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(np.asarray(grads[True][k]), np.asarray(grads[False][k]), atol=1e-5, rtol=1e-5)


def test_functional_and_eager_modes_trace_the_subgraph_once():
    m = Stack(4)
    sd = _load(m)
    x = RNG.standard_normal((2, 3, D)).astype(np.float32)
    expected = _reference(sd, x, 4)
    np.testing.assert_allclose(np.asarray(m(x)), expected, atol=1e-5)
    out = jax.jit(lambda s, x: nn.functional_call(m, s, x))(nn.state(m), x)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)
    sub = m.layers[0].build_subgraph("block", [TensorType(DType.float32, [2, 3, D], DeviceRef.CPU())], weight_prefix="layers.0.")
    # eager calls run the layers themselves (so hooks see each one); the four calls under the
    # outer jit trace the subgraph once
    assert sub._trace_count == 1
    grads = jax.grad(lambda s: jnp.sum(nn.functional_call(m, s, x)))(nn.state(m))
    assert all(float(jnp.abs(grads[f"layers.{i}.up.weight"]).max()) > 0 for i in range(4))


def test_a_trace_that_raises_leaves_no_subgraph_behind(monkeypatch):
    """A layer whose trace raises (a bad input, a device mismatch) leaves nothing cached: the next
    call traces again and runs, rather than finding a subgraph without output (seen on a GPU host,
    where one test's device error broke every later test of the module)."""
    m = Stack(3)
    sd = _load(m)
    x = RNG.standard_normal((2, 3, D)).astype(np.float32)
    calls = {"n": 0}
    real = Block.__call__

    def fails_once(self, h):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("the first trace fails")
        return real(self, h)

    monkeypatch.setattr(Block, "__call__", fails_once)
    run = jax.jit(lambda s, x: nn.functional_call(m, s, x))
    with pytest.raises(RuntimeError, match="the first trace fails"):
        run(nn.state(m), x)
    out = jax.jit(lambda s, x: nn.functional_call(m, s, x))(nn.state(m), x)
    np.testing.assert_allclose(np.asarray(out), _reference(sd, x, 3), atol=1e-5)


def test_call_argument_errors():
    m = Stack(2)
    _load(m)
    t = TensorType(DType.float32, [2, D], DeviceRef.CPU())
    with Graph("g", input_types=[t, TensorType(DType.int32, [2, D], DeviceRef.CPU()), TensorType(DType.float32, [2, 3, D], DeviceRef.CPU())]) as g:
        sub = m.layers[0].build_subgraph("block", inputs=[t], weight_prefix="layers.0.")
        with pytest.raises(ValueError, match="Expected 1 args to call to block, got 2"):
            ops.call(sub, g.inputs[0], g.inputs[0], prefix="layers.1.")
        with pytest.raises(ValueError, match=r"Argument 0 to call to block: expected dtype DType.float32, got DType.int32"):
            ops.call(sub, g.inputs[1], prefix="layers.1.")
        with pytest.raises(ValueError, match="Argument 0 to call to block: expected rank 2"):
            ops.call(sub, g.inputs[2], prefix="layers.1.")
        g.output(ops.call(sub, g.inputs[0], prefix="layers.9.")[0])
    with pytest.raises(ValueError, match=r"Weight 'layers.9.norm.weight' is not in the weights registry. Did you mean 'layers\.[01]\.norm\.weight'\?"):
        InferenceSession().load(g, weights_registry=m.state_dict())
    with Graph("other", input_types=[t]) as other:
        with pytest.raises(ValueError, match="Subgraph 'block' belongs to 'g', not to graph 'other'"):
            ops.call(sub, other.inputs[0], prefix="layers.0.")

    class Bad(Stack):
        def __call__(self, x):
            sub = self.layers[0].build_subgraph("block", [x.type], weight_prefix="layers.0.")
            return ops.call(sub, x, prefix="layers.7.")[0]

    bad = Bad(2)
    bad.load_state_dict(m.state_dict())
    with pytest.raises(KeyError, match=r"no weight 'layers.7.norm.weight'.*Did you mean"):
        bad(np.ones((2, D), np.float32))


def test_build_subgraph_accepts_both_spellings():
    m = Stack(2)
    _load(m)
    t = TensorType(DType.float32, [1, D], DeviceRef.CPU())
    with Graph("g", input_types=[t]) as g:
        a = m.layers[0].build_subgraph("a", [t], "layers.0.")
        b = m.layers[0].build_subgraph("b", inputs=[g.inputs[0]], weight_prefix="layers.0.")
        g.output(ops.call(a, g.inputs[0], prefix="layers.0.")[0] - ops.call(b, g.inputs[0], prefix="layers.0.")[0])
        with pytest.raises(ValueError, match="exactly once"):
            m.layers[0].build_subgraph("c", [t], inputs=[t])
        with pytest.raises(ValueError, match="Subgraph 'a' already exists"):
            m.layers[0].build_subgraph("a", [t], "layers.0.")
    out = InferenceSession().load(g, weights_registry=m.state_dict()).execute(np.ones((1, D), np.float32))[0]
    assert np.all(out.to_numpy() == 0)


def test_enable_compilation_cache(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    try:
        folder = enable_compilation_cache(str(tmp_path / "cache"))
        assert jax.config.jax_compilation_cache_dir == folder
        m = Stack(2)
        _load(m)
        model = InferenceSession().load(Graph("c", forward=m, input_types=_types()), weights_registry=m.state_dict())
        model.execute(np.ones((1, 2, D), np.float32))
        assert any((tmp_path / "cache").iterdir())
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
