"""ops.custom / ops.inplace_custom: MAX 26.7's build-time checks (exception types and order observed
with MAX), and JAX kernels registered by name run in graph, eager and jit modes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.engine import InferenceSession, Program
from maxjax.graph import BufferType, BufferValue, DeviceRef, Graph, KernelLibrary, TensorType, ops, register_kernel
from maxjax.graph import graph as graph_module

CPU = DeviceRef.CPU()
T23 = TensorType(DType.float32, (2, 3), CPU)
B10 = BufferType(DType.float32, (10,), CPU)
RNG = np.random.default_rng(0)


def _scaled_add(x, y, *, scale: float, negate: bool = False):
    """A two-output kernel: (x * scale + y, -(x*scale+y) if negate else x - y)."""
    s = x * jnp.asarray(scale, x.dtype) + y
    return s, (-s if negate else x - y)


def _library() -> KernelLibrary:
    lib = KernelLibrary()
    lib.register("scaled_add", _scaled_add)

    @lib.register("accumulate")
    def accumulate(buf, x, *, times: int):  # in place: buf += times * x; also returns sum(buf_new)
        new = buf + x * jnp.asarray(times, buf.dtype)
        return new, jnp.sum(new, keepdims=True)

    @lib.register("cast_to")
    def cast_to(x, *, dtype: DType):
        return x.astype(dtype.to_jax())

    return lib


@pytest.fixture
def lib() -> KernelLibrary:
    return _library()


# -- MAX's build-time checks (each observed with MAX 26.7: same exception type) --------------------


def test_unregistered_and_empty_names_raise_value_error_saying_how_to_register(lib):
    with Graph("g", input_types=[T23], kernel_library=lib) as g:
        x = g.inputs[0]
        with pytest.raises(ValueError, match=r"no kernel registered for 'nope'.*register_kernel\('nope'\)"):
            ops.custom("nope", CPU, [x], [T23])
        with pytest.raises(ValueError, match="non-empty"):
            ops.custom("", CPU, [x], [T23])
        # MAX's built-in kernel names are not present (maxjax's ops are jnp functions)
        with pytest.raises(ValueError, match="no kernel registered for 'mo.add'"):
            ops.custom("mo.add", CPU, [x, x], [T23])
        # MAX checks the name after the inputs and parameters: no inputs / no outputs reach it
        with pytest.raises(ValueError, match="no kernel registered"):
            ops.custom("nope", CPU, [], [T23])
        with pytest.raises(ValueError, match="no kernel registered"):
            ops.custom("nope", CPU, [x], [])
        assert len(g._nodes) == 1  # only the input: failed ops leave the graph as it was
        assert g._kernel_library is lib and g.kernel_libraries_paths == []
        g.output(ops.cast(x, DType.float64))


def test_argument_checks_in_maxs_order(lib):
    with Graph("g", input_types=[T23, B10], kernel_library=lib) as g:
        x, buf = g.inputs
        with pytest.raises(TypeError, match="should use ops.inplace_custom"):
            ops.custom("scaled_add", CPU, [buf], [T23])
        for bad in ([1, 2], {"a": 1}, None, np.int64(3)):  # MAX: bool, int, float, str, DType only
            with pytest.raises(TypeError, match=r"unsupported parameter type .* for custom op"):
                ops.custom("nope", CPU, [x], [T23], parameters={"p": bad})  # before the name check
        with pytest.raises(TypeError, match="values must be a sequence"):
            ops.custom("scaled_add", CPU, None, [T23])
        with pytest.raises(TypeError, match="out_types must be a sequence"):
            ops.custom("scaled_add", CPU, [x], None)
        with pytest.raises(ValueError, match=r"values\[0\] must be a tensor value"):
            ops.custom("scaled_add", CPU, [1.0], [T23])  # MAX: ValueError (operand is not a Value)
        with pytest.raises(TypeError, match="expected a Device"):
            ops.custom("scaled_add", "cpu", [x], [T23])
        for values in ([x], [], None):
            with pytest.raises(TypeError, match="BufferValue|values must be a sequence"):
                ops.inplace_custom("accumulate", CPU, values)
        with pytest.raises(TypeError, match="unsupported parameter type <class 'dict'>"):
            ops.inplace_custom("nope", CPU, [buf], parameters={"p": {"a": 1}})
        with pytest.raises(ValueError, match="no kernel registered for 'nope'"):
            ops.inplace_custom("nope", CPU, [buf], out_types=[T23])
        with pytest.raises(ValueError, match="on device=gpu:0"):
            ops.custom("scaled_add", DeviceRef.GPU(), [x, x], [T23, T23], parameters={"scale": 1.0})
        assert len(g._nodes) == 2 and buf._current is g.inputs[1]._current


def test_kernel_outputs_are_checked_against_out_types(lib):
    with Graph("g", input_types=[T23], kernel_library=lib) as g:
        x = g.inputs[0]
        with pytest.raises(ValueError, match=r"kernel 'scaled_add' returned 2 value\(s\), expected 1"):
            ops.custom("scaled_add", CPU, [x, x], [T23], parameters={"scale": 2.0})
        i23 = TensorType(DType.int32, (2, 3), CPU)
        with pytest.raises(ValueError, match=r"output 1 of the kernel is DType.float32\[2, 3\], .* DType.int32\[2, 3\]"):
            ops.custom("scaled_add", CPU, [x, x], [T23, i23], parameters={"scale": 2.0})
        t32 = TensorType(DType.float32, (3, 2), CPU)
        with pytest.raises(ValueError, match=r"output 0 .* DType.float32\[2, 3\], the declared type is DType.float32\[3, 2\]"):
            ops.custom("cast_to", CPU, [x], [t32], parameters={"dtype": DType.float32})
        with pytest.raises(ValueError, match=r"ops.custom: scaled_add\(float32\[2, 3\], float32\[2, 3\]\) failed: .*'scale'"):
            ops.custom("scaled_add", CPU, [x, x], [T23, T23])  # the kernel needs `scale`
        assert len(g._nodes) == 1


def test_custom_extensions_and_mojo_paths_are_refused_naming_them():
    with pytest.raises(NotImplementedError, match=r"cannot load Mojo kernels \(\['ops.mojopkg'\]\).*register_kernel"):
        Graph("g", input_types=[T23], custom_extensions=["ops.mojopkg"])
    with pytest.raises(NotImplementedError, match="ops_dir"):
        KernelLibrary(["ops_dir"])
    from maxjax.graph import default_custom_extensions, default_custom_extensions_scope

    assert default_custom_extensions() == ()
    with default_custom_extensions_scope():  # no paths: nothing to load
        assert default_custom_extensions() == ()
    with pytest.raises(NotImplementedError, match=r"default_custom_extensions_scope\('a.mojopkg'\): .*Mojo"):
        with default_custom_extensions_scope("a.mojopkg"):
            pass


# -- registration ------------------------------------------------------------------------------


def test_registration_api():
    lib = KernelLibrary()
    assert "double" not in lib and list(lib) == []
    fn = lib.register("double", lambda x: x * 2)
    assert lib["double"] is fn and "double" in lib and lib.has_shape_function("double")
    lib.register("double", fn)  # the same function again is fine
    with pytest.raises(ValueError, match="'double' is already registered"):
        lib.register("double", lambda x: x + x)
    with pytest.raises(ValueError, match="non-empty"):
        lib.register("", fn)
    with pytest.raises(TypeError, match="callable"):
        lib.register("x", 3)
    with pytest.raises(KeyError):
        lib.has_shape_function("missing")
    assert "double" not in KernelLibrary()  # a library's own kernels are its own

    @register_kernel("test_ops_custom.triple")
    def triple(x):
        return x * 3

    try:
        assert "test_ops_custom.triple" in KernelLibrary() and list(lib) == ["double", "test_ops_custom.triple"]
        with Graph("g", input_types=[T23]) as g:  # every graph sees process-wide kernels
            g.output(ops.custom("test_ops_custom.triple", CPU, [g.inputs[0]], [T23])[0])
        x = RNG.standard_normal((2, 3)).astype(np.float32)
        np.testing.assert_array_equal(InferenceSession().load(g).execute(x)[0].to_numpy(), x * 3)
        # eagerly (no graph) on arrays: a plain JAX array, as other ops
        out = ops.custom("test_ops_custom.triple", CPU, [jnp.asarray(x)], [T23])
        assert isinstance(out, list) and isinstance(out[0], jax.Array)
        np.testing.assert_array_equal(np.asarray(out[0]), x * 3)
    finally:
        graph_module._GLOBAL_KERNELS.pop("test_ops_custom.triple")


# -- kernels run: graph, eager, jit -----------------------------------------------------------------


def _expected(x, y, scale, negate):
    s = x * np.float32(scale) + y
    return s, (-s if negate else x - y)


def test_custom_runs_in_a_graph_with_parameters_and_symbolic_dims(lib):
    t = TensorType(DType.float32, ["batch", 3], CPU)
    with Graph("g", input_types=[t, t], kernel_library=lib) as g:
        a, b = ops.custom("scaled_add", CPU, g.inputs, [t, t], parameters={"scale": 0.5, "negate": True})
        assert str(a.type) == str(t) and str(b.type) == str(t)
        bf16 = TensorType(DType.bfloat16, ["batch", 3], CPU)
        h = ops.custom("cast_to", CPU, [a], [bf16], parameters={"dtype": DType.bfloat16})[0]
        assert h.dtype == DType.bfloat16
        i64 = TensorType(DType.int64, ["batch", 3], CPU)  # int64 as MAX declares it, held in 32 bits without x64
        assert ops.custom("cast_to", CPU, [a], [i64], parameters={"dtype": DType.int64})[0].dtype == DType.int64
        g.output(a, b, h)
    model = InferenceSession().load(g)
    for n in (2, 5):
        x, y = (RNG.standard_normal((n, 3)).astype(np.float32) for _ in range(2))
        outs = [o.to_numpy() for o in model.execute(x, y)]
        want = _expected(x, y, 0.5, True)
        np.testing.assert_allclose(outs[0], want[0], rtol=1e-6)
        np.testing.assert_allclose(outs[1], want[1], rtol=1e-6)
        assert outs[2].dtype.name == "bfloat16"


def test_a_subgraph_uses_its_parents_kernel_library(lib):
    with Graph("main", input_types=[T23], kernel_library=lib) as g:
        with g.add_subgraph("sub", input_types=[T23]) as sub:
            assert sub._kernel_library is lib
            y = sub.inputs[0]
            sub.output(*ops.custom("scaled_add", CPU, [y, y], [T23, T23], parameters={"scale": 3.0}))
        g.output(*ops.call(sub, g.inputs[0]))
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    s, d = (o.to_numpy() for o in InferenceSession().load(g).execute(x))
    np.testing.assert_allclose(s, 4 * x, rtol=1e-6)
    np.testing.assert_array_equal(d, np.zeros_like(x))


def test_custom_eager_and_under_jit(lib):
    x, y = (RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    # eagerly there is no graph and so no graph library: a process-wide kernel
    register_kernel("test_ops_custom.scaled_add", lib["scaled_add"])
    try:
        want = _expected(x, y, 2.0, False)
        name, params = "test_ops_custom.scaled_add", {"scale": 2.0}
        eager = ops.custom(name, CPU, [jnp.asarray(x), jnp.asarray(y)], [T23, T23], parameters=params)
        jitted = jax.jit(
            lambda x, y: ops.custom("test_ops_custom.scaled_add", CPU, [x, y], [T23, T23], parameters={"scale": 2.0})
        )(x, y)
        for got in (eager, jitted):
            np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-6)
            np.testing.assert_allclose(np.asarray(got[1]), want[1], rtol=1e-6)
        with pytest.raises(ValueError, match=r"output 0 .* declared type is DType.float32\[3, 3\]"):
            ops.custom(name, CPU, [x, y], [TensorType(DType.float32, (3, 3), CPU), T23], parameters=params)
    finally:
        graph_module._GLOBAL_KERNELS.pop("test_ops_custom.scaled_add")


def _accumulate_graph(lib, out_types):
    x_t = TensorType(DType.float32, [4], CPU)
    with Graph("acc", input_types=[x_t, BufferType(DType.float32, [4], CPU)], kernel_library=lib) as g:
        x, buf = g.inputs
        outs = ops.inplace_custom("accumulate", CPU, [buf, x], out_types=out_types, parameters={"times": 3})
        g.output(ops.buffer_load(buf) * 1.0, *outs)
    return g


def test_inplace_custom_updates_the_buffer(lib):
    sum_t = TensorType(DType.float32, [1], CPU)
    g = _accumulate_graph(lib, [sum_t])
    model = InferenceSession().load(g)
    x = np.arange(4, dtype=np.float32)
    cache = Buffer.from_numpy(np.ones(4, np.float32))
    for step in (1, 2):
        seen, total = (o.to_numpy() for o in model.execute(x, cache))
        want = 1 + 3 * step * x
        np.testing.assert_array_equal(seen, want)  # the update is visible in the graph
        np.testing.assert_array_equal(cache.to_numpy(), want)  # and in the caller's Buffer
        np.testing.assert_allclose(total, [want.sum()], rtol=1e-6)
    # functional mode: the buffer's new value after the outputs
    prog = Program(g)
    *_, new_buf = jax.jit(prog.apply)(prog.prepare({}), x, np.zeros(4, np.float32))
    np.testing.assert_array_equal(np.asarray(new_buf), 3 * x)
    # eager: a BufferValue(array) is updated in place
    # eager: a BufferValue(array) is updated in place (no graph: a process-wide kernel)
    b = BufferValue(jnp.zeros(4, jnp.float32))
    register_kernel("test_ops_custom.accumulate", lib["accumulate"])
    try:
        (total,) = ops.inplace_custom("test_ops_custom.accumulate", CPU, [b, jnp.asarray(x)], [sum_t], {"times": 2})
        np.testing.assert_array_equal(np.asarray(ops.buffer_load(b).to_jax()), 2 * x)
        np.testing.assert_allclose(np.asarray(total.to_jax()), [2 * x.sum()], rtol=1e-6)
    finally:
        graph_module._GLOBAL_KERNELS.pop("test_ops_custom.accumulate")


def test_inplace_custom_checks_the_buffers_new_values(lib):
    lib.register("bad_update", lambda buf: buf[:2])
    with Graph("g", input_types=[B10], kernel_library=lib) as g:
        before = g.inputs[0]._current
        with pytest.raises(ValueError, match="missing"):
            ops.inplace_custom("accumulate", CPU, [g.inputs[0]], parameters={"times": 1})  # kernel needs x: fails
        with pytest.raises(ValueError, match=r"output 0 of the kernel is DType.float32\[2\], .* DType.float32\[10\]"):
            ops.inplace_custom("bad_update", CPU, [g.inputs[0]])
        assert g.inputs[0]._current is before and len(g._nodes) == 1  # buffer and graph as before
