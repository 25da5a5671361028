"""Layer library pieces of issue 21: the ``nn.layer`` package, ``Identity``/``Sequential``,
``nn.hooks.PrintHook`` and ``nn.sampling``, against MAX 26.7's reference (``layerlib`` area)."""

from __future__ import annotations

import gc
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from max_reference import load

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, ops
from maxjax.nn.hooks import PrintHook, format_tensor
from maxjax.nn.sampling import (
    LogitPenalties,
    MinPSampler,
    RejectionSampler,
    compute_synthetic_acceptance_base_rate,
    greedy_acceptance_sampler,
)

REF = load("layerlib")
CPU = DeviceRef.CPU()


@pytest.fixture(autouse=True)
def _collect_earlier_hooks():
    """A PrintHook prints its summary when it is collected (MAX's ``__del__``): collect the hooks
    of earlier tests before this test captures its output."""
    gc.collect()


def _graph(fn, arrays, dims=None):
    """Runs ``fn(*graph_inputs)`` as a maxjax graph on ``arrays`` (symbolic dims where given)."""
    types = [TensorType(DType.of(a.dtype), (dims[i] if dims and dims[i] else a.shape), CPU) for i, a in enumerate(arrays)]
    with Graph("t", input_types=types) as g:
        out = fn(*(v.tensor for v in g.inputs))
        g.output(*(out if isinstance(out, (list, tuple)) else [out]))
    return [np.asarray(r.to_numpy()) for r in InferenceSession().load(g).execute(*arrays)]


def _three_modes(fn, arrays, dims=None):
    """``fn``'s outputs in graph, functional (jax.jit) and eager mode, as lists of NumPy arrays."""
    as_list = lambda o: [np.asarray(x) for x in (o if isinstance(o, (list, tuple)) else [o])]
    return {
        "graph": _graph(fn, arrays, dims),
        "functional": as_list(jax.jit(fn)(*arrays)),
        "eager": as_list(fn(*[jnp.asarray(a) for a in arrays])),
    }


# -- nn.layer package, Identity, Sequential -------------------------------------------------------
def test_layer_package_layout_matches_max():
    import maxjax.nn.layer as layer
    from maxjax.nn.layer.layer import Module, Shardable, add_layer_hook, clear_hooks
    from maxjax.nn.layer.layer_list import LayerList
    from maxjax.nn.layer.missing_layer import MissingLayer

    assert sorted(layer.__all__) == ["Layer", "LayerList", "MissingLayer", "Module", "Shardable", "add_layer_hook", "clear_hooks"]
    assert (layer.Module, layer.LayerList, layer.MissingLayer) == (Module, LayerList, MissingLayer)
    assert layer.add_layer_hook is add_layer_hook and layer.clear_hooks is clear_hooks
    assert isinstance(nn.Linear(2, 3, DType.float32, CPU), Shardable) and not isinstance(nn.Identity(), Shardable)
    assert list(inspect.signature(LayerList).parameters) == ["layers"]
    assert list(inspect.signature(MissingLayer).parameters) == ["layer_id"]
    from maxjax.nn.identity import Identity
    from maxjax.nn.sequential import Sequential

    assert nn.Identity is Identity and nn.Sequential is Sequential and layer.Sequential is Sequential
    assert issubclass(Sequential, LayerList)


def test_missing_layer_holds_a_place():
    lst = nn.LayerList([nn.MissingLayer(0), nn.Linear(2, 2, DType.float32, CPU)])
    assert list(lst.raw_state_dict()) == ["1.weight"]  # the built layer keeps its checkpoint name
    with pytest.raises(RuntimeError, match="Decoder layer 0 belongs to another pipeline stage."):
        lst[0](jnp.ones((1, 2)))


def test_layer_list_setitem_delitem_reregister():
    a, b, c = (nn.Linear(2, 2, DType.float32, CPU) for _ in range(3))
    lst = nn.LayerList([a, b])
    lst[1] = c
    assert lst.sublayers["1"] is c and lst[1] is c
    del lst[0]
    assert list(lst.sublayers) == ["0"] and lst[0] is c and len(lst) == 1 and str(lst) == str([c])


