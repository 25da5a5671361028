"""maxjax.experimental.tensor.Tensor (MAX 26.7's eager Tensor, one device): signatures, default
dtypes, constructors, methods and operators against NumPy on random data and against MAX 26.7's
observed values/dtypes/errors (``tests/data/max_reference/experimental_tensor.npz``), the printed
form, the ``default_*`` context managers, refused distributed arguments, and interop with graphs,
``InferenceSession`` and ``jax.jit``."""

from __future__ import annotations

import inspect
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from max_reference import load
from maxjax.driver import CPU, Buffer
from maxjax.dtype import DType
from maxjax.experimental import Tensor as PackageTensor
from maxjax.experimental import tensor as T
from maxjax.experimental.tensor import Tensor
from maxjax.graph import DeviceRef, Graph, Shape, TensorType, ops

REF = load("experimental_tensor")
RNG = np.random.default_rng(7)

# MAX 26.7's signatures (inspect.signature on max.experimental.tensor.Tensor), as
# (name, kind, default) per parameter; annotations left out.
_P, _K, _V = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_KEYWORD
_E = inspect.Parameter.empty
MAX_SIGNATURES = {  # fmt: skip
    "__init__": [("self", _P, _E), ("data", _P, None), ("dtype", _K, None), ("device", _K, None), ("storage", _K, None), ("state", _K, None)],
    "constant": [("value", _P, _E), ("dtype", _K, None), ("device", _K, None)],
    "zeros": [("shape", _P, _E), ("dtype", _K, None), ("device", _K, None)],
    "ones": [("shape", _P, _E), ("dtype", _K, None), ("device", _K, None)],
    "full": [("shape", _P, _E), ("value", _P, _E), ("dtype", _K, None), ("device", _K, None)],
    "arange": [("start", _P, 0), ("stop", _P, None), ("step", _P, 1), ("out_dim", _P, None), ("dtype", _K, None), ("device", _K, None)],
    "zeros_like": [("input", _P, _E)],
    "ones_like": [("input", _P, _E)],
    "full_like": [("input", _P, _E), ("value", _P, _E)],
    "range_like": [("input", _P, _E)],
    "from_dim": [("dim", _P, _E)],
    "from_dlpack": [("array", _P, _E)],
    "cast": [("self", _P, _E), ("dtype", _P, _E)],
    "to": [("self", _P, _E), ("target", _P, _E)],
    "reshape": [("self", _P, _E), ("shape", _P, _E)],
    "permute": [("self", _P, _E), ("dims", _P, _E)],
    "transpose": [("self", _P, _E), ("dim1", _P, _E), ("dim2", _P, _E)],
    "squeeze": [("self", _P, _E), ("axis", _P, _E)],
    "unsqueeze": [("self", _P, _E), ("axis", _P, _E)],
    "broadcast_to": [("self", _P, _E), ("shape", _P, _E)],
    "split": [("self", _P, _E), ("split_size_or_sections", _P, _E), ("axis", _P, 0)],
    "clip": [("self", _P, _E), ("min", _K, None), ("max", _K, None)],
    **{n: [("self", _P, _E), ("axis", _P, -1)] for n in ("sum", "mean", "max", "min", "prod", "argmax")},
    "item": [("self", _P, _E)],
    "to_numpy": [("self", _P, _E)],
    "num_elements": [("self", _P, _E)],
    "__dlpack__": [("self", _P, _E), ("stream", _P, None)],
}
MAX_MODULE_SIGNATURES = {
    "defaults": [("dtype", _P, None), ("device", _P, None)],
    "default_device": [("device", _P, _E)],
    "default_dtype": [("dtype", _P, _E)],
    "defaults_like": [("like", _P, _E)],
}


@pytest.fixture(autouse=True)
def _on_cpu():
    """MAX's reference was taken on the CPU (where the default dtype is float32; an accelerator's
    is bfloat16): pin the default device so the tests mean the same on a machine with a GPU."""
    with T.default_device(CPU()):
        yield


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_match_max():
    assert PackageTensor is Tensor
    for name, want in MAX_SIGNATURES.items():
        assert _params(getattr(Tensor, name)) == want, name
    for name, want in MAX_MODULE_SIGNATURES.items():
        assert _params(getattr(T, name)) == want, name


