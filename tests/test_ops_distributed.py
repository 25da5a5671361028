"""MAX's distributed graph ops on host devices: ``ops.reducescatter.sum``,
``ops.distributed_broadcast``, ``ops.distributed_scatter``, ``ops.shard_and_stack``,
``ops.allgather_rms_norm``, ``ops.reduce_scatter_rms_norm``, ``ops.bundled_allreduce.sum`` against NumPy
in graph mode (Graph + InferenceSession), eagerly on arrays placed on 2-4 CPU devices (the
conftest gives 8) and under ``jax.jit``; MAX's build-time errors (messages from MAX 26.7's source, checked by running
it); ``ops.distributed_ep`` (records MAX's output types, raises NotImplementedError when run);
``maxjax.nn.comm.ep``'s arithmetic (numbers from MAX 26.7) and ``maxjax.nn.parallel``.
"""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

from maxjax import nn
from maxjax.driver import CPU as CPUDevice
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import BufferType, DeviceRef, Dim, Graph, TensorType, ops
from maxjax.nn.comm.ep import EPConfig, calculate_ep_max_tokens_per_rank
from maxjax.nn.comm.ep.ep_config import estimate_ep_memory_usage
from maxjax.nn.parallel import ParallelArrayOps

F32 = DType.float32
CPU = [DeviceRef.CPU(i) for i in range(8)]
RNG = np.random.default_rng(0)


def _run_graph(name, input_types, n_devices, build, *args):
    """Builds a graph of ``input_types`` plus one signal buffer per device, ``build(tensors,
    buffers)`` giving its outputs; returns (graph outputs, executed NumPy outputs)."""
    signals = nn.Signals(CPU[:n_devices])
    with Graph(name, input_types=[*input_types, *signals.input_types()]) as g:
        k = len(input_types)
        outs = build([v.tensor for v in g.inputs[:k]], [v.buffer for v in g.inputs[k:]])
        g.output(*outs)
    model = InferenceSession(devices=[d.to_device() for d in CPU[:n_devices]]).load(g)
    return outs, [o.to_numpy() for o in model.execute(*args, *signals.buffers())]


def _placed(arrays, devices):
    return [ops.transfer_to(jnp.asarray(a), d) for a, d in zip(arrays, devices)]