def test_identity_and_sequential_in_three_modes():
    rng = np.random.default_rng(0)
    seq = nn.Sequential([nn.Linear(3, 4, DType.float32, CPU, has_bias=True), nn.Identity(), nn.Linear(4, 2, DType.float32, CPU)])
    sd = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in seq.state_dict().items()}
    assert sorted(sd) == ["0.bias", "0.weight", "2.weight"]
    seq.load_state_dict(sd)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    want = (x @ sd["0.weight"].T + sd["0.bias"]) @ sd["2.weight"].T
    g = Graph("seq", forward=seq, input_types=[TensorType(DType.float32, ["n", 3], CPU)])
    graph_out = InferenceSession().load(g, weights_registry=seq.state_dict()).execute(x)[0].to_numpy()
    functional = jax.jit(lambda s, x: nn.functional_call(seq, s, x))(nn.state(seq), x)
    eager = seq(jnp.asarray(x))
    for out in (graph_out, functional, eager):
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    ident = nn.Identity()
    assert ident(jnp.arange(3)).tolist() == [0, 1, 2]
    with Graph("id", input_types=[TensorType(DType.float32, [2], CPU)]) as g:
        v = g.inputs[0].tensor
        assert ident(v) is v


# -- PrintHook ----------------------------------------------------------------------------------
class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2, DType.float32, CPU, has_bias=True)
        self.norm = nn.RMSNorm(2, DType.float32)

    def __call__(self, x):
        return self.norm(self.lin(x)), x


def _block():
    m = _Block()
    m.load_state_dict({k: REF[f"print_w_{k}"] for k in ("lin.weight", "lin.bias", "norm.weight")})
    return m


def test_print_hook_graph_mode_prints_what_max_prints(capfd):
    m = _block()
    hook = PrintHook()
    hook.name_layers(m)
    with Graph("hooked", input_types=[TensorType(DType.float32, [2, 3], CPU)]) as g:
        h, _ = m(g.inputs[0].tensor)
        g.output(h, m.lin(g.inputs[0].tensor))
    hook.remove()
    assert "\n".join(hook._recorded_prints[0]) == str(REF["print_hook_names"])
    capfd.readouterr()
    InferenceSession().load(g, weights_registry=m.state_dict()).execute(REF["print_x"])
    assert capfd.readouterr().out == str(REF["print_hook_text"])  # printed when the graph runs, MAX's text


def test_print_hook_eager_and_functional_modes(capfd):
    m = _block()
    hook = PrintHook(filter=["model.lin"])
    hook.name_layers(m)
    capfd.readouterr()
    m(jnp.asarray(REF["print_x"]))  # eager: printed at once
    eager = capfd.readouterr().out
    lines = str(REF["print_hook_text"]).split("model.norm-input_0")[0]  # MAX's text of model.lin's input and output
    assert eager == lines
    f = jax.jit(lambda s, x: nn.functional_call(m, s, x))
    f(nn.state(m), REF["print_x"])
    first = capfd.readouterr().out
    f(nn.state(m), REF["print_x"])  # printed on every call of the compiled function
    assert capfd.readouterr().out == first == lines.replace("model.lin-", "model.lin(2)-")
    hook.remove()
    m(jnp.asarray(REF["print_x"]))
    assert capfd.readouterr().out == ""  # removed: no more prints


def test_format_tensor_matches_max_ops_print():
    names = [str(n) for n in REF["fmt_names"]]
    ours = "".join(format_tensor(n, REF[f"fmt_in_{n}"]) + "\n" for n in names)
    assert ours == str(REF["fmt_text"])


def test_print_hook_names_counts_and_export(tmp_path, capsys):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.LayerList([nn.Linear(2, 2, DType.float32, CPU) for _ in range(2)])
            self.seq = nn.Sequential([nn.Identity(), nn.Linear(2, 2, DType.float32, CPU)])
            self.pair = (nn.Identity(),)
            self.shared = self.layers[0]

        def __call__(self, x):
            return self.seq(self.layers(x))

    m = M()
    m.load_state_dict({k: np.eye(2, dtype=np.float32) for k in m.state_dict()})
    hook = PrintHook(export_path=str(tmp_path), filter=["model.seq"])
    hook.name_layers(m)
    names = sorted(info.layer_name for _, info in hook._known_layers.values())
    # MAX 26.7's names for the same model (breadth first; a layer reached twice keeps the deeper name)
    assert names == ["model", "model.layers", "model.layers.layers.0", "model.layers.layers.1", "model.pair.0", "model.seq",
                     "model.seq.layers.0", "model.seq.layers.1"]
    m(jnp.ones((1, 2), jnp.float32))
    m(jnp.ones((1, 2), jnp.float32))
    assert (tmp_path / "0" / "tensor_names.txt").read_text() == "model.seq-input_0\nmodel.seq-output\nmodel.seq(2)-input_0\nmodel.seq(2)-output\n"
    hook.step()
    assert (tmp_path / "1").is_dir()
    hook.remove()
    assert not (tmp_path / "1").exists()  # the empty step directory is removed, as in MAX
    capsys.readouterr()
    hook.summarize()
    assert capsys.readouterr().out == f"Saved 4 tensors for step 0.\nTensors exported to {tmp_path}\n"
    with pytest.raises(TypeError, match="expects a maxjax.nn Layer"):
        hook.name_layers(object())
    del hook
    gc.collect()


