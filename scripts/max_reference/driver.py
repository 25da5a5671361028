"""MAX 26.7's ``max.driver`` and ``max.engine`` behaviour on the CPU: Buffer values, views,
strides and slices, device answers, error messages, and a loaded model's metadata.

Keys: ``buf.*`` (Buffer), ``dev.*`` (devices), ``err.*`` (MAX's error messages, text),
``eng.*`` (engine), ``sd.*`` (``Module.state_dict`` value types). Text is stored as 0-d str arrays.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


def _err(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what we record
        return f"{type(e).__name__}: {e}"
    return "no error"


def build() -> dict[str, np.ndarray]:
    from max import driver, nn
    from max.driver import CPU, Buffer
    from max.dtype import DType
    from max.engine import InferenceSession
    from max.graph import DeviceRef, Graph, TensorType, Weight

    out: dict[str, np.ndarray] = {}
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = Buffer.from_numpy(a)
    out["buf.a"] = a.copy()
    out["buf.shares_from_numpy"] = np.asarray(np.shares_memory(b.to_numpy(), a))
    out["buf.col1"] = b[:, 1].to_numpy()
    out["buf.col1_strides"] = np.asarray(b[:, 1].strides)
    out["buf.col1_contiguous"] = np.asarray(b[:, 1].is_contiguous)
    out["buf.col1_shares"] = np.asarray(np.shares_memory(b[:, 1].to_numpy(), a))
    out["buf.row1"] = b[1, :].to_numpy()
    out["buf.row1_contiguous"] = np.asarray(b[1, :].is_contiguous)
    out["buf.item_1_2"] = np.asarray(b[1, 2].item())
    out["buf.item_rank"] = np.asarray(b[1, 2].rank)
    out["buf.list_index_rank"] = np.asarray(b[[0, 1]].rank)
    r1 = Buffer.from_numpy(np.arange(4.0, dtype=np.float32))
    out["buf.step2"] = r1[::2].to_numpy()
    out["buf.step2_strides"] = np.asarray(r1[::2].strides)
    out["buf.step2_contiguous"] = np.asarray(r1[::2].is_contiguous)
    out["buf.neg1_item"] = np.asarray(r1[-1].item())
    out["buf.view_int32"] = b.view(DType.int32).to_numpy()
    out["buf.view_int32_shares"] = np.asarray(np.shares_memory(b.view(DType.int32).to_numpy(), a))
    out["buf.view_uint8_shape"] = np.asarray(b.view(DType.uint8).shape)
    out["buf.view_3x2"] = b.view(DType.float32, [3, 2]).to_numpy()
    out["buf.view_bool"] = Buffer.from_numpy(np.array([1, 0], np.uint8)).view(DType.bool).to_numpy()
    z = np.zeros((2, 3), np.float32)
    zb = Buffer.from_numpy(z)
    zb[1, 1] = 9
    zb[0, 0] = np.float32(3)
    view = zb[1, :]
    view[2] = 4.0
    out["buf.setitem_numpy_after"] = z.copy()  # writes through the buffer and its view reach the array
    d = Buffer(DType.float32, [3, 2])
    d.inplace_copy_from(b)
    out["buf.inplace_copy_reshaped"] = d.to_numpy()
    out["buf.contiguous_col1"] = b[:, 1].contiguous().to_numpy()
    out["buf.contiguous_shares"] = np.asarray(np.shares_memory(b.contiguous().to_numpy(), a))
    out["buf.copy_shares"] = np.asarray(np.shares_memory(b.copy().to_numpy(), a))
    out["buf.to_same_is_self"] = np.asarray(b.to(CPU()) is b)
    out["buf.scalar_f32"] = Buffer.scalar(3, DType.float32).to_numpy()
    out["buf.scalar_bool"] = np.asarray(Buffer.scalar(True, DType.bool).item())
    out["buf.scalar_bf16_item"] = np.asarray(Buffer.scalar(1.5, DType.bfloat16).item())
    out["buf.num_elements_rank0"] = np.asarray(Buffer.scalar(3, DType.float32).num_elements)
    out["buf.element_size_bf16"] = np.asarray(Buffer(DType.bfloat16, [1]).element_size)
    out["buf.zeros"] = Buffer.zeros([2, 2], DType.int32).to_numpy()
    out["buf.zeros_staging_usage"] = np.asarray(str(Buffer.zeros([2], DType.float32, CPU(), driver.Usage.STAGING).usage))
    out["buf.usage_default"] = np.asarray(str(b.usage))
    out["buf.pinned"] = np.asarray(b.pinned)
    out["buf.stream"] = np.asarray(repr(b.stream))
    out["buf.repr"] = np.asarray(repr(b))
    out["buf.str"] = np.asarray(str(b))
    out["buf.dlpack_device"] = np.asarray(b.__dlpack_device__())
    out["buf.from_dlpack_copy_true_shares"] = np.asarray(np.shares_memory(Buffer.from_dlpack(a, copy=True).to_numpy(), a))
    ro = np.zeros(3, np.float32)
    ro.setflags(write=False)
    out["buf.readonly_shares"] = np.asarray(np.shares_memory(Buffer.from_numpy(ro).to_numpy(), ro))
    out["buf.noncontig_from_numpy_shares"] = np.asarray(np.shares_memory(Buffer.from_numpy(a[:, 1]).to_numpy(), a))
    with tempfile.TemporaryDirectory() as td:
        p = os.path.join(td, "x.bin")
        np.arange(10, dtype=np.float32).tofile(p)
        out["buf.mmap_offset8"] = Buffer.mmap(p, DType.float32, [2, 4], offset=8).to_numpy()
        m = Buffer.mmap(p, DType.float32, [10], mode="r+")
        m[0] = 100.0
        del m
        out["buf.mmap_rplus_file"] = np.fromfile(p, np.float32)
        out["err.load_max_buffer"] = np.asarray(_err(lambda: driver.load_max_buffer(p)).replace(p, "PATH"))

    out["err.item"] = np.asarray(_err(lambda: b.item()))
    out["err.oob"] = np.asarray(_err(lambda: r1[7]))
    out["err.view_bytes"] = np.asarray(_err(lambda: b.view(DType.float32, [4, 2])))
    out["err.view_larger"] = np.asarray(_err(lambda: Buffer.from_numpy(np.zeros((2, 3), np.uint8)).view(DType.float32)))
    out["err.copy_dtype"] = np.asarray(_err(lambda: Buffer(DType.int32, [2, 3]).inplace_copy_from(b)))
    out["err.copy_size"] = np.asarray(_err(lambda: Buffer(DType.float32, [2, 2]).inplace_copy_from(b)))
    out["err.from_dlpack_noncontig"] = np.asarray(_err(lambda: Buffer.from_dlpack(a[:, 1])))
    out["err.batch_len"] = np.asarray(_err(lambda: driver.batch_inplace_copy([b], [])))
    out["err.arch_cpu"] = np.asarray(_err(lambda: CPU().architecture_name))
    out["err.devicespec_neg_gpu"] = np.asarray(_err(lambda: driver.DeviceSpec(-1, "gpu")))
    out["err.load_missing_gpu"] = np.asarray(_err(lambda: driver.load_devices([driver.DeviceSpec.accelerator()])))

    cpu = CPU()
    out["dev.repr"] = np.asarray(repr(cpu))
    out["dev.label_api_model"] = np.asarray([cpu.label, cpu.api, cpu.model_name])
    out["dev.flags"] = np.asarray([cpu.is_host, cpu.is_host_unified, cpu.is_compatible, cpu.can_access(cpu)])
    out["dev.stats_keys"] = np.asarray(sorted(cpu.stats))
    out["dev.queue_repr"] = np.asarray(repr(cpu.default_queue))
    out["dev.native_stream_handle"] = np.asarray(cpu.default_queue.native_stream_handle)
    out["dev.scan"] = np.asarray(repr(driver.scan_available_devices()))
    out["dev.accelerator_api"] = np.asarray(driver.accelerator_api())
    out["dev.devices_exist"] = np.asarray(
        [driver.devices_exist([driver.DeviceSpec.cpu()]), driver.devices_exist([driver.DeviceSpec.accelerator()])]
    )
    out["dev.virtual_counts"] = np.asarray([
        driver.calculate_virtual_device_count([driver.DeviceSpec.accelerator(3)], [driver.DeviceSpec.cpu()]),
        driver.calculate_virtual_device_count(),
        driver.calculate_virtual_device_count_from_cli("gpu:0,2", [5], "gpu"),
        driver.calculate_virtual_device_count_from_cli("gpu"),
        driver.calculate_virtual_device_count_from_cli("gpu:all"),
    ])  # fmt: skip
    out["dev.virtual_getters"] = np.asarray([
        str(driver.get_virtual_device_count()), str(driver.is_virtual_device_mode()), driver.get_virtual_device_api(),
        driver.get_virtual_device_target_arch(), driver.get_virtual_cpu_target(),
    ])  # fmt: skip
    with driver.launch_trace() as entries:
        Buffer(DType.float32, [4]).inplace_copy_from(Buffer.from_numpy(np.ones(4, np.float32)))
    out["dev.launch_trace_len_cpu"] = np.asarray(len(entries))
    out["dev.usage_members"] = np.asarray([str(u) for u in (driver.Usage.DEFAULT, driver.Usage.STAGING, driver.Usage.UNTRACKED,
                                                           driver.Usage.STAGING | driver.Usage.UNTRACKED)])  # fmt: skip

    # engine: one graph with a symbolic dim, a weight and two outputs
    w = Weight("w", DType.float32, [3], DeviceRef.CPU())
    in_types = [TensorType(DType.float32, ["batch", 3], DeviceRef.CPU()), TensorType(DType.int32, [2], DeviceRef.CPU())]
    with Graph("probe", input_types=in_types) as g:
        x, y = g.inputs
        g.output(x.tensor + w, y.tensor * 2)
    session = InferenceSession(devices=[CPU()])
    model = session.init(session.compile(g), weights_registry={"w": np.full(3, 0.5, np.float32)})
    xs = np.arange(6, dtype=np.float32).reshape(2, 3)
    ys = np.array([3, -4], np.int32)
    o0, o1 = model(xs, input1=ys)
    out["eng.x"], out["eng.y"], out["eng.out0"], out["eng.out1"] = xs, ys, o0.to_numpy(), o1.to_numpy()
    out["eng.session_repr"] = np.asarray(repr(session))
    out["eng.session_devices"] = np.asarray(repr(session.devices))
    out["eng.compiled_repr"] = np.asarray(repr(session.compile(g)))
    out["eng.model_repr"] = np.asarray(repr(model))
    out["eng.name"] = np.asarray(model.name)
    out["eng.signature"] = np.asarray(str(model.signature))
    out["eng.devices"] = np.asarray(repr([model.devices, model.input_devices, model.output_devices]))
    out["eng.spec_str"] = np.asarray([str(s) for s in model.input_metadata + model.output_metadata])
    out["eng.spec_repr"] = np.asarray([repr(s) for s in model.input_metadata + model.output_metadata])
    out["err.call_kw"] = np.asarray(_err(lambda: model(xs, foo=ys)))
    out["err.noncontig"] = np.asarray(_err(lambda: model.execute(np.ones((3, 2), np.float32).T, ys)))
    out["err.print_style"] = np.asarray(_err(lambda: session.set_debug_print_options("WRONG")))
    out["err.print_binary"] = np.asarray(_err(lambda: session.set_debug_print_options("BINARY")))
    out["err.split_k"] = np.asarray(_err(lambda: session.set_split_k_reduction_precision("X")))
    out["err.log_level"] = np.asarray(_err(lambda: session.set_mojo_log_level("X")))
    out["err.graph_key"] = np.asarray([_err(lambda: model.release_captured_graph(-1)),
                                       _err(lambda: model.release_captured_graph("a"))])  # fmt: skip

    # Module.state_dict(): zero-filled values are Buffers; loaded NumPy arrays come back as they were
    lin = nn.Linear(3, 2, DType.float32, DeviceRef.CPU())
    zero = lin.state_dict()["weight"]
    out["sd.zero_type"] = np.asarray(type(zero).__name__)
    out["sd.zero_values"] = zero.to_numpy()
    out["sd.zero_is_kept"] = np.asarray(lin.state_dict()["weight"] is zero)
    lin.load_state_dict({"weight": np.ones((2, 3), np.float32)})
    out["sd.numpy_type"] = np.asarray(type(lin.state_dict()["weight"]).__name__)
    return out
