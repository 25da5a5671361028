"""Sharding: MAX 26.7's strategies and per-device style exactly as MAX gives them, and the SPMD path
(weights laid out on a NamedSharding mesh) giving the single-device numbers.

The MAX figures are from ../shared/max-api-26.7.md ("Checked on CPU with 2 shards of a (6,4)
weight, values 0..23") and MAX's sources (max/graph/weight.py of max==26.7.0).
"""

from __future__ import annotations

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession, Program
from maxjax.engine.mesh import make_mesh
from maxjax.graph import DeviceRef, Graph, ShardingStrategy, TensorType, Weight, ops
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.weight import Segment

RNG = np.random.default_rng(11)
W = np.arange(24, dtype=np.float32).reshape(6, 4)
S = ShardingStrategy
CPU = [DeviceRef.CPU(i) for i in range(8)]


def shards_of(strategy, x=W):
    return [np.asarray(strategy(jnp.asarray(x), i)) for i in range(strategy.num_devices)]


def test_max_probe_of_every_preset_on_a_6x4_weight_over_two_devices():
    r0, r1 = shards_of(S.rowwise(2))
    np.testing.assert_array_equal(r0, W[0:3]) and np.testing.assert_array_equal(r1, W[3:6])
    c0, c1 = shards_of(S.columnwise(2))
    np.testing.assert_array_equal(c0, W[:, 0:2]) and np.testing.assert_array_equal(c1, W[:, 2:4])
    for a, b in zip(shards_of(S.columnwise(2)), shards_of(S.axiswise(1, 2))):
        np.testing.assert_array_equal(a, b)
    assert all(np.array_equal(s, W) for s in shards_of(S.replicate(2)))
    g0, g1 = shards_of(S.gate_up(2, axis=0))  # each half split on its own: shard 0 = rows 0, 1, 3, 4
    assert g0.shape == (4, 4) and g1.shape == (2, 4)
    np.testing.assert_array_equal(g0, W[[0, 1, 3, 4]])
    np.testing.assert_array_equal(g1, W[[2, 5]])
    qkv = np.arange(48, dtype=np.float32).reshape(12, 4)
    q0, q1 = shards_of(S.stacked_qkv(2, 2, 2), qkv)  # its head of Q, K and V each
    assert q0.shape == q1.shape == (6, 4)
    np.testing.assert_array_equal(q0, qkv[[0, 1, 4, 5, 8, 9]])
    for placeholder in (S.tensor_parallel(2), S.expert_parallel(2)):
        with pytest.raises(NotImplementedError, match="is a placeholder and should not be called directly"):
            placeholder(jnp.asarray(W), 0)


def test_uneven_splits_give_the_lower_shards_more_and_segments_split_as_max():
    assert [s.shape for s in shards_of(S.rowwise(4))] == [(2, 4), (2, 4), (1, 4), (1, 4)]
    x = np.arange(24, dtype=np.float32).reshape(4, 6)  # 3 heads of 2 columns over 2 devices: 2 heads, 1 head
    h0, h1 = shards_of(S.head_aware_columnwise(2, 3, 2), x)
    np.testing.assert_array_equal(h0, x[:, 0:4]) and np.testing.assert_array_equal(h1, x[:, 4:6])
    seg = S.segmented(2, 0, [Segment.head_aware(1, 2), Segment.even(4)])  # rows [0,2) by head, [2,6) evenly
    s0, s1 = shards_of(seg)
    np.testing.assert_array_equal(s0, W[[0, 1, 2, 3]]) and np.testing.assert_array_equal(s1, W[[4, 5]])
    assert Segment.even(5) == Segment(5, None) and Segment.head_aware(3, 4) == Segment(12, 3)
    assert Segment.head_aware(3, 4).shard_range(1, 2) == (8, 12) and Segment.even(5).shard_range(0, 2) == (0, 3)
    with pytest.raises(ValueError, match="Segmented sharding: segments cover 5 slots along axis 0, but weight has 6"):
        S.segmented(2, 0, [Segment.even(5)])(jnp.asarray(W), 0)
    with pytest.raises(ValueError, match="Dimension 0 must be even for gate_up sharding, got 5"):
        S.gate_up(2, axis=0)(jnp.zeros((5, 4)), 0)
    with pytest.raises(ValueError, match=r"Stacked QKV weight must have shape \[3\*hidden_size, hidden_size\]"):
        S.stacked_qkv(2, 2, 2)(jnp.zeros((13, 4)), 0)


