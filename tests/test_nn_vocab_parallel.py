"""``VocabParallelEmbedding`` (MAX 26.7's ``max.nn.VocabParallelEmbedding``) and the ``Embedding``
weight key, on the 8 host devices of tests/conftest.py.

MAX 26.7 cannot build a ``VocabParallelEmbedding`` without a GPU (its ``Allreduce`` asks for one:
"No supported "gpu" device available"), so the numbers are those of a plain ``Embedding`` of the
same table (what MAX's masked per-device lookups and allreduce sum to), in graph, functional and
eager mode; the signature and the ``Embedding`` key are MAX's (``scripts/max_reference/moe.py``).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from max_reference import load

from maxjax import nn
from maxjax.dtype import DType
from maxjax.engine import InferenceSession
from maxjax.engine.mesh import make_mesh
from maxjax.graph import DeviceRef, Graph, ShardingStrategy, TensorType

REF = load("moe")
CPU = [DeviceRef.CPU(i) for i in range(8)]
VOCAB, HID = 10, 3  # 10 rows over 4 devices: 3, 3, 2, 2 (MAX's rowwise split; the short ones padded on the mesh)
TABLE = np.random.default_rng(3).standard_normal((VOCAB, HID)).astype(np.float32)
IDS = np.array([[0, 1, 2, 3, 9], [4, 5, 6, 7, 8]], dtype=np.int64)


def _vpe(n=4, name=None):
    v = nn.VocabParallelEmbedding(VOCAB, HID, DType.float32, CPU[:n], name=name)
    v.load_state_dict({name or "weight": TABLE})
    return v


@pytest.mark.parametrize("n", [1, 4])
def test_every_device_gets_the_plain_embedding_in_three_modes(n):
    v = _vpe(n)
    expected = TABLE[IDS]
    signals = nn.Signals(CPU[:n])
    with Graph("vpe", input_types=[TensorType(DType.int64, list(IDS.shape), CPU[0]), *signals.input_types()]) as g:
        ids, *buffers = g.inputs
        g.output(*v(ids, buffers))
    model = InferenceSession(devices=[d.to_device() for d in CPU[:n]]).load(g, weights_registry=v.state_dict())
    graph_out = [r.to_numpy() for r in model.execute(IDS, *signals.buffers())]
    buffers = signals.buffers()
    functional = jax.jit(lambda s, i: nn.functional_call(v, s, i, buffers))(nn.state(v), jnp.asarray(IDS))
    eager = v(jnp.asarray(IDS), signals.buffers())
    for outs in (graph_out, functional, eager):
        assert len(outs) == n
        for out in outs:
            np.testing.assert_array_equal(np.asarray(out), expected)
    assert [next(iter(o.devices())) for o in eager] == [d.to_device().jax_device for d in CPU[:n]]


def test_the_table_lives_split_over_the_vocabulary_and_state_dict_keeps_it_whole():
    v = _vpe(4)
    assert v.shard_size == 3 and v.num_devices == 4 and v.allreduce.num_accelerators == 4
    assert v.weight.sharding_strategy.is_rowwise and v.weight.sharding.spec == jax.sharding.PartitionSpec("tp", None)
    shards = [s.data.shape for s in v.weight.array().addressable_shards]
    assert shards == [(3, HID)] * 4  # MAX's 3, 3, 2, 2 rows, padded to 3 on the mesh
    assert v.state_dict()["weight"] is TABLE
    one = _vpe(1)
    assert one.weight.mesh is None  # one device: a plain table


def test_an_embedding_on_an_uneven_mesh_looks_up_the_right_rows():
    e = nn.Embedding(VOCAB, HID, DType.float32, CPU[0])
    e.load_state_dict({"weight": TABLE})
    e.sharding_strategy = ShardingStrategy.rowwise(4)
    e.to(make_mesh("tp=4"))
    np.testing.assert_array_equal(np.asarray(e(jnp.asarray(IDS))), TABLE[IDS])
    out = jax.jit(lambda s, i: nn.functional_call(e, s, i))(nn.state(e), jnp.asarray(IDS))
    np.testing.assert_array_equal(np.asarray(out), TABLE[IDS])


def test_weight_keys_are_maxs():
    assert sorted(nn.Embedding(10, 4, DType.float32, CPU[0], name="emb").raw_state_dict()) == list(REF["embedding.keys"])
    assert sorted(_vpe(2, name="emb").raw_state_dict()) == ["emb"]
    assert sorted(_vpe(2).raw_state_dict()) == ["weight"]


def test_signature_is_maxs_and_bad_calls_are_refused():
    params = [(p.name, None if p.default is inspect.Parameter.empty else repr(p.default))
              for p in inspect.signature(nn.VocabParallelEmbedding).parameters.values()]  # fmt: skip
    assert params == [("vocab_size", None), ("hidden_dim", None), ("dtype", None), ("devices", None),
                      ("quantization_encoding", "None"), ("name", "None")]  # fmt: skip
    assert "vocab_size: 'int', hidden_dim: 'int', dtype: 'DType', devices: 'list[DeviceRef]'" in str(REF["sig.VocabParallelEmbedding"])
    v = _vpe(2)
    with pytest.raises(ValueError, match=r"expected number of inputs \(2\) and number of signal buffers \(1\) to match"):
        v(jnp.asarray(IDS), nn.Signals(CPU[:1]).buffers())
    with pytest.raises(ValueError, match=r"VocabParallelEmbedding: devices=\[\]"):
        nn.VocabParallelEmbedding(VOCAB, HID, DType.float32, [])