# -- reducescatter.sum -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "shape", "axis", "group_size"), [(3, (7, 2), 0, None), (2, (3, 5), -1, None), (4, (5, 3), 0, 2)]
)
def test_reducescatter_sums_each_group_and_cuts_it_in_maxs_ragged_parts(n, shape, axis, group_size):
    xs = [RNG.standard_normal(shape).astype(np.float32) for _ in range(n)]
    gs = group_size or n
    expected = []
    for start in range(0, n, gs):
        total = sum(xs[start : start + gs])
        d = total.shape[axis]
        sizes = [(d + gs - r - 1) // gs for r in range(gs)]  # MAX: the first d % gs parts one longer
        expected += np.split(total, np.cumsum(sizes)[:-1], axis=axis)
    graph_outs, got = _run_graph(
        "rs", [TensorType(F32, shape, CPU[i]) for i in range(n)], n,
        lambda t, b: ops.reducescatter.sum(t, b, axis=axis, group_size=group_size), *xs,
    )
    assert [o.device for o in graph_outs] == CPU[:n]
    assert [list(o.shape) for o in graph_outs] == [list(e.shape) for e in expected]
    eager = ops.reducescatter.sum(_placed(xs, CPU), nn.Signals(CPU[:n]).buffers(), axis=axis, group_size=group_size)
    assert [o.device for o in eager] == CPU[:n]
    for g_out, e_out, want in zip(got, eager, expected):
        np.testing.assert_allclose(g_out, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(e_out), want, rtol=1e-5, atol=1e-6)


def test_reducescatter_of_nine_rows_over_eight_devices_gives_the_first_two_rows():
    with Graph("rs8", input_types=[*(TensorType(F32, [9, 16], d) for d in CPU), *nn.Signals(CPU).input_types()]) as g:
        outs = ops.reducescatter.sum([v.tensor for v in g.inputs[:8]], [v.buffer for v in g.inputs[8:]])
    assert [int(o.shape[0]) for o in outs] == [2, 1, 1, 1, 1, 1, 1, 1]


# -- distributed_broadcast / distributed_scatter ------------------------------------------------


def test_distributed_broadcast_copies_the_root_input_to_every_device():
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    graph_outs, got = _run_graph(
        "bc", [TensorType(F32, [4, 3], CPU[1])], 3, lambda t, b: ops.distributed_broadcast(t[0], b), x
    )
    assert [o.device for o in graph_outs] == CPU[:3]
    eager = ops.distributed_broadcast(ops.transfer_to(jnp.asarray(x), CPU[2]), nn.Signals(CPU[:3]).buffers())
    assert [o.device for o in eager] == CPU[:3]
    for out in [*got, *eager]:
        np.testing.assert_array_equal(np.asarray(out), x)


def test_distributed_scatter_gives_each_replica_its_chunk():
    a = np.arange(5, dtype=np.uint32)
    b = np.arange(10, 13, dtype=np.uint32)
    types = [TensorType(DType.uint32, [5], CPU[0]), TensorType(DType.uint32, [3], CPU[0])]
    graph_outs, got = _run_graph("sc", types, 4, lambda t, bufs: ops.distributed_scatter(t, bufs), a, b)
    assert [o.device for o in graph_outs] == CPU[:4] and [list(o.shape) for o in graph_outs] == [[5], [5], [3], [3]]
    eager = ops.distributed_scatter(_placed([a, b], CPU[:1] * 2), nn.Signals(CPU[:3]).buffers())  # tp = ceil(3 / 2) = 2
    assert [o.device for o in eager] == CPU[:3]
    for out, want in zip([*got, *eager], [a, a, b, b, a, a, b]):
        np.testing.assert_array_equal(np.asarray(out), want)


# -- shard_and_stack ---------------------------------------------------------------------------


@pytest.mark.parametrize(("axis", "n"), [(1, 3), (-2, 2)])
def test_shard_and_stack_stacks_part_i_of_every_input_on_device_i(axis, n):
    xs = [RNG.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]
    expected = [np.stack(parts) for parts in zip(*(np.split(x, n, axis=axis) for x in xs))]
    graph_outs, got = _run_graph(
        "ss", [TensorType(F32, [4, 6], CPU[0])] * 2, n, lambda t, b: ops.shard_and_stack(t, CPU[:n], axis), *xs
    )
    assert [o.device for o in graph_outs] == CPU[:n]
    eager = ops.shard_and_stack([jnp.asarray(x) for x in xs], CPU[:n], axis=axis)
    assert [o.device for o in eager] == CPU[:n]
    for g_out, e_out, want in zip(got, eager, expected):
        np.testing.assert_array_equal(g_out, want)
        np.testing.assert_array_equal(np.asarray(e_out), want)


def test_shard_and_stack_of_a_symbolic_dim_divides_it():
    with Graph("ss_sym", input_types=[TensorType(F32, ["n", 4], CPU[0])]) as g:
        (out,) = ops.shard_and_stack([g.inputs[0].tensor], CPU[:1])
        outs = ops.shard_and_stack([g.inputs[0].tensor], CPU[:2])
    assert out.shape == [1, Dim("n"), 4]
    assert [o.shape for o in outs] == [[1, Dim("n") // 2, 4]] * 2


def test_the_ops_run_under_jax_jit():
    import jax

    x = RNG.standard_normal((5, 4)).astype(np.float32)
    bufs = nn.Signals(CPU[:3]).buffers()

    def run(a, b):
        outs = [
            *ops.reducescatter.sum([a, b, a], bufs),
            *ops.distributed_broadcast(a, bufs),
            *ops.distributed_scatter([a, b], bufs),
            *ops.shard_and_stack([a, b], CPU[:2], axis=1),
        ]
        return [o.to_jax() for o in outs]

    got = jax.jit(run)(x, 2 * x)
    total = 4 * x
    halves = [np.stack([x[:, :2], 2 * x[:, :2]]), np.stack([x[:, 2:], 2 * x[:, 2:]])]
    want = [total[:2], total[2:4], total[4:], x, x, x, x, x, 2 * x, *halves]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


# -- allgather_rms_norm / reduce_scatter_rms_norm / bundled_allreduce -------------------------------


def _bf16(a):
    return np.asarray(jnp.asarray(a, jnp.bfloat16))


def _rms(x, gamma, eps, offset):  # float32 statistics, weight applied before the cast (MAX's fused norm)
    x = x.astype(np.float32)
    return _bf16(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (gamma.astype(np.float32) + offset))


def test_allgather_rms_norm_is_allgather_then_rms_norm():
    n, eps, offset = 3, 1e-5, 1.0
    xs = [_bf16(RNG.standard_normal((r, 8))) for r in (2, 3, 2)]
    gammas = [_bf16(RNG.standard_normal(8))] * n
    gathered = np.concatenate(xs).astype(np.float32)
    types = [TensorType(DType.bfloat16, [x.shape[0], 8], CPU[i]) for i, x in enumerate(xs)]
    types += [TensorType(DType.bfloat16, [8], CPU[i]) for i in range(n)]

    def build(t, b):
        normed, residual = ops.allgather_rms_norm(t[:n], b, t[n:], eps, weight_offset=offset)
        return [*normed, *residual]

    graph_outs, got = _run_graph("agn", types, n, build, *xs, *gammas)
    assert [o.device for o in graph_outs] == CPU[:n] * 2
    normed, residual = ops.allgather_rms_norm(_placed(xs, CPU), nn.Signals(CPU[:n]).buffers(), gammas, eps, offset)
    want = _rms(gathered, gammas[0], eps, offset)
    for out in [*got[:n], *normed]:
        np.testing.assert_allclose(np.asarray(out, np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2)
    for out in [*got[n:], *residual]:
        np.testing.assert_array_equal(np.asarray(out, np.float32), gathered)


@pytest.mark.parametrize("with_residual", [False, True])
def test_reduce_scatter_rms_norm_sums_in_float32_adds_the_residual_rows_and_norms(with_residual):
    n, eps = 2, 1e-6
    xs = [_bf16(RNG.standard_normal((5, 8))) for _ in range(n)]
    gammas = [_bf16(RNG.standard_normal(8)) for _ in range(n)]
    res = _bf16(RNG.standard_normal((5, 8)))
    total = sum(x.astype(np.float32) for x in xs) + (res.astype(np.float32) if with_residual else 0)
    parts = [total[:3], total[3:]]  # ragged: 3 rows, then 2
    residuals = _placed([res] * n, CPU) if with_residual else None
    normed, residual = ops.reduce_scatter_rms_norm(
        _placed(xs, CPU), nn.Signals(CPU[:n]).buffers(), gammas, eps, residuals=residuals
    )
    assert [o.device for o in normed + residual] == CPU[:n] * 2
    if not with_residual:  # the same numbers under jax.jit
        import jax

        bufs = nn.Signals(CPU[:n]).buffers()
        jitted = jax.jit(lambda *a: [o.to_jax() for pair in ops.reduce_scatter_rms_norm(a[:n], bufs, a[n:], eps) for o in pair])
        for j, e in zip(jitted(*xs, *gammas), [*normed, *residual]):
            np.testing.assert_array_equal(np.asarray(j, np.float32), np.asarray(e, np.float32))
    for i in range(n):
        np.testing.assert_array_equal(np.asarray(residual[i], np.float32), _bf16(parts[i]).astype(np.float32))
        want = _rms(parts[i], gammas[i], eps, 0.0).astype(np.float32)
        np.testing.assert_allclose(np.asarray(normed[i], np.float32), want, rtol=1e-2, atol=1e-2)


def test_bundled_allreduce_sums_like_allreduce():
    xs = [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
    _, got = _run_graph("ba", [TensorType(F32, [2, 3], d) for d in CPU[:2]], 2, ops.bundled_allreduce.sum, *xs)
    for out in got:
        np.testing.assert_allclose(out, xs[0] + xs[1], rtol=1e-6)


# -- MAX's build-time errors -------------------------------------------------------------------


def _build_error(fn, types, n_signal_devices):
    signals = nn.Signals(n_signal_devices)
    with Graph("err", input_types=[*types, *signals.input_types()]) as g:
        k = len(types)
        fn([v.tensor for v in g.inputs[:k]], [v.buffer for v in g.inputs[k:]])


T = TensorType


def BF(device):  # noqa: N802 - a type constructor, like T
    return TensorType(DType.bfloat16, [4, 4], device)


ERRORS = [
    (lambda t, b: ops.reducescatter.sum(t, b[:1]), [T(F32, [4, 2], CPU[0]), T(F32, [4, 2], CPU[1])], CPU[:2], ValueError,
     "expected number of inputs (2) and number of signal buffers (1) to match"),
    (lambda t, b: ops.reducescatter.sum([], []), [], [], ValueError, "reducescatter.sum operation requires at least one input"),
    (lambda t, b: ops.reducescatter.sum(t, b, group_size=3), [T(F32, [4, 2], CPU[0]), T(F32, [4, 2], CPU[1])], CPU[:2],
     ValueError, "reducescatter.sum operation requires group_size to evenly divide the number of input tensors. Got: group_size=3 and num_devices=2"),
    (lambda t, b: ops.reducescatter.sum(t, b), [T(F32, [4, 2], CPU[0]), T(DType.int32, [4, 2], CPU[1])], CPU[:2], ValueError,
     "reducescatter.sum operation must have the same dtype across all input tensors."),
    (lambda t, b: ops.reducescatter.sum(t, b), [T(F32, [4, 2], CPU[0]), T(F32, [4], CPU[1])], CPU[:2], ValueError,
     "reducescatter.sum operation must have the same rank across all input tensors."),
    (lambda t, b: ops.reducescatter.sum(t, b), [T(F32, [4, 2], CPU[0]), T(F32, [4, 3], CPU[1])], CPU[:2], ValueError,
     "reducescatter.sum operation must have the same shape across all input tensors in each group."),
    (lambda t, b: ops.reducescatter.sum(t, b), [T(F32, [4, 2], CPU[0]), T(F32, [4, 2], CPU[0])], CPU[:2], ValueError,
     "reducescatter.sum operation must have unique devices across its input tensors."),
    (lambda t, b: ops.reducescatter.sum(t, b, axis=-3), [T(F32, [4, 2], CPU[0]), T(F32, [4, 2], CPU[1])], CPU[:2], ValueError,
     "axis -1 is out of bounds for tensor with rank 2"),
    (lambda t, b: ops.distributed_broadcast(t[0], []), [T(F32, [4], CPU[0])], [], ValueError,
     "distributed_broadcast requires at least 1 signal buffer."),
    (lambda t, b: ops.distributed_broadcast(t[0], b), [T(F32, [4], CPU[3])], CPU[:2], ValueError,
     "input tensor device cpu:3 not found in signal buffer devices"),
    (lambda t, b: ops.distributed_broadcast(t[0], b), [T(F32, [4], CPU[0])], [CPU[0], CPU[0]], ValueError,
     "distributed_broadcast requires unique devices across signal buffers."),
    (lambda t, b: ops.distributed_scatter([], b), [], CPU[:2], ValueError, "distributed_scatter requires at least 1 input chunk. Got: 0"),
    (lambda t, b: ops.distributed_scatter(t, b), [T(F32, [4], CPU[0]), T(F32, [4], CPU[1])], CPU[:2], ValueError,
     "All input chunks must be on the same device. Chunk 0 is on cpu:0, but chunk 1 is on cpu:1"),
    (lambda t, b: ops.distributed_scatter(t, b), [T(F32, [4], CPU[0])], [CPU[0], CPU[0]], ValueError,
     "distributed_scatter requires unique devices across signal buffers."),
    (lambda t, b: ops.distributed_scatter(t, b), [T(F32, [4], CPU[2])], CPU[:2], ValueError,
     "input chunk device cpu:2 not found in signal buffer devices"),
    (lambda t, b: ops.shard_and_stack([], CPU[:2]), [], [], ValueError, "Must provide at least one input tensor."),
    (lambda t, b: ops.shard_and_stack(t, []), [T(F32, [10, 4], CPU[0])], [], ValueError, "Must provide at least one device."),
    (lambda t, b: ops.shard_and_stack(t, CPU[:2]), [T(F32, [10, 4], CPU[0]), T(F32, [10, 4], CPU[1])], [], ValueError,
     "Input values must be on the same device"),
    (lambda t, b: ops.shard_and_stack(t, CPU[:2]), [T(F32, [10, 4], CPU[0]), T(DType.int32, [10, 4], CPU[0])], [], ValueError,
     "All input tensors must have the same dtype. Input 0 has dtype DType.float32, but input 1 has dtype DType.int32"),
    (lambda t, b: ops.shard_and_stack(t, CPU[:2]), [T(F32, [10, 4], CPU[0]), T(F32, [8, 4], CPU[0])], [], ValueError,
     "All input tensors must have the same shape. Input 0 has shape [Dim(10), Dim(4)], but input 1 has shape [Dim(8), Dim(4)]"),
    (lambda t, b: ops.shard_and_stack(t, CPU[:2], axis=3), [T(F32, [10, 4, 8], CPU[0])], [], IndexError,
     "Axis must be in range [-3, 3), got 3"),
    (lambda t, b: ops.shard_and_stack(t, CPU[:2]), [T(F32, [10, 4], DeviceRef.GPU(0))], [], ValueError,
     "Input value must be on the host device"),
    (lambda t, b: ops.shard_and_stack(t, CPU[:3]), [T(F32, [10, 4], CPU[0])], [], ValueError,
     "Dimension size along axis 0 (10) must be evenly divisible by number of devices (3)"),
    (lambda t, b: ops.allgather_rms_norm(t[:1], b[:1], t[1:], 1e-5), [BF(CPU[0]), T(DType.bfloat16, [4], CPU[0])], CPU[:1],
     ValueError, "allgather_rms_norm requires at least two inputs (one per device); the all-gather is a no-op otherwise. Got: 1"),
    (lambda t, b: ops.allgather_rms_norm(t, b, t, 1e-5), [T(F32, [2, 4], CPU[0]), T(F32, [2, 4], CPU[1])], CPU[:2], ValueError,
     "allgather_rms_norm is bfloat16-only (the kernel and fuse threshold assume it). Got: DType.float32"),
    (lambda t, b: ops.allgather_rms_norm(t, b, t, 1e-5), [T(DType.bfloat16, [2, 4, 1], d) for d in CPU[:2]], CPU[:2],
     ValueError, "allgather_rms_norm is 2D-only ([rows, cols]); the fused kernel indexes rows and cols directly. Got rank: 3"),
    (lambda t, b: ops.reduce_scatter_rms_norm(t, b, t, 1e-5, residuals=t[:1]), [BF(CPU[0]), BF(CPU[1])], CPU[:2], ValueError,
     "expected number of inputs (2) and number of residuals (1) to match"),
    (lambda t, b: ops.reduce_scatter_rms_norm(t, b, t, 1e-5, group_size=1), [BF(CPU[0]), BF(CPU[1])], CPU[:2], ValueError,
     "reduce_scatter_rms_norm requires group_size to be at least 2 (the reduce-scatter is a no-op otherwise). Got: group_size=1"),
    (lambda t, b: ops.reduce_scatter_rms_norm(t, b, t, 1e-5), [BF(CPU[0]), BF(CPU[0])], CPU[:2], ValueError,
     "reduce_scatter_rms_norm requires unique devices across its input tensors."),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "types", "signal_devices", "error", "message"), ERRORS)
def test_build_time_errors_are_maxs(fn, types, signal_devices, error, message):
    with pytest.raises(error, match=re.escape(message)):
        _build_error(fn, types, signal_devices)


def test_signal_inputs_are_buffers_and_other_tensors_are_not():
    with Graph("sig", input_types=[TensorType(F32, [2], CPU[0]), *nn.Signals(CPU[:1]).input_types()]) as g:
        x, sig = g.inputs
        assert sig.buffer is sig and sig.device == CPU[0]
        with pytest.raises(TypeError, match="is not a buffer value"):
            x.buffer


# -- distributed_ep ----------------------------------------------------------------------------


def test_ep_dispatch_and_combine_build_maxs_outputs_and_refuse_to_run():
    n, tokens, hidden, top_k = 2, 4, 8, 2
    types = [
        *(TensorType(DType.bfloat16, [tokens, hidden], d) for d in CPU[:n]),
        *(TensorType(DType.int32, [tokens, top_k], d) for d in CPU[:n]),
        *(TensorType(DType.uint64, [n], CPU[0]) for _ in range(3)),
        *(BufferType(DType.int32, [16], d) for d in CPU[:n]),
    ]
    out_types = [
        [TensorType(DType.bfloat16, [16, hidden], d), TensorType(DType.uint32, [3], d), TensorType(DType.int32, [2], d),
         TensorType(DType.int32, [16, 2], d)]
        for d in CPU[:n]
    ]
    kw = dict(
        hidden_size=hidden, top_k=top_k, n_experts=4, max_token_per_rank=tokens, n_gpus_per_node=n, n_nodes=1,
        fused_shared_expert=False,
    )
    with Graph("ep", input_types=types) as g:
        ins = g.inputs
        results = ops.distributed_ep.dispatch_bf16(
            [v.tensor for v in ins[:n]], [v.tensor for v in ins[n : 2 * n]], ins[2 * n].tensor, ins[2 * n + 1].tensor,
            ins[2 * n + 2].tensor, [v.buffer for v in ins[2 * n + 3 :]], out_types, **kw,
        )
        assert [[(o.dtype, list(o.shape), o.device) for o in r] for r in results] == [
            [(t.dtype, list(t.shape), t.device) for t in ts] for ts in out_types
        ]
        combined = ops.distributed_ep.combine(
            [r[0] for r in results], [r[3] for r in results], ins[2 * n].tensor, ins[2 * n + 1].tensor, ins[2 * n + 2].tensor,
            [v.tensor for v in ins[n : 2 * n]], [v.buffer for v in ins[2 * n + 3 :]],
            [TensorType(DType.bfloat16, [tokens, hidden], d) for d in CPU[:n]], **kw,
        )
        assert [o.device for o in combined] == CPU[:n]
        g.output(*combined)
    with pytest.raises(NotImplementedError, match=r"ops\.distributed_ep\.combine|ops\.distributed_ep\.dispatch_bf16"):
        model = InferenceSession(devices=[CPUDevice()]).load(g)
        model.execute(*[np.zeros([int(d) for d in t.shape], t.dtype.to_numpy()) for t in types])
    with pytest.raises(NotImplementedError, match=r"ops\.distributed_ep\.dispatch_fp8: .*GPU-only"):
        ops.distributed_ep.dispatch_fp8(
            [jnp.zeros((tokens, hidden))], [jnp.zeros((tokens, top_k), jnp.int32)], None, None, None, [], [out_types[0]],
            dispatch_scale_granularity="blockwise", **kw,
        )
    with pytest.raises(ValueError, match="input_tokens must be non-empty"):
        ops.distributed_ep.combine([], [], None, None, None, [], [], [], **kw)


# -- nn.comm.ep ---------------------------------------------------------------------------------


def test_ep_config_arithmetic_is_maxs():
    # the numbers are MAX 26.7's for the same arguments
    assert [
        calculate_ep_max_tokens_per_rank(max_batch_input_tokens=s, ep_size=p, data_parallel_degree=dp)
        for s, p, dp in [(4096, 8, 1), (4196, 8, 1), (10, 3, 1), (4196, 8, 8)]
    ] == [512, 525, 4, 4196]
    kw = dict(max_batch_input_tokens=4196, ep_size=8, data_parallel_degree=1, use_allreduce=True)
    assert calculate_ep_max_tokens_per_rank(**kw) == 4196
    cfg = EPConfig(DType.bfloat16, DType.bfloat16, 128, 8, 64, 64, 2, 1)
    got = (cfg.get_max_recv_tokens(), cfg.estimate_memory_usage(), cfg._max_recv_tokens_per_expert(), cfg.num_logical_experts)
    assert got == (1024, 1196032, 128, 64)
    cfg = EPConfig(DType.bfloat16, DType.bfloat16, 128, 8, 64, 64, 4, 1, use_allreduce=True)
    assert (cfg.get_max_recv_tokens(), cfg.estimate_memory_usage()) == (512, 409600)
    assert estimate_ep_memory_usage(
        hidden_size=7168, dispatch_dtype=DType.float4_e2m1fn, combine_dtype=DType.bfloat16, max_tokens_per_rank=128,
        n_experts=256, n_nodes=2, n_gpus_per_node=8, top_k=8,
    ) == 382197760


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"dispatch_dtype": DType.float8_e4m3fn}, "dispatch_quant_config must be specified when dispatch_dtype is not bfloat16"),
        ({"use_allreduce": True, "n_nodes": 2}, "Using allreduce as communication backend is not supported when n_nodes > 1"),
        ({"n_nodes": 2}, "ep_size=4 with 2 GPU(s) on this node implies 2-node multi-node EP"),
        ({"nvfp4_dyn_global_scales": True}, "nvfp4_dyn_global_scales requires an NVFP4 dispatch_quant_config"),
    ],
)
def test_ep_config_checks_are_maxs(kw, message, monkeypatch):
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    base = dict(dispatch_dtype=DType.bfloat16, combine_dtype=DType.bfloat16, hidden_size=128, top_k=8, n_experts=64,
                max_tokens_per_rank=64, n_gpus_per_node=2, n_nodes=1)
    with pytest.raises(ValueError, match=re.escape(message)):
        EPConfig(**{**base, **kw})