# -- sampling -----------------------------------------------------------------------------------
def test_greedy_acceptance_sampler_three_modes():
    d, t, pk = REF["greedy_draft"], REF["greedy_target"], REF["greedy_packed"]
    d32 = d.astype(np.int32)
    for mode, out in _three_modes(greedy_acceptance_sampler, [d32, t]).items():
        for got, key in zip(out, ("greedy_first", "greedy_recovered", "greedy_bonus")):
            np.testing.assert_array_equal(got, REF[key], err_msg=f"{mode} {key}")
    for mode, out in _three_modes(greedy_acceptance_sampler, [d32, t, pk]).items():
        for got, key in zip(out, ("greedy_mask_first", "greedy_mask_recovered", "greedy_mask_bonus")):
            np.testing.assert_array_equal(got, REF[key], err_msg=f"{mode} {key}")
    # symbolic batch in graph mode
    out = _graph(greedy_acceptance_sampler, [d32, t], dims=[["batch", 4], ["rows", 40]])
    np.testing.assert_array_equal(out[0], REF["greedy_first"])


def test_rejection_sampler_top_k_1_three_modes():
    sampler = RejectionSampler(CPU)
    args = [REF["greedy_draft"].astype(np.int32), REF["rej_draft_logits"], REF["greedy_target"],
            REF["rej_offsets"].astype(np.int32), REF["rej_seed"].astype(np.uint32)]
    for mode, (first, token) in _three_modes(lambda *a: sampler(*a), args).items():
        np.testing.assert_array_equal(first, REF["rej_first"], err_msg=mode)
        np.testing.assert_array_equal(token, REF["rej_token"], err_msg=mode)


def test_rejection_sampler_top_k_draws_are_keyed_and_in_the_top_k():
    logits = np.random.default_rng(1).standard_normal((4, 50)).astype(np.float32)
    draft = np.zeros((4, 1), np.int32)
    dl = np.full((4, 1), 100.0, np.float32)  # every draft rejected at 0
    off = np.arange(5, dtype=np.int32)
    s = RejectionSampler(CPU, top_k=5, temperature=0.7)
    a = np.asarray(s(draft, dl, logits, off, np.array([3], np.uint32))[1])[:, 0]
    b = np.asarray(s(draft, dl, logits, off, np.array([3], np.uint32))[1])[:, 0]
    top5 = np.argsort(-logits, axis=-1)[:, :5]
    assert (a == b).all() and all(a[i] in top5[i] for i in range(4))
    draws = {tuple(np.asarray(s(draft, dl, logits, off, np.array([k], np.uint32))[1])[:, 0]) for k in range(20)}
    assert len(draws) > 1  # the seed keys the draw


def test_min_p_sampler():
    logits = REF["minp_logits"]
    sampler = MinPSampler(DType.int32, ["batch", 1])
    for mode, (tok,) in _three_modes(lambda x: sampler(x, 1.0), [logits]).items():
        np.testing.assert_array_equal(tok[:, 0], logits.argmax(-1), err_msg=mode)  # min_p = 1: the most likely token
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    for seed in range(10):
        tok = np.asarray(sampler(jnp.asarray(logits), 0.5, seed=seed))[:, 0]
        assert all(probs[i, tok[i]] >= 0.5 * probs[i].max() for i in range(3))
    with pytest.raises(ValueError, match=r"expected min_p to be in \[0, 1\], got 1.5"):
        sampler(jnp.asarray(logits), 1.5)


def test_logit_penalties_three_modes():
    args = [REF["pen_logits"], REF["pen_data"], REF["pen_offsets"], REF["pen_freq"], REF["pen_pres"]]
    for mode, (out,) in _three_modes(lambda l, *p: LogitPenalties(*p).apply(l), args).items():
        np.testing.assert_allclose(out, REF["pen_out"], rtol=1e-6, atol=1e-6, err_msg=mode)
    types = LogitPenalties.input_types(CPU)
    assert [t.dtype for t in types] == [DType.int32, DType.uint32, DType.float32, DType.float32]


def test_compute_synthetic_acceptance_base_rate():
    got = [compute_synthetic_acceptance_base_rate(p, int(n)) for p, n in REF["base_rate_in"]]
    np.testing.assert_array_equal(got, REF["base_rate"])


