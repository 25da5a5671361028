"""Build-time behaviours of maxjax.graph that match MAX 26.7 (issue 22's small fidelity fixes).

Every expectation here was observed by running MAX 26.7 (``~/max267/bin/python``) on the same
graph: the exception type and the words MAX's own tests look for.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from maxjax.dtype import DType
from maxjax.graph import DeviceRef, Dim, Graph, SymbolicDim, TensorType, ops

CPU = DeviceRef.CPU()


def _graph(*types: TensorType) -> Graph:
    return Graph("misc", input_types=list(types))


def test_size_in_bits_is_a_property() -> None:
    # MAX 26.7: DType.size_in_bits is a property (DType.float32.size_in_bits == 32).
    assert DType.float32.size_in_bits == 32
    assert DType.float4_e2m1fn.size_in_bits == 4


def test_tensor_type_rejects_negative_static_dims() -> None:
    with pytest.raises(TypeError, match=re.escape("Static tensor dimensions must be non-negative; got shape=[-1, 2]")):
        TensorType(DType.float32, [-1, 2], CPU)
    with pytest.raises(TypeError):
        Graph("neg", input_types=[TensorType(DType.float32, [-7], CPU)])
    assert Dim(-1) == -1  # a Dim alone may be negative, as in MAX
    assert TensorType(DType.float32, ["r"], CPU)._layout is None
    assert repr(TensorType(DType.int32, [3], CPU)) == "TensorType(dtype=int32, shape=[Dim(3)], device=cpu:0)"


def test_symbolic_dims() -> None:
    with pytest.raises(TypeError, match="Int conversions only supported for static dims"):
        int(SymbolicDim("x"))
    with pytest.raises(TypeError, match="Int conversions only supported for static dims"):
        int(Dim("x") * 2)
    # MAX's name rule: an ASCII letter or "_" first ("º" and "é" fail, "aº" is fine)
    for bad in ("º", "é", "a b", "1a"):
        with pytest.raises(ValueError):
            SymbolicDim(bad)
    assert SymbolicDim("aº").name == "aº"


def test_where_errors() -> None:
    with _graph(
        TensorType(DType.bool, [2, 4], CPU),
        TensorType(DType.int32, [2, 6], CPU),
        TensorType(DType.float32, [3], CPU),
        TensorType(DType.bool, [3], CPU),
        TensorType(DType.int32, [3], CPU),
        TensorType(DType.int32, [3], DeviceRef.GPU()),
    ) as g:
        c, x, f, c3, i3, gi3 = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match="dimension at axis 1 \\(value 4\\) and input x .* are neither equivalent nor broadcastable"):
            ops.where(c, x, x)
        with pytest.raises(ValueError, match="Expected condition to be a boolean tensor, but got a tensor with dtype DType.float32"):
            ops.where(f, i3, i3)
        with pytest.raises(ValueError, match=re.escape(
            "Input values must be on the same device\n"
            "    condition: TensorType(dtype=bool, shape=[Dim(3)], device=cpu:0)\n"
            "    x: TensorType(dtype=int32, shape=[Dim(3)], device=cpu:0)\n"
            "    y: TensorType(dtype=int32, shape=[Dim(3)], device=gpu:0)"
        )):
            ops.where(c3, i3, gi3)
        assert ops.where(c3, i3, 1).shape == [3]


def test_axis_and_size_errors() -> None:
    with _graph(TensorType(DType.float32, [15], CPU), TensorType(DType.float32, [6], CPU),
                TensorType(DType.float32, ["D0"], CPU), TensorType(DType.float32, [4, "n"], CPU)) as g:
        x, y, s, m = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"axis \(5\) out of bound"):
            ops.top_k(x, 3, axis=5)
        with pytest.raises(ValueError, match=r"k \(30\) cannot be larger than dimension size along axis 0"):
            ops.top_k(x, 30)
        with pytest.raises(IndexError, match=re.escape("Axis must be in range [-1, 1), got 2")):
            ops.split(x, [10, 5], 2)
        with pytest.raises(IndexError, match=re.escape("Axis must be in range [-2, 2), got 2")):
            ops.chunk(m, 2, axis=2)
        with pytest.raises(TypeError):  # a symbolic axis, before chunks is looked at (as MAX)
            ops.chunk(m, 0, axis=1)
        with pytest.raises(ValueError, match=re.escape(
            "[broadcast_to] input dimension at index 0 (6) must be either 1 or equal to corresponding "
            "output dimension at index 1 (7)")):
            ops.broadcast_to(y, [6, 7])
        with pytest.raises(ValueError, match=re.escape(
            "[broadcast_to] input dimension at index 0 (D0) must be either 1 or equal to corresponding "
            "output dimension at index 1 (D2)")):
            ops.broadcast_to(s, ["D1", "D2"])
        assert ops.broadcast_to(y, [2, 6]).shape == [2, 6]


def test_promotion_error_names_mlir_dtypes() -> None:
    # MAX: "Failed to resolve valid dtype: Unsafe cast from si32 to f32" for int32 with float16 (and
    # float32); si64 to f64 for int64 with bfloat16; ui32 to si32; f16 to bf16.
    cases = [
        (DType.int32, DType.float16, "si32 to f32"),
        (DType.int32, DType.float32, "si32 to f32"),
        (DType.int64, DType.bfloat16, "si64 to f64"),
        (DType.uint32, DType.int32, "ui32 to si32"),
        (DType.float16, DType.bfloat16, "f16 to bf16"),
        (DType.int16, DType.float16, "si16 to f16"),
    ]
    with _graph(*(TensorType(d, [3], CPU) for a, b, _ in cases for d in (a, b))) as g:
        v = [x.tensor for x in g.inputs]
        for i, (_, _, words) in enumerate(cases):
            with pytest.raises(ValueError, match=f"Failed to resolve valid dtype: Unsafe cast from {words}. Insert an explicit cast"):
                ops.add(v[2 * i], v[2 * i + 1])


def test_tensor_value_is_not_a_container() -> None:
    with _graph(TensorType(DType.float32, ["a", "b"], CPU)) as g:
        with pytest.raises(TypeError, match="is not a container"):
            _ = 1 in g.inputs[0].tensor


def test_constant_and_range_bounds() -> None:
    with _graph() as g:
        with pytest.raises(ValueError, match="out of range for DType"):
            ops.constant(2**63, DType.int64, device=CPU)
        gpu_start = ops.constant(0, DType.int32, device=DeviceRef.GPU())
        assert gpu_start.device == DeviceRef.GPU()
        with pytest.raises(ValueError, match="Range input values must be on CPU"):
            ops.range(gpu_start, 5, 1, 5, device=CPU, dtype=DType.int32)


def test_slice_order_and_large_bounds() -> None:
    with _graph(TensorType(DType.float32, ["d"], CPU), TensorType(DType.float32, [5], CPU)) as g:
        x, y = (v.tensor for v in g.inputs)
        words = "start and stop should be increasing for positive step and decreasing for negative step, but got "
        with pytest.raises(ValueError, match=words + "start 2, stop 1 for step 1"):
            x[2:1]
        with pytest.raises(ValueError, match=words + "start 4, stop 3 for step 1"):
            y[-1:-2]
        assert y[1:3].shape == [2]
        # an int64 index on a symbolic dim (MAX accepts any int64 there)
        assert x[2**40].shape == []
        assert x[-(2**40) :].shape[0] is not None
        g.output(y[1:3])


def test_slice_order_eager() -> None:
    a = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(ops.slice_tensor(a, (slice(1, 3),))), a[1:3])
    with pytest.raises(ValueError, match="start 3, stop 1"):
        ops.slice_tensor(a, (slice(3, 1),))


def test_range_length_beyond_int64() -> None:
    with _graph():
        start = ops.constant(0, DType.int64, device=CPU)
        stop = ops.constant(-(2**63), DType.int64, device=CPU)
        step = ops.constant(-1, DType.int64, device=CPU)
        with pytest.raises(ValueError):  # the length 2**63 is no int64 (MAX: ValueError)
            ops.range(start, stop, step, 2**63, device=CPU, dtype=DType.int64)


def test_ops_keep_declared_dtypes() -> None:
    with _graph(TensorType(DType.bool, [3, 2], CPU), TensorType(DType.bool, [4], CPU)) as g:
        b, v = (x.tensor for x in g.inputs)
        # MAX: hann_window's dtype is the one asked for (float64 too); cumsum, sum, prod, max of a
        # bool stay bool; argsort of a bool is int64 indices, both orders.
        assert ops.hann_window(8, CPU, dtype=DType.float64).dtype == DType.float64
        assert ops.cumsum(b, axis=0).type == b.type
        for op in (ops.sum, ops.prod, ops.max, ops.min, ops.mean):
            assert op(b, axis=1).dtype == DType.bool
        for ascending in (True, False):
            assert ops.argsort(v, ascending=ascending).type == v.type.cast(DType.int64)


def test_bool_reductions_and_argsort_eager() -> None:
    b = np.array([[True, False], [False, False], [True, True]])
    np.testing.assert_array_equal(np.asarray(ops.cumsum(b, axis=0)), [[True, False], [True, False], [True, True]])
    np.testing.assert_array_equal(np.asarray(ops.sum(b, axis=1)), [[True], [False], [True]])
    np.testing.assert_array_equal(np.asarray(ops.prod(b, axis=1)), [[False], [False], [True]])
    # descending argsort is stable and right for unsigned ints (no negation)
    np.testing.assert_array_equal(np.asarray(ops.argsort(np.array([0, 200, 5, 200], np.uint8), ascending=False)), [1, 3, 2, 0])
    np.testing.assert_array_equal(np.asarray(ops.argsort(np.array([True, False, True]), ascending=False)), [0, 2, 1])


def test_call_declared_dtypes_and_wrong_type() -> None:
    it = TensorType(DType.int64, [3], CPU)
    with Graph("main", input_types=[it, it]) as g:
        with g.add_subgraph("add", input_types=[it, it]) as sub:
            a, b = (x.tensor for x in sub.inputs)
            sub.output(ops.add(a, b), ops.cast(a, DType.bool))
        assert [r.type for r in ops.call(sub, *g.inputs)] == [it, it.cast(DType.bool)]
        with g.add_subgraph("f", input_types=[TensorType(DType.int32, [3], CPU)] * 2) as sub32:
            sub32.output(sub32.inputs[0])
        with pytest.raises(ValueError, match="wrong type"):  # int64 is not int32 (MAX)
            ops.call(sub32, *g.inputs)


def test_driver_version_and_cpu_host_func() -> None:
    import maxjax.driver as md

    assert md.__version__
    with pytest.raises(RuntimeError):  # MAX: CPU devices take no host callbacks
        md.CPU().__unsafe_enqueue_py_host_func(lambda: None)


def test_slice_bounds_of_long_static_dims_are_exact() -> None:
    with _graph(TensorType(DType.float32, [2**40], CPU)) as g:
        x = g.inputs[0].tensor
        assert x[2**35 : 2**35 + 2].shape == [2]  # no int32 clamping of a static axis


def test_conv_operands_on_two_devices() -> None:
    x_t = TensorType(DType.float32, [1, 8, 8, 4], CPU)
    w_t = TensorType(DType.float32, [3, 3, 4, 5], DeviceRef.GPU(1))
    with _graph(x_t, w_t) as g:
        x, w = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match="same device"):
            ops.conv2d(x, w)
        with pytest.raises(ValueError, match="same device"):
            ops.conv2d_transpose(x, w)


def test_repeat_interleave_zero_repeats() -> None:
    with _graph(TensorType(DType.float32, [3], CPU)) as g:
        with pytest.raises(ValueError, match="repeat value must be positive, given repeats=0"):
            ops.repeat_interleave(g.inputs[0].tensor, 0)
        assert ops.repeat_interleave(g.inputs[0].tensor, 2).shape == [6]


def test_dequantize_last_dim_checks() -> None:
    from maxjax.graph.quantization import QuantizationEncoding

    with _graph(TensorType(DType.uint8, [2, 19], CPU), TensorType(DType.uint8, [2, "n"], CPU)) as g:
        odd, sym = (v.tensor for v in g.inputs)
        with pytest.raises(ValueError, match=r"last dimension \(19\) not divisible by block size \(18\)"):
            ops.dequantize(QuantizationEncoding.Q4_0, odd)
        with pytest.raises(TypeError, match="static last dimension"):
            ops.dequantize(QuantizationEncoding.Q4_0, sym)


def test_reshape_of_zero_elements_with_huge_dims() -> None:
    # MAX: a 0 among the dims makes 0 elements, however large the others multiply out
    with _graph(TensorType(DType.float32, [2**40, 0, 2**40, "a"], CPU)) as g:
        out = g.inputs[0].tensor.reshape([0, 2**50, "a", 2**40])
        assert out.shape == [0, 2**50, "a", 2**40]
        with pytest.raises(ValueError):
            g.inputs[0].tensor.reshape([1, "a"])


def test_gather_nd_devices_checked_first() -> None:
    # MAX checks devices before anything else (here the indices' float dtype would fail later)
    with _graph(TensorType(DType.float32, [4, 3], CPU), TensorType(DType.float32, [2, 1], DeviceRef.GPU(1))) as g:
        with pytest.raises(ValueError, match="Input values must be on the same device\n    input: "):
            ops.gather_nd(*(v.tensor for v in g.inputs))


def test_conv_over_a_symbolic_channel_count_builds_and_runs() -> None:
    """MAX 26.7 builds conv2d / conv2d_transpose over an input whose channel count is symbolic (the
    filter fixes it); maxjax rebinds the channels to the filter's and checks them when it runs."""
    from maxjax.engine import InferenceSession

    x_t = TensorType(DType.float32, [1, "h", "w", "c"], CPU)
    f = np.random.default_rng(0).standard_normal((2, 2, 3, 4)).astype(np.float32)  # RSCF: 3 in, 4 out
    with Graph("conv_sym", input_types=[x_t, TensorType(DType.float32, [2, 2, 3, 4], CPU)]) as g:
        y = ops.conv2d(g.inputs[0].tensor, g.inputs[1].tensor)
        assert list(y.shape)[-1] == 4
        g.output(y)
    model = InferenceSession().load(g)
    x = np.random.default_rng(1).standard_normal((1, 5, 6, 3)).astype(np.float32)
    out = model.execute(x, f)[0].to_numpy()
    ref = np.zeros((1, 4, 5, 4), np.float32)
    for i in range(4):
        for j in range(5):
            ref[0, i, j] = np.einsum("rsc,rscf->f", x[0, i:i + 2, j:j + 2], f)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match=re.escape("(1, 5, 6, 2)")):  # refused at run time (rebind), naming the shape
        model.execute(np.zeros((1, 5, 6, 2), np.float32), f)  # 2 channels against the filter's 3
    with Graph("convt_sym", input_types=[x_t, TensorType(DType.float32, [2, 2, 4, 3], CPU)]) as g:
        y = ops.conv2d_transpose(g.inputs[0].tensor, g.inputs[1].tensor)
        assert list(y.shape)[-1] == 4 and str(y.shape[1]) != "h"  # [1, h + 1, w + 1, 4]


