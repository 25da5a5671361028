"""MAX 26.7's Mixture of Experts in maxjax (issue 21): ``maxjax.nn.moe`` (``MoEGate``, ``MoE``,
``GatedActivation``, ``forward_moe_sharded_layers``).

Numbers: ``MoEGate`` against MAX's own outputs (``scripts/max_reference/moe.py``) in graph,
functional (jit) and eager mode. MAX 26.7 cannot run ``MoE`` on a CPU (its ``moe_create_indices``,
``grouped_matmul_ragged``, ``fused_silu`` and ``moe_finalize`` kernels have no CPU implementation;
the graph fails to compile), so ``MoE`` is checked against :func:`np_moe`, NumPy written from MAX's
source (``max/nn/moe/moe.py``, the ``GatedActivation`` docstring of ``max/nn/activation.py``),
and its weight names, shapes and dtypes against MAX's.
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
from maxjax.nn import moe as nm
from maxjax.nn.moe import GatedActivation, MoE, MoEGate

REF = load("moe")
CPU = DeviceRef.CPU()
F32, BF16 = DType.float32, DType.bfloat16
HID, E, K, FF, SHARED, T = 8, 6, 2, 5, 4, 7
RNG = np.random.default_rng(5)


def f32_gate(**kw):
    """MAX's ``gate_cls`` hook: a float32 gate (``MoE`` builds its gate in bfloat16)."""
    return MoEGate(**{**kw, "dtype": F32})


# -- NumPy reference, from MAX's source --------------------------------------------------------
def _silu(v):
    return v / (1.0 + np.exp(-v))


def _gelu_tanh(v):
    return 0.5 * v * (1.0 + np.tanh(0.7978845608028654 * (v + 0.044715 * v**3)))


def _bf16(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def np_moe(x, w, *, act="silu", alpha=0.0, limit=0.0, interleaved=False, fn=None, shared=False, norm_eps=None, bf16=False):
    """MAX's ``MoE.__call__`` for one device in NumPy (float64 arithmetic; with ``bf16`` every stage
    rounded to bfloat16 where MAX's kernels write bfloat16)."""
    r = _bf16 if bf16 else (lambda a: a)
    x = np.asarray(x, np.float64)
    scores = x @ np.asarray(w["gate.gate_score.weight"], np.float64).T  # [T, E]
    scores = r(scores)
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :K]  # top_k, largest first
    weights = np.take_along_axis(scores, idx, axis=1)
    if norm_eps is not None:  # pre_expert_norm: RMSNorm (weight "pre_expert_norm.weight")
        x = r(x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + norm_eps) * np.asarray(w["pre_expert_norm.weight"], np.float64))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(K):
            e = idx[t, j]
            gate_up = np.concatenate([w[f"experts.{e}.gate_proj.weight"], w[f"experts.{e}.up_proj.weight"]]).astype(np.float64)
            h = r(gate_up @ x[t])  # [2F]: rows [gate | up]
            g, u = (h[0::2], h[1::2]) if interleaved else (h[:FF], h[FF:])
            if fn is not None:
                a = fn(g, u)
            else:
                if limit > 0:
                    g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
                a = {"silu": lambda: _silu(g) * u, "gelu_tanh": lambda: _gelu_tanh(g) * u,
                     "swigluoai": lambda: g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)}[act]()  # fmt: skip
            y = r(np.asarray(w[f"experts.{e}.down_proj.weight"], np.float64) @ r(a))  # [H]
            out[t] += weights[t, j] * y
    out = r(out)
    if shared:
        sg = x @ np.asarray(w["shared_experts.gate_proj.weight"], np.float64).T
        su = x @ np.asarray(w["shared_experts.up_proj.weight"], np.float64).T
        out = r(out + r(r(r(_silu(r(sg))) * r(su)) @ np.asarray(w["shared_experts.down_proj.weight"], np.float64).T))
    return out


