"""``maxjax.driver`` against MAX 26.7's ``max.driver`` (values and messages recorded by
``scripts/max_reference/driver.py``), and each refusal of a MAX runtime feature."""

from __future__ import annotations

import inspect
import struct

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from max_reference import load

import maxjax.driver as driver
from maxjax.driver import CPU, Accelerator, Buffer, Device, DeviceSpec, Usage
from maxjax.dtype import DType

REF = load("driver")


def ref(key: str):
    return REF[key].tolist() if REF[key].dtype.kind == "U" else REF[key]


def err(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_every_max_driver_name_is_present():
    max_names = [
        "CPU", "Accelerator", "Buffer", "CompletionFlag", "DLPackArray", "Device", "DeviceEvent", "DeviceQueue",
        "DeviceSpec", "HostHazardError", "LaunchTraceEntry", "SymmetricPool", "Usage", "accelerator_api",
        "accelerator_architecture_name", "accelerator_count", "batch_inplace_copy", "begin_launch_trace",
        "calculate_virtual_device_count", "calculate_virtual_device_count_from_cli", "copy_pinned_to_destinations",
        "devices_exist", "enable_all_peer_access", "get_virtual_cpu_target", "get_virtual_device_api",
        "get_virtual_device_count", "get_virtual_device_target_arch", "is_virtual_device_mode", "launch_trace",
        "load_devices", "load_max_buffer", "scan_available_devices", "set_virtual_cpu_target", "set_virtual_device_api",
        "set_virtual_device_count", "set_virtual_device_target_arch", "take_launch_trace",
    ]  # fmt: skip  (MAX 26.7's max.driver.__all__)
    assert [n for n in max_names if not hasattr(driver, n)] == []
    assert set(max_names) <= set(driver.__all__)


# -- Buffer: host memory, shared as in MAX ----------------------------------------------------
def test_from_numpy_and_to_numpy_share_memory_and_writes_go_both_ways():
    a = REF["buf.a"].copy()
    b = Buffer.from_numpy(a)
    assert np.shares_memory(b.to_numpy(), a) == REF["buf.shares_from_numpy"]
    a[0, 0] = 42.0
    assert b[0, 0].item() == 42.0  # the buffer reads the array's memory
    b[1, 2] = 7.0
    assert a[1, 2] == 7.0  # and writes into it


def test_slices_are_strided_views_with_maxs_strides():
    a = REF["buf.a"].copy()
    b = Buffer.from_numpy(a)
    col = b[:, 1]
    # MAX 26.7's to_numpy of a strided view ignores the strides (REF["buf.col1"] == [1, 2], the
    # first two floats of the parent): a bug maxjax does not copy
    np.testing.assert_array_equal(col.to_numpy(), a[:, 1])
    np.testing.assert_array_equal(REF["buf.col1"], a.reshape(-1)[1:3])
    assert col.strides == tuple(REF["buf.col1_strides"]) and col.is_contiguous == REF["buf.col1_contiguous"]
    assert np.shares_memory(col.to_numpy(), a) == REF["buf.col1_shares"]
    np.testing.assert_array_equal(b[1, :].to_numpy(), REF["buf.row1"])
    assert b[1, :].is_contiguous == REF["buf.row1_contiguous"]
    assert b[1, 2].item() == REF["buf.item_1_2"] and b[1, 2].rank == REF["buf.item_rank"]
    assert b[[0, 1]].rank == REF["buf.list_index_rank"]  # a list indexes per axis, as a tuple
    r1 = Buffer.from_numpy(np.arange(4.0, dtype=np.float32))
    np.testing.assert_array_equal(r1[::2].to_numpy(), [0.0, 2.0])  # (MAX 26.7: REF["buf.step2"] == [0, 1], the same bug)
    np.testing.assert_array_equal(REF["buf.step2"], [0.0, 1.0])
    assert r1[::2].strides == tuple(REF["buf.step2_strides"]) and r1[::2].is_contiguous == REF["buf.step2_contiguous"]
    assert r1[-1].item() == REF["buf.neg1_item"]
    assert err(lambda: r1[7]).startswith("IndexError")  # MAX: IndexError too
    with pytest.raises(TypeError, match="ints and slices"):
        r1[None]


def test_setitem_writes_through_buffer_and_view():
    z = np.zeros((2, 3), np.float32)
    zb = Buffer.from_numpy(z)
    zb[1, 1] = 9
    zb[0, 0] = np.float32(3)
    view = zb[1, :]
    view[2] = 4.0
    np.testing.assert_array_equal(z, REF["buf.setitem_numpy_after"])
    with pytest.raises(TypeError, match="float cannot be stored in a DType.int32"):  # MAX: std::bad_cast
        Buffer.from_numpy(np.zeros(2, np.int32))[0] = 2.7
    with pytest.raises(TypeError, match="expected dtype DType.float32, got DType.int32"):
        zb[0, :] = np.ones(3, np.int32)
    # MAX 26.7 (oracle run 2026-11-27): integer indices one per axis, a scalar takes [0] or [()]
    with pytest.raises(ValueError, match=r"number of indices \(1\) is not equal to the tensor rank \(2\)"):
        zb[1] = 5
    with pytest.raises(ValueError, match=r"number of indices \(3\) is not equal to the tensor rank \(2\)"):
        zb[1, 1, 1] = 5
    scalar = Buffer.scalar(5, DType.int32)
    scalar[0] = 8
    assert scalar.item() == 8
    scalar[()] = 9
    assert scalar.item() == 9
    with pytest.raises(ValueError, match=r"number of indices \(1\) is not equal to the tensor rank \(0\)"):
        scalar[1] = 3


def test_view_reinterprets_bytes_and_shares_host_memory():
    a = REF["buf.a"].copy()
    b = Buffer.from_numpy(a)
    v = b.view(DType.int32)
    np.testing.assert_array_equal(v.to_numpy(), REF["buf.view_int32"])
    assert np.shares_memory(v.to_numpy(), a) == REF["buf.view_int32_shares"]
    assert b.view(DType.uint8).shape == tuple(REF["buf.view_uint8_shape"])
    np.testing.assert_array_equal(b.view(DType.float32, [3, 2]).to_numpy(), REF["buf.view_3x2"])
    np.testing.assert_array_equal(Buffer.from_numpy(np.array([1, 0], np.uint8)).view(DType.bool).to_numpy(), REF["buf.view_bool"])
    assert err(lambda: b.view(DType.float32, [4, 2])) == ref("err.view_bytes")
    assert err(lambda: Buffer.from_numpy(np.zeros((2, 3), np.uint8)).view(DType.float32)) == ref("err.view_larger")


def test_copies_and_contiguous():
    a = REF["buf.a"].copy()
    b = Buffer.from_numpy(a)
    np.testing.assert_array_equal(b[:, 1].contiguous().to_numpy(), REF["buf.contiguous_col1"])
    assert b[:, 1].contiguous().is_contiguous
    assert np.shares_memory(b.contiguous().to_numpy(), a) == REF["buf.contiguous_shares"]
    assert np.shares_memory(b.copy().to_numpy(), a) == REF["buf.copy_shares"]
    np.testing.assert_array_equal(b[:, 1].copy().to_numpy(), [1.0, 4.0])  # (MAX 26.7 gives [1, 2]: a bug)
    assert (b.to(CPU()) is b) == REF["buf.to_same_is_self"]
    assert [x.device for x in b.to([CPU(), CPU()])] == [CPU(), CPU()]
    d = Buffer(DType.float32, [3, 2])
    d.inplace_copy_from(b)
    np.testing.assert_array_equal(d.to_numpy(), REF["buf.inplace_copy_reshaped"])
    assert err(lambda: Buffer(DType.int32, [2, 3]).inplace_copy_from(b)) == ref("err.copy_dtype")
    assert err(lambda: Buffer(DType.float32, [2, 2]).inplace_copy_from(b)) == ref("err.copy_size")
    with pytest.raises(ValueError, match="Cannot copy from non-contiguous buffer"):
        Buffer(DType.float32, [2]).inplace_copy_from(b[:, 1])
    dsts = [Buffer(DType.float32, [2, 3]), Buffer(DType.float32, [6])]
    driver.batch_inplace_copy(dsts, [b, b])
    driver.copy_pinned_to_destinations(b, [Buffer(DType.float32, [6])])
    np.testing.assert_array_equal(dsts[1].to_numpy(), a.reshape(-1))
    assert err(lambda: driver.batch_inplace_copy([b], [])) == ref("err.batch_len")


def test_construction_scalars_and_metadata():
    assert inspect.signature(Buffer.zeros).parameters["usage"].default is Usage.DEFAULT
    np.testing.assert_array_equal(Buffer.zeros([2, 2], DType.int32).to_numpy(), REF["buf.zeros"])
    assert str(Buffer.zeros([2], DType.float32, CPU(), Usage.STAGING).usage) == ref("buf.zeros_staging_usage")
    assert [str(u) for u in (Usage.DEFAULT, Usage.STAGING, Usage.UNTRACKED, Usage.STAGING | Usage.UNTRACKED)] == ref("dev.usage_members")
    np.testing.assert_array_equal(Buffer.scalar(3, DType.float32).to_numpy(), REF["buf.scalar_f32"])
    assert Buffer.scalar(True, DType.bool).item() is True and REF["buf.scalar_bool"]
    assert Buffer.scalar(1.5, DType.bfloat16).item() == REF["buf.scalar_bf16_item"]
    with pytest.raises(TypeError, match="float value cannot be held"):
        Buffer.scalar(2.7, DType.int32)
    assert Buffer.scalar(3, DType.float32).num_elements == REF["buf.num_elements_rank0"]
    assert Buffer(DType.bfloat16, [1]).element_size == REF["buf.element_size_bf16"]
    b = Buffer.from_numpy(REF["buf.a"].copy())
    assert str(b.usage) == ref("buf.usage_default") and b.pinned == REF["buf.pinned"]
    assert repr(b.stream) == ref("buf.stream")
    assert repr(b) == ref("buf.repr").replace("max.driver", "maxjax.driver")
    assert str(b) == ref("buf.str")
    assert b.__dlpack_device__() == tuple(REF["buf.dlpack_device"])
    assert (b.shape, b.rank, b.dtype, b.device, b.is_host) == ((2, 3), 2, DType.float32, CPU(), True)
    assert err(lambda: b.item()) == ref("err.item")
    assert np.shares_memory(np.asarray(b), b.to_numpy()) and not np.shares_memory(np.array(b), b.to_numpy())
    # MAX's overloads: (dtype, shape, stream) and (ndarray, device)
    assert Buffer(DType.float32, [2], CPU().default_queue).device == CPU()
    src = np.ones(3, np.float32)
    copied = Buffer(src, CPU())
    assert not np.shares_memory(copied.to_numpy(), src)
    with pytest.raises(TypeError, match="dtype must be a DType"):
        Buffer(np.float32, [2])
    with pytest.raises(ValueError, match="non-negative"):
        Buffer(DType.float32, [-1])


def test_from_dlpack_rules():
    a = REF["buf.a"].copy()
    assert np.shares_memory(Buffer.from_dlpack(a, copy=True).to_numpy(), a) == REF["buf.from_dlpack_copy_true_shares"]
    assert np.shares_memory(Buffer.from_dlpack(a).to_numpy(), a)
    ro = np.zeros(3, np.float32)
    ro.setflags(write=False)
    assert np.shares_memory(Buffer.from_numpy(ro).to_numpy(), ro) == REF["buf.readonly_shares"]
    assert np.shares_memory(Buffer.from_numpy(a[:, 1]).to_numpy(), a) == REF["buf.noncontig_from_numpy_shares"]
    assert err(lambda: Buffer.from_dlpack(a[:, 1])) == ref("err.from_dlpack_noncontig")
    b = Buffer.from_numpy(a)
    assert Buffer.from_dlpack(b) is b
    with pytest.raises(ValueError, match="supports the `copy` flag only"):
        Buffer.from_dlpack(jnp.ones(2), copy=True)
    j = jnp.arange(3.0)
    assert Buffer.from_dlpack(j).to_jax() is j
    np.testing.assert_array_equal(np.from_dlpack(b), a)  # a Buffer is a DLPack producer
    bf = np.ones(2, ml_dtypes.bfloat16)  # MAX 26.7 cannot; maxjax holds bfloat16 in NumPy
    assert Buffer.from_numpy(bf).dtype is DType.bfloat16


def test_mmap_and_load_max_buffer(tmp_path):
    p = tmp_path / "x.bin"
    np.arange(10, dtype=np.float32).tofile(p)
    np.testing.assert_array_equal(Buffer.mmap(p, DType.float32, [2, 4], offset=8).to_numpy(), REF["buf.mmap_offset8"])
    m = Buffer.mmap(p, DType.float32, [10], mode="r+")
    m[0] = 100.0
    del m
    np.testing.assert_array_equal(np.fromfile(p, np.float32), REF["buf.mmap_rplus_file"])
    assert err(lambda: driver.load_max_buffer(p)) == ref("err.load_max_buffer").replace("PATH", str(p))
    # a MAX checkpoint (format of MAX 26.7's load_max_buffer): magic, version, metadata, key, dtype, rank, dims, offset
    key = b"t"
    shape = (2, 3)
    meta = struct.pack("I", len(key)) + key + struct.pack("2B", DType.int16.value, 2) + struct.pack("2I", *shape)
    offset = 8 + 8 + 8 + len(meta) + 8
    header = b"\x93\xf0\x9f\x94\xa5\x2b\x2b\x93" + struct.pack("2I", 0, 1) + struct.pack("Q", len(meta) + 8) + meta
    ck = tmp_path / "t.max"
    ck.write_bytes(header + struct.pack("Q", offset) + np.arange(6, dtype=np.int16).tobytes())
    got = driver.load_max_buffer(ck)
    assert got.dtype is DType.int16
    np.testing.assert_array_equal(got.to_numpy(), np.arange(6, dtype=np.int16).reshape(shape))


# -- Buffer: a jax.Array, rebound on writes ---------------------------------------------------
def test_device_buffer_rebinds_on_write_and_copies_on_read():
    arr = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    b = Buffer(arr)
    assert b.to_jax() is arr  # wrapped, not copied
    before = b.to_numpy()
    row = b[1]
    b[0, 0] = 5.0
    assert b[0, 0].item() == 5.0 and before[0, 0] == 0.0 and row.to_numpy()[0] == 3.0  # earlier reads are copies
    assert float(arr[0, 0]) == 0.0  # the original array is untouched (immutable)
    np.testing.assert_array_equal(b.view(DType.int32).to_numpy(), np.asarray(b).view(np.int32))
    np.testing.assert_array_equal(b.view(DType.uint8).to_numpy(), np.asarray(b).view(np.uint8))
    with pytest.raises(IndexError):
        b[7, 0]  # JAX would clamp; the Buffer checks as MAX does
    b.inplace_copy_from(Buffer.from_numpy(np.ones(6, np.float32)))
    np.testing.assert_array_equal(b.to_numpy(), np.ones((2, 3), np.float32))
    assert b.to_numpy().flags.writeable and b.is_contiguous and b.strides == (3, 1)


def test_host_buffer_placement_for_models():
    a = np.arange(3, dtype=np.float32)
    b = Buffer.from_numpy(a)
    j = b.to_jax()  # a copy: the host memory stays the buffer's
    a[0] = 9.0
    assert float(j[0]) == 0.0 and b.to_numpy()[0] == 9.0
    placed = b._array  # what a model's buffer input does: place once, then a device buffer
    assert b.to_jax() is placed and not np.shares_memory(b.to_numpy(), a)


# -- devices -----------------------------------------------------------------------------------
def test_cpu_device_answers_as_max():
    cpu = CPU()
    assert type(cpu) is CPU and isinstance(cpu, Device) and not isinstance(cpu, Accelerator)
    assert repr(cpu) == ref("dev.repr") and Device.cpu() == cpu and CPU(-1) == cpu
    assert [cpu.label, cpu.api, cpu.model_name] == ref("dev.label_api_model")
    assert [cpu.is_host, cpu.is_host_unified, cpu.is_compatible, cpu.can_access(cpu)] == REF["dev.flags"].tolist()
    stats = cpu.stats
    assert sorted(stats) == ref("dev.stats_keys") and 0 < stats["free_memory"] <= stats["total_memory"]
    assert cpu.max_single_alloc_size == stats["total_memory"]
    assert err(lambda: cpu.architecture_name) == ref("err.arch_cpu")
    q = cpu.default_queue
    assert repr(q) == ref("dev.queue_repr") and q.native_stream_handle == REF["dev.native_stream_handle"]
    assert q.device == cpu and driver.DeviceQueue(cpu) == q
    x = jnp.ones(4) * 2
    event = q.record_event()
    q.wait_for(cpu)
    cpu.synchronize()
    event.synchronize()
    assert event.is_ready() and x.is_ready()
    with pytest.raises(NotImplementedError, match="enable_timing"):
        driver.DeviceEvent(cpu, enable_timing=True)
    with pytest.raises(TypeError, match="use CPU\\(\\) or Accelerator\\(\\)"):
        Device(0)


def test_device_specs_and_module_functions():
    assert repr(driver.scan_available_devices()) == ref("dev.scan")
    assert driver.accelerator_api() == ref("dev.accelerator_api") and driver.accelerator_count() == 0
    assert err(driver.accelerator_architecture_name) == ref("err.arch_cpu")
    assert [driver.devices_exist([DeviceSpec.cpu()]), driver.devices_exist([DeviceSpec.accelerator()])] == REF["dev.devices_exist"].tolist()
    assert driver.load_devices([DeviceSpec.cpu()]) == [CPU()]
    assert err(lambda: DeviceSpec(-1, "gpu")) == ref("err.devicespec_neg_gpu")
    assert err(lambda: driver.load_devices([DeviceSpec.accelerator()])) == ref("err.load_missing_gpu")
    assert [
        driver.calculate_virtual_device_count([DeviceSpec.accelerator(3)], [DeviceSpec.cpu()]),
        driver.calculate_virtual_device_count(),
        driver.calculate_virtual_device_count_from_cli("gpu:0,2", [5], "gpu"),
        driver.calculate_virtual_device_count_from_cli("gpu"),
        driver.calculate_virtual_device_count_from_cli("gpu:all"),
    ] == REF["dev.virtual_counts"].tolist()
    assert [
        str(driver.get_virtual_device_count()), str(driver.is_virtual_device_mode()), driver.get_virtual_device_api(),
        driver.get_virtual_device_target_arch(), driver.get_virtual_cpu_target(),
    ] == ref("dev.virtual_getters")
    with driver.launch_trace() as entries:
        Buffer(DType.float32, [4]).inplace_copy_from(Buffer.from_numpy(np.ones(4, np.float32)))
    assert len(entries) == REF["dev.launch_trace_len_cpu"]
    assert driver.SymmetricPool.is_supported([CPU()]) is False and driver.SymmetricPool.lookup([CPU()]) is None
    assert issubclass(driver.HostHazardError, RuntimeError)
    assert isinstance(np.zeros(2), driver.DLPackArray) and not isinstance([1], driver.DLPackArray)
    driver.set_virtual_device_count(0)  # off: what it already is
    driver.set_virtual_cpu_target("")
    driver.enable_all_peer_access()


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: driver.set_virtual_device_count(2), "set_virtual_device_count"),
        (lambda: driver.set_virtual_device_api("cuda"), "set_virtual_device_api"),
        (lambda: driver.set_virtual_device_target_arch("sm_90"), "set_virtual_device_target_arch"),
        (lambda: driver.set_virtual_cpu_target("x86-64-v3"), "set_virtual_cpu_target"),
        (lambda: driver.CompletionFlag(CPU()), "CompletionFlag"),
        (lambda: driver.SymmetricPool.allocate([CPU(), CPU()], 64), "SymmetricPool.allocate"),
        (lambda: CPU().default_queue.wait_for_host_value(None, 1), "wait_for_host_value"),
        (lambda: driver.DeviceEvent(CPU()).elapsed_time(driver.DeviceEvent(CPU())), "DeviceEvent.elapsed_time"),
    ],
)
def test_refusals_name_themselves(call, name):
    with pytest.raises(NotImplementedError, match=name):
        call()


