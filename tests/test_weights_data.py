"""WeightData: metadata, conversions (astype, bfloat16 without torch, lossy casts), DLPack."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.graph.quantization import QuantizationEncoding
from maxjax.graph.type import Dim
from maxjax.graph.weights import WeightData
from maxjax.graph.weights.weight_data import is_lossy_cast


def test_from_numpy_keeps_the_array_and_infers_metadata():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    wd = WeightData.from_numpy(arr, "a.weight")
    assert wd.data is arr
    assert wd.name == "a.weight"
    assert wd.dtype is DType.float32
    assert wd.shape == [Dim(2), Dim(3)]
    assert wd.quantization_encoding is None
    assert repr(wd) == "WeightData(DType.float32, [Dim(2), Dim(3)])"
    assert wd.nbytes == 24


def test_from_numpy_rejects_dtypes_without_a_dtype():
    with pytest.raises(ValueError, match="complex64"):
        WeightData.from_numpy(np.zeros(2, np.complex64), "c")


def test_astype_same_dtype_returns_self():
    wd = WeightData.from_numpy(np.ones(3, np.float32), "x")
    assert wd.astype(DType.float32) is wd


def test_astype_float32_to_bfloat16_rounds_like_ml_dtypes():
    rng = np.random.default_rng(0)
    arr = rng.standard_normal((4, 5)).astype(np.float32)
    out = WeightData.from_numpy(arr, "w").astype(DType.bfloat16)
    assert out.dtype is DType.bfloat16
    assert isinstance(out.data, Buffer)
    np.testing.assert_array_equal(out.to_numpy(), arr.astype(ml_dtypes.bfloat16))
    assert out.name == "w" and out.shape == [4, 5]


def test_astype_drops_encoding_and_dequantizes_packed_data():
    import gguf

    rng = np.random.default_rng(1)
    floats = rng.standard_normal((2, 64)).astype(np.float32)
    packed = gguf.quants.quantize(floats, gguf.GGMLQuantizationType.Q8_0)
    wd = WeightData(packed, "q", DType.uint8, packed.shape, QuantizationEncoding.Q8_0, (2, 64))
    out = wd.astype(DType.float32)
    assert out.quantization_encoding is None
    assert out.shape == [2, 64]
    np.testing.assert_array_equal(out.to_numpy(), gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q8_0))
    with pytest.raises(ValueError, match="quantized weight 'q'.*int32"):
        wd.astype(DType.int32)


@pytest.mark.parametrize(
    "src,dst,lossy",
    [
        (DType.float32, DType.int32, True),
        (DType.float32, DType.bool, True),
        (DType.int32, DType.bool, True),
        (DType.int32, DType.int8, True),
        (DType.int8, DType.uint8, True),
        (DType.uint8, DType.int8, True),
        (DType.uint8, DType.int16, False),
        (DType.int8, DType.int32, False),
        (DType.int32, DType.float32, False),
        (DType.float32, DType.bfloat16, False),
        (DType.float32, DType.float8_e4m3fn, False),
        (DType.bool, DType.int8, False),
    ],
)
def test_lossy_cast_table(src, dst, lossy):
    assert is_lossy_cast(src, dst) is lossy


def test_lossy_conversion_is_refused_unless_asked_for():
    wd = WeightData.from_numpy(np.array([1.7, -2.2], np.float32), "w")
    with pytest.raises(ValueError, match="lossy conversion of weight 'w' from DType.float32 to DType.int32"):
        wd.astype(DType.int32)
    out = wd.astype(DType.int32, allow_lossy=True)
    np.testing.assert_array_equal(out.to_numpy(), np.array([1, -2], np.int32))


def test_to_buffer_replaces_data_in_place():
    arr = np.arange(4, dtype=np.int32)
    wd = WeightData.from_numpy(arr, "i")
    buf = wd.to_buffer()
    assert isinstance(buf, Buffer) and wd.data is buf
    np.testing.assert_array_equal(buf.to_numpy(), arr)
    assert wd.to_buffer() is buf


def test_dlpack_round_trip_for_numpy_and_buffer_data():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    for wd in (WeightData.from_numpy(arr, "a"), WeightData(Buffer(jnp.asarray(arr)), "a", DType.float32, (2, 3))):
        np.testing.assert_array_equal(np.from_dlpack(wd), arr)
        np.testing.assert_array_equal(np.asarray(jax.dlpack.from_dlpack(wd)), arr)


def test_bfloat16_data_goes_through_dlpack_via_jax():
    arr = np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    wd = WeightData.from_numpy(arr, "b")
    out = jax.dlpack.from_dlpack(wd)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out), arr)