# -- configurations -----------------------------------------------------------------------------
CONFIGS = {  # name: (constructor kwargs, np_moe kwargs)
    "silu_shared": (dict(has_shared_experts=True, shared_experts_dim=SHARED), dict(shared=True)),
    "silu_limit": (dict(activation=GatedActivation(limit=0.7)), dict(limit=0.7)),
    "swigluoai": (dict(activation=GatedActivation("swigluoai", alpha=1.702, limit=0.9)), dict(act="swigluoai", alpha=1.702, limit=0.9)),
    "gelu_tanh_interleaved": (dict(activation=GatedActivation("gelu_tanh"), interleaved_gate_up=True), dict(act="gelu_tanh", interleaved=True)),
    "concat_fn_relu_limit": (
        dict(activation=GatedActivation(gated_activation_fn=nm.make_concatenated_gated_activation_fn(ops.relu, limit=0.5))),
        dict(fn=lambda g, u: np.minimum(np.maximum(g, 0.0), 0.5) * np.clip(u, -0.5, 0.5)),
    ),
    "interleaved_fn_silu": (
        dict(activation=GatedActivation(gated_activation_fn=nm.make_interleaved_gated_activation_fn(ops.silu))),
        dict(interleaved=True),  # fn reads [g0, u0, ...] from the concatenated rows, as MAX's would
    ),
    "pre_norm": (dict(pre_expert_norm_cls=lambda: nn.RMSNorm(HID, F32, eps=1e-5)), dict(norm_eps=1e-5)),
}


def _moe(name, dtype=F32, **extra):
    kwargs, _ = CONFIGS[name]
    gate = {} if dtype == BF16 else {"gate_cls": f32_gate}
    return MoE([CPU], HID, E, K, FF, dtype=dtype, **gate, **kwargs, **extra)


def _weights(m, dtype=np.float32):
    rng = np.random.default_rng(sum(map(ord, type(m).__name__)))
    out = {}
    for k, w in sorted(m.raw_state_dict().items()):
        v = rng.standard_normal(tuple(int(d) for d in w.shape)) * 0.5
        out[k] = (1.0 + 0.1 * v if k.endswith("norm.weight") else v).astype(w.dtype.to_numpy() if dtype is None else dtype)
    return out


X = RNG.standard_normal((T, HID)).astype(np.float32)