def test_predicates_and_sharded_axis_are_maxs():
    table = {
        "rowwise": (S.rowwise(2), 0), "columnwise": (S.columnwise(2), 1), "replicate": (S.replicate(2), None),
        "axiswise": (S.axiswise(-1, 2), -1), "gate_up": (S.gate_up(2), 2), "stacked_qkv": (S.stacked_qkv(2, 1, 2), 0),
        "head_aware_colwise": (S.head_aware_columnwise(2, 1, 2), 1), "segmented": (S.segmented(2, 1, [Segment.even(4)]), 1),
        "tensor_parallel": (S.tensor_parallel(2), None), "expert_parallel": (S.expert_parallel(2), None),
    }  # fmt: skip
    names = ["rowwise", "colwise", "replicate", "axiswise", "gate_up", "stacked_qkv", "head_aware_colwise", "segmented",
             "tensor_parallel", "expert_parallel"]  # fmt: skip
    for kind, (strategy, axis) in table.items():
        assert strategy.sharded_axis == axis, kind
        expected = kind.replace("columnwise", "colwise")
        assert [n for n in names if getattr(strategy, f"is_{n}")] == [expected], kind


def test_weight_shard_names_sizes_values_and_maxs_errors():
    w = Weight("w", DType.float32, (6, 4), CPU[0])
    with pytest.raises(ValueError, match=r"^Weight w cannot be sharded because no sharding strategy was provided\.$"):
        w.shard(CPU[:2])
    w.sharding_strategy = S.rowwise(4)
    shards = w.shard(CPU[:4])
    assert [s.name for s in shards] == ["w[0]", "w[1]", "w[2]", "w[3]"] and [s.shard_idx for s in shards] == [0, 1, 2, 3]
    assert [list(s.shape) for s in shards] == [[2, 4], [2, 4], [1, 4], [1, 4]]
    assert all(s.sharding_strategy is w.sharding_strategy for s in shards)
    with pytest.raises(ValueError, match=r"^Weight w\[0\] was already sharded\. Use __getitem__ instead\.$"):
        shards[0].shard(CPU[:4])
    # values: eager (the host weight's loaded value), and in a graph (the registry's value under "w")
    w.set_value(W)
    for s, expected in zip(shards, shards_of(S.rowwise(4))):
        np.testing.assert_array_equal(np.asarray(ops.identity(s)), expected)
    with Graph("g", input_types=[]) as g:
        g.output(*shards)
    outs = InferenceSession().load(g, weights_registry={"w": W}).execute()
    for got, expected in zip(outs, shards_of(S.rowwise(4))):
        np.testing.assert_array_equal(got.to_numpy(), expected)
    q = Weight("q", DType.uint8, (4, 20), CPU[0], QuantizationEncoding.Q4_1)
    q.sharding_strategy = S.rowwise(2)
    with pytest.raises(NotImplementedError, match="per-device shards of a quantized weight are not supported"):
        q.shard(CPU[:2])


def test_linear_strategy_reaches_the_bias_as_in_max_and_shards_keep_one_bias():
    lin = nn.Linear(4, 6, DType.float32, CPU[0], has_bias=True)
    lin.sharding_strategy = S.rowwise(2)
    assert lin.bias.sharding_strategy.is_rowwise  # the output dim is split: the bias too
    lin.sharding_strategy = S.columnwise(2)
    assert lin.bias.sharding_strategy.is_replicate
    shards = lin.shard(CPU[:2])
    assert [s.weight.name for s in shards] == ["weight[0]", "weight[1]"]
    assert shards[0].bias is not None and shards[1].bias is None  # only device 0 adds the bias
    with pytest.raises(ValueError, match="Linear layer cannot be sharded because no sharding strategy was provided."):
        nn.Linear(4, 6, DType.float32).shard(CPU[:2])
    with pytest.raises(ValueError, match="Unsupported sharding strategy"):
        nn.MLP(DType.float32, None, 4, 8, CPU[:1]).sharding_strategy = S.rowwise(2)
    with pytest.raises(ValueError, match="RMSNorm only supports replicate strategy"):
        nn.RMSNorm(4, DType.float32).sharding_strategy = S.rowwise(2)


def _mlp(hidden=8, ffn=12):
    m = nn.MLP(DType.float32, None, hidden, ffn, CPU[:1], has_bias=True)
    m.load_state_dict({k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in m.state_dict().items()})
    return m