def test_conv_checks_dtypes_before_shapes() -> None:
    # MAX 26.7: an int32 input and a float16 filter fail on the dtypes even when the channels differ too
    with Graph("conv_dt", input_types=[TensorType(DType.int32, [1, 8, 8, 4], CPU)]) as g:
        w = ops.constant(np.zeros((3, 3, 5, 4), np.float16), DType.float16, CPU)
        with pytest.raises(ValueError, match="Failed to resolve valid dtype: Unsafe cast from si32 to f32"):
            ops.conv2d(g.inputs[0].tensor, w)


def test_buffer_store_slice_refuses_a_source_on_another_device() -> None:
    from maxjax.graph import BufferType

    with Graph("bss", input_types=[TensorType(DType.float32, [2], CPU), BufferType(DType.float32, [2], DeviceRef.GPU(1))]) as g:
        t, b = g.inputs
        with pytest.raises(ValueError, match="same device"):
            ops.buffer_store_slice(b.buffer, t.tensor, [...])


def test_conv2d_shard_puts_each_replica_on_its_device() -> None:
    from maxjax.graph import ShardingStrategy
    from maxjax.nn import Conv2d

    conv = Conv2d(kernel_size=3, in_channels=3, out_channels=8, dtype=DType.float32, device=DeviceRef.GPU(0), has_bias=True)
    conv.sharding_strategy = ShardingStrategy.replicate(num_devices=2)
    shards = conv.shard([DeviceRef.GPU(0), DeviceRef.GPU(1)])
    assert [s.device for s in shards] == [DeviceRef.GPU(0), DeviceRef.GPU(1)]
    assert all(s.filter.sharding_strategy == conv.filter.sharding_strategy for s in shards)


