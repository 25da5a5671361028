"""MAX 26.7's build-time rules met by user code: errors, dtypes and devices of graph ops
(observed on MAX 26.7), and the values of the ops whose rules changed here."""

import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.dtype import DType
from maxjax.graph import DeviceRef, Graph, TensorType, Weight, ops
from maxjax.graph.ops.irfft import Normalization
from maxjax.graph.value import Numeric  # noqa: F401 - MAX's alias exists

CPU = DeviceRef.CPU()


def test_band_part_bounds():
    x = jnp.ones((3, 4), jnp.float32)
    for lo, hi, msg in [(-2, 0, "num_lower=-2 must be non-negative"), (0, -2, "num_upper=-2 must be non-negative"),
                        (3, 0, "num_lower=3 is out of bounds for dimension size 3"),
                        (0, 4, "num_upper=4 is out of bounds for dimension size 4")]:  # fmt: skip
        with pytest.raises(ValueError, match=msg):
            ops.band_part(x, lo, hi)
    np.testing.assert_array_equal(np.asarray(ops.band_part(x, 2, 3)), np.ones((3, 4)))
    np.testing.assert_array_equal(np.asarray(ops.band_part(x, None, 0)), np.tril(np.ones((3, 4))))


def test_stack_and_axis_messages():
    a, b = jnp.ones((2, 3), jnp.float32), jnp.ones((2,), jnp.float32)
    with pytest.raises(ValueError, match="All inputs to stack must be the same rank"):
        ops.stack([a, b])
    with pytest.raises(ValueError, match="All inputs to stack must have the same dtype"):
        ops.stack([a, a.astype(jnp.int32)])
    with pytest.raises(ValueError, match="Expected at least one value to stack"):
        ops.stack([])
    with pytest.raises(IndexError, match=r"Axis out of range \(expected to be in range of \[-3, 2\], but got 3\)"):
        ops.stack([a, a], axis=3)
    with pytest.raises(IndexError, match=r"Axis axis_1 out of range \(expected to be in range of \[-2, 1\], but got 2\)"):
        ops.transpose(a, 2, 0)


def test_conv_promotes_input_and_weight():
    w = Weight("filter", DType.float32, [3, 3, 4, 5], CPU)
    with Graph("c", input_types=[TensorType(DType.bfloat16, [1, 8, 8, 4], CPU)]) as g:
        assert ops.conv2d(g.inputs[0].tensor, w).dtype == DType.float32
        assert ops.conv2d(g.inputs[0].tensor, np.ones((3, 3, 4, 5), np.float32)).dtype == DType.bfloat16
    x = jnp.arange(2 * 5 * 5 * 2, dtype=jnp.float32).reshape(2, 5, 5, 2).astype(jnp.bfloat16)
    f = jnp.full((3, 3, 2, 1), 0.5, jnp.float32)
    y = ops.conv2d(x, f)
    assert y.dtype == jnp.float32
    ref = np.asarray(x, np.float32)
    want = sum(ref[:, i : i + 3, j : j + 3, :].sum(axis=(1, 2, 3)) for i, j in [(0, 0)]) * 0.5
    np.testing.assert_allclose(np.asarray(y)[:, 0, 0, 0], want, rtol=1e-6)


def test_range_device_messages_and_tensor_stats():
    with Graph("r", input_types=[TensorType(DType.int32, [2, 4], CPU), TensorType(DType.bool, [3], CPU)]) as g:
        r = ops.range(0, 4, 1, dtype=DType.int32, device=DeviceRef.GPU())
        assert r.type.device == DeviceRef.GPU()
        s = ops.constant(np.array([0], np.int32), DType.int32, CPU)
        with pytest.raises(ValueError, match="Dynamic ranges must provide an explicit out_dim"):
            ops.range(s, 4, 1, dtype=DType.int32)
        with pytest.raises(ValueError, match="range expected scalar values as inputs!"):
            ops.range(s, 4, 1, out_dim=4, dtype=DType.int32)
        x, bools = g.inputs[0].tensor, g.inputs[1].tensor
        assert x.var().dtype == DType.int32
        with pytest.raises(TypeError, match="Variance undefined for boolean values"):
            bools.var()
        with pytest.raises(TypeError, match="Variance undefined for boolean values"):
            bools.stdev()
    # MAX 26.7: mean([1, 2, 2, 2]) of int32 is 1, of the negatives -1; var is 0
    a = jnp.array([[1, 2, 2, 2], [-1, -2, -2, -2]], jnp.int32)
    np.testing.assert_array_equal(np.asarray(ops.mean(a)), [[1], [-1]])


def test_slice_list_of_tensor_indices_and_bool_sub_and_complex_mul():
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    out = ops.slice_tensor(x, [jnp.asarray(1, jnp.int32), slice(1, 3)])
    np.testing.assert_array_equal(np.asarray(out), [5.0, 6.0])
    a, b = jnp.array([0, 0, 1, 1], bool), jnp.array([0, 1, 0, 1], bool)
    np.testing.assert_array_equal(np.asarray(ops.sub(a, b)), [False, True, True, False])
    p = jnp.array([[1.0, 2.0], [0.5, -1.0]], jnp.float32)  # 1+2i, 0.5-i
    q = jnp.array([3.0, -1.0], jnp.float32)  # 3-i (broadcast)
    got = np.asarray(ops.complex.mul(p, q))
    want = np.array([(1 + 2j) * (3 - 1j), (0.5 - 1j) * (3 - 1j)])
    np.testing.assert_allclose(got, np.stack([want.real, want.imag], -1), rtol=1e-6)
    with pytest.raises(ValueError, match="Complex-valued tensors must be 2-dimensional"):
        ops.complex.mul(jnp.ones((3,), jnp.float32), q)
    assert Normalization("ortho") is Normalization.ORTHO