@pytest.mark.parametrize(
    "case, make",
    [
        ("float_list", lambda: Tensor([1.0, 2.0])),
        ("int_list", lambda: Tensor([1, 2, 3])),
        ("bool_list", lambda: Tensor([True, False])),
        ("int_scalar", lambda: Tensor(3)),
        ("np_int64", lambda: Tensor(np.array([1, 2]))),
        ("np_float64", lambda: Tensor(np.array([1.0, 2.0]))),
        ("np_int32", lambda: Tensor(np.array([1, 2], dtype=np.int32))),
        ("np_bool", lambda: Tensor(np.array([True]))),
        ("zeros", lambda: Tensor.zeros([2])),
        ("full_int", lambda: Tensor.full([2], 3)),
        ("from_dim", lambda: Tensor.from_dim(5)),
    ],
)
def test_default_dtypes_match_max(case, make):
    t = make()
    assert t.dtype.name == str(REF[f"default.{case}"])
    assert t.to_numpy().dtype == t.dtype.to_numpy()  # to_numpy gives the declared dtype (int64 too)


def test_default_dtype_context_matches_max():
    with T.default_dtype(DType.int32) as d:
        assert d is DType.int32
        assert Tensor([1, 2]).dtype.name == str(REF["default.ctx_int_list"])
        assert Tensor(np.array([1.0])).dtype.name == str(REF["default.ctx_np_float64"])  # arrays keep theirs
        assert Tensor.ones([2]).dtype.name == str(REF["default.ctx_ones"])
        with T.default_dtype(DType.bfloat16):
            assert Tensor.zeros([1]).dtype is DType.bfloat16
        assert Tensor([1]).dtype is DType.int32  # the inner scope is undone
    assert Tensor([1]).dtype is DType.float32
    assert T.defaults() == (DType.float32, CPU())
    assert T.defaults(DType.int8) == (DType.int8, CPU())
    assert T.defaults(device=CPU(1))[1] == CPU(1)
    with T.default_device(DeviceRef.CPU()) as dev:
        assert dev == CPU() and Tensor([1.0]).device == CPU()
    x = Tensor.zeros([1], dtype=DType.int16)
    with T.defaults_like(x):
        assert Tensor.ones([2]).dtype is DType.int16
    seen = []  # a ContextVar: another thread does not see this thread's default
    with T.default_dtype(DType.int8):
        th = threading.Thread(target=lambda: seen.append(Tensor([1], device=CPU()).dtype))
        th.start()
        th.join()
    assert seen == [DType.float32]
    with pytest.raises(TypeError, match="DType"):
        T.default_dtype("int32")


def test_properties():
    a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    t = Tensor(a)
    assert isinstance(t.shape, Shape) and t.shape == [2, 3, 4] and t.rank == 3
    assert t.type == TensorType(DType.float32, [2, 3, 4], DeviceRef.CPU())
    assert t.num_elements() == 24 and t.device == CPU() and t.real and t.state is None
    assert not t.is_distributed and t.num_shards == 1 and t.local_shards == (t,)
    assert isinstance(t.driver_tensor, Buffer) and t.storage.shape == (2, 3, 4)
    np.testing.assert_array_equal(t.driver_tensor.to_numpy(), a)
    np.testing.assert_array_equal(t.to_numpy(), a)
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    assert t.__dlpack_device__() == (1, 0)
    assert Tensor(2.5).item() == 2.5 and isinstance(Tensor(2.5).item(), float)
    assert Tensor([7], dtype=DType.int32).item() == int(REF["item.int32"])
    assert bool(Tensor([1.0])) and not bool(Tensor(0.0))
    assert t.materialize() is t and t.external_name is None

    async def realized():
        return (await t) is t and (await t.realize) is t

    import asyncio

    assert asyncio.run(realized())