def test_gather_nd_with_empty_index_tuples() -> None:
    # MAX: indices [..., 0] select the whole input for each index row: [*indices.shape[:-1], *input.shape]
    from maxjax.engine import InferenceSession

    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    with Graph("gnd0", input_types=[TensorType(DType.float32, [2, 3], CPU), TensorType(DType.int64, [4, 0], CPU),
                                    TensorType(DType.int64, [2, 5, 0], CPU)]) as g:
        a, i0, i1 = (v.tensor for v in g.inputs)
        y0 = ops.gather_nd(a, i0)
        y1 = ops.gather_nd(a, i1, batch_dims=1)
        assert y0.shape == [4, 2, 3] and y1.shape == [2, 5, 3]
        g.output(y0, y1)
    out0, out1 = (o.to_numpy() for o in InferenceSession().load(g).execute(x, np.zeros((4, 0), np.int64),
                                                                            np.zeros((2, 5, 0), np.int64)))
    np.testing.assert_array_equal(out0, np.broadcast_to(x, (4, 2, 3)))
    np.testing.assert_array_equal(out1, np.broadcast_to(x[:, None, :], (2, 5, 3)))


def test_device_placement_policy() -> None:
    # MAX 26.7: an enum Ignore/Warn/Error ('ignore'/'warn'/'error'), Graph's strict_device_placement, default Warn
    from maxjax.graph import DevicePlacementPolicy

    assert [(p.name, p.value) for p in DevicePlacementPolicy] == [("Ignore", "ignore"), ("Warn", "warn"), ("Error", "error")]
    assert Graph("g0").strict_device_placement is DevicePlacementPolicy.Warn
    for policy in DevicePlacementPolicy:  # no maxjax op moves a tensor: every policy builds and runs the same graph
        with Graph("g", input_types=[TensorType(DType.float32, [2], CPU)], strict_device_placement=policy) as g:
            g.output(ops.constant(np.array([1.0, 2.0], np.float32)) + g.inputs[0].tensor)
        assert g.strict_device_placement is policy
    with pytest.raises(TypeError, match="DevicePlacementPolicy"):
        Graph("bad", strict_device_placement="error")


