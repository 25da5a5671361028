"""nn.Module as MAX 26.7 behaves (seed max-nn-Module.txt), and where maxjax does better."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maxjax import nn
from maxjax.driver import Buffer
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.graph import DeviceRef, Graph, TensorType, Weight, ops
from maxjax.nn.layer import add_layer_hook, clear_hooks, recursive_named_layers

RNG = np.random.default_rng(1)


class Child(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = Weight("kernel", DType.float32, (2, 3), DeviceRef.CPU())

    def __call__(self, x):
        return x @ self.w.T


class Parent(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = Child()
        self.layers = nn.LayerList([nn.Linear(2, 2, DType.float32, DeviceRef.CPU(), has_bias=True) for _ in range(2)])

    def __call__(self, x):
        return self.layers(self.child(x))


def _random_state(module):
    return {k: RNG.standard_normal(v.shape).astype(v.dtype) for k, v in module.state_dict().items()}


def test_weights_are_keyed_by_their_own_name_under_the_module_path():
    p = Parent()
    assert list(p.raw_state_dict()) == ["child.kernel", "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]
    assert p.child.layer_weights == {"kernel": p.child.w}
    assert set(p.sublayers) == {"child", "layers"}
    assert [prefix for prefix, _ in p.named_modules()] == ["", "child.", "layers.", "layers.0.", "layers.1."]
    # state_dict() gives the weights their fully-qualified names (MAX behaviour)
    assert p.child.w.name == "child.kernel"
    assert repr(p) == "Parent(2 layers, 0 weights)"


def test_state_dict_zero_fills_and_returns_the_loaded_objects():
    p = Parent()
    with pytest.raises(ValueError, match="Weight 'child.kernel' was not initialized."):
        p.state_dict(auto_initialize=False)
    sd = p.state_dict()
    assert all(np.all(v.to_numpy() == 0) for v in sd.values())  # MAX 26.7: zero-filled values are Buffer.zeros
    new = _random_state(p)
    p.load_state_dict(new)
    out = p.state_dict()
    assert all(out[k] is new[k] for k in new)  # no copy


def test_load_state_dict_errors_use_max_messages():
    p = Parent()
    good = _random_state(p)
    bad = dict(good, **{"layers.1.weight": good["layers.1.weight"].T.copy()[:, :1].repeat(2, 1).T[:1]})
    with pytest.raises(ValueError, match=r"Value provided to weight 'layers.1.weight' had different shape \(expected=\(2, 2\), actual=\(1, 2\)\)\."):
        p.load_state_dict(bad)
    bad = dict(good, **{"child.kernel": good["child.kernel"].astype(np.float16)})
    with pytest.raises(ValueError, match=r"had different dtype \(expected=DType.float32, actual=DType.float16\)"):
        p.load_state_dict(bad)
    bad = dict(good, **{"child.kernel": good["child.kernel"].T.astype(np.float16)})
    with pytest.raises(ValueError, match=r"different shape \(expected=\(2, 3\), actual=\(3, 2\)\) and dtype"):
        p.load_state_dict(bad)
    bad = dict(good, **{"child.kernel": [[1.0, 2.0, 3.0]] * 2})
    with pytest.raises(ValueError, match="The class type of 'child.kernel' value .*list.* is not an array type"):
        p.load_state_dict(bad)


def test_load_state_dict_strict_lists_all_missing_and_unexpected_keys_with_did_you_mean():
    p = Parent()
    sd = _random_state(p)
    sd["layers.0.biass"] = sd.pop("layers.0.bias")
    sd["extra"] = np.zeros(1, np.float32)
    del sd["child.kernel"]
    with pytest.raises(ValueError) as e:
        p.load_state_dict(sd)
    msg = str(e.value)
    assert msg.startswith("load_state_dict() strict=True validation failed. Missing required weights: child.kernel, layers.0.bias;")
    assert "For 'layers.0.bias', did you mean 'layers.0.biass'?" in msg
    assert "Unexpected keys in state_dict: layers.0.biass, extra" in msg


def test_failed_load_changes_nothing():
    p = Parent()
    first = _random_state(p)
    p.load_state_dict(first)
    second = _random_state(p)
    second["layers.1.bias"] = np.zeros((3,), np.float32)  # last weight is wrong: everything before it is valid
    with pytest.raises(ValueError, match="layers.1.bias"):
        p.load_state_dict(second)
    assert all(p.state_dict()[k] is first[k] for k in first)
    second = _random_state(p)
    second["nope"] = np.zeros(1, np.float32)
    with pytest.raises(ValueError, match="Unexpected keys"):
        p.load_state_dict(second)
    assert all(p.state_dict()[k] is first[k] for k in first)


def test_bad_keys_and_unloadable_dtypes_name_the_key_or_the_weight():
    p = Parent()
    first = _random_state(p)
    p.load_state_dict(first)
    for key in (0, ("child", "kernel"), None, b"child.kernel"):
        for strict in (True, False):
            with pytest.raises(ValueError) as e:
                p.load_state_dict({**_random_state(p), key: np.zeros(1, np.float32)}, strict=strict)
            assert str(e.value) == f"load_state_dict() keys must be weight names (str), got {key!r} of type {type(key).__name__}"
    for dtype in (np.complex64, object, "U3", "S3", ">f4"):
        value = first["child.kernel"].astype(dtype)
        with pytest.raises(ValueError) as e:
            p.load_state_dict({**_random_state(p), "child.kernel": value})
        msg = str(e.value)
        assert msg.startswith(f"Value provided to weight 'child.kernel' had unsupported dtype (actual={value.dtype}):"), msg
        assert "\n" not in msg
    with pytest.raises(ValueError, match="needs a mapping of weight names to arrays, got a list"):
        p.load_state_dict(list(first.items()))
    assert all(p.state_dict()[k] is first[k] for k in first)  # nothing changed


class Symbolic(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = Weight("w", DType.float32, ["batch", 4], DeviceRef.CPU())
        self.sq = Weight("sq", DType.float32, ["n", "n"], DeviceRef.CPU())


def test_symbolic_dims_take_any_size_but_rank_and_static_dims_are_checked():
    m = Symbolic()
    good = {"w": np.ones((7, 4), np.float32), "sq": np.ones((3, 3), np.float32)}
    m.load_state_dict(good)
    cases = [  # MAX 26.7's words for the first three
        ("w", np.ones(512, np.float32), "shape rank (expected=2, actual=1)"),
        ("w", np.ones((7, 5), np.float32), "shape (dim[1]: expected 4, got 5)"),
        ("w", np.ones((1, 7, 4), np.float32), "shape rank (expected=2, actual=3)"),
        # MAX 26.7 accepts this one; maxjax refuses a symbolic dim bound to two sizes
        ("sq", np.ones((3, 2), np.float32), "shape (expected=('n', 'n'), actual=(3, 2))"),
    ]
    for w, value, words in cases:
        with pytest.raises(ValueError) as e:
            m.load_state_dict({**good, w: value})
        assert str(e.value) == f"Value provided to weight '{w}' had different {words}."
        assert m.w.value is good["w"] and m.sq.value is good["sq"]
    other = {"w": np.ones((0, 4), np.float32), "sq": np.ones((5, 5), np.float32)}
    m.load_state_dict(other)
    assert m.w.value is other["w"] and m.sq.value is other["sq"]


def test_several_bad_values_are_reported_on_one_line():
    p = Parent()
    sd = _random_state(p)
    sd["child.kernel"] = sd["child.kernel"].T.copy()
    sd["layers.0.bias"] = [0.0, 1.0]
    with pytest.raises(ValueError) as e:
        p.load_state_dict(sd)
    msg = str(e.value)
    assert "\n" not in msg
    assert "weight 'child.kernel' had different shape (expected=(2, 3), actual=(3, 2))." in msg
    assert "The class type of 'layers.0.bias' value (<class 'list'>)" in msg


def test_strict_false_returns_missing_and_unexpected_keys():
    p = Parent()
    sd = _random_state(p)
    del sd["layers.1.bias"]
    sd["junk"] = np.ones(2, np.float32)
    result = p.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["layers.1.bias"]
    assert result.unexpected_keys == ["junk"]
    assert p.layers[0].weight.value is sd["layers.0.weight"]
    # shape errors still raise with strict=False
    sd["layers.0.bias"] = np.zeros(5, np.float32)
    with pytest.raises(ValueError, match="layers.0.bias"):
        p.load_state_dict(sd, strict=False)


def test_none_value_is_missing_and_unexpected():
    p = Parent()
    sd = _random_state(p)
    sd["child.kernel"] = None
    with pytest.raises(ValueError, match="Missing required weights: child.kernel.*Unexpected keys in state_dict: child.kernel"):
        p.load_state_dict(sd)


def test_load_accepts_buffers_jax_arrays_and_checks_alignment():
    p = Parent()
    sd = _random_state(p)
    mixed = dict(sd)
    mixed["child.kernel"] = Buffer.from_numpy(sd["child.kernel"])
    mixed["layers.0.weight"] = jnp.asarray(sd["layers.0.weight"])
    p.load_state_dict(mixed)
    np.testing.assert_array_equal(np.asarray(nn.state(p)["child.kernel"]), sd["child.kernel"])
    raw = np.zeros(4 * 6 + 1, np.uint8)
    unaligned = raw[1:].view(np.float32).reshape(2, 3)
    assert unaligned.ctypes.data % 4
    with pytest.raises(ValueError, match=r"Found unaligned weight 'child.kernel' \(expected alignment=4\)"):
        p.load_state_dict(dict(sd, **{"child.kernel": unaligned}))
    p.load_state_dict(dict(sd, **{"child.kernel": unaligned}), weight_alignment=1)


def test_set_shared_weight_ties_embeddings_with_one_key():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4, DType.float32, DeviceRef.CPU())
            self.head = nn.Linear(4, 10, DType.float32, DeviceRef.CPU())
            self.head.set_shared_weight("weight", self.embed.weight)

        def __call__(self, ids):
            return self.head(self.embed(ids))

    m = Tied()
    assert list(m.raw_state_dict()) == ["embed.weight"]
    table = RNG.standard_normal((10, 4)).astype(np.float32)
    m.load_state_dict({"embed.weight": table})
    ids = np.array([[1, 2]], np.int32)
    np.testing.assert_allclose(np.asarray(m(ids)), table[ids] @ table.T, rtol=1e-5)
    # works after names were finalized too (MAX 26.7 raises KeyError here)
    m2 = Tied()
    m2.state_dict()
    m2.head.set_shared_weight("weight", m2.embed.weight)
    assert list(m2.raw_state_dict()) == ["embed.weight"]


def test_layer_list_registers_appended_layers():
    ll = nn.LayerList([nn.Linear(2, 2, DType.float32)])
    ll.append(nn.Linear(2, 3, DType.float32))
    ll.extend([nn.Linear(3, 1, DType.float32)])
    assert list(ll.raw_state_dict()) == ["0.weight", "1.weight", "2.weight"]
    ll.insert(0, nn.Linear(2, 2, DType.float32))
    assert [ll.raw_state_dict()[f"{i}.weight"].shape[0] for i in range(4)] == [2, 2, 3, 1]
    sd = _random_state(ll)
    ll.load_state_dict(sd)
    x = RNG.standard_normal((1, 2)).astype(np.float32)
    expect = x
    for i in range(4):
        expect = expect @ sd[f"{i}.weight"].T
    np.testing.assert_allclose(np.asarray(ll(x)), expect, rtol=1e-5)
    assert len(ll) == 4 and ll[1] is list(ll)[1]


def test_replace_module_and_recursive_named_layers():
    p = Parent()
    with pytest.raises(KeyError, match="nope"):
        p.replace_module("nope", Child())
    new = Child()
    p.replace_module("child", new)
    assert p.child is new and p.sublayers["child"] is new
    names = [n for n, _ in recursive_named_layers(p)]
    assert names == ["", "child", "layers", "layers.0", "layers.1"]


def test_hooks_run_after_each_layer_innermost_first_and_can_replace_outputs():
    p = Parent()
    p.load_state_dict(_random_state(p))
    seen = []
    h = add_layer_hook(lambda layer, args, kwargs, out: seen.append(type(layer).__name__))
    x = RNG.standard_normal((1, 3)).astype(np.float32)
    base = np.asarray(p(x))
    assert seen == ["Child", "Linear", "Linear", "LayerList", "Parent"]
    h.remove()
    seen.clear()
    h2 = add_layer_hook(lambda layer, args, kwargs, out: out * 0 if isinstance(layer, Child) else None)
    assert np.all(np.asarray(p(x)) == np.asarray(p.layers(jnp.zeros((1, 2), jnp.float32))))
    assert not np.all(base == np.asarray(p(x)))
    assert seen == []
    clear_hooks()
    np.testing.assert_array_equal(np.asarray(p(x)), base)
    del h2


def test_hooks_run_in_graph_mode_with_graph_values():
    p = Parent()
    p.load_state_dict(_random_state(p))
    calls = []
    add_layer_hook(lambda layer, args, kwargs, out: calls.append((type(layer).__name__, str(out.shape))))
    Graph("p", forward=p, input_types=[TensorType(DType.float32, ["b", 3], DeviceRef.CPU())])
    assert calls[0] == ("Child", "[b, 2]") and calls[-1] == ("Parent", "[b, 2]")


def test_module_staged_into_many_graphs():
    p = Parent()
    sd = _random_state(p)
    p.load_state_dict(sd)
    t = [TensorType(DType.float32, ["b", 3], DeviceRef.CPU())]
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    outs = []
    for i in range(3):
        g = Graph(f"g{i}", forward=p, input_types=t)
        outs.append(InferenceSession().load(g, weights_registry=p.state_dict()).execute(x)[0].to_numpy())
    assert all(np.array_equal(outs[0], o) for o in outs)


def test_tracing_never_renames_or_mutates_weights():
    p = Parent()
    p.load_state_dict(_random_state(p))
    before = {id(w): (w.name, w.dtype, list(w.shape), w.value) for w in p.raw_state_dict().values()}
    t = TensorType(DType.float32, ["b", 2], DeviceRef.CPU())
    with Graph("g", input_types=[TensorType(DType.float32, ["b", 3], DeviceRef.CPU())]) as g:
        h = p.child(g.inputs[0])
        sub = p.layers[0].build_subgraph("lin", [t], weight_prefix="layers.0.")
        for i in range(2):
            h = ops.call(sub, h, prefix=f"layers.{i}.")[0].tensor
        g.output(h)
    jax.jit(lambda s, x: nn.functional_call(p, s, x))(nn.state(p), np.ones((2, 3), np.float32))
    after = {id(w): (w.name, w.dtype, list(w.shape), w.value) for w in p.raw_state_dict().values()}
    assert before == after
    assert "layers.0.weight" not in [e.key for e in g._subgraphs["lin"]._weights.values()]
    assert set(g._subgraphs["lin"]._weights) == {"weight", "bias"}


def test_weight_used_with_no_graph_and_no_value_names_the_weight():
    c = Child()
    with pytest.raises(ValueError, match="Cannot operate on Weight 'kernel'.*no parent graph"):
        c(np.ones((1, 3), np.float32))


def test_same_name_twice_in_a_graph_before_names_are_final():
    class Two(nn.Module):
        def __init__(self):
            self.a = nn.Linear(2, 2, DType.float32)
            self.b = nn.Linear(2, 2, DType.float32)

        def __call__(self, x):
            return self.b(self.a(x))

    with pytest.raises(ValueError, match=r"(?s)Weight 'weight' already exists in Graph 'g'.*1\. Call model.state_dict\(\)"):
        Graph("g", forward=Two(), input_types=[TensorType(DType.float32, [1, 2], DeviceRef.CPU())])
    m = Two()
    m.state_dict()
    Graph("g", forward=m, input_types=[TensorType(DType.float32, [1, 2], DeviceRef.CPU())])


def test_module_to_moves_weights_and_sets_sharding_strategy():
    from maxjax.graph import ShardingStrategy

    p = Parent()
    p.to(DeviceRef.CPU(1))
    assert all(w.device == DeviceRef.CPU(1) for w in p.raw_state_dict().values())
    p.load_state_dict(_random_state(p))
    assert nn.state(p)["child.kernel"].devices() == {jax.devices("cpu")[1]}
    p.to(DeviceRef.CPU(0), DeviceRef.CPU(1), sharding_strategy=ShardingStrategy.rowwise(2))
    assert p.child.w.sharding_strategy.is_rowwise
    shards = p.child.w.shard([DeviceRef.CPU(0), DeviceRef.CPU(1)])
    assert [s.name for s in shards] == ["child.kernel[0]", "child.kernel[1]"]
    assert [list(s.shape) for s in shards] == [[1, 3], [1, 3]]


def test_bfloat16_numpy_weights_load_and_run():
    import ml_dtypes

    lin = nn.Linear(2, 3, DType.bfloat16, DeviceRef.CPU())
    w = np.arange(6, dtype=np.float32).reshape(3, 2).astype(ml_dtypes.bfloat16)
    lin.load_state_dict({"weight": w})
    out = lin(np.ones((1, 2), ml_dtypes.bfloat16))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out, np.float32), [[1.0, 5.0, 9.0]])


def test_two_weights_with_one_fully_qualified_name_raise_as_in_max():
    class Same(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Weight("w", DType.float32, (2,), DeviceRef.CPU())
            self.b = Weight("w", DType.float32, (2,), DeviceRef.CPU())

    with pytest.raises(ValueError, match=r"Same\.b: a different Weight named 'w' is already attribute 'a'"):
        Same()

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = Weight("w", DType.float32, (2,), DeviceRef.CPU())

    class Outer(nn.Module):  # "b.w" as weight "w" of module "b", and as weight "b.w" of the root
        def __init__(self):
            super().__init__()
            self.b = Inner()
            self.x = Weight("b.w", DType.float32, (2,), DeviceRef.CPU())

    with pytest.raises(ValueError, match=r"Duplicate weight FQN 'b.w' produced by two distinct attribute paths: '<root>' and 'b'"):
        Outer().raw_state_dict()
    m = Inner()  # replacing an attribute's Weight, or one Weight under two attributes, is fine
    m.w = Weight("w", DType.float32, (3,), DeviceRef.CPU())
    m.alias = m.w
    assert list(m.raw_state_dict()) == ["w"] and m.raw_state_dict()["w"].shape == [3]


def test_state_dict_renames_weights_as_max_does_while_ops_and_graphs_never_do():
    c = Child()
    assert c.w.name == "kernel"
    p = Parent()
    assert p.child.w.name == "kernel"
    p.raw_state_dict()
    assert p.child.w.name == "child.kernel"  # MAX 26.7: raw_state_dict/state_dict/load_state_dict give FQNs
    import maxjax.graph.weight as weight_module

    assert "state_dict()" in weight_module.__doc__ and "never changes it" in weight_module.__doc__


def test_build_subgraph_rebuilds_nested_inputs():
    class Pair(nn.Module):  # a MAX layer taking a tuple
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, DType.float32, DeviceRef.CPU())

        def __call__(self, h, kv):
            k, v = kv
            return self.lin(h) + k * v

    m = Pair()
    m.load_state_dict({"lin.weight": RNG.standard_normal((3, 3)).astype(np.float32)})
    t = TensorType(DType.float32, [2, 3], DeviceRef.CPU())
    with Graph("g", input_types=[t, t, t]) as g:
        sub = m.build_subgraph("pair", [t, (t, t)])
        assert len(sub.input_types) == 3  # flat inputs, as ops.call takes them
        g.output(ops.call(sub, *g.inputs)[0].tensor)
    h, k, v = (RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(3))
    got = InferenceSession().load(g, weights_registry=m.state_dict()).execute(h, k, v)[0].to_numpy()
    np.testing.assert_allclose(got, np.asarray(m(h, (k, v))), rtol=1e-6)