def test_multicast_pool_sizing_is_maxs_and_allocation_takes_maxs_fallback():
    from maxjax.nn.comm import MulticastPool

    sizes = [MulticastPool.capacity_bytes(*a) for a in [(4, 1024, 4096), (2, 1024, 4096), (8, 1 << 20, 8192), (4, 0, 4096)]]
    assert sizes == [8388608, 0, 0, 0]  # MAX 26.7's
    assert MulticastPool.allocate([CPUDevice()], 1024) is None


# -- nn.parallel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_parallel_concatenate_is_numpys(axis, monkeypatch):
    p = ParallelArrayOps(max_workers=4)
    arrays = [RNG.standard_normal((8, 6, 3)) for _ in range(2)]
    copies = []
    copy = ParallelArrayOps._copy_array_slice
    monkeypatch.setattr(ParallelArrayOps, "_copy_array_slice", staticmethod(lambda *a: copies.append(1) or copy(*a)))
    split = p.concatenate(arrays, axis=axis, min_chunk_size_mb=0.0001)  # 2 workers per array: 2 chunks each
    np.testing.assert_array_equal(split.to_numpy(), np.concatenate(arrays, axis=axis))
    assert len(copies) == 4
    one = RNG.standard_normal((3, 2))
    out = p.concatenate([one])
    np.testing.assert_array_equal(out.to_numpy(), one)
    assert not np.shares_memory(out.to_numpy(), one)
    with pytest.raises(IndexError, match="axis 2 is out of bounds for array of dimension 2"):
        p.concatenate([one, one], axis=2)
    with pytest.raises(ValueError, match=r"Dimension 1: arrays\[0\]=2, arrays\[1\]=3"):
        p.concatenate([one, np.zeros((3, 3))])
    with pytest.raises(ValueError, match="A provided device must be a GPU"):
        ParallelArrayOps(accelerator=CPUDevice())
    p.shutdown()
