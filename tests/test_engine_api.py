"""``maxjax.engine``'s MAX 26.7 surface (``Model``, ``InferenceSession``, ``TensorSpec``,
``CompiledModel`` and the rest of ``max.engine``) against what MAX printed and returned for the
same graph (``scripts/max_reference/driver.py``), and each refusal."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from max_reference import load

import maxjax.engine as engine
from maxjax import nn
from maxjax.driver import CPU, Buffer
from maxjax.dtype import DType
from maxjax.engine import CompiledModel, InferenceSession, PrintStyle, TensorSpec
from maxjax.graph import DeviceRef, Graph, TensorType, Weight

REF = load("driver")


def ref(key: str):
    return REF[key].tolist()


def err(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "no error"


def _graph() -> Graph:
    w = Weight("w", DType.float32, [3], DeviceRef.CPU())
    in_types = [TensorType(DType.float32, ["batch", 3], DeviceRef.CPU()), TensorType(DType.int32, [2], DeviceRef.CPU())]
    with Graph("probe", input_types=in_types) as g:
        x, y = g.inputs
        g.output(x.tensor + w, y.tensor * 2)
    return g


@pytest.fixture(scope="module")
def loaded():
    session = InferenceSession(devices=[CPU()])
    g = _graph()
    return session, g, session.init(session.compile(g), weights_registry={"w": np.full(3, 0.5, np.float32)})


def test_every_max_engine_name_is_present():
    max_names = [
        "ArtifactBodyMismatch", "CompilationStopped", "CompileOnlyExecutionError", "CompileOnlyModel", "CompiledModel",
        "DebugConfig", "InferenceSession", "LogLevel", "MefStore", "MissingArtifactError", "Model", "PrintStyle",
        "TensorSpec", "read",
    ]  # fmt: skip  (MAX 26.7's public max.engine names)
    assert [n for n in max_names if not hasattr(engine, n)] == []
    for name in ["compile", "compile_async", "compile_reusing_mefs", "debug", "default_mef_store", "devices",
                 "enable_per_tensor_fp8_quantize", "gpu_profiling", "init", "init_all", "load", "load_all",
                 "set_debug_print_options", "set_mojo_assert_level", "set_mojo_log_level",
                 "set_split_k_reduction_precision", "use_fi_topk_kernel"]:  # fmt: skip
        assert hasattr(InferenceSession, name), name
    for name in ["capture", "debug_verify_replay", "devices", "execute", "input_devices", "input_metadata",
                 "kernel_summaries", "name", "output_devices", "output_metadata", "release_captured_graph",
                 "release_weights", "reload", "replay", "signature"]:  # fmt: skip
        assert hasattr(engine.Model, name), name


def test_model_runs_and_describes_itself_as_max(loaded):
    session, g, model = loaded
    o0, o1 = model(REF["eng.x"], input1=REF["eng.y"])
    np.testing.assert_allclose(o0.to_numpy(), REF["eng.out0"], rtol=1e-6)
    np.testing.assert_array_equal(o1.to_numpy(), REF["eng.out1"])
    assert repr(session) == ref("eng.session_repr").replace("modular", "maxjax")
    assert repr(session.devices) == ref("eng.session_devices")
    assert repr(session.compile(g)) == ref("eng.compiled_repr")
    assert repr(model) == ref("eng.model_repr")
    assert model.name == ref("eng.name")
    assert isinstance(model.signature, inspect.Signature) and str(model.signature) == ref("eng.signature")
    assert repr([model.devices, model.input_devices, model.output_devices]) == ref("eng.devices")
    specs = model.input_metadata + model.output_metadata
    assert all(isinstance(s, TensorSpec) for s in specs)
    assert [str(s) for s in specs] == ref("eng.spec_str")
    assert [repr(s) for s in specs] == ref("eng.spec_repr")
    assert specs[0].shape == [None, 3] and specs[0].dtype is DType.float32 and specs[0].name == "input0"


def test_model_input_errors_as_max(loaded):
    _, _, model = loaded
    x, y = REF["eng.x"], REF["eng.y"]
    assert err(lambda: model(x, foo=y)) == ref("err.call_kw")
    assert err(lambda: model.execute(np.ones((3, 2), np.float32).T, y)) == ref("err.noncontig")
    with pytest.raises(ValueError, match="non-contiguous"):
        model.execute(Buffer.from_numpy(np.ones((2, 6), np.float32))[:, ::2], y)
    assert model.execute(Buffer.from_numpy(x), Buffer.from_numpy(y))[1].to_numpy().tolist() == REF["eng.out1"].tolist()


def test_scalar_inputs_take_the_inputs_dtype():
    with Graph("scale", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU()), TensorType(DType.float32, [], DeviceRef.CPU())]) as g:
        a, s = g.inputs
        g.output(a.tensor * s.tensor)
    model = InferenceSession().load(g)
    np.testing.assert_array_equal(model.execute(np.array([1.0, 2.0], np.float32), 3)[0].to_numpy(), [3.0, 6.0])
    with Graph("shift", input_types=[TensorType(DType.int32, [], DeviceRef.CPU())]) as g:
        g.output(g.inputs[0].tensor + 1)
    shift = InferenceSession().load(g)
    assert shift.execute(np.int32(4))[0].item() == 5 and shift.execute(True)[0].item() == 2
    with pytest.raises(TypeError, match="float value cannot be held by an integer"):
        shift.execute(2.5)


def test_reload_load_all_init_all_and_graph_keys(loaded):
    session, g, model = loaded
    fresh = session.load(g, weights_registry={"w": np.zeros(3, np.float32)})
    fresh.reload({"w": np.full(3, 2.0, np.float32)})
    np.testing.assert_array_equal(fresh.execute(np.zeros((1, 3), np.float32), REF["eng.y"])[0].to_numpy(), [[2.0, 2.0, 2.0]])
    fresh.release_weights()  # nothing kept on the host: the model still runs
    np.testing.assert_array_equal(fresh.execute(np.zeros((1, 3), np.float32), REF["eng.y"])[0].to_numpy(), [[2.0, 2.0, 2.0]])
    assert list(session.load_all(g, weights_registry={"w": np.ones(3, np.float32)})) == ["probe"]
    compiled = session.compile_async(g)
    assert isinstance(compiled, CompiledModel) and isinstance(session.compile_reusing_mefs(g), CompiledModel)
    assert list(session.init_all(compiled, weights_registry={"w": np.ones(3, np.float32)})) == ["probe"]
    model.release_captured_graph([1, 2])  # never captured: a no-op, as in MAX
    assert [err(lambda: model.release_captured_graph(-1)), err(lambda: model.release_captured_graph("a"))] == ref("err.graph_key")
    with pytest.raises(ValueError, match="Weight 'w' is not in the weights registry"):
        session.init(compiled)


def test_session_options_validate_as_max_then_refuse(loaded):
    session, _, _ = loaded
    assert err(lambda: session.set_debug_print_options("WRONG")) == ref("err.print_style")
    assert err(lambda: session.set_debug_print_options("BINARY")) == ref("err.print_binary")
    assert err(lambda: session.set_split_k_reduction_precision("X")) == ref("err.split_k")
    assert err(lambda: session.set_mojo_log_level("X")) == ref("err.log_level")
    session.set_debug_print_options()  # COMPACT: what jax.debug.print does
    session.set_debug_print_options(PrintStyle.COMPACT)
    session.set_mojo_log_level("NOTSET")
    session.set_mojo_assert_level("none")
    session.gpu_profiling("off")
    session.use_fi_topk_kernel("off")
    session.enable_per_tensor_fp8_quantize("0")
    assert session.debug.nan_check is False and InferenceSession.debug is session.debug
    session.debug.nan_check = False
    assert session.num_threads is None and InferenceSession.default_mef_store is None


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda s, m: s.set_debug_print_options("FULL", 3), "set_debug_print_options"),
        (lambda s, m: s.set_split_k_reduction_precision("ACCUM"), "set_split_k_reduction_precision"),
        (lambda s, m: s.set_mojo_log_level("DEBUG"), "set_mojo_log_level"),
        (lambda s, m: s.set_mojo_assert_level("all"), "set_mojo_assert_level"),
        (lambda s, m: s.gpu_profiling("detailed"), "gpu_profiling"),
        (lambda s, m: s.use_fi_topk_kernel("on"), "use_fi_topk_kernel"),
        (lambda s, m: s.enable_per_tensor_fp8_quantize("1"), "enable_per_tensor_fp8_quantize"),
        (lambda s, m: setattr(s.debug, "nan_check", True), "nan_check"),
        (lambda s, m: m.capture(1, Buffer.from_numpy(np.ones((2, 3), np.float32))), "capture"),
        (lambda s, m: m.replay(1), "replay"),
        (lambda s, m: m.debug_verify_replay(1), "debug_verify_replay"),
        (lambda s, m: m.kernel_summaries, "kernel_summaries"),
        (lambda s, m: s.compile(_graph()).export_mef("x.mef"), "export_mef"),
        (lambda s, m: engine.read("x.mef"), "read"),
        (lambda s, m: engine.MefStore(), "MefStore"),
        (lambda s, m: InferenceSession(precompiled_mefs="d"), "precompiled_mefs"),
        (lambda s, m: s.load(_graph(), custom_extensions=["k.mojo"]), "custom_extensions"),
    ],
)
def test_refusals_name_themselves(loaded, call, name):
    session, _, model = loaded
    with pytest.raises(NotImplementedError, match=name):
        call(session, model)


def test_compile_only_model_refuses_everything():
    stand_in = engine.CompileOnlyModel("g", CompiledModel(None))
    with pytest.raises(engine.CompileOnlyExecutionError, match="execute"):
        stand_in.execute()
    with pytest.raises(engine.CompileOnlyExecutionError, match="input_metadata"):
        stand_in.input_metadata
    assert issubclass(engine.CompilationStopped, RuntimeError) and issubclass(engine.MissingArtifactError, RuntimeError)


def test_state_dict_zero_fills_with_max_buffers():
    lin = nn.Linear(3, 2, DType.float32, DeviceRef.CPU())
    zero = lin.state_dict()["weight"]
    assert type(zero).__name__ == ref("sd.zero_type")
    np.testing.assert_array_equal(zero.to_numpy(), REF["sd.zero_values"])
    assert (lin.state_dict()["weight"] is zero) == REF["sd.zero_is_kept"]
    lin.load_state_dict({"weight": np.ones((2, 3), np.float32)})
    assert type(lin.state_dict()["weight"]).__name__ == ref("sd.numpy_type")


def test_module_holds_several_graphs_compiled_together():
    """MAX 26.7's ``max.graph.Module`` (oracle run 2026-11-27): graphs built with ``module=m`` compile
    together; ``init_all``/``load_all`` give one model per graph; ``load``/``init`` of the artifact,
    or ``load`` of one of its graphs, refuse with MAX's words; an empty module compiles to ``{}``."""
    from maxjax.graph import Module

    m = Module()
    t = [TensorType(DType.float32, [2], DeviceRef.CPU())]
    g_a = Graph("a", forward=lambda x: x * 2, input_types=t, module=m)
    Graph("b", forward=lambda x: x + 1, input_types=t, module=m)
    assert m.top_level_graph_names() == ["a", "b"]
    session = InferenceSession(devices=[CPU()])
    compiled = session.compile(m)
    assert repr(compiled) == "CompiledModel()"
    models = session.init_all(compiled)
    x = np.array([1.0, 3.0], np.float32)
    np.testing.assert_array_equal(models["a"].execute(x)[0].to_numpy(), [2.0, 6.0])
    np.testing.assert_array_equal(models["b"].execute(x)[0].to_numpy(), [2.0, 4.0])
    assert set(session.load_all(g_a)) == {"a", "b"}  # a graph of a module loads its module
    with pytest.raises(ValueError, match=r"exactly one model in the compiled artifact, but got 2\. Use init_all"):
        session.init(compiled)
    with pytest.raises(ValueError, match=r"but got 2\. Use load_all"):
        session.load(g_a)
    assert session.init_all(session.compile(Module())) == {}
    with pytest.raises(ValueError, match="'a' is already in this Module"):  # MAX fails later, at compile
        Graph("a", forward=lambda x: x, input_types=t, module=m)
    with pytest.raises(RuntimeError):  # a graph whose forward fails does not join the module
        Graph("c", forward=lambda x: (_ for _ in ()).throw(RuntimeError("boom")), input_types=t, module=m)
    assert m.top_level_graph_names() == ["a", "b"]
    with pytest.raises(TypeError, match="takes a maxjax.graph.Module"):
        Graph("d", forward=lambda x: x, input_types=t, module="m")


def test_non_contiguous_weights_and_inputs_refused_as_max():
    """MAX refuses non-contiguous arrays in ``weights_registry`` (any key, used or not) and in
    ``execute`` with one message (``max.engine.api._raise_if_not_contiguous``)."""
    g = Graph("unity", forward=lambda x: x + 1, input_types=[TensorType(DType.float32, [4, 4], DeviceRef.CPU())])
    session = InferenceSession(devices=[CPU()])
    transposed = np.arange(16, dtype=np.float32).reshape(4, 4).T
    assert not transposed.flags.c_contiguous
    for load in (lambda: session.load(g, weights_registry={"extra": transposed}),
                 lambda: session.init(session.compile(g), weights_registry={"extra": transposed}),
                 lambda: session.init_all(session.compile(g), weights_registry={"extra": transposed}),
                 lambda: session.load(g).execute(transposed)):  # fmt: skip
        with pytest.raises(ValueError, match="non-contiguous tensors"):
            load()
    out = session.load(g).execute(np.ascontiguousarray(transposed))[0].to_numpy()
    np.testing.assert_array_equal(out, transposed + 1)
    from maxjax.engine.api import InferenceSession as ApiSession  # MAX's module path

    assert ApiSession is InferenceSession