def test_array_inputs_held_without_copy():
    j = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    t = Tensor(j)
    assert t.to_jax() is j and t.dtype is DType.float32
    assert Tensor.from_dlpack(t) is t
    np.testing.assert_array_equal(Tensor.from_dlpack(np.arange(3, dtype=np.int16)).to_numpy(), np.arange(3))
    b = Buffer.from_numpy(np.arange(4, dtype=np.int8))
    s = Tensor(storage=b)
    assert s.dtype is DType.int8 and s.to_numpy().tolist() == [0, 1, 2, 3]
    assert Tensor(b).dtype is DType.int8
    bf = Tensor([1.5, 2.0], dtype=DType.bfloat16)
    assert bf.dtype is DType.bfloat16 and bf.to_numpy().astype(np.float32).tolist() == [1.5, 2.0]


def test_int64_is_declared_and_range_checked():
    t = Tensor(np.array([1, -2, 3], dtype=np.int64))
    assert t.dtype is DType.int64 and t.to_numpy().dtype == np.int64
    assert t.to_jax().dtype == jnp.int32  # JAX without x64 holds 32 bits (README "64-bit dtypes")
    assert (t + 1).dtype is DType.int64 and (t + t).to_numpy().tolist() == [2, -4, 6]
    assert (t + Tensor(np.array([1, 1, 1], dtype=np.int32))).dtype is DType.int64
    # MAX's promotion on the declared dtypes, not the held 32-bit ones
    u = Tensor(np.array([7, 8, 9], dtype=np.uint32))
    s = t + u  # int64 + uint32 is int64 (uint32 + int32 would be refused)
    assert s.dtype is DType.int64 and s.to_numpy().tolist() == [8, 6, 12]
    f = Tensor(np.array([0.5, 1.5, 2.5])) * Tensor(np.array([2, 2, 2], dtype=np.int32))  # float64 * int32
    assert f.dtype is DType.float64 and f.to_numpy().tolist() == [1.0, 3.0, 5.0]
    assert (t / t).dtype is DType.float64 and (t == t).dtype is DType.bool
    with pytest.raises(ValueError, match="Unsafe cast"):
        t + Tensor([1.0])  # int64 + float32: MAX refuses
    with pytest.raises(ValueError, match="int64"):
        Tensor(np.array([2**40]))
    with pytest.raises(ValueError, match="int64"):
        Tensor([2**40], dtype=DType.int64)


def test_constructors_against_numpy():
    assert Tensor.zeros([2, 3], dtype=DType.int32).to_numpy().tolist() == np.zeros((2, 3), np.int32).tolist()
    np.testing.assert_array_equal(Tensor.ones((3,)).to_numpy(), np.ones(3, np.float32))
    np.testing.assert_array_equal(Tensor.full([2, 2], 7, dtype=DType.int8).to_numpy(), np.full((2, 2), 7, np.int8))
    np.testing.assert_array_equal(Tensor.full([2], 3).to_numpy(), REF["out.full"])
    ref = Tensor(RNG.standard_normal((2, 4)).astype(np.float32))
    for like, want in ((Tensor.zeros_like, 0), (Tensor.ones_like, 1)):
        got = like(ref)
        assert got.dtype is DType.float32 and got.shape == [2, 4] and (got.to_numpy() == want).all()
    assert Tensor.full_like(ref, 2.5).to_numpy().tolist() == [[2.5] * 4] * 2
    np.testing.assert_array_equal(Tensor.arange(5).to_numpy(), REF["out.arange"])
    assert Tensor.arange(5).dtype.name == str(REF["dtype.arange"])
    np.testing.assert_array_equal(Tensor.arange(1, 2, 0.25).to_numpy(), REF["out.arange_float"])
    np.testing.assert_array_equal(Tensor.arange(5, 0, -1, dtype=DType.int32).to_numpy(), np.arange(5, 0, -1))
    # MAX 26.7: a float interval that step does not divide gives the floor length; an integer one fails
    np.testing.assert_allclose(Tensor.arange(0, 0.3, 0.1).to_numpy(), REF["out.arange_floor"])
    assert str(REF["err.arange_int_nondivisible"]).startswith("RemoteCompileError")  # a RuntimeError
    with pytest.raises(RuntimeError, match="multiple of step"):
        Tensor.arange(0, 10, 3)
    i = Tensor(REF["in.i"])
    rl = Tensor.range_like(i)
    assert rl.dtype.name == str(REF["dtype.range_like"])
    np.testing.assert_array_equal(rl.to_numpy(), REF["out.range_like"])
    fd = Tensor.from_dim(5)
    assert fd.shape == [] and fd.item() == 5 and fd.device == CPU()
    with pytest.raises(ValueError, match="symbolic"):
        Tensor.from_dim("batch")
    with pytest.warns(DeprecationWarning, match="deprecated"):
        c = Tensor.constant([1, 2], dtype=DType.int32)
    assert c.dtype is DType.int32 and c.to_numpy().tolist() == [1, 2]