def _three_modes(m, x, in_dtype=F32):
    g = Graph("moe", forward=m, input_types=[TensorType(in_dtype, list(x.shape), CPU)])
    graph_out = InferenceSession().load(g, weights_registry=m.state_dict()).execute(x)[0].to_numpy()
    functional = jax.jit(lambda s, v: nn.functional_call(m, s, v))(nn.state(m), jnp.asarray(x))
    eager = m(jnp.asarray(x))
    return [np.asarray(graph_out, np.float32), np.asarray(functional, np.float32), np.asarray(eager, np.float32)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_moe_three_modes_match_maxs_routing_and_experts(name):
    m = _moe(name)
    w = _weights(m)
    m.load_state_dict(w)
    expected = np_moe(X, w, **CONFIGS[name][1])
    for out in _three_modes(m, X):
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_moe_in_bfloat16_with_maxs_bfloat16_gate():
    """MAX's defaults: ``dtype=bfloat16`` experts and the bfloat16 gate, on bfloat16 activations;
    the reference rounds to bfloat16 where MAX's kernels write bfloat16 (float32 accumulation)."""
    m = _moe("silu_shared", dtype=BF16)
    w = _weights(m, dtype=None)
    m.load_state_dict(w)
    assert m.gate.gate_score.weight.dtype == BF16
    x = X.astype(ml_dtypes.bfloat16)
    expected = np_moe(x.astype(np.float32), {k: v.astype(np.float32) for k, v in w.items()}, shared=True, bf16=True)
    eager = np.asarray(m(jnp.asarray(x)), np.float32)
    functional = np.asarray(jax.jit(lambda s, v: nn.functional_call(m, s, v))(nn.state(m), jnp.asarray(x)), np.float32)
    for out in (eager, functional):  # two bfloat16 ulps (2 ** -7 relative) of the largest output
        np.testing.assert_allclose(out, expected, rtol=2**-7, atol=2**-7 * np.abs(expected).max())


def test_state_dict_keys_shapes_and_dtypes_are_maxs():
    m = MoE([CPU], HID, E, K, 5, has_shared_experts=True, shared_experts_dim=4, dtype=F32)
    sd = m.raw_state_dict()
    keys = sorted(sd)
    assert keys == list(REF["moe.keys"])
    assert [str([int(d) for d in sd[k].shape]) for k in keys] == list(REF["moe.shapes"])
    assert [str(sd[k].dtype) for k in keys] == list(REF["moe.dtypes"])  # the gate is bfloat16, as in MAX


def test_moe_gate_three_modes_match_max():
    gate = MoEGate([CPU], HID, E, K, F32)
    gate.load_state_dict({"gate_score.weight": REF["w.gate.gate_score.weight"]})
    x = REF["x"]
    g = Graph("gate", forward=gate, input_types=[TensorType(F32, list(x.shape), CPU)])
    graph_out = [r.to_numpy() for r in InferenceSession().load(g, weights_registry=gate.state_dict()).execute(x)]
    functional = jax.jit(lambda s, v: nn.functional_call(gate, s, v))(nn.state(gate), x)
    eager = gate(jnp.asarray(x))
    for idx, scores in (graph_out, functional, eager):
        np.testing.assert_array_equal(np.asarray(idx), REF["gate.idx"])
        np.testing.assert_allclose(np.asarray(scores), REF["gate.scores"], rtol=1e-5, atol=1e-6)


def test_gated_activation_checks_are_maxs():
    assert GatedActivation().kernel_parameters() == {"activation": "silu", "swiglu_alpha": 0.0, "swiglu_limit": 0.0}
    for kwargs, msg in (
        (dict(fused_activation="relu"), r"fused_activation must be one of \('silu', 'swigluoai', 'gelu_tanh'\), got 'relu'"),
        (dict(fused_activation="silu", alpha=1.0), "silu takes no alpha"),
        (dict(fused_activation="gelu_tanh", limit=1.0), "gelu_tanh takes no limit"),
        (dict(limit=-1.0), "limit must be non-negative, got -1.0"),
        (dict(fused_activation="swigluoai", alpha=1.0), "swigluoai needs a non-zero alpha and limit"),
        (dict(limit=1.0, gated_activation_fn=lambda h, d: h), "a gated_activation_fn replaces the fused activation"),
    ):
        with pytest.raises(ValueError, match=msg):
            GatedActivation(**kwargs)
    with pytest.raises(ValueError, match="cannot be fused into a kernel"):
        GatedActivation(gated_activation_fn=lambda h, d: h).kernel_parameters()


def test_unsupported_arguments_are_refused_by_name():
    for kwargs, msg in (
        (dict(ep_size=2), r"MoE\(ep_size=2\): expert parallelism is not supported"),
        (dict(ep_batch_manager=object()), r"MoE\(ep_batch_manager=...\)"),
        (dict(quant_config=object()), r"MoE\(quant_config=.*\): quantized experts are not supported"),
        (dict(shared_experts_quant_config=object()), r"MoE\(shared_experts_quant_config=.*\)"),
    ):
        with pytest.raises(NotImplementedError, match=msg):
            MoE([CPU], HID, E, K, FF, dtype=F32, **kwargs)
    with pytest.raises(AssertionError, match="shared_experts_dim must be greater than 0"):
        MoE([CPU], HID, E, K, FF, dtype=F32, has_shared_experts=True)
    m = _moe("silu_limit")
    with pytest.raises(NotImplementedError, match="expert_parallel: expert parallelism is not supported"):
        m.sharding_strategy = ShardingStrategy.expert_parallel(2)
    with pytest.raises(ValueError, match="Only tensor parallel or expert parallel sharding strategies are supported for MoE"):
        m.sharding_strategy = ShardingStrategy.rowwise(2)
    with pytest.raises(ValueError, match="MoE module cannot be sharded because no sharding strategy was provided."):
        m.shard([CPU])
    with pytest.raises(ValueError, match="Only replicate sharding strategy is supported for MoEGate."):
        m.gate.sharding_strategy = ShardingStrategy.rowwise(2)
    m.load_state_dict(_weights(m))
    with pytest.raises(ValueError, match="MoE: the input's dtype is bfloat16, expected the experts' dtype float32"):
        m(jnp.asarray(X, jnp.bfloat16))
    with pytest.raises(NotImplementedError, match=r"forward_moe_sharded_layers\(eplb_counter_buffers=...\)"):
        nm.forward_moe_sharded_layers([m], [X], eplb_counter_buffers=[])
    with pytest.raises(AssertionError, match=r"Number of layers \(1\) must match number of inputs \(2\)"):
        nm.forward_moe_sharded_layers([m], [X, X])


def test_eplb_weight_sources_are_maxs():
    m = _moe("silu_limit")
    src = m.eplb_weight_sources([0, 0, 2, 1, 4, 5])
    assert src["experts.1.gate_proj.weight"] == "experts.0.gate_proj.weight"
    assert src["experts.3.down_proj.weight"] == "experts.1.down_proj.weight" and len(src) == 3 * E
    with pytest.raises(ValueError, match="EPLB placement row has 2 slots, expected 6"):
        m.eplb_weight_sources([0, 1])
    with pytest.raises(ValueError, match=r"EPLB placement maps slot 0 to logical expert 7, outside \[0, 6\)"):
        m.eplb_weight_sources([7, 0, 1, 2, 3, 4])


def test_tensor_parallel_shards_add_up_to_the_layer():
    """MAX's tensor-parallel MoE: each device computes its slice of every expert's ``moe_dim`` (and
    of the shared experts'); ``forward_moe_sharded_layers`` runs the shards and
    ``ops.allreduce.sum`` joins them, in graph and eager mode."""
    m = MoE([CPU], HID, E, K, 6, gate_cls=f32_gate, dtype=F32, has_shared_experts=True, shared_experts_dim=4)
    m.load_state_dict(_weights(m))
    expected = np.asarray(m(jnp.asarray(X)))
    devices = [DeviceRef.CPU(i) for i in range(2)]
    m.sharding_strategy = ShardingStrategy.tensor_parallel(2)
    shards = m.shard(devices)
    assert [s.moe_dim for s in shards] == [3, 3] and [int(s.gate_up_proj.shape[1]) for s in shards] == [6, 6]
    signals = nn.Signals(devices)
    with Graph("tp_moe", input_types=[TensorType(F32, ["t", HID], devices[0]), *signals.input_types()]) as g:
        h, *buffers = g.inputs
        outs = nm.forward_moe_sharded_layers(shards, [ops.transfer_to(h, d) for d in devices])
        g.output(*ops.allreduce.sum(outs, buffers))
    model = InferenceSession(devices=[d.to_device() for d in devices]).load(g, weights_registry=m.state_dict())
    for out in model.execute(X, *signals.buffers()):
        np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-5, atol=1e-5)
    eager = ops.allreduce.sum(nm.forward_moe_sharded_layers(shards, [jnp.asarray(X)] * 2), signals.buffers())
    np.testing.assert_allclose(np.asarray(eager[1]), expected, rtol=1e-5, atol=1e-5)


