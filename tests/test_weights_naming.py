"""Hierarchical naming of every Weights source: attribute/index access, exists, items with a
'.'-boundary match, did-you-mean, allocate that records nothing on failure; graph.weights()."""

import os
import re
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from maxjax.dtype import DType
from maxjax.graph import DeviceRef, Graph, TensorType, ops
from maxjax.graph.weights import SafetensorWeights, Weights
from maxjax.graph.weights.protocol import natural_key, select_prefix

NAMES = [
    "transformer.layers.1.attention.weight",
    "transformer.layers.1.mlp.weight",
    "transformer.layers.10.attention.weight",
    "transformer.layers.2.attention.weight",
    "transformer.norm.weight",
    "head",
    "head.bias",
]


@pytest.fixture()
def weights(tmp_path):
    tensors = {n: np.full((2, 8), i, np.float32) for i, n in enumerate(NAMES)}
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    return SafetensorWeights([path])


def test_attribute_and_index_access_build_the_same_name(weights):
    a = weights.transformer.layers[1].attention.weight
    b = weights["transformer"]["layers"]["1"]["attention"]["weight"]
    assert a.name == b.name == "transformer.layers.1.attention.weight"
    assert weights.name == ""
    assert isinstance(a, Weights) and isinstance(weights, Weights)


def test_exists_is_exact(weights):
    assert weights.transformer.layers[1].mlp.weight.exists()
    assert not weights.transformer.layers[1].exists()  # a prefix, not a weight
    assert not weights.transformer.layers[3].mlp.weight.exists()
    assert weights.head.exists() and weights.head.bias.exists()
    assert "1.mlp.weight" in weights.transformer.layers


def test_items_match_whole_components_in_natural_order(weights):
    names = [n for n, _ in weights.transformer.layers[1].items()]
    assert names == ["transformer.layers.1.attention.weight", "transformer.layers.1.mlp.weight"]  # no layers.10
    assert [n for n, _ in weights.transformer.layers.items()] == [
        "transformer.layers.1.attention.weight",
        "transformer.layers.1.mlp.weight",
        "transformer.layers.2.attention.weight",
        "transformer.layers.10.attention.weight",
    ]
    assert [n for n, _ in weights.head.items()] == ["head", "head.bias"]
    assert len(list(weights.items())) == len(NAMES)
    for name, view in weights.transformer.items():
        assert view.name == name and view.exists()


def test_missing_names_raise_keyerror_with_did_you_mean(weights):
    with pytest.raises(KeyError, match=r"'transformer.layers.1.mlp.weigth' is not a weight .* Did you mean 'transformer.layers.1.mlp.weight'\?"):
        weights.transformer.layers[1].mlp.weigth.data()
    with pytest.raises(KeyError, match=r"It is a prefix of 2 weight\(s\)"):
        weights.transformer.layers[1].data()
    with pytest.raises(KeyError, match="No weight name given"):
        weights.data()


def test_failed_allocate_records_nothing(weights):
    view = weights.transformer.layers[2].attention.weight
    with pytest.raises(ValueError, match=r"had different shape \(expected=\(4, 4\), actual=\(Dim\(2\), Dim\(8\)\)\)"):
        view.allocate(DType.float32, (4, 4))
    with pytest.raises(ValueError, match=r"had different dtype \(expected=DType.float16, actual=DType.float32\)"):
        view.allocate(DType.float16)
    with pytest.raises(KeyError):
        weights.nothing.allocate()
    assert weights.allocated_weights == {}
    w = view.allocate(DType.float32, (2, 8), device=DeviceRef.CPU())
    assert w.name == "transformer.layers.2.attention.weight"
    assert list(weights.allocated_weights) == [w.name]
    np.testing.assert_array_equal(np.asarray(weights.allocated_weights[w.name]), np.full((2, 8), 3, np.float32))


def test_views_are_read_only_and_not_iterable(weights):
    with pytest.raises(AttributeError, match="read-only"):
        weights.transformer = 1
    with pytest.raises(TypeError, match=r"use \.items\(\)"):
        list(weights.transformer)
    with pytest.raises(AttributeError):
        weights._private
    assert weights["_private"].name == "_private"
    with pytest.raises(TypeError):
        weights[1.5]
    assert "layers" in dir(weights.transformer)


# -- properties -----------------------------------------------------------------------------------