def test_constant_build_time_rules() -> None:
    # MAX 26.7 in a graph: a Python literal needs both dtype and device (TypeError), an array's dtype
    # must equal dtype= (ValueError: no silent conversion, here a lossy int64 -> int8), sub-byte dtypes refused
    arr = np.arange(6, dtype=np.int64).reshape(2, 3) * 100
    with Graph("consts", input_types=()) as g:
        with pytest.raises(TypeError, match="Literal constants must explicitly set a dtype and device"):
            ops.constant([[0, 1, 2], [3, 4, 5]], dtype=DType.int8)
        with pytest.raises(TypeError, match="Literal constants must explicitly set a dtype and device"):
            ops.constant(1.5, device=CPU)
        with pytest.raises(ValueError, match="DType must match input dtype"):
            ops.constant(arr, dtype=DType.int8)
        with pytest.raises(ValueError):  # not rectangular
            ops.constant([[0, 1, 2], [3, 4]], DType.int8, CPU)
        with pytest.raises(TypeError, match="sub-byte"):
            ops.constant(np.zeros(2, np.uint8), DType.float4_e2m1fn, CPU)
        a = ops.constant(arr)  # an array keeps its dtype (int64 declared, as MAX)
        b = ops.constant(arr, dtype=DType.int64)
        c = ops.constant([[1, 2, 3], [4, 5, 6]], DType.int32, CPU)
        assert a.dtype == b.dtype == DType.int64 and c.dtype == DType.int32
        g.output(c)
    from maxjax.engine import InferenceSession

    np.testing.assert_array_equal(InferenceSession().load(g).execute()[0].to_numpy(), [[1, 2, 3], [4, 5, 6]])
    # outside a graph (maxjax's eager mode) a literal takes NumPy's dtype, floats as float32
    assert ops.constant(1.5).dtype == DType.float32
