"""ops.random (MAX's max.graph.ops.random) and max.graph.dtype_promotion, on real draws."""

import numpy as np
import pytest

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, dtype_promotion, ops

CPU_REF = DeviceRef.CPU()


def _run(graph, *inputs):
    return [o.to_numpy() for o in InferenceSession().load(graph).execute(*inputs)]


def test_random_distributions_and_seed_input():
    n = 200_000
    with Graph("rand", input_types=[ops.random.SeedType(CPU_REF)]) as g:
        ops.random.set_seed(g.inputs[0].tensor)
        like = TensorType(DType.float32, [n], CPU_REF)
        a = ops.random.gaussian(like, mean=3.0, std=2.0)
        b = ops.random.uniform(like, range=(-1.0, 5.0))
        c = ops.random.uniform(TensorType(DType.int32, [n], CPU_REF), range=(2, 7))
        g.output(a, b, c)
    a, b, c = _run(g, np.array([7], np.uint64))
    assert a.shape == (n,) and a.dtype == np.float32
    assert abs(a.mean() - 3.0) < 0.03 and abs(a.std() - 2.0) < 0.03
    assert b.min() >= -1.0 and b.max() < 5.0 and abs(b.mean() - 2.0) < 0.03
    assert abs(b.std() - 6.0 / np.sqrt(12)) < 0.02
    assert c.dtype == np.int32 and set(np.unique(c)) == {2, 3, 4, 5, 6}
    a2, _, _ = _run(g, np.array([7], np.uint64))
    a3, _, _ = _run(g, np.array([8], np.uint64))
    np.testing.assert_array_equal(a, a2)  # one seed, one draw
    assert not np.array_equal(a, a3)


def test_random_errors():
    like = TensorType(DType.float32, [3], CPU_REF)
    with Graph("e"):
        with pytest.raises(RuntimeError, match="No seed set"):
            ops.random.uniform(like)
        with pytest.raises(ValueError, match="Unsafe cast"):
            ops.random.set_seed(-1)
        ops.random.set_seed(2**64 - 1)
        with pytest.raises(ValueError, match="Expected a scalar value"):
            ops.random.gaussian(like, mean=np.zeros(2, np.float32))
        with pytest.raises(ValueError, match="Unsafe cast"):
            ops.random.uniform(TensorType(DType.int8, [3], CPU_REF), range=(0, 300))


def test_dtype_promotion_helpers():
    with Graph("p"):
        assert dtype_promotion._promote_to_strong(3, DType.int8, CPU_REF).dtype == DType.int8
        with pytest.raises(ValueError, match="Unsafe cast"):
            dtype_promotion._promote_to_strong(2**24 + 1, DType.float32, CPU_REF)
        with pytest.raises(ValueError, match="Unsafe cast"):
            dtype_promotion._promote_to_strong(1.5, DType.int32, CPU_REF)
        buf = Buffer.from_numpy(np.array(2.5, np.float64))
        assert dtype_promotion._promote_to_strong(buf, DType.bfloat16, CPU_REF).dtype == DType.bfloat16
        x = ops.constant(np.ones(2, np.float16), DType.float16, CPU_REF)
        a, b = dtype_promotion._promote_weak_dtypes(x, 2)
        assert a.dtype == b.dtype == DType.float16
        with pytest.raises(TypeError, match="at least one max object"):
            dtype_promotion._promote_weak_dtypes(1, 2)
        with pytest.raises(TypeError):
            dtype_promotion._restrict_to_strong_dtypes(1.0)