def test_staging_on_an_accelerator_and_constructors_max_forbids():
    with pytest.raises(TypeError, match="no constructor"):
        driver.LaunchTraceEntry()
    with pytest.raises(TypeError, match="no constructor"):
        driver.SymmetricPool()
    if driver.accelerator_count():  # only with an accelerator
        with pytest.raises(NotImplementedError, match="Usage.STAGING"):
            Buffer(DType.float32, [2], Accelerator(), Usage.STAGING)
    if not driver.accelerator_count():
        with pytest.raises(ValueError, match='No supported "gpu" device'):
            Accelerator()


def test_device_buffers_move_between_devices():
    cpus = jax.devices("cpu")
    b = Buffer.from_numpy(np.arange(4, dtype=np.int32))
    if driver.accelerator_count():
        acc = Accelerator()
        on = b.to(acc)
        assert on.device == acc and not on.is_host and on._jax is not None
        back = on.to(CPU())
        assert back.is_host and back._host is not None
        np.testing.assert_array_equal(back.to_numpy(), np.arange(4))
    else:
        assert b.to(Device(cpus[0])) is b


def test_from_dlpack_bfloat16_producer():
    """A CPU DLPack producer of bfloat16 (torch in MAX's test; here any object that exports a
    capsule): NumPy's DLPack has no bfloat16, so the buffer comes in through jax.dlpack."""

    class Producer:  # not a jax.Array: exercises the generic DLPack path
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    values = np.array([1.5, -2.25, np.nan], ml_dtypes.bfloat16)
    b = Buffer.from_dlpack(Producer(jnp.asarray(values)))
    assert b.dtype == DType.bfloat16
    assert b[0].item() == 1.5 and b[1].item() == -2.25 and np.isnan(b[2].item())