component = st.one_of(st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True), st.integers(0, 30).map(str))
names_st = st.lists(st.lists(component, min_size=1, max_size=4).map(".".join), min_size=1, max_size=12, unique=True)


@settings(max_examples=40, deadline=None)
@given(names=names_st, data=st.data())
def test_naming_properties(names, data):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "p.safetensors")
        save_file({n: np.array([i], np.int32) for i, n in enumerate(names)}, path)
        w = SafetensorWeights([path])
        target = data.draw(st.sampled_from(names))
        parts = target.split(".")
        # attribute access and indexing by parts give the full dotted name
        view = w
        for p in parts:
            view = view[int(p)] if p.isdigit() and data.draw(st.booleans()) else view[p]
        assert view.name == target and view.exists()
        assert int(view.data().to_numpy()[0]) == names.index(target)
        # items() under any prefix of components is exactly the '.'-boundary selection
        k = data.draw(st.integers(0, len(parts)))
        prefix = ".".join(parts[:k])
        sub = w
        for p in parts[:k]:
            sub = sub[p]
        got = [n for n, _ in sub.items()]
        expected = sorted((n for n in names if not prefix or n == prefix or n.startswith(prefix + ".")), key=natural_key)
        assert got == expected
        assert target in got
        # exists() is exact: a strict prefix is a weight only if it was itself stored
        assert sub.exists() == (prefix in names)
        w.close()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.from_regex(r"[a-z]{1,3}(\.[0-9]{1,2}){0,2}", fullmatch=True), unique=True, max_size=20))
def test_natural_order_sorts_numbers_numerically(names):
    ordered = select_prefix(names, "")
    assert sorted(ordered) == sorted(names)
    for a, b in zip(ordered, ordered[1:]):
        ka, kb = natural_key(a), natural_key(b)
        assert ka <= kb
    key = [[int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)] for n in ordered]
    assert key == sorted(key)


# -- graph.weights() ------------------------------------------------------------------------------


def test_graph_weights_allocate_by_hierarchical_name():
    g = Graph("g", input_types=[TensorType(DType.float32, ["batch", 8], DeviceRef.CPU())])
    weights = g.weights()
    assert isinstance(weights, Weights) and g.weights() is weights
    w = weights.transformer.layers[0].attention.weight.allocate(dtype=DType.float32, shape=(8, 8))
    assert w.name == "transformer.layers.0.attention.weight"
    assert weights.transformer.layers[0].attention.weight.exists()
    assert not weights.transformer.layers[0].mlp.weight.exists()
    # same request again: the same Weight; a conflicting one: an error
    assert weights.transformer.layers[0].attention.weight.allocate(dtype=DType.float32, shape=(8, 8)) is w
    with pytest.raises(ValueError, match="already exists"):
        weights.transformer.layers[0].attention.weight.allocate(dtype=DType.float16, shape=(8, 8))
    with pytest.raises(ValueError, match="needs dtype and shape"):
        weights.other.allocate()
    with g:
        x = g.inputs[0] @ g.add_weight(w)
        bias = weights.bias.allocate(dtype=DType.float32, shape=(8,))
        g.output(ops.add(x, g.add_weight(bias)))
    assert [n for n, _ in weights.items()] == ["bias", "transformer.layers.0.attention.weight"]
    assert sorted(g.weight_names) == ["bias", "transformer.layers.0.attention.weight"]
    from maxjax.engine import InferenceSession

    rng = np.random.default_rng(0)
    registry = {"transformer.layers.0.attention.weight": rng.standard_normal((8, 8)).astype(np.float32),
                "bias": rng.standard_normal(8).astype(np.float32)}  # fmt: skip
    model = InferenceSession().load(g, weights_registry=registry)
    x_in = rng.standard_normal((3, 8)).astype(np.float32)
    out = model.execute(x_in)[0].to_numpy()
    np.testing.assert_allclose(out, x_in @ registry["transformer.layers.0.attention.weight"] + registry["bias"], rtol=1e-5)


def test_graph_weights_see_weights_added_directly():
    from maxjax.graph import Weight

    g = Graph("h", input_types=[TensorType(DType.float32, [2], DeviceRef.CPU())])
    with g:
        g.add_weight(Weight("a.b", DType.float32, (2,)))
    assert g.weights().a.b.exists()
    with pytest.raises(ValueError, match="has no data"):
        g.weights().a.b.data()