def test_on_a_mesh_the_experts_split_and_the_numbers_stay():
    """The SPMD path: tensor-parallel strategy, the weights placed on a mesh axis (5 hidden units over
    2 devices: 3 and 2, padded), functional mode under jit gives the single-device numbers."""
    from maxjax.engine.mesh import make_mesh

    m = _moe("silu_shared")
    m.load_state_dict(_weights(m))
    expected = np.asarray(m(jnp.asarray(X)))
    m.sharding_strategy = ShardingStrategy.tensor_parallel(2)
    m.to(make_mesh("tp=2"))
    assert m.experts[0].gate_proj.weight.sharding.spec == jax.sharding.PartitionSpec("tp", None)
    out = jax.jit(lambda s, v: nn.functional_call(m, s, v))(nn.state(m), jnp.asarray(X))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)


# -- signatures (MAX 26.7's) ----------------------------------------------------------------------
SIGNATURES = {
    "MoE": MoE, "MoEGate": MoEGate, "forward_moe_sharded_layers": nm.forward_moe_sharded_layers,
    "GatedActivation": GatedActivation, "make_concatenated_gated_activation_fn": nm.make_concatenated_gated_activation_fn,
    "make_interleaved_gated_activation_fn": nm.make_interleaved_gated_activation_fn,
}  # fmt: skip


def _names_and_defaults(sig: str) -> list[tuple[str, str | None]]:
    """``(name, default)`` of each parameter in a signature string (top-level commas only)."""
    body = sig[sig.index("(") + 1 : sig.rindex(")", 0, sig.rindex("->") if "->" in sig else len(sig))]
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch in "([{<"
        depth -= ch in ")]}>"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return [(re.match(r"[*/\w]+", p).group(0), p.split(" = ", 1)[1] if " = " in p else None) for p in parts if p and p != "self"]


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_is_maxs(name):
    expected = _names_and_defaults(str(REF[f"sig.{name}"]))
    actual = []
    for p in inspect.signature(SIGNATURES[name]).parameters.values():
        if p.default is inspect.Parameter.empty:
            default = None
        elif isinstance(p.default, type):
            default = f"<class '{p.default.__module__.replace('maxjax.', 'max.')}.{p.default.__qualname__}'>"
        elif isinstance(p.default, DType):
            default = p.default.name
        else:
            default = repr(p.default)
        actual.append((p.name, default))
    assert actual == expected