def _ref_out(case, got):
    assert got.dtype.name == str(REF[f"dtype.{case}"]), case
    assert list(got.shape) == REF[f"shape.{case}"].tolist(), case
    np.testing.assert_allclose(got.to_numpy(), REF[f"out.{case}"], rtol=1e-6, atol=1e-6, err_msg=case)


def test_methods_and_operators_match_max():
    x, i = Tensor(REF["in.x"]), Tensor(REF["in.i"])

    def setitem():
        y = Tensor(np.zeros((2, 3), dtype=np.float32))
        y[0] = Tensor(np.ones(3, dtype=np.float32))
        return y

    cases = {
        "setitem": setitem, "intdiv": lambda: i / i, "eq": lambda: x == x, "argmax": lambda: x.argmax(),
        "lt": lambda: x < 0.5, "getitem": lambda: x[1], "getitem2": lambda: x[:, 1:3], "mean_int": lambda: i.mean(),
        "floordiv": lambda: i // 2, "sum": lambda: x.sum(), "sum_none": lambda: x.sum(axis=None),
        "arange_floor": lambda: Tensor.arange(0, 0.3, 0.1),
    }  # fmt: skip
    for case, f in cases.items():
        _ref_out(case, f())
    for name, sections in (("split", [1, 2]), ("split_int", 2)):
        pieces = x.split(sections, axis=1)
        assert len(pieces) == len([k for k in REF if k.startswith(f"out.{name}.")]) == 2
        for n, piece in enumerate(pieces):
            np.testing.assert_array_equal(piece.to_numpy(), REF[f"out.{name}.{n}"])
    assert (x.cast(DType.float32) is x) == bool(REF["cast_same_is_self"])
    assert (x.to(CPU()) is x) == bool(REF["to_same_is_self"])