def test_a_max_program_in_per_device_style_gives_the_same_numbers():
    """MAX's DistributedTransformerBlock pattern: MLP shards per device, one op per device, allreduce."""
    m = _mlp()
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    expected = np.asarray(m(x))
    m.sharding_strategy = S.tensor_parallel(3)  # 12 hidden units over 3 devices; down_proj's bias on device 0 only
    devices = CPU[:3]
    shards = m.shard(devices)
    signals = nn.Signals(devices)
    with Graph("tp_mlp", input_types=[TensorType(DType.float32, ["b", 8], CPU[0]), *signals.input_types()]) as g:
        h, *buffers = g.inputs
        outs = [s(ops.transfer_to(h, d)) for s, d in zip(shards, devices)]
        summed = ops.allreduce.sum(outs, buffers)
        g.output(summed[0], summed[2])
    model = InferenceSession(devices=[d.to_device() for d in devices]).load(g, weights_registry=m.state_dict())
    out0, out2 = model.execute(x, *signals.buffers())
    np.testing.assert_allclose(out0.to_numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out2.to_numpy(), expected, rtol=1e-5, atol=1e-5)
    eager = ops.allreduce.sum([s(x) for s in shards], signals.buffers())  # eager mode, the same
    np.testing.assert_allclose(np.asarray(eager[1]), expected, rtol=1e-5, atol=1e-5)
    gathered = ops.allgather([ops.transfer_to(jnp.asarray(x[:, :4]), CPU[0]), ops.transfer_to(jnp.asarray(x[:, 4:]), CPU[1])],
                             signals.buffers()[:2], axis=1)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(gathered[1]), x)


def test_collectives_check_their_arguments_as_max():
    a, b = (ops.transfer_to(jnp.ones((2, 3)), CPU[i]) for i in range(2))
    with pytest.raises(ValueError, match=r"expected number of inputs \(2\) and number of signal buffers \(1\) to match"):
        ops.allreduce.sum([a, b], [None])
    with pytest.raises(ValueError, match="requires group_size to evenly divide the number of input tensors"):
        ops.allreduce.sum([a, b], [None, None], group_size=3)
    with pytest.raises(ValueError, match="must have unique devices across its input tensors"):
        ops.allreduce.sum([a, a], [None, None])
    with pytest.raises(ValueError, match="must have the same shape across all input tensors in each group"):
        ops.allreduce.sum([a, ops.transfer_to(jnp.ones((2, 4)), CPU[1])], [None, None])
    with pytest.raises(IndexError, match="Dimension out of range 2, axis=2"):
        ops.allgather([a, b], [None, None], axis=2)
    alone = ops.allgather([a, b], [None, None], group_size=1)
    assert [np.asarray(v).shape for v in alone] == [(2, 3), (2, 3)] and ops.allgather([], []) == []


def test_a_weight_on_a_mesh_is_its_shards_laid_out_with_zeros_and_state_dict_keeps_the_declared_layout():
    mesh = make_mesh("tp=4")
    lin = nn.Linear(4, 6, DType.float32, CPU[0], has_bias=True)
    values = {"weight": W, "bias": np.arange(6, dtype=np.float32)}
    lin.load_state_dict(values)
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    expected = np.asarray(lin(x))
    lin.sharding_strategy = S.rowwise(4)  # 6 rows over 4 devices: 2, 2, 1, 1
    lin.to(mesh)
    assert lin.weight.sharding == NamedSharding(mesh, P("tp", None))
    assert lin.weight.storage_sharding == NamedSharding(mesh, P(None, None))  # 6 rows do not divide by 4
    laid = np.asarray(lin.weight.array())
    assert laid.shape == (8, 4)  # 4 blocks of 2 rows, the short shards padded with a zero row
    np.testing.assert_array_equal(laid, np.concatenate([W[0:2], W[2:4], W[4:5], 0 * W[:1], W[5:6], 0 * W[:1]]))
    for device_shard in lin.weight.array().addressable_shards:  # each device holds exactly MAX's shard (+ padding)
        assert device_shard.data.shape == (2, 4)
    assert lin.state_dict()["weight"] is W  # the declared layout, the object given to load_state_dict
    out = np.asarray(lin(x))  # eager on the mesh: the padded rows give zero outputs, then are cut by the bias shape
    assert out.shape == (2, 8)
    np.testing.assert_allclose(out[:, [0, 1, 2, 3, 4, 6]], expected, rtol=1e-6, atol=1e-6)