def test_rejection_sampler_with_residuals_given_uniforms_three_modes():
    from maxjax.nn.sampling import RejectionSamplerWithResiduals

    s = RejectionSamplerWithResiduals(CPU)
    args = [REF["res_draft"].astype(np.int32), REF["res_draft_logit"], REF["res_target"], REF["res_offsets"].astype(np.int32),
            REF["res_all_draft"], REF["res_seed"].astype(np.uint32), REF["res_rejection_rand"], REF["res_residual_rand"]]
    # where draft and target distributions are equal, max(p - q, tiny) is rounding noise and its
    # argmax is arbitrary (in MAX too): compare the recovered tokens where p - q is not
    sm = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
    p = sm(REF["res_target"].reshape(3, 5, -1)[:, :4].astype(np.float64))
    q = sm(REF["res_all_draft"].transpose(1, 0, 2).astype(np.float64))
    informative = (p - q).max(-1) > 1e-3  # [batch, steps]
    assert informative.sum() >= 5
    for mode, (first, recovered, bonus) in _three_modes(lambda *a: s(*a[:6], rejection_rand=a[6], residual_rand=a[7]), args).items():
        np.testing.assert_array_equal(first, REF["res_first"], err_msg=mode)  # the accept mask from the given uniforms
        np.testing.assert_array_equal(recovered[informative], REF["res_recovered"][informative], err_msg=mode)
        np.testing.assert_array_equal(bonus, REF["res_bonus"], err_msg=mode)
    first, recovered, bonus = s(*[jnp.asarray(a) for a in args[:6]])  # uniforms drawn, keyed by the seed
    again = s(*[jnp.asarray(a) for a in args[:6]])
    assert all((np.asarray(x) == np.asarray(y)).all() for x, y in zip((first, recovered, bonus), again))
    np.testing.assert_array_equal(bonus, REF["res_bonus"])  # top_k=1: the argmax either way


def test_synthetic_acceptance_at_rates_0_and_1_and_acceptance_sampler():
    from maxjax.nn.sampling import AcceptanceSampler, synthetic_acceptance_sampler

    d, t, seed = REF["res_draft"].astype(np.int32), REF["res_target"], REF["res_seed"].astype(np.uint32)
    for rate, tag in ((0.0, "syn0"), (1.0, "syn1")):
        fn = lambda d, t, s, rate=rate: synthetic_acceptance_sampler(d, t, rate, 4, s)
        for mode, out in _three_modes(fn, [d, t, seed]).items():
            for got, key in zip(out, ("first", "recovered", "bonus")):
                np.testing.assert_array_equal(got, REF[f"{tag}_{key}"], err_msg=f"{mode} {tag}_{key}")
    acc = AcceptanceSampler(synthetic_acceptance_rate=1.0, num_draft_steps=4)
    assert acc.acceptance_rule == "synthetic"
    for got, key in zip(acc(jnp.asarray(d), jnp.asarray(t), seed=jnp.asarray(seed)), ("first", "recovered", "bonus")):
        np.testing.assert_array_equal(got, REF[f"acc_{key}"])
    assert AcceptanceSampler().acceptance_rule == "greedy"
    with pytest.raises(NotImplementedError, match="use_stochastic=True is not supported"):
        AcceptanceSampler(use_stochastic=True)
    with pytest.raises(ValueError, match="vocab_size is required when draft_proposal='sampled'"):
        AcceptanceSampler(draft_proposal="sampled")
    with pytest.raises(NotImplementedError, match="temperature given"):
        synthetic_acceptance_sampler(d, t, 0.5, 4, seed, temperature=np.ones(3, np.float32))


def test_distributed_attention_impl_is_max_s_abstract_interface():
    with pytest.raises(TypeError, match="abstract"):
        nn.DistributedAttentionImpl()

    class PerDevice(nn.DistributedAttentionImpl):  # MAX's per-device-list calling convention
        def __init__(self):
            super().__init__()
            self.o_proj = nn.Linear(2, 2, DType.float32, CPU)

        def __call__(self, layer_idx, x, signal_buffers, kv_collections, freqs_cis, input_row_offsets):
            return [self.o_proj(xi) for xi in x]

    layer = PerDevice()
    layer.load_state_dict({"o_proj.weight": np.eye(2, dtype=np.float32) * 2})
    out = layer(0, [jnp.ones((3, 2)), jnp.full((1, 2), 3.0)], [], [], [], [])
    np.testing.assert_array_equal(np.asarray(out[1]), [[6.0, 6.0]])
    assert list(inspect.signature(nn.DistributedAttentionImpl.__call__).parameters) == [
        "self", "layer_idx", "x", "signal_buffers", "kv_collections", "freqs_cis", "input_row_offsets",
    ]