def test_methods_against_numpy():
    # every method and operator once on random data (the MAX-checked cases above are not repeated;
    # each new eager op compiles an XLA kernel, so the list is kept short)
    a = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    b = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    x, y = Tensor(a), Tensor(b)
    close = lambda got, want: np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-5, atol=1e-6)  # noqa: E731
    close(x.mean(axis=1), a.mean(axis=1, keepdims=True))
    close(x.max(axis=None), a.max().reshape(1))
    close(x.min(), a.min(axis=-1, keepdims=True))
    close(x.prod(axis=None), a.prod().reshape(1))
    close(x.sum(axis=0), a.sum(axis=0, keepdims=True))
    np.testing.assert_array_equal(x.argmax(axis=None).to_numpy(), [np.argmax(a)])
    np.testing.assert_array_equal(x.argmax(axis=0).to_numpy(), np.argmax(a, axis=0)[None])
    close(x.reshape([5, -1]), a.reshape(5, -1))
    close(x.permute([2, 0, 1]), a.transpose(2, 0, 1))
    close(x.transpose(0, 2), a.swapaxes(0, 2))
    close(x.T, a.swapaxes(-1, -2))
    close(x.unsqueeze(1), a[:, None])
    close(x[:, :1].squeeze(1), a[:, 0])
    close(x[0, 1:3, ::2], a[0, 1:3, ::2])
    close(x[..., None, -1], a[..., None, -1])
    close(Tensor(a[:, :1]).broadcast_to([3, 6, 5]), np.broadcast_to(a[:, :1], (3, 6, 5)))
    close(x.cast(DType.int32), a.astype(np.int32))
    assert [p.shape[2] for p in x.split(2, axis=-1)] == [2, 2, 1]
    close(x.split([1, 3], axis=1)[1], a[:, 1:])
    close(x + y, a + b)
    close(x - y, a - b)
    close(x * y, a * b)
    close(x / y, a / b)
    close(abs(x) ** y, np.abs(a) ** b)
    close(2.0 + x, 2 + a)
    close(2.0 - x, 2 - a)
    close(2.0 * x, 2 * a)
    close(2.0 / x, 2 / a)
    q, r = divmod(x, y)
    close(q, np.floor_divide(a, b))
    close(r, np.mod(a, b))
    close(Tensor(a[0]) @ Tensor(b[0].T), a[0] @ b[0].T)
    close(abs(x), np.abs(a))
    close(-x, -a)
    close(x.clip(min=-0.5, max=0.5), np.clip(a, -0.5, 0.5))
    for op, f in (("__eq__", np.equal), ("__ne__", np.not_equal), ("__lt__", np.less), ("__le__", np.less_equal),
                  ("__gt__", np.greater), ("__ge__", np.greater_equal)):  # fmt: skip
        got = getattr(x, op)(y)
        assert got.dtype is DType.bool
        np.testing.assert_array_equal(got.to_numpy(), f(a, b))
    p, q2 = x > 0, y > 0
    np.testing.assert_array_equal((p & q2).to_numpy(), (a > 0) & (b > 0))
    np.testing.assert_array_equal((p | q2).to_numpy(), (a > 0) | (b > 0))
    np.testing.assert_array_equal((p ^ q2).to_numpy(), (a > 0) ^ (b > 0))
    np.testing.assert_array_equal((~p).to_numpy(), ~(a > 0))
    np.testing.assert_array_equal((True & p).to_numpy(), a > 0)
    ints = RNG.integers(1, 9, (4,)).astype(np.int32)
    it = Tensor(ints)
    np.testing.assert_array_equal((7 // it).to_numpy(), 7 // ints)
    np.testing.assert_array_equal((7 % it).to_numpy(), 7 % ints)
    np.testing.assert_array_equal((2**it).to_numpy(), 2**ints)
    np.testing.assert_array_equal((it + 2).to_numpy(), ints + 2)
    np.testing.assert_array_equal((it % 3).to_numpy(), ints % 3)
    np.testing.assert_array_equal(abs(-it).to_numpy(), ints)
    assert (it + 2).dtype is DType.int32 and (it % 3).dtype is DType.int32


def test_setitem_is_a_functional_update():
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    t = Tensor(a)
    before = t.to_jax()
    t[1:, 2] = Tensor(np.array([5.0, 6.0], dtype=np.float32))
    want = a.copy()
    want[1:, 2] = [5.0, 6.0]
    np.testing.assert_array_equal(t.to_numpy(), want)
    np.testing.assert_array_equal(np.asarray(before), a)  # the old array is unchanged (immutable)


def test_promotion_matches_max():
    x, i = Tensor(REF["in.x"]), Tensor(REF["in.i"])
    assert (Tensor([1.0], dtype=DType.bfloat16) + Tensor([1.0])).dtype is DType.float32
    assert (Tensor([1], dtype=DType.int8) + Tensor([1], dtype=DType.int32)).dtype is DType.int32
    assert (Tensor([1], dtype=DType.uint8) * 3).dtype is DType.uint8
    assert (i / 2).dtype.name == str(REF["dtype.intdiv"])  # integer / integer is float64 in MAX
    for case, f in (("add_int_float", lambda: x + i), ("add_pyfloat_int", lambda: i + 1.5)):
        want = str(REF[f"err.{case}"]).split(":")[0]
        with pytest.raises(Exception) as e:
            f()
        assert type(e.value).__name__ == want, (case, e.value)


@pytest.mark.parametrize(
    "case, f",
    [
        ("conflict", lambda x: Tensor(np.array([1, 2], dtype=np.int32), dtype=DType.float32)),
        ("ragged", lambda x: Tensor([[1, 2], [3]])),
        ("range", lambda x: Tensor([300], dtype=DType.int8)),
        ("float_to_int", lambda x: Tensor([1.5], dtype=DType.int32)),
        ("empty", lambda x: Tensor()),
        ("item_many", lambda x: x.item()),
        ("bool_many", lambda x: bool(x)),
        ("reshape_bad", lambda x: x.reshape([4])),
        ("squeeze_bad", lambda x: x.squeeze(0)),
        ("permute_bad", lambda x: x.permute([0])),
        ("transpose_1d", lambda x: Tensor([1.0, 2.0]).T),
        ("sum_badaxis", lambda x: x.sum(5)),
        ("and_float", lambda x: x & x),
        ("invert_float", lambda x: ~x),
        ("setitem_scalar", lambda x: x.__setitem__(0, 1.0)),
    ],
)
def test_errors_match_max(case, f):
    x = Tensor(REF["in.x"])
    want = str(REF[f"err.{case}"])
    if want == "no error":
        f(x)
        return
    with pytest.raises(Exception) as e:
        f(x)
    assert type(e.value).__name__ == want.split(":")[0], (case, want, e.value)


def test_repr_matches_max():
    x, i = Tensor(REF["in.x"]), Tensor(REF["in.i"])
    assert repr(x) == str(REF["repr.x"]) and str(x) == repr(x)
    assert repr(i) == str(REF["repr.i"])
    assert repr(Tensor(3.5)) == str(REF["repr.scalar"])
    assert repr(Tensor([True, False])) == str(REF["repr.vec"])
    # MAX's matrix-of-matrices layout: 3-D side by side with "|", 4-D stacked with a blank line
    assert repr(Tensor(np.arange(8, dtype=np.int32).reshape(2, 2, 2))).startswith("Tensor([0 1 | 4 5\n 2 3 | 6 7]")
    assert "\n \n" in repr(Tensor(np.arange(16, dtype=np.int32).reshape(2, 2, 2, 2)))
    assert "..." in repr(Tensor(np.arange(2000, dtype=np.int32)))


def test_distributed_and_lazy_arguments_refused():
    class FakeMesh:  # what a DeviceMesh looks like from outside
        devices = (CPU(),)

    x = Tensor([1.0])
    for f in (lambda: Tensor.zeros([1], device=FakeMesh()), lambda: x.to(FakeMesh()),
              lambda: T.default_device(FakeMesh()),
              lambda: x.mesh, lambda: x.placements, lambda: x.mapping, lambda: x.layout, lambda: x.rebind_mapping(None),
              lambda: Tensor.from_shard_values([x, x])):  # fmt: skip
        with pytest.raises(NotImplementedError, match="NamedSharding"):
            f()
    with pytest.raises(NotImplementedError, match="state"):
        Tensor(state=object())
    with pytest.raises(TypeError):
        x.to("cpu")


def test_interop_with_graphs_sessions_and_jit():
    from maxjax.engine import InferenceSession

    a = RNG.standard_normal((2, 3)).astype(np.float32)
    t = Tensor(a)
    with Graph("const_from_tensor", input_types=()) as g:  # MAX's test_constant pattern
        c = ops.constant(t)
        assert c.type == TensorType(DType.float32, [2, 3], DeviceRef.CPU())
        g.output(c * 2.0)
    np.testing.assert_allclose(InferenceSession().load(g).execute()[0].to_numpy(), a * 2)
    with Graph("takes_tensor", input_types=[TensorType(DType.float32, [2, 3], DeviceRef.CPU())]) as g2:
        g2.output(g2.inputs[0] + 1.0)
    with Graph("eager_inside", input_types=()) as g3:  # a Tensor stays eager data while a graph is built
        u = (t * 2.0).sum(axis=None)
        assert isinstance(u.to_jax(), jax.Array) and Tensor.arange(3).to_numpy().tolist() == [0, 1, 2]
        g3.output(ops.constant(u))
    np.testing.assert_allclose(InferenceSession().load(g3).execute()[0].to_numpy(), [2 * a.sum()], rtol=1e-5)
    (out,) = InferenceSession().load(g2).execute(t)
    np.testing.assert_allclose(Tensor(out).to_numpy(), a + 1)

    @jax.jit
    def f(u: Tensor, v: Tensor) -> Tensor:
        return (u * v).sum(axis=None)

    got = f(t, t)
    assert isinstance(got, Tensor) and got.dtype is DType.float32
    np.testing.assert_allclose(got.item(), (a * a).sum(), rtol=1e-5)
    leaves, _ = jax.tree_util.tree_flatten(t)
    assert leaves[0] is t.to_jax()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(np.asarray(t), a)