def test_mlp_on_a_mesh_in_graph_and_functional_modes():
    m = _mlp(8, 10)  # 10 hidden units over 4 devices: 3, 3, 2, 2 (padded to 3 each)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    expected = np.asarray(m(x))
    m.sharding_strategy = S.tensor_parallel(4)
    m.to(make_mesh("dp=2,tp=4"), axis="tp")
    g = Graph("mlp", forward=m, input_types=[TensorType(DType.float32, ["b", 8])])
    program = Program(g)
    state = program.prepare(m.state_dict())
    assert state["weights"]["down_proj.weight"].sharding.spec == P(None, "tp")
    assert state["weights"]["gate_proj.weight"].shape == (12, 8)
    np.testing.assert_allclose(np.asarray(jax.jit(program.apply)(state, x)[0]), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(nn.functional_call(m, nn.state(m), x)), expected, rtol=1e-5, atol=1e-5)


def test_quantized_weights_on_a_mesh_move_in_whole_blocks():
    q = gguf.quants.quantize(RNG.standard_normal((8, 128)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
    dense = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_1)
    x = RNG.standard_normal((2, 128)).astype(np.float32)
    for strategy, n, layout in ((S.columnwise(2), 2, "unpacked"), (S.rowwise(4), 4, "nibbles"), (S.columnwise(4), 4, "packed")):
        lin = nn.Linear(128, 8, DType.float32, CPU[0], quantization_encoding=QuantizationEncoding.Q4_1)
        lin.load_state_dict({"weight": q})
        lin.sharding_strategy = strategy
        lin.to(make_mesh(f"tp={n}"))
        g = Graph("q", forward=lin, input_types=[TensorType(DType.float32, ["b", 128])])
        program = Program(g, quantized_layout=layout)
        state = program.prepare(lin.state_dict())
        np.testing.assert_allclose(np.asarray(jax.jit(program.apply)(state, x)[0]), x @ dense.T, rtol=1e-4, atol=1e-4)
    lin = nn.Linear(128, 8, DType.float32, CPU[0], quantization_encoding=QuantizationEncoding.Q4_1)
    lin.sharding_strategy = S.columnwise(3)  # 43, 43, 42 columns: blocks of 32 cut
    with pytest.raises(ValueError, match=r"cannot place on mesh axis 'tp' \(3 devices\): weight: its column split into shards of \[42, 43\] columns cuts Q4_1 blocks of 32"):
        lin.to(make_mesh("tp=3"))
    lin.sharding_strategy = S.columnwise(8)  # 16 columns a device: half a block
    with pytest.raises(ValueError, match=r"Weight 'weight' of shape \[8, 80\]: cannot place on mesh axis 'tp' \(8 devices\): .*cuts Q4_1 blocks of 32"):
        lin.to(make_mesh("tp=8"))
    assert lin.weight.mesh is None  # nothing changed


def test_bad_placements_name_the_weight_axis_and_sizes():
    lin = nn.Linear(4, 6, DType.float32, CPU[0], has_bias=True)
    lin.sharding_strategy = S.rowwise(2)
    with pytest.raises(ValueError, match=r"Weight 'weight': mesh axis 'tp' does not exist \(the mesh has axes \('model',\)\)"):
        lin.to(make_mesh("model=2"))
    with pytest.raises(ValueError, match=r"Weight 'weight': its sharding strategy splits it over 2 devices, but mesh axis 'tp' has 4"):
        lin.to(make_mesh("tp=4"))
    lin.weight.sharding_strategy = S.rowwise(2)
    lin.bias.sharding_strategy = S.columnwise(2)  # a rank-1 bias has no columns
    with pytest.raises(ValueError, match=r"Weight 'bias' of shape \[6\]: cannot place on mesh axis 'tp' \(2 devices\): axis 1 out of range"):
        lin.to(make_mesh("tp=2"))
    assert lin.weight.mesh is None and lin.bias.mesh is None  # all or nothing
    with pytest.raises(ValueError, match=r"mesh dp=4, tp=4 needs 16 devices, but only 8 are present"):
        make_mesh("dp=4,tp=4")
    with pytest.raises(ValueError, match=r"mesh spec 'dp=2;tp=4': 'dp=2;tp=4' is not axis=size"):
        make_mesh("dp=2;tp=4")
