"""DType, driver (Device, Buffer) and graph types (Dim, Shape, DeviceRef, TensorType)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxjax import driver
from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.graph import AlgebraicDim, BufferType, DeviceRef, Dim, Shape, StaticDim, SymbolicDim, TensorType


def test_dtype_values_match_max():
    assert [(d.name, d.value) for d in (DType.bool, DType.int8, DType.uint64, DType.float32, DType.bfloat16, DType.float8_e4m3fn)] == [
        ("bool", 1), ("int8", 135), ("uint64", 140), ("float32", 81), ("bfloat16", 80), ("float8_e4m3fn", 75)
    ]  # fmt: skip


@pytest.mark.parametrize("dtype", list(DType))
def test_dtype_numpy_round_trip_and_properties(dtype):
    np_dtype = dtype.to_numpy()
    assert DType.from_numpy(np_dtype) is dtype
    assert np.dtype(dtype) == np_dtype
    assert dtype.size_in_bytes == np_dtype.itemsize
    assert dtype.align == np_dtype.itemsize
    assert dtype.is_float() == (np_dtype.kind == "f" or "float" in np_dtype.name)
    assert dtype.is_integral() == (np_dtype.kind in "iu")
    assert dtype.is_half() == (dtype in (DType.float16, DType.bfloat16))
    assert dtype.is_float8() == ("float8" in dtype.name)
    if dtype.is_float():
        assert dtype.finfo().bits <= 64


def test_dtype_bits_and_jax():
    assert DType.float4_e2m1fn.size_in_bits == 4 and DType.float6_e3m2fn.size_in_bits == 6
    assert DType.bfloat16.size_in_bits == 16 and DType.bool.size_in_bits == 8  # a property, as in MAX 26.7
    assert DType.bfloat16.to_jax() == jnp.bfloat16
    assert DType.from_jax(jnp.float16) is DType.float16
    assert DType.int64.to_jax() == (jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)
    with pytest.raises(ValueError, match="complex64"):
        DType.from_numpy(np.complex64)
    with pytest.raises(ValueError, match="finfo is only defined for float"):
        DType.int8.finfo()


def test_devices():
    cpu = driver.CPU()
    assert cpu.label == "cpu" and cpu.id == 0 and cpu.is_host
    assert driver.CPU(3).id == 3
    assert driver.accelerator_count() == 0
    with pytest.raises(ValueError, match='No supported "gpu" device available'):
        driver.Accelerator()
    with pytest.raises(ValueError, match="no CPU device with id 99"):
        driver.CPU(99)


def test_buffer_round_trips():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = Buffer.from_numpy(a)
    assert b.shape == (2, 3) and b.dtype == DType.float32 and b.rank == 2 and b.num_elements == 6
    np.testing.assert_array_equal(b.to_numpy(), a)
    np.testing.assert_array_equal(np.from_dlpack(b), a)
    np.testing.assert_array_equal(Buffer.from_dlpack(a).to_numpy(), a)
    np.testing.assert_array_equal(Buffer.from_dlpack(jnp.asarray(a)).to_numpy(), a)
    bf = Buffer.from_numpy(a.astype(ml_dtypes.bfloat16))
    assert bf.dtype == DType.bfloat16
    moved = b.to(driver.CPU(2))
    assert moved.device == driver.CPU(2) and moved.to(driver.CPU(2)) is moved
    assert b.to(DeviceRef.CPU(1)).device.id == 1
    z = Buffer(DType.int32, (2, 2))
    assert z.to_numpy().sum() == 0 and z.dtype == DType.int32
    assert Buffer.from_numpy(np.array([5], np.int32)).item() == 5
    assert isinstance(b.to_jax(), jax.Array)
    assert isinstance(b, driver.DLPackArray)


def test_dims_and_shapes():
    assert isinstance(Dim(3), StaticDim) and isinstance(Dim("batch"), SymbolicDim)
    assert Dim(3) == 3 and Dim("a") == "a" and Dim("a") != Dim("b")
    alg = Dim("a") * 2 + 1
    assert isinstance(alg, AlgebraicDim) and str(alg) == "2*a + 1"
    assert alg.evaluate({"a": 5}) == 11
    assert int(Dim(4) * 3) == 12
    s = Shape([2, "batch", Dim(5)])
    assert s == [2, "batch", 5] and s == (2, "batch", 5) and s.rank == 3
    assert s.static_dims == [2, 5] and not Shape.is_static(s)
    assert repr(s) == "[Dim(2), Dim('batch'), Dim(5)]"
    with pytest.raises(ValueError, match="Invalid name for symbolic dimension"):
        Dim("not a name")
    with pytest.raises(TypeError):
        Dim(1.5)


@given(st.lists(st.integers(0, 1000), max_size=5))
def test_static_shapes_round_trip(dims):
    s = Shape(dims)
    assert s == dims and Shape.is_static(s) and [int(d) for d in s] == dims
    assert s.evaluate({}) == tuple(dims)


def test_device_refs_and_tensor_types():
    assert DeviceRef.CPU() == DeviceRef("cpu", 0) and str(DeviceRef.GPU(1)) == "gpu:1"
    assert DeviceRef.from_device(driver.CPU(2)) == DeviceRef.CPU(2)
    assert DeviceRef.CPU(1).to_device() == driver.CPU(1)
    assert DeviceRef.CPU().is_cpu() and DeviceRef.GPU().is_gpu() and DeviceRef.TPU().is_tpu()
    t = TensorType(DType.float32, ["batch", 4], DeviceRef.CPU())
    assert t.shape == ["batch", 4] and t.rank == 2 and t.cast(DType.int8).dtype == DType.int8
    sds = t.to_shape_dtype_struct()
    assert str(sds.shape[0]) == "batch" and sds.shape[1] == 4
    assert TensorType(DType.float32, [2, 3]).num_elements() == 6


def test_kernel_library_is_empty_and_refuses_mojo_paths_by_name():
    from maxjax.graph import Graph, KernelLibrary, Type

    lib = KernelLibrary()
    assert lib.library_paths() == [] and list(lib) == [] and "mo.add" not in lib
    with pytest.raises(KeyError):
        lib["my_kernel"]
    g = Graph("k", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())], kernel_library=lib)  # MAX's test fixtures do this
    assert g.name == "k"
    with pytest.raises(NotImplementedError, match="kernels.mojopkg"):
        KernelLibrary(["kernels.mojopkg"])
    with pytest.raises(NotImplementedError, match="ops_dir"):
        lib.load_paths(["ops_dir"])
    with pytest.raises(TypeError, match="KernelLibrary"):
        Graph("k", input_types=[], kernel_library="kernels.mojopkg")
    assert isinstance(TensorType(DType.float32, [2], DeviceRef.CPU()), Type)
    assert isinstance(BufferType(DType.float32, [2], DeviceRef.CPU()), Type)


def test_the_sharding_helpers_are_where_max_keeps_them():
    from maxjax.graph import sharding, weight

    for name in ("col_sharding_strategy", "row_sharding_strategy", "stacked_qkv_sharding_strategy", "head_aware_col_sharding_strategy", "segmented_sharding_strategy"):
        assert getattr(weight, name) is getattr(sharding, name)
